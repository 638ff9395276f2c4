-- moonrl.train.eval: the evaluation stage: greedy success and sampled pass@k on held-out tasks.
--
-- The `evaluate` option replaces the stage: a function(ctx, step) -> {name = number, ...}, logged
-- as eval/<name> at step 0 (after SFT) and every eval.every steps and at the last; `eval = false`
-- turns evaluation off. The default rolls out eval.tasks tasks of the environment's eval.split
-- (drawn with eval.seed, the same every time) through the rollout stage, once greedily and
-- eval.k times at eval.temperature.
--
-- M.pass_grid(ctx, {tasks =, n = 16, ks = {1, 2, 4, 8, 16}, depths = {1, ..., max_turns},
-- temperature = 1, seed = 1, chunk =}) -> grid: PASS@(k, T), the chance that at least one of k
-- samples solves a task within T turns, for each k in ks and T in depths, averaged over the
-- tasks: grid[T][k] (and grid.n, grid.tasks). Each task is rolled out n times (n >= every k) at
-- the run's max_turns through the rollout stage, chunk tasks a call (default: as many as a
-- training step holds); a sample counts at depth T when it succeeded within T turns. That equals
-- rolling out with max_turns = T, because an episode's first T turns do not depend on its
-- horizon (its own sampling stream, the environment seeded per episode): tested. pass@k from n
-- samples with c successes is the unbiased 1 - C(n - c, k) / C(n, k) (M.pass_at_k).
local seedlib = require "moonrl.train.seed"

local mix = seedlib.mix
local M = {}

-- The default stage.
function M.run(ctx)
  local e = ctx.cfg.eval
  local tasks = ctx.cfg.env.tasks(e.split, e.tasks, e.seed)
  local greedy = ctx.stages.rollout(ctx, { tasks = tasks, repeats = 1, seed = mix(e.seed, 1),
    temperature = 0, group_base = 0 })
  local sampled = ctx.stages.rollout(ctx, { tasks = tasks, repeats = e.k, seed = mix(e.seed, 2),
    temperature = e.temperature, group_base = 0 })
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

-- The unbiased pass@k of n samples with c successes: 1 - C(n - c, k) / C(n, k), as the product
-- prod_(i = n - c + 1)^n (1 - k / i) (no large binomials).
function M.pass_at_k(n, c, k)
  if math.type(n) ~= "integer" or math.type(c) ~= "integer" or math.type(k) ~= "integer"
    or n < 1 or c < 0 or c > n or k < 1 or k > n then
    error(string.format("pass_at_k: integers 0 <= c <= n and 1 <= k <= n expected, got n = %s, c = %s, k = %s",
      tostring(n), tostring(c), tostring(k)), 2)
  end
  if n - c < k then return 1.0 end
  local miss = 1.0
  for i = n - c + 1, n do miss = miss * (1 - k / i) end
  return 1 - miss
end

local GRID_KEYS = { tasks = true, n = true, ks = true, depths = true, temperature = true, seed = true, chunk = true }

local function positive_list(v)
  if type(v) ~= "table" or #v == 0 then return false end
  for _, x in ipairs(v) do
    if math.type(x) ~= "integer" or x < 1 then return false end
  end
  return true
end

function M.pass_grid(ctx, o)
  if type(o) ~= "table" then error("pass_grid: a table {tasks =, n =, ks =, depths =, ...} expected", 2) end
  for k in pairs(o) do
    if not GRID_KEYS[k] then error("pass_grid: unknown option '" .. tostring(k) .. "'", 2) end
  end
  local c = ctx.cfg
  local tasks, n = o.tasks, o.n or 16
  if type(tasks) ~= "table" or #tasks == 0 then error("pass_grid: tasks: a non-empty list of tasks expected", 2) end
  if math.type(n) ~= "integer" or n < 1 then error("pass_grid: n: a positive integer expected", 2) end
  local ks = o.ks or { 1, 2, 4, 8, 16 }
  if not positive_list(ks) then error("pass_grid: ks: a list of positive integers expected", 2) end
  for _, k in ipairs(ks) do
    if k > n then error(string.format("pass_grid: ks: %d is more than n = %d samples", k, n), 2) end
  end
  local depths = o.depths
  if depths == nil then
    depths = {}
    for t = 1, c.max_turns do depths[t] = t end
  end
  if not positive_list(depths) then error("pass_grid: depths: a list of positive integers expected", 2) end
  local chunk = o.chunk or math.max(1, (c.tasks_per_step * c.group_size) // n)
  if math.type(chunk) ~= "integer" or chunk < 1 then error("pass_grid: chunk: a positive integer expected", 2) end
  local temperature, seed = o.temperature or 1.0, o.seed or 1
  -- wins[i][T]: task i's samples that succeeded within T turns
  local wins = {}
  for first = 1, #tasks, chunk do
    local part = table.move(tasks, first, math.min(#tasks, first + chunk - 1), 1, {})
    local b = ctx.stages.rollout(ctx, { tasks = part, repeats = n, seed = mix(seed, first),
      temperature = temperature, group_base = first - 1 })
    for _, ep in ipairs(b.episodes) do
      local i = ep.group
      wins[i] = wins[i] or {}
      for _, t in ipairs(depths) do
        if ep.success and ep.turns <= t then wins[i][t] = (wins[i][t] or 0) + 1 end
      end
    end
  end
  local grid = { n = n, tasks = #tasks }
  for _, t in ipairs(depths) do
    grid[t] = {}
    for _, k in ipairs(ks) do
      local sum = 0
      for i = 1, #tasks do sum = sum + M.pass_at_k(n, (wins[i] or {})[t] or 0, k) end
      grid[t][k] = sum / #tasks
    end
  end
  return grid
end

-- Whether step is an evaluation step.
function M.due(c, step)
  return c.eval and (step % c.eval.every == 0 or step == c.steps) or false
end

return M
