#!/bin/bash
# Two builds of `batchonce-bench drain`, side by side: ROUNDS rounds, each
# running A and B once, alternating which goes first, so that a machine that
# speeds up or slows down during the comparison favours neither. These shared
# machines move the bare queue's own figure by half from one run to the next,
# so a change is judged by the paired figures (B's runs/s over A's in the
# same round) and the medians of many rounds, never by one run. See
# BENCHMARKS.md, "Comparing two builds".
#
#   workers/probes/drain-ab/run.sh A_BENCH B_BENCH [ROUNDS] [CONCURRENCY] [RUNS]
#
# A_BENCH and B_BENCH are copies of target/release/batchonce-bench built from
# the two commits. DATABASE_URL, if set, names the server, as for the bench.
# Prints one line a run, then the median ratio of each build and the median
# of B's runs/s over A's.
set -euo pipefail
usage() { echo "usage: $0 A_BENCH B_BENCH [ROUNDS(1-100)] [CONCURRENCY(1-256)] [RUNS(1000-1000000)]" >&2; exit 2; }
[ $# -ge 2 ] && [ $# -le 5 ] || usage
A=$1 B=$2 ROUNDS=${3:-8} C=${4:-32} N=${5:-60000}
[ -x "$A" ] && [ -x "$B" ] || { echo "$0: both benches must be executable files" >&2; exit 1; }
[[ $ROUNDS =~ ^[0-9]+$ ]] && [ "$ROUNDS" -ge 1 ] && [ "$ROUNDS" -le 100 ] || usage
[[ $C =~ ^[0-9]+$ ]] && [ "$C" -ge 1 ] && [ "$C" -le 256 ] || usage
[[ $N =~ ^[0-9]+$ ]] && [ "$N" -ge 1000 ] && [ "$N" -le 1000000 ] || usage
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
for r in $(seq 1 "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then order="A B"; else order="B A"; fi
  for b in $order; do
    if [ "$b" = A ]; then exe=$A; else exe=$B; fi
    # The JSON line on stdout: the drain's runs/s and its ratio.
    line=$("$exe" drain --concurrency "$C" --runs "$N" 2>/dev/null)
    rate=$(echo "$line" | grep -o '"runs_per_s":[0-9.]*' | head -1 | cut -d: -f2)
    ratio=$(echo "$line" | grep -o '"ratio":[0-9.]*' | head -1 | cut -d: -f2)
    [ -n "$rate" ] && [ -n "$ratio" ] || { echo "$0: $b gave no figures in round $r" >&2; exit 1; }
    echo "round $r $b: $rate runs/s, ratio $ratio"
    echo "$r $b $rate $ratio" >> "$OUT"
  done
done
median() { sort -g | awk '{v[NR]=$1} END {if (NR % 2) print v[(NR+1)/2]; else printf "%.3f\n", (v[NR/2]+v[NR/2+1])/2}'; }
echo "median ratio: A $(awk '$2=="A"{print $4}' "$OUT" | median), B $(awk '$2=="B"{print $4}' "$OUT" | median)"
echo "median B/A runs/s: $(awk '{rate[$1" "$2]=$3} END {for (k in rate) {split(k, p, " "); if (p[2]=="A") printf "%.3f\n", rate[p[1]" B"]/rate[k]}}' "$OUT" | median)"
