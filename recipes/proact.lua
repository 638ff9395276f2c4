-- proact.lua - ProactAgent's ProactRL in miniature (spec reproductions.md, section 3.3, first
-- part): learning *when* to retrieve from paired-branch process rewards, on envs/lockers.lua (a
-- lifelong stream of locker tasks; some need a code only an earlier task of the stream showed,
-- which `recall <k>` fetches from the experience base for a turn).
--
-- Arms (one table):
--   never     scripted: never recalls (opens shown codes, guesses hidden ones);
--   passive   scripted: one recall at the start (of the first hidden locker, else of the
--             first locker: a generous passive retriever that always picks the useful key),
--             then opens, guessing a second hidden code;
--   every     scripted: a recall before every open (all the recalls the task could use);
--             the three scripted arms execute perfectly otherwise (an upper bound for each
--             recall schedule, not a trained policy);
--   SFT       the shared warm start (imitation of envs/lockers.lua's imperfect oracle);
--   grpo      plain GRPO from SFT, recall available, reward = success;
--   grpo_cost GRPO with the same turn cost in the reward: success - 0.02 x turns (a control:
--             is the paired branch needed, or is ProactRL's gain the turn cost alone?);
--   proactrl  GRPO's outcome advantage plus ProactRL's process reward on every recall turn:
--             branch A is the episode as sampled; branch B re-runs the same episode (same
--             task, same experience base, same sampling stream: the identical prefix, token
--             for token) and at the recall's turn takes it back and samples again
--             (rollout hook on_action, up to 32 times) until the action is not a recall; both
--             go to the end (rl.train.paired.rollout); the recall turn's process reward is
--               outcome(A) - outcome(B) - 0.02 x (turns(A) - turns(B))
--             added (x --process-weight, 1) to the advantage of that turn's tokens
--             (rl.train.paired.advantage, registered as "proactrl"). B is not trained on; a
--             recall the policy still made after 32 resamples gets no process reward.
--   ideal     envs/lockers.lua's solve: a recall exactly on each hidden code (the ceiling).
-- Same seed, tasks and steps for grpo, grpo_cost and proactrl; PPO clip 0.2 / 0.28.
-- Measured greedily on held-out streams (held-out worlds): success, success on the tasks
-- that need a past fact, recalls per episode, recall precision (the share of recalls made on
-- tasks that need a past fact), turns per episode, and the seconds per RL step.
--
--   moonrl run recipes/proact.lua [--seed 1] [--seeds 3] [--steps 40] [--tasks 8] [--group 8]
--     [--sft-examples 4000] [--sft-epochs 4] [--eval-tasks 240] [--lr 3e-4]
--     [--process-weight 1] [--turn-cost 0.02] [--dim 64] [--layers 2] [--dir runs] [--smoke]
--
-- --seeds n runs the recipe for seeds seed .. seed + n - 1 (each with its own SFT) and prints the
-- mean ± sample sd. --smoke is a tiny run that only shows the recipe works. Files go to
-- <dir>/proact-<arm>-s<seed>/ and the warm start to <dir>/proact-sft-s<seed>.bin.
local rl = require "moonrl"

local root = os.getenv("MOONRL_ROOT") or "."
package.path = root .. "/?.lua;" .. package.path
local L = require "envs.lockers"
local R = rl.recipe

local o, why = R.args(arg, { seed = 1, seeds = 1, steps = 40, tasks = 8, group = 8,
  sft_examples = 4000, sft_epochs = 4, eval_tasks = 240, lr = 3e-4, process_weight = 1.0,
  turn_cost = 0.02, dim = 64, layers = 2, dir = root .. "/runs", smoke = false })
if not o then error("proact.lua: " .. why, 0) end
if o.smoke then
  o.steps, o.tasks, o.group, o.sft_examples, o.sft_epochs, o.eval_tasks = 2, 2, 4, 64, 1, 24
  o.dim, o.layers = 32, 1
end
local MAX_TOKENS, MAX_RESAMPLES = 12, 32

local tok = rl.tokenizer.bytes()
local function new_model(seed)
  return rl.model.new { vocab = tok:vocab_size(), dim = o.dim, layers = o.layers, heads = 4,
    ffn = 3 * o.dim, ctx = 256, seed = seed }
end

local HELD = L.tasks("test", o.eval_tasks, 4242)

-- The figures of a list of {task =, record =, success =}.
local function figures(list)
  local f = { success = 0, need_success = 0, recalls = 0, precision = 0, turns = 0 }
  local need, on_need = 0, 0
  for _, e in ipairs(list) do
    local n = 0
    for _, r in ipairs(e.record) do
      if type(r.info) == "table" and r.info.recall then n = n + 1 end
    end
    f.success = f.success + (e.success and 1 or 0)
    f.recalls, f.turns = f.recalls + n, f.turns + #e.record
    if e.task.need then
      need, on_need = need + 1, on_need + n
      f.need_success = f.need_success + (e.success and 1 or 0)
    end
  end
  f.precision = f.recalls > 0 and on_need / f.recalls or nil -- ("-": no recalls)
  f.need_success = f.need_success / math.max(need, 1)
  for _, k in ipairs { "success", "recalls", "turns" } do f[k] = f[k] / #list end
  return f
end

-- A scripted schedule (actions = fn(task, rng)) on the held-out tasks, max_turns turns at most.
local function scripted(fn)
  local list = {}
  for i, task in ipairs(HELD) do
    local inst, record, ok = L.new(), {}, false
    inst:reset(task)
    for k, a in ipairs(fn(task, rl.rng(rl.train.mix(777, i)))) do
      if k > L.max_turns then break end
      local _, reward, done = rl.env.step(L, inst, a, record)
      if done then
        ok = reward == 1
        break
      end
    end
    list[i] = { task = task, record = record, success = ok }
  end
  return figures(list)
end

local function guess(task, i, rng)
  local g
  repeat g = L.letter(rng:random(26)) until g ~= task.codes[i]
  return "open " .. g
end

-- The scripted recall schedules: each opens a code it knows (shown or recalled) and guesses one
-- it does not (over and over, until the budget runs out).
local SCHEDULES = {
  never = function(task, rng)
    local out = {}
    for i, l in ipairs(task.lockers) do
      if task.shown[i] then
        out[#out + 1] = "open " .. task.codes[i]
      else
        for _ = 1, L.max_turns do out[#out + 1] = guess(task, i, rng) end
      end
    end
    return out
  end,
  passive = function(task, rng)
    local pick = task.shown[1] and not task.shown[2] and 2 or 1
    local out = { "recall " .. task.lockers[pick] }
    for i, l in ipairs(task.lockers) do
      if task.shown[i] or i == pick then
        out[#out + 1] = "open " .. task.codes[i]
      else
        for _ = 1, L.max_turns do out[#out + 1] = guess(task, i, rng) end
      end
    end
    return out
  end,
  every = function(task)
    local out = {}
    for i, l in ipairs(task.lockers) do
      out[#out + 1] = "recall " .. l
      out[#out + 1] = "open " .. task.codes[i]
    end
    return out
  end,
}

-- The evaluate stage: the policy, greedy, on the held-out tasks (the default rollout, so that
-- proactrl's branching stage is for training only).
local function evaluate(ctx)
  local list, chunk = {}, o.tasks * o.group
  for first = 1, #HELD, chunk do
    local part = table.move(HELD, first, math.min(#HELD, first + chunk - 1), 1, {})
    local b = rl.train.rollout.run(ctx, { tasks = part, repeats = 1, seed = rl.train.mix(4242, first),
      temperature = 0, group_base = 0 })
    for _, ep in ipairs(b.episodes) do list[#list + 1] = { task = ep.task, record = ep.record, success = ep.success } end
  end
  return figures(list)
end

local function is_recall(text) return text:lower():match("^%s*recall") ~= nil end

-- ProactRL's rollout stage (rl.train.paired.rollout): branch A as sampled; for every recall turn
-- branch B from the identical prefix with the recall replaced; the recall turn's process reward
-- from the two outcomes. The counts add up in stats.
local function branching_rollout(stats)
  local stage = rl.train.paired.rollout {
    mark = function(r) return type(r.info) == "table" and r.info.recall == true end,
    refuse = is_recall, max_resamples = MAX_RESAMPLES,
    reward = function(a, b) return a.reward - b.return_ - o.turn_cost * (a.turns - b.turns) end,
  }
  return function(ctx, req)
    local b = stage(ctx, req)
    local p = b.paired
    stats.marked, stats.paired = stats.marked + p.marked, stats.paired + p.paired
    stats.differed, stats.refused = stats.differed + p.differed, stats.refused + p.refused
    stats.sum = stats.sum + p.mean * p.paired
    return b
  end
end

-- The proactrl estimator: GRPO's outcome advantage on every sampled token, plus the process
-- weight times the recall turn's process reward on that turn's tokens.
rl.train.advantage.register("proactrl", rl.train.paired.advantage { base = "grpo", weight = o.process_weight })

local function warm_start(seed)
  local m = new_model(seed)
  local t0 = rl.clock()
  local ctx = { cfg = { env = L, max_turns = L.max_turns }, tokenizer = tok }
  local data = rl.train.oracle_examples(ctx, o.sft_examples, rl.train.mix(seed, 0x10C))
  local path = string.format("%s/proact-sft-s%d.bin", o.dir, seed)
  local r = R.warm_start { model = m, data = data, epochs = o.sft_epochs, path = path,
    seed = rl.train.mix(seed, 0x5F7) }
  return path, { seconds = rl.clock() - t0, loss = r.final_loss, examples = #data }
end

local printed_rate = false

local function run_arm(seed, sft_path, arm)
  local m = new_model(seed)
  m:load_checkpoint(sft_path)
  m:reset_optimizer()
  local stats = { marked = 0, paired = 0, differed = 0, refused = 0, sum = 0 }
  local secs, n = 0, 0
  local result = rl.train {
    model = m, tokenizer = tok, env = L, name = string.format("proact-%s-s%d", arm, seed),
    dir = o.dir, seed = seed, overwrite = true, steps = o.steps, tasks_per_step = o.tasks,
    group_size = o.group, minibatch = o.tasks * o.group, max_turn_tokens = MAX_TOKENS,
    clip_low = 0.2, clip_high = 0.28, lr = o.lr,
    advantage = arm == "proactrl" and "proactrl" or "grpo",
    rewards = arm == "grpo_cost" and { turns = function(ep) return -o.turn_cost * ep.turns end } or nil,
    rollout = arm == "proactrl" and branching_rollout(stats) or nil,
    eval = { every = o.steps, tasks = 1, k = 1 }, evaluate = evaluate, progress = false,
    log_episodes = 2,
    on_step = function(step, mt)
      local s = mt["time/step"] - (mt["time/eval"] or 0)
      secs, n = secs + s, n + 1
      if not printed_rate then
        printed_rate = true
        print(string.format("  measured: %.2f s per RL step (%s, step %d; %d episodes a step)", s, arm, step,
          o.tasks * o.group))
        io.stdout:flush()
      end
    end,
  }
  local row = { arm = arm, sps = secs / math.max(n, 1) }
  for _, k in ipairs { "success", "need_success", "recalls", "precision", "turns" } do
    row[k] = result.after["eval/" .. k]
  end
  if arm == "proactrl" then
    print(string.format("  proactrl branches: %d recall turns, %d paired (mean process reward %.3f), "
      .. "%d prefixes differed, %d still recalled after %d resamples", stats.marked, stats.paired,
      stats.paired > 0 and stats.sum / stats.paired or 0, stats.differed, stats.refused, MAX_RESAMPLES))
  end
  print(string.format("  %-9s %d steps  %.2f s/step  held-out success %.1f%%, %.2f recalls/ep",
    arm, o.steps, row.sps, 100 * row.success, row.recalls))
  io.stdout:flush()
  return row, result.before
end

local function one_seed(seed)
  local t0 = rl.clock()
  print(string.format("seed %d: SFT warm start ...", seed))
  io.stdout:flush()
  local sft_path, sft = warm_start(seed)
  print(string.format("  SFT: %d examples x %d epochs, final loss %.3f, %.0f s", sft.examples, o.sft_epochs,
    sft.loss, sft.seconds))
  local rows = {}
  for _, name in ipairs { "never", "passive", "every" } do
    local row = scripted(SCHEDULES[name])
    row.arm = name
    rows[#rows + 1] = row
  end
  local grpo, before = run_arm(seed, sft_path, "grpo")
  local sft_row = { arm = "SFT" }
  for _, k in ipairs { "success", "need_success", "recalls", "precision", "turns" } do
    sft_row[k] = before["eval/" .. k]
  end
  rows[#rows + 1] = sft_row
  rows[#rows + 1] = grpo
  rows[#rows + 1] = (run_arm(seed, sft_path, "grpo_cost"))
  rows[#rows + 1] = (run_arm(seed, sft_path, "proactrl"))
  local ideal = scripted(L.solve)
  ideal.arm = "ideal"
  rows[#rows + 1] = ideal
  rows.seconds = rl.clock() - t0
  print(string.format("seed %d: %.0f s", seed, rows.seconds))
  return rows
end

local function print_table(list, title)
  local w = #list > 1 and 13 or 7
  local function cell(v, scale, fmt) return string.format("%" .. w .. "s", R.pm(v, scale, fmt)) end
  print(string.format("\nproact, %s; %d steps of %d tasks x %d episodes; %d held-out tasks (held-out worlds), greedy",
    title, o.steps, o.tasks, o.group, #HELD))
  print(table.concat({ string.format("%-9s", "arm"), string.format("%" .. w .. "s", "succ%"),
    string.format("%" .. w .. "s", "need%"), string.format("%" .. w .. "s", "recall"),
    string.format("%" .. w .. "s", "prec%"), string.format("%" .. w .. "s", "turns"),
    string.format("%7s", "s/step") }, " "))
  for _, r in ipairs(R.summarise(list, "arm")) do
    local s = type(r.sps) == "table" and r.sps.mean or r.sps
    print(table.concat({ string.format("%-9s", r.arm), cell(r.success), cell(r.need_success),
      cell(r.recalls, 1, "%.2f"), cell(r.precision), cell(r.turns, 1, "%.2f"),
      string.format("%7s", s and string.format("%.2f", s) or "-") }, " "))
  end
end

local t_all = rl.clock()
R.report(o.seed, o.seeds, one_seed, print_table)
print(string.format("(succ%%: held-out success; need%%: success on the tasks that need a past fact; recall: recalls per "
  .. "episode; prec%%: share of recalls on those tasks; s/step: seconds per RL step, eval excluded; %.0f s in all)",
  rl.clock() - t_all))
