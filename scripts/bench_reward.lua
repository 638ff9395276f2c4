-- bench_reward.lua - what a reward graph costs in a training step, for `make bench`: rl.train on
-- the quickstart environment with 512 episodes a step (32 tasks x 16), once with a graph of 5 rule
-- terms (env, format gated on it, budget, fn, metric) and once with the default stage and 4
-- `rewards` functions; the reward stage's share of the step (time/reward over time/step, the
-- median of the steps); then the graph with a curriculum and novelty checks (acceptance test 22
-- of the agent library). Prints tab-separated lines "reward <key> <value>".
--   moonrl run scripts/bench_reward.lua
local rl = require "moonrl"
local root = os.getenv("MOONRL_ROOT") or "."
package.path = root .. "/?.lua;" .. package.path
local env = require "envs.guess_letter"

local function out(key, value) io.write(string.format("reward\t%s\t%.6g\n", key, value)) end

local dir = os.tmpname()
os.remove(dir)
assert(rl.fs.mkdir(dir))

local function median(xs)
  table.sort(xs)
  return xs[(#xs + 1) // 2]
end

local function run(name, extra)
  local o = { model = rl.model.new { vocab = 264, dim = 64, layers = 2, heads = 4, ffn = 192, ctx = 128,
      seed = 1 }, tokenizer = rl.tokenizer.bytes(), env = env, dir = dir, name = name, seed = 1, steps = 5,
    tasks_per_step = 32, group_size = 16, minibatch = 128, max_turn_tokens = 3, eval = false,
    progress = false, plot = false, log_episodes = 0 }
  for k, v in pairs(extra) do o[k] = v end
  local h = rl.train(o).history
  local share, reward = {}, {}
  for s = 2, #h do
    share[#share + 1] = h[s]["time/reward"] / h[s]["time/step"]
    reward[#reward + 1] = h[s]["time/reward"]
  end
  return median(share), median(reward)
end

local R = rl.reward
local share, seconds = run("graph", { reward = R.graph { terms = {
  R.env { name = "correct" },
  R.format { name = "style", pattern = "^%l$", where = "each_turn", weight = 0.2, gate = "correct" },
  R.budget { turns = 0.05, tokens = 0.005 },
  R.fn("first", function(ep) return ep.record[1] and #ep.record[1].action or 0 end, { weight = 0.01 }),
  R.metric("turns", function(ep) return ep.turns end),
} } })
out("graph_share", share)
out("graph_seconds", seconds)
share, seconds = run("plain", { rewards = { { name = "style", fn = function(ep) return 0 end },
  { name = "budget", fn = function(ep) return -0.05 * ep.turns end },
  { name = "first", fn = function(ep) return ep.record[1] and 0.01 * #ep.record[1].action or 0 end },
  { name = "turns", fn = function() return 0 end } } })
out("plain_share", share)
out("plain_seconds", seconds)

-- Acceptance test 22: the reward graph above, a curriculum (a pool of 1,000 tasks drawn by
-- learnability) and novelty (32 candidate tasks a step checked against, then added to, an index
-- of 10,000) against the whole step. The graph's and the curriculum's seconds are the run's own
-- time/reward and time/tasks; novelty is timed here on the same kind of index, since rl.train
-- has no novelty stage of its own outside a synthesis loop (whose proposals it checks).
local C = rl.curriculum
local h = (function()
  local o = { model = rl.model.new { vocab = 264, dim = 64, layers = 2, heads = 4, ffn = 192, ctx = 128,
      seed = 1 }, tokenizer = rl.tokenizer.bytes(), env = env, dir = dir, name = "agentlib", seed = 1,
    steps = 5, tasks_per_step = 32, group_size = 16, minibatch = 128, max_turn_tokens = 3, eval = false,
    progress = false, plot = false, log_episodes = 0,
    curriculum = C.new { seed = 1, source = C.pool { env = env, size = 1000 }, sampler = C.learnability() },
    reward = R.graph { terms = {
      R.env { name = "correct" },
      R.format { name = "style", pattern = "^%l$", where = "each_turn", weight = 0.2, gate = "correct" },
      R.budget { turns = 0.05, tokens = 0.005 },
      R.fn("first", function(ep) return ep.record[1] and #ep.record[1].action or 0 end, { weight = 0.01 }),
      R.metric("turns", function(ep) return ep.turns end),
    } } }
  return rl.train(o).history
end)()
local steps, rewards, tasks = {}, {}, {}
for s = 2, #h do
  steps[#steps + 1], rewards[#rewards + 1], tasks[#tasks + 1] = h[s]["time/step"], h[s]["time/reward"], h[s]["time/tasks"]
end
local step_s, reward_s, tasks_s = median(steps), median(rewards), median(tasks)

local WORDS = { "apples", "pears", "coins", "books", "cards", "shells", "marbles", "stamps", "plums", "pens" }
local NAMES = { "Ann", "Ben", "Cleo", "Dan", "Eva", "Finn", "Gus", "Hana", "Ivo", "Jun" }
local rng = rl.rng(22)
local function text()
  return string.format("%s has %d %s, gives %d to %s and buys %d %s; how many %s are left?",
    NAMES[rng:random(1, 10)], rng:random(1, 999), WORDS[rng:random(1, 10)], rng:random(1, 99),
    NAMES[rng:random(1, 10)], rng:random(1, 99), WORDS[rng:random(1, 10)], WORDS[rng:random(1, 10)])
end
local nov = rl.synth.novelty { key = function(t) return t.text end, numbers = "keep" }
for i = 1, 10000 do nov:add({ text = text() }, "pool", "seed" .. i) end
local per_step = {}
for round = 1, 5 do
  local t0 = rl.clock()
  for i = 1, 32 do
    local task = { text = text() }
    if nov:check(task) then nov:add(task, "pool", round .. "/" .. i) end
  end
  per_step[round] = rl.clock() - t0
end
local novelty_s = median(per_step)
out("agentlib_step_seconds", step_s)
out("agentlib_reward_seconds", reward_s)
out("agentlib_curriculum_seconds", tasks_s)
out("agentlib_novelty_seconds", novelty_s)
out("agentlib_share", (reward_s + tasks_s + novelty_s) / step_s)
os.execute("rm -rf '" .. dir .. "'")
