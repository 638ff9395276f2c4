-- curriculum.lua - a band curriculum against uniform sampling over the levels and against fixed
-- sampling at the hardest level, on envs/arith.lua (10-digit additions, one turn per column;
-- the level is the number of carries, 0 to 9). The same policy, seed and step budget each time;
-- measured on held-out tasks of levels 8 to 10 (7 to 9 carries), greedily.
--   band      rl.curriculum.band{low = .2, high = .8} over the ten levels, from the first;
--   uniform   rl.curriculum.uniform() over the ten levels;
--   hardest   the last level only (9 carries).
-- The SFT warm start copies an oracle that forgets most carries, so the policy starts able to
-- solve 0-carry tasks and next to nothing with several carries.
--
--   moonrl run recipes/curriculum.lua [seed] [steps] [arms]  (files go to runs/curriculum-<arm>/)
--
-- arms: a comma-separated subset of band,uniform,hardest (all three by default). About a minute
-- on 2 cores. Seed 1, 60 steps: band 42.7%, uniform 60.7%, hardest 0.0% held out; seed 2: 3.7%,
-- 100%, 0%: on this task the band does not beat uniform sampling (see the README, "Curricula").
local rl = require "moonrl"

local root = os.getenv("MOONRL_ROOT") or "."
package.path = root .. "/?.lua;" .. package.path
local env = require "envs.arith"
local C = rl.curriculum

local seed = math.tointeger(tonumber(arg and arg[1] or "")) or 1
local steps = math.tointeger(tonumber(arg and arg[2] or "")) or 100
local arms = {}
for name in ((arg and arg[3]) or "band,uniform,hardest"):gmatch("[^,]+") do arms[#arms + 1] = name end

local function curriculum(arm)
  local levels = arm == "hardest" and C.levels { 9 } or C.range { 0, 9 }
  local sampler = arm == "band" and C.band { low = 0.2, high = 0.8 } or C.uniform()
  if arm ~= "band" and arm ~= "uniform" and arm ~= "hardest" then
    error("curriculum.lua: unknown arm " .. arm .. " (band, uniform or hardest)")
  end
  return C.new { seed = seed, sampler = sampler,
    source = C.procedural { gen = env.gen, params = { carries = levels } } }
end

-- Held-out success by level: 100 greedy episodes at each of 7, 8 and 9 carries.
local HELD_OUT = { 7, 8, 9 }
local function evaluate(ctx)
  local out, all = {}, 0
  for _, k in ipairs(HELD_OUT) do
    local rng = rl.rng(rl.train.mix(12345, k))
    local tasks = {}
    for i = 1, 100 do tasks[i] = env.gen({ carries = k, split = "test" }, rng) end
    local b = ctx.stages.rollout(ctx, { tasks = tasks, repeats = 1, seed = 5, temperature = 0, group_base = 0 })
    local s = 0
    for _, ep in ipairs(b.episodes) do s = s + (ep.success and 1 or 0) end
    out["level" .. (k + 1)] = s / #tasks
    all = all + s
  end
  out.greedy_success = all / (100 * #HELD_OUT)
  return out
end

local rows = {}
for _, arm in ipairs(arms) do
  local tok = rl.tokenizer.bytes()
  local model = rl.model.new { vocab = tok:vocab_size(), dim = 64, layers = 2, heads = 4, ffn = 192,
    ctx = 192, seed = seed }
  local cur = curriculum(arm)
  local zero, groups = 0, 0
  local t0 = rl.clock()
  local result = rl.train {
    model = model, tokenizer = tok, env = env, name = "curriculum-" .. arm, dir = root .. "/runs",
    seed = seed, overwrite = true, curriculum = cur,
    sft = { examples = 2000, epochs = 3, lr = 3e-3, batch_size = 16 },
    steps = steps, tasks_per_step = 16, group_size = 8, minibatch = 64, max_turn_tokens = 2,
    advantage = "grpo", loss = "ppo", clip_high = 0.28, lr = 1e-3,
    evaluate = evaluate, eval = { every = steps },
    progress = false,
    on_step = function(_, mt)
      zero, groups = zero + mt["curriculum/zero_variance"], groups + 1
    end,
  }
  local a = result.after
  rows[#rows + 1] = { arm = arm, before = result.before["eval/greedy_success"], after = a["eval/greedy_success"],
    l8 = a["eval/level8"], l9 = a["eval/level9"], l10 = a["eval/level10"], zero = zero / groups,
    level = cur:brief().frontier or "-", seconds = rl.clock() - t0 }
end

print(string.format("\narith, seed %d, %d steps of 16 tasks x 8 episodes; held-out levels 8-10 (7-9 carries), 100 tasks each, greedy", seed, steps))
print(string.format("%-8s %9s %9s %8s %8s %8s %9s %12s %7s", "arm", "after SFT", "after RL", "level 8", "level 9",
  "level 10", "zero-var", "last level", "seconds"))
for _, r in ipairs(rows) do
  print(string.format("%-8s %8.1f%% %8.1f%% %7.1f%% %7.1f%% %7.1f%% %8.0f%% %12s %7.0f", r.arm, 100 * r.before,
    100 * r.after, 100 * r.l8, 100 * r.l9, 100 * r.l10, 100 * r.zero, r.level, r.seconds))
end
