-- multi_agent.lua - Dr. MAS on envs/planact.lua: a planner and an executor (each its own model)
-- trained together with agent-wise normalisation (advantage "drmas": groups keyed (prompt,
-- agent)) against the global baseline (advantage "grpo": each episode's mean invocation score
-- normalised over its group, for both agents alike); with --arms also planner-only and
-- executor-only training (the other agent frozen) at equal compute (the same steps and
-- episodes; the frozen agent still acts). Spec reproductions.md section 3.5, advantage.md 6.4.
-- The planner's reward is team success (0/1), the executor's a per-step shaped reward on a 0-10
-- scale (0 .. 30 per invocation), so the two reward distributions differ by construction.
--
-- One SFT warm start per seed on the environment's scripted imperfect oracles (the planner's
-- knows two door colours of six, the executor's follows the plan 75% of the time) is shared by
-- every arm: each arm loads the same two checkpoints and trains with the same seed, tasks and
-- budget. Measured greedily on held-out layouts (K = 2 and 3 rooms). The table gives held-out
-- team success, each agent's held-out mean reward, and each trainable agent's gradient-norm
-- spikes (steps whose largest gradient norm is above 5x the median of the previous 20, once 5
-- exist), and the measured seconds per RL step.
--
--   moonrl run recipes/multi_agent.lua [--seed 1] [--seeds 3]
--     [--arms drmas,grpo,planner_only,executor_only] [--steps 100] [--tasks 16] [--group 8]
--     [--lr 1e-3] [--sft-examples 3000] [--sft-epochs 3] [--eval-tasks 128] [--dim 64]
--     [--layers 2] [--dir runs]
--
-- Every arm: PPO (clip 0.2 / 0.28), lr 1e-3 for each trainable agent, 16 tasks x 8 episodes a
-- step, one optimizer step per agent a step (minibatch = the whole batch), 100 steps. --arms
-- takes drmas, grpo, planner_only, executor_only (the last two: Dr. MAS with the other agent
-- frozen). Files go to <dir>/multi-<arm>-s<seed>/ (metrics.jsonl, trace.jsonl) and the warm
-- starts to <dir>/multi-sft-<agent>-s<seed>.bin.
local rl = require "moonrl"

local root = os.getenv("MOONRL_ROOT") or "."
package.path = root .. "/?.lua;" .. package.path
local planact = require "envs.planact"
local R = rl.recipe

local o, why = R.args(arg, { seed = 1, seeds = 1, arms = "drmas,grpo,planner_only,executor_only", steps = 100,
  tasks = 16, group = 8, sft_examples = 3000, sft_epochs = 3, eval_tasks = 128, dir = root .. "/runs", dim = 64,
  layers = 2, lr = 1e-3 })
if not o then error("multi_agent.lua: " .. why, 0) end

