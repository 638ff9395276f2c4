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
--
-- Delayed rewards (the `delayed` option, FutureWorld's backfill):
--   rl.train{ ..., replay = { buffer = buf, ratio = 0 },
--     delayed = { resolve = function(step, pending) return {{key =, reward =}, ...} end,
--                 mode = "backfill" | "discard", max_wait = nil } }
-- An episode is pending when its last turn's info.pending is a key (a string or an integer;
-- episodes about one event may share it). Per step, right after the rollout:
--   hold     pending episodes leave the step's batch (no reward term, advantage or update sees
--            them); "backfill" holds them in the buffer (buf:add_pending, behaviour log-probs
--            kept), "discard" drops them;
--   resolve  resolve(step, buf:pending()) (default: the environment's env.resolve) names the
--            keys whose rewards arrived, {key =, reward = number | function(episode) ->
--            number} (or {key =, discard = true}); each is buf:backfill'ed (buf:discard'ed);
--            with max_wait, keys still waiting max_wait steps after their rollout are
--            discarded;
--   draw     buf:sample(n, step, {logprobs =, resolved = true}): the entries resolved this step
--            join the update first, then the replay draws. Their importance weights are the
--            buffer's: per token min(pi / pi_behaviour, max_ratio) (moonrl.core.replay.ratios,
--            pi the current policy's log-probs before the update, pi_behaviour the rollout's),
--            times the entry's PER weight (1 for a resolved entry), in the loss through
--            batch.is_weights with replay.correction = true; the PPO ratio's old log-probs are
--            the current policy's (decoupled PPO), and an entry whose episode ratio exp(mean
--            log(pi / pi_behaviour)) is beyond max_ratio is evicted instead.
-- Metrics: delayed/held (episodes held this step), delayed/pending (episodes waiting after it),
-- delayed/pending_keys, delayed/resolved and delayed/discarded (episodes, this step),
-- delayed/trained (resolved episodes in this update), delayed/is_weight_mean (their tokens' mean
-- importance weight), delayed/ratio_mean, delayed/wait_mean (steps from rollout to update).
local core = require "moonrl.core"
local batchlib = require "moonrl.batch"
local replaylib = require "moonrl.replay"
local score = require "moonrl.train.score"
local argcheck = require "moonrl.argcheck"

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
-- With delayed = {mode = "backfill"}, the entries resolved this step come first (and come
-- with n = 0 too).
function M.draw(ctx, batch, step)
  local c = ctx.cfg
  local buf = c.replay.buffer
  local before = ctx.replay_before or counters(buf) -- (delayed: from before the backfills)
  ctx.replay_before = nil
  local n = M.count(ctx, batch)
  local resolved = c.delayed ~= nil and c.delayed.mode == "backfill"
  local replayed
  if n > 0 or resolved then
    replayed = buf:sample(n, step, { resolved = resolved or nil, logprobs = function(b)
      return score.score(ctx.model, b, c.minibatch)
    end })
    if replayed and replayed:size() == 0 then replayed = nil end
  end
  return replayed, before
end

-- ---------------------------------------------------------------- delayed rewards

