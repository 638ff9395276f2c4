-- multi_spec.lua - rl.multi (lua/moonrl/multi.lua): several policies in one run. Gradients reach
-- only the trainable agents (a frozen agent's weights are bit-identical after steps), shared
-- weights form one update unit, Dr. MAS's agent-wise normalisation and the global baseline
-- against a direct computation written here, the orchestration trace, determinism, and option
-- errors that name the option.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"

local tok = rl.tokenizer.bytes()
local function model(seed)
  return rl.model.new { vocab = tok:vocab_size(), dim = 16, layers = 1, heads = 2, ffn = 32, ctx = 128, seed = seed }
end

-- A two-agent relay: the lead is given "task <n>" and answers once (reward: its answer's length
-- mod 3); the follower is given "lead said: <answer>" and takes two turns (reward per turn: 10
-- when its answer's length is even). finish(): the lead gets 1 when the follower earned 20.
-- Random models give rewards that vary, so every group has something to learn from.
local Relay = {}
Relay.__index = Relay
local relay = { name = "relay", agents = { "lead", "follow" }, max_turns = { lead = 1, follow = 2 },
  new = function() return setmetatable({}, Relay) end }
function relay.tasks(split, n, seed)
  local out = {}
  for i = 1, n do out[i] = { n = (seed or 0) % 97 + i, split = split } end
  return out
end
function Relay:reset(task) self.task, self.phase, self.earned = task, 1, 0 end
local relay_again = setmetatable({ name = "relay_again", tasks = function(split, n, seed)
  local out = relay.tasks(split, n, seed)
  for _, t in ipairs(out) do t.again = true end
  return out
end }, { __index = relay })
function Relay:next(prev)
  if self.phase == 1 then return "lead", "task " .. self.task.n end
  if self.phase == 2 then
    self.phase = 3
    return "follow", "lead said: " .. self.said
  end
  if self.phase == 3 and self.task.again then -- (relay_again: the lead speaks last, too)
    self.phase = 4
    return "lead", "follow is done"
  end
  self.prev_end = prev and prev["end"]
  return nil
end
function Relay:step(agent, action)
  if agent == "lead" then
    if self.phase == 1 then self.said, self.phase = action, 2 end
    return "ok", #action % 3, true, {}
  end
  local r = (#action % 2 == 0) and 10 or 0
  self.earned = self.earned + r
  return "again", r, false, {}
end
function Relay:finish() return { lead = self.earned >= 20 and 1 or 0 } end
function Relay:success() return self.earned >= 20 end

local function weights(m, dir, name)
  local path = dir .. "/" .. name .. ".bin"
  assert(m:save_checkpoint(path))
  local f = assert(io.open(path, "rb"))
  local bytes = f:read("a")
  f:close()
  return bytes
end

local function opts(dir, over)
  local o = { env = relay, dir = dir, name = "run", seed = 3, steps = 2, tasks_per_step = 2, group_size = 4,
    max_turn_tokens = 4, minibatch = 8, lr = 1e-2, eval = false, trace_episodes = 3, overwrite = true }
  for k, v in pairs(over or {}) do o[k] = v end
  return o
end

local function strip_times(rows)
  for _, r in ipairs(rows) do
    for k in pairs(r) do if k:match("^time/") then r[k] = nil end end
  end
  return rows
end

describe("rl.multi.train", function()
  local dir
  before_each(function() dir = H.tmpdir() end)
  after_each(function() H.sh("rm -rf " .. H.shell_quote(dir)) end)

  it("steps only the trainable agent: the frozen one's weights stay bit-identical", function()
    local lead, follow = model(1), model(2)
    local lead0, follow0 = weights(lead, dir, "lead0"), weights(follow, dir, "follow0")
    local r = rl.multi.train(opts(dir, { agents = {
      lead = { model = lead, tokenizer = tok, trainable = true },
      follow = { model = follow, tokenizer = tok, trainable = false } } }))
    assert.are.equal(follow0, weights(follow, dir, "follow1"))
    assert.are_not.equal(lead0, weights(lead, dir, "lead1"))
    local last = r.history[#r.history]
    assert.is_true(last["loss/lead/updates"] >= 1)
    assert.is_number(last["loss/lead/grad_norm"])
    assert.is_nil(last["loss/follow/updates"])
    assert.is_nil(last["loss/follow/grad_norm"])
    assert.are.equal(8, last["invocations/lead"])
    assert.are.equal(8, last["invocations/follow"])
    assert.is_number(last["reward/lead"])
    assert.is_number(last["reward/follow"])
    assert.is_number(last["grad/lead/spike"])
    -- and the other way round
    local lead2, follow2 = model(1), model(2)
    local l0, f0 = weights(lead2, dir, "l0"), weights(follow2, dir, "f0")
    rl.multi.train(opts(dir, { agents = {
      lead = { model = lead2, tokenizer = tok, trainable = false },
      follow = { model = follow2, tokenizer = tok } } }))
    assert.are.equal(l0, weights(lead2, dir, "l1"))
    assert.are_not.equal(f0, weights(follow2, dir, "f1"))
  end)

  it("gives two agents that share a model one update unit", function()
    local m = model(1)
    local w0 = weights(m, dir, "w0")
    local r = rl.multi.train(opts(dir, { agents = { lead = { model = m, tokenizer = tok },
      follow = { model = m, tokenizer = tok } } }))
    local last = r.history[#r.history]
    assert.is_true(last["loss/lead+follow/updates"] >= 1)
    assert.is_nil(last["loss/lead/updates"])
    assert.are_not.equal(w0, weights(m, dir, "w1"))
  end)

  it("normalises an agent's rows in the groups regroup gives them: its rows each step, one key each", function()
    local calls, seen = 0, 0
    local function train(regroup)
      return rl.multi.train(opts(dir, { regroup = regroup, agents = { lead = { model = model(1), tokenizer = tok },
        follow = { model = model(2), tokenizer = tok } } }))
    end
    -- every follower row of the step in one group, across the two prompt groups
    local r = train { follow = function(rows)
      calls = calls + 1
      local keys = {}
      for j, row in ipairs(rows) do
        assert.matches("^lead said: ", row.given)
        keys[j], seen = "all", seen + 1
      end
      return keys
    end }
    assert.are.equal(2, calls)
    assert.are.equal(2 * 8, seen)
    local plain = train(nil)
    -- step 2 (the follower's rewards differ within its groups): the lead's advantages are the
    -- same (step 1 gave the follower nothing to learn), the follower's are not
    assert.are.equal(plain.history[3]["adv/lead/abs_max"], r.history[3]["adv/lead/abs_max"])
    assert.are_not.equal(plain.history[3]["adv/follow/abs_max"], r.history[3]["adv/follow/abs_max"])
  end)

  it("is deterministic given the seed: metrics, trace and weights", function()
    local function run(name)
      local lead, follow = model(1), model(2)
      local r = rl.multi.train(opts(dir, { name = name, steps = 3, eval = { every = 3, tasks = 4 },
        agents = { lead = { model = lead, tokenizer = tok }, follow = { model = follow, tokenizer = tok } } }))
      local f = assert(io.open(dir .. "/" .. name .. "/trace.jsonl"))
      local trace = f:read("a")
      f:close()
      return strip_times(r.history), trace, weights(lead, dir, name .. "-l"), weights(follow, dir, name .. "-f")
    end
    local h1, t1, l1, f1 = run("a")
    local h2, t2, l2, f2 = run("b")
    assert.are.same(h1, h2)
    assert.are.equal(t1, t2)
    assert.are.equal(l1, l2)
    assert.are.equal(f1, f2)
    assert.is_number(h1[#h1]["eval/success"])
    -- another seed samples other episodes
    local lead, follow = model(1), model(2)
    rl.multi.train(opts(dir, { name = "c", seed = 4, steps = 3, agents = { lead = { model = lead, tokenizer = tok },
      follow = { model = follow, tokenizer = tok } } }))
    local f = assert(io.open(dir .. "/c/trace.jsonl"))
    assert.are_not.equal(t1, f:read("a"))
    f:close()
  end)

  it("writes the orchestration trace: who acted at which turn, on what, with what, at what cost", function()
    rl.multi.train(opts(dir, { agents = { lead = { model = model(1), tokenizer = tok },
      follow = { model = model(2), tokenizer = tok } } }))
    local lines = H.read_json_lines(dir .. "/run/trace.jsonl")
    assert.are.equal(6, #lines) -- 3 a step
    -- the first episode of each group, then the second of the first
    assert.are.same({ 1, 5, 2 }, { lines[1].episode, lines[2].episode, lines[3].episode })
    for _, t in ipairs(lines) do
      assert.are.equal(3, #t.turns)
      local a, b, c = t.turns[1], t.turns[2], t.turns[3]
      assert.are.same({ "lead", 1, 1, 1 }, { a.agent, a.round, a.invocation, a.turn })
      assert.are.equal("task " .. t.task.n, a.given)
      assert.are.same({ "follow", 2, 2, 1, 2 }, { b.agent, b.round, b.invocation, b.k, b.turn })
      assert.are.equal("lead said: " .. a.returned, b.given)
      assert.are.same({ "follow", 2, 3 }, { c.agent, c.k, c.turn })
      assert.are.equal("again", c.given) -- the observation its previous turn got
      assert.is_false(c.done) -- the environment did not end it: its turn limit did
      assert.are.equal("max_turns", c["end"])
      assert.are.equal("done", a["end"])
      assert.is_nil(b["end"])
      -- the rewards: each turn's, the lead's with finish() added; per agent, their sums
      assert.are.equal(b.reward + c.reward, t.rewards.follow)
      local bonus = t.rewards.follow >= 20 and 1 or 0
      assert.are.equal(#a.returned % 3 + bonus, a.reward)
      assert.are.equal(a.reward, t.rewards.lead)
      assert.are.equal(t.rewards.follow >= 20, t.success)
      -- tokens: what each turn was given (the first one's prompt holds its observation) and
      -- returned, summed per agent
      assert.is_true(a.tokens.given > #a.given)
      assert.is_true(b.tokens.given > #b.given)
      assert.is_true(c.tokens.given >= #c.given)
      for _, turn in ipairs(t.turns) do
        assert.is_true(turn.tokens.returned >= 1 and turn.tokens.returned <= 4)
      end
      assert.are.same({ given = b.tokens.given + c.tokens.given, returned = b.tokens.returned + c.tokens.returned },
        t.tokens.follow)
      assert.are.same(a.tokens, t.tokens.lead)
    end
  end)

  it("warm-starts the agents that have sft on their oracles' demonstrations, frozen ones too", function()
    package.path = H.root .. "/?.lua;" .. package.path
    local planact = require "envs.planact"
    local planner, executor = model(1), model(2)
    local p0, e0 = weights(planner, dir, "p0"), weights(executor, dir, "e0")
    local r = rl.multi.train(opts(dir, { env = planact, steps = 0, max_turn_tokens = 12, agents = {
      planner = { model = planner, tokenizer = tok, trainable = false, sft = { examples = 12, epochs = 1 } },
      executor = { model = executor, tokenizer = tok } } }))
    assert.are.equal(12, r.sft.planner.examples)
    assert.is_number(r.sft.planner.final_loss)
    assert.is_nil(r.sft.executor)
    assert.are_not.equal(p0, weights(planner, dir, "p1"))
    assert.are.equal(e0, weights(executor, dir, "e1"))
    -- the demonstrations are the oracles' play: the planner's a plan, the executor's tries
    local data = rl.multi.oracle_examples(planact, { planner = { sft = { examples = 3 }, tokenizer = tok },
      executor = { sft = { examples = 3 }, tokenizer = tok } }, 7)
    assert.are.equal(3, #data.planner)
    assert.is_true(#data.executor >= 3)
    local text = tok:decode(data.planner[1].tokens)
    assert.matches("plan [rgbypo] [rgbypo]", text)
    assert.matches("try [rgbypo]", tok:decode(data.executor[1].tokens))
  end)

  it("lets an agent act again in a later round: each invocation its own row, in its own context", function()
    local r = rl.multi.train(opts(dir, { env = relay_again, steps = 1, agents = {
      lead = { model = model(1), tokenizer = tok }, follow = { model = model(2), tokenizer = tok } } }))
    assert.are.equal(16, r.history[2]["invocations/lead"])
    assert.are.equal(8, r.history[2]["invocations/follow"])
    local t = H.read_json_lines(dir .. "/run/trace.jsonl")[1]
    assert.are.same({ "lead", "follow", "follow", "lead" }, { t.turns[1].agent, t.turns[2].agent, t.turns[3].agent,
      t.turns[4].agent })
    assert.are.same({ 1, 2, 2, 3 }, { t.turns[1].round, t.turns[2].round, t.turns[3].round, t.turns[4].round })
    assert.are.equal(3, t.turns[4].invocation)
    assert.are.equal("follow is done", t.turns[4].given)
    -- a fresh context: its prompt is about as long as the first invocation's, not the history
    assert.is_true(math.abs(t.turns[4].tokens.given - t.turns[1].tokens.given) <= #"follow is done")
    -- both lead invocations got the finish() reward
    local bonus = (t.turns[2].reward + t.turns[3].reward) >= 20 and 1 or 0
    assert.are.equal(#t.turns[4].returned % 3 + bonus, t.turns[4].reward)
    assert.are.equal(t.turns[1].reward + t.turns[4].reward, t.rewards.lead)
  end)

  it("ends an episode after max_rounds invocations, whatever next() says", function()
    local loop = setmetatable({ name = "loop", new = function()
      return { reset = function() end, next = function() return "lead", "more" end,
        step = function() return "ok", 1, true, {} end }
    end }, { __index = relay })
    local r = rl.multi.train(opts(dir, { env = loop, steps = 1, max_rounds = 3, agents = {
      lead = { model = model(1), tokenizer = tok }, follow = { model = model(2), tokenizer = tok } } }))
    assert.are.equal(8 * 3, r.history[2]["invocations/lead"])
    assert.is_nil(r.history[2]["invocations/follow"])
    assert.are.equal(0, r.history[2]["loss/lead/updates"]) -- every row's reward 1: nothing to learn
  end)

  it("refuses to overwrite an earlier run unless told to", function()
    local o = opts(dir, { steps = 1, agents = { lead = { model = model(1), tokenizer = tok },
      follow = { model = model(2), tokenizer = tok } } })
    rl.multi.train(o)
    o.overwrite = false
    H.assert_error(function() rl.multi.train(o) end, { "holds an earlier run", "overwrite = true" })
  end)
end)

-- Rows of hand-made per-agent batches: {agent = {{reward =, group =, traj =}, ...}}.
local function batches(spec, ids)
  local out = {}
  for a, rows in pairs(spec) do
    local eps = {}
    for j, r in ipairs(rows) do eps[j] = { reward = r[1], group = r[2], traj = r[3], agent = ids[a] } end
    out[a] = { episodes = eps }
  end
  return out
end

-- Mean and unbiased std (std 1, mean 0 for a group of one: verl's convention).
local function stats(xs)
  if #xs == 1 then return 0, 1 end
  local s = 0
  for _, x in ipairs(xs) do s = s + x end
  local m, q = s / #xs, 0
  for _, x in ipairs(xs) do q = q + (x - m) * (x - m) end
  return m, math.sqrt(q / (#xs - 1))
end

describe("rl.multi.advantages", function()
  local env = { agents = { "planner", "executor" } }
  local ids = { planner = 1, executor = 2 }
  -- two prompt groups; the planner's rewards 0/1 once per episode, the executor's 0..30, twice in
  -- some episodes (every invocation is a row: no deduplication); one executor row alone in its
  -- (group, agent)
  local spec = {
    planner = { { 1, 1, 1 }, { 0, 1, 2 }, { 0, 1, 3 }, { 1, 2, 4 }, { 0, 2, 5 } },
    executor = { { 30, 1, 1 }, { 6, 1, 2 }, { 13, 1, 3 }, { 20, 1, 3 }, { 17, 2, 4 } },
  }
  local eps = 1e-6

  it("normalises each agent's rows within (prompt group, agent): Dr. MAS", function()
    local c = { env = env, advantage = "drmas", norm_adv_by_std = true, adv_epsilon = eps }
    local got = rl.multi.advantages(c, batches(spec, ids))
    for a, rows in pairs(spec) do
      for j, r in ipairs(rows) do
        local xs = {}
        for _, q in ipairs(rows) do if q[2] == r[2] then xs[#xs + 1] = q[1] end end
        local m, s = stats(xs)
        assert.is_true(math.abs(got[a][j] - (r[1] - m) / (s + eps)) < 1e-5, a .. " row " .. j)
      end
    end
    -- the singleton executor row keeps its raw score / (1 + eps): 17
    assert.is_true(math.abs(got.executor[5] - 17 / (1 + eps)) < 1e-4)
    -- without std: centred only
    c.norm_adv_by_std = false
    local centred = rl.multi.advantages(c, batches(spec, ids))
    assert.is_true(math.abs(centred.executor[1] - (30 - (30 + 6 + 13 + 20) / 4)) < 1e-4)
  end)

  it("the global baseline normalises each episode's mean row score over its group, for every row", function()
    local c = { env = env, advantage = "grpo", norm_adv_by_std = true, adv_epsilon = eps }
    local got = rl.multi.advantages(c, batches(spec, ids))
    -- an episode's score: the mean of all its rows' (every agent's) scores
    local sum, cnt, group = {}, {}, {}
    for _, rows in pairs(spec) do
      for _, r in ipairs(rows) do
        sum[r[3]], cnt[r[3]], group[r[3]] = (sum[r[3]] or 0) + r[1], (cnt[r[3]] or 0) + 1, r[2]
      end
    end
    local want = {}
    for t = 1, 5 do
      local xs = {}
      for u = 1, 5 do if group[u] == group[t] then xs[#xs + 1] = sum[u] / cnt[u] end end
      local m, s = stats(xs)
      want[t] = (sum[t] / cnt[t] - m) / (s + eps)
    end
    for a, rows in pairs(spec) do
      for j, r in ipairs(rows) do
        assert.is_true(math.abs(got[a][j] - want[r[3]]) < 1e-5, a .. " row " .. j)
      end
    end
    -- so the planner and the executor of one episode share one value, and the planner's 0/1
    -- rewards are drowned by the executor's scale: episode 1 (planner 1) and episode 2 (planner 0)
    -- rank by the executor's rewards alone
    assert.are.equal(got.planner[1], got.executor[1])
    local wise = rl.multi.advantages({ env = env, advantage = "drmas", norm_adv_by_std = true, adv_epsilon = eps },
      batches(spec, ids))
    assert.is_true(wise.planner[1] > 0 and wise.planner[2] < 0)
    assert.is_true(math.abs(got.planner[2] - wise.planner[2]) > 0.1)
  end)

  it("normalises an agent's rows within the groups regroup gives them, the other agents' as before", function()
    -- the executor's rows regrouped by reward parity, across prompt groups: {30, 6, 20} and {13, 17}
    local regroup = { executor = function(rows)
      local keys = {}
      for j, row in ipairs(rows) do keys[j] = row.reward % 2 == 0 and "even" or 7 end
      return keys
    end }
    local c = { env = env, advantage = "drmas", norm_adv_by_std = true, adv_epsilon = eps, regroup = regroup }
    local b = batches(spec, ids)
    rl.multi.regroup(c, b)
    assert.are.same({ "even", "even", 7, "even", 7 }, { b.executor.episodes[1].adv_group, b.executor.episodes[2].adv_group,
      b.executor.episodes[3].adv_group, b.executor.episodes[4].adv_group, b.executor.episodes[5].adv_group })
    assert.is_nil(b.planner.episodes[1].adv_group)
    local got = rl.multi.advantages(c, b)
    local plain = rl.multi.advantages({ env = env, advantage = "drmas", norm_adv_by_std = true, adv_epsilon = eps },
      batches(spec, ids))
    assert.are.same(plain.planner, got.planner)
    for j, r in ipairs(spec.executor) do
      local xs = {}
      for _, q in ipairs(spec.executor) do if q[1] % 2 == r[1] % 2 then xs[#xs + 1] = q[1] end end
      local m, s = stats(xs)
      assert.is_true(math.abs(got.executor[j] - (r[1] - m) / (s + eps)) < 1e-5, "executor row " .. j)
    end
  end)

  it("refuses regroup keys that are not one number or string per row", function()
    local function with(f)
      local c = { env = env, advantage = "drmas", regroup = { executor = f } }
      return function() rl.multi.regroup(c, batches(spec, ids)) end
    end
    H.assert_error(with(function() return { 1, 2 } end), "regroup.executor returned")
    H.assert_error(with(function() return { 1, 2, 3, 4, {} } end), "regroup.executor: key 5 is")
    H.assert_error(with(function() return nil end), "not a list of 5 keys")
  end)
end)

describe("rl.multi.trigram_groups", function()
  -- Jaccard of byte-trigram sets, written out
  local function jaccard(a, b)
    local function grams(t)
      local set = {}
      for p = 1, math.max(1, #t - 2) do set[t:sub(p, p + 2)] = true end
      return set
    end
    local x, y, common, union = grams(a), grams(b), 0, 0
    for g in pairs(x) do union = union + 1 if y[g] then common = common + 1 end end
    for g in pairs(y) do if not x[g] then union = union + 1 end end
    return common / union
  end

  it("links texts at Jaccard >= threshold and keys each connected set by its first text", function()
    local texts = { "ann boss", "kim city", "ann boss", "ann bos", "kim cit", "zed pet", "ann boss " }
    local got = rl.multi.trigram_groups(texts, 0.5)
    assert.are.equal(#texts, #got)
    -- the same key exactly when a chain of links >= 0.5 joins two texts (checked by a closure here)
    local reach = {}
    for i = 1, #texts do
      reach[i] = { [i] = true }
      for j = 1, #texts do if jaccard(texts[i], texts[j]) >= 0.5 then reach[i][j] = true end end
    end
    for _ = 1, #texts do
      for i = 1, #texts do
        for j in pairs(reach[i]) do for k in pairs(reach[j]) do reach[i][k] = true end end
      end
    end
    for i = 1, #texts do
      local first = i
      for j = 1, i do if reach[i][j] then first = j break end end
      assert.are.equal(first, got[i], texts[i])
    end
    assert.are.equal(1, got[4]) -- "ann bos": 5 of 6 trigrams shared with "ann boss"
    assert.are.equal(6, got[6]) -- alone
    assert.is_true(jaccard("ann boss", "kim boss") < 0.5 and got[2] ~= got[1])
    assert.are.same({ 1, 1, 1 }, rl.multi.trigram_groups({ "ab", "ab", "ab" }))
    assert.are.same({ 1, 2, 3 }, rl.multi.trigram_groups({ "ann boss", "ann city", "ann pet" }, 0.5))
    assert.are.same({ 1, 1, 1 }, rl.multi.trigram_groups({ "ann boss", "ann city", "ann pet" }, 0))
  end)

  it("refuses what is not a list of strings and a threshold outside [0, 1]", function()
    H.assert_error(function() rl.multi.trigram_groups("x") end, "texts: a list of strings")
    H.assert_error(function() rl.multi.trigram_groups({ "a", 2 }) end, "texts[2]: a string")
    H.assert_error(function() rl.multi.trigram_groups({ "a" }, 1.5) end, "threshold: a number in [0, 1]")
  end)
end)

describe("rl.multi options", function()
  local function base(over)
    local m1, m2 = model(1), model(2)
    local o = { env = relay, eval = false, steps = 0, agents = { lead = { model = m1, tokenizer = tok },
      follow = { model = m2, tokenizer = tok } } }
    for k, v in pairs(over or {}) do o[k] = v end
    return o, m1
  end
  local function fails(o, wanted) H.assert_error(function() rl.multi.options(o) end, wanted) end

  it("names the option that is wrong", function()
    fails(base { stepz = 3 }, { "unknown field 'stepz'", "did you mean 'steps'?" })
    fails(base { advantage = "gae" }, "advantage")
    fails(base { steps = -1 }, "steps")
    fails(base { clip_low = -1 }, "clip_low")
    fails(base { eval = { evry = 2 } }, { "eval", "evry" })
    fails(base { grad_spike = { factor = 0 } }, { "grad_spike", "factor" })
    fails(base { env = { name = "x", new = function() end, tasks = function() end } }, { "env", "agents" })
    fails(base { agents = 3 }, "agents")
    local o = base()
    o.agents.leed = o.agents.lead
    fails(o, { "agents: 'leed' is not an agent of relay", "did you mean 'lead'?" })
    o = base()
    o.agents.follow = nil
    fails(o, { "agents", "'follow' has no model" })
    o = base()
    o.agents.lead.lr = 0
    fails(o, "agents.lead: lr")
    o = base()
    o.agents.lead.trainable = "yes"
    fails(o, "agents.lead: trainable")
    o = base()
    o.agents.lead.model = nil
    fails(o, { "agents.lead: model", "required" })
    o = base()
    o.agents.lead.sft = { examples = 4 }
    fails(o, "agents.lead.sft: relay has no oracles.lead")
    o = base()
    o.agents.lead.sft = { exampels = 4 }
    fails(o, { "agents.lead.sft", "exampels" })
    fails(base { regroup = { leed = function() end } }, "regroup: 'leed' is not an agent of relay")
    fails(base { regroup = { lead = 3 } }, "regroup.lead: a function")
    fails(base { regroup = { lead = function() end }, advantage = "grpo" }, "regroup: needs advantage = \"drmas\"")
  end)

  it("refuses a frozen agent that shares its model with a trainable one", function()
    local o, m1 = base()
    o.agents.follow = { model = m1, tokenizer = tok, trainable = false }
    fails(o, { "agents.follow: trainable = false", "shares its model", "agents.lead" })
    o = base()
    o.agents.follow = { model = o.agents.lead.model, tokenizer = tok, lr = 5e-3 }
    o.agents.lead.lr = 1e-3
    fails(o, "agents.follow.lr: differs from agents.lead.lr")
  end)

  it("fills in the defaults", function()
    local c = rl.multi.options((base()))
    assert.are.equal("drmas", c.advantage)
    assert.is_true(c.norm_adv_by_std)
    assert.are.equal(2, #c.units)
    assert.are.same({ "lead" }, c.units[1].agents)
    assert.are.equal(1e-3, c.units[1].cfg.lr)
    assert.are.equal("ppo", c.units[1].cfg.loss)
  end)
end)
