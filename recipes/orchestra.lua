-- orchestra.lua - Uno-Orchestra in miniature (spec reproductions.md, section 3.5) on
-- envs/orchestra.lua: an orchestration policy decides per arithmetic problem whether to split it
-- and routes each (sub)task to a frozen scripted worker (cheap: 70% right, cost 1; strong: 95%,
-- cost 10) with a primitive (direct or tool), for reward = correct - 0.02 x cost. The policy is
-- warm-started by SFT on the random router (uniform over the valid actions: a mixed-routing
-- oracle), then trained with a GRPO estimator, the same seed, tasks and steps per arm. Rows on
-- the same held-out problems (greedy for the policies):
--   drgrpo          SFT + Dr. GRPO (each episode's reward minus its group's mean, no division by
--                   the group's std: the default)
--   grpo            SFT + GRPO (divided by the std too; within a group whose workers are all
--                   right the rewards differ only by cost, and the std turns those few
--                   hundredths into full-size advantages for the cheapest route)
--   SFT             the warm start
--   always cheap    "solve cheap direct" on everything (scripted)
--   always strong   "solve strong direct" on everything (scripted)
--   random          the SFT demonstrator, uniform over the valid actions (scripted)
--   best            the routing that maximises the expected reward under the environment's
--                   accuracy table (scripted, it knows the table: the upper bound)
-- Columns: accuracy, mean cost, mean reward, and how the dispatches were made (share of problems
-- split, share of dispatches to the strong worker, share with the tool primitive).
-- Expected per the paper: near-strong accuracy at several-fold lower cost than always-strong.
--
--   moonrl run recipes/orchestra.lua [--seed 1] [--seeds 3] [--arms drgrpo,grpo] [--steps 100]
--     [--tasks 16] [--group 8] [--minibatch 32] [--sft-examples 2000] [--sft-epochs 2]
--     [--eval-tasks 400] [--lr 5e-4] [--trace 2] [--dir runs] [--smoke]
--
-- Files go to <dir>/orchestra-<arm>-s<seed>/ (metrics.jsonl, episodes.jsonl and trace.jsonl: the
-- orchestration trace of `--trace` episodes a step, rl.multi's schema, every dispatch with its
-- worker, primitive, subtask and cost); the warm start to <dir>/orchestra-sft-s<seed>.bin.
local rl = require "moonrl"

local root = os.getenv("MOONRL_ROOT") or "."
package.path = root .. "/?.lua;" .. package.path
local env = require "envs.orchestra"
local R = rl.recipe

local o, why = R.args(arg, { seed = 1, seeds = 1, arms = "drgrpo,grpo", steps = 100, tasks = 16, group = 8, minibatch = 32,
  sft_examples = 2000, sft_epochs = 2, eval_tasks = 400, lr = 5e-4, trace = 2, dir = root .. "/runs", smoke = false })
if not o then error("orchestra.lua: " .. why, 0) end
if o.smoke then
  o.steps, o.tasks, o.group, o.minibatch, o.sft_examples, o.sft_epochs, o.eval_tasks = 2, 4, 4, 8, 60, 1, 24
end
if o.trace < 0 then error("orchestra.lua: --trace: an integer >= 0 expected", 0) end
if o.steps < 1 then error("orchestra.lua: --steps: an integer >= 1 expected", 0) end
local arms = {}
for name in o.arms:gmatch("[^,]+") do
  if name ~= "grpo" and name ~= "drgrpo" then error("orchestra.lua: unknown arm '" .. name .. "' (drgrpo, grpo)", 0) end
  arms[#arms + 1] = name
end

local CTX, TURN_TOKENS = 128, 24
local tok = rl.tokenizer.bytes()
local function new_model(seed)
  return rl.model.new { vocab = tok:vocab_size(), dim = 64, layers = 2, heads = 4, ffn = 192, ctx = CTX, seed = seed }
end
local HELD = env.tasks("test", o.eval_tasks, 4242)

-- The figures of a list of finished episodes {success =, cost =, reward =, split =, strong =,
-- tool =, dispatches =}.
local function figures(list)
  local f = { acc = 0, cost = 0, reward = 0, split = 0, strong = 0, tool = 0 }
  local dispatches = 0
  for _, e in ipairs(list) do
    f.acc, f.cost, f.reward = f.acc + (e.success and 1 or 0), f.cost + e.cost, f.reward + e.reward
    f.split = f.split + (e.split and 1 or 0)
    f.strong, f.tool, dispatches = f.strong + e.strong, f.tool + e.tool, dispatches + e.dispatches
  end
  for _, k in ipairs { "acc", "cost", "reward", "split" } do f[k] = f[k] / #list end
  f.strong, f.tool = f.strong / math.max(dispatches, 1), f.tool / math.max(dispatches, 1)
  return f
end

-- One episode's summary from its turn records ({action =, reward =, info =} each).
local function summary(record)
  local s = { success = false, cost = 0, reward = 0, split = false, strong = 0, tool = 0, dispatches = 0 }
  for _, r in ipairs(record) do
    s.reward = s.reward + r.reward
    if r.action and r.action:match("^%s*split") then s.split = true end
    local d = type(r.info) == "table" and r.info.dispatch or nil
    if d then
      s.cost, s.dispatches = s.cost + d.cost, s.dispatches + 1
      if d.to == "strong" then s.strong = s.strong + 1 end
      if d.primitive == "tool" then s.tool = s.tool + 1 end
    end
    if type(r.info) == "table" and r.info.success then s.success = true end
  end
  return s
end

-- The scripted rows: each policy played on the held-out problems.
local function scripted(make)
  local list = {}
  for i, t in ipairs(HELD) do
    local inst, record = env.new(), {}
    local obs = inst:reset(t)
    local policy = make(i)
    for _ = 1, env.max_turns do
      local a = policy(obs)
      local nobs, r, done, info = inst:step(a, nil)
      record[#record + 1] = { action = a, reward = r, info = info }
      if done then break end
      obs = nobs
    end
    list[i] = summary(record)
  end
  return figures(list)
end
local SCRIPTED = {
  { arm = "always cheap", f = scripted(function() return env.always("cheap", "direct") end) },
  { arm = "always strong", f = scripted(function() return env.always("strong", "direct") end) },
  { arm = "random", f = scripted(function(i) return env.random_router(rl.rng(rl.train.mix(77, i))) end) },
  { arm = "best", f = scripted(function() return env.best_router() end) },
}

local function held_out(ctx)
  local b = ctx.stages.rollout(ctx, { tasks = HELD, repeats = 1, seed = 4243, temperature = 0, group_base = 0 })
  local list = {}
  for i, ep in ipairs(b.episodes) do list[i] = summary(ep.record) end
  local f = figures(list)
  f.greedy_success = f.acc
  return f
end

local function warm_start(seed)
  local t0 = rl.clock()
  local model = new_model(seed)
  local data = rl.train.oracle_examples({ cfg = { env = env, max_turns = env.max_turns }, tokenizer = tok },
    o.sft_examples, rl.train.mix(seed, 0xF7))
  local path = string.format("%s/orchestra-sft-s%d.bin", o.dir, seed)
  local s = R.warm_start { model = model, data = data, epochs = o.sft_epochs, path = path,
    seed = rl.train.mix(seed, 0x5F7) }
  return path, { examples = #data, loss = s.final_loss, seconds = rl.clock() - t0 }
end

-- The log stage: rl.train's, then the orchestration trace of the step's first episodes (the
-- first of each group, then the second, ...).
local function log_with_trace(ctx, step, mt, batch)
  rl.train.log.step(ctx, step, mt, batch)
  if not batch or o.trace == 0 then return end
  local lines, groups, round = {}, batch:groups(), 1
  while #lines < math.min(o.trace, batch:size()) do
    for _, g in ipairs(groups) do
      local i = g.members[round]
      if i and #lines < o.trace then lines[#lines + 1] = rl.json.encode(env.trace_record(step, i, batch.episodes[i])) end
    end
    round = round + 1
  end
  rl.train.log.append(ctx.dir .. "/trace.jsonl", table.concat(lines, "\n") .. "\n")
end

local function row_of(arm, mt)
  return { arm = arm, acc = mt["eval/acc"], cost = mt["eval/cost"], reward = mt["eval/reward"],
    split = mt["eval/split"], strong = mt["eval/strong"], tool = mt["eval/tool"] }
end

local function run_arm(seed, sft_path, arm)
  local m = new_model(seed)
  assert(m:load_checkpoint(sft_path))
  m:reset_optimizer()
  local secs, n = 0, 0
  local result = rl.train {
    model = m, tokenizer = tok, env = env, name = string.format("orchestra-%s-s%d", arm, seed), dir = o.dir,
    seed = seed, overwrite = true, steps = o.steps, tasks_per_step = o.tasks, group_size = o.group,
    minibatch = o.minibatch, max_turn_tokens = TURN_TOKENS, temperature = 1.0,
    advantage = arm, loss = "ppo", clip_low = 0.2, clip_high = 0.28, lr = o.lr, schedule = "cosine",
    min_lr = o.lr / 10, evaluate = held_out, eval = { every = o.steps, tasks = #HELD, k = 1 }, progress = false,
    log = log_with_trace,
    on_step = function(_, mt) secs, n = secs + mt["time/step"] - (mt["time/eval"] or 0), n + 1 end,
  }
  local row = row_of(arm, result.after)
  row.sps = secs / math.max(n, 1)
  print(string.format("  %-8s %d steps  %.2f s/step  held-out acc %.1f%%  cost %.2f  reward %.3f", arm, o.steps,
    row.sps, 100 * row.acc, row.cost, row.reward))
  io.stdout:flush()
  return row, row_of("SFT", result.before)
end

local function one_seed(seed)
  local t0 = rl.clock()
  local sft_path = R.announced_start(seed, warm_start, o.sft_epochs)
  local rows, sft_row = {}, nil
  for _, arm in ipairs(arms) do
    local row, before = run_arm(seed, sft_path, arm)
    rows[#rows + 1] = row
    sft_row = sft_row or before
  end
  rows[#rows + 1] = sft_row
  for _, s in ipairs(SCRIPTED) do
    local f = s.f
    rows[#rows + 1] = { arm = s.arm, acc = f.acc, cost = f.cost, reward = f.reward, split = f.split,
      strong = f.strong, tool = f.tool }
  end
  print(string.format("seed %d: %.0f s", seed, rl.clock() - t0))
  io.stdout:flush()
  return rows
end

local function print_table(list, title)
  local w = #list > 1 and 13 or 8
  print(string.format("\norchestra, %s; %d steps of %d problems x %d episodes; %d held-out problems, greedy",
    title, o.steps, o.tasks, o.group, #HELD))
  local head = { string.format("%-14s", "arm") }
  for _, k in ipairs { "acc%", "cost", "reward", "split%", "strong%", "tool%", "s/step" } do
    head[#head + 1] = string.format("%" .. w .. "s", k)
  end
  print(table.concat(head, " "))
  for _, r in ipairs(R.summarise(list, "arm")) do
    local function cell(v, scale, fmt) return string.format("%" .. w .. "s", R.pm(v, scale, fmt)) end
    print(table.concat({ string.format("%-14s", r.arm), cell(r.acc), cell(r.cost, 1, "%.2f"),
      cell(r.reward, 1, "%.3f"), cell(r.split), cell(r.strong), cell(r.tool), cell(r.sps, 1, "%.2f") }, " "))
  end
end

R.report(o.seed, o.seeds, one_seed, print_table)
