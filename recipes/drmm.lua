-- drmm.lua - DR-MMSearchAgent's fix for premature interaction collapse (spec reproductions.md,
-- section 3.2) on envs/kbqa.lua: a Gaussian bonus on the number of searches, centred on the
-- question's hop count, and a batch-wide advantage term that compares trajectories of like
-- structure. The warm start is search_qa.lua's SFT on the oracle's demonstrations (kbqa.warm_start)
-- with a smaller budget by default (2000 examples x 2 epochs, not 6000 x 3, to fit the recipe's
-- time), in a file of its own; each arm loads it and runs the same seed, tasks and steps on
-- kbqa.variant{} (the plain environment, its search turns marked):
--   grpo   the episode's reward (1 for the right answer, -0.1 an invalid action), GRPO;
--   gauss  the same plus bonus x exp(-(searches - hops)^2 / (2 sigma^2)) (a reward term, weight
--          0.2 and sigma 1 by default), GRPO;
--   full   gauss's reward, and advantage GRPO + structure x rl.train.advantage.structure_term:
--          each episode's score against the episodes of the whole batch with the same sequence
--          of action kinds (s search, a answer, x invalid: "ssa"), (S - mean) / (sd + eps)
--          (weight 0.5 by default).
-- Expected per the paper: the search-turn rate does not collapse over training; multi-hop
-- accuracy above GRPO. The table: held-out success per hop count (greedy, 32 questions per hop
-- count), searches per held-out question, the held-out episodes that answered after fewer
-- searches than hops (short%), the search turns per turn of the training episodes in each third
-- of the steps, the seconds per RL step.
--
--   moonrl run recipes/drmm.lua [--seed 1] [--seeds 3] [--arms grpo,gauss,full] [--steps 20]
--     [--tasks 8] [--group 8] [--sft-examples 2000] [--sft-epochs 2] [--eval-tasks 32]
--     [--lr 2e-4] [--bonus 0.2] [--sigma 1] [--structure 0.5] [--reuse-sft] [--dir runs] [--smoke]
--
-- --smoke: a tiny run for the test. Files go to <dir>/drmm-<arm>-s<seed>/ and the warm start to
-- <dir>/drmm-sft-s<seed>.bin.
local rl = require "moonrl"

local root = os.getenv("MOONRL_ROOT") or "."
package.path = root .. "/?.lua;" .. package.path
local kbqa = require "envs.kbqa"
local R = rl.recipe

local o, why = R.args(arg, { seed = 1, seeds = 1, arms = "grpo,gauss,full", steps = 20, tasks = 8, group = 8,
  sft_examples = 2000, sft_epochs = 2, eval_tasks = 32, lr = 2e-4, bonus = 0.2, sigma = 1.0, structure = 0.5,
  reuse_sft = false, dir = root .. "/runs", smoke = false })
if not o then error("drmm.lua: " .. why, 0) end
if o.smoke then
  o.steps, o.tasks, o.group, o.sft_examples, o.sft_epochs, o.eval_tasks = 2, 2, 2, 40, 1, 2
end
if o.bonus < 0 then error("drmm.lua: --bonus: a number >= 0 expected", 0) end
if not (o.sigma > 0) then error("drmm.lua: --sigma: a number > 0 expected", 0) end
if o.structure < 0 then error("drmm.lua: --structure: a number >= 0 expected", 0) end

