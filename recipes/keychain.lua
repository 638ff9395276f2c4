-- keychain.lua - BEACON vs GiGPO vs GRPO on envs/keychain.lua at K = 2, 4, 6 rooms, and a
-- horizon curriculum beside full-horizon training (spec reproductions.md, section 2.2; the
-- BEACON and horizon-length papers). One SFT warm start on the environment's imperfect oracle
-- (it knows the keys of two door colours of six) is shared by every arm: each arm loads the same checkpoint and
-- trains with the same seed, the same tasks per step and the same number of steps at its K:
--   beacon     advantage "beacon": each opened door a milestone, segment rewards shaped by
--              gamma_ms 0.9 and scaled x10, segment advantage weight w = 10 (the ALFWorld script);
--   gigpo      advantage "gigpo", state_key = room and key in hand, gamma 0.95;
--   grpo       advantage "grpo" on the episode's reward (1 on leaving room K, -0.1 an invalid
--              action);
--   curriculum GRPO at K = 6 with max_turns grown from 5 to 20 by a band curriculum (low 0.2,
--              high 0.6: with 0.8 the band sat at the first level for 24 of 30 steps) over the
--              horizon, each horizon's tasks having (max_turns - 2) / 3 rooms (K = 1 .. 6),
--              beside the grpo arm at K = 6 (full horizon from the start);
--   macro, decompose (only with --horizon-arms): GRPO at K = 6 on the variants of the same name
--              (macro from the shared warm start too, which never saw try <c>).
-- Every arm: PPO (clip 0.2 / 0.28), lr 1e-3, 8 tasks x 8 episodes a step. Measured greedily on
-- held-out layouts (64 per K) at the arm's K, the K = 6 arms also at K = 12 (never trained on:
-- horizon generalisation). The table gives held-out success, the mean effective sample
-- utilisation (adv/utilisation: episodes with a non-zero advantage) and the measured seconds
-- per RL step of each arm.
--
--   moonrl run recipes/keychain.lua [--seed 1] [--seeds 3] [--rooms 2,4,6] [--methods beacon,gigpo,grpo]
--     [--horizon-arms curriculum] [--steps N] [--tasks 8] [--group 8] [--sft-examples 3000]
--     [--sft-epochs 2] [--eval-tasks 64] [--eval12 true] [--dir runs]
--
-- --seeds n runs the whole recipe for seeds seed .. seed + n - 1 (each with its own SFT), prints
-- each seed's table and then the mean ± spread (sample standard deviation) over them. Files go to
-- <dir>/keychain-<arm>-k<K>-s<seed>/ and the warm start to <dir>/keychain-sft-s<seed>.bin.
local rl = require "moonrl"

local root = os.getenv("MOONRL_ROOT") or "."
package.path = root .. "/?.lua;" .. package.path
local keychain = require "envs.keychain"
local C, R = rl.curriculum, rl.recipe

local o, why = R.args(arg, { seed = 1, seeds = 1, rooms = "2,4,6", methods = "beacon,gigpo,grpo",
  horizon_arms = "curriculum", steps = 0, tasks = 8, group = 8, sft_examples = 3000, sft_epochs = 2,
  eval_tasks = 64, eval12 = true, dir = root .. "/runs" })
if not o then error("keychain.lua: " .. why, 0) end

