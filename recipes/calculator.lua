-- calculator.lua - train a policy to use a tool: envs/calculator.lua (about 50 lines of Lua, no
-- C) with rl.train. SFT on an oracle that calls the `add` tool only half of the time, then GRPO.
--
--   moonrl run recipes/calculator.lua [seed]        (files go to runs/calculator/)
local rl = require "moonrl"

local root = os.getenv("MOONRL_ROOT") or "."
package.path = root .. "/?.lua;" .. package.path
local env = require "envs.calculator"

local seed = math.tointeger(tonumber(arg and arg[1] or "")) or 1
local tok = rl.tokenizer.bytes()
local model = rl.model.new { vocab = tok:vocab_size(), dim = 64, layers = 2, heads = 4, ffn = 192,
  ctx = 128, seed = seed }

local result = rl.train {
  model = model, tokenizer = tok, env = env, name = "calculator", dir = root .. "/runs", seed = seed,
  overwrite = true, -- a rerun replaces runs/calculator/
  sft = { examples = 2000, epochs = 6, lr = 3e-3, batch_size = 16, warmup = 10 },
  steps = 100, tasks_per_step = 16, group_size = 8, minibatch = 32,
  max_turn_tokens = 12, advantage = "grpo", loss = "ppo", clip_high = 0.28,
  lr = 1e-3, schedule = "cosine", min_lr = 1e-4,
  eval = { every = 10, tasks = 128, k = 4 },
}

local b, a = result.before, result.after
print(string.format("held-out greedy success: after SFT %.1f%%, after RL %.1f%%",
  100 * b["eval/greedy_success"], 100 * a["eval/greedy_success"]))
