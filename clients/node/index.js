// batchonce for Node.js command jobs: the run's context from the
// environment the worker gives the script, fenced transactions (nothing a
// copy that lost its lease writes can commit), progress the operator sees,
// skip, a clean stop on shutdown, and enqueue from an application.
'use strict';

/** A variable of the run's environment is missing or malformed. */
class ContextError extends Error {
  constructor(message) {
    super(message);
    this.name = 'ContextError';
  }
}

/** The run's lease is gone: another attempt owns the run now, and nothing of this transaction committed. */
class LeaseLostError extends Error {
  constructor(key, cause) {
    super(`lease lost for ${key}: the run was taken over, expired or finished; nothing of this transaction was committed`);
    this.name = 'LeaseLostError';
    this.key = key;
    this.cause = cause;
  }
}

/** Thrown to end the attempt as SKIPPED: nothing to do for the period. */
class SkipRun extends Error {
  constructor(reason) {
    super(oneLine(reason));
    this.name = 'SkipRun';
    this.reason = oneLine(reason);
  }
}

/** Thrown to fail the run at once, without a retry (bad input, a bug). */
class FatalError extends Error {
  constructor(message) {
    super(message);
    this.name = 'FatalError';
  }
}

/** Thrown by `throwIfStopping()` once the worker asked the script to stop. */
class StoppedError extends Error {
  constructor() {
    super('stopped: the worker is shutting down; the run is released and retried');
    this.name = 'StoppedError';
  }
}

/** `enqueue` was refused by the database (see `code`). */
class EnqueueError extends Error {
  constructor(message, code) {
    super(message);
    this.name = 'EnqueueError';
    this.code = code;
  }
}

function oneLine(s) {
  return String(s).replace(/[\r\n]+/g, ' ').trim();
}

const DATE = /^(\d{4})-(\d{2})-(\d{2})$/;

function parseDate(name, v) {
  const m = DATE.exec(v);
  const d = m && new Date(Date.UTC(+m[1], +m[2] - 1, +m[3]));
  if (!m || d.getUTCFullYear() !== +m[1] || d.getUTCMonth() !== +m[2] - 1 || d.getUTCDate() !== +m[3]) {
    throw new ContextError(`${name} is ${JSON.stringify(v)}: expected a date YYYY-MM-DD`);
  }
  return v;
}

/**
 * The run's context, read from the environment the batchonce worker gives a
 * command job and checked: each missing or malformed variable is one
 * ContextError naming it.
 */
