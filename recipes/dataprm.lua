-- dataprm.lua - DataPRM's environment-aware process rewards (spec reproductions.md, section 3.8)
-- on envs/table.lua: queries over a 5 x 3 table answered with filt / sum / show / undo / ans ops,
-- where a silent error (filt a>=3 for a>3) runs like any other op. Two scripted PRMs score every
-- turn (table.prm_aware, the active verifier that re-executes each op against the gold plan:
-- 1 progress, 0.5 an exploratory show or a mistake later undone, 0 an unrepaired silent error;
-- table.prm_naive, which reads the text only: show and undo 0, silent errors invisible).
--
-- One warm start, SFT on the environment's imperfect oracle (a silent error in 40% of its
-- demonstrations, half of them repaired with undo), is shared by every arm; each arm runs GRPO
-- with the same seed, tasks and steps, its reward a reward graph:
--   outcome  the environment's return (1 for the right answer);
--   aware    the return + 0.5 x the mean step score of prm_aware (a dense process term: turn t
--            gets 0.5 x score_t / turns, so the turns sum to 0.5 x the mean);
--   naive    the same with prm_naive.
-- Before the arms, Best-of-8 on the SFT policy: 8 samples (temperature 1) per held-out query,
-- the one with the highest mean step score kept (the first of those tied), by each PRM; beside
-- them the first sample alone (no reranking) and pass@8 (the outcome as the reranker: the
-- ceiling). Expected per the paper: aware > outcome > naive in RL, aware > naive in Best-of-N.
--
-- The tables: held-out queries (eval_tasks of them, split by construction), 8 samples each at
-- temperature 1: success, the share of episodes that ended with a silent error live (silent),
-- those that answered right all the same (lucky), the mean prm_aware score; greedy success; the
-- measured seconds per RL step.
--
--   moonrl run recipes/dataprm.lua [--seed 1] [--seeds 3] [--arms outcome,aware,naive]
--     [--steps 40] [--tasks 8] [--group 8] [--weight 0.5] [--sft-examples 3000]
--     [--sft-epochs 3] [--eval-tasks 64] [--lr 3e-4] [--reuse-sft] [--dir runs] [--smoke]
--
-- --smoke: a tiny run for the test; --reuse-sft: the warm start already in <dir>, if there is one. Files go to <dir>/dataprm-<arm>-s<seed>/ and the warm start
-- to <dir>/dataprm-sft-s<seed>.bin.
local rl = require "moonrl"

local root = os.getenv("MOONRL_ROOT") or "."
package.path = root .. "/?.lua;" .. package.path
local env = require "envs.table"
local R = rl.recipe

local o, why = R.args(arg, { seed = 1, seeds = 1, arms = "outcome,aware,naive", steps = 40, tasks = 8, group = 8,
  weight = 0.5, sft_examples = 3000, sft_epochs = 3, eval_tasks = 64, lr = 3e-4, reuse_sft = false,
  dir = root .. "/runs", smoke = false })
if not o then error("dataprm.lua: " .. why, 0) end
if o.smoke then
  o.steps, o.tasks, o.group, o.sft_examples, o.sft_epochs, o.eval_tasks = 2, 2, 4, 40, 1, 4
end
if o.weight < 0 then error("dataprm.lua: --weight: a number >= 0 expected", 0) end

