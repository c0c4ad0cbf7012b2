/**
 * Resolves the signed-in session into the Tally customer it bills, and the profile
 * (name, email) that customer sync writes. The id always comes from the server-side
 * session, never from a request body, so a browser cannot name another customer.
 */
import { APIError } from 'better-auth/api';
import type { CustomerIdSource, TallyPluginOptions, TallySession } from './options.js';

/** Tally's id limit: 1–255 characters. */
const CUSTOMER_ID_LENGTH_MAX = 255;

export interface ResolvedCustomer {
  readonly id: string;
  /** The built-in source, `custom` for a function, null for `resolveCustomerId`. */
  readonly source: CustomerIdSource | null;
  /** The native id before `mapCustomerId` (the organization's or team's own id). */
  readonly nativeId: string;
}

/**
 * The customer of `session` under `options`. Throws a 400 `APIError` when the source is
 * an organization or team and the session has none active, and a 500 when a function
 * of the application answers something that is not a valid id (a bug to fix there).
 */
export async function resolveCustomer(
  session: TallySession,
  options: TallyPluginOptions,
): Promise<ResolvedCustomer> {
  if (options.resolveCustomerId !== undefined) {
    const id = checkedId(await options.resolveCustomerId(session), 'resolveCustomerId');
    return { id, source: null, nativeId: id };
  }
  const { source, id: nativeId } = nativeCustomerId(session, options.customerId ?? 'user');
  const id =
    options.mapCustomerId === undefined
      ? nativeId
      : checkedId(options.mapCustomerId({ source, id: nativeId }), 'mapCustomerId');
  return { id, source, nativeId };
}

function nativeCustomerId(
  session: TallySession,
  customerId: NonNullable<TallyPluginOptions['customerId']>,
): { source: CustomerIdSource; id: string } {
  switch (customerId) {
    case 'user':
      return { source: 'user', id: session.user.id };
    case 'organization': {
      const id = session.session.activeOrganizationId;
      if (typeof id !== 'string' || id === '') {
        throw new APIError('BAD_REQUEST', {
          message: 'no active organization: set one with organization.setActive first',
          code: 'NO_ACTIVE_ORGANIZATION',
        });
      }
      return { source: 'organization', id };
    }
    case 'team': {
      const id = session.session.activeTeamId;
      if (typeof id !== 'string' || id === '') {
        throw new APIError('BAD_REQUEST', {
          message: 'no active team: set one with organization.setActiveTeam first',
          code: 'NO_ACTIVE_TEAM',
        });
      }
      return { source: 'team', id };
    }
    default:
      return { source: 'custom', id: checkedId(customerId(session), 'customerId') };
  }
}

function checkedId(id: unknown, option: string): string {
  if (typeof id === 'string' && id !== '' && [...id].length <= CUSTOMER_ID_LENGTH_MAX) return id;
  throw new APIError('INTERNAL_SERVER_ERROR', {
    message:
      `tally plugin: ${option} must answer a customer id of 1-${CUSTOMER_ID_LENGTH_MAX} ` +
      `characters, got ${typeof id === 'string' ? JSON.stringify(id.slice(0, 40)) : typeof id}`,
    code: 'INVALID_CUSTOMER_ID',
  });
}

/** The name and email customer sync writes. */
export interface CustomerProfile {
  readonly name?: string;
  readonly email?: string;
}

/** Reads one organization or team row; the plugin passes Better Auth's adapter. */
export type FindNamed = (model: 'organization' | 'team', id: string) => Promise<string | null>;

/**
 * The profile of a resolved customer. A user (and an id the application chose) carries
 * the signed-in user's name and email. An organization or team carries its own name and
 * no email: writing the email of whichever member synced last would flip it between
 * members.
 */
export async function customerProfile(
  session: TallySession,
  customer: ResolvedCustomer,
  findName: FindNamed,
): Promise<CustomerProfile> {
  if (customer.source === 'organization' || customer.source === 'team') {
    const name = await findName(customer.source, customer.nativeId);
    return name === null ? {} : { name };
  }
  return { name: session.user.name, email: session.user.email };
}
