-- savoir.lua - SAVOIR's Shapley credit for dialogue in miniature (spec reproductions.md section
-- 3.10) on envs/haggle.lua: split 10 coins with a scripted opponent of hidden type, at most
-- five agent utterances; rapport (`say fair`) in the first two turns lowers the opponent's
-- threshold, so its value shows only later. The score (coins + 1 with a deal, -1 without) is the
-- episode's only reward. Arms, all PPO on the same batches of the same tasks:
--   grpo     episode GRPO: the score's z within the task's group on every turn;
--   uniform  the episode's advantage split evenly over its turns;
--   last     the last utterance takes the whole advantage, the others 0;
--   savoir   the utterances' Shapley values (envs/haggle.lua's shapley_credit):
--            v(S) the mean score of --continuations (4) default-policy finishes of the dialogue
--            with the utterances outside S replaced by `ok`, --permutations (8) permutations
--            drawn from the step's seed and the episode's index.
-- Each per-turn arm splits an advantage over the dialogue's turns, each turn's share on its
-- tokens [chosen]: uniform and last the episode's GRPO advantage (score - group mean) / group sd,
-- savoir (score - v(none)) / group sd, which the Shapley values split by efficiency; a group
-- whose scores are all equal gets nothing (as under GRPO).
--
-- One SFT warm start per seed on the imperfect demonstrator (rapport first a quarter of the
-- time) is shared by every arm. Measured on the three held-out opponents (type, base pairs
-- never trained on): the greedy policy's mean score over them, and --eval-samples sampled
-- dialogues' mean score, coins, deal rate and early-rapport rate (a `say fair` among the first
-- two utterances), the sampled score also after each of --rounds (4) equal parts of the run
-- (how fast each arm learns); then the measured seconds per RL step.
--
--   moonrl run recipes/savoir.lua [--seed 1] [--seeds 3] [--arms grpo,uniform,last,savoir]
--     [--steps 40] [--tasks 8] [--group 8] [--lr 1e-3] [--continuations 4] [--permutations 8]
--     [--sft-examples 2000] [--sft-epochs 3] [--eval-samples 96] [--rounds 4] [--dim 64] [--layers 2]
--     [--dir runs] [--smoke]
--
-- --seeds n runs the recipe for seeds seed .. seed + n - 1 (each with its own SFT), then the
-- mean ± spread (sample sd). --smoke is a tiny run that only shows the recipe works. Files go to
-- <dir>/savoir-<arm>-s<seed>/ and the warm start to <dir>/savoir-sft-s<seed>.bin.
local rl = require "moonrl"

local root = os.getenv("MOONRL_ROOT") or "."
package.path = root .. "/?.lua;" .. package.path
local Hg = require "envs.haggle"
local R = rl.recipe
local A = rl.train.advantage

local o, why = R.args(arg, { seed = 1, seeds = 1, arms = "grpo,uniform,last,savoir", steps = 40, tasks = 8, group = 8,
  lr = 1e-3, continuations = 4, permutations = 8, sft_examples = 2000, sft_epochs = 3, eval_samples = 96, rounds = 4,
  dim = 64, layers = 2, dir = root .. "/runs", smoke = false })
if not o then error("savoir.lua: " .. why, 0) end
if o.smoke then
  o.steps, o.tasks, o.group, o.sft_examples, o.sft_epochs, o.eval_samples, o.rounds, o.dim, o.layers =
    2, 2, 4, 300, 1, 12, 2, 32, 1
