-- envkit_spec.lua - rl.envkit, the pieces for writing environments: costs in named currencies
-- (summed exactly, into ep.costs and the budget term), noise planned from the episode's seed
-- (the same plan in another process) and fired per turn, personas, macro actions (the same as
-- their primitives one by one), everything logged with the episode, and the options checked.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"

local kit = rl.envkit
local T = rl.tensor

local prices = kit.costs { currencies = { "money", "discomfort", "time" },
  actions = { cbc = { money = 1, discomfort = 1 }, ct = { money = 3, discomfort = 1, time = 0.5 },
    ask = { time = 0.1 } } }

-- A small clinic: "ask" (costs time), "exam cbc" / "exam ct" (priced, tool calls), "dx <d>"
-- ends the episode (reward 1 for "flu"). Patient noise on "ask" turns turns the answer "unsure";
-- a persona's mood "impatient" shortens answers. Macro "workup" = exam cbc, exam ct.
local patient_noise = kit.noise { types = { "vague", "omits", "contradictory" }, rate = 0.5,
  count = { 1, 3 }, within = 4, on = "^ask" }
local people = kit.personas { traits = { { name = "mood", values = { "plain", "impatient" }, weights = { 3, 1 } },
  { name = "recall", values = { "low", "high" } } } }
local macros = kit.macros { macros = { workup = { "exam cbc", "exam ct" } } }

local Episode = {}
Episode.__index = Episode

