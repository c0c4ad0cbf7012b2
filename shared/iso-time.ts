/**
 * Timestamps as the API shows them. In the leaf because the core renders them in its
 * views and storage renders them in the customer index rows it writes on restore.
 */

/** Recently rendered timestamps: period ends repeat on every balance answered. */
const isoCache = new Map<number, string>();
const ISO_CACHE_MAX = 256;

/** ISO 8601 with milliseconds for an epoch ms, memoised (a small, bounded cache). */
export function isoOf(ms: number): string {
  let iso = isoCache.get(ms);
  if (iso === undefined) {
    iso = new Date(ms).toISOString();
    if (isoCache.size >= ISO_CACHE_MAX) isoCache.clear();
    isoCache.set(ms, iso);
  }
  return iso;
}
