-- synth.lua - task synthesis in a closed loop (rl.synth) on arithmetic word problems
-- (envs/word_problems.lua): the policy proposes tasks, the loop verifies them by Lua execution,
-- calibrates them on the policy's own pass rate, drops near-duplicates and admits the rest into
-- the curriculum's pool, which the policy then trains on.
--
--   moonrl run recipes/synth.lua [closed|target] [seed]
--
-- closed (acceptance test 18): one policy, warm-started on an oracle that writes one-digit
--   operands right and two-digit ones whole only 1 time in 3 (else their ones digit: "12" as
--   "2"), over all six topics and operand ranges (split "wide", never a held-out task), and on
--   demonstrations of proposing; then trained N steps on the seeds' 24 fixed tasks (one-digit
--   operands) only, or on the fixed tasks plus what it synthesises, or (the bound of what
--   training can reach) on 2000 tasks of the held-out kind; held-out success on tasks of all
--   topics and operand ranges (to 15); the proposer's learnability reward 4p(1-p) and the
--   pool's median p over the run. Candidates are calibrated by pass_rate{k = 8, band = {.125,
--   .8}} (the top at the .8 the pool's median is held to) and retired from the pool at >= .8
--   (mastered) or <= .125 (failing) of their last 8 training rollouts.
-- target (acceptance test 19): the same with a weakness injected (the warm start's oracle keeps
--   a negative operand's sign 1 time in 4, so greedy decoding fails every negative at first;
--   two-digit operands are written right), synthesis with and without failure targeting
--   (rl.synth.target): the share of proposals in the failure cluster (a negative operand) in the
--   first 5 loop steps, and held-out success on that cluster.
--
-- Seed 1, 60 steps per arm on 2 shared cores: closed about 4 min, target about 3 min (the tables
-- are in the README, "Task synthesis"). Knobs, for experiments:
-- SYNTH_STEPS (60), SYNTH_WARM (4000 warm-start answers), SYNTH_WARM_SPLIT ("wide"), SYNTH_WIDE
-- (1/3: how often the closed run's warm start writes a two-digit operand whole), SYNTH_KEEP
-- (.25: how often the target run's keeps a negative's sign), SYNTH_LR (5e-4), SYNTH_ENT (0.01),
-- SYNTH_TEMP (the rollout temperature, 1), SYNTH_PT (the proposer's temperature, 1.3),
-- SYNTH_BAND_HI (.8: the calibration band's top), SYNTH_RETIRE (.8), SYNTH_BELOW (.125) and
-- SYNTH_WINDOW (8) (retirement: mastered at >= .8 of the last 8 training rollouts, failing at
-- <= .125), SYNTH_NOLEARN (the proposer does not learn), SYNTH_ONLY (one arm: fixed, synth,
-- synth_target or oracle), SYNTH_CURVES (print the held-out curves), SYNTH_TAG (a suffix of the
-- run folders, for runs side by side).
local rl = require "moonrl"

local root = os.getenv("MOONRL_ROOT") or "."
package.path = root .. "/?.lua;" .. package.path
local wp = require "envs.word_problems"

local mode = arg and arg[1] or "closed"
if mode ~= "closed" and mode ~= "target" then error("synth.lua: the mode is \"closed\" or \"target\", got " .. mode, 0) end
local seed = math.tointeger(tonumber(arg and arg[2] or "")) or 1
local STEPS = math.tointeger(tonumber(os.getenv("SYNTH_STEPS") or "")) or 60
local tok = rl.tokenizer.bytes()

local function new_model()
  return rl.model.new { vocab = tok:vocab_size(), dim = 64, layers = 2, heads = 4, ffn = 192, ctx = 128, seed = seed }
end

local WIDE = tonumber(os.getenv("SYNTH_WIDE") or "") or 1 / 3
local KEEP = tonumber(os.getenv("SYNTH_KEEP") or "") or 0.25
local env = mode == "target" and wp.with { weakness = "negative", keep = KEEP } or wp.with { wide = WIDE }

-- The held-out evaluation: greedy success on 128 tasks of all kinds, and on 64 with a negative
-- first operand (the targeting run's failure cluster).
local function evaluate(ctx, step)
  local out = rl.train.evaluate(ctx, step)
  local e = ctx.cfg.eval
  local neg = env.tasks("test_neg", 64, e.seed)
  local b = ctx.stages.rollout(ctx, { tasks = neg, repeats = 1, seed = rl.train.mix(e.seed, 3), temperature = 0, group_base = 0 })
  local s = 0
  for _, ep in ipairs(b.episodes) do s = s + (ep.success and 1 or 0) end
  out.neg_greedy_success = s / #neg
  return out
end

local function is_negative(task) return task.a < 0 end

local function proposer()
  return rl.synth.proposer { policy = "self", contract = wp.contract, seeds = wp.seeds,
    prompt = "propose like {exemplar}:", group = 2, max_tokens = 10, demos = wp.demo,
    temperature = tonumber(os.getenv("SYNTH_PT") or "") or 1.3,
    learn = os.getenv("SYNTH_NOLEARN") == nil }
end

-- The warm start every arm begins from: SFT on the weak oracle's answers to tasks of split
-- "wide" (all topics and operand ranges, no held-out task), so that what is left to learn is
-- writing two-digit operands whole (closed) or a negative's sign (target), and on
-- demonstrations of proposing (a seed in the prompt, a move from it in the reply).
local function warm_start()
  local m = new_model()
  local t0 = rl.clock()
  local split = os.getenv("SYNTH_WARM_SPLIT") or "wide"
  local warm_env = setmetatable({ tasks = function(_, n, s) return env.tasks(split, n, s) end }, { __index = env })
  local ctx = { cfg = { env = warm_env, max_turns = 1 }, tokenizer = tok }
  local data = rl.train.oracle_examples(ctx, tonumber(os.getenv('SYNTH_WARM') or '') or 4000, rl.train.mix(seed, 1))
  for _, ex in ipairs(proposer():sft_examples(tok, 1500, rl.train.mix(seed, 2))) do data[#data + 1] = ex end
  local r = rl.sft { model = m, data = data, epochs = 3, batch_size = 16, lr = 3e-3, warmup = 10,
    schedule = "cosine", seed = rl.train.mix(seed, 3) }
  return m, { examples = #data, final_loss = r.final_loss, seconds = rl.clock() - t0 }
end
local warm, warm_info = warm_start()

-- One training run: arm "fixed" (the fixed tasks only), "synth" or "synth_target".
local function run(arm)
  local m = warm:clone()
  local base = wp.fixed
  if arm == "oracle" then -- the held-out distribution's kind of task (not its tasks), deduplicated
    base = {}
    local seen = {}
    for _, t in ipairs(env.tasks("wide", 2000, rl.train.mix(seed, 9))) do
      if not seen[wp.key(t)] then seen[wp.key(t)] = true base[#base + 1] = t end
    end
  end
  local cur = rl.curriculum.new { source = rl.curriculum.pool { tasks = base, key = wp.key,
    cell = function(t) return is_negative(t) and "neg" or "pos" end },
    sampler = rl.curriculum.learnability {}, seed = seed }
  local loop = rl.synth.loop {
    propose = proposer(),
    verify = { rl.synth.exec {}, rl.synth.oracle(wp.solve) },
    calibrate = rl.synth.pass_rate { k = 8, band = { 0.125, tonumber(os.getenv("SYNTH_BAND_HI") or "") or 0.8 } },
    novelty = rl.synth.novelty { key = wp.key, numbers = "keep", threshold = 0.95 },
    target = arm == "synth_target" and rl.synth.target { from = cur, by = { "state" } } or nil,
    pool = cur, per_step = 16, every = 1, seed = seed, retire = { above = tonumber(os.getenv("SYNTH_RETIRE") or "") or 0.8, window = math.tointeger(tonumber(os.getenv("SYNTH_WINDOW") or "")) or 8,
      below = tonumber(os.getenv("SYNTH_BELOW") or "") or 0.125 },
  }
  local proposals = {} -- per loop step: how many proposals had a negative first operand
  local t0 = rl.clock()
  local result = rl.train {
    model = m, tokenizer = tok, env = env, name = "synth_" .. mode .. "_" .. arm .. (os.getenv("SYNTH_TAG") or ""), dir = root .. "/runs",
    seed = seed, overwrite = true, progress = false,
    steps = STEPS, tasks_per_step = 16, group_size = 8, minibatch = 64, max_turn_tokens = 8,
    advantage = "grpo", loss = "ppo", clip_high = 0.28, entropy_coef = tonumber(os.getenv("SYNTH_ENT") or "") or 0.01, lr = tonumber(os.getenv("SYNTH_LR") or "") or 5e-4, temperature = tonumber(os.getenv("SYNTH_TEMP") or "") or 1,
    eval = { every = 10, tasks = 128, k = 1, split = "test" }, evaluate = evaluate,
    curriculum = cur, synth = (arm ~= "fixed" and arm ~= "oracle") and loop or nil,
    on_step = function(step)
      if arm ~= "fixed" and arm ~= "oracle" then
        local neg, n = 0, 0
        for _, rec in ipairs(loop.records) do
          if rec.step == loop.t then
            n = n + 1
            if rec.task and is_negative(rec.task) then neg = neg + 1 end
          end
        end
        proposals[step] = n > 0 and neg / n or 0
      end
    end,
  }
  return { result = result, loop = arm ~= "fixed" and loop or nil, proposals = proposals, seconds = rl.clock() - t0 }
end

local function mean(list, from, to)
  local s, n = 0, 0
  for i = from, to do if list[i] then s, n = s + list[i], n + 1 end end
  return n > 0 and s / n or 0
end

local function series(r, key)
  local out = {}
  for _, mt in ipairs(r.result.history) do if mt[key] then out[mt.step] = mt[key] end end
  return out
end

print(string.format("synth (%s): seed %d, %d steps per arm, BLAS %s x%d; warm start: %d examples, loss %.3f, %.0f s",
  mode, seed, STEPS, rl.blas_info().core, rl.blas_info().threads, warm_info.examples, warm_info.final_loss, warm_info.seconds))
if os.getenv("SYNTH_ONLY") then
  local r = run(os.getenv("SYNTH_ONLY"))
  print(string.format("%s: before %.1f%% after %.1f%% (cluster %.1f%% -> %.1f%%), %.0f s", os.getenv("SYNTH_ONLY"),
    100 * r.result.before["eval/greedy_success"], 100 * r.result.after["eval/greedy_success"],
    100 * r.result.before["eval/neg_greedy_success"], 100 * r.result.after["eval/neg_greedy_success"], r.seconds))
elseif mode == "closed" then
  local fixed, synth, oracle = run("fixed"), run("synth"), run("oracle")
  local b, af, as = fixed.result.before, fixed.result.after, synth.result.after
  local rew = series(synth, "synth/reward")
  local med = series(synth, "synth/pool_median_p")
  local q = STEPS // 4
  print(string.format("| run | held-out greedy success | time |\n|---|---|---|"))
  print(string.format("| after the warm start | %.1f%% | |", 100 * b["eval/greedy_success"]))
  print(string.format("| %d steps on the fixed tasks | %.1f%% | %.0f s |", STEPS, 100 * af["eval/greedy_success"], fixed.seconds))
  print(string.format("| %d steps with synthesis | %.1f%% | %.0f s |", STEPS, 100 * as["eval/greedy_success"], synth.seconds))
  print(string.format("| %d steps on tasks of the held-out kind (the bound) | %.1f%% | %.0f s |", STEPS, 100 * oracle.result.after["eval/greedy_success"], oracle.seconds))
  print(string.format("synthesis over fixed: %+.1f points", 100 * (as["eval/greedy_success"] - af["eval/greedy_success"])))
  print(string.format("proposer reward (learnability 4p(1-p), penalties -1 invalid, -0.5 duplicate): first quarter %.3f, last quarter %.3f",
    mean(rew, 1, q), mean(rew, STEPS - q + 1, STEPS)))
  -- the learnability part alone: 4p(1-p) of the proposals that reached calibration, and how
  -- many of all proposals did
  local function part(from, to)
    local s, n, all = 0, 0, 0
    for _, rec in ipairs(synth.loop.records) do
      if rec.step >= from and rec.step <= to then
        all = all + 1
        local c = rec.p and rec.p[1]
        if c and c.source == "calibrate" then s, n = s + 4 * c.p * (1 - c.p), n + 1 end
      end
    end
    return n > 0 and s / n or 0, all > 0 and n / all or 0
  end
  local l1, c1 = part(1, q)
  local l4, c4 = part(STEPS - q + 1, STEPS)
  print(string.format("learnability 4p(1-p) of the calibrated proposals: first quarter %.3f (%.0f%% of proposals calibrated), last quarter %.3f (%.0f%%)",
    l1, 100 * c1, l4, 100 * c4))
  local ms = {}
  for s = 1, STEPS do if med[s] then ms[#ms + 1] = med[s] end end
  local lo, hi, inside = 1, 0, 0
  for _, v in ipairs(ms) do lo, hi = math.min(lo, v), math.max(hi, v) if v >= 0.2 and v <= 0.8 then inside = inside + 1 end end
  print(string.format("pool median p: %d of %d steps in [.2, .8] (range %.2f .. %.2f)", inside, #ms, lo, hi))
  local st = synth.loop:stats()
  print(string.format("loop totals: proposed %d, admitted %d, retired %d, regressed %d, invalid %d, duplicate %d, too easy %d, too hard %d",
    st.proposed, st.admitted, st.retired, st.regressed, st.invalid, st.duplicate, st.too_easy, st.too_hard))
else
  local untargeted, targeted = run("synth"), run("synth_target")
  local function share5(r) return math.max(r.proposals[2] or 0, r.proposals[3] or 0, r.proposals[4] or 0, r.proposals[5] or 0) end
  local b = targeted.result.before
  print("| run | failure-cluster share of proposals, steps 1-5 | held-out success on the cluster | all held-out |\n|---|---|---|---|")
  print(string.format("| after the warm start | | %.1f%% | %.1f%% |", 100 * b["eval/neg_greedy_success"], 100 * b["eval/greedy_success"]))
  for _, e in ipairs { { "untargeted synthesis", untargeted }, { "targeted synthesis", targeted } } do
    local r = e[2]
    local p = {}
    for s = 1, 5 do p[s] = string.format("%.2f", r.proposals[s] or 0) end
    print(string.format("| %s | %s | %.1f%% | %.1f%% |", e[1], table.concat(p, " "), 100 * r.result.after["eval/neg_greedy_success"],
      100 * r.result.after["eval/greedy_success"]))
  end
  -- the cluster's held-out success at every evaluation, and the gain over the warm start
  local cu, ct = series(untargeted, "eval/neg_greedy_success"), series(targeted, "eval/neg_greedy_success")
  local b0 = b["eval/neg_greedy_success"]
  print("\n| step | cluster, untargeted | cluster, targeted | gain ratio (targeted / untargeted) |\n|---|---|---|---|")
  for s = 1, STEPS do
    if cu[s] and ct[s] then
      local gu, gt = cu[s] - b0, ct[s] - b0
      print(string.format("| %d | %.1f%% | %.1f%% | %s |", s, 100 * cu[s], 100 * ct[s],
        gu > 0 and string.format("%.1fx", gt / gu) or (gt > 0 and "untargeted did not improve" or "neither improved")))
    end
  end
  local gu = untargeted.result.after["eval/neg_greedy_success"] - untargeted.result.before["eval/neg_greedy_success"]
  local gt = targeted.result.after["eval/neg_greedy_success"] - targeted.result.before["eval/neg_greedy_success"]
  print(string.format("cluster gain after %d steps: targeted %+.1f points, untargeted %+.1f points; ratio %s; max share in steps 2-5: %.2f",
    STEPS, 100 * gt, 100 * gu, gu > 0 and string.format("%.1fx", gt / gu) or "n/a (untargeted did not improve)", share5(targeted)))
end
if os.getenv("SYNTH_CURVES") then
  for _, name in ipairs { "runs/synth_" .. mode .. "_fixed", "runs/synth_" .. mode .. "_synth", "runs/synth_" .. mode .. "_synth_target" } do
    local f = io.open(root .. "/" .. name .. "/metrics.jsonl")
    if f then
      local line = {}
      for l in f:lines() do
        local mt = rl.json.decode(l)
        if mt["eval/greedy_success"] then line[#line + 1] = string.format("%d:%.2f/%.2f", mt.step, mt["eval/greedy_success"], mt["eval/neg_greedy_success"] or 0) end
      end
      f:close()
      print(name, table.concat(line, " "))
    end
  end
end
