#!/bin/sh
# bench.sh - `make bench`: sgemm GFLOPS through the engine from C and from Lua beside a direct
# cblas_sgemm call on the same OpenBLAS in the same process; OpenBLAS linked the usual way with
# each core type (and with its own detection) as baselines; elementwise throughput; the policy
# model's training and sampling beside PyTorch; a reward graph's share of a training step; the tool
# sandbox beside fork+exec and bubblewrap; `moonrl serve` (requests/s, time to first token) and the
# HTTP client's cost per request against a loopback stub.
# BENCH_ROUNDS (default 3) alternating rounds. BENCH_ONLY picks parts (space- or comma-separated):
# blas model rl reward sandbox serve (default: all). The model part: BENCH_CONFIGS (default
# "small large qwenvocab qwen05b"), BENCH_BIG_ROUNDS (default 1: rounds of qwen05b, whose
# processes take minutes), and BENCH_BASELINE=/path/to/other/build to run that build's moonrl on
# the same scripts in alternation with this one ("before / after / ratio" columns; the RL part
# gets the same).
# usage: sh scripts/bench.sh BUILD
set -eu
BUILD=${1:?usage: bench.sh BUILD}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

ROUNDS=${BENCH_ROUNDS:-3}
# Every figure comes from separate processes; they run in alternation over ROUNDS rounds and each
# figure keeps its median round, so that a noisy moment on a shared machine does not land on one
# side only. Lines are "kind key value [value]" (tab-separated); `medians` reduces them.
medians() {
  awk -F'\t' '
    function median(k,   i, j, t, v, n) {
      n = count[k]
      for (i = 1; i <= n; i++) v[i] = val[k, i]
      for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (v[j] + 0 < v[i] + 0) { t = v[i]; v[i] = v[j]; v[j] = t }
      return v[int((n + 1) / 2)]
    }
    $3 ~ /^[0-9.]+$/ {
      k = $1 FS $2; if (!(k in count)) order[++keys] = k
      val[k, ++count[k]] = $3; if (NF > 3) val2[k, count[k]] = $4
      next
    }
    !seen[$0]++ { print }
    END {
      for (i = 1; i <= keys; i++) {
        k = order[i]; line = k FS median(k)
        if ((k, 1) in val2) {
          for (j = 1; j <= count[k]; j++) val[k, j] = val2[k, j]
          line = line FS median(k)
        }
        print line
      }
    }'
}
# ---- serving: `moonrl serve` on the quickstart-sized model at 1, 8 and 32 concurrent streaming
# clients, and the HTTP client against the mock server (scripts/bench_serve.lua, a fresh server
# and stub in every round) ----
serve_section() {
  : >"$tmp/serve"
  for round in $(seq "$ROUNDS"); do
    "$BUILD/moonrl" run scripts/bench_serve.lua "$BUILD" >>"$tmp/serve" ||
      printf 'serve\terror\tbench_serve.lua failed (exit %s)\n' "$?" >>"$tmp/serve"
  done
  echo
  echo "serving, moonrl serve on the quickstart-sized model (d=64 L=2, ctx 128, --max-batch 32);"
  echo "clients are rl.http coroutine tasks in one process, each sending streamed /v1/completions"
  echo "back to back (16-token id prompt, max_tokens 32, ignore_eos); median of $ROUNDS rounds:"
  medians <"$tmp/serve" | awk -F'\t' '
    { v[$1, $2] = $3 }
    END {
      if (("serve", "error") in v) print "  " v["serve", "error"]
      printf "  %8s %10s %10s %14s %14s %10s %13s\n", "clients", "req/s", "tokens/s", "TTFT p50 ms",
             "TTFT p90 ms", "batch seen", "client cores"
      split("1 8 32", cs, " ")
      for (i = 1; i <= 3; i++) {
        c = cs[i]
        printf "  %8d %10.1f %10.0f %14.3f %14.3f %10d %13.2f\n", c, v["serve", "rps_" c],
               v["serve", "tokens_per_s_" c], v["serve", "ttft_p50_ms_" c],
               v["serve", "ttft_p90_ms_" c], v["serve", "max_batch_seen_" c],
               v["serve", "client_cores_" c]
      }
      print "HTTP client against the mock server (a separate process, GET /hold?ms=0 answered \"ok\" at once):"
      printf "  %-12s %12s %14s %12s %10s\n", "in flight", "wall us/req", "client CPU us", "connections",
             "max open"
      split("1 16", fs, " ")
      for (i = 1; i <= 2; i++) {
        f = fs[i]
        printf "  %-12d %12.1f %14.1f %12d %10d\n", f, v["client", "wall_us_" f], v["client", "cpu_us_" f],
               v["client", "connections_" f], v["client", "max_open_" f]
      }
      print "  (targets at 16 in flight: under 100 us per request, 16 connections)"
    }'
}
ONLY=" $(echo "${BENCH_ONLY:-blas model rl reward sandbox serve}" | tr ',' ' ') "
want() { case "$ONLY" in *" $1 "*) return 0 ;; esac; return 1; }
BASE=${BENCH_BASELINE:-}
if [ -n "$BASE" ] && [ ! -x "$BASE/moonrl" ]; then
  echo "BENCH_BASELINE=$BASE: no moonrl there" >&2
  exit 1