local function primitive(self, action)
  self.log[#self.log + 1] = action
  local fired = self.plan:step(action)
  local exam = action:match("^exam (%a+)")
  local obs, reward, done, info = nil, 0, false, {}
  if exam then
    self.ledger:charge(exam)
    obs, info.tool_call = exam .. ": normal", true
  elseif action:match("^ask") then
    self.ledger:charge("ask")
    obs = #fired > 0 and "unsure" or (self.persona.mood == "impatient" and "no" or "no, not at all")
  elseif action:match("^dx") then
    done, reward = true, action == "dx flu" and 1 or 0
  else
    obs = "?"
  end
  info.costs, info.noise = self.ledger:turn(), #fired > 0 and fired or nil
  return obs, reward, done, info
end

local clinic = {
  name = "clinic_kit", max_turns = 4, format = "line",
  tasks = function(_, n)
    local t = {}
    for i = 1, n do t[i] = { i = i } end
    return t
  end,
  new = function() return setmetatable({ log = {} }, Episode) end,
}
function Episode:reset(task, rng)
  self.task, self.ledger = task, prices:ledger()
  self.plan = patient_noise:plan(rng)
  self.persona = people:draw(rng)
  return "patient " .. self.persona.mood
end
function Episode:step(action, parsed) return macros:step(self, action, parsed, primitive) end
function Episode:episode_info() return { persona = self.persona, noise = self.plan:log() } end

describe("rl.envkit", function()
  it("a ledger charges priced actions and amounts, per turn and in total, exactly", function()
    local l = prices:ledger()
    assert.are.same({ money = 0, discomfort = 0, time = 0 }, l:totals())
    assert.are.same({ money = 3, discomfort = 1, time = 0.5 }, l:charge("ct"))
    l:charge { money = 0.1 }
    l:charge { money = 0.2, time = 0.7 }
    local t1 = l:turn()
    assert.are.same({ money = (3 + 0.1) + 0.2, discomfort = 1, time = 0.5 + 0.7 }, t1)
    assert.are.same({ money = 0, discomfort = 0, time = 0 }, l:turn()) -- a turn without charges
    l:charge("ask")
    l:charge { money = 0.3 }
    local copy = l:clone()
    local t3 = l:turn()
    -- the totals are the turns' sums added in turn order, as rl.batch adds info.costs
    local want = { money = (t1.money + 0) + t3.money, discomfort = 1, time = (t1.time + 0) + t3.time }
    assert.are.same(want, l:totals())
    assert.are.same(want, copy:totals()) -- (the open turn counts too)
    copy:charge("cbc")
    assert.are.same(want, l:totals()) -- the copy is its own
    assert.are.same({ money = 1, discomfort = 1 }, prices:price("cbc"))
    assert.is_nil(prices:price("mri"))
  end)

  it("the costs of each turn become ep.costs, a budget term's penalty and the episode's log", function()
    local costs = { { money = 3, discomfort = 1, time = 0.5 }, { money = 0.1, discomfort = 0, time = 0.2 },
      { money = 0.2, discomfort = 0, time = 0.1 } }
    local record = {}
    for k, c in ipairs(costs) do record[k] = { action = "a", reward = 0, info = { costs = c } } end
    local b = rl.batch.new { tokens = T.from { 1, 2 }, logprobs = T.zeros(2), mask = T.from { 0, 1 },
      turns = T.zeros(2), offsets = { 0, 2 }, episodes = { { group = 1, reward = 0, record = record } } }
    local ep = b.episodes[1]
    assert.are.same({ money = (3 + 0.1) + 0.2, discomfort = 1, time = (0.5 + 0.2) + 0.1 }, ep.costs)
    local g = rl.reward.graph { terms = { rl.reward.budget { name = "cost", costs = { money = 0.5, discomfort = 2 } } } }
    g:score(b)
    assert.are.equal(-(0.5 * ep.costs.money + 2 * ep.costs.discomfort), ep.reward_terms.cost)
    local path = os.tmpname()
    assert(b:to_jsonl(path))
    local back = assert(rl.batch.load(path))
    assert.are.same(ep.costs, back.episodes[1].costs)
    os.remove(path)
    -- an episode nobody charged has no costs, and the budget charges it nothing
    local free = rl.batch.new { tokens = T.from { 1, 2 }, logprobs = T.zeros(2), mask = T.from { 0, 1 },
      turns = T.zeros(2), offsets = { 0, 2 }, episodes = { { group = 1, reward = 0, record = { { action = "a" } } } } }
    assert.is_nil(free.episodes[1].costs)
    g:score(free)
    assert.are.equal(0, free.episodes[1].reward_terms.cost)
  end)

  it("a noise plan is drawn from the seed: the same in every process, at the configured rate", function()
    local function plans(from, to)
      local out = {}
      for s = from, to do
        local p = patient_noise:plan(s)
        for _, a in ipairs { "ask a", "exam cbc", "ask b", "ask c", "dx x", "ask d", "ask e" } do p:step(a) end
        out[#out + 1] = rl.json.encode(p:log())
      end
      return table.concat(out, "\n")
    end
    local here = plans(1, 40)
    assert.are.equal(here, plans(1, 40))
    local out, _, ok = H.run_lua([[
      local rl = require "moonrl"
      local n = rl.envkit.noise { types = { "vague", "omits", "contradictory" }, rate = 0.5,
        count = { 1, 3 }, within = 4, on = "^ask" }
      for s = 1, 40 do
        local p = n:plan(s)
        for _, a in ipairs { "ask a", "exam cbc", "ask b", "ask c", "dx x", "ask d", "ask e" } do p:step(a) end
        io.write(rl.json.encode(p:log()), s < 40 and "\n" or "")
      end
    ]])
    assert.is_true(ok, out)
    assert.are.equal(here, out)
    assert.are_not.equal(here, plans(41, 80))
    -- the schedule: 1..3 types, each on a different counted ("ask") turn among the first 4
    local noisy, n = 0, 2000
    for s = 1, n do
      local p = patient_noise:plan(s)
      if p.noisy then
        noisy = noisy + 1
        assert.is_true(#p.types >= 1 and #p.types <= 3)
        local used = {}
        for _, t in ipairs(p.types) do
          local k = p.at[t]
          assert.is_true(k >= 1 and k <= 4 and not used[k])
          used[k] = true
        end
        -- it fires on the k-th "ask" turn, whatever comes between
        local fired, asks = {}, 0
        for turn, a in ipairs { "exam ct", "ask a", "hello", "ask b", "ask c", "exam cbc", "ask d" } do
          if a:match("^ask") then asks = asks + 1 end
          for _, t in ipairs(p:step(a)) do fired[t] = { turn = turn, ask = asks } end
        end
        for _, t in ipairs(p.types) do assert.are.equal(p.at[t], fired[t].ask) end
        assert.are.equal(#p.types, #p:log().fired)
      else
        assert.are.same({}, p.types)
        assert.are.same({}, p:step("ask a"))
      end
    end
    assert.is_near(0.5, noisy / n, 0.04)
  end)

  it("a plan takes one draw from an episode's rl.rng, and keeps to the eligible types", function()
    local r1, r2 = rl.rng(9), rl.rng(9)
    local a = patient_noise:plan(r1)
    assert.are.same(rl.json.encode(a:log()), rl.json.encode(patient_noise:plan(r2):log()))
    local r3 = rl.rng(9)
    r3:random(0, 0x3FFFFFFFFFFFFFFF)
    assert.are.equal(r3:random(), r1:random()) -- exactly one draw was taken
    for s = 1, 200 do
      local p = patient_noise:plan(s, { eligible = { "omits" } })
      assert.is_true(#p.types == 0 or (#p.types == 1 and p.types[1] == "omits"))
      local q = patient_noise:plan(s, { eligible = function(t) return t ~= "vague" end })
      for _, t in ipairs(q.types) do assert.are_not.equal("vague", t) end
    end
    -- two noise models of one seed draw apart (their salts differ)
    local exam = kit.noise { types = { "swap", "omission", "ambiguity" }, per_turn = 0.5, on = "^exam" }
    local same = 0
    for s = 1, 50 do
      if patient_noise:plan(s).noisy == exam:plan(s).noisy then same = same + 1 end
    end
    assert.is_true(same < 50)
  end)

  it("per-turn noise fires on each counted turn with its probability; a clone fires alike", function()
    local exam = kit.noise { types = { "swap", "omission", "ambiguity" }, per_turn = 0.3, on = "^exam" }
    local fired, counted = 0, 0
    for s = 1, 300 do
      local p = exam:plan(s)
      local c
      for turn = 1, 8 do
        local a = turn % 2 == 0 and "exam ct" or "ask"
        if turn == 4 then c = p:clone() end -- from here on the copy steps beside it
        local f = p:step(a)
        if c then assert.are.same(f, c:step(a)) end
        if a == "ask" then assert.are.same({}, f) elseif p.noisy then counted = counted + 1 end
        assert.is_true(#f <= 1)
        fired = fired + #f
      end
      assert.are.equal(rl.json.encode(p:log()), rl.json.encode(c:log()))
    end
    assert.is_near(0.3, fired / counted, 0.05)
  end)

  it("personas are drawn per seed, in proportion to their weights", function()
    assert.are.same(people:draw(5), people:draw(5))
    assert.are.same(people:draw(rl.rng(5)), people:draw(rl.rng(5)))
    local impatient, low, n = 0, 0, 4000
    for s = 1, n do
      local p = people:draw(s)
      assert.is_true(p.mood == "plain" or p.mood == "impatient")
      if p.mood == "impatient" then impatient = impatient + 1 end
      if p.recall == "low" then low = low + 1 end
    end
    assert.is_near(0.25, impatient / n, 0.03)
    assert.is_near(0.5, low / n, 0.03)
    local out, _, ok = H.run_lua([[
      local rl = require "moonrl"
      local p = rl.envkit.personas { traits = { { name = "mood", values = { "plain", "impatient" },
        weights = { 3, 1 } }, { name = "recall", values = { "low", "high" } } } }
      for s = 1, 30 do io.write(rl.json.encode(p:draw(s)), "\n") end
    ]])
    assert.is_true(ok, out)
    local here = {}
    for s = 1, 30 do here[s] = rl.json.encode(people:draw(s)) .. "\n" end
    assert.are.equal(table.concat(here), out)
  end)

  it("a macro is its primitives one by one: observations, rewards, costs and state", function()
    local function fresh(seed)
      local e = clinic.new()
      e:reset({ i = 1 }, rl.rng(seed))
      return e
    end
    for seed = 1, 20 do
      local m, p = fresh(seed), fresh(seed)
      m:step("ask fever")
      p:step("ask fever")
      local obs, reward, done, info = m:step(" workup ")
      local obs1, r1, d1, i1 = p:step("exam cbc")
      local obs2, r2, d2, i2 = p:step("exam ct")
      assert.are.equal(obs1 .. "\n" .. obs2, obs)
      assert.are.equal(r1 + r2, reward)
      assert.are.equal(d1 or d2, done)
      assert.is_true(info.tool_call)
      assert.are.equal("workup", info.macro.name)
      assert.are.same({ "exam cbc", "exam ct" }, { info.macro.steps[1].action, info.macro.steps[2].action })
      assert.are.same({ obs1, obs2 }, { info.macro.steps[1].observation, info.macro.steps[2].observation })
      assert.are.same(i1.costs, info.macro.steps[1].costs)
      for _, c in ipairs { "money", "discomfort", "time" } do
        assert.are.equal(i1.costs[c] + i2.costs[c], info.costs[c])
      end
      assert.are.same(p.ledger:totals(), m.ledger:totals()) -- (dyadic prices: exact either way)
      assert.are.same(p.log, m.log)
      assert.are.same(p.plan:log(), m.plan:log())
      assert.are.same({ "exam cbc", "exam ct" }, macros:expand("workup"))
      assert.is_nil(macros:expand("exam cbc"))
    end
    -- a primitive that ends the episode ends the macro there
    local stop = kit.macros { macros = { guess = { "dx flu", "exam ct" } } }
    local e = fresh(1)
    local obs, reward, done, info = stop:step(e, "guess", nil, primitive)
    assert.is_nil(obs)
    assert.are.same({ 1, true, 1 }, { reward, done, #info.macro.steps })
    assert.are.same({ "dx flu" }, e.log)
  end)

  it("an episode's costs, persona and noise are logged with it, the same for one seed", function()
    local dir = H.tmpdir()
    local function run(name)
      rl.train { model = rl.model.new { vocab = 264, dim = 32, layers = 1, heads = 2, ffn = 64, ctx = 96,
        seed = 3 }, tokenizer = rl.tokenizer.bytes(), env = clinic, dir = dir, name = name, seed = 7,
        steps = 1, tasks_per_step = 2, group_size = 3, max_turn_tokens = 8, eval = false,
        progress = false, plot = false, log_episodes = 6,
        reward = rl.reward.graph { terms = { rl.reward.env {},
          rl.reward.budget { name = "cost", costs = { money = 0.1, time = 1 } } } } }
      return H.read_json_lines(dir .. "/" .. name .. "/episodes.jsonl")
    end
    local eps = run("a")
    assert.are.equal(6, #eps)
    for _, ep in ipairs(eps) do
      assert.is_table(ep.env_info.persona)
      assert.is_string(ep.env_info.persona.mood)
      assert.is_boolean(ep.env_info.noise.noisy)
      assert.is_table(ep.env_info.noise.planned)
      -- every turn the environment saw charged something or nothing, in every currency
      local money = 0
      for _, r in ipairs(ep.record) do
        assert.is_number(r.info.costs.money)
        money = money + r.info.costs.money
      end
      assert.are.equal(money, ep.costs.money)
      assert.is_near(-(0.1 * ep.costs.money + ep.costs.time), ep.reward_terms.cost, 1e-12)
    end
    local again = run("b")
    for i, ep in ipairs(eps) do
      assert.are.equal(rl.json.encode(ep.env_info), rl.json.encode(again[i].env_info))
      assert.are.equal(rl.json.encode(ep.costs), rl.json.encode(again[i].costs))
    end
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)

  it("an episode_info() that fails is the episode's environment error", function()
    local ro = rl.rollout.new { model = rl.model.new { vocab = 264, dim = 16, layers = 1, heads = 2,
      ffn = 32, ctx = 64, seed = 1 }, episodes = 1, capacity = 64 }
    local env = { name = "broken_info", tasks = clinic.tasks, new = function()
      return { reset = function() return "x" end, step = function() return nil, 0, true end,
        episode_info = function() error("no persona yet") end }
    end }
    local results = ro:run { tokenizer = rl.tokenizer.bytes(), env = env, tasks = { {} }, seeds = { 1 },
      max_turns = 1, max_turn_tokens = 2 }
    local b = rl.batch.from_rollout(ro, results, { 1 })
    assert.are.equal("env_error", b.episodes[1]["end"])
    assert.matches("episode_info%(%) failed: .*no persona yet", b.episodes[1].error)
    ro:free()
  end)

  it("bad options raise errors that name the argument", function()
    local cases = {
      { function() kit.costs { currency = { "money" } } end, "rl.envkit.costs: unknown field 'currency' (known: currencies, actions)" },
      { function() kit.costs {} end, "rl.envkit.costs: currencies: a non-empty list of currency names" },
      { function() kit.costs { currencies = { "a", "a" } } end, "currencies: 'a' appears twice" },
      { function() kit.costs { currencies = { "money" }, actions = { ct = { mony = 1 } } } end,
        "actions.ct: unknown currency \"mony\" (did you mean 'money'?)" },
      { function() kit.costs { currencies = { "money" }, actions = { ct = { money = -1 } } } end,
        "actions.ct: money: a non-negative number expected, got -1" },
      { function() prices:ledger():charge("mri") end, "ledger:charge: action: 'mri' has no price" },
      { function() prices:ledger():charge { money = 0 / 0 } end, "money: a non-negative number expected" },
      { function() kit.noise { types = { "a" }, rat = 0.5 } end, "rl.envkit.noise: unknown field 'rat' (did you mean 'rate'?)" },
      { function() kit.noise { types = { "a" }, rate = 2 } end, "rl.envkit.noise: rate: a number in [0, 1] expected, got 2" },
      { function() kit.noise { types = { "a" }, count = { 2, 1 } } end, "count: a pair {lo, hi} of integers with 1 <= lo <= hi" },
      { function() kit.noise { types = { "a" }, on = "[" } end, "on: a valid Lua pattern expected" },
      { function() kit.noise { types = {} } end, "types: a non-empty list of noise type names" },
      { function() patient_noise:plan("seed") end, "noise:plan: seed: an integer or an rl.rng expected, got \"seed\"" },
      { function() patient_noise:plan(1, { eligible = { "vauge" } }) end, "eligible: unknown noise type \"vauge\" (did you mean 'vague'?)" },
      { function() patient_noise:plan(1, { elegible = {} }) end, "noise:plan: unknown field 'elegible' (did you mean 'eligible'?)" },
      { function() kit.personas { traits = { { name = "m", values = { "a", "b" }, weights = { 1 } } } } end,
        "traits[1].weights: one non-negative weight per value" },
      { function() kit.personas { traits = { { name = "m", vals = { "a" } } } } end,
        "rl.envkit.personas: traits[1]: unknown field 'vals' (did you mean 'values'?)" },
      { function() people:draw(1.5) end, "personas:draw: seed: an integer or an rl.rng expected, got 1.5" },
      { function() kit.macros { macros = { a = {} } } end, "macros.a: a non-empty list of primitive actions expected" },
      { function() kit.macros { macros = { a = { "b" }, b = { "c" } } } end, "'b' is a macro (macros do not nest)" },
      { function() kit.macros { macros = { a = { "b" } }, format = "xml" } end, "format: one of \"line\", \"hermes\" expected" },
      { function() macros:step({}, "workup", nil, nil) end, "macros:step: primitive: a function" },
      { function() kit.seed(1) end, "rl.envkit.seed: salt: a string expected" },
      { function() rl.reward.budget { costs = { money = -1 } } end,
        "rl.reward.budget: costs.money: a non-negative number expected, got -1" },
      { function() rl.reward.budget { costs = {} } end, "rl.reward.budget: costs: a table {currency = coefficient}" },
    }
    for _, c in ipairs(cases) do H.assert_error(c[1], c[2]) end
    -- raised at the caller's line
    local line = debug.getinfo(1, "l").currentline + 1
    local msg = H.error_of(function() kit.noise { types = { "a" }, rate = -1 } end)
    assert.truthy(msg:find("envkit_spec.lua:" .. line .. ":", 1, true), msg)
  end)
end)

describe("rl.envkit state blocks and copies", function()
  local kit = rl.envkit

  it("a state block renders the tracked fields in declared order, cut at max_bytes", function()
    local block = kit.state_block { fields = { "user", { name = "found", kind = "set", keep = 2 }, "goal" },
      max_bytes = 30 }
    local st = block:tracker()
    assert.are.equal("", st:render())
    assert.are.equal("uid=1000", st:wrap("uid=1000"))
    assert.is_true(st:set("user", "bob"))
    assert.is_false(st:set("user", "bob"))
    assert.is_true(st:add("found", "sudo"))
    assert.is_false(st:add("found", "sudo"))
    assert.are.equal("[user=bob found=sudo] ok", st:wrap("ok"))
    st:add("found", "suid")
    st:add("found", "cron") -- keep = 2: the oldest item leaves
    assert.are.same({ "suid", "cron" }, st:get("found"))
    st:set("goal", 0)
    local full = "user=bob found=suid,cron goal=0" -- 31 bytes, cut to 30
    assert.are.equal(full:sub(1, 30), st:render())
    st:set("goal", nil)
    assert.are.equal("user=bob found=suid,cron", st:render())
    local c = st:clone()
    c:set("user", "root")
    c:add("found", "caps")
    assert.are.equal("user=bob found=suid,cron", st:render())
    assert.are.equal("user=root found=cron,caps", c:render())
    local other = kit.state_block { fields = { "a" }, prefix = "<", suffix = ">", sep = ";" }:tracker()
    other:set("a", true)
    assert.are.equal("<a=true>x", other:wrap("x"))
  end)

  it("state block misuse raises naming the field", function()
    local block = kit.state_block { fields = { "user", { name = "found", kind = "set" } } }
    local st = block:tracker()
    local cases = {
      { function() st:set("usr", "x") end, "tracker:set: unknown field \"usr\" (did you mean 'user'?)" },
      { function() st:set("found", "x") end, "tracker:set: field 'found' is a set" },
      { function() st:add("user", "x") end, "tracker:add: field 'user' is a value" },
      { function() st:add("found", {}) end, "tracker:add: value: a string, number or boolean expected" },
      { function() kit.state_block { fields = {} } end, "rl.envkit.state_block: fields: a non-empty list" },
      { function() kit.state_block { fields = { "a", "a" } } end, "fields: 'a' appears twice" },
      { function() kit.state_block { fields = { { name = "a", kind = "bag" } } } end, "fields[1]: kind" },
      { function() kit.state_block { fields = { "a" }, max_byte = 3 } end, "unknown field 'max_byte' (did you mean 'max_bytes'?)" },
    }
    for _, c in ipairs(cases) do
      local ok, err = pcall(c[1])
      assert.is_false(ok)
      assert.truthy(tostring(err):find(c[2], 1, true), tostring(err))
    end
  end)

  -- A counter environment: the task says how many "inc" actions reach the goal; copy i of
  -- copies{variant} needs task.n + i - 1 of them.
  local Counter = { name = "counter", format = "line", max_turns = 6 }
  function Counter.tasks(_, n) local t = {} for i = 1, n do t[i] = { n = 2 } end return t end
  function Counter.oracle(task) local a = {} for i = 1, task.n do a[i] = "inc" end return a end
  local CI = {}
  CI.__index = CI
  function Counter.new() return setmetatable({}, CI) end
  function CI:reset(task) self.need, self.at = task.n, 0 return "need " .. task.n end
  function CI:step(action)
    if action ~= "inc" then return "?", -0.5, false, { costs = { money = 1 } } end
    self.at = self.at + 1
    local won = self.at >= self.need
    if won then return nil, 1, true, { success = true, costs = { money = 2 } } end
    return "at " .. self.at, 0, false, { success = false, costs = { money = 2 } }
  end
  function CI:clone() return setmetatable({ need = self.need, at = self.at }, CI) end

  it("copies step one action in every copy, aggregate observations, rewards and success", function()
    local W = kit.copies { env = Counter, n = 3, variant = function(task, i) return { n = task.n + i - 1 } end }
    assert.are.equal("counter-x3", W.name)
    assert.are.equal(Counter.tasks, W.tasks)
    local inst = W.new()
    assert.are.equal("1: need 2\n2: need 3\n3: need 4", inst:reset({ n = 2 }, rl.rng(1)))
    local obs, r, done, info = inst:step("bad")
    assert.are.equal("1: ?\n2: ?\n3: ?", obs)
    assert.are.equal(-0.5, r)
    assert.is_false(done)
    assert.are.same({ money = 3 }, info.costs)
    inst:step("inc")
    local c = inst:clone()
    obs, r, done, info = inst:step("inc") -- copy 1 wins
    assert.are.equal("1: done\n2: at 2\n3: at 2", obs)
    assert.are.equal(1 / 3, r)
    assert.is_false(done)
    assert.is_false(info.success)
    assert.are.same({ money = 6 }, info.costs)
    inst:step("inc")
    obs, r, done, info = inst:step("inc")
    assert.are.equal("1: done\n2: done\n3: done", obs)
    assert.is_true(done)
    assert.is_true(info.success)
    assert.are.same({ money = 2 }, info.costs) -- only copy 3 was still running
    -- the clone went on from the state it was taken in
    obs = c:step("inc")
    assert.are.equal("1: done\n2: at 2\n3: at 2", obs)
    -- "any" and "mean"
    local any = kit.copies { env = Counter, n = 2, success = "mean", variant = function(t, i) return { n = i } end }.new()
    any:reset({ n = 1 })
    local _, _, d, inf = any:step("inc")
    assert.is_false(d)
    assert.are.equal(0.5, inf.success_rate)
    assert.is_false(inf.success)
    local anyw = kit.copies { env = Counter, n = 2, success = "any", variant = function(t, i) return { n = i } end }.new()
    anyw:reset({ n = 1 })
    assert.is_true(select(4, anyw:step("inc")).success)
  end)

  it("copies run through the rollout protocol and reject bad options", function()
    local W = kit.copies { env = Counter, n = 2 }
    local inst, record = W.new(), {}
    inst:reset({ n = 2 }, rl.rng(3))
    for _ = 1, 2 do rl.env.step(W, inst, "inc", record) end
    assert.is_true(record[2].done)
    assert.is_true(record[2].info.success)
    assert.are.equal(1, record[2].reward)
    local ok, err = pcall(kit.copies, { env = Counter, n = 0 })
    assert.is_false(ok)
    assert.truthy(err:find("rl.envkit.copies: n", 1, true))
    ok, err = pcall(kit.copies, { env = {}, n = 2 })
    assert.truthy(err:find("env: an environment module", 1, true))
    ok, err = pcall(kit.copies, { env = Counter, sucess = "all" })
    assert.truthy(err:find("did you mean 'success'", 1, true))
  end)
end)
