-- quickstart.lua - what `make demo` runs: a byte-level policy learns a multi-turn task on a CPU.
--
-- The environment (envs/guess_letter.lua) hides a letter in an interval of the alphabet; the
-- agent has 4 guesses and is told "later" or "earlier" after each. A small Llama-style policy is
-- trained from scratch: first SFT on an oracle that usually guesses near the low end of the
-- interval (imperfect on purpose), then GRPO-family RL (GiGPO: episode- and step-level group
-- advantages, PPO clip-higher loss). Success on held-out tasks, never trained on, is measured
-- greedily after SFT and after RL.
--
--   moonrl run recipes/quickstart.lua [seed]        (files go to runs/quickstart/)
local rl = require "moonrl"

local root = os.getenv("MOONRL_ROOT") or "."
package.path = root .. "/?.lua;" .. package.path
local env = require "envs.guess_letter"

local seed = math.tointeger(tonumber(arg and arg[1] or "")) or 1
local tok = rl.tokenizer.bytes()
local model = rl.model.new { vocab = tok:vocab_size(), dim = 64, layers = 2, heads = 4, ffn = 192,
  ctx = 128, seed = seed }

print(string.format("quickstart: %s, policy of %d parameters, BLAS %s x%d", env.name,
  model:config().params, rl.blas_info().core, rl.blas_info().threads))

local result = rl.train {
  model = model, tokenizer = tok, env = env, name = "quickstart", dir = root .. "/runs", seed = seed,
  overwrite = true,                           -- a rerun replaces runs/quickstart/
  -- SFT warm start: 2000 oracle demonstrations, 6 epochs
  sft = { examples = 2000, epochs = 6, lr = 3e-3, batch_size = 16, warmup = 10 },
  -- RL: 240 steps of 16 tasks x 16 episodes, one PPO epoch in minibatches of 64 episodes
  steps = 240, tasks_per_step = 16, group_size = 16, minibatch = 64, epochs = 1,
  max_turn_tokens = 3, temperature = 1.0,
  advantage = "gigpo", gamma = 0.8,           -- a success found sooner is worth more
  loss = "ppo", clip_low = 0.2, clip_high = 0.28,
  lr = 2e-3, schedule = "cosine", min_lr = 2e-4,
  eval = { every = 30, tasks = 256, k = 4 },  -- held-out: greedy success and pass@4
}

local b, a = result.before, result.after
print(string.format("SFT: %d examples, final loss %.3f, %.0f s", result.sft.examples,
  result.sft.final_loss, result.sft.seconds))
print(string.format("held-out greedy success: after SFT %.1f%%, after RL %.1f%% (%+.1f points)",
  100 * b["eval/greedy_success"], 100 * a["eval/greedy_success"],
  100 * (a["eval/greedy_success"] - b["eval/greedy_success"])))
print(string.format("held-out sampled success: after SFT %.1f%%, after RL %.1f%%; pass@4 %.1f%% -> %.1f%%",
  100 * b["eval/sample_success"], 100 * a["eval/sample_success"], 100 * b["eval/pass_at_k"],
  100 * a["eval/pass_at_k"]))
print("files: " .. result.dir .. "/metrics.jsonl, episodes.jsonl, curve.svg, state.json")
print("report: " .. result.dir .. "/report.html")
