/**
 * The customer record: the profile a customer carries and the object the API shows for
 * it. In the leaf because the core keeps it in every customer's state and renders it at
 * every write, and storage renders the same object into the customer index when it
 * restores a snapshot, so both must agree field for field.
 */
import { isoOf } from './iso-time.js';

/** Customer metadata values: strings, numbers, booleans or null. */
export type MetadataValue = string | number | boolean | null;

/** The customer's own fields, kept with the billing state. */
export interface CustomerProfile {
  name: string | null;
  email: string | null;
  metadata: Record<string, MetadataValue>;
  updatedAtMs: number;
}

/** What the API shows for a customer (and the customer index stores). */
export interface CustomerView {
  readonly id: string;
  readonly name: string | null;
  readonly email: string | null;
  readonly metadata: Readonly<Record<string, MetadataValue>>;
  readonly createdAt: string;
  readonly updatedAt: string;
}

/** The fields of a customer that its view shows: live state and snapshot items both have them. */
export interface CustomerRecord {
  readonly id: string;
  readonly createdAtMs: number;
  readonly profile: CustomerProfile;
}

/** The API's customer object; a snapshot item has the same fields, so restore needs no state. */
export function customerView(customer: CustomerRecord): CustomerView {
  return {
    id: customer.id,
    name: customer.profile.name,
    email: customer.profile.email,
    metadata: customer.profile.metadata,
    createdAt: isoOf(customer.createdAtMs),
    updatedAt: isoOf(customer.profile.updatedAtMs),
  };
}
