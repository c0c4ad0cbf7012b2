/**
 * Customer-bound client tokens: short-lived proofs, minted for an application's server
 * with its server key (`POST /v1/client-tokens`), that a browser may read one customer's
 * entitlements and balances with the public client key. A client key alone can read any
 * customer; with a token beside it (`x-tally-customer-token`), a request for another
 * customer is refused, and an environment may require one (`client.requireCustomerToken`).
 *
 * A token is `ct_<environment>_<generation>.<expiresAtMs>.<customerId, base64url>.<mac>`,
 * the mac being HMAC-SHA256 of everything before it under the environment's current
 * signing secret, base64url. The secrets live in the control store, one set per
 * environment; rotating makes a new current secret and keeps the one before valid for
 * CUSTOMER_TOKEN_TTL_SEC_MAX, the longest a token it signed can live, so that no token
 * minted before a rotation stops working before it expires. A token of an older
 * generation is refused.
 *
 * Verification is on the client-key read path. A page sends the same token with every
 * request until it expires, so verified tokens are kept (bounded) and a repeat costs a
 * map lookup and two comparisons instead of an HMAC.
 */
import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import type { Environment } from '../../actors/protocol.js';
import type { ControlStore, TokenSecretSet } from '../../storage/control-store.js';

/**
 * The longest a token may live: a page refreshes it well before, and a token copied
 * out of a page is useful for at most this long. Also how long a rotated-out secret
 * stays valid.
 */
export const CUSTOMER_TOKEN_TTL_SEC_MAX = 3600;
/** Lifetime of a token minted without `ttlSeconds`. */
export const CUSTOMER_TOKEN_TTL_SEC_DEFAULT = 900;
/** Longer than any token Tally mints (a 255-character customer id included); cheap to refuse. */
export const CUSTOMER_TOKEN_LENGTH_MAX = 1024;
const SECRET_BYTES = 32;
const MAC_BYTES = 32;
/** Verified tokens kept per environment; the table is emptied when it reaches this size. */
const VERIFIED_MAX = 10_000;

/** Why a presented token is not accepted (an error code of the catalog). */
export type TokenProblem = 'customer_token_invalid' | 'customer_token_expired';

/** A token whose signature checked out. */
export interface VerifiedToken {
  readonly customerId: string;
  readonly expiresAtMs: number;
  readonly generation: number;
}

/** A rotation: the generation it makes current, and when that is durable. */
export interface Rotation {
  readonly generation: number;
  /** Resolves once stored and in use; rejects if the write fails (nothing changed). */
  readonly stored: Promise<{ readonly previousValidUntilMs: number }>;
}

export interface MintedToken {
  readonly token: string;
  readonly customerId: string;
  readonly expiresAtMs: number;
}

interface LiveSecret {
  readonly generation: number;
  readonly key: Buffer;
}

interface EnvironmentSecrets {
  current: LiveSecret;
  previous: LiveSecret | null;
  /** Until when `previous` is accepted (ms since the epoch). */
  previousUntilMs: number;
  /** Token text → what it proved; only valid signatures are kept. */
  readonly verified: Map<string, VerifiedToken>;
}

function liveSecret(stored: { generation: number; secretHex: string }): LiveSecret {
  return { generation: stored.generation, key: Buffer.from(stored.secretHex, 'hex') };
}

function newSecretHex(): string {
  return randomBytes(SECRET_BYTES).toString('hex');
}

function macOf(key: Buffer, body: string): Buffer {
  return createHmac('sha256', key).update(body).digest();
}

export class CustomerTokens {
  private readonly environments = new Map<Environment, EnvironmentSecrets>();
  /** Rotations run one after another: each builds on the set the one before stored. */
  private rotations: Promise<unknown> = Promise.resolve();
  /** The generation the latest rotation issued, per environment (stored or not yet). */
  private readonly issued = new Map<Environment, number>();

  private constructor(private readonly control: ControlStore) {}

  /**
   * Loads each environment's secrets, creating (durably) those a new data dir lacks.
   * Rejects if a write fails; throws on a corrupt stored record.
   */
  static async open(
    control: ControlStore,
    environments: readonly Environment[],
  ): Promise<CustomerTokens> {
    const tokens = new CustomerTokens(control);
    for (const environment of environments) {
      let stored = control.tokenSecrets(environment);
      if (stored === null) {
        stored = {
          current: { generation: 1, secretHex: newSecretHex() },
          previous: null,
          previousUntilMs: 0,
        };
        await control.putTokenSecrets(environment, stored);
      }
      tokens.install(environment, stored);
    }
    return tokens;
  }

  private install(environment: Environment, stored: TokenSecretSet): void {
    this.environments.set(environment, {
      current: liveSecret(stored.current),
      previous: stored.previous === null ? null : liveSecret(stored.previous),
      previousUntilMs: stored.previousUntilMs,
      verified: new Map(),
    });
  }

  private secrets(environment: Environment): EnvironmentSecrets {
    const secrets = this.environments.get(environment);
    if (secrets === undefined) throw new Error(`no customer-token secrets for ${environment}`);
    return secrets;
  }

