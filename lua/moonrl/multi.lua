-- moonrl.multi (rl.multi): several policies in one run. A multi-agent environment's episodes are
-- turns taken by different agents (a planner and an executor, an orchestrator and its workers),
-- each agent its own model or sharing one; rl.multi.train trains the trainable ones with
-- per-agent (Dr. MAS) or global normalisation and writes an orchestration trace.
--
--   local r = rl.multi.train{
--     env = require "envs.planact",
--     agents = {
--       planner  = { model = m1, tokenizer = tok, trainable = true, lr = 1e-3,
--                    sft = { examples = 400, epochs = 2, lr = 3e-3 } },   -- or false
--       executor = { model = m2, tokenizer = tok, trainable = false },   -- frozen: no step
--     },                                     -- the same model under two names: shared weights
--     advantage = "drmas",                   -- "drmas": groups keyed (prompt, agent); "grpo":
--                                            -- each episode's mean invocation score normalised
--                                            -- over its prompt group, for every agent alike
--     norm_adv_by_std = true, adv_epsilon = 1e-6,
--     name = "planact", dir = "runs", seed = 1, steps = 20, overwrite = false,
--     tasks_per_step = 8, group_size = 8,    -- G multi-agent episodes of each task form a group
--     max_turns = 8,                         -- turns one invocation may take (env.max_turns
--                                            -- [agent] first)
--     max_rounds = 8,                        -- invocations an episode may have (then it
--                                            -- ends, whatever next() says)
--     lr = 1e-3,                             -- each agent's lr unless it gives its own
--     max_turn_tokens = 8, temperature = 1, capacity = nil,
--     eval = { every = 5, tasks = 32 },      -- held-out team success, greedy (or false)
--     trace_episodes = 2,                    -- episodes a step written to trace.jsonl
--     grad_spike = { factor = 3, window = 20, min_steps = 5 },
--     on_step = function(step, metrics) end, progress = false,
--     regroup = { agent = function(rows) -> keys },  -- optional: the group each of an agent's
--                                            -- rows is normalised in (one number or string per
--                                            -- row, e.g. rl.multi.trigram_groups of what the
--                                            -- rows were given) instead of its prompt group;
--                                            -- advantage = "drmas" only
--     -- the update's options, as rl.train's (checked by moonrl.train.options): loss, clip_low,
--     -- clip_high, clip_c, agg, epochs, minibatch, lr, schedule, warmup, min_lr,
--     -- weight_decay, clip_grad, entropy_coef
--   }
-- returns {before = step 0's metrics, after = the last evaluated step's, history =, dir =}.
--
-- The design. One rollout engine (KV cache) serves one model, so an episode is not one token
-- stream but a sequence of *invocations*: in each round the environment names the agent that
-- acts next and what it is given; that agent then runs a sub-episode of one or more turns in its
-- own context (its system message, the observation it was given, its own actions and the
-- observations they got), until the environment says the invocation is done. It never sees the
-- other agents' contexts, only what the environment passes on. Each invocation is one row of
-- that agent's batch (an rl.batch of its own tokens): Dr. MAS's "rows are agent invocations".
-- The rounds run in lockstep over the step's episodes: round r rolls out, for each agent in
-- env.agents order, every episode whose r-th invocation is that agent's, in one ro:run of the
-- agent's model (agents sharing a model share its rollout engine and its update).
--
-- A multi-agent environment module:
--   name, agents = {"planner", "executor"}   (its agents, in order: agent ids 1, 2, ...)
--   tasks(split, n, seed), format ("line" | "hermes"), system (a string, or {agent = string})
--   max_turns = {agent = n}                  optional: each agent's invocation turn limit
--   oracles = {agent = function(task, turns, rng) -> action}   optional (sft): the scripted
--       demonstrator of each agent; turns is the invocation so far, {{given =, returned =},
--       ..., {given = the current observation}}
--   new() -> an instance with
--     reset(task, rng)
--     next(prev) -> agent, observation: who acts next and what it is given; nil: the episode is
--       over. prev is the invocation that just ended ({agent =, turns =, ["end"] =}; nil first)
--     step(agent, action, parsed) -> observation, reward, done, info: done ends the invocation
--     finish() -> {agent = reward}    optional, once the episode is over: each agent's terminal
--       reward, added to every invocation of that agent (at its last turn)
--     success() -> boolean            optional: team success (else: any invocation succeeded)
--
-- Rows. Every invocation's row carries group (the task's prompt group), agent (its agent id),
-- agent_name, traj (the episode's index in the step), round and reward (its turns' rewards plus
-- the agent's finish() reward). Dr. MAS (spec advantage.md 6.4, rl.advantage.drmas): agent-wise,
-- a row's advantage is (S - mean) / (std + eps) over the rows of its (group, agent) (with regroup:
-- its (regroup key, agent)); global, over
-- the episodes of the group of each episode's mean row score, given to all its rows.
--
-- Metrics (metrics.jsonl): success (team), reward/<agent> and reward/<agent>/std (the mean and
-- std of its invocations' rewards), invocations/<agent>, turns/<agent>, tokens/<agent>
-- (sampled), adv/<agent>/abs_max, loss/<u>/<stat> (rl.train's update stats of update unit u: the
-- agent's name, or the names of the trainable agents sharing one model joined by "+"),
-- grad/<u>/spike, grad/<u>/spikes, grad/<u>/norm_median (moonrl.train.diagnostics on that unit's
-- gradient norms), eval/success and eval/reward/<agent>, time/rollout, time/update, time/step.
-- A frozen agent's model is never stepped (its weights and optimizer state stay as they were).
--
-- The orchestration trace (trace.jsonl), one line per traced episode (trace_episodes per step,
-- the first episode of each group, then the second, ...):
--   {step, episode, group, task, success, rewards = {agent = its invocations' summed reward},
--    tokens = {agent = {given =, returned =}},
--    turns = {{turn = 1.., round, agent, invocation = its index in the episode, k = the turn in
--      the invocation, given = the text it was given (the invocation's observation, then the
--      previous turn's), returned = its action, reward, done, tokens = {given =, returned =},
--      end = how the invocation ended, on its last turn: "done", "max_turns", "budget", ...}}}
-- given tokens are the turn's prompt tokens (chat template, system and observation included),
-- returned tokens the sampled ones. Everything is deterministic given the seed.
local core = require "moonrl.core"
local argcheck = require "moonrl.argcheck"
local batchlib = require "moonrl.batch"
local envlib = require "moonrl.env"
local sftlib = require "moonrl.sft"
local options = require "moonrl.train.options"
local seedlib = require "moonrl.train.seed"
local update = require "moonrl.train.update"
local diagnostics = require "moonrl.train.diagnostics"
local log = require "moonrl.train.log"

local mix = seedlib.mix
local describe = argcheck.describe
local M = {}

-- ---------------------------------------------------------------- the environment

-- Checks a multi-agent environment module; raises naming what is wrong.
function M.check_env(env, level)
  level = (level or 1) + 1
  local function need(cond, msg) if not cond then error("rl.multi: env: " .. msg, level) end end
  need(type(env) == "table", "a multi-agent environment (a table) expected, got " .. describe(env))
  need(type(env.name) == "string", "name (a string) is missing")
  need(type(env.new) == "function", "new() is missing")
  need(type(env.tasks) == "function", "tasks() is missing")
  need(argcheck.is_list(env.agents) and #env.agents > 0, "agents: a list of agent names expected")
  local seen = {}
  for i, a in ipairs(env.agents) do
    need(type(a) == "string" and not argcheck.name(a), string.format("agents[%d]: a name expected", i))
    need(not seen[a], "agents: '" .. a .. "' is listed twice")
    seen[a] = true
  end
  need(env.format == nil or env.format == "line" or env.format == "hermes",
    "format must be \"line\" or \"hermes\"")
  return env
end

-- The single-agent environment module an agent's invocations run through: its instance forwards
-- each turn to the multi-agent instance (task.ep.inst) as that agent's.
local View = {}
View.__index = View
function View:reset(task)
  self.t = task
  return task.obs
end
function View:step(action, parsed)
  local t = self.t
  return t.ep.inst:step(t.agent, action, parsed)
end

local function view_env(env, agent)
  return { name = env.name .. "/" .. agent, format = env.format,
    new = function() return setmetatable({}, View) end,
    tasks = function() error("rl.multi: a view environment has no tasks of its own", 2) end }
end

local function system_of(env, agent)
  if type(env.system) == "table" then return env.system[agent] end
  return env.system
end

-- ---------------------------------------------------------------- options

local AGENT_FIELDS = {
  { "model", nil, argcheck.instance_of("moonrl.model", "an rl.model"), required = true },
  { "tokenizer", nil, argcheck.instance_of("moonrl.tokenizer", "an rl.tokenizer"), required = true },
  { "trainable", true, argcheck.boolean },
  { "lr", nil, argcheck.number(0, nil, true) },
  { "sft", false, function(v)
    if v == false or type(v) == "table" then return nil end
    return "false or a table {examples =, epochs =, lr =, batch_size =}"
  end },
}

local SFT_FIELDS = {
  { "examples", 256, argcheck.integer(1) }, { "epochs", 2, argcheck.integer(1) },
  { "batch_size", 16, argcheck.integer(1) }, { "lr", 1e-3, argcheck.number(0, nil, true) },
  { "warmup", 0, argcheck.integer(0) },
}

-- rl.train options the update reads, passed through (moonrl.train.options checks them)
local UPDATE_KEYS = { "loss", "clip_low", "clip_high", "clip_c", "agg", "epochs", "minibatch", "lr",
  "schedule", "warmup", "min_lr", "weight_decay", "clip_grad", "entropy_coef" }

local EVAL_FIELDS = {
  { "every", 5, argcheck.integer(1) }, { "tasks", 32, argcheck.integer(1) },
  { "split", "test", argcheck.string },
}

local function eval_check(v)
  if v == false then return nil end
  if type(v) ~= "table" then return "false or a table {every =, tasks =}" end
  local ok, err = pcall(argcheck.fields, "eval", v, EVAL_FIELDS)
  if ok then return nil end
  return { (tostring(err):gsub("^[^:]*:%d+: ", "")) }
end

local TOP = {
  { "env", nil, function(v)
    local ok, err = pcall(M.check_env, v)
    if ok then return nil end
    return { (tostring(err):gsub("^[^:]*:%d+: ", ""):gsub("^rl%.multi: ", "")) }
  end, required = true },
  { "agents", nil, function(v)
    if type(v) ~= "table" or next(v) == nil then return "a table {name = {model =, tokenizer =, ...}}" end
  end, required = true },
  { "advantage", "drmas", argcheck.one_of { "drmas", "grpo" } },
  { "norm_adv_by_std", true, argcheck.boolean },
  { "adv_epsilon", 1e-6, argcheck.number(0) },
  { "name", "multi", argcheck.name }, { "dir", "runs", argcheck.string },
  { "seed", 1, argcheck.integer() }, { "steps", 20, argcheck.integer(0) },
  { "tasks_per_step", 8, argcheck.integer(1) }, { "group_size", 8, argcheck.integer(1) },
  { "max_turns", 8, argcheck.integer(1) }, { "max_rounds", 8, argcheck.integer(1) },
  { "max_turn_tokens", 16, argcheck.integer(1) }, { "temperature", 1.0, argcheck.number(0) },
  { "capacity", nil, argcheck.integer(16) },
  { "eval", { every = 5, tasks = 32 }, eval_check },
  { "trace_episodes", 2, argcheck.integer(0) },
  { "grad_spike", diagnostics.SPIKE, argcheck.sub("grad_spike", {
    { "factor", 3, argcheck.number(0, nil, true) }, { "window", 20, argcheck.integer(1) },
    { "min_steps", 5, argcheck.integer(1) } }) },
  { "overwrite", false, argcheck.boolean }, { "progress", false, argcheck.boolean },
  { "on_step", nil, argcheck.func },
  { "regroup", nil, function(v)
    if type(v) ~= "table" then return "a table {agent = function(rows) -> a key per row}" end
    for k, f in pairs(v) do
      if type(f) ~= "function" then return "regroup." .. tostring(k) .. ": a function(rows) -> a key per row expected" end
    end
  end },
}
for _, k in ipairs(UPDATE_KEYS) do
  if k ~= "lr" then TOP[#TOP + 1] = { k, nil, function() return nil end } end
end
TOP[#TOP + 1] = { "lr", 1e-3, argcheck.number(0, nil, true) }

-- The checked configuration: the options with defaults, c.agents[name] checked, c.units (the
-- update units: {name =, model =, agents = {names}, cfg = rl.train's resolved options}) and
-- c.engines (one per model: {model =, agents = {names}}).
function M.options(opts, level)
  level = (level or 1) + 1
  local c = argcheck.fields("rl.multi", opts, TOP, level)
  local env = c.env
  if c.eval then c.eval = argcheck.fields("rl.multi: eval", c.eval, EVAL_FIELDS, level) end
  local known = {}
  for _, a in ipairs(env.agents) do known[a] = true end
  for name in pairs(c.agents) do
    if not known[name] then
      local near = argcheck.nearest(tostring(name), env.agents)
      error(string.format("rl.multi: agents: '%s' is not an agent of %s (%s)", tostring(name), env.name,
        near and ("did you mean '" .. near .. "'?") or ("its agents: " .. table.concat(env.agents, ", "))), level)
    end
  end
  local agents = {}
  for _, a in ipairs(env.agents) do
    if c.agents[a] == nil then
      error(string.format("rl.multi: agents: %s's agent '%s' has no model (agents.%s = {model =, tokenizer =})",
        env.name, a, a), level)
    end
    local spec = argcheck.fields("rl.multi: agents." .. a, c.agents[a], AGENT_FIELDS, level)
    if spec.sft then
      spec.sft = argcheck.fields("rl.multi: agents." .. a .. ".sft", spec.sft, SFT_FIELDS, level)
      if type(env.oracles) ~= "table" or type(env.oracles[a]) ~= "function" then
        error(string.format("rl.multi: agents.%s.sft: %s has no oracles.%s(task, turns, rng)", a, env.name, a), level)
      end
    end
    spec.lr = spec.lr or c.lr
    agents[a] = spec
  end
  c.agents = agents
  for a in pairs(c.regroup or {}) do
    if not known[a] then
      error(string.format("rl.multi: regroup: '%s' is not an agent of %s (its agents: %s)", tostring(a), env.name,
        table.concat(env.agents, ", ")), level)
    end
    if c.advantage ~= "drmas" then
      error("rl.multi: regroup: needs advantage = \"drmas\" (the global baseline groups episodes, not rows)", level)
    end
  end
  -- one engine per model; the trainable agents of one model form one update unit
  local engines, by_model = {}, {}
  for id, a in ipairs(env.agents) do
    local spec = agents[a]
    spec.id = id
    local e = by_model[spec.model]
    if not e then
      e = { model = spec.model, agents = {}, tokenizer = spec.tokenizer }
      by_model[spec.model] = e
      engines[#engines + 1] = e
    elseif e.tokenizer ~= spec.tokenizer then
      error(string.format("rl.multi: agents.%s: shares its model with %s but not its tokenizer", a, e.agents[1]), level)
    end
    e.agents[#e.agents + 1] = a
    spec.engine = e
  end
  c.units = {}
  for _, e in ipairs(engines) do
    local train, frozen = {}, {}
    for _, a in ipairs(e.agents) do
      if agents[a].trainable then train[#train + 1] = a else frozen[#frozen + 1] = a end
    end
    if #train > 0 and #frozen > 0 then
      error(string.format("rl.multi: agents.%s: trainable = false, but it shares its model with the "
        .. "trainable agents.%s (a frozen agent's weights never change)", frozen[1], train[1]), level)
    end
    for _, a in ipairs(train) do
      if agents[a].lr ~= agents[train[1]].lr then
        error(string.format("rl.multi: agents.%s.lr: differs from agents.%s.lr, which shares its model",
          a, train[1]), level)
      end
    end
    if #train > 0 then
      local o = { model = e.model, tokenizer = e.tokenizer, env = view_env(env, train[1]), seed = c.seed,
        steps = math.max(c.steps, 1), temperature = c.temperature, max_turn_tokens = c.max_turn_tokens,
        sft = false, eval = false }
      for _, k in ipairs(UPDATE_KEYS) do o[k] = opts[k] end
      o.lr = agents[train[1]].lr
      local cfg, err = options.check(o)
      if not cfg then error("rl.multi: " .. err, level) end
      c.units[#c.units + 1] = { name = table.concat(train, "+"), model = e.model, agents = train, cfg = cfg }
    end
  end
  c.engines = engines
  return c
end

-- ---------------------------------------------------------------- rollout

-- The turns limit of an agent's invocations.
local function turns_of(c, agent)
  local mt = c.env.max_turns
  if type(mt) == "table" and math.type(mt[agent]) == "integer" then return mt[agent] end
  return c.max_turns
end

-- Rolls out #tasks x repeats multi-agent episodes. Returns
--   {episodes = {{task =, group =, index =, success =, invocations = {{agent =, row =}, ...}}, ...},
--    batches = {agent = an rl.batch of its invocations (nil when it never acted)}}
-- ctx: {cfg =, ro = {[model] = rollout engine}}.
function M.rollout(ctx, tasks, repeats, seed, temperature, group_base)
  local c, env = ctx.cfg, ctx.cfg.env
  local eps = {}
  for t, task in ipairs(tasks) do
    for _ = 1, repeats do
      local e = { task = task, group = group_base + t, index = #eps + 1, invocations = {}, inst = env.new() }
      e.inst:reset(task, core.rng(mix(seed, e.index, 1)))
      eps[#eps + 1] = e
    end
  end
  local parts, counts = {}, {}
  for _, a in ipairs(env.agents) do parts[a], counts[a] = {}, 0 end
  local live = #eps
  for round = 1, c.max_rounds + 1 do
    if live == 0 then break end
    local by = {}
    for _, e in ipairs(eps) do
      if not e.over then
        local last = e.invocations[#e.invocations]
        local prev = last and { agent = last.agent, turns = last.ep.turns, ["end"] = last.ep["end"] } or nil
        local agent, obs = e.inst:next(prev)
        if agent ~= nil and round > c.max_rounds then agent = nil end -- (max_rounds reached)
        if agent == nil then
          e.over, live = true, live - 1
        else
          if not c.agents[agent] then
            error(string.format("rl.multi: %s: next() named an unknown agent %s", env.name, describe(agent)), 0)
          end
          if type(obs) ~= "string" then
            error(string.format("rl.multi: %s: next() gave agent %s %s, not an observation string",
              env.name, agent, describe(obs)), 0)
          end
          by[agent] = by[agent] or {}
          local l = by[agent]
          l[#l + 1] = { ep = e, agent = agent, obs = obs }
        end
      end
    end
    for _, a in ipairs(env.agents) do
      local list = by[a]
      if list then
        local spec = c.agents[a]
        local seeds, groups = {}, {}
        for j, v in ipairs(list) do seeds[j], groups[j] = mix(seed, round, v.ep.index, spec.id), v.ep.group end
        local ro = ctx.ro[spec.model]
        local results = ro:run { tokenizer = spec.tokenizer, env = ctx.views[a], tasks = list, seeds = seeds,
          max_turns = turns_of(c, a), max_turn_tokens = c.max_turn_tokens, temperature = temperature,
          system = system_of(env, a) }
        local b = batchlib.from_rollout(ro, results, groups)
        for j, row in ipairs(b.episodes) do
          local e = list[j].ep
          row.task, row.agent, row.agent_name, row.traj, row.round = e.task, spec.id, a, e.index, round
          row.given = list[j].obs
          e.invocations[#e.invocations + 1] = { agent = a, row = counts[a] + j, ep = row }
        end
        counts[a] = counts[a] + b:size()
        parts[a][#parts[a] + 1] = b
      end
    end
  end
  for _, e in ipairs(eps) do
    local fin = e.inst.finish and e.inst:finish() or nil
    if fin ~= nil and type(fin) ~= "table" then
      error(string.format("rl.multi: %s: finish() returned %s, not {agent = reward}", env.name, describe(fin)), 0)
    end
    local any = false
    for _, inv in ipairs(e.invocations) do
      local row, r = inv.ep, fin and fin[inv.agent]
      if r ~= nil then
        if not argcheck.finite(r) then
          error(string.format("rl.multi: %s: finish()'s reward for %s is not a finite number: %s", env.name,
            inv.agent, describe(r)), 0)
        end
        row.reward = row.reward + r
        if row.rewards and #row.rewards > 0 then row.rewards[#row.rewards] = row.rewards[#row.rewards] + r end
        local rec = row.record[#row.record]
        if rec then rec.reward = rec.reward + r end
      end
      any = any or row.success
    end
    if e.inst.success then e.success = e.inst:success() and true or false else e.success = any end
    for _, inv in ipairs(e.invocations) do inv.ep.team_success = e.success end
    e.inst = nil
  end
  local batches = {}
  for _, a in ipairs(env.agents) do
    if #parts[a] > 0 then batches[a] = #parts[a] == 1 and parts[a][1] or batchlib.concat(parts[a]) end
  end
  return { episodes = eps, batches = batches }
end

-- ---------------------------------------------------------------- advantages

-- Per-row advantages of every agent's rows (Dr. MAS agent-wise, or the global baseline):
-- {agent = {value per row}}.
function M.advantages(c, batches)
  local scores, groups, trajs, ids, where = {}, {}, {}, {}, {}
  for _, a in ipairs(c.env.agents) do
    local b = batches[a]
    if b then
      for j, ep in ipairs(b.episodes) do
        local r = #scores + 1
        scores[r], groups[r], trajs[r], ids[r] = { ep.reward }, ep.adv_group or ep.group, ep.traj, ep.agent
        where[r] = { a, j }
      end
    end
  end
  local out = {}
  for _, a in ipairs(c.env.agents) do out[a] = {} end
  if #scores == 0 then return out end
  local mask = {}
  for r = 1, #scores do mask[r] = { 1 } end
  local res = core.advantage.drmas({ token_level_rewards = scores, response_mask = mask, index = groups,
    traj_index = trajs, agent_id = ids }, { agent_wise = c.advantage == "drmas",
    norm_adv_by_std = c.norm_adv_by_std, epsilon = c.adv_epsilon })
  for r, w in ipairs(where) do out[w[1]][w[2]] = res.advantages[r][1] end
  return out
end

-- Sets each row's adv_group (the group its advantage is normalised in) from cfg.regroup[agent]
-- (rows) -> one key (a number or a string) per row, for the agents that have one.
function M.regroup(c, batches)
  for _, a in ipairs(c.env.agents) do
    local f, b = c.regroup and c.regroup[a], batches[a]
    if f and b then
      local keys = f(b.episodes)
      if not argcheck.is_list(keys) or #keys ~= #b.episodes then
        error(string.format("rl.multi: regroup.%s returned %s, not a list of %d keys (one per row)", a, describe(keys),
          #b.episodes), 0)
      end
      for j, k in ipairs(keys) do
        if type(k) ~= "string" and not argcheck.finite(k) then
          error(string.format("rl.multi: regroup.%s: key %d is %s, not a number or a string", a, j, describe(k)), 0)
        end
        b.episodes[j].adv_group = k
      end
    end
  end
end

-- trigram_groups(texts [, threshold = 0.5]) -> one key per text: texts whose byte-trigram sets
-- have a Jaccard similarity >= threshold are linked, and each connected set (single linkage) is
-- keyed by the index of its first text. A text shorter than three bytes is its own trigram.
function M.trigram_groups(texts, threshold)
  if not argcheck.is_list(texts) then error("rl.multi.trigram_groups: texts: a list of strings expected", 2) end
  for i, t in ipairs(texts) do
    if type(t) ~= "string" then error(string.format("rl.multi.trigram_groups: texts[%d]: a string expected", i), 2) end
  end
  threshold = threshold or 0.5
  if not argcheck.finite(threshold) or threshold < 0 or threshold > 1 then
    error("rl.multi.trigram_groups: threshold: a number in [0, 1] expected", 2)
  end
  local sets, sizes = {}, {}
  for i, t in ipairs(texts) do
    local set, n = {}, 0
    for p = 1, math.max(1, #t - 2) do
      local g = t:sub(p, p + 2)
      if not set[g] then set[g], n = true, n + 1 end
    end
    sets[i], sizes[i] = set, n
  end
  local parent = {}
  for i = 1, #texts do parent[i] = i end
  local function root(i)
    while parent[i] ~= i do i = parent[i] end
    return i
  end
  for i = 1, #texts do
    for j = i + 1, #texts do
      local common = 0
      for g in pairs(sets[i]) do if sets[j][g] then common = common + 1 end end
      local union = sizes[i] + sizes[j] - common
      if union > 0 and common / union >= threshold then
        local a, b = root(i), root(j)
        if a ~= b then parent[math.max(a, b)] = math.min(a, b) end
      end
    end
  end
  local out = {}
  for i = 1, #texts do out[i] = root(i) end
  return out
end

-- ---------------------------------------------------------------- SFT

-- The demonstrations of an episode played by the oracles: {agent = {example, ...}}.
local function oracle_episode(env, task, seed, tokenizers, max_turns)
  local inst = env.new()
  inst:reset(task, core.rng(mix(seed, 1)))
  local out, prev, rng = {}, nil, core.rng(mix(seed, 2))
  local views = {}
  for _ = 1, 64 do
    local agent, obs = inst:next(prev)
    if agent == nil then break end
    views[agent] = views[agent] or view_env(env, agent)
    local msgs, turns, record = {}, { { given = obs } }, {}
    local sys = system_of(env, agent)
    if sys then msgs[#msgs + 1] = { role = "system", content = sys } end
    msgs[#msgs + 1] = { role = "user", content = obs }
    local n, done, ended = 0, false, "max_turns"
    local vi = setmetatable({ t = { ep = { inst = inst }, agent = agent } }, View)
    while n < (type(env.max_turns) == "table" and env.max_turns[agent] or max_turns) do
      local action = env.oracles[agent](task, turns, rng)
      n = n + 1
      msgs[#msgs + 1] = { role = "assistant", content = action }
      turns[#turns].returned = action
      local o
      o, _, done = envlib.step(views[agent], vi, action, record)
      if done or o == nil then ended = "done" break end
      msgs[#msgs + 1] = { role = "user", content = o }
      turns[#turns + 1] = { given = o }
    end
    if tokenizers[agent] then
      out[agent] = out[agent] or {}
      out[agent][#out[agent] + 1] = sftlib.example(tokenizers[agent], msgs)
    end
    prev = { agent = agent, turns = n, ["end"] = ended }
  end
  return out
end

-- The SFT examples of the oracles' play of n training tasks (n = the largest
-- agents[a].sft.examples; each agent's first sft.examples invocations): {agent = {examples}}.
-- agents: {name = {sft = {examples =}, tokenizer =}}; max_turns: an invocation's turn limit
-- where env.max_turns gives none (8).
function M.oracle_examples(env, agents, seed, max_turns)
  local n, tokenizers = 0, {}
  for a, spec in pairs(agents) do
    n, tokenizers[a] = math.max(n, spec.sft.examples), spec.tokenizer
  end
  local out = {}
  for a in pairs(agents) do out[a] = {} end
  local tasks = env.tasks("train", n, seed)
  for i, task in ipairs(tasks) do
    for a, list in pairs(oracle_episode(env, task, mix(seed, i), tokenizers, max_turns or 8)) do
      if #out[a] < agents[a].sft.examples then
        for _, ex in ipairs(list) do out[a][#out[a] + 1] = ex end
      end
    end
  end
  return out
end

-- The warm start: each model SFT on the demonstrations of its agents that have sft (with the
-- settings of the first of them in env.agents order). Returns {agent = {examples =, final_loss =}}.
local function warm_start(c)
  local want = {}
  for _, a in ipairs(c.env.agents) do
    if c.agents[a].sft then want[a] = c.agents[a] end
  end
  if next(want) == nil then return nil end
  local data = M.oracle_examples(c.env, want, mix(c.seed, 0xF7), c.max_turns)
  local figures = {}
  for _, e in ipairs(c.engines) do
    local examples, first = {}, nil
    for _, a in ipairs(e.agents) do
      if want[a] then
        first = first or want[a].sft
        for _, ex in ipairs(data[a]) do examples[#examples + 1] = ex end
      end
    end
    if first then
      local r = sftlib.sft { model = e.model, data = examples, epochs = first.epochs, batch_size = first.batch_size,
        lr = first.lr, warmup = first.warmup, seed = mix(c.seed, 0x5F7, #figures + 1) }
      e.model:reset_optimizer()
      for _, a in ipairs(e.agents) do
        if want[a] then figures[a] = { examples = #data[a], final_loss = r.final_loss } end
      end
    end
  end
  return figures
end

-- ---------------------------------------------------------------- the trace

-- {given =, returned =} token counts per turn (1-based) of row i of batch b. The rollout
-- numbers a token by the turn (0-based) whose action it is or whose observation follows it (the
-- prompt is -1): what turn k was given is the tokens numbered k - 2 that it did not sample.
local function turn_tokens(b, i)
  local out = {}
  local a, z = b:range(i)
  for p = a, z do
    local t, sampled = math.floor(b.turns:get(p)), b.mask:get(p) ~= 0
    local k = sampled and t + 1 or t + 2
    out[k] = out[k] or { given = 0, returned = 0 }
    if sampled then out[k].returned = out[k].returned + 1 else out[k].given = out[k].given + 1 end
  end
  return out
end

-- One trace.jsonl record of multi-agent episode e.
function M.trace_record(step, e, batches)
  local turns, rewards, tokens, n = {}, {}, {}, 0
  for k, inv in ipairs(e.invocations) do
    local b, row = batches[inv.agent], inv.ep
    local counts = turn_tokens(b, inv.row)
    rewards[inv.agent] = (rewards[inv.agent] or 0) + row.reward
    local tk = tokens[inv.agent] or { given = 0, returned = 0 }
    tokens[inv.agent] = tk
    local given = row.given
    for j, rec in ipairs(row.record) do
      n = n + 1
      local c = counts[j] or { given = 0, returned = 0 }
      tk.given, tk.returned = tk.given + c.given, tk.returned + c.returned
      turns[n] = { turn = n, round = row.round, agent = inv.agent, invocation = k, k = j, given = given,
        returned = rec.action, reward = rec.reward, done = rec.done, tokens = c,
        ["end"] = j == #row.record and row["end"] or nil }
      given = rec.observation
    end
  end
  return { step = step, episode = e.index, group = e.group, task = e.task, success = e.success,
    rewards = rewards, tokens = tokens, turns = turns }
end

-- The episodes a step traces: the first of each group, then the second, ... up to n.
local function traced(eps, n)
  local by, order = {}, {}
  for _, e in ipairs(eps) do
    if not by[e.group] then by[e.group] = {} order[#order + 1] = e.group end
    table.insert(by[e.group], e)
  end
  local out, k = {}, 1
  while #out < math.min(n, #eps) do
    for _, g in ipairs(order) do
      local e = by[g][k]
      if e and #out < n then out[#out + 1] = e end
    end
    k = k + 1
  end
  return out
end

-- ---------------------------------------------------------------- the loop

local function mean_std(list)
  local n, s = #list, 0
  if n == 0 then return 0, 0 end
  for _, v in ipairs(list) do s = s + v end
  local m, q = s / n, 0
  for _, v in ipairs(list) do q = q + (v - m) ^ 2 end
  return m, n > 1 and math.sqrt(q / (n - 1)) or 0
end

-- Rollout figures: success, reward/<agent>, ... into mt under prefix.
local function rollout_metrics(mt, c, r, prefix)
  local wins = 0
  for _, e in ipairs(r.episodes) do wins = wins + (e.success and 1 or 0) end
  mt[prefix .. "success"] = wins / math.max(#r.episodes, 1)
  for _, a in ipairs(c.env.agents) do
    local b, rewards, turns = r.batches[a], {}, 0
    if b then
      for j, ep in ipairs(b.episodes) do rewards[j], turns = ep.reward, turns + ep.turns end
      mt[prefix .. "reward/" .. a], mt[prefix .. "reward/" .. a .. "/std"] = mean_std(rewards)
      if prefix == "" then
        mt["invocations/" .. a], mt["turns/" .. a] = b:size(), turns / b:size()
        mt["tokens/" .. a] = b.mask:sum()
      end
    end
  end
end

-- Held-out team success (greedy) and each agent's mean reward: eval/... metrics.
function M.evaluate(ctx, step)
  local c = ctx.cfg
  local tasks = c.env.tasks(c.eval.split, c.eval.tasks, mix(c.seed, 0xE7A1))
  local r = M.rollout(ctx, tasks, 1, mix(c.seed, 0xE7A1, 2), 0, 0)
  local mt = {}
  rollout_metrics(mt, c, r, "eval/")
  return mt
end

-- One RL step: its metrics.
local function step_once(ctx, step)
  local c = ctx.cfg
  local t0 = core.clock()
  local tasks = c.env.tasks("train", c.tasks_per_step, mix(c.seed, step))
  local r = M.rollout(ctx, tasks, c.group_size, mix(c.seed, step, 7), c.temperature, 100000)
  local mt = { step = step, ["time/rollout"] = core.clock() - t0 }
  rollout_metrics(mt, c, r, "")
  local t1 = core.clock()
  M.regroup(c, r.batches)
  local values = M.advantages(c, r.batches)
  for _, a in ipairs(c.env.agents) do
    local m = 0
    for _, v in ipairs(values[a]) do m = math.max(m, math.abs(v)) end
    if r.batches[a] then mt["adv/" .. a .. "/abs_max"] = m end
  end
  for _, u in ipairs(c.units) do
    local parts, vals = {}, {}
    for _, a in ipairs(u.agents) do
      if r.batches[a] then
        parts[#parts + 1] = r.batches[a]
        for _, v in ipairs(values[a]) do vals[#vals + 1] = v end
      end
    end
    local amax = 0
    for _, v in ipairs(vals) do amax = math.max(amax, math.abs(v)) end
    local p = "loss/" .. u.name .. "/"
    if #parts == 0 or amax == 0 then
      mt[p .. "updates"] = 0 -- nothing to learn from
    else
      local b = #parts == 1 and parts[1] or batchlib.concat(parts)
      local adv = core.objective.broadcast { values = vals, mask = b.mask, offsets = b.offsets }
      local uctx = { cfg = u.cfg, model = u.model }
      for k, v in pairs(update.run(uctx, b, adv, step)) do
        if type(v) == "number" then mt[p .. k] = v end
      end
      -- the unit's own gradient-norm spikes (moonrl.train.diagnostics on its history)
      local hist = {}
      for i, h in ipairs(ctx.state.history) do
        hist[i] = { ["loss/grad_norm_max"] = h[p .. "grad_norm_max"], ["loss/updates"] = h[p .. "updates"] or 0,
          ["grad/spikes"] = h["grad/" .. u.name .. "/spikes"] }
      end
      local g = diagnostics.grad_metrics(hist, { ["loss/grad_norm_max"] = mt[p .. "grad_norm_max"],
        ["loss/updates"] = mt[p .. "updates"] }, c.grad_spike)
      for k, v in pairs(g) do mt[k:gsub("^grad/", "grad/" .. u.name .. "/")] = v end
    end
  end
  mt["time/update"] = core.clock() - t1
  if c.trace_episodes > 0 then
    local lines = {}
    for _, e in ipairs(traced(r.episodes, c.trace_episodes)) do
      lines[#lines + 1] = core.json.encode(M.trace_record(step, e, r.batches))
    end
    log.append(ctx.dir .. "/trace.jsonl", table.concat(lines, "\n") .. (#lines > 0 and "\n" or ""))
  end
  if c.eval and (step % c.eval.every == 0 or step == c.steps) then
    local t2 = core.clock()
    for k, v in pairs(M.evaluate(ctx, step)) do mt[k] = v end
    mt["time/eval"] = core.clock() - t2
  end
  mt["time/step"] = core.clock() - t0
  return mt
end

local FILES = { "metrics.jsonl", "trace.jsonl" }

-- rl.multi.train{...}: see the top of this file.
function M.train(opts)
  local c = M.options(opts, 2)
  local dir = c.dir .. "/" .. c.name
  for _, f in ipairs(FILES) do
    local h = io.open(dir .. "/" .. f, "r")
    if h then
      h:close()
      if not c.overwrite then
        error(string.format("rl.multi: %s holds an earlier run (%s): pass overwrite = true to replace it", dir, f), 2)
      end
      os.remove(dir .. "/" .. f)
    end
  end
  local ok, err = core.fs.mkdir(dir)
  if not ok then error("rl.multi: " .. err, 2) end
  local n = c.tasks_per_step * c.group_size
  local ctx = { cfg = c, dir = dir, ro = {}, views = {}, state = { history = {} } }
  for _, a in ipairs(c.env.agents) do ctx.views[a] = view_env(c.env, a) end
  for _, e in ipairs(c.engines) do
    ctx.ro[e.model] = core.rollout.new { model = e.model, episodes = math.max(n, c.eval and c.eval.tasks or 0),
      capacity = c.capacity or e.model:config().ctx }
  end
  local sft = warm_start(c)
  local first = { step = 0 }
  if c.eval then
    for k, v in pairs(M.evaluate(ctx, 0)) do first[k] = v end
  end
  ctx.state.history[1] = first
  log.metrics(ctx, first)
  for step = 1, c.steps do
    local mt = step_once(ctx, step)
    ctx.state.history[#ctx.state.history + 1] = mt
    log.metrics(ctx, mt)
    if c.progress then
      io.write(string.format("step %d/%d  success %.2f  %.1f s\n", step, c.steps, mt.success, mt["time/step"]))
    end
    if c.on_step then c.on_step(step, mt) end
  end
  for _, ro in pairs(ctx.ro) do ro:free() end
  local last
  for i = #ctx.state.history, 1, -1 do
    if ctx.state.history[i]["eval/success"] ~= nil then last = ctx.state.history[i] break end
  end
  return { before = first, after = last, history = ctx.state.history, dir = dir, sft = sft }
end

return M
