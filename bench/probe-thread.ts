/**
 * The worker thread `startProbes` (probe.ts) runs: it probes its targets until told to
 * stop, so the soak's own work never sits between a probe's timestamps.
 */
import { parentPort, workerData } from 'node:worker_threads';
import { runProbeThread, type ProbeTarget } from './probe.js';

const port = parentPort;
if (port === null) throw new Error('probe-thread.ts runs as a worker thread');
const { targets } = workerData as { targets: ProbeTarget[] };
await runProbeThread(targets, port, (message) => port.postMessage(message));
port.close();
