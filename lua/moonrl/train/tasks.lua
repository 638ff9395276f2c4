-- moonrl.train.tasks: the task stage: which tasks a training step rolls out.
--
-- The `tasks` option is either
--   a function(ctx, step, n, seed) -> a list of n tasks, or
--   an object with :sample(ctx, step, n, seed) -> a list of n tasks, and optionally
--     :update(ctx, step, batch)   called after the step's rewards (e.g. a curriculum reading
--                                 pass rates: batch.episodes[i].task, .success, .reward),
--     :state() -> a JSON value and :load(value)   its state, kept in state.json for resume.
-- The default draws from the environment's training split: env.tasks("train", n, seed). seed is
-- a deterministic function of the run's seed, the step and the sampling try.
local M = {}

-- The default source.
function M.env_tasks(ctx, _, n, seed) return ctx.cfg.env.tasks("train", n, seed) end

local function source(ctx) return ctx.cfg.tasks or M.env_tasks end

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

-- Tells an object source the step's outcome.
function M.update(ctx, step, batch)
  local src = source(ctx)
  if type(src) == "table" and src.update then src:update(ctx, step, batch) end
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
