-- search_fatal.lua - OpenSearch-VL's fatal-aware GRPO on envs/kbqa.lua with a faulty search tool
-- (spec reproductions.md, section 3.2): kbqa.variant{faults = 0.1, cascade = true}, where each
-- search fails with probability 0.1 ("error: search failed") and after a malformed call the tool
-- is down until the episode ends ("error: search down"), failed turns setting info.error. The warm start is
-- search_qa.lua's (SFT on the oracle's demonstrations in the plain environment, which never
-- fails; the same file, so either recipe's --reuse-sft reuses the other's); each arm loads it and
-- runs GRPO with the same seed, tasks and steps on the faulty environment:
--   none   no masking: fatal episodes are trained on like any other;
--   drop   fatal = {drop = true}: fatal episodes (3 consecutive failed turns) leave the group
--          statistics and the loss;
--   fatal  fatal = true (fatal-aware): a fatal episode's turns from the start of the failed run
--          on leave the loss, the turns before it keep only non-negative advantages.
-- The table: held-out success (greedy, in the faulty environment, 32 questions per hop count,
-- the same failures for every arm) during training and at the end, per hop count; the tool-call
-- rate (search turns per turn) of the training episodes in each third of the steps; the share of
-- training episodes that were fatal (rl.train.advantage.fatal_turn, threshold 3, counted in
-- every arm); the seconds per RL step.
--
--   moonrl run recipes/search_fatal.lua [--seed 1] [--seeds 3] [--arms none,drop,fatal]
--     [--steps 30] [--tasks 8] [--group 8] [--sft-examples 6000] [--sft-epochs 3]
--     [--eval-tasks 32] [--lr 2e-4] [--faults 0.1] [--reuse-sft] [--dir runs] [--smoke]
--
-- --smoke: a tiny run (2 steps of 2 x 2 episodes, 40 SFT examples, 2 questions per hop count)
-- for the test. Files go to <dir>/search_fatal-<arm>-s<seed>/.
local rl = require "moonrl"

local root = os.getenv("MOONRL_ROOT") or "."
package.path = root .. "/?.lua;" .. package.path
local kbqa = require "envs.kbqa"
local R = rl.recipe

local o, why = R.args(arg, { seed = 1, seeds = 1, arms = "none,drop,fatal", steps = 30, tasks = 8, group = 8,
  sft_examples = 6000, sft_epochs = 3, eval_tasks = 32, lr = 2e-4, faults = 0.1, reuse_sft = false,
  dir = root .. "/runs", smoke = false })
if not o then error("search_fatal.lua: " .. why, 0) end
if o.smoke then
  o.steps, o.tasks, o.group, o.sft_examples, o.sft_epochs, o.eval_tasks = 2, 2, 2, 40, 1, 2
end
if o.faults < 0 or o.faults > 1 then error("search_fatal.lua: --faults: a probability in [0, 1] expected", 0) end

