-- ledger.lua - UMA's Task-Stratified GRPO on envs/ledger.lua (Ledger-QA; spec reproductions.md
-- section 3.3): one policy keeps a structured memory bank over a stream of account updates
-- ("ann +5" -> "set ann 5"; "bob x" -> "del bob") and answers questions from the bank alone
-- (a QA episode's prompt is the bank and the question; the updates are not in it).
--
-- A training step rolls out tasks x group memory episodes of training streams (3..8 updates),
-- then, from each memory state (the bank after each op), QA episodes: the account the op was
-- about, and after the last op every account of the stream, qa_k samples of each. Every arm sees
-- these same rollouts; they differ in the advantage:
--   outcome     GRPO with one normalisation: an episode's outcome is the accuracy of the QA
--               episodes from its final bank plus its format terms (-0.1 a malformed op),
--               normalised over the stream's group; every token of the episode and of all the
--               QA episodes branching from it gets that one advantage.
--   stratified  Task-Stratified GRPO: op t's value is the mean reward of the QA episodes from
--               the memory state it made (plus its format term), normalised over the group's
--               episodes at the same op (the memory groups); each QA episode's reward is
--               normalised over the qa_k samples of its own question from its own bank (the
--               per-question QA groups).
--   guideline   MemCoE's second stage: outcome's advantage, plus on each op a structured process
--               reward from a fixed memory guideline (envs/ledger.lua M.guideline: set the
--               updated account to its running total, delete a closed account, never delete an
--               open one; each op scores 1, 0 or -1, M.guideline_score), centred over the group's
--               ops at the same position and weighted --guideline-weight (0.5) [chosen].
-- Every arm: PPO clip 0.2 / 0.28, lr 2e-4 (at 5e-4 both arms fell below the SFT start on every
-- column in 40 steps), 40 steps of 8 streams x 4 episodes, qa_k = 2, temperature 1.
-- One SFT warm start on the demonstrator (each op right with probability 0.85, else it forgets
-- the update) is shared by the arms. Measured greedily on held-out streams of 4 and of 8
-- updates: QA accuracy (one question per account, from the final bank), op accuracy (the op
-- left the updated account equal to the true ledger), bank accuracy (the final bank equals the
-- true ledger) and, on the 8-update streams, the ops that follow the guideline (score 1).
--
--   moonrl run recipes/ledger.lua [--seed 1] [--seeds 3] [--arms outcome,stratified,guideline]
--     [--steps 40] [--tasks 8] [--group 4] [--qa-k 2] [--lr 2e-4] [--guideline-weight 0.5]
--     [--sft-examples 3000] [--sft-epochs 3]
--     [--eval-tasks 64] [--reuse-sft] [--dir runs] [--smoke]
--
-- --reuse-sft loads <dir>/ledger-sft-s<seed>.bin when it exists instead of training it again (the
-- same seed and SFT options give the same file).
-- Files go to <dir>/ledger-<arm>-s<seed>/ and the warm start to <dir>/ledger-sft-s<seed>.bin.
local rl = require "moonrl"

local root = os.getenv("MOONRL_ROOT") or "."
package.path = root .. "/?.lua;" .. package.path
local ledger = require "envs.ledger"
local R = rl.recipe

local o, why = R.args(arg, { seed = 1, seeds = 1, arms = "outcome,stratified,guideline", steps = 40, tasks = 8,
  group = 4, qa_k = 2, lr = 2e-4, guideline_weight = 0.5, sft_examples = 3000, sft_epochs = 3, eval_tasks = 64,
  reuse_sft = false, dir = root .. "/runs", smoke = false })
if not o then error("ledger.lua: " .. why, 0) end
if o.smoke then
  o.steps, o.tasks, o.group, o.qa_k, o.sft_examples, o.sft_epochs, o.eval_tasks = 2, 2, 2, 2, 60, 1, 6
end
if o.guideline_weight < 0 then error("ledger.lua: --guideline-weight: a number >= 0 expected", 0) end
local KNOWN = { outcome = true, stratified = true, guideline = true }
local ARMS = {}
for name in o.arms:gmatch("[^,]+") do
  if not KNOWN[name] then error("ledger.lua: --arms: unknown arm '" .. name .. "' (outcome, stratified, guideline)", 0) end
  ARMS[#ARMS + 1] = name
end

local CTX, QA_CTX, LENS = 256, 64, { 4, 8 }
local tok = rl.tokenizer.bytes()
local function new_model(seed)
  return rl.model.new { vocab = tok:vocab_size(), dim = 64, layers = 2, heads = 4, ffn = 192, ctx = CTX, seed = seed }
end

local HELD = {}
for _, len in ipairs(LENS) do HELD[len] = ledger.tasks("test", o.eval_tasks, 4242 + len, { len = len }) end

-- A view of ctx whose rollout engine is one of `key` with room for n episodes of capacity cap.
local function engine(ctx, key, n, cap)
  local e = ctx[key]
  if not e or e.n < n then
    if e then e.ro:free() end
    e = { ro = rl.rollout.new { model = ctx.model, episodes = n, capacity = cap }, n = n }
    ctx[key] = e
  end
  return setmetatable({ ro = e.ro }, { __index = ctx })
end

-- The rollout stage: the memory episodes, then their QA branches (qa_k each), in one batch.
local function rollout(ctx, req)
  local mem = rl.train.rollout.run(ctx, req)
  local qa = ledger.branches(mem.episodes)
  local qctx = engine(ctx, "qa_engine", #qa * o.qa_k, QA_CTX)
  local b = rl.train.rollout.run(qctx, { tasks = qa, repeats = o.qa_k, seed = rl.train.mix(req.seed, 0x0A),
    temperature = req.temperature, group_base = req.group_base + 50000 })
  local all = rl.batch.concat { mem, b }
  all.n_memory = mem:size()
  return all
end

-- The batch's memory episodes and QA episodes as ledger.credit takes them.
local function split(batch)
  local memory, qa = {}, {}
  for i = 1, batch:size() do
    local ep = batch.episodes[i]
    if i <= batch.n_memory then memory[i] = ep else qa[#qa + 1] = ep end
  end
  return memory, qa
end

local function mean(list)
  local s = 0
  for _, v in ipairs(list) do s = s + v end
  return #list > 0 and s / #list or 0
end

-- The reward stage: a memory episode's reward is its outcome (final QA accuracy + format terms),
-- a QA episode's its correctness.
local function reward(_, batch)
  local memory, qa = split(batch)
  local fmt, all, rule = {}, {}, {}
  for i, ep in ipairs(memory) do
    fmt[i] = ep.reward
    for _, rec in ipairs(ep.record) do rule[#rule + 1] = ledger.op_score(rec) end
  end
  for j, q in ipairs(qa) do all[j] = q.reward end
  local out = ledger.outcomes(memory, qa)
  for i, ep in ipairs(memory) do ep.reward = out[i] end
  return { qa_final = mean(out) - mean(fmt), qa_all = mean(all), format = mean(fmt), guideline = mean(rule) }
end

-- The advantage stage of an arm: ledger.credit's per-turn values on the sampled tokens.
local function advantage(kind)
  return function(_, batch)
    local memory, qa = split(batch)
    local turn_adv, qa_adv = ledger.credit(kind, memory, qa, o.guideline_weight)
    local adv, per = rl.tensor.zeros(batch.mask:numel()), {}
    for i = 1, batch:size() do
      local first, last = batch:range(i)
      local s, n = 0, 0
      for p = first, last do
        if batch.mask:get(p) ~= 0 then
          local a
          if i <= batch.n_memory then a = turn_adv[i][batch.turns:get(p) + 1] or 0 else a = qa_adv[i - batch.n_memory] end
          adv:set(p, a)
          s, n = s + a, n + 1
        end
      end
      per[i] = n > 0 and s / n or 0
    end
    return adv, per
  end
end

-- The update stage: the memory episodes and the QA episodes as two updates (one AdamW step
-- each), so that a minibatch is not right-padded to the memory episodes' length for hundreds of
-- short QA episodes. The metrics are the two updates' means.
local function update(ctx, batch, adv, step)
  local out, parts = {}, 0
  for _, list in ipairs { { 1, batch.n_memory }, { batch.n_memory + 1, batch:size() } } do
    if list[2] >= list[1] then
      local idx, total = {}, 0
      for i = list[1], list[2] do
        idx[#idx + 1] = i
        total = total + batch.offsets[i + 1] - batch.offsets[i]
      end
      local sub = batch:select(idx)
      local a, at = rl.tensor.zeros(math.max(total, 1)):narrow(1, 1, total), 0
      for _, i in ipairs(idx) do
        local len = batch.offsets[i + 1] - batch.offsets[i]
        a:narrow(1, at + 1, len):copy(adv:narrow(1, batch.offsets[i] + 1, len))
        at = at + len
      end
      parts = parts + 1
      for k, v in pairs(rl.train.update.run(ctx, sub, a, step)) do
        if type(v) == "number" then out[k] = (out[k] or 0) + v end
      end
    end
  end
  for k, v in pairs(out) do out[k] = v / parts end
  return out
end

local ADVANTAGE = { outcome = advantage("outcome"), stratified = advantage("stratified"),
  guideline = advantage("guideline") }

-- Greedy held-out figures on the streams of each length: qa<len>, ops<len>, bank<len>, rule<len>
-- (the ops whose guideline score is 1).
local function evaluate(ctx)
  local out = {}
  for _, len in ipairs(LENS) do
    local tasks = HELD[len]
    local ectx = engine(ctx, "eval_engine", #tasks, CTX)
    local mem = rl.train.rollout.run(ectx, { tasks = tasks, repeats = 1, seed = 4242, temperature = 0, group_base = 0 })
    local ok, ops, banks, qa, rule = 0, 0, 0, {}, 0
    for i, ep in ipairs(mem.episodes) do
      local last
      for _, rec in ipairs(ep.record) do
        if type(rec.info) == "table" and rec.info.bank then
          ops, last = ops + (rec.info.op_ok and 1 or 0), rec.info
          rule = rule + (rec.info.guideline == 1 and 1 or 0)
        end
      end
      if last and ep.turns == len and last.bank == last.truth then banks = banks + 1 end
      for _, name in ipairs(tasks[i].names) do
        -- an episode cut short answers from the bank it reached (empty when none)
        qa[#qa + 1] = ledger.qa_task(last and last.bank or "empty", ledger.bank_text(ledger.truth(tasks[i])), name)
      end
    end
    local qctx = engine(ctx, "qa_eval_engine", #qa, QA_CTX)
    local b = rl.train.rollout.run(qctx, { tasks = qa, repeats = 1, seed = 4243, temperature = 0, group_base = 0 })
    for _, ep in ipairs(b.episodes) do ok = ok + (ep.success and 1 or 0) end
    out["qa" .. len], out["ops" .. len], out["bank" .. len] = ok / #qa, ops / (#tasks * len), banks / #tasks
    out["rule" .. len] = rule / (#tasks * len)
  end
  return out
end

-- The demonstrator's figures on the same held-out streams (its QA answered from its own bank).
local function scripted(policy)
  local out = {}
  for _, len in ipairs(LENS) do
    local ok, ops, banks, n, rule = 0, 0, 0, 0, 0
    for i, t in ipairs(HELD[len]) do
      local inst = ledger.new()
      inst:reset(t)
      local info
      for _, a in ipairs(policy(t, rl.rng(rl.train.mix(99, len, i)))) do
        _, _, _, info = inst:step(a)
        ops = ops + (info.op_ok and 1 or 0)
        rule = rule + (info.guideline == 1 and 1 or 0)
      end
      if info.bank == info.truth then banks = banks + 1 end
      for _, name in ipairs(t.names) do
        local q = ledger.qa_task(info.bank, info.truth, name)
        ok, n = ok + ((ledger.lookup(q.bank, name) or "none") == q.answer and 1 or 0), n + 1
      end
    end
    out["qa" .. len], out["ops" .. len], out["bank" .. len] = ok / n, ops / (#HELD[len] * len), banks / #HELD[len]
    out["rule" .. len] = rule / (#HELD[len] * len)
  end
  return out
end
local DEMO = scripted(ledger.oracle)

local function warm_start(seed)
  local t0 = rl.clock()
  local path = string.format("%s/ledger-sft-s%d.bin", o.dir, seed)
  local f = o.reuse_sft and io.open(path, "rb")
  if f then
    f:close()
    return path, { seconds = 0, loss = 0 / 0, examples = 0 }
  end
  local ctx = { cfg = { env = ledger, max_turns = ledger.max_turns }, tokenizer = tok }
  local data = rl.train.oracle_examples(ctx, o.sft_examples, rl.train.mix(seed, 0x5EA))
  local r = R.warm_start { model = new_model(seed), data = data, epochs = o.sft_epochs, path = path,
    seed = rl.train.mix(seed, 0x5F7) }
  return path, { seconds = rl.clock() - t0, loss = r.final_loss, examples = #data }
end

local printed = false

local function run_arm(seed, path, arm)
  local m = new_model(seed)
  assert(m:load_checkpoint(path))
  m:reset_optimizer()
  local secs, n, qa_ep = 0, 0, 0
  local t0 = rl.clock()
  local result = rl.train {
    model = m, tokenizer = tok, env = ledger, name = string.format("ledger-%s-s%d", arm, seed), dir = o.dir,
    seed = seed, overwrite = true, steps = o.steps, tasks_per_step = o.tasks, group_size = o.group,
    max_turns = ledger.max_turns, max_turn_tokens = 12, minibatch = 4096, epochs = 1, temperature = 1,
    loss = "ppo", clip_low = 0.2, clip_high = 0.28, lr = o.lr, progress = false, log_episodes = 2,
    tasks = function(_, _, k, s) return ledger.tasks("train", k, s, { kind = "memory" }) end,
    rollout = rollout, reward = reward, advantage = ADVANTAGE[arm], update = update, evaluate = evaluate,
    eval = { every = o.steps, tasks = 1, k = 1 },
    on_step = function(step, mt)
      local s = mt["time/step"] - (mt["time/eval"] or 0)
      secs, n = secs + s, n + 1
      if not printed then
        printed = true
        print(string.format("  measured: %.2f s per RL step (%s, step %d; %d memory episodes a step + QA branches)",
          s, arm, step, o.tasks * o.group))
        io.stdout:flush()
      end
    end,
  }
  local row = { arm = arm, sps = secs / math.max(n, 1), before = result.before }
  for _, len in ipairs(LENS) do
    for _, f in ipairs { "qa", "ops", "bank", "rule" } do row[f .. len] = result.after["eval/" .. f .. len] end
  end
  print(string.format("  %-10s %d steps  %.2f s/step  %.0f s  held-out QA %.1f%% (4) %.1f%% (8)", arm, o.steps,
    row.sps, rl.clock() - t0, 100 * row.qa4, 100 * row.qa8))
  io.stdout:flush()
  return row
end

local COLS = { "qa4", "qa8", "ops4", "ops8", "bank4", "bank8", "rule8" }

local function one_seed(seed)
  local t0 = rl.clock()
  local path, sft = R.announced_start(seed, warm_start, o.sft_epochs)
  local rows, sft_row = {}, { arm = "SFT" }
  for i, arm in ipairs(ARMS) do
    rows[i] = run_arm(seed, path, arm)
    if i == 1 then
      for _, c in ipairs(COLS) do sft_row[c] = rows[i].before["eval/" .. c] end
    end
    rows[i].before = nil
  end
  table.insert(rows, 1, sft_row)
  local demo = { arm = "demonstrator" }
  for _, c in ipairs(COLS) do demo[c] = DEMO[c] end
  rows[#rows + 1] = demo
  print(string.format("seed %d: %.0f s", seed, rl.clock() - t0))
  return rows
end

local function print_table(list, title)
  local w = #list > 1 and 12 or 7
  print(string.format("\nledger, %s; %d steps of %d streams x %d episodes (+ %d QA samples per question); "
    .. "held-out streams, %d per length, greedy", title, o.steps, o.tasks, o.group, o.qa_k, o.eval_tasks))
  local head = { string.format("%-13s", "arm") }
  for _, c in ipairs(COLS) do head[#head + 1] = string.format("%" .. w .. "s", c .. "%") end
  head[#head + 1] = string.format("%7s", "s/step")
  print(table.concat(head, " "))
  for _, r in ipairs(R.summarise(list, "arm")) do
    local line = { string.format("%-13s", r.arm) }
    for _, c in ipairs(COLS) do line[#line + 1] = string.format("%" .. w .. "s", R.pm(r[c])) end
    local s = type(r.sps) == "table" and r.sps.mean or r.sps
    line[#line + 1] = string.format("%7s", s and string.format("%.2f", s) or "-")
    print(table.concat(line, " "))
  end
end

local t_all = rl.clock()
R.report(o.seed, o.seeds, one_seed, print_table)
print(string.format("(qaN: held-out QA accuracy from the final bank on streams of N updates; opsN: ops that left the "
  .. "updated account right; bankN: final banks equal to the true ledger; rule8: ops on 8-update streams that "
  .. "follow the memory guideline; s/step: seconds per RL step, eval "
  .. "excluded; %.0f s in all)", rl.clock() - t_all))
