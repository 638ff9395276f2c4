-- horizon.lua - horizon and backward curricula on a 12-step key-and-door task
-- (envs/navigate.lua): the same policy, seed and step budget trained three ways, then measured
-- on held-out tasks at the full horizon (10 moves, max_turns 12):
--   full      the full task from the start (max_turns 12);
--   horizon   max_turns grown from 4 to 12 by a band curriculum (rl.curriculum.horizon as a
--             parameter of a procedural source whose tasks need max_turns - 2 moves: the same
--             two spare moves as the full task, from 2 moves up);
--   backward  full tasks started k moves before the end of a shortest path (rl.curriculum.backward:
--             the path replayed, the env cloned for each episode), k grown from 2 by a band.
-- The SFT warm start teaches the reply format only (the oracle moves at random), so what a policy
-- knows of the way it learns from reward. GiGPO (gamma .9; the compass reading is the state_key)
-- with PPO and a KL term (0.1, to the warm start) that keeps the reply format: without it the
-- horizon arm (seed 1) answered with empty replies from step ~90 on, every group failed and
-- nothing was learnt again (0% held out).
--
--   moonrl run recipes/horizon.lua [seed] [steps] [arms]     (files go to runs/horizon-<arm>/)
--
-- arms: a comma-separated subset of full,horizon,backward (all three by default). About 4 minutes
-- on 2 cores (the README, "Curricula", has the tables). Knobs, for experiments: HZ_KL (0.1),
-- HZ_ENT (the entropy bonus, 0), HZ_TAG (a suffix of the run folders, for runs side by side).
local rl = require "moonrl"

local root = os.getenv("MOONRL_ROOT") or "."
package.path = root .. "/?.lua;" .. package.path
local env = require "envs.navigate"
local C = rl.curriculum

local seed = math.tointeger(tonumber(arg and arg[1] or "")) or 1
local steps = math.tointeger(tonumber(arg and arg[2] or "")) or 100
local arms = {}
for name in ((arg and arg[3]) or "full,horizon,backward"):gmatch("[^,]+") do arms[#arms + 1] = name end

local band = function() return C.band { low = 0.2, high = 0.8, min_samples = 32, cooldown = 2 } end
local function curriculum(arm)
  if arm == "horizon" then
    return C.new { seed = seed, sampler = band(), source = C.procedural {
      gen = function(p, rng) return env.gen({ length = p.max_turns - 2 }, rng) end,
      params = { max_turns = C.horizon { start = 4, stop = 12 } } } }
  elseif arm == "backward" then
    return C.new { seed = seed, sampler = band(),
      source = C.backward { env = env, demos = env.solve, k = C.range { 2, 10 } } }
  elseif arm ~= "full" then
    error("horizon.lua: unknown arm " .. arm .. " (full, horizon or backward)")
  end
  return nil
end

local rows = {}
for _, arm in ipairs(arms) do
  local tok = rl.tokenizer.bytes()
  local model = rl.model.new { vocab = tok:vocab_size(), dim = 64, layers = 2, heads = 4, ffn = 192,
    ctx = 256, seed = seed }
  local cur = curriculum(arm)
  local zero, n = 0, 0
  local t0 = rl.clock()
  local result = rl.train {
    model = model, tokenizer = tok, env = env, name = "horizon-" .. arm .. (os.getenv("HZ_TAG") or ""), dir = root .. "/runs",
    seed = seed, overwrite = true, curriculum = cur,
    sft = { examples = 2000, epochs = 3, lr = 3e-3, batch_size = 16 },
    steps = steps, tasks_per_step = 16, group_size = 8, minibatch = 64, max_turn_tokens = 2,
    advantage = "gigpo", gamma = 0.9, loss = "ppo", clip_high = 0.28, lr = 1e-3,
    kl_coef = tonumber(os.getenv("HZ_KL") or "") or 0.1, entropy_coef = tonumber(os.getenv("HZ_ENT") or "") or 0,
    eval = { every = steps, tasks = 200, k = 1 },
    progress = false,
    on_step = function(_, mt) zero, n = zero + (mt.zero_variance_groups or 1), n + 1 end,
  }
  local last = cur and cur:brief() or nil
  rows[#rows + 1] = { arm = arm, before = result.before["eval/greedy_success"],
    after = result.after["eval/greedy_success"],
    zero = zero / n, level = last and last.frontier or "-", seconds = rl.clock() - t0 }
end

print(string.format("\nnavigate, seed %d, %d steps of 16 tasks x 8 episodes; held-out full-horizon tasks (200, greedy)", seed, steps))
print(string.format("%-9s %10s %10s %10s %14s %8s", "arm", "after SFT", "after RL", "zero-var", "last frontier", "seconds"))
local full
for _, r in ipairs(rows) do
  if r.arm == "full" then full = r.after end
  print(string.format("%-9s %9.1f%% %9.1f%% %9.0f%% %14s %8.0f", r.arm, 100 * r.before, 100 * r.after,
    100 * r.zero, r.level, r.seconds))
end
if full then
  for _, r in ipairs(rows) do
    if r.arm ~= "full" then
      print(string.format("%s / full: %s", r.arm, full > 0 and string.format("%.2fx", r.after / full)
        or (r.after > 0 and "inf (full-horizon training solved none)" or "0 / 0")))
    end
  end
end
