#!/bin/sh
# bench.sh - `make bench`: sgemm GFLOPS through the engine from C and from Lua beside a direct
# cblas_sgemm call on the same OpenBLAS in the same process; OpenBLAS linked the usual way with
# each core type (and with its own detection) as baselines; elementwise throughput. Medians of 9.
# usage: sh scripts/bench.sh BUILD
set -eu
BUILD=${1:?usage: bench.sh BUILD}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The C and Lua runs are separate processes; alternate them over three rounds (the first also
# measures elementwise throughput) and keep each figure's median round, so that a noisy moment on
# a shared machine does not land on one side only.
"$BUILD/bench_tensor" >"$tmp/c1"
"$BUILD/moonrl" run scripts/bench_tensor.lua >"$tmp/lua1"
for round in 2 3; do
  "$BUILD/bench_tensor" matmul >"$tmp/c$round"
  "$BUILD/moonrl" run scripts/bench_tensor.lua matmul >"$tmp/lua$round"
done
median_rounds() { # file prefix -> one file with the median of each matmul figure over rounds
  cat "$1"1 "$1"2 "$1"3 | awk -F'\t' '
    $1 ~ /matmul$/ { key = $1 FS $2; n[key]++; d[key, n[key]] = $3; e[key, n[key]] = $4; next }
    !seen[$0]++ { print }
    function med(a, key,   x, y, z) {
      x = a[key, 1]; y = a[key, 2]; z = a[key, 3]
      return (x + 0 <= y + 0) ? ((y + 0 <= z + 0) ? y : ((x + 0 <= z + 0) ? z : x)) \
                              : ((x + 0 <= z + 0) ? x : ((y + 0 <= z + 0) ? z : y))
    }
    END { for (key in n) { if (e[key, 1] != "") print key FS med(d, key) FS med(e, key);
                           else print key FS med(d, key) } }' | sort -t "$(printf '\t')" -k1,1 -k2,2n
}
median_rounds "$tmp/c" >"$tmp/c"
median_rounds "$tmp/lua" >"$tmp/lua"
# OpenBLAS on its own: its detection, then each core type forced
env -u OPENBLAS_CORETYPE "$BUILD/bench_stock_blas" | sed 's/^stock/detected/' >"$tmp/stock"
for core in Prescott Haswell SkylakeX; do
  OPENBLAS_CORETYPE=$core "$BUILD/bench_stock_blas" | sed "s/^stock/$core/" >>"$tmp/stock"
done

echo "== machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
awk -F'\t' '$1 == "blas" { printf "== engine: OpenBLAS core %s (chosen by %s), %s threads\n", $2, $3, $4 }' "$tmp/c"
awk -F'\t' '$1 == "detected" && $2 == "core" { printf "== OpenBLAS linked normally, no OPENBLAS_CORETYPE, detects: %s\n", $3 }' "$tmp/stock"
echo
echo "sgemm n x n x n, float32, GFLOPS. 'direct' calls cblas_sgemm of the OpenBLAS the engine loaded,"
echo "in the same process, alternating with the engine's calls."
cat "$tmp/c" "$tmp/lua" | awk -F'\t' '
  $1 == "matmul"     { direct[$2] = $3; engine[$2] = $4; order[++k] = $2 }
  $1 == "lua_matmul" { lua[$2] = $3 }
  END {
    printf "%6s %8s %10s %11s %10s %11s\n", "n", "direct", "engine C", "engine Lua", "C/direct",
           "Lua/direct"
    for (i = 1; i <= k; i++) {
      n = order[i]
      printf "%6d %8.1f %10.1f %11.1f %9.1f%% %10.1f%%\n", n, direct[n], engine[n], lua[n],
             100 * engine[n] / direct[n], 100 * lua[n] / direct[n]
    }
  }'
echo
echo "OpenBLAS linked the usual way (core picked before main), GFLOPS, and the engine against the best:"
cat "$tmp/c" "$tmp/stock" | awk -F'\t' '
  $1 == "matmul" { engine[$2] = $4; order[++k] = $2 }
  $1 != "matmul" && $2 != "core" && $1 != "blas" && $1 != "elementwise" { g[$1, $2] = $3 }
  END {
    printf "%6s %10s %10s %10s %10s %14s\n", "n", "detected", "Prescott", "Haswell", "SkylakeX",
           "engine/best"
    for (i = 1; i <= k; i++) {
      n = order[i]; best = 0
      split("detected Prescott Haswell SkylakeX", cores, " ")
      for (c = 1; c <= 4; c++) if (g[cores[c], n] > best) best = g[cores[c], n]
      printf "%6d %10.1f %10.1f %10.1f %10.1f %13.1f%%\n", n, g["detected", n], g["Prescott", n],
             g["Haswell", n], g["SkylakeX", n], 100 * engine[n] / best
    }
  }'
echo
echo "elementwise, 2^24 float32 elements, GB/s (bytes read + written):"
cat "$tmp/c" "$tmp/lua" | awk -F'\t' '
  $1 == "elementwise"     { printf "  %-22s C   %7.1f\n", $2, $3 }
  $1 == "lua_elementwise" { printf "  %-22s Lua %7.1f\n", $2, $3 }'
