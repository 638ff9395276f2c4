-- clinic_ttopd.lua - TT-OPD (Healthcare AI GYM; shared/spec/reproductions.md §2.1, the second
-- clinic recipe) in miniature on envs/clinic.lua: GRPO against GRPO + TT-OPD, from one SFT
-- checkpoint with the same RL seeds and task sequence, on the held-out patients (case seeds
-- 1..N, never trained on; patient noise 0.3, exam noise 0.1).
--
--   TT-OPD (rl.train's teacher option, moonrl.train.teacher): a gradient-free EMA copy of the
--   policy after SFT (m = 0.99 per update) sees, in its system message, the privileged text
--   "hint dx=<disease>; exams <the case's ground-truth exams>"; its per-turn k3 KL to the
--   student on the student's sampled tokens (each turn's first 8), weighted beta = 0.05, joins
--   the GRPO loss. (The spec's choices; the paper pins none of them.)
--   SFT: the clinic recipe's imperfect Calgary-Cambridge demonstrations (no hint), plus a quarter
--   as many hinted ones in which the perfect oracle, who knows the disease, acts: so the teacher
--   has learnt to use the hint, which the student never sees.
--   GRPO as in recipes/clinic.lua (clip 0.2 / 0.3, entropy 0.002, composite reward with the
--   released weights), with the spec's 48-token turn cap.
--
--   moonrl run recipes/clinic_ttopd.lua [--seed 1] [--seeds 3] [--steps 40] [--arms grpo,ttopd]
--        [--sft 1600] [--sft-epochs 3] [--eval 300] [--tasks 16] [--group 8] [--dim 64]
--        [--layers 2] [--lr 1e-4] [--beta 0.05] [--decay 0.99] [--dir runs] [--smoke]
--
-- Prints the measured seconds per step of each arm as soon as it has run, then per seed a table
-- of the held-out figures (greedy and sampled at temperature 1): success (the right diagnosis),
-- turns, exam cost (money + discomfort levels), exams per case, bytes per turn, and the training
-- success over the steps; --seeds K gives each figure's mean ± sample sd over seeds. The README
-- ("Reproductions", "Clinic: TT-OPD") has the measured table and the verdict.
local rl = require "moonrl"

local root = os.getenv("MOONRL_ROOT") or "."
package.path = root .. "/?.lua;" .. package.path
local env = require "envs.clinic"
local envlib = require "moonrl.env"

local o, why = rl.recipe.args(arg, { seed = 1, seeds = 1, steps = 40, arms = "grpo,ttopd", sft = 1600,
  sft_epochs = 3, eval = 300, tasks = 16, group = 8, dim = 64, layers = 2, lr = 1e-4, beta = 0.05,
  decay = 0.99, dir = root .. "/runs", smoke = false })
if not o then error("clinic_ttopd.lua: " .. why, 0) end
if o.smoke then
  o.steps, o.sft, o.sft_epochs, o.eval, o.tasks, o.group, o.dim, o.layers = 2, 120, 1, 6, 2, 4, 32, 1
end

-- The privileged text of a task: the hidden diagnosis and the exams that decide it.
local function privileged(task)
  local d = env.case(task.seed).disease
  local exams = {}
  for i, g in ipairs(env.gt_calls(d)) do exams[i] = g.region and (g.name .. " " .. g.region) or g.name end
  return string.format("hint dx=%s; exams %s", d, table.concat(exams, ", "))
end

local TEACHER = { privileged = privileged, decay = o.decay, coef = o.beta, kl = "k3", truncate = 8 }
local ARMS = {
  grpo = { label = "GRPO" },
  ttopd = { label = "GRPO + TT-OPD", teacher = TEACHER },
}
local arms = {}
for name in o.arms:gmatch("[^,]+") do
  if not ARMS[name] then error("clinic_ttopd.lua: unknown arm '" .. name .. "' (grpo, ttopd)", 0) end
  arms[#arms + 1] = name
end

local tok = rl.tokenizer.bytes()
local MAX_TURN_TOKENS = 48
local function new_model(seed)
  return rl.model.new { vocab = tok:vocab_size(), dim = o.dim, layers = o.layers, heads = 4,
    ffn = 3 * o.dim, ctx = 512, seed = seed }
end
local held_out = env.tasks("test", o.eval)

-- n hinted SFT examples: the perfect oracle's actions replayed through the environment, with the
-- task's privileged text as the system message, as the teacher's context has it.
local function hinted_examples(n, seed)
  local out = {}
  for i, task in ipairs(env.tasks("train", n, seed)) do
    local inst = env.new()
    local msgs = { { role = "system", content = rl.train.teacher.system_text(nil, privileged(task)) },
      { role = "user", content = inst:reset(task, rl.rng(rl.train.mix(seed, i))) } }
    local record = {}
    for _, action in ipairs(env.perfect(task)) do
      msgs[#msgs + 1] = { role = "assistant", content = action }
      local obs, _, done = envlib.step(env, inst, action, record)
      if done or obs == nil then break end
      msgs[#msgs + 1] = { role = "user", content = obs }
    end
    out[i] = rl.sft_example(tok, msgs)
  end
  return out
end

-- The held-out figures of a list of episodes: success, turns, exam cost, exams, bytes per turn.
local function figures(list)
  local f = { success = 0, turns = 0, cost = 0, exams = 0, bytes = 0 }
  for _, e in ipairs(list) do
    local c = e.costs or {}
    f.success = f.success + (e.success and 1 or 0)
    f.turns = f.turns + e.turns
    f.cost = f.cost + (c.money or 0) + (c.discomfort or 0)
    f.exams = f.exams + (c.exams or 0)
    local bytes = 0
    for _, r in ipairs(e.record or {}) do bytes = bytes + #(r.action or "") end
    f.bytes = f.bytes + bytes / math.max(#(e.record or {}), 1)
  end
  for k, v in pairs(f) do f[k] = v / math.max(#list, 1) end
  return f
end

-- The evaluate stage: the policy on the held-out patients, greedy and sampled at temperature 1
-- (t1_ figures).
local function evaluate(ctx)
  local f = {}
  for _, temp in ipairs { 0, 1 } do
    local list, chunk = {}, ctx.cfg.tasks_per_step * ctx.cfg.group_size
    for first = 1, #held_out, chunk do
      local part = table.move(held_out, first, math.min(first + chunk - 1, #held_out), 1, {})
      local b = ctx.stages.rollout(ctx, { tasks = part, repeats = 1, seed = rl.train.mix(4242, first),
        temperature = temp, group_base = 0 })
      for _, ep in ipairs(b.episodes) do list[#list + 1] = ep end
    end
    for k, v in pairs(figures(list)) do f[(temp == 0 and "" or "t1_") .. k] = v end
  end
  f.greedy_success = f.success
  return f
end

-- One seed: the shared SFT checkpoint, then each arm from it. Returns rows {key = figures} and
-- the timings.
local function run_seed(seed)
  local rows, timing = {}, { arms = {} }
  local t0 = rl.clock()
  local model = new_model(seed)
  local data = rl.train.oracle_examples({ cfg = { env = env, max_turns = env.max_turns }, tokenizer = tok },
    o.sft, rl.train.mix(seed, 0xF7))
  for _, ex in ipairs(hinted_examples(o.sft // 4, rl.train.mix(seed, 0x417))) do data[#data + 1] = ex end
  local sft_path = string.format("%s/clinic_ttopd-sft-s%d.bin", o.dir, seed)
  local s = rl.recipe.warm_start { model = model, data = data, epochs = o.sft_epochs, path = sft_path,
    seed = rl.train.mix(seed, 0x5F7) }
  timing.sft, timing.sft_loss, timing.sft_examples = rl.clock() - t0, s.final_loss, #data
  for _, arm in ipairs(arms) do
    local m = new_model(seed)
    assert(m:load_checkpoint(sft_path))
    local ta = rl.clock()
    local result = rl.train {
      model = m, tokenizer = tok, env = env, name = string.format("clinic_ttopd-%s-s%d", arm, seed), dir = o.dir,
      seed = seed, overwrite = true, reward = env.reward {},
      steps = o.steps, tasks_per_step = o.tasks, group_size = o.group, minibatch = 64, epochs = 1,
      max_turn_tokens = MAX_TURN_TOKENS, temperature = 1.0,
      advantage = "grpo", loss = "ppo", clip_low = 0.2, clip_high = 0.3, entropy_coef = 0.002,
      lr = o.lr, schedule = "cosine", min_lr = o.lr / 10,
      teacher = ARMS[arm].teacher,
      evaluate = evaluate, eval = { every = o.steps },
      progress = false,
      on_step = function(step, mt)
        if step == 1 then print(string.format("seed %d, arm %s: step 1 took %.2f s", seed, arm, mt["time/step"])) end
      end,
    }
    local steps, step_s, curve, kl = 0, 0, {}, {}
    for _, h in ipairs(result.history) do
      if h.step > 0 and h["time/step"] then
        steps, step_s = steps + 1, step_s + h["time/step"]
        curve[#curve + 1] = h.success
        kl[#kl + 1] = h["loss/teacher_kl"]
      end
    end
    local function strip(t)
      local f = {}
      for k, v in pairs(t) do if k:match("^eval/") then f[k:sub(6)] = v end end
      return f
    end
    rows.sft = rows.sft or strip(result.before)
    rows[arm] = strip(result.after)
    rows[arm].curve, rows[arm].kl = curve, kl
    timing.arms[arm] = { seconds = rl.clock() - ta, per_step = steps > 0 and step_s / steps or 0 }
    print(string.format("seed %d, arm %s: %d steps, %.2f s/step, %.0f s (with the evaluations)", seed, arm,
      steps, timing.arms[arm].per_step, timing.arms[arm].seconds))
  end
  timing.total = rl.clock() - t0
  return rows, timing
end

local ORDER = { { key = "sft", label = "SFT policy" } }
for _, arm in ipairs(arms) do ORDER[#ORDER + 1] = { key = arm, label = ARMS[arm].label } end
local COLS = { { "success", "success", "%7.1f%%", 100 }, { "turns", "turns", "%5.2f", 1 },
  { "cost", "exam cost", "%9.2f", 1 }, { "exams", "exams/case", "%10.2f", 1 }, { "bytes", "bytes/turn", "%10.2f", 1 } }

local function print_table(title, rows, prefix)
  print("\n" .. title)
  local h = string.format("%-16s", "policy")
  for _, c in ipairs(COLS) do h = h .. " " .. string.format("%" .. #string.format(c[3], 0) .. "s", c[2]) end
  print(h)
  for _, r in ipairs(ORDER) do
    local f, line = rows[r.key], string.format("%-16s", r.label)
    for _, c in ipairs(COLS) do line = line .. " " .. string.format(c[3], c[4] * f[prefix .. c[1]]) end
    print(line)
  end
end

-- Training success (sampled, the step's batch) averaged over windows of the run's steps.
local function windows(curve)
  local n = #curve
  local parts, w = {}, math.max(1, n // 4)
  for a = 1, n, w do
    local s, k = 0, 0
    for i = a, math.min(n, a + w - 1) do s, k = s + curve[i], k + 1 end
    parts[#parts + 1] = string.format("%d-%d %.1f%%", a, math.min(n, a + w - 1), 100 * s / k)
  end
  return table.concat(parts, ", ")
end

print(string.format("clinic_ttopd: TT-OPD miniature; policy d=%d, %d layers (%d parameters); %d held-out patients "
  .. "(noise 0.3, exam noise 0.1); RL %d steps x %d cases x %d episodes, turns <= %d tokens; teacher beta %g, EMA %g, "
  .. "k3 on each turn's first 8 tokens; BLAS %s x%d", o.dim, o.layers, new_model(o.seed):config().params, #held_out,
  o.steps, o.tasks, o.group, MAX_TURN_TOKENS, o.beta, o.decay, rl.blas_info().core, rl.blas_info().threads))

local all = rl.recipe.over_seeds(o.seed, o.seeds, function(seed)
  local rows, timing = run_seed(seed)
  print_table(string.format("seed %d: held-out patients, greedy (exam cost: money + discomfort levels per case)", seed),
    rows, "")
  print_table(string.format("seed %d: held-out patients, sampled at temperature 1", seed), rows, "t1_")
  for _, arm in ipairs(arms) do
    local r = rows[arm]
    local kl = r.kl[1] and string.format("; teacher KL first step %.3f, last %.3f", r.kl[1], r.kl[#r.kl]) or ""
    print(string.format("training success, %s: %s%s", ARMS[arm].label, windows(r.curve), kl))
  end
  local parts = {}
  for _, arm in ipairs(arms) do
    local a = timing.arms[arm]
    parts[#parts + 1] = string.format("%s %.0f s (%.2f s/step)", arm, a.seconds, a.per_step)
  end
  print(string.format("seconds: SFT %.0f (%d examples, final loss %.3f); %s; seed total %.0f",
    timing.sft, timing.sft_examples, timing.sft_loss, table.concat(parts, "; "), timing.total))
  return rows
end)

if #all > 1 then
  for _, prefix in ipairs { "", "t1_" } do
    print(string.format("\nover %d seeds (%d..%d), %s: mean ± sample sd", #all, o.seed, o.seed + #all - 1,
      prefix == "" and "greedy" or "sampled at temperature 1"))
    local headers = {}
    for k, c in ipairs(COLS) do headers[k] = c[2] end
    for _, line in ipairs(rl.recipe.spread_table { runs = all, rows = ORDER, headers = headers,
      value = function(rows, r, k) return COLS[k][4] * rows[r.key][prefix .. COLS[k][1]] end,
      fmt = function(k) return COLS[k][4] == 100 and "%.1f" or "%.2f" end }) do
      print(line)
    end
  end
end
