-- clinic.lua - MedExAgent in miniature (shared/spec/reproductions.md §2.1): SFT on imperfect
-- Calgary-Cambridge demonstrations, then DAPO (clip-higher 0.2 / 0.3 as released, plus dynamic
-- sampling on the reward graph's totals) on the composite reward, against the same SFT checkpoint
-- trained on diagnostic accuracy alone, against an "order every exam" policy, on the 500
-- held-out patients of envs/clinic.lua (case seeds 1..500, never trained on; patient noise 0.3,
-- exam noise 0.1).
--
--   arms (same SFT checkpoint, same RL seeds and task sequence):
--     composite   R = 1.0 R_dx + 0.5 R_tool - 0.1 R_cost (the released RL config's weights)
--     accuracy    R = R_dx (w_tool = w_cost = 0: the ablation)
--   rows without RL: the SFT policy (the arms' step 0), the scripted "order every exam" policy,
--   the imperfect oracle the SFT data came from, the perfect oracle (the ceiling), history only.
--
--   moonrl run recipes/clinic.lua [--seed 1] [--seeds 3] [--steps 90] [--arms composite,accuracy]
--        [--sft 2000] [--sft-epochs 3] [--eval 500] [--tasks 16] [--group 8] [--dim 64]
--        [--layers 2] [--lr 1e-4] [--uniform-exam-cost] [--dir runs] [--smoke]
--
-- --seeds K runs seeds seed..seed+K-1 and reports each figure's mean ± sample sd; --smoke is a
-- tiny run (a few steps of a small model) that only shows the recipe works. Files go to
-- <dir>/clinic-<arm>-s<seed>/ (metrics.jsonl, episodes.jsonl with each patient's persona and
-- noise, curve.svg, reward.svg, diagnostics.svg). The README ("Reproductions", "Clinic") has the
-- measured table and the verdict.
local rl = require "moonrl"

local root = os.getenv("MOONRL_ROOT") or "."
package.path = root .. "/?.lua;" .. package.path
local env = require "envs.clinic"

local o, why = rl.recipe.args(arg, { seed = 1, seeds = 1, steps = 90, arms = "composite,accuracy",
  sft = 2000, sft_epochs = 3, eval = 500, tasks = 16, group = 8, dim = 64, layers = 2, lr = 1e-4,
  uniform_exam_cost = false, dir = root .. "/runs", smoke = false })
if not o then error("clinic.lua: " .. why, 0) end
if o.smoke then
  o.steps, o.sft, o.sft_epochs, o.eval, o.tasks, o.group, o.dim, o.layers = 2, 150, 2, 8, 2, 4, 32, 1
end
local ARMS = {
  composite = { label = "RL composite (DAPO)", reward = { uniform_exam_cost = o.uniform_exam_cost } },
  accuracy = { label = "RL accuracy only (DAPO)", reward = { tool = 0, cost = 0 } },
}
local arms = {}
for name in o.arms:gmatch("[^,]+") do
  if not ARMS[name] then error("clinic.lua: unknown arm '" .. name .. "' (composite, accuracy)", 0) end
  arms[#arms + 1] = name
end

local tok = rl.tokenizer.bytes()
local function new_model(seed)
  return rl.model.new { vocab = tok:vocab_size(), dim = o.dim, layers = o.layers, heads = 4,
    ffn = 3 * o.dim, ctx = 512, seed = seed }
end
local held_out = env.tasks("test", o.eval)

-- The held-out figures of a list of episodes (trained: rl.batch episodes; scripted: env.play
-- results): accuracy, R_dx, exam cost (money + discomfort levels), exams, R_tool, turns.
local function figures(list)
  local f = { accuracy = 0, r_dx = 0, cost = 0, exams = 0, r_tool = 0, turns = 0, unneeded = 0 }
  for _, e in ipairs(list) do
    local c = e.costs or {}
    f.accuracy = f.accuracy + (e.success and 1 or 0)
    f.r_dx = f.r_dx + e.r_dx
    f.cost = f.cost + (c.money or 0) + (c.discomfort or 0)
    f.exams = f.exams + (c.exams or 0)
    f.unneeded = f.unneeded + (c.unneeded_n or 0)
    f.r_tool = f.r_tool + env.tool_score(e.calls, env.gt_calls(env.case(e.task.seed).disease))
    f.turns = f.turns + e.turns
  end
  for k, v in pairs(f) do f[k] = v / #list end
  return f
end

-- The evaluate stage: the policy on the held-out patients, greedy and sampled at temperature 1
-- (what RL trains; its figures are prefixed t1_).
local function evaluate(ctx)
  local f
  for _, temp in ipairs { 0, 1 } do
    local list, chunk = {}, ctx.cfg.tasks_per_step * ctx.cfg.group_size -- the rollout's episodes
    for first = 1, #held_out, chunk do
      local part = table.move(held_out, first, math.min(first + chunk - 1, #held_out), 1, {})
      local b = ctx.stages.rollout(ctx, { tasks = part, repeats = 1, seed = rl.train.mix(4242, first),
        temperature = temp, group_base = 0 })
      for _, ep in ipairs(b.episodes) do
        list[#list + 1] = { success = ep.success, r_dx = ep.reward, costs = ep.costs,
          calls = env.episode_calls(ep), task = ep.task, turns = ep.turns }
      end
    end
    if temp == 0 then
      f = figures(list)
    else
      for k, v in pairs(figures(list)) do f["t1_" .. k] = v end
    end
  end
  f.greedy_success = f.accuracy
  return f
end

-- The scripted rows (the same in every seed: the cases and their noise are the tasks').
local function scripted(actions_of)
  local list = {}
  for i, t in ipairs(held_out) do
    local out = env.play(t, env.replay(actions_of(t)))
    list[i] = { success = out.success, r_dx = out.reward, costs = out.costs, calls = out.calls, task = t,
      turns = out.turns }
  end
  return figures(list)
end
local SCRIPTED = {
  { key = "order_all", label = "order every exam (scripted)", fn = env.order_all },
  { key = "oracle", label = "SFT demonstrator (scripted)", fn = function(t) return env.oracle(t, rl.rng(t.seed)) end },
  { key = "perfect", label = "perfect oracle (ceiling)", fn = env.perfect },
  { key = "history", label = "history only (scripted)", fn = env.no_exam },
}
local scripted_rows = {}
for _, s in ipairs(SCRIPTED) do scripted_rows[s.key] = scripted(s.fn) end

-- One seed: the shared SFT warm start, then each arm from its checkpoint. Returns {key =
-- figures} and the timings.
local function run_seed(seed)
  local rows, timing = {}, { arms = {} }
  local t0 = rl.clock()
  local model = new_model(seed)
  local data = rl.train.oracle_examples({ cfg = { env = env, max_turns = env.max_turns }, tokenizer = tok },
    o.sft, rl.train.mix(seed, 0xF7))
  local sft_path = string.format("%s/clinic-sft-s%d.bin", o.dir, seed)
  local s = rl.recipe.warm_start { model = model, data = data, epochs = o.sft_epochs, path = sft_path,
    seed = rl.train.mix(seed, 0x5F7) }
  timing.sft, timing.sft_loss, timing.sft_examples = rl.clock() - t0, s.final_loss, #data
  for _, arm in ipairs(arms) do
    local m = new_model(seed)
    assert(m:load_checkpoint(sft_path))
    local ta = rl.clock()
    local result = rl.train {
      model = m, tokenizer = tok, env = env, name = string.format("clinic-%s-s%d", arm, seed), dir = o.dir,
      seed = seed, overwrite = true, reward = env.reward(ARMS[arm].reward),
      steps = o.steps, tasks_per_step = o.tasks, group_size = o.group, minibatch = 64, epochs = 1,
      max_turn_tokens = 16, temperature = 1.0,
      advantage = "grpo", loss = "ppo", clip_low = 0.2, clip_high = 0.3, entropy_coef = 0.002,
      dynamic_sampling = "reward", max_sampling_tries = 2,
      lr = o.lr, schedule = "cosine", min_lr = o.lr / 10,
      evaluate = evaluate, eval = { every = o.steps },
      progress = false,
    }
    local steps, step_s = 0, 0
    for _, h in ipairs(result.history) do
      if h.step > 0 and h["time/step"] then steps, step_s = steps + 1, step_s + h["time/step"] end
    end
    local function strip(t)
      local f = {}
      for k, v in pairs(t) do if k:match("^eval/") then f[k:sub(6)] = v end end
      return f
    end
    rows.sft = rows.sft or strip(result.before)
    rows[arm] = strip(result.after)
    timing.arms[arm] = { seconds = rl.clock() - ta, per_step = steps > 0 and step_s / steps or 0, dir = result.dir }
  end
  timing.total = rl.clock() - t0
  return rows, timing
end

local ORDER = { { key = "sft", label = "SFT policy" } }
for _, arm in ipairs(arms) do ORDER[#ORDER + 1] = { key = arm, label = ARMS[arm].label } end
for _, s in ipairs(SCRIPTED) do ORDER[#ORDER + 1] = { key = s.key, label = s.label } end
local COLS = { { "accuracy", "accuracy", "%8.1f%%", 100 }, { "r_dx", "R_dx", "%6.3f", 1 },
  { "cost", "exam cost", "%9.2f", 1 }, { "exams", "exams/case", "%10.2f", 1 },
  { "unneeded", "unneeded", "%8.2f", 1 }, { "r_tool", "R_tool", "%6.3f", 1 }, { "turns", "turns", "%5.1f", 1 } }

local function header()
  local h = string.format("%-28s", "policy")
  for _, c in ipairs(COLS) do h = h .. " " .. string.format("%" .. (#string.format(c[3], 0) ) .. "s", c[2]) end
  return h
end

-- The figures of row r (a trained policy's greedy ones, or with prefix "t1_" its sampled ones;
-- a scripted policy's are the same in both).
local function row_figures(rows, r, prefix)
  local f = rows[r.key]
  if not f then return scripted_rows[r.key] end
  local out = {}
  for _, c in ipairs(COLS) do out[c[1]] = f[prefix .. c[1]] end
  return out
end

local function print_table(title, rows, prefix)
  print("\n" .. title)
  print(header())
  for _, r in ipairs(ORDER) do
    local f = row_figures(rows, r, prefix)
    local line = string.format("%-28s", r.label)
    for _, c in ipairs(COLS) do line = line .. " " .. string.format(c[3], c[4] * f[c[1]]) end
    print(line)
  end
end

print(string.format("clinic: MedExAgent miniature; policy d=%d, %d layers (%d parameters); %d held-out "
  .. "patients (noise 0.3, exam noise 0.1); RL %d steps x %d cases x %d episodes; BLAS %s x%d", o.dim, o.layers,
  new_model(o.seed):config().params, #held_out, o.steps, o.tasks, o.group, rl.blas_info().core, rl.blas_info().threads))

local all = rl.recipe.over_seeds(o.seed, o.seeds, function(seed)
  local rows, timing = run_seed(seed)
  print_table(string.format("seed %d: held-out patients, greedy (exam cost: money + discomfort levels per case)", seed),
    rows, "")
  print_table(string.format("seed %d: held-out patients, sampled at temperature 1 (trained rows; scripted as above)",
    seed), rows, "t1_")
  local parts = {}
  for _, arm in ipairs(arms) do
    local a = timing.arms[arm]
    parts[#parts + 1] = string.format("%s %.0f s (%.2f s/step)", arm, a.seconds, a.per_step)
  end
  print(string.format("seconds: SFT %.0f (%d examples, final loss %.3f); %s; seed total %.0f",
    timing.sft, timing.sft_examples, timing.sft_loss, table.concat(parts, "; "), timing.total))
  return rows
end)

-- "mean ± sample sd" of a list over seeds in fmt (the mean alone for one seed).
local function pm(values, fmt)
  local mean, spread, n = rl.recipe.mean_spread(values)
  return rl.recipe.pm({ mean = mean, spread = spread, n = n }, 1, fmt)
end

if #all > 1 then
  for _, prefix in ipairs { "", "t1_" } do
    print(string.format("\nover %d seeds (%d..%d), %s: mean ± sample sd", #all, o.seed, o.seed + #all - 1,
      prefix == "" and "greedy" or "sampled at temperature 1"))
    local headers = {}
    for k, c in ipairs(COLS) do headers[k] = c[2] end
    for _, line in ipairs(rl.recipe.spread_table { runs = all, rows = ORDER, headers = headers, label_width = 28,
      value = function(rows, r, k) return COLS[k][4] * row_figures(rows, r, prefix)[COLS[k][1]] end,
      fmt = function(k) return COLS[k][4] == 100 and "%.1f" or "%.2f" end }) do
      print(line)
    end
  end
end

-- The claim's comparisons, per seed: the composite arm against order-every-exam (accuracy kept,
-- exam cost cut) and against the accuracy-only ablation (which should order more).
local function has(name) for _, a in ipairs(arms) do if a == name then return true end end return false end
if has("composite") then
  for _, prefix in ipairs { "", "t1_" } do
    local d_acc, ratio, d_exams = {}, {}, {}
    for i, rows in ipairs(all) do
      local c = row_figures(rows, { key = "composite" }, prefix)
      d_acc[i] = 100 * (c.accuracy - scripted_rows.order_all.accuracy)
      ratio[i] = c.cost / scripted_rows.order_all.cost
      if rows.accuracy then d_exams[i] = row_figures(rows, { key = "accuracy" }, prefix).exams - c.exams end
    end
    print(string.format("%s composite vs order-every-exam: accuracy %s points, exam cost x%s; accuracy-only "
      .. "minus composite: exams/case %s", prefix == "" and "greedy: " or "sampled:", pm(d_acc, "%.1f"),
      pm(ratio, "%.3f"), #d_exams > 0 and pm(d_exams, "%.2f") or "-"))
  end
end
