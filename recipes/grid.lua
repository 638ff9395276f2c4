-- grid.lua - the grid-world recipe (shared/spec/reproductions.md §3.6: TSR, T²PO, AEM, DPEPO) on
-- FrozenLake 6x6 with slips (envs/grid.lua). One shared SFT warm start on the demonstrator's
-- closed-loop walks, then each arm trains from it with the same seeds and task stream:
--
--   grpo    GRPO (one advantage per episode), the baseline
--   gigpo   GiGPO (gamma 0.95): the episode term plus a step term among the group's turns from
--           the same cell (state_key)
--   t2po    T²PO's turn-level half on top of GiGPO (gamma 0.95): a turn is sampled again (at most
--           twice) when |H_t - H_{t-1}|, the mean entropy of this turn's sampled tokens against
--           the previous turn's, lies in (0, 0.3). The rollout view carries no entropies, so the
--           on_action hook scores the episode's context with the policy itself (m:logprobs with
--           entropy = true on the chat template's tokens of the conversation so far, the action
--           and its end marker: what the rollout sampled, the end marker aside when a turn ran
--           out of tokens)
--   aem     AEM: GRPO's advantage times alpha = exp(-H~) normalised to group mean 1, H~ the
--           episode's mean token entropy min-max scaled within its group, lambda 1, none when the
--           group's entropies span less than 0.1 (advantage = "aem")
--   tsr     TSR best-of-4 per turn by distance to the goal, on GRPO: each sampled action is
--           tried on a clone of the episode's environment (the clone slips as the episode will,
--           the slip stream being the episode's) and the turn is sampled again, up to 3 times,
--           until the action's distance after the move is the best any of u, d, l, r reaches
--           from there; the 4th sample is kept whatever it scores. This is best-of-4 whenever
--           one of the 4 samples reaches the best score, and takes the last sample (not the
--           best of the 4) when none does. Training rollouts only: evaluation searches nothing
--   pgrpo   parallel GRPO: one agent in 3 copies of the map (rl.envkit.copies{actions = "split"}),
--           one action per copy a turn ("1:u 2:r 3:l", a finished copy left out), each copy with
--           its own slips; the turn's reward is the rise of the best copy's return, so an
--           episode earns 1 when any copy reaches the goal (parallel success), and it ends when
--           every copy has. Its own SFT start on the demonstrator's walks in all 3 copies at
--           once, and a ctx of 1024 (3 views a turn do not fit 256)
--   dpepo   DPEPO: pgrpo with each turn's GRPO advantage times DPEPO's diversity weight W when
--           positive, times 2 - W when negative (advantage = "dpepo"; alpha 0.8, gamma_t 0.95,
--           beta 0.95, omega 0.8)
--
--   columns: held-out greedy success (maps no training task uses), mean turns per episode
--   (greedy, held-out), and the first evaluation step at which held-out greedy success reached
--   --level (- when it never did); scripted rows: the demonstrator and the shortest-path planner
--   (replanned after each slip: the ceiling), on the same maps and slip streams. The parallel
--   arms get their own table: held-out greedy success per copy (the share of copies that reach
--   the goal), of all 3 copies and of any copy, mean turns per episode, and the cross-copy
--   redundancy (the share of turns with at least two acting copies in which two of them got the
--   same action); sequential rows there show their success per copy.
--
--   moonrl run recipes/grid.lua [--seed 1] [--seeds 3] [--steps 30] [--sft 800] [--sft-epochs 3]
--        [--eval 100] [--every 10] [--level 0.5] [--tasks 8] [--group 8] [--dim 64] [--layers 2]
--        [--lr 2e-4] [--arms grpo,gigpo,t2po,aem,tsr] [--dir runs] [--smoke]
--        [--psft 400] [--copies 3] (--arms also takes pgrpo and dpepo: --arms grpo,pgrpo,dpepo
--        is the DPEPO comparison; --psft is the number of parallel SFT walks)
--
-- --seeds K runs seeds seed..seed+K-1 and reports mean ± sample sd; --smoke is a tiny run that
-- only shows the recipe works. Files go to <dir>/grid-<arm>-s<seed>/. The README
-- ("Reproductions", "Grid worlds: TSR, T²PO, AEM, DPEPO") has the measured table and the verdict.
local rl = require "moonrl"

