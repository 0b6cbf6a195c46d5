// batchonce for Node.js command jobs: the run's context from the
// environment the worker gives the script, fenced transactions (nothing a
// copy that lost its lease writes can commit), progress the operator sees,
// skip, a clean stop on shutdown, and enqueue from an application.
'use strict';
const crypto = require('node:crypto');
const fs = require('node:fs');
const util = require('node:util');

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

/** `v` if it is a real calendar date `YYYY-MM-DD`, else null. */
function calendarDate(v) {
  const m = DATE.exec(v);
  if (!m) return null;
  const d = new Date(Date.UTC(+m[1], +m[2] - 1, +m[3]));
  d.setUTCFullYear(+m[1]); // years 0-99 too
  if (d.getUTCFullYear() !== +m[1] || d.getUTCMonth() !== +m[2] - 1 || d.getUTCDate() !== +m[3]) return null;
  return v;
}

function parseDate(name, v) {
  if (calendarDate(v) === null) {
    throw new ContextError(`${name} is ${JSON.stringify(v)}: expected a date YYYY-MM-DD`);
  }
  return v;
}

// RFC 3339 with its offset: without one, JavaScript would read local time.
const INSTANT = /^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$/;
const INT64_MIN = -(2n ** 63n);
const INT64_MAX = 2n ** 63n - 1n;

// What follows `<job>:` in a key: the period, an optional `@<scope>` and an
// optional partition suffix, the rule of the schema's CHECK.
const KEY_REST = /^[0-9T:-]+(?:@([a-z0-9]+(?:-[a-z0-9]+)*))?(?:\.p[1-9]\d{0,2})?$/;
const SCOPE = /^[a-z0-9]+(-[a-z0-9]+)*$/;
const MAX_SCOPE_LEN = 36;

/** Whether `s` is a scope: 1-36 lowercase letters, digits and single dashes. */
function isScope(s) {
  return typeof s === 'string' && s.length <= MAX_SCOPE_LEN && SCOPE.test(s);
}

function isTimeZone(tz) {
  try {
    new Intl.DateTimeFormat('en-US', { timeZone: tz });
    return true;
  } catch (_) {
    return false;
  }
}

const DB_SECRET_PARAMS = /^(password|sslpassword|sslkey)$/i;

/**
 * The database URL as it may be shown: its password, and any password in its
 * query, replaced by `***`. A string that is no URL is not shown at all.
 */
function redactUrl(u) {
  if (u === null || u === undefined) return null;
  try {
    const url = new URL(u);
    if (url.password) url.password = '***';
    for (const k of [...url.searchParams.keys()]) {
      if (DB_SECRET_PARAMS.test(k)) url.searchParams.set(k, '***');
    }
    return url.toString();
  } catch (_) {
    return '[redacted]';
  }
}

// A context printed (console.log, util.inspect, JSON.stringify) shows the
// database URL without its password: scripts print their context while they
// are being written, and the output lands in the worker's log. The methods
// are not enumerable, so keys and spreads are unchanged; a copy made with a
// spread prints what it holds.
function printable(obj) {
  const shown = {};
  for (const k of Object.keys(obj)) shown[k] = obj[k];
  if ('databaseUrl' in shown) shown.databaseUrl = redactUrl(shown.databaseUrl);
  return shown;
}