-- The pending key of an episode (its last turn's info.pending, as the buffer keeps keys), or
-- nil.
function M.pending_key(ep)
  local last = type(ep.record) == "table" and ep.record[#ep.record]
  local v = type(last) == "table" and type(last.info) == "table" and last.info.pending or nil
  if v == nil then return nil end
  local k = replaylib.pending_key(v)
  if not k then
    error("train: delayed: an episode's info.pending: a non-empty string or an integer key "
      .. "expected, got " .. argcheck.describe(v), 0)
  end
  return k
end

-- Without the delayed option a pending episode is an error (its reward would count as 0).
function M.refuse_pending(batch)
  for i, ep in ipairs(batch.episodes) do
    local k = M.pending_key(ep)
    if k then
      error(string.format("train: episode %d is pending (its last turn's info.pending = %q), "
        .. "but rl.train has no delayed option: give delayed = {resolve =, mode = \"backfill\"} "
        .. "(or mode = \"discard\")", i, k), 0)
    end
  end
end

-- hold: the batch without its pending episodes (possibly empty), which go into the buffer as
-- pending entries (mode "backfill") or are dropped ("discard"); and the metrics.
function M.hold(ctx, batch, step)
  local d = ctx.cfg.delayed
  local fresh, held, keys = {}, {}, {}
  for i, ep in ipairs(batch.episodes) do
    local k = M.pending_key(ep)
    if k then
      held[#held + 1], keys[#keys + 1] = i, k
    else
      fresh[#fresh + 1] = i
    end
  end
  local mt = { ["delayed/held"] = #held, ["delayed/discarded"] = 0 }
  if #held == 0 then return batch, mt end
  if d.mode == "backfill" then
    ctx.cfg.replay.buffer:add_pending(batch:select(held), step, keys)
  else
    mt["delayed/discarded"] = #held
  end
  local out = batch:select(fresh)
  out.gate = batch.gate
  return out, mt
end

local function check_item(item, i)
  local where = string.format("train: delayed.resolve: item %d", i)
  if type(item) ~= "table" then
    error(where .. ": {key =, reward =} or {key =, discard = true} expected, got "
      .. argcheck.describe(item), 0)
  end
  for k in pairs(item) do
    if k ~= "key" and k ~= "reward" and k ~= "discard" then
      error(string.format("%s: unknown field '%s' (known: key, reward, discard)", where,
        tostring(k)), 0)
    end
  end
  if replaylib.pending_key(item.key) == nil then
    error(where .. ": key: a non-empty string or an integer expected", 0)
  end
  if item.discard ~= nil and item.discard ~= true then
    error(where .. ": discard: true expected (or leave it out)", 0)
  end
  if item.discard and item.reward ~= nil then
    error(where .. ": give one of reward and discard = true", 0)
  end
  local r = item.reward
  if not item.discard and not (type(r) == "function" or argcheck.finite(r)) then
    error(where .. ": reward: a finite number or a function(episode) -> number expected", 0)
  end
end

-- resolve: the keys whose rewards arrived are backfilled (mode "backfill"), those waiting too
-- long discarded; adds the step's delayed/* counts to mt.
function M.resolve(ctx, step, mt)
  local c = ctx.cfg
  local d = c.delayed
  if d.mode ~= "backfill" then return mt end
  local buf = c.replay.buffer
  local before = buf:stats()
  ctx.replay_before = counters(buf) -- a backfill may evict by capacity: this step's replay/*
  local pending = buf:pending()
  if #pending > 0 then
    local fn = d.resolve or c.env.resolve
    local list = fn(step, pending)
    if type(list) ~= "table" then
      error("train: delayed.resolve: a list {{key =, reward =}, ...} expected, got "
        .. type(list), 0)
    end
    for i, item in ipairs(list) do
      check_item(item, i)
      local ok, why
      if item.discard then
        ok, why = buf:discard(item.key, step)
      else
        ok, why = buf:backfill(item.key, item.reward, step)
      end
      if not ok then error(string.format("train: delayed.resolve: item %d: %s", i, why), 0) end
    end
    if d.max_wait then
      for _, p in ipairs(buf:pending()) do
        if step - p.step >= d.max_wait then buf:discard(p.key, step) end
      end
    end
  end
  local after = buf:stats()
  mt["delayed/resolved"] = after.resolved - before.resolved
  mt["delayed/discarded"] = (mt["delayed/discarded"] or 0) + after.discarded - before.discarded
  mt["delayed/pending"], mt["delayed/pending_keys"] = after.pending, after.pending_keys
  return mt
end

-- The step's figures of the resolved episodes in the update (replayed.resolved).
function M.delayed_metrics(replayed, mt)
  local n, wsum, wcount, ratio, wait = 0, 0, 0, 0, 0
  for j = 1, replayed and replayed:size() or 0 do
    if replayed.resolved and replayed.resolved[j] then
      n = n + 1
      ratio = ratio + (replayed.ratios and replayed.ratios[j] or 1)
      wait = wait + (replayed.ages and replayed.ages[j] or 0)
      if replayed.token_weights then
        for p = replayed.offsets[j] + 1, replayed.offsets[j + 1] do
          if replayed.mask:get(p) ~= 0 then
            wsum, wcount = wsum + replayed.token_weights:get(p), wcount + 1
          end
        end
      end
    end
  end
  mt["delayed/trained"] = n
  if n > 0 then
    mt["delayed/ratio_mean"], mt["delayed/wait_mean"] = ratio / n, wait / n
    if wcount > 0 then mt["delayed/is_weight_mean"] = wsum / wcount end
  end
  return mt
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
