/**
 * Amounts for people: Stripe amounts are integers in the currency's smallest unit
 * (cents for USD, whole yen for JPY). Used by the hosted checkout page and by invoice
 * line descriptions.
 */
import type Stripe from 'stripe';

/** `2000, 'usd'` → `$20.00`; `500, 'jpy'` → `¥500`. */
export function formatAmount(amount: number, currency: string): string {
  const format = new Intl.NumberFormat('en-US', {
    style: 'currency',
    currency: currency.toUpperCase(),
  });
  const digits = format.resolvedOptions().maximumFractionDigits ?? 2;
  return format.format(amount / 10 ** digits);
}

/** `$20.00`, `$20.00 / month`, `$50.00 every 3 months`. */
export function formatPrice(price: Stripe.Price): string {
  const amount = formatAmount(price.unit_amount ?? 0, price.currency);
  if (price.recurring === null) return amount;
  const { interval, interval_count: count } = price.recurring;
  return count === 1 ? `${amount} / ${interval}` : `${amount} every ${count} ${interval}s`;
}