local ARMS = { none = {}, drop = { fatal = { drop = true } }, fatal = { fatal = true } }
local arms = {}
for name in o.arms:gmatch("[^,]+") do
  if not ARMS[name] then error("search_fatal.lua: unknown arm '" .. name .. "' (none, drop, fatal)", 0) end
  arms[#arms + 1] = name
end
local env = kbqa.variant { faults = o.faults, cascade = true }
local HOPS, TURNS, THRESHOLD = kbqa.max_hops, kbqa.max_turns, 3
local EVERY = math.max(1, o.steps // 3) -- held-out evaluations at EVERY, 2 EVERY, ... and the end
local THIRD = math.max(1, -(-o.steps // 3)) -- the tool-call rate's windows of steps

local function new_model(seed)
  local tok = rl.tokenizer.bytes()
  return rl.model.new { vocab = tok:vocab_size(), dim = 64, layers = 2, heads = 4, ffn = 192,
    ctx = 320, seed = seed }, tok
end

-- The held-out questions, the same for every arm (and as search_qa.lua's): eval_tasks of each hop count.
local HELD = kbqa.held_out(o.eval_tasks)

-- Greedy held-out success per hop count (h1 .. h4) and over all, in chunks of tasks x group
-- episodes; each chunk's rollout seed (and so each episode's failures) is fixed.
local function held_out(ctx) return kbqa.success_by_hops(ctx, HELD, o.tasks * o.group) end

-- search_qa.lua's warm start (the same options, the same file).
local function warm_start(seed)
  return kbqa.warm_start { env = kbqa, path = string.format("%s/search_qa-sft-s%d.bin", o.dir, seed),
    reuse = o.reuse_sft, new_model = new_model, seed = seed, examples = o.sft_examples, epochs = o.sft_epochs }
end

local printed_rate = false

local function run_arm(seed, sft_path, arm)
  local m, tok = new_model(seed)
  m:load_checkpoint(sft_path)
  m:reset_optimizer()
  local secs, n, curve = 0, 0, {}
  local calls, turns = {}, {} -- per window of steps: search turns, turns
  local fatal, episodes = 0, 0
  local opts = {
    model = m, tokenizer = tok, env = env, name = string.format("search_fatal-%s-s%d", arm, seed),
    dir = o.dir, seed = seed, overwrite = true, steps = o.steps, tasks_per_step = o.tasks,
    group_size = o.group, minibatch = o.tasks * o.group, max_turn_tokens = 20, clip_low = 0.2,
    clip_high = 0.28, lr = o.lr, temperature = 1.0, capacity = 320, advantage = "grpo",
    eval = { every = EVERY, tasks = 1, k = 1 }, progress = false, log_episodes = 2,
    evaluate = function(ctx) return held_out(ctx) end,
    -- the default reward stage, after counting the step's tool calls and fatal episodes
    reward = function(ctx, batch, step)
      local w = (step - 1) // THIRD + 1
      calls[w], turns[w] = calls[w] or 0, turns[w] or 0
      for _, ep in ipairs(batch.episodes) do
        episodes = episodes + 1
        if rl.train.advantage.fatal_turn(ep, THRESHOLD) then fatal = fatal + 1 end
        for _, r in ipairs(ep.record) do
          turns[w] = turns[w] + 1
          if rl.batch.is_tool_call(r) then calls[w] = calls[w] + 1 end
        end
      end
      return rl.train.reward.run(ctx, batch, step)
    end,
    on_step = function(step, mt)
      local s = mt["time/step"] - (mt["time/eval"] or 0)
      secs, n = secs + s, n + 1
      if mt["eval/all"] then curve[step] = mt["eval/all"] end
      if not printed_rate then
        printed_rate = true
        print(string.format("  measured: %.2f s per RL step (%s, step %d; %d episodes a step)", s, arm, step,
          o.tasks * o.group))
        io.stdout:flush()
      end
    end,
  }
  for k, v in pairs(ARMS[arm]) do opts[k] = v end
  local result = rl.train(opts)
  local row = { arm = arm, sps = secs / math.max(n, 1), before = result.before,
    fatal = episodes > 0 and fatal / episodes or nil }
  for h = 1, HOPS do row["h" .. h] = result.after["eval/h" .. h] end
  row.all = result.after["eval/all"]
  for k = 1, 2 do row["at" .. k] = curve[k * EVERY] end
  for w = 1, 3 do row["c" .. w] = (turns[w] or 0) > 0 and calls[w] / turns[w] or nil end
  print(string.format("  %-6s %d steps  %.2f s/step  held-out %.1f%%  tool calls/turn %s %s %s  fatal %s%%",
    arm, o.steps, row.sps, 100 * row.all, R.pm(row.c1, 1, "%.2f"), R.pm(row.c2, 1, "%.2f"),
    R.pm(row.c3, 1, "%.2f"), R.pm(row.fatal)))
  io.stdout:flush()
  return row
end

local function one_seed(seed)
  local t0 = rl.clock()
  local sft_path, sft = R.announced_start(seed, warm_start, o.sft_epochs)
  local rows, sft_row = {}, { arm = "SFT" }
  for i, arm in ipairs(arms) do
    local row = run_arm(seed, sft_path, arm)
    rows[#rows + 1] = row
    if i == 1 then
      for h = 1, HOPS do sft_row["h" .. h] = row.before["eval/h" .. h] end
      sft_row.all = row.before["eval/all"]
    end
  end
  rows[#rows + 1] = sft_row
  rows.seconds = rl.clock() - t0
  print(string.format("seed %d: %.0f s", seed, rows.seconds))
  return rows
end

local function print_table(list, title)
  local w = #list > 1 and 13 or 7
  local function cell(v, scale, fmt) return string.format("%" .. w .. "s", R.pm(v, scale, fmt)) end
  print(string.format("\nsearch_fatal, %s; search fails %.0f%% of the time, down after a malformed call; %d steps "
    .. "of %d questions x %d episodes; held-out questions, %d per hop count, greedy", title, 100 * o.faults,
    o.steps, o.tasks, o.group, o.eval_tasks))
  local head = { string.format("%-6s", "arm") }
  for k = 1, 2 do head[#head + 1] = string.format("%" .. w .. "s", "all@" .. k * EVERY) end
  for h = 1, HOPS do head[#head + 1] = string.format("%" .. w .. "s", h .. "-hop%") end
  head[#head + 1] = string.format("%" .. w .. "s", "all%")
  for k = 1, 3 do
    local lo, hi = (k - 1) * THIRD + 1, math.min(k * THIRD, o.steps)
    head[#head + 1] = string.format("%" .. w .. "s", lo <= hi and string.format("call%d-%d", lo, hi) or "call-")
  end
  head[#head + 1] = string.format("%" .. w .. "s", "fatal%")
  head[#head + 1] = string.format("%7s", "s/step")
  print(table.concat(head, " "))
  for _, r in ipairs(R.summarise(list, "arm")) do
    local line = { string.format("%-6s", r.arm) }
    for k = 1, 2 do line[#line + 1] = cell(r["at" .. k]) end
    for h = 1, HOPS do line[#line + 1] = cell(r["h" .. h]) end
    line[#line + 1] = cell(r.all)
    for k = 1, 3 do line[#line + 1] = cell(r["c" .. k], 1, "%.3f") end
    line[#line + 1] = cell(r.fatal)
    local s = type(r.sps) == "table" and r.sps.mean or r.sps
    line[#line + 1] = string.format("%7s", s and string.format("%.2f", s) or "-")
    print(table.concat(line, " "))
  end
end

local t_all = rl.clock()
R.report(o.seed, o.seeds, one_seed, print_table)
print(string.format("(all@s: held-out success after s steps; callA-B: search turns per turn of the training "
  .. "episodes in steps A-B; fatal%%: training episodes with %d failed turns in a row; %.0f s in all)", THRESHOLD,
  rl.clock() - t_all))
