-- objective_spec.lua - the trainer's advantages and losses over ragged batches (`rl.objective`):
-- values against direct Lua references, per-token gradients against finite differences, the
-- model's parameter gradients through m:backward_batch against finite differences, and errors.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"
local T = rl.tensor

-- A flat batch of three episodes (lengths 6, 4, 7) with sampled tokens scattered among prompt
-- and observation tokens.
local offsets = { 0, 6, 10, 17 }
local mask_v = { 0, 0, 1, 1, 0, 1,   0, 1, 1, 0,   0, 1, 0, 1, 1, 1, 0 }
local function flat(values) return T.from(values) end

local rng = rl.rng(42)
local logp_v, old_v, adv_v, ref_v, ent_v = {}, {}, {}, {}, {}
local episode_adv = { 1.3, -0.7, 0.4 }
for i = 1, #mask_v do
  local e = i <= 6 and 1 or i <= 10 and 2 or 3
  logp_v[i] = -0.2 - 2 * rng:random()
  old_v[i] = logp_v[i] + 0.3 * (rng:random() - 0.5) -- ratios within about [0.86, 1.16]
  ref_v[i] = logp_v[i] + 0.5 * (rng:random() - 0.5)
  ent_v[i] = 0.5 + rng:random()
  adv_v[i] = mask_v[i] * episode_adv[e]
end

local function args(extra)
  local a = { logp = flat(logp_v), old_logp = flat(old_v), adv = flat(adv_v), mask = flat(mask_v),
    offsets = offsets, episodes = { 1, 2, 3 } }
  for k, v in pairs(extra or {}) do a[k] = v end
  return a
end

-- PPO clip loss per token, the direct way.
local function ppo_token(logp, old, a, lo, hi)
  local r = math.exp(logp - old)
  local c = math.min(math.max(r, 1 - lo), 1 + hi)
  return math.max(-a * r, -a * c)
end

