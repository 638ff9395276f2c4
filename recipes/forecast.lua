-- forecast.lua - FutureWorld's delayed rewards in miniature, and (with --per) freshness-aware
-- PER (spec reproductions.md, section 3.4) on envs/forecast.lua: forecast the chance a hidden
-- biased coin lands up after at most two looks at noisy sources; reward 1 - (p - y)^2.
-- One SFT warm start on the environment's imperfect oracle (random sources, the raw fraction of
-- ups: overconfident) is shared by every arm; each arm loads it and trains with the same seed,
-- the same questions in the same order and the same number of steps (equal environment
-- interactions); Dr. GRPO (--advantage; GRPO's division by the group's reward spread makes the
-- Brier score improper: a group whose toss went the likely way has a small spread and its
-- advantages are scaled up, which rewards overconfidence), PPO clip 0.2 / 0.28, lr 1e-3.
--
-- FutureWorld arms (the default):
--   immediate  every question resolves at once: the reward is known at rollout (upper bound);
--   backfill   a question resolves --delay (5) training steps after its rollout, except a
--              --quick (25%) fraction that resolves at once [chosen: with none, discard would
--              never train at all]; pending episodes wait in an rl.replay buffer, their
--              rewards are backfilled at resolution and they join that step's update with
--              importance weights min(pi / pi_behaviour, 5) per token (rl.train's delayed
--              option; --replay-ratio > 0 also replays older resolved groups);
--   discard    the same questions and delays; episodes unresolved at rollout are dropped;
--   nois       (only with --arms ...,nois) backfill without the importance weights.
-- PER arms (--per; every question resolves at once, a replay batch as large as the fresh
-- one each step, K = 1):
--   onpolicy   no replay;
--   per        PER: priority |R| (the critic-free base priority), alpha 0.6, IS weights with
--              beta annealed 0.4 -> 1, no age decay;
--   freshper   the same with the priority x exp(-age / tau), tau = steps / 3 (the spec's 50
--              steps for a 150-step run).
-- Measured greedily on --eval-tasks held-out questions (the same for every arm) after SFT and
-- at --rounds evaluation points: accuracy (the forecast on the side of 0.5 the toss falls),
-- the Brier score and the expected calibration error (10 bins, by bucket), each in expectation
-- over the toss given the coin's q (less noisy than one toss per question; a missing forecast
-- counts as wrong with Brier 1), the fraction of episodes that looked at each source, and the
-- measured seconds per RL step of each arm (printed first, after the first arm).
--
--   moonrl run recipes/forecast.lua [--seed 1] [--seeds 3] [--per] [--arms immediate,backfill,discard]
--     [--steps 60] [--delay 5] [--quick 0.25] [--replay-ratio 0] [--tasks 8] [--group 8]
--     [--sft-examples 4000] [--sft-epochs 4] [--eval-tasks 400] [--rounds 4] [--lr 1e-3]
--     [--advantage drgrpo] [--dim 64] [--layers 2] [--dir runs] [--smoke]
--
-- --seeds n runs the whole recipe for seeds seed .. seed + n - 1 (each with its own SFT),
-- printing each seed's table and then the mean ± spread (sample standard deviation). --smoke is
-- a tiny run that only shows the recipe works. Files go to <dir>/forecast-<arm>-s<seed>/ and
-- the warm start to <dir>/forecast-sft-s<seed>.bin.
local rl = require "moonrl"

local root = os.getenv("MOONRL_ROOT") or "."
package.path = root .. "/?.lua;" .. package.path
local F = require "envs.forecast"
local R = rl.recipe

local o, why = R.args(arg, { seed = 1, seeds = 1, per = false, arms = "", steps = 60, delay = 5,
  quick = 0.25, replay_ratio = 0, tasks = 8, group = 8, sft_examples = 4000, sft_epochs = 4,
  eval_tasks = 400, rounds = 4, lr = 1e-3, advantage = "drgrpo", dim = 64, layers = 2, dir = root .. "/runs", smoke = false })
if not o then error("forecast.lua: " .. why, 0) end
if o.smoke then
  o.steps, o.delay, o.tasks, o.group, o.sft_examples, o.sft_epochs, o.eval_tasks, o.rounds =
    4, 2, 2, 4, 48, 1, 16, 2
  o.dim, o.layers = 32, 1
