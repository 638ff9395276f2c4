-- moonrl.train: the RL trainer, `rl.train{...}`, and the loop that ties its stages together.
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
--                                             -- reinforce_plus_plus(_baseline), gdpo (each
--                                             -- reward term normalised on its own: gdpo =
--                                             -- {terms =, weights =}), optimal_token_baseline,
--                                             -- tir_optimal_token_baseline, gigpo, beacon,
--                                             -- gae (PPO with a critic: a value head on the
--                                             -- policy's last hidden state; gamma, lam = 1,
--                                             -- value_coef = 0.5, value_clip = 0.5, value_lr),
--                                             -- step_gae (StepPO: the same critic, GAE over
--                                             -- turns),
--                                             -- any name registered with
--                                             -- rl.train.advantage.register, or a function
--     loss = "ppo",                           -- ppo, gspo, cispo, sapo, gpg, gmpo, dppo_tv,
--                                             -- dppo_kl, clip_cov, kl_cov, dro (dro_beta =),
--                                             -- reinforce
--     clip_low = 0.2, clip_high = 0.28, clip_c = 3, agg = "token-mean",
--     epochs = 1, minibatch = 32,             -- episodes per optimizer step
--     lr = 2e-4, schedule = "constant", warmup = 0, weight_decay = 0, clip_grad = 1,
--     kl_coef = 0, kl = "k3", kl_reward_coef = 0,   -- KL as a loss term, or in the reward
--     rollout_correction = nil,               -- verl's: {rollout_is = "token" | "sequence",
--                                             -- rollout_is_threshold = 2 or "L_U", rollout_rs =
--                                             -- "token_k1,...", rollout_rs_threshold =,
--                                             -- bypass_mode = false, loss_type = "ppo_clip"}
--     entropy_coef = 0,
--     teacher = nil,                          -- TT-OPD: {privileged = function(task, episode)
--                                             -- -> text only the teacher sees, decay = 0.99,
--                                             -- coef = 1, kl = "k1", weights =, truncate =}:
--                                             -- an EMA copy of the policy after SFT scores the
--                                             -- sampled tokens with the text in its system
--                                             -- message; coef x its turn-level KL joins the
--                                             -- loss (moonrl.train.teacher)
--     milestone = nil,                        -- advantage = "beacon": {gamma = 0.95, scale = 10,
--                                             -- weight = 1, mode = "mean_norm"}; turns whose
--                                             -- info.milestone is true end segments
--     fatal = nil,                            -- true or {threshold = 3, drop = false}: fatal-
--                                             -- aware masking (drop: fatal episodes leave the
--                                             -- group statistics and the loss instead)
--     dynamic_sampling = false,               -- DAPO: drop zero-variance groups, sample more
--                                             -- ("reward": zero variance of the graph's totals)
--     curriculum = nil,                       -- an rl.curriculum: chooses the tasks (in place of
--                                             -- env.tasks("train"), sets per-task max_turns for
--                                             -- a horizon, observes every rolled-out group;
--                                             -- its gate drops groups; its state in state.json)
--     synth = nil,                            -- an rl.synth.loop: every loop.every steps, before
--                                             -- the step's tasks are drawn, it proposes,
--                                             -- verifies, calibrates on the policy and admits
--                                             -- tasks into its pool (the curriculum, which
--                                             -- defaults to loop.pool); its proposals by
--                                             -- "self" train on their rewards; it sees each
--                                             -- step's batch (retirement, failure clusters);
--                                             -- synth/* metrics; its state in state.json
--     remote = nil,                           -- {client = rl.http.openai{...} | clients = {...}, push_weights =
--                                             -- false}: episodes (and evaluations) generated
--                                             -- by the endpoint (rl.remote.rollout); with
--                                             -- push_weights, the weights are posted to its
--                                             -- /v1/load_weights after SFT and each update
--     tree = nil,                             -- {turn = t, k = K}: each of group_size / K roots
--                                             -- branches into K episodes after turn t (needs
--                                             -- the env's clone()); GiGPO then compares the K
--                                             -- continuations of one state exactly
--     rollout_hooks = nil,                    -- {on_turn =, on_branches =, on_action =,
--                                             -- max_resamples =, gate =, fork_room =}: ro:run's
--                                             -- hooks on training rollouts (README "Rollout
--                                             -- hooks"); cut groups leave the batch, the gate's
--                                             -- counts are batch.gate (moonrl.train.rollout)
--     batch_invariant = false,                -- true: episodes decode to the same floats
--                                             -- whatever runs beside them (~1.5x slower)
--     decode_bf16 = false,                    -- true: rollouts decode from a bfloat16 copy of
--                                             -- the weights (m:decode_bf16), refreshed by each
--                                             -- update; training and scoring stay float32
--     overlong = nil,                         -- {max_len =, buffer =, factor = 1}: DAPO shaping
--     replay = nil,                           -- an rl.replay buffer, or {buffer =, ratio = 0.5,
--                                             -- advantages = "recompute" | "stored",
--                                             -- correction = true}: replayed entries join each
--                                             -- update (moonrl.train.replay)
--     delayed = nil,                          -- {resolve = function(step, pending) -> {{key =,
--                                             -- reward =}, ...}, mode = "backfill" | "discard",
--                                             -- max_wait =}: episodes whose last turn has
--                                             -- info.pending = key wait in the replay buffer
--                                             -- until resolve backfills their reward, then join
--                                             -- an update with importance weights (or are
--                                             -- dropped: "discard"; moonrl.train.replay)
--     rewards = { name = function(episode) return x end },  -- extra reward terms, added in
--                                             -- name order (or a list {{name =, fn =}, ...},
--                                             -- in its order)
--     reward = g,                             -- or a reward graph (rl.reward.graph), which is
--                                             -- then the whole reward (see moonrl.reward)
--     sft = { examples = 400, epochs = 2, lr = 2e-3, batch_size = 16 },  -- or false
--     eval = { every = 5, tasks = 64, k = 4, temperature = 1 },
--     resume = false,                         -- true: continue the run in dir/name; "force":
--                                             -- even with other options than state.json's
--     overwrite = false,                      -- true: a fresh run replaces an earlier one's files
--     progress = "auto", log_episodes = 2,
--     grad_spike = { factor = 3, window = 20, min_steps = 5 },  -- grad/spike: the step's
--                                             -- largest gradient norm above factor x the median
--                                             -- of the last `window` steps' (once min_steps
--                                             -- exist); see moonrl.train.diagnostics
--     on_step = function(step, metrics) end,
--     -- the stages, each replaceable (see the modules named): tasks (moonrl.train.tasks),
--     -- rollout (.rollout), reward (.reward), advantage (.advantage), update (.update),
--     -- evaluate (.eval), log (.log), checkpoint (.checkpoint)
--   }
-- returns {before = step 0's metrics (the eval after SFT), after = the last evaluated step's
-- metrics, history = {metrics...}, dir = path, sft = the warm start's figures}.
--
-- rl.train is this module: callable, with the stage modules as fields (rl.train.advantage,
-- rl.train.rollout, ...), so a recipe can call one stage on its own or register an estimator.
local core = require "moonrl.core"
local options = require "moonrl.train.options"
local seedlib = require "moonrl.train.seed"
local tasks = require "moonrl.train.tasks"
local rollout = require "moonrl.train.rollout"
local reward = require "moonrl.train.reward"
local advantage = require "moonrl.train.advantage"
local critic = require "moonrl.train.critic"
local update = require "moonrl.train.update"
local eval = require "moonrl.train.eval"
local log = require "moonrl.train.log"
local checkpoint = require "moonrl.train.checkpoint"
local warmstart = require "moonrl.train.warmstart"
local correction = require "moonrl.train.correction"
local replay = require "moonrl.train.replay"
local diagnostics = require "moonrl.train.diagnostics"
local teacher = require "moonrl.train.teacher"
local paired = require "moonrl.train.paired"
local window = require "moonrl.train.window"
local dist = require "moonrl.train.dist"

local M = {
  options = options, seed = seedlib, tasks = tasks, rollout = rollout, reward = reward,
  advantage = advantage, critic = critic, update = update, eval = eval, log = log,
  checkpoint = checkpoint, warmstart = warmstart, correction = correction, replay = replay,
  teacher = teacher, paired = paired, window = window, diagnostics = diagnostics, dist = dist,
  mix = seedlib.mix, oracle_examples = warmstart.oracle_examples,
  evaluate = eval.run,
}

-- The stage functions of a configuration: the recipe's where it gave one, else the defaults.
-- With several ranks only rank 0 logs and saves (moonrl.train.dist); every rank loads.
local function stages(c)
  local graph = advantage.graph_of(c)
  local s = {
    rollout = c.rollout or rollout.run,
    reward = graph and reward.graph_stage or c.reward or reward.run,
    update = c.update or update.run,
    evaluate = c.evaluate or eval.run,
    log = c.log or log.step,
    checkpoint = c.checkpoint or { save = checkpoint.save, load = checkpoint.load },
  }
  if not dist.lead() then
    s.log = function() end
    s.checkpoint = { save = function() end, load = s.checkpoint.load }
  end
  return s
end

local function needs_reference(c) return c.kl_coef ~= 0 or c.kl_reward_coef ~= 0 or c.reference end

-- The run's context from checked options: what every stage receives as ctx.
--   ctx.cfg (the options with defaults), ctx.model, ctx.tokenizer, ctx.dir (the run folder),
--   ctx.ro (the rollout engine), ctx.stages, ctx.value (the value head, with a critic),
--   ctx.ref (the frozen reference, once loaded), ctx.graph (the reward graph, with reward = g),
--   ctx.state (what state.json holds: history, step, before, sft, reward (the graph's state),
--   ...)
local function context(c)
  local m = c.model
  if c.decode_bf16 then m:decode_bf16(true) end
  local ctx = { cfg = c, model = m, tokenizer = c.tokenizer, stages = stages(c) }
  if c.curriculum then c.env = c.curriculum:wrap_env(c.env) end -- backward starts
  ctx.dir = c.dir .. "/" .. c.name
  local ok, err = core.fs.mkdir(ctx.dir)
  if not ok then error("train: " .. err, 0) end
  ctx.tty = c.progress == true or (c.progress == "auto" and core.fs.isatty(1))
  local per_step = c.tasks_per_step * c.group_size
  local eval_eps = c.eval and c.eval.tasks * math.max(c.eval.k, 1) or 0
  ctx.ro = core.rollout.new { model = m, episodes = math.max(per_step, eval_eps),
    capacity = c.capacity or m:config().ctx }
  if advantage.estimator(c).critic then ctx.value = critic.new(m:config().dim) end
  ctx.graph = advantage.graph_of(c)
  if ctx.graph then -- its judges' cache = true: judge_cache.jsonl (rank 0's; the others' in memory)
    ctx.graph:use_dir(dist.lead() and ctx.dir or nil)
  end
  return ctx
end

-- Why a fresh run may not start in dir (an earlier run's files are there and the recipe did not
-- say overwrite = true), or nil.
local function refusal(c, dir)
  local left = checkpoint.leftovers(dir)
  if #left == 0 or c.overwrite then return nil end
  return string.format("train: %s holds an earlier run (%s): pass overwrite = true to replace "
    .. "it, or resume = true to continue it", dir, table.concat(left, ", "))
end

-- Why the run may not resume from state: the options differ from those it was written with
-- (state.options; a state written before they were kept has none to compare), or nil.
-- resume = "force" continues anyway.
local function mismatch(c, state, dir)
  if c.resume == "force" or type(state.options) ~= "table" then return nil end
  local diff = options.differences(state.options, core.json.decode(core.json.encode(options.record(c))))
  if #diff == 0 then return nil end
  return string.format("train: resume: the options differ from those %s/state.json was written "
    .. "with: %s; resume = \"force\" continues with the new ones", dir, table.concat(diff, ", "))
end

-- Step 0 of a fresh run: the SFT warm start, the frozen reference, the first evaluation and the
-- first checkpoint.
-- What a checkpoint keeps besides the weights: the state of every stateful stage.
local function gather_state(ctx)
  local c = ctx.cfg
  ctx.state.tasks = tasks.state(ctx)
  if c.synth then ctx.state.synth = c.synth:state() end
  if c.replay then ctx.state.replay = c.replay.buffer:state() end
  if ctx.graph then ctx.state.reward = ctx.graph:state() end
end

local function start_fresh(ctx)
  local c = ctx.cfg
  local why = refusal(c, ctx.dir) -- (a checkpoint stage of the recipe's found nothing to resume)
  if why then error(why, 0) end
  dist.barrier() -- every rank has looked at the folder before rank 0 changes it
  if c.overwrite and dist.lead() then checkpoint.clear(ctx.dir) end
  if ctx.graph then ctx.graph:reset() end -- a graph used by an earlier run starts anew
  if c.synth then c.synth:reset() end
  ctx.state = { history = {}, step = 0, options = options.record(c) }
  if c.sft then ctx.state.sft = warmstart.run(ctx) end
  if c.teacher then teacher.init(ctx) end -- TT-OPD: the teacher is the policy after SFT
  if c.remote and c.remote.push_weights then rollout.push_weights(ctx) end -- (the eval's policy)
  if needs_reference(c) and dist.lead() then
    local ok, err = ctx.model:save(ctx.dir .. "/reference")
    if not ok then error("train: reference: " .. err, 0) end
  end
  dist.barrier() -- (the other ranks load the reference rank 0 wrote)
  local first = { step = 0 }
  if c.eval then
    for k, v in pairs(ctx.stages.evaluate(ctx, 0)) do first["eval/" .. k] = v end
  end
  ctx.state.before = first
  ctx.state.history[1] = first
  ctx.stages.log(ctx, 0, first, nil)
  gather_state(ctx)
  ctx.stages.checkpoint.save(ctx, 0)
end

-- A synthesis step's figures as metrics: synth/<name>, synth/invalid/<reason>, synth/learn/<name>.
local function synth_metrics(mt, r)
  for k, v in pairs(r) do
    if type(v) == "number" and k ~= "step" then mt["synth/" .. k] = v end
  end
  local invalid = 0
  for reason, n in pairs(r.invalid) do
    mt["synth/invalid/" .. reason] = n
    invalid = invalid + n
  end
  mt["synth/invalid"] = invalid
  for k, v in pairs(r.learn or {}) do
    if type(v) == "number" then mt["synth/learn/" .. k] = v end
  end
end

-- One RL step: its metrics.
local function step_once(ctx, step)
  local c = ctx.cfg
  local t0 = core.clock()
  local synth_mt = {}
  if c.synth and (step - 1) % c.synth.every == 0 then
    synth_metrics(synth_mt, c.synth:step(ctx, step)) -- before the step's tasks are drawn
    synth_mt["time/synth"] = core.clock() - t0
  end
  local t_start = core.clock()
  local batch, info = rollout.sample(ctx, step)
  local t_roll = core.clock() - t_start
  local mt = { step = step, ["time/rollout"] = t_roll, ["sampling/tries"] = info.tries,
    ["sampling/groups_dropped"] = info.groups_dropped }
  for k, v in pairs(synth_mt) do mt[k] = v end
  -- delayed rewards: pending episodes leave the batch and wait; those resolved now are
  -- backfilled and join the update through the replay draw (moonrl.train.replay)
  local rolled = batch
  if batch and c.delayed then
    local dmt
    batch, dmt = replay.hold(ctx, batch, step)
    for k, v in pairs(replay.resolve(ctx, step, dmt)) do mt[k] = v end
  elseif batch then
    replay.refuse_pending(batch)
  end
  for k, v in pairs(diagnostics.gate_metrics(info.gate)) do mt[k] = v end
  if batch then
    local t_rew = core.clock()
    local terms = batch:size() > 0 and ctx.stages.reward(ctx, batch, step) or {} -- (delayed: all held)
    for _, ep in ipairs(batch.episodes) do -- an endpoint's failure is no score (rl.remote)
      if ep.infra then ep.reward_status = "unscorable" end
    end
    mt["time/reward"] = core.clock() - t_rew
    for k, v in pairs(terms) do mt["reward/" .. k] = v end
    if dist.size() > 1 then dist.check_same(reward.fingerprint(batch), "the step's rewards") end
    if c.kl_reward_coef ~= 0 then mt["reward/kl_penalty"] = -reward.kl_penalty(ctx, batch) end
    for k, v in pairs(tasks.update(ctx, step, batch, info.rejected) or {}) do mt[k] = v end
    local st = batch:stats()
    mt["reward/mean"], mt["reward/std"], mt.success = st.reward_mean, st.reward_std, st.success
    mt.episodes, mt.turns_mean, mt.length_mean = st.episodes, st.turns_mean, st.length_mean
    if c.remote and c.remote.clients then -- the split over endpoints, and where failures were
      for i = 1, #c.remote.clients do
        mt["remote/episodes/" .. i], mt["remote/infra/" .. i] = 0, 0
      end
      for _, ep in ipairs(batch.episodes) do
        local k = ep.endpoint
        if k then
          mt["remote/episodes/" .. k] = mt["remote/episodes/" .. k] + 1
          if ep.infra then mt["remote/infra/" .. k] = mt["remote/infra/" .. k] + 1 end
        end
      end
    end
    mt.turns_max, mt.tool_calls_per_turn = st.turns_max, st.tool_calls_per_turn
    mt.sampled_tokens, mt.zero_variance_groups = st.sampled_tokens, st.zero_variance_groups
    for k, v in pairs(st.ends) do mt["end/" .. k] = v end
    mt.errors = st.errors
    local rc = c.rollout_correction
    if rc and not rc.bypass_mode and batch:size() > 0 then -- before the advantage, which sees the rejection
      for k, v in pairs(correction.decoupled(ctx, batch)) do mt[k] = v end
    end
    local t1 = core.clock()
    -- with replay: episodes from the buffer join the fresh ones (moonrl.train.replay)
    local train_batch, replayed, before = batch, nil, nil
    if c.replay then
      replayed, before = replay.draw(ctx, rolled, step) -- (as many draws as if none were held)
      mt["time/replay"] = core.clock() - t1
    end
    local adv, per_ep, fatal
    if replayed and c.replay.advantages == "stored" then
      local fresh_adv, fresh_per
      fresh_adv, fresh_per, fatal = advantage.compute(ctx, batch)
      train_batch = replay.mix(ctx, batch, replayed)
      adv, per_ep = replay.stored_advantages(fresh_adv, fresh_per, replayed)
    else
      if replayed then train_batch = replay.mix(ctx, batch, replayed) end
      if train_batch:size() > 0 then
        adv, per_ep, fatal = advantage.compute(ctx, train_batch)
      else -- (delayed: every episode held, none resolved)
        adv, per_ep = core.tensor.zeros(1):narrow(1, 1, 0), {}
      end
    end
    if c.delayed then replay.delayed_metrics(replayed, mt) end
    if fatal then mt["fatal/episodes"] = fatal / train_batch:size() end
    for k, v in pairs(train_batch.adv_metrics or {}) do mt[k] = v end -- an estimator's own
    local amax = 0
    for _, v in ipairs(per_ep) do amax = math.max(amax, math.abs(v)) end
    mt["adv/abs_max"] = amax
    mt["adv/utilisation"] = diagnostics.utilisation(train_batch, adv)
    if amax > 0 then
      for k, v in pairs(ctx.stages.update(ctx, train_batch, adv, step)) do
        if type(v) == "number" then mt["loss/" .. k] = v end
      end
      for k, v in pairs(ctx.teacher_metrics or {}) do mt[k] = v end -- teacher/kl_turn_<k>
      ctx.teacher_metrics = nil
      for k, v in pairs(diagnostics.grad_metrics(ctx.state.history, mt, c.grad_spike)) do mt[k] = v end
    else
      mt["loss/updates"] = 0 -- every group had one reward: nothing to learn from
    end
    if c.replay then
      local t3 = core.clock()
      for k, v in pairs(replay.store(ctx, batch, replayed, adv, step, before)) do mt[k] = v end
      mt["time/replay"] = mt["time/replay"] + core.clock() - t3
    end
    mt["time/update"] = core.clock() - t1
    if c.remote and c.remote.push_weights and amax > 0 then
      local t4 = core.clock()
      mt["remote/policy_version"] = rollout.push_weights(ctx)
      mt["time/push"] = core.clock() - t4
    end
    if c.synth then
      local o = c.synth:observe(batch) -- (after the advantage: fatal masks)
      mt["synth/retired_mastered"] = o.retired
      if o.failing then mt["synth/retired_failing"] = o.failing end
    end
    mt.tokens_per_s = st.tokens / math.max(core.clock() - t_start, 1e-9)
  else
    mt.skipped = 1 -- dynamic sampling found no group with different rewards: no update
    for k, v in pairs(tasks.update(ctx, step, nil, info.rejected) or {}) do mt[k] = v end
  end
  if eval.due(c, step) then
    local t2 = core.clock()
    for k, v in pairs(ctx.stages.evaluate(ctx, step)) do mt["eval/" .. k] = v end
    mt["time/eval"] = core.clock() - t2
    local held = mt["eval/greedy_success"]
    if ctx.graph and type(held) == "number" then
      -- the hacking alarm: a term rising while held-out success falls
      for name, on in pairs(ctx.graph:observe(step, held)) do mt["reward/" .. name .. "/alarm"] = on and 1 or 0 end
    end
  end
  mt["time/tasks"] = tasks.seconds(ctx)
  if dist.size() > 1 then mt["time/comm"] = dist.take_seconds() end -- (in the other times too)
  mt["time/step"] = core.clock() - t0
  return mt, batch
end

-- rl.train{...}: see the top of this file.
local function train(opts)
  local c, err = options.check(opts)
  if not c then error("train: " .. err, 2) end -- at the recipe's line
  local dir = c.dir .. "/" .. c.name
  local resuming = false -- whether there is a run to resume (a recipe's checkpoint stage decides)
  if c.resume and c.checkpoint then
    resuming = true
  elseif c.resume then
    local state, serr = checkpoint.read_state(dir)
    if serr then error("train: resume: " .. serr, 2) end
    resuming = state ~= nil
    local why = state and mismatch(c, state, dir)
    if why then error(why, 2) end
  end
  if not resuming then
    local why = refusal(c, dir)
    if why then error(why, 2) end
  end
  local ctx = context(c)
  if dist.size() > 1 then ctx.model:broadcast(0) end -- every rank starts from rank 0's weights
  local state = c.resume and ctx.stages.checkpoint.load(ctx) or nil
  if state then
    if type(state) ~= "table" or math.type(state.step) ~= "integer" or type(state.history) ~= "table" then
      error("train: resume: the checkpoint stage's load returned no state {step =, history =, ...}", 0)
    end
    local why = c.checkpoint and mismatch(c, state, ctx.dir)
    if why then error(why, 0) end
    ctx.state = state
    state.options = options.record(c) -- what the next checkpoint was run with
    tasks.load(ctx, state.tasks)
    -- (a run resumed with resume = "force" and replay newly on starts with the buffer it has)
    if c.replay and state.replay ~= nil then c.replay.buffer:load(state.replay) end
    if ctx.graph and state.reward ~= nil then ctx.graph:load(state.reward) end
    if c.synth and state.synth ~= nil then c.synth:load(state.synth) end
    dist.check_replicas(ctx.model, "after resuming (is the run folder on a file system every rank sees?)")
    if c.remote and c.remote.push_weights then rollout.push_weights(ctx) end
  else
    start_fresh(ctx)
  end
  if needs_reference(c) then
    local ref, rerr = core.model.load(ctx.dir .. "/reference")
    if not ref then error("train: reference: " .. rerr, 0) end
    ctx.ref = ref
  end
  if dist.size() > 1 then -- the curriculum's state: every rank's must be rank 0's
    local st = tasks.state(ctx)
    dist.check_same(st ~= nil and core.json.encode(st) or "", "the curriculum's state at the start")
  end
  ctx.t_start = core.clock()
  dist.take_seconds() -- (time/comm counts from the first step)
  for step = ctx.state.step + 1, c.steps do
    reward.boundary(ctx, step) -- a watched reward file reloads here, between steps
    local mt, batch = step_once(ctx, step)
    ctx.state.history[#ctx.state.history + 1] = mt
    ctx.stages.log(ctx, step, mt, batch)
    if c.on_step then c.on_step(step, mt) end
    local every = c.checkpoint_every or (c.eval and c.eval.every) or 10
    if step % every == 0 or step == c.steps or step == c.stop_after then
      dist.check_replicas(ctx.model, "at step " .. step)
      gather_state(ctx)
      ctx.stages.checkpoint.save(ctx, step)
    end
    if step == c.stop_after then break end
  end
  local last -- the last evaluation's step
  for i = #ctx.state.history, 1, -1 do
    for k in pairs(ctx.state.history[i]) do
      if k:sub(1, 5) == "eval/" then last = ctx.state.history[i] break end
    end
    if last then break end
  end
  ctx.ro:free()
  return { before = ctx.state.before, after = last, history = ctx.state.history, dir = ctx.dir,
    sft = ctx.state.sft }
end

M.train = train
return setmetatable(M, { __call = function(_, opts) return train(opts) end })
