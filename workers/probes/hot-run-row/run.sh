#!/bin/bash
# A diagnosis for issue 25, not a benchmark of the product: what a run row
# whose claim and finish are HOT updates would gain. Every variant claims and
# finishes the same way (claim-finish.sql), with the writes the engine's own
# statements make; the `hot` ones move the indexes that name a run's state
# (the PENDING runs, the RUNNING runs' expiry, the token) off the run row into
# two narrow tables, and the variants differ in what keeps those in step.
# See BENCHMARKS.md, "Drain, ninth round".
#
#   workers/probes/hot-run-row/run.sh VARIANT CLIENTS BATCH [FILLFACTOR]
#
# VARIANT, and the files of this folder it is made of:
#   control                today's schema (control.sql)
#   hot                    the two narrow tables, the token a key of the lease row,
#                          the claim and the finish keeping them in step
#   hot-guarded            hot, with a row trigger keeping them in step for every
#                          other writer, skipped while the claim or the finish runs
#   hot-keep-token         hot, with the token still a unique key of the run row
#   hot-row-trigger        hot, kept in step by a row trigger only
#   hot-statement-trigger  hot, kept in step by a statement trigger only
# FILLFACTOR (10-100, default 45) is the run table's, set and applied by
# rewriting it in every variant. It needs a server reached through the usual
# PG* variables (PGHOST, PGPORT, PGUSER), drops and creates the database
# `batchonce_hot_probe` there (never point it at a server whose databases
# matter), migrates it with a release build of `batchonce`, inserts 60,000
# runs (workers/probes/claim-streams/setup.sql) and drains 48,000 of them with
# pgbench, one CALL a claim and a finish. Prints the runs/s, the runs
# finished and how many run-row updates were HOT, and fails if the narrow
# tables do not list exactly the PENDING and RUNNING runs at the end.
set -euo pipefail
usage() { echo "usage: $0 control|hot|hot-keep-token|hot-guarded|hot-row-trigger|hot-statement-trigger CLIENTS(1-64) BATCH(1-1000) [FILLFACTOR(10-100)]" >&2; exit 2; }
[ $# -ge 3 ] && [ $# -le 4 ] || usage
V=$1 N=$2 BATCH=$3 FF=${4:-45}
case $V in
    control) FILES="control claim-finish upkeep-none" ;;
    hot) FILES="narrow token-on-lease pick-due-delete claim-finish upkeep-explicit" ;;
    hot-guarded) FILES="narrow token-on-lease pick-due-delete claim-finish upkeep-explicit keep-in-step guarded-trigger" ;;
    hot-keep-token) FILES="narrow pick-due-delete claim-finish upkeep-explicit" ;;
    hot-row-trigger) FILES="narrow token-on-lease pick-due claim-finish upkeep-none keep-in-step row-trigger" ;;
    hot-statement-trigger) FILES="narrow token-on-lease pick-due claim-finish upkeep-none statement-trigger" ;;
    *) usage ;;
esac
[[ $N =~ ^[0-9]+$ ]] && [ "$N" -ge 1 ] && [ "$N" -le 64 ] || usage
[[ $BATCH =~ ^[0-9]+$ ]] && [ "$BATCH" -ge 1 ] && [ "$BATCH" -le 1000 ] || usage
[[ $FF =~ ^[0-9]+$ ]] && [ "$FF" -ge 10 ] && [ "$FF" -le 100 ] || usage
[ $((48000 / BATCH / N)) -ge 1 ] || usage
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/../pgbench-db.sh"
DB=batchonce_hot_probe
probe_database "$DB"
for f in $FILES; do psql -q -v ON_ERROR_STOP=1 -d "$DB" -f "$HERE/$f.sql" >/dev/null; done
psql -q -v ON_ERROR_STOP=1 -d "$DB" -c "ALTER TABLE batch_job_run SET (fillfactor = $FF)" \
    -c "VACUUM FULL batch_job_run" -c "VACUUM ANALYZE" >/dev/null
SCRIPT=$(mktemp)
trap 'rm -f "$SCRIPT"' EXIT
cat >"$SCRIPT" <<SQL
CREATE PROCEDURE probe_cycle(p_limit int) LANGUAGE plpgsql AS \$\$
DECLARE k text[]; t bigint[];
BEGIN
  SELECT array_agg(c.job_key), array_agg(c.lease_token) INTO k, t FROM probe_claim(p_limit) c;
  COMMIT;
  IF k IS NOT NULL THEN PERFORM probe_finish(k, t); END IF;
  COMMIT;
END \$\$;
SQL
psql -q -v ON_ERROR_STOP=1 -d "$DB" -f "$SCRIPT" >/dev/null
echo "CALL probe_cycle($BATCH);" >"$SCRIPT"
OUT=$("$BIN/pgbench" -n -c "$N" -j "$N" -t $((48000 / BATCH / N)) -f "$SCRIPT" "$DB" 2>&1)
TPS=$(echo "$OUT" | grep -oP 'tps = \K[0-9.]+' | head -1)
[ -n "$TPS" ] || { echo "$0: pgbench gave no figure: $OUT" >&2; exit 1; }
# The statistics collector reports a backend's counts when it goes idle;
# give it the moment it needs, with a deadline, before reading them.
UPD=0
for _ in $(seq 1 50); do
    UPD=$(psql -Atd "$DB" -c "SELECT n_tup_upd FROM pg_stat_user_tables WHERE relname = 'batch_job_run'")
    [ "$UPD" -gt 0 ] && break
    sleep 0.1
done
[ "$UPD" -gt 0 ] || { echo "$0: the server reported no update of batch_job_run within 5 s" >&2; exit 1; }
read -r DONE HOT < <(psql -AtF ' ' -d "$DB" -c "SELECT (SELECT count(*) FROM batch_job_run WHERE status = 'SUCCEEDED'),
    (SELECT round(100.0 * n_tup_hot_upd / greatest(n_tup_upd, 1)) FROM pg_stat_user_tables WHERE relname = 'batch_job_run')")
# The narrow tables must list exactly the PENDING and the RUNNING runs.
if [ "$V" != control ]; then
    DRIFT=$(psql -Atd "$DB" -c "SELECT (SELECT count(*) FROM probe_due) - (SELECT count(*) FROM batch_job_run WHERE status = 'PENDING'),
        (SELECT count(*) FROM probe_lease) - (SELECT count(*) FROM batch_job_run WHERE status = 'RUNNING')")
    [ "$DRIFT" = "0|0" ] || { echo "$0: the narrow tables are out of step with the runs (due, lease): $DRIFT" >&2; exit 1; }
fi
echo "variant=$V clients=$N batch=$BATCH fillfactor=$FF runs/s=$(awk -v t="$TPS" -v b="$BATCH" 'BEGIN { printf "%d", t * b }') finished=$DONE hot_updates=${HOT}%"
