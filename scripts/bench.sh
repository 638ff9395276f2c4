#!/bin/sh
# bench.sh - `make bench`: sgemm GFLOPS through the engine from C and from Lua beside a direct
# cblas_sgemm call on the same OpenBLAS in the same process; OpenBLAS linked the usual way with
# each core type (and with its own detection) as baselines; elementwise throughput; the policy
# model's training and sampling beside PyTorch; a reward graph's share of a training step; the tool
# sandbox beside fork+exec and bubblewrap; `moonrl serve` (requests/s, time to first token) and the
# HTTP client's cost per request against a loopback stub.
# BENCH_ROUNDS (default 3) alternating rounds; BENCH_ONLY=serve runs the serving part only.
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
if [ "${BENCH_ONLY:-}" = serve ]; then
  serve_section
  exit 0
fi

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

echo "== machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
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

# ---- the policy model: training and sampling, moonrl and PyTorch alternating ----
core=$(awk -F'\t' '$1 == "blas" { print $2 }' "$tmp/c")
have_torch=0
/usr/bin/python3 -c 'import torch' 2>/dev/null && have_torch=1
: >"$tmp/model"
for round in $(seq "$ROUNDS"); do
  "$BUILD/moonrl" run scripts/bench_model.lua | grep "^model" >>"$tmp/model"
  if [ "$have_torch" = 1 ]; then
    OPENBLAS_CORETYPE=$core MOONRL_BENCH_THREADS=$(nproc) /usr/bin/python3 scripts/bench_torch.py \
      >>"$tmp/model"
  fi
done
peak=$(awk -F'\t' '$1 == "matmul" && $3 > p { p = $3 } END { print p }' "$tmp/c")
echo
echo "policy model, Llama layout, vocab 256, ffn 3 x dim; median of $ROUNDS alternating rounds."
echo "train = forward + backward + AdamW on a full batch; sample = batch 16, 16-token prompts,"
echo "128 new tokens with the KV cache. MFU = train FLOPs/s over the best sgemm of this run"
echo "($peak GFLOPS). small: d=128 L=4 h=4 T=256 B=16; large: d=512 L=8 h=8 T=256 B=8."
[ "$have_torch" = 1 ] || echo "(python3-torch is not installed: apt-get install python3-torch for the comparison)"
awk -F'\t' -v peak="$peak" '
  function median(key,   n, i, j, t, v) {
    n = count[key]
    for (i = 1; i <= n; i++) v[i] = val[key, i]
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
    return n ? v[int((n + 1) / 2)] : 0
  }
  { key = $1 FS $2 FS $3; val[key, ++count[key]] = $4; if ($5 == "train_flops_per_token") flops[$2] = $6 }
  END {
    printf "%-6s %-8s %12s %12s %8s %8s %6s\n", "config", "metric", "moonrl", "PyTorch", "ratio",
           "target", "MFU"
    split("small large", names, " ")
    for (i = 1; i <= 2; i++) {
      name = names[i]
      split("train sample", metrics, " ")
      for (j = 1; j <= 2; j++) {
        metric = metrics[j] "_tokens_per_s"
        ours = median("model" FS name FS metric); theirs = median("torch" FS name FS metric)
        target = metrics[j] == "sample" ? 10 : (name == "small" ? 3 : 1.5)
        mfu = metrics[j] == "train" ? sprintf("%5.1f%%", 100 * ours * flops[name] / (peak * 1e9)) : ""
        printf "%-6s %-8s %12.1f %12s %7s %7sx %6s\n", name, metrics[j] " tok/s", ours,
               theirs ? sprintf("%.1f", theirs) : "-", theirs ? sprintf("%.2fx", ours / theirs) : "-",
               target, mfu
      }
    }
  }' "$tmp/model"

# ---- RL: rollouts of the quickstart environment, one update, advantages and loss at 1M tokens ----
: >"$tmp/rl"
for round in $(seq "$ROUNDS"); do
  "$BUILD/moonrl" run scripts/bench_rl.lua | grep "^rl" >>"$tmp/rl"
done
medians <"$tmp/rl" >"$tmp/rlm"
echo
echo "RL (median of $ROUNDS rounds, each the best of its repetitions): the quickstart policy (d=64"
echo "L=2) on guess_letter, 256 episodes (16 tasks x 16) decoded together, up to 4 turns of 3 tokens."
awk -F'\t' '{ v[$2] = $3 } END {
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

# ---- the reward graph's share of a training step, then with a curriculum and novelty (spec acceptance 22) ----
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

# ---- the tool sandbox: /bin/true through a pool (every protection on) beside plain fork+exec
# and bubblewrap, sampled in alternation in the same process; calls per second through the
# pool; restricted-Lua calls. scripts/bench_sandbox.c pins itself to two cores. ----
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

serve_section
