// A daily report sent by a cron script that writes nothing to the database
// of its own, made exactly-once by the fence alone: the script holds a
// fenced transaction while it sends, so a copy that lost its lease cannot
// start sending. README.md says what that does and does not guarantee.
'use strict';
const fs = require('node:fs');
const { Client } = require('pg');
const batchonce = require('batchonce');

// Stands in for a mail or chat API: one line per report in a file. A real
// provider gets the run's key as its idempotency key.
function send(outbox, idempotencyKey, text) {
  fs.appendFileSync(outbox, `${idempotencyKey}\t${text}\n`);
}

batchonce.run(async (ctx) => {
  const outbox = process.env.REPORT_OUTBOX;
  if (!outbox) throw new batchonce.FatalError('REPORT_OUTBOX is not set: give the job env = { REPORT_OUTBOX = "/path/to/outbox" }');
  if (!ctx.databaseUrl) throw new batchonce.FatalError('DATABASE_URL is not set: give the job database_url_env');
  const db = new Client({ connectionString: ctx.databaseUrl });
  await db.connect();
  try {
    const { rows } = await db.query(
      'SELECT count(*)::int AS n FROM report_order WHERE ordered_at >= $1 AND ordered_at < $2',
      [ctx.periodStart, ctx.periodEnd],
    );
    // The send happens inside the fence: it starts only while this attempt
    // holds the lease, and no other copy can take the run over meanwhile.
    await batchonce.fenced(db, ctx, async () => {
      send(outbox, ctx.key, `orders on ${ctx.businessDate}: ${rows[0].n}`);
    });
    console.log(`sent the report for ${ctx.businessDate}: ${rows[0].n} orders`);
  } finally {
    await db.end();
  }
});
