// The package against a real PostgreSQL migrated with batchonce's schema
// (DATABASE_URL). `workers/tests/node_client.rs` gives it a fresh database
// and runs these tests; under CI a missing DATABASE_URL fails them.
'use strict';
const test = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const { spawn } = require('node:child_process');
const { Client } = require('pg');
const batchonce = require('..');

const url = process.env.DATABASE_URL;
if (!url && process.env.CI) {
  throw new Error('DATABASE_URL is not set: these tests need a PostgreSQL migrated with batchonce\'s schema');
}
const db = { skip: url ? false : 'DATABASE_URL is not set (a database migrated with `batchonce migrate`)' };

let seq = 0;
function jobName(what) {
  seq += 1;
  return `node-${what}-${process.pid}-${seq}`;
}

async function connect() {
  const c = new Client({ connectionString: url });
  await c.connect();
  return c;
}

const SETTINGS = {
  timezone: 'Asia/Seoul',
  schedule: null,
  covers: 'previous-day',
  catch_up: '7days',
  skip_dates: ['2026-12-25'],
  skip_weekdays: ['Sat'],
  enabled: true,
  max_attempts: 3,
  lease_ttl: '30s',
  stale_after: '20m',
  chunk_size: 500,
  chunk_pause: '0s',
  backoff: '10s',
  backoff_max: '5m',
  on_lease_expiry: 'retry',
  max_item_failures: null,
  options: {},
  command: null,
};

/** A live producer declaring `job`, as `batchonce produce` registers itself. */
async function declare(c, job, settings = SETTINGS, fingerprint = 'f1') {
  const id = `producer-${job}-${fingerprint}`;
  await c.query(
    `INSERT INTO batch_worker (worker_id, host, pid, version, started_at, last_seen, role, live_until)
     VALUES ($1, 'test', 1, 'test', now(), now(), 'producer', now() + interval '1 minute')`,
    [id],
  );
  await c.query(
    'INSERT INTO batch_process_config (process_id, job_name, fingerprint, settings) VALUES ($1, $2, $3, $4)',
    [id, job, fingerprint, JSON.stringify(settings)],
  );
}

/** Enqueues and claims one run of a fresh job; returns its context. */
async function claimed(c, what) {
  const job = jobName(what);
  await declare(c, job);
  const r = await batchonce.enqueue(c, { job, dates: ['2026-09-15'] });
  assert.deepEqual(r.enqueued, [`${job}:2026-09-15`]);
  const { rows } = await c.query(
    "SELECT job_key, lease_token::text AS token, attempts FROM batchonce_claim(ARRAY[$1], ARRAY[30::float8], 1, 'node-test', NULL)",
    [job],
  );
  assert.equal(rows.length, 1);
  await c.query(`CREATE TABLE IF NOT EXISTS node_item (job text, n int, PRIMARY KEY (job, n))`);
  return batchonce.context(envOf(rows[0].job_key, job, rows[0].token));
}

function envOf(key, job, token, extra = {}) {
  return {
    BATCHONCE_JOB_KEY: key,
    BATCHONCE_JOB_NAME: job,
    BATCHONCE_BUSINESS_DATE: '2026-09-15',
    BATCHONCE_ATTEMPT: '1',
    BATCHONCE_LEASE_TOKEN: token,
    BATCHONCE_WORKER_ID: 'node-test',
    BATCHONCE_TIMEZONE: 'Asia/Seoul',
    BATCHONCE_PERIOD_START: '2026-09-14T15:00:00+00:00',
    BATCHONCE_PERIOD_END: '2026-09-15T15:00:00+00:00',
    BATCHONCE_PAYLOAD: '{"campaign":"autumn"}',
    BATCHONCE_LEASE_TTL_MS: '30000',
    ...extra,
  };
}

