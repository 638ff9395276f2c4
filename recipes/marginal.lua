-- marginal.lua - marginal-contribution policy gradients in miniature (spec reproductions.md,
-- section 3.5) on envs/router.lua: a router sends each of a problem's three parts to one of three
-- frozen scripted solvers with different skills per operation; the team answer is right only
-- when all three outputs are. One warm start (SFT on a uniformly random router) is shared by the
-- arms, which run the same GRPO (same seed, tasks, steps) and differ only in the signal each
-- routing turn is credited with:
--   wta        winner-take-all: the shared team reward, the same for every turn (GRPO);
--   mc         each turn's marginal contribution: team reward minus the team reward with that
--              part's output replaced by the default solver's (an exact counterfactual
--              evaluation of the finished episode, no extra generation), normalised per
--              (problem group, turn) as GRPO normalises rewards;
--   mc_budget  the same with a budget of --budget exact evaluations per batch (a fraction of
--              the turns): they go to the turns whose (operation, solver) pair has had the
--              fewest exact evaluations so far; every other turn gets the learned signal, the
--              running mean of the exact contributions seen for its pair (0 before any).
-- Rows (held-out problems, greedy): team accuracy, per-part accuracy, the share of parts sent to
-- the expert for their operation, the exact counterfactual evaluations per batch; scripted rows:
-- the random router (the SFT demonstrator) and the expert routing (the upper bound).
-- Expected per the paper: marginal contributions beat winner-take-all at equal generation cost.
--
--   moonrl run recipes/marginal.lua [--seed 1] [--seeds 3] [--arms wta,mc,mc_budget] [--steps 80]
--     [--tasks 16] [--group 8] [--minibatch 32] [--budget 0.25] [--sft-examples 1500]
--     [--sft-epochs 2] [--eval-tasks 300] [--lr 1e-3] [--dir runs] [--smoke]
--
-- Files go to <dir>/marginal-<arm>-s<seed>/; the warm start to <dir>/marginal-sft-s<seed>.bin.
local rl = require "moonrl"

local root = os.getenv("MOONRL_ROOT") or "."
package.path = root .. "/?.lua;" .. package.path
local env = require "envs.router"
local R = rl.recipe

local o, why = R.args(arg, { seed = 1, seeds = 1, arms = "wta,mc,mc_budget", steps = 80, tasks = 16, group = 8,
  minibatch = 32, budget = 0.25, sft_examples = 1500, sft_epochs = 2, eval_tasks = 300, lr = 1e-3,
  dir = root .. "/runs", smoke = false })
if not o then error("marginal.lua: " .. why, 0) end
if o.smoke then
  o.steps, o.tasks, o.group, o.minibatch, o.sft_examples, o.sft_epochs, o.eval_tasks = 2, 4, 4, 8, 60, 1, 24
