-- reward_spec.lua - rl.reward, the reward graph: the acceptance tests of shared/spec/agentlib.md
-- (1 exact composition and GDPO, 2 skip is not zero, 3 gates, 4 judge cache and budgets, 5
-- order-invariant ranking, 6 dense process rewards, 7 logging, 8 hot reload, 9 attribution), then
-- the terms one by one and every constructor's refusal of bad input. Judges talk to mock client
-- objects; clocks are injected, so nothing sleeps and nothing depends on timing.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local V = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "vectors.lua")
local rl = require "moonrl"

V = V(rl)
local R = rl.reward
local T = rl.tensor
local advantages = rl.train.advantage.compute

local tmpdir = H.tmpdir

local read_lines = H.read_json_lines

local function write(path, text)
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
end

-- A hand-made batch: one prompt token, then per turn one action token (mask 1) and one
-- observation token. Episodes need group and record; reward, turns, seed are filled in.
local function fake_batch(eps)
  local tokens, mask, turns, offsets = {}, {}, {}, { 0 }
  for i, ep in ipairs(eps) do
    tokens[#tokens + 1], mask[#mask + 1], turns[#turns + 1] = 1, 0, -1
    for k = 1, #ep.record do
      tokens[#tokens + 1], mask[#mask + 1], turns[#turns + 1] = 97, 1, k - 1
      tokens[#tokens + 1], mask[#mask + 1], turns[#turns + 1] = 2, 0, k - 1
    end
    offsets[#offsets + 1] = #tokens
    ep.turns = #ep.record
    ep.reward = ep.reward or 0
    ep.seed = ep.seed or i
  end
  return rl.batch.new { tokens = T.from(tokens), logprobs = T.zeros { #tokens }, mask = T.from(mask),
    turns = T.from(turns), offsets = offsets, episodes = eps }
end

-- One-turn episodes with the given answers, `size` to a group.
local function answers_batch(answers, size)
  local eps = {}
  for i, a in ipairs(answers) do
    eps[i] = { group = (i - 1) // size + 1, task = { q = "task " .. ((i - 1) // size + 1) },
      record = { { action = a, reward = 0, done = true, info = {} } } }
  end
  return fake_batch(eps)
end

-- The per-token advantage of each turn of episode i (its action token).
local function turn_values(b, adv, i)
  local out = {}
  for p = b.offsets[i] + 1, b.offsets[i + 1] do
    if b.mask:get(p) ~= 0 then out[#out + 1] = adv:get(p) end
  end
  return out
end

-- A mock judge: answers "yes" when the prompt's answer is lowercase; counts its calls and what it
-- was asked with.
local function mock_judge(reply)
  local c = { calls = 0, seen = {} }
  function c:chat(messages, opts)
    self.calls = self.calls + 1
    self.seen[#self.seen + 1] = { messages = messages, opts = opts }
    if reply then return reply(messages, opts) end
    local text = messages[#messages].content
    return text:match("answer: %l") and "Yes." or "No.", { prompt_tokens = #text // 4, completion_tokens = 1 }
  end
  return c
end

-- A one-turn environment: reward 1 when the reply starts with a lowercase letter.
local letter_env = H.letter_env()
local tok = rl.tokenizer.bytes()
local function letter_run(dir, extra)
  local o = { model = rl.model.new { vocab = 264, dim = 32, layers = 1, heads = 2, ffn = 64, ctx = 32,
    seed = 3 }, tokenizer = tok, env = letter_env, dir = dir, name = "graph", seed = 4, steps = 3,
    tasks_per_step = 2, group_size = 4, max_turn_tokens = 2, lr = 1e-2, eval = false, progress = false }
  for k, v in pairs(extra or {}) do o[k] = v end
  return rl.train(o)
end

describe("rl.reward acceptance", function()
  -- 1. Exact composition
  it("1: a 4-term graph (weights 1, .5, .1, 0) equals the hand computation on 64 episodes", function()
    local eps = {}
    for i = 1, 64 do
      eps[i] = { group = (i - 1) // 8 + 1, seed = i, success = i % 3 == 0,
        record = { { action = string.rep("x", i % 5 + 1), reward = (i % 3 == 0) and 1 or 0 } } }
    end
    local b = fake_batch(eps)
    local fa = function(ep) return ep.success and 1 or 0 end
    local fb = function(ep) return math.sin(ep.seed) end
    local fc = function(ep) return math.sqrt(ep.seed) / 7 end
    local fd = function(ep) return ep.seed * 1000 end
    local g = R.graph { terms = { R.fn("a", fa), R.fn("b", fb, { weight = 0.5 }),
      R.fn("c", fc, { weight = 0.1 }), R.metric("d", fd) } }
    local scores = g:score(b)
    local worst = 0
    for i, ep in ipairs(b.episodes) do
      local want = ((0 + 1 * fa(ep)) + 0.5 * fb(ep)) + 0.1 * fc(ep)
      worst = math.max(worst, math.abs(scores[i].total - want), math.abs(ep.reward - want))
      assert.are.equal(fd(ep), ep.reward_terms.d) -- the metric is kept, not added
      assert.are.equal("ok", scores[i].status)
      assert.are.equal(1, ep.reward_version)
    end
    assert.is_true(worst <= 1e-12, "max difference " .. worst)
  end)

  it("1: under per_term the term vectors (1,0) and (0,1) get different advantages, equal under sum", function()
    -- a group where the first term is common and the second rare: GDPO credits the rare one more
    local vecs = { { 1, 0 }, { 0, 1 }, { 1, 0 }, { 0, 0 } }
    local function run(combine)
      local eps = {}
      for i, v in ipairs(vecs) do eps[i] = { group = 1, seed = i, record = { { action = "a", reward = 0 } }, v = v } end
      local b = fake_batch(eps)
      local g = R.graph { combine = combine, terms = { R.fn("x", function(ep) return ep.v[1] end),
        R.fn("y", function(ep) return ep.v[2] end) } }
      g:score(b)
      local _, per = advantages({ cfg = { advantage = combine == "per_term" and "gdpo" or "grpo", reward = g } }, b)
      local direct = g:advantages(b)
      for i = 1, #vecs do assert.is_near(per[i], direct[i], 1e-12) end
      return per
    end
    local sum, gdpo = run("sum"), run("per_term")
    assert.are.equal(sum[1], sum[2])
    assert.is_true(math.abs(gdpo[1] - gdpo[2]) > 0.1, string.format("%g vs %g", gdpo[1], gdpo[2]))
    assert.is_true(gdpo[2] > gdpo[1]) -- the rare term's success counts more
  end)

  it("1: per_term matches verl's GDPO vectors to 1e-6 (the trainer's advantage stage and g:advantages)", function()
    local doc = V.read(H.root .. "/tests/advantage/verl_vectors.json")
    local checked = 0
    for _, case in ipairs(doc.cases) do
      if case.method == "gdpo" and case.inputs.reward_terms and not case.outputs.error
          and case.params.norm_adv_by_std ~= false then
        local inputs = V.from_json(case.inputs, true)
        local ids, eps = {}, {}
        for i, row in ipairs(inputs.response_mask) do
          local n = 0
          for _, m in ipairs(row) do n = n + m end
          local key = tostring(inputs.index[i])
          ids[key] = ids[key] or (#eps + 1)
          local rec = {}
          for k = 1, n do rec[k] = { action = "a", reward = 0 } end
          eps[i] = { group = ids[key], row = i, record = rec }
        end
        local b = fake_batch(eps)
        local list = {}
        local weights = case.params.weights or {}
        for k in ipairs(inputs.reward_terms) do
          list[k] = R.fn("t" .. k, function(ep) return inputs.reward_terms[k][ep.row] end,
            { weight = weights[k] or 1 })
        end
        local g = R.graph { combine = "per_term", terms = list }
        g:score(b)
        local adv, per = advantages({ cfg = { advantage = "gdpo", reward = g } }, b)
        local direct = g:advantages(b)
        for i, row in ipairs(case.outputs.advantages) do
          local want = row[1]
          assert.is_near(want, per[i], 1e-6, case.name .. " episode " .. i)
          assert.is_near(want, direct[i], 1e-6, case.name .. " episode " .. i)
          for _, v in ipairs(turn_values(b, adv, i)) do assert.is_near(want, v, 1e-6) end
        end
        checked = checked + 1
      end
    end
    assert.is_true(checked >= 3, "GDPO cases checked: " .. checked)
  end)

  -- 2. Skip is not zero
  it("2: two unscorable episodes of a group of 8 leave the baseline of the other 6 and get 0", function()
    local values = { 0.3, 1.2, -0.4, 0.9, 0.0, 2.5, 1.1, -1.0 }
    local eps = {}
    for i = 1, 8 do eps[i] = { group = 7, seed = i, record = { { action = "a", reward = 0 }, { action = "b", reward = 0 } } } end
    local g = R.graph { terms = { R.fn("score", function(ep)
      if ep.seed == 3 then return R.SKIP end
      if ep.seed == 6 then error("the checker crashed") end
      return values[ep.seed]
    end) } }
    for _, method in ipairs { "grpo", "rloo", "gigpo" } do
      local b = fake_batch(eps)
      local scores = g:score(b)
      assert.are.equal("unscorable", scores[3].status)
      assert.are.equal("unscorable", scores[3].terms.score.status)
      assert.is_nil(scores[3].terms.score.value) -- not 0
      assert.are.equal("error", scores[6].terms.score.status)
      assert.matches("the checker crashed", scores[6].terms.score.message)
      assert.are.equal("unscorable", b.episodes[6].reward_status)
      local adv, per = advantages({ cfg = { advantage = method, reward = g } }, b)
      -- the same estimator on the six scorable episodes alone
      local six, keep = {}, {}
      for i = 1, 8 do
        if i ~= 3 and i ~= 6 then
          keep[#keep + 1] = i
          six[#six + 1] = { group = 7, seed = i, record = { { action = "a", reward = 0 }, { action = "b", reward = 0 } } }
        end
      end
      local b6 = fake_batch(six)
      g:score(b6)
      local adv6, per6 = advantages({ cfg = { advantage = method, reward = g } }, b6)
      for k, i in ipairs(keep) do
        assert.are.equal(per6[k], per[i], method .. " episode " .. i)
        assert.are.same(turn_values(b6, adv6, k), turn_values(b, adv, i))
      end
      for _, i in ipairs { 3, 6 } do
        assert.are.equal(0, per[i])
        assert.are.same({ 0, 0 }, turn_values(b, adv, i))
      end
      -- with all 8 in the baseline (the skips scored 0) the others' advantages would differ
      local zeros = {}
      for i = 1, 8 do zeros[i] = (i == 3 or i == 6) and 0 or values[i] end
      local wrong = rl.objective.advantage { method = "grpo", scores = zeros, groups = { 1, 1, 1, 1, 1, 1, 1, 1 } }
      if method == "grpo" then assert.is_true(math.abs(wrong[1] - per[1]) > 1e-3) end
      local st = b:stats()
      assert.are.equal(2, st.unscorable)
    end
  end)

  it("2: a judge that times out makes the episode unscorable (never 0), after its retries", function()
    local clock = H.fake_clock()
    local client = mock_judge(function() return nil, "deadline exceeded", { timeout = true } end)
    local g = R.graph { terms = { R.env(), R.judge { name = "judge", client = client, prompt = "answer: {answer}",
      retries = 2, timeout = 5, clock = clock } } }
    local b = answers_batch({ "a", "b", "c", "d" }, 4)
    local scores = g:score(b)
    for i = 1, 4 do
      assert.are.equal("unscorable", scores[i].status)
      assert.are.equal("unscorable", scores[i].terms.judge.status)
      assert.is_nil(scores[i].terms.judge.value)
      assert.matches("timed out", scores[i].terms.judge.message)
    end
    assert.are.equal(4 * 3, client.calls) -- each try and two retries
    assert.are.equal(5, client.seen[1].opts.timeout)
    assert.is_true(clock.slept > 0) -- backed off between tries, on the injected clock
    local st = g:stats()
    assert.are.equal(1, st.terms.judge.skip)
    assert.are.equal(12, st.terms.judge.timeouts)
    local _, per = advantages({ cfg = { advantage = "grpo", reward = g } }, b)
    for i = 1, 4 do assert.are.equal(0, per[i]) end
    -- on_error = "fail" stops the scoring instead
    local failing = R.graph { terms = { R.judge { name = "judge", client = client, prompt = "answer: {answer}",
      on_error = "fail", clock = clock } } }
    H.assert_error(function() failing:score(answers_batch({ "a" }, 1)) end, { "judge judge", "timed out" })
  end)

  -- 3. Gates
  it("3: a style term gated on correct adds exactly 0 to wrong episodes; stats().gated is the wrong share", function()
    local eps, wrong = {}, 0
    for i = 1, 64 do
      local right = (i * 7) % 5 < 2
      if not right then wrong = wrong + 1 end
      eps[i] = { group = (i - 1) // 8 + 1, seed = i, success = right,
        record = { { action = (i % 2 == 0) and "ok" or "OK", reward = right and 1 or 0 } } }
    end
    local b = fake_batch(eps)
    local g = R.graph { terms = {
      R.fn("correct", function(ep) return ep.success and 1 or 0 end),
      R.format { name = "style", pattern = "^%l+$", weight = 0.25, gate = "correct" },
      R.fn("length", function(ep) return -0.01 * ep.length end),
    } }
    local scores = g:score(b)
    for i, ep in ipairs(b.episodes) do
      local s = scores[i]
      if not ep.success then
        assert.are.equal("gated", s.terms.style.status)
        assert.are.equal(0, ep.reward_terms.style)
        assert.are.equal((0 + 0) + -0.01 * ep.length, s.total) -- exactly: style added nothing
      else
        assert.are.equal("ok", s.terms.style.status)
      end
    end
    assert.are.equal(wrong / 64, g:stats().terms.style.gated)
    assert.is_true(wrong > 0 and wrong < 64)
    -- a gate function sees the earlier terms' values
    local g2 = R.graph { terms = { R.fn("correct", function(ep) return ep.success and 1 or 0 end),
      R.fn("bonus", function() return 1 end, { gate = function(_, values) return values.correct == 1 end }) } }
    g2:score(b)
    assert.are.equal(wrong / 64, g2:stats().terms.bonus.gated)
  end)

  -- 4. Judge cache and budgets
  local CACHE_SCRIPT = [==[
local rl = require "moonrl"
local path, model, temperature = arg[1], arg[2], tonumber(arg[3])
local client = { calls = 0 }
function client:chat(messages) self.calls = self.calls + 1 return "yes" end
local eps, tokens, offsets = {}, {}, { 0 }
for i = 1, 16 do
  eps[i] = { group = (i - 1) // 4 + 1, reward = 0, seed = i, task = { q = "t" .. i },
    record = { { action = "answer " .. i, reward = 0 } } }
  tokens[#tokens + 1] = 97
  offsets[#offsets + 1] = #tokens
end
local T = rl.tensor
local b = rl.batch.new { tokens = T.from(tokens), logprobs = T.zeros { #tokens }, mask = T.ones { #tokens },
  turns = T.zeros { #tokens }, offsets = offsets, episodes = eps }
local g = rl.reward.graph { terms = { rl.reward.judge { name = "judge", client = client, model = model,
  prompt = "Is {answer} right for {task}?", sampling = { temperature = temperature }, cache = path } } }
g:score(b)
local first = client.calls
g:score(b)
print(string.format("calls %d then %d", first, client.calls - first))
]==]

  it("4: scoring twice makes N calls, then 0; the cache survives a new process; another model or sampling misses", function()
    local dir = tmpdir()
    local cache = dir .. "/judge_cache.jsonl"
    local function run(model, temp)
      local out, _, ok = H.run_lua(CACHE_SCRIPT, cache, model, temp)
      assert.is_true(ok, out)
      return out
    end
    assert.matches("calls 16 then 0", run("judge-a", "0"))
    assert.matches("calls 0 then 0", run("judge-a", "0"))  -- another process: all from the file
    assert.matches("calls 16 then 0", run("judge-b", "0")) -- another model misses
    assert.matches("calls 16 then 0", run("judge-a", "0.5")) -- other sampling misses
    assert.matches("calls 0 then 0", run("judge-b", "0"))
    assert.are.equal(48, #read_lines(cache))
    -- in this process: a judge with cache = false asks every time
    local client = mock_judge()
    local g = R.graph { terms = { R.judge { name = "judge", client = client, prompt = "answer: {answer}", cache = false } } }
    local b = answers_batch({ "a", "b", "c", "d" }, 2)
    g:score(b)
    g:score(b)
    assert.are.equal(8, client.calls)
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)

  it("4: rpm = 60 is never exceeded over 2 simulated minutes; tpm and call budgets hold", function()
    local clock = H.fake_clock()
    local times = {}
    local client = mock_judge(function()
      times[#times + 1] = clock.t
      clock.t = clock.t + 0.25 -- each call takes a quarter of a second
      return "yes", { prompt_tokens = 90, completion_tokens = 10 }
    end)
    local g = R.graph { terms = { R.judge { name = "judge", client = client, prompt = "answer: {answer} ({task})",
      cache = false, rpm = 60, clock = clock } } }
    local round = 0
    while clock.t < 120 do
      round = round + 1
      local answers = {}
      for i = 1, 16 do answers[i] = "a" .. round .. "-" .. i end
      g:score(answers_batch(answers, 4))
    end
    local worst = 0
    for i, t in ipairs(times) do
      local n = 0
      for j = i, #times do if times[j] < t + 60 then n = n + 1 end end
      worst = math.max(worst, n)
    end
    assert.are.equal(60, worst) -- the limit, reached and never passed
    assert.is_true(#times >= 120, "calls in 2 minutes: " .. #times)
    -- tpm: 100 tokens a call, 1000 a minute
    clock = H.fake_clock()
    times = {}
    local g2 = R.graph { terms = { R.judge { name = "judge", client = client, prompt = "answer: {answer}",
      cache = false, tpm = 1000, clock = clock } } }
    for round2 = 1, 3 do
      local answers = {}
      for i = 1, 10 do answers[i] = "b" .. round2 .. i end
      g2:score(answers_batch(answers, 5))
    end
    for i, t in ipairs(times) do
      local n = 0
      for j = i, #times do if times[j] < t + 60 then n = n + 1 end end
      assert.is_true(n <= 10, "calls in a minute: " .. n)
    end
    -- a budget of 5 calls: then the judge stops and the rest is unscorable
    local counted = mock_judge()
    local g3 = R.graph { terms = { R.judge { name = "judge", client = counted, prompt = "answer: {answer}",
      cache = false, budget = { calls = 5 } } } }
    local scores = g3:score(answers_batch({ "a", "b", "c", "d", "e", "f", "g", "h" }, 4))
    assert.are.equal(5, counted.calls)
    for i = 6, 8 do
      assert.are.equal("unscorable", scores[i].status)
      assert.matches("budget spent", scores[i].terms.judge.message)
    end
    -- cost: the client's, or from price per token
    local priced = R.graph { terms = { R.judge { name = "judge", client = mock_judge(), prompt = "answer: {answer}",
      price = { prompt = 0.001, completion = 0.002 }, budget = { cost = 1 } } } }
    priced:score(answers_batch({ "aaaaaaaa", "bbbbbbbb" }, 2))
    assert.is_true(priced:stats().judge.judge.cost > 0)
  end)

  -- 5. Order-invariant ranking
  it("5: 10 shuffles of a group give identical rank scores, with one call per group", function()
    -- the mock ranks the candidates shown by the number in their text, largest first
    local orders = {}
    local client = mock_judge(function(messages)
      local shown = {}
      for k, text in messages[#messages].content:gmatch("%[(%d+)%] ([^\n]*)") do
        shown[#shown + 1] = { k = tonumber(k), v = tonumber(text:match("%d+")) }
      end
      local key = {}
      for _, s in ipairs(shown) do key[#key + 1] = s.v end
      orders[table.concat(key, ",")] = true
      table.sort(shown, function(a, b) return a.v > b.v end)
      local out = {}
      for _, s in ipairs(shown) do out[#out + 1] = s.k end
      return "Ranking: " .. table.concat(out, " ")
    end)
    local g = R.graph { seed = 5, terms = { R.rank { name = "rank", client = client, rubric = "Prefer larger numbers.",
      cache = false } } }
    local answers = { "n 7", "n 3", "n 9", "n 1", "n 5", "n 12", "n 40", "n 2", "n 8", "n 30" }
    local want = { [7] = 0.6, [3] = 0.2, [9] = 0.8, [1] = 0, [5] = 0.4, [12] = 1,
      [40] = 1, [2] = 0, [8] = 1 / 3, [30] = 2 / 3 }
    local rng = rl.rng(11)
    for shuffle = 1, 10 do
      local order = {}
      for i = 1, #answers do order[i] = i end
      for i = #order, 2, -1 do
        local j = rng:random(i)
        order[i], order[j] = order[j], order[i]
      end
      local eps = {}
      for k, i in ipairs(order) do
        eps[k] = { group = i <= 6 and 1 or 2, task = { q = "pick" }, record = { { action = answers[i], reward = 0 } } }
      end
      local before = client.calls
      local scores = g:score(fake_batch(eps))
      assert.are.equal(2, client.calls - before, "one call per group")
      for k, i in ipairs(order) do
        local v = tonumber(answers[i]:match("%d+"))
        assert.is_near(want[v], scores[k].terms.rank.value, 1e-12, "shuffle " .. shuffle .. ": " .. answers[i])
      end
    end
    local distinct = 0
    for _ in pairs(orders) do distinct = distinct + 1 end
    assert.is_true(distinct >= 10, "the judge saw the candidates in " .. distinct .. " orders")
    -- a reply that ranks only some of them is unscorable for the whole group
    local partial = R.graph { terms = { R.rank { name = "rank", client = mock_judge(function() return "1 2" end),
      rubric = "x", cache = false } } }
    local s = partial:score(answers_batch({ "a", "b", "c" }, 3))
    for i = 1, 3 do
      assert.are.equal("unscorable", s[i].terms.rank.status)
      assert.matches("names 2 of 3", s[i].terms.rank.message)
    end
  end)

  -- 6. Dense process rewards
  local vectors = V.read(H.root .. "/tests/advantage/advantage_vectors.json")
  local function vector(method, name)
    for _, c in ipairs(vectors.cases) do
      if c.method == method and c.name == name then return c end
    end
    error("no vector " .. method .. "/" .. name)
  end

  it("6: per-turn values land on each turn's last sampled token and reproduce the GAE vectors", function()
    for _, name in ipairs { "multiturn_gamma_1.0_lam_1.0", "multiturn_gamma_0.99_lam_0.95" } do
      local case = vector("gae", name)
      local inp = case.inputs
      -- each sampled position of the vector's rows is one turn (its last sampled token); the
      -- masked positions are observation tokens of the turn before
      local tokens, mask, turns, offsets, values, eps = {}, {}, {}, { 0 }, {}, {}
      for b, row in ipairs(inp.response_mask) do
        tokens[#tokens + 1], mask[#mask + 1], turns[#turns + 1], values[#values + 1] = 1, 0, -1, 0
        local rec, turn, per_turn = {}, -1, {}
        for p, m in ipairs(row) do
          if m == 1 then
            turn = turn + 1
            rec[#rec + 1] = { action = "a", reward = 0 }
            per_turn[turn + 1] = inp.token_level_rewards[b][p]
          end
          tokens[#tokens + 1], mask[#mask + 1], turns[#turns + 1] = 97, m, math.max(turn, 0)
          values[#values + 1] = inp.values[b][p]
        end
        offsets[#offsets + 1] = #tokens
        eps[b] = { group = 1, reward = 0, seed = b, record = rec, per_turn = per_turn }
      end
      local batch = rl.batch.new { tokens = T.from(tokens), logprobs = T.zeros { #tokens }, mask = T.from(mask),
        turns = T.from(turns), offsets = offsets, episodes = eps }
      local g = R.graph { terms = { R.process { name = "prm", turn = function(_, ep, ctx) return ep.per_turn[ctx.turn] end } } }
      g:score(batch)
      local rewards = rl.train.advantage.token_rewards(batch)
      local adv, ret = rl.objective.gae { rewards = rewards, values = T.from(values), mask = batch.mask,
        offsets = batch.offsets, episodes = { 1, 2, 3 }, gamma = case.params.gamma, lambda = case.params.lam }
      for b, row in ipairs(inp.response_mask) do
        local base = batch.offsets[b] + 1
        for p, m in ipairs(row) do
          local pos = base + p
          if m == 1 then
            assert.is_near(inp.token_level_rewards[b][p], rewards:get(pos), 1e-6)
            local wa, wr = case.outputs.advantages[b][p], case.outputs.returns[b][p]
            assert.is_true(math.abs(adv:get(pos) - wa) <= 1e-6 + 1e-5 * math.abs(wa),
              string.format("%s row %d pos %d: %.9g vs %.9g", name, b, p, adv:get(pos), wa))
            assert.is_true(math.abs(ret:get(pos) - wr) <= 1e-6 + 1e-5 * math.abs(wr))
          else
            assert.are.equal(0, rewards:get(pos))
          end
        end
      end
    end
  end)

  it("6: dense process values are BEACON's segment rewards and reproduce its vectors", function()
    for _, name in ipairs { "dynamic_w_1.0", "dynamic_w_10.0", "dynamic_mean_std_norm" } do
      local case = vector("beacon", name)
      local inp = case.inputs
      local eps, by_uid, rows = {}, {}, {}
      for r, uid in ipairs(inp.traj_uids) do
        if not by_uid[uid] then
          by_uid[uid] = { group = 1, reward = 0, record = {}, step_rewards = {} }
          eps[#eps + 1] = by_uid[uid]
        end
        local ep = by_uid[uid]
        local k = #ep.record + 1
        -- a segment ends where the next row's segment id is higher (a milestone)
        local nxt = inp.traj_uids[r + 1] == uid and inp.segment_ids[r + 1] or nil
        ep.record[k] = { action = "a", reward = 0, info = { milestone = nxt ~= nil and nxt > inp.segment_ids[r] } }
        ep.step_rewards[k] = inp.step_rewards[r]
        ep.outcome = inp.token_level_rewards[r][2]
        rows[r] = { ep = ep, k = k }
      end
      for _, ep in ipairs(eps) do ep.record[#ep.record].reward = ep.outcome end -- the return, on the last turn
      local b = fake_batch(eps)
      local g = R.graph { terms = { R.env(),
        R.process { name = "milestones", turn = function(_, ep, ctx) return ep.step_rewards[ctx.turn] end } } }
      g:score(b)
      local p = case.params
      local adv = advantages({ cfg = { advantage = "beacon", reward = g, adv_epsilon = p.epsilon,
        milestone = { gamma = 0.95, scale = 10, weight = p.step_advantage_w, mode = p.mode } } }, b)
      local index = {}
      for i, ep in ipairs(b.episodes) do index[ep] = i end
      for r, row in ipairs(rows) do
        local got = turn_values(b, adv, index[row.ep])[row.k]
        local want = case.outputs.advantages[r][1]
        assert.is_true(math.abs(got - want) <= 1e-6 + 1e-5 * math.abs(want),
          string.format("%s row %d: %.9g vs %.9g", name, r, got, want))
      end
    end
  end)

  it("6: GiGPO's step rewards are the dense per-turn values", function()
    local eps = {}
    for i = 1, 4 do
      local rec = {}
      for k = 1, 3 do rec[k] = { action = "a", reward = 0, state = "s" .. k } end
      eps[i] = { group = 1, seed = i, record = rec }
    end
    local b = fake_batch(eps)
    local dense = function(_, ep, ctx) return (ep.seed * 3 + ctx.turn * 5) % 7 / 7 end
    local g = R.graph { terms = { R.process { name = "p", turn = dense } } }
    g:score(b)
    local adv = advantages({ cfg = { advantage = "gigpo", reward = g, gamma = 0.9 } }, b)
    local rs, rr, rg, ra, rt = {}, {}, {}, {}, {}
    for i, ep in ipairs(b.episodes) do
      for k = 1, 3 do
        rs[#rs + 1], rg[#rg + 1], ra[#ra + 1], rt[#rt + 1] = ep.reward, 1, "s:s" .. k, i
        rr[#rr + 1] = dense(nil, ep, { turn = k })
      end
    end
    local returns = rl.objective.step_returns { rewards = rr, traj = rt, gamma = 0.9 }
    local want = rl.objective.gigpo { scores = rs, step_rewards = returns, groups = rg, anchors = ra }
    local r = 0
    for i = 1, 4 do
      for _, v in ipairs(turn_values(b, adv, i)) do
        r = r + 1
        assert.is_near(want[r], v, 1e-6)
      end
    end
  end)

  -- 7. Logging
  it("7: metrics.jsonl has reward/<term>/{mean, std, skip, dominance} for every term, every step", function()
    local dir = tmpdir()
    local names = { "env", "judge", "flaky", "budget", "length" }
    local g = R.graph { terms = { R.env(), R.judge { name = "judge", client = mock_judge(), prompt = "answer: {answer}",
      weight = 0.5 }, R.fn("flaky", function(ep) if ep.seed % 3 == 0 then return R.SKIP end return 0 end),
      R.budget { tokens = 0.01 }, R.metric("length", function(ep) return ep.length end) } }
    letter_run(dir, { reward = g, steps = 4 })
    local lines = read_lines(dir .. "/graph/metrics.jsonl")
    assert.are.equal(5, #lines)
    for s = 2, 5 do
      for _, name in ipairs(names) do
        for _, k in ipairs { "mean", "std", "skip", "dominance", "error", "gated", "dead" } do
          assert.is_number(lines[s]["reward/" .. name .. "/" .. k], string.format("step %d %s/%s", s - 1, name, k))
        end
      end
      assert.is_number(lines[s]["reward/judge/calls"])
      assert.are.equal(1, lines[s]["reward/version"])
      assert.is_number(lines[s]["reward/unscorable"])
    end
    local svg = assert(io.open(dir .. "/graph/reward.svg")):read("a")
    for _, name in ipairs(names) do assert.truthy(svg:find(name, 1, true), name) end
    local state = rl.json.decode(assert(io.open(dir .. "/graph/state.json")):read("a"))
    assert.are.equal(4, state.reward.scored)
    assert.are.same({ graph = "reward", combine = "sum", terms = names }, state.options.reward)
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)

  it("7: two runs from one seed write identical metrics (the graph adds nothing that varies)", function()
    local dir = tmpdir()
    local function run(name)
      local g = R.graph { terms = { R.env(), R.judge { name = "judge", client = mock_judge(), prompt = "answer: {answer}" },
        R.rank { name = "rank", client = mock_judge(function(m)
          local n = 0
          for _ in m[#m].content:gmatch("%[%d+%]") do n = n + 1 end
          local out = {}
          for k = n, 1, -1 do out[#out + 1] = k end
          return table.concat(out, " ")
        end), rubric = "last first", weight = 0.1 },
        R.fn("flaky", function(ep) if ep.seed % 4 == 0 then return R.SKIP end return 0 end) } }
      letter_run(dir, { name = name, reward = g, steps = 3 })
      return read_lines(dir .. "/" .. name .. "/metrics.jsonl")
    end
    local a, b = run("one"), run("two")
    assert.are.equal(#a, #b)
    local compared = 0
    for i, rec in ipairs(a) do
      for k, v in pairs(rec) do
        if not k:match("^time/") and k ~= "tokens_per_s" then
          assert.are.equal(v, b[i][k], k)
          compared = compared + 1
        end
      end
    end
    assert.is_true(compared > 100)
    assert.is_number(a[2]["time/reward"])
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)

  -- 8. Hot reload
  local REWARD_FILE = [==[
return rl.reward.graph {
  terms = {
    rl.reward.env(),
    rl.reward.fn("short", function(ep) return -(%s) * ep.length end),
  },
}
]==]
  local CHECKS = { { better = { record = { { action = "a", reward = 1 } } }, worse = { record = { { action = "ab", reward = 0 } } } } }

  it("8: editing the reward file changes reward_version at the next step; a reload breaking a check is refused", function()
    local dir = tmpdir()
    local path = dir .. "/reward.lua"
    write(path, REWARD_FILE:format("0.01"))
    local g = assert(R.load(path, { watch = true, checks = CHECKS }))
    local seen = {}
    letter_run(dir, { reward = g, steps = 5, log_episodes = 8, on_step = function(step, mt)
      seen[step] = mt["reward/version"]
      if step == 2 then write(path, REWARD_FILE:format("0.02")) end
      if step == 3 then write(path, REWARD_FILE:format("-5")) end -- longer is better: breaks the check
    end })
    assert.are.same({ 1, 1, 2, 2, 2 }, seen)
    local by_step = {}
    for _, ep in ipairs(read_lines(dir .. "/graph/episodes.jsonl")) do
      by_step[ep.step] = by_step[ep.step] or {}
      by_step[ep.step][ep.reward_version] = true
    end
    assert.are.same({ [1] = true }, by_step[2])
    assert.are.same({ [2] = true }, by_step[3])
    assert.are.same({ [2] = true }, by_step[5])
    local log = assert(io.open(dir .. "/graph/reward.log")):read("a")
    assert.matches("step 3: .* reloaded: version 2", log)
    assert.matches("step 4: .* refused, version 2 kept: 1 of 1 check cases failed", log)
    assert.are.equal(2, g.version)
    -- a file that does not load is refused too
    write(path, "return rl.reward.graph { terms = {} }")
    local ok, why = g:reload()
    assert.is_nil(ok)
    assert.matches("terms: a non%-empty list", why)
    assert.are.equal(2, g.version)
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)

  it("8: g:rescore of a saved batch under version 2 equals a fresh score", function()
    local dir = tmpdir()
    local path = dir .. "/reward.lua"
    write(path, REWARD_FILE:format("0.01"))
    local g = assert(R.load(path, { watch = true }))
    local function batch()
      local eps = {}
      for i = 1, 8 do
        eps[i] = { group = (i - 1) // 4 + 1, task = { i = i }, success = i % 2 == 0,
          record = { { action = string.rep("x", i), reward = i % 2 }, { action = "y", reward = 0.5 } } }
      end
      return fake_batch(eps)
    end
    local b = batch()
    local v1 = g:score(b)
    assert(b:to_jsonl(dir .. "/batch.jsonl"))
    write(path, REWARD_FILE:format("0.02"))
    assert.is_true(g:reload())
    assert.are.equal(2, g.version)
    local saved = assert(rl.batch.load(dir .. "/batch.jsonl"))
    assert.are.equal(1, saved.episodes[1].reward_version)
    local again = g:rescore(saved)
    local fresh = g:score(batch())
    for i = 1, 8 do
      assert.are.equal(fresh[i].total, again[i].total)
      assert.are_not.equal(v1[i].total, again[i].total)
      assert.are.equal(2, saved.episodes[i].reward_version)
      assert.are.same(fresh[i].rewards, saved.episodes[i].rewards)
    end
    assert.is_false(g:reload()) -- nothing changed
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)

  it("8: a reward file runs in a fresh environment: no io, os or require; globals come from the loader", function()
    local dir = tmpdir()
    local path = dir .. "/reward.lua"
    write(path, "local x = io.open('/etc/passwd') return rl.reward.graph { terms = { rl.reward.env() } }")
    local g, why = R.load(path)
    assert.is_nil(g)
    assert.matches("undefined global 'io'", why)
    write(path, "return rl.reward.graph { terms = { rl.reward.judge { name = 'j', client = client, prompt = '{answer}' } } }")
    g = assert(R.load(path, { globals = { client = mock_judge() } }))
    assert.are.equal("judge", g.terms[1].kind)
    assert.is_nil(R.load(dir .. "/missing.lua"))
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)

  -- 9. Attribution
  it("9: on 3 terms explain sums to the advantage, and symmetric terms get equal shares", function()
    local eps = {}
    for i = 1, 16 do eps[i] = { group = (i - 1) // 8 + 1, seed = i, record = { { action = "a", reward = 0 } } } end
    local b = fake_batch(eps)
    local sym = function(ep) return (ep.seed * 5) % 3 end
    local g = R.graph { terms = { R.fn("a", sym), R.fn("other", function(ep) return math.cos(ep.seed) end, { weight = 0.7 }),
      R.fn("b", sym) } }
    g:score(b)
    local adv = g:advantages(b)
    for i, ep in ipairs(b.episodes) do
      local ex = g:explain(ep)
      local sum = ex.terms.a + ex.terms.other + ex.terms.b
      assert.is_near(adv[i], ex.advantage, 1e-12)
      assert.are.equal(0, ex.base)
      assert.is_near(ex.advantage, sum, 1e-9)
      assert.is_near(ex.terms.a, ex.terms.b, 1e-12)
    end
    -- a term constant within groups earns nothing (a null player), and per_term works the same way
    local g2 = R.graph { combine = "per_term", terms = { R.fn("x", function(ep) return ep.seed % 4 end),
      R.fn("flat", function(ep) return ep.group end), R.fn("y", function(ep) return math.sin(ep.seed) end) } }
    g2:score(b)
    local adv2 = g2:advantages(b)
    for i, ep in ipairs(b.episodes) do
      local ex = g2:explain(ep)
      assert.is_near(adv2[i], ex.terms.x + ex.terms.flat + ex.terms.y, 1e-9)
      assert.is_near(0, ex.terms.flat, 1e-6)
    end
    assert.are.equal(0, g2:stats().terms.flat.dominance)
    assert.are.equal(1, g2:stats().terms.flat.dead)
  end)
end)

describe("rl.reward terms", function()
  it("fn: nil is not applicable, a non-number an error; when and clip", function()
    local b = answers_batch({ "a", "bb", "ccc", "dddd" }, 2)
    local g = R.graph { terms = {
      R.fn("n", function(ep) return #ep.record[1].action end, { clip = { 1, 3 } }),
      R.fn("odd", function(ep) if #ep.record[1].action % 2 == 1 then return 1 end end),
      R.fn("bad", function() return "1" end, { weight = 0 }),
      R.fn("first", function() return 5 end, { when = function(task) return task.q == "task 1" end }),
    } }
    local s = g:score(b)
    assert.are.same({ 1, 2, 3, 3 }, { s[1].terms.n.value, s[2].terms.n.value, s[3].terms.n.value, s[4].terms.n.value })
    assert.are.equal("na", s[2].terms.odd.status)
    assert.are.equal("error", s[1].terms.bad.status)
    assert.matches("returned \"1\"", s[1].terms.bad.message)
    assert.are.equal("ok", s[1].status) -- a metric's error does not make the episode unscorable
    assert.are.equal("na", s[3].terms.first.status)
    assert.are.equal(1 + 1 + 5, s[1].total)
    assert.are.equal(3 + 0, s[4].total)
    local st = g:stats()
    assert.are.equal(0.5, st.terms.odd.na)
    assert.are.equal(1, st.terms.bad.error)
  end)

  it("format: Lua and lpeg patterns, on the final turn or each turn", function()
    local lpeg = require "lpeg"
    local eps = {
      { group = 1, record = { { action = "CALL x", reward = 0 }, { action = "ANSWER 4", reward = 0 } } },
      { group = 1, record = { { action = "hmm", reward = 0 }, { action = "4", reward = 0 } } },
    }
    local b = fake_batch(eps)
    local g = R.graph { terms = {
      R.format { name = "answer", pattern = "^ANSWER %d+$" },
      R.format { name = "upper", pattern = lpeg.R("AZ") ^ 1, where = "each_turn" },
    } }
    local s = g:score(b)
    assert.are.same({ 1, 0 }, { s[1].terms.answer.value, s[2].terms.answer.value })
    assert.are.same({ 1, 0 }, { s[1].terms.upper.value, s[2].terms.upper.value })
  end)

  it("group: one value per episode of a group (a diversity bonus)", function()
    local b = answers_batch({ "x", "x", "y", "z" }, 4)
    local g = R.graph { terms = { R.group("unique", function(episodes)
      local count, out = {}, {}
      for _, ep in ipairs(episodes) do count[ep.record[1].action] = (count[ep.record[1].action] or 0) + 1 end
      for k, ep in ipairs(episodes) do out[k] = count[ep.record[1].action] == 1 and 1 or 0 end
      return out
    end) } }
    local s = g:score(b)
    assert.are.same({ 0, 0, 1, 1 }, { s[1].total, s[2].total, s[3].total, s[4].total })
  end)

  it("budget: linear penalties on sampled tokens, turns, tool calls, sandbox CPU time and judge cost", function()
    local eps = { { group = 1, record = {
      { action = "CALL add 1 2", parsed = { kind = "call", name = "add" }, tool_cpu_ms = 250, reward = 0 },
      { action = "ANSWER 3", parsed = { kind = "answer" }, reward = 1 } } } }
    local b = fake_batch(eps)
    local client = mock_judge(function() return "yes", { cost = 0.5 } end)
    local g = R.graph { terms = {
      R.judge { name = "judge", client = client, prompt = "{transcript}", cache = false, weight = 0 },
      R.budget { tokens = 1, turns = 10, tool_calls = 100, cpu_seconds = 1000, judge_cost = 10000 },
    } }
    local s = g:score(b)
    -- 2 sampled tokens, 2 turns, 1 call, 0.25 s, 0.5 of judge cost
    assert.are.equal(-(2 + 20 + 100 + 250 + 5000), s[1].terms.budget.value)
    assert.are.equal(0.5, s[1].terms.judge.cost)
  end)

  it("overlong: DAPO's penalty, as rl.objective.overlong gives it", function()
    local b = answers_batch({ "a", "b" }, 2)
    b.episodes[1].length, b.episodes[2].length = 10, 30
    local g = R.graph { terms = { R.overlong { max_len = 32, buffer = 8 } } }
    local s = g:score(b)
    local want = rl.objective.overlong { lengths = { 10, 30 }, max_len = 32, buffer = 8 }
    assert.are.same(want, { s[1].total, s[2].total })
  end)

  it("judge: yes/no, score and choices parsing, identical prompts asked once, an unreadable reply unscorable", function()
    local replies = { ["answer: a"] = "yes", ["answer: b"] = "NO!", ["answer: c"] = "maybe" }
    local client = mock_judge(function(messages) return replies[messages[#messages].content] end)
    local g = R.graph { terms = { R.judge { name = "j", client = client, prompt = "answer: {answer}", system = "Be brief." } } }
    local s = g:score(answers_batch({ "a", "b", "c", "a" }, 4))
    assert.are.same({ 1, 0 }, { s[1].total, s[2].total })
    assert.are.equal("unscorable", s[3].status)
    assert.are.equal(3, client.calls) -- "a" once
    assert.are.equal("system", client.seen[1].messages[1].role)
    local scored = R.graph { terms = { R.judge { name = "j", parse = "score", prompt = "{answer}",
      client = mock_judge(function() return "Score: 7.5/10" end) } } }
    assert.are.equal(7.5, scored:score(answers_batch({ "a" }, 1))[1].total)
    local chosen = R.graph { terms = { R.judge { name = "j", parse = { A = 1, B = 0.5, C = 0 }, prompt = "{answer}",
      client = mock_judge(function() return "I pick B, not A" end) } } }
    assert.are.equal(0.5, chosen:score(answers_batch({ "a" }, 1))[1].total)
    local custom = R.graph { terms = { R.judge { name = "j", prompt = function(ep) return "say " .. ep.record[1].action end,
      parse = function(text) return #text end, client = mock_judge(function(m) return m[1].content end) } } }
    assert.are.equal(#"say abc", custom:score(answers_batch({ "abc" }, 1))[1].total)
    -- a complete-only client gets the joined text
    local comp = { complete = function(_, prompt) return prompt:find("answer: a", 1, true) and "yes" or "no" end }
    local g4 = R.graph { terms = { R.judge { name = "j", client = comp, prompt = "answer: {answer}" } } }
    assert.are.equal(1, g4:score(answers_batch({ "a" }, 1))[1].total)
    -- a client that raises counts as a failed call
    local boom = R.graph { terms = { R.judge { name = "j", client = { chat = function() error("down") end }, prompt = "{answer}" } } }
    local bs = boom:score(answers_batch({ "a" }, 1))[1]
    assert.are.equal("unscorable", bs.status)
    assert.matches("the client raised: .*down", bs.terms.j.message)
  end)

  it("judge: retry_after from a rate-limited server is waited on the judge's clock", function()
    local clock = H.fake_clock()
    local n = 0
    local client = mock_judge(function()
      n = n + 1
      if n == 1 then return nil, "429 too many requests", { retry_after = 7 } end
      return "yes"
    end)
    local g = R.graph { terms = { R.judge { name = "j", client = client, prompt = "{answer}", retries = 1, clock = clock } } }
    assert.are.equal(1, g:score(answers_batch({ "a" }, 1))[1].total)
    assert.are.equal(7, clock.slept)
  end)

  it("judge: with concurrency, a client's batch method gets that many requests at a time", function()
    local sizes = {}
    local client = { chat = function() return "yes" end, batch = function(_, requests)
      sizes[#sizes + 1] = #requests
      local out = {}
      for k in ipairs(requests) do out[k] = { "yes", {} } end
      return out
    end }
    local g = R.graph { terms = { R.judge { name = "j", client = client, prompt = "{answer}", concurrency = 3, cache = false } } }
    local s = g:score(answers_batch({ "a", "b", "c", "d", "e", "f", "g" }, 7))
    assert.are.same({ 3, 3 }, { sizes[1], sizes[2] })
    for i = 1, 7 do assert.are.equal(1, s[i].total) end
  end)

  -- The busiest 60 seconds of a list of times.
  local function busiest(times)
    local worst = 0
    for _, t in ipairs(times) do
      local n = 0
      for _, u in ipairs(times) do if u >= t and u < t + 60 then n = n + 1 end end
      worst = math.max(worst, n)
    end
    return worst
  end

  it("judge: rpm holds as a server sees the calls, at any moment of their flight; a chunk never waits with calls held back", function()
    -- the first call takes 0.9 s, the others 0.01 s; the server sees each call at its start or
    -- at its end (the two extremes): counting a call only from its admission, call 61 would go
    -- at 60 s and the server's 60 s from 0.9 s would hold 61 calls
    local clock = H.fake_clock()
    local starts, ends = {}, {}
    local client = mock_judge(function()
      starts[#starts + 1] = clock.t
      clock.t = clock.t + (#starts == 1 and 0.9 or 0.01)
      ends[#ends + 1] = clock.t
      return "yes"
    end)
    local g = R.graph { terms = { R.judge { name = "j", client = client, prompt = "{answer}", cache = false,
      rpm = 60, clock = clock } } }
    local answers = {}
    for i = 1, 70 do answers[i] = "a" .. i end
    g:score(answers_batch(answers, 10))
    assert.are.same({ 60, 60 }, { busiest(starts), busiest(ends) })
    assert.is_true(starts[61] >= ends[1] + 60)
    -- rpm = 2, concurrency = 3: the third call waits alone, after the first two went out
    clock = H.fake_clock()
    local sizes, sent = {}, {}
    local batcher = { batch = function(_, requests)
      sizes[#sizes + 1] = #requests
      local out = {}
      for k in ipairs(requests) do
        sent[#sent + 1] = clock.t
        out[k] = { "yes", {} }
      end
      clock.t = clock.t + 0.1
      return out
    end }
    function batcher.chat() -- a chunk of one
      sizes[#sizes + 1] = 1
      sent[#sent + 1] = clock.t
      clock.t = clock.t + 0.1
      return "yes"
    end
    local g2 = R.graph { terms = { R.judge { name = "j", client = batcher, prompt = "{answer}", cache = false,
      rpm = 2, concurrency = 3, clock = clock } } }
    local s = g2:score(answers_batch({ "a", "b", "c" }, 3))
    for i = 1, 3 do assert.are.equal(1, s[i].total) end
    assert.are.same({ 2, 1 }, sizes)
    assert.are.equal(2, busiest(sent))
    assert.is_true(sent[3] >= 60.1)
  end)

  it("model_client: a local rl.model serves as a deterministic judge", function()
    local m = rl.model.new { vocab = 264, dim = 16, layers = 1, heads = 2, ffn = 32, ctx = 128, seed = 9 }
    local client = R.model_client { model = m, tokenizer = tok, max_new_tokens = 4 }
    local text, info = client:chat({ { role = "user", content = "is it?" } }, { temperature = 0 })
    assert.is_string(text)
    assert.are.equal(0, info.cost)
    assert.is_true(info.completion_tokens >= 1 and info.completion_tokens <= 4)
    local g = R.graph { terms = { R.judge { name = "local", client = client, prompt = "{answer}",
      parse = function(t) return #t end } } }
    local a = g:score(answers_batch({ "a", "b" }, 2))
    local g2 = R.graph { terms = { R.judge { name = "local", client = client, prompt = "{answer}",
      parse = function(t) return #t end } } }
    local b2 = g2:score(answers_batch({ "a", "b" }, 2))
    assert.are.same({ a[1].total, a[2].total }, { b2[1].total, b2[2].total })
  end)

  it("stats: dominance, correlation with success, dead terms; the hacking alarm", function()
    local eps = {}
    for i = 1, 32 do eps[i] = { group = (i - 1) // 8 + 1, seed = i, success = i % 2 == 0, record = { { action = "a", reward = 0 } } } end
    local b = fake_batch(eps)
    local g = R.graph { alarm = { window = 2 }, terms = {
      R.fn("big", function(ep) return 100 * (ep.success and 1 or 0) end),
      R.fn("small", function(ep) return 0.01 * (ep.seed % 3) end),
      R.fn("constant", function(ep) return ep.group end),
    } }
    g:score(b, { step = 1 })
    local st = g:stats()
    assert.is_true(st.terms.big.dominance > 0.99, "big " .. st.terms.big.dominance)
    assert.is_true(math.abs(st.terms.small.dominance) < 0.01)
    assert.are.equal(1, st.terms.big.corr_success)
    assert.are.equal(1, st.terms.constant.dead)
    assert.are.equal(0, st.terms.big.dead)
    -- a term rising while held-out success falls
    assert.is_false(g:observe(1, 0.8).big)
    for _, ep in ipairs(b.episodes) do ep.success = true end
    g:score(b, { step = 2 })
    local alarm = g:observe(2, 0.5)
    assert.is_true(alarm.big)
    assert.is_false(alarm.small)
    assert.is_true(g:stats().terms.big.alarm)
    -- the alarm and history are in the state
    local g2 = R.graph { alarm = { window = 2 }, terms = {
      R.fn("big", function() return 0 end), R.fn("small", function() return 0 end), R.fn("constant", function() return 0 end) } }
    g2:load(rl.json.decode(rl.json.encode(g:state())))
    assert.are.equal(2, g2.scored)
    assert.is_true(g2.alarms.big)
  end)

  it("check: better/worse and expect cases, a failure named", function()
    local g = R.graph { terms = { R.format { name = "answer", pattern = "^ANSWER" }, R.fn("short", function(ep) return -0.01 * #ep.record[1].action end) } }
    assert.is_true(g:check {
      { better = "ANSWER 4", worse = "I think 4" },
      { ep = "ANSWER 4", term = "answer", expect = { "==", 1 } },
      { ep = "xx", expect = { "<", 0 } },
      { ep = "xx", term = "answer", expect = { "status", "ok" } },
    })
    local ok, msg, failures = g:check { { better = "I think 4", worse = "ANSWER 4", name = "format first" } }
    assert.is_nil(ok)
    assert.matches("case 1 %(format first%): better scores", msg)
    assert.are.equal(1, #failures)
    H.assert_error(function() g:check { { ep = "x", term = "nope", expect = { "==", 1 } } } end, "'nope' is not a term")
    H.assert_error(function() g:check { { ep = "x", expect = { "=", 1 } } } end, "expect: {op, value}")
    H.assert_error(function() g:check { { better = "x" } } end, "both better and worse")
    H.assert_error(function() g:check { { what = 1 } } end, "{better =, worse =} or {ep =")
  end)
end)

describe("rl.reward refuses bad input", function()
  local f = function() return 0 end
  local client = mock_judge()
  local cases = {
    { function() R.fn { name = "a", fn = f, wieght = 2 } end, "rl.reward.fn: unknown field 'wieght' (did you mean 'weight'?)" },
    { function() R.fn { name = "a" } end, "rl.reward.fn: fn: a function expected (it is required)" },
    { function() R.fn { fn = f } end, "rl.reward.fn: name:" },
    { function() R.fn { name = "a b", fn = f } end, "rl.reward.fn: name: a name of letters" },
    { function() R.fn("a", 3) end, "rl.reward.fn: fn: a function" },
    { function() R.fn { name = "a", fn = f, weight = "1" } end, "rl.reward.fn: weight: a finite number expected, got \"1\"" },
    { function() R.fn { name = "a", fn = f, clip = { 2, 1 } } end, "rl.reward.fn: clip: a pair {lo, hi}" },
    { function() R.fn { name = "a", fn = f, gate = 3 } end, "rl.reward.fn: gate:" },
    { function() R.fn { name = "a", fn = f, when = true } end, "rl.reward.fn: when: a function expected" },
    { function() R.metric("m", f, { weight = 1 }) end, "rl.reward.metric: weight: a metric has weight 0" },
    { function() R.format { pattern = 3 } end, "rl.reward.format: pattern: a Lua pattern" },
    { function() R.format { pattern = "[a" } end, "rl.reward.format: pattern:" },
    { function() R.format { pattern = "a", where = "last" } end, "rl.reward.format: where: one of \"final\", \"each_turn\"" },
    { function() R.group { name = "g" } end, "rl.reward.group: fn: a function expected" },
    { function() R.process { name = "p" } end, "rl.reward.process: turn: a function expected" },
    { function() R.process { name = "p", turn = f, reduce = "max" } end, "rl.reward.process: reduce: one of" },
    { function() R.process { name = "p", turn = f, model = 1 } end, "rl.reward.process: model: no process reward model" },
    { function() R.env { nmae = "e" } end, "rl.reward.env: unknown field 'nmae' (did you mean 'name'?)" },
    { function() R.budget {} end, "rl.reward.budget: at least one of" },
    { function() R.budget { tokens = -1 } end, "rl.reward.budget: tokens: a non-negative number expected, got -1" },
    { function() R.budget { token = 1 } end, "rl.reward.budget: unknown field 'token' (did you mean 'tokens'?)" },
    { function() R.overlong { max_len = 8 } end, "rl.reward.overlong: buffer: a positive integer expected (it is required)" },
    { function() R.overlong { max_len = 8, buffer = 9 } end, "rl.reward.overlong: buffer: at most max_len" },
    { function() R.judge { name = "j", prompt = "{answer}" } end, "rl.reward.judge: client: a client" },
    { function() R.judge { name = "j", client = {}, prompt = "{answer}" } end, "rl.reward.judge: client: a client (an object with a chat" },
    { function() R.judge { name = "j", client = client } end, "rl.reward.judge: prompt:" },
    { function() R.judge { name = "j", client = client, prompt = "{answr}" } end, "(not {answr})" },
    { function() R.judge { name = "j", client = client, prompt = "x", parse = "yes" } end, "rl.reward.judge: parse:" },
    { function() R.judge { name = "j", client = client, prompt = "x", rpm = 0 } end, "rl.reward.judge: rpm: a positive number expected, got 0" },
    { function() R.judge { name = "j", client = client, prompt = "x", modle = "m" } end, "unknown field 'modle' (did you mean 'model'?)" },
    { function() R.judge { name = "j", client = client, prompt = "x", on_error = "zero" } end, "rl.reward.judge: on_error: one of \"skip\", \"fail\"" },
    { function() R.judge { name = "j", client = client, prompt = "x", budget = { call = 1 } } end, "rl.reward.judge: budget: unknown field 'call' (did you mean 'calls'?)" },
    { function() R.judge { name = "j", client = client, prompt = "x", clock = {} } end, "rl.reward.judge: clock: a table {now" },
    { function() R.judge { name = "j", client = client, prompt = "x", cache = 1 } end, "rl.reward.judge: cache: true or false or a string" },
    { function() R.rank { name = "r", client = client } end, "rl.reward.rank: rubric: a string expected (it is required)" },
    { function() R.rank { name = "r", client = client, rubric = "x", show = "all" } end, "rl.reward.rank: show:" },
    { function() R.model_client { tokenizer = tok } end, "rl.reward.model_client: model: an rl.model expected" },
    { function() R.graph { terms = {} } end, "rl.reward.graph: terms: a non-empty list" },
    { function() R.graph { terms = { f } } end, "rl.reward.graph: terms: a list of rl.reward terms" },
    { function() R.graph { terms = { R.env() }, combin = "sum" } end, "rl.reward.graph: unknown field 'combin' (did you mean 'combine'?)" },
    { function() R.graph { terms = { R.env() }, combine = "gdpo" } end, "rl.reward.graph: combine: one of \"sum\", \"per_term\"" },
    { function() R.graph { terms = { R.env(), R.env() } } end, "the name 'env' is taken by terms[1]" },
    { function() R.graph { terms = { R.fn("a", f, { gate = "b" }), R.fn("b", f) } } end, "gate: 'b' is not an earlier term" },
    { function() R.graph { terms = { R.env() }, scale = "batch" } end, "scale: only with combine = \"per_term\"" },
    { function() R.graph { terms = { R.metric("m", f) }, combine = "per_term" } end, "needs a term of non-zero weight" },
    { function() R.graph { terms = { R.env() }, alarm = { windw = 2 } } end, "rl.reward.graph: alarm: unknown field 'windw' (did you mean 'window'?)" },
    { function() R.load("x.lua", { wath = true }) end, "rl.reward.load: unknown field 'wath' (did you mean 'watch'?)" },
    { function() R.load(3) end, "rl.reward.load: path: a string expected" },
    { function() R.skip(3) end, "rl.reward.skip: why: a string" },
    { function() R.cache(3) end, "rl.reward.cache: path: a string" },
  }
  it("names the field for every constructor, at the caller's line", function()
    for k, c in ipairs(cases) do
      local ok, err = pcall(c[1])
      assert.is_false(ok, "case " .. k .. " was accepted")
      assert.truthy(tostring(err):find(c[2], 1, true), "case " .. k .. ": " .. tostring(err))
      assert.truthy(tostring(err):find("reward_spec.lua:", 1, true), "case " .. k .. " not at the caller: " .. tostring(err))
    end
  end)

  it("methods check their arguments", function()
    local g = R.graph { terms = { R.env() } }
    H.assert_error(function() g:score({}) end, "score: batch: an rl.batch expected")
    H.assert_error(function() g:rescore(3) end, "rescore: batch: an rl.batch expected")
    H.assert_error(function() g:explain({}) end, "explain: no batch")
    local b = answers_batch({ "a" }, 1)
    g:score(b)
    H.assert_error(function() g:explain({}) end, "explain: ep: an episode of the batch")
    H.assert_error(function() g:observe("1", 0.5) end, "observe: step: an integer")
    H.assert_error(function() g:reload() end, "not loaded from a file")
    H.assert_error(function() g:advantages(answers_batch({ "a" }, 1)) end, "was not scored by this graph")
    local many = {}
    for k = 1, 13 do many[k] = R.fn("t" .. k, function() return k end) end
    local g13 = R.graph { terms = many }
    g13:score(b)
    H.assert_error(function() g13:explain(b.episodes[1]) end, "at most 12")
  end)

  it("rl.train refuses a graph with options that contradict it", function()
    local dir = tmpdir()
    local g = R.graph { terms = { R.env() } }
    local gp = R.graph { combine = "per_term", terms = { R.env(), R.fn("x", f) } }
    local function err(extra)
      local ok, msg = pcall(letter_run, dir, extra)
      assert.is_false(ok)
      return msg
    end
    assert.matches("reward: an rl.reward graph or a function", err { reward = 3 })
    assert.matches("rewards: with a reward graph", err { reward = g, rewards = { a = f } })
    assert.matches("overlong: with a reward graph %(reward = g%) use the term", err { reward = g, overlong = { max_len = 8, buffer = 2 } })
    assert.matches("combine = \"per_term\", which is GDPO", err { reward = gp, advantage = "grpo" })
    assert.matches("give the reward graph reward combine = \"per_term\"", err { reward = g, advantage = "gdpo" })
    assert.matches("gdpo: with a reward graph", err { reward = gp, gdpo = { weights = { 1, 1 } } })
    -- a per_term graph makes gdpo the default estimator
    local seen = {}
    letter_run(dir, { reward = gp, steps = 1, on_step = function(_, mt) seen[1] = mt end })
    local state = rl.json.decode(assert(io.open(dir .. "/graph/state.json")):read("a"))
    assert.are.equal("gdpo", state.options.advantage)
    assert.is_number(seen[1]["reward/x/dominance"])
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)
end)