local KNOWN = { grpo = true, gauss = true, full = true }
local arms = {}
for name in o.arms:gmatch("[^,]+") do
  if not KNOWN[name] then error("drmm.lua: unknown arm '" .. name .. "' (grpo, gauss, full)", 0) end
  arms[#arms + 1] = name
end
local env = kbqa.variant {}
local HOPS = kbqa.max_hops
local THIRD = math.max(1, -(-o.steps // 3)) -- the search-turn rate's windows of steps

local function new_model(seed) -- search_qa.lua's
  local tok = rl.tokenizer.bytes()
  return rl.model.new { vocab = tok:vocab_size(), dim = 64, layers = 2, heads = 4, ffn = 192,
    ctx = 320, seed = seed }, tok
end

-- The held-out questions (as search_qa.lua's): eval_tasks of each hop count.
local HELD = kbqa.held_out(o.eval_tasks)

-- An episode's action kinds ("ssa": two searches, then an answer) and its searches.
local function kinds_of(ep)
  local out = {}
  for k, r in ipairs(ep.record) do
    if rl.batch.is_tool_call(r) then out[k] = "s"
    elseif type(r.info) == "table" and r.info.invalid then out[k] = "x"
    else out[k] = "a" end
  end
  return table.concat(out)
end
local function searches_of(ep) return select(2, kinds_of(ep):gsub("s", "")) end

-- The Gaussian bonus of an episode of a question of `hops` hops.
local function gauss(ep, hops)
  return o.bonus * math.exp(-(searches_of(ep) - hops) ^ 2 / (2 * o.sigma ^ 2))
end

rl.train.advantage.register("drmm", rl.train.advantage.structure { base = "grpo", weight = o.structure, key = kinds_of })

-- Greedy held-out success per hop count and over all, searches per question and the share of
-- episodes that answered with fewer searches than hops.
local function held_out(ctx)
  local searches, short = 0, 0
  local out = kbqa.success_by_hops(ctx, HELD, o.tasks * o.group, function(ep, task)
    local kinds = kinds_of(ep)
    local n = select(2, kinds:gsub("s", ""))
    searches = searches + n
    if kinds:sub(-1) == "a" and n < task.hops then short = short + 1 end
  end)
  out.searches, out.short = searches / #HELD, short / #HELD
  return out
end

local function warm_start(seed) -- search_qa.lua's, with this recipe's budget
  return kbqa.warm_start { env = kbqa, path = string.format("%s/drmm-sft-s%d.bin", o.dir, seed),
    reuse = o.reuse_sft, new_model = new_model, seed = seed, examples = o.sft_examples, epochs = o.sft_epochs }
end

local printed_rate = false

local function run_arm(seed, sft_path, arm)
  local m, tok = new_model(seed)
  m:load_checkpoint(sft_path)
  m:reset_optimizer()
  local secs, n, rate, count = 0, 0, {}, {}
  local opts = {
    model = m, tokenizer = tok, env = env, name = string.format("drmm-%s-s%d", arm, seed),
    dir = o.dir, seed = seed, overwrite = true, steps = o.steps, tasks_per_step = o.tasks,
    group_size = o.group, minibatch = o.tasks * o.group, max_turn_tokens = 20, clip_low = 0.2,
    clip_high = 0.28, lr = o.lr, temperature = 1.0, capacity = 320, advantage = arm == "full" and "drmm" or "grpo",
    eval = { every = o.steps, tasks = 1, k = 1 }, progress = false, log_episodes = 2,
    evaluate = function(ctx, step) if step == 0 and arm == arms[1] or step > 0 then return held_out(ctx) end return {} end,
    on_step = function(step, mt)
      local s = mt["time/step"] - (mt["time/eval"] or 0)
      secs, n = secs + s, n + 1
      local w = (step - 1) // THIRD + 1
      rate[w], count[w] = (rate[w] or 0) + mt.tool_calls_per_turn, (count[w] or 0) + 1
      if not printed_rate then
        printed_rate = true
        print(string.format("  measured: %.2f s per RL step (%s, step %d; %d episodes a step)", s, arm, step,
          o.tasks * o.group))
        io.stdout:flush()
      end
    end,
  }
  if arm ~= "grpo" then opts.rewards = { gauss = function(ep) return gauss(ep, ep.task.hops) end } end
  local result = rl.train(opts)
  local function row_of(mt, name)
    local row = { arm = name, all = mt["eval/all"], searches = mt["eval/searches"], short = mt["eval/short"] }
    for h = 1, HOPS do row["h" .. h] = mt["eval/h" .. h] end
    return row
  end
  local row = row_of(result.after, arm)
  row.sps = secs / math.max(n, 1)
  for w = 1, 3 do row["c" .. w] = count[w] and rate[w] / count[w] or nil end
  print(string.format("  %-5s %d steps  %.2f s/step  held-out %.1f%%  searches %.2f  short %.1f%%  search turns/turn %s %s %s",
    arm, o.steps, row.sps, 100 * row.all, row.searches, 100 * row.short, R.pm(row.c1, 1, "%.3f"),
    R.pm(row.c2, 1, "%.3f"), R.pm(row.c3, 1, "%.3f")))
  io.stdout:flush()
  return row, arm == arms[1] and row_of(result.before, "SFT") or nil
end

local function one_seed(seed) return R.arms_of_seed(seed, warm_start, o.sft_epochs, arms, run_arm) end


local function print_table(list, title)
  local w = #list > 1 and 13 or 7
  local function cell(v, scale, fmt) return string.format("%" .. w .. "s", R.pm(v, scale, fmt)) end
  print(string.format("\ndrmm, %s; %d steps of %d questions x %d episodes; bonus %g, sigma %g, structure %g; "
    .. "held-out questions, %d per hop count, greedy", title, o.steps, o.tasks, o.group, o.bonus, o.sigma,
    o.structure, o.eval_tasks))
  local head = { string.format("%-5s", "arm") }
  for h = 1, HOPS do head[#head + 1] = string.format("%" .. w .. "s", h .. "-hop%") end
  for _, k in ipairs { "all%", "searches", "short%" } do head[#head + 1] = string.format("%" .. w .. "s", k) end
  for k = 1, 3 do
    local lo, hi = (k - 1) * THIRD + 1, math.min(k * THIRD, o.steps)
    head[#head + 1] = string.format("%" .. w .. "s", lo <= hi and string.format("call%d-%d", lo, hi) or "call-")
  end
  head[#head + 1] = string.format("%" .. w .. "s", "s/step")
  print(table.concat(head, " "))
  for _, row in ipairs(R.summarise(list, "arm")) do
    local line = { string.format("%-5s", row.arm) }
    for h = 1, HOPS do line[#line + 1] = cell(row["h" .. h]) end
    line[#line + 1] = cell(row.all)
    line[#line + 1] = cell(row.searches, 1, "%.2f")
    line[#line + 1] = cell(row.short)
    for k = 1, 3 do line[#line + 1] = cell(row["c" .. k], 1, "%.3f") end
    line[#line + 1] = cell(row.sps, 1, "%.2f")
    print(table.concat(line, " "))
  end
end

R.report(o.seed, o.seeds, one_seed, print_table)
print("(short%: held-out episodes that answered after fewer searches than hops; callA-B: search turns per turn "
  .. "of the training episodes in steps A-B)")
