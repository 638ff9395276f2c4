-- act.lua - ACT, Agentic Critical Training (spec reproductions.md, section 3.7), in miniature on
-- envs/keychain.lua at K rooms. The expert is the environment's perfect oracle (keychain.solve);
-- `demos` of its trajectories on training layouts are all the data every pipeline gets:
--   IL            SFT on the demonstrations (il_epochs epochs);
--   IL+           the same with as many more optimizer steps as ACT takes (the paper's
--                 matched-duration control);
--   ACT>IL        first ACT: at each state of the demonstrations where the expert takes a key,
--                 the expert's action and another (a random other key on the floor: a fresh byte
--                 policy's samples are not actions, so they cannot be the alternative as in the
--                 paper) are shown in a random order, "A:take g B:take b", and GRPO rewards the
--                 reply that names the expert's letter (1, else 0; one byte, no reasoning), after
--                 4 epochs of SFT on 256 pairs with random letters for the reply format (a fresh
--                 byte policy almost never says A or B); then the same SFT as IL;
--   IL>RL, ACT>IL>RL  the IL and ACT>IL policies after rl_steps of GRPO on the keychain itself.
-- Measured greedily on held-out layouts (eval_tasks) at K rooms; the table also gives the ACT
-- stage's accuracy on pairs from held-out layouts (ACT pipelines) and the seconds of each stage.
-- Expected per the paper: ACT>IL > IL and ACT>IL>RL > IL>RL by a few points. A byte policy cannot
-- reason before it answers, which the paper credits for part of the gain.
--
--   moonrl run recipes/act.lua [--seed 1] [--seeds 3] [--rooms 2] [--demos 40] [--il-epochs 40]
--     [--act-steps 60] [--rl-steps 20] [--tasks 8] [--group 8] [--eval-tasks 64] [--lr 1e-3]
--     [--dir runs]
--
-- Files go to <dir>/act-<pipeline>-s<seed>/.
local rl = require "moonrl"
local batchlib = require "moonrl.batch"

local root = os.getenv("MOONRL_ROOT") or "."
package.path = root .. "/?.lua;" .. package.path
local keychain = require "envs.keychain"
local R = rl.recipe

local o, why = R.args(arg, { seed = 1, seeds = 1, rooms = 2, demos = 40, il_epochs = 40, act_steps = 60,
  rl_steps = 20, tasks = 8, group = 8, eval_tasks = 64, lr = 1e-3, dir = root .. "/runs" })
if not o then error("act.lua: " .. why, 0) end
for _, k in ipairs { "rooms", "demos", "il_epochs", "act_steps", "rl_steps", "tasks", "group", "eval_tasks" } do
  if o[k] < 1 then error("act.lua: --" .. k:gsub("_", "-") .. ": a positive integer expected", 0) end
end
if o.rooms > 6 then error("act.lua: --rooms: at most 6 (the training layouts' largest K)", 0) end

local K, BATCH, FORMAT, FORMAT_EPOCHS = o.rooms, 16, 256, 4
local MAX_TURNS = keychain.budget(K)

local function new_model(seed)
  local tok = rl.tokenizer.bytes()
  return rl.model.new { vocab = tok:vocab_size(), dim = 64, layers = 2, heads = 4, ffn = 192,
    ctx = 96 * K + 128, seed = seed }, tok
end

-- Training layouts at K rooms; their expert demonstrations.
local function layouts(split, n, seed)
  local rng, out = rl.rng(seed), {}
  for i = 1, n do out[i] = keychain.gen({ rooms = K, split = split }, rng) end
  return out
end

-- The keychain with the perfect oracle and K-room tasks (what the SFT data comes from).
local expert_env = setmetatable({
  oracle = function(task) return keychain.solve(task) end,
  tasks = function(split, n, seed) return layouts(split, n, seed) end,
}, { __index = keychain })

