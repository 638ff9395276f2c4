#!/bin/sh
# profile.sh - `make profile`: where the time of a training step (small and large model) and of a
# decode step (small at batch 16, large at batch 1 and 16) goes, per phase, from `perf record`
# samples of the timed steps only (the workloads of scripts/profile_model.lua open and close
# perf's sampling around them).
# Prints, per workload, wall and CPU milliseconds per step and each phase's share of the CPU
# samples and CPU milliseconds per step; with a second build (PROFILE_BASELINE=/other/build or a
# second argument), "before" columns from that build's moonrl on the same workloads.
# PROFILE_WORKLOADS (default: small-train large-train small-decode16 large-decode1
# large-decode16), PROFILE_FREQ (default 1999 samples/s per core). Needs perf (Debian:
# linux-perf) and perf_event_paranoid <= 2.
# Phases are assigned from symbol names (the table in `phase_of` below); a symbol that matches no
# rule is counted as "other" and listed under the table when it holds 1% or more.
# usage: sh scripts/profile.sh BUILD [BASELINE_BUILD]
set -eu
BUILD=${1:?usage: profile.sh BUILD [BASELINE_BUILD]}
BASE=${2:-${PROFILE_BASELINE:-}}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
if ! command -v perf >/dev/null 2>&1; then
  echo "profile.sh: perf is not installed (Debian: apt-get install linux-perf)" >&2
  exit 1
fi
for b in "$BUILD" $BASE; do
  [ -x "$b/moonrl" ] || { echo "profile.sh: no moonrl in $b" >&2; exit 1; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
WORKLOADS=${PROFILE_WORKLOADS:-small-train large-train small-decode16 large-decode1 large-decode16}
FREQ=${PROFILE_FREQ:-1999}

# phase_of MAP: reads "percent<TAB>dso<TAB>symbol" lines, prints "phase<TAB>percent" lines and, for
# unassigned symbols of 1% or more, "?<TAB>percent<TAB>dso symbol". MAP holds "symbol<TAB>source
# file" for the moonrl binary (from nm -l): moonrl's own functions are assigned by the file that
# defines them (then by name inside block.c and model_backward.c), other libraries by name.
phase_of() {
  awk -F'\t' -v map="$1" '
    BEGIN { while ((getline line < map) > 0) { split(line, f, "\t"); file[f[1]] = f[2] } }
    {
      p = $1 + 0; d = $2; s = $3; ph = ""; src = file[s]
      if (src == "") { base = s; sub(/\.(constprop|isra|part|cold|arch_)[^ ]*$/, "", base); src = file[base] }
      if (d ~ /openblas/) ph = (s ~ /sgemm_(kernel|beta|small)/ ? "matmul: OpenBLAS kernel" : \
                                s ~ /copy/ ? "matmul: OpenBLAS packing" : \
                                s ~ /gemv/ ? "matmul: OpenBLAS gemv" : "threads: OpenBLAS wait/sync")
      else if (src ~ /skinny\.c/) ph = "matmul: skinny (few rows, no packing)"
      else if (src ~ /attention\.c/ || s ~ /attention_(backward_)?unit/) ph = "attention"
      else if (src ~ /head\.c/) ph = "LM head: softmax, log-probs, gradient"
      else if (src ~ /sample\.c|rng\.c/) ph = "sampling"
      else if (s ~ /rmsnorm/) ph = "RMSNorm"
      else if (s ~ /swiglu/) ph = "SwiGLU"
      else if (s ~ /rope/) ph = "RoPE"
      else if (s ~ /adamw|clip|grad_norm/) ph = "optimizer (AdamW, clipping)"
      else if (src ~ /model\/|kv_cache/) ph = "model glue (embedding, residuals, cache, gemm calls)"
      else if (s ~ /sched_yield/) ph = "threads: OpenBLAS idle spin (sched_yield)"
      else if (src ~ /pool\.c/ || s ~ /futex|pthread_cond|pthread_mutex/) ph = "threads: engine pool wait/sync"
      else if (s ~ /__schedule|finish_task_switch|do_syscall|entry_SYSCALL|x64_sys_call/) ph = "threads: scheduler and system calls"
      else if (s ~ /mem(cpy|move|set)/) ph = "memory copies"
      else if (src ~ /\/lua\// || d ~ /lua/ || s ~ /^lua[A-Z_]/) ph = "Lua and the binding"
      else if (s ~ /^(__)?(exp|log|sincos|pow)/ || d ~ /libm/) ph = "libm (exp, log)"
      else if (s ~ /clear_page|page_fault|handle_mm_fault|alloc_pages/) ph = "page faults (first touch of new memory)"
      else if (d ~ /kernel/) ph = "kernel, other"
      if (ph == "") { ph = "other"; if (p >= 1) printf "?\t%.2f\t%s %s\n", p, d, s }
      printf "%s\t%.4f\n", ph, p
    }'
}

# profile SIDE BUILD WORKLOAD: "SIDE<TAB>WORKLOAD<TAB>phase<TAB>percent", plus the step times
profile() {
  side=$1 build=$2 w=$3
  nm -l --defined-only "$build/moonrl" 2>/dev/null |
    awk -F'\t' 'NF == 2 { n = split($1, f, " "); print f[n] "\t" $2 }' >"$tmp/map" || :
  rm -f "$tmp/ctl" "$tmp/ack"
  mkfifo "$tmp/ctl" "$tmp/ack"
  if ! MOONRL_PERF_CTL="$tmp/ctl" MOONRL_PERF_ACK="$tmp/ack" perf record -q -F "$FREQ" -D -1 \
      --control "fifo:$tmp/ctl,$tmp/ack" -o "$tmp/perf.data" -- \
      "$build/moonrl" run scripts/profile_model.lua "$w" >"$tmp/out" 2>"$tmp/err"; then
    echo "profile.sh: $side $w failed: $(tail -n 1 "$tmp/err")" >&2
    exit 1
  fi
  awk -F'\t' -v side="$side" '$1 == "profile" {
    printf "%s\t%s\t=wall\t%.3f\n%s\t%s\t=cpu\t%.3f\n", side, $2, 1000 * $4, side, $2, 1000 * $5 }' \
    "$tmp/out" >>"$tmp/times"
  perf report -i "$tmp/perf.data" --stdio --no-children --sort dso,sym 2>/dev/null |
    awk '/^ *[0-9.]+%/ { p = $1; sub(/%/, "", p); d = $2; s = ""
           for (i = 4; i <= NF; i++) s = s (i > 4 ? " " : "") $i
           printf "%s\t%s\t%s\n", p, d, s }' |
    phase_of "$tmp/map" | awk -F'\t' -v side="$side" -v w="$w" '
      $1 == "?" { print side "\t" w "\t?\t" $2 "\t" $3; next }
      { sum[$1] += $2 } END { for (k in sum) printf "%s\t%s\t%s\t%.4f\n", side, w, k, sum[k] }' \
    >>"$tmp/phases"
}

