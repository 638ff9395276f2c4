-- short_run.lua - a short training run for the report tests: a tiny byte-level policy on
-- envs/guess_letter.lua (multi-turn: successes, failures and several end reasons), 6 RL steps
-- with a held-out evaluation every 3, into DIR/short (report.html is written by the trainer).
--
--   moonrl run tests/report/short_run.lua DIR
local rl = require "moonrl"

local root = os.getenv("MOONRL_ROOT") or "."
local dir = assert(arg and arg[1], "usage: moonrl run tests/report/short_run.lua DIR")
local env = dofile(root .. "/envs/guess_letter.lua")
local tok = rl.tokenizer.bytes()
local model = rl.model.new { vocab = tok:vocab_size(), dim = 32, layers = 1, heads = 2, ffn = 64,
  ctx = 96, seed = 5 }
local r = rl.train {
  model = model, tokenizer = tok, env = env, name = "short", dir = dir, seed = 5, steps = 6,
  tasks_per_step = 4, group_size = 4, minibatch = 16, max_turn_tokens = 3, lr = 3e-3,
  sft = { examples = 400, epochs = 2, lr = 3e-3, batch_size = 16 },
  log_episodes = 3, eval = { every = 3, tasks = 16, k = 2 }, progress = false, overwrite = true,
}
print(r.dir .. "/report.html")
