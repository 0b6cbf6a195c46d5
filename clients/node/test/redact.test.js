// The context as a script prints it: never the database password. Needs no
// database.
'use strict';
const test = require('node:test');
const assert = require('node:assert/strict');
const util = require('node:util');
const { spawnSync } = require('node:child_process');
const path = require('node:path');
const batchonce = require('..');

const SECRET = 's3cr3t-Pa55';

function env(url) {
  return {
    BATCHONCE_JOB_KEY: 'invoices:2026-09-15',
    BATCHONCE_JOB_NAME: 'invoices',
    BATCHONCE_BUSINESS_DATE: '2026-09-15',
    BATCHONCE_ATTEMPT: '1',
    BATCHONCE_LEASE_TOKEN: '42',
    BATCHONCE_TIMEZONE: 'Asia/Seoul',
    BATCHONCE_PERIOD_START: '2026-09-14T15:00:00+00:00',
    BATCHONCE_PERIOD_END: '2026-09-15T15:00:00+00:00',
    DATABASE_URL: url,
  };
}

test('a printed context shows the database URL without its password', () => {
  const url = `postgres://worker:${SECRET}@db.internal:5432/jobs?sslmode=require&password=${SECRET}`;
  const ctx = batchonce.context(env(url));
  // The script still gets the real URL to connect with.
  assert.equal(ctx.databaseUrl, url);
  for (const [how, printed] of [
    ['util.inspect', util.inspect(ctx)],
    ['util.inspect, everything', util.inspect(ctx, { showHidden: true, depth: null })],
    ['format %o', util.format('%o', ctx)],
    ['format %j', util.format('%j', ctx)],
    ['JSON.stringify', JSON.stringify(ctx)],
    ['JSON.stringify of an object holding it', JSON.stringify({ ctx })],
  ]) {
    assert.ok(!printed.includes(SECRET), `${how} printed the password: ${printed}`);
    assert.ok(printed.includes('postgres://worker:***@db.internal:5432/jobs'), `${how}: ${printed}`);
    assert.ok(printed.includes('invoices:2026-09-15'), `${how}: ${printed}`);
  }
  // Keys and values are as before.
  assert.ok(!Object.keys(ctx).includes('toJSON'));
  assert.deepEqual(JSON.parse(JSON.stringify(ctx)).payload, {});
  // A string that is no URL is not shown at all.
  const odd = batchonce.context(env(`host=db password=${SECRET}`));
  assert.ok(!util.inspect(odd).includes(SECRET));
  assert.ok(!JSON.stringify(odd).includes(SECRET));
});

test('the context run() hands to main prints without the password too', () => {
  const script = `
    const batchonce = require(${JSON.stringify(path.join(__dirname, '..'))});
    batchonce.run(async (ctx) => {
      console.log(ctx);
      console.log(JSON.stringify(ctx));
    });
  `;
  const out = spawnSync(process.execPath, ['-e', script], {
    env: { ...process.env, ...env(`postgres://worker:${SECRET}@db/jobs`) },
    encoding: 'utf8',
  });
  assert.equal(out.status, 0, out.stderr);
  assert.ok(!out.stdout.includes(SECRET), out.stdout);
  assert.ok(out.stdout.includes('postgres://worker:***@db/jobs'), out.stdout);
});
