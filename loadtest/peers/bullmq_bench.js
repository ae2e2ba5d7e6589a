// One BullMQ scenario against one Redis, for loadtest/bench_peers.py.
//
//   node bullmq_bench.js --port 17001 --scenario publish --seconds 5 [--warmup 1] [--jobs N]
//                        [--steps 200] [--concurrency 64]
//
// Scenarios: publish (queue.add, 64 in flight), bulk (addBulk of 64, 16 in flight), consume
// (a Worker with a no-op processor on a pre-filled queue), e2e (addBulk producers and a
// Worker), precision (delayed jobs; lateness = delivery - due) and memory (delayed jobs).
//
// Protocol on stdout, one JSON object a line: {"ready": true} once set up (connected, queue
// pre-filled); then the script waits for one line on stdin and runs; {"warm": true} when the
// warm-up ends and the measured window starts; last the figures {"jobs", "seconds", "errors",
// "lateness_ms"?}. The caller reads the CPU of this process and of Redis at "warm" and at the
// end. Completed jobs are removed (removeOnComplete), as cluster_dq removes acked jobs.
'use strict';

const readline = require('node:readline');
const { Queue, Worker } = require('bullmq');

const BODY = 'x'.repeat(64);
const QUEUE = 'bench';
const JOB_OPTS = { removeOnComplete: true, removeOnFail: true };
const BACKLOG = 1024; // e2e: producers wait while more jobs than this are queued

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const say = (obj) => console.log(JSON.stringify(obj));
const bulkOf = (n, opts = JOB_OPTS) =>
  Array.from({ length: n }, () => ({ name: 'j', data: BODY, opts }));

function parseArgs(argv) {
  const args = {
    scenario: 'publish', seconds: 5, warmup: 1, jobs: 0, steps: 200, concurrency: 64, port: 0,
  };
  for (let i = 2; i < argv.length; i += 2) {
    const key = argv[i].replace(/^--/, '');
    args[key] = key === 'scenario' ? argv[i + 1] : Number(argv[i + 1]);
  }
  return args;
}

function waitForLine() {
  const rl = readline.createInterface({ input: process.stdin });
  return new Promise((resolve) => rl.once('line', () => { rl.close(); resolve(); }));
}

// Counts jobs done inside the measured window: from the end of the warm-up to the last job.
class Meter {
  constructor(warmup, announce = true) {
    this.from = Date.now() + warmup * 1000;
    this.jobs = 0;
    this.last = this.from;
    this.errors = 0;
    if (announce) setTimeout(() => say({ warm: true }), warmup * 1000);
  }

  count(n) {
    const now = Date.now();
    if (now >= this.from) {
      this.jobs += n;
      this.last = now;
    }
  }

  figures(end = this.last) {
    return { jobs: this.jobs, seconds: Math.max(0, end - this.from) / 1000, errors: this.errors };
  }
}

// Runs `call` (returns the jobs it did) from `inflight` loops until the window ends.
async function loops(meter, inflight, seconds, call) {
  const stop = meter.from + seconds * 1000;
  await Promise.all(Array.from({ length: inflight }, async () => {
    while (Date.now() < stop) {
      try {
        meter.count(await call());
      } catch {
        meter.errors += 1;
      }
    }
  }));
}

// A Worker with a processor `onJob` (no-op by default), counting completions into `meter`
// once started; `start()` resolves after `seconds` or at `limit` completions.
function consumer(connection, concurrency, onJob = () => {}) {
  const worker = new Worker(QUEUE, async (job) => onJob(job), {
    connection, concurrency, autorun: false,
  });
  let meter = null;
  let finish = () => {};
  let completed = 0;
  let limit = Infinity;
  worker.on('completed', () => {
    completed += 1;
    meter?.count(1);
    if (completed >= limit) finish();
  });
  worker.on('failed', () => { if (meter) meter.errors += 1; });
  worker.on('error', () => { if (meter) meter.errors += 1; });
  const start = (m, seconds, max = Infinity) => {
    meter = m;
    limit = max;
    const done = new Promise((resolve) => { finish = resolve; });
    setTimeout(finish, Math.max(0, m.from + seconds * 1000 - Date.now()));
    worker.run();
    return done;
  };
  return { worker, start, completed: () => completed };
}

