-- judge_http_spec.lua: acceptance test 4 of shared/spec/agentlib.md (judge cache and budgets)
-- over real HTTP: rl.reward.judge, rl.reward.rank and rl.synth.proposer with an rl.http.openai
-- client, against the scripted loopback server (build/tests/mock_server, started here on a free
-- port and stopped at the end), whose log of every request with its arrival time is what the
-- tests count and time; then one judge call through `moonrl serve`.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"

local json = rl.json
local R = rl.reward
local server, base

-- The judges' prompt: the server's "verdict..." models say yes when the answer is lowercase.
local PROMPT = "Task: {task}\nanswer: {answer}\nIs the answer in lowercase? Reply yes or no."

local function control(path)
  local c = rl.http.client{ base_url = base, retries = 0 }
  local status, _, body = c:get(path)
  c:close()
  assert(status == 200, path .. ": " .. tostring(body))
  return body
end

-- The chat requests the server received since the last call (its log is emptied), each
-- {t = arrival (rl.clock's seconds), path =, body = (text), json = (decoded)}.
local function received()
  local log = json.decode(control("/requests"))
  control("/reset_stats")
  assert.equal(0, log.dropped)
  local out = {}
  for _, r in ipairs(log.requests) do
    if r.path:sub(-20) == "/v1/chat/completions" then
      r.json = json.decode(r.body)
      out[#out + 1] = r
    end
  end
  return out
end

-- One-turn episodes with the given answers, `size` to a group (the text of this chunk is also
-- run in another process: it returns the batch builder).
local BATCH = [==[
local rl = ...
return function(answers, size)
  local eps, tokens, offsets = {}, {}, { 0 }
  for i, a in ipairs(answers) do
    eps[i] = { group = (i - 1) // size + 1, seed = i, reward = 0, turns = 1, task = { q = "task " .. i },
      record = { { action = a, reward = 0, done = true, info = {} } } }
    tokens[#tokens + 1] = 97
    offsets[#offsets + 1] = #tokens
  end
  local T = rl.tensor
  return rl.batch.new { tokens = T.from(tokens), logprobs = T.zeros { #tokens }, mask = T.ones { #tokens },
    turns = T.zeros { #tokens }, offsets = offsets, episodes = eps }
end
]==]
local answers_batch = assert(load(BATCH, "=BATCH"))(rl)

-- N answers, the odd ones lowercase (verdict yes), the even ones not.
local N = 12
local ANSWERS = {}
for i = 1, N do ANSWERS[i] = (i % 2 == 1 and "low" or "High") .. i end

-- Scores ANSWERS once with a judge over HTTP on a cache file; prints the judge's values.
local CACHE_SCRIPT = "local answers_batch = assert(load(" .. string.format("%q", BATCH) .. "))(require 'moonrl')\n" .. [==[
local rl = require "moonrl"
local base, cache, model, temperature, client_model = arg[1], arg[2], arg[3], tonumber(arg[4]), arg[5]
local answers = {}
for i = 1, 12 do answers[i] = (i % 2 == 1 and "low" or "High") .. i end
local client = rl.http.openai { base_url = base, model = client_model, retries = 0 }
local g = rl.reward.graph { terms = { rl.reward.judge { name = "judge", client = client,
  model = model ~= "" and model or nil, prompt = ]==] .. string.format("%q", PROMPT) .. [==[,
  sampling = { temperature = temperature }, cache = cache } } }
local out = {}
for i, s in ipairs(g:score(answers_batch(answers, 4))) do
  out[i] = s.terms.judge.status .. "=" .. tostring(s.terms.judge.value)
end
print(table.concat(out, " "))
]==]

-- What CACHE_SCRIPT prints when every verdict came through.
local ALL_SCORED = {}
for i = 1, N do ALL_SCORED[i] = "ok=" .. (i % 2 == 1 and "1" or "0") end
ALL_SCORED = table.concat(ALL_SCORED, " ")

local function judge_values(scores)
  local out = {}
  for i, s in ipairs(scores) do out[i] = s.terms.judge.status .. "=" .. tostring(s.terms.judge.value) end
  return table.concat(out, " ")
end

describe("judges over HTTP (the scripted server)", function()
  setup(function()
    server = assert(io.popen(H.shell_quote(H.build .. "/tests/mock_server") .. " 120", "r"))
    base = "http://127.0.0.1:" .. assert(server:read("l"), "the mock server printed no port")
  end)
  before_each(function() control("/reset_stats") end) -- each test counts its own requests
  teardown(function()
    local c = rl.http.client{ base_url = base, retries = 0 }
    c:get("/quit")
    c:close()
    server:close()
  end)

  it("4: scoring N twice makes N requests, then 0; a new process on the cache file 0; another model or sampling N", function()
    local dir = H.tmpdir()
    finally(function() H.sh("rm -rf " .. H.shell_quote(dir)) end)
    local cache = dir .. "/judge_cache.jsonl"
    local client = rl.http.openai { base_url = base, retries = 0 }
    local g = R.graph { terms = { R.judge { name = "judge", client = client, model = "verdict-a", prompt = PROMPT,
      sampling = { temperature = 0 }, cache = cache } } }
    local b = answers_batch(ANSWERS, 4)
    assert.equal(ALL_SCORED, judge_values(g:score(b)))
    local seen = received()
    assert.equal(N, #seen)
    local prompts = {}
    for i, r in ipairs(seen) do
      assert.same({ "verdict-a", 0 }, { r.json.model, r.json.temperature })
      prompts[r.json.messages[1].content] = i
    end
    for i = 1, N do assert.is_number(prompts[PROMPT:gsub("{task}", '{"q":"task ' .. i .. '"}'):gsub("{answer}", ANSWERS[i])]) end
    assert.equal(ALL_SCORED, judge_values(g:score(b)))
    assert.equal(0, #received()) -- all from the cache
    assert.equal(N, g:stats().judge.judge.hits)
    local function run(model, temperature, client_model)
      local out, _, ok = H.run_lua(CACHE_SCRIPT, base, cache, model, temperature, client_model or "default")
      assert.is_true(ok, out)
      return out
    end
    assert.matches(ALL_SCORED, run("verdict-a", "0"), 1, true)
    assert.equal(0, #received()) -- another process: all from the file
    assert.matches(ALL_SCORED, run("verdict-b", "0"), 1, true)
    seen = received()
    assert.equal(N, #seen) -- another model misses
    assert.equal("verdict-b", seen[1].json.model)
    assert.matches(ALL_SCORED, run("verdict-a", "0.5"), 1, true)
    seen = received()
    assert.equal(N, #seen) -- other sampling misses
    assert.equal(0.5, seen[N].json.temperature)
    assert.matches(ALL_SCORED, run("verdict-b", "0"), 1, true)
    assert.equal(0, #received())
    assert.equal(3 * N, #H.read_json_lines(cache))
  end)

  it("4: a judge without a model asks the client's, whose model is part of the cache key", function()
    local dir = H.tmpdir()
    finally(function() H.sh("rm -rf " .. H.shell_quote(dir)) end)
    local cache = dir .. "/judge_cache.jsonl"
    local function run(client_model)
      local out, _, ok = H.run_lua(CACHE_SCRIPT, base, cache, "", "0", client_model)
      assert.is_true(ok, out)
      return out, received()
    end
    local out, seen = run("verdict-x")
    assert.matches(ALL_SCORED, out, 1, true)
    assert.equal(N, #seen)
    assert.equal("verdict-x", seen[1].json.model) -- the client's model, not the judge's ""
    out, seen = run("verdict-y")
    assert.matches(ALL_SCORED, out, 1, true)
    assert.equal(N, #seen) -- another model behind the client misses
    assert.equal("verdict-y", seen[1].json.model)
    out, seen = run("verdict-x")
    assert.matches(ALL_SCORED, out, 1, true)
    assert.equal(0, #seen)
  end)

  it("4: rpm = 60 is never exceeded over 2 simulated minutes, timed by the server; a call budget leaves the rest unscorable", function()
    -- the judge's clock runs SPEED times faster than rl.clock, and its sleep waits the real
    -- equivalent, so 2 simulated minutes take 6 s. The server's arrival times are rl.clock's
    -- seconds too and convert to the judge's time exactly; a request arrives after the judge
    -- admitted it and before its reply, until which the judge counts it: no tolerance is needed
    local SPEED, start = 20, rl.clock()
    local clock = { now = function() return SPEED * (rl.clock() - start) end,
      sleep = function(s) os.execute(string.format("sleep %.6f", s / SPEED)) end }
    local client = rl.http.openai { base_url = base, model = "verdict-r", retries = 0, max_connections = 4 }
    local g = R.graph { terms = { R.judge { name = "judge", client = client, prompt = PROMPT, cache = false,
      rpm = 60, concurrency = 4, clock = clock } } }
    local scored, round = 0, 0
    while clock.now() < 120 do
      round = round + 1
      local answers = {}
      for i = 1, 16 do answers[i] = (i % 2 == 1 and "low" or "High") .. round .. "-" .. i end
      local s = g:score(answers_batch(answers, 4))
      for i = 1, 16 do
        assert.equal("ok", s[i].terms.judge.status)
        assert.equal(i % 2, s[i].terms.judge.value)
      end
      scored = scored + 16
    end
    local seen = received()
    assert.equal(scored, #seen) -- one request per episode, each scored
    local times = {}
    for i, r in ipairs(seen) do times[i] = SPEED * (r.t - start) end
    table.sort(times)
    local worst = 0
    for i = 1, #times do
      local n = 0
      for j = i, #times do if times[j] < times[i] + 60 then n = n + 1 end end
      worst = math.max(worst, n)
    end
    assert.equal(60, worst) -- the limit, reached and never passed, as the server saw it
    assert.is_true(#times >= 120, "requests in 2 minutes: " .. #times)
    -- a budget of 5 calls: 5 requests, the rest unscorable (no value, not 0)
    local counted = R.graph { terms = { R.judge { name = "judge", client = client, model = "verdict-b",
      prompt = PROMPT, cache = false, budget = { calls = 5 } } } }
    local s = counted:score(answers_batch(ANSWERS, 4))
    assert.equal(5, #received())
    for i = 1, N do
      if i <= 5 then
        assert.same({ "ok", i % 2 }, { s[i].terms.judge.status, s[i].terms.judge.value })
      else
        assert.same({ "unscorable", "unscorable" }, { s[i].status, s[i].terms.judge.status })
        assert.is_nil(s[i].terms.judge.value)
        assert.matches("budget spent: 5 calls of 5", s[i].terms.judge.message, 1, true)
      end
    end
    client:close()
  end)

  it("a server error or a timeout makes the episodes unscorable (never 0), after the judge's retries", function()
    local clock = H.fake_clock()
    local failing = rl.http.openai { base_url = base .. "/code/500", model = "verdict-f", retries = 0 }
    local g = R.graph { terms = { R.env(), R.judge { name = "judge", client = failing, prompt = PROMPT,
      cache = false, retries = 1, backoff = 2, clock = clock } } }
    local s = g:score(answers_batch({ "a", "b", "c" }, 3))
    for i = 1, 3 do
      assert.same({ "unscorable", "unscorable" }, { s[i].status, s[i].terms.judge.status })
      assert.is_nil(s[i].terms.judge.value)
      assert.matches("failed: HTTP 500 from /v1/chat/completions: injected 500", s[i].terms.judge.message, 1, true)
    end
    assert.equal(6, #received()) -- each episode asked twice (the judge's retry), the client retrying nothing
    assert.equal(2, clock.slept) -- the backoff, on the judge's clock
    assert.equal(6, g:stats().judge.judge.errors)
    -- a server slower than the judge's timeout
    local slow = rl.http.openai { base_url = base .. "/delay/600", model = "verdict-f", retries = 0 }
    local t0 = rl.clock()
    local g2 = R.graph { terms = { R.judge { name = "judge", client = slow, prompt = PROMPT, cache = false,
      timeout = 0.1 } } }
    s = g2:score(answers_batch({ "a", "b" }, 2))
    assert.is_true(rl.clock() - t0 < 1, "the timeout did not cut the calls short")
    for i = 1, 2 do
      assert.equal("unscorable", s[i].terms.judge.status)
      assert.is_nil(s[i].terms.judge.value)
      assert.matches("timed out", s[i].terms.judge.message, 1, true)
    end
    assert.equal(2, g2:stats().judge.judge.timeouts)
    assert.equal(2, #received())
    failing:close()
    slow:close()
  end)

  it("rl.reward.rank: one request per group, the server's ranking mapped back through the shuffle", function()
    local client = rl.http.openai { base_url = base, model = "ranker", retries = 0 }
    local g = R.graph { seed = 5, terms = { R.rank { name = "rank", client = client,
      rubric = "Prefer larger numbers.", cache = false } } }
    local answers = { "n 7", "n 3", "n 9", "n 1", "n 12", "n 40", "n 2" }
    local want = { 2 / 3, 1 / 3, 1, 0, 0.5, 1, 0 }
    local s = g:score(answers_batch(answers, 4))
    for i = 1, #answers do assert.is_near(want[i], s[i].terms.rank.value, 1e-12, answers[i]) end
    local seen = received()
    assert.equal(2, #seen)
    local shuffled = false
    for k, r in ipairs(seen) do
      local shown = {}
      for v in r.json.messages[#r.json.messages].content:gmatch("\n%[%d+%] n (%d+)") do shown[#shown + 1] = v end
      local members = k == 1 and { "7", "3", "9", "1" } or { "12", "40", "2" }
      assert.equal(#members, #shown)
      shuffled = shuffled or table.concat(shown, ",") ~= table.concat(members, ",")
    end
    assert.is_true(shuffled, "the server saw every group in batch order")
    client:close()
  end)

  it("rl.synth.proposer: one request per proposal, with its seed and sampling; the replies pass the contract", function()
    local seedlib = require "moonrl.train.seed"
    local client = rl.http.openai { base_url = base, profile = "vllm", model = "proposer", retries = 0 }
    local contract = rl.synth.contract { "instruction", "answer" }
    local exemplars = { { instruction = "add 2 and 3", answer = "5" }, { instruction = "add 4 and 4", answer = "8" } }
    local p = rl.synth.proposer { policy = client, contract = contract, seeds = exemplars, group = 2,
      max_tokens = 24, temperature = 0.5 }
    local items = p:propose({}, 4, 7, exemplars)
    assert.equal(4, #items)
    local seen = received()
    assert.equal(4, #seen)
    for i, it in ipairs(items) do
      local ex = exemplars[it.group]
      assert.equal(ex, it.exemplar)
      assert.is_nil(it.error)
      assert.equal("reply to: " .. it.prompt, it.text) -- the server's reply to this prompt
      local task = assert(contract:validate(it.text))
      assert.same({ ex.instruction, ex.answer }, { task.instruction, task.answer })
      local body = seen[i].json
      assert.same({ "proposer", 24, 0.5, it.prompt }, { body.model, body.max_tokens, body.temperature,
        body.messages[1].content })
      assert.equal(tostring(seedlib.mix(7, i)), seen[i].body:match('"seed":(%d+)'))
    end
    client:close()
  end)
end)

describe("a judge through moonrl serve", function()
  it("plugs rl.http.openai (profile moonrl) into a judge: serve answers, its reply is no verdict, so unscorable", function()
    local dir = H.tmpdir()
    local m = rl.model.new { dim = 32, layers = 1, heads = 2, ctx = 96, seed = 11 }
    assert(m:save(dir .. "/m"))
    local srv = H.serve(dir .. "/m")
    finally(function()
      srv.stop()
      H.sh("rm -rf " .. H.shell_quote(dir))
    end)
    local client = rl.http.openai { base_url = srv.base, profile = "moonrl", model = "moonrl", retries = 0, timeout = 60 }
    local health = rl.http.client { base_url = srv.base, retries = 0 }
    local function requests()
      local status, _, body = health:get("/health")
      assert.equal(200, status)
      return json.decode(body).requests
    end
    local before = requests()
    local g = R.graph { terms = { R.judge { name = "judge", client = client, prompt = PROMPT,
      sampling = { max_tokens = 4, temperature = 0 }, cache = false } } }
    local s = g:score(answers_batch({ "a" }, 1))
    assert.equal(before + 1, requests()) -- serve answered the judge's one request
    assert.equal("unscorable", s[1].terms.judge.status)
    assert.is_nil(s[1].terms.judge.value)
    assert.matches("the reply is neither yes nor no", s[1].terms.judge.message, 1, true)
    assert.equal(1, g:stats().judge.judge.calls)
    assert.equal(0, g:stats().judge.judge.errors) -- a reply came; it was no verdict
    assert.is_true(g:stats().judge.judge.tokens > 0) -- serve's usage reached the judge
    health:close()
    client:close()
  end)
end)
