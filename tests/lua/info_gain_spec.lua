-- info_gain_spec.lua - information-gain advantages in rl.train: the a2tgpo and igpo estimators
-- against a hand computation of their formulas on a real rollout's forced scores, the loss kind
-- "a2tgpo" against a direct computation, a tiny training run of each (metrics logged, the same
-- seed giving the same run), and the info_gain option's errors.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"
local advantage = require "moonrl.train.advantage"
local options = require "moonrl.train.options"
local batchlib = require "moonrl.batch"

local tok = rl.tokenizer.bytes()

-- Three turns; the second observation tells the answer; the reward is 1 for "answer <x>".
local hint = {
  name = "hint",
  max_turns = 3,
  tasks = function(_, n)
    local t = {}
    for i = 1, n do t[i] = { x = string.char(96 + (i - 1) % 26 + 1) } end
    return t
  end,
  new = function()
    return {
      reset = function(self, task) self.task, self.n = task, 0 return "find x" end,
      step = function(self, action)
        self.n = self.n + 1
        local ok = action == "answer " .. self.task.x
        return self.n == 1 and ("x is " .. self.task.x) or "go on", ok and 1 or 0,
          ok or self.n >= 3, { success = ok }
      end,
      clone = function(self)
        local c = {}
        for k, v in pairs(self) do c[k] = v end
        return c
      end,
    }
  end,
}
local function answer(task) return "answer " .. task.x end

local function model() return rl.model.new { vocab = 264, dim = 32, layers = 1, heads = 2, ffn = 64, ctx = 128, seed = 9 } end

