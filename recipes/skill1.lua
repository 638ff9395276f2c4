-- skill1.lua - Skill1 in miniature (spec reproductions.md, section 2.5, "Skill1 variant"): one
-- trainable policy queries a skill repo, picks one of 3 candidates, solves conditioned on it and
-- distils a new skill, on envs/rulebook.lua's skill1 streams (4 doors of one room, all opening to
-- one hidden code letter; a skill "cq" says "in room c try q"; without one, 8 tries from the
-- door's letter on open a door half the time). See rulebook.skill1 for the turns.
--
-- All arms share one SFT start on the imperfect oracle (rulebook.skill1.oracle). A training step
-- takes --streams training streams and runs --group chains of each, every chain with its own copy
-- of the stream's repo: task 1 of every chain (one batched rollout), its distils admitted to the
-- chain's repo, then task 2, ... task 4. The GRPO group of a turn is the --group chains' episodes
-- of the same stream and task, normalised per role (query+pick, solve, distil). Credit:
--
--   solve turns    the task's outcome (1 opened, 0 not)
--   query, pick    the picked skill's success trend: an EMA (rate --rate) of the successes of the
--                  tasks that picked it (per stream and skill text, prior 0.5, this use included;
--                  "no skill" is a key of its own), kept across steps
--   distil         the distilled skill's later success (the next task's outcome when that task
--                  picked it, else 0) minus its trend before that use (the high-frequency part);
--                  task 4's distil has no later task and no credit
--
-- Arms (--arms, trained unless marked): skill1 (all three credits); no_trend (query and pick get
-- the outcome); no_distil (distil gets the outcome); outcome (every turn the outcome: GRPO on the
-- loop); grpo_nomem (outcome-only GRPO with no repo: query answers "none"); and two rows always
-- evaluated: the SFT start with no memory and with the repo. Evaluation: greedy, --eval-streams
-- held-out streams (test seeds), one chain each; success and tries on tasks 2-4, own skills in
-- the repo after task 4, how often the right candidate was picked when offered (tasks 2-4), how
-- often a success was distilled into the right skill (tasks 1-3).
--
-- Two more arms behind --arms, for the two other papers of section 2.5, both outcome-GRPO on the
-- same loop: skillrl (SkillRL: the policy's distils are dropped; after each task a scripted
-- teacher, rulebook.skill1.teach, writes room + the hidden code into the chain's repo when the
-- task failed and its room's validation success, the training success of the room's tasks in
-- earlier steps, is under 0.4, at most 3 skills an update; the teacher also runs in evaluation
-- with the rates frozen; rows "SFT + teacher" and "skillrl, ungated" show the start and the
-- trained policy with the teacher writing for every room, no trigger) and comprl
-- (Complementary RL: the distil turn is the extractor; it gets task t+1's success minus that of
-- a paired rollout of task t+1, same seed, without the entry; rulebook.skill1.comp_credit).
--
--   moonrl run recipes/skill1.lua [--seed 1] [--seeds 1] [--arms skill1,no_distil,outcome,grpo_nomem; also no_trend,
--     skillrl,comprl] [--steps 25] [--streams 4] [--group 4] [--examples 1500] [--epochs 5] [--eval-streams 64]
--     [--rate 0.1] [--lr 3e-4] [--dim 64] [--dir runs] [--reuse-sft] [--smoke]
--   (--reuse-sft: load <dir>/skill1-sft-s<seed>.bin when it exists instead of training it)
local rl = require "moonrl"

local root = os.getenv("MOONRL_ROOT") or "."
package.path = root .. "/?.lua;" .. package.path
local B = require "envs.rulebook"
local S1 = B.skill1
local R = rl.recipe
local mix = rl.train.mix

local o, why = R.args(arg, { seed = 1, seeds = 1, arms = "skill1,no_distil,outcome,grpo_nomem", steps = 25,
  streams = 4, group = 4, examples = 1500, epochs = 5, eval_streams = 64, rate = 0.1, lr = 3e-4, dim = 64,
  dir = root .. "/runs", smoke = false, reuse_sft = false })
if not o then error("skill1.lua: " .. why, 0) end

