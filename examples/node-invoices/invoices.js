// An existing cron script, made exactly-once by batchonce: it invoices every
// subscription for the business date batchonce hands it. Each chunk is one
// transaction that starts with batchonce_fence(), so a copy of this script
// that lost its lease (its worker was cut off, or an operator failed the run)
// can never commit, and each invoice has a unique key, so a retry after a
// crash skips what was already written.
'use strict';
const { Client } = require('pg');

const env = (name) => {
  const v = process.env[name];
  if (!v) {
    // batchonce passes a database URL only when the job names the worker's
    // variable that holds it: database_url_env = "INVOICES_DATABASE_URL".
    const hint = name === 'DATABASE_URL'
      ? ' (give the job database_url_env in batchonce.toml, naming a variable of the worker that holds this script\'s URL)'
      : '';
    console.error(`${name} is not set: run this script as a batchonce command job${hint}`);
    process.exit(2); // a fatal exit code: retrying cannot help
  }
  return v;
};

async function main() {
  const key = env('BATCHONCE_JOB_KEY');
  const token = env('BATCHONCE_LEASE_TOKEN');
  const date = env('BATCHONCE_BUSINESS_DATE');
  const chunk = Number(process.env.INVOICE_CHUNK || 100);
  const pauseMs = Number(process.env.INVOICE_PAUSE_MS || 0);
  const db = new Client({ connectionString: env('DATABASE_URL') });
  await db.connect();
  try {
    const { rows } = await db.query('SELECT count(*)::int AS n FROM subscription');
    if (rows[0].n === 0) {
      console.log(`no subscriptions to invoice for ${date}`);
      process.exitCode = 3; // batchonce records the run as SKIPPED with this line
      return;
    }
    let after = -1;
    let written = 0;
    for (;;) {
      await db.query('BEGIN');
      await db.query('SELECT batchonce_fence($1, $2)', [key, token]);
      const r = await db.query(
        `WITH chunk AS (
           SELECT customer_id, plan_minor FROM subscription
           WHERE customer_id > $1 ORDER BY customer_id LIMIT $2
         ), ins AS (
           INSERT INTO invoice (business_date, customer_id, amount_minor, job_key, lease_token)
           SELECT $3, customer_id, plan_minor, $4, $5 FROM chunk
           ON CONFLICT ON CONSTRAINT invoice_once DO NOTHING
           RETURNING 1
         )
         SELECT (SELECT max(customer_id) FROM chunk) AS last,
                (SELECT count(*) FROM chunk)::int AS scanned,
                (SELECT count(*) FROM ins)::int AS inserted`,
        [after, chunk, date, key, token],
      );
      await db.query('COMMIT');
      const { last, scanned, inserted } = r.rows[0];
      written += inserted;
      if (scanned < chunk) break;
      after = last;
      if (pauseMs) await new Promise((res) => setTimeout(res, pauseMs));
    }
    console.log(`invoiced ${date}: ${written} new invoices`);
  } finally {
    await db.end();
  }
}

main().catch((e) => {
  // SQLSTATE BO001: the lease is gone; another attempt owns the run now.
  console.error(e.code === 'BO001' ? `lease lost: ${e.message}` : e.stack || String(e));
  process.exit(1); // retryable
});