describe("rl.objective.loss", function()
  it("equals the token-mean PPO loss computed directly", function()
    local stats = rl.objective.loss(args { clip_low = 0.05, clip_high = 0.08 })
    local sum, n = 0, 0
    for i, m in ipairs(mask_v) do
      if m == 1 then
        sum = sum + ppo_token(logp_v[i], old_v[i], adv_v[i], 0.05, 0.08)
        n = n + 1
      end
    end
    assert.are.equal(n, stats.tokens)
    assert.is_near(sum / n, stats.pg_loss, 1e-6)
    assert.is_true(stats.clipfrac > 0) -- the tight clip range clips some tokens
  end)

  it("averages each episode first under seq-mean-token-mean", function()
    local stats = rl.objective.loss(args { agg = "seq-mean-token-mean", clip_low = 10, clip_high = 10 })
    local total = 0
    for e = 1, 3 do
      local s, n = 0, 0
      for i = offsets[e] + 1, offsets[e + 1] do
        if mask_v[i] == 1 then
          s = s + ppo_token(logp_v[i], old_v[i], adv_v[i], 10, 10)
          n = n + 1
        end
      end
      total = total + s / n
    end
    assert.is_near(total / 3, stats.pg_loss, 1e-6)
  end)

  it("only looks at the listed episodes", function()
    local stats, dlogp = rl.objective.loss(args { episodes = { 2 } })
    local s, n = 0, 0
    for i = 7, 10 do
      if mask_v[i] == 1 then
        s = s + ppo_token(logp_v[i], old_v[i], adv_v[i], 0.2, 0.2)
        n = n + 1
      end
    end
    assert.is_near(s / n, stats.pg_loss, 1e-6)
    for i = 1, #mask_v do
      if i < 7 or i > 10 then assert.are.equal(0, dlogp:get(i)) end
    end
  end)

  -- d loss / d logp (and d entropy) by central differences, for several loss kinds, with KL to
  -- a reference and an entropy bonus in the same loss.
  -- the IS weights of the losses that take them per token
  local isw_v = {}
  for i = 1, #mask_v do isw_v[i] = 0.6 + 0.8 * ((i * 7) % 5) / 4 end
  -- stop-gradient ratios: moving old_logp along keeps them, so only the differentiated path moves
  local stopped = { cispo = true, dppo_tv = true, dppo_kl = true }
  for _, kind in ipairs { "ppo", "gspo", "cispo", "sapo", "gpg", "gmpo", "dppo_tv", "dppo_kl",
    "clip_cov", "kl_cov", "dro", "reinforce" } do
    it("gives per-token gradients equal to finite differences: " .. kind, function()
      local opts = { kind = kind, ref_logp = flat(ref_v), kl = "k3", kl_coef = 0.1,
        entropy = flat(ent_v), entropy_coef = 0.01 }
      if kind == "ppo" then opts.clip_low, opts.clip_high = 0.3, 0.3 end
      if kind == "dro" then opts.dro_beta = 0.8 end
      if kind == "clip_cov" then opts.clip_cov_ratio, opts.clip_cov_lb, opts.clip_cov_ub = 0.3, -1, 1 end
      if kind == "kl_cov" then opts.kl_cov_ratio, opts.ppo_kl_coef = 0.3, 1.5 end
      if kind ~= "gspo" and kind ~= "sapo" then opts.is_weights = flat(isw_v) end
      if kind == "dppo_tv" then opts.clip_low, opts.clip_high = 0.02, 0.02 end
      if kind == "dppo_kl" then opts.clip_low, opts.clip_high = 0.002, 0.002 end
      local st, dlogp, dent = rl.objective.loss(args(opts))
      if kind == "clip_cov" or kind == "kl_cov" or kind:match("^dppo") then
        -- the data reaches both branches: some tokens chosen (or outside the trust region)
        assert.is_true(st.clipfrac > 0.05 and st.clipfrac < 0.95, kind .. " " .. st.clipfrac)
      end
      local h = 1e-3
      for i, m in ipairs(mask_v) do
        local function loss_at(delta, field)
          local v = {}
          local src = field == "entropy" and ent_v or logp_v
          for j = 1, #src do v[j] = src[j] end
          v[i] = v[i] + delta
          local o = args(opts)
          o[field == "entropy" and "entropy" or "logp"] = flat(v)
          if stopped[kind] or kind == "gspo" then
            -- stop-gradient losses: move old_logp along so only the differentiated path changes
            if field ~= "entropy" and stopped[kind] then
              local ov = {}
              for j = 1, #old_v do ov[j] = old_v[j] end
              ov[i] = ov[i] + delta
              o.old_logp = flat(ov)
            end
          end
          return rl.objective.loss(o).loss
        end
        if m == 1 and kind ~= "gspo" then
          local fd = (loss_at(h) - loss_at(-h)) / (2 * h)
          assert.is_near(fd, dlogp:get(i), 2e-3 + 1e-2 * math.abs(fd))
        elseif m == 0 then
          assert.are.equal(0, dlogp:get(i))
        end
        if m == 1 then
          local fd = (loss_at(h, "entropy") - loss_at(-h, "entropy")) / (2 * h)
          assert.is_near(fd, dent:get(i), 1e-4)
        end
      end
    end)
  end

  it("with details, reports each sampled token's loss and GSPO's sequence ratios", function()
    local stats = rl.objective.loss(args { clip_low = 0.05, clip_high = 0.08, details = true })
    for i, m in ipairs(mask_v) do
      local want = m == 1 and ppo_token(logp_v[i], old_v[i], adv_v[i], 0.05, 0.08) or 0
      assert.is_near(want, stats.pg_losses:get(i), 1e-6)
    end
    assert.is_nil(stats.seq_ratio) -- PPO has no sequence ratio
    assert.is_nil(rl.objective.loss(args()).pg_losses) -- only when asked
    local gspo = rl.objective.loss(args { kind = "gspo", episodes = { 3, 1 }, details = true })
    for k, e in ipairs { 3, 1 } do -- exp of the mean log ratio over the episode's sampled tokens
      local s, n = 0, 0
      for i = offsets[e] + 1, offsets[e + 1] do
        if mask_v[i] == 1 then s, n = s + logp_v[i] - old_v[i], n + 1 end
      end
      assert.is_near(math.exp(s / n), gspo.seq_ratio[k], 1e-5)
    end
    assert.are.equal(2, #gspo.seq_ratio)
  end)

  it("weighs each token's loss by is_weights", function()
    local w = {}
    for i = 1, #mask_v do w[i] = 0.5 + (i % 3) / 2 end
    local stats = rl.objective.loss(args { clip_low = 0.05, clip_high = 0.08, is_weights = flat(w) })
    local sum, n = 0, 0
    for i, m in ipairs(mask_v) do
      if m == 1 then
        sum = sum + w[i] * ppo_token(logp_v[i], old_v[i], adv_v[i], 0.05, 0.08)
        n = n + 1
      end
    end
    assert.is_near(sum / n, stats.pg_loss, 1e-6)
  end)

  it("reports the KL to the reference even when it is not trained on", function()
    local stats = rl.objective.loss(args { ref_logp = flat(ref_v), kl = "k1" })
    local s, n = 0, 0
    for i, m in ipairs(mask_v) do
      if m == 1 then s, n = s + (logp_v[i] - ref_v[i]), n + 1 end
    end
    assert.is_near(s / n, stats.kl, 1e-6)
    assert.are.equal(0, stats.kl_loss)
  end)

  it("names bad arguments", function()
    local function err(extra)
      local ok, msg = pcall(rl.objective.loss, args(extra))
      assert.is_false(ok)
      return msg
    end
    assert.matches("kind: unknown policy loss", err { kind = "nope" })
    assert.matches("agg: unknown value", err { agg = "sum" })
    assert.matches("ref_logp: needed", err { kl_coef = 0.1 })
    assert.matches("entropy: needed", err { entropy_coef = 0.1 })
    assert.matches("episodes%[1%]", err { episodes = { 9 } })
    assert.matches("logp: a contiguous 1%-D tensor", err { logp = T.zeros(3) })
    assert.matches("mask: 0 or 1", err { mask = flat((function()
      local v = {}
      for i = 1, #mask_v do v[i] = mask_v[i] * 0.5 end
      return v
    end)()) })
  end)
end)

describe("rl.objective advantages", function()
  it("GRPO normalises each group by its mean and unbiased std", function()
    local scores = { 1, 0, 0, 1, 1, 5, 3 }
    local groups = { "a", "a", "a", "a", "b", "b", "b" }
    local adv = rl.objective.advantage { method = "grpo", scores = scores, groups = groups }
    local function check(idx)
      local mean, n = 0, #idx
      for _, i in ipairs(idx) do mean = mean + scores[i] / n end
      local var = 0
      for _, i in ipairs(idx) do var = var + (scores[i] - mean) ^ 2 / (n - 1) end
      for _, i in ipairs(idx) do
        assert.is_near((scores[i] - mean) / (math.sqrt(var) + 1e-6), adv[i], 1e-5)
      end
    end
    check { 1, 2, 3, 4 }
    check { 5, 6, 7 }
    local dr = rl.objective.advantage { method = "drgrpo", scores = scores, groups = groups }
    assert.is_near(1 - 0.5, dr[1], 1e-6)
  end)

  it("REINFORCE++ whitens the scores over every sampled token of the batch, groups aside", function()
    -- token returns {1, 1, 0, 2}: mean 1, unbiased variance 2/3
    local adv = rl.objective.advantage { method = "reinforce_plus_plus", scores = { 1, 0, 2 },
      groups = { 1, 2, 3 }, counts = { 2, 1, 1 } }
    local sd = math.sqrt(2 / 3 + 1e-8)
    assert.is_near(0, adv[1], 1e-6)
    assert.is_near(-1 / sd, adv[2], 1e-5)
    assert.is_near(1 / sd, adv[3], 1e-5)
  end)

  it("RLOO uses the mean of the other members", function()
    local adv = rl.objective.advantage { method = "rloo", scores = { 1, 2, 6 }, groups = { 1, 1, 1 } }
    assert.is_near(1 - 4, adv[1], 1e-6)
    assert.is_near(6 - 1.5, adv[3], 1e-6)
  end)

  it("GiGPO adds the step return normalised among turns from the same state", function()
    local returns = rl.objective.step_returns { rewards = { 0, 1, 0, 0, 1 }, traj = { 1, 1, 2, 2, 2 },
      gamma = 0.5 }
    assert.is_near(0.5, returns[1], 1e-12)
    assert.is_near(1, returns[2], 1e-12)
    assert.is_near(0.25, returns[3], 1e-12)
    local a, ea, sa = rl.objective.gigpo { scores = { 1, 1, 1, 1, 1 }, step_rewards = returns,
      groups = { 1, 1, 1, 1, 1 }, anchors = { "s0", "x", "s0", "y", "z" } }
    -- every episode score is equal: the episode term is 0; turns 1 and 3 share the state s0
    for i = 1, 5 do assert.is_near(0, ea[i], 1e-6) end
    assert.is_near(0.5 - 0.375, sa[1], 1e-6)
    assert.is_near(0.25 - 0.375, sa[3], 1e-6)
    assert.is_near(0, sa[2], 1e-6) -- a state seen once has no comparison
    assert.is_near(sa[1], a[1], 1e-6)
  end)

  it("RLOO gives a group of one its score, or 0 with singleton_zero", function()
    local o = { method = "rloo", scores = { 1, 2, 6, 4 }, groups = { 1, 1, 1, 2 } }
    assert.is_near(4, rl.objective.advantage(o)[4], 1e-6)
    o.singleton_zero = true
    local adv = rl.objective.advantage(o)
    assert.are.equal(0, adv[4])
    assert.is_near(1 - 4, adv[1], 1e-6) -- larger groups unchanged
  end)

  it("step returns share one return among the rows of an environment step", function()
    -- rows 1 and 2 are one step of the trajectory (its first row's reward counts), row 3 the next
    local r = rl.objective.step_returns { rewards = { 1, 5, 4 }, traj = { 7, 7, 7 },
      env_step = { 0, 0, 1 }, gamma = 0.5 }
    assert.are.same({ 1 + 0.5 * 4, 1 + 0.5 * 4, 4 }, r)
    r = rl.objective.step_returns { rewards = { 1, 5, 4 }, traj = { 7, 7, 7 }, gamma = 0.5 }
    assert.are.same({ 1 + 0.5 * (5 + 0.5 * 4), 5 + 0.5 * 4, 4 }, r)
  end)

  it("GiGPO with dedup_traj counts each trajectory once in the episode statistics", function()
    -- trajectory a has three turns (score 1), b one (score 0), in one group
    local o = { scores = { 1, 1, 1, 0 }, step_rewards = { 0, 0, 0, 0 }, groups = { 1, 1, 1, 1 },
      anchors = { 1, 2, 3, 4 }, traj = { "a", "a", "a", "b" } }
    local _, ea = rl.objective.gigpo(o)
    assert.is_near(1 - 0.75, ea[1], 1e-6) -- mean over the four turns
    o.dedup_traj = true
    _, ea = rl.objective.gigpo(o)
    assert.is_near(1 - 0.5, ea[1], 1e-6) -- mean over the two trajectories
    assert.is_near(0 - 0.5, ea[4], 1e-6)
    o.traj = nil
    H.assert_error(function() rl.objective.gigpo(o) end, "traj: needed with dedup_traj")
  end)

  it("DAPO overlong shaping penalises only the last buffer tokens", function()
    local pen = rl.objective.overlong { lengths = { 10, 16, 18, 20, 30 }, max_len = 20, buffer = 4 }
    assert.are.same({ 0, 0, -0.5, -1, -1 }, pen)
  end)

  it("names bad arguments", function()
    assert.has_error(function() rl.objective.advantage { method = "nope", scores = { 1 }, groups = { 1 } } end)
    local ok, msg = pcall(rl.objective.advantage, { scores = { 1, 2 }, groups = { 1 } })
    assert.is_false(ok)
    assert.matches("groups: 2 ids expected", msg)
    ok, msg = pcall(rl.objective.advantage, { scores = { 1, 0 / 0 }, groups = { 1, 1 } })
    assert.is_false(ok)
    assert.matches("scores%[2%]: a finite number", msg)
    ok, msg = pcall(rl.objective.gigpo, { scores = { 1 }, step_rewards = { 1 }, groups = { 1 },
      anchors = { {} } })
    assert.is_false(ok)
    assert.matches("anchors%[1%]", msg)
  end)
end)

describe("rl.objective: verl 1dda039's estimators and rollout correction", function()
  it("GDPO normalises each reward term in its group, sums them and whitens over the tokens", function()
    local groups = { "a", "a", "a", "b", "b" }
    local t1, t2 = { 1, 0, 0, 5, 3 }, { 0, 10, 20, 0, 0 }
    local counts = { 2, 1, 3, 2, 2 }
    local adv = rl.objective.advantage { method = "gdpo", scores = { 0, 0, 0, 0, 0 }, groups = groups,
      counts = counts, terms = { t1, t2 }, term_weights = { 1, 0.5 } }
    local function norm(x, idx)
      local mean, n = 0, #idx
      for _, i in ipairs(idx) do mean = mean + x[i] / n end
      local var = 0
      for _, i in ipairs(idx) do var = var + (x[i] - mean) ^ 2 / (n - 1) end
      local out = {}
      for _, i in ipairs(idx) do out[i] = (x[i] - mean) / (math.sqrt(var) + 1e-6) end
      return out
    end
    local sum = {}
    for _, idx in ipairs { { 1, 2, 3 }, { 4, 5 } } do
      local a, b = norm(t1, idx), norm(t2, idx)
      for _, i in ipairs(idx) do sum[i] = a[i] + 0.5 * b[i] end
    end
    -- token-weighted whitening: row i counts counts[i] times
    local s, n = 0, 0
    for i = 1, 5 do s, n = s + counts[i] * sum[i], n + counts[i] end
    local mean, var = s / n, 0
    for i = 1, 5 do var = var + counts[i] * (sum[i] - mean) ^ 2 / (n - 1) end
    for i = 1, 5 do
      assert.is_near((sum[i] - mean) / math.sqrt(var + 1e-8), adv[i], 1e-5)
    end
    H.assert_error(function()
      rl.objective.advantage { method = "gdpo", scores = { 1, 2 }, groups = { 1, 1 },
        terms = { { 1, 2 } }, term_weights = { 1, 2 } }
    end, "term_weights: 1 weights expected")
    H.assert_error(function()
      rl.objective.advantage { method = "grpo", scores = { 1, 2 }, groups = { 1, 1 }, terms = { { 1, 2 } } }
    end, "only for method gdpo")
  end)

  it("the optimal token baseline over episodes equals rl.advantage's over the same rows", function()
    -- two episodes of one group, a third alone; each starts with a prompt token (mask 0)
    local m = { 0, 1, 1, 1, 0, 1, 1, 0, 1, 1, 1 }
    local off = { 0, 4, 7, 11 }
    local r, lp, spq = {}, {}, {}
    local rr = rl.rng(3)
    for i = 1, #m do
      r[i] = m[i] * (rr:random() < 0.4 and 1 or 0)
      lp[i] = -0.1 - rr:random()
      spq[i] = 0.2 + 0.5 * rr:random()
    end
    for _, multi in ipairs { false, true } do
      local adv, ret = rl.objective.otb { rewards = flat(r), mask = flat(m), old_logp = flat(lp),
        sum_pi_sq = flat(spq), offsets = off, episodes = { 1, 2, 3 }, groups = { "g", "g", "h" },
        multi_turn = multi }
      -- the same rows from each episode's first sampled token, right-padded
      local rows = { { 2, 4 }, { 6, 7 }, { 9, 11 } }
      local inp = { token_level_rewards = {}, response_mask = {}, old_log_probs = {},
        sum_pi_squared = {}, index = { "g", "g", "h" } }
      for b, span in ipairs(rows) do
        for _, k in ipairs { "token_level_rewards", "response_mask", "old_log_probs", "sum_pi_squared" } do
          inp[k][b] = { 0, 0, 0 }
        end
        for j = span[1], span[2] do
          local t = j - span[1] + 1
          inp.token_level_rewards[b][t], inp.response_mask[b][t] = r[j], m[j]
          inp.old_log_probs[b][t], inp.sum_pi_squared[b][t] = lp[j], spq[j]
        end
      end
      local fn = multi and rl.advantage.tir_optimal_token_baseline or rl.advantage.optimal_token_baseline
      local want = fn(inp)
      for b, span in ipairs(rows) do
        for j = span[1], span[2] do
          local t = j - span[1] + 1
          assert.is_near(want.advantages[b][t], adv:get(j), 1e-6)
          if m[j] == 1 then assert.is_near(want.returns[b][t], ret:get(j), 1e-6) end
        end
      end
      assert.are.equal(0, adv:get(1)) -- the prompt token
    end
  end)

  it("rollout correction weighs and rejects tokens as the options say", function()
    local lp = flat { -1, -0.2, -3, -0.5, -0.1, -0.7 }
    local roll = flat { -1.5, -0.2, -1, -0.5, -0.2, -0.7 }
    local mask = flat { 1, 1, 1, 0, 1, 1 }
    local base = { logp = lp, rollout_logp = roll, mask = mask, offsets = { 0, 3, 6 }, episodes = { 1, 2 } }
    local function with(t)
      local o = {}
      for k, v in pairs(base) do o[k] = v end
      for k, v in pairs(t) do o[k] = v end
      return o
    end
    local w, m, st = rl.objective.rollout_correction(with { is = "token", is_threshold = 1.5 })
    assert.is_near(1.5, w:get(1), 1e-6) -- e^0.5 truncated at 1.5
    assert.is_near(math.exp(-2), w:get(3), 1e-6)
    assert.are.equal(0, w:get(4)) -- not a sampled token
    assert.are.same({ 1, 1, 1, 0, 1, 1 }, m:totable()) -- no rejection asked for
    assert.is_near((1.5 + 1 + math.exp(-2) + math.exp(0.1) + 1) / 5, st.is_mean, 1e-6)
    w = rl.objective.rollout_correction(with { is = "token", is_threshold = "0.5_1.5" })
    assert.are.equal(0, w:get(1)) -- masked outside the band (IcePop)
    assert.are.equal(0, w:get(3))
    w = rl.objective.rollout_correction(with { is = "sequence", is_threshold = 10 })
    assert.is_near(math.exp(0.5 + 0 - 2), w:get(2), 1e-6) -- one weight per episode
    w, m = rl.objective.rollout_correction(with { rs = "token_k1,seq_max_k2", rs_threshold = "0.5_2,1.5" })
    assert.is_nil(w)
    -- token 3's log ratio -2 leaves [ln 0.5, ln 2]; its k2 (2) rejects all of episode 1
    assert.are.same({ 0, 0, 0, 0, 1, 1 }, m:totable())
    H.assert_error(function() rl.objective.rollout_correction(with { rs = "token_k4", rs_threshold = 1 }) end,
      { "rs: unknown value 'token_k4'", "token_k1" })
    H.assert_error(function() rl.objective.rollout_correction(with { rs = "token_k2" }) end,
      "rs_threshold: needed with rs")
    H.assert_error(function() rl.objective.rollout_correction(with { rs = "token_k2", rs_threshold = "1_2" }) end,
      "not a threshold of token_k2")
    H.assert_error(function() rl.objective.rollout_correction(with { is = "token", is_threshold = "2_1" }) end,
      "is_lower is 2")
    H.assert_error(function() rl.objective.rollout_correction(with { is = "tokens" }) end,
      { "is: unknown value 'tokens'", "sequence" })
  end)

  it("names the losses, aggregation modes, KL estimators and rejection criteria it takes", function()
    local names = rl.objective.names()
    local function has(list, x)
      for _, v in ipairs(list) do if v == x then return true end end
      return false
    end
    for _, k in ipairs { "dppo_tv", "dppo_kl", "clip_cov", "kl_cov", "dro", "reinforce", "gmpo" } do
      assert.is_true(has(names.loss, k), k)
    end
    assert.is_true(has(names.agg, "token-sum"))
    assert.is_true(has(names.kl, "low_var_kl+") and has(names.kl, "abs+"))
    assert.is_true(has(names.rs, "binary_kl") and has(names.advantage, "gdpo"))
    H.assert_error(function() rl.objective.loss(args { kind = "dppo" }) end,
      { "kind: unknown policy loss 'dppo'", "dppo_tv, dppo_kl" })
    H.assert_error(function() rl.objective.loss(args { kind = "dro" }) end, "dro_beta is 0")
  end)
end)

describe("rl.objective options", function()
  it("are checked: every function names an unknown key and the keys it takes", function()
    local n = 0
    for _, fn in pairs(rl.objective) do
      H.assert_error(function() fn { bogus = 1 } end,
        { "unknown option 'bogus'", "expected: " })
      n = n + 1
    end
    assert.are.equal(14, n) -- (turn_kl and ema: TT-OPD)
    H.assert_error(function() rl.objective.loss(args { clip = 0.2 }) end,
      { "unknown option 'clip'", "clip_low, clip_high" })
  end)
end)

describe("the policy gradient through the model", function()
  it("m:backward_batch of rl.objective.loss equals finite differences of the parameters", function()
    local m = rl.model.new { vocab = 264, dim = 16, layers = 1, heads = 2, ffn = 32, ctx = 32, seed = 5 }
    local tokens = {}
    local r = rl.rng(9)
    for i = 1, #mask_v do tokens[i] = r:random(0, 255) end
    local batch = { tokens = flat(tokens), mask = flat(mask_v), offsets = offsets, episodes = { 1, 2, 3 } }
    local old = m:forward_batch(batch) -- old = current: ratio 1, no clipping nearby
    old = old:clone()
    local function loss()
      local lp = m:forward_batch(batch)
      local s = rl.objective.loss { logp = lp, old_logp = old, adv = flat(adv_v), mask = batch.mask,
        offsets = offsets, episodes = batch.episodes, clip_low = 0.5, clip_high = 0.5 }
      return s.loss
    end
    local lp = m:forward_batch(batch)
    local _, dlogp = rl.objective.loss { logp = lp, old_logp = old, adv = flat(adv_v),
      mask = batch.mask, offsets = offsets, episodes = batch.episodes, clip_low = 0.5, clip_high = 0.5 }
    m:backward_batch { tokens = batch.tokens, mask = batch.mask, offsets = offsets,
      episodes = batch.episodes, dlogprobs = dlogp }
    local params, grads = m:parameters(), m:parameters(true)
    local checked = 0
    for _, name in ipairs { "model.layers.0.mlp.down_proj.weight", "model.embed_tokens.weight",
      "model.layers.0.self_attn.q_proj.weight" } do
      local w, g = params[name], grads[name]
      -- the entry with the largest gradient
      local flat_w, flat_g = w:reshape(w:numel()), g:reshape(g:numel())
      local best, bi = -1, 1
      for i = 1, flat_g:numel() do
        if math.abs(flat_g:get(i)) > best then best, bi = math.abs(flat_g:get(i)), i end
      end
      local w0, h = flat_w:get(bi), 1e-2
      flat_w:set(bi, w0 + h)
      local up = loss()
      flat_w:set(bi, w0 - h)
      local down = loss()
      flat_w:set(bi, w0)
      local fd = (up - down) / (2 * h)
      assert.is_near(fd, flat_g:get(bi), 2e-2 * math.abs(fd) + 1e-5)
      checked = checked + 1
    end
    assert.are.equal(3, checked)
  end)
end)

describe("the critic: rl.objective.gae, rl.objective.value_loss and a value head", function()
  -- rewards on sampled tokens (a turn's reward on its last), values anywhere
  local rew_v, val_v = {}, {}
  local r = rl.rng(17)
  for i = 1, #mask_v do
    rew_v[i] = mask_v[i] * (r:random() < 0.4 and (r:random() - 0.3) or 0)
    val_v[i] = r:random() - 0.5
  end

  it("GAE over the flat batch follows the spec's recursion with observations transparent", function()
    local gamma, lam = 0.9, 0.8
    local adv, ret = rl.objective.gae { rewards = flat(rew_v), values = flat(val_v),
      mask = flat(mask_v), offsets = offsets, episodes = { 1, 2, 3 }, gamma = gamma, lambda = lam }
    -- spec 1.1 over each episode's tokens: mask-0 tokens neither bootstrap nor advance
    local raw = {}
    for e = 1, 3 do
      local next_v, g = 0, 0
      for i = offsets[e + 1], offsets[e] + 1, -1 do
        local m = mask_v[i]
        local step = rew_v[i] + gamma * next_v - val_v[i] + gamma * lam * g
        next_v = m * val_v[i] + (1 - m) * next_v
        g = m * step + (1 - m) * g
        raw[i] = g
      end
    end
    -- whitened over the sampled tokens (unbiased variance); returns unwhitened + values
    local sum, n = 0, 0
    for i, m in ipairs(mask_v) do
      if m == 1 then sum, n = sum + raw[i], n + 1 end
    end
    local mean, var = sum / n, 0
    for i, m in ipairs(mask_v) do
      if m == 1 then var = var + (raw[i] - mean) ^ 2 / (n - 1) end
    end
    for i, m in ipairs(mask_v) do
      if m == 1 then
        assert.is_near((raw[i] - mean) / math.sqrt(var + 1e-8), adv:get(i), 1e-5)
        assert.is_near(raw[i] + val_v[i], ret:get(i), 1e-5)
      else
        assert.are.equal(0, adv:get(i))
        assert.are.equal(0, ret:get(i))
      end
    end
  end)

  it("the clipped value loss and its gradient match the definition and finite differences", function()
    local old, ret = {}, {}
    for i = 1, #mask_v do old[i], ret[i] = val_v[i] + 0.3 * (r:random() - 0.5), r:random() end
    local function stats(v)
      return rl.objective.value_loss { values = flat(v), old_values = flat(old), returns = flat(ret),
        mask = flat(mask_v), offsets = offsets, episodes = { 1, 2, 3 }, clip = 0.1, coef = 0.5 }
    end
    local s, dv = stats(val_v)
    local sum, n = 0, 0
    for i = 1, #mask_v do
      if mask_v[i] == 1 then
        local c = math.min(math.max(val_v[i], old[i] - 0.1), old[i] + 0.1)
        sum, n = sum + math.max((val_v[i] - ret[i]) ^ 2, (c - ret[i]) ^ 2), n + 1
      end
    end
    assert.is_near(0.5 * 0.5 * sum / n, s.loss, 1e-6)
    for i = 1, #mask_v do
      if mask_v[i] == 1 then
        local v = { table.unpack(val_v) }
        v[i] = val_v[i] + 1e-3
        local up = stats(v).loss
        v[i] = val_v[i] - 1e-3
        local down = stats(v).loss
        assert.is_near((up - down) / 2e-3, dv:get(i), 1e-3)
      else
        assert.are.equal(0, dv:get(i))
      end
    end
  end)

  it("a value head's values, its gradients and the model's match finite differences", function()
    local m = rl.model.new { vocab = 264, dim = 16, layers = 1, heads = 2, ffn = 32, ctx = 32, seed = 6 }
    local tokens = {}
    for i = 1, #mask_v do tokens[i] = r:random(0, 255) end
    local batch = { tokens = flat(tokens), mask = flat(mask_v), offsets = offsets, episodes = { 1, 2, 3 } }
    local w = T.randn({ 16 }, 3):scale(0.5)
    local head = { w = w, b = 0.25 }
    local coef = {}
    for i = 1, #mask_v do coef[i] = mask_v[i] * (r:random() - 0.5) end
    local function objective()
      local _, _, v = m:forward_batch { tokens = batch.tokens, mask = batch.mask, offsets = offsets,
        episodes = batch.episodes, value = head }
      local s = 0
      for i = 1, #mask_v do s = s + coef[i] * v:get(i) end
      return s, v
    end
    local _, v = objective()
    for i = 1, #mask_v do
      if mask_v[i] == 0 then assert.are.equal(0, v:get(i)) end
    end
    local zeros = T.zeros { #mask_v }
    local dw, db = m:backward_batch { tokens = batch.tokens, mask = batch.mask, offsets = offsets,
      episodes = batch.episodes, dlogprobs = zeros, value = head, dvalues = flat(coef) }
    local sum_c = 0
    for i = 1, #mask_v do sum_c = sum_c + coef[i] end
    assert.is_near(sum_c, db, 1e-5) -- d/db of sum c v is sum c
    for _, j in ipairs { 1, 7, 16 } do
      local w0 = w:get(j)
      w:set(j, w0 + 1e-2)
      local up = objective()
      w:set(j, w0 - 1e-2)
      local down = objective()
      w:set(j, w0)
      assert.is_near((up - down) / 2e-2, dw:get(j), 1e-3 + 1e-2 * math.abs(dw:get(j)))
    end
    local params, grads = m:parameters(), m:parameters(true)
    for _, name in ipairs { "model.layers.0.mlp.down_proj.weight", "model.norm.weight" } do
      local fw, fg = params[name]:reshape(params[name]:numel()), grads[name]:reshape(grads[name]:numel())
      local best, bi = -1, 1
      for i = 1, fg:numel() do
        if math.abs(fg:get(i)) > best then best, bi = math.abs(fg:get(i)), i end
      end
      assert.is_true(best > 0, name .. " got no gradient")
      local w0 = fw:get(bi)
      fw:set(bi, w0 + 1e-2)
      local up = objective()
      fw:set(bi, w0 - 1e-2)
      local down = objective()
      fw:set(bi, w0)
      local fd = (up - down) / 2e-2
      assert.is_near(fd, fg:get(bi), 2e-2 * math.abs(fd) + 1e-5)
    end
  end)

  it("names bad arguments", function()
    local m = rl.model.new { vocab = 264, dim = 16, layers = 1, heads = 2, ffn = 32, ctx = 32, seed = 6 }
    local b = { tokens = T.zeros { #mask_v }, mask = flat(mask_v), offsets = offsets, episodes = { 1 } }
    b.value = { w = T.zeros { 8 } }
    H.assert_error(function() m:forward_batch(b) end, "value.w: a contiguous 1-D tensor of 16")
    b.value = { w = T.zeros { 16 }, b = "x" }
    H.assert_error(function() m:forward_batch(b) end, "value.b")
    b.value = { w = T.zeros { 16 } }
    m:forward_batch(b)
    b.dlogprobs = T.zeros { #mask_v }
    H.assert_error(function() m:backward_batch(b) end, "value and dvalues")
    H.assert_error(function()
      rl.objective.gae { rewards = flat(rew_v), mask = flat(mask_v), offsets = offsets, episodes = { 1 } }
    end, "values: a tensor expected")
    H.assert_error(function()
      rl.objective.gae { rewards = flat(rew_v), values = flat(val_v), mask = flat(mask_v),
        offsets = offsets, episodes = { 1 }, gamma = "x" }
    end, "gamma: number expected, got string")
    local vl = { values = flat(val_v), old_values = flat(val_v), mask = flat(mask_v),
      offsets = offsets, episodes = { 1, 2, 3 } }
    H.assert_error(function() rl.objective.value_loss(vl) end, "returns: a tensor expected")
    vl.returns = T.zeros { 3 }
    H.assert_error(function() rl.objective.value_loss(vl) end, "returns: a contiguous 1-D tensor as long as mask")
    vl.returns = flat(val_v)
    vl.agg = "mean"
    H.assert_error(function() rl.objective.value_loss(vl) end, "agg")
    vl.agg, vl.episodes = nil, { 4 }
    H.assert_error(function() rl.objective.value_loss(vl) end, "episodes[1]: an episode number in 1..3")
  end)
end)
