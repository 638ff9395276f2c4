-- moonrl.train.window (rl.train.window): history windows. A rollout stage in which the policy
-- sees, at each turn, not the whole episode but a prompt made afresh: the last `turns` turns
-- (action and observation) and the current observation (turns = 0: only the current
-- observation, the constant-context agent; an environment that renders a state block into its
-- observations, rl.envkit.state_block, keeps what the episode has found). And an estimator
-- that credits each turn with its episode's advantage.
--
--   local win = rl.train.window.rollout { turns = 2 }
--   rl.train.advantage.register("window", rl.train.window.advantage { base = "grpo" })
--   rl.train { ..., rollout = win, advantage = "window" }
--
-- Why a stage of its own: the rollout engine keeps one KV cache per episode and the trainer
-- scores an episode as one token row, each turn's tokens under everything before them. A
-- windowed prompt changes every turn, so each turn is its own row here: the stage runs the
-- episodes turn by turn, each turn a one-turn rollout (ro:run) of every live episode whose
-- task is its prompt, and steps the real environment instances itself (moonrl.env.step, so
-- tool calls and records are as in the engine's rollout). The batch holds one row per turn:
-- row = the turn's prompt (mask 0) and its sampled tokens (mask 1), scored by the trainer under
-- exactly the context they were sampled in, so the update is on-policy as in a normal rollout.
--
-- A row's batch episode: group, task and seed are its episode's; record = {the turn's record};
-- rewards = {the turn's reward}; window = {episode =, turn =, turns =, last =, return_ =}
-- (episode: its number in the request, return_ the episode's return). The last row of an episode
-- carries the episode's summary: reward = its return, success, turns = its turn count, end,
-- error; every other row has reward 0, success false, turns 0. So sums over rows are sums over
-- episodes: the evaluation stage's greedy success and turns, pass@k and the PASS@(k, T) grid
-- count episodes exactly. Means over rows (the training log's reward/mean, success,
-- turns_mean) are per row, not per episode; batch.window = {episodes =, rows =, success =
-- (per episode), reward_mean = (per episode), prompt_tokens = (mean prompt tokens per turn),
-- turns_mean =} has the per-episode numbers.
--
-- Limits (errors, not silent): dynamic_sampling and a curriculum gate (they compare rows'
-- rewards), tree rollouts, rollout_hooks and forced scoring (info_gain) are for the engine's
-- rollout and are refused; a reward graph would score rows (one turn each), so estimators other
-- than window.advantage see row rewards.
local argcheck = require "moonrl.argcheck"
local core = require "moonrl.core"
local batchlib = require "moonrl.batch"
local envlib = require "moonrl.env"
local sftlib = require "moonrl.sft"
local rollout = require "moonrl.train.rollout"
local seedlib = require "moonrl.train.seed"

local mix = seedlib.mix
local M = {}

-- The default prompt: each shown past turn as "> action" and its observation on the next
-- line, then the current observation.
function M.render(view)
  local parts = {}
  for _, h in ipairs(view.history) do
    parts[#parts + 1] = "> " .. h.action
    if h.observation and h.observation ~= "" then parts[#parts + 1] = h.observation end
  end
  parts[#parts + 1] = view.observation
  return table.concat(parts, "\n")
end

-- A turn's prompt: render's text for the last `o.turns` turns of record and the observation.
local function prompt_of(o, task, turn, record, obs, instance)
  local history = {}
  for t = math.max(1, #record - o.turns + 1), #record do
    history[#history + 1] = { action = record[t].action, observation = record[t].observation }
  end
  local prompt = o.render { task = task, turn = turn, history = history, observation = obs,
    instance = instance }
  if type(prompt) ~= "string" then
    error("rl.train.window: render: a string expected, got " .. argcheck.describe(prompt), 0)
  end
  return prompt
end

-- The one-turn environment a turn's rollout runs: its task is the prompt; its step ends the
-- episode (the stage steps the real environment with the action).
local function view_env(env)
  local Inst = {}
  Inst.__index = Inst
  function Inst:reset(task) return task.prompt end
  function Inst:step() return nil, 0, true end
  return { name = env.name .. "-window", format = "line", system = env.system,
    new = function() return setmetatable({}, Inst) end,
    tasks = function() error("window: the view environment has no tasks", 2) end }
end

-- rollout{turns = 0, render = M.render} -> a rollout stage (ctx, req) -> batch of one row per
-- turn (see the top of the file). render(view) -> the prompt text of a turn, view = {task =,
-- turn = (1-based), history = {{action =, observation =}, ...} (the last `turns` turns, oldest
-- first), observation = (the current one), instance = (the environment's instance)}.
function M.rollout(opts)
  local o = argcheck.fields("rl.train.window.rollout", opts or {}, {
    { "turns", 0, argcheck.integer(0) },
    { "render", M.render, argcheck.func },
  }, 2)
  local envs = setmetatable({}, { __mode = "k" })
  return function(ctx, req)
    local c = ctx.cfg
    if c.dynamic_sampling or (c.curriculum and c.curriculum.gate) then
      error("rl.train.window: dynamic_sampling and curriculum gates compare rows' rewards; not supported", 0)
    end
    if req.tree or req.hooks or req.forced then
      error("rl.train.window: tree, rollout_hooks and info_gain need the engine's rollout; not supported", 0)
    end
    if c.remote then error("rl.train.window: the remote option is not supported", 0) end
    local view = envs[c.env]
    if not view then
      view = view_env(c.env)
      envs[c.env] = view
    end
    -- the episodes: each task `repeats` times, seeded as the default stage seeds them
    local eps = {}
    for t, task in ipairs(req.tasks) do
      for _ = 1, req.repeats do
        local k = #eps + 1
        local e = { task = task, seed = mix(req.seed, k), group = req.group_base + t,
          horizon = rollout.horizon(c, task), record = {}, rows = {}, ret = 0 }
        e.instance = c.env.new()
        local ok, obs = pcall(e.instance.reset, e.instance, task, core.rng(e.seed))
        if not ok or type(obs) ~= "string" then
          e["end"], e.error = "env_error", ok and "reset returned no observation string" or tostring(obs)
        else
          e.obs = obs
        end
        eps[k] = e
      end
    end
    local parts, prompt_tokens, nrows = {}, 0, 0
    for turn = 1, math.huge do
      local live = {}
      for _, e in ipairs(eps) do
        if not e["end"] then live[#live + 1] = e end
      end
      if #live == 0 then break end
      local tasks, seeds, groups = {}, {}, {}
      for j, e in ipairs(live) do
        local prompt = prompt_of(o, e.task, turn, e.record, e.obs, e.instance)
        tasks[j], seeds[j], groups[j] = { prompt = prompt }, mix(e.seed, turn), e.group
      end
      local res = ctx.ro:run { tokenizer = ctx.tokenizer, env = view, tasks = tasks, seeds = seeds,
        max_turns = 1, max_turn_tokens = c.max_turn_tokens, temperature = req.temperature,
        top_k = c.top_k, top_p = c.top_p, min_p = c.min_p, system = c.system,
        batch_invariant = c.batch_invariant }
      local part = batchlib.from_rollout(ctx.ro, res, groups)
      local sampled = part:sampled_counts()
      for j, e in ipairs(live) do
        local row = part.episodes[j]
        local r = res[j].record[1]
        local action = r and r.action or ""
        local ok, obs, reward, done = true, nil, 0, true
        if res[j]["end"] == "budget" then
          -- the context could not hold the prompt and a whole turn: the environment is not
          -- stepped with a cut action
          e["end"] = "budget"
          e.record[#e.record + 1] = { action = action, reward = 0, done = true }
        else
          ok, obs, reward, done = pcall(envlib.step, c.env, e.instance, action, e.record)
          if not ok then
            e["end"], e.error = "env_error", tostring(obs)
            e.record[#e.record + 1] = { action = action, reward = 0, done = true }
            obs, reward = nil, 0
          elseif done then
            e["end"] = "done"
          elseif #e.record >= e.horizon then
            e["end"] = "max_turns"
          end
        end
        e.ret = e.ret + reward
        e.obs = obs
        prompt_tokens = prompt_tokens + row.length - sampled[j]
        nrows = nrows + 1
        row.task, row.seed, row.group = e.task, e.seed, e.group
        row.record = { e.record[#e.record] }
        row.rewards, row.reward, row.success, row.turns = { reward }, 0, false, 0
        row["end"], row.error, row.env_info = nil, nil, nil
        row.window = { turn = turn }
        e.rows[#e.rows + 1] = row
      end
      parts[#parts + 1] = part
    end
    local succ, sum = 0, 0
    for k, e in ipairs(eps) do
      local last = e.record[#e.record]
      local success
      if last and type(last.info) == "table" and last.info.success ~= nil then
        success = last.info.success and true or false
      else
        success = e.ret > 0
      end
      succ, sum = succ + (success and 1 or 0), sum + e.ret
      for t, row in ipairs(e.rows) do
        row.window.episode, row.window.turns, row.window.return_ = k, #e.rows, e.ret
        row.window.last = t == #e.rows
        row["end"] = e["end"]
      end
      local final = e.rows[#e.rows]
      if final then
        final.reward, final.success, final.turns, final.error = e.ret, success, #e.rows, e.error
        local info, err = batchlib.env_info(e.instance)
        final.env_info = info
        if err then final["end"], final.error = "env_error", final.error or err end
      end
    end
    if #parts == 0 then
      error("rl.train.window: no episode could start: " .. tostring(eps[1] and eps[1].error), 0)
    end
    local b = batchlib.concat(parts)
    b.window = { episodes = #eps, rows = nrows, success = #eps > 0 and succ / #eps or 0,
      reward_mean = #eps > 0 and sum / #eps or 0,
      prompt_tokens = nrows > 0 and prompt_tokens / nrows or 0,
      turns_mean = #eps > 0 and nrows / #eps or 0 }
    return b
  end
end

local function is_tokenizer(v)
  if type(v) == "userdata" or type(v) == "table" then return nil end
  return "a tokenizer"
end

-- examples{env =, tokenizer =, n =, seed =, turns = 0, render = M.render, oracle = env.oracle,
-- system = env.system, max_turns = env.max_turns or 4} -> step-level SFT examples
-- ({tokens =, mask =}, one per turn): n training tasks (env.tasks("train", n, seed)), each
-- oracle demonstration replayed through the environment (reset with rl.rng(mix(seed, i, 1)), the
-- oracle given rl.rng(mix(seed, i))), every turn a one-turn chat of the prompt the rollout
-- stage with the same turns and render would show and the oracle's action. So the warm start
-- teaches the policy the context it will act in.
function M.examples(opts)
  local o = argcheck.fields("rl.train.window.examples", opts, {
    { "env", nil, argcheck.table, required = true },
    { "tokenizer", nil, is_tokenizer, required = true },
    { "n", nil, argcheck.integer(1), required = true },
    { "seed", nil, argcheck.integer(), required = true },
    { "turns", 0, argcheck.integer(0) },
    { "render", M.render, argcheck.func },
    { "oracle", nil, argcheck.func },
    { "system", nil, argcheck.string },
    { "max_turns", nil, argcheck.integer(1) },
  }, 2)
  local env = o.env
  local oracle = o.oracle or env.oracle
  if type(oracle) ~= "function" then
    argcheck.fail("rl.train.window.examples", "oracle: the environment has no oracle(task, rng); give one", 2)
  end
  local system, max_turns = o.system or env.system, o.max_turns or env.max_turns or 4
  local out = {}
  for i, task in ipairs(env.tasks("train", o.n, o.seed)) do
    local actions = oracle(task, core.rng(mix(o.seed, i)))
    local inst, record = env.new(), {}
    local obs = inst:reset(task, core.rng(mix(o.seed, i, 1)))
    for turn, action in ipairs(actions) do
      if turn > max_turns or obs == nil then break end
      local msgs = {}
      if system then msgs[1] = { role = "system", content = system } end
      msgs[#msgs + 1] = { role = "user", content = prompt_of(o, task, turn, record, obs, inst) }
      msgs[#msgs + 1] = { role = "assistant", content = action }
      out[#out + 1] = sftlib.example(o.tokenizer, msgs)
      local _, done
      obs, _, done = envlib.step(env, inst, action, record)
      if done then break end
    end
  end
  return out
end

-- advantage{base = "grpo"} -> an estimator (ctx, batch) -> adv, per_row: the base method
-- (rl.objective.advantage's: grpo, drgrpo, rloo, ...) over the episodes of the rows' groups,
-- each episode scored by its return less its rows' KL penalties; every sampled token of each of
-- an episode's rows gets the episode's value. A batch with rows of no window stage is an error.
function M.advantage(opts)
  local o = argcheck.fields("rl.train.window.advantage", opts or {}, {
    { "base", "grpo", argcheck.string },
  }, 2)
  return function(ctx, batch)
    local index, scores, groups, counts, of = {}, {}, {}, {}, {}
    local sampled = batch:sampled_counts()
    for i, ep in ipairs(batch.episodes) do
      local w = ep.window
      if type(w) ~= "table" or not w.episode then
        error("rl.train.window.advantage: batch row " .. i .. " is not from rl.train.window.rollout", 0)
      end
      local key = ep.group .. ":" .. w.episode
      local k = index[key]
      if not k then
        k = #scores + 1
        index[key] = k
        scores[k], groups[k], counts[k] = w.return_, ep.group, 0
      end
      scores[k] = scores[k] - (ep.kl_penalty or 0)
      counts[k] = counts[k] + sampled[i]
      of[i] = k
    end
    local per_row = {}
    if #scores > 0 then
      local a = core.objective.advantage { method = o.base, scores = scores, groups = groups,
        counts = counts, epsilon = ctx.cfg.adv_epsilon }
      for i = 1, #of do per_row[i] = a[of[i]] end
    end
    return core.objective.broadcast { values = per_row, mask = batch.mask, offsets = batch.offsets }, per_row
  end
end

return M