local KNOWN = {
  drmas = { advantage = "drmas", planner = true, executor = true },
  grpo = { advantage = "grpo", planner = true, executor = true },
  planner_only = { advantage = "drmas", planner = true, executor = false },
  executor_only = { advantage = "drmas", planner = false, executor = true },
}
local ARMS = {}
for name in o.arms:gmatch("[^,]+") do
  if not KNOWN[name] then error(string.format("multi_agent.lua: --arms: unknown arm '%s' (known: drmas, grpo, "
    .. "planner_only, executor_only)", name), 0) end
  ARMS[#ARMS + 1] = name
end

local tok = rl.tokenizer.bytes()
local function new_model(seed)
  return rl.model.new { vocab = tok:vocab_size(), dim = o.dim, layers = o.layers, heads = 4, ffn = 3 * o.dim,
    ctx = 256, seed = seed }
end

-- The shared warm start: each agent's model SFT on its oracle's demonstrations, saved once.
local function warm_start(seed)
  local t0 = rl.clock()
  local sft = { examples = o.sft_examples }
  local data = rl.multi.oracle_examples(planact, { planner = { sft = sft, tokenizer = tok },
    executor = { sft = sft, tokenizer = tok } }, rl.train.mix(seed, 0xF7))
  local paths, loss = {}, {}
  assert(rl.fs.mkdir(o.dir))
  for k, agent in ipairs(planact.agents) do
    local m = new_model(rl.train.mix(seed, k))
    paths[agent] = string.format("%s/multi-sft-%s-s%d.bin", o.dir, agent, seed)
    local r = rl.recipe.warm_start { model = m, data = data[agent], epochs = o.sft_epochs, path = paths[agent],
      seed = rl.train.mix(seed, 0x5F7, k) }
    loss[agent] = r.final_loss
  end
  return paths, { seconds = rl.clock() - t0, loss = loss, examples = #data.planner }
end

local FIRST = true -- the seconds per step are printed once, after the first arm's first step

local function run_arm(seed, paths, arm)
  local spec = KNOWN[arm]
  local agents = {}
  for k, agent in ipairs(planact.agents) do
    local m = new_model(rl.train.mix(seed, k))
    m:load_checkpoint(paths[agent])
    m:reset_optimizer()
    agents[agent] = { model = m, tokenizer = tok, trainable = spec[agent] }
  end
  local secs, n = 0, 0
  local result = rl.multi.train {
    env = planact, agents = agents, advantage = spec.advantage, name = string.format("multi-%s-s%d", arm, seed),
    dir = o.dir, seed = seed, overwrite = true, steps = o.steps, tasks_per_step = o.tasks, group_size = o.group,
    minibatch = o.tasks * o.group, max_turn_tokens = 12, loss = "ppo", clip_low = 0.2, clip_high = 0.28, lr = o.lr,
    eval = { every = o.steps, tasks = o.eval_tasks }, trace_episodes = 2,
    grad_spike = { factor = 5, window = 20, min_steps = 5 },
    on_step = function(step, mt)
      secs, n = secs + mt["time/step"] - (mt["time/eval"] or 0), n + 1
      if FIRST and step == 1 then
        FIRST = false
        print(string.format("  measured: %.2f s per RL step (%s, %d x %d episodes)", mt["time/step"], arm, o.tasks, o.group))
        io.stdout:flush()
      end
    end,
  }
  local last = result.history[#result.history]
  local row = { arm = arm, success = result.after["eval/success"], before = result.before["eval/success"],
    planner = result.after["eval/reward/planner"], executor = result.after["eval/reward/executor"], sps = secs / n }
  for _, agent in ipairs(planact.agents) do row["spikes_" .. agent] = spec[agent] and (last["grad/" .. agent .. "/spikes"] or 0) or nil end
  print(string.format("  %-14s %3d steps  %.2f s/step  held-out team success %.1f%% (SFT %.1f%%)", arm, o.steps,
    row.sps, 100 * row.success, 100 * row.before))
  io.stdout:flush()
  return row
end

local function one_seed(seed)
  local t0 = rl.clock()
  print(string.format("seed %d: SFT warm start ...", seed))
  local paths, sft = warm_start(seed)
  print(string.format("  SFT: %d episodes' demonstrations x %d epochs, final loss planner %.3f executor %.3f, %.0f s",
    sft.examples, o.sft_epochs, sft.loss.planner, sft.loss.executor, sft.seconds))
  local rows = {}
  for _, arm in ipairs(ARMS) do rows[#rows + 1] = run_arm(seed, paths, arm) end
  rows[#rows + 1] = { arm = "SFT", success = rows[1].before }
  print(string.format("seed %d: %.0f s", seed, rl.clock() - t0))
  return rows
end

local function print_table(list, title)
  local w = #list > 1 and 13 or 8
  local function cell(v, scale) return string.format("%" .. w .. "s", v == nil and "-" or R.pm(v, scale)) end
  print(string.format("\nplanact, %s; %d steps of %d tasks x %d episodes; held-out layouts, %d, greedy",
    title, o.steps, o.tasks, o.group, o.eval_tasks))
  print(string.format("%-14s %" .. w .. "s %" .. w .. "s %" .. w .. "s %" .. w .. "s %" .. w .. "s %7s", "arm",
    "success", "r_plan", "r_exec", "spk_plan", "spk_exec", "s/step"))
  for _, r in ipairs(R.summarise(list, "arm")) do
    local sps = type(r.sps) == "table" and r.sps.mean or r.sps
    print(string.format("%-14s %s %s %s %s %s %7s", r.arm, cell(r.success), cell(r.planner), cell(r.executor, 1),
      cell(r.spikes_planner, 1), cell(r.spikes_executor, 1), sps and string.format("%.2f", sps) or "-"))
  end
end

local t_all = rl.clock()
R.report(o.seed, o.seeds, one_seed, print_table)
print(string.format("(success: held-out team success, %%; r_plan: the planner's held-out mean reward (0/1), %%; "
  .. "r_exec: the executor's (0..30); "
  .. "spk: gradient-norm spikes over the run (> 5x running median); s/step: seconds per RL step, eval excluded; "
  .. "%.0f s in all)", rl.clock() - t_all))
