-- bench_model.lua - the policy model's throughput (run by bench.sh inside the moonrl command, one
-- process per config so that each process's peak memory is its own config's):
--   moonrl run scripts/bench_model.lua CONFIG
-- Prints tab-separated lines "model <config> <metric> <value>":
--   train_tokens_per_s      forward + backward + AdamW on a full batch of random tokens
--   score_tokens_per_s      forward + log-probs of every row (m:forward_batch, all rows sampled)
--   score14_tokens_per_s    the same with 14% of the rows scored (3 of every 21: rollout-like)
--   sample_tokens_per_s     batch 16, 16-token prompts, `new` new tokens (plain sampling, T = 1);
--   sample_topk_tokens_per_s, sample_topp_tokens_per_s   the same with top-k 50 / top-p 0.9
--   decode1_step_s, decode16_step_s   seconds per decode step at batch 1 / 16: the time of
--                           `new` new tokens minus that of 1 (the prefill), over new - 1 steps
--   prefill256_tokens_per_s batch 1, a 256-token prompt, 1 new token
--   peak_rss_mb             VmHWM of this process at the end (all of the above)
-- and the constants train_flops_per_token and weight_bytes (float32 weights read by one decode
-- step: every projection, bias and norm of every layer, and the LM head).
local rl = require "moonrl"

-- ffn 3 x dim for the Llama-layout configs; qwen05b is Qwen2.5-0.5B's shape (random weights).
local CONFIGS = {
  small = { vocab = 256, dim = 128, layers = 4, heads = 4, ffn = 384, T = 256, B = 16,
    new = 128, train_reps = 7, sample_reps = 5 },
  large = { vocab = 256, dim = 512, layers = 8, heads = 8, ffn = 1536, T = 256, B = 8,
    new = 128, train_reps = 7, sample_reps = 3, decode = true, prefill = true },
  qwenvocab = { vocab = 151936, dim = 256, layers = 4, heads = 4, ffn = 768, T = 256, B = 2,
    new = 16, train_reps = 3, sample_reps = 3, score = true, variants = true },
  qwen05b = { arch = "qwen2", vocab = 151936, dim = 896, layers = 24, heads = 14, kv_heads = 2,
    ffn = 4864, tie = true, rope_theta = 1e6, norm_eps = 1e-6, T = 256, B = 2, new = 32,
    train_reps = 2, sample_reps = 2, score = true, decode = true },
}
local name = arg and arg[1]
local c = CONFIGS[name or ""]
if not c then
  io.stderr:write("usage: moonrl run scripts/bench_model.lua small|large|qwenvocab|qwen05b\n")
  os.exit(2)
end

local function out(metric, value, fmt)
  print(string.format("model\t%s\t%s\t" .. (fmt or "%.6g"), name, metric, value))
  io.stdout:flush()
end