end
local KNOWN = o.per and { onpolicy = true, per = true, freshper = true }
  or { immediate = true, backfill = true, discard = true, nois = true }
local ARMS = {}
for name in (o.arms ~= "" and o.arms or (o.per and "onpolicy,per,freshper" or "immediate,backfill,discard")):gmatch("[^,]+") do
  if not KNOWN[name] then error(string.format("forecast.lua: unknown arm '%s'%s", name, o.per and " with --per" or ""), 0) end
  ARMS[#ARMS + 1] = name
end
if o.rounds < 1 or o.steps % o.rounds ~= 0 then
  error("forecast.lua: --rounds must divide --steps (the evaluation points)", 0)
end
local TAU = o.steps / 3

local tok = rl.tokenizer.bytes()
local function new_model(seed)
  return rl.model.new { vocab = tok:vocab_size(), dim = o.dim, layers = o.layers, heads = 4,
    ffn = 3 * o.dim, ctx = 256, seed = seed }
end

local held_out = F.tasks("test", o.eval_tasks, 4242)

-- The held-out figures of a list of {forecast = p or nil, task =, looks = {source = true}}.
local function figures(list)
  local f = { acc = 0, brier = 0, ece = 0, answered = 0, wire = 0, poll = 0, blog = 0 }
  local bins = {}
  for _, e in ipairs(list) do
    local p, q = e.forecast, e.task.q
    if p then
      f.answered = f.answered + 1
      f.acc = f.acc + (p > 0.5 and q or 1 - q)
      f.brier = f.brier + (p - q) ^ 2 + q * (1 - q)
      local b = F.bucket(p)
      bins[b] = bins[b] or { n = 0, p = 0, q = 0 }
      bins[b].n, bins[b].p, bins[b].q = bins[b].n + 1, bins[b].p + p, bins[b].q + q
    else
      f.brier = f.brier + 1
    end
    for s in pairs(e.looks) do f[s] = f[s] + 1 end
  end
  for _, b in pairs(bins) do f.ece = f.ece + math.abs(b.p - b.q) / math.max(f.answered, 1) end
  for _, k in ipairs { "acc", "brier", "answered", "wire", "poll", "blog" } do f[k] = f[k] / #list end
  return f
end

local function looks_of(record)
  local seen = {}
  for _, r in ipairs(record) do
    if type(r.info) == "table" and r.info.look then seen[r.info.look] = true end
  end
  return seen
end

-- The evaluate stage: the policy, greedy, on the held-out questions.
local function evaluate(ctx)
  local list, chunk = {}, ctx.cfg.tasks_per_step * ctx.cfg.group_size -- the rollout's episodes
  for first = 1, #held_out, chunk do
    local part = table.move(held_out, first, math.min(first + chunk - 1, #held_out), 1, {})
    local b = ctx.stages.rollout(ctx, { tasks = part, repeats = 1, seed = rl.train.mix(4242, first),
      temperature = 0, group_base = 0 })
    for _, ep in ipairs(b.episodes) do
      list[#list + 1] = { forecast = F.forecast(ep), task = ep.task, looks = looks_of(ep.record) }
    end
  end
  return figures(list)
end

-- A scripted policy (actions = fn(task, rng)) on the held-out questions.
local function scripted(fn)
  local list = {}
  for i, task in ipairs(held_out) do
    local inst, record = F.new(), {}
    inst:reset(task)
    for _, a in ipairs(fn(task, rl.rng(rl.train.mix(777, i)))) do
      local _, _, done = rl.env.step(F, inst, a, record)
      if done then break end
    end
    list[i] = { forecast = F.forecast { record = record }, task = task, looks = looks_of(record) }
  end
  return figures(list)
end

-- The shared warm start: SFT on the oracle's demonstrations of training questions, saved once.
local function warm_start(seed)
  local m = new_model(seed)
  local t0 = rl.clock()
  local ctx = { cfg = { env = F, max_turns = F.max_turns }, tokenizer = tok }
  local data = rl.train.oracle_examples(ctx, o.sft_examples, rl.train.mix(seed, 0xF7))
  local path = string.format("%s/forecast-sft-s%d.bin", o.dir, seed)
  local r = rl.recipe.warm_start { model = m, data = data, epochs = o.sft_epochs, path = path,
    seed = rl.train.mix(seed, 0x5F7) }
  return path, { seconds = rl.clock() - t0, loss = r.final_loss, examples = #data }
end

local printed_sps = false

-- One arm: the warm start loaded, rl.train for o.steps steps; the last evaluation's figures,
-- the Brier score at each round, the seconds per step (evaluation left out), the delayed
-- figures (episodes held, trained after resolution, discarded; the mean importance weight).
local function run_arm(seed, sft_path, arm)
  local m = new_model(seed)
  m:load_checkpoint(sft_path)
  m:reset_optimizer()
  local delayed_arm = arm == "backfill" or arm == "discard" or arm == "nois"
  local secs, n, held, trained, discarded, wsum, wn = 0, 0, 0, 0, 0, 0, 0
  local opts = {
    model = m, tokenizer = tok, env = F, name = string.format("forecast-%s-s%d", arm, seed),
    dir = o.dir, seed = seed, overwrite = true, steps = o.steps, tasks_per_step = o.tasks,
    group_size = o.group, minibatch = o.tasks * o.group, max_turn_tokens = 10, loss = "ppo",
    clip_low = 0.2, clip_high = 0.28, lr = o.lr, advantage = o.advantage,
    eval = { every = o.steps // o.rounds, tasks = o.eval_tasks, k = 1 }, evaluate = evaluate,
    progress = false, log_episodes = 2,
    tasks = function(_, _, count, s)
      local rng, out = rl.rng(s), {}
      for i = 1, count do
        out[i] = F.gen(delayed_arm and { delay = o.delay, quick = o.quick } or { delay = 0 }, rng)
      end
      return out
    end,
    on_step = function(_, mt)
      secs, n = secs + mt["time/step"] - (mt["time/eval"] or 0), n + 1
      held, trained = held + (mt["delayed/held"] or 0), trained + (mt["delayed/trained"] or 0)
      discarded = discarded + (mt["delayed/discarded"] or 0)
      if mt["delayed/is_weight_mean"] then
        wsum, wn = wsum + mt["delayed/is_weight_mean"], wn + 1
      end
      if not printed_sps and n == 3 then
        printed_sps = true
        print(string.format("  (measured: %.2f s per RL step, %s arm, steps 1-3)", secs / n, arm))
        io.stdout:flush()
      end
    end,
  }
  if arm == "backfill" or arm == "nois" then
    local buf = rl.replay.new { capacity = o.tasks * o.group * (o.delay + 4), priority = "reward",
      age_decay = false, staleness = 0, max_ratio = 5, seed = seed }
    opts.replay = { buffer = buf, ratio = o.replay_ratio, correction = arm == "backfill" }
    opts.delayed = { mode = "backfill" } -- resolved by envs/forecast.lua's resolve
  elseif arm == "discard" then
    opts.delayed = { mode = "discard" }
  elseif arm == "per" or arm == "freshper" then
    local buf = rl.replay.new { capacity = o.tasks * o.group * o.steps, priority = "reward",
      alpha = 0.6, beta = { start = 0.4, stop = 1, steps = o.steps }, staleness = 0,
      age_decay = arm == "freshper" and TAU or false, max_ratio = 5, seed = seed }
    opts.replay = { buffer = buf, ratio = 1 }
  end
  local result = rl.train(opts)
  local row = { arm = arm, sps = secs / n, before = result.before }
  for k, v in pairs(result.after) do
    local name = k:match("^eval/(.*)$")
    if name then row[name] = v end
  end
  local r = 0
  for _, h in ipairs(result.history) do
    if h.step > 0 and h["eval/brier"] then
      r = r + 1
      row["brier" .. r] = h["eval/brier"]
    end
  end
  if delayed_arm then
    row.held, row.trained, row.discarded = held, trained, discarded
    row.isw = wn > 0 and wsum / wn or nil
  end
  print(string.format("  %-10s %3d steps  %.2f s/step  acc %.1f%%  Brier %.4f  ECE %.4f%s", arm, o.steps,
    row.sps, 100 * row.acc, row.brier, row.ece, delayed_arm and string.format(
      "  held %d, trained after resolution %d, discarded %d", held, trained, discarded) or ""))
  io.stdout:flush()
  return row
end

-- The whole recipe for one seed: its table rows.
local function one_seed(seed)
  local t0 = rl.clock()
  print(string.format("seed %d: SFT warm start ...", seed))
  local sft_path, sft = warm_start(seed)
  print(string.format("  SFT: %d examples x %d epochs, final loss %.3f, %.0f s", sft.examples, o.sft_epochs,
    sft.loss, sft.seconds))
  io.stdout:flush()
  local rows = {}
  local sft_row
  for _, arm in ipairs(ARMS) do
    local row = run_arm(seed, sft_path, arm)
    rows[#rows + 1] = row
    if not sft_row then
      sft_row = { arm = "SFT" }
      for k, v in pairs(row.before) do
        local name = k:match("^eval/(.*)$")
        if name then sft_row[name] = v end
      end
    end
  end
  rows[#rows + 1] = sft_row
  local oracle = scripted(F.oracle)
  oracle.arm = "oracle"
  local perfect = scripted(function(task) return F.solve(task) end)
  perfect.arm = "perfect"
  local half = scripted(function() return { "p 5" } end)
  half.arm = "p=0.55"
  rows[#rows + 1], rows[#rows + 2], rows[#rows + 3] = oracle, perfect, half
  rows.seconds = rl.clock() - t0
  print(string.format("seed %d: %.0f s", seed, rows.seconds))
  return rows
end

-- The table of a list of runs (one per seed): one seed's values, or mean ± spread over several.
local function print_table(list, title)
  local many = #list > 1
  local w = many and 13 or 7
  local function cell(v, scale, fmt)
    return string.format("%" .. w .. "s", R.pm(v, scale, fmt))
  end
  local function mean(v) return type(v) == "table" and v.mean or v end
  print(string.format("\nforecast%s, %s; %d steps of %d questions x %d episodes; %d held-out questions, greedy",
    o.per and " (PER)" or "", title, o.steps, o.tasks, o.group, o.eval_tasks))
  print(o.per and string.format("(replay: one batch as large as the fresh one per step; FreshPER tau = %g steps)", TAU)
    or string.format("(delay %d steps, %d%% of questions resolve at once in backfill and discard)", o.delay,
      math.floor(100 * o.quick + 0.5)))
  local head = { string.format("%-10s", "arm"), string.format("%" .. w .. "s", "acc%"),
    string.format("%" .. w .. "s", "Brier"), string.format("%" .. w .. "s", "ECE") }
  for r = 1, o.rounds do head[#head + 1] = string.format("%" .. w .. "s", "Brier@" .. r) end
  for _, s in ipairs { "wire%", "poll%", "blog%" } do head[#head + 1] = string.format("%" .. w .. "s", s) end
  head[#head + 1] = string.format("%7s", "s/step")
  print(table.concat(head, " "))
  for _, r in ipairs(R.summarise(list, "arm")) do
    local line = { string.format("%-10s", r.arm), cell(r.acc), cell(r.brier, 1, "%.4f"), cell(r.ece, 1, "%.4f") }
    for k = 1, o.rounds do line[#line + 1] = cell(r["brier" .. k], 1, "%.4f") end
    for _, s in ipairs { "wire", "poll", "blog" } do line[#line + 1] = cell(r[s], 100, "%.0f") end
    local sps = mean(r.sps)
    line[#line + 1] = string.format("%7s", sps and string.format("%.2f", sps) or "-")
    print(table.concat(line, " "))
  end
  if not o.per then
    for _, r in ipairs(R.summarise(list, "arm")) do
      if r.held then
        print(string.format("  %-10s episodes held %s, trained after resolution %s, discarded %s, mean IS weight %s",
          r.arm, R.pm(r.held, 1, "%.0f"), R.pm(r.trained, 1, "%.0f"), R.pm(r.discarded, 1, "%.0f"),
          R.pm(r.isw, 1, "%.4f")))
      end
    end
  end
end

local t_all = rl.clock()
R.report(o.seed, o.seeds, one_seed, print_table)
print(string.format("(acc, Brier, ECE in expectation over the toss given q; Brier@r: after round r of %d steps; "
  .. "wire/poll/blog: episodes that looked there; s/step: measured, eval excluded; %.0f s in all)",
  o.steps // o.rounds, rl.clock() - t_all))
