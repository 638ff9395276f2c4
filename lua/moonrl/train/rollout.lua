-- moonrl.train.rollout: the rollout stage (the episodes of some tasks -> a trajectory batch) and
-- the sampling of a training step's batch (tasks -> rollouts, with DAPO's dynamic sampling).
--
-- The `rollout` option replaces the stage: a function(ctx, req) -> an rl.batch, where req is
--   {tasks = list, repeats = episodes per task, seed = integer, temperature = number,
--    group_base = integer, tree = nil or {turn =, k =}}
-- and batch.episodes[i].group is group_base + the index of the episode's task. Training and the
-- default evaluation both roll out through it.
local batchlib = require "moonrl.batch"
local seedlib = require "moonrl.train.seed"
local tasks = require "moonrl.train.tasks"

local mix = seedlib.mix
local M = {}

-- The default stage: the engine's batched multi-turn rollout (ctx.ro). With req.tree, repeats /
-- k roots per task each branch into k episodes after tree.turn turns (all of a task's episodes
-- are its group).
function M.run(ctx, req)
  local list, seeds, groups = {}, {}, {}
  local tree = req.tree
  local roots = tree and req.repeats // tree.k or req.repeats
  for t, task in ipairs(req.tasks) do
    for _ = 1, roots do
      list[#list + 1] = task
      seeds[#seeds + 1] = mix(req.seed, #list)
      groups[#groups + 1] = req.group_base + t
    end
  end
  local c = ctx.cfg
  local results = ctx.ro:run {
    tokenizer = ctx.tokenizer, env = c.env, tasks = list, seeds = seeds, max_turns = c.max_turns,
    max_turn_tokens = c.max_turn_tokens, temperature = req.temperature, top_k = c.top_k,
    top_p = c.top_p, min_p = c.min_p, system = c.system, branch = tree,
  }
  if tree then
    local by_root = groups
    groups = {}
    for i, r in ipairs(results) do groups[i] = by_root[r.branch.root] end
  end
  return batchlib.from_rollout(ctx.ro, results, groups)
end

-- The batch of training step `step`: tasks_per_step tasks of group_size episodes each. With
-- dynamic_sampling, groups whose episodes all got one reward are dropped and more tasks drawn
-- (up to max_sampling_tries). Returns the batch (nil when every group was dropped) and
-- {tries =, groups_drawn =, groups_dropped =}.
function M.sample(ctx, step)
  local c = ctx.cfg
  local want = c.tasks_per_step
  local parts, kept, tries, drawn, filtered = {}, 0, 0, 0, 0
  repeat
    tries = tries + 1
    local list = tasks.sample(ctx, step, want, mix(c.seed, step, tries))
    local b = ctx.stages.rollout(ctx, { tasks = list, repeats = c.group_size,
      seed = mix(c.seed, step, tries, 7), temperature = c.temperature,
      group_base = tries * 100000, tree = c.tree })
    drawn = drawn + #list
    if not c.dynamic_sampling then return b, { tries = 1, groups_drawn = drawn, groups_dropped = 0 } end
    local keep = {}
    for _, g in ipairs(b:groups()) do
      local first, varied = b.episodes[g.members[1]].reward, false
      for _, i in ipairs(g.members) do varied = varied or b.episodes[i].reward ~= first end
      if varied and kept < c.tasks_per_step then
        for _, i in ipairs(g.members) do keep[#keep + 1] = i end
        kept = kept + 1
      else
        filtered = filtered + 1
      end
    end
    if #keep > 0 then parts[#parts + 1] = b:select(keep) end
    want = c.tasks_per_step - kept
  until kept >= c.tasks_per_step or tries >= c.max_sampling_tries
  local info = { tries = tries, groups_drawn = drawn, groups_dropped = filtered }
  if #parts == 0 then return nil, info end
  return batchlib.concat(parts), info
end

return M
