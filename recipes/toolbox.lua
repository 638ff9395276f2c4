-- toolbox.lua - failure-targeted task synthesis (TRACE, CoEvolve, Agent-World; plan §2.3) on the
-- tagged tool tasks of envs/toolbox.lua, against uniform GRPO, at the same rollout budget.
--
--   moonrl run recipes/toolbox.lua [--seed 1] [--seeds 3] [--arms a,b,c,d] [--steps 60] [--smoke]
--     [--dir runs]
--
-- One SFT warm start per seed, on an oracle whose demos under-represent recover and chain3 (4%
-- each), then four arms from that checkpoint, each with the run's seed:
--   (a) GRPO on the target distribution sampled uniformly (split "train");
--   (b) GRPO on untargeted random synthetic tasks (gen with two random focus tags at a random
--       level, split "random"), each verified by the scripted solver;
--   (c) the targeted loop: rl.synth.loop with an rl.synth.generator every ROUND steps: probe
--       the policy greedily on PROBE target-like tasks, diagnose (rl.synth.target: per-tag pass
--       rates, the turn-type contrast), synthesise CANDIDATES tasks for the two weakest tags at
--       a level the loop's calibration moves (rl.synth.pass_rate, k = 4, band [.2, .8]), admit
--       the solver-verified ones in the band into the curriculum pool, train on the pool;
--   (d) the targeted loop at a quarter of the rollouts.
-- Rollouts are every episode the arm rolled out, training, probes and calibration alike
-- (evaluation excluded): (a) and (b) spend BUDGET on training; (c) gets fewer training steps so
-- that its training, probes and calibration together stay within BUDGET. Held-out success is
-- greedy on the fixed suite of 400 tasks (envs/toolbox.lua M.suite), overall and per tag. s/step
-- is an arm's wall-clock seconds per training step, its two evaluations, probes and calibration
-- included.
-- --seeds n runs seeds seed .. seed + n - 1 and adds the mean ± spread (sample sd) table.
--
-- Sizes (plan §2.3, changed where the budget or the policy needed it; README, "Reproductions"):
-- d = 96, 3 layers, ctx 256 (the plan's d = 64, 2 layers copied the digits of a call so badly
-- after SFT, 8.8% held-out success, that there was nothing to diagnose); SFT 4000 demos x 3
-- epochs; 60 steps of 8 tasks x 8 episodes per baseline arm; rounds of 10 steps; probes of 64
-- tasks (the plan's 128 would take a sixth of the budget); 24 candidates per round, k = 4.
-- Seed 1: 6 min 45 s on the 2 shared cores (the job got half of them). --smoke: tiny sizes
-- for make test (a few seconds).
local rl = require "moonrl"

local root = os.getenv("MOONRL_ROOT") or "."
package.path = root .. "/?.lua;" .. package.path
local tb = require "envs.toolbox"

-- Arguments (rl.recipe.args): --seed n (a bare integer first is the seed too, as before),
-- --seeds n, --arms list, --steps n (0: the size's default), --smoke, --dir path.
local argv = {}
for i, a in ipairs(arg or {}) do argv[i] = a end
if math.tointeger(tonumber(argv[1] or "")) then argv[1] = "--seed=" .. argv[1] end
local args, why = rl.recipe.args(argv, { seed = 1, seeds = 1, arms = "a,b,c,d", steps = 0,
  smoke = false, dir = root .. "/runs" })
if not args then error("toolbox.lua: " .. why, 0) end
if args.seeds < 1 or args.steps < 0 then error("toolbox.lua: --seeds >= 1 and --steps >= 0 expected", 0) end
if args.steps == 0 then args.steps = nil end

-- Sizes: the full run, and the smoke run of make test.
local S = args.smoke and {
  sft = 200, sft_epochs = 1, steps = 4, tasks = 4, group = 4, round = 2, probe = 8, candidates = 4, k = 2,
  suite = 48, dim = 32, layers = 1,
} or {
  sft = 4000, sft_epochs = 3, steps = 60, tasks = 8, group = 8, round = 10, probe = 64, candidates = 24, k = 4,
  suite = 400, dim = 96, layers = 3,
}
S.steps = args.steps or S.steps
-- Knobs for experiments: TOOLBOX_SFT (demos), TOOLBOX_SFT_EPOCHS, TOOLBOX_DIM, TOOLBOX_LAYERS,
-- TOOLBOX_LR (RL learning rate), TOOLBOX_SFT_LR, TOOLBOX_ENT (entropy bonus), TOOLBOX_EPOCHS (PPO
-- passes per batch), TOOLBOX_CACHE (a folder: reuse the warm start of the same sizes).
local function knob(name, v) return tonumber(os.getenv("TOOLBOX_" .. name) or "") or v end
S.sft, S.sft_epochs = math.tointeger(knob("SFT", S.sft)), math.tointeger(knob("SFT_EPOCHS", S.sft_epochs))
S.dim, S.layers = math.tointeger(knob("DIM", S.dim)), math.tointeger(knob("LAYERS", S.layers))
S.lr, S.sft_lr = knob("LR", 2e-4), knob("SFT_LR", 3e-3)
S.entropy, S.epochs = knob("ENT", 0), math.tointeger(knob("EPOCHS", 1))
local PER_STEP = S.tasks * S.group
local BUDGET = S.steps * PER_STEP
-- A round's rollouts besides training, at most: the probe and every candidate's calibration.
local OVERHEAD = S.probe + S.candidates * S.k

-- The training steps of a targeted arm within budget: steps * PER_STEP + rounds * OVERHEAD.
local function targeted_steps(budget)
  local s = budget // PER_STEP
  while s > 1 and s * PER_STEP + ((s + S.round - 1) // S.round) * OVERHEAD > budget do s = s - 1 end
  return s
end

local tok = rl.tokenizer.bytes()
local SUITE = tb.suite(S.suite)

-- Held-out success, greedy, overall and per tag (eval/<tag>).
local function evaluate(ctx)
  ctx.evaluating = true
  local b = ctx.stages.rollout(ctx, { tasks = SUITE, repeats = 1, seed = 7, temperature = 0, group_base = 0 })
  ctx.evaluating = false
  local n, s = {}, {}
  local all = 0
  for _, ep in ipairs(b.episodes) do
    local task = SUITE[ep.group]
    all = all + (ep.success and 1 or 0)
    for _, tag in ipairs(task.tags) do
      n[tag], s[tag] = (n[tag] or 0) + 1, (s[tag] or 0) + (ep.success and 1 or 0)
    end
  end
  local out = { greedy_success = all / #SUITE }
  for _, tag in ipairs(tb.tags) do out[tag] = n[tag] and s[tag] / n[tag] or 0 end
  return out
end

local function warm_start(seed)
  local cache = os.getenv("TOOLBOX_CACHE") -- experiments: reuse a warm start of the same sizes
  local cached = cache and string.format("%s/warm-s%d-%d-%d-%d-%d-%g", cache, seed, S.sft, S.sft_epochs, S.dim,
    S.layers, S.sft_lr)
  if cached then
    local m = rl.model.load(cached)
    if m then
      local f = assert(io.open(cached .. "/info.json"))
      local info = rl.json.decode(f:read("a"))
      f:close()
      return m, info
    end
  end
  local m = rl.model.new { vocab = tok:vocab_size(), dim = S.dim, layers = S.layers, heads = 4, ffn = 3 * S.dim,
    ctx = 256, seed = seed }
  local t0 = rl.clock()
  local sft_env = setmetatable({ tasks = function(_, n, s) return tb.tasks("sft", n, s) end }, { __index = tb })
  local ctx = { cfg = { env = sft_env, max_turns = tb.max_turns }, tokenizer = tok }
  local data = rl.train.oracle_examples(ctx, S.sft, rl.train.mix(seed, 1))
  local r = rl.sft { model = m, data = data, epochs = S.sft_epochs, batch_size = 16, lr = S.sft_lr, warmup = 10,
    schedule = "cosine", seed = rl.train.mix(seed, 3) }
  local shares = { recover = 0, chain3 = 0 }
  for _, t in ipairs(tb.tasks("sft", S.sft, rl.train.mix(seed, 1))) do
    for _, tag in ipairs(t.tags) do if shares[tag] then shares[tag] = shares[tag] + 1 / S.sft end end
  end
  local info = { examples = #data, loss = r.final_loss, seconds = rl.clock() - t0, shares = shares }
  if cached then
    rl.fs.mkdir(cache)
    assert(m:save(cached))
    local f = assert(io.open(cached .. "/info.json", "w"))
    f:write(rl.json.encode(info))
    f:close()
  end
  return m, info
end

-- The targeted loop of arms (c) and (d).
local function targeted_loop(seed)
  local diag = rl.synth.target { by = { "state" }, decay = 0 }
  local gen = rl.synth.generator { gen = tb.gen, diagnose = diag, probe_tasks = S.probe,
    probe = function(n, s) return tb.tasks("train", n, s) end, weakest = 2, levels = tb.levels, level = 1,
    min_episodes = 2 }
  local cur = rl.curriculum.new { source = rl.curriculum.pool { tasks = tb.tasks("train", 256, rl.train.mix(seed, 5)),
    key = tb.key }, sampler = rl.curriculum.learnability {}, seed = seed }
  local loop = rl.synth.loop { propose = gen, verify = { tb.verify },
    calibrate = rl.synth.pass_rate { k = S.k, band = { 0.2, 0.8 } },
    novelty = rl.synth.novelty { key = tb.key, numbers = "keep", threshold = 0.99 },
    pool = cur, per_step = S.candidates, every = S.round, seed = seed, probe = 0,
    retire = { above = 0.9, window = 16 } }
  return loop, gen, cur
end

-- One arm from the warm start: its held-out figures, rollouts, steps and time.
local function run_arm(arm, warm, seed)
  local m = warm:clone()
  local o = {
    model = m, tokenizer = tok, env = tb, name = string.format("toolbox-%s-s%d", arm, seed), dir = args.dir,
    seed = seed, overwrite = true, progress = false, sft = false,
    tasks_per_step = S.tasks, group_size = S.group, minibatch = PER_STEP, max_turn_tokens = 16,
    advantage = "grpo", loss = "ppo", clip_high = 0.28, lr = S.lr, entropy_coef = S.entropy, epochs = S.epochs, temperature = 1,
    eval = { every = 1000000, tasks = S.suite, k = 1 }, evaluate = evaluate,
  }
  -- every rollout outside evaluation counts towards the arm's budget
  local rollouts = 0
  o.rollout = function(ctx, ro)
    local b = rl.train.rollout.run(ctx, ro)
    if not ctx.evaluating then rollouts = rollouts + #b.episodes end
    return b
  end
  local rounds, gen, loop = {}, nil, nil
  local budget = arm == "d" and BUDGET // 4 or BUDGET
  if arm == "a" then
    o.steps = S.steps
  elseif arm == "b" then
    o.steps = S.steps
    o.tasks = function(_, _, n, s)
      local list = tb.tasks("random", n, s)
      for _, t in ipairs(list) do assert(tb.verify(t), "toolbox.lua: an unverifiable random task " .. t.key) end
      return list
    end
  else
    local cur
    loop, gen, cur = targeted_loop(seed)
    o.steps, o.synth, o.curriculum = targeted_steps(budget), loop, cur
    o.on_step = function(step)
      if loop.last and loop.last.step ~= (rounds[#rounds] or {}).loop_step then
        local d = gen.last
        rounds[#rounds + 1] = { loop_step = loop.last.step, train_step = step, weakest = d.weakest, tags = d.tags,
          contrast = d.contrast, levels = d.levels, admitted = loop.last.admitted, too_easy = loop.last.too_easy,
          too_hard = loop.last.too_hard, invalid = loop.last.invalid, duplicate = loop.last.duplicate, pool = loop.last.pool }
      end
    end
  end
  local t0 = rl.clock()
  local result = rl.train(o)
  local seconds = rl.clock() - t0
  return { arm = arm, after = result.after, before = result.before, rollouts = rollouts,
    train = o.steps * PER_STEP, steps = o.steps, seconds = seconds, s_per_step = seconds / o.steps,
    rounds = rounds, probed = gen and gen.probed or 0, loop = loop }
end

local NAMES = { a = "(a) GRPO, target distribution", b = "(b) GRPO, random synthetic", c = "(c) targeted loop",
  d = "(d) targeted loop, 1/4 rollouts" }

local function pct(x) return string.format("%.1f", 100 * x) end

local function table_of(rows, sft_row)
  local head = { "arm", "rollouts (train/all)", "held-out" }
  for _, t in ipairs(tb.tags) do head[#head + 1] = t end
  head[#head + 1] = "s/step"
  print("| " .. table.concat(head, " | ") .. " |")
  print("|" .. string.rep("---|", #head))
  local function line(name, r, ev, step)
    local cells = { name, r, pct(ev["eval/greedy_success"]) }
    for _, t in ipairs(tb.tags) do cells[#cells + 1] = pct(ev["eval/" .. t]) end
    cells[#cells + 1] = step
    print("| " .. table.concat(cells, " | ") .. " |")
  end
  line("SFT warm start", "0", sft_row, "")
  for _, r in ipairs(rows) do
    line(NAMES[r.arm], string.format("%d/%d", r.train, r.rollouts), r.after, string.format("%.2f", r.s_per_step))
  end
end

local function one_seed(seed)
  local warm, info = warm_start(seed)
  local bl = rl.blas_info()
  print(string.format("toolbox: seed %d, BLAS %s x%d; SFT %d demos (recover %.1f%%, chain3 %.1f%%), loss %.3f, %.0f s; "
    .. "budget %d rollouts (%d steps x %d episodes); targeted rounds of %d steps: probe %d, %d candidates x k = %d",
    seed, bl.core, bl.threads, info.examples, 100 * info.shares.recover, 100 * info.shares.chain3, info.loss, info.seconds,
    BUDGET, S.steps, PER_STEP, S.round, S.probe, S.candidates, S.k))
  local rows, by = {}, {}
  for arm in args.arms:gmatch("[^,]+") do
    if not NAMES[arm] then error("toolbox.lua: unknown arm " .. arm .. " (a, b, c or d)", 0) end
    local r = run_arm(arm, warm, seed)
    rows[#rows + 1], by[arm] = r, r
    print(string.format("arm %s: %d steps, %d rollouts (%d training, %d probe, %d calibration), %.0f s, %.2f s/step",
      arm, r.steps, r.rollouts, r.train, r.probed, r.rollouts - r.train - r.probed, r.seconds, r.s_per_step))
    for i, d in ipairs(r.rounds) do
      local rates, con = {}, {}
      for _, x in ipairs(d.tags) do rates[#rates + 1] = string.format("%s %.2f", x.tag, x.pass) end
      for j = 1, math.min(3, #d.contrast) do
        local c = d.contrast[j]
        con[#con + 1] = string.format("%s %.2f", c.turn, c.fail_rate)
      end
      local lv = {}
      for _, t in ipairs(d.weakest) do lv[#lv + 1] = string.format("%s@%s", t, tostring(d.levels[t])) end
      local inv = 0
      for _, n in pairs(d.invalid) do inv = inv + n end
      print(string.format("  round %d (step %d): probe pass %s | fails at %s | synthesise %s: admitted %d, too easy %d, too hard %d, invalid %d, duplicate %d; pool %d",
        i, d.train_step, table.concat(rates, ", "), table.concat(con, ", "), table.concat(lv, " "), d.admitted,
        d.too_easy, d.too_hard, inv, d.duplicate, d.pool))
    end
  end
  local sft_row = rows[1] and rows[1].before
  print("")
  table_of(rows, sft_row)
  local function g(arm) return by[arm] and by[arm].after["eval/greedy_success"] end
  local function cmp(x, y, op)
    if not (g(x) and g(y)) then return string.format("(%s) vs (%s): not run", x, y) end
    local d = 100 * (g(x) - g(y))
    local holds = (op == ">" and d > 0) or (op == ">=" and d >= 0)
    return string.format("(%s) %s (%s): %s (%+.1f points)", x, op, y, holds and "yes" or "no", d)
  end
  print(string.format("%s; %s; %s", cmp("c", "a", ">"), cmp("a", "b", ">"), cmp("d", "a", ">=")))
  return { rows = rows, sft = sft_row }
end

local runs = {}
for k = 0, args.seeds - 1 do
  runs[#runs + 1] = one_seed(args.seed + k)
  print("")
end

if args.seeds > 1 then
  local function ms(values)
    local s, n = 0, #values
    for _, v in ipairs(values) do s = s + v end
    local mean, ss = s / n, 0
    for _, v in ipairs(values) do ss = ss + (v - mean) ^ 2 end
    return mean, n > 1 and math.sqrt(ss / (n - 1)) or 0
  end
  local cols = { "greedy_success" }
  for _, t in ipairs(tb.tags) do cols[#cols + 1] = t end
  print(string.format("mean ± spread (sample sd) over seeds %d..%d", args.seed, args.seed + args.seeds - 1))
  local head = { "arm", "rollouts", "held-out" }
  for _, t in ipairs(tb.tags) do head[#head + 1] = t end
  print("| " .. table.concat(head, " | ") .. " |")
  print("|" .. string.rep("---|", #head))
  local arms = { "sft" }
  for _, r in ipairs(runs[1].rows) do arms[#arms + 1] = r.arm end
  local means = {}
  for _, arm in ipairs(arms) do
    local cells = { arm == "sft" and "SFT warm start" or NAMES[arm] }
    local ro = {}
    for _, run in ipairs(runs) do
      for _, r in ipairs(run.rows) do if r.arm == arm then ro[#ro + 1] = r.rollouts end end
    end
    cells[2] = #ro > 0 and string.format("%.0f", (ms(ro))) or "0"
    means[arm] = {}
    for _, col in ipairs(cols) do
      local vals = {}
      for _, run in ipairs(runs) do
        if arm == "sft" then vals[#vals + 1] = run.sft["eval/" .. col]
        else for _, r in ipairs(run.rows) do if r.arm == arm then vals[#vals + 1] = r.after["eval/" .. col] end end end
      end
      local mean, sd = ms(vals)
      means[arm][col] = { mean = mean, sd = sd }
      cells[#cells + 1] = string.format("%.1f ± %.1f", 100 * mean, 100 * sd)
    end
    print("| " .. table.concat(cells, " | ") .. " |")
  end
  -- A claim counts as reproduced when the margin exceeds twice the seeds' spread (plan §0).
  local function margin(x, y)
    if not (means[x] and means[y]) then return string.format("(%s) - (%s): not run", x, y) end
    local dx, dy = means[x].greedy_success, means[y].greedy_success
    local d = dx.mean - dy.mean
    local spread = math.max(dx.sd, dy.sd)
    return string.format("(%s) - (%s) = %+.1f points, 2 x spread = %.1f", x, y, 100 * d, 200 * spread)
  end
  print(string.format("%s; %s; %s", margin("c", "a"), margin("a", "b"), margin("d", "a")))
  -- The arms of a seed share its warm start and seeds, so the per-seed margins are paired: their
  -- spread leaves out how good each seed's warm start happened to be.
  local function paired(x, y)
    local d = {}
    for _, run in ipairs(runs) do
      local gx, gy
      for _, r in ipairs(run.rows) do
        if r.arm == x then gx = r.after["eval/greedy_success"] end
        if r.arm == y then gy = r.after["eval/greedy_success"] end
      end
      if gx and gy then d[#d + 1] = gx - gy end
    end
    if #d == 0 then return string.format("(%s) - (%s): not run", x, y) end
    local mean, sd = ms(d)
    return string.format("(%s) - (%s) = %+.1f ± %.1f", x, y, 100 * mean, 100 * sd)
  end
  print(string.format("paired over seeds: %s; %s; %s", paired("c", "a"), paired("a", "b"), paired("d", "a")))
end