: >"$tmp/times"
: >"$tmp/phases"
echo "== machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
for w in $WORKLOADS; do
  [ -n "$BASE" ] && profile before "$BASE" "$w"
  profile after "$BUILD" "$w"
done

for w in $WORKLOADS; do
  awk -F'\t' -v w="$w" -v base="$BASE" '
    FILENAME ~ /times$/ && $2 == w { t[$1, $3] = $4; next }
    FILENAME ~ /phases$/ && $2 == w && $3 == "?" { odd[$1] = odd[$1] sprintf("    %s: %s%% %s\n", $1, $4, $5); next }
    FILENAME ~ /phases$/ && $2 == w { share[$1, $3] = $4; if (!($3 in seen)) { seen[$3] = 1; names[++n] = $3 } ; tot[$3] += $4 }
    END {
      printf "\n== %s: ", w
      if (base != "") printf "before %.2f ms wall, %.2f ms CPU per step; ", t["before", "=wall"], t["before", "=cpu"]
      printf "after %.2f ms wall, %.2f ms CPU per step", t["after", "=wall"], t["after", "=cpu"]
      if (base != "") printf " (%.2fx)", t["before", "=wall"] / t["after", "=wall"]
      printf "\n"
      # phases by their largest share on either side
      for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (tot[names[j]] > tot[names[i]]) { x = names[i]; names[i] = names[j]; names[j] = x }
      if (base != "") printf "  %-42s %14s %14s\n", "phase (share of CPU samples, CPU ms/step)", "before", "after"
      else printf "  %-42s %14s\n", "phase (share of CPU samples, CPU ms/step)", "after"
      for (i = 1; i <= n; i++) {
        k = names[i]
        if (share["before", k] < 0.5 && share["after", k] < 0.5) continue
        printf "  %-42s", k
        if (base != "") printf " %5.1f%% %6.2f", share["before", k], share["before", k] * t["before", "=cpu"] / 100
        printf " %5.1f%% %6.2f\n", share["after", k], share["after", k] * t["after", "=cpu"] / 100
      }
      if (odd["before"] odd["after"] != "") printf "  unassigned symbols of 1%% or more:\n%s%s", odd["before"], odd["after"]
    }' "$tmp/times" "$tmp/phases"
done