async function prefill(queue, jobs) {
  for (let done = 0; done < jobs; done += 1000) {
    await queue.addBulk(bulkOf(Math.min(1000, jobs - done)));
  }
}

async function publish(queue, connection, args, inflight, call) {
  return async () => {
    const meter = new Meter(args.warmup);
    await loops(meter, inflight, args.seconds, call);
    return meter.figures();
  };
}

async function consume(queue, connection, args) {
  await prefill(queue, args.jobs);
  const c = consumer(connection, args.concurrency);
  await c.worker.waitUntilReady();
  return async () => {
    const meter = new Meter(args.warmup);
    await c.start(meter, args.seconds, args.jobs);
    await c.worker.close(true);
    return meter.figures();
  };
}

// Producers and a Worker at once; the producers wait while more than BACKLOG jobs are queued,
// so the figure is the rate at which jobs go through (cluster_dq's clients likewise publish
// 64 and then consume what is there).
async function endToEnd(queue, connection, args) {
  const c = consumer(connection, args.concurrency);
  await c.worker.waitUntilReady();
  let added = 0;
  const produce = async () => {
    while (added - c.completed() >= BACKLOG) await sleep(1);
    const jobs = await queue.addBulk(bulkOf(64));
    added += jobs.length;
    return 0; // counted when completed
  };
  return async () => {
    const meter = new Meter(args.warmup);
    const consuming = c.start(meter, args.seconds);
    await loops(new Meter(0, false), 8, args.warmup + args.seconds, produce);
    await consuming;
    await c.worker.close(true);
    return meter.figures(Date.now());
  };
}

// `jobs` delayed jobs due over 2 s in `steps` steps, the first 2 s from the start, added in
// one addBulk per step from 16 loops; a Worker waits and notes lateness = delivery - due.
async function precision(queue, connection, args) {
  const lateness = [];
  const c = consumer(connection, args.concurrency, (job) => {
    lateness.push(Date.now() - job.data.due);
  });
  await c.worker.waitUntilReady();
  return async () => {
    const meter = new Meter(0);
    const consuming = c.start(meter, 30, args.jobs);
    const first = Date.now() + 2000;
    const perStep = args.jobs / args.steps;
    let step = 0;
    await Promise.all(Array.from({ length: 16 }, async () => {
      while (step < args.steps) {
        const due = first + Math.floor((step++ * 2000) / args.steps);
        const opts = { ...JOB_OPTS, delay: Math.max(0, due - Date.now()) };
        await queue.addBulk(Array.from({ length: perStep }, () => ({ name: 'j', data: { due }, opts })));
      }
    }));
    await consuming;
    await c.worker.close(true);
    return { ...meter.figures(), lateness_ms: lateness };
  };
}

// `jobs` delayed jobs (64-byte bodies) due between 1 and 2 hours from now, in bulks of 64.
async function memory(queue, connection, args) {
  const delayed = () => ({ ...JOB_OPTS, delay: 3600000 + Math.floor(Math.random() * 3600000) });
  return async () => {
    const meter = new Meter(0);
    let left = args.jobs;
    await Promise.all(Array.from({ length: 16 }, async () => {
      while (left > 0) {
        const n = Math.min(64, left);
        left -= n;
        const jobs = Array.from({ length: n }, () => ({ name: 'j', data: BODY, opts: delayed() }));
        meter.count((await queue.addBulk(jobs)).length);
      }
    }));
    return meter.figures();
  };
}

const SCENARIOS = {
  publish: (queue, connection, args) =>
    publish(queue, connection, args, 64, () => queue.add('j', BODY, JOB_OPTS).then(() => 1)),
  bulk: (queue, connection, args) =>
    publish(queue, connection, args, 16, () => queue.addBulk(bulkOf(64)).then((js) => js.length)),
  consume,
  e2e: endToEnd,
  precision,
  memory,
};

async function main() {
  const args = parseArgs(process.argv);
  const setup = SCENARIOS[args.scenario];
  if (!setup) throw new Error(`unknown scenario ${args.scenario}`);
  const connection = { host: '127.0.0.1', port: args.port, maxRetriesPerRequest: null };
  const queue = new Queue(QUEUE, { connection });
  await queue.waitUntilReady();
  const run = await setup(queue, connection, args);
  say({ ready: true });
  await waitForLine();
  say(await run());
  await queue.close();
  process.exit(0);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
