/**
 * The billing configuration as the actor core sees it.
 *
 * `BillingConfig` is the pushed JSON document (validated at the edge by the JSON Schema
 * in src/config); `compileConfig` turns it into lookup tables the core reads on every
 * command. Compilation is pure and total for a validated document, so every shard can
 * compile the same pushed version independently.
 */
import { quantityToMicros, type Micros } from './fixed.js';
import type { ResetInterval } from './periods.js';

export type EntitlementType = 'feature' | 'limit' | 'meter';

export interface EntitlementDefinition {
  readonly type: EntitlementType;
  readonly name?: string;
  readonly reset?: ResetInterval;
}

export interface PriceDefinition {
  readonly amount: number;
  readonly currency: string;
  readonly interval?: 'month' | 'year';
}

export interface ProductEntitlementValue {
  readonly included?: number;
  readonly expansion?: { readonly unitAmount: number };
  readonly overage?: { readonly unitAmount: number };
}

export interface ProductDefinition {
  readonly name?: string;
  readonly default?: boolean;
  readonly price?: PriceDefinition;
  readonly entitlements?: Readonly<Record<string, boolean | ProductEntitlementValue>>;
  readonly grants?: Readonly<Record<string, number>>;
}

export interface ForwardingEntry {
  readonly key: string;
  readonly path: string;
  readonly events: string | readonly string[];
  readonly integration?: string;
  readonly autoRegister?: boolean;
}

export interface BillingConfig {
  readonly entitlements: Readonly<Record<string, EntitlementDefinition>>;
  readonly products: Readonly<Record<string, ProductDefinition>>;
  /** What web pages may do with client keys (the front end reads it; shards ignore it). */
  readonly client?: {
    readonly allowedOrigins?: readonly string[];
    readonly requireCustomerToken?: boolean;
  };
  readonly webhooks?: {
    readonly devTunnel?: boolean;
    readonly forwarding?: readonly ForwardingEntry[];
  };
}

export interface LimitGrant {
  readonly included: number;
  readonly expansionAllowed: boolean;
}

export interface MeterGrant {
  readonly includedMicros: Micros;
  readonly overageAllowed: boolean;
}

export interface CompiledProduct {
  readonly key: string;
  readonly features: ReadonlySet<string>;
  readonly limits: ReadonlyMap<string, LimitGrant>;
  readonly meters: ReadonlyMap<string, MeterGrant>;
  /** A recurring plan's billing interval (null: one-time or free). */
  readonly interval: 'month' | 'year' | null;
  /** Meter key → credits a paid one-time purchase of this product grants. */
  readonly grants: ReadonlyMap<string, Micros>;
}

export interface CompiledEntitlement {
  readonly key: string;
  readonly type: EntitlementType;
  readonly reset: ResetInterval;
}

export interface CompiledConfig {
  readonly version: number;
  readonly entitlements: ReadonlyMap<string, CompiledEntitlement>;
  readonly products: ReadonlyMap<string, CompiledProduct>;
  readonly defaultProduct: CompiledProduct | null;
}

/** The configuration of an environment that has never been pushed: every key is unknown. */
export const EMPTY_CONFIG: CompiledConfig = {
  version: 0,
  entitlements: new Map(),
  products: new Map(),
  defaultProduct: null,
};

/**
 * Builds the core's lookup tables. Assumes a document that passed validation; an
 * entitlement a product names but the config does not define is a programmer error.
 */
export function compileConfig(config: BillingConfig, version: number): CompiledConfig {
  const entitlements = new Map<string, CompiledEntitlement>();
  for (const [key, def] of Object.entries(config.entitlements)) {
    entitlements.set(key, {
      key,
      type: def.type,
      reset: def.type === 'meter' ? (def.reset ?? 'month') : 'never',
    });
  }
  const products = new Map<string, CompiledProduct>();
  let defaultProduct: CompiledProduct | null = null;
  for (const [key, def] of Object.entries(config.products)) {
    const product = compileProduct(key, def, entitlements);
    products.set(key, product);
    if (def.default === true) defaultProduct = product;
  }
  return { version, entitlements, products, defaultProduct };
}

function compileProduct(
  key: string,
  def: ProductDefinition,
  entitlements: ReadonlyMap<string, CompiledEntitlement>,
): CompiledProduct {
  const features = new Set<string>();
  const limits = new Map<string, LimitGrant>();
  const meters = new Map<string, MeterGrant>();
  for (const [entKey, value] of Object.entries(def.entitlements ?? {})) {
    const ent = entitlements.get(entKey);
    if (ent === undefined) throw new Error(`product ${key} names undefined entitlement ${entKey}`);
    if (ent.type === 'feature') {
      if (value === true || (typeof value === 'object' && (value.included ?? 1) > 0))
        features.add(entKey);
      continue;
    }
    const grant = typeof value === 'object' ? value : {};
    if (ent.type === 'limit') {
      limits.set(entKey, {
        included: grant.included ?? 0,
        expansionAllowed: grant.expansion !== undefined,
      });
    } else {
      const includedMicros = quantityToMicros(grant.included ?? 0);
      if (includedMicros === null)
        throw new Error(`product ${key}: invalid included for ${entKey}`);
      meters.set(entKey, { includedMicros, overageAllowed: grant.overage !== undefined });
    }
  }
  const grants = new Map<string, Micros>();
  for (const [meterKey, credits] of Object.entries(def.grants ?? {})) {
    const micros = quantityToMicros(credits);
    if (micros === null) throw new Error(`product ${key}: invalid grant for ${meterKey}`);
    grants.set(meterKey, micros);
  }
  return { key, features, limits, meters, interval: def.price?.interval ?? null, grants };
}
