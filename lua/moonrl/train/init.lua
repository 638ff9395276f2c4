-- moonrl.train: the RL trainer, `rl.train{...}`.
--
-- An optional SFT warm start on the environment's oracle, then iterations of
--   tasks -> rollouts (G episodes per task) -> rewards -> advantages -> K epochs of minibatch
--   updates with a PPO-family loss (+ KL to a frozen reference, + entropy bonus) -> log,
-- with held-out evaluation every N steps, atomic checkpoints and bit-exact resume.
--
--   local result = rl.train{
--     model = m, tokenizer = tok, env = require "envs.guess_letter",
--     name = "quickstart", dir = "runs",      -- files go to runs/quickstart/
--     seed = 1, steps = 30,
--     tasks_per_step = 8, group_size = 8,     -- G episodes of each task form a group
--     max_turns = env.max_turns, max_turn_tokens = 8, temperature = 1,
--     advantage = "grpo",                     -- grpo, drgrpo, rloo, opo, gpg, grpo_passk,
--                                             -- reinforce_plus_plus(_baseline), gigpo, beacon,
--                                             -- gae (PPO with a critic: a value head on the
--                                             -- policy's last hidden state; gamma, lam = 1,
--                                             -- value_coef = 0.5, value_clip = 0.5, value_lr)
--     loss = "ppo",                           -- ppo, gspo, cispo, sapo, gpg, gmpo
--     clip_low = 0.2, clip_high = 0.28, clip_c = 3, agg = "token-mean",
--     epochs = 1, minibatch = 32,             -- episodes per optimizer step
--     lr = 2e-4, schedule = "constant", warmup = 0, weight_decay = 0, clip_grad = 1,
--     kl_coef = 0, kl = "k3", kl_reward_coef = 0,   -- KL as a loss term, or in the reward
--     entropy_coef = 0,
--     milestone = nil,                        -- advantage = "beacon": {gamma = 0.95, scale = 10,
--                                             -- weight = 1, mode = "mean_norm"}; turns whose
--                                             -- info.milestone is true end segments
--     fatal = nil,                            -- true or {threshold = 3}: fatal-aware masking
--     dynamic_sampling = false,               -- DAPO: drop zero-variance groups, sample more
--     tree = nil,                             -- {turn = t, k = K}: each of group_size / K roots
--                                             -- branches into K episodes after turn t (needs
--                                             -- the env's clone()); GiGPO then compares the K
--                                             -- continuations of one state exactly
--     overlong = nil,                         -- {max_len =, buffer =, factor = 1}: DAPO shaping
--     rewards = { name = function(episode) return x end },  -- extra reward terms
--     sft = { examples = 400, epochs = 2, lr = 2e-3, batch_size = 16 },  -- or false
--     eval = { every = 5, tasks = 64, k = 4, temperature = 1 },
--     resume = false, progress = "auto", log_episodes = 2,
--     on_step = function(step, metrics) end,
--   }
-- returns {before = eval after SFT, after = final eval, history = {metrics...}, dir = path}.
local core = require "moonrl.core"
local batchlib = require "moonrl.batch"
local envlib = require "moonrl.env"
local plot = require "moonrl.plot"
local sftlib = require "moonrl.sft"
local json = core.json

local M = {}

-- ---------------------------------------------------------------- options

local DEFAULTS = {
  dir = "runs", seed = 0, steps = 20, tasks_per_step = 8, group_size = 8,
  max_turn_tokens = 16, temperature = 1.0, advantage = "grpo", loss = "ppo",
  agg = "token-mean", epochs = 1, lr = 2e-4, schedule = "constant", warmup = 0,
  min_lr = 0, weight_decay = 0, clip_grad = 1.0, beta1 = 0.9, beta2 = 0.95,
  kl_coef = 0, kl = "k3", kl_reward_coef = 0, entropy_coef = 0, dynamic_sampling = false,
  gamma = 1.0, step_weight = 1.0, resume = false, progress = "auto", log_episodes = 2,
  lam = 1.0, value_coef = 0.5, value_clip = 0.5,
  max_sampling_tries = 4,
}

local OUTCOME = { grpo = true, drgrpo = true, rloo = true, opo = true, gpg = true,
  grpo_passk = true, reinforce_plus_plus_baseline = true, reinforce_plus_plus = true }

local function check_options(o)
  assert(type(o) == "table", "train: a table of options expected")
  local function need(cond, msg) if not cond then error("train: " .. msg, 3) end end
  need(o.model ~= nil, "model: an rl.model expected")
  need(o.tokenizer ~= nil, "tokenizer: an rl.tokenizer expected")
  envlib.check(o.env)
  local c = {}
  for k, v in pairs(DEFAULTS) do c[k] = v end
  for k, v in pairs(o) do c[k] = v end
  c.name = c.name or o.env.name
  need(type(c.name) == "string" and c.name:match("^[%w_.%-]+$"),
    "name: letters, digits, '_', '.', '-' expected")
  c.max_turns = c.max_turns or o.env.max_turns or 4
  need(OUTCOME[c.advantage] or c.advantage == "gigpo" or c.advantage == "beacon"
    or c.advantage == "gae", "advantage: unknown estimator '"
    .. tostring(c.advantage) .. "'")
  for _, k in ipairs { "steps", "tasks_per_step", "group_size", "epochs", "max_turns",
    "max_turn_tokens" } do
    need(math.type(c[k]) == "integer" and c[k] >= 1, k .. ": a positive integer expected")
  end
  if c.tree then
    local t = c.tree
    need(type(t) == "table" and math.type(t.turn) == "integer" and t.turn >= 1
      and math.type(t.k) == "integer" and t.k >= 2,
      "tree: {turn = n >= 1, k = n >= 2} expected")
    need(c.group_size % t.k == 0, "tree: group_size must be a multiple of tree.k")
    need(t.turn < c.max_turns, "tree: turn must be less than max_turns")
    local probe = o.env.new()
    need(type(probe) == "table" and type(probe.clone) == "function",
      "tree: the environment's instances need a clone() method")
  end
  local function number_in(k, lo, hi)
    need(type(c[k]) == "number" and c[k] >= lo and c[k] <= hi,
      string.format("%s: a number in [%g, %g] expected", k, lo, hi))
  end
  number_in("gamma", 0, 1)
  number_in("lam", 0, 1)
  number_in("value_coef", 0, math.huge)
  number_in("value_clip", 0, math.huge)
  if c.value_lr ~= nil then number_in("value_lr", 0, math.huge) end
  if c.fatal ~= nil and c.fatal ~= false then
    need(c.fatal == true or (type(c.fatal) == "table" and (c.fatal.threshold == nil or
      (math.type(c.fatal.threshold) == "integer" and c.fatal.threshold >= 1))),
      "fatal: true or {threshold = n >= 1} expected")
  end
  if c.milestone ~= nil then
    need(type(c.milestone) == "table", "milestone: a table {gamma =, scale =, weight =, mode =} expected")
    for _, k in ipairs { "gamma", "scale", "weight" } do
      need(c.milestone[k] == nil or type(c.milestone[k]) == "number", "milestone." .. k .. ": a number expected")
    end
    need(c.milestone.mode == nil or c.milestone.mode == "mean_norm" or c.milestone.mode == "mean_std_norm",
      "milestone.mode: \"mean_norm\" or \"mean_std_norm\" expected")
  end
  c.minibatch = c.minibatch or c.tasks_per_step * c.group_size
  need(math.type(c.minibatch) == "integer" and c.minibatch >= 1,
    "minibatch: a positive integer expected")
  c.eval = c.eval == nil and {} or c.eval
  if c.eval then
    local e = {}
    for k, v in pairs { every = 5, tasks = 32, k = 4, temperature = 1.0, split = "test", seed = 12345 } do
      e[k] = c.eval[k] == nil and v or c.eval[k]
    end
    c.eval = e
  end
  return c
end

-- Deterministic 63-bit mixing of integers (splitmix64's finaliser), for per-step seeds.
local function mix(...)
  local h = 0x2545F4914F6CDD1D
  for _, v in ipairs { ... } do
    h = h ~ (v + 0x9E3779B97F4A7C15 + (h << 6) + (h >> 2))
    h = (h ~ (h >> 30)) * 0xBF58476D1CE4E5B9
    h = (h ~ (h >> 27)) * 0x94D049BB133111EB
    h = h ~ (h >> 31)
  end
  return h & 0x7FFFFFFFFFFFFFFF
end
M.mix = mix

-- ---------------------------------------------------------------- rollouts

-- Runs episodes of `tasks` (each repeated `repeats` times) and returns the batch. groups[i] of
-- each episode is group_base + task index. With `tree` ({turn =, k =}), repeats / k roots per
-- task each branch into k episodes after `turn` turns (all of a task's episodes are its group).
local function rollout(ctx, tasks, repeats, seed, temperature, group_base, tree)
  local list, seeds, groups = {}, {}, {}
  local roots = tree and repeats // tree.k or repeats
  for t, task in ipairs(tasks) do
    for _ = 1, roots do
      list[#list + 1] = task
      seeds[#seeds + 1] = mix(seed, #list)
      groups[#groups + 1] = group_base + t
    end
  end
  local c = ctx.cfg
  local results = ctx.ro:run {
    tokenizer = ctx.tokenizer, env = c.env, tasks = list, seeds = seeds, max_turns = c.max_turns,
    max_turn_tokens = c.max_turn_tokens, temperature = temperature, top_k = c.top_k,
    top_p = c.top_p, min_p = c.min_p, system = c.system, branch = tree,
  }
  if tree then
    local by_root = groups
    groups = {}
    for i, r in ipairs(results) do groups[i] = by_root[r.branch.root] end
  end
  return batchlib.from_rollout(ctx.ro, results, groups)
end

-- ---------------------------------------------------------------- rewards

-- Adds the configured reward terms and shaping to every episode's reward; returns the mean of
-- each term (metrics "reward/<name>").
local function shape_rewards(ctx, batch)
  local c, terms = ctx.cfg, { env = 0 }
  local n = batch:size()
  local lengths = {}
  for i, ep in ipairs(batch.episodes) do
    ep.env_reward = ep.reward
    terms.env = terms.env + ep.reward / n
    lengths[i] = ep.length
  end
  for name, fn in pairs(c.rewards or {}) do
    terms[name] = 0
    for _, ep in ipairs(batch.episodes) do
      local ok, r = pcall(fn, ep)
      if not ok or type(r) ~= "number" or r ~= r then
        error(string.format("train: reward %s failed on an episode: %s", name,
          ok and "returned " .. tostring(r) or tostring(r)), 0)
      end
      ep.reward = ep.reward + r
      terms[name] = terms[name] + r / n
    end
  end
  if c.overlong then
    -- DAPO's soft overlong punishment on each episode's token count
    local o = c.overlong
    local pen = core.objective.overlong { lengths = lengths, max_len = o.max_len,
      buffer = o.buffer, factor = o.factor, floor = o.floor }
    terms.overlong = 0
    for i, ep in ipairs(batch.episodes) do
      ep.reward = ep.reward + pen[i]
      terms.overlong = terms.overlong + pen[i] / n
    end
  end
  return terms
end

-- ---------------------------------------------------------------- advantages

-- ---------------------------------------------------------------- the critic (advantage = "gae")


-- The value head: V(h) = w . h + b on the policy's final hidden state (a linear critic sharing
-- the policy's trunk), with its own AdamW moments. w starts at zero.
local function new_value_head(dim)
  local mw, vw = {}, {}
  for j = 1, dim do mw[j], vw[j] = 0, 0 end
  return { w = core.tensor.zeros { dim }, b = 0, mw = mw, vw = vw, mb = 0, vb = 0, t = 0 }
end

-- The head as plain numbers (for state.json: floats round-trip exactly) and back.
local function value_head_state(v)
  local w = {}
  for j = 1, v.w:numel() do w[j] = v.w:get(j) end
  return { w = w, b = v.b, mw = v.mw, vw = v.vw, mb = v.mb, vb = v.vb, t = v.t }
end

local function value_head_from(s)
  local v = new_value_head(#s.w)
  for j, x in ipairs(s.w) do v.w:set(j, x) end
  v.b, v.mw, v.vw, v.mb, v.vb, v.t = s.b, s.mw, s.vw, s.mb, s.vb, s.t
  return v
end

-- One AdamW step of the value head on its gradients (no weight decay).
local function value_head_step(c, v, dw, db, lr)
  local b1, b2, eps = c.beta1, c.beta2, 1e-8
  v.t = v.t + 1
  local bc1, bc2 = 1 - b1 ^ v.t, 1 - b2 ^ v.t
  for j = 1, v.w:numel() do
    local g = dw:get(j)
    v.mw[j] = b1 * v.mw[j] + (1 - b1) * g
    v.vw[j] = b2 * v.vw[j] + (1 - b2) * g * g
    v.w:set(j, v.w:get(j) - lr * (v.mw[j] / bc1) / (math.sqrt(v.vw[j] / bc2) + eps))
  end
  v.mb = b1 * v.mb + (1 - b1) * db
  v.vb = b2 * v.vb + (1 - b2) * db * db
  v.b = v.b - lr * (v.mb / bc1) / (math.sqrt(v.vb / bc2) + eps)
end

-- GAE: token rewards (each turn's reward on its last sampled token; the rest of the episode's
-- score, reward terms and KL penalty, on its last sampled token), the critic's values before the
-- update, then rl.objective.gae. Keeps old values and returns for the value loss.
local function gae_advantages(ctx, batch)
  local c, n = ctx.cfg, batch:size()
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
      for k, r in ipairs(ep.record) do
        local p = last_of_turn[k - 1]
        if p then rewards:set(p, rewards:get(p) + r.reward) end
        env_sum = env_sum + r.reward
      end
      local rest = ep.reward - (ep.kl_penalty or 0) - env_sum
      rewards:set(last, rewards:get(last) + rest)
    end
  end
  local values = core.tensor.zeros(math.max(total, 1)):narrow(1, 1, total)
  for a = 1, n, c.minibatch do
    local eps = {}
    for i = a, math.min(n, a + c.minibatch - 1) do eps[#eps + 1] = i end
    local _, _, v = ctx.model:forward_batch { tokens = batch.tokens, mask = mask,
      offsets = batch.offsets, episodes = eps, value = ctx.value }
    local s, e = batch.offsets[a] + 1, batch.offsets[eps[#eps] + 1]
    if e >= s then values:narrow(1, s, e - s + 1):copy(v:narrow(1, s, e - s + 1)) end
  end
  local all = {}
  for i = 1, n do all[i] = i end
  local adv, returns = core.objective.gae { rewards = rewards, values = values, mask = mask,
    offsets = batch.offsets, episodes = all, gamma = c.gamma, lambda = c.lam }
  ctx.gae = { old_values = values, returns = returns }
  local per_episode = {}
  for i = 1, n do
    local sum, cnt = 0, 0
    for p = batch.offsets[i] + 1, batch.offsets[i + 1] do
      if mask:get(p) ~= 0 then sum, cnt = sum + adv:get(p), cnt + 1 end
    end
    per_episode[i] = cnt > 0 and sum / cnt or 0
  end
  return adv, per_episode
end

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

-- BEACON (dynamic milestones): turns whose info.milestone is true split each episode into
-- segments; the shaped segment rewards are normalised among episodes of the same task in the
-- same segment and added to the episode term (spec section 6.5, through rl.advantage).
local function beacon_rows(c, batch, scores)
  local rows = turn_rows(batch)
  local flags, uids, index, rewards, mask = {}, {}, {}, {}, {}
  for r, row in ipairs(rows) do
    local rec = row.record
    flags[r] = (rec and rec.info and rec.info.milestone) and true or false
    uids[r] = row.episode
    index[r] = batch.episodes[row.episode].group
    rewards[r] = { scores[row.episode] }
    mask[r] = { 1 }
  end
  local ms = c.milestone or {}
  local shaped = core.advantage.beacon_step_rewards_dynamic({ milestone_flags = flags,
    traj_uids = uids }, { gamma = ms.gamma or 0.95, scale = ms.scale or 10 })
  local out = core.advantage.beacon({ token_level_rewards = rewards, response_mask = mask,
    index = index, traj_uids = uids, step_rewards = shaped.step_rewards,
    segment_ids = shaped.segment_ids }, { epsilon = c.adv_epsilon or 1e-6,
    step_advantage_w = ms.weight or 1.0, mode = ms.mode or "mean_norm" })
  local values = {}
  for r = 1, #rows do values[r] = out.advantages[r][1] end
  return values
end

-- OpenSearch-VL fatal-aware masking (spec section 6.8): an episode with `threshold` consecutive
-- failed turns (a malformed call, a failed tool, info.error), or that ended without an answer,
-- is fatal from the first turn of that run on: those turns leave the loss (mask 0) and the rest
-- of the episode keeps only non-negative advantages. Returns the number of fatal episodes.
local function apply_fatal(c, batch, adv)
  local threshold = type(c.fatal) == "table" and c.fatal.threshold or 3
  local mask, turns, fatal = batch.mask, batch.turns, 0
  for i, ep in ipairs(batch.episodes) do
    local errors = {}
    for k, r in ipairs(ep.record) do
      errors[k] = (r.parsed and r.parsed.kind == "error") or r.tool_error == true
        or (type(r.info) == "table" and r.info.error ~= nil and r.info.error ~= false)
    end
    local res = core.advantage.find_fatal_step_index({ step_is_error = core.json.array(errors),
      terminated_with_answer = ep["end"] == "done" }, { threshold = threshold }).result
    local at = type(res) == "table" and math.tointeger(res[1])
    if at then
      fatal = fatal + 1
      ep.fatal_turn = at
      for p = batch.offsets[i] + 1, batch.offsets[i + 1] do
        if mask:get(p) ~= 0 then
          if turns:get(p) >= at then
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

-- Per-token advantages (a flat tensor like batch.mask), the per-episode values logged, and the
-- number of fatal episodes (with `fatal`).
local function advantages(ctx, batch)
  local c = ctx.cfg
  local scores, groups = {}, {}
  for i, ep in ipairs(batch.episodes) do
    scores[i], groups[i] = ep.reward - (ep.kl_penalty or 0), ep.group
  end
  local adv, per_episode
  if c.advantage == "gae" then
    adv, per_episode = gae_advantages(ctx, batch)
  elseif OUTCOME[c.advantage] then
    local a = core.objective.advantage { method = c.advantage, scores = scores, groups = groups,
      counts = batch:sampled_counts(), epsilon = c.adv_epsilon }
    adv, per_episode = core.objective.broadcast { values = a, mask = batch.mask,
      offsets = batch.offsets }, a
  else
    local rows, index = turn_rows(batch)
    local values
    if c.advantage == "beacon" then
      values = beacon_rows(c, batch, scores)
    else
      -- GiGPO: one row per turn, anchored on the state the turn acted on
      local rs, rr, rg, ra, rt = {}, {}, {}, {}, {}
      for r, row in ipairs(rows) do
        local rec = row.record
        rs[r], rg[r], rt[r] = scores[row.episode], groups[row.episode], row.episode
        rr[r] = rec and rec.reward or 0
        ra[r] = (rec and rec.state) and ("s:" .. rec.state) or ("t:" .. (row.turn + 1))
      end
      local returns = core.objective.step_returns { rewards = rr, traj = rt, gamma = c.gamma }
      values = core.objective.gigpo { scores = rs, step_rewards = returns, groups = rg,
        anchors = ra, step_weight = c.step_weight, mode = c.gigpo_mode }
    end
    adv, per_episode = rows_to_tokens(batch, index, values)
  end
  local fatal = c.fatal and apply_fatal(c, batch, adv) or nil
  return adv, per_episode, fatal
end
M._advantages = advantages -- for the tests

-- ---------------------------------------------------------------- scoring in chunks

-- Flat log-probs (and entropies) of the batch's sampled tokens under model, minibatch by
-- minibatch.
local function score(model, batch, chunk, want_entropy)
  local n = batch:size()
  local total = batch.offsets[n + 1]
  local lp = core.tensor.zeros(math.max(total, 1)):narrow(1, 1, total)
  local ent = want_entropy and core.tensor.zeros(math.max(total, 1)):narrow(1, 1, total) or nil
  for a = 1, n, chunk do
    local eps = {}
    for i = a, math.min(n, a + chunk - 1) do eps[#eps + 1] = i end
    local l, h = model:forward_batch { tokens = batch.tokens, mask = batch.mask,
      offsets = batch.offsets, episodes = eps }
    local s, e = batch.offsets[a] + 1, batch.offsets[eps[#eps] + 1]
    lp:narrow(1, s, e - s + 1):copy(l:narrow(1, s, e - s + 1))
    if ent then ent:narrow(1, s, e - s + 1):copy(h:narrow(1, s, e - s + 1)) end
  end
  return lp, ent
end

-- ---------------------------------------------------------------- one update

local function shuffled(n, seed) return sftlib.shuffled(n, seed) end

local function update(ctx, batch, adv, step)
  local c, m = ctx.cfg, ctx.model
  local n = batch:size()
  local old = batch.logprobs
  if c.temperature ~= 1 or c.top_k or c.top_p or c.min_p then
    old = score(m, batch, c.minibatch) -- the ratio is taken against the untempered policy
  end
  local ref = ctx.ref and score(ctx.ref, batch, c.minibatch) or nil
  local lr = core.lr_at(c.schedule, step - 1, c.steps, c.warmup, c.lr, c.min_lr)
  local acc = { loss = 0, pg_loss = 0, clipfrac = 0, clipfrac_lower = 0, ppo_kl = 0, kl = 0,
    kl_loss = 0, entropy = 0, entropy_loss = 0, grad_norm = 0 }
  local critic = c.advantage == "gae" and ctx.value or nil
  if critic then acc.value_loss, acc.value_clipfrac = 0, 0 end
  local updates = 0
  for epoch = 1, c.epochs do
    local order = shuffled(n, mix(c.seed, step, epoch))
    for a = 1, n, c.minibatch do
      local eps = {}
      for j = a, math.min(n, a + c.minibatch - 1) do eps[#eps + 1] = order[j] end
      local logp, ent, values = m:forward_batch { tokens = batch.tokens, mask = batch.mask,
        offsets = batch.offsets, episodes = eps, value = critic }
      local stats, dlogp, dent = core.objective.loss {
        logp = logp, old_logp = old, adv = adv, mask = batch.mask, offsets = batch.offsets,
        episodes = eps, kind = c.loss, agg = c.agg, agg_norm = c.agg_norm,
        clip_low = c.clip_low, clip_high = c.clip_high, clip_c = c.clip_c, tau_pos = c.tau_pos,
        tau_neg = c.tau_neg, ref_logp = ref, kl = c.kl, kl_coef = c.kl_coef, entropy = ent,
        entropy_coef = c.entropy_coef }
      local vstats, dvalues
      if critic then
        vstats, dvalues = core.objective.value_loss { values = values,
          old_values = ctx.gae.old_values, returns = ctx.gae.returns, mask = batch.mask,
          offsets = batch.offsets, episodes = eps, clip = c.value_clip, coef = c.value_coef,
          agg = c.agg, agg_norm = c.agg_norm }
        stats.loss = stats.loss + vstats.loss
        stats.value_loss, stats.value_clipfrac = vstats.loss, vstats.clipfrac
      end
      local dw, db = m:backward_batch { tokens = batch.tokens, mask = batch.mask,
        offsets = batch.offsets, episodes = eps, dlogprobs = dlogp, dentropy = dent,
        value = critic, dvalues = dvalues }
      local norm = m:step { lr = lr, weight_decay = c.weight_decay, beta1 = c.beta1,
        beta2 = c.beta2, clip = c.clip_grad }
      if critic then value_head_step(c, critic, dw, db, c.value_lr or lr) end
      for k in pairs(acc) do
        if k == "grad_norm" then acc[k] = acc[k] + norm else acc[k] = acc[k] + stats[k] end
      end
      updates = updates + 1
    end
  end
  for k, v in pairs(acc) do acc[k] = v / math.max(updates, 1) end
  acc.lr, acc.updates = lr, updates
  return acc
end

-- ---------------------------------------------------------------- evaluation

-- Greedy success and sampled pass@k on the held-out tasks.
local function evaluate(ctx)
  local e = ctx.cfg.eval
  local tasks = ctx.cfg.env.tasks(e.split, e.tasks, e.seed)
  local greedy = rollout(ctx, tasks, 1, mix(e.seed, 1), 0, 0)
  local sampled = rollout(ctx, tasks, e.k, mix(e.seed, 2), e.temperature, 0)
  local g_succ, solved, s_succ, turns = 0, {}, 0, 0
  for _, ep in ipairs(greedy.episodes) do
    g_succ = g_succ + (ep.success and 1 or 0)
    turns = turns + ep.turns
  end
  for _, ep in ipairs(sampled.episodes) do
    s_succ = s_succ + (ep.success and 1 or 0)
    if ep.success then solved[ep.group] = true end
  end
  local pass = 0
  for _ in pairs(solved) do pass = pass + 1 end
  return { greedy_success = g_succ / #tasks, sample_success = s_succ / (#tasks * e.k),
    ["pass@" .. e.k] = pass / #tasks, pass_at_k = pass / #tasks, k = e.k, tasks = #tasks,
    greedy_turns = turns / #tasks }
end

-- ---------------------------------------------------------------- SFT warm start

-- The oracle's demonstrations replayed through the environment itself, as chat examples.
local function oracle_examples(ctx, n, seed)
  local c = ctx.cfg
  local env = c.env
  assert(type(env.oracle) == "function", "train: sft needs env.oracle(task, rng)")
  local tasks = env.tasks("train", n, seed)
  local out = {}
  for i, task in ipairs(tasks) do
    local rng = core.rng(mix(seed, i))
    local actions = env.oracle(task, rng)
    local inst = env.new()
    local msgs = {}
    local sys = c.system or env.system
    if sys then msgs[#msgs + 1] = { role = "system", content = sys } end
    msgs[#msgs + 1] = { role = "user", content = inst:reset(task, core.rng(mix(seed, i, 1))) }
    local record = {}
    for k, action in ipairs(actions) do
      if k > c.max_turns then break end
      msgs[#msgs + 1] = { role = "assistant", content = action }
      local obs, _, done = envlib.step(env, inst, action, record)
      if done or obs == nil then break end
      msgs[#msgs + 1] = { role = "user", content = obs }
    end
    out[i] = sftlib.example(ctx.tokenizer, msgs)
  end
  return out
end

-- ---------------------------------------------------------------- logging

local function progress_line(ctx, step, mt, elapsed)
  local c = ctx.cfg
  local done = step / c.steps
  local eta = done > 0 and elapsed / done * (1 - done) or 0
  local text = string.format("step %d/%d  reward %.3f  success %.2f  tok/s %.0f  ETA %d:%02d",
    step, c.steps, mt["reward/mean"] or 0, mt.success or 0, mt.tokens_per_s or 0, math.floor(eta / 60),
    math.floor(eta % 60))
  if mt["eval/greedy_success"] then
    text = text .. string.format("  held-out %.2f", mt["eval/greedy_success"])
  end
  if ctx.tty then
    local width = 20
    local fill = math.floor(done * width + 0.5)
    io.stdout:write("\r\27[K[", string.rep("#", fill), string.rep(".", width - fill), "] ", text)
    if step == c.steps then io.stdout:write("\n") end
  else
    io.stdout:write(text, "\n")
  end
  io.stdout:flush()
end

local function write_plot(ctx)
  local train, held = {}, {}
  for _, h in ipairs(ctx.state.history) do
    if h.success then train[#train + 1] = { h.step, h.success } end
    if h["eval/greedy_success"] then held[#held + 1] = { h.step, h["eval/greedy_success"] } end
  end
  local c = ctx.cfg
  return plot.svg(ctx.dir .. "/curve.svg", {
    title = c.name .. ": success (step 0 = after SFT, before RL)", xlabel = "RL step",
    ylabel = "success rate", ymin = 0, ymax = 1,
    series = { { name = "train (sampled)", points = train },
      { name = "held-out (greedy)", points = held, dots = true } },
    marks = { { x = 0, label = "RL starts" } } })
end

local function append(path, text)
  local f = assert(io.open(path, "a"))
  f:write(text)
  f:close()
end

-- ---------------------------------------------------------------- checkpoints

local function save_state(ctx, step)
  local ckpt = string.format("%s/checkpoint-%06d.bin", ctx.dir, step)
  local ok, err = ctx.model:save_checkpoint(ckpt, step)
  if not ok then error("train: checkpoint: " .. err, 0) end
  local prev = ctx.state.checkpoint
  ctx.state.checkpoint = ckpt:match("[^/]+$")
  ctx.state.step = step
  if ctx.value then ctx.state.value_head = value_head_state(ctx.value) end
  ok, err = core.fs.write(ctx.dir .. "/state.json", json.encode(ctx.state))
  if not ok then error("train: state: " .. err, 0) end
  if prev and prev ~= ctx.state.checkpoint then os.remove(ctx.dir .. "/" .. prev) end
end

local function load_state(ctx)
  local f = io.open(ctx.dir .. "/state.json", "r")
  if not f then return nil end
  local state = json.decode(f:read("a"))
  f:close()
  if type(state) ~= "table" or type(state.checkpoint) ~= "string" then
    error("train: " .. ctx.dir .. "/state.json is not a trainer state", 0)
  end
  local step, err = ctx.model:load_checkpoint(ctx.dir .. "/" .. state.checkpoint)
  if not step then error("train: resume: " .. err, 0) end
  if step ~= state.step then error("train: resume: checkpoint and state.json disagree", 0) end
  return state
end

-- Rewrites metrics.jsonl with the history up to the checkpoint (a crash may have left later
-- lines).
local function rewrite_metrics(ctx)
  local lines = {}
  for _, h in ipairs(ctx.state.history) do lines[#lines + 1] = json.encode(h) .. "\n" end
  assert(core.fs.write(ctx.dir .. "/metrics.jsonl", table.concat(lines)))
end

-- ---------------------------------------------------------------- the loop

local function sample_batch(ctx, step)
  local c = ctx.cfg
  local want = c.tasks_per_step
  local parts, kept, tries, drawn, filtered = {}, 0, 0, 0, 0
  repeat
    tries = tries + 1
    local tasks = c.env.tasks("train", want, mix(c.seed, step, tries))
    local b = rollout(ctx, tasks, c.group_size, mix(c.seed, step, tries, 7), c.temperature,
      tries * 100000, c.tree)
    drawn = drawn + #tasks
    if not c.dynamic_sampling then return b, { tries = 1, groups_drawn = drawn, groups_dropped = 0 } end
    local keep = {}
    for _, g in ipairs(b:groups()) do
      local first, varied = b.episodes[g.members[1]].reward, false
      for _, i in ipairs(g.members) do varied = varied or b.episodes[i].reward ~= first end
      if varied and kept < c.tasks_per_step then
        for _, i in ipairs(g.members) do keep[#keep + 1] = i end
        kept = kept + 1
      else
        filtered = filtered + 1
      end
    end
    if #keep > 0 then parts[#parts + 1] = b:select(keep) end
    want = c.tasks_per_step - kept
  until kept >= c.tasks_per_step or tries >= c.max_sampling_tries
  local info = { tries = tries, groups_drawn = drawn, groups_dropped = filtered }
  if #parts == 0 then return nil, info end
  return batchlib.concat(parts), info
end

local function flatten(prefix, t, out)
  for k, v in pairs(t) do
    if type(v) == "number" then out[prefix .. k] = v end
  end
end

function M.train(opts)
  local c = check_options(opts)
  local m = c.model
  local ctx = { cfg = c, model = m, tokenizer = c.tokenizer }
  ctx.dir = c.dir .. "/" .. c.name
  local ok, err = core.fs.mkdir(ctx.dir)
  if not ok then error("train: " .. err, 2) end
  ctx.tty = c.progress == true or (c.progress == "auto" and core.fs.isatty(1))
  local per_step = c.tasks_per_step * c.group_size
  local eval_eps = c.eval and c.eval.tasks * math.max(c.eval.k, 1) or 0
  ctx.ro = core.rollout.new { model = m, episodes = math.max(per_step, eval_eps),
    capacity = c.capacity or m:config().ctx }
  local start = 1
  ctx.state = c.resume and load_state(ctx) or nil
  if c.advantage == "gae" then ctx.value = new_value_head(m:config().dim) end
  if ctx.state then
    start = ctx.state.step + 1
    rewrite_metrics(ctx)
    if ctx.value then
      if type(ctx.state.value_head) ~= "table" then
        error("train: resume: state.json has no value head (the run did not use gae)", 0)
      end
      ctx.value = value_head_from(ctx.state.value_head)
    end
  else
    -- a fresh run replaces what an earlier run of the same name left
    local f = io.open(ctx.dir .. "/state.json", "r")
    if f then
      local old = json.decode(f:read("a"))
      f:close()
      if type(old) == "table" and type(old.checkpoint) == "string" then
        os.remove(ctx.dir .. "/" .. old.checkpoint)
      end
      os.remove(ctx.dir .. "/state.json")
    end
    ctx.state = { history = {}, step = 0 }
    for _, name in ipairs { "metrics.jsonl", "episodes.jsonl", "curve.svg" } do
      os.remove(ctx.dir .. "/" .. name)
    end
    if c.sft then
      local t0 = core.clock()
      local s = c.sft
      local data = oracle_examples(ctx, s.examples or 256, mix(c.seed, 0xF7))
      local r = sftlib.sft { model = m, data = data, epochs = s.epochs or 2,
        batch_size = s.batch_size or 16, lr = s.lr or 1e-3, schedule = s.schedule or "cosine",
        warmup = s.warmup or 0, seed = mix(c.seed, 0x5F7), weight_decay = s.weight_decay or 0 }
      ctx.state.sft = { examples = #data, steps = r.steps, final_loss = r.final_loss,
        seconds = core.clock() - t0 }
      m:reset_optimizer()
    end
    if c.kl_coef ~= 0 or c.kl_reward_coef ~= 0 or c.reference then
      ok, err = m:save(ctx.dir .. "/reference")
      if not ok then error("train: reference: " .. err, 0) end
    end
    local first = { step = 0 }
    if c.eval then
      for k, v in pairs(evaluate(ctx)) do first["eval/" .. k] = v end
    end
    ctx.state.before = first
    ctx.state.history[1] = first
    append(ctx.dir .. "/metrics.jsonl", json.encode(first) .. "\n")
    save_state(ctx, 0)
  end
  if c.kl_coef ~= 0 or c.kl_reward_coef ~= 0 or c.reference then
    ctx.ref = assert(core.model.load(ctx.dir .. "/reference"))
  end
  local t_start = core.clock()
  for step = start, c.steps do
    local t0 = core.clock()
    local batch, info = sample_batch(ctx, step)
    local t_roll = core.clock() - t0
    local mt = { step = step, ["time/rollout"] = t_roll, ["sampling/tries"] = info.tries,
      ["sampling/groups_dropped"] = info.groups_dropped }
    if batch then
      local terms = shape_rewards(ctx, batch)
      for k, v in pairs(terms) do mt["reward/" .. k] = v end
      if c.kl_reward_coef ~= 0 then
        -- KL in the reward: each episode's score loses beta * its summed per-token KL
        local ref = score(ctx.ref, batch, c.minibatch)
        local kl = core.objective.kl { logp = batch.logprobs, ref_logp = ref, mask = batch.mask,
          kind = c.kl }
        local total = 0
        for i, ep in ipairs(batch.episodes) do
          local s = 0
          for p = batch.offsets[i] + 1, batch.offsets[i + 1] do s = s + kl:get(p) end
          ep.kl_penalty = c.kl_reward_coef * s
          total = total + ep.kl_penalty
        end
        mt["reward/kl_penalty"] = -total / batch:size()
      end
      local st = batch:stats()
      mt["reward/mean"], mt["reward/std"], mt.success = st.reward_mean, st.reward_std, st.success
      mt.episodes, mt.turns_mean, mt.length_mean = st.episodes, st.turns_mean, st.length_mean
      mt.sampled_tokens, mt.zero_variance_groups = st.sampled_tokens, st.zero_variance_groups
      for k, v in pairs(st.ends) do mt["end/" .. k] = v end
      mt.errors = st.errors
      local t1 = core.clock()
      local adv, per_ep, fatal = advantages(ctx, batch)
      if fatal then mt["fatal/episodes"] = fatal / batch:size() end
      local amax = 0
      for _, v in ipairs(per_ep) do amax = math.max(amax, math.abs(v)) end
      mt["adv/abs_max"] = amax
      if amax > 0 then
        local loss = update(ctx, batch, adv, step)
        flatten("loss/", loss, mt)
      else
        mt["loss/updates"] = 0 -- every group had one reward: nothing to learn from
      end
      mt["time/update"] = core.clock() - t1
      mt.tokens_per_s = st.tokens / math.max(core.clock() - t0, 1e-9)
      local f = assert(io.open(ctx.dir .. "/episodes.jsonl", "a"))
      -- the first episode of each group, then the second of each, ... up to log_episodes
      local groups, logged, round = batch:groups(), 0, 1
      while logged < math.min(c.log_episodes, batch:size()) do
        for _, g in ipairs(groups) do
          local i = g.members[round]
          if i and logged < c.log_episodes then
            local rec = batch:episode_record(i, { tokens = false })
            rec.step = step
            f:write(json.encode(rec), "\n")
            logged = logged + 1
          end
        end
        round = round + 1
      end
      f:close()
    else
      mt.skipped = 1 -- dynamic sampling found no group with different rewards: no update
    end
    if c.eval and (step % c.eval.every == 0 or step == c.steps) then
      local t2 = core.clock()
      for k, v in pairs(evaluate(ctx)) do mt["eval/" .. k] = v end
      mt["time/eval"] = core.clock() - t2
    end
    mt["time/step"] = core.clock() - t0
    ctx.state.history[#ctx.state.history + 1] = mt
    append(ctx.dir .. "/metrics.jsonl", json.encode(mt) .. "\n")
    if c.on_step then c.on_step(step, mt) end
    if c.progress then progress_line(ctx, step, mt, core.clock() - t_start) end
    local every = c.checkpoint_every or (c.eval and c.eval.every) or 10
    if step % every == 0 or step == c.steps or step == c.stop_after then save_state(ctx, step) end
    if c.plot ~= false then write_plot(ctx) end
    if step == c.stop_after then break end
  end
  if c.plot ~= false then write_plot(ctx) end
  local last
  for i = #ctx.state.history, 1, -1 do
    if ctx.state.history[i]["eval/greedy_success"] then last = ctx.state.history[i] break end
  end
  ctx.ro:free()
  return { before = ctx.state.before, after = last, history = ctx.state.history, dir = ctx.dir,
    sft = ctx.state.sft }
end

M.oracle_examples = oracle_examples
M.evaluate = evaluate
return M