function frozenContext(obj) {
  Object.defineProperty(obj, 'toJSON', {
    value() {
      return printable(this);
    },
  });
  Object.defineProperty(obj, util.inspect.custom, {
    value() {
      return printable(this);
    },
  });
  return Object.freeze(obj);
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
  // <job>:<period>[@<scope>][.p<n>]: a scoped run's key names its scope.
  const keyParts = key.startsWith(`${job}:`) ? KEY_REST.exec(key.slice(job.length + 1)) : null;
  if (!keyParts || (keyParts[1] !== undefined && !isScope(keyParts[1]))) {
    throw new ContextError(`BATCHONCE_JOB_KEY is ${JSON.stringify(key)}: expected ${job}:<period> or ${job}:<period>@<scope>, e.g. ${job}:2026-09-15 or ${job}:2026-09-15@seller-4711`);
  }
  const keyScope = keyParts[1] === undefined ? null : keyParts[1];
  const businessDate = parseDate('BATCHONCE_BUSINESS_DATE', need('BATCHONCE_BUSINESS_DATE'));
  const attemptText = need('BATCHONCE_ATTEMPT');
  if (!/^[1-9]\d{0,8}$/.test(attemptText)) {
    throw new ContextError(`BATCHONCE_ATTEMPT is ${JSON.stringify(attemptText)}: expected a whole number from 1`);
  }
  const leaseToken = need('BATCHONCE_LEASE_TOKEN');
  if (!/^-?\d{1,19}$/.test(leaseToken) || BigInt(leaseToken) < INT64_MIN || BigInt(leaseToken) > INT64_MAX) {
    throw new ContextError(`BATCHONCE_LEASE_TOKEN is ${JSON.stringify(leaseToken)}: expected a 64-bit integer`);
  }
  const instant = (name) => {
    const v = need(name);
    const t = new Date(v);
    if (!INSTANT.test(v) || Number.isNaN(t.getTime())) {
      throw new ContextError(`${name} is ${JSON.stringify(v)}: expected an RFC 3339 instant with its offset, e.g. 2026-09-14T15:00:00+00:00`);
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
  // The step of a partitioned run: a partition works on the items for
  // which batchonce_partition(item_key, partitions) = partition.
  const step = env.BATCHONCE_STEP || 'whole';
  if (!['whole', 'partition', 'final'].includes(step)) {
    throw new ContextError(`BATCHONCE_STEP is ${JSON.stringify(step)}: expected whole, partition or final`);
  }
  const small = (name) => {
    const v = need(name);
    if (!/^[1-9]\d{0,2}$/.test(v) || Number(v) > 256) {
      throw new ContextError(`${name} is ${JSON.stringify(v)}: expected a whole number from 1 to 256`);
    }
    return Number(v);
  };
  const partitions = step === 'whole' ? null : small('BATCHONCE_PARTITIONS');
  const partition = step === 'partition' ? small('BATCHONCE_PARTITION') : null;
  if (partition !== null && partition > partitions) {
    throw new ContextError(`BATCHONCE_PARTITION (${partition}) is more than BATCHONCE_PARTITIONS (${partitions})`);
  }
  if ((step === 'partition') !== /\.p\d+$/.test(key)) {
    throw new ContextError(`BATCHONCE_JOB_KEY ${JSON.stringify(key)} does not match BATCHONCE_STEP ${step}`);
  }
  // A scoped run's scope: the worker sets BATCHONCE_SCOPE to the scope its
  // key names, and leaves it unset for an unscoped run.
  let scope = null;
  if (env.BATCHONCE_SCOPE !== undefined && env.BATCHONCE_SCOPE !== '') {
    scope = env.BATCHONCE_SCOPE;
    if (!isScope(scope)) {
      throw new ContextError(`BATCHONCE_SCOPE is ${JSON.stringify(scope)}: expected a scope of 1-36 lowercase letters, digits and single dashes, e.g. seller-4711`);
    }
  }
  if (scope !== keyScope) {
    throw new ContextError(`BATCHONCE_JOB_KEY ${JSON.stringify(key)} does not match BATCHONCE_SCOPE ${scope === null ? '(not set)' : scope}`);
  }
  const timezone = need('BATCHONCE_TIMEZONE');
  if (!isTimeZone(timezone)) {
    throw new ContextError(`BATCHONCE_TIMEZONE is ${JSON.stringify(timezone)}: expected an IANA time zone such as Asia/Seoul`);
  }
  return frozenContext({
    key,
    job,
    businessDate,
    attempt: Number(attemptText),
    leaseToken,
    workerId: env.BATCHONCE_WORKER_ID || null,
    timezone,
    periodStart,
    periodEnd,
    leaseTtlMs,
    payload,
    step,
    partition,
    partitions,
    scope,
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

// A pg.Pool runs each query on whichever connection is free, so BEGIN, the
// fence and the caller's writes could each land on a different one.
function isPool(c) {
  return c && typeof c.release !== 'function' && 'totalCount' in c && 'idleCount' in c;
}

// The clients inside a fenced transaction: a nested `fenced` on the same
// client would COMMIT the outer transaction early.
const inFence = new WeakSet();

/**
 * Runs `fn(tx)` in one transaction on `client` that first calls
 * `batchonce_fence`: it commits only while this attempt holds the run's
 * lease. `tx.query` runs on the client; `tx.progress(processed, failed)`
 * adds to the run's counts, written in the same transaction. A lost lease
 * rejects with LeaseLostError; any error rolls the transaction back.
 */
async function fenced(client, ctx, fn) {
  if (!client || typeof client.query !== 'function' || isPool(client)) {
    throw new TypeError('fenced needs one connection: a pg Client, or a client from pool.connect() (not a Pool, whose queries may each run on another connection)');
  }
  if (!ctx || typeof ctx.key !== 'string' || typeof ctx.leaseToken !== 'string') {
    throw new TypeError('fenced needs the run\'s context, from batchonce.context() or run()');
  }
  if (typeof fn !== 'function') throw new TypeError('fenced needs a function (tx) => ...');
  if (inFence.has(client)) {
    throw new Error('fenced: this client is already in a fenced transaction; use its tx instead of nesting');
  }
  inFence.add(client);
  const began = Date.now();
  let processed = 0;
  let failed = 0;
  let open = true;
  const tx = {
    query: (...args) => client.query(...args),
    progress(p, f = 0) {
      if (!open) throw new Error('tx.progress called after its fenced transaction ended');
      const np = processed + count('processed', p);
      const nf = failed + count('failed', f);
      processed = np;
      failed = nf;
    },
  };
  try {
    await client.query('BEGIN');
    try {
      await client.query('SELECT batchonce_fence($1, $2)', [ctx.key, ctx.leaseToken]);
      const result = await fn(tx);
      open = false;
      if (processed > 0 || failed > 0) {
        await client.query('SELECT batchonce_progress($1, $2, $3, $4)', [ctx.key, ctx.leaseToken, processed, failed]);
      }
      await client.query('COMMIT');
      return result;
    } catch (e) {
      open = false;
      try {
        await client.query('ROLLBACK');
      } catch (_) {
        // The connection may be gone; the server rolls back then.
      }
      if (isLeaseLost(e)) throw new LeaseLostError(ctx.key, e);
      throw e;
    }
  } finally {
    open = false;
    inFence.delete(client);
    const took = Date.now() - began;
    if (ctx.leaseTtlMs && took > ctx.leaseTtlMs / 3) {
      process.stderr.write(`batchonce: a fenced transaction of ${ctx.key} took ${took} ms, more than a third of its ${ctx.leaseTtlMs} ms lease; keep each one shorter (smaller chunks), or the lease may not be renewed in time\n`);
    }
  }
}

/**
 * Ends the attempt as SKIPPED at once: prints `reason` (one line) as the
 * last line on stdout and exits 3, without running any `finally`. Inside
 * `run`, `throw new SkipRun(reason)` is the gentler way.
 */
function skip(reason) {
  fs.writeSync(1, `${oneLine(reason)}\n`);
  process.exit(3);
}

function write(stream, line) {
  if (line) (stream === 'stdout' ? process.stdout : process.stderr).write(`${line}\n`);
}

// How long `run` waits, once `main` has settled, for the event loop to empty
// before it exits anyway (something such as a client not ended is left).
const EXIT_GRACE_MS = 1000;

/**
 * The entry point of a command job: `run(async (ctx) => { ... })`. It reads
 * the context, stops the script cleanly on SIGTERM (`ctx.stopping`,
 * `ctx.signal`, `ctx.throwIfStopping()`), and turns how `main` ends into
 * the exit code batchonce expects: 0 success; SkipRun → 3 with its reason;
 * FatalError or ContextError → 2; anything else → 1 (retried). It owns the
 * process: call it once, as the script's entry point.
 */
async function run(main, env = process.env) {
  if (typeof main !== 'function') throw new TypeError('run needs a function async (ctx) => { ... }');
  let ctx;
  try {
    ctx = context(env);
  } catch (e) {
    finish(2, e instanceof ContextError ? e.message : (e && e.stack) || String(e));
    return;
  }
  const controller = new AbortController();
  const state = { stopping: false };
  // Once: a second SIGTERM or ^C then ends the process at once.
  const stop = () => {
    state.stopping = true;
    controller.abort(new StoppedError());
  };
  process.once('SIGTERM', stop);
  process.once('SIGINT', stop);
  const live = frozenContext({
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
    finish(0);
  } catch (e) {
    if (e instanceof SkipRun) finish(3, e.reason, 'stdout');
    else if (e instanceof FatalError || e instanceof ContextError) finish(2, e.message);
    else if (e instanceof LeaseLostError || e instanceof StoppedError) finish(1, e.message);
    else finish(1, (e && e.stack) || String(e));
  } finally {
    process.removeListener('SIGTERM', stop);
    process.removeListener('SIGINT', stop);
  }
}

function finish(code, line, stream) {
  write(stream, line);
  process.exitCode = code;
  setTimeout(() => {
    process.stderr.write(`batchonce: the script's work is done but something still keeps it running (a database client not ended?); exiting with ${code}\n`);
    process.exit(code);
  }, EXIT_GRACE_MS).unref();
}

const FIRST_DATE = '1970-01-01';
const LAST_DATE = '2199-12-31';

function isoDate(d) {
  let s;
  if (d instanceof Date) {
    if (Number.isNaN(d.getTime())) throw new TypeError('dates: an invalid Date');
    s = d.toISOString().slice(0, 10); // the Date's UTC calendar date
  } else if (typeof d === 'string') {
    s = d;
  } else {
    throw new TypeError(`dates: ${JSON.stringify(d)} is neither a Date nor a YYYY-MM-DD string`);
  }
  if (calendarDate(s) === null) throw new TypeError(`dates: ${JSON.stringify(s)} is not a date YYYY-MM-DD`);
  if (s < FIRST_DATE || s > LAST_DATE) {
    throw new TypeError(`dates: ${s} is outside ${FIRST_DATE}..${LAST_DATE}`);
  }
  return s;
}

/**
 * Enqueues one run of a declared daily job per date, with `payload`, in one
 * statement. The job's configuration comes from the live batchonce
 * processes that declare it. Resolves to the keys enqueued, the ones that
 * already existed (duplicates, untouched) and the ones the business
 * calendar skips (recorded as SKIPPED). A scoped job is refused (BO005):
 * its runs are enqueued per scope, by its producer or `batchonce enqueue`.
 */
async function enqueue(client, { job, dates, payload = {} } = {}) {
  if (typeof job !== 'string' || !/^[a-z0-9]+(-[a-z0-9]+)*$/.test(job)) {
    throw new TypeError(`job is ${JSON.stringify(job)}: expected a job name such as nightly-invoices`);
  }
  if (!Array.isArray(dates) || dates.length === 0) {
    throw new TypeError('dates must be a non-empty array of Date or YYYY-MM-DD');
  }
  const list = dates.map(isoDate);
  const json = JSON.stringify(payload);
  if (json === undefined) throw new TypeError('payload must be JSON');
  let rows;
  try {
    ({ rows } = await client.query(
      'SELECT job_key, outcome FROM batchonce_enqueue_declared($1, $2::date[], $3::jsonb)',
      [job, list, json],
    ));
  } catch (e) {
    if (e && ['BO002', 'BO003', 'BO004', 'BO005', '22023'].includes(e.code)) {
      throw new EnqueueError(e.message, e.code);
    }
    throw e;
  }
  const out = { enqueued: [], duplicates: [], skipped: [] };
  for (const r of rows) {
    if (r.outcome === 'enqueued') out.enqueued.push(r.job_key);
    else if (r.outcome === 'duplicate') out.duplicates.push(r.job_key);
    else if (r.outcome === 'skipped') out.skipped.push(r.job_key);
    else throw new Error(`batchonce_enqueue_declared returned an unknown outcome ${JSON.stringify(r.outcome)} for ${r.job_key}`);
  }
  return out;
}

/**
 * Runs `fn(item, index)` on `items` with at most `limit` calls in flight,
 * for I/O a chunk waits on (provider calls, HTTP requests). No new call
 * starts once `ctx.stopping`; those in flight finish. Resolves to the
 * settled results of the calls that started, in item order
 * (`{ status: 'fulfilled', value }` or `{ status: 'rejected', reason }`),
 * so the caller can record them in one `fenced` transaction and leave the
 * rest for the next attempt under the same idempotency keys.
 */
async function concurrently(ctx, items, limit, fn) {
  if (!Array.isArray(items)) throw new TypeError('concurrently needs an array of items');
  if (!Number.isInteger(limit) || limit < 1) throw new TypeError(`limit is ${JSON.stringify(limit)}: expected a whole number from 1`);
  if (typeof fn !== 'function') throw new TypeError('concurrently needs a function (item, index) => ...');
  const results = [];
  let next = 0;
  const stopping = () => Boolean(ctx && ctx.stopping);
  async function lane() {
    while (next < items.length && !stopping()) {
      const i = next;
      next += 1;
      try {
        results[i] = { status: 'fulfilled', value: await fn(items[i], i) };
      } catch (reason) {
        results[i] = { status: 'rejected', reason };
      }
    }
  }
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, lane));
  // Only the calls that started, in order: a stop leaves a tail unstarted.
  const started = [];
  for (let i = 0; i < items.length && results[i] !== undefined; i += 1) started.push(results[i]);
  return started;
}

/**
 * The partition (1..partitions) an item key belongs to, as the database's
 * batchonce_partition(item_key, partitions) computes it: the first 31 bits of
 * the key's MD5, modulo the count, plus one.
 */
function partitionOf(itemKey, partitions) {
  if (typeof itemKey !== 'string') {
    throw new TypeError(`partitionOf: the item key must be a string, not ${typeof itemKey}`);
  }
  if (!Number.isInteger(partitions) || partitions < 1 || partitions > 256) {
    throw new RangeError(`partitionOf: partitions must be a whole number from 1 to 256, not ${partitions}`);
  }
  const head = crypto.createHash('md5').update(itemKey, 'utf8').digest().readUInt32BE(0);
  return ((head & 0x7fffffff) % partitions) + 1;
}

module.exports = {
  context,
  partitionOf,
  fenced,
  concurrently,
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
