/**
 * Overage billed to the processor: what a subscription period's overage is per meter
 * (read when the processor drafts that period's invoice), and the record that it was
 * billed, so that a period is billed once however often its invoice is announced.
 *
 * A meter keeps its current period's overage, and the previous period's once a write has
 * moved it on (apply.ts, `closedOverage`), so the overage of a period that just ended is
 * still known when its invoice is drafted.
 */
import { OVERAGE_BILLS_PER_CUSTOMER_MAX } from '../../shared/limits.js';
import type {
  CommerceState,
  CustomerState,
  Decision,
  Event,
  OveragePeriod,
  OverageView,
  WriteCommand,
} from './types.js';

function billKey(period: OveragePeriod): string {
  return `${period.subscriptionId}@${period.periodStartMs}`;
}

/** The overage each meter recorded in the period starting at `periodStartMs`. */
export function overageView(
  customer: CustomerState | undefined,
  period: OveragePeriod,
): OverageView {
  const billed = customer?.commerce?.overageBilled?.includes(billKey(period)) ?? false;
  const meters: Array<{ meterKey: string; micros: string }> = [];
  for (const [meterKey, meter] of customer?.meters ?? []) {
    const micros =
      meter.periodStartMs === period.periodStartMs
        ? meter.overageMicros
        : meter.closedOverage?.periodStartMs === period.periodStartMs
          ? meter.closedOverage.micros
          : 0n;
    if (micros > 0n) meters.push({ meterKey, micros: String(micros) });
  }
  return { billed, meters };
}

export function decideRecordOverageBill(
  customer: CustomerState | undefined,
  command: Extract<WriteCommand, { op: 'recordOverageBill' }>,
  nowMs: number,
): Decision {
  if (customer?.commerce?.overageBilled?.includes(billKey(command.bill)) === true)
    return { rejection: null, events: [] };
  const event: Event = {
    type: 'overageBilled',
    environment: command.environment,
    customerId: command.customerId,
    key: '',
    atMs: nowMs,
    bill: command.bill,
  };
  return { rejection: null, events: [event] };
}

export function applyOverageBilled(
  commerce: CommerceState,
  event: Extract<Event, { type: 'overageBilled' }>,
): void {
  const billed = (commerce.overageBilled ??= []);
  billed.push(billKey(event.bill));
  if (billed.length > OVERAGE_BILLS_PER_CUSTOMER_MAX) billed.shift();
}
