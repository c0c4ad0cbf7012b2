/**
 * Registering the plugin's receiver at Tally, and finding the registration stored in the
 * plugin's table.
 *
 * Registration is idempotent at Tally: one endpoint per (environment, url, key), so
 * instances racing to register get the same endpoint and secret; within one process
 * concurrent registrations also share one call. What to register (key, event filter)
 * comes from the pushed configuration's forwarding entry for the receiver's path when
 * there is one, else from the plugin's options.
 */
import type { DBAdapter } from 'better-auth';
import { type ForwardingEntry, type TallyClient, TallyApiError } from '../client/index.js';
import { ENDPOINT_MODEL, type StoredEndpoint } from './webhook-schema.js';

/** The plugin's options for registration, with their defaults applied. */
export interface RegistrationDefaults {
  readonly key: string;
  readonly events: string | readonly string[];
  readonly autoRegister: boolean;
}

export interface CheckedRegistration {
  readonly endpoint: StoredEndpoint;
  readonly status: string | null;
}

/** What a registration sends, and whether a delivery may cause it (the options' defaults
 * or a forwarding entry's). */
type Registration = RegistrationDefaults;

/** Finds, and registers when asked, the endpoint of one receiver URL. */
export class Registrar {
  private readonly inFlight = new Map<string, Promise<StoredEndpoint>>();

  constructor(
    readonly client: TallyClient,
    private readonly settings: RegistrationDefaults,
  ) {}

  stored(adapter: DBAdapter, url: string): Promise<StoredEndpoint | null> {
    return adapter.findOne<StoredEndpoint>({
      model: ENDPOINT_MODEL,
      where: [{ field: 'url', value: url }],
    });
  }

  /**
   * The stored endpoint, or a new registration (with `registration`, or what the
   * configuration and the options say); concurrent callers share one.
   */
  async ensure(
    adapter: DBAdapter,
    url: string,
    registration?: Registration,
  ): Promise<StoredEndpoint> {
    const stored = await this.stored(adapter, url);
    if (stored !== null) return stored;
    let pending = this.inFlight.get(url);
    if (pending === undefined) {
      pending = (async () =>
        this.register(adapter, url, registration ?? (await this.registrationFor(url))))().finally(
        () => this.inFlight.delete(url),
      );
      this.inFlight.set(url, pending);
    }
    return pending;
  }

  /**
   * How to register `url`. A forwarding entry of the pushed configuration whose `path`
   * is this receiver's (and whose `integration` is `better-auth` or unset) gives the
   * registration key and events, and its `autoRegister: true` lets a delivery register
   * even when the plugin's option is false: the configuration describes the deployment.
   * Without one, the plugin's options do.
   */
  async registrationFor(url: string): Promise<Registration> {
    const path = new URL(url).pathname;
    let entry: ForwardingEntry | undefined;
    try {
      const { config } = await this.client.pull();
      entry = config.webhooks?.forwarding?.find(
        (candidate) =>
          candidate.path === path &&
          (candidate.integration === undefined || candidate.integration === 'better-auth'),
      );
    } catch (error) {
      // No configuration pushed yet: the options alone decide.
      if (!(error instanceof TallyApiError) || error.status !== 404) throw error;
    }
    if (entry === undefined) {
      const { key, events, autoRegister } = this.settings;
      return { key, events, autoRegister };
    }
    return {
      key: entry.key,
      events: entry.events,
      autoRegister: this.settings.autoRegister || entry.autoRegister === true,
    };
  }

  private async register(
    adapter: DBAdapter,
    url: string,
    registration: Registration,
  ): Promise<StoredEndpoint> {
    const { key, events } = registration;
    const endpoint = await this.client.webhooks.register({ url, key, events });
    const row = {
      url,
      registrationKey: key,
      endpointId: endpoint.id,
      secret: endpoint.secret,
      events: eventsText(endpoint.events),
      createdAt: new Date(),
    };
    try {
      return await adapter.create<typeof row, StoredEndpoint>({ model: ENDPOINT_MODEL, data: row });
    } catch (error) {
      // Another instance stored the same registration first (the unique index refused ours).
      const stored = await this.stored(adapter, url);
      if (stored !== null) return stored;
      throw error;
    }
  }
}

/**
 * The registration as Tally has it now. The stored endpoint (or a new registration) is
 * registered again, which Tally answers idempotently with the same endpoint, its current
 * secret and its status (`active`, or `pending_approval` for a live endpoint not yet
 * approved). A changed secret (rotated at Tally), a changed event filter or a new endpoint
 * (the old one was deleted at Tally) is written back, so a status call also repairs a
 * receiver whose stored registration went stale.
 */
export async function checkedRegistration(
  adapter: DBAdapter,
  registrar: Registrar,
  url: string,
): Promise<CheckedRegistration> {
  const stored = await registrar.ensure(adapter, url);
  const wanted = await registrar.registrationFor(url);
  const current = await registrar.client.webhooks.register({
    url,
    key: stored.registrationKey,
    events: wanted.events,
  });
  const events = eventsText(current.events);
  const update = { endpointId: current.id, secret: current.secret, events };
  if (
    update.endpointId === stored.endpointId &&
    update.secret === stored.secret &&
    update.events === stored.events
  ) {
    return { endpoint: stored, status: current.status ?? null };
  }
  await adapter.update({
    model: ENDPOINT_MODEL,
    where: [{ field: 'id', value: stored.id }],
    update,
  });
  return { endpoint: { ...stored, ...update }, status: current.status ?? null };
}

/** The stored form of an event filter: `*` or comma-separated kinds. */
function eventsText(events: string | readonly string[]): string {
  return typeof events === 'string' ? events : events.join(',');
}
