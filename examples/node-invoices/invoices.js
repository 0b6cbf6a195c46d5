// An existing cron script, made exactly-once by batchonce: it invoices every
// subscription for the business date batchonce hands it. Each chunk is one
// fenced transaction (the `batchonce` package's `fenced`), so a copy of this
// script that lost its lease (its worker was cut off, or an operator failed
// the run) can never commit, and each invoice has a unique key, so a retry
// after a crash skips what was already written.
'use strict';
const { Client } = require('pg');
const batchonce = require('batchonce');

// A knob from the job's `env` table: a whole number, or the default.
function knob(name, dflt, min) {
  const v = process.env[name];
  if (v === undefined || v === '') return dflt;
  if (!/^\d+$/.test(v) || Number(v) < min || !Number.isSafeInteger(Number(v))) {
    throw new batchonce.FatalError(`${name} is ${JSON.stringify(v)}: expected a whole number from ${min}`);
  }
  return Number(v);
}

batchonce.run(async (ctx) => {
  if (!ctx.databaseUrl) {
    // batchonce passes a database URL only when the job names the worker's
    // variable that holds it: database_url_env = "INVOICES_DATABASE_URL".
    throw new batchonce.FatalError('DATABASE_URL is not set: run this script as a batchonce command job (give the job database_url_env in batchonce.toml, naming a variable of the worker that holds this script\'s URL)');
  }
  const chunk = knob('INVOICE_CHUNK', 100, 1); // rows per fenced transaction
  const pauseMs = knob('INVOICE_PAUSE_MS', 0, 0); // a pause between chunks
  const date = ctx.businessDate;
  const db = new Client({ connectionString: ctx.databaseUrl });
  await db.connect();
  try {
    const { rows } = await db.query('SELECT count(*)::int AS n FROM subscription');
    if (rows[0].n === 0) {
      // batchonce records the run as SKIPPED with this line as the reason.
      throw new batchonce.SkipRun(`no subscriptions to invoice for ${date}`);
    }
    let after = -1;
    let written = 0;
    for (;;) {
      ctx.throwIfStopping(); // a shutdown: stop between chunks; the run is released
      const r = await batchonce.fenced(db, ctx, async (tx) => {
        const res = await tx.query(
          `WITH chunk AS (
             SELECT customer_id, plan_minor FROM subscription
             WHERE customer_id > $1 ORDER BY customer_id LIMIT $2
           ), ins AS (
             INSERT INTO invoice (business_date, customer_id, amount_minor, job_key, attempt)
             SELECT $3, customer_id, plan_minor, $4, $5 FROM chunk
             ON CONFLICT ON CONSTRAINT invoice_once DO NOTHING
             RETURNING 1
           )
           SELECT (SELECT max(customer_id) FROM chunk) AS last,
                  (SELECT count(*) FROM chunk)::int AS scanned,
                  (SELECT count(*) FROM ins)::int AS inserted`,
          [after, chunk, date, ctx.key, ctx.attempt],
        );
        tx.progress(res.rows[0].inserted);
        return res.rows[0];
      });
      written += r.inserted;
      if (r.scanned < chunk) break;
      after = r.last;
      if (pauseMs) await new Promise((res) => setTimeout(res, pauseMs));
    }
    console.log(`invoiced ${date}: ${written} new invoices`);
  } finally {
    await db.end();
  }
});