local function median(v)
  table.sort(v)
  return v[(#v + 1) // 2]
end

local function random_batch(B, T, vocab, seed)
  local state, tokens = seed, {}
  for b = 1, B do
    local row = {}
    for t = 1, T do
      state = (state * 6364136223846793005 + 1442695040888963407)
      row[t] = (state >> 33) % vocab
    end
    tokens[b] = row
  end
  return tokens
end

local kv_heads = c.kv_heads or c.heads
local head_dim = c.dim // c.heads
local q_dim, kv_dim = c.heads * head_dim, kv_heads * head_dim

-- Matmul FLOPs per trained token: 6 per weight of the projections and the head, plus attention
-- (q k^T and p v: 2 * 2 * T * q_dim per layer forward, causal halves it, times 3 for backward).
local function train_flops_per_token()
  local d, f, L, V, T = c.dim, c.ffn, c.layers, c.vocab, c.T
  local weights = L * (2 * d * q_dim + 2 * d * kv_dim + 3 * d * f) + V * d
  return 6 * weights + 3 * L * 2 * T * q_dim
end

local function weight_bytes()
  local d, L = c.dim, c.layers
  local per_layer = 2 * d * q_dim + 2 * d * kv_dim + 3 * d * c.ffn + 2 * d
  if c.arch == "qwen2" then per_layer = per_layer + q_dim + 2 * kv_dim end
  local head = c.vocab * d -- tied or not, the head is one vocab x dim matrix read per step
  return 4 * (L * per_layer + d + head)
end

local m = rl.model.new { arch = c.arch, vocab = c.vocab, dim = c.dim, layers = c.layers,
  heads = c.heads, kv_heads = kv_heads, ffn = c.ffn, ctx = c.T + 128, tie = c.tie,
  rope_theta = c.rope_theta, norm_eps = c.norm_eps, seed = 1 }
out("train_flops_per_token", train_flops_per_token(), "%d")
out("weight_bytes", weight_bytes(), "%d")

-- training
local tokens = random_batch(c.B, c.T, c.vocab, 42)
do
  local opts = { tokens = tokens }
  local optim = { lr = 1e-4, weight_decay = 0.1 }
  m:accumulate(opts) -- warm-up: allocates activations and scratch once
  m:step(optim)
  local rates = {}
  for s = 1, c.train_reps do
    local t0 = rl.clock()
    m:accumulate(opts)
    m:step(optim)
    rates[s] = c.B * c.T / (rl.clock() - t0)
  end
  out("train_tokens_per_s", median(rates), "%.1f")
end

-- scoring: the batch as a flat trajectory batch (m:forward_batch), every row or 14% scored
local function score_rate(period, sampled)
  local flat, mask, offsets, eps = {}, {}, { 0 }, {}
  for b = 1, c.B do
    for t = 1, c.T do
      flat[#flat + 1] = tokens[b][t]
      mask[#mask + 1] = (t - 1) % period >= period - sampled and 1 or 0
    end
    offsets[b + 1], eps[b] = b * c.T, b
  end
  local opts = { tokens = rl.tensor.from(flat), mask = rl.tensor.from(mask), offsets = offsets,
    episodes = eps }
  m:forward_batch(opts) -- warm-up
  local rates = {}
  for s = 1, c.train_reps do
    local t0 = rl.clock()
    m:forward_batch(opts)
    rates[s] = c.B * c.T / (rl.clock() - t0)
  end
  return median(rates)
end
out("score_tokens_per_s", score_rate(1, 1), "%.1f")
if c.score then out("score14_tokens_per_s", score_rate(21, 3), "%.1f") end

-- sampling and decode: seconds of a generate call (median of sample_reps)
local function generate_seconds(prompts, new, extra)
  local times = {}
  for s = 1, c.sample_reps do
    local opts = { prompts = prompts, max_new_tokens = new, temperature = 1, seed = s }
    for k, v in pairs(extra or {}) do opts[k] = v end
    local t0 = rl.clock()
    local g = m:generate(opts)
    times[s] = rl.clock() - t0
    for b = 1, #g.tokens do
      if #g.tokens[b] ~= new then error("generate stopped early") end
    end
  end
  return median(times)
end

local prompts = random_batch(16, 16, c.vocab, 7)
m:generate { prompts = prompts, max_new_tokens = 8 } -- warm-up
local t_new = generate_seconds(prompts, c.new)
out("sample_tokens_per_s", 16 * c.new / t_new, "%.1f")
if c.variants then
  out("sample_topk_tokens_per_s", 16 * c.new / generate_seconds(prompts, c.new, { top_k = 50 }), "%.1f")
  out("sample_topp_tokens_per_s", 16 * c.new / generate_seconds(prompts, c.new, { top_p = 0.9 }), "%.1f")
end
if c.decode then
  out("decode16_step_s", (t_new - generate_seconds(prompts, 1)) / (c.new - 1))
  local one = { prompts[1] }
  m:generate { prompts = one, max_new_tokens = 8 }
  out("decode1_step_s", (generate_seconds(one, c.new) - generate_seconds(one, 1)) / (c.new - 1))
end
if c.prefill then
  local long = random_batch(1, 256, c.vocab, 11)
  m:generate { prompts = long, max_new_tokens = 1 }
  out("prefill256_tokens_per_s", 256 / generate_seconds(long, 1), "%.1f")
end
m:free()

local f = io.open("/proc/self/status")
if f then
  local kb = f:read("a"):match("VmHWM:%s*(%d+)")
  f:close()
  if kb then out("peak_rss_mb", tonumber(kb) / 1024, "%.0f") end
end
