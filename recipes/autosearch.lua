-- autosearch.lua - AutoSearch's minimal sufficient search depth (spec reproductions.md, section
-- 3.2) on envs/kbqa.lua with self-answering: kbqa.variant{guess = true}, where a search may end
-- with "guess <x>" ("search bob city guess tex"). The searches before the first search whose guess
-- is the answer are the question's minimal depth (all of them when no guess is right); the last
-- turn's info has the depth and the excess (the searches beyond it). One warm start, SFT on the
-- variant's oracle (one search per hop, each guessing the entity found so far, and a redundant
-- search a quarter of the time, whose guess is then the answer: an excess search), is shared by
-- both arms, which run GRPO with the same seed, tasks and steps:
--   grpo        the episode's reward (1 for the right answer, -0.1 an invalid action);
--   autosearch  the same minus 0.1 x the excess searches (a reward term).
-- Expected per the paper: fewer searches per question at equal accuracy. The table: held-out
-- success per hop count (greedy, 32 questions per hop count), searches and excess searches per
-- held-out question, the seconds per RL step.
--
--   moonrl run recipes/autosearch.lua [--seed 1] [--seeds 3] [--arms grpo,autosearch]
--     [--steps 30] [--tasks 8] [--group 8] [--sft-examples 6000] [--sft-epochs 3]
--     [--eval-tasks 32] [--lr 2e-4] [--penalty 0.1] [--reuse-sft] [--dir runs] [--smoke]
--
-- --smoke: a tiny run for the test. A guess can dodge the penalty by being wrong (no right guess:
-- no excess); the table's excess column shows whether the policy does. Files go to
-- <dir>/autosearch-<arm>-s<seed>/ and the warm start to <dir>/autosearch-sft-s<seed>.bin.
local rl = require "moonrl"

local root = os.getenv("MOONRL_ROOT") or "."
package.path = root .. "/?.lua;" .. package.path
local kbqa = require "envs.kbqa"
local R = rl.recipe

local o, why = R.args(arg, { seed = 1, seeds = 1, arms = "grpo,autosearch", steps = 30, tasks = 8, group = 8,
  sft_examples = 6000, sft_epochs = 3, eval_tasks = 32, lr = 2e-4, penalty = 0.1, reuse_sft = false,
  dir = root .. "/runs", smoke = false })
if not o then error("autosearch.lua: " .. why, 0) end
if o.smoke then
  o.steps, o.tasks, o.group, o.sft_examples, o.sft_epochs, o.eval_tasks = 2, 2, 2, 40, 1, 2
end
if o.penalty < 0 then error("autosearch.lua: --penalty: a number >= 0 expected", 0) end