function context(env = process.env) {
  const need = (name) => {
    const v = env[name];
    if (v === undefined || v === '') {
      throw new ContextError(`${name} is not set: run this script as a batchonce command job`);
    }
    return v;
  };
  const key = need('BATCHONCE_JOB_KEY');
  const job = need('BATCHONCE_JOB_NAME');
  if (!/^[a-z0-9]+(-[a-z0-9]+)*$/.test(job)) {
    throw new ContextError(`BATCHONCE_JOB_NAME is ${JSON.stringify(job)}: expected a job name such as nightly-invoices`);
  }
  if (!key.startsWith(`${job}:`)) {
    throw new ContextError(`BATCHONCE_JOB_KEY is ${JSON.stringify(key)}: expected ${job}:<period>`);
  }
  const businessDate = parseDate('BATCHONCE_BUSINESS_DATE', need('BATCHONCE_BUSINESS_DATE'));
  const attemptText = need('BATCHONCE_ATTEMPT');
  if (!/^[1-9]\d{0,3}$/.test(attemptText)) {
    throw new ContextError(`BATCHONCE_ATTEMPT is ${JSON.stringify(attemptText)}: expected a whole number from 1`);
  }
  const leaseToken = need('BATCHONCE_LEASE_TOKEN');
  if (!/^-?\d{1,19}$/.test(leaseToken)) {
    throw new ContextError(`BATCHONCE_LEASE_TOKEN is ${JSON.stringify(leaseToken)}: expected a 64-bit integer`);
  }
  const instant = (name) => {
    const v = need(name);
    const t = new Date(v);
    if (Number.isNaN(t.getTime()) || !/^\d{4}-\d{2}-\d{2}T/.test(v)) {
      throw new ContextError(`${name} is ${JSON.stringify(v)}: expected an RFC 3339 instant`);
    }
    return t;
  };
  const periodStart = instant('BATCHONCE_PERIOD_START');
  const periodEnd = instant('BATCHONCE_PERIOD_END');
  if (!(periodStart < periodEnd)) {
    throw new ContextError(`BATCHONCE_PERIOD_START (${env.BATCHONCE_PERIOD_START}) is not before BATCHONCE_PERIOD_END (${env.BATCHONCE_PERIOD_END})`);
  }
  let payload = {};
  if (env.BATCHONCE_PAYLOAD !== undefined && env.BATCHONCE_PAYLOAD !== '') {
    try {
      payload = JSON.parse(env.BATCHONCE_PAYLOAD);
    } catch (e) {
      throw new ContextError(`BATCHONCE_PAYLOAD is not JSON: ${e.message}`);
    }
  }
  let leaseTtlMs = null;
  if (env.BATCHONCE_LEASE_TTL_MS !== undefined && env.BATCHONCE_LEASE_TTL_MS !== '') {
    if (!/^[1-9]\d{0,11}$/.test(env.BATCHONCE_LEASE_TTL_MS)) {
      throw new ContextError(`BATCHONCE_LEASE_TTL_MS is ${JSON.stringify(env.BATCHONCE_LEASE_TTL_MS)}: expected milliseconds`);
    }
    leaseTtlMs = Number(env.BATCHONCE_LEASE_TTL_MS);
  }
  return Object.freeze({
    key,
    job,
    businessDate,
    attempt: Number(attemptText),
    leaseToken,
    workerId: env.BATCHONCE_WORKER_ID || null,
    timezone: need('BATCHONCE_TIMEZONE'),
    periodStart,
    periodEnd,
    leaseTtlMs,
    payload,
    databaseUrl: env.BATCHONCE_DATABASE_URL || env.DATABASE_URL || null,
  });
}

function isLeaseLost(e) {
  return e && e.code === 'BO001';
}

function count(name, n) {
  if (!Number.isSafeInteger(n) || n < 0) {
    throw new TypeError(`${name} must be a whole number of items, 0 or more, not ${n}`);
  }
  return n;
}

/**
 * Runs `fn(tx)` in one transaction on `client` that first calls
 * `batchonce_fence`: it commits only while this attempt holds the run's
 * lease. `tx.query` runs on the client; `tx.progress(processed, failed)`
 * adds to the run's counts, written in the same transaction. A lost lease
 * rejects with LeaseLostError; any error rolls the transaction back.
 */
async function fenced(client, ctx, fn) {
  const began = Date.now();
  let processed = 0;
  let failed = 0;
  const tx = {
    query: (...args) => client.query(...args),
    progress(p, f = 0) {
      processed += count('processed', p);
      failed += count('failed', f);
    },
  };
  await client.query('BEGIN');
  try {
    await client.query('SELECT batchonce_fence($1, $2)', [ctx.key, ctx.leaseToken]);
    const result = await fn(tx);
    if (processed > 0 || failed > 0) {
      await client.query('SELECT batchonce_progress($1, $2, $3, $4)', [ctx.key, ctx.leaseToken, processed, failed]);
    }
    await client.query('COMMIT');
    const took = Date.now() - began;
    if (ctx.leaseTtlMs && took > ctx.leaseTtlMs / 3) {
      process.stderr.write(`batchonce: a fenced transaction of ${ctx.key} took ${took} ms, more than a third of its ${ctx.leaseTtlMs} ms lease; keep each one shorter, or the lease may not be renewed in time\n`);
    }
    return result;
  } catch (e) {
    try {
      await client.query('ROLLBACK');
    } catch (_) {
      // The connection may be gone; the server rolls back then.
    }
    if (isLeaseLost(e)) throw new LeaseLostError(ctx.key, e);
    throw e;
  }
}

