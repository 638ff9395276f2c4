-- moonrl.train.advantage: the advantage stage and its registry of estimators.
--
-- An estimator is fn(ctx, batch) -> adv, per_episode: adv a flat tensor like batch.mask holding
-- each sampled token's advantage (0 elsewhere), per_episode a list of one number per episode
-- (logged: adv/abs_max; an all-zero list skips the update). Each episode's score is
-- ep.reward - (ep.kl_penalty or 0) (M.scores). The built-in estimators are registered below
-- exactly as a recipe registers its own:
--   rl.train.advantage.register("mine", function(ctx, batch) ... end [, {critic = true}])
--   rl.train{..., advantage = "mine"}      -- or advantage = function(ctx, batch) ... end
-- critic = true gives the run a value head (ctx.value, moonrl.train.critic), trained by the
-- update on batch.critic = {old_values =, returns =} (flat tensors like batch.mask), which the
-- estimator sets.
local core = require "moonrl.core"
local argcheck = require "moonrl.argcheck"
local critic = require "moonrl.train.critic"
local reward = require "moonrl.train.reward"
local score = require "moonrl.train.score"

local M = {}

local registry = {}

-- register(name, fn [, {critic = false}]): adds an estimator (or replaces one of that name).
function M.register(name, fn, opts)
  if type(name) ~= "string" or not name:match("^[%w_.%-]+$") then
    error("advantage.register: name: a string of letters, digits, '_', '.', '-' expected", 2)
  end
  if type(fn) ~= "function" then
    error("advantage.register: fn: a function(ctx, batch) -> adv, per_episode expected", 2)
  end
  if opts ~= nil and type(opts) ~= "table" then
    error("advantage.register: opts: a table {critic = boolean} expected", 2)
  end
  for k, v in pairs(opts or {}) do
    if k ~= "critic" then
      error("advantage.register: opts: unknown option '" .. tostring(k) .. "' (known: critic)", 2)
    end
    if type(v) ~= "boolean" then error("advantage.register: opts.critic: a boolean expected", 2) end
  end
  registry[name] = { name = name, fn = fn, critic = (opts and opts.critic) or false }
end

-- The estimator registered under name ({name =, fn =, critic =}), or nil.
function M.get(name) return registry[name] end

