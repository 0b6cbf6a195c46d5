# Sourced by the pgbench probe claim-streams/run.sh (and, until issue 25's
# tenth drain round made its design a migration, hot-run-row/run.sh):
# `probe_database DB` checks for a release build of `batchonce` and for
# pgbench (setting BIN to the PostgreSQL binaries), drops and creates DB on
# the server the PG* variables name, migrates it and loads
# claim-streams/setup.sql (60,000 runs and the bare queue).
probe_database() {
    local db=$1 probes root exe
    probes=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
    root=$(cd "$probes/../.." && pwd)
    exe="$root/target/release/batchonce"
    [ -x "$exe" ] || { echo "$0: $exe is missing: cargo build --release -p batchonce-workers --bins" >&2; exit 1; }
    BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | tail -1)
    [ -x "$BIN/pgbench" ] || { echo "$0: pgbench is missing (the PostgreSQL server binaries)" >&2; exit 1; }
    psql -q -d postgres -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db" >/dev/null 2>&1
    DATABASE_URL="postgres://${PGUSER:-postgres}@${PGHOST:-127.0.0.1}:${PGPORT:-5432}/$db" \
        "$exe" migrate >/dev/null
    psql -q -v ON_ERROR_STOP=1 -d "$db" -f "$probes/claim-streams/setup.sql" >/dev/null
}
