-- moonrl.train.replay: experience replay in the trainer (the `replay` option): each step mixes
-- episodes drawn from a replay buffer (rl.replay) into the update, then stores the step's fresh
-- episodes in it.
--
--   rl.train{ ..., replay = buf }      -- or
--   rl.train{ ..., replay = { buffer = buf, ratio = 0.5, advantages = "recompute", correction = true } }
--
-- ratio: entries replayed per fresh entry (groups with the buffer's unit = "group", episodes
-- with "episode"), rounded. Per step, after the rewards (and decoupled rollout correction):
--   1. draw: buf:sample(n, step, {logprobs = the current policy's}) re-scores entries of an old
--      reward version, evicts those whose importance ratio is beyond max_ratio;
--   2. mix: fresh + replayed in one batch. The PPO ratio's old log-probs of replayed tokens are
--      the current policy's (the proximal policy of decoupled PPO); with correction, each
--      replayed token's loss is weighted by min(pi / pi_behaviour, max_ratio) times its entry's
--      importance weight (batch.is_weights, which the update applies);
--   3. advantages: "recompute" runs the run's estimator over the mixed batch (replayed groups
--      are whole, under group ids of their own, so group baselines see them again; a re-scored
--      reward counts); "stored" keeps the advantages replayed episodes had when they were added
--      (for unit = "episode" with a group estimator);
--   4. store: replayed entries get new priorities (their new |advantage| under "abs_adv"), the
--      fresh episodes go into the buffer with their advantages.
-- Metrics: replay/sampled, replay/size, replay/entries, replay/fill, replay/age_mean,
-- replay/ratio_mean, replay/weight_mean, and this step's replay/evicted_ratio,
-- replay/evicted_capacity, replay/rescored, replay/stale_picks; time/replay.
local core = require "moonrl.core"
local batchlib = require "moonrl.batch"
local score = require "moonrl.train.score"

local M = {}

-- How many entries to replay with this fresh batch.
function M.count(ctx, batch)
  local rp = ctx.cfg.replay
  local buf = rp.buffer
  local unit = buf.cfg and buf.cfg.unit or "group"
  local fresh = unit == "group" and #batch:groups() or batch:size()
  return math.floor(rp.ratio * fresh + 0.5)
end

local COUNTED = { "evicted_ratio", "evicted_capacity", "rescored", "stale_picks" }

local function counters(buf)
  local s = buf.stats and buf:stats() or {}
  local out = {}
  for _, k in ipairs(COUNTED) do out[k] = s[k] or 0 end
  return out
end

-- Step 1: the replayed batch (nil when there is none) and what it was before it was drawn.
function M.draw(ctx, batch, step)
  local c = ctx.cfg
  local buf = c.replay.buffer
  local before = counters(buf)
  local n = M.count(ctx, batch)
  local replayed
  if n > 0 then
    replayed = buf:sample(n, step, { logprobs = function(b)
      return score.score(ctx.model, b, c.minibatch)
    end })
    if replayed and replayed:size() == 0 then replayed = nil end
  end
  return replayed, before
end

local function ones(n)
  return core.tensor.ones(math.max(n, 1)):narrow(1, 1, n)
end

-- Step 2: fresh and replayed episodes in one batch, with policy_logprobs and is_weights.
function M.mix(ctx, fresh, replayed)
  local c = ctx.cfg
  local rp = c.replay
  local b = batchlib.concat { fresh, replayed }
  local nf, total = fresh.offsets[fresh:size() + 1], b.offsets[b:size() + 1]
  local nr = total - nf
  local logp = core.tensor.zeros(math.max(total, 1)):narrow(1, 1, total)
  if nf > 0 then logp:narrow(1, 1, nf):copy(score.policy(ctx, fresh)) end
  if nr > 0 then logp:narrow(1, nf + 1, nr):copy(replayed.policy_logprobs) end
  b.policy_logprobs = logp
  local bypass = c.rollout_correction and c.rollout_correction.bypass_mode
  if not bypass then
    local w = ones(total)
    if fresh.is_weights and nf > 0 then w:narrow(1, 1, nf):copy(fresh.is_weights) end
    if nr > 0 then
      local part = w:narrow(1, nf + 1, nr)
      if rp.correction and replayed.token_weights then part:copy(replayed.token_weights) end
      for j = 1, replayed:size() do
        local a, len = replayed.offsets[j], replayed.offsets[j + 1] - replayed.offsets[j]
        local wj = replayed.weights and replayed.weights[j] or 1
        if len > 0 and wj ~= 1 then
          local seg = part:narrow(1, a + 1, len)
          seg:scale(wj, seg)
        end
      end
    end
    b.is_weights = w
  end
  return b
end

-- The advantages of the mixed batch under advantages = "stored": the fresh episodes' from the
-- estimator, the replayed ones' as stored; and the per-episode values (a replayed episode's:
-- the mean of its stored advantages over its sampled tokens).
function M.stored_advantages(fresh_adv, fresh_per_episode, replayed)
  if not replayed.advantages then
    error("train: replay: advantages = \"stored\" needs a buffer whose episodes were stored "
      .. "with their advantages", 0)
  end
  local nf, nr = fresh_adv:numel(), replayed.advantages:numel()
  local adv = core.tensor.zeros(math.max(nf + nr, 1)):narrow(1, 1, nf + nr)
  if nf > 0 then adv:narrow(1, 1, nf):copy(fresh_adv) end
  if nr > 0 then adv:narrow(1, nf + 1, nr):copy(replayed.advantages) end
  local per = {}
  for i, v in ipairs(fresh_per_episode) do per[i] = v end
  for j = 1, replayed:size() do
    local sum, count = 0, 0
    for p = replayed.offsets[j] + 1, replayed.offsets[j + 1] do
      if replayed.mask:get(p) ~= 0 then sum, count = sum + replayed.advantages:get(p), count + 1 end
    end
    per[#per + 1] = count > 0 and sum / count or 0
  end
  return adv, per
end

-- Step 4: new priorities for the replayed entries, the fresh episodes into the buffer; returns
-- the step's metrics.
function M.store(ctx, fresh, replayed, adv, step, before)
  local buf = ctx.cfg.replay.buffer
  local nf = fresh.offsets[fresh:size() + 1]
  local mt = {}
  if replayed then
    local nr = replayed.offsets[replayed:size() + 1]
    if ctx.cfg.replay.advantages == "recompute" and buf.priorities then
      replayed.advantages = nr > 0 and adv:narrow(1, nf + 1, nr):clone() or ones(0)
      buf:update(replayed.keys, buf:priorities(replayed))
    end
    local n = replayed:size()
    local age, ratio, weight = 0, 0, 0
    for j = 1, n do
      age = age + (replayed.ages and replayed.ages[j] or 0)
      ratio = ratio + (replayed.ratios and replayed.ratios[j] or 1)
      weight = weight + (replayed.weights and replayed.weights[j] or 1)
    end
    mt["replay/sampled"], mt["replay/age_mean"] = n, age / n
    mt["replay/ratio_mean"], mt["replay/weight_mean"] = ratio / n, weight / n
  else
    mt["replay/sampled"] = 0
  end
  fresh.advantages = nf > 0 and adv:narrow(1, 1, nf):clone() or ones(0)
  buf:add(fresh, step)
  fresh.advantages = nil
  local after = counters(buf)
  for _, k in ipairs(COUNTED) do mt["replay/" .. k] = after[k] - before[k] end
  if buf.stats then
    local s = buf:stats()
    mt["replay/size"], mt["replay/entries"], mt["replay/fill"] = s.size, s.entries, s.fill
    mt["replay/priority_mean"] = s.priority_mean
  end
  return mt
end

return M
