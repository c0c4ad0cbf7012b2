/**
 * The hosted checkout page: what a buyer's browser sees at a session's `url`.
 *
 * `GET /checkout/<session id>` shows the items (product name, quantity, price with its
 * currency and interval), the total and a Pay button, a form that posts to
 * `/checkout/<session id>/pay`. Posting completes the session (checkout-completion.ts)
 * and redirects (303) to its `success_url`, with `{CHECKOUT_SESSION_ID}` filled in as
 * Stripe does. An expired session's page says so and offers no button; paying it, or a
 * completed one, is refused. These routes need no API key: the buyer's browser has none.
 */
import type Stripe from 'stripe';
import { completeSession, SessionClosedError } from './checkout-completion.js';
import { optString, parseForm } from './form.js';
import { formatAmount, formatPrice } from './money.js';
import type { SandboxState } from './state.js';

export interface PageAnswer {
  readonly status: number;
  readonly html?: string;
  /** Redirect target (with status 303). */
  readonly location?: string;
}

const ESCAPES: Readonly<Record<string, string>> = {
  '&': '&amp;',
  '<': '&lt;',
  '>': '&gt;',
  '"': '&quot;',
  "'": '&#39;',
};

export function escapeHtml(text: string): string {
  return text.replace(/[&<>"']/g, (c) => ESCAPES[c] ?? c);
}

function layout(title: string, body: string): string {
  return (
    `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" ` +
    `content="width=device-width, initial-scale=1">
<title>${escapeHtml(title)}</title>
<style>body{font-family:system-ui,sans-serif;max-width:28rem;margin:3rem auto;padding:0 ` +
    `1rem}table{width:100%;border-collapse:collapse}td{padding:.4rem ` +
    `0}td.amount{text-align:right}.total{font-weight:bold;border-top:1px solid ` +
    `#ccc}button{width:100%;padding:.8rem;font-size:1rem;margin-top:1rem}input{width:100%;` +
    `padding:.5rem;box-sizing:border-box}.notice{padding:1rem;background:#f6f6f6}</style>
</head><body><p><small>Stripe sandbox · test mode</small></p>
${body}
</body></html>
`
  );
}

function itemRows(state: SandboxState, session: Stripe.Checkout.Session): string {
  return (session.line_items?.data ?? [])
    .map((line) => {
      const price = line.price;
      const name =
        price === null
          ? (line.description ?? '')
          : (state.products.find(String(price.product))?.name ?? line.description ?? '');
      const quantity = (line.quantity ?? 1) > 1 ? ` × ${line.quantity ?? 1}` : '';
      const shown =
        price === null ? formatAmount(line.amount_total, line.currency) : formatPrice(price);
      return (
        `<tr><td class="product">${escapeHtml(name)}${quantity}</td><td ` +
        `class="amount">${escapeHtml(shown)}</td></tr>`
      );
    })
    .join('\n');
}

function openPage(state: SandboxState, session: Stripe.Checkout.Session): string {
  const total = formatAmount(session.amount_total ?? 0, session.currency ?? 'usd');
  const action = session.mode === 'subscription' ? 'Subscribe' : 'Pay';
  const email = escapeHtml(session.customer_email ?? '');
  const cancel =
    session.cancel_url === null
      ? ''
      : `<p><a href="${escapeHtml(session.cancel_url)}">Cancel</a></p>`;
  return layout(
    `Checkout · ${total}`,
    `<h1>Checkout</h1>
<table>
${itemRows(state, session)}
<tr class="total"><td>Total due today</td><td class="amount">${escapeHtml(total)}</td></tr>
</table>
<form method="post" action="/checkout/${encodeURIComponent(session.id)}/pay">
<p><label>Email<br><input type="email" name="email" value="${email}"></label></p>
<p><small>Test card 4242 4242 4242 4242: the sandbox's payments always succeed.</small></p>
<button type="submit">${action} ${escapeHtml(total)}</button>
</form>
${cancel}`,
  );
}

function closedPage(status: 'expired' | 'complete'): string {
  const message =
    status === 'expired'
      ? 'This checkout session has expired.'
      : 'This checkout session has already been paid.';
  return layout('Checkout', `<h1>Checkout</h1><p class="notice">${message}</p>`);
}

const MISSING: PageAnswer = {
  status: 404,
  html: layout('Checkout', '<h1>Checkout</h1><p class="notice">No such checkout session.</p>'),
};

/** `GET /checkout/<id>`. */
export function showCheckout(state: SandboxState, sessionId: string): PageAnswer {
  const session = state.sessions.find(sessionId);
  if (session === undefined) return MISSING;
  if (session.status === 'expired') return { status: 410, html: closedPage('expired') };
  if (session.status === 'complete') return { status: 200, html: closedPage('complete') };
  return { status: 200, html: openPage(state, session) };
}

/** `POST /checkout/<id>/pay`. */
export function payCheckout(state: SandboxState, sessionId: string, form: string): PageAnswer {
  if (state.sessions.find(sessionId) === undefined) return MISSING;
  try {
    const completed = completeSession(state, sessionId, {
      email: optString(parseForm(form), 'email') ?? '',
    });
    const target = (completed.success_url ?? '').replaceAll('{CHECKOUT_SESSION_ID}', completed.id);
    return { status: 303, location: target };
  } catch (error) {
    if (error instanceof SessionClosedError)
      return { status: error.status === 'expired' ? 410 : 409, html: closedPage(error.status) };
    throw error;
  }
}
