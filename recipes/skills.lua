-- skills.lua - skill libraries in miniature (spec reproductions.md, section 2.5: SkillOS) on
-- envs/rulebook.lua: streams of 4 doors governed by one hidden rule; a frozen executor opens a
-- door in 1 try with the right `skill: +k` line, and explores (about half the time out of its 8
-- tries) without.
--
-- One executor is SFT'd on its oracle (reads skill lines, else explores) and then frozen. The
-- curator (a second policy) is SFT'd on its imperfect oracle and trained with GRPO by rl.train
-- on its own one-turn environment (rulebook.curator): after task i of a training stream (rule
-- families 1-6) it sees the repo and task i's compressed trajectory and emits one operation; the
-- recipe's reward stage runs the frozen executor greedily on tasks i+1..min(i+3, 4) of the same
-- stream with the repo after that operation, and the curator's reward is their mean success +
-- 0.1 x (1 - mean turns / 8) - 0.05 per repo entry (- 0.1 for a malformed operation, which leaves
-- the repo as it was); the GRPO group is the --group samples made after the same task i.
--
-- Arms, evaluated greedily on held-out streams (test seeds; families 1-6, and families 7-8 that
-- the curator never saw): none (no memory); raw (the last trajectory in the prompt); heuristic
-- (after a success, add the letter that opened the door); curator SFT (the curator's start);
-- curator RL (SkillOS); oracle (adds the implied rule: an upper bound); and the RL curator and
-- no memory with a second executor (another seed, --dim2 wide) for the executor swap.
-- Metric: success on tasks 2-4, tries per task on tasks 2-4, repo size after task 4.
--
--   moonrl run recipes/skills.lua [--seed 1] [--seeds 3] [--steps 20] [--streams 6] [--group 8]
--     [--exec-examples 3000] [--exec-epochs 2] [--cur-examples 2000] [--cur-epochs 2]
--     [--eval-streams 64] [--lr 1e-3] [--dim 64] [--dim2 48] [--dir runs] [--smoke]
local rl = require "moonrl"

local root = os.getenv("MOONRL_ROOT") or "."
package.path = root .. "/?.lua;" .. package.path
local B = require "envs.rulebook"
local C = B.curator
local R = rl.recipe

local o, why = R.args(arg, { seed = 1, seeds = 1, steps = 20, streams = 6, group = 8, exec_examples = 3000,
  exec_epochs = 2, cur_examples = 2000, cur_epochs = 2, eval_streams = 64, lr = 1e-3, dim = 64, dim2 = 48,
  dir = root .. "/runs", smoke = false })
if not o then error("skills.lua: " .. why, 0) end
if o.smoke then
  o.steps, o.streams, o.group, o.exec_examples, o.exec_epochs, o.cur_examples, o.cur_epochs, o.eval_streams =
    2, 2, 4, 64, 1, 32, 1, 8
  o.dim, o.dim2 = 32, 32
end

local tok = rl.tokenizer.bytes()
local function new_model(seed, dim)
  return rl.model.new { vocab = tok:vocab_size(), dim = dim, layers = 2, heads = 4, ffn = 3 * dim, ctx = 256, seed = seed }
end

-- Greedy (or sampled) episodes of model on env's tasks: the rl.batch.
local function run(model, env, tasks, turns, turn_tokens, seed, temperature)
  if #tasks == 0 then return { episodes = {} } end
  local ro = rl.rollout.new { model = model, episodes = #tasks, capacity = 256 }
  local seeds, groups = {}, {}
  for i = 1, #tasks do seeds[i], groups[i] = rl.train.mix(seed, i), i end
  local results = ro:run { tokenizer = tok, env = env, tasks = tasks, seeds = seeds, max_turns = turns,
    max_turn_tokens = turn_tokens, temperature = temperature or 0 }
  local b = rl.batch.from_rollout(ro, results, groups)
  ro:free()
  return b
end

-- The frozen executor, greedy, with a cache: the outcome of a prompt never changes.
local function executor(model)
  local cache = {}
  return function(tasks)
    local keys, todo, out = {}, {}, {}
    for i, t in ipairs(tasks) do
      keys[i] = B.prompt(t) .. "|" .. t.rule
      if not cache[keys[i]] and not todo[keys[i]] then todo[keys[i]] = t; todo[#todo + 1] = keys[i] end
    end
    local list = {}
    for k, key in ipairs(todo) do list[k] = todo[key] end
    local b = run(model, B, list, B.max_turns, 6, 99)
    for k, ep in ipairs(b.episodes) do
      local tried, ok, turns = B.outcome(ep)
      cache[todo[k]] = { tried = tried, success = ok, turns = turns }
    end
    for i = 1, #tasks do out[i] = cache[keys[i]] end
    return out
  end
end

local function sft(env, turns, n, epochs, seed, dim, path)
  local m = new_model(seed, dim)
  local ctx = { cfg = { env = env, max_turns = turns }, tokenizer = tok }
  local data = rl.train.oracle_examples(ctx, n, rl.train.mix(seed, 0xF7))
  local t0 = rl.clock()
  local r = R.warm_start { model = m, data = data, epochs = epochs, path = path, seed = rl.train.mix(seed, 0x5F7) }
  return m, { seconds = rl.clock() - t0, loss = r.final_loss }
end

local function action_of(ep) return ep.record and ep.record[1] and ep.record[1].action or "" end

-- The curator's reward of the operation op after task i of stream s (repo before it: repo).
local function reward_of(exec, s, i, repo, op)
  local new, bad = B.apply(repo, op)
  new = new or repo
  local tasks = {}
  for t = i + 1, math.min(i + 3, B.TASKS) do tasks[#tasks + 1] = B.task(s.rule, s.doors[t], new) end
  return tasks, new, bad
end

local function train_curator(seed, exec, cur_path)
  local model = new_model(seed, o.dim)
  assert(model:load_checkpoint(cur_path))
  local pool = B.streams("train", 4096, seed, B.TRAIN_FAMILIES)
  local secs, n = 0, 0
  local function tasks(ctx, step, count, tseed)
    local rng = rl.rng(tseed)
    local list, etasks = {}, {}
    for k = 1, count do
      local s = pool[rng:random(#pool)]
      local i = rng:random(B.TASKS - 1)
      local repo, r = {}, rng:random()
      if i > 1 and r < 0.4 then repo[1] = B.skill(s.rule)
      elseif i > 1 and r < 0.7 then repo[1] = B.skill(rng:random(8)) end
      list[k] = { stream = s, i = i, repo = repo }
      etasks[k] = B.task(s.rule, s.doors[i], repo)
    end
    for k, out in ipairs(exec(etasks)) do
      list[k].traj = B.trajectory(list[k].stream.doors[list[k].i], out.tried, out.success)
    end
    return list
  end
  local function reward(ctx, batch)
    local all, spans, news, bads = {}, {}, {}, {}
    for e, ep in ipairs(batch.episodes) do
      local t = ep.task
      local tl, new, bad = reward_of(exec, t.stream, t.i, t.repo, action_of(ep))
      spans[e] = { #all + 1, #all + #tl }
      news[e], bads[e] = new, bad
      for _, x in ipairs(tl) do all[#all + 1] = x end
    end
    local outs = exec(all)
    local m = { exec_success = 0, repo = 0, malformed = 0 }
    for e, ep in ipairs(batch.episodes) do
      local succ, turns, k = 0, 0, 0
      for j = spans[e][1], spans[e][2] do
        succ, turns, k = succ + (outs[j].success and 1 or 0), turns + outs[j].turns, k + 1
      end
      succ, turns = succ / k, turns / k
      ep.reward = succ + 0.1 * (1 - turns / B.max_turns) - 0.05 * #news[e] - (bads[e] and 0.1 or 0)
      ep.env_reward = ep.reward
      m.exec_success, m.repo = m.exec_success + succ, m.repo + #news[e]
      m.malformed = m.malformed + (bads[e] and 1 or 0)
    end
    local nep = #batch.episodes
    for k, v in pairs(m) do m[k] = v / nep end
    return m
  end
  rl.train {
    model = model, tokenizer = tok, env = C, name = string.format("skills-curator-s%d", seed), dir = o.dir,
    seed = seed, steps = o.steps, tasks_per_step = o.streams * (B.TASKS - 1), group_size = o.group,
    minibatch = 48, max_turn_tokens = 10, max_turns = 1, advantage = "grpo", loss = "ppo", clip_high = 0.28,
    lr = o.lr, tasks = tasks, reward = reward, eval = false, overwrite = true, checkpoint_every = o.steps,
    on_step = function(_, mt) secs, n = secs + mt["time/step"], n + 1 end,
  }
  return model, secs / math.max(n, 1)
end

-- The curators compared: policy(streams, t, outs, repos, lasts) updates repos / lasts in place.
local function oracle_op(repo, traj)
  local door, tried, ok = traj:match("^(%a)>(%a*)([!.])$")
  if ok ~= "!" then return "none" end
  local right = "+" .. ((B.index(tried:sub(-1)) - B.index(door)) % B.LETTERS)
  for _, s in ipairs(repo) do if s == right then return "none" end end
  return #repo >= B.MAX_REPO and ("upd 1 " .. right) or ("add " .. right)
end

local function policies(cur_sft, cur_rl)
  local function by_model(model)
    return function(state, trajs)
      local ts = {}
      for k, tr in ipairs(trajs) do ts[k] = { repo = state.repos[k], traj = tr } end
      local b = run(model, C, ts, 1, 10, 7)
      for k, ep in ipairs(b.episodes) do
        state.repos[k] = B.apply(state.repos[k], action_of(ep)) or state.repos[k]
      end
    end
  end
  return {
    none = function() end,
    raw = function(state, trajs) for k, tr in ipairs(trajs) do state.lasts[k] = tr:sub(1, 24) end end,
    heuristic = function(state, trajs)
      for k, tr in ipairs(trajs) do
        if tr:sub(-1) == "!" then
          local repo = state.repos[k]
          if #repo >= B.MAX_REPO then table.remove(repo, 1) end
          repo[#repo + 1] = tr:sub(-2, -2)
        end
      end
    end,
    curator_sft = by_model(cur_sft),
    curator_rl = by_model(cur_rl),
    oracle = function(state, trajs)
      for k, tr in ipairs(trajs) do state.repos[k] = B.apply(state.repos[k], oracle_op(state.repos[k], tr)) end
    end,
  }
end

local function evaluate(exec, policy, streams)
  local state = { repos = {}, lasts = {} }
  for k = 1, #streams do state.repos[k] = {} end
  local succ, turns, n = 0, 0, 0
  for t = 1, B.TASKS do
    local tasks = {}
    for k, s in ipairs(streams) do tasks[k] = B.task(s.rule, s.doors[t], state.repos[k], state.lasts[k]) end
    local outs = exec(tasks)
    local trajs = {}
    for k, out in ipairs(outs) do
      if t > 1 then succ, turns, n = succ + (out.success and 1 or 0), turns + out.turns, n + 1 end
      trajs[k] = B.trajectory(streams[k].doors[t], out.tried, out.success)
    end
    if t < B.TASKS then policy(state, trajs) end
  end
  local size = 0
  for k = 1, #streams do size = size + #state.repos[k] end
  return { success = succ / n, turns = turns / n, repo = size / #streams }
end

local function one_seed(seed)
  local t0 = rl.clock()
  local exec_m, es = sft(B, B.max_turns, o.exec_examples, o.exec_epochs, seed, o.dim,
    string.format("%s/skills-exec-s%d.bin", o.dir, seed))
  local exec2_m = sft(B, B.max_turns, o.exec_examples, o.exec_epochs, seed + 1000, o.dim2,
    string.format("%s/skills-exec2-s%d.bin", o.dir, seed))
  local cur_path = string.format("%s/skills-cur-s%d.bin", o.dir, seed)
  local cur_sft = sft(C, 1, o.cur_examples, o.cur_epochs, rl.train.mix(seed, 0xC0), o.dim, cur_path)
  local exec, exec2 = executor(exec_m), executor(exec2_m)
  local cur_rl, sps = train_curator(seed, exec, cur_path)
  local P = policies(cur_sft, cur_rl)
  local held = B.streams("test", o.eval_streams, 4242, B.TRAIN_FAMILIES)
  local transfer = B.streams("test", o.eval_streams, 4243, B.HELD_FAMILIES)
  local rows = {}
  local arms = {
    { "(a) none", P.none, exec }, { "(b) raw memory", P.raw, exec }, { "(c) heuristic", P.heuristic, exec },
    { "curator SFT", P.curator_sft, exec }, { "(d) curator RL", P.curator_rl, exec },
    { "oracle curator", P.oracle, exec },
    { "swap: none", P.none, exec2 }, { "swap: curator RL", P.curator_rl, exec2 },
  }
  for _, a in ipairs(arms) do
    local h, tr = evaluate(a[3], a[2], held), evaluate(a[3], a[2], transfer)
    rows[#rows + 1] = { label = a[1], success = h.success, turns = h.turns, repo = h.repo, transfer = tr.success }
  end
  print(string.format("seed %d: executor SFT %.1f s (loss %.3f), curator RL %.2f s/step, total %.1f s",
    seed, es.seconds, es.loss, sps, rl.clock() - t0))
  return rows
end

local function print_table(runs, title)
  print(string.format("\nskills (%s): %d held-out streams per column, tasks 2-4; curator RL %d steps x %d groups x %d",
    title, o.eval_streams, o.steps, o.streams * (B.TASKS - 1), o.group))
  local lines = R.spread_table { runs = runs, rows = runs[1],
    headers = { "success 2-4 %", "tries 2-4", "repo size", "transfer %" }, label = "arm",
    value = function(run, row, k)
      local r
      for _, x in ipairs(run) do if x.label == row.label then r = x end end
      return ({ 100 * r.success, r.turns, r.repo, 100 * r.transfer })[k]
    end, fmt = function(k) return (k == 1 or k == 4) and "%.1f" or "%.2f" end }
  for _, l in ipairs(lines) do print(l) end
end

R.report(o.seed, o.seeds, one_seed, print_table)