test('the context is read and every bad variable is one clear error', () => {
  const env = envOf('invoices:2026-09-15', 'invoices', '1152921504606846975');
  const ctx = batchonce.context(env);
  assert.equal(ctx.key, 'invoices:2026-09-15');
  assert.equal(ctx.attempt, 1);
  assert.equal(ctx.leaseToken, '1152921504606846975', 'the token is never rounded');
  assert.deepEqual(ctx.payload, { campaign: 'autumn' });
  assert.equal(ctx.periodStart.toISOString(), '2026-09-14T15:00:00.000Z');
  assert.equal(ctx.leaseTtlMs, 30000);
  assert.ok(Object.isFrozen(ctx));
  const bad = [
    [{ BATCHONCE_JOB_KEY: undefined }, /BATCHONCE_JOB_KEY is not set/],
    [{ BATCHONCE_JOB_KEY: 'other:2026-09-15' }, /BATCHONCE_JOB_KEY .*expected invoices:<period>/],
    [{ BATCHONCE_JOB_NAME: 'Invoices' }, /BATCHONCE_JOB_NAME/],
    [{ BATCHONCE_BUSINESS_DATE: '2026-02-30' }, /BATCHONCE_BUSINESS_DATE is "2026-02-30": expected a date/],
    [{ BATCHONCE_ATTEMPT: 'x' }, /BATCHONCE_ATTEMPT is "x": expected a whole number from 1/],
    [{ BATCHONCE_ATTEMPT: '0' }, /BATCHONCE_ATTEMPT/],
    [{ BATCHONCE_LEASE_TOKEN: '12.5' }, /BATCHONCE_LEASE_TOKEN/],
    [{ BATCHONCE_PERIOD_START: 'yesterday' }, /BATCHONCE_PERIOD_START is "yesterday"/],
    [{ BATCHONCE_PERIOD_END: '2026-09-14T15:00:00+00:00' }, /is not before BATCHONCE_PERIOD_END/],
    [{ BATCHONCE_PAYLOAD: '{' }, /BATCHONCE_PAYLOAD is not JSON/],
    [{ BATCHONCE_LEASE_TTL_MS: '-1' }, /BATCHONCE_LEASE_TTL_MS/],
    [{ BATCHONCE_TIMEZONE: '' }, /BATCHONCE_TIMEZONE is not set/],
  ];
  for (const [change, message] of bad) {
    const e = { ...env, ...change };
    for (const [k, v] of Object.entries(change)) if (v === undefined) delete e[k];
    assert.throws(() => batchonce.context(e), (err) => err instanceof batchonce.ContextError && message.test(err.message), JSON.stringify(change));
  }
});

test('a fenced transaction commits its rows and its progress', db, async () => {
  const c = await connect();
  try {
    const ctx = await claimed(c, 'commit');
    const n = await batchonce.fenced(c, ctx, async (tx) => {
      await tx.query('INSERT INTO node_item VALUES ($1, 1), ($1, 2), ($1, 3)', [ctx.job]);
      tx.progress(3);
      tx.progress(0, 1);
      return 3;
    });
    assert.equal(n, 3);
    const { rows } = await c.query(
      'SELECT r.processed_count::int AS p, r.failed_count::int AS f, a.processed_count::int AS ap FROM batch_job_run r JOIN batch_job_attempt a USING (job_key) WHERE job_key = $1',
      [ctx.key],
    );
    assert.deepEqual(rows[0], { p: 3, f: 1, ap: 3 });
    const items = await c.query('SELECT count(*)::int AS n FROM node_item WHERE job = $1', [ctx.job]);
    assert.equal(items.rows[0].n, 3);
  } finally {
    await c.end();
  }
});

test('a lost lease is a LeaseLostError and nothing of the transaction commits', db, async () => {
  const c = await connect();
  try {
    const ctx = await claimed(c, 'lost');
    // Another attempt takes the run over: the token changes under us.
    await c.query('UPDATE batch_job_run SET lease_token = lease_token + 1 WHERE job_key = $1', [ctx.key]);
    // With progress reported, and without: the fence alone must refuse.
    for (const report of [true, false]) {
      await assert.rejects(
        batchonce.fenced(c, ctx, async (tx) => {
          await tx.query('INSERT INTO node_item VALUES ($1, 1)', [ctx.job]);
          if (report) tx.progress(1);
        }),
        (e) => e instanceof batchonce.LeaseLostError && e.key === ctx.key,
      );
    }
    const items = await c.query('SELECT count(*)::int AS n FROM node_item WHERE job = $1', [ctx.job]);
    assert.equal(items.rows[0].n, 0);
    // The client is usable afterwards: the transaction was rolled back.
    await c.query('SELECT 1');
  } finally {
    await c.end();
  }
});

test('an error inside rolls the transaction back and is rethrown', db, async () => {
  const c = await connect();
  try {
    const ctx = await claimed(c, 'rollback');
    await assert.rejects(
      batchonce.fenced(c, ctx, async (tx) => {
        await tx.query('INSERT INTO node_item VALUES ($1, 1)', [ctx.job]);
        throw new Error('the provider said no');
      }),
      /the provider said no/,
    );
    const items = await c.query('SELECT count(*)::int AS n FROM node_item WHERE job = $1', [ctx.job]);
    assert.equal(items.rows[0].n, 0);
    await assert.rejects(batchonce.fenced(c, ctx, async (tx) => tx.progress(-1)), /whole number/);
  } finally {
    await c.end();
  }
});

