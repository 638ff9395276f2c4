-- curriculum.lua - a band curriculum against uniform sampling over the levels and against fixed
-- sampling at the hardest level (acceptance test 10 of the agent library). The same policy, seed
-- and step budget in each arm; measured greedily on held-out tasks of levels 8 to 10.
--   band      rl.curriculum.band{low = .2, high = .8} over the ten levels, from the first;
--   uniform   rl.curriculum.uniform() over the ten levels;
--   hardest   the last level only.
-- Two environments: envs/chain.lua (the default: level L chains L ops, one new op a level, so
-- the skills come in order; the warm start knows two ops and guesses the others) and
-- envs/arith.lua (10-digit additions; the level is the number of carries, one skill that every
-- level exercises; the warm start forgets most carries).
--
--   moonrl run recipes/curriculum.lua [seed] [steps] [arms] [chain|arith]
--
-- arms: a comma-separated subset of band,uniform,hardest (all three by default); files go to
-- runs/curriculum-<arm>/. chain: 300 steps by default, about 5 minutes on 2 cores; arith: 60
-- steps, about a minute. The README ("Curricula") has the tables of both. Knobs, for
-- experiments: CUR_ENT (the entropy bonus; chain .01, arith 0), CUR_KL (the KL coefficient),
-- CUR_MS and CUR_CD (the band's min_samples, 32, and cooldown, 4), CUR_MIX ("frontier,review,
-- explore" shares, default ".7,.2,.1"), CUR_TAG (a suffix of the run folders, for runs side by side).
local rl = require "moonrl"

local root = os.getenv("MOONRL_ROOT") or "."
package.path = root .. "/?.lua;" .. package.path
local C = rl.curriculum

local seed = math.tointeger(tonumber(arg and arg[1] or "")) or 1
local steps_arg = math.tointeger(tonumber(arg and arg[2] or ""))
local arms = {}
for name in ((arg and arg[3]) or "band,uniform,hardest"):gmatch("[^,]+") do arms[#arms + 1] = name end
local env_name = (arg and arg[4]) or "chain"

-- Each environment's level parameter (its name and ten values; the last three are held out)
-- and training settings.
-- chain's warm start sees each random answer once (32,000 examples, one epoch: with 4,000 x 8
-- the policy learnt the random answers by heart and was as sure of a wrong answer as of a right
-- one); PPO makes 4 passes over each batch, samples at temperature 1.3, and a KL term (0.1, to
-- the warm start) and an entropy bonus (.01) keep the ops not yet learnt from collapsing onto
-- one wrong symbol: a task that reaches such an answer fails in all 8 episodes of its group, so
-- GRPO has no gradient to undo it (without the bonus, seed 1 sat at 6 ops for 200 steps with
-- op f's answer to 0 given as op d's "N" 92% of the time).
local FAMILIES = {
  chain = { param = "ops", first = 1, last = 10, steps = 300, epochs = 4, temperature = 1.3,
    kl_coef = 0.1, entropy_coef = 0.01,
    sft = { examples = 32000, epochs = 1, lr = 3e-3, batch_size = 16 } },
  arith = { param = "carries", first = 0, last = 9, steps = 60, epochs = 1, temperature = 1, kl_coef = 0, entropy_coef = 0,
    sft = { examples = 2000, epochs = 3, lr = 3e-3, batch_size = 16 } },
}
local fam = FAMILIES[env_name]
if not fam then error("curriculum.lua: unknown environment " .. env_name .. " (chain or arith)", 0) end
local env = require("envs." .. env_name)
local steps = steps_arg or fam.steps
local HELD_OUT = { fam.last - 2, fam.last - 1, fam.last }

local function curriculum(arm)
  if arm ~= "band" and arm ~= "uniform" and arm ~= "hardest" then
    error("curriculum.lua: unknown arm " .. arm .. " (band, uniform or hardest)", 0)
  end
  local levels = arm == "hardest" and C.levels { fam.last } or C.range { fam.first, fam.last }
  local sampler = arm == "band" and C.band { low = 0.2, high = 0.8, min_samples = math.tointeger(tonumber(os.getenv("CUR_MS") or "")) or 32,
    cooldown = math.tointeger(tonumber(os.getenv("CUR_CD") or "")) or 4 } or C.uniform()
  local mx = nil
  if arm == "band" and os.getenv("CUR_MIX") then
    local f, r, e = os.getenv("CUR_MIX"):match("^([%d.]+),([%d.]+),([%d.]+)$")
    if not f then error("curriculum.lua: CUR_MIX: \"frontier,review,explore\" shares expected, got " .. os.getenv("CUR_MIX"), 0) end
    mx = { frontier = tonumber(f), review = tonumber(r), explore = tonumber(e) }
  end
  return C.new { seed = seed, sampler = sampler, mix = mx,
    source = C.procedural { gen = env.gen, params = { [fam.param] = levels } } }
end

-- Held-out success by level: 100 greedy episodes at each of the three hardest levels.
local function evaluate(ctx)
  local out, all = {}, 0
  for _, k in ipairs(HELD_OUT) do
    local rng = rl.rng(rl.train.mix(12345, k))
    local tasks = {}
    for i = 1, 100 do tasks[i] = env.gen({ [fam.param] = k, split = "test" }, rng) end
    local b = ctx.stages.rollout(ctx, { tasks = tasks, repeats = 1, seed = 5, temperature = 0, group_base = 0 })
    local s = 0
    for _, ep in ipairs(b.episodes) do s = s + (ep.success and 1 or 0) end
    out["level" .. (k - fam.first + 1)] = s / #tasks
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
    model = model, tokenizer = tok, env = env, name = "curriculum-" .. arm .. (os.getenv("CUR_TAG") or ""), dir = root .. "/runs",
    seed = seed, overwrite = true, curriculum = cur,
    sft = fam.sft,
    steps = steps, tasks_per_step = 16, group_size = 8, minibatch = 64, max_turn_tokens = 2,
    advantage = "grpo", loss = "ppo", clip_high = 0.28, lr = 1e-3, epochs = fam.epochs,
    temperature = fam.temperature, kl_coef = tonumber(os.getenv("CUR_KL") or "") or fam.kl_coef,
    entropy_coef = tonumber(os.getenv("CUR_ENT") or "") or fam.entropy_coef,
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

print(string.format("\n%s, seed %d, %d steps of 16 tasks x 8 episodes; held-out tasks of levels 8-10 (%s %d-%d), 100 each, greedy",
  env_name, seed, steps, fam.param, HELD_OUT[1], HELD_OUT[3]))
print(string.format("%-8s %9s %9s %8s %8s %8s %9s %12s %7s", "arm", "after SFT", "after RL", "level 8", "level 9",
  "level 10", "zero-var", "last level", "seconds"))
for _, r in ipairs(rows) do
  print(string.format("%-8s %8.1f%% %8.1f%% %7.1f%% %7.1f%% %7.1f%% %8.0f%% %12s %7.0f", r.arm, 100 * r.before,
    100 * r.after, 100 * r.l8, 100 * r.l9, 100 * r.l10, 100 * r.zero, r.level, r.seconds))
end
