-- search_qa.lua - GRPO vs IGPO vs A2TGPO on envs/kbqa.lua, multi-hop questions answered with a
-- search tool (spec reproductions.md, section 3.2). One SFT warm start on the oracle's
-- demonstrations (one correct search per hop, sometimes a redundant one) is shared by every arm;
-- each arm loads it and trains with the same seed, tasks per step and steps:
--   grpo    advantage "grpo" on the episode's reward (1 for the right answer, -0.1 an invalid
--           action);
--   igpo    advantage "igpo": after the prompt and after each turn the gold answer ("answer
--           <x>") is scored under the policy without disturbing the episode (the info_gain
--           option, mrl_rollout_score); each search turn's reward is its information gain (the
--           change of the answer's mean token probability, kind "prob"), the answer turn's the
--           outcome, all normalised over the batch and summed (gamma 1) from each turn on;
--   a2tgpo  advantage "a2tgpo" (kind "logprob"): the IG normalised within (question, turn
--           index), accumulated with the square-root rescaling, alpha 0.3 on top of the GRPO
--           outcome advantage, and each turn's clip range scaled by 1 + 0.3 (2 sigmoid(g) - 1)
--           with a turn-level ratio (loss "a2tgpo").
-- And StepPO's comparison (--methods grpo,gae,step_gae):
--   gae       PPO with a critic (a value head on the policy's trunk), token-level GAE (gamma 1,
--             lambda 1);
--   step_gae  StepPO's step-level GAE: one step per turn, the critic's value before each turn's
--             first sampled token, gamma 0.99, lambda 1, whitened over the batch's turns (the
--             paper's GSPO loss is not used: every arm keeps the same PPO clip loss).
-- Every arm: clip 0.2 / 0.28, lr 2e-4 (1e-3 collapsed every arm to ~0% held-out in 30 steps), hops
-- 1-4 mixed in training. Measured greedily on held-out
-- questions (held-out start entities or relation chains), eval_tasks per hop count. The table
-- gives held-out success per hop count, the mean |advantage| of each turn position over the
-- steps (adv/turn_<k>_abs, which igpo and a2tgpo log) and the seconds per RL step.
--
--   moonrl run recipes/search_qa.lua [--seed 1] [--seeds 3] [--methods grpo,igpo,a2tgpo,gae,step_gae]
--     [--steps 30] [--tasks 8] [--group 8] [--sft-examples 6000] [--sft-epochs 3]
--     [--eval-tasks 32] [--lr 2e-4] [--temperature 1] [--reuse-sft] [--grid 16]
--     [--rl-sft-epochs 3] [--rl-sft-lr 2e-4] [--dir runs]
--
-- --grid n: the PASS@(k, T) evaluation grid (spec 3.2, "PASS@(k,T)"; rl.train.eval.pass_grid)
-- of each arm's policy after training, of the SFT policy and of the sft-rl policy, on the
-- held-out 1-hop and 3-hop questions: n samples a question at temperature 1 (k = 1, 2, 4, ... up
-- to n; T = 1..6 turns); 0 (the default) leaves it out. sft-rl is the paper's matched-data
-- control: the SFT policy fine-tuned (rl.sft, --rl-sft-epochs, --rl-sft-lr, batches of 16) on
-- the first arm's successful training rollouts, their tokens as sampled (the data RL learned
-- from, without the failures it also learned from); it is evaluated without further training.
--
-- --reuse-sft loads <dir>/search_qa-sft-s<seed>.bin when it exists instead of training it again
-- (the same seed and SFT options give the same file).
--
-- Files go to <dir>/search_qa-<arm>-s<seed>/ and the warm start to <dir>/search_qa-sft-s<seed>.bin.
local rl = require "moonrl"

local root = os.getenv("MOONRL_ROOT") or "."
package.path = root .. "/?.lua;" .. package.path
local kbqa = require "envs.kbqa"
local R = rl.recipe