-- The states of the expert's trajectories where it takes a key: {obs =, expert =, keys =}.
local function key_states(tasks)
  local out = {}
  for _, task in ipairs(tasks) do
    local inst, record = keychain.new(), {}
    local obs = inst:reset(task)
    for _, a in ipairs(keychain.solve(task)) do
      local c = a:match("^take (%a)$")
      if c then out[#out + 1] = { obs = obs, expert = c, keys = task.keys[inst.room] } end
      local next_obs, _, done = rl.env.step(keychain, inst, a, record)
      if done then break end
      obs = next_obs
    end
  end
  return out
end

-- A pair from a state: the expert's key and another on the floor, in an order drawn from rng.
local function pair_of(state, rng)
  local others = {}
  for _, k in ipairs(state.keys) do if k ~= state.expert then others[#others + 1] = k end end
  local other = others[rng:random(#others)]
  local expert_first = rng:random(2) == 1
  local a, b = expert_first and state.expert or other, expert_first and other or state.expert
  return { obs = state.obs, a = a, b = b, answer = expert_first and "A" or "B" }
end

local function pair_text(p) return string.format("%s\nA:take %s\nB:take %s", p.obs, p.a, p.b) end
local ACT_SYSTEM = "pick the action that opens the door: reply A or B"

-- ACT's judging environment: one turn, the reply names the expert's action.
local function act_env(states)
  return {
    name = "act-pairs",
    max_turns = 1,
    system = ACT_SYSTEM,
    tasks = function(_, n, seed)
      local rng, out = rl.rng(seed), {}
      for i = 1, n do out[i] = pair_of(states[rng:random(#states)], rng) end
      return out
    end,
    new = function()
      return {
        reset = function(self, task)
          self.task = task
          return pair_text(task)
        end,
        step = function(self, action)
          local ok = action == self.task.answer
          return nil, ok and 1 or 0, true, { success = ok }
        end,
      }
    end,
  }
end

-- Greedy success of m on tasks in env.
local function success(m, tok, env, tasks, max_turns, turn_tokens)
  local ro = rl.rollout.new { model = m, episodes = #tasks, capacity = m:config().ctx }
  local seeds, groups = {}, {}
  for i = 1, #tasks do seeds[i], groups[i] = 1000 + i, i end
  local res = ro:run { tokenizer = tok, env = env, tasks = tasks, seeds = seeds, max_turns = max_turns,
    max_turn_tokens = turn_tokens, temperature = 0 }
  local s = batchlib.from_rollout(ro, res, groups):stats().success
  ro:free()
  return s
end

local function held_out(m, tok)
  return success(m, tok, keychain, layouts("test", o.eval_tasks, rl.train.mix(12345, K)), MAX_TURNS, 8)
end

-- GRPO on env for `steps` steps from m as it is (PPO clip 0.2 / 0.28).
local function grpo(m, tok, env, name, seed, steps, tasks, turn_tokens)
  local t0 = rl.clock()
  rl.train { model = m, tokenizer = tok, env = env, name = name, dir = o.dir, seed = seed, overwrite = true,
    steps = steps, tasks_per_step = o.tasks, group_size = o.group, minibatch = o.tasks * o.group,
    max_turns = env.max_turns, max_turn_tokens = turn_tokens, loss = "ppo", clip_low = 0.2,
    clip_high = 0.28, lr = o.lr, eval = false, progress = false, plot = false, tasks = tasks }
  m:reset_optimizer()
  return rl.clock() - t0
end

local function keychain_tasks(_, _, n, s) return layouts("train", n, s) end

-- One seed: the rows of the table.
local function one_seed(seed)
  local t0 = rl.clock()
  local demo_tasks = layouts("train", o.demos, rl.train.mix(seed, 0xDE))
  local data = rl.train.oracle_examples({ cfg = { env = expert_env, max_turns = MAX_TURNS },
    tokenizer = rl.tokenizer.bytes() }, o.demos, rl.train.mix(seed, 0xDE))
  local states = key_states(demo_tasks)
  local test_states = key_states(layouts("test", o.eval_tasks, rl.train.mix(12345, K)))
  local pairs = act_env(states)
  local test_pairs = pairs.tasks("test", #test_states, rl.train.mix(seed, 0x7E))
  do -- the held-out pairs come from held-out layouts' states
    local rng = rl.rng(rl.train.mix(seed, 0x7E))
    for i, st in ipairs(test_states) do test_pairs[i] = pair_of(st, rng) end
  end
  -- The reply format first (a fresh byte policy almost never says "A" or "B", so GRPO would see
  -- no reward): FORMAT_EPOCHS epochs of SFT on FORMAT pairs of training states whose letters are drawn at
  -- random, which says nothing about which action is the expert's.
  local frng, format = rl.rng(rl.train.mix(seed, 0xF0)), {}
  for i = 1, FORMAT do
    local p = pair_of(states[frng:random(#states)], frng)
    format[i] = rl.sft_example(rl.tokenizer.bytes(), { { role = "system", content = ACT_SYSTEM },
      { role = "user", content = pair_text(p) }, { role = "assistant", content = frng:random(2) == 1 and "A" or "B" } })
  end
  local per_epoch = (#data + BATCH - 1) // BATCH
  local act_updates = FORMAT_EPOCHS * FORMAT // BATCH + o.act_steps
  local extra = (act_updates + per_epoch - 1) // per_epoch
  print(string.format("seed %d: %d expert demonstrations (%d key choices), SFT %d epochs x %d steps; IL+ %d more epochs",
    seed, #data, #states, o.il_epochs, per_epoch, extra))
  io.stdout:flush()

  local function sft(m, epochs, tag)
    local t = rl.clock()
    local r = R.warm_start { model = m, data = data, epochs = epochs, batch_size = BATCH,
      path = string.format("%s/act-%s-s%d.bin", o.dir, tag, seed), seed = rl.train.mix(seed, 0x5F7) }
    return rl.clock() - t, r.final_loss
  end

  local rows = {}
  local function report(row)
    rows[#rows + 1] = row
    print(string.format("  %-10s held-out %5.1f%%%s  %.0f s", row.pipeline, 100 * row.success,
      row.pair and string.format("  pairs %5.1f%%", 100 * row.pair) or "", row.seconds))
    io.stdout:flush()
  end

  -- IL, then IL>RL
  local m, tok = new_model(seed)
  local secs = sft(m, o.il_epochs, "il")
  report { pipeline = "IL", success = held_out(m, tok), seconds = secs }
  secs = secs + grpo(m, tok, keychain, "act-il-rl-s" .. seed, seed, o.rl_steps, keychain_tasks, 8)
  local il_rl = { pipeline = "IL>RL", success = held_out(m, tok), seconds = secs }

  -- IL+ (matched optimizer steps)
  m, tok = new_model(seed)
  secs = sft(m, o.il_epochs + extra, "ilplus")
  report { pipeline = "IL+", success = held_out(m, tok), seconds = secs }

  -- ACT>IL, then ACT>IL>RL
  m, tok = new_model(seed)
  local t_format = rl.clock()
  rl.sft { model = m, data = format, epochs = FORMAT_EPOCHS, batch_size = BATCH, lr = 3e-3, seed = rl.train.mix(seed, 0xF1) }
  m:reset_optimizer()
  local pair0 = success(m, tok, pairs, test_pairs, 1, 1)
  secs = rl.clock() - t_format + grpo(m, tok, pairs, "act-act-s" .. seed, seed, o.act_steps, nil, 1)
  local pair = success(m, tok, pairs, test_pairs, 1, 1)
  local s2 = sft(m, o.il_epochs, "act-il")
  secs = secs + s2
  report { pipeline = "ACT>IL", success = held_out(m, tok), pair = pair, seconds = secs }
  report(il_rl)
  secs = secs + grpo(m, tok, keychain, "act-act-il-rl-s" .. seed, seed, o.rl_steps, keychain_tasks, 8)
  report { pipeline = "ACT>IL>RL", success = held_out(m, tok), pair = pair, seconds = secs }
  print(string.format("  ACT pair accuracy on held-out layouts: %.1f%% after the format warm-up, %.1f%% after ACT (%d pairs); seed %d took %.0f s",
    100 * pair0, 100 * pair, #test_pairs, seed, rl.clock() - t0))
  return rows
end

local function print_table(runs, title)
  print(string.format("\nACT on keychain K=%d, %d demonstrations, %s: greedy success on %d held-out layouts", K,
    o.demos, title, o.eval_tasks))
  print(string.format("%-10s %12s %12s %8s", "pipeline", "held-out %", "pairs %", "s"))
  for _, row in ipairs(R.summarise(runs, "pipeline")) do
    print(string.format("%-10s %12s %12s %8s", row.pipeline, R.pm(row.success), R.pm(row.pair),
      R.pm(row.seconds, 1, "%.0f")))
  end
end

R.report(o.seed, o.seeds, one_seed, print_table)