test('enqueue reports enqueued, duplicate and skipped keys, and refuses without a declaration', db, async () => {
  const c = await connect();
  try {
    const job = jobName('enqueue');
    await assert.rejects(
      batchonce.enqueue(c, { job, dates: ['2026-09-18'] }),
      (e) => e instanceof batchonce.EnqueueError && e.code === 'BO002',
    );
    await declare(c, job);
    const first = await batchonce.enqueue(c, { job, dates: ['2026-09-18', new Date('2026-09-19T00:00:00Z')], payload: { from: 'app' } });
    assert.deepEqual(first, { enqueued: [`${job}:2026-09-18`], duplicates: [], skipped: [`${job}:2026-09-19`] });
    const again = await batchonce.enqueue(c, { job, dates: ['2026-09-18'] });
    assert.deepEqual(again, { enqueued: [], duplicates: [`${job}:2026-09-18`], skipped: [] });
    const { rows } = await c.query('SELECT payload FROM batch_job_run WHERE job_key = $1', [`${job}:2026-09-18`]);
    assert.deepEqual(rows[0].payload, { from: 'app' });
    await declare(c, job, { ...SETTINGS, max_attempts: 9 }, 'f2');
    await assert.rejects(
      batchonce.enqueue(c, { job, dates: ['2026-09-21'] }),
      (e) => e instanceof batchonce.EnqueueError && e.code === 'BO003',
    );
    await assert.rejects(batchonce.enqueue(c, { job, dates: ['2026-13-01'] }), TypeError);
    await assert.rejects(batchonce.enqueue(c, { job, dates: [] }), TypeError);
  } finally {
    await c.end();
  }
});

/** Runs `node -e script` with a run's environment; resolves to its exit code and output. */
function child(script, env, { onSpawn } = {}) {
  return new Promise((resolve) => {
    const p = spawn(process.execPath, ['-e', script], {
      env: { ...process.env, ...env, BATCHONCE_PKG: path.resolve(__dirname, '..') },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    let err = '';
    p.stdout.on('data', (d) => { out += d; });
    p.stderr.on('data', (d) => { err += d; });
    p.on('exit', (code) => resolve({ code, out, err }));
    if (onSpawn) onSpawn(p, () => out);
  });
}

test('run() maps how the script ends to the exit codes batchonce expects', async () => {
  const env = envOf('invoices:2026-09-15', 'invoices', '42');
  const pkg = "const b = require(process.env.BATCHONCE_PKG);";
  let r = await child(`${pkg} b.run(async () => {})`, env);
  assert.equal(r.code, 0, r.err);
  r = await child(`${pkg} b.run(async () => { console.log('checking'); throw new b.SkipRun('no subscriptions\\nto invoice'); })`, env);
  assert.equal(r.code, 3, r.err);
  assert.equal(r.out.trim().split('\n').pop(), 'no subscriptions to invoice', 'the reason is the last stdout line');
  r = await child(`${pkg} b.run(async () => { throw new b.FatalError('the input file is corrupt'); })`, env);
  assert.equal(r.code, 2);
  assert.match(r.err, /the input file is corrupt/);
  r = await child(`${pkg} b.run(async () => { throw new Error('connection reset'); })`, env);
  assert.equal(r.code, 1);
  assert.match(r.err, /connection reset/);
  r = await child(`${pkg} b.run(async () => {})`, { ...env, BATCHONCE_ATTEMPT: 'x' });
  assert.equal(r.code, 2);
  assert.match(r.err, /BATCHONCE_ATTEMPT is "x"/);
  r = await child(`${pkg} b.skip('nothing to send today')`, env);
  assert.equal(r.code, 3);
  assert.equal(r.out.trim(), 'nothing to send today');
});

test('on SIGTERM the script stops at its next chunk boundary and exits promptly', async () => {
  const env = envOf('invoices:2026-09-15', 'invoices', '42');
  const script = `const b = require(process.env.BATCHONCE_PKG);
    b.run(async (ctx) => {
      console.log('started');
      for (;;) {
        ctx.throwIfStopping();
        await new Promise((r) => setTimeout(r, 50));
      }
    });`;
  const began = Date.now();
  let stoppedAt = 0;
  const r = await child(script, env, {
    onSpawn: (p, out) => {
      const wait = setInterval(() => {
        if (out().includes('started')) {
          clearInterval(wait);
          stoppedAt = Date.now();
          p.kill('SIGTERM');
        }
      }, 20);
    },
  });
  assert.equal(r.code, 1);
  assert.match(r.err, /stopped: the worker is shutting down/);
  assert.ok(stoppedAt > began);
  assert.ok(Date.now() - stoppedAt < 2000, 'exited within 2 s of SIGTERM');
});
