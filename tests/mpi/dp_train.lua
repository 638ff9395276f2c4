-- dp_train.lua - a small rl.train run for the data-parallel tests (tests/lua/mpi_spec.lua), run
-- with moonrl run under mpirun -np N (or alone):
--   moonrl run tests/mpi/dp_train.lua DIR VARIANT [STOP_AFTER] [resume]
-- VARIANT: "ppo" (GiGPO advantages, PPO loss with KL to the reference and an entropy bonus,
-- sampling at temperature 0.9, so the old log-probs are scored), "critic" (GAE with a value
-- head) or "agentlib" (a reward graph of four terms, a learnability curriculum over a pool with a
-- resampling zero-variance gate) or "tree" (tree rollouts branching after turn 1, GiGPO). Every step each rank's model digest is gathered; rank 0 writes DIR/result.json with, per
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
    -- what the global batch decides (reward terms, curriculum, sampling): equal, not close
    local global = {}
    for k, v in pairs(mt) do
      if type(v) == "number" and (k:find("^reward/") or k:find("^curriculum/") or k:find("^sampling/")) then
        global[k] = v
      end
    end
    steps[#steps + 1] = { step = step, digest = all[1], same = same, ranks = #all,
      loss = mt["loss/loss"], reward = mt["reward/mean"], eval = mt["eval/greedy_success"],
      global = global }
  end,
}
if variant == "ppo" then
  opts.advantage, opts.gamma, opts.temperature = "gigpo", 0.8, 0.9
  opts.kl_coef, opts.entropy_coef = 0.05, 0.01
elseif variant == "critic" then
  opts.advantage, opts.temperature = "gae", 1.0
elseif variant == "agentlib" then
  -- a reward graph and a curriculum with a resampling gate: their statistics see the global batch
  local R, C = rl.reward, rl.curriculum
  -- (lr 1e-3: this run's gate resamples, more steps of AdamW let rounding grow; at 2e-3 its
  -- parameters end 5.2e-7 apart, near the tests' 1e-6)
  opts.advantage, opts.temperature, opts.lr = "grpo", 1.0, 1e-3
  opts.reward = R.graph { name = "dp", terms = {
    R.env { name = "correct" },
    R.format { name = "style", pattern = "^%l", where = "each_turn", weight = 0.1 },
    R.budget { turns = 0.02 },
    R.metric("turns", function(ep) return ep.turns end),
  } }
  opts.curriculum = C.new { source = C.pool { env = env, split = "train", size = 48, seed = 2 },
    sampler = C.learnability {}, gate = C.gate { reject = "zero_variance", resample = true, max_tries = 2 },
    seed = 4 }
elseif variant == "tree" then
  -- tree rollouts: each task's 2 roots branch into 2 episodes after turn 1 (GiGPO compares them)
  opts.advantage, opts.gamma, opts.temperature, opts.tree = "gigpo", 0.8, 1.0, { turn = 1, k = 2 }
else
  error("VARIANT: ppo, critic, agentlib or tree expected, got " .. tostring(variant))
end
local result = rl.train(opts)
if rl.comm.rank() == 0 then
  assert(model:save(result.dir .. "/final"))
  assert(rl.fs.write(result.dir .. "/result.json", rl.json.encode { steps = steps,
    ranks = rl.comm.size(), backend = rl.comm.backend() }))
end