fi

echo "== machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
: >"$tmp/c"
if want blas; then
: >"$tmp/raw"
for round in $(seq "$ROUNDS"); do
  if [ "$round" = 1 ]; then "$BUILD/bench_tensor"; else "$BUILD/bench_tensor" matmul; fi >>"$tmp/raw"
  "$BUILD/moonrl" run scripts/bench_tensor.lua $([ "$round" = 1 ] || echo matmul) >>"$tmp/raw"
  # OpenBLAS linked the usual way: its own detection, then each core type forced
  env -u OPENBLAS_CORETYPE "$BUILD/bench_stock_blas" | sed 's/^stock/detected/' >>"$tmp/raw"
  for core in Prescott Haswell SkylakeX; do
    OPENBLAS_CORETYPE=$core "$BUILD/bench_stock_blas" | sed "s/^stock/$core/" >>"$tmp/raw"
  done
done
medians <"$tmp/raw" >"$tmp/all"
grep -v -E '^(detected|Prescott|Haswell|SkylakeX)' "$tmp/all" | grep -v '^lua_' >"$tmp/c" || true
grep '^lua_' "$tmp/all" >"$tmp/lua" || true
grep -E '^(detected|Prescott|Haswell|SkylakeX)' "$tmp/all" >"$tmp/stock" || true

awk -F'\t' '$1 == "blas" { printf "== engine: OpenBLAS core %s (chosen by %s), %s threads\n", $2, $3, $4 }' "$tmp/c"
awk -F'\t' '$1 == "detected" && $2 == "core" { printf "== OpenBLAS linked normally, no OPENBLAS_CORETYPE, detects: %s\n", $3 }' "$tmp/stock"
echo
echo "sgemm n x n x n, float32, GFLOPS (median of $ROUNDS rounds of medians of 9 samples). 'direct'"
echo "calls cblas_sgemm of the OpenBLAS the engine loaded, in the same process, alternating with"
echo "the engine's calls."
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

fi # want blas