local function list(text, what, known)
  local out = {}
  for name in text:gmatch("[^,]+") do
    if known and not known[name] then error(string.format("keychain.lua: unknown %s '%s'", what, name), 0) end
    out[#out + 1] = known and name or math.tointeger(tonumber(name))
    if not out[#out] then error(string.format("keychain.lua: %s: integers expected, got '%s'", what, name), 0) end
  end
  return out
end
local ROOMS = list(o.rooms, "rooms")
local METHODS = list(o.methods, "method", { beacon = true, gigpo = true, grpo = true })
local HORIZON = list(o.horizon_arms, "horizon arm", { curriculum = true, macro = true, decompose = true, none = true })
if HORIZON[1] == "none" then HORIZON = {} end
-- RL steps per arm at each K (the 10-minute budget: about 2 minutes of RL per K on 2 idle cores)
local STEPS = { [2] = 60, [4] = 40, [6] = 30 }
local function steps_at(k) return o.steps > 0 and o.steps or STEPS[k] or 30 end
local HORIZON_K, GEN_K = 6, 12

local ADVANTAGE = {
  beacon = { advantage = "beacon", milestone = { gamma = 0.9, scale = 10, weight = 10 } },
  gigpo = { advantage = "gigpo", gamma = 0.95 },
  grpo = { advantage = "grpo" },
}

-- Held-out success at K rooms: eval_tasks held-out layouts (the same for every arm), greedy.
local function held_out(ctx, env, k)
  local rng, tasks = rl.rng(rl.train.mix(12345, k)), {}
  for i = 1, o.eval_tasks do tasks[i] = env.gen({ rooms = k, split = "test" }, rng) end
  local b = ctx.stages.rollout(ctx, { tasks = tasks, repeats = 1, seed = 5, temperature = 0, group_base = 0 })
  local s = 0
  for _, ep in ipairs(b.episodes) do s = s + (ep.success and 1 or 0) end
  return s / #tasks
end

-- The oracles' success on the same held-out layouts (no policy: the demonstrations replayed).
local function oracle_success(k, demo)
  local rng, wins = rl.rng(rl.train.mix(12345, k)), 0
  for i = 1, o.eval_tasks do
    local task = keychain.gen({ rooms = k, split = "test" }, rng)
    local inst, record = keychain.new(), {}
    inst:reset(task)
    for _, a in ipairs(demo(task, rl.rng(rl.train.mix(777, i)))) do
      local _, _, done = rl.env.step(keychain, inst, a, record)
      if done then break end
    end
    wins = wins + ((record[#record].info or {}).success and 1 or 0)
  end
  return wins / o.eval_tasks
end

local function new_model(seed)
  local tok = rl.tokenizer.bytes()
  return rl.model.new { vocab = tok:vocab_size(), dim = 64, layers = 2, heads = 4, ffn = 192,
    ctx = 1024, seed = seed }, tok
end

-- The shared warm start: SFT on the oracle's demonstrations of training tasks (K = 2, 4, 6 in
-- turn), saved once; every arm loads it.
local function warm_start(seed)
  local m, tok = new_model(seed)
  local t0 = rl.clock()
  local ctx = { cfg = { env = keychain, max_turns = keychain.max_turns }, tokenizer = tok }
  local data = rl.train.oracle_examples(ctx, o.sft_examples, rl.train.mix(seed, 0xF7))
  local path = string.format("%s/keychain-sft-s%d.bin", o.dir, seed)
  local r = rl.recipe.warm_start { model = m, data = data, epochs = o.sft_epochs, path = path,
    seed = rl.train.mix(seed, 0x5F7) }
  return path, { seconds = rl.clock() - t0, loss = r.final_loss, examples = #data }
end

-- One arm: the warm start loaded, rl.train for `steps` steps, held-out success at the `eval`
-- rooms; the mean utilisation over the steps and the seconds per step (evaluation left out).
local function run_arm(seed, sft_path, a)
  local m, tok = new_model(seed)
  m:load_checkpoint(sft_path)
  m:reset_optimizer()
  local util, n, secs = 0, 0, 0
  local opts = {
    model = m, tokenizer = tok, env = a.env, name = string.format("keychain-%s-k%d-s%d", a.arm, a.k, seed),
    dir = o.dir, seed = seed, overwrite = true, steps = a.steps, tasks_per_step = o.tasks,
    group_size = o.group, minibatch = o.tasks * o.group, max_turn_tokens = 8, loss = "ppo", clip_low = 0.2,
    clip_high = 0.28, lr = 1e-3,
    eval = { every = a.steps, tasks = o.eval_tasks, k = 1 }, progress = false, log_episodes = 2,
    evaluate = function(ctx, step)
      local out = {}
      if step == 0 and a.sft_eval then
        for _, k in ipairs(a.sft_eval) do out["k" .. k] = held_out(ctx, a.eval_env, k) end
      elseif step > 0 then
        for _, k in ipairs(a.eval) do out["k" .. k] = held_out(ctx, a.eval_env, k) end
      end
      return out
    end,
    on_step = function(_, mt)
      util, n = util + (mt["adv/utilisation"] or 0), n + 1
      secs = secs + mt["time/step"] - (mt["time/eval"] or 0)
    end,
  }
  for k, v in pairs(ADVANTAGE[a.method]) do opts[k] = v end
  if a.curriculum then
    opts.curriculum = a.curriculum(seed)
  else
    opts.tasks = function(_, _, count, s)
      local rng, out = rl.rng(s), {}
      for i = 1, count do out[i] = a.env.gen({ rooms = a.k }, rng) end
      return out
    end
  end
  local result = rl.train(opts)
  local row = { util = util / n, sps = secs / n, before = result.before }
  local held = {}
  for _, k in ipairs(a.eval) do
    row[k] = result.after["eval/k" .. k]
    held[#held + 1] = string.format("K=%d %.1f%%", k, 100 * row[k])
  end
  print(string.format("  %-10s K=%-2d %3d steps  %.2f s/step  held-out %s  utilisation %.0f%%",
    a.arm, a.k, a.steps, row.sps, table.concat(held, ", "), 100 * row.util))
  io.stdout:flush()
  return row
end

local macro_env = keychain.variant { macro = true }
local decompose_env = keychain.variant { decompose = true }

-- The horizon curriculum: tasks of (max_turns - 2) / 3 rooms, max_turns 5 .. 20 by a band.
local function horizon_curriculum(seed)
  return C.new { seed = seed, sampler = C.band { low = 0.2, high = 0.6, min_samples = 32, cooldown = 2 },
    source = C.procedural { gen = function(p, rng) return keychain.gen({ rooms = (p.max_turns - 2) // 3 }, rng) end,
      params = { max_turns = C.horizon { start = 5, stop = keychain.budget(HORIZON_K), step = 3 } } } }
end

-- The whole recipe for one seed: its table rows.
local function one_seed(seed)
  local t0 = rl.clock()
  print(string.format("seed %d: SFT warm start ...", seed))
  local sft_path, sft = warm_start(seed)
  print(string.format("  SFT: %d examples x %d epochs, final loss %.3f, %.0f s", sft.examples, o.sft_epochs,
    sft.loss, sft.seconds))
  local rows = { method = {}, horizon = {} }
  local sft_row, oracle_row, perfect_row = { arm = "SFT" }, { arm = "oracle" }, { arm = "perfect" }
  local gen_rooms = {}
  for _, k in ipairs(ROOMS) do gen_rooms[#gen_rooms + 1] = k end
  if o.eval12 then gen_rooms[#gen_rooms + 1] = GEN_K end
  for _, k in ipairs(gen_rooms) do
    oracle_row["k" .. k] = oracle_success(k, keychain.oracle)
    perfect_row["k" .. k] = oracle_success(k, keychain.solve)
  end
  local first = true
  local by = {}
  for _, method in ipairs(METHODS) do by[method] = { arm = method } end
  for _, k in ipairs(ROOMS) do
    for _, method in ipairs(METHODS) do
      local eval = { k }
      if k == HORIZON_K and o.eval12 then eval[2] = GEN_K end
      local row = run_arm(seed, sft_path, { arm = method, method = method, k = k, steps = steps_at(k),
        env = keychain, eval_env = keychain, eval = eval, sft_eval = first and gen_rooms or nil })
      if first then
        for _, kk in ipairs(gen_rooms) do sft_row["k" .. kk] = row.before["eval/k" .. kk] end
        first = false
      end
      local r = by[method]
      r["k" .. k], r["u" .. k], r["s" .. k] = row[k], row.util, row.sps
      if k == HORIZON_K then
        r["k" .. GEN_K] = row[GEN_K]
        if method == "grpo" then rows.horizon[#rows.horizon + 1] = { arm = "full", k6 = row[k], k12 = row[GEN_K],
          util = row.util, sps = row.sps } end
      end
    end
  end
  for _, method in ipairs(METHODS) do rows.method[#rows.method + 1] = by[method] end
  rows.method[#rows.method + 1] = sft_row
  rows.method[#rows.method + 1] = oracle_row
  rows.method[#rows.method + 1] = perfect_row
  if by.beacon and by.grpo then
    local gap = { arm = "beacon-grpo" }
    for _, k in ipairs(ROOMS) do
      gap["k" .. k] = by.beacon["k" .. k] - by.grpo["k" .. k]
      gap["u" .. k] = by.beacon["u" .. k] - by.grpo["u" .. k]
    end
    rows.method[#rows.method + 1] = gap
  end
  local horizon_eval = { HORIZON_K }
  if o.eval12 then horizon_eval[2] = GEN_K end
  for _, arm in ipairs(HORIZON) do
    local a = { arm = arm, method = "grpo", k = HORIZON_K, steps = steps_at(HORIZON_K), env = keychain,
      eval_env = keychain, eval = horizon_eval }
    if arm == "curriculum" then
      a.curriculum = horizon_curriculum
    elseif arm == "macro" then
      a.env, a.eval_env = macro_env, macro_env
    else
      a.env = decompose_env
    end
    local row = run_arm(seed, sft_path, a)
    rows.horizon[#rows.horizon + 1] = { arm = arm, k6 = row[HORIZON_K], k12 = row[GEN_K], util = row.util,
      sps = row.sps }
  end
  rows.seconds = rl.clock() - t0
  print(string.format("seed %d: %.0f s", seed, rows.seconds))
  return rows
end

-- The tables of a list of runs (one per seed): one seed's values, or mean ± spread over several.
local function print_tables(list, title)
  local methods, horizon = {}, {}
  for i, r in ipairs(list) do methods[i], horizon[i] = r.method, r.horizon end
  local w = #list > 1 and 13 or 7
  local function cell(v) return string.format("%" .. w .. "s", R.pm(v)) end
  local function mean(v) return type(v) == "table" and v.mean or v end
  print(string.format("\nkeychain, %s; %d tasks x %d episodes a step; held-out layouts, %d per K, greedy (%%)",
    title, o.tasks, o.group, o.eval_tasks))
  local head = { string.format("%-12s", "method") }
  for _, k in ipairs(ROOMS) do head[#head + 1] = string.format("%" .. w .. "s", "K=" .. k) end
  if o.eval12 then head[#head + 1] = string.format("%" .. w .. "s", "K=12") end
  for _, k in ipairs(ROOMS) do head[#head + 1] = string.format("%" .. w .. "s", "util" .. k) end
  for _, k in ipairs(ROOMS) do head[#head + 1] = string.format("%7s", "s/st" .. k) end
  print(table.concat(head, " "))
  for _, r in ipairs(R.summarise(methods, "arm")) do
    local line = { string.format("%-12s", r.arm) }
    for _, k in ipairs(ROOMS) do line[#line + 1] = cell(r["k" .. k]) end
    if o.eval12 then line[#line + 1] = cell(r["k" .. GEN_K]) end
    for _, k in ipairs(ROOMS) do line[#line + 1] = cell(r["u" .. k]) end
    for _, k in ipairs(ROOMS) do
      local v = mean(r["s" .. k])
      line[#line + 1] = string.format("%7s", v and string.format("%.2f", v) or "-")
    end
    print(table.concat(line, " "))
  end
  if #horizon[1] > 0 then
    print(string.format("\nhorizon: GRPO at K = %d, full horizon vs reduced; held-out K = %d%s (%%)", HORIZON_K,
      HORIZON_K, o.eval12 and " and K = 12" or ""))
    print(string.format("%-12s %" .. w .. "s %" .. w .. "s %" .. w .. "s %7s", "arm", "K=" .. HORIZON_K, "K=12",
      "util", "s/step"))
    for _, r in ipairs(R.summarise(horizon, "arm")) do
      print(string.format("%-12s %s %s %s %7.2f", r.arm, cell(r.k6), cell(r.k12), cell(r.util), mean(r.sps)))
    end
  end
end

local t_all = rl.clock()
R.report(o.seed, o.seeds, one_seed, print_tables)
print(string.format("(util: mean adv/utilisation over the steps; s/st: measured seconds per RL step, eval excluded; "
  .. "%.0f s in all)", rl.clock() - t_all))
