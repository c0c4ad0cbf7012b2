/**
 * Programmer-error assertions. A failed assertion means a broken invariant, never a
 * client mistake: it throws, and in a shard worker that crashes the worker so that
 * recovery rebuilds its state from disk (never catch-and-continue).
 */
export class AssertionError extends Error {
  override name = 'AssertionError';
}

export function assert(condition: unknown, message: string): asserts condition {
  if (!condition) throw new AssertionError(`assertion failed: ${message}`);
}
