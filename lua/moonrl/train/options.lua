-- moonrl.train.options: rl.train's options: every known key with its default and its check, the
-- resolved configuration the stages read (ctx.cfg), and the nearest known key for a misspelt one.
--
-- M.check(opts) -> cfg, or nil and a message naming the option ("steps: a positive integer
-- expected, got 0", "unknown option 'lr_rate' (did you mean 'lr'?)"); rl.train raises it at
-- the recipe's line. Nothing is written or run before every check has passed.
local argcheck = require "moonrl.argcheck"
local envlib = require "moonrl.env"
local advantage = require "moonrl.train.advantage"

local M = {}

-- ---------------------------------------------------------------- checks (moonrl.argcheck)

local describe, finite = argcheck.describe, argcheck.finite
M.describe, M.distance, M.nearest = describe, argcheck.distance, argcheck.nearest
local integer, number, enum, kind = argcheck.integer, argcheck.number, argcheck.one_of, argcheck.kind
local boolean, func, str = argcheck.boolean, argcheck.func, argcheck.string
local list_of, instance_of = argcheck.list_of, argcheck.instance_of

-- Unknown keys of t (a list of messages, sorted), given the known names in order; prefix names
-- the table ("" or "sft.").
local function unknown_keys(t, fields, order, prefix)
  local bad = {}
  for k in pairs(t) do
    if type(k) ~= "string" then
      bad[#bad + 1] = string.format("%soptions are named (key = value), got a value at [%s]",
        prefix ~= "" and prefix:sub(1, -2) .. ": " or "", tostring(k))
    elseif not fields[k] then
      local near = M.nearest(k, order)
      bad[#bad + 1] = string.format("unknown option '%s%s'%s", prefix, k,
        near and string.format(" (did you mean '%s%s'?)", prefix, near) or "")
    end
  end
  table.sort(bad)
  return bad
end

-- ---------------------------------------------------------------- sub-tables

-- A table option's fields: name -> {default, check, required}.
local function fields(list)
  local spec, order = {}, {}
  for _, f in ipairs(list) do
    spec[f[1]] = { default = f[2], check = f[3], required = f.required }
    order[#order + 1] = f[1]
  end
  return { spec = spec, order = order }
end

local SUB = {
  sft = fields {
    { "examples", 256, integer(1) }, { "epochs", 2, integer(1) }, { "batch_size", 16, integer(1) },
    { "lr", 1e-3, number(0) }, { "schedule", "cosine", enum { "constant", "cosine" } },
    { "warmup", 0, integer(0) }, { "weight_decay", 0, number(0) },
  },
  eval = fields {
    { "every", 5, integer(1) }, { "tasks", 32, integer(1) }, { "k", 4, integer(1) },
    { "temperature", 1.0, number(0) }, { "split", "test", str }, { "seed", 12345, integer() },
  },
  tree = fields { { "turn", nil, integer(1), required = true }, { "k", nil, integer(2), required = true } },
  milestone = fields {
    { "gamma", nil, number() }, { "scale", nil, number() }, { "weight", nil, number() },
    { "mode", nil, enum { "mean_norm", "mean_std_norm" } },
  },
  fatal = fields { { "threshold", nil, integer(1) }, { "drop", nil, boolean } },
  overlong = fields {
    { "max_len", nil, integer(1), required = true }, { "buffer", nil, integer(1), required = true },
    { "factor", nil, number() }, { "floor", nil, boolean },
  },
  checkpoint = fields { { "save", nil, func, required = true }, { "load", nil, func, required = true } },
  -- verl's RolloutCorrectionConfig, its field names kept
  rollout_correction = fields {
    { "rollout_is", nil, enum { "token", "sequence" } },
    { "rollout_is_threshold", 2.0, function(v)
      if (type(v) == "number" and v > 0) or type(v) == "string" then return nil end
      return "a positive number or a string \"U\" / \"L_U\""
    end },
    { "rollout_is_batch_normalize", false, boolean },
    { "rollout_rs", nil, function(v)
      if type(v) == "string" or list_of(str, "")(v) == nil then return nil end
      return "a string of criteria (\"token_k1,seq_mean_k3\") or a list of them"
    end },
    { "rollout_rs_threshold", nil, function(v)
      if type(v) == "number" or type(v) == "string" then return nil end
      if list_of(function(x)
        return not (type(x) == "number" or type(x) == "string") and "x" or nil
      end, "")(v) == nil then return nil end
      return "a number, a string or a list of them"
    end },
    { "bypass_mode", false, boolean },
    { "loss_type", "ppo_clip", enum { "ppo_clip", "reinforce" } },
  },
  gdpo = fields {
    { "terms", nil, list_of(str, "a list of reward-term names") },
    { "weights", nil, list_of(number(), "a list of numbers") },
  },
  remote = fields {
    { "client", nil, function(v) return require("moonrl.remote").client_check(v) end },
    { "clients", nil, function(v) return require("moonrl.remote").clients_check(v) end },
    { "push_weights", false, boolean },
  },
  otb = fields { { "handle_zero_tail", true, boolean }, { "epsilon", 1e-8, number(0) } },
  -- information gain for advantage = "a2tgpo" / "igpo": answer(task) -> the text forced after
  -- each turn (moonrl.train.rollout); A2TGPO's alpha (IG weight), beta (clip scale), gamma
  info_gain = fields {
    { "answer", nil, func, required = true }, { "kind", "logprob", enum { "logprob", "prob" } },
    { "alpha", 0.3, number() }, { "beta", 0.3, number(0, 1) }, { "gamma", 1.0, number(0, 1) },
  },
  -- moonrl.train.diagnostics.SPIKE's defaults
  grad_spike = fields { { "factor", 3, number(1) }, { "window", 20, integer(1) },
    { "min_steps", 5, integer(1) } },
  replay = fields {
    { "buffer", nil, function(v)
      if M.is_buffer(v) then return nil end
      return "a replay buffer (rl.replay.new{...}: add, sample, update, state, load)"
    end, required = true },
    { "ratio", 0.5, number(0) },
    { "advantages", "recompute", enum { "recompute", "stored" } },
    { "correction", true, boolean },
  },
  -- delayed rewards (moonrl.train.replay): pending episodes wait in the replay buffer
  delayed = fields {
    { "resolve", nil, func },
    { "mode", "backfill", enum { "backfill", "discard" } },
    { "max_wait", nil, integer(1) },
  },
  -- TT-OPD (moonrl.train.teacher)
  teacher = fields {
    { "privileged", nil, func, required = true },
    { "decay", 0.99, number(0, 1) },
    { "coef", 1.0, number(0) },
    { "kl", "k1", enum(require("moonrl.core").objective.names().kl) },
    { "weights", nil, function(v)
      if type(v) == "function" or list_of(number(0), "")(v) == nil then return nil end
      return "a list of per-turn weights (numbers >= 0) or a function(episode) -> such a list"
    end },
    { "truncate", nil, integer(1) },
  },
}

-- Whether v is a replay buffer: an object with add, sample, update, state and load.
function M.is_buffer(v)
  if type(v) ~= "table" then return false end
  for _, m in ipairs { "add", "sample", "update", "state", "load" } do
    if type(v[m]) ~= "function" then return false end
  end
  return true
end

-- Checks table option `name` (a table) against its fields; returns the table with defaults filled
-- in, or nil, message.
local function sub_table(name, t)
  local f = SUB[name]
  local bad = unknown_keys(t, f.spec, f.order, name .. ".")
  if #bad > 0 then return nil, table.concat(bad, "; ") end
  local out = {}
  for _, k in ipairs(f.order) do
    local spec, v = f.spec[k], t[k]
    if v == nil then
      if spec.required then
        return nil, string.format("%s.%s: %s expected (it is required)", name, k, spec.check(nil))
      end
      v = spec.default
    else
      local want = spec.check(v)
      if want then return nil, string.format("%s.%s: %s expected, got %s", name, k, want, describe(v)) end
    end
    out[k] = v
  end
  return out
end

-- ---------------------------------------------------------------- the options

local function table_of(name, what)
  return function(v)
    if type(v) ~= "table" then return what end
    local _, err = sub_table(name, v)
    return err and { err } or nil -- a full message (in a table), not a description
  end
end

local function env_check(v)
  local ok, err = pcall(envlib.check, v)
  if ok then return nil end
  return { (tostring(err):gsub("^[^:]*:%d+: ", "")) }
end

local function advantage_check(v)
  if type(v) == "function" or (type(v) == "string" and advantage.get(v)) then return nil end
  if type(v) == "string" then
    local near = M.nearest(v, advantage.names())
    return { string.format("advantage: unknown estimator '%s'%s (registered: %s)", v,
      near and string.format(" (did you mean '%s'?)", near) or "", table.concat(advantage.names(), ", ")) }
  end
  return "a registered estimator's name or a function(ctx, batch) -> adv, per_episode"
end

local RESERVED_TERMS = { env = true, overlong = true, kl_penalty = true, mean = true, std = true }

-- rewards: {name = function(episode)} (summed in name order) or a list of {name =, fn =} (in
-- list order).
local function rewards_check(v)
  if type(v) ~= "table" then return "a table {name = function(episode)} or a list {{name =, fn =}}" end
  local seen = {}
  local function term(name, fn, where)
    if type(name) ~= "string" or not name:match("^[%w_.%-]+$") then
      return { string.format("rewards%s: a name of letters, digits, '_', '.', '-' expected, got %s",
        where, describe(name)) }
    end
    if RESERVED_TERMS[name] then
      return { string.format("rewards%s: '%s' is a built-in term's name", where, name) }
    end
    if seen[name] then return { string.format("rewards%s: '%s' appears twice", where, name) } end
    seen[name] = true
    if type(fn) ~= "function" then
      return { string.format("rewards%s: a function(episode) -> number expected, got %s", where,
        describe(fn)) }
    end
  end
  if #v > 0 then
    for i = 1, #v do
      local e = v[i]
      if type(e) ~= "table" then
        return { string.format("rewards[%d]: {name =, fn =} expected, got %s", i, describe(e)) }
      end
      for k in pairs(e) do
        if k ~= "name" and k ~= "fn" then
          return { string.format("rewards[%d]: unknown option '%s' (known: name, fn)", i, tostring(k)) }
        end
      end
      local err = term(e.name, e.fn, "[" .. i .. "]")
      if err then return err end
    end
    for k in pairs(v) do
      if math.type(k) ~= "integer" or k < 1 or k > #v then
        return { "rewards: either a list {{name =, fn =}, ...} or a table {name = fn}, not both" }
      end
    end
    return nil
  end
  for name, fn in pairs(v) do
    local err = term(name, fn, "." .. tostring(name))
    if err then return err end
  end
  return nil
end

-- A reward graph (rl.reward.graph); the reward module is not required here (it requires this one).
local function is_graph(v)
  local mt = getmetatable(v)
  return type(v) == "table" and type(mt) == "table" and mt.__name == "moonrl.reward.graph"
end

local function reward_check(v)
  if type(v) == "function" or is_graph(v) then return nil end
  return "an rl.reward graph or a function(ctx, batch, step) -> terms (the reward stage)"
end

local function tasks_check(v)
  if type(v) == "function" then return nil end
  if type(v) == "table" and type(v.sample) == "function" then
    for _, m in ipairs { "update", "state", "load" } do
      if v[m] ~= nil and type(v[m]) ~= "function" then
        return { string.format("tasks.%s: a function expected, got %s", m, describe(v[m])) }
      end
    end
    return nil
  end
  return "a function(ctx, step, n, seed) -> tasks or an object with :sample(ctx, step, n, seed)"
end

local function curriculum_check(v)
  local mt = getmetatable(v)
  if type(v) == "table" and type(mt) == "table" and mt.__name == "moonrl.curriculum" then return nil end
  return "an rl.curriculum (rl.curriculum.new{...})"
end

local function synth_check(v)
  local mt = getmetatable(v)
  if type(v) == "table" and type(mt) == "table" and mt.__name == "moonrl.synth.loop" then return nil end
  return "an rl.synth.loop{...}"
end

-- rollout_hooks: the rollout stage's hooks, passed to ro:run (README "Rollout hooks"); fork_room
-- is how many episodes beyond the step's the forks of on_turn may add (default: as many again).
local HOOK_FIELDS = {
  { "on_turn", nil, func }, { "on_branches", nil, func }, { "on_action", nil, func },
  { "max_resamples", 1, integer(1) }, { "fork_room", nil, integer(1) },
  { "gate", nil, argcheck.sub("gate", {
    { "turn", nil, integer(1), required = true }, { "d_low", nil, number() },
    { "t_high", nil, number() }, { "finish", false, boolean }, { "fn", nil, func },
  }) },
}

local function hooks_check(v)
  if type(v) ~= "table" then
    return "a table {on_turn =, on_branches =, on_action =, max_resamples =, gate =, fork_room =}"
  end
  local ok, err = pcall(argcheck.fields, "rollout_hooks", v, HOOK_FIELDS)
  if not ok then return { (tostring(err):gsub("^[^:]*:%d+: ", "")) } end
  local g = v.gate
  if g and g.fn and (g.d_low or g.t_high) then
    return { "rollout_hooks: gate: d_low and t_high are the built-in gate's; give them or fn" }
  end
  return nil
end

local function either(...)
  local checks = { ... }
  return function(v)
    local wants = {}
    for i, c in ipairs(checks) do
      local want = c(v)
      if not want then return nil end
      if type(want) == "table" then return want end -- the right kind, wrong contents: say which
      wants[i] = want
    end
    return table.concat(wants, " or ")
  end
end
local function literal(x, what) return function(v) if v == x then return nil end return what end end

-- The options, in the order they are checked (and suggested). default: a value, or a function
-- of the options resolved so far.
local TOP, ORDER = {}, {}
local function opt(key, default, check, required)
  TOP[key] = { default = default, check = check, required = required }
  ORDER[#ORDER + 1] = key
end

-- The losses, aggregation modes and KL estimators are rl.objective's (one list, in C).
local NAMES = require("moonrl.core").objective.names()
local PG_LOSSES, AGGS, KLS = NAMES.loss, NAMES.agg, NAMES.kl

-- what to train, where
opt("model", nil, instance_of("moonrl.model", "an rl.model"), true)
opt("tokenizer", nil, instance_of("moonrl.tokenizer", "an rl.tokenizer"), true)
opt("env", nil, env_check, true)
opt("name", function(c) return c.env.name end, function(v)
  if type(v) == "string" and v:match("^[%w_.%-]+$") then return nil end
  return "letters, digits, '_', '.', '-'"
end)
opt("dir", "runs", str)
opt("seed", 0, integer())
-- the batch
opt("steps", 20, integer(1))
opt("tasks_per_step", 8, integer(1))
opt("group_size", 8, integer(1))
opt("max_turns", function(c) return c.env.max_turns or 4 end, integer(1))
opt("max_turn_tokens", 16, integer(1))
opt("temperature", 1.0, number(0))
opt("top_k", nil, integer(0))
opt("top_p", nil, number(0, 1))
opt("min_p", nil, number(0, 1))
opt("system", nil, str)
opt("capacity", nil, integer(1))
opt("dynamic_sampling", false, either(boolean, literal("reward", "\"reward\"")))
opt("max_sampling_tries", 4, integer(1))
opt("tree", nil, table_of("tree", "a table {turn =, k =}"))
opt("rollout_hooks", nil, hooks_check)
opt("batch_invariant", false, boolean)
opt("decode_bf16", false, boolean)
opt("remote", nil, table_of("remote", "a table {client = | clients =, push_weights =}"))
-- rewards
opt("reward", nil, reward_check)
opt("rewards", nil, rewards_check)
opt("overlong", nil, table_of("overlong", "a table {max_len =, buffer =, factor =, floor =}"))
opt("kl_reward_coef", 0, number(0))
-- replay: a buffer, or {buffer =, ratio =, advantages =, correction =} (moonrl.train.replay)
opt("replay", nil, either(function(v) if M.is_buffer(v) then return nil end return "a replay buffer" end,
  table_of("replay", "a table {buffer =, ratio =, advantages =, correction =}")))
-- delayed rewards: {resolve =, mode = "backfill" | "discard", max_wait =} (moonrl.train.replay)
opt("delayed", nil, table_of("delayed", "a table {resolve =, mode =, max_wait =}"))
-- advantages
opt("advantage", function(c)
  return (is_graph(c.reward) and c.reward.combine == "per_term") and "gdpo" or "grpo"
end, advantage_check)
opt("gamma", 1.0, number(0, 1))
opt("lam", 1.0, number(0, 1))
opt("step_weight", 1.0, number())
opt("gigpo_mode", nil, enum { "mean", "mean_std" })
opt("adv_epsilon", nil, number(0))
opt("milestone", nil, table_of("milestone", "a table {gamma =, scale =, weight =, mode =}"))
opt("fatal", nil, either(boolean, table_of("fatal", "a table {threshold =}")))
opt("gdpo", nil, table_of("gdpo", "a table {terms =, weights =}"))
opt("otb", nil, table_of("otb", "a table {handle_zero_tail =, epsilon =}"))
opt("info_gain", nil, table_of("info_gain", "a table {answer =, kind =, alpha =, beta =, gamma =}"))
-- the loss and the update
opt("loss", function(c) return c.advantage == "a2tgpo" and "a2tgpo" or "ppo" end, enum(PG_LOSSES))
opt("agg", "token-mean", enum(AGGS))
opt("agg_norm", nil, number(0))
opt("clip_low", nil, number(0))
opt("clip_high", nil, number(0))
opt("clip_c", nil, number(0))
opt("tau_pos", nil, number(0))
opt("tau_neg", nil, number(0))
opt("clip_cov_ratio", nil, number(0))
opt("clip_cov_lb", nil, number())
opt("clip_cov_ub", nil, number())
opt("kl_cov_ratio", nil, number(0))
opt("ppo_kl_coef", nil, number())
opt("dro_beta", nil, number(0))
opt("rollout_correction", nil, table_of("rollout_correction", "a table {rollout_is =, "
  .. "rollout_is_threshold =, rollout_rs =, rollout_rs_threshold =, bypass_mode =, loss_type =}"))
opt("kl_coef", 0, number(0))
opt("kl", "k3", enum(KLS))
opt("reference", false, boolean)
opt("entropy_coef", 0, number())
opt("teacher", nil, table_of("teacher", "a table {privileged =, decay =, coef =, kl =, weights =, truncate =}"))
opt("epochs", 1, integer(1))
opt("minibatch", function(c) return c.tasks_per_step * c.group_size end, integer(1))
opt("lr", 2e-4, number(0))
opt("schedule", "constant", enum { "constant", "cosine" })
opt("warmup", 0, integer(0))
opt("min_lr", 0, number(0))
opt("weight_decay", 0, number(0))
opt("clip_grad", 1.0, number(0))
opt("beta1", 0.9, number(0, 1, "hi"))
opt("beta2", 0.95, number(0, 1, "hi"))
-- the critic
opt("value_coef", 0.5, number(0))
opt("value_clip", 0.5, number(0))
opt("value_lr", nil, number(0))
-- SFT warm start and evaluation
opt("sft", nil, either(literal(false, "false"), table_of("sft", "a table {examples =, epochs =, ...}")))
opt("eval", function() return {} end,
  either(literal(false, "false"), table_of("eval", "a table {every =, tasks =, k =, ...}")))
-- the stages
opt("tasks", nil, tasks_check)
opt("synth", nil, synth_check)
opt("curriculum", function(c) return c.synth and c.synth.pool or nil end, curriculum_check)
opt("rollout", nil, func)
opt("update", nil, func)
opt("evaluate", nil, func)
opt("log", nil, func)
opt("checkpoint", nil, table_of("checkpoint", "a table {save = function(ctx, step), load = function(ctx)}"))
-- the run
opt("resume", false, either(boolean, literal("force", "\"force\"")))
opt("overwrite", false, boolean)
opt("stop_after", nil, integer(1))
opt("checkpoint_every", nil, integer(1))
opt("progress", "auto", either(boolean, literal("auto", "\"auto\"")))
opt("plot", true, boolean)
opt("log_episodes", 2, integer(0))
opt("grad_spike", function() return {} end,
  table_of("grad_spike", "a table {factor =, window =, min_steps =}"))
opt("on_step", nil, func)

M.known = ORDER

-- ---------------------------------------------------------------- the options in state.json

-- Options that say how to run, not what is trained: a resumed run may change them.
local RUN_CONTROL = { model = true, tokenizer = true, dir = true, name = true, resume = true,
  overwrite = true, stop_after = true, checkpoint_every = true, progress = true, plot = true,
  log_episodes = true, on_step = true, log = true, grad_spike = true }

-- The configuration as JSON-ready data (state.json's "options"): numbers, strings, booleans and
-- the table options as they are; the environment by its name; reward terms by their names in
-- the order they are added; functions and objects (stages of the recipe's) as "<function>" and
-- "<object>", since only their presence can be compared.
function M.record(c)
  local json = require("moonrl.core").json
  local out = {}
  for _, k in ipairs(ORDER) do
    local v = c[k]
    if RUN_CONTROL[k] or v == nil then
      -- not recorded
    elseif k == "env" then
      out[k] = v.name
    elseif k == "rewards" then
      local names = {}
      for i, t in ipairs(require("moonrl.train.reward").terms(v)) do names[i] = t.name end
      out[k] = json.array(names)
    elseif k == "reward" and is_graph(v) then
      -- a watched graph by its file (a reload may change its terms), else by its terms
      if v.source and v.source.watch then
        out[k] = { graph = v.name, combine = v.combine, file = v.source.path }
      else
        local names = {}
        for i, t in ipairs(v.terms) do names[i] = t.name end
        out[k] = { graph = v.name, combine = v.combine, terms = json.array(names) }
      end
    elseif type(v) == "function" then
      out[k] = "<function>"
    elseif k == "curriculum" then
      out[k] = json.decode(json.encode(v:config()))
    elseif k == "synth" then
      out[k] = json.decode(json.encode(v:config()))
    elseif k == "remote" then
      out[k] = { client = v.client and "<object>" or nil, push_weights = v.push_weights,
                 clients = v.clients and #v.clients or nil }
    elseif k == "rollout_hooks" then
      local t = {}
      for field, x in pairs(v) do
        if type(x) == "table" then -- the gate
          local g = {}
          for gk, gx in pairs(x) do g[gk] = type(gx) == "function" and "<function>" or gx end
          x = g
        end
        t[field] = type(x) == "function" and "<function>" or x
      end
      out[k] = t
    elseif type(v) == "table" and (k == "tasks" or k == "checkpoint") then
      out[k] = "<object>"
    elseif k == "replay" then
      -- the buffer's own options (an rl.replay buffer's), not its contents
      local t = { ratio = v.ratio, advantages = v.advantages, correction = v.correction,
        buffer = "<object>" }
      local bc = type(v.buffer.cfg) == "table" and v.buffer.cfg
      if bc then
        t.buffer = {}
        for field, x in pairs(bc) do
          t.buffer[field] = (type(x) == "function" and "<function>")
            or ((type(x) == "table" or type(x) == "userdata") and field == "rescore" and "<object>")
            or x
        end
      end
      out[k] = t
    elseif type(v) == "table" then
      local t = {}
      for field, x in pairs(v) do t[field] = type(x) == "function" and "<function>" or x end
      out[k] = t
    else
      out[k] = v
    end
  end
  return out
end

local function same(a, b)
  if type(a) == "table" and type(b) == "table" then
    for k, v in pairs(a) do if not same(v, b[k]) then return false end end
    for k in pairs(b) do if a[k] == nil then return false end end
    return true
  end
  return a == b -- numbers by value: 1 and 1.0 are the same option
end

-- The options that differ between two records (M.record, or state.json's decoded copy), as
-- "name (then, now)" strings in option order.
function M.differences(old, new)
  local json = require("moonrl.core").json
  local function show(v) return v == nil and "unset" or json.encode(v) end
  local out = {}
  for _, k in ipairs(ORDER) do
    if not same(old[k], new[k]) then
      out[#out + 1] = string.format("%s (%s, now %s)", k, show(old[k]), show(new[k]))
    end
  end
  return out
end

-- Checks that involve several options.
local function relations(c)
  if c.remote and (c.remote.client == nil) == (c.remote.clients == nil) then
    return "remote: give one of client and clients"
  end
  if c.remote and c.tree then return "remote: tree rollouts are local only (leave tree unset)" end
  if c.remote and c.rollout_hooks then
    return "remote: rollout hooks run in the local rollout only (leave rollout_hooks unset)"
  end
  if c.tree and c.rollout_hooks then
    return "rollout_hooks: a tree does not run with hooks: fork from on_turn instead (leave tree unset)"
  end
  if c.remote and c.rollout then
    return "remote: the rollout option replaces the stage that uses it (give one of them)"
  end
  local t = c.tree
  if t then
    if c.group_size % t.k ~= 0 then return "tree: group_size must be a multiple of tree.k" end
    if t.turn >= c.max_turns then return "tree: turn must be less than max_turns" end
    local probe = c.env.new()
    if type(probe) ~= "table" or type(probe.clone) ~= "function" then
      return "tree: the environment's instances need a clone() method"
    end
  end
  local cur = c.curriculum
  if c.synth and c.synth.pool and c.synth.pool ~= cur then
    return "synth: the loop admits tasks into another curriculum than rl.train's (give curriculum = "
      .. "the loop's pool, or leave curriculum unset)"
  end
  if c.synth and c.synth.pool and c.synth.pool:config().source.kind ~= "pool" then
    return "synth: the loop's pool is a curriculum whose source is " .. tostring(c.synth.pool:config().source.kind)
      .. ": synthesised tasks are admitted into a pool (rl.curriculum.pool{...})"
  end
  if c.synth and not cur and not c.tasks then
    return "synth: the loop needs a pool to admit into: give it pool = cur (an rl.curriculum with a "
      .. "pool source), which rl.train then draws its tasks from"
  end
  if cur then
    if c.tasks then return "curriculum: the tasks option chooses the tasks too: give one of them" end
    if cur.gate and c.dynamic_sampling then
      return "curriculum: its gate and dynamic_sampling both drop groups: give one of them "
        .. "(rl.curriculum.gate{reject = \"zero_variance\"} is dynamic sampling)"
    end
    local env = cur:env()
    if env and env ~= c.env then
      return string.format("curriculum: its source draws tasks of the environment %s, rl.train's is %s",
        tostring(env.name), tostring(c.env.name))
    end
  end
  if c.dynamic_sampling == "reward" and not is_graph(c.reward) then
    return "dynamic_sampling: \"reward\" filters groups on a reward graph's totals: give reward = "
      .. "rl.reward.graph{...} (or dynamic_sampling = true, the environment's return)"
  end
  if c.sft and type(c.env.oracle) ~= "function" then
    return "sft: the environment " .. c.env.name .. " has no oracle(task, rng) to learn from"
  end
  local ig_adv = c.advantage == "a2tgpo" or c.advantage == "igpo"
  if ig_adv and not c.info_gain then
    return string.format("info_gain: advantage = %q needs info_gain = {answer = function(task) -> "
      .. "text, ...} (the forced answer whose information gain it uses)", c.advantage)
  end
  if c.info_gain and not ig_adv then
    return "info_gain: only with advantage = \"a2tgpo\" or \"igpo\" (got " .. describe(c.advantage) .. ")"
  end
  if c.loss == "a2tgpo" and c.advantage ~= "a2tgpo" then
    return "loss: \"a2tgpo\" reads the clip scales of advantage = \"a2tgpo\" (got advantage = "
      .. describe(c.advantage) .. ")"
  end
  if c.loss == "a2tgpo" and c.replay and c.replay.advantages == "stored" then
    return "replay.advantages: \"stored\" keeps no clip scales for loss = \"a2tgpo\": use \"recompute\""
  end
  if c.loss == "a2tgpo" and c.rollout_correction then
    return "rollout_correction: not with loss = \"a2tgpo\", which takes no importance weights"
  end
  if c.info_gain and (c.tree or c.remote) then
    return "info_gain: scoring the forced answer needs the local engine without a tree ("
      .. (c.tree and "tree" or "remote") .. " is set)"
  end
  if c.loss == "dro" and not (c.dro_beta and c.dro_beta > 0) then
    return "dro_beta: loss = \"dro\" needs a positive dro_beta (verl has no default)"
  end
  if is_graph(c.reward) then
    local g = c.reward
    if c.rewards then return "rewards: with a reward graph (reward = g) add terms to the graph instead" end
    if c.overlong then return "overlong: with a reward graph (reward = g) use the term rl.reward.overlong{...}" end
    if c.gdpo then return "gdpo: with a reward graph its terms and weights are the graph's (combine = \"per_term\")" end
    if g.combine == "per_term" and c.advantage ~= "gdpo" then
      return string.format("advantage: the reward graph %s has combine = \"per_term\", which is GDPO: "
        .. "leave advantage unset or \"gdpo\" (got %s)", g.name, describe(c.advantage))
    end
    if g.combine == "sum" and c.advantage == "gdpo" then
      return string.format("advantage gdpo normalises each reward term: give the reward graph %s "
        .. "combine = \"per_term\" (and leave advantage unset)", g.name)
    end
  end
  if c.advantage == "gdpo" and c.kl_reward_coef ~= 0 then
    return "advantage gdpo normalises the reward terms; the KL penalty of kl_reward_coef is not "
      .. "one of them (verl leaves it out too): use kl_coef"
  end
  if c.gdpo and c.advantage ~= "gdpo" then return "gdpo: only with advantage = \"gdpo\"" end
  if c.otb and c.advantage ~= "optimal_token_baseline"
      and c.advantage ~= "tir_optimal_token_baseline" then
    return "otb: only with advantage = \"optimal_token_baseline\" or \"tir_optimal_token_baseline\""
  end
  if c.advantage == "gdpo" and not is_graph(c.reward) then
    local known = advantage.gdpo_terms(c)
    local g = c.gdpo or {}
    for _, name in ipairs(g.terms or {}) do
      local found = false
      for _, k in ipairs(known) do found = found or k == name end
      if not found then
        local near = M.nearest(name, known)
        return string.format("gdpo.terms: '%s' is not a reward term%s (the terms: %s)", name,
          near and string.format(" (did you mean '%s'?)", near) or "", table.concat(known, ", "))
      end
    end
    local n = #(g.terms or known)
    if g.weights and #g.weights ~= n then
      return string.format("gdpo.weights: %d weights expected (one per term), got %d", n,
        #g.weights)
    end
  end
  if c.replay and c.replay.advantages == "stored" and advantage.estimator(c).critic then
    return "replay.advantages: \"stored\" does not go with an estimator that has a critic ("
      .. tostring(c.advantage) .. "): the value loss needs the critic's values of every episode"
  end
  local d = c.delayed
  if d and d.mode == "backfill" then
    if not c.replay then
      return "delayed: mode \"backfill\" keeps pending episodes in the replay buffer: give "
        .. "replay = rl.replay.new{...} (or {buffer =, ratio = 0} to train on resolved ones only)"
    end
    if type(c.replay.buffer.add_pending) ~= "function" or type(c.replay.buffer.backfill) ~= "function" then
      return "delayed: the replay buffer has no add_pending/backfill (an rl.replay buffer expected)"
    end
    if c.replay.buffer.cfg and c.replay.buffer.cfg.rescore then
      return "delayed: the replay buffer re-scores episodes (rescore = g), which would replace "
        .. "backfilled rewards: leave rescore out"
    end
    if c.replay.advantages == "stored" then
      return "delayed: resolved episodes have no stored advantages: replay.advantages = "
        .. "\"recompute\" (the default)"
    end
    if not d.resolve and type(c.env.resolve) ~= "function" then
      return "delayed.resolve: a function(step, pending) -> {{key =, reward =}, ...} expected "
        .. "(the environment " .. tostring(c.env.name) .. " has no resolve of its own)"
    end
  elseif d and (d.resolve or d.max_wait) then
    return "delayed: mode \"discard\" drops pending episodes at once: leave "
      .. (d.resolve and "resolve" or "max_wait") .. " out"
  end
  local rc = c.rollout_correction
  if rc then
    if rc.bypass_mode and c.loss ~= "ppo" then
      return string.format("rollout_correction.bypass_mode: the loss is rollout_correction."
        .. "loss_type's (\"ppo_clip\" or \"reinforce\"), not loss = %q", c.loss)
    end
    if rc.rollout_rs_threshold and not rc.rollout_rs then
      return "rollout_correction.rollout_rs_threshold: only with rollout_rs"
    end
    local criteria = {}
    if type(rc.rollout_rs) == "string" then
      for name in rc.rollout_rs:gmatch("[^,%s]+") do criteria[#criteria + 1] = name end
    elseif rc.rollout_rs then
      criteria = rc.rollout_rs
    end
    for _, name in ipairs(criteria) do
      if enum(NAMES.rs)(name) then
        local near = M.nearest(name, NAMES.rs)
        return string.format("rollout_correction.rollout_rs: unknown criterion '%s'%s (known: %s)",
          name, near and string.format(" (did you mean '%s'?)", near) or "",
          table.concat(NAMES.rs, ", "))
      end
    end
    -- the thresholds and criteria as rl.objective reads them, on one token
    local core = require "moonrl.core"
    local one = core.tensor.zeros(1)
    local ok, err = pcall(core.objective.rollout_correction, { logp = one, rollout_logp = one,
      mask = core.tensor.ones(1), offsets = { 0, 1 }, episodes = { 1 }, is = rc.rollout_is,
      is_threshold = rc.rollout_is_threshold, is_batch_normalize = rc.rollout_is_batch_normalize,
      rs = rc.rollout_rs, rs_threshold = rc.rollout_rs_threshold })
    if not ok then
      local why = tostring(err):match("%((.*)%)$") or tostring(err)
      return "rollout_correction: " .. why
    end
  end
  return nil
end

-- M.check(opts) -> cfg (every option, defaults filled in; table options with theirs), or nil and
-- a message naming the offending option.
function M.check(o)
  if type(o) ~= "table" then return nil, "a table of options expected, got " .. describe(o) end
  local bad = unknown_keys(o, TOP, ORDER, "")
  if #bad > 0 then return nil, table.concat(bad, "; ") end
  local c = {}
  for _, k in ipairs(ORDER) do
    local spec, v = TOP[k], o[k]
    if v == nil then
      if spec.required then
        local want = spec.check(nil)
        return nil, type(want) == "table" and want[1] or string.format("%s: %s expected", k, want)
      end
      v = spec.default
      if type(v) == "function" then v = v(c) end
      if SUB[k] and type(v) == "table" then v = sub_table(k, v) end -- the default's own fields
    else
      local want = spec.check(v)
      if type(want) == "table" then return nil, want[1] end
      if want then return nil, string.format("%s: %s expected, got %s", k, want, describe(v)) end
      if k == "replay" and M.is_buffer(v) then v = { buffer = v } end
      if SUB[k] and type(v) == "table" then v = sub_table(k, v) end
    end
    c[k] = v
  end
  local err = relations(c)
  if err then return nil, err end
  return c
end

return M