/** Ends the attempt as SKIPPED with `reason` (printed as the last line on stdout, exit 3). */
function skip(reason) {
  process.stdout.write(`${oneLine(reason)}\n`, () => process.exit(3));
}

function exitWith(code, line, stream) {
  const out = stream === 'stdout' ? process.stdout : process.stderr;
  process.exitCode = code;
  if (line) out.write(`${line}\n`);
}

/**
 * The entry point of a command job: `run(async (ctx) => { ... })`. It reads
 * the context, stops the script cleanly on SIGTERM (`ctx.stopping`,
 * `ctx.signal`, `ctx.throwIfStopping()`), and turns how `main` ends into
 * the exit code batchonce expects: 0 success; SkipRun → 3 with its reason;
 * FatalError or ContextError → 2; anything else → 1 (retried).
 */
async function run(main, env = process.env) {
  let ctx;
  try {
    ctx = context(env);
  } catch (e) {
    exitWith(2, e.message);
    return;
  }
  const controller = new AbortController();
  const state = { stopping: false };
  const stop = () => {
    if (!state.stopping) {
      state.stopping = true;
      controller.abort();
    }
  };
  process.once('SIGTERM', stop);
  process.once('SIGINT', stop);
  const live = Object.freeze({
    ...ctx,
    signal: controller.signal,
    get stopping() {
      return state.stopping;
    },
    throwIfStopping() {
      if (state.stopping) throw new StoppedError();
    },
  });
  try {
    await main(live);
    exitWith(0);
  } catch (e) {
    if (e instanceof SkipRun) exitWith(3, e.reason, 'stdout');
    else if (e instanceof FatalError) exitWith(2, e.message);
    else if (e instanceof LeaseLostError) exitWith(1, e.message);
    else if (e instanceof StoppedError) exitWith(1, e.message);
    else exitWith(1, (e && e.stack) || String(e));
  } finally {
    process.removeListener('SIGTERM', stop);
    process.removeListener('SIGINT', stop);
  }
}

function isoDate(d) {
  if (d instanceof Date) {
    if (Number.isNaN(d.getTime())) throw new TypeError('an invalid Date');
    return d.toISOString().slice(0, 10);
  }
  return parseDate('a date', String(d));
}

/**
 * Enqueues one run of a declared daily job per date, with `payload`, in one
 * statement. The job's configuration comes from the live batchonce
 * processes that declare it. Resolves to the keys enqueued, the ones that
 * already existed (duplicates, untouched) and the ones the business
 * calendar skips (recorded as SKIPPED).
 */
async function enqueue(client, { job, dates, payload = {} }) {
  if (!Array.isArray(dates) || dates.length === 0) {
    throw new TypeError('dates must be a non-empty array of Date or YYYY-MM-DD');
  }
  let list;
  try {
    list = dates.map(isoDate);
  } catch (e) {
    throw new TypeError(`dates: ${e.message}`);
  }
  let rows;
  try {
    ({ rows } = await client.query(
      'SELECT job_key, outcome FROM batchonce_enqueue_declared($1, $2::date[], $3::jsonb)',
      [job, list, JSON.stringify(payload)],
    ));
  } catch (e) {
    if (e && ['BO002', 'BO003', 'BO004', '22023'].includes(e.code)) {
      throw new EnqueueError(e.message, e.code);
    }
    throw e;
  }
  const out = { enqueued: [], duplicates: [], skipped: [] };
  for (const r of rows) {
    if (r.outcome === 'enqueued') out.enqueued.push(r.job_key);
    else if (r.outcome === 'duplicate') out.duplicates.push(r.job_key);
    else out.skipped.push(r.job_key);
  }
  return out;
}

module.exports = {
  context,
  fenced,
  run,
  skip,
  enqueue,
  ContextError,
  LeaseLostError,
  SkipRun,
  FatalError,
  StoppedError,
  EnqueueError,
};
