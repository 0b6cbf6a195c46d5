#!/bin/bash
# The `hot-guarded` design of run.sh under the worker: builds this commit
# once more, in a scratch worktree, with keep-in-step.sql and
# under-worker.sql as its last migration (and the bench's wait for a drain's
# end counting the two narrow tables, since the run table no longer indexes
# PENDING and RUNNING runs), then runs the drain of today's build (A)
# against it (B) with workers/probes/drain-ab/run.sh. A diagnosis for issue
# 25, not a change of the product; see BENCHMARKS.md, "Drain, ninth round".
#
#   workers/probes/hot-run-row/under-worker.sh [ROUNDS(1-100)]
#
# Needs a release build of this commit (cargo build --release -p
# batchonce-workers --bins), git, and DATABASE_URL naming a server the bench
# may create databases on, as for the bench. The first build of B takes
# minutes; it is kept in target/probe-hot-run-row.
set -euo pipefail
usage() { echo "usage: $0 [ROUNDS(1-100)]" >&2; exit 2; }
[ $# -le 1 ] || usage
ROUNDS=${1:-6}
[[ $ROUNDS =~ ^[0-9]+$ ]] && [ "$ROUNDS" -ge 1 ] && [ "$ROUNDS" -le 100 ] || usage
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
A="$ROOT/target/release/batchonce-bench"
[ -x "$A" ] || { echo "$0: $A is missing: cargo build --release -p batchonce-workers --bins" >&2; exit 1; }
[ -n "${DATABASE_URL:-}" ] || { echo "$0: set DATABASE_URL to the server the bench may use" >&2; exit 1; }
WT=$(mktemp -d)
cleanup() { git -C "$ROOT" worktree remove --force "$WT" >/dev/null 2>&1 || rm -rf "$WT"; }
trap cleanup EXIT
git -C "$ROOT" worktree add --detach "$WT" HEAD >/dev/null
cat "$HERE/keep-in-step.sql" "$HERE/under-worker.sql" >"$WT/migrations/29991231000001_probe_hot_run_row.sql"
BENCH="$WT/workers/src/bin/batchonce-bench.rs"
sed -i "s|\"SELECT count(\*) FROM batch_job_run \\\\|\"SELECT (SELECT count(*) FROM probe_due) + (SELECT count(*) FROM probe_lease) WHERE true \\\\|" "$BENCH"
sed -i "s|^         WHERE status IN ('PENDING', 'RUNNING') AND job_name = 'bench-noop'\",|         AND 'bench-noop' = 'bench-noop'\",|" "$BENCH"
grep -q "FROM probe_lease) WHERE true" "$BENCH" && grep -q "AND 'bench-noop' = 'bench-noop'" "$BENCH" \
    || { echo "$0: the bench's wait for the drain's end was not found; adapt this script" >&2; exit 1; }
CARGO_TARGET_DIR="$ROOT/target/probe-hot-run-row" \
    cargo build --release --quiet -p batchonce-workers --bins --manifest-path "$WT/Cargo.toml"
B="$ROOT/target/probe-hot-run-row/release/batchonce-bench"
"$ROOT/workers/probes/drain-ab/run.sh" "$A" "$B" "$ROUNDS"