local KNOWN = { grpo = true, autosearch = true }
local arms = {}
for name in o.arms:gmatch("[^,]+") do
  if not KNOWN[name] then error("autosearch.lua: unknown arm '" .. name .. "' (grpo, autosearch)", 0) end
  arms[#arms + 1] = name
end
local env = kbqa.variant { guess = true }
local HOPS, TURNS = kbqa.max_hops, kbqa.max_turns

local function new_model(seed)
  local tok = rl.tokenizer.bytes()
  return rl.model.new { vocab = tok:vocab_size(), dim = 64, layers = 2, heads = 4, ffn = 192,
    ctx = 384, seed = seed }, tok
end

-- The held-out questions (as search_qa.lua's): eval_tasks of each hop count.
local HELD = kbqa.held_out(o.eval_tasks)

local function searches_of(ep)
  local n = 0
  for _, r in ipairs(ep.record) do
    if type(r.info) == "table" and r.info.tool_call then n = n + 1 end
  end
  return n
end

local function excess_of(ep)
  local last = ep.record[#ep.record]
  return last and type(last.info) == "table" and last.info.excess or 0
end

-- Greedy held-out success per hop count and over all, searches and excess searches per question.
local function held_out(ctx)
  local searches, excess = 0, 0
  local out = kbqa.success_by_hops(ctx, HELD, o.tasks * o.group, function(ep)
    searches, excess = searches + searches_of(ep), excess + excess_of(ep)
  end)
  out.searches, out.excess = searches / #HELD, excess / #HELD
  return out
end

local function warm_start(seed)
  return kbqa.warm_start { env = env, path = string.format("%s/autosearch-sft-s%d.bin", o.dir, seed),
    reuse = o.reuse_sft, new_model = new_model, seed = seed, examples = o.sft_examples, epochs = o.sft_epochs }
end

local function run_arm(seed, sft_path, arm)
  local m, tok = new_model(seed)
  m:load_checkpoint(sft_path)
  m:reset_optimizer()
  local secs, n = 0, 0
  local opts = {
    model = m, tokenizer = tok, env = env, name = string.format("autosearch-%s-s%d", arm, seed),
    dir = o.dir, seed = seed, overwrite = true, steps = o.steps, tasks_per_step = o.tasks,
    group_size = o.group, minibatch = o.tasks * o.group, max_turn_tokens = 28, clip_low = 0.2,
    clip_high = 0.28, lr = o.lr, temperature = 1.0, capacity = 384, advantage = "grpo",
    eval = { every = o.steps, tasks = 1, k = 1 }, progress = false, log_episodes = 2,
    evaluate = function(ctx, step) if step == 0 and arm == arms[1] or step > 0 then return held_out(ctx) end return {} end,
    on_step = function(_, mt) secs, n = secs + mt["time/step"] - (mt["time/eval"] or 0), n + 1 end,
  }
  if arm == "autosearch" then
    opts.rewards = { excess = function(ep) return -o.penalty * excess_of(ep) end }
  end
  local result = rl.train(opts)
  local function row_of(mt, name)
    local row = { arm = name, all = mt["eval/all"], searches = mt["eval/searches"], excess = mt["eval/excess"] }
    for h = 1, HOPS do row["h" .. h] = mt["eval/h" .. h] end
    return row
  end
  local row = row_of(result.after, arm)
  row.sps = secs / math.max(n, 1)
  print(string.format("  %-10s %d steps  %.2f s/step  held-out %.1f%%  searches %.2f  excess %.2f", arm, o.steps,
    row.sps, 100 * row.all, row.searches, row.excess))
  io.stdout:flush()
  return row, arm == arms[1] and row_of(result.before, "SFT") or nil
end

local function one_seed(seed) return R.arms_of_seed(seed, warm_start, o.sft_epochs, arms, run_arm) end

local function print_table(list, title)
  local w = #list > 1 and 13 or 7
  local function cell(v, scale, fmt) return string.format("%" .. w .. "s", R.pm(v, scale, fmt)) end
  print(string.format("\nautosearch, %s; %d steps of %d questions x %d episodes; held-out questions, %d per hop count, greedy",
    title, o.steps, o.tasks, o.group, o.eval_tasks))
  local head = { string.format("%-10s", "arm") }
  for h = 1, HOPS do head[#head + 1] = string.format("%" .. w .. "s", h .. "-hop%") end
  for _, k in ipairs { "all%", "searches", "excess", "s/step" } do head[#head + 1] = string.format("%" .. w .. "s", k) end
  print(table.concat(head, " "))
  for _, row in ipairs(R.summarise(list, "arm")) do
    local line = { string.format("%-10s", row.arm) }
    for h = 1, HOPS do line[#line + 1] = cell(row["h" .. h]) end
    line[#line + 1] = cell(row.all)
    line[#line + 1] = cell(row.searches, 1, "%.2f")
    line[#line + 1] = cell(row.excess, 1, "%.2f")
    line[#line + 1] = cell(row.sps, 1, "%.2f")
    print(table.concat(line, " "))
  end
end

R.report(o.seed, o.seeds, one_seed, print_table)