end
if o.budget <= 0 or o.budget > 1 then error("marginal.lua: --budget: a fraction in (0, 1] expected", 0) end
local KNOWN = { wta = true, mc = true, mc_budget = true }
local arms = {}
for name in o.arms:gmatch("[^,]+") do
  if not KNOWN[name] then error("marginal.lua: unknown arm '" .. name .. "' (wta, mc, mc_budget)", 0) end
  arms[#arms + 1] = name
end

local PARTS = env.parts
local tok = rl.tokenizer.bytes()
local function new_model(seed)
  return rl.model.new { vocab = tok:vocab_size(), dim = 64, layers = 2, heads = 4, ffn = 192, ctx = 96, seed = seed }
end
local HELD = env.tasks("test", o.eval_tasks, 4242)

-- Team accuracy, part accuracy and the expert share of routed episodes (each a last-turn info).
local function figures(infos, tasks)
  local f = { team = 0, part = 0, expert = 0 }
  for i, info in ipairs(infos) do
    if info.success then f.team = f.team + 1 end
    for k, q in ipairs(tasks[i].parts) do
      if info.outputs[k] == q.answer then f.part = f.part + 1 end
      if info.solvers[k] == env.expert(q.op) then f.expert = f.expert + 1 end
    end
  end
  f.team, f.part, f.expert = f.team / #infos, f.part / (#infos * PARTS), f.expert / (#infos * PARTS)
  return f
end

local function last_info(ep)
  local last = ep.record[#ep.record]
  return last and type(last.info) == "table" and last.info.gold and last.info or nil
end

local function held_out(ctx)
  local b = ctx.stages.rollout(ctx, { tasks = HELD, repeats = 1, seed = 4243, temperature = 0, group_base = 0 })
  local infos = {}
  for i, ep in ipairs(b.episodes) do
    infos[i] = last_info(ep) or { success = false, outputs = {}, solvers = {} }
  end
  return figures(infos, HELD)
end

local SCRIPTED = {}
do
  local infos, best = {}, {}
  for i, t in ipairs(HELD) do
    infos[i] = env.play(t, env.oracle(t, rl.rng(rl.train.mix(77, i))))
    best[i] = env.play(t, env.best(t))
  end
  SCRIPTED = { { arm = "random", f = figures(infos, HELD) }, { arm = "expert", f = figures(best, HELD) } }
end

-- Per (group, turn) normalisation of a per-turn signal s[i][k] into per-token advantages.
local function turn_advantages(batch, signal)
  local sum, sq, count = {}, {}, {}
  for i, ep in ipairs(batch.episodes) do
    for k = 1, PARTS do
      local key = ep.group .. ":" .. k
      local v = signal[i][k]
      if v then
        sum[key], sq[key], count[key] = (sum[key] or 0) + v, (sq[key] or 0) + v * v, (count[key] or 0) + 1
      end
    end
  end
  local per_turn = {}
  for i, ep in ipairs(batch.episodes) do
    per_turn[i] = {}
    for k = 1, PARTS do
      local key, v = ep.group .. ":" .. k, signal[i][k]
      if v and count[key] > 1 then
        local mean = sum[key] / count[key]
        local sd = math.sqrt(math.max(sq[key] / count[key] - mean * mean, 0))
        per_turn[i][k] = (v - mean) / (sd + 1e-6)
      else
        per_turn[i][k] = 0
      end
    end
  end
  local adv = rl.tensor.zeros(math.max(batch.mask:numel(), 1)):narrow(1, 1, batch.mask:numel())
  local per_episode = {}
  for i = 1, batch:size() do
    local first, last = batch:range(i)
    local total = 0
    for p = first, last do
      if batch.mask:get(p) ~= 0 then
        local a = per_turn[i][math.floor(batch.turns:get(p)) + 1] or 0
        adv:set(p, a)
      end
    end
    for k = 1, PARTS do total = total + per_turn[i][k] end
    per_episode[i] = total / PARTS
  end
  return adv, per_episode
end

-- The marginal-contribution advantage stage; budget nil: every turn exact. learned: the running
-- table {[op .. solver] = {sum =, n =}} of exact contributions (kept across steps); stats gets the
-- step's exact evaluations.
local function mc_stage(budget, learned, stats)
  return function(_, batch)
    local slots = {}
    for i, ep in ipairs(batch.episodes) do
      local info = last_info(ep)
      for k = 1, PARTS do
        local s = info and info.solvers[k] or "none"
        slots[#slots + 1] = { i = i, k = k, key = ep.task.parts[k].op .. s, info = info }
      end
    end
    local n_exact = budget and math.floor(budget * #slots + 0.5) or #slots
    local order = {}
    for j = 1, #slots do order[j] = j end
    if budget then
      local function seen(j) local e = learned[slots[j].key] return e and e.n or 0 end
      table.sort(order, function(x, y)
        local a, b = seen(x), seen(y)
        if a ~= b then return a < b end
        return x < y
      end)
    end
    local signal, exact = {}, 0
    for i = 1, batch:size() do signal[i] = {} end
    local fresh = {}
    for rank, j in ipairs(order) do
      local s = slots[j]
      if rank <= n_exact and s.info then
        local mc = env.team_reward(s.info.outputs, s.info.gold) - env.counterfactual(s.info, s.k)
        exact = exact + 1
        signal[s.i][s.k] = mc
        fresh[#fresh + 1] = { key = s.key, mc = mc }
      elseif s.info then
        local e = learned[s.key]
        signal[s.i][s.k] = e and e.sum / e.n or 0
      else
        signal[s.i][s.k] = 0
      end
    end
    for _, f in ipairs(fresh) do
      local e = learned[f.key] or { sum = 0, n = 0 }
      e.sum, e.n = e.sum + f.mc, e.n + 1
      learned[f.key] = e
    end
    stats.exact = exact
    return turn_advantages(batch, signal)
  end
end

local function warm_start(seed)
  local t0 = rl.clock()
  local model = new_model(seed)
  local data = rl.train.oracle_examples({ cfg = { env = env, max_turns = env.max_turns }, tokenizer = tok },
    o.sft_examples, rl.train.mix(seed, 0xF7))
  local path = string.format("%s/marginal-sft-s%d.bin", o.dir, seed)
  local s = R.warm_start { model = model, data = data, epochs = o.sft_epochs, path = path,
    seed = rl.train.mix(seed, 0x5F7) }
  return path, { examples = #data, loss = s.final_loss, seconds = rl.clock() - t0 }
end

local function run_arm(seed, sft_path, arm)
  local m = new_model(seed)
  assert(m:load_checkpoint(sft_path))
  m:reset_optimizer()
  local secs, n, stats, exact_sum = 0, 0, {}, 0
  local advantage = "grpo"
  if arm == "mc" then advantage = mc_stage(nil, {}, stats) end
  if arm == "mc_budget" then advantage = mc_stage(o.budget, {}, stats) end
  local result = rl.train {
    model = m, tokenizer = tok, env = env, name = string.format("marginal-%s-s%d", arm, seed), dir = o.dir,
    seed = seed, overwrite = true, steps = o.steps, tasks_per_step = o.tasks, group_size = o.group,
    minibatch = o.minibatch, max_turn_tokens = 8, temperature = 1.0, advantage = advantage,
    loss = "ppo", clip_low = 0.2, clip_high = 0.28, lr = o.lr, evaluate = held_out,
    eval = { every = o.steps, tasks = #HELD, k = 1 }, progress = false, log_episodes = 2,
    on_step = function(_, mt)
      secs, n = secs + mt["time/step"] - (mt["time/eval"] or 0), n + 1
      exact_sum = exact_sum + (stats.exact or 0)
    end,
  }
  local function row(name, mt)
    return { arm = name, team = mt["eval/team"], part = mt["eval/part"], expert = mt["eval/expert"] }
  end
  local r = row(arm, result.after)
  r.sps, r.exact = secs / math.max(n, 1), exact_sum / math.max(n, 1)
  print(string.format("  %-10s %d steps  %.2f s/step  held-out team %.1f%%  expert %.1f%%  exact evals/batch %.0f",
    arm, o.steps, r.sps, 100 * r.team, 100 * r.expert, r.exact))
  io.stdout:flush()
  return r, row("SFT", result.before)
end

local function one_seed(seed)
  local t0 = rl.clock()
  local sft_path = R.announced_start(seed, warm_start, o.sft_epochs)
  local rows, sft_row = {}, nil
  for _, arm in ipairs(arms) do
    local r, before = run_arm(seed, sft_path, arm)
    rows[#rows + 1] = r
    sft_row = sft_row or before
  end
  rows[#rows + 1] = sft_row
  for _, s in ipairs(SCRIPTED) do
    rows[#rows + 1] = { arm = s.arm, team = s.f.team, part = s.f.part, expert = s.f.expert }
  end
  print(string.format("seed %d: %.0f s", seed, rl.clock() - t0))
  return rows
end

local function print_table(list, title)
  local w = #list > 1 and 13 or 8
  print(string.format("\nmarginal, %s; %d steps of %d problems x %d episodes; %d held-out problems, greedy",
    title, o.steps, o.tasks, o.group, #HELD))
  local head = { string.format("%-10s", "arm") }
  for _, k in ipairs { "team%", "part%", "expert%", "exact/b", "s/step" } do
    head[#head + 1] = string.format("%" .. w .. "s", k)
  end
  print(table.concat(head, " "))
  for _, r in ipairs(R.summarise(list, "arm")) do
    local function cell(v, scale, fmt) return string.format("%" .. w .. "s", R.pm(v, scale, fmt)) end
    print(table.concat({ string.format("%-10s", r.arm), cell(r.team), cell(r.part), cell(r.expert),
      cell(r.exact, 1, "%.0f"), cell(r.sps, 1, "%.2f") }, " "))
  end
end

R.report(o.seed, o.seeds, one_seed, print_table)
