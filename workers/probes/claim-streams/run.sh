#!/bin/bash
# A diagnosis for issue 25, not a benchmark of the product: how fast the
# engine's own claim and finish statements drain when each pgbench client
# calls them server-side (one CALL a claim-and-finish cycle, two commits),
# next to the bare queue in the same harness. See BENCHMARKS.md, "Drain,
# fifth round".
#
#   workers/probes/claim-streams/run.sh MODE CLIENTS BATCH
#
# MODE 0: batchonce_claim3 and batchonce_finish; MODE 1: the same claim with
# its pick limited to one of two hash buckets of the key (client_id % 2), so
# that two clients never meet a row the other has locked; MODE 2: the bare
# queue of `batchonce-bench drain` (three columns, no history).
#
# It needs a server reached through the usual PG* variables (PGHOST, PGPORT,
# PGUSER), drops and creates the database `probe` there, migrates it with a
# release build of `batchonce`, inserts 60,000 runs and drains 48,000 of them.
set -euo pipefail
MODE=$1 N=$2 BATCH=$3
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
BIN=$(ls -d /usr/lib/postgresql/*/bin | tail -1)
psql -q -d postgres -c "DROP DATABASE IF EXISTS probe" -c "CREATE DATABASE probe" >/dev/null
DATABASE_URL="postgres://${PGUSER:-postgres}@${PGHOST:-127.0.0.1}:${PGPORT:-5432}/probe" \
    "$ROOT/target/release/batchonce" migrate >/dev/null
psql -q -d probe -f "$HERE/setup.sql" >/dev/null
SCRIPT=$(mktemp)
trap 'rm -f "$SCRIPT"' EXIT
echo '\set b :client_id % 2' >"$SCRIPT"
if [ "$MODE" = 2 ]; then echo "CALL bench_bare($BATCH);"; else echo "CALL bench_cycle($MODE, :b, $BATCH);"; fi >>"$SCRIPT"
OUT=$("$BIN/pgbench" -n -c "$N" -j "$N" -t $((48000 / BATCH / N)) -f "$SCRIPT" probe 2>&1)
TPS=$(echo "$OUT" | grep -oP 'tps = \K[0-9.]+' | head -1)
DONE=$(psql -Atd probe -c "SELECT (SELECT count(*) FROM batch_job_run WHERE status = 'SUCCEEDED')
                                + (SELECT count(*) FROM bench_q WHERE state = 'done')")
echo "mode=$MODE clients=$N batch=$BATCH runs/s=$(echo "$TPS * $BATCH / 1" | bc) finished=$DONE"