end
if o.rounds < 1 or o.steps % o.rounds ~= 0 then error("savoir.lua: --rounds must divide --steps", 0) end
local KNOWN = { grpo = true, uniform = true, last = true, savoir = true }
local ARMS = {}
for name in o.arms:gmatch("[^,]+") do
  if not KNOWN[name] then
    error(string.format("savoir.lua: --arms: unknown arm '%s' (known: grpo, uniform, last, savoir)", name), 0)
  end
  ARMS[#ARMS + 1] = name
end

local tok = rl.tokenizer.bytes()
local function new_model(seed)
  return rl.model.new { vocab = tok:vocab_size(), dim = o.dim, layers = o.layers, heads = 4, ffn = 3 * o.dim,
    ctx = 192, seed = seed }
end

-- The three held-out opponents, once each for the greedy policy; eval_samples for sampling.
local held_out = {}
for _, t in ipairs(Hg.types) do
  for _, b in ipairs(Hg.bases[t]) do
    if Hg.held_out(t, b) then held_out[#held_out + 1] = { id = t .. b, type = t, base = b } end
  end
end

local function warm_start(seed)
  local m = new_model(seed)
  local t0 = rl.clock()
  local ctx = { cfg = { env = Hg, max_turns = Hg.max_turns }, tokenizer = tok }
  local data = rl.train.oracle_examples(ctx, o.sft_examples, rl.train.mix(seed, 0xF7))
  local path = string.format("%s/savoir-sft-s%d.bin", o.dir, seed)
  local r = R.warm_start { model = m, data = data, epochs = o.sft_epochs, path = path, seed = rl.train.mix(seed, 0x5F7) }
  return path, { seconds = rl.clock() - t0, loss = r.final_loss, examples = #data }
end

-- The utterances of an episode, in order.
local function utterances(ep)
  local out = {}
  for k, rec in ipairs(ep.record) do out[k] = rec.action end
  return out
end

-- The last turn's info (the dialogue's outcome).
local function outcome(ep)
  local last = ep.record[#ep.record]
  return last and last.info or {}
end

-- The advantage stage of a per-turn arm. uniform and last hand out the episode's GRPO advantage
-- z = (score - group mean) / group sd: z / turns on every turn, or z on the last turn alone;
-- savoir hands out (score - v(none)) / group sd by the utterances' Shapley values (their sum by
-- efficiency; v(none), the all-`ok` dialogue's value, is the baseline).
local function credit_stage(arm, seed, step_of)
  return function(_, batch)
    local rows, index = A.turn_rows(batch)
    local stats = {}
    for _, ep in ipairs(batch.episodes) do
      local s = stats[ep.group] or { n = 0, sum = 0, sq = 0 }
      stats[ep.group] = s
      s.n, s.sum, s.sq = s.n + 1, s.sum + ep.reward, s.sq + ep.reward ^ 2
    end
    local values = {}
    for row in ipairs(rows) do values[row] = 0 end
    for i, ep in ipairs(batch.episodes) do
      local s = stats[ep.group]
      local mean = s.sum / s.n
      local sd = math.sqrt(math.max(0, s.sq / s.n - mean * mean))
      local m = #ep.record
      if sd > 1e-6 and m > 0 then
        local share
        if arm == "savoir" then
          share = Hg.shapley_credit(ep.task, utterances(ep), { continuations = o.continuations,
            permutations = o.permutations, seed = rl.train.mix(seed, step_of(), i) })
        else
          local z = (ep.reward - mean) / (sd + 1e-6)
          share = {}
          for k = 1, m do share[k] = arm == "uniform" and z / m or (k == m and z or 0) end
        end
        for k = 1, m do
          values[index[i][k - 1]] = arm == "savoir" and share[k] / (sd + 1e-6) or share[k]
        end
      end
    end
    return A.rows_to_tokens(batch, index, values)
  end
end

-- The evaluate stage: greedy on the three held-out opponents, sampled on eval_samples of them.
local function evaluate(ctx, step)
  local g = ctx.stages.rollout(ctx, { tasks = held_out, repeats = 1, seed = rl.train.mix(4242, step), temperature = 0,
    group_base = 0 })
  local greedy = 0
  for _, ep in ipairs(g.episodes) do greedy = greedy + ep.reward / #held_out end
  local sampled = {}
  for i = 1, o.eval_samples do sampled[i] = held_out[(i - 1) % #held_out + 1] end
  local f = { greedy = greedy, score = 0, coins = 0, deal = 0, rapport = 0 }
  local chunk = ctx.cfg.tasks_per_step * ctx.cfg.group_size
  for first = 1, #sampled, chunk do
    local part = table.move(sampled, first, math.min(first + chunk - 1, #sampled), 1, {})
    local b = ctx.stages.rollout(ctx, { tasks = part, repeats = 1, seed = rl.train.mix(4343, first), temperature = 1,
      group_base = 0 })
    for _, ep in ipairs(b.episodes) do
      local info = outcome(ep)
      f.score, f.coins = f.score + ep.reward, f.coins + (info.coins or 0)
      f.deal = f.deal + (info.deal and 1 or 0)
      local u = utterances(ep)
      if u[1] == "say fair" or u[2] == "say fair" then f.rapport = f.rapport + 1 end
    end
  end
  for _, k in ipairs { "score", "coins", "deal", "rapport" } do f[k] = f[k] / #sampled end
  return f
end

local printed_sps = false

local function run_arm(seed, sft_path, arm)
  local m = new_model(seed)
  m:load_checkpoint(sft_path)
  m:reset_optimizer()
  local secs, n, step_now = 0, 0, 0
  local result = rl.train {
    model = m, tokenizer = tok, env = Hg, name = string.format("savoir-%s-s%d", arm, seed), dir = o.dir, seed = seed,
    overwrite = true, steps = o.steps, tasks_per_step = o.tasks, group_size = o.group, minibatch = o.tasks * o.group,
    max_turn_tokens = 10, loss = "ppo", clip_low = 0.2, clip_high = 0.28, lr = o.lr,
    advantage = arm == "grpo" and "grpo" or credit_stage(arm, seed, function() return step_now end),
    tasks = function(_, step, count, s)
      step_now = step
      return Hg.tasks("train", count, s)
    end,
    eval = { every = o.steps // o.rounds, tasks = 1, k = 1 }, evaluate = evaluate, progress = false, plot = false,
    log_episodes = 2,
    on_step = function(_, mt)
      secs, n = secs + mt["time/step"] - (mt["time/eval"] or 0), n + 1
      if not printed_sps and n == 2 then
        printed_sps = true
        print(string.format("  (measured: %.2f s per RL step, %s arm, steps 1-2)", secs / n, arm))
        io.stdout:flush()
      end
    end,
  }
  local function row_of(mt, name)
    local row = { arm = name }
    for _, k in ipairs { "greedy", "score", "coins", "deal", "rapport" } do row[k] = mt["eval/" .. k] end
    return row
  end
  local row = row_of(result.after, arm)
  row.sps = secs / math.max(n, 1)
  local r = 0
  for _, h in ipairs(result.history) do
    if h.step > 0 and h["eval/score"] then
      r = r + 1
      row["score" .. r] = h["eval/score"]
    end
  end
  print(string.format("  %-8s %d steps  %.2f s/step  greedy %.2f  sampled score %.2f  early rapport %.0f%%", arm,
    o.steps, row.sps, row.greedy, row.score, 100 * row.rapport))
  io.stdout:flush()
  return row, row_of(result.before, "SFT")
end

local function one_seed(seed)
  local t0 = rl.clock()
  local sft_path = R.announced_start(seed, warm_start, o.sft_epochs)
  local rows, sft_row = {}, nil
  for _, arm in ipairs(ARMS) do
    local row, before = run_arm(seed, sft_path, arm)
    rows[#rows + 1] = row
    sft_row = sft_row or before
  end
  rows[#rows + 1] = sft_row
  local solve = 0
  for _, t in ipairs(held_out) do
    local inst, score = Hg.new(), nil
    inst:reset(t)
    for _, a in ipairs(Hg.solve(t)) do
      local _, r, done = inst:step(a)
      if done then score = r break end
    end
    solve = solve + score / #held_out
  end
  rows[#rows + 1] = { arm = "solve", greedy = solve }
  print(string.format("seed %d: %.0f s", seed, rl.clock() - t0))
  return rows
end

local function print_table(list, title)
  local w = #list > 1 and 13 or 7
  local function cell(v, scale, fmt) return string.format("%" .. w .. "s", R.pm(v, scale, fmt)) end
  print(string.format("\nhaggle, %s; %d steps of %d tasks x %d dialogues; 3 held-out opponents (greedy), %d sampled",
    title, o.steps, o.tasks, o.group, o.eval_samples))
  local head = { string.format("%-8s", "arm"), string.format("%" .. w .. "s", "greedy") }
  for k = 1, o.rounds - 1 do head[#head + 1] = string.format("%" .. w .. "s", "score@" .. k * (o.steps // o.rounds)) end
  for _, h in ipairs { "score", "coins", "deal%", "rapport%", "s/step" } do
    head[#head + 1] = string.format("%" .. w .. "s", h)
  end
  print(table.concat(head, " "))
  for _, r in ipairs(R.summarise(list, "arm")) do
    local line = { string.format("%-8s", r.arm), cell(r.greedy, 1, "%.2f") }
    for k = 1, o.rounds - 1 do line[#line + 1] = cell(r["score" .. k], 1, "%.2f") end
    for _, c in ipairs { cell(r.score, 1, "%.2f"), cell(r.coins, 1, "%.2f"), cell(r.deal), cell(r.rapport),
      cell(r.sps, 1, "%.2f") } do line[#line + 1] = c end
    print(table.concat(line, " "))
  end
end

local t_all = rl.clock()
R.report(o.seed, o.seeds, one_seed, print_table)
print(string.format("(greedy: the greedy policy's mean score over the 3 held-out opponents at the end; score@s: the "
  .. "sampled dialogues' mean score after step s; score, coins, deal%%, rapport%% (say fair among the first two "
  .. "utterances): over the sampled dialogues at the end; s/step: measured, eval "
  .. "excluded; %.0f s in all)", rl.clock() - t_all))
