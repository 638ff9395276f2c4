-- moonrl.synth.solver: how the synthesis loop reaches the current policy as a solver: k rollouts
-- of each of a list of tasks, each reduced to {success =, answer =, ep =}.
--
-- In rl.train the context is the trainer's (ctx.stages.rollout with the run's environment,
-- sampling temperature and seeds, in chunks the rollout engine holds). Outside it, or to
-- simulate a policy, the context may carry ctx.solve = function(tasks, k, seed) -> a list with,
-- for each task, a list of k outcomes {success = bool, answer = string (optional)}.
local seedlib = require "moonrl.train.seed"

local mix = seedlib.mix
local M = {}

-- The answer an episode gave: its last turn's parsed answer text, else its last action.
function M.answer_of(ep)
  local rec = ep.record and ep.record[#ep.record]
  if not rec then return nil end
  if type(rec.parsed) == "table" and rec.parsed.kind == "answer" and type(rec.parsed.text) == "string" then
    return (rec.parsed.text:gsub("^%s+", ""):gsub("%s+$", ""))
  end
  if type(rec.action) == "string" then return (rec.action:gsub("^%s+", ""):gsub("%s+$", "")) end
  return nil
end

-- Whether ctx can roll out: a simulated solver or a trainer's context.
function M.available(ctx)
  return type(ctx) == "table" and (type(ctx.solve) == "function"
    or (type(ctx.stages) == "table" and type(ctx.stages.rollout) == "function" and type(ctx.cfg) == "table"))
end

local function checked(out, tasks, k, where)
  if type(out) ~= "table" or #out ~= #tasks then
    error(string.format("rl.synth: %s: ctx.solve returned %s for %d tasks (a list of %d lists "
      .. "of outcomes expected)", where, type(out) == "table" and #out .. " entries" or type(out),
      #tasks, #tasks), 0)
  end
  for i, list in ipairs(out) do
    if type(list) ~= "table" or #list ~= k then
      error(string.format("rl.synth: %s: ctx.solve: task %d has %s outcomes (%d expected)", where, i,
        type(list) == "table" and tostring(#list) or "no", k), 0)
    end
  end
  return out
end

-- M.rollouts(ctx, tasks, k, seed, where [, temperature]) -> for each task, its k outcomes.
function M.rollouts(ctx, tasks, k, seed, where, temperature)
  if #tasks == 0 then return {} end
  if type(ctx) == "table" and type(ctx.solve) == "function" then
    return checked(ctx.solve(tasks, k, seed), tasks, k, where)
  end
  if not M.available(ctx) then
    error(string.format("rl.synth: %s: the context cannot roll out (a trainer's ctx, or ctx.solve = "
      .. "function(tasks, k, seed) expected)", where), 0)
  end
  local c = ctx.cfg
  local per = math.max(1, (c.tasks_per_step * c.group_size) // k)
  local out = {}
  for first = 1, #tasks, per do
    local chunk = {}
    for i = first, math.min(#tasks, first + per - 1) do chunk[#chunk + 1] = tasks[i] end
    local b = ctx.stages.rollout(ctx, { tasks = chunk, repeats = k, seed = mix(seed, first),
      temperature = temperature or c.temperature, group_base = 0 })
    for _, ep in ipairs(b.episodes) do
      local t = first - 1 + ep.group
      local list = out[t]
      if not list then list = {} out[t] = list end
      list[#list + 1] = { success = ep.success and true or false, answer = M.answer_of(ep), ep = ep }
    end
  end
  for i = 1, #tasks do out[i] = out[i] or {} end
  return checked(out, tasks, k, where)
end

return M
