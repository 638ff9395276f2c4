-- moonrl.train.options: rl.train's options: defaults and checks, giving the resolved
-- configuration the stages read (ctx.cfg).
local envlib = require "moonrl.env"
local advantage = require "moonrl.train.advantage"

local M = {}

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

function M.check(o)
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
  need(type(c.advantage) == "function" or advantage.get(c.advantage) ~= nil,
    "advantage: unknown estimator '" .. tostring(c.advantage) .. "'")
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

return M
