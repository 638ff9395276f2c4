-- moonrl.train.eval: the evaluation stage: greedy success and sampled pass@k on held-out tasks.
--
-- The `evaluate` option replaces the stage: a function(ctx, step) -> {name = number, ...}, logged
-- as eval/<name> at step 0 (after SFT) and every eval.every steps and at the last; `eval = false`
-- turns evaluation off. The default rolls out eval.tasks tasks of the environment's eval.split
-- (drawn with eval.seed, the same every time) through the rollout stage, once greedily and
-- eval.k times at eval.temperature.
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

-- Whether step is an evaluation step.
function M.due(c, step)
  return c.eval and (step % c.eval.every == 0 or step == c.steps) or false
end

return M