  /** The generation new tokens of `environment` are signed with. */
  generation(environment: Environment): number {
    return this.secrets(environment).current.generation;
  }

  /**
   * A token for `customerId` valid for `ttlSec` seconds from `nowMs`. The caller has
   * checked both (1 ≤ ttlSec ≤ CUSTOMER_TOKEN_TTL_SEC_MAX; an id of 1 to 255 characters).
   */
  mint(environment: Environment, customerId: string, ttlSec: number, nowMs: number): MintedToken {
    const { current } = this.secrets(environment);
    const expiresAtMs = nowMs + ttlSec * 1000;
    const body =
      `ct_${environment}_${current.generation}.${expiresAtMs}.` +
      Buffer.from(customerId, 'utf8').toString('base64url');
    const token = `${body}.${macOf(current.key, body).toString('base64url')}`;
    return { token, customerId, expiresAtMs };
  }

  /**
   * What `token` proves in `environment` at `nowMs`, or why it proves nothing: invalid
   * (malformed, another environment's, a retired secret's, a wrong signature) or
   * expired. Never throws for client input.
   */
  verify(environment: Environment, token: string, nowMs: number): VerifiedToken | TokenProblem {
    const secrets = this.secrets(environment);
    let verified = secrets.verified.get(token);
    if (verified === undefined) {
      const checked = this.check(environment, secrets, token);
      if (typeof checked === 'string') return checked;
      verified = checked;
      if (verified.expiresAtMs > nowMs) {
        if (secrets.verified.size >= VERIFIED_MAX) secrets.verified.clear();
        secrets.verified.set(token, verified);
      }
    }
    if (!this.accepts(secrets, verified.generation, nowMs)) return 'customer_token_invalid';
    return verified.expiresAtMs > nowMs ? verified : 'customer_token_expired';
  }

  private accepts(secrets: EnvironmentSecrets, generation: number, nowMs: number): boolean {
    if (generation === secrets.current.generation) return true;
    return generation === secrets.previous?.generation && nowMs < secrets.previousUntilMs;
  }

  /** Parses the token and checks its signature (not its expiry, not the generation's age). */
  private check(
    environment: Environment,
    secrets: EnvironmentSecrets,
    token: string,
  ): VerifiedToken | TokenProblem {
    const prefix = `ct_${environment}_`;
    if (token.length > CUSTOMER_TOKEN_LENGTH_MAX || !token.startsWith(prefix))
      return 'customer_token_invalid';
    const parts = token.slice(prefix.length).split('.');
    if (parts.length !== 4) return 'customer_token_invalid';
    const [generationText, expiresText, customerText, macText] = parts as [
      string,
      string,
      string,
      string,
    ];
    if (!/^[1-9][0-9]{0,8}$/.test(generationText) || !/^[1-9][0-9]{0,15}$/.test(expiresText))
      return 'customer_token_invalid';
    if (!/^[A-Za-z0-9_-]+$/.test(customerText) || !/^[A-Za-z0-9_-]{43}$/.test(macText))
      return 'customer_token_invalid';
    const generation = Number(generationText);
    const secret =
      generation === secrets.current.generation
        ? secrets.current
        : generation === secrets.previous?.generation
          ? secrets.previous
          : null;
    if (secret === null) return 'customer_token_invalid';
    const body = token.slice(0, token.length - macText.length - 1);
    const presented = Buffer.from(macText, 'base64url');
    if (presented.length !== MAC_BYTES || !timingSafeEqual(presented, macOf(secret.key, body)))
      return 'customer_token_invalid';
    const customerId = Buffer.from(customerText, 'base64url').toString('utf8');
    return { customerId, expiresAtMs: Number(expiresText), generation };
  }

  /**
   * Makes a new signing secret current for `environment`; the one it replaces stays valid
   * for CUSTOMER_TOKEN_TTL_SEC_MAX from `nowMs`, and the one before that stops being
   * accepted at once. The new set is written durably before it is used; if the write
   * rejects, nothing changed.
   */
  rotate(environment: Environment, nowMs: number): Rotation {
    const generation = (this.issued.get(environment) ?? this.generation(environment)) + 1;
    this.issued.set(environment, generation);
    const stored = this.rotations.then(() => this.rotateNow(environment, generation, nowMs));
    this.rotations = stored.catch(() => undefined);
    return { generation, stored };
  }

  private async rotateNow(
    environment: Environment,
    generation: number,
    nowMs: number,
  ): Promise<{ previousValidUntilMs: number }> {
    const secrets = this.secrets(environment);
    const previousUntilMs = nowMs + CUSTOMER_TOKEN_TTL_SEC_MAX * 1000;
    const stored: TokenSecretSet = {
      current: { generation, secretHex: newSecretHex() },
      previous: {
        generation: secrets.current.generation,
        secretHex: secrets.current.key.toString('hex'),
      },
      previousUntilMs,
    };
    await this.control.putTokenSecrets(environment, stored);
    this.install(environment, stored);
    return { previousValidUntilMs: previousUntilMs };
  }
}
