-- aem_spec.lua - AEM as a trainer estimator (advantage = "aem", spec advantage.md 6.7): against a
-- direct computation (each episode's mean token entropy from the model's own forward pass, the
-- min-max scaling and exp(-H) normalised to group mean 1, times the GRPO advantage), and a group
-- whose entropies span less than 0.1, which keeps GRPO's advantages.
local rl = require "moonrl"
local advantage = require "moonrl.train.advantage"
local batchlib = require "moonrl.batch"

local tok = rl.tokenizer.bytes()

-- Two turns; an action with an "a" in it earns 1 (so rewards differ within a group).
local env = {
  name = "aem_toy", max_turns = 2,
  tasks = function(_, n) local t = {} for i = 1, n do t[i] = { i = i } end return t end,
  new = function()
    return {
      reset = function(self) self.n = 0 return "go" end,
      step = function(self, action)
        self.n = self.n + 1
        local hit = action:find("a", 1, true) ~= nil
        return "more", hit and 1 or 0, hit or self.n >= 2, { success = hit }
      end,
    }
  end,
}

local function make_batch(m)
  local ro = rl.rollout.new { model = m, episodes = 8, capacity = 64 }
  local tasks, seeds, groups = {}, {}, {}
  for i = 1, 8 do tasks[i], seeds[i], groups[i] = { i = i }, 30 + i, (i - 1) // 4 + 1 end
  local res = ro:run { tokenizer = tok, env = env, tasks = tasks, seeds = seeds, max_turns = 2, max_turn_tokens = 4 }
  local batch = batchlib.from_rollout(ro, res, groups)
  ro:free()
  return batch
end

-- GRPO's advantage, written out: (S - group mean) / (group sample sd + eps).
local function grpo(scores, groups, eps)
  local out = {}
  for i, s in ipairs(scores) do
    local sum, n = 0, 0
    for j, g in ipairs(groups) do if g == groups[i] then sum, n = sum + scores[j], n + 1 end end
    local mean, sq = sum / n, 0
    for j, g in ipairs(groups) do if g == groups[i] then sq = sq + (scores[j] - mean) ^ 2 end end
    out[i] = (s - mean) / (math.sqrt(sq / (n - 1)) + eps)
  end
  return out
end

describe("advantage = \"aem\"", function()
  it("is GRPO times exp(-scaled mean entropy) normalised to group mean 1, from the model's own entropies", function()
    local m = rl.model.new { vocab = tok:vocab_size(), dim = 32, layers = 1, heads = 2, ffn = 64, ctx = 64, seed = 7 }
    -- a little SFT on one reply, so that episodes sampling it are surer than the others (at
    -- initialisation every distribution is close to uniform and no group spans 0.1 nats)
    local data = {}
    for i = 1, 24 do
      data[i] = rl.sft_example(tok, { { role = "user", content = "go" }, { role = "assistant", content = "ab" } })
    end
    rl.sft { model = m, data = data, epochs = 4, batch_size = 8, lr = 1e-2, seed = 1 }
    local batch = make_batch(m)
    for i, ep in ipairs(batch.episodes) do ep.reward = ep.reward + 0.1 * i end -- every group has a spread
    local ctx = { model = m, cfg = { minibatch = 3, adv_epsilon = 1e-6 } }
    local adv, per = advantage.get("aem").fn(ctx, batch)
    -- entropies, one episode at a time
    local n, H, scores, groups = batch:size(), {}, {}, {}
    for i = 1, n do
      local _, ent = m:forward_batch { tokens = batch.tokens, mask = batch.mask, offsets = batch.offsets, episodes = { i } }
      local sum, cnt = 0, 0
      for p = batch.offsets[i] + 1, batch.offsets[i + 1] do
        if batch.mask:get(p) ~= 0 then sum, cnt = sum + ent:get(p), cnt + 1 end
      end
      H[i], scores[i], groups[i] = sum / cnt, batch.episodes[i].reward, batch.episodes[i].group
    end
    local base = grpo(scores, groups, 1e-6)
    local spans = 0
    for i = 1, n do
      local lo, hi, ws, k = math.huge, -math.huge, 0, 0
      for j = 1, n do
        if groups[j] == groups[i] then lo, hi = math.min(lo, H[j]), math.max(hi, H[j]) end
      end
      local alpha = 1
      if hi - lo >= 0.1 then
        for j = 1, n do
          if groups[j] == groups[i] then ws, k = ws + math.exp(-(H[j] - lo) / (hi - lo)), k + 1 end
        end
        alpha = math.exp(-(H[i] - lo) / (hi - lo)) / (ws / k)
        spans = spans + 1
      end
      assert.is_true(math.abs(per[i] - alpha * base[i]) < 1e-4, string.format("episode %d: %g vs %g", i, per[i], alpha * base[i]))
      assert.is_true(math.abs(batch.aem_alpha[i] - alpha) < 1e-4)
      for p = batch.offsets[i] + 1, batch.offsets[i + 1] do
        local want = batch.mask:get(p) ~= 0 and per[i] or 0
        assert.is_true(math.abs(adv:get(p) - want) < 1e-5)
      end
    end
    assert.is_true(spans > 0, "no group spanned 0.1 nats: the test would not exercise the modulation")
  end)

  it("keeps GRPO's advantages in groups whose entropies span less than 0.1 (a model at initialisation)", function()
    local m = rl.model.new { vocab = tok:vocab_size(), dim = 32, layers = 1, heads = 2, ffn = 64, ctx = 64, seed = 7 }
    local batch = make_batch(m)
    for i, ep in ipairs(batch.episodes) do ep.reward = ep.reward + 0.1 * i end
    local ctx = { model = m, cfg = { minibatch = 8, adv_epsilon = 1e-6 } }
    local H = advantage.mean_entropies(ctx, batch)
    local _, per = advantage.get("aem").fn(ctx, batch)
    local _, plain = advantage.get("grpo").fn(ctx, batch)
    local flat = 0
    for g = 1, 2 do
      local lo, hi = math.huge, -math.huge
      for i = 1, 8 do if batch.episodes[i].group == g then lo, hi = math.min(lo, H[i]), math.max(hi, H[i]) end end
      if hi - lo < 0.1 then
        flat = flat + 1
        for i = 1, 8 do
          if batch.episodes[i].group == g then assert.is_true(math.abs(per[i] - plain[i]) < 1e-9) end
        end
      end
    end
    -- either way, every alpha is positive and each group's alphas average 1
    for g = 1, 2 do
      local s, k = 0, 0
      for i = 1, 8 do if batch.episodes[i].group == g then s, k = s + batch.aem_alpha[i], k + 1 end end
      assert.is_true(math.abs(s / k - 1) < 1e-9)
    end
    assert.are.equal(2, flat)
  end)
end)