-- The registered names, sorted.
function M.names()
  local out = {}
  for name in pairs(registry) do out[#out + 1] = name end
  table.sort(out)
  return out
end

-- Each episode's score (its reward less its KL penalty) and prompt group.
function M.scores(batch)
  local scores, groups = {}, {}
  for i, ep in ipairs(batch.episodes) do
    scores[i], groups[i] = ep.reward - (ep.kl_penalty or 0), ep.group
  end
  return scores, groups
end

-- ---------------------------------------------------------------- outcome estimators

-- One value per episode (rl.objective.advantage), which each of its sampled tokens gets.
local function outcome(method)
  return function(ctx, batch)
    local scores, groups = M.scores(batch)
    local a = core.objective.advantage { method = method, scores = scores, groups = groups,
      counts = batch:sampled_counts(), epsilon = ctx.cfg.adv_epsilon }
    return core.objective.broadcast { values = a, mask = batch.mask, offsets = batch.offsets }, a
  end
end

for _, method in ipairs { "grpo", "drgrpo", "rloo", "opo", "gpg", "grpo_passk",
  "reinforce_plus_plus_baseline", "reinforce_plus_plus" } do
  M.register(method, outcome(method))
end

-- AEM (spec advantage.md 6.7, rl.advantage.aem): each episode's GRPO advantage times alpha =
-- exp(-H) normalised to group mean 1, H the episode's mean token entropy under the policy before
-- the update (min-max scaled within the group; alpha = 1 in a group whose entropies span less
-- than 0.1), lambda 1. batch.aem_alpha keeps the alphas (for a recipe's diagnostics).
function M.mean_entropies(ctx, batch)
  local _, ent = score.score(ctx.model, batch, ctx.cfg.minibatch, true)
  local out = {}
  for i = 1, batch:size() do
    local sum, cnt = 0, 0
    for p = batch.offsets[i] + 1, batch.offsets[i + 1] do
      if batch.mask:get(p) ~= 0 then sum, cnt = sum + ent:get(p), cnt + 1 end
    end
    out[i] = cnt > 0 and sum / cnt or 0
  end
  return out
end

M.register("aem", function(ctx, batch)
  local scores, groups = M.scores(batch)
  local base = core.objective.advantage { method = "grpo", scores = scores, groups = groups,
    counts = batch:sampled_counts(), epsilon = ctx.cfg.adv_epsilon }
  local res = core.advantage.aem({ base_adv = base, mean_entropy = M.mean_entropies(ctx, batch), group = groups },
    { lam = 1, min_range = 0.1 })
  local a = {}
  for i = 1, #base do a[i] = res.advantages[i] end
  batch.aem_alpha = res.alpha
  return core.objective.broadcast { values = a, mask = batch.mask, offsets = batch.offsets }, a
end)

-- The reward terms GDPO normalises by default, in the order the reward stage adds them: the
-- environment's return ("env"), the recipe's terms, DAPO's overlong penalty ("overlong").
function M.gdpo_terms(c)
  local names = { "env" }
  for _, t in ipairs(reward.terms(c.rewards)) do names[#names + 1] = t.name end
  if c.overlong then names[#names + 1] = "overlong" end
  return names
end

-- A reward graph in the reward option (rl.reward.graph), or nil.
local function graph_of(c)
  local r = c.reward
  local mt = getmetatable(r)
  if type(r) == "table" and type(mt) == "table" and mt.__name == "moonrl.reward.graph" then return r end
  return nil
end
M.graph_of = graph_of

-- GDPO (verl "gdpo"): each reward term of ep.reward_terms normalised within the task's group on
-- its own, the normalised terms summed with gdpo.weights, whitened over the sampled tokens. With
-- a reward graph (combine = "per_term") the terms, weights and epsilon are its own: its weighted
-- terms, normalised within the group (scale = "group") or over the batch (scale = "batch").
M.register("gdpo", function(ctx, batch)
  local c = ctx.cfg
  local g = c.gdpo or {}
  local graph = graph_of(c)
  local epsilon = c.adv_epsilon
  if graph then
    local names, weights = graph:weighted()
    g = { terms = names, weights = weights }
    epsilon = graph.eps
  end
  local names = g.terms or M.gdpo_terms(c)
  local terms = {}
  for k, name in ipairs(names) do
    terms[k] = {}
    for i, ep in ipairs(batch.episodes) do
      local v = type(ep.reward_terms) == "table" and ep.reward_terms[name]
      if type(v) ~= "number" then
        error(string.format("train: advantage gdpo: episode %d has no reward term '%s' "
          .. "(ep.reward_terms, which the reward stage sets)", i, name), 0)
      end
      terms[k][i] = v
    end
  end
  local scores, groups = M.scores(batch)
  if graph and graph.scale == "batch" then
    for i in ipairs(groups) do groups[i] = 0 end
  end
  local a = core.objective.advantage { method = "gdpo", scores = scores, groups = groups,
    counts = batch:sampled_counts(), terms = terms, term_weights = g.weights,
    epsilon = epsilon }
  return core.objective.broadcast { values = a, mask = batch.mask, offsets = batch.offsets }, a
end)

-- ---------------------------------------------------------------- per-turn estimators

-- One row per turn of each episode: rows[r] = {episode =, turn = 0-based, record =}, and
-- index[i][turn] = r.
local function turn_rows(batch)
  local rows, index = {}, {}
  for i, ep in ipairs(batch.episodes) do
    index[i] = {}
    for k = 1, math.max(ep.turns, #ep.record) do
      rows[#rows + 1] = { episode = i, turn = k - 1, record = ep.record[k] }
      index[i][k - 1] = #rows
    end
  end
  return rows, index
end
M.turn_rows = turn_rows

-- Per-row values -> a flat per-token tensor (each sampled token gets its turn's value) and the
-- mean over each episode's sampled tokens.
local function rows_to_tokens(batch, index, values)
  local n, mask, turns = batch:size(), batch.mask, batch.turns
  local adv = core.tensor.zeros(math.max(batch.offsets[n + 1], 1)):narrow(1, 1, batch.offsets[n + 1])
  local per_episode = {}
  for i = 1, n do
    local sum, cnt = 0, 0
    for p = batch.offsets[i] + 1, batch.offsets[i + 1] do
      if mask:get(p) ~= 0 then
        local row = index[i][math.floor(turns:get(p))]
        local v = row and values[row] or 0
        adv:set(p, v)
        sum, cnt = sum + v, cnt + 1
      end
    end
    per_episode[i] = cnt > 0 and sum / cnt or 0
  end
  return adv, per_episode
end
M.rows_to_tokens = rows_to_tokens

-- The reward of turn k (1-based) of an episode: a reward graph's dense per-turn values
-- (ep.rewards, once a graph scored the episode), else the environment's (the turn record's).
local function turn_reward(ep, k)
  if ep.reward_version ~= nil then return (ep.rewards and ep.rewards[k]) or 0 end
  local rec = ep.record[k]
  return rec and rec.reward or 0
end
M.turn_reward = turn_reward

-- GiGPO: one row per turn, anchored on the state the turn acted on (its state_key, else its
-- turn number): the episode term plus the step term among turns from the same state.
M.register("gigpo", function(ctx, batch)
  local c = ctx.cfg
  local scores, groups = M.scores(batch)
  local rows, index = turn_rows(batch)
  local rs, rr, rg, ra, rt = {}, {}, {}, {}, {}
  for r, row in ipairs(rows) do
    local rec = row.record
    rs[r], rg[r], rt[r] = scores[row.episode], groups[row.episode], row.episode
    rr[r] = turn_reward(batch.episodes[row.episode], row.turn + 1)
    ra[r] = (rec and rec.state) and ("s:" .. rec.state) or ("t:" .. (row.turn + 1))
  end
  local returns = core.objective.step_returns { rewards = rr, traj = rt, gamma = c.gamma }
  local values = core.objective.gigpo { scores = rs, step_rewards = returns, groups = rg,
    anchors = ra, step_weight = c.step_weight, mode = c.gigpo_mode }
  return rows_to_tokens(batch, index, values)
end)

-- The per-turn values of a reward graph's dense process terms (weighted), one list per episode,
-- or nil when the graph has none.
local function process_rewards(c, batch)
  local graph = graph_of(c)
  if not graph then return nil end
  local dense = {}
  for _, t in ipairs(graph.terms) do
    if t.kind == "process" and t.dense and t.weight ~= 0 then dense[#dense + 1] = t end
  end
  if #dense == 0 then return nil end
  local out = {}
  for i, ep in ipairs(batch.episodes) do
    local per = {}
    for k = 1, math.max(ep.turns, #ep.record) do per[k] = 0 end
    for _, t in ipairs(dense) do
      local r = ep.reward_detail and ep.reward_detail[t.name]
      if r and r.status == "ok" and r.turns then
        for k, v in ipairs(r.turns) do per[k] = (per[k] or 0) + t.weight * v end
      end
    end
    out[i] = per
  end
  return out
end

-- BEACON (dynamic milestones): turns whose info.milestone is true split each episode into
-- segments; the shaped segment rewards are normalised among episodes of the same task in the
-- same segment and added to the episode term (spec section 6.5, through rl.advantage). With a
-- reward graph that has dense process terms, their per-turn values are the segment rewards in
-- place of the milestone shaping, and the episode term sees the rest of the score (the outcome).
M.register("beacon", function(ctx, batch)
  local c = ctx.cfg
  local scores = M.scores(batch)
  local process = process_rewards(c, batch)
  if process then
    for i, per in ipairs(process) do
      local s = 0
      for _, v in ipairs(per) do s = s + v end
      scores[i] = scores[i] - s
    end
  end
  local rows, index = turn_rows(batch)
  local flags, uids, tasks, rewards, mask = {}, {}, {}, {}, {}
  for r, row in ipairs(rows) do
    local rec = row.record
    flags[r] = (rec and rec.info and rec.info.milestone) and true or false
    uids[r] = row.episode
    tasks[r] = batch.episodes[row.episode].group
    rewards[r] = { scores[row.episode] }
    mask[r] = { 1 }
  end
  local ms = c.milestone or {}
  local shaped = core.advantage.beacon_step_rewards_dynamic({ milestone_flags = flags,
    traj_uids = uids }, { gamma = ms.gamma or 0.95, scale = ms.scale or 10 })
  if process then
    for r, row in ipairs(rows) do shaped.step_rewards[r] = process[row.episode][row.turn + 1] or 0 end
  end
  local out = core.advantage.beacon({ token_level_rewards = rewards, response_mask = mask,
    index = tasks, traj_uids = uids, step_rewards = shaped.step_rewards,
    segment_ids = shaped.segment_ids }, { epsilon = c.adv_epsilon or 1e-6,
    step_advantage_w = ms.weight or 1.0, mode = ms.mode or "mean_norm" })
  local values = {}
  for r = 1, #rows do values[r] = out.advantages[r][1] end
  return rows_to_tokens(batch, index, values)
end)

-- ---------------------------------------------------------------- token rewards

-- Token rewards: each turn's reward (turn_reward: a graph's dense values, else the environment's)
-- on its last sampled token; the rest of the episode's score (reward terms, KL penalty) on its
-- last sampled token. A flat tensor like batch.mask.
local function token_rewards(batch)
  local n = batch:size()
  local total = batch.offsets[n + 1]
  local rewards = core.tensor.zeros(math.max(total, 1)):narrow(1, 1, total)
  local mask, turns = batch.mask, batch.turns
  for i, ep in ipairs(batch.episodes) do
    local last_of_turn, last = {}, nil
    for p = batch.offsets[i] + 1, batch.offsets[i + 1] do
      if mask:get(p) ~= 0 then
        last_of_turn[math.floor(turns:get(p))] = p
        last = p
      end
    end
    if last then
      local env_sum = 0
      local turns_n = ep.reward_version ~= nil and #(ep.rewards or {}) or #ep.record
      for k = 1, turns_n do
        local r = turn_reward(ep, k)
        local p = last_of_turn[k - 1]
        if p then rewards:set(p, rewards:get(p) + r) end
        env_sum = env_sum + r
      end
      local rest = ep.reward - (ep.kl_penalty or 0) - env_sum
      rewards:set(last, rewards:get(last) + rest)
    end
  end
  return rewards
end
M.token_rewards = token_rewards

-- Each sampled token's sum over the vocabulary of the squared probabilities of the distribution
-- it was drawn from (untempered, the model as it is), one episode at a time through m:logits.
function M.sum_pi_squared(model, batch)
  local n = batch:size()
  local total = batch.offsets[n + 1]
  local out = core.tensor.zeros(math.max(total, 1)):narrow(1, 1, total)
  for i = 1, n do
    local first, last = batch:range(i)
    local ids = {}
    for p = first, last do ids[#ids + 1] = math.tointeger(batch.tokens:get(p)) end
    local probs = model:logits({ ids }):softmax()
    local sq = (probs * probs):sum(3) -- (1, length): position j predicts token j + 1
    for p = first + 1, last do
      if batch.mask:get(p) ~= 0 then out:set(p, sq:get(1, p - first)) end
    end
  end
  return out
end

-- The optimal token baseline (verl "optimal_token_baseline"; "tir_optimal_token_baseline" packs
-- each episode's sampled tokens first): per-step baselines within the task's group, weighted by
-- the policy's accumulated score-function variance, from the policy's log-probs before the update
-- and its sum of squared probabilities; with decoupled rollout correction, its IS weights too.
local function otb(multi_turn)
  return function(ctx, batch)
    local c, n = ctx.cfg, batch:size()
    local eps, groups = {}, {}
    for i, ep in ipairs(batch.episodes) do eps[i], groups[i] = i, ep.group end
    local o = c.otb or {}
    local adv = core.objective.otb { rewards = token_rewards(batch), mask = batch.mask,
      old_logp = score.policy(ctx, batch), sum_pi_sq = M.sum_pi_squared(ctx.model, batch),
      is_weights = batch.is_weights, offsets = batch.offsets, episodes = eps, groups = groups,
      multi_turn = multi_turn, handle_zero_tail = o.handle_zero_tail, epsilon = o.epsilon }
    local per_episode = {}
    for i = 1, n do
      local sum, cnt = 0, 0
      for p = batch.offsets[i] + 1, batch.offsets[i + 1] do
        if batch.mask:get(p) ~= 0 then sum, cnt = sum + adv:get(p), cnt + 1 end
      end
      per_episode[i] = cnt > 0 and sum / cnt or 0
    end
    return adv, per_episode
  end
end
M.register("optimal_token_baseline", otb(false))
M.register("tir_optimal_token_baseline", otb(true))

-- ---------------------------------------------------------------- GAE (PPO with a critic)

-- Token rewards (token_rewards above), the critic's values before the update, then
-- rl.objective.gae. Leaves the old values and returns for the value loss.
M.register("gae", function(ctx, batch)
  local c, n = ctx.cfg, batch:size()
  local mask = batch.mask
  local rewards = token_rewards(batch)
  local values = critic.values(ctx, batch)
  local all = {}
  for i = 1, n do all[i] = i end
  local adv, returns = core.objective.gae { rewards = rewards, values = values, mask = mask,
    offsets = batch.offsets, episodes = all, gamma = c.gamma, lambda = c.lam }
  batch.critic = { old_values = values, returns = returns }
  local per_episode = {}
  for i = 1, n do
    local sum, cnt = 0, 0
    for p = batch.offsets[i] + 1, batch.offsets[i + 1] do
      if mask:get(p) ~= 0 then sum, cnt = sum + adv:get(p), cnt + 1 end
    end
    per_episode[i] = cnt > 0 and sum / cnt or 0
  end
  return adv, per_episode
end, { critic = true })

-- StepPO's step-level GAE (spec advantage.md 6.3, rl.advantage.steppo_step_gae): the step is
-- the turn. A turn's reward is the sum of its sampled tokens' rewards (token_rewards above: the
-- environment's turn reward on the turn's last sampled token, the rest of the episode's total on
-- the episode's last), its value the critic's value at its first sampled token; GAE runs over each
-- episode's turns (gamma, lam; a turn with no sampled token is a zero-reward, zero-value step),
-- the advantages are whitened over all turns of the batch, and every sampled token of a turn gets
-- its turn's advantage, with the turn's return (advantage + value, before whitening) as the value
-- head's target. A batch of fewer than two turns has no spread to whiten: no update.
M.register("step_gae", function(ctx, batch)
  local c, n, mask, turns = ctx.cfg, batch:size(), batch.mask, batch.turns
  local rewards = token_rewards(batch)
  local values = critic.values(ctx, batch)
  local rows, index = turn_rows(batch)
  local sums, firsts = {}, {}
  for i = 1, n do
    for p = batch.offsets[i] + 1, batch.offsets[i + 1] do
      if mask:get(p) ~= 0 then
        local r = index[i][math.floor(turns:get(p))]
        if r then
          sums[r] = (sums[r] or 0) + rewards:get(p)
          if firsts[r] == nil then firsts[r] = values:get(p) end
        end
      end
    end
  end
  local rs, vs, ms, trajs, steps, of = {}, {}, {}, {}, {}, {}
  for r, row in ipairs(rows) do
    if firsts[r] ~= nil then
      local k = #rs + 1
      rs[k], vs[k], ms[k] = { sums[r] }, { firsts[r] }, { 1 }
      trajs[k], steps[k], of[k] = row.episode, row.turn, r
    end
  end
  local adv_rows, ret_rows = {}, {}
  if #rs >= 2 then
    local res = core.advantage.steppo_step_gae({ token_level_rewards = rs, values = vs,
      response_mask = ms, trajectory_uids = trajs, step_indices = steps },
      { gamma = c.gamma, lam = c.lam })
    for k, r in ipairs(of) do
      adv_rows[r], ret_rows[r] = res.advantages[k][1], res.returns[k][1]
    end
  end
  local adv, per_episode = rows_to_tokens(batch, index, adv_rows)
  batch.critic = { old_values = values,
    returns = #rs >= 2 and rows_to_tokens(batch, index, ret_rows) or values }
  return adv, per_episode
end, { critic = true })

-- ---------------------------------------------------------------- the stage

-- OpenSearch-VL fatal-aware masking (spec section 6.8): an episode with `threshold` consecutive
-- failed turns (a malformed call, a failed tool, info.error), or that ended without an answer,
-- is fatal from the first turn of that run on. M.fatal_turn(ep, threshold) -> that turn (0-based,
-- as batch.turns counts), or nil when the episode is not fatal.
function M.fatal_turn(ep, threshold)
  local errors = {}
  for k, r in ipairs(ep.record) do
    errors[k] = (r.parsed and r.parsed.kind == "error") or r.tool_error == true
      or (type(r.info) == "table" and r.info.error ~= nil and r.info.error ~= false)
  end
  local res = core.advantage.find_fatal_step_index({ step_is_error = core.json.array(errors),
    terminated_with_answer = ep["end"] == "done" }, { threshold = threshold or 3 }).result
  return type(res) == "table" and math.tointeger(res[1]) or nil
end

-- The fatal turn of each of the batch's episodes ({[i] = turn}) under the fatal option.
local function fatal_turns(c, batch)
  local threshold = type(c.fatal) == "table" and c.fatal.threshold or 3
  local at = {}
  for i, ep in ipairs(batch.episodes) do at[i] = M.fatal_turn(ep, threshold) end
  return at
end

-- Fatal-aware masking of adv (the fatal turns at): a fatal episode's turns from the fatal one on
-- leave the loss (mask 0) and the rest keeps only non-negative advantages; with fatal.drop the
-- whole episode leaves the loss (its advantages were computed without it). Marks ep.fatal_turn;
-- returns the number of fatal episodes.
local function apply_fatal(c, batch, adv, at)
  local drop = type(c.fatal) == "table" and c.fatal.drop
  local mask, turns, fatal = batch.mask, batch.turns, 0
  for i, ep in ipairs(batch.episodes) do
    local t = at[i]
    if t then
      fatal = fatal + 1
      ep.fatal_turn = t
      for p = batch.offsets[i] + 1, batch.offsets[i + 1] do
        if mask:get(p) ~= 0 then
          if drop or turns:get(p) >= t then
            mask:set(p, 0)
            adv:set(p, 0)
          elseif adv:get(p) < 0 then
            adv:set(p, 0)
          end
        end
      end
    end
  end
  return fatal
end

-- ---------------------------------------------------------------- information gain

-- The information gain of each episode's turns from the forced-continuation scores the rollout
-- stage took with the info_gain option (ep.forced: after the prompt, then after each turn the
-- episode went on from; moonrl.train.rollout): f = the mean log-probability of the answer's
-- tokens (kind "logprob") or its exp (kind "prob"), IG of turn t = f(after t) - f(after t - 1).
-- One list per episode, one value per IG turn (turns 1 .. #forced - 1); the turns after them
-- (the answer) have none.
function M.information_gains(c, batch)
  local kind = c.info_gain and c.info_gain.kind or "logprob"
  local out = {}
  for i, ep in ipairs(batch.episodes) do
    local f = {}
    for k, e in ipairs(ep.forced or {}) do f[k] = e.logp / e.tokens end
    if #f >= 2 then
      local r = core.advantage.information_gain({ answer_logp_per_turn = f })
      out[i] = kind == "prob" and r.ig_prob or r.ig_logprob
    else
      out[i] = {}
    end
  end
  return out
end

-- Per-turn values (rows of turn_rows) -> the log's mean |value| per turn position,
-- adv/turn_<k>_abs (k from 1), and ig/mean over every IG turn.
local function turn_metrics(rows, values, igs)
  local m, sum, cnt = {}, {}, {}
  for r, row in ipairs(rows) do
    local k = row.turn + 1
    sum[k], cnt[k] = (sum[k] or 0) + math.abs(values[r]), (cnt[k] or 0) + 1
  end
  for k, v in pairs(sum) do m["adv/turn_" .. k .. "_abs"] = v / cnt[k] end
  local s, n = 0, 0
  for _, list in ipairs(igs) do
    for _, v in ipairs(list) do s, n = s + v, n + 1 end
  end
  m["ig/mean"] = n > 0 and s / n or 0
  m["ig/turns"] = n
  return m
end
M.turn_metrics = turn_metrics

-- A2TGPO (spec advantage.md 6.6): IG normalised within (prompt group, turn index), accumulated
-- (discounted, divided by the square root of the terms), alpha D_t + the outcome's GRPO advantage
-- on IG turns and the outcome's alone on the answer turn; each IG turn's clip range scaled by
-- 1 + beta (2 sigmoid(g) - 1), which the loss kind "a2tgpo" reads from batch.clip_scale.
M.register("a2tgpo", function(ctx, batch)
  local c = ctx.cfg
  local ig_opts = c.info_gain
  local scores, groups = M.scores(batch)
  local igs = M.information_gains(c, batch)
  local trajs = {}
  for i = 1, batch:size() do
    trajs[i] = { group = groups[i], ig = igs[i], outcome = scores[i] }
  end
  local res = core.advantage.a2tgpo_advantages({ trajs = trajs }, { alpha = ig_opts.alpha,
    gamma = ig_opts.gamma, clip_beta = ig_opts.beta, epsilon = c.adv_epsilon })
  local rows, index = turn_rows(batch)
  local values, scale = {}, {}
  for r, row in ipairs(rows) do
    local t = res.per_traj[row.episode]
    local k = math.min(row.turn + 1, #t.turn_adv) -- turns past the IG turns: the answer's
    values[r], scale[r] = t.turn_adv[k], t.clip_scale[k]
  end
  local adv, per_episode = rows_to_tokens(batch, index, values)
  batch.clip_scale = rows_to_tokens(batch, index, scale)
  batch.adv_metrics = turn_metrics(rows, values, igs)
  return adv, per_episode
end)

-- IGPO-style: each IG turn's reward is its raw information gain and the answer turn's the
-- episode's score; all turn rewards of the batch are normalised together (mean, population
-- std), and a turn's advantage is the discounted sum (info_gain.gamma) of the normalised
-- rewards from it to the episode's end.
M.register("igpo", function(ctx, batch)
  local c = ctx.cfg
  local gamma, eps = c.info_gain.gamma, c.adv_epsilon or 1e-6
  local scores = M.scores(batch)
  local igs = M.information_gains(c, batch)
  local rows, index = turn_rows(batch)
  local raw = {}
  for r, row in ipairs(rows) do
    local ig = igs[row.episode][row.turn + 1]
    local last = index[row.episode][row.turn + 1] == nil
    raw[r] = ig or (last and scores[row.episode] or 0)
  end
  local mean, var = 0, 0
  for _, v in ipairs(raw) do mean = mean + v / #raw end
  for _, v in ipairs(raw) do var = var + (v - mean) ^ 2 / #raw end
  local sd = math.sqrt(var)
  local values = {}
  for r = #rows, 1, -1 do
    local z = (raw[r] - mean) / (sd + eps)
    local nxt = rows[r + 1]
    local later = (nxt and nxt.episode == rows[r].episode) and values[r + 1] or 0
    values[r] = z + gamma * later
  end
  local adv, per_episode = rows_to_tokens(batch, index, values)
  batch.adv_metrics = turn_metrics(rows, values, igs)
  return adv, per_episode
end)

-- ---------------------------------------------------------------- DPEPO

-- DPEPO's options (the spec's defaults), checked at `level`.
local function dpepo_options(where, opts, level)
  return argcheck.fields(where, opts == nil and {} or opts, {
    { "alpha", 0.8, argcheck.number(0, 1) },
    { "gamma", 0.95, argcheck.number(0, 1) },
    { "beta", 0.95, argcheck.number(0, 1) },
    { "omega", 0.8, argcheck.number(0, 1) },
  }, level + 1)
end

-- DPEPO's step-level diversity weight (shared/spec/reproductions.md §3.6). turns[t][i] is copy
-- i's action at turn t: a string, "" when the copy acted with none (a missing or malformed
-- part) or false when it was done (skipped). Copy i's weight at turn t is the mean of
-- alpha^(times its action is in its own earlier actions), gamma^(times its (previous, current)
-- pair is among its own earlier pairs) and beta^(times that pair is among the other copies'
-- earlier pairs), 0.5 for a copy with no action; the turn's W is the mean of the copies' weights
-- (those not skipped) averaged with omega^(actions this turn minus distinct ones); a turn in
-- which no copy acted gets 0.5. "Earlier" is the turns before t; a copy's "previous" action is
-- its last one that was not "" (a first action has no pair: both pair terms are 1). Returns the
-- list of W.
function M.dpepo_weights(turns, opts)
  local where = "rl.train.advantage.dpepo_weights"
  local o = dpepo_options(where, opts, 2)
  if type(turns) ~= "table" then error(where .. ": turns: a list of per-copy action lists expected", 2) end
  local acts, last, pairs_of, out = {}, {}, {}, {} -- per copy: action counts, last action, pair counts
  for t, row in ipairs(turns) do
    if type(row) ~= "table" then error(string.format("%s: turns[%d]: a list of actions expected", where, t), 2) end
    local sum, cnt, this, seen, distinct, new_pairs = 0, 0, 0, {}, 0, {}
    for i, a in pairs(row) do
      if type(i) ~= "number" or (a ~= false and type(a) ~= "string") then
        error(string.format("%s: turns[%d][%s]: an action string, \"\" or false expected", where, t, tostring(i)), 2)
      end
    end
    local n = 0
    for i in pairs(row) do n = math.max(n, i) end
    for i = 1, n do
      local a = row[i]
      if a == "" then
        sum, cnt = sum + 0.5, cnt + 1
      elseif a then
        acts[i], pairs_of[i] = acts[i] or {}, pairs_of[i] or {}
        local own_pair, other_pair = 0, 0
        local key = last[i] and (last[i] .. "\0" .. a)
        if key then
          own_pair = pairs_of[i][key] or 0
          for j, p in pairs(pairs_of) do if j ~= i then other_pair = other_pair + (p[key] or 0) end end
        end
        sum = sum + (o.alpha ^ (acts[i][a] or 0) + o.gamma ^ own_pair + o.beta ^ other_pair) / 3
        cnt, this = cnt + 1, this + 1
        if not seen[a] then seen[a], distinct = true, distinct + 1 end
        new_pairs[i] = key or false
      end
    end
    out[t] = this == 0 and 0.5 or (sum / cnt + o.omega ^ (this - distinct)) / 2
    for i = 1, n do -- this turn joins the histories after every copy's weight is taken
      local a = row[i]
      if a and a ~= "" then
        acts[i][a] = (acts[i][a] or 0) + 1
        if new_pairs[i] then pairs_of[i][new_pairs[i]] = (pairs_of[i][new_pairs[i]] or 0) + 1 end
        last[i] = a
      end
    end
  end
  return out
end

-- One episode's turns for dpepo_weights, from its record's info (rl.envkit.copies with actions =
-- "split": info.copy_actions, and info.copies[i].skipped for a copy that was done); nil for a
-- turn whose record carries no copy_actions.
function M.dpepo_turns(ep)
  local turns = {}
  for k = 1, math.max(ep.turns or 0, #(ep.record or {})) do
    local info = ep.record and ep.record[k] and ep.record[k].info
    if type(info) == "table" and type(info.copy_actions) == "table" then
      local row = {}
      for i, a in ipairs(info.copy_actions) do
        local c = type(info.copies) == "table" and info.copies[i]
        row[i] = (type(c) == "table" and c.skipped) and false or tostring(a)
      end
      turns[k] = row
    else
      turns[k] = {} -- no actions: the turn's W is 0.5
    end
  end
  return turns
end

-- dpepo{alpha =, gamma =, beta =, omega =} -> an estimator (advantage = "dpepo" is dpepo{}):
-- each episode's GRPO advantage A, per turn times W (dpepo_weights) when A > 0 and times 2 - W
-- when A < 0, so a redundant step gets less credit and more blame. batch.dpepo_w keeps each
-- episode's list of W. It needs rl.envkit.copies{actions = "split"} episodes: a batch in which
-- no turn has info.copy_actions is an error.
function M.dpepo(opts)
  opts = dpepo_options("rl.train.advantage.dpepo", opts, 2)
  return function(ctx, batch)
    local scores, groups = M.scores(batch)
    local base = core.objective.advantage { method = "grpo", scores = scores, groups = groups,
      counts = batch:sampled_counts(), epsilon = ctx.cfg.adv_epsilon }
    local rows, index = turn_rows(batch)
    local ws, any = {}, false
    for i, ep in ipairs(batch.episodes) do
      for _, rec in ipairs(ep.record or {}) do
        if type(rec.info) == "table" and rec.info.copy_actions then any = true end
      end
      ws[i] = M.dpepo_weights(M.dpepo_turns(ep), opts)
    end
    if not any and #rows > 0 then
      error("train: advantage dpepo: no turn has info.copy_actions (an environment made by "
        .. "rl.envkit.copies{actions = \"split\"} expected)", 0)
    end
    local values = {}
    for r, row in ipairs(rows) do
      local a, w = base[row.episode], ws[row.episode][row.turn + 1] or 0.5
      values[r] = a > 0 and a * w or (a < 0 and a * (2 - w) or 0)
    end
    batch.dpepo_w = ws
    return rows_to_tokens(batch, index, values)
  end
end
M.register("dpepo", M.dpepo())

-- ---------------------------------------------------------------- batch-wide structure term

-- structure_term(scores, keys [, epsilon = 1e-6]) -> one value per episode: DR-MMSearch's
-- batch-wide comparison of trajectories of like structure (spec reproductions.md 3.2, a chosen
-- reading): episodes with the same key (any string: e.g. the sequence of their action kinds) form
-- one class across the whole batch, whatever their prompt group, and an episode's value is
-- (S - class mean) / (class sample sd + epsilon); 0 in a class of one.
function M.structure_term(scores, keys, epsilon)
  if not argcheck.is_list(scores) then argcheck.fail("advantage.structure_term", "scores: a list of numbers expected", 2) end
  if not argcheck.is_list(keys) or #keys ~= #scores then
    argcheck.fail("advantage.structure_term", "keys: a list as long as scores expected", 2)
  end
  for i = 1, #scores do
    if not argcheck.finite(scores[i]) then
      argcheck.fail("advantage.structure_term", string.format("scores[%d]: a finite number expected", i), 2)
    end
    if type(keys[i]) ~= "string" then argcheck.fail("advantage.structure_term", string.format("keys[%d]: a string expected", i), 2) end
  end
  local eps = epsilon or 1e-6
  local sum, count, sq = {}, {}, {}
  for i, k in ipairs(keys) do sum[k], count[k] = (sum[k] or 0) + scores[i], (count[k] or 0) + 1 end
  for i, k in ipairs(keys) do sq[k] = (sq[k] or 0) + (scores[i] - sum[k] / count[k]) ^ 2 end
  local out = {}
  for i, k in ipairs(keys) do
    local n = count[k]
    out[i] = n > 1 and (scores[i] - sum[k] / n) / (math.sqrt(sq[k] / (n - 1)) + eps) or 0
  end
  return out
end

-- structure{base = "grpo", weight = 0.5, key = function(ep) -> string} -> an estimator: base's
-- advantage plus weight x structure_term of the episodes' scores keyed by key(ep), given to each
-- episode's sampled tokens. batch.structure keeps the term (one value per episode).
function M.structure(opts)
  local o = argcheck.fields("rl.train.advantage.structure", opts or {}, {
    { "base", "grpo", argcheck.string }, { "weight", 0.5, argcheck.number() },
    { "key", nil, argcheck.func, required = true },
  }, 2)
  local est = registry[o.base]
  if not est then argcheck.fail("rl.train.advantage.structure", "base: no estimator named " .. argcheck.describe(o.base), 2) end
  if est.critic then argcheck.fail("rl.train.advantage.structure", "base: an estimator without a critic expected", 2) end
  return function(ctx, batch)
    local keys = {}
    for i, ep in ipairs(batch.episodes) do
      local k = o.key(ep)
      if type(k) ~= "string" then
        error("rl.train.advantage.structure: key(ep) returned " .. argcheck.describe(k) .. ", not a string", 0)
      end
      keys[i] = k
    end
    local adv, per_episode = est.fn(ctx, batch)
    local scores = M.scores(batch)
    local term = M.structure_term(scores, keys, ctx.cfg.adv_epsilon)
    local per = {}
    for i = 1, #term do
      local first, last = batch:range(i)
      for p = first, last do
        if batch.mask:get(p) ~= 0 then adv:set(p, adv:get(p) + o.weight * term[i]) end
      end
      per[i] = per_episode[i] + o.weight * term[i]
    end
    batch.structure = term
    return adv, per
  end
end

-- The estimator a configuration names: cfg.advantage is a registered name or a function.
function M.estimator(c)
  if type(c.advantage) == "function" then return { name = "function", fn = c.advantage, critic = false } end
  return registry[c.advantage]
end

-- The flat per-token tensors of a batch that estimators read besides its own (the policy's
-- log-probs, the rollout correction's weights).
local EXTRA_TENSORS = { "policy_logprobs", "is_weights" }

-- Copies the positions of episodes `list` of a flat tensor `from` (laid out like batch) into
-- `to` (laid out like the batch of those episodes, or the other way round with back = true).
local function move(batch, list, from, to, back)
  local at = 0
  for _, i in ipairs(list) do
    local a, len = batch.offsets[i], batch.offsets[i + 1] - batch.offsets[i]
    if len > 0 then
      if back then
        to:narrow(1, a + 1, len):copy(from:narrow(1, at + 1, len))
      else
        to:narrow(1, at + 1, len):copy(from:narrow(1, a + 1, len))
      end
    end
    at = at + len
  end
end

local function flat(n) return core.tensor.zeros(math.max(n, 1)):narrow(1, 1, n) end

-- The batch of episodes `list` with the extra tensors too.
local function subset(batch, list)
  local sub = batch:select(list)
  for _, k in ipairs(EXTRA_TENSORS) do
    if batch[k] then
      sub[k] = flat(sub.offsets[#list + 1])
      move(batch, list, batch[k], sub[k])
    end
  end
  return sub
end

-- The estimator without the unscorable episodes (a reward graph's ep.reward_status): it runs on
-- the others alone, so their groups' statistics leave those out, and the unscorable ones get
-- advantage 0. With a critic, their value targets are their current values (no information).
local function without_unscorable(ctx, batch, est, dropped)
  local keep, out = {}, {}
  for i, ep in ipairs(batch.episodes) do
    if ep.reward_status == "unscorable" or dropped[i] then out[#out + 1] = i else keep[#keep + 1] = i end
  end
  if #out == 0 then return est.fn(ctx, batch) end
  local n, total = batch:size(), batch.offsets[batch:size() + 1]
  local adv, per_episode = flat(total), {}
  for i = 1, n do per_episode[i] = 0 end
  if #keep > 0 then
    local sub = subset(batch, keep)
    local a, pe = est.fn(ctx, sub)
    if not core.tensor.is_tensor(a) or a:numel() ~= sub.offsets[#keep + 1] or type(pe) ~= "table" then
      return a, pe -- the stage's checks below name what is wrong
    end
    move(batch, keep, a, adv, true)
    for k, i in ipairs(keep) do per_episode[i] = pe[k] end
    if sub.clip_scale then -- A2TGPO's clip scales; the unscorable episodes' stay 1
      batch.clip_scale = flat(total)
      batch.clip_scale:fill(1)
      move(batch, keep, sub.clip_scale, batch.clip_scale, true)
    end
    batch.adv_metrics = sub.adv_metrics
    if sub.critic then
      local old, ret = flat(total), flat(total)
      move(batch, keep, sub.critic.old_values, old, true)
      move(batch, keep, sub.critic.returns, ret, true)
      batch.critic = { old_values = old, returns = ret }
    end
  end
  if est.critic then
    local rest = subset(batch, out)
    local values = critic.values(ctx, rest)
    if not batch.critic then batch.critic = { old_values = flat(total), returns = flat(total) } end
    move(batch, out, values, batch.critic.old_values, true)
    move(batch, out, values, batch.critic.returns, true)
  end
  return adv, per_episode
end

-- The stage: the run's estimator on the batch (without its unscorable episodes, which get 0,
-- and with fatal.drop without its fatal ones), then fatal-aware masking (with `fatal`). Returns
-- the per-token advantages, the per-episode values and the number of fatal episodes (nil
-- without `fatal`).
function M.compute(ctx, batch)
  local est = M.estimator(ctx.cfg)
  local at = ctx.cfg.fatal and fatal_turns(ctx.cfg, batch) or nil
  local drop = at and type(ctx.cfg.fatal) == "table" and ctx.cfg.fatal.drop
  local adv, per_episode = without_unscorable(ctx, batch, est, drop and at or {})
  local n, total = batch:size(), batch.offsets[batch:size() + 1]
  if not core.tensor.is_tensor(adv) or adv:numel() ~= total then
    error(string.format("train: advantage %s: per-token advantages expected (a tensor of %d "
      .. "values, like batch.mask), got %s", est.name, total, type(adv)), 0)
  end
  if type(per_episode) ~= "table" or #per_episode ~= n then
    error(string.format("train: advantage %s: per-episode values expected (a list of %d "
      .. "numbers)", est.name, n), 0)
  end
  local fatal = at and apply_fatal(ctx.cfg, batch, adv, at) or nil
  return adv, per_episode, fatal
end

return M