local KNOWN = { outcome = true, aware = true, naive = true }
local arms = {}
for name in o.arms:gmatch("[^,]+") do
  if not KNOWN[name] then error("dataprm.lua: unknown arm '" .. name .. "' (outcome, aware, naive)", 0) end
  arms[#arms + 1] = name
end
local N = 8 -- samples per held-out query (and Best-of-N's N)

local function new_model(seed)
  local tok = rl.tokenizer.bytes()
  return rl.model.new { vocab = tok:vocab_size(), dim = 64, layers = 2, heads = 4, ffn = 192, ctx = 256,
    seed = seed }, tok
end

local HELD = env.tasks("test", o.eval_tasks, 4242)

-- An episode's actions and observations, one per turn.
local function trace(ep)
  local actions, obs = {}, {}
  for k, r in ipairs(ep.record or {}) do actions[k], obs[k] = r.action or "", r.observation end
  return actions, obs
end

-- The per-turn scores of a PRM (kind "aware" or "naive") for an episode, kept on it.
local function scores_of(kind, ep)
  local key = "prm_" .. kind
  if not ep[key] then
    local actions, obs = trace(ep)
    ep[key] = kind == "aware" and env.prm_aware(ep.task, actions) or env.prm_naive(actions, obs)
  end
  return ep[key]
end

local function graph_of(arm)
  local terms = { rl.reward.env { name = "outcome" } }
  if arm ~= "outcome" then
    terms[2] = rl.reward.process { name = "prm_" .. arm, weight = o.weight, reduce = "dense",
      turn = function(_, ep, ctx)
        local s = scores_of(arm, ep)
        return s[ctx.turn] / #s
      end }
  end
  return rl.reward.graph { name = "dataprm-" .. arm, terms = terms }
end

-- Held-out evaluation: N samples per query at temperature 1 (success, silent, lucky, the mean
-- aware score), greedy success; with bon, the Best-of-N figures of the same samples.
local function held_out(ctx, bon)
  local chunk = math.max(1, o.tasks * o.group // N)
  local n, succ, silent, lucky, aware = 0, 0, 0, 0, 0
  local pick = { first = 0, naive = 0, aware = 0, pass = 0 }
  local greedy = 0
  for first = 1, #HELD, chunk do
    local part = table.move(HELD, first, math.min(#HELD, first + chunk - 1), 1, {})
    local b = ctx.stages.rollout(ctx, { tasks = part, repeats = N, seed = rl.train.mix(77, first), temperature = 1,
      group_base = 0 })
    for t, task in ipairs(part) do
      local best = { naive = { -1 }, aware = { -1 } }
      local any = false
      for j = 1, N do
        local ep = b.episodes[(t - 1) * N + j]
        local actions = trace(ep)
        local c = env.check(task, actions)
        n = n + 1
        if ep.success then succ = succ + 1 end
        if c.silent then silent = silent + 1 end
        if c.lucky then lucky = lucky + 1 end
        aware = aware + env.mean(scores_of("aware", ep))
        any = any or ep.success
        if j == 1 and ep.success then pick.first = pick.first + 1 end
        for _, kind in ipairs { "naive", "aware" } do
          local m = env.mean(scores_of(kind, ep))
          if m > best[kind][1] then best[kind] = { m, ep.success } end
        end
      end
      for _, kind in ipairs { "naive", "aware" } do
        if best[kind][2] then pick[kind] = pick[kind] + 1 end
      end
      if any then pick.pass = pick.pass + 1 end
    end
    local g = ctx.stages.rollout(ctx, { tasks = part, repeats = 1, seed = 5, temperature = 0, group_base = 0 })
    for _, ep in ipairs(g.episodes) do if ep.success then greedy = greedy + 1 end end
  end
  local out = { success = succ / n, silent = silent / n, lucky = lucky / n, aware = aware / n,
    greedy = greedy / #HELD }
  if bon then
    for k, v in pairs(pick) do out["bon_" .. k] = v / #HELD end
  end
  return out
end

local function warm_start(seed)
  return R.oracle_start { env = env, path = string.format("%s/dataprm-sft-s%d.bin", o.dir, seed), reuse = o.reuse_sft,
    new_model = new_model, seed = seed, examples = o.sft_examples, epochs = o.sft_epochs }
end

local BON -- the Best-of-N rows of the current seed (from its first arm's step-0 evaluation)

local function run_arm(seed, sft_path, arm)
  local m, tok = new_model(seed)
  m:load_checkpoint(sft_path)
  m:reset_optimizer()
  local secs, n = 0, 0
  local result = rl.train {
    model = m, tokenizer = tok, env = env, name = string.format("dataprm-%s-s%d", arm, seed),
    dir = o.dir, seed = seed, overwrite = true, steps = o.steps, tasks_per_step = o.tasks,
    group_size = o.group, minibatch = o.tasks * o.group, max_turn_tokens = 12, clip_low = 0.2,
    clip_high = 0.28, lr = o.lr, temperature = 1.0, advantage = "grpo", reward = graph_of(arm),
    eval = { every = o.steps, tasks = 1, k = 1 }, progress = false, log_episodes = 2,
    evaluate = function(ctx, step)
      if step == 0 and arm == arms[1] or step > 0 then return held_out(ctx, step == 0) end
      return {}
    end,
    on_step = function(_, mt) secs, n = secs + mt["time/step"] - (mt["time/eval"] or 0), n + 1 end,
  }
  local function row_of(mt, name)
    return { arm = name, success = mt["eval/success"], greedy = mt["eval/greedy"], silent = mt["eval/silent"],
      lucky = mt["eval/lucky"], aware = mt["eval/aware"] }
  end
  local row = row_of(result.after, arm)
  row.sps = secs / math.max(n, 1)
  print(string.format("  %-8s %d steps  %.2f s/step  held-out %.1f%% (greedy %.1f%%)  silent %.1f%%", arm, o.steps,
    row.sps, 100 * row.success, 100 * row.greedy, 100 * row.silent))
  io.stdout:flush()
  if arm == arms[1] then
    local b = result.before
    BON = { { arm = "bon_first", success = b["eval/bon_first"] }, { arm = "bon_naive", success = b["eval/bon_naive"] },
      { arm = "bon_aware", success = b["eval/bon_aware"] }, { arm = "bon_pass", success = b["eval/bon_pass"] } }
    return row, row_of(b, "SFT")
  end
  return row
end

local function one_seed(seed)
  local t0 = rl.clock()
  local sft_path = R.announced_start(seed, warm_start, o.sft_epochs)
  local rows, sft_row = {}, nil
  for _, arm in ipairs(arms) do
    local row, before = run_arm(seed, sft_path, arm)
    rows[#rows + 1] = row
    sft_row = sft_row or before
  end
  rows[#rows + 1] = sft_row
  for _, r in ipairs(BON) do rows[#rows + 1] = r end
  print(string.format("seed %d: %.0f s", seed, rl.clock() - t0))
  return rows
end

local BON_LABEL = { bon_first = "first sample", bon_naive = "naive PRM", bon_aware = "env-aware PRM",
  bon_pass = "pass@8 (outcome)" }

local function print_table(list, title)
  local w = #list > 1 and 13 or 7
  local function cell(v, scale, fmt) return string.format("%" .. w .. "s", R.pm(v, scale, fmt)) end
  local rows = R.summarise(list, "arm")
  print(string.format("\ndataprm, %s; GRPO, %d steps of %d queries x %d episodes; held-out queries, %d, %d samples "
    .. "each at temperature 1", title, o.steps, o.tasks, o.group, o.eval_tasks, N))
  print(string.format("%-8s %" .. w .. "s %" .. w .. "s %" .. w .. "s %" .. w .. "s %" .. w .. "s %" .. w .. "s",
    "arm", "success%", "greedy%", "silent%", "lucky%", "aware", "s/step"))
  for _, r in ipairs(rows) do
    if not BON_LABEL[r.arm] then
      print(string.format("%-8s %s %s %s %s %s %s", r.arm, cell(r.success), cell(r.greedy), cell(r.silent),
        cell(r.lucky), cell(r.aware, 1, "%.3f"), r.sps and cell(r.sps, 1, "%.2f") or string.format("%" .. w .. "s", "-")))
    end
  end
  print(string.format("\ndataprm, %s; Best-of-%d on the SFT policy's samples; held-out queries, %d", title, N,
    o.eval_tasks))
  print(string.format("%-18s %" .. w .. "s", "reranker", "success%"))
  for _, r in ipairs(rows) do
    if BON_LABEL[r.arm] then print(string.format("%-18s %s", BON_LABEL[r.arm], cell(r.success))) end
  end
end

local t_all = rl.clock()
R.report(o.seed, o.seeds, one_seed, print_table)
print(string.format("(success: mean over %d samples per held-out query; silent: episodes that aggregated or "
  .. "answered with a wrong filter live; lucky: those that answered right all the same; aware: the mean "
  .. "env-aware step score; s/step: seconds per RL step, eval excluded; %.0f s in all)", N, rl.clock() - t_all))
