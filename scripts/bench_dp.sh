#!/bin/sh
# bench_dp.sh - `make bench-dp`: data-parallel training on 1 and 2 ranks (mpirun, shared memory)
# of one global batch, alternating over BENCH_ROUNDS rounds (default 3); prints per rank count the
# medians of steps/s, rollout and update seconds and the collectives' share of a step.
# usage: sh scripts/bench_dp.sh MPI_BUILD
set -eu
BUILD=${1:?usage: bench_dp.sh MPI_BUILD}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ROUNDS=${BENCH_ROUNDS:-3}
STEPS=${BENCH_DP_STEPS:-12}
export MOONRL_ROOT="$ROOT"
for round in $(seq "$ROUNDS"); do
  for np in 1 2; do
    mpirun --allow-run-as-root --oversubscribe -np "$np" "$BUILD/moonrl" run scripts/bench_dp.lua \
      "$tmp/runs" "$STEPS" >>"$tmp/lines"
  done
done
echo "data-parallel training, quickstart policy, 16 tasks x 16 episodes per step ($STEPS steps,"
echo "medians of steps 2..; medians of $ROUNDS alternating rounds; $(nproc) cores)"
awk -F'\t' '
  { n = $1; c[n]++; s[n, c[n]] = $2; r[n, c[n]] = $3; u[n, c[n]] = $4; m[n, c[n]] = $5 }
  function med(a, n,   i, j, t, v, k) {
    k = c[n]; for (i = 1; i <= k; i++) v[i] = a[n, i]
    for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
    return v[int((k + 1) / 2)]
  }
  END {
    printf "%-6s %10s %10s %10s %10s %12s\n", "ranks", "steps/s", "speedup", "rollout s", "update s", "comm share"
    base = 1 / med(s, 1)
    for (n = 1; n <= 2; n++) if (c[n])
      printf "%-6d %10.2f %9.2fx %10.3f %10.3f %11.1f%%\n", n, 1 / med(s, n), (1 / med(s, n)) / base, med(r, n), med(u, n), 100 * med(m, n)
  }' "$tmp/lines"
