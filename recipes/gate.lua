-- gate.lua - the selective rollout gate against plain GRPO and DAPO's dynamic sampling, on the
-- mixed-difficulty corridor maze (envs/maze.lua; reproductions.md section 2.4). One SFT warm
-- start per seed, shared by three arms trained with the same seeds and budget:
--   grpo   plain GRPO
--   gate   GRPO + the selective gate: after turn K every group whose episodes' first K actions
--          are alike (mean pairwise normalised edit distance d_K < d_low) is stopped and left out
--   dapo   GRPO + DAPO dynamic sampling: groups rolled out to the end, flat ones dropped after,
--          more tasks drawn in their place (up to max_sampling_tries)
-- Every episode samples from its own stream and decodes batch-invariantly, so a gated and an
-- ungated run of one policy share their first K turns bit for bit. K = 8 of max_turns 24 scales
-- the paper's K = 10 of 30; by turn 8 most mixed tasks have met a junction, where the warm
-- policy's episodes part ways. The gate's precision and recall are measured offline over the
-- plain arm's groups (d_K of each, against whether its returns were all equal), as the paper's
-- sweep did.
--
--   moonrl run recipes/gate.lua [--seed N] [--seeds N] [--steps N] [--arms grpo,gate,dapo]
--                               [--dir D] [--tiny]
--
-- --seeds N runs seeds seed .. seed + N - 1 (rl.recipe; each with its own warm start, arms in
-- turn within it) and prints mean and spread; --tiny is the smoke test's size. Files go to
-- D/gate-<arm>-<seed>/ (D is runs/ by default). 1-3 minutes a seed on 2 shared cores (0.1-0.9 s per step). Seed 1: every arm
-- 86.5% held out (the ceiling), the gate in 0.44x grpo's training time, dapo's rollout 3.6x
-- grpo's; the measured tables and the verdict are in the README, "Reproductions".
local rl = require "moonrl"

local root = os.getenv("MOONRL_ROOT") or "."
package.path = root .. "/?.lua;" .. package.path
local env = require "envs.maze"

local opts, why = rl.recipe.args(arg, { seed = 1, seeds = 1, steps = 60, arms = "grpo,gate,dapo",
  dir = root .. "/runs", tiny = false })
if not opts then error("gate.lua: " .. why, 0) end
if opts.seeds < 1 or opts.steps < 1 then error("gate.lua: --seeds and --steps: positive integers expected", 0) end

local K, D_LOW, G, TASKS, EVERY = 8, 0.12, 8, 10, 10
local size = opts.tiny and { steps = 2, tasks = 3, group = 4, sft = 40, sft_epochs = 1, eval = 6, every = 1 }
  or { steps = opts.steps, tasks = TASKS, group = G, sft = 3000, sft_epochs = 3, eval = 96, every = EVERY }