# ---- the policy model: training, scoring, sampling and decode; moonrl (and the baseline build's
# moonrl) and PyTorch alternating, one process per config and side ----
model_section() {
  if [ ! -s "$tmp/c" ]; then # BENCH_ONLY without blas: the sgemm peak for MFU still comes from this run
    : >"$tmp/raw"
    for round in $(seq "$ROUNDS"); do "$BUILD/bench_tensor" matmul >>"$tmp/raw"; done
    medians <"$tmp/raw" >"$tmp/c"
    awk -F'\t' '$1 == "blas" { printf "== engine: OpenBLAS core %s (chosen by %s), %s threads\n", $2, $3, $4 }' "$tmp/c"
  fi
  core=$(awk -F'\t' '$1 == "blas" { print $2 }' "$tmp/c")
  peak=$(awk -F'\t' '$1 == "matmul" && $3 > p { p = $3 } END { print p }' "$tmp/c")
  have_torch=0
  /usr/bin/python3 -c 'import torch' 2>/dev/null && have_torch=1
  configs=${BENCH_CONFIGS:-small large qwenvocab qwen05b}
  big_rounds=${BENCH_BIG_ROUNDS:-1}
  : >"$tmp/model"
  : >"$tmp/bw"
  # one side of one config: "side<TAB>config.metric<TAB>value" lines, or a note when it failed
  run_side() {
    side=$1 cfg=$2
    shift 2
    if "$@" >"$tmp/one" 2>"$tmp/one.err"; then
      awk -F'\t' -v side="$side" '($1 == "model" || $1 == "torch") && NF == 4 {
        print side "\t" $2 "." $3 "\t" $4 }' "$tmp/one" >>"$tmp/model"
    else
      printf '%s\t%s.error\tfailed (exit %s): %s\n' "$side" "$cfg" "$?" \
        "$(tail -n 1 "$tmp/one.err" | tr '\t' ' ')" >>"$tmp/model"
    fi
  }
  t_start=$(date +%s)
  for round in $(seq "$ROUNDS"); do
    "$BUILD/bench_tensor" membw >>"$tmp/bw"
    for cfg in $configs; do
      [ "$cfg" = qwen05b ] && [ "$round" -gt "$big_rounds" ] && continue
      # the two builds take turns at going first
      if [ -n "$BASE" ] && [ $((round % 2)) = 0 ]; then
        run_side before "$cfg" "$BASE/moonrl" run scripts/bench_model.lua "$cfg"
      fi
      run_side after "$cfg" "$BUILD/moonrl" run scripts/bench_model.lua "$cfg"
      if [ -n "$BASE" ] && [ $((round % 2)) = 1 ]; then
        run_side before "$cfg" "$BASE/moonrl" run scripts/bench_model.lua "$cfg"
      fi
      if [ "$have_torch" = 1 ]; then
        run_side torch "$cfg" env OPENBLAS_CORETYPE="$core" MOONRL_BENCH_THREADS="$(nproc)" \
          /usr/bin/python3 scripts/bench_torch.py "$cfg"
      fi
    done
  done
  bw=$(medians <"$tmp/bw" | awk -F'\t' '$1 == "membw" { printf "%s%s", sep, $3; sep = " " }')
  bw1=${bw%% *} bw2=${bw##* }
  echo
  echo "policy model: median of $ROUNDS alternating rounds (qwen05b: $big_rounds), one process per config"
  echo "and side; this part took $(($(date +%s) - t_start)) s. Configs (T = sequence length, B = batch of"
  echo "the training and scoring steps; ffn 3 x dim, head dim = dim / heads, Llama layout unless said):"
  echo "  small: vocab 256 d=128 L=4 h=4 T=256 B=16        large: vocab 256 d=512 L=8 h=8 T=256 B=8"
  echo "  qwenvocab: vocab 151,936 d=256 L=4 h=4 ffn 768 T=256 B=2"
  echo "  qwen05b: Qwen2.5-0.5B's shape, random weights: vocab 151,936 d=896 L=24, 14 query and 2"
  echo "    key/value heads, ffn 4,864, q/k/v biases, tied head, T=256 B=2"
  echo "train = forward + backward + AdamW; score = forward + the log-prob of every row (moonrl:"
  echo "m:forward_batch; PyTorch: log_softmax + gather, no autograd); score 14% = 3 rows of every 21"
  echo "scored; sample = batch 16, 16-token prompts, 128 new tokens (qwenvocab 16, qwen05b 32), KV cache,"
  echo "T = 1; top-k 50 / top-p 0.9 on the same. decode b1 / b16 = new tokens/s of the decode steps"
  echo "alone (a generate of N new tokens minus one of 1, over N - 1 steps); prefill = one 256-token"
  echo "prompt and 1 new token. MFU = train FLOPs/s over the best sgemm of this run ($peak GFLOPS)."
  echo "Memory bandwidth (read-streaming 1 GiB): $bw1 GB/s on 1 thread, $bw2 GB/s on 2; 'bound' ="
  echo "float32 weight bytes per decode step / step time, as a share of the 2-thread figure."
  echo "peak MB = VmHWM of the config's whole process (train + score + sample)."
  [ "$have_torch" = 1 ] || echo "(python3-torch is not installed: apt-get install python3-torch for the comparison)"
  [ -z "$BASE" ] || echo "before = $BASE/moonrl, after = $BUILD/moonrl, both on this tree's scripts."
  medians <"$tmp/model" | awk -F'\t' -v peak="$peak" -v bw="$bw2" -v base="$BASE" -v configs="$configs" '
    { v[$1, $2] = $3 }
    function has(side, key) { return (side, key) in v }
    function cell(x) { return x == "" ? "-" : x >= 1000 ? sprintf("%.0f", x) : sprintf("%.1f", x) }
    function get(side, key) { return has(side, key) ? v[side, key] : "" }
    function row(cfg, label, key, target, note,   a, b, t, line) {
      a = get("after", cfg "." key)
      if (a == "") return
      b = get("before", cfg "." key); t = get("torch", cfg "." key)
      line = sprintf("%-10s %-14s", cfg, label)
      if (base != "") line = line sprintf(" %10s %10s %8s", cell(b), cell(a), b != "" ? sprintf("%.2fx", a / b) : "-")
      else line = line sprintf(" %10s", cell(a))
      line = line sprintf(" %10s %8s %8s  %s", cell(t), t != "" ? sprintf("%.2fx", a / t) : "-", target, note)
      print line
    }
    function pct(x) { return sprintf("%.0f%%", 100 * x) }
    END {
      n = split(configs, cs, " ")
      sides["after"]; sides["before"]
      for (i = 1; i <= n; i++) for (s in sides) {
        c = cs[i]
        if (has(s, c ".decode1_step_s")) v[s, c ".decode1_tokens_per_s"] = 1 / v[s, c ".decode1_step_s"]
        if (has(s, c ".decode16_step_s")) v[s, c ".decode16_tokens_per_s"] = 16 / v[s, c ".decode16_step_s"]
      }
      if (base != "") printf "%-10s %-14s %10s %10s %8s %10s %8s %8s  %s\n", "config", "metric", "before",
                             "after", "aft/bef", "PyTorch", "ratio", "target", "MFU, bound, cost"
      else printf "%-10s %-14s %10s %10s %8s %8s  %s\n", "config", "metric", "moonrl", "PyTorch", "ratio",
                  "target", "MFU, bound, cost"
      for (i = 1; i <= n; i++) {
        c = cs[i]
        for (s in sides) if (has(s, c ".error")) printf "%-10s %s: %s\n", c, s, v[s, c ".error"]
        if (has("torch", c ".error")) printf "%-10s PyTorch: %s\n", c, v["torch", c ".error"]
        a = get("after", c ".train_tokens_per_s")
        mfu = a != "" ? "MFU " pct(a * v["after", c ".train_flops_per_token"] / (peak * 1e9)) : ""
        tt = c == "small" ? ">=3x" : c == "large" ? ">=1.8x" : c == "qwen05b" ? ">=1.5x" : ""
        mt = c == "small" ? " (>=45%)" : c == "large" ? " (>=75%)" : ""
        row(c, "train tok/s", "train_tokens_per_s", tt, mfu mt)
        row(c, "score tok/s", "score_tokens_per_s", "", "")
        a = get("after", c ".score14_tokens_per_s")
        if (a != "") row(c, "score 14% t/s", "score14_tokens_per_s", "",
                         "costs " pct(v["after", c ".score_tokens_per_s"] / a) " of scoring all (<=25%)")
        tt = c == "small" ? ">=15x" : c == "large" ? ">=10x" : c == "qwen05b" ? ">=1.5x" : ""
        row(c, "sample tok/s", "sample_tokens_per_s", tt, "")
        plain = get("after", c ".sample_tokens_per_s")
        a = get("after", c ".sample_topk_tokens_per_s")
        if (a != "") row(c, "top-k 50 t/s", "sample_topk_tokens_per_s", "", sprintf("%.2fx plain sampling'"'"'s time (<=1.2x)", plain / a))
        a = get("after", c ".sample_topp_tokens_per_s")
        if (a != "") row(c, "top-p 0.9 t/s", "sample_topp_tokens_per_s", "", sprintf("%.2fx plain sampling'"'"'s time (<=1.2x)", plain / a))
        wb = get("after", c ".weight_bytes")
        a = get("after", c ".decode1_step_s")
        if (a != "") row(c, "decode b1 t/s", "decode1_tokens_per_s", "",
                         sprintf("weights at %.1f GB/s: %s of bound%s", wb / a / 1e9, pct(wb / a / 1e9 / bw),
                                 c == "large" ? " (>=80%)" : ""))
        a = get("after", c ".decode16_step_s")
        if (a != "") row(c, "decode b16 t/s", "decode16_tokens_per_s", "",
                         sprintf("weights at %.1f GB/s: %s of bound%s", wb / a / 1e9, pct(wb / a / 1e9 / bw),
                                 c == "large" ? " (>=60%; >=1.5x today'"'"'s)" : ""))
        row(c, "prefill256 t/s", "prefill256_tokens_per_s", "", "")
        row(c, "peak MB", "peak_rss_mb", c == "qwen05b" ? "<=1x" : "", "")
      }
    }'
}
want model && model_section

# ---- RL: rollouts of the quickstart environment, one update, advantages and loss at 1M tokens ----
if want rl; then
: >"$tmp/rl"
for round in $(seq "$ROUNDS"); do
  if [ -n "$BASE" ] && [ $((round % 2)) = 0 ]; then
    "$BASE/moonrl" run scripts/bench_rl.lua | grep "^rl" | sed 's/^rl/before/' >>"$tmp/rl"
  fi
  "$BUILD/moonrl" run scripts/bench_rl.lua | grep "^rl" >>"$tmp/rl"
  if [ -n "$BASE" ] && [ $((round % 2)) = 1 ]; then
    "$BASE/moonrl" run scripts/bench_rl.lua | grep "^rl" | sed 's/^rl/before/' >>"$tmp/rl"
  fi
done
medians <"$tmp/rl" >"$tmp/rlm"
echo
echo "RL (median of $ROUNDS rounds, each the best of its repetitions): the quickstart policy (d=64"
echo "L=2) on guess_letter, 256 episodes (16 tasks x 16) decoded together, up to 4 turns of 3 tokens."
awk -F'\t' '$1 == "rl" { v[$2] = $3 } END {
  printf "  rollout: %.0f episodes in %.3f s: %.0f turns/s, %.0f tokens/s (%.0f sampled tokens/s)\n",
         v["rollout_episodes"], v["rollout_seconds"], v["rollout_turns_per_s"],
         v["rollout_tokens_per_s"], v["rollout_sampled_tokens_per_s"]
  printf "  time in Lua environment code (reset, parse, step): %.1f%% of the rollout\n",
         100 * v["rollout_lua_share"]
  printf "  PPO update of that batch (4 minibatches: forward, loss, backward, AdamW): %.3f s, %.0f tokens/s\n",
         v["update_seconds"], v["update_tokens_per_s"]
  printf "  1M tokens (4096 episodes x 256): GRPO advantages + broadcast %.1f ms; PPO loss + gradient %.1f ms\n",
         1000 * v["grpo_1m_seconds"], 1000 * v["ppo_loss_1m_seconds"]
}' "$tmp/rlm"
if [ -n "$BASE" ]; then
  echo "  before = $BASE/moonrl, after = this build, same script:"
  awk -F'\t' '{ v[$1, $2] = $3 } END {
    printf "  %-28s %10s %10s %8s %8s\n", "", "before", "after", "ratio", "target"
    split("rollout_turns_per_s rollout_tokens_per_s rollout_sampled_tokens_per_s update_tokens_per_s", k, " ")
    for (i = 1; i <= 4; i++)
      printf "  %-28s %10.0f %10.0f %7.2fx %8s\n", k[i], v["before", k[i]], v["rl", k[i]],
             v["rl", k[i]] / v["before", k[i]], k[i] == "rollout_tokens_per_s" || k[i] == "update_tokens_per_s" ? ">=1.5x" : ""
  }' "$tmp/rlm"
fi
fi # want rl

# ---- the reward graph's share of a training step, then with a curriculum and novelty (spec acceptance 22) ----
if want reward; then
: >"$tmp/reward"
for round in $(seq "$ROUNDS"); do
  "$BUILD/moonrl" run scripts/bench_reward.lua | grep "^reward" >>"$tmp/reward"
done
medians <"$tmp/reward" | awk -F'\t' '{ v[$2] = $3 } END {
  printf "\nreward graph, 512 episodes a step (32 tasks x 16), 5 rule terms: %.1f ms, %.2f%% of the step (target <= 5%%);\n",
         1000 * v["graph_seconds"], 100 * v["graph_share"]
  printf "  the default stage with 4 rewards functions: %.2f ms, %.2f%%\n", 1000 * v["plain_seconds"],
         100 * v["plain_share"]
  printf "reward graph + curriculum (learnability over a pool of 1,000) + novelty (32 candidates against 10,000): %.1f + %.1f + %.1f ms of a %.0f ms step, %.2f%% (target <= 5%%)\n",
         1000 * v["agentlib_reward_seconds"], 1000 * v["agentlib_curriculum_seconds"],
         1000 * v["agentlib_novelty_seconds"], 1000 * v["agentlib_step_seconds"], 100 * v["agentlib_share"]
}'
fi # want reward

# ---- the tool sandbox: /bin/true through a pool (every protection on) beside plain fork+exec
# and bubblewrap, sampled in alternation in the same process; calls per second through the
# pool; restricted-Lua calls. scripts/bench_sandbox.c pins itself to two cores. ----
if want sandbox; then
: >"$tmp/sandbox"
for round in $(seq "$ROUNDS"); do
  "$BUILD/bench_sandbox" 200 >>"$tmp/sandbox" ||
    printf 'sandbox\terror\tbench_sandbox failed (exit %s)\n' "$?" >>"$tmp/sandbox"
done
echo
echo "tool sandbox, 2 cores; latency = median of 200 calls per round, median of $ROUNDS rounds:"
medians <"$tmp/sandbox" | awk -F'\t' '
  $1 == "sandbox" { v[$2] = $3 }
  END {
    if ("error" in v) print "  " v["error"]
    printf "  protections on: %s\n", v["protections"]
    printf "  %-44s %8.3f ms   (target <= 2.0 ms)\n", "/bin/true through the pool", v["pool_true_ms"]
    printf "  %-44s %8.3f ms\n", "  the same without the network namespace", v["pool_no_net_true_ms"]
    printf "  %-44s %8.3f ms\n", "plain fork+exec", v["fork_exec_true_ms"]
    if ("bwrap_true_ms" in v)
      printf "  %-44s %8.3f ms   pool %.2fx faster (target >= 2x)\n",
             "bwrap --unshare-all --ro-bind / / true", v["bwrap_true_ms"],
             v["bwrap_true_ms"] / v["pool_true_ms"]
    else print "  bwrap: " v["bwrap"]
    printf "  %-44s %8.0f /s   (target >= 700; 4, 8, 16 in flight: %s, %s, %s)\n",
           "calls through the pool", v["pool_calls_per_s"], v["pool_calls_per_s_4_in_flight"],
           v["pool_calls_per_s_8_in_flight"], v["pool_calls_per_s_16_in_flight"]
    printf "  %-44s %8.4f ms\n", "restricted Lua call, in-process", v["lua_call_ms"]
    printf "  %-44s %8.3f ms\n", "restricted Lua call, sandboxed worker", v["lua_worker_call_ms"]
  }'

fi # want sandbox

if want serve; then serve_section; fi
