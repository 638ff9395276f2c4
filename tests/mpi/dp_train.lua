-- dp_train.lua - a small rl.train run for the data-parallel tests (tests/lua/mpi_spec.lua), run
-- with moonrl run under mpirun -np N (or alone):
--   moonrl run tests/mpi/dp_train.lua DIR VARIANT [STOP_AFTER] [resume]
-- VARIANT: "ppo" (GiGPO advantages, PPO loss with KL to the reference and an entropy bonus,
-- sampling at temperature 0.9, so the old log-probs are scored) or "critic" (GAE with a value
-- head). Every step each rank's model digest is gathered; rank 0 writes DIR/result.json with, per
-- step, the digest, whether every rank had it, the loss and the reward, and saves the final
-- weights in DIR/final (safetensors).
local rl = require "moonrl"
local root = os.getenv("MOONRL_ROOT") or "."
package.path = root .. "/?.lua;" .. package.path
local env = require "envs.guess_letter"

local dir, variant = assert(arg[1], "DIR expected"), arg[2] or "ppo"
local stop_after = math.tointeger(tonumber(arg[3] or ""))
local resume = arg[4] == "resume"
local tok = rl.tokenizer.bytes()
local model = rl.model.new { vocab = tok:vocab_size(), dim = 32, layers = 1, heads = 2, ffn = 64,
  ctx = 96, seed = 3 }
local steps = {}
local opts = {
  model = model, tokenizer = tok, env = env, name = variant, dir = dir, seed = 5,
  overwrite = not resume, resume = resume, stop_after = stop_after, progress = false,
  sft = { examples = 600, epochs = 3, lr = 3e-3, batch_size = 16 },
  steps = 4, tasks_per_step = 6, group_size = 4, minibatch = 10, epochs = 2,
  max_turn_tokens = 3, lr = 2e-3, checkpoint_every = 2,
  eval = { every = 2, tasks = 10, k = 2 },
  on_step = function(step, mt)
    local all = rl.comm.allgather(model:digest())
    local same = true
    for r = 2, #all do same = same and all[r] == all[1] end
    steps[#steps + 1] = { step = step, digest = all[1], same = same, ranks = #all,
      loss = mt["loss/loss"], reward = mt["reward/mean"], eval = mt["eval/greedy_success"] }
  end,
}
if variant == "ppo" then
  opts.advantage, opts.gamma, opts.temperature = "gigpo", 0.8, 0.9
  opts.kl_coef, opts.entropy_coef = 0.05, 0.01
elseif variant == "critic" then
  opts.advantage, opts.temperature = "gae", 1.0
else
  error("VARIANT: ppo or critic expected, got " .. tostring(variant))
end
local result = rl.train(opts)
if rl.comm.rank() == 0 then
  assert(model:save(result.dir .. "/final"))
  assert(rl.fs.write(result.dir .. "/result.json", rl.json.encode { steps = steps,
    ranks = rl.comm.size(), backend = rl.comm.backend() }))
end