local arms = {}
for name in opts.arms:gmatch("[^,]+") do
  if name ~= "grpo" and name ~= "gate" and name ~= "dapo" then
    error("gate.lua: --arms: unknown arm " .. name .. " (grpo, gate, dapo)", 0)
  end
  arms[#arms + 1] = name
end

local tok = rl.tokenizer.bytes()

-- The shared warm start: SFT on the oracle's walks (junctions taken at random).
local function warm_start(seed)
  local m = rl.model.new { vocab = tok:vocab_size(), dim = 64, layers = 2, heads = 4, ffn = 192,
    ctx = 320, seed = seed }
  local t0 = rl.clock()
  local data = rl.train.oracle_examples({ cfg = { env = env, max_turns = env.max_turns }, tokenizer = tok },
    size.sft, rl.train.mix(seed, 1))
  local fit = rl.sft { model = m, data = data, epochs = size.sft_epochs, batch_size = 16, lr = 3e-3, warmup = 10,
    schedule = "cosine", seed = rl.train.mix(seed, 2) }
  return m, rl.clock() - t0, fit.final_loss
end

-- Each training group's first K actions per episode and whether its returns were all equal.
local function group_records(batch)
  local out = {}
  for _, g in ipairs(batch:groups()) do
    local acts, flat, first = {}, true, nil
    for j, i in ipairs(g.members) do
      local ep = batch.episodes[i]
      local a = {}
      for k = 1, math.min(K, #ep.record) do a[k] = ep.record[k].action end
      acts[j] = a
      first = first or ep.reward
      flat = flat and ep.reward == first
    end
    out[#out + 1] = { actions = acts, zero_variance = flat }
  end
  return out
end

-- The area under the ROC curve of score (higher: more likely positive), ties counted half.
local function auroc(items)
  local pos, neg, sum = 0, 0, 0
  for _, a in ipairs(items) do
    if a.positive then pos = pos + 1 else neg = neg + 1 end
  end
  if pos == 0 or neg == 0 then return nil end
  for _, a in ipairs(items) do
    if a.positive then
      for _, b in ipairs(items) do
        if not b.positive then
          sum = sum + (a.score > b.score and 1 or a.score == b.score and 0.5 or 0)
        end
      end
    end
  end
  return sum / (pos * neg)
end

-- The gate applied offline to recorded groups: cut fraction, precision, recall, AUROC.
local function offline_gate(groups)
  local cut, tp, zv, items = 0, 0, 0, {}
  for _, g in ipairs(groups) do
    local d = rl.advantage.selective_rollout_gate({ actions_per_traj = g.actions },
      { K = K, d_low = D_LOW, t_high = 2 }).prefix_edit_distance_mean
    local c = d < D_LOW
    cut, zv = cut + (c and 1 or 0), zv + (g.zero_variance and 1 or 0)
    if c and g.zero_variance then tp = tp + 1 end
    items[#items + 1] = { score = -d, positive = g.zero_variance }
  end
  local n = #groups
  return { groups = n, zero_variance = n > 0 and zv / n or 0, cut = n > 0 and cut / n or 0,
    precision = cut > 0 and tp / cut or nil, recall = zv > 0 and tp / zv or nil, auroc = auroc(items) }
end

-- The recorded groups of the first round (steps 1..eval interval): the warm policy's, before
-- training has made most groups flat.
local function first_round(groups)
  local out = {}
  for _, g in ipairs(groups) do
    if g.step <= size.every then out[#out + 1] = g end
  end
  return out
end

-- An arm of one seed, trained in rounds: arm:advance(stop) trains up to step `stop` (resuming
-- the run after the first round) and keeps that round's training seconds; arm:result() sums up.
local function new_arm(name, seed, warm)
  local recorded, rolled, turns = {}, 0, 0
  local series, rounds = {}, {}
  local sum = { rollout = 0, update = 0, reward = 0, eval = 0, step = 0, grad = 0, zero_adv = 0,
    batches = 0, updates = 0, cut = 0, groups = 0, steps = 0 }
  local function rollout(ctx, req)
    local b = rl.train.rollout.run(ctx, req)
    if req.group_base > 0 then -- a training rollout (evaluation's have group_base 0)
      local cut = b.gate and b.gate.episodes_cut or 0
      rolled = rolled + b:size() + cut
      for _, ep in ipairs(b.episodes) do turns = turns + ep.turns end
      turns = turns + cut * K -- a cut episode took K turns at most
      if name == "grpo" then
        for _, g in ipairs(group_records(b)) do
          g.step = sum.steps + 1
          recorded[#recorded + 1] = g
        end
      end
    end
    return b
  end
  local function on_step(step, mt)
    sum.steps = sum.steps + 1
    for _, k in ipairs { "rollout", "update", "reward", "eval", "step" } do
      sum[k] = sum[k] + (mt["time/" .. k] or 0)
    end
    if mt["adv/utilisation"] then
      sum.zero_adv, sum.batches = sum.zero_adv + 1 - mt["adv/utilisation"], sum.batches + 1
    end
    if mt["loss/grad_norm"] then sum.grad, sum.updates = sum.grad + mt["loss/grad_norm"], sum.updates + 1 end
    sum.cut, sum.groups = sum.cut + (mt["gate/cut"] or 0), sum.groups + (mt["gate/groups"] or 0)
    if mt["eval/greedy_success"] then
      series[#series + 1] = { step = step, success = mt["eval/greedy_success"],
        sampled = mt["eval/sample_success"], train_s = sum.step - sum.eval }
    end
  end
  local arm = { name = name }
  function arm:advance(stop)
    local before = sum.step - sum.eval
    local result = rl.train {
      model = warm:clone(), tokenizer = tok, env = env, name = string.format("gate-%s-%d", name, seed),
      dir = opts.dir, seed = seed, overwrite = #rounds == 0, resume = #rounds > 0, stop_after = stop,
      progress = false, plot = not opts.tiny,
      steps = size.steps, tasks_per_step = size.tasks, group_size = size.group,
      max_turns = env.max_turns, max_turn_tokens = 2, capacity = 320,
      advantage = "grpo", loss = "ppo", lr = 1e-3, temperature = 1, batch_invariant = true,
      rollout = rollout,
      rollout_hooks = name == "gate" and { gate = { turn = K, d_low = D_LOW } } or nil,
      dynamic_sampling = name == "dapo" or nil,
      eval = { every = size.every, tasks = size.eval, k = 1 },
      on_step = on_step,
    }
    if #rounds == 0 then
      table.insert(series, 1, { step = 0, success = result.before["eval/greedy_success"],
        sampled = result.before["eval/sample_success"], train_s = 0 })
    end
    rounds[#rounds + 1] = sum.step - sum.eval - before
  end
  function arm:result()
    return {
      arm = name, seed = seed, rollout = sum.rollout, update = sum.update, reward = sum.reward,
      eval = sum.eval, train = sum.step - sum.eval, steps = sum.steps, rounds = rounds,
      per_step = (sum.step - sum.eval) / math.max(sum.steps, 1),
      grad = sum.updates > 0 and sum.grad / sum.updates or 0,
      zero_adv = sum.batches > 0 and sum.zero_adv / sum.batches or 0,
      cut_rate = sum.groups > 0 and sum.cut / sum.groups or nil, rolled = rolled, turns = turns,
      series = series, final = series[#series].success, final_sampled = series[#series].sampled,
      offline = name == "grpo" and offline_gate(recorded) or nil,
      offline_first = name == "grpo" and offline_gate(first_round(recorded)) or nil,
    }
  end
  return arm
end

-- The training seconds an arm took to first reach held-out success >= target at an evaluation.
local function time_to(r, target)
  for _, p in ipairs(r.series) do
    if p.success >= target - 1e-9 then return p.train_s end
  end
  return nil
end

local function pct(x) return x and string.format("%.1f%%", 100 * x) or "-" end
local function num(x, f) return x and string.format(f or "%.1f", x) or "-" end

local function median(xs)
  local s = table.move(xs, 1, #xs, 1, {})
  table.sort(s)
  local n = #s
  return n % 2 == 1 and s[(n + 1) // 2] or (s[n // 2] + s[n // 2 + 1]) / 2
end

local function print_seed(rows, warm_s, warm_loss, seed)
  local base
  for _, r in ipairs(rows) do if r.arm == "grpo" then base = r end end
  local target = base and base.final
  print(string.format("\nmaze, seed %d: SFT %.0f s (%d examples, final loss %.3f); %d steps x %d tasks x %d episodes, K = %d of %d turns, d_L = %.2f",
    seed, warm_s, size.sft, warm_loss, size.steps, size.tasks, size.group, K, env.max_turns, D_LOW))
  print(string.format("%-5s %8s %8s %8s %7s %8s %9s %8s %7s %8s %7s %8s %8s", "arm", "train s", "rollout",
    "update", "s/step", "to tgt", "episodes", "turns", "cut", "zero-adv", "grad", "held-out", "sampled"))
  for _, r in ipairs(rows) do
    local tt = target and time_to(r, target)
    print(string.format("%-5s %8.1f %8.1f %8.1f %7.2f %8s %9d %8d %7s %8s %7.3f %8s %8s", r.arm, r.train,
      r.rollout, r.update, r.per_step, tt and string.format("%.1f", tt) or "n/r", r.rolled, r.turns,
      pct(r.cut_rate), pct(r.zero_adv), r.grad, pct(r.final), pct(r.final_sampled)))
  end
  if target then print(string.format("target held-out success: %s (grpo's final)", pct(target))) end
  for _, r in ipairs(rows) do
    local parts = {}
    for _, p in ipairs(r.series) do parts[#parts + 1] = string.format("%d:%s", p.step, pct(p.success)) end
    print(string.format("held-out %-5s %s", r.arm, table.concat(parts, " ")))
  end
  if base and base.offline then
    for _, o in ipairs { base.offline_first, base.offline } do
      print(string.format("gate offline over grpo's %d groups%s: zero-variance %s, cut %s, precision %s, recall %s, AUROC %s",
        o.groups, o == base.offline and "" or string.format(" of steps 1-%d", size.every),
        pct(o.zero_variance), pct(o.cut), num(o.precision, "%.2f"), num(o.recall, "%.2f"),
        num(o.auroc, "%.2f")))
    end
  end
  for _, r in ipairs(rows) do
    if r.arm ~= "grpo" and base then
      local per = {}
      for i, t in ipairs(r.rounds) do per[i] = t / base.rounds[i] end
      print(string.format("%s / grpo: train time %.2fx (median of %d rounds %.2fx; rollout %.2fx, update %.2fx), episodes %.2fx, env turns %.2fx, held-out %+.1f pp",
        r.arm, r.train / base.train, #per, median(per), r.rollout / base.rollout,
        r.update / math.max(base.update, 1e-9), r.rolled / base.rolled, r.turns / base.turns,
        100 * (r.final - base.final)))
    end
  end
end

local all = rl.recipe.over_seeds(opts.seed, opts.seeds, function(seed)
  local warm, warm_s, warm_loss = warm_start(seed)
  local list = {}
  for i, name in ipairs(arms) do list[i] = new_arm(name, seed, warm) end
  -- the arms take turns, a round (an evaluation interval) each, so that the machine's load
  -- falls on all of them alike; per-round times are compared as medians
  local stop = 0
  repeat
    stop = math.min(stop + size.every, size.steps)
    for _, a in ipairs(list) do a:advance(stop) end
  until stop >= size.steps
  local rows = {}
  for i, a in ipairs(list) do rows[i] = a:result() end
  print_seed(rows, warm_s, warm_loss, seed)
  return rows
end)

if opts.seeds > 1 then
  print(string.format("\nmaze, %d seeds (arms in turn within each seed): mean +- sd; ratios to grpo as medians over seeds", opts.seeds))
  print(string.format("%-5s %14s %14s %14s %14s %14s %10s %10s", "arm", "train s", "rollout s", "update s",
    "held-out", "zero-adv", "train/grpo", "roll/grpo"))
  for a, arm in ipairs(arms) do
    local col = { train = {}, rollout = {}, update = {}, final = {}, zero_adv = {}, rt = {}, rr = {} }
    for _, rows in ipairs(all) do
      local r, b = rows[a], nil
      for _, x in ipairs(rows) do if x.arm == "grpo" then b = x end end
      for _, k in ipairs { "train", "rollout", "update", "final", "zero_adv" } do col[k][#col[k] + 1] = r[k] end
      if b then
        col.rt[#col.rt + 1] = r.train / b.train
        col.rr[#col.rr + 1] = r.rollout / b.rollout
      end
    end
    local function ms(xs, scale, f)
      local mu, sd = rl.recipe.mean_spread(xs)
      return string.format(f, mu * scale, sd * scale)
    end
    print(string.format("%-5s %14s %14s %14s %14s %14s %10s %10s", arm, ms(col.train, 1, "%.1f+-%.1f"),
      ms(col.rollout, 1, "%.1f+-%.1f"), ms(col.update, 1, "%.1f+-%.1f"), ms(col.final, 100, "%.1f+-%.1f%%"),
      ms(col.zero_adv, 100, "%.1f+-%.1f%%"), #col.rt > 0 and string.format("%.2fx", median(col.rt)) or "-",
      #col.rr > 0 and string.format("%.2fx", median(col.rr)) or "-"))
  end
end

return all
