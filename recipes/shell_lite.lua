-- shell_lite.lua - PrivEsc-LLM in miniature (shared/spec/reproductions.md §3.1): a byte-level
-- policy learns Linux privilege escalation on simulated hosts (envs/shell_lite.lua; every
-- command runs in the restricted Lua sandbox through rl.shell). Two-stage post-training as in
-- the paper: SFT on the imperfect demonstrator's traces from the seven training generators,
-- then GRPO with a verifiable reward.
--
--   rows (same seed, same SFT data stream):
--     base           SFT on 25% of the demonstrations (the paper's weaker starting point)
--     sft            SFT on all of them
--     grpo_outcome   sft + GRPO, R = 1 at uid 0 (minus the interface penalty)
--     grpo_cost      sft + GRPO, R = outcome * (1 + lambda (1 - turns / h_max)), lambda = 0.1
--                    (outcome_cost with turns as the cost unit; minus the interface penalty)
--   scripted rows: the demonstrator, and the perfect oracle (the exploit alone: the ceiling).
--   columns: greedy success within the h_max = 10 round budget on the holdout variants and on
--   the 12 static scenarios, mean turns to root (over successes) on both.
--
--   moonrl run recipes/shell_lite.lua [--seed 1] [--seeds 3] [--steps 80] [--sft 1600]
--        [--sft-epochs 4] [--eval 70] [--tasks 8] [--group 8] [--dim 64] [--layers 2]
--        [--lr 2e-4] [--arms grpo_outcome,grpo_cost] [--dir runs] [--smoke]
--
-- --seeds K runs seeds seed..seed+K-1 and reports mean ± sample sd; --smoke is a tiny run that
-- only shows the recipe works. Files go to <dir>/shell_lite-<arm>-s<seed>/. The README
-- ("Reproductions", "Shell-lite") has the measured table and the verdict.
local rl = require "moonrl"

local root = os.getenv("MOONRL_ROOT") or "."
package.path = root .. "/?.lua;" .. package.path
local env = require "envs.shell_lite"

local o, why = rl.recipe.args(arg, { seed = 1, seeds = 1, steps = 80, sft = 1600, sft_epochs = 4, eval = 70,
  tasks = 8, group = 8, dim = 64, layers = 2, lr = 2e-4, arms = "grpo_outcome,grpo_cost", dir = root .. "/runs",
  smoke = false })
if not o then error("shell_lite.lua: " .. why, 0) end
if o.smoke then
  o.steps, o.sft, o.sft_epochs, o.eval, o.tasks, o.group, o.dim, o.layers = 1, 40, 1, 7, 2, 2, 32, 1
end
local ARMS = {
  grpo_outcome = { label = "SFT + GRPO outcome" },
  grpo_cost = { label = "SFT + GRPO outcome_cost", rewards = { cost = env.cost_term } },
}
local arms = {}
for name in o.arms:gmatch("[^,]+") do
  if not ARMS[name] then error("shell_lite.lua: unknown arm '" .. name .. "' (grpo_outcome, grpo_cost)", 0) end
  arms[#arms + 1] = name
end

local CTX, TURN_TOKENS = 640, 40
local tok = rl.tokenizer.bytes()
local function new_model(seed)
  return rl.model.new { vocab = tok:vocab_size(), dim = o.dim, layers = o.layers, heads = 4, ffn = 3 * o.dim,
    ctx = CTX, seed = seed }
end
local SETS = { holdout = env.tasks("test", o.eval), static = env.tasks("static", 12) }

-- success and mean turns to root of a list of {success =, turns =}
local function figures(list)
  local ok, turns = 0, 0
  for _, e in ipairs(list) do
    if e.success then ok, turns = ok + 1, turns + e.turns end
  end
  return ok / #list, ok > 0 and turns / ok or 0
end

-- The evaluate stage: greedy on the holdout variants and on the static scenarios.
local function evaluate(ctx)
  local f = {}
  for name, tasks in pairs(SETS) do
    local b = ctx.stages.rollout(ctx, { tasks = tasks, repeats = 1, seed = 4242, temperature = 0, group_base = 0 })
    local list = {}
    for i, ep in ipairs(b.episodes) do list[i] = { success = ep.success, turns = ep.turns } end
    f[name .. "_success"], f[name .. "_turns"] = figures(list)
  end
  f.greedy_success = f.holdout_success
  return f
end

local function scripted(policy)
  local f = {}
  for name, tasks in pairs(SETS) do
    local list = {}
    for i, t in ipairs(tasks) do list[i] = env.play(t, policy(t, rl.rng(rl.train.mix(77, i)))) end
    f[name .. "_success"], f[name .. "_turns"] = figures(list)
  end
  return f
end
local scripted_rows = { oracle = scripted(env.oracle), perfect = scripted(env.perfect) }

-- SFT of a fresh model on the first n of the seed's demonstrations; the checkpoint's path.
local function warm_start(seed, data, n, tag)
  local model = new_model(seed)
  local part = table.move(data, 1, n, 1, {})
  local path = string.format("%s/shell_lite-%s-s%d.bin", o.dir, tag, seed)
  local s = rl.recipe.warm_start { model = model, data = part, epochs = o.sft_epochs, path = path,
    seed = rl.train.mix(seed, 0x5F7) }
  return path, s.final_loss
end

local function strip(t)
  local f = {}
  for k, v in pairs(t) do if k:match("^eval/") then f[k:sub(6)] = v end end
  return f
end

local function run_seed(seed)
  local rows, timing = {}, { arms = {} }
  local t0 = rl.clock()
  local data = rl.train.oracle_examples({ cfg = { env = env, max_turns = env.max_turns }, tokenizer = tok },
    o.sft, rl.train.mix(seed, 0xF7))
  local paths = {}
  paths.base, timing.base_loss = warm_start(seed, data, math.max(1, o.sft // 4), "base")
  paths.sft, timing.sft_loss = warm_start(seed, data, #data, "sft")
  timing.sft = rl.clock() - t0
  local function train(arm, path, steps)
    local m = new_model(seed)
    assert(m:load_checkpoint(path))
    local ta = rl.clock()
    local result = rl.train {
      model = m, tokenizer = tok, env = env, name = string.format("shell_lite-%s-s%d", arm, seed), dir = o.dir,
      seed = seed, overwrite = true, rewards = ARMS[arm] and ARMS[arm].rewards or nil,
      steps = steps, tasks_per_step = o.tasks, group_size = o.group, minibatch = o.tasks * o.group, epochs = 1,
      max_turn_tokens = TURN_TOKENS, temperature = 1.0,
      advantage = "grpo", loss = "ppo", clip_low = 0.2, clip_high = 0.28, entropy_coef = 0.001,
      lr = o.lr, schedule = "cosine", min_lr = o.lr / 10,
      evaluate = evaluate, eval = { every = math.max(steps, 1) },
      progress = false,
      on_step = function(step, metrics)
        if step == 1 and ARMS[arm] then
          print(string.format("%s: %.2f s per RL step (%d tasks x %d episodes)", arm, metrics["time/step"] or 0,
            o.tasks, o.group))
        end
      end,
    }
    local n, sum = 0, 0
    for _, h in ipairs(result.history) do
      if h.step > 0 and h["time/step"] then n, sum = n + 1, sum + h["time/step"] end
    end
    timing.arms[arm] = { seconds = rl.clock() - ta, per_step = n > 0 and sum / n or 0 }
    return result
  end
  -- the base row is the policy before RL: one (unused) RL step gives rl.train's evaluation of it
  rows.base = strip(train("base", paths.base, 1).before)
  local sft_result
  for _, arm in ipairs(arms) do
    local r = train(arm, paths.sft, o.steps)
    sft_result = sft_result or r
    rows[arm] = strip(r.after)
  end
  rows.sft = sft_result and strip(sft_result.before) or strip(train("sft", paths.sft, 1).before)
  timing.total = rl.clock() - t0
  timing.examples = #data
  return rows, timing
end

local ORDER = { { key = "base", label = "SFT 25% (base)" }, { key = "sft", label = "SFT all" } }
for _, arm in ipairs(arms) do ORDER[#ORDER + 1] = { key = arm, label = ARMS[arm].label } end
ORDER[#ORDER + 1] = { key = "oracle", label = "demonstrator (scripted)" }
ORDER[#ORDER + 1] = { key = "perfect", label = "perfect oracle (ceiling)" }
local COLS = { { "holdout_success", "holdout", 100, "%.1f%%" }, { "holdout_turns", "turns", 1, "%.2f" },
  { "static_success", "static 12", 100, "%.1f%%" }, { "static_turns", "turns", 1, "%.2f" } }

local function row_of(rows, key) return rows[key] or scripted_rows[key] end

print(string.format("shell_lite: PrivEsc-LLM miniature; policy d=%d, %d layers (%d parameters), ctx %d; "
  .. "h_max %d rounds, outputs cut at %d bytes; %d holdout tasks (7 families) + 12 static; SFT %d demos "
  .. "(base: %d); RL %d steps x %d tasks x %d episodes; BLAS %s x%d", o.dim, o.layers,
  new_model(o.seed):config().params, CTX, env.max_turns, env.WIDTH, #SETS.holdout, o.sft, o.sft // 4, o.steps,
  o.tasks, o.group, rl.blas_info().core, rl.blas_info().threads))

local all = rl.recipe.over_seeds(o.seed, o.seeds, function(seed)
  local rows, timing = run_seed(seed)
  print(string.format("\nseed %d: greedy success within %d rounds, mean turns to root (successes)", seed,
    env.max_turns))
  local h = string.format("%-26s", "policy")
  for _, c in ipairs(COLS) do h = h .. string.format(" %10s", c[2]) end
  print(h)
  for _, r in ipairs(ORDER) do
    local f = row_of(rows, r.key)
    local line = string.format("%-26s", r.label)
    for _, c in ipairs(COLS) do line = line .. string.format(" %10s", string.format(c[4], c[3] * f[c[1]])) end
    print(line)
  end
  local parts = {}
  for _, arm in ipairs(arms) do
    local a = timing.arms[arm]
    parts[#parts + 1] = string.format("%s %.0f s (%.2f s/step)", arm, a.seconds, a.per_step)
  end
  print(string.format("seconds: SFT %.0f (%d examples; final loss base %.3f, all %.3f); %s; seed total %.0f",
    timing.sft, timing.examples, timing.base_loss, timing.sft_loss, table.concat(parts, "; "), timing.total))
  return rows
end)

if #all > 1 then
  print(string.format("\nover %d seeds (%d..%d): mean ± sample sd", #all, o.seed, o.seed + #all - 1))
  local headers = {}
  for k, c in ipairs(COLS) do headers[k] = c[2] end
  for _, line in ipairs(rl.recipe.spread_table { runs = all, rows = ORDER, headers = headers, label_width = 26,
    cell_width = 14, value = function(rows, r, k) return COLS[k][3] * row_of(rows, r.key)[COLS[k][1]] end,
    fmt = function(k) return COLS[k][3] == 100 and "%.1f" or "%.2f" end }) do
    print(line)
  end
end
