-- pacevolve.lua - PACEvolve++ in miniature (spec reproductions.md section 3.9, advantage.md
-- 6.11) on envs/evolve.lua: an advisor policy proposes one hypothesis per sample (`inc p2 3`,
-- `swap p1 p4`, ...) that a scripted implementer applies to the search's current best vector;
-- --samples (8) samples make one generation, the best of them and the current best is the next
-- generation's best (elitist), and the advisor is trained during the search on that problem
-- alone (test-time training, one RL step per generation, --gens generations), afresh from the
-- same SFT warm start on each of --problems held-out problems. Reward 5 clip(progress), failed
-- or invalid hypotheses -1 (the environment's). Arms, all with the engine's estimator
-- (rl.advantage.pacevolve_pp: A = (1 - a) z(r - mean) + a z(SLOO best-of-k credit), k = --k):
--   frozen    the SFT advisor, never updated (the evolutionary search alone);
--   group     a = 0: group-relative only;
--   frontier  a = 1: leave-one-out best-of-k frontier credit only;
--   phase     a = s / (T - 1) at generation s (0-based) of T: PACEvolve++'s phase-adaptive mix.
-- A generation whose weighted branch has no spread (all rewards equal) makes no update (the
-- estimator's skip). For reference, two scripted advisors run the same search: uniform (a
-- hypothesis drawn uniformly from those that evaluate) and greedy (the largest score gain: it
-- knows the peak). The SFT demonstrator is greedy 30% of the time, else uniform; the peak is
-- hidden, so the SFT advisor is close to the uniform one.
--
-- Measured per arm, as the mean over the problems: the best progress (best score's progress
-- from the start to the peak, %) after generations 10, 20, 30 and the last; the generations to
-- reach 90% progress and to reach the peak (a problem that never does counts --gens + 1); how
-- many problems reached the peak; the share of samples that failed; seconds per generation.
--
--   moonrl run recipes/pacevolve.lua [--seed 1] [--seeds 3] [--arms frozen,group,frontier,phase]
--     [--problems 12] [--gens 40] [--samples 8] [--k 4] [--lr 1e-3] [--epochs 1] [--kl 0.5]
--     [--sft-examples 3000] [--sft-epochs 3] [--dim 64] [--layers 2] [--dir runs] [--smoke]
--
-- Every arm: PPO (clip 0.2 / 0.28), --epochs passes over each generation's samples (one
-- minibatch), lr --lr, a k3 KL to the SFT advisor with coefficient --kl (0: none; without it the
-- byte-level advisor loses its output format within a few generations at these learning
-- rates, and every sample then fails), the same problems, the same seed per problem (so every arm's first
-- generation is the same sample). --seeds n runs the recipe for seeds seed .. seed + n - 1,
-- each with its own SFT and problems, then the mean ± spread (sample sd). --smoke is a tiny
-- run that only shows the recipe works. Files go to <dir>/evolve-<arm>-p<problem>-s<seed>/ and
-- the warm start to <dir>/evolve-sft-s<seed>.bin.
local rl = require "moonrl"

local root = os.getenv("MOONRL_ROOT") or "."
package.path = root .. "/?.lua;" .. package.path
local E = require "envs.evolve"
local R = rl.recipe

local o, why = R.args(arg, { seed = 1, seeds = 1, arms = "frozen,group,frontier,phase", problems = 12, gens = 40,
  samples = 8, k = 4, lr = 1e-3, epochs = 1, kl = 0.5, sft_examples = 3000, sft_epochs = 3, dim = 64, layers = 2,
  dir = root .. "/runs", smoke = false })
if not o then error("pacevolve.lua: " .. why, 0) end
if o.smoke then
  o.problems, o.gens, o.sft_examples, o.sft_epochs, o.dim, o.layers = 2, 4, 400, 2, 32, 1
