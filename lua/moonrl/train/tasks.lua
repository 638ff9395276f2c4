-- moonrl.train.tasks: the task stage: which tasks a training step rolls out.
--
-- The `tasks` option is either
--   a function(ctx, step, n, seed) -> a list of n tasks, or
--   an object with :sample(ctx, step, n, seed) -> a list of n tasks, and optionally
--     :update(ctx, step, batch)   called after the step's rewards (e.g. a curriculum reading
--                                 pass rates: batch.episodes[i].task, .success, .reward),
--     :state() -> a JSON value and :load(value)   its state, kept in state.json for resume.
-- The `curriculum` option (an rl.curriculum) is such a source: cur:sample(n, rl.rng(seed)), then
-- cur:observe on the step's episodes, the groups a gate or dynamic sampling dropped included,
-- and its state in state.json. A task's own max_turns (a horizon curriculum's) replaces the
-- option for its episodes (see moonrl.train.rollout).
-- The default draws from the environment's training split: env.tasks("train", n, seed). seed is
-- a deterministic function of the run's seed, the step and the sampling try.
local core = require "moonrl.core"

local M = {}

-- The default source.
function M.env_tasks(ctx, _, n, seed) return ctx.cfg.env.tasks("train", n, seed) end

-- The task-stage object of a curriculum.
local function from_curriculum(cur)
  local src = { curriculum = cur }
  function src:sample(_, _, n, seed)
    local list, err = cur:sample(n, core.rng(seed))
    if not list then error("train: curriculum: " .. err, 0) end
    return list
  end
  function src:update(_, _, batch, rejected)
    local eps = {}
    for _, ep in ipairs(batch and batch.episodes or {}) do eps[#eps + 1] = ep end
    for _, ep in ipairs(rejected or {}) do eps[#eps + 1] = ep end
    return cur:observe(eps)
  end
  function src:state() return cur:state() end
  function src:load(v) cur:load(v) end
  return src
end

local function source(ctx)
  local c = ctx.cfg
  if c.curriculum then
    ctx.task_source = ctx.task_source or from_curriculum(c.curriculum)
    return ctx.task_source
  end
  return c.tasks or M.env_tasks
end

-- n tasks for a training step.
function M.sample(ctx, step, n, seed)
  local src = source(ctx)
  local list
  if type(src) == "function" then list = src(ctx, step, n, seed) else list = src:sample(ctx, step, n, seed) end
  if type(list) ~= "table" or #list ~= n then
    error(string.format("train: tasks: the task source returned %s for %d tasks (a list of %d "
      .. "expected)", type(list) == "table" and #list .. " tasks" or type(list), n, n), 0)
  end
  return list
end

-- The metrics of a curriculum's observation: curriculum/<cell>/{n, success} for each cell the
-- step saw, curriculum/level/<param> (band), curriculum/{episodes, ignored, zero_variance,
-- moves, frontier_share}.
local function curriculum_metrics(cur, seen)
  local mt = { ["curriculum/episodes"] = seen.episodes, ["curriculum/ignored"] = seen.ignored,
    ["curriculum/zero_variance"] = seen.zero_variance, ["curriculum/moves"] = #seen.moves }
  for _, c in ipairs(seen.cells) do
    mt["curriculum/" .. c.cell .. "/n"] = c.n
    mt["curriculum/" .. c.cell .. "/success"] = c.success
  end
  local st = cur:brief()
  mt["curriculum/frontier_share"] = st.frontier_share
  for name, v in pairs(st.levels or {}) do
    if type(v) == "number" then mt["curriculum/level/" .. name] = v end
  end
  return mt
end

-- Tells an object source the step's outcome: batch (nil when every group was dropped) and the
-- episodes of the dropped groups (only a curriculum sees those). Returns metrics to log (a
-- curriculum's) or nil.
function M.update(ctx, step, batch, rejected)
  local src = source(ctx)
  if ctx.cfg.curriculum then
    return curriculum_metrics(ctx.cfg.curriculum, src:update(ctx, step, batch, rejected))
  end
  if batch and type(src) == "table" and src.update then src:update(ctx, step, batch) end
  return nil
end

-- The source's state for state.json (nil when it keeps none), and its restoration.
function M.state(ctx)
  local src = source(ctx)
  if type(src) == "table" and src.state then return src:state() end
  return nil
end

function M.load(ctx, value)
  local src = source(ctx)
  if type(src) == "table" and src.load and value ~= nil then src:load(value) end
end

return M
