-- constant_context.lua - constant-context skill learning (spec reproductions.md, section 2.2,
-- comparison 3) in miniature on envs/keychain.lua: a policy that sees only the current
-- observation behind a tracker's state block, trained with step-level SFT and then RL, against
-- the same policy size trained on the full history. Arms:
--   full    the plain keychain, every turn appended to the context (the engine's rollout); SFT
--           on the oracle's whole demonstrations, then GRPO;
--   cc      keychain.variant{constant_context = true}: each observation starts with the state
--           block "[r=3/6 d=y k=gb tried=r]" and each door that opens pays a subgoal reward of
--           0.1; the policy's prompt is that observation alone (rl.train.window.rollout{turns =
--           0}: one row per turn); step-level SFT on the same demonstrations cut into turns
--           (rl.train.window.examples), then GRPO over the episodes' returns
--           (rl.train.window.advantage);
--   window2 the plain keychain with a history window of the last 2 turns and no state block
--           (what a window alone keeps), trained as cc.
-- The same SFT demonstrations (the keychain's partly-knowing oracle, training layouts of K = 2,
-- 4, 6 rooms), the same RL tasks and step budget. Measured greedily on held-out layouts at K = 2,
-- 4, 6 and at K = 12 (horizon generalisation: a K = 12 episode of up to 38 turns does not fit
-- the full arm's context, so its column is left empty), with the mean prompt tokens per turn on
-- the held-out K = 6 episodes (for full: the context before each turn's first sampled token).
-- Expected per the paper: equal or better success with several-fold fewer prompt tokens per
-- turn (its 2-7x).
--
--   moonrl run recipes/constant_context.lua [--seed 1] [--seeds 1] [--steps 40] [--tasks 8]
--     [--group 8] [--demos 3000] [--epochs 2] [--eval-tasks 48] [--lr 1e-3]
--     [--arms full,cc,window2] [--reuse-sft] [--dir runs]
--
-- Each arm's table has two rows: after its SFT warm start (RL step 0) and after RL; the seconds
-- are the SFT's and the RL's (with evaluation). --reuse-sft loads <dir>/cc-sft-<arm>-s<seed>.bin
-- when a run with the same options wrote it.
--
-- Files go to <dir>/cc-<arm>-s<seed>/.
local rl = require "moonrl"

local root = os.getenv("MOONRL_ROOT") or "."
package.path = root .. "/?.lua;" .. package.path
local keychain = require "envs.keychain"
local R = rl.recipe

local o, why = R.args(arg, { seed = 1, seeds = 1, steps = 30, tasks = 8, group = 8, demos = 3000, epochs = 2,
  eval_tasks = 48, lr = 1e-3, arms = "full,cc,window2", reuse_sft = false, dir = root .. "/runs" })
if not o then error("constant_context.lua: " .. why, 0) end
for _, k in ipairs { "steps", "tasks", "group", "demos", "epochs", "eval_tasks" } do
  if o[k] < 1 then error("constant_context.lua: --" .. k:gsub("_", "-") .. ": a positive integer expected", 0) end
end

local cc_env = keychain.variant { constant_context = true }
-- arm -> {env =, turns = (window; nil: the full history), ctx = model context}
local ARMS = {
  full = { env = keychain, ctx = 1024 },
  cc = { env = cc_env, turns = 0, ctx = 128 },
  window2 = { env = keychain, turns = 2, ctx = 160 },
}
local arms = {}
for name in o.arms:gmatch("[^,]+") do
  if not ARMS[name] then error("constant_context.lua: --arms: unknown arm " .. name .. " (full, cc, window2)", 0) end
  arms[#arms + 1] = name
end
local EVAL_K = { 2, 4, 6, 12 }
local TURN_TOKENS = 8

-- The keychain's rollout budget: the longest training task's (K = 6) or K = 12's.
local function max_turns(k) return keychain.budget(k or 6) end

local function new_model(seed, ctx)
  local tok = rl.tokenizer.bytes()
  return rl.model.new { vocab = tok:vocab_size(), dim = 64, layers = 2, heads = 4, ffn = 192,
    ctx = ctx, seed = seed }, tok
end

-- Held-out layouts at K rooms (the same for every arm).
local function held_out_tasks(env, k)
  local rng, out = rl.rng(rl.train.mix(12345, k)), {}
  for i = 1, o.eval_tasks do out[i] = env.gen({ rooms = k, split = "test" }, rng) end
  return out
end

-- Mean prompt tokens per turn of a full-history batch: for each turn, the tokens before its
-- first sampled token.
local function full_prompt_tokens(b)
  local sum, n = 0, 0
  for i = 1, b:size() do
    local first, last = b:range(i)
    local seen = {}
    for p = first, last do
      local t = b.turns:get(p)
      if b.mask:get(p) ~= 0 and not seen[t] then
        seen[t] = true
        sum, n = sum + (p - first), n + 1
      end
    end
  end
  return n > 0 and sum / n or 0
end

-- The evaluation: greedy success per K and prompt tokens per turn at K = 6.
local function evaluate(arm, a)
  return function(ctx, step)
    local out = {}
    for _, k in ipairs(EVAL_K) do
      if not (arm == "full" and k == 12) then
        -- (each task carries its own max_turns, its budget)
        local b = ctx.stages.rollout(ctx, { tasks = held_out_tasks(a.env, k), repeats = 1, seed = 5,
          temperature = 0, group_base = 0 })
        local s = 0
        for _, ep in ipairs(b.episodes) do s = s + (ep.success and 1 or 0) end
        out["k" .. k] = s / o.eval_tasks
        if k == 6 then out.prompt_tokens = b.window and b.window.prompt_tokens or full_prompt_tokens(b) end
      end
    end
    return out
  end
end

rl.train.advantage.register("cc_window", rl.train.window.advantage { base = "grpo" })

local function one_arm(seed, arm)
  local a = ARMS[arm]
  local t0 = rl.clock()
  local m, tok = new_model(seed, a.ctx)
  local path = string.format("%s/cc-sft-%s-s%d.bin", o.dir, arm, seed)
  local examples, loss = 0, nil
  local f = o.reuse_sft and io.open(path, "rb")
  if f then -- --reuse-sft: the file a run with the same options wrote
    f:close()
    assert(m:load_checkpoint(path))
  else
    local data
    local seed_sft = rl.train.mix(seed, 0xF7)
    if a.turns then
      data = rl.train.window.examples { env = a.env, tokenizer = tok, n = o.demos, seed = seed_sft,
        turns = a.turns, max_turns = max_turns() }
    else
      data = rl.train.oracle_examples({ cfg = { env = a.env, max_turns = max_turns() }, tokenizer = tok },
        o.demos, seed_sft)
    end
    local sft = R.warm_start { model = m, data = data, epochs = o.epochs, path = path,
      seed = rl.train.mix(seed, 0x5F7) }
    examples, loss = #data, sft.final_loss
  end
  local t_sft = rl.clock() - t0
  local opts = {
    model = m, tokenizer = tok, env = a.env, name = string.format("cc-%s-s%d", arm, seed), dir = o.dir,
    seed = seed, overwrite = true, steps = o.steps, tasks_per_step = o.tasks, group_size = o.group,
    minibatch = o.tasks * o.group, max_turns = max_turns(), max_turn_tokens = TURN_TOKENS, loss = "ppo",
    clip_low = 0.2, clip_high = 0.28, lr = o.lr, progress = false, plot = false, log_episodes = 2,
    eval = { every = o.steps, tasks = o.eval_tasks, k = 1 }, evaluate = evaluate(arm, a),
  }
  if a.turns then
    opts.rollout = rl.train.window.rollout { turns = a.turns }
    opts.advantage = "cc_window"
  else
    opts.advantage = "grpo"
  end
  local t_rl = rl.clock()
  local result = rl.train(opts)
  local rows = {}
  for _, stage in ipairs { "SFT", "RL" } do
    local ev = stage == "SFT" and result.before or result.after
    local row = { arm = arm .. " " .. stage, prompt_tokens = ev["eval/prompt_tokens"],
      seconds = stage == "SFT" and t_sft or rl.clock() - t_rl }
    local cells = {}
    for _, k in ipairs(EVAL_K) do
      row["k" .. k] = ev["eval/k" .. k]
      cells[#cells + 1] = string.format("K=%d %s", k, row["k" .. k] and string.format("%.1f%%", 100 * row["k" .. k]) or "-")
    end
    rows[#rows + 1] = row
    print(string.format("  %-11s %s, %.1f prompt tokens/turn; %s", row.arm, table.concat(cells, ", "),
      row.prompt_tokens or 0, stage == "SFT" and (examples > 0 and string.format("%d examples x %d epochs, loss %.3f, %.0f s",
        examples, o.epochs, loss, t_sft) or "reused " .. path) or string.format("%d steps, %.0f s", o.steps, row.seconds)))
  end
  io.stdout:flush()
  return rows
end

local function one_seed(seed)
  print(string.format("seed %d: arms %s", seed, table.concat(arms, ",")))
  local rows = {}
  for _, arm in ipairs(arms) do
    for _, row in ipairs(one_arm(seed, arm)) do rows[#rows + 1] = row end
  end
  return rows
end

local function print_table(runs, title)
  print(string.format("\nconstant context on keychain, %s: %d demonstrations, %d RL steps of %d tasks x %d; greedy success on %d held-out layouts per K",
    title, o.demos, o.steps, o.tasks, o.group, o.eval_tasks))
  print(string.format("%-11s %12s %12s %12s %12s %15s %8s", "arm", "K=2 %", "K=4 %", "K=6 %", "K=12 %",
    "prompt tok/turn", "s"))
  for _, row in ipairs(R.summarise(runs, "arm")) do
    print(string.format("%-11s %12s %12s %12s %12s %15s %8s", row.arm, R.pm(row.k2), R.pm(row.k4), R.pm(row.k6),
      R.pm(row.k12), R.pm(row.prompt_tokens, 1), R.pm(row.seconds, 1, "%.0f")))
  end
end

R.report(o.seed, o.seeds, one_seed, print_table)
