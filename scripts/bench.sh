#!/bin/sh
# bench.sh - `make bench`: sgemm GFLOPS through the engine from C and from Lua beside a direct
# cblas_sgemm call on the same OpenBLAS (in the same run), OpenBLAS left to its own core detection
# as the baseline, and elementwise throughput. Prints medians and ratios as tables.
# usage: sh scripts/bench.sh BUILD
set -eu
BUILD=${1:?usage: bench.sh BUILD}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$BUILD/bench_tensor" >"$tmp/c"
"$BUILD/moonrl" run scripts/bench_tensor.lua >"$tmp/lua"
env -u OPENBLAS_CORETYPE "$BUILD/bench_stock_blas" >"$tmp/stock"

echo "== machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
awk -F'\t' '$1 == "blas" { printf "== OpenBLAS core %s (chosen by %s), %s threads\n", $2, $3, $4 }' "$tmp/c"
awk -F'\t' '$2 == "core" { printf "== OpenBLAS left to itself (linked normally, no OPENBLAS_CORETYPE): core %s\n", $3 }' "$tmp/stock"
echo
echo "sgemm, n x n times n x n, float32, GFLOPS (median of 9 samples of >= 50 ms)"
cat "$tmp/c" "$tmp/lua" "$tmp/stock" | awk -F'\t' '
  $1 == "matmul"     { direct[$2] = $3; engine[$2] = $4; order[++k] = $2 }
  $1 == "lua_matmul" { lua[$2] = $3 }
  $1 == "stock" && $2 != "core" { stock[$2] = $3 }
  END {
    printf "%6s %14s %10s %11s %9s %9s %16s %12s\n", "n", "direct cblas", "engine C", "engine Lua",
           "C/direct", "Lua/dir.", "OpenBLAS alone", "moonrl gain"
    for (i = 1; i <= k; i++) {
      n = order[i]
      printf "%6d %14.1f %10.1f %11.1f %8.1f%% %8.1f%% %16.1f %11.2fx\n", n, direct[n], engine[n],
             lua[n], 100 * engine[n] / direct[n], 100 * lua[n] / direct[n], stock[n],
             engine[n] / stock[n]
    }
  }'
echo
echo "elementwise, 2^24 float32 elements, GB/s (bytes read + written, median of 9)"
cat "$tmp/c" "$tmp/lua" | awk -F'\t' '
  $1 == "elementwise"     { printf "  %-22s C   %7.1f\n", $2, $3 }
  $1 == "lua_elementwise" { printf "  %-22s Lua %7.1f\n", $2, $3 }'