-- A batch of 3 groups of 4 episodes with forced scores after each continuing turn.
local function scored_batch(m)
  local ro = rl.rollout.new { model = m, episodes = 12, capacity = 128 }
  local tasks, seeds, groups = {}, {}, {}
  for i = 1, 12 do
    tasks[i] = hint.tasks(nil, 3)[(i - 1) // 4 + 1]
    seeds[i], groups[i] = 40 + i, (i - 1) // 4 + 1
  end
  local res = ro:run { tokenizer = tok, env = hint, tasks = tasks, seeds = seeds, max_turns = 3,
    max_turn_tokens = 6, forced = function(view) return answer(view.task) end }
  return batchlib.from_rollout(ro, res, groups)
end

-- Per episode: the IG list, by hand from the forced scores (mean log-probability per token).
local function igs_of(batch, kind)
  local out = {}
  for i, ep in ipairs(batch.episodes) do
    local f, ig = {}, {}
    for k, e in ipairs(ep.forced) do
      local s = 0
      for _, v in ipairs(e.logprobs) do s = s + v end
      f[k] = s / #e.logprobs
    end
    for t = 2, #f do ig[t - 1] = kind == "prob" and math.exp(f[t]) - math.exp(f[t - 1]) or f[t] - f[t - 1] end
    out[i] = ig
  end
  return out
end

-- The advantage of each episode's turns (0-based turn -> value) read off the per-token tensor.
local function turn_values(batch, adv)
  local out = {}
  for i = 1, batch:size() do
    out[i] = {}
    local a, b = batch:range(i)
    for p = a, b do
      if batch.mask:get(p) ~= 0 then out[i][math.floor(batch.turns:get(p))] = adv:get(p) end
    end
  end
  return out
end

local function mean_sd(v, unbiased)
  local m, s = 0, 0
  for _, x in ipairs(v) do m = m + x / #v end
  for _, x in ipairs(v) do s = s + (x - m) ^ 2 end
  return m, math.sqrt(s / (unbiased and math.max(#v - 1, 1) or #v))
end

describe("information-gain advantages", function()
  local m = model()
  local batch = scored_batch(m)
  local ig_cfg = { answer = answer, kind = "logprob", alpha = 0.3, beta = 0.3, gamma = 1.0 }

  it("a2tgpo: alpha D_t + A_o on IG turns, A_o on the answer, clip scales 1 + beta (2 sig(g) - 1)", function()
    local adv = advantage.get("a2tgpo").fn({ cfg = { info_gain = ig_cfg } }, batch)
    local got, scale = turn_values(batch, adv), turn_values(batch, batch.clip_scale)
    local igs = igs_of(batch, "logprob")
    local n, eps = batch:size(), 1e-6
    -- g: IG normalised within (group, turn index), population std, groups of one 0
    local g = {}
    for i = 1, n do g[i] = {} end
    local cells = {}
    for i, ep in ipairs(batch.episodes) do
      for t, v in ipairs(igs[i]) do
        local key = ep.group .. ":" .. t
        cells[key] = cells[key] or {}
        table.insert(cells[key], { i = i, t = t, v = v })
      end
    end
    for _, cell in pairs(cells) do
      local vals = {}
      for k, c in ipairs(cell) do vals[k] = c.v end
      local mu, sd = mean_sd(vals, false)
      for _, c in ipairs(cell) do g[c.i][c.t] = #cell > 1 and (c.v - mu) / (sd + eps) or 0 end
    end
    -- A_o: GRPO of the rewards in each group
    local ao = {}
    for grp = 1, 3 do
      local vals, idx = {}, {}
      for i, ep in ipairs(batch.episodes) do
        if ep.group == grp then vals[#vals + 1], idx[#idx + 1] = ep.reward, i end
      end
      local mu, sd = mean_sd(vals, true)
      for k, i in ipairs(idx) do ao[i] = (vals[k] - mu) / (sd + eps) end
    end
    local checked = 0
    for i = 1, n do
      local K = #igs[i]
      for turn, v in pairs(got[i]) do
        local t = turn + 1
        local want, want_scale = ao[i], 1
        if t <= K then
          local D = 0
          for j = t, K do D = D + g[i][j] end
          want = 0.3 * D / math.sqrt(K - t + 1) + ao[i]
          want_scale = 1 + 0.3 * (2 / (1 + math.exp(-g[i][t])) - 1)
          checked = checked + 1
        end
        assert.is_true(math.abs(v - want) < 1e-5, string.format("episode %d turn %d: %g vs %g", i, t, v, want))
        assert.is_true(math.abs(scale[i][turn] - want_scale) < 1e-5)
      end
    end
    assert.is_true(checked >= 12, "IG turns checked: " .. checked)
    assert.is_true(batch.adv_metrics["ig/turns"] >= 12)
  end)

  it("igpo: the discounted sum of batch-normalised turn rewards (IG, then the outcome)", function()
    local cfg = { info_gain = { answer = answer, kind = "prob", alpha = 0.3, beta = 0.3, gamma = 0.9 } }
    local adv = advantage.get("igpo").fn({ cfg = cfg }, batch)
    local got = turn_values(batch, adv)
    local igs = igs_of(batch, "prob")
    local raw, where = {}, {}
    for i, ep in ipairs(batch.episodes) do
      for t = 1, ep.turns do
        raw[#raw + 1] = igs[i][t] or (t == ep.turns and ep.reward or 0)
        where[#where + 1] = { i = i, t = t }
      end
    end
    local mu, sd = mean_sd(raw, false)
    local z = {}
    for k, w in ipairs(where) do
      z[w.i] = z[w.i] or {}
      z[w.i][w.t] = (raw[k] - mu) / (sd + 1e-6)
    end
    for i, ep in ipairs(batch.episodes) do
      for turn, v in pairs(got[i]) do
        local want = 0
        for j = ep.turns, turn + 1, -1 do want = z[i][j] + 0.9 * want end
        assert.is_true(math.abs(v - want) < 1e-5, string.format("episode %d turn %d: %g vs %g", i, turn + 1, v, want))
      end
    end
    assert.is_true(batch.adv_metrics["adv/turn_1_abs"] > 0)
  end)

  it("loss kind a2tgpo: a turn's ratio is exp(mean log ratio), its clip range scaled", function()
    local mask = rl.tensor.from { 0, 1, 1, 1, 0, 1 }
    local turns = rl.tensor.from { -1, 0, 0, 1, 1, 1 }
    local logp = rl.tensor.from { 0, -1.0, -2.0, -0.5, 0, -1.5 }
    local old = rl.tensor.from { 0, -1.2, -1.6, -0.9, 0, -1.0 }
    local adv = rl.tensor.from { 0, 1, 1, -2, 0, -2 }
    local scale = rl.tensor.from { 1, 1.2, 1.2, 0.8, 1, 0.8 }
    local stats, dlogp = rl.objective.loss { logp = logp, old_logp = old, adv = adv, mask = mask,
      offsets = { 0, 6 }, episodes = { 1 }, kind = "a2tgpo", clip_scale = scale, turns = turns,
      clip_low = 0.2, clip_high = 0.2 }
    -- turn 0: x = (0.2 - 0.4) / 2 = -0.1, r = e^-0.1 inside [1 - 0.24, 1.24]: -A r on 2 tokens;
    -- turn 1: x = (0.4 - 0.5) / 2 = -0.05, r = e^-0.05 inside [0.84, 1.16]: 2 r on 2 tokens
    local r0, r1 = math.exp(-0.1), math.exp(-0.05)
    local want = (-(1 * r0) * 2 + (2 * r1) * 2) / 4
    assert.is_true(math.abs(stats.loss - want) < 1e-6, stats.loss .. " vs " .. want)
    -- d loss / d logp of a turn-0 token: both of the turn's terms -A r / 4 move with it, each
    -- by d r / d logp = r / 2 (the mean over its 2 tokens): 2 (-1 / 4) r0 / 2
    assert.is_true(math.abs(dlogp:get(2) - (-r0 / 4)) < 1e-6)
    assert.is_true(math.abs(dlogp:get(4) - (2 * r1 / 4)) < 1e-6)
    -- a ratio outside the scaled range is clipped: scale 0 pins the range to [1, 1]
    local s0 = rl.tensor.from { 0, 0, 0, 0, 0, 0 }
    local st0 = rl.objective.loss { logp = logp, old_logp = old, adv = adv, mask = mask,
      offsets = { 0, 6 }, episodes = { 1 }, kind = "a2tgpo", clip_scale = s0, turns = turns }
    assert.is_true(st0.clipfrac > 0)
    assert.has_error(function()
      rl.objective.loss { logp = logp, old_logp = old, adv = adv, mask = mask, offsets = { 0, 6 },
        episodes = { 1 }, kind = "a2tgpo", turns = turns }
    end, "bad argument #1 to 'loss' (clip_scale: a tensor expected)")
    assert.has_error(function()
      rl.objective.loss { logp = logp, old_logp = old, adv = adv, mask = mask, offsets = { 0, 6 },
        episodes = { 1 }, clip_scale = scale }
    end)
  end)
end)

describe("rl.train with info_gain", function()
  local function train(adv_name, dir)
    return rl.train { model = model(), tokenizer = tok, env = hint, dir = dir, seed = 5, steps = 2,
      tasks_per_step = 2, group_size = 4, max_turn_tokens = 6, minibatch = 8, eval = false,
      progress = false, plot = false, overwrite = true, advantage = adv_name,
      info_gain = { answer = answer } }
  end

  for _, name in ipairs { "a2tgpo", "igpo" } do
    it(name .. ": logs ig/mean and adv per turn position; the same seed gives the same run", function()
      local dir = H.tmpdir()
      local a = train(name, dir)
      local b = train(name, dir)
      local h = a.history[#a.history]
      assert.is_number(h["ig/mean"])
      assert.is_number(h["adv/turn_1_abs"])
      assert.is_true(h["loss/updates"] > 0)
      for k, v in pairs(h) do
        if not k:match("^time/") and k ~= "tokens_per_s" and type(v) == "number" then
          assert.are.equal(v, b.history[#b.history][k], k)
        end
      end
      H.sh("rm -rf " .. H.shell_quote(dir))
    end)
  end

  it("checks the option", function()
    local base = { model = model(), tokenizer = tok, env = hint }
    local function err(extra)
      local o = {}
      for k, v in pairs(base) do o[k] = v end
      for k, v in pairs(extra) do o[k] = v end
      local cfg, msg = options.check(o)
      assert.is_nil(cfg)
      return msg
    end
    assert.matches("info_gain: advantage = \"a2tgpo\" needs info_gain", err { advantage = "a2tgpo" }, 1, true)
    assert.matches("info_gain: only with advantage", err { info_gain = { answer = answer } }, 1, true)
    assert.matches("unknown option 'info_gain.alpah'", err { advantage = "igpo",
      info_gain = { answer = answer, alpah = 1 } }, 1, true)
    assert.matches("info_gain.answer", err { advantage = "igpo", info_gain = {} }, 1, true)
    assert.matches("info_gain.kind", err { advantage = "igpo", info_gain = { answer = answer, kind = "f1" } }, 1, true)
    assert.matches("loss: \"a2tgpo\" reads", err { loss = "a2tgpo" }, 1, true)
    assert.matches("info_gain: scoring the forced answer needs the local engine without a tree",
      err { advantage = "igpo", info_gain = { answer = answer }, tree = { turn = 1, k = 2 }, group_size = 4 }, 1, true)
    assert.matches("rollout_correction: not with loss = \"a2tgpo\"", err { advantage = "a2tgpo",
      info_gain = { answer = answer }, rollout_correction = {} }, 1, true)
    local cfg = options.check { model = base.model, tokenizer = tok, env = hint, advantage = "a2tgpo",
      info_gain = { answer = answer } }
    assert.are.equal("a2tgpo", cfg.loss)
    assert.are.equal(0.3, cfg.info_gain.alpha)
  end)
end)
