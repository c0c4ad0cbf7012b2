/**
 * Test clocks: `/v1/test_helpers/test_clocks` create, retrieve, list, advance.
 *
 * A customer created with `test_clock` lives on that clock's `frozen_time`, and so do its
 * subscriptions and invoices. Advancing answers at once with `status: advancing`; the
 * sandbox then bills every period that ended on the way (renewals, paid invoices,
 * cancellations at period end, with their events dated at the period boundaries), sets
 * the new frozen time and turns the clock `ready` (`test_helpers.test_clock.ready`), as
 * Stripe does asynchronously. Poll until `ready` before looking at the results.
 */
import type Stripe from 'stripe';
import { renewOnClock } from '../billing.js';
import { invalidParam, invalidState } from '../errors.js';
import { render, renderList } from '../expand.js';
import { allowOnly, optInteger, optString, type Params } from '../form.js';
import { LIST_PARAMS, listPage } from '../list.js';
import type { Router } from '../router.js';
import type { SandboxState } from '../state.js';
import { newId } from '../store.js';

const RETENTION = 30 * 86_400;
const ADVANCE_MAX = 20 * 366 * 86_400;

function requiredTime(params: Params): number {
  const time = optInteger(params, 'frozen_time');
  if (time === undefined)
    throw invalidParam('frozen_time', 'Missing required param: frozen_time.', 'parameter_missing');
  return time;
}

function createClock(state: SandboxState, params: Params): Stripe.TestHelpers.TestClock {
  allowOnly(params, ['frozen_time', 'name']);
  const created = state.clock.nowSeconds();
  const clock: Stripe.TestHelpers.TestClock = {
    id: newId('clock'),
    object: 'test_helpers.test_clock',
    created,
    deletes_after: created + RETENTION,
    frozen_time: requiredTime(params),
    livemode: false,
    name: optString(params, 'name') || null,
    status: 'ready',
    status_details: {},
  };
  state.testClocks.insert(clock);
  state.events.emit('test_helpers.test_clock.created', clock);
  return clock;
}

/** Runs the billing of an advance, then marks the clock ready. */
function finishAdvance(state: SandboxState, id: string, target: number): void {
  renewOnClock(state, id, target);
  const clock = state.testClocks.find(id);
  if (clock === undefined) return;
  const ready: Stripe.TestHelpers.TestClock = {
    ...clock,
    frozen_time: target,
    status: 'ready',
    status_details: {},
  };
  state.testClocks.update(ready);
  state.events.emit('test_helpers.test_clock.ready', ready, undefined, target);
}

function advanceClock(
  state: SandboxState,
  id: string,
  params: Params,
): Stripe.TestHelpers.TestClock {
  allowOnly(params, ['frozen_time']);
  const clock = state.testClocks.get(id);
  if (clock.status !== 'ready')
    throw invalidState(
      `The test clock ${id} is ${clock.status}; wait until it is ready before advancing it again.`,
    );
  const target = requiredTime(params);
  if (target <= clock.frozen_time)
    throw invalidParam(
      'frozen_time',
      'The frozen_time must be after the current frozen_time of the test clock.',
    );
  if (target - clock.frozen_time > ADVANCE_MAX)
    throw invalidParam(
      'frozen_time',
      'The Stripe sandbox advances a test clock by at most 20 years at a time.',
    );
  const advancing: Stripe.TestHelpers.TestClock = {
    ...clock,
    status: 'advancing',
    status_details: { advancing: { target_frozen_time: target } },
  };
  state.testClocks.update(advancing);
  state.events.emit('test_helpers.test_clock.advancing', advancing);
  state.schedule(() => finishAdvance(state, id, target));
  return advancing;
}

function listClocks(
  state: SandboxState,
  params: Params,
): Stripe.ApiList<Stripe.TestHelpers.TestClock> {
  allowOnly(params, LIST_PARAMS);
  return listPage(
    state.testClocks.newestFirst(),
    params,
    '/v1/test_helpers/test_clocks',
    'test_clock',
  );
}

export function registerTestClocks(router: Router): void {
  router
    .add('POST', '/v1/test_helpers/test_clocks', ({ state, params, expand }) =>
      render(state, createClock(state, params), expand),
    )
    .add('GET', '/v1/test_helpers/test_clocks/:id', ({ state, path, expand }) =>
      render(state, state.testClocks.get(path['id'] as string), expand),
    )
    .add('POST', '/v1/test_helpers/test_clocks/:id/advance', ({ state, path, params, expand }) =>
      render(state, advanceClock(state, path['id'] as string, params), expand),
    )
    .add('GET', '/v1/test_helpers/test_clocks', ({ state, params, expand }) =>
      renderList(state, listClocks(state, params), expand),
    );
}
