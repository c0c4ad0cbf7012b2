/**
 * The long fault-simulation run: random seeds for N seconds (`npm run sim -- --seconds N`,
 * default 60), or one seed (`SIM_SEED=<n> npm run sim`); `--steps N` per seed (default
 * 1000). Prints the seed of the first failing run and exits 1.
 */
import { simulate, SimulationFailure } from './support/durability-sim.js';

const args = process.argv.slice(2);
const at = args.indexOf('--seconds');
const seconds = at >= 0 ? Number(args[at + 1]) : 60;
const stepsAt = args.indexOf('--steps');
const steps = stepsAt >= 0 ? Number(args[stepsAt + 1]) : 1000;
if (!Number.isFinite(seconds) || seconds <= 0 || !Number.isInteger(steps) || steps <= 0) {
  process.stderr.write('usage: npm run sim -- [--seconds N] [--steps N]\n');
  process.exit(2);
}

async function main(): Promise<void> {
  const fixed = process.env['SIM_SEED'];
  if (fixed !== undefined) {
    const stats = await simulate(Number(fixed), steps);
    process.stdout.write(`seed ${fixed}: ok ${JSON.stringify(stats)}\n`);
    return;
  }
  const deadline = Date.now() + seconds * 1000;
  let runs = 0;
  while (Date.now() < deadline) {
    const seed = Math.floor(Math.random() * 2 ** 31);
    await simulate(seed, steps);
    runs++;
  }
  process.stdout.write(`${runs} random seeds of ${steps} steps passed in ${seconds} s\n`);
}

main().catch((error: unknown) => {
  const shown =
    error instanceof SimulationFailure
      ? error.message
      : String(error instanceof Error ? error.stack : error);
  process.stderr.write(`${shown}\n`);
  process.exit(1);
});
