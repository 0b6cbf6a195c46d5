#!/bin/bash
# A diagnosis for issue 25, not a benchmark of the product: how fast the
# engine's own claim and finish statements drain when each pgbench client
# calls them server-side (one CALL a claim-and-finish cycle, two commits),
# next to the bare queue in the same harness. See BENCHMARKS.md, "Comparing
# two builds", and issue 25's fifth round in `git log -p BENCHMARKS.md`.
#
#   workers/probes/claim-streams/run.sh MODE CLIENTS BATCH
#
# MODE 0: batchonce_claim3 and batchonce_finish; MODE 1: the same claim with
# its pick limited to one of two hash buckets of the key (client_id % 2), so
# that two clients never meet a row the other has locked; MODE 2: the bare
# queue of `batchonce-bench drain` (three columns, no history).
#
# It needs a server reached through the usual PG* variables (PGHOST, PGPORT,
# PGUSER), drops and creates the database `batchonce_claim_probe` there
# (never point it at a server whose databases matter), migrates it with a
# release build of `batchonce`, inserts 60,000 runs and drains 48,000 of them.
set -euo pipefail
usage() { echo "usage: $0 MODE(0|1|2) CLIENTS(1-64) BATCH(1-1000)" >&2; exit 2; }
[ $# -eq 3 ] || usage
MODE=$1 N=$2 BATCH=$3
[[ $MODE =~ ^[012]$ ]] || usage
[[ $N =~ ^[0-9]+$ ]] && [ "$N" -ge 1 ] && [ "$N" -le 64 ] || usage
[[ $BATCH =~ ^[0-9]+$ ]] && [ "$BATCH" -ge 1 ] && [ "$BATCH" -le 1000 ] || usage
[ $((48000 / BATCH / N)) -ge 1 ] || usage
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/../pgbench-db.sh"
DB=batchonce_claim_probe
probe_database "$DB"
SCRIPT=$(mktemp)
trap 'rm -f "$SCRIPT"' EXIT
echo '\set b :client_id % 2' >"$SCRIPT"
if [ "$MODE" = 2 ]; then echo "CALL bench_bare($BATCH);"; else echo "CALL bench_cycle($MODE, :b, $BATCH);"; fi >>"$SCRIPT"
OUT=$("$BIN/pgbench" -n -c "$N" -j "$N" -t $((48000 / BATCH / N)) -f "$SCRIPT" "$DB" 2>&1)
TPS=$(echo "$OUT" | grep -oP 'tps = \K[0-9.]+' | head -1)
DONE=$(psql -Atd "$DB" -c "SELECT (SELECT count(*) FROM batch_job_run WHERE status = 'SUCCEEDED')
                                + (SELECT count(*) FROM bench_q WHERE state = 'done')")
echo "mode=$MODE clients=$N batch=$BATCH runs/s=$(awk -v t="$TPS" -v b="$BATCH" 'BEGIN { printf "%d", t * b }') finished=$DONE"
