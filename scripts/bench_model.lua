-- bench_model.lua - training and sampling throughput of the policy model (run by bench.sh inside
-- the moonrl command). Prints tab-separated lines:
--   model <name> train_tokens_per_s <median> train_flops_per_token <n>
--   model <name> sample_tokens_per_s <median>
-- Training: forward + backward + AdamW on a full batch of random tokens. Sampling: batch 16,
-- prompts of 16 tokens, 128 new tokens each, KV cache, temperature 1.
local rl = require "moonrl"

local CONFIGS = {
  { name = "small", vocab = 256, dim = 128, layers = 4, heads = 4, ffn = 384, T = 256, B = 16 },
  { name = "large", vocab = 256, dim = 512, layers = 8, heads = 8, ffn = 1536, T = 256, B = 8 },
}
local only = arg and arg[1]

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

-- Matmul FLOPs per trained token: 6 per weight of the projections and the head, plus attention
-- (q k^T and p v: 2 * 2 * T * dim per layer forward, causal halves it, times 3 for backward).
local function train_flops_per_token(c)
  local d, f, L, V, T = c.dim, c.ffn, c.layers, c.vocab, c.T
  local weights = L * (4 * d * d + 3 * d * f) + V * d
  return 6 * weights + 3 * L * 2 * T * d
end

for _, c in ipairs(CONFIGS) do
  if not only or only == c.name then
    local m = rl.model.new { vocab = c.vocab, dim = c.dim, layers = c.layers, heads = c.heads,
      ffn = c.ffn, ctx = c.T + 128, seed = 1 }
    local tokens = random_batch(c.B, c.T, c.vocab, 42)
    local opts = { tokens = tokens }
    local optim = { lr = 1e-4, weight_decay = 0.1 }
    m:accumulate(opts) -- warm-up: allocates activations and scratch once
    m:step(optim)
    local rates = {}
    for s = 1, 7 do
      local t0 = rl.clock()
      m:accumulate(opts)
      m:step(optim)
      rates[s] = c.B * c.T / (rl.clock() - t0)
    end
    print(string.format("model\t%s\ttrain_tokens_per_s\t%.1f\ttrain_flops_per_token\t%d", c.name,
      median(rates), train_flops_per_token(c)))

    local prompts = random_batch(16, 16, c.vocab, 7)
    m:generate { prompts = prompts, max_new_tokens = 8 } -- warm-up
    rates = {}
    for s = 1, 5 do
      local t0 = rl.clock()
      local g = m:generate { prompts = prompts, max_new_tokens = 128, temperature = 1, seed = s }
      local n = 0
      for b = 1, #g.tokens do n = n + #g.tokens[b] end
      rates[s] = n / (rl.clock() - t0)
    end
    print(string.format("model\t%s\tsample_tokens_per_s\t%.1f", c.name, median(rates)))
    m:free()
  end
end