end
local ALPHA = { frozen = false, group = 0, frontier = 1, phase = "schedule" }
local ARMS = {}
for name in o.arms:gmatch("[^,]+") do
  if ALPHA[name] == nil then
    error(string.format("pacevolve.lua: --arms: unknown arm '%s' (known: frozen, group, frontier, phase)", name), 0)
  end
  ARMS[#ARMS + 1] = name
end
if o.gens < 2 then error("pacevolve.lua: --gens must be at least 2", 0) end
if o.k < 2 or o.k > o.samples then error("pacevolve.lua: --k must be in 2 .. --samples", 0) end
local MARKS = {}
for _, g in ipairs { 10, 20, 30 } do if g < o.gens then MARKS[#MARKS + 1] = g end end
MARKS[#MARKS + 1] = o.gens

local tok = rl.tokenizer.bytes()
local function new_model(seed)
  return rl.model.new { vocab = tok:vocab_size(), dim = o.dim, layers = o.layers, heads = 4, ffn = 3 * o.dim,
    ctx = 64, seed = seed }
end

-- The warm start: SFT on the demonstrator's hypotheses for generations of training problems.
local function warm_start(seed)
  local m = new_model(seed)
  local t0 = rl.clock()
  local ctx = { cfg = { env = E, max_turns = E.max_turns }, tokenizer = tok }
  local data = rl.train.oracle_examples(ctx, o.sft_examples, rl.train.mix(seed, 0xF7))
  local path = string.format("%s/evolve-sft-s%d.bin", o.dir, seed)
  local r = R.warm_start { model = m, data = data, epochs = o.sft_epochs, path = path, seed = rl.train.mix(seed, 0x5F7) }
  return path, { seconds = rl.clock() - t0, loss = r.final_loss, examples = #data }
end

-- A search's summary from its best-progress curve (curve[g] after generation g) and counts.
local function summary(curve, samples, failed)
  local s = { g90 = o.gens + 1, gpeak = o.gens + 1, peak = 0, failed = failed / samples }
  for g, p in ipairs(curve) do
    if p >= 0.9 and s.g90 > o.gens then s.g90 = g end
    if p >= 1 and s.gpeak > o.gens then s.gpeak, s.peak = g, 1 end
  end
  for i, g in ipairs(MARKS) do s["b" .. i] = curve[g] end
  return s
end

-- The search's state between generations: the current best and its curve. As rl.train's task
-- stage it hands out one generation (the problem at the current best) and, after the rewards,
-- keeps the best evaluated vector.
local function search(problem)
  local st = { x = problem.x0, y = problem.y0, curve = {}, samples = 0, failed = 0, step = 0 }
  function st:sample(_, step)
    self.step = step
    return { { problem = problem, x = self.x } }
  end
  function st:update(_, _, batch)
    for _, ep in ipairs(batch.episodes) do
      local info = ep.record[1] and ep.record[1].info or {}
      self.samples = self.samples + 1
      if not info.x then self.failed = self.failed + 1
      elseif info.y > self.y then self.x, self.y = info.x, info.y end
    end
    self.curve[#self.curve + 1] = E.progress(problem, self.y)
  end
  return st
end

-- The advantage stage of an arm: the engine's PACEvolve++ estimator on the generation's rewards.
local function estimator(arm, st)
  return function(_, batch)
    local rewards, per = {}, {}
    for i, ep in ipairs(batch.episodes) do rewards[i], per[i] = ep.reward, 0 end
    local alpha = ALPHA[arm]
    if alpha then
      local params = alpha == "schedule" and { k = o.k, total_steps = o.gens } or { k = o.k, alpha = alpha }
      local out = rl.advantage.pacevolve_pp({ rewards = rewards, step = st.step - 1 }, params)
      if not out.skip then per = out.advantages end
    end
    return rl.objective.broadcast { values = per, mask = batch.mask, offsets = batch.offsets }, per
  end
end

-- One arm on one problem: the warm start loaded, o.gens generations of test-time training.
local function run_search(seed, sft_path, arm, pi, problem)
  local m = new_model(seed)
  m:load_checkpoint(sft_path)
  m:reset_optimizer()
  local st = search(problem)
  local secs = 0
  rl.train {
    model = m, tokenizer = tok, env = E, name = string.format("evolve-%s-p%d-s%d", arm, pi, seed), dir = o.dir,
    seed = rl.train.mix(seed, pi), overwrite = true, steps = o.gens, tasks_per_step = 1, group_size = o.samples,
    minibatch = o.samples, epochs = o.epochs, max_turn_tokens = 12, loss = "ppo", clip_low = 0.2, clip_high = 0.28,
    lr = o.lr, kl_coef = o.kl > 0 and o.kl or nil, kl = o.kl > 0 and "k3" or nil, advantage = estimator(arm, st),
    tasks = st, eval = false, progress = false, plot = false, log_episodes = 1, checkpoint_every = o.gens,
    on_step = function(_, mt) secs = secs + mt["time/step"] end,
  }
  local s = summary(st.curve, st.samples, st.failed)
  s.sps = secs / o.gens
  return s
end

-- A scripted advisor (choose(problem, x, rng) -> hypothesis) running the same search.
local function scripted(problem, choose, rng)
  local x, y, curve, failed = problem.x0, problem.y0, {}, 0
  for g = 1, o.gens do
    local bx, by = x, y
    for _ = 1, o.samples do
      local nx = E.apply(x, choose(problem, x, rng))
      if not nx then failed = failed + 1
      else
        local ny = E.score(problem, nx)
        if ny > by then bx, by = nx, ny end
      end
    end
    x, y = bx, by
    curve[g] = E.progress(problem, y)
  end
  return summary(curve, o.gens * o.samples, failed)
end

local SCRIPTED = {
  uniform = function(_, x, rng) local v = E.valid_from(x) return v[rng:random(#v)] end,
  greedy = function(problem, x) return E.greedy(problem, x) end,
}

-- The mean over the problems of each summary field.
local function mean_row(name, list)
  local row = { arm = name }
  for k, v in pairs(list[1]) do
    local sum = 0
    for _, s in ipairs(list) do sum = sum + s[k] end
    row[k] = type(v) == "number" and sum / #list or v
  end
  row.peak = row.peak * #list -- a count of problems
  return row
end

local printed_sps = false

local function one_seed(seed)
  local t0 = rl.clock()
  local sft_path = R.announced_start(seed, warm_start, o.sft_epochs)
  local problems = E.problems("test", o.problems, rl.train.mix(seed, 0x7E57))
  local rows = {}
  for _, arm in ipairs(ARMS) do
    local list = {}
    for pi, problem in ipairs(problems) do
      list[pi] = run_search(seed, sft_path, arm, pi, problem)
      if not printed_sps then
        printed_sps = true
        print(string.format("  (measured: %.3f s per generation of %d samples, %s arm, problem 1)", list[pi].sps,
          o.samples, arm))
        io.stdout:flush()
      end
    end
    local row = mean_row(arm, list)
    rows[#rows + 1] = row
    print(string.format("  %-9s %d problems x %d generations  best %.1f%%  to 90%% %.1f  to peak %.1f  (%d at the peak)",
      arm, o.problems, o.gens, 100 * row["b" .. #MARKS], row.g90, row.gpeak, row.peak))
    io.stdout:flush()
  end
  for _, name in ipairs { "uniform", "greedy" } do
    local list = {}
    for pi, problem in ipairs(problems) do
      list[pi] = scripted(problem, SCRIPTED[name], rl.rng(rl.train.mix(seed, pi, 0x5C)))
    end
    rows[#rows + 1] = mean_row(name, list)
  end
  print(string.format("seed %d: %.0f s", seed, rl.clock() - t0))
  return rows
end

local function print_table(list, title)
  local w = #list > 1 and 13 or 7
  local function cell(v, scale, fmt) return string.format("%" .. w .. "s", R.pm(v, scale, fmt)) end
  print(string.format("\nevolve, %s; %d held-out problems x %d generations of %d samples; best-of-k k = %d",
    title, o.problems, o.gens, o.samples, o.k))
  local head = { string.format("%-9s", "arm") }
  for _, g in ipairs(MARKS) do head[#head + 1] = string.format("%" .. w .. "s", "best@" .. g) end
  for _, h in ipairs { "to90%", "to_peak", "peaks", "failed%", "s/gen" } do
    head[#head + 1] = string.format("%" .. w .. "s", h)
  end
  print(table.concat(head, " "))
  for _, r in ipairs(R.summarise(list, "arm")) do
    local line = { string.format("%-9s", r.arm) }
    for i = 1, #MARKS do line[#line + 1] = cell(r["b" .. i]) end
    line[#line + 1] = cell(r.g90, 1)
    line[#line + 1] = cell(r.gpeak, 1)
    line[#line + 1] = cell(r.peak, 1, "%.0f")
    line[#line + 1] = cell(r.failed)
    line[#line + 1] = r.sps and cell(r.sps, 1, "%.3f") or string.format("%" .. w .. "s", "-")
    print(table.concat(line, " "))
  end
end

local t_all = rl.clock()
R.report(o.seed, o.seeds, one_seed, print_table)
print(string.format("(best@g: best progress after generation g, %%, mean over problems; to90%%, to_peak: generations "
  .. "to reach 90%% progress and the peak, %d when never; peaks: problems at the peak by the end; failed%%: samples "
  .. "that failed or were invalid; s/gen: measured seconds per generation; %.0f s in all)", o.gens + 1,
  rl.clock() - t_all))
