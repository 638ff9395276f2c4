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
# three set-ups: one rank on every core (its engine and OpenBLAS threads on all of them), one rank
# bound to one core, and one rank per core (mpirun binds each to its core)
for round in $(seq "$ROUNDS"); do
  for setup in "1 none" "1 core" "$(nproc) core"; do
    set -- $setup
    printf '%s\t%s\t' "$1" "$2" >>"$tmp/lines"
    mpirun --allow-run-as-root --oversubscribe --bind-to "$2" -np "$1" "$BUILD/moonrl" run \
      scripts/bench_dp.lua "$tmp/runs" "$STEPS" | cut -f2- >>"$tmp/lines"
  done
done
echo "data-parallel training, quickstart policy, 16 tasks x 16 episodes per step ($STEPS steps,"
echo "medians of steps 2..; medians of $ROUNDS alternating rounds; $(nproc) cores)"
awk -F'\t' '
  { k = $1 FS $2; if (!(k in c)) order[++keys] = k
    c[k]++; s[k, c[k]] = $3; r[k, c[k]] = $4; u[k, c[k]] = $5; m[k, c[k]] = $6 }
  function med(a, k,   i, j, t, v, n) {
    n = c[k]; for (i = 1; i <= n; i++) v[i] = a[k, i]
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
    return v[int((n + 1) / 2)]
  }
  END {
    printf "%-6s %-12s %10s %10s %10s %10s %12s\n", "ranks", "bound to", "steps/s", "vs first", "rollout s", "update s", "comm share"
    base = 1 / med(s, order[1])
    for (i = 1; i <= keys; i++) {
      k = order[i]; split(k, p, FS)
      printf "%-6d %-12s %10.2f %9.2fx %10.3f %10.3f %11.1f%%\n", p[1], p[2] == "none" ? "all cores" : p[1] == 1 ? "one core" : "a core each",
        1 / med(s, k), (1 / med(s, k)) / base, med(r, k), med(u, k), 100 * med(m, k)
    }
  }' "$tmp/lines"
