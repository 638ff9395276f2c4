-- bench_dp.lua - one data-parallel training run for scripts/bench_dp.sh: the quickstart's policy
-- and task (no SFT, no evaluation), STEPS steps of 16 tasks x 16 episodes, minibatches of 64;
-- rank 0 prints one tab-separated line: ranks, then the medians over steps 2.. of the step's
-- seconds, its rollout and update seconds, and the share of the step spent in collectives
-- (time/comm, waiting for the slower rank included).
--   mpirun -np N moonrl run scripts/bench_dp.lua DIR [STEPS]
local rl = require "moonrl"
local root = os.getenv("MOONRL_ROOT") or "."
package.path = root .. "/?.lua;" .. package.path
local env = require "envs.guess_letter"

local dir, steps = assert(arg[1], "DIR expected"), math.tointeger(tonumber(arg[2] or "")) or 12
local tok = rl.tokenizer.bytes()
local model = rl.model.new { vocab = tok:vocab_size(), dim = 64, layers = 2, heads = 4, ffn = 192,
  ctx = 128, seed = 1 }
local rows = {}
rl.train {
  model = model, tokenizer = tok, env = env, name = "bench_dp", dir = dir, seed = 1,
  overwrite = true, progress = false, sft = false, eval = false, plot = false,
  steps = steps, tasks_per_step = 16, group_size = 16, minibatch = 64, epochs = 1,
  max_turn_tokens = 3, advantage = "gigpo", gamma = 0.8, lr = 2e-3,
  on_step = function(step, mt)
    if step > 1 then
      rows[#rows + 1] = { mt["time/step"], mt["time/rollout"], mt["time/update"],
        (mt["time/comm"] or 0) / mt["time/step"] }
    end
  end,
}
local function median(k)
  local v = {}
  for i, r in ipairs(rows) do v[i] = r[k] end
  table.sort(v)
  return v[(#v + 1) // 2]
end
print(string.format("%d\t%.4f\t%.4f\t%.4f\t%.4f", rl.comm.size(), median(1), median(2), median(3), median(4)))
