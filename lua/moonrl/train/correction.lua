-- moonrl.train.correction: verl's rollout correction in the trainer (the rollout_correction
-- option): importance weights and rejection between the policy that sampled a batch
-- (batch.logprobs: tempered, or truncated by top_k/top_p/min_p, unless sampling is plain) and the
-- policy trained on it, through rl.objective.rollout_correction.
--   decoupled (bypass_mode = false, verl's default): once per batch, before the advantage, the
--     untempered policy's log-probs (the PPO ratio's old_logp) against the rollout's. Rejected
--     tokens leave batch.mask (verl rewrites its response_mask the same way); the weights are
--     batch.is_weights, which the update multiplies into the policy loss and the optimal token
--     baseline into its variance weights.
--   bypass_mode: the rollout's log-probs are old_logp; each minibatch compares the current
--     log-probs with them (as constants). loss_type "ppo_clip" is PPO on the kept tokens, without
--     the weights (the ratio already is pi / pi_rollout); "reinforce" is the REINFORCE loss with
--     them.
local core = require "moonrl.core"
local score = require "moonrl.train.score"

local M = {}

-- rl.objective.rollout_correction's options from the configuration's table.
local function args(rc, t)
  t.is, t.is_threshold = rc.rollout_is, rc.rollout_is_threshold
  t.is_batch_normalize, t.rs, t.rs_threshold = rc.rollout_is_batch_normalize, rc.rollout_rs,
    rc.rollout_rs_threshold
  return t
end

local function all_episodes(batch)
  local eps = {}
  for i = 1, batch:size() do eps[i] = i end
  return eps
end

-- The stats as numbers to log: rollout/<name>.
local function metrics(stats, out)
  for k, v in pairs(stats) do out["rollout/" .. k] = v end
  return out
end

-- Decoupled mode on a batch: sets batch.is_weights (with rollout_is) and takes the rejected tokens
-- out of batch.mask. Returns the metrics (rollout/is_mean, rollout/rs_masked_fraction, ...).
function M.decoupled(ctx, batch)
  local rc = ctx.cfg.rollout_correction
  local w, mask, stats = core.objective.rollout_correction(args(rc, {
    logp = score.policy(ctx, batch), rollout_logp = batch.logprobs, mask = batch.mask,
    offsets = batch.offsets, episodes = all_episodes(batch) }))
  batch.mask:copy(mask)
  batch.is_weights = w
  return metrics(stats, {})
end

-- Bypass mode on a minibatch (episodes eps, current log-probs logp): the loss's kind, its IS
-- weights (nil for ppo_clip) and mask, and the stats.
function M.bypass(ctx, batch, logp, eps)
  local rc = ctx.cfg.rollout_correction
  local w, mask, stats = core.objective.rollout_correction(args(rc, { logp = logp,
    rollout_logp = batch.logprobs, mask = batch.mask, offsets = batch.offsets, episodes = eps }))
  local reinforce = rc.loss_type == "reinforce"
  return reinforce and "reinforce" or "ppo", reinforce and w or nil, mask, stats
end

M.metrics = metrics
return M
