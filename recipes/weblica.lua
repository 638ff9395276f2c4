-- weblica.lua - Weblica's claim in miniature (spec reproductions.md section 3.12): RL on more
-- synthetic sites generalises better to sites never seen. envs/webshop.lua synthesises a text
-- shop from each site seed (departments, product types and colours in a site-specific layout,
-- a search box, a cart); every page is fetched over the rl.http request interface through an
-- rl.http.cassette keyed by request, so each distinct request reaches the site once and every
-- repeat is replayed from the cassette.
--
-- One SFT warm start on the imperfect demonstrator (half the time it searches for the type, else
-- it browses the departments in order; 83% success) on sites 1..--sft-sites (4) is shared by
-- both arms, which then run GRPO with the same seed, the same number of steps, tasks and
-- episodes:
--   sites4    training tasks on sites 1..4;
--   sites64   training tasks on sites 1..64.
-- Expected per the paper: higher success on held-out sites (seeds 1001..1016, which no arm
-- trains on) and fewer steps. Measured greedily: held-out success and steps (turns per episode)
-- on --eval-tasks held-out tasks, the same on as many new tasks of sites 1-4, the requests the
-- arm's training made that went live (the others were replayed from its cassette), and the
-- seconds per RL step. After each arm the held-out evaluation is run twice more: once onto an
-- empty cassette (live requests counted by the synthetic web), once from that cassette in
-- replay mode (no request may reach the web; the outcomes must be the same).
--
--   moonrl run recipes/weblica.lua [--seed 1] [--seeds 3] [--arms sites4,sites64] [--steps 60]
--     [--tasks 8] [--group 8] [--lr 3e-4] [--sft-examples 2000] [--sft-epochs 3] [--sft-sites 4]
--     [--eval-tasks 64] [--reuse-sft] [--dir runs] [--smoke]
--
-- Files go to <dir>/weblica-<arm>-s<seed>/ (with the arm's cassette, cassette.jsonl) and the warm
-- start to <dir>/weblica-sft-s<seed>.bin (weblica-sft<n>-s<seed>.bin with --sft-sites n other than 4).
local rl = require "moonrl"

local root = os.getenv("MOONRL_ROOT") or "."
package.path = root .. "/?.lua;" .. package.path
local W = require "envs.webshop"
local R = rl.recipe

local o, why = R.args(arg, { seed = 1, seeds = 1, arms = "sites4,sites64", steps = 60, tasks = 8, group = 8,
  lr = 3e-4, sft_examples = 2000, sft_epochs = 3, sft_sites = 4, eval_tasks = 64, reuse_sft = false, dir = root .. "/runs",
  smoke = false })
if not o then error("weblica.lua: " .. why, 0) end
if o.smoke then
  o.steps, o.tasks, o.group, o.sft_examples, o.sft_epochs, o.eval_tasks = 2, 2, 2, 40, 1, 4
end
local SITES = { sites4 = 4, sites64 = 64 }
local ARMS = {}
for name in o.arms:gmatch("[^,]+") do
  if not SITES[name] then error("weblica.lua: --arms: unknown arm '" .. name .. "' (sites4, sites64)", 0) end
  ARMS[#ARMS + 1] = name
end
if #ARMS == 0 then error("weblica.lua: --arms: at least one arm expected", 0) end
if o.sft_sites < 1 or o.sft_sites > 1000 or math.type(o.sft_sites) ~= "integer" then
  error("weblica.lua: --sft-sites: an integer in 1..1000 expected (the held-out sites are 1001..1016)", 0)
end

local function range(n)
  local out = {}
  for i = 1, n do out[i] = i end
  return out
end

local CTX = 384
local tok = rl.tokenizer.bytes()
local function new_model(seed)
  return rl.model.new { vocab = tok:vocab_size(), dim = 64, layers = 2, heads = 4, ffn = 192, ctx = CTX, seed = seed }
end

-- The transport every episode uses: a forwarder whose target the recipe sets (an arm's
-- cassette, the evaluation's cassettes).
local Switch = {}
Switch.__index = Switch
function Switch:request(a) return self.to:request(a) end
local switch = setmetatable({ opts = {} }, Switch)

local HELD = W.tasks_on(W.test_sites, o.eval_tasks, 4242)
local SEEN = W.tasks_on(range(4), o.eval_tasks, 4343)

-- A cassette keyed by request on an empty file at path: each request not in it yet goes to web
-- and is appended; a repeat is replayed.
local function caching(path, web)
  local f = assert(io.open(path, "w"))
  f:close()
  return rl.http.cassette { client = web, path = path, mode = "replay", on_miss = "record" }
end

-- Greedy success and turns per episode of the policy on tasks; outcomes[i] = "success/turns".
local function measure(ctx, tasks)
  local wins, turns, outcomes = 0, 0, {}
  local chunk = o.tasks * o.group
  for first = 1, #tasks, chunk do
    local part = table.move(tasks, first, math.min(#tasks, first + chunk - 1), 1, {})
    local b = ctx.stages.rollout(ctx, { tasks = part, repeats = 1, seed = rl.train.mix(4242, first),
      temperature = 0, group_base = 0 })
    for _, ep in ipairs(b.episodes) do
      wins, turns = wins + (ep.success and 1 or 0), turns + ep.turns
      outcomes[#outcomes + 1] = (ep.success and 1 or 0) .. "/" .. ep.turns
    end
  end
  return { success = wins / #tasks, steps = turns / #tasks }, table.concat(outcomes, " ")
end

-- A scripted policy (fn(task, rng) -> actions) on tasks, straight on the synthetic web.
local function scripted(fn, tasks)
  local web, wins, turns = W.web(), 0, 0
  for i, t in ipairs(tasks) do
    local ep = W.new { http = web }
    ep:reset(t)
    local n = 0
    for _, a in ipairs(fn(t, rl.rng(rl.train.mix(777, i)))) do
      if n == W.max_turns then break end
      n = n + 1
      local _, _, done, info = ep:step(a)
      if done then
        wins = wins + (info.success and 1 or 0)
        break
      end
    end
    turns = turns + n
  end
  return { success = wins / #tasks, steps = turns / #tasks }
end

local function warm_start(seed)
  local t0 = rl.clock()
  local path = string.format("%s/weblica-sft%s-s%d.bin", o.dir, o.sft_sites == 4 and "" or o.sft_sites, seed)
  local f = o.reuse_sft and io.open(path, "rb")
  if f then
    f:close()
    return path, { seconds = 0, loss = 0 / 0, examples = 0 }
  end
  switch.to = W.web()
  local env = W.variant { http = switch, sites = range(o.sft_sites) }
  local ctx = { cfg = { env = env, max_turns = W.max_turns }, tokenizer = tok }
  local data = rl.train.oracle_examples(ctx, o.sft_examples, rl.train.mix(seed, 0x3EB))
  local r = R.warm_start { model = new_model(seed), data = data, epochs = o.sft_epochs, path = path,
    seed = rl.train.mix(seed, 0x5F7) }
  return path, { seconds = rl.clock() - t0, loss = r.final_loss, examples = #data }
end

local printed = false

local function run_arm(seed, path, arm)
  local m = new_model(seed)
  assert(m:load_checkpoint(path))
  m:reset_optimizer()
  local name = string.format("weblica-%s-s%d", arm, seed)
  local rundir = o.dir .. "/" .. name
  assert(rl.fs.mkdir(rundir))
  local web = W.web()
  local cas = caching(rundir .. "/cassette.jsonl", web)
  local env = W.variant { http = switch, sites = range(SITES[arm]) }
  local secs, n, replay = 0, 0, nil
  local function evaluate(ctx, step)
    if step > 0 and step < o.steps then return {} end
    switch.to = W.web() -- the evaluation's requests stay out of the arm's cassette
    local held, held_out = measure(ctx, HELD)
    local seen = measure(ctx, SEEN)
    if step == o.steps then
      -- the held-out evaluation again, onto an empty cassette, then from it with no live request
      local ev_web = W.web()
      switch.to = caching(rundir .. "/eval.jsonl", ev_web)
      local _, first = measure(ctx, HELD)
      local live1 = ev_web.requests
      switch.to = rl.http.cassette { client = ev_web, path = rundir .. "/eval.jsonl", mode = "replay" }
      local _, second = measure(ctx, HELD)
      replay = { live1 = live1, live2 = ev_web.requests - live1, hits = switch.to:stats().hits,
        same = first == second and first == held_out }
    end
    switch.to = cas
    return { held = held.success, held_steps = held.steps, seen = seen.success, seen_steps = seen.steps }
  end
  switch.to = cas
  local result = rl.train {
    model = m, tokenizer = tok, env = env, name = name, dir = o.dir, seed = seed, overwrite = true,
    steps = o.steps, tasks_per_step = o.tasks, group_size = o.group, max_turns = W.max_turns,
    max_turn_tokens = 16, minibatch = o.tasks * o.group, capacity = CTX, temperature = 1, loss = "ppo",
    clip_low = 0.2, clip_high = 0.28, lr = o.lr, advantage = "grpo", progress = false, log_episodes = 2,
    evaluate = evaluate, eval = { every = o.steps, tasks = 1, k = 1 },
    on_step = function(step, mt)
      local s = mt["time/step"] - (mt["time/eval"] or 0)
      secs, n = secs + s, n + 1
      if not printed then
        printed = true
        print(string.format("  measured: %.2f s per RL step (%s, step %d; %d episodes a step)", s, arm, step,
          o.tasks * o.group))
        io.stdout:flush()
      end
    end,
  }
  cas:close()
  local st = cas:stats()
  local a = result.after
  local row = { arm = arm, held = a["eval/held"], held_steps = a["eval/held_steps"], seen = a["eval/seen"],
    seen_steps = a["eval/seen_steps"], live = web.requests, replayed = st.hits, sps = secs / math.max(n, 1) }
  print(string.format("  %-8s %d steps  %.2f s/step  held-out %.1f%% in %.2f steps  training requests: %d live, %d replayed",
    arm, o.steps, row.sps, 100 * row.held, row.held_steps, row.live, row.replayed))
  print(string.format("  %-8s replay check: held-out evaluation onto an empty cassette %d live requests; again from it %d live, %d replayed; same outcomes: %s",
    arm, replay.live1, replay.live2, replay.hits, replay.same and "yes" or "no"))
  io.stdout:flush()
  local b = result.before
  return row, { arm = "SFT", held = b["eval/held"], held_steps = b["eval/held_steps"], seen = b["eval/seen"],
    seen_steps = b["eval/seen_steps"] }
end

local DEMO = { arm = "demonstrator" }
local PERFECT = { arm = "perfect" }
for _, p in ipairs { { DEMO, W.oracle }, { PERFECT, W.perfect } } do
  local h, s = scripted(p[2], HELD), scripted(p[2], SEEN)
  p[1].held, p[1].held_steps, p[1].seen, p[1].seen_steps = h.success, h.steps, s.success, s.steps
end

local function one_seed(seed)
  local t0 = rl.clock()
  local path = R.announced_start(seed, warm_start, o.sft_epochs)
  local rows, sft = {}, nil
  for i, arm in ipairs(ARMS) do
    local row, before = run_arm(seed, path, arm)
    rows[i] = row
    sft = sft or before
  end
  rows[#rows + 1] = sft
  rows[#rows + 1] = DEMO
  rows[#rows + 1] = PERFECT
  print(string.format("seed %d: %.0f s", seed, rl.clock() - t0))
  return rows
end

local function print_table(list, title)
  local w = #list > 1 and 13 or 8
  local sft = o.sft_sites == 4 and "" or string.format("SFT on sites 1-%d; ", o.sft_sites)
  print(string.format("\nweblica, %s; %s%d steps of %d tasks x %d episodes; greedy, %d tasks on held-out sites 1001-1016 "
    .. "and %d new tasks on sites 1-4", title, sft, o.steps, o.tasks, o.group, o.eval_tasks, o.eval_tasks))
  local head = { string.format("%-13s", "arm") }
  for _, h in ipairs { "held%", "steps", "sites1-4%", "steps", "live", "replayed", "s/step" } do
    head[#head + 1] = string.format("%" .. w .. "s", h)
  end
  print(table.concat(head, " "))
  for _, r in ipairs(R.summarise(list, "arm")) do
    local line = { string.format("%-13s", r.arm) }
    line[#line + 1] = string.format("%" .. w .. "s", R.pm(r.held))
    line[#line + 1] = string.format("%" .. w .. "s", R.pm(r.held_steps, 1, "%.2f"))
    line[#line + 1] = string.format("%" .. w .. "s", R.pm(r.seen))
    line[#line + 1] = string.format("%" .. w .. "s", R.pm(r.seen_steps, 1, "%.2f"))
    line[#line + 1] = string.format("%" .. w .. "s", R.pm(r.live, 1, "%.0f"))
    line[#line + 1] = string.format("%" .. w .. "s", R.pm(r.replayed, 1, "%.0f"))
    line[#line + 1] = string.format("%" .. w .. "s", R.pm(r.sps, 1, "%.2f"))
    print(table.concat(line, " "))
  end
end

local t_all = rl.clock()
R.report(o.seed, o.seeds, one_seed, print_table)
print(string.format("(held%%/steps: greedy success and turns per episode on held-out sites; sites1-4%%: the same on "
  .. "new tasks of sites 1-4, which the SFT and both arms train on; live/replayed: the arm's training requests that reached the synthetic web / "
  .. "came from its cassette; s/step: seconds per RL step, eval excluded; %.0f s in all)", rl.clock() - t_all))
