-- step_gae_spec.lua - StepPO's step-level GAE as a trainer estimator (advantage = "step_gae"):
-- against a direct computation of the recursion over each episode's turns (turn rewards, the
-- critic's value at each turn's first sampled token, whitening over the batch's turns), the value
-- head's targets, a batch too small to whiten, and a short training run that is the same twice.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"
local advantage = require "moonrl.train.advantage"
local critic = require "moonrl.train.critic"
local batchlib = require "moonrl.batch"

local tok = rl.tokenizer.bytes()

-- Up to three turns; each turn pays 0.1 per distinct byte of its action (so turn rewards differ),
-- and an action with an "a" in it ends the episode (so episodes have different lengths).
local env = {
  name = "steps",
  max_turns = 3,
  tasks = H.numbered_tasks,
  new = function()
    return {
      reset = function(self) self.n = 0 return "go" end,
      step = function(self, action)
        self.n = self.n + 1
        local seen, d = {}, 0
        for ch in action:gmatch(".") do
          if not seen[ch] then seen[ch], d = true, d + 1 end
        end
        local stop = action:find("a", 1, true) ~= nil
        return "more", 0.1 * d, stop or self.n >= 3, { success = stop }
      end,
    }
  end,
}

local function model() return rl.model.new { vocab = 264, dim = 32, layers = 1, heads = 2, ffn = 64, ctx = 96, seed = 5 } end

-- 8 episodes in 2 groups; every episode's total reward is its turns' plus 0.25 (as a reward term
-- would add), which token_rewards puts on its last sampled token.
local function make_batch(m)
  local ro = rl.rollout.new { model = m, episodes = 8, capacity = 96 }
  local tasks, seeds, groups = {}, {}, {}
  for i = 1, 8 do tasks[i], seeds[i], groups[i] = { i = i }, 70 + i, (i - 1) // 4 + 1 end
  local res = ro:run { tokenizer = tok, env = env, tasks = tasks, seeds = seeds, max_turns = 3,
    max_turn_tokens = 4 }
  local batch = batchlib.from_rollout(ro, res, groups)
  for _, ep in ipairs(batch.episodes) do ep.reward = ep.reward + 0.25 end
  ro:free()
  return batch
end

-- A value head with weights that are not zero, so the values differ between tokens.
local function head(dim)
  local w = {}
  for j = 1, dim do w[j] = 0.05 * math.sin(j) end
  return critic.from { w = w, b = 0.1, mw = {}, vw = {}, mb = 0, vb = 0, t = 0 }
end