local o, why = R.args(arg, { seed = 1, seeds = 1, methods = "grpo,igpo,a2tgpo", steps = 30,
  tasks = 8, group = 8, sft_examples = 6000, sft_epochs = 3, eval_tasks = 32, lr = 2e-4,
  temperature = 1.0, reuse_sft = false, grid = 0, rl_sft_epochs = 3, rl_sft_lr = 2e-4, dir = root .. "/runs" })
if not o then error("search_qa.lua: " .. why, 0) end

local KNOWN = { grpo = true, igpo = true, a2tgpo = true, gae = true, step_gae = true }
local METHODS = {}
for name in o.methods:gmatch("[^,]+") do
  if not KNOWN[name] then error("search_qa.lua: unknown method '" .. name .. "' (grpo, igpo, a2tgpo, gae, step_gae)", 0) end
  METHODS[#METHODS + 1] = name
end
local HOPS, TURNS = kbqa.max_hops, kbqa.max_turns
local GRID_HOPS, GRID_KS = { 1, 3 }, {}
if o.grid < 0 then error("search_qa.lua: --grid: 0 or a number of samples expected", 0) end
if o.rl_sft_epochs < 1 then error("search_qa.lua: --rl-sft-epochs: a positive integer expected", 0) end
if not (o.rl_sft_lr > 0) then error("search_qa.lua: --rl-sft-lr: a positive number expected", 0) end
do
  local k = 1
  while k <= o.grid do GRID_KS[#GRID_KS + 1], k = k, 2 * k end
end

local ADVANTAGE = {
  grpo = { advantage = "grpo" },
  igpo = { advantage = "igpo", info_gain = { answer = kbqa.gold, kind = "prob", gamma = 1 } },
  a2tgpo = { advantage = "a2tgpo", info_gain = { answer = kbqa.gold, kind = "logprob",
    alpha = 0.3, beta = 0.3, gamma = 1 } },
  gae = { advantage = "gae" },
  step_gae = { advantage = "step_gae", gamma = 0.99, lam = 1 },
}

local function new_model(seed)
  local tok = rl.tokenizer.bytes()
  return rl.model.new { vocab = tok:vocab_size(), dim = 64, layers = 2, heads = 4, ffn = 192,
    ctx = 320, seed = seed }, tok
end

-- The held-out questions, the same for every arm: eval_tasks of each hop count.
local HELD = kbqa.held_out(o.eval_tasks)

-- Greedy held-out success per hop count (h1 .. h4) and over all.
-- (in chunks of the rollout's episodes, tasks x group).
local function held_out(ctx) return kbqa.success_by_hops(ctx, HELD, o.tasks * o.group) end

-- The PASS@(k, T) grids of a policy (ctx) on the held-out questions of each of GRID_HOPS:
-- {[h] = grid}.
local function grids(ctx)
  local out = {}
  for _, h in ipairs(GRID_HOPS) do
    local list = {}
    for _, t in ipairs(HELD) do
      if t.hops == h then list[#list + 1] = t end
    end
    out[h] = rl.train.eval.pass_grid(ctx, { tasks = list, n = o.grid, ks = GRID_KS, seed = 77 + h })
  end
  return out
end

local function warm_start(seed)
  return kbqa.warm_start { env = kbqa, path = string.format("%s/search_qa-sft-s%d.bin", o.dir, seed),
    reuse = o.reuse_sft, new_model = new_model, seed = seed, examples = o.sft_examples, epochs = o.sft_epochs }
end

local printed_rate = false

-- run_arm(seed, sft_path, method [, rl_data]): with rl_data (a list), the arm's successful
-- training rollouts are appended to it as SFT examples.
local function run_arm(seed, sft_path, method, rl_data)
  local m, tok = new_model(seed)
  m:load_checkpoint(sft_path)
  m:reset_optimizer()
  local secs, n, absadv, grid = 0, 0, {}, {}
  local opts = {
    model = m, tokenizer = tok, env = kbqa, name = string.format("search_qa-%s-s%d", method, seed),
    dir = o.dir, seed = seed, overwrite = true, steps = o.steps, tasks_per_step = o.tasks,
    group_size = o.group, minibatch = o.tasks * o.group, max_turn_tokens = 20, clip_low = 0.2,
    clip_high = 0.28, lr = o.lr, temperature = o.temperature, capacity = 320,
    eval = { every = o.steps, tasks = 1, k = 1 }, progress = false, log_episodes = 2,
    evaluate = function(ctx, step)
      if o.grid > 0 and (step == o.steps or (step == 0 and method == METHODS[1])) then
        grid[step == 0 and "SFT" or method] = grids(ctx)
      end
      return held_out(ctx)
    end,
    on_step = function(step, mt)
      local s = mt["time/step"] - (mt["time/eval"] or 0)
      secs, n = secs + s, n + 1
      for k = 1, TURNS do
        local v = mt["adv/turn_" .. k .. "_abs"]
        if v then absadv[k] = (absadv[k] or 0) + v / o.steps end
      end
      if not printed_rate then
        printed_rate = true
        print(string.format("  measured: %.2f s per RL step (%s, step %d; %d episodes a step)", s, method,
          step, o.tasks * o.group))
        io.stdout:flush()
      end
    end,
  }
  for k, v in pairs(ADVANTAGE[method]) do opts[k] = v end
  if rl_data then
    opts.reward = function(ctx, batch, step) -- the default reward stage, after keeping the successes
      for _, ex in ipairs(batch:sft_examples(function(ep) return ep.success end)) do rl_data[#rl_data + 1] = ex end
      return rl.train.reward.run(ctx, batch, step)
    end
  end
  local result = rl.train(opts)
  local row = { arm = method, sps = secs / math.max(n, 1), before = result.before, grid = grid }
  for h = 1, HOPS do row["h" .. h] = result.after["eval/h" .. h] end
  row.all = result.after["eval/all"]
  for k = 1, TURNS do row["a" .. k] = absadv[k] end
  print(string.format("  %-7s %d steps  %.2f s/step  held-out %.1f%% (1-4 hops: %s)", method, o.steps, row.sps,
    100 * row.all, table.concat({ R.pm(row.h1), R.pm(row.h2), R.pm(row.h3), R.pm(row.h4) }, " ")))
  io.stdout:flush()
  return row
end

-- The sft-rl policy: the SFT start fine-tuned on data (the first arm's successful training
-- rollouts); its PASS@(k, T) grids and greedy held-out success, from a trainer context that
-- evaluates at step 0 and never updates (one rollout step, the update stage a no-op).
local function sft_on_rl(seed, sft_path, data)
  local m, tok = new_model(seed)
  m:load_checkpoint(sft_path)
  m:reset_optimizer()
  local t0, loss = rl.clock(), 0 / 0
  if #data > 0 then
    loss = rl.sft { model = m, data = data, epochs = o.rl_sft_epochs, batch_size = 16, lr = o.rl_sft_lr,
      seed = rl.train.mix(seed, 0x5F8) }.final_loss
    m:reset_optimizer()
  end
  local sft_seconds, grid, held = rl.clock() - t0, nil, nil
  rl.train { model = m, tokenizer = tok, env = kbqa, name = string.format("search_qa-sft_rl-s%d", seed),
    dir = o.dir, seed = seed, overwrite = true, steps = 1, tasks_per_step = o.tasks, group_size = o.group,
    max_turn_tokens = 20, capacity = 320, temperature = o.temperature, eval = { every = 1, tasks = 1, k = 1 },
    progress = false, log_episodes = 0, update = function() return {} end,
    evaluate = function(ctx, step)
      if step == 0 then grid, held = grids(ctx), held_out(ctx) end
      return {}
    end }
  print(string.format("  sft-rl  %d successful %s rollouts x %d epochs (lr %g), final loss %.3f, %.0f s; "
    .. "held-out %.1f%% (1-4 hops: %s)", #data, METHODS[1], o.rl_sft_epochs, o.rl_sft_lr, loss, sft_seconds, 100 * held.all,
    table.concat({ R.pm(held.h1), R.pm(held.h2), R.pm(held.h3), R.pm(held.h4) }, " ")))
  io.stdout:flush()
  return grid
end

local function one_seed(seed)
  local t0 = rl.clock()
  local sft_path, sft = R.announced_start(seed, warm_start, o.sft_epochs)
  local rows, sft_row, rl_data = {}, { arm = "SFT" }, o.grid > 0 and {} or nil
  for i, method in ipairs(METHODS) do
    local row = run_arm(seed, sft_path, method, i == 1 and rl_data or nil)
    rows[#rows + 1] = row
    if i == 1 then
      for h = 1, HOPS do sft_row["h" .. h] = row.before["eval/h" .. h] end
      sft_row.all = row.before["eval/all"]
    end
  end
  rows[#rows + 1] = sft_row
  if o.grid > 0 then
    local by = {}
    for _, row in ipairs(rows) do
      for policy, g in pairs(row.grid or {}) do by[policy] = g end
      row.grid = nil
    end
    by["sft-rl"] = sft_on_rl(seed, sft_path, rl_data)
    local order = { "SFT" }
    for _, m in ipairs(METHODS) do order[#order + 1] = m end
    order[#order + 1] = "sft-rl"
    for _, h in ipairs(GRID_HOPS) do
      print(string.format("\nseed %d: PASS@(k,T) on the %d held-out %d-hop questions, %d samples each at temperature 1",
        seed, o.eval_tasks, h, o.grid))
      local head = { string.format("%-8s %2s", "policy", "T") }
      for _, k in ipairs(GRID_KS) do head[#head + 1] = string.format("%6s", "k=" .. k) end
      print(table.concat(head, " "))
      for _, policy in ipairs(order) do
        for t = 1, TURNS do
          local line = { string.format("%-8s %2d", t == 1 and policy or "", t) }
          for _, k in ipairs(GRID_KS) do line[#line + 1] = string.format("%6.1f", 100 * by[policy][h][t][k]) end
          print(table.concat(line, " "))
        end
      end
    end
  end
  rows.seconds = rl.clock() - t0
  print(string.format("seed %d: %.0f s", seed, rows.seconds))
  return rows
end

local function print_table(list, title)
  local w = #list > 1 and 13 or 7
  local function cell(v, scale, fmt) return string.format("%" .. w .. "s", R.pm(v, scale, fmt)) end
  print(string.format("\nsearch_qa, %s; %d steps of %d questions x %d episodes; held-out questions, %d per hop count, greedy",
    title, o.steps, o.tasks, o.group, o.eval_tasks))
  local head = { string.format("%-8s", "method") }
  for h = 1, HOPS do head[#head + 1] = string.format("%" .. w .. "s", h .. "-hop%") end
  head[#head + 1] = string.format("%" .. w .. "s", "all%")
  for k = 1, TURNS do head[#head + 1] = string.format("%" .. w .. "s", "|A|t" .. k) end
  head[#head + 1] = string.format("%7s", "s/step")
  print(table.concat(head, " "))
  for _, r in ipairs(R.summarise(list, "arm")) do
    local line = { string.format("%-8s", r.arm) }
    for h = 1, HOPS do line[#line + 1] = cell(r["h" .. h]) end
    line[#line + 1] = cell(r.all)
    for k = 1, TURNS do line[#line + 1] = cell(r["a" .. k], 1, "%.3f") end
    local s = type(r.sps) == "table" and r.sps.mean or r.sps
    line[#line + 1] = string.format("%7s", s and string.format("%.2f", s) or "-")
    print(table.concat(line, " "))
  end
end

local t_all = rl.clock()
R.report(o.seed, o.seeds, one_seed, print_table)
print(string.format("(|A|tk: mean |advantage| of turn k over the steps, logged by igpo and a2tgpo; s/step: "
  .. "measured seconds per RL step, eval excluded; %.0f s in all)", rl.clock() - t_all))