-- credit[arm] = {trend = selection credited by the trend, distil = distillation by its own credit}
local ARMS = {
  skill1 = { trend = true, distil = true }, no_trend = { trend = false, distil = true },
  no_distil = { trend = true, distil = false }, outcome = { trend = false, distil = false },
  grpo_nomem = { trend = false, distil = false, nomem = true },
  skillrl = { trend = false, distil = false, teacher = true },
  comprl = { trend = false, distil = false, comp = true },
}
local arms = {}
for name in o.arms:gmatch("[^,]+") do
  if not ARMS[name] then error("skill1.lua: --arms: unknown arm '" .. name .. "'", 0) end
  arms[#arms + 1] = name
end
if o.rate <= 0 or o.rate > 1 then error("skill1.lua: --rate: a number in (0, 1] expected", 0) end
if o.smoke then
  o.steps, o.streams, o.group, o.examples, o.epochs, o.eval_streams, o.dim = 2, 2, 4, 64, 1, 8, 32
end

local tok = rl.tokenizer.bytes()
local CTX = 256
local function new_model(seed)
  return rl.model.new { vocab = tok:vocab_size(), dim = o.dim, layers = 2, heads = 4, ffn = 3 * o.dim, ctx = CTX, seed = seed }
end

local function copy(list) return table.move(list, 1, #list, 1, {}) end

local turns_of, info_of = S1.turns_of, S1.info_of

-- Chains: {stream =, s = the stream's number in the step, repo = its own copy} for each of n
-- chains of each stream; task(chain, t) is its task t.
local function chains_of(streams, n)
  local out = {}
  for s, st in ipairs(streams) do
    for _ = 1, n do out[#out + 1] = { stream = st, s = s, repo = copy(st.repo) } end
  end
  return out
end
local function task_of(chain, t, nomem)
  return { room = chain.stream.room, door = chain.stream.doors[t], code = chain.stream.code, repo = copy(chain.repo),
    nomem = nomem }
end

-- Runs tasks 1..4 of every chain: rollout(tasks, t) -> a batch of one episode per task, in order.
-- Each episode's distil joins its chain's repo (not with nomem). With val (SkillRL), the policy's
-- distil is dropped and the teacher updates the chain's repo after each task instead
-- (S1.teach on the task when it failed, with val the rooms' validation success). Returns
-- eps[t][c] and the batches, one a task.
local function run_chains(chains, nomem, rollout, val)
  local eps, batches = {}, {}
  for t = 1, B.TASKS do
    local list = {}
    for c, ch in ipairs(chains) do list[c] = task_of(ch, t, nomem) end
    local b = rollout(list, t)
    eps[t] = b.episodes
    for c, ep in ipairs(b.episodes) do
      if val then
        if not ep.success then S1.teach(chains[c].repo, { ep.task }, val) end
      elseif not nomem then
        S1.admit(chains[c].repo, info_of(ep, "distil").distil)
      end
    end
    batches[t] = b
  end
  return eps, batches
end

-- The advantage stage: S1.normalise's value of each turn on every sampled token of the turn.
local function advantage(_, batch)
  local per = S1.normalise(batch.episodes)
  local adv, per_episode = rl.tensor.zeros(batch.mask:numel()), {}
  local mask, turns = batch.mask, batch.turns
  for i = 1, batch:size() do
    local first, last = batch:range(i)
    local a = per[i]
    for p = first, last do
      if mask:get(p) ~= 0 then adv:set(p, a[math.floor(turns:get(p)) + 1] or 0) end
    end
    per_episode[i] = a[turns_of(batch.episodes[i], "solve")[1] or 0] or 0
  end
  return adv, per_episode
end

-- A greedy rollout of model on tasks (one episode each): the batch.
local function greedy(model, tasks, seed)
  local ro = rl.rollout.new { model = model, episodes = #tasks, capacity = CTX }
  local seeds, groups = {}, {}
  for i = 1, #tasks do seeds[i], groups[i] = mix(seed, i), i end
  local results = ro:run { tokenizer = tok, env = S1, tasks = tasks, seeds = seeds, max_turns = S1.max_turns,
    max_turn_tokens = 10, temperature = 0 }
  local b = rl.batch.from_rollout(ro, results, groups)
  ro:free()
  return b
end

local function train(seed, name, path, pool)
  local cr = ARMS[name]
  local model = new_model(seed)
  assert(model:load_checkpoint(path))
  local trends, secs, n = {}, 0, 0
  -- SkillRL's validation success per room: the training outcomes of the room's tasks up to the
  -- step before (wins / tasks; a room not yet seen counts as 0, so the teacher starts active).
  local seen, won = {}, {}
  local function val_now()
    local v = {}
    for room, k in pairs(seen) do v[room] = won[room] / k end
    return v
  end
  local function tasks(_, _, count, tseed)
    local rng = rl.rng(tseed)
    local list = {}
    for k = 1, count do list[k] = pool[rng:random(#pool)] end
    return list
  end
  local function rollout(ctx, req)
    local chains = chains_of(req.tasks, req.repeats)
    local val = cr.teacher and val_now() or nil
    -- Complementary RL: task t's tasks rolled out again (same seeds) with the repos of task t-1,
    -- before its distils joined them; without[t][c] their successes (not trained on).
    local without, prev = {}, nil
    local eps, batches = run_chains(chains, cr.nomem, function(list, t)
      if cr.comp and prev then
        local cf = {}
        for c, task in ipairs(list) do
          cf[c] = {}
          for k, v in pairs(task) do cf[c][k] = v end
          cf[c].repo = copy(prev[c].repo)
        end
        local cb = rl.train.rollout.run(ctx, { tasks = cf, repeats = 1, seed = mix(req.seed, t),
          temperature = req.temperature, group_base = 0 })
        without[t] = {}
        for c, ep in ipairs(cb.episodes) do without[t][c] = ep.success and true or false end
      end
      prev = list
      local b = rl.train.rollout.run(ctx, { tasks = list, repeats = 1, seed = mix(req.seed, t),
        temperature = req.temperature, group_base = 0 })
      for c, ep in ipairs(b.episodes) do ep.group = req.group_base + (t - 1) * #req.tasks + chains[c].s end
      return b
    end, val)
    if cr.teacher then
      for t = 1, B.TASKS do
        for _, ep in ipairs(eps[t]) do
          local room = ep.task.room
          seen[room], won[room] = (seen[room] or 0) + 1, (won[room] or 0) + (ep.success and 1 or 0)
        end
      end
    end
    local keys = {}
    for c, ch in ipairs(chains) do keys[c] = ch.stream.id end
    if cr.comp then
      -- pairing check: where task t-1's distil was malformed (the repo unchanged), the two
      -- rollouts of task t must agree
      for t = 2, B.TASKS do
        for c, ep in ipairs(eps[t]) do
          if not info_of(eps[t - 1][c], "distil").distil and without[t][c] ~= (ep.success and true or false) then
            error("skill1.lua: comprl: the paired rollout of an unchanged repo differs", 0)
          end
        end
      end
      S1.comp_credit(eps, without)
    else
      S1.credit(eps, keys, { trend = cr.trend, distil = cr.distil, rate = o.rate }, trends)
    end
    return rl.batch.concat(batches)
  end
  rl.train {
    model = model, tokenizer = tok, env = S1, name = string.format("skill1-%s-s%d", name, seed), dir = o.dir,
    seed = seed, steps = o.steps, tasks_per_step = o.streams, group_size = o.group, minibatch = 64,
    max_turn_tokens = 10, max_turns = S1.max_turns, advantage = advantage, loss = "ppo", clip_high = 0.28,
    lr = o.lr, tasks = tasks, rollout = rollout, eval = false, overwrite = true, checkpoint_every = o.steps,
    on_step = function(_, mt) secs, n = secs + mt["time/step"], n + 1 end,
  }
  return model, secs / math.max(n, 1), cr.teacher and val_now() or nil
end

-- Greedy evaluation on held-out streams, one chain each.
-- With val, the teacher updates the repos as in training (SkillRL), val frozen.
local function evaluate(model, streams, nomem, seed, val)
  local chains = chains_of(streams, 1)
  local eps = run_chains(chains, nomem, function(list, t) return greedy(model, list, mix(seed, t)) end, val)
  local m = { success = 0, tries = 0, n = 0, repo = 0, offered = 0, right_pick = 0, wins = 0, right_distil = 0 }
  for t = 1, B.TASKS do
    for c, ch in ipairs(chains) do
      local ep, right = eps[t][c], B.letter(ch.stream.code)
      if t > 1 then
        m.success, m.tries, m.n = m.success + (ep.success and 1 or 0), m.tries + #turns_of(ep, "solve"), m.n + 1
        local offered = false
        for _, c2 in ipairs(S1.candidates(ep.task.repo, { B.letter(ch.stream.room) })) do
          if c2:sub(2, 2) == right then offered = true end
        end
        local picked = info_of(ep, "pick").picked
        if offered and not nomem then
          m.offered = m.offered + 1
          if picked and picked:sub(2, 2) == right then m.right_pick = m.right_pick + 1 end
        end
      end
      if t < B.TASKS and ep.success then
        m.wins = m.wins + 1
        if info_of(ep, "distil").distil == B.letter(ch.stream.room) .. right then m.right_distil = m.right_distil + 1 end
      end
    end
  end
  for _, ch in ipairs(chains) do m.repo = m.repo + #ch.repo - #ch.stream.repo end
  local function share(a, b) return b > 0 and a / b or 0 end
  return { success = m.success / m.n, tries = m.tries / m.n, repo = m.repo / #chains,
    pick = share(m.right_pick, m.offered), distil = share(m.right_distil, m.wins) }
end

local function one_seed(seed)
  local t0 = rl.clock()
  local path = string.format("%s/skill1-sft-s%d.bin", o.dir, seed)
  local sft_m = new_model(seed)
  local f = o.reuse_sft and io.open(path, "rb")
  local sft
  if f then
    f:close()
    assert(sft_m:load_checkpoint(path))
  end
  sft = f and { final_loss = 0 / 0 } or R.warm_start { model = sft_m, epochs = o.epochs, path = path, seed = mix(seed, 0x5F7),
    data = rl.train.oracle_examples({ cfg = { env = S1, max_turns = S1.max_turns }, tokenizer = tok }, o.examples,
      mix(seed, 0xF7)) }
  local sft_s = rl.clock() - t0
  local pool = S1.streams("train", 4096, seed)
  for i, st in ipairs(pool) do st.id = i end
  local held = S1.streams("test", o.eval_streams, 4242)
  local rows = {}
  local function row(label, model, nomem, sps, val)
    local r = evaluate(model, held, nomem, 7, val)
    r.label, r.sps = label, sps or 0
    rows[#rows + 1] = r
  end
  row("SFT, no memory", sft_m, true)
  row("SFT + repo", sft_m, false)
  for _, name in ipairs(arms) do
    if ARMS[name].teacher then row("SFT + teacher", sft_m, false, 0, {}) end
  end
  for _, name in ipairs(arms) do
    local m, sps, val = train(seed, name, path, pool)
    row(name, m, ARMS[name].nomem, sps, val)
    -- the same policy with the teacher writing for every room (no trigger)
    if ARMS[name].teacher then row(name .. ", ungated", m, false, sps, {}) end
  end
  if f then
    print(string.format("seed %d: SFT reused %s; total %.1f s", seed, path, rl.clock() - t0))
  else
    print(string.format("seed %d: SFT %d examples x %d epochs, loss %.3f, %.1f s; total %.1f s", seed, o.examples,
      o.epochs, sft.final_loss, sft_s, rl.clock() - t0))
  end
  return rows
end

local function print_table(runs, title)
  print(string.format("\nskill1 (%s): %d held-out streams, tasks 2-4; RL %d steps x %d streams x %d chains x %d tasks",
    title, o.eval_streams, o.steps, o.streams, o.group, B.TASKS))
  local lines = R.spread_table { runs = runs, rows = runs[1], label = "arm", cell_width = 13,
    headers = { "success 2-4 %", "tries 2-4", "own skills", "pick right %", "distil ok %", "s/step" },
    value = function(run, row, k)
      local r
      for _, x in ipairs(run) do if x.label == row.label then r = x end end
      return ({ 100 * r.success, r.tries, r.repo, 100 * r.pick, 100 * r.distil, r.sps })[k]
    end, fmt = function(k) return (k == 2 or k == 3 or k == 6) and "%.2f" or "%.1f" end }
  for _, l in ipairs(lines) do print(l) end
end

R.report(o.seed, o.seeds, one_seed, print_table)