local root = os.getenv("MOONRL_ROOT") or "."
package.path = root .. "/?.lua;" .. package.path
local env = require "envs.grid"

local o, why = rl.recipe.args(arg, { seed = 1, seeds = 1, steps = 30, sft = 800, sft_epochs = 3, eval = 100,
  every = 10, level = 0.5, tasks = 8, group = 8, dim = 64, layers = 2, lr = 2e-4, arms = "grpo,gigpo,t2po,aem,tsr",
  psft = 400, copies = 3, dir = root .. "/runs", smoke = false })
if not o then error("grid.lua: " .. why, 0) end
if o.smoke then
  o.steps, o.sft, o.sft_epochs, o.eval, o.every, o.tasks, o.group, o.dim, o.layers = 2, 40, 1, 8, 1, 2, 4, 32, 1
  o.psft = 20
end
local ARMS = {
  grpo = { label = "SFT + GRPO", train = { advantage = "grpo" } },
  gigpo = { label = "SFT + GiGPO", train = { advantage = "gigpo", gamma = 0.95 } },
  t2po = { label = "SFT + GiGPO + T2PO turns", train = { advantage = "gigpo", gamma = 0.95 }, t2po = true },
  aem = { label = "SFT + AEM (GRPO)", train = { advantage = "aem" } },
  tsr = { label = "SFT + GRPO + TSR best-of-4", train = { advantage = "grpo" }, tsr = true },
  pgrpo = { label = "SFT-par + parallel GRPO", train = { advantage = "grpo" }, parallel = true },
  dpepo = { label = "SFT-par + DPEPO", train = { advantage = "dpepo" }, parallel = true },
}
local ARM_NAMES = "grpo, gigpo, t2po, aem, tsr, pgrpo, dpepo"
local arms = {}
for name in o.arms:gmatch("[^,]+") do
  if not ARMS[name] then error("grid.lua: unknown arm '" .. name .. "' (" .. ARM_NAMES .. ")", 0) end
  arms[#arms + 1] = name
end

local CTX, TURN_TOKENS, EVAL_SEED = 256, 4, 4242
-- The parallel arms: 3 views a turn (about 60 tokens with the parts and the chat template) need
-- a longer context; a turn is up to 3 parts of 3 bytes and the end marker.
local PAR_CTX, PAR_TURN_TOKENS = 1024, 14
local tok = rl.tokenizer.bytes()
local function new_model(seed, ctx)
  return rl.model.new { vocab = tok:vocab_size(), dim = o.dim, layers = o.layers, heads = 4, ffn = 3 * o.dim,
    ctx = ctx or CTX, seed = seed }
end
local par_env = rl.envkit.copies { env = env, n = o.copies, actions = "split", reward = "best", success = "any",
  name = "grid-par" }
local any_parallel, any_sequential = false, false
for _, arm in ipairs(arms) do
  if ARMS[arm].parallel then any_parallel = true else any_sequential = true end
end
local HELD_OUT = env.tasks("test", o.eval, 777)

-- The evaluate stage: greedy on the held-out maps, success and mean turns.
local function evaluate(ctx)
  local b = ctx.stages.rollout(ctx, { tasks = HELD_OUT, repeats = 1, seed = EVAL_SEED, temperature = 0,
    group_base = 0 })
  local ok, turns = 0, 0
  for _, ep in ipairs(b.episodes) do
    if ep.success then ok = ok + 1 end
    turns = turns + ep.turns
  end
  return { greedy_success = ok / #b.episodes, turns = turns / #b.episodes }
end

-- The parallel measures of a list of episodes' records (each a list of turns whose info is
-- rl.envkit.copies' split info): success per copy, of all copies, of any, mean turns, redundancy.
local function parallel_measures(records)
  local per, all, any, turns, red, shared = 0, 0, 0, 0, 0, 0
  for _, record in ipairs(records) do
    local last = record[#record]
    local wins = 0
    for i = 1, o.copies do
      local c = last and last.info and last.info.copies and last.info.copies[i]
      if c and c.success then wins = wins + 1 end
    end
    per, turns = per + wins / o.copies, turns + #record
    if wins == o.copies then all = all + 1 end
    if wins > 0 then any = any + 1 end
    for _, rec in ipairs(record) do
      local seen, acting, dup = {}, 0, false
      for i, a in ipairs(rec.info and rec.info.copy_actions or {}) do
        local c = rec.info.copies[i]
        if a ~= "" and not c.skipped then
          acting = acting + 1
          local m = a:match("^%s*([udlr])") or a
          if seen[m] then dup = true end
          seen[m] = true
        end
      end
      if acting >= 2 then
        shared = shared + 1
        if dup then red = red + 1 end
      end
    end
  end
  local n = math.max(#records, 1)
  return { per_copy = per / n, all = all / n, any = any / n, turns = turns / n,
    redundancy = shared > 0 and red / shared or 0 }
end

-- The evaluate stage of the parallel arms: greedy on the held-out maps, the parallel measures
-- (greedy_success is the success per copy, for the steps-to-level column).
local function evaluate_parallel(ctx)
  local b = ctx.stages.rollout(ctx, { tasks = HELD_OUT, repeats = 1, seed = EVAL_SEED, temperature = 0,
    group_base = 0 })
  local records = {}
  for i, ep in ipairs(b.episodes) do records[i] = ep.record end
  local m = parallel_measures(records)
  return { greedy_success = m.per_copy, all = m.all, any = m.any, turns = m.turns, redundancy = m.redundancy }
end

-- play_parallel(task, policy, seed) -> {messages =, record =}: a closed-loop scripted walk in
-- all copies at once (par_env, slips from rl.rng(seed)); policy(task, pos) -> a move for one
-- copy, asked for each copy not yet done, in copy order; messages is the conversation (for
-- SFT), record the turns' {info =}.
local function play_parallel(task, policy, seed)
  local inst = par_env.new()
  local msgs, record = { { role = "user", content = inst:reset(task, rl.rng(seed)) } }, {}
  for _ = 1, env.max_turns do
    local parts = {}
    for i = 1, o.copies do
      if not inst.done[i] then parts[#parts + 1] = i .. ":" .. policy(task, inst.insts[i].pos) end
    end
    local action = table.concat(parts, " ")
    msgs[#msgs + 1] = { role = "assistant", content = action }
    local obs, _, done, info = inst:step(action)
    record[#record + 1] = { info = info }
    if done then break end
    msgs[#msgs + 1] = { role = "user", content = obs }
  end
  return { messages = msgs, record = record }
end

-- A scripted row on the held-out maps: slips from each map's own seed (not the rollout's
-- streams, which only the engine draws), so it is comparable in distribution, not episode by
-- episode.
local function scripted(policy)
  local ok, turns = 0, 0
  for i, t in ipairs(HELD_OUT) do
    local r = env.play(t, policy(rl.rng(rl.train.mix(91, i))), rl.train.mix(EVAL_SEED, i))
    if r.success then ok = ok + 1 end
    turns = turns + r.turns
  end
  return { greedy_success = ok / #HELD_OUT, turns = turns / #HELD_OUT }
end
local scripted_rows = {
  demo = scripted(function(rng) return function(t, pos) return env.demo_action(t, pos, rng) end end),
  plan = scripted(function() return env.plan_action end),
}
-- The same in all copies at once (the parallel table's scripted rows).
local function scripted_parallel(policy)
  local records = {}
  for i, t in ipairs(HELD_OUT) do
    records[i] = play_parallel(t, policy(rl.rng(rl.train.mix(91, i))), rl.train.mix(EVAL_SEED, i)).record
  end
  local m = parallel_measures(records)
  m.greedy_success = m.per_copy
  return m
end
if any_parallel then
  scripted_rows.pdemo = scripted_parallel(function(rng) return function(t, pos) return env.demo_action(t, pos, rng) end end)
  scripted_rows.pplan = scripted_parallel(function() return env.plan_action end)
end

-- The SFT data: the demonstrator's closed-loop walks on training maps (a walk is replanned after
-- each slip, which an open-loop oracle list replayed by rl.train could not do).
local function sft_data(seed)
  local tasks, data = env.tasks("train", o.sft, rl.train.mix(seed, 0xF7)), {}
  for i, t in ipairs(tasks) do
    local rng = rl.rng(rl.train.mix(seed, i, 2))
    local walk = env.play(t, function(task, pos) return env.demo_action(task, pos, rng) end, rl.train.mix(seed, i, 1))
    data[i] = rl.sft_example(tok, walk.messages)
  end
  return data
end

-- The parallel SFT data: the demonstrator's closed-loop walks in all copies at once, in the split
-- format ("1:u 2:r 3:l", each copy's move the demonstrator's for that copy, replanned after its
-- slips), on training maps.
local function parallel_sft_data(seed)
  local tasks, data = env.tasks("train", o.psft, rl.train.mix(seed, 0xF8)), {}
  for i, t in ipairs(tasks) do
    local rng = rl.rng(rl.train.mix(seed, i, 4))
    local walk = play_parallel(t, function(task, pos) return env.demo_action(task, pos, rng) end, rl.train.mix(seed, i, 3))
    data[i] = rl.sft_example(tok, walk.messages)
  end
  return data
end

-- T²PO's turn resampling for policy m: on_action(ep, action, attempt) -> true when the turn's mean
-- token entropy is within (0, 0.3) of the previous turn's (never on the first turn). counts
-- gets the hook's calls and resamples.
local T2PO_BAND, T2PO_RETRIES = 0.3, 2
local function t2po_hooks(m, counts)
  local function span_entropy(ent, first, last) -- tokens first..last (1-based) of the sequence
    local sum = 0
    for p = first, last do sum = sum + ent[p - 1] end
    return sum / (last - first + 1)
  end
  return {
    max_resamples = T2PO_RETRIES,
    on_action = function(ep, action)
      counts.calls = counts.calls + 1
      if #ep.record == 0 then return false end
      local msgs = { { role = "user", content = env.new():reset(ep.task) } }
      for _, rec in ipairs(ep.record) do
        msgs[#msgs + 1] = { role = "assistant", content = rec.action }
        msgs[#msgs + 1] = { role = "user", content = rec.observation }
      end
      local prev_start = #tok:chat({ table.unpack(msgs, 1, #msgs - 2) }, { add_generation_prompt = true })
      local prev_end = #tok:chat({ table.unpack(msgs, 1, #msgs - 1) }, { add_generation_prompt = false })
      local cur_start = #tok:chat(msgs, { add_generation_prompt = true })
      msgs[#msgs + 1] = { role = "assistant", content = action }
      local ids = tok:chat(msgs, { add_generation_prompt = false })
      if #ids > CTX then return false end -- a turn cut at the context's end: nothing to compare
      local _, ent = m:logprobs { tokens = { ids }, entropy = true }
      local dh = math.abs(span_entropy(ent[1], cur_start + 1, #ids) - span_entropy(ent[1], prev_start + 1, prev_end))
      if dh > 0 and dh < T2PO_BAND then
        counts.resamples = counts.resamples + 1
        return true
      end
      return false
    end,
  }
end

-- TSR's per-turn search: on_action -> true (sample the turn again) while the action's distance to
-- the goal after the move, tried on a clone of the episode's environment, is worse than the best
-- of the four directions'.
local TSR_N = 4
local function after(inst, action)
  local c = inst:clone()
  c:step(action)
  return c:distance()
end
local function tsr_hooks(counts)
  return {
    max_resamples = TSR_N - 1,
    on_action = function(ep, action)
      counts.calls = counts.calls + 1
      local best = math.huge
      for _, a in ipairs(env.ACTIONS) do best = math.min(best, after(ep.instance, a)) end
      if after(ep.instance, action) > best then
        counts.resamples = counts.resamples + 1
        return true
      end
      return false
    end,
  }
end

-- The first evaluation step whose greedy success reached the level (nil: never).
local function steps_to_level(history)
  for _, h in ipairs(history) do
    if h["eval/greedy_success"] and h["eval/greedy_success"] >= o.level then return h.step end
  end
  return nil
end

local function run_seed(seed)
  local rows, timing = {}, { arms = {} }
  local t0 = rl.clock()
  local path = string.format("%s/grid-sft-s%d.bin", o.dir, seed)
  local ppath = string.format("%s/grid-psft-s%d.bin", o.dir, seed)
  if any_sequential then
    local s = rl.recipe.warm_start { model = new_model(seed), data = sft_data(seed), epochs = o.sft_epochs,
      path = path, seed = rl.train.mix(seed, 0x5F7) }
    timing.sft, timing.sft_loss = rl.clock() - t0, s.final_loss
  end
  if any_parallel then
    local tp = rl.clock()
    local s = rl.recipe.warm_start { model = new_model(seed, PAR_CTX), data = parallel_sft_data(seed),
      epochs = o.sft_epochs, path = ppath, seed = rl.train.mix(seed, 0x5F8) }
    timing.psft, timing.psft_loss = rl.clock() - tp, s.final_loss
  end
  for _, arm in ipairs(arms) do
    local par = ARMS[arm].parallel
    local m = new_model(seed, par and PAR_CTX or CTX)
    assert(m:load_checkpoint(par and ppath or path))
    local ta = rl.clock()
    local opts = {
      model = m, tokenizer = tok, env = par and par_env or env, name = string.format("grid-%s-s%d", arm, seed),
      dir = o.dir, seed = seed, overwrite = true, steps = o.steps, tasks_per_step = o.tasks, group_size = o.group,
      minibatch = o.tasks * o.group, epochs = 1, max_turn_tokens = par and PAR_TURN_TOKENS or TURN_TOKENS,
      temperature = 1.0, loss = "ppo", clip_low = 0.2, clip_high = 0.28, lr = o.lr, schedule = "cosine",
      min_lr = o.lr / 10, evaluate = par and evaluate_parallel or evaluate, eval = { every = o.every }, progress = false,
    }
    for k, v in pairs(ARMS[arm].train) do opts[k] = v end
    local counts = { calls = 0, resamples = 0 }
    if ARMS[arm].t2po then opts.rollout_hooks = t2po_hooks(m, counts) end
    if ARMS[arm].tsr then opts.rollout_hooks = tsr_hooks(counts) end
    local result = rl.train(opts)
    local n, sum = 0, 0
    for _, h in ipairs(result.history) do
      if h.step > 0 and h["time/step"] then n, sum = n + 1, sum + h["time/step"] end
    end
    timing.arms[arm] = { seconds = rl.clock() - ta, per_step = n > 0 and sum / n or 0,
      resampled = (ARMS[arm].t2po or ARMS[arm].tsr) and counts.resamples / math.max(counts.calls, 1) or nil }
    local function row(ev, level_step)
      return { greedy_success = ev["eval/greedy_success"], turns = ev["eval/turns"], level_step = level_step,
        all = ev["eval/all"], any = ev["eval/any"], redundancy = ev["eval/redundancy"] }
    end
    local first = par and "psft" or "sft"
    rows[first] = rows[first] or row(result.before, result.before["eval/greedy_success"] >= o.level and 0 or nil)
    rows[arm] = row(result.after, steps_to_level(result.history))
  end
  timing.total = rl.clock() - t0
  return rows, timing
end

local ORDER = { { key = "sft", label = "SFT (demonstrator walks)" } }
for _, arm in ipairs(arms) do
  if not ARMS[arm].parallel then ORDER[#ORDER + 1] = { key = arm, label = ARMS[arm].label } end
end
ORDER[#ORDER + 1] = { key = "demo", label = "demonstrator (scripted)" }
ORDER[#ORDER + 1] = { key = "plan", label = "planner (ceiling)" }
-- The parallel table: the sequential rows' success per copy, then the parallel arms'.
local PORDER = {}
for _, r in ipairs(ORDER) do
  if any_sequential and r.key ~= "demo" and r.key ~= "plan" then PORDER[#PORDER + 1] = { key = r.key, label = r.label, seq = true } end
end
PORDER[#PORDER + 1] = { key = "psft", label = "SFT-par (parallel walks)" }
for _, arm in ipairs(arms) do
  if ARMS[arm].parallel then PORDER[#PORDER + 1] = { key = arm, label = ARMS[arm].label } end
end
PORDER[#PORDER + 1] = { key = "pdemo", label = "demonstrator x" .. o.copies }
PORDER[#PORDER + 1] = { key = "pplan", label = "planner x" .. o.copies }
local function row_of(rows, key) return rows[key] or scripted_rows[key] end

print(string.format("grid: FrozenLake 6x6, slip %.1f, max %d turns, 3x3 view + goal offset; policy d=%d, %d layers "
  .. "(%d parameters), ctx %d; %d held-out maps; SFT %d walks x %d epochs; RL %d steps x %d tasks x %d episodes, "
  .. "eval every %d; level %.2f; BLAS %s x%d", env.SLIP, env.max_turns, o.dim, o.layers,
  new_model(o.seed):config().params, CTX, #HELD_OUT, o.sft, o.sft_epochs, o.steps, o.tasks, o.group, o.every, o.level,
  rl.blas_info().core, rl.blas_info().threads))
if any_parallel then
  print(string.format("parallel arms: %d copies of each map (own slips), split actions \"1:u 2:r 3:l\", reward the "
    .. "best copy's (parallel success), ctx %d, %d tokens a turn; parallel SFT %d walks x %d epochs", o.copies, PAR_CTX,
    PAR_TURN_TOKENS, o.psft, o.sft_epochs))
end

local COLS = { "held-out", "turns", "steps to level" }
local PCOLS = { "per copy", "all", "any", "turns", "redundant" }
local function pct(v) return v and string.format("%.1f%%", 100 * v) or "-" end
local all = rl.recipe.over_seeds(o.seed, o.seeds, function(seed)
  local rows, timing = run_seed(seed)
  if any_sequential then
    print(string.format("\nseed %d: held-out greedy success, mean turns, first eval step at success >= %.2f", seed,
      o.level))
    print(string.format("%-26s %10s %10s %15s", "policy", COLS[1], COLS[2], COLS[3]))
    for _, r in ipairs(ORDER) do
      local f = row_of(rows, r.key)
      print(string.format("%-26s %10s %10s %15s", r.label, string.format("%.1f%%", 100 * f.greedy_success),
        string.format("%.2f", f.turns), (r.key == "demo" or r.key == "plan") and "" or f.level_step or "-"))
    end
  end
  if any_parallel then
    print(string.format("\nseed %d, %d copies: held-out greedy success per copy, of all copies, of any copy; mean "
      .. "turns; share of turns with two copies on the same action", seed, o.copies))
    print(string.format("%-26s %10s %8s %8s %8s %10s", "policy", table.unpack(PCOLS)))
    for _, r in ipairs(PORDER) do
      local f = row_of(rows, r.key)
      print(string.format("%-26s %10s %8s %8s %8s %10s", r.label, pct(f.greedy_success), pct(f.all), pct(f.any),
        string.format("%.2f", f.turns), pct(f.redundancy)))
    end
  end
  local parts = {}
  for _, arm in ipairs(arms) do
    local a = timing.arms[arm]
    parts[#parts + 1] = string.format("%s %.0f s (%.2f s/step%s)", arm, a.seconds, a.per_step,
      a.resampled and string.format(", %.0f%% of hook calls resampled", 100 * a.resampled) or "")
  end
  local sfts = {}
  if timing.sft then sfts[#sfts + 1] = string.format("SFT %.0f (final loss %.3f)", timing.sft, timing.sft_loss) end
  if timing.psft then
    sfts[#sfts + 1] = string.format("parallel SFT %.0f (final loss %.3f)", timing.psft, timing.psft_loss)
  end
  print(string.format("seconds: %s; %s; seed total %.0f", table.concat(sfts, "; "), table.concat(parts, "; "),
    timing.total))
  return rows
end)

if #all > 1 and any_sequential then
  print(string.format("\nover %d seeds (%d..%d): mean ± sample sd", #all, o.seed, o.seed + #all - 1))
  for _, line in ipairs(rl.recipe.spread_table { runs = all, rows = ORDER, headers = { COLS[1], COLS[2] },
    label_width = 26, cell_width = 14,
    value = function(rows, r, k) local f = row_of(rows, r.key); return k == 1 and 100 * f.greedy_success or f.turns end,
    fmt = function(k) return k == 1 and "%.1f" or "%.2f" end }) do
    print(line)
  end
end
if #all > 1 and any_parallel then
  print(string.format("\nover %d seeds (%d..%d), %d copies: mean ± sample sd (per copy, any copy, turns, redundant %%)",
    #all, o.seed, o.seed + #all - 1, o.copies))
  local keys = { "greedy_success", "any", "turns", "redundancy" }
  local prows = {}
  for _, r in ipairs(PORDER) do if not r.seq then prows[#prows + 1] = r end end
  for _, line in ipairs(rl.recipe.spread_table { runs = all, rows = prows,
    headers = { PCOLS[1], PCOLS[3], PCOLS[4], PCOLS[5] }, label_width = 26, cell_width = 14,
    value = function(rows, r, k)
      local v = row_of(rows, r.key)[keys[k]]
      return k == 3 and v or 100 * v
    end,
    fmt = function(k) return k == 3 and "%.2f" or "%.1f" end }) do
    print(line)
  end
end
