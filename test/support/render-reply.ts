/**
 * An outcome of the core rendered exactly as a client would see it: the shard's reply
 * (actors/shard.ts) through the front end's rendering (src/api/shard-reply.ts). For tests
 * that compare the core's answers with an independent model.
 */
import type { Command, Outcome } from '../../actors/customer.js';
import { OPS } from '../../actors/ops.js';
import { shardReplyOf } from '../../actors/shard.js';
import { renderReply, type Rendered } from '../../src/api/shard-reply.js';

export function renderOutcome(command: Command, outcome: Outcome): Rendered {
  const reply = shardReplyOf(OPS[command.op], outcome);
  return renderReply(reply.outcome, reply.body);
}
