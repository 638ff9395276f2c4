-- cosearch.lua - CoSearch's joint training of a reasoning agent and a generative document ranker
-- (spec reproductions.md, section 3.2) with rl.multi on kbqa.cosearch: the reasoner searches
-- ("search ann boss") and answers; each search retrieves 4 documents by BM25, which a ranker
-- orders ("rank 3 1 2 4") before the reasoner is shown the first two. One warm start serves every
-- arm: a reasoner and a ranker model (d=64, 2 layers each), SFT on the oracles' play
-- (rl.multi.oracle_examples of kbqa.cosearch{ranker = "policy"}: the reasoner searches each hop,
-- the ranker puts the gold document first half the time and keeps BM25's order otherwise). The
-- arms run the same seed, tasks and steps, and train the reasoner with Dr. MAS's agent-wise GRPO:
--   joint   the ranker is the second policy (agent id 2) and trains too; its rows are grouped by
--           their sub-queries, clustered by byte-trigram Jaccard >= 0.5 across the step's batch
--           (rl.multi.trigram_groups through rl.multi's regroup); its reward 0.5 (gold document
--           ranked first) + 0.5 x the episode's outcome;
--   bm25    no ranker agent: BM25's top two (the fixed ranker);
--   oracle  no ranker agent: the gold document first, then BM25's order (the upper bound).
-- Expected per the paper: joint beats the fixed BM25 ranker and closes part of the gap to the
-- oracle. The table: held-out team success (greedy, 32 questions per hop count) per hop count and
-- over all, how often the held-out searches showed the gold document first (gold1%) and at all
-- (seen%), each arm after its steps and at its start (@0: the warm start with that ranker); for
-- joint the ranker's gold-first rate on the training searches in each third of the steps; the
-- seconds per RL step.
--
--   moonrl run recipes/cosearch.lua [--seed 1] [--seeds 3] [--arms joint,bm25,oracle]
--     [--steps 12] [--tasks 8] [--group 8] [--sft-examples 2000] [--sft-epochs 2]
--     [--eval-tasks 32] [--lr 2e-4] [--demo-gold 0.5] [--threshold 0.5] [--reuse-sft]
--     [--dir runs] [--smoke]
--
-- --smoke: a tiny run for the test. Files go to <dir>/cosearch-<arm>-s<seed>/ and the warm start
-- to <dir>/cosearch-sft-reasoner-s<seed>.bin and <dir>/cosearch-sft-ranker-s<seed>.bin.
local rl = require "moonrl"

local root = os.getenv("MOONRL_ROOT") or "."
package.path = root .. "/?.lua;" .. package.path
local kbqa = require "envs.kbqa"
local R = rl.recipe

local o, why = R.args(arg, { seed = 1, seeds = 1, arms = "joint,bm25,oracle", steps = 12, tasks = 8, group = 8,
  sft_examples = 2000, sft_epochs = 2, eval_tasks = 32, lr = 2e-4, demo_gold = 0.5, threshold = 0.5,
  reuse_sft = false, dir = root .. "/runs", smoke = false })
if not o then error("cosearch.lua: " .. why, 0) end
if o.smoke then
  o.steps, o.tasks, o.group, o.sft_examples, o.sft_epochs, o.eval_tasks = 2, 2, 2, 30, 1, 2
end
if o.steps < 2 then error("cosearch.lua: --steps: at least 2 expected", 0) end
if o.demo_gold < 0 or o.demo_gold > 1 then error("cosearch.lua: --demo-gold: a probability in [0, 1] expected", 0) end
if o.threshold < 0 or o.threshold > 1 then error("cosearch.lua: --threshold: a number in [0, 1] expected", 0) end

local KNOWN = { joint = "policy", bm25 = "bm25", oracle = "oracle" }
local arms = {}
for name in o.arms:gmatch("[^,]+") do
  if not KNOWN[name] then error("cosearch.lua: unknown arm '" .. name .. "' (joint, bm25, oracle)", 0) end
  arms[#arms + 1] = name
end
local HOPS = kbqa.max_hops
local THIRD = math.max(1, -(-o.steps // 3)) -- the ranker's training windows of steps

local function new_model(seed, ctx)
  local tok = rl.tokenizer.bytes()
  return rl.model.new { vocab = tok:vocab_size(), dim = 64, layers = 2, heads = 4, ffn = 192, ctx = ctx,
    seed = seed }, tok
end

local function paths(seed)
  return string.format("%s/cosearch-sft-reasoner-s%d.bin", o.dir, seed),
    string.format("%s/cosearch-sft-ranker-s%d.bin", o.dir, seed)
end

-- The shared warm start: both models SFT on the oracles' play of training questions.
local function warm_start(seed)
  local rpath, kpath = paths(seed)
  local f1, f2 = o.reuse_sft and io.open(rpath, "rb"), o.reuse_sft and io.open(kpath, "rb")
  if f1 then f1:close() end
  if f2 then f2:close() end
  if f1 and f2 then return rpath, { seconds = 0, loss = 0 / 0, examples = 0 } end
  local t0 = rl.clock()
  local reasoner, tok = new_model(seed, 320)
  local ranker = new_model(rl.train.mix(seed, 2), 256)
  local spec = { sft = { examples = o.sft_examples }, tokenizer = tok }
  local data = rl.multi.oracle_examples(kbqa.cosearch { ranker = "policy", demo_gold = o.demo_gold },
    { reasoner = spec, ranker = spec }, rl.train.mix(seed, 0x5EA))
  local r1 = R.warm_start { model = reasoner, data = data.reasoner, epochs = o.sft_epochs, path = rpath,
    seed = rl.train.mix(seed, 0x5F7) }
  local r2 = R.warm_start { model = ranker, data = data.ranker, epochs = o.sft_epochs, path = kpath,
    seed = rl.train.mix(seed, 0x5F8) }
  print(string.format("  ranker SFT: %d examples, final loss %.3f", #data.ranker, r2.final_loss))
  return rpath, { seconds = rl.clock() - t0, loss = r1.final_loss, examples = #data.reasoner }
end

-- Held-out figures from an env's tally of one evaluation: success per hop count and over all,
-- gold-first and gold-seen rates of its searches.
local function figures(t, name)
  local row, wins, eps = { arm = name }, 0, 0
  for h = 1, HOPS do
    local n, w = t["ep" .. h] or 0, t["win" .. h] or 0
    row["h" .. h] = n > 0 and w / n or 0
    wins, eps = wins + w, eps + n
  end
  row.all = eps > 0 and wins / eps or 0
  local ranked = t.ranked or 0
  row.gold1 = ranked > 0 and (t.gold_first or 0) / ranked or 0
  row.seen = ranked > 0 and (t.gold_shown or 0) / ranked or 0
  return row
end

local printed_rate = false

local function run_arm(seed, sft_path, arm)
  local env = kbqa.cosearch { ranker = KNOWN[arm], demo_gold = o.demo_gold }
  local rpath, kpath = paths(seed)
  assert(rpath == sft_path)
  local reasoner, tok = new_model(seed, 320)
  reasoner:load_checkpoint(rpath)
  reasoner:reset_optimizer()
  local agents = { reasoner = { model = reasoner, tokenizer = tok } }
  local regroup
  if arm == "joint" then
    local ranker = new_model(rl.train.mix(seed, 2), 256)
    ranker:load_checkpoint(kpath)
    ranker:reset_optimizer()
    agents.ranker = { model = ranker, tokenizer = tok }
    regroup = { ranker = function(rows)
      local queries = {}
      for j, row in ipairs(rows) do queries[j] = row.given:match("^q: (.-) |") or row.given end
      return rl.multi.trigram_groups(queries, o.threshold)
    end }
  end
  local secs, n, before = 0, 0, nil
  local gold, ranked = {}, {} -- per window of steps: the ranker's gold-first searches, searches
  env.tally = {}
  local result = rl.multi.train {
    env = env, agents = agents, advantage = "drmas", regroup = regroup, name = string.format("cosearch-%s-s%d", arm, seed),
    dir = o.dir, seed = seed, overwrite = true, steps = o.steps, tasks_per_step = o.tasks, group_size = o.group,
    max_rounds = 2 * kbqa.max_turns, max_turn_tokens = 20, temperature = 1.0, lr = o.lr, minibatch = 64,
    clip_low = 0.2, clip_high = 0.28, eval = { every = o.steps, tasks = HOPS * o.eval_tasks, split = "test" },
    trace_episodes = 2,
    on_step = function(step, mt)
      local s = mt["time/step"] - (mt["time/eval"] or 0)
      secs, n = secs + s, n + 1
      if step == 1 then before, env.tally.test = env.tally.test or {}, {} end
      local t, w = env.tally.train or {}, (step - 1) // THIRD + 1
      gold[w], ranked[w] = (gold[w] or 0) + (t.gold_first or 0), (ranked[w] or 0) + (t.ranked or 0)
      env.tally.train = {}
      if not printed_rate then
        printed_rate = true
        print(string.format("  measured: %.2f s per RL step (%s, step %d; %d episodes a step)", s, arm, step,
          o.tasks * o.group))
        io.stdout:flush()
      end
    end,
  }
  local row = figures(env.tally.test or {}, arm)
  assert(math.abs(row.all - result.after["eval/success"]) < 1e-9)
  row.sps = secs / math.max(n, 1)
  if arm == "joint" then
    for w = 1, 3 do row["g" .. w] = (ranked[w] or 0) > 0 and gold[w] / ranked[w] or nil end
  end
  print(string.format("  %-6s %d steps  %.2f s/step  held-out %.1f%%  gold first %.1f%%  seen %.1f%%", arm, o.steps,
    row.sps, 100 * row.all, 100 * row.gold1, 100 * row.seen))
  io.stdout:flush()
  return row, figures(before, arm .. "@0")
end

local function one_seed(seed) return R.arms_of_seed(seed, warm_start, o.sft_epochs, arms, run_arm) end

local function print_table(list, title)
  local w = #list > 1 and 13 or 7
  local function cell(v, scale, fmt) return string.format("%" .. w .. "s", R.pm(v, scale, fmt)) end
  print(string.format("\ncosearch, %s; %d steps of %d questions x %d episodes; ranker groups: trigram Jaccard >= %g; "
    .. "held-out questions, %d per hop count, greedy", title, o.steps, o.tasks, o.group, o.threshold, o.eval_tasks))
  local head = { string.format("%-9s", "arm") }
  for h = 1, HOPS do head[#head + 1] = string.format("%" .. w .. "s", h .. "-hop%") end
  for _, k in ipairs { "all%", "gold1%", "seen%" } do head[#head + 1] = string.format("%" .. w .. "s", k) end
  for k = 1, 3 do
    local lo, hi = (k - 1) * THIRD + 1, math.min(k * THIRD, o.steps)
    head[#head + 1] = string.format("%" .. w .. "s", lo <= hi and string.format("rank%d-%d", lo, hi) or "rank-")
  end
  head[#head + 1] = string.format("%" .. w .. "s", "s/step")
  print(table.concat(head, " "))
  for _, row in ipairs(R.summarise(list, "arm")) do
    local line = { string.format("%-9s", row.arm) }
    for h = 1, HOPS do line[#line + 1] = cell(row["h" .. h]) end
    line[#line + 1] = cell(row.all)
    line[#line + 1] = cell(row.gold1)
    line[#line + 1] = cell(row.seen)
    for k = 1, 3 do line[#line + 1] = cell(row["g" .. k]) end
    line[#line + 1] = cell(row.sps, 1, "%.2f")
    print(table.concat(line, " "))
  end
end

R.report(o.seed, o.seeds, one_seed, print_table)
print("(gold1%, seen%: held-out searches whose shown documents had the gold one first, or at all; rankA-B: the "
  .. "joint ranker's training searches with the gold document first, steps A-B; <arm>@0: before RL)")
