-- moonrl.train.update: the loss and update stage: K epochs of shuffled minibatch steps with a
-- PPO-family loss (+ KL to the frozen reference, + entropy bonus, + the critic's value loss),
-- AdamW on the policy and on the value head; the rollout correction's IS weights (decoupled
-- mode, batch.is_weights) or its per-minibatch weights and rejection (bypass mode).
--
-- The `update` option replaces the stage: a function(ctx, batch, adv, step) -> stats, given the
-- per-token advantages (a flat tensor like batch.mask); the numbers in stats are logged as
-- loss/<name>. The default's are loss, pg_loss, clipfrac, clipfrac_lower, ppo_kl, kl, kl_loss,
-- entropy, entropy_loss, grad_norm (the mean over the optimizer steps of the gradient norm before
-- clipping), grad_norm_max (their largest), value_loss and value_clipfrac (with a critic), lr,
-- updates. With the teacher option (moonrl.train.teacher), the loss also has the teacher's
-- turn-level KL (loss/teacher_kl) and the teacher takes its EMA step after the update.
local core = require "moonrl.core"
local sftlib = require "moonrl.sft"
local critic = require "moonrl.train.critic"
local score = require "moonrl.train.score"
local seedlib = require "moonrl.train.seed"
local correction = require "moonrl.train.correction"
local teacher = require "moonrl.train.teacher"
local dist = require "moonrl.train.dist"

local mix = seedlib.mix
local M = {}

-- The default stage.
function M.run(ctx, batch, adv, step)
  local c, m = ctx.cfg, ctx.model
  local n = batch:size()
  local rc = c.rollout_correction
  local bypass = rc and rc.bypass_mode
  -- the ratio is taken against the untempered policy, or in bypass mode against the rollout's
  local old = bypass and batch.logprobs or score.policy(ctx, batch)
  local ref = ctx.ref and score.score(ctx.ref, batch, c.minibatch) or nil
  local lr = core.lr_at(c.schedule, step - 1, c.steps, c.warmup, c.lr, c.min_lr)
  local acc = { loss = 0, pg_loss = 0, clipfrac = 0, clipfrac_lower = 0, ppo_kl = 0, kl = 0,
    kl_loss = 0, entropy = 0, entropy_loss = 0, grad_norm = 0 }
  local head = ctx.value
  if head then
    if not batch.critic then
      error("train: update: the run has a critic but the estimator left no batch.critic "
        .. "{old_values =, returns =}", 0)
    end
    acc.value_loss, acc.value_clipfrac = 0, 0
  end
  local tt = ctx.teacher and teacher.prepare(ctx, batch) -- TT-OPD: the teacher's log-probs
  if tt then acc.teacher_kl = 0 end
  local updates, norm_max = 0, 0
  local ranks = dist.size()
  local rollout_acc = {} -- bypass mode: the rollout correction's stats, summed
  for epoch = 1, c.epochs do
    local order = sftlib.shuffled(n, mix(c.seed, step, epoch))
    for a = 1, n, c.minibatch do
      local eps = {}
      for j = a, math.min(n, a + c.minibatch - 1) do eps[#eps + 1] = order[j] end
      -- with several ranks each scores its share of the minibatch and the scores are summed, so
      -- that every rank computes the whole minibatch's loss (moonrl.train.dist)
      local own = eps
      if ranks > 1 then own = dist.part(eps) end
      local logp, ent, values
      if #own > 0 then
        logp, ent, values = m:forward_batch { tokens = batch.tokens, mask = batch.mask,
          offsets = batch.offsets, episodes = own, value = head }
      else
        local total = math.max(batch.offsets[n + 1], 1)
        logp, ent = core.tensor.zeros(total), core.tensor.zeros(total)
        values = head and core.tensor.zeros(total) or nil
      end
      if ranks > 1 then
        dist.sum(logp)
        dist.sum(ent)
        if values then dist.sum(values) end
      end
      local kind, is_weights, mask = c.loss, batch.is_weights, batch.mask
      if bypass then
        local st
        kind, is_weights, mask, st = correction.bypass(ctx, batch, logp, eps)
        for k, v in pairs(st) do rollout_acc[k] = (rollout_acc[k] or 0) + v end
      end
      local stats, dlogp, dent = core.objective.loss {
        logp = logp, old_logp = old, adv = adv, mask = mask, offsets = batch.offsets,
        episodes = eps, kind = kind, agg = c.agg, agg_norm = c.agg_norm,
        clip_low = c.clip_low, clip_high = c.clip_high, clip_c = c.clip_c, tau_pos = c.tau_pos,
        tau_neg = c.tau_neg, clip_cov_ratio = c.clip_cov_ratio, clip_cov_lb = c.clip_cov_lb,
        clip_cov_ub = c.clip_cov_ub, kl_cov_ratio = c.kl_cov_ratio, ppo_kl_coef = c.ppo_kl_coef,
        dro_beta = c.dro_beta, seed = kind == "clip_cov" and mix(c.seed, step, epoch, a) or nil,
        is_weights = is_weights, ref_logp = ref, kl = c.kl, kl_coef = c.kl_coef, entropy = ent,
        entropy_coef = c.entropy_coef,
        -- A2TGPO's loss: the estimator's per-token clip scales and the turns of its ratios
        clip_scale = kind == "a2tgpo" and batch.clip_scale or nil,
        turns = kind == "a2tgpo" and batch.turns or nil }
      local vstats, dvalues
      if head then
        vstats, dvalues = core.objective.value_loss { values = values,
          old_values = batch.critic.old_values, returns = batch.critic.returns, mask = batch.mask,
          offsets = batch.offsets, episodes = eps, clip = c.value_clip, coef = c.value_coef,
          agg = c.agg, agg_norm = c.agg_norm }
        stats.loss = stats.loss + vstats.loss
        stats.value_loss, stats.value_clipfrac = vstats.loss, vstats.clipfrac
      end
      if tt then teacher.add_loss(ctx, tt, batch, logp, eps, dlogp, stats) end
      local dw, db
      if #own > 0 then
        dw, db = m:backward_batch { tokens = batch.tokens, mask = batch.mask,
          offsets = batch.offsets, episodes = own, dlogprobs = dlogp, dentropy = dent,
          value = head, dvalues = dvalues }
      elseif head then
        dw, db = core.tensor.zeros(m:config().dim), 0
      end
      if ranks > 1 then
        dist.sum_gradients(m)
        if head then
          dist.sum(dw)
          db = dist.sum_number(db)
        end
      end
      local norm = m:step { lr = lr, weight_decay = c.weight_decay, beta1 = c.beta1,
        beta2 = c.beta2, clip = c.clip_grad }
      if head then critic.step(c, head, dw, db, c.value_lr or lr) end
      norm_max = math.max(norm_max, norm)
      for k in pairs(acc) do
        if k == "grad_norm" then acc[k] = acc[k] + norm else acc[k] = acc[k] + stats[k] end
      end
      updates = updates + 1
    end
  end
  if tt then teacher.finish(ctx, tt) end
  for k, v in pairs(acc) do acc[k] = v / math.max(updates, 1) end
  for k, v in pairs(rollout_acc) do acc["rollout_" .. k] = v / math.max(updates, 1) end
  acc.lr, acc.updates, acc.grad_norm_max = lr, updates, norm_max
  return acc
end

return M