-- The per-turn reference: per episode, {turn (0-based) = {adv =, ret =}}.
local function reference(batch, values, gamma, lam)
  local steps = {} -- {episode, turn, reward, value}
  for i, ep in ipairs(batch.episodes) do
    local first, last = batch:range(i)
    local per = {}
    local last_sampled
    for p = first, last do
      if batch.mask:get(p) ~= 0 then
        local t = math.floor(batch.turns:get(p))
        if not per[t] then per[t] = { value = values:get(p) } end
        last_sampled = t
      end
    end
    local env_sum = 0
    for k, rec in ipairs(ep.record) do
      if per[k - 1] then per[k - 1].reward = rec.reward end
      env_sum = env_sum + rec.reward
    end
    per[last_sampled].reward = per[last_sampled].reward + (ep.reward - env_sum)
    for t = 0, last_sampled do
      if per[t] then steps[#steps + 1] = { i = i, t = t, r = per[t].reward, v = per[t].value } end
    end
  end
  -- GAE backwards over each episode's turns (consecutive here: every turn sampled tokens)
  local by_ep = {}
  for _, s in ipairs(steps) do
    by_ep[s.i] = by_ep[s.i] or {}
    by_ep[s.i][s.t] = s
  end
  for _, turns in pairs(by_ep) do
    local top = 0
    for t in pairs(turns) do top = math.max(top, t) end
    local next_v, next_a = 0, 0
    for t = top, 0, -1 do
      local s = turns[t]
      local delta = s.r + gamma * next_v - s.v
      s.a = delta + gamma * lam * next_a
      next_v, next_a = s.v, s.a
    end
  end
  local mean, sq = 0, 0
  for _, s in ipairs(steps) do mean = mean + s.a / #steps end
  for _, s in ipairs(steps) do sq = sq + (s.a - mean) ^ 2 end
  local sd = math.sqrt(sq / (#steps - 1))
  local out = {}
  for _, s in ipairs(steps) do
    out[s.i] = out[s.i] or {}
    out[s.i][s.t] = { adv = (s.a - mean) / (sd + 1e-8), ret = s.a + s.v }
  end
  return out, #steps
end

describe("advantage = \"step_gae\" (StepPO)", function()
  local m = model()
  local batch = make_batch(m)

  it("has episodes of different lengths and turn rewards that differ", function()
    local lengths = {}
    for _, ep in ipairs(batch.episodes) do lengths[#ep.record] = true end
    local n = 0
    for _ in pairs(lengths) do n = n + 1 end
    assert.is_true(n >= 2, "every episode took the same number of turns")
  end)

  it("equals GAE over each episode's turns, whitened over the batch's turns, with step returns", function()
    local value = head(32)
    local ctx = { cfg = { gamma = 0.9, lam = 0.8, minibatch = 3 }, model = m, value = value }
    local adv, per_episode = advantage.get("step_gae").fn(ctx, batch)
    local values = critic.values(ctx, batch)
    local want, nsteps = reference(batch, values, 0.9, 0.8)
    assert.is_true(nsteps > 8)
    local checked = 0
    for i = 1, batch:size() do
      local first, last = batch:range(i)
      local sum, cnt = 0, 0
      for p = first, last do
        if batch.mask:get(p) ~= 0 then
          local w = want[i][math.floor(batch.turns:get(p))]
          assert.is_near(w.adv, adv:get(p), 1e-4)
          assert.is_near(w.ret, batch.critic.returns:get(p), 1e-4)
          assert.is_near(values:get(p), batch.critic.old_values:get(p), 1e-6)
          sum, cnt, checked = sum + adv:get(p), cnt + 1, checked + 1
        else
          assert.are.equal(0, adv:get(p))
        end
      end
      assert.is_near(sum / cnt, per_episode[i], 1e-4)
    end
    assert.is_true(checked > 20)
  end)

  it("differs from the token-level estimator (gae) on the same batch", function()
    local ctx = { cfg = { gamma = 0.9, lam = 0.8, minibatch = 8 }, model = m, value = head(32) }
    local a = advantage.get("step_gae").fn(ctx, batch)
    local b = advantage.get("gae").fn(ctx, batch)
    assert.is_true(a:max_abs_diff(b) > 1e-3)
  end)

  it("gives no update on a batch with one turn, and keeps the value targets at the values", function()
    local m1 = model()
    local ro = rl.rollout.new { model = m1, episodes = 1, capacity = 96 }
    local res = ro:run { tokenizer = tok, env = env, tasks = { { i = 1 } }, seeds = { 3 },
      max_turns = 1, max_turn_tokens = 4 }
    local one = batchlib.from_rollout(ro, res, { 1 })
    ro:free()
    local ctx = { cfg = { gamma = 1, lam = 1, minibatch = 1 }, model = m1, value = head(32) }
    local adv, per_episode = advantage.get("step_gae").fn(ctx, one)
    assert.are.equal(0, adv:max_abs_diff(adv * 0))
    assert.are.equal(0, per_episode[1])
    assert.are.equal(0, one.critic.returns:max_abs_diff(one.critic.old_values))
  end)

  it("trains with rl.train: the value head moves, and the same seed gives the same run", function()
    local function run(dir)
      return rl.train { model = model(), tokenizer = tok, env = env, dir = dir, name = "run", seed = 2, steps = 3,
        tasks_per_step = 2, group_size = 4, max_turn_tokens = 4, lr = 1e-3, minibatch = 8,
        advantage = "step_gae", gamma = 0.95, eval = false, progress = false, plot = false,
        value_lr = 1e-2 }
    end
    local d1, d2 = H.tmpdir(), H.tmpdir()
    local a, b = run(d1), run(d2)
    local la = H.read_json_lines(d1 .. "/run/metrics.jsonl")
    local lb = H.read_json_lines(d2 .. "/run/metrics.jsonl")
    assert.are.equal(#la, #lb)
    local value_loss = 0
    for s = 1, #la do
      for k, v in pairs(la[s]) do
        if type(v) == "number" and not k:match("^time") and not k:match("per_s$") then assert.are.equal(v, lb[s][k], k) end
      end
      value_loss = value_loss + math.abs(la[s]["loss/value_loss"] or 0)
    end
    assert.is_true(value_loss > 0, "no value loss logged")
    local state = rl.json.decode(assert(io.open(d1 .. "/run/state.json")):read("a"))
    local moved = 0
    for _, w in ipairs(state.value_head.w) do moved = math.max(moved, math.abs(w)) end
    assert.is_true(moved > 0, "the value head did not move")
    assert.is_table(a.history)
    assert.is_table(b.history)
    H.sh("rm -rf " .. H.shell_quote(d1) .. " " .. H.shell_quote(d2))
  end)
end)
