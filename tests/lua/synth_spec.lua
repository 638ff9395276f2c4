-- synth_spec.lua - task synthesis (rl.synth): the contract, the verifiers on a prepared corpus of
-- 30 proposals (acceptance test 15), pass-rate calibration against a simulated policy of known
-- per-task p (16), near-duplicate detection on a fixed corpus (17), the loop's admission,
-- retirement, regression, provenance and state, failure targeting (a quick 19), and bad input.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"

local S = rl.synth
local CONTRACT = S.contract { "instruction", "answer", "check", "solution", "failures" }

-- ---------------------------------------------------------------- word problems for the tests

local OPS = { ["+"] = function(a, b) return a + b end, ["-"] = function(a, b) return a - b end,
  ["*"] = function(a, b) return a * b end }

local TEMPLATES = {
  ["+"] = "%s has %d %s and finds %d more. How many %s does %s have now?",
  ["-"] = "%s has %d %s and gives away %d. How many %s does %s have left?",
  ["*"] = "%s fills %d boxes with %d %s each. How many %s are there in all? (%s counts)",
}

-- A well-formed proposal: instruction, answer, a Lua check, a Lua solution, failure cases, and
-- the fields the oracle reads (a, op, b).
local function problem(a, op, b, who, thing)
  who, thing = who or "Ann", thing or "apples"
  local ans = OPS[op](a, b)
  local text
  if op == "*" then text = string.format(TEMPLATES[op], who, a, b, thing, thing, who)
  else text = string.format(TEMPLATES[op], who, a, thing, b, thing, who) end
  return { instruction = text, answer = tostring(ans), check = string.format("local x = ... return tonumber(x) == %d", ans),
    solution = string.format("return %d %s %d", a, op, b), failures = { tostring(ans + 1), tostring(ans - 1) },
    a = a, b = b }
end

local function with(t, over)
  local out = {}
  for k, v in pairs(t) do out[k] = v end
  for k, v in pairs(over) do out[k] = v end
  return out
end

-- The environment's own solver: it reads the instruction (as a solver would), not the fields.
local function oracle(task)
  local text = task.instruction:lower():gsub("%s+", " ")
  local a, b = text:match("has (%-?%d+) %a+ and finds (%-?%d+) more")
  if a then return tonumber(a) + tonumber(b) end
  a, b = text:match("has (%-?%d+) %a+ and gives away (%-?%d+)")
  if a then return tonumber(a) - tonumber(b) end
  a, b = text:match("fills (%-?%d+) boxes with (%-?%d+) %a+ each")
  if a then return tonumber(a) * tonumber(b) end
  return nil
end

-- A simulated policy of known per-task p (task.p, else from the numbers in the instruction: 1
-- when none is above 1, 0 when one is 1000 or more, else 1/2): successes drawn with rl.rng(seed), or exactly round(p k)
-- with exact = true.
local function simulated(exact, p_of)
  return function(tasks, k, seed)
    local rng = rl.rng(seed)
    local out = {}
    for i, t in ipairs(tasks) do
      local p = p_of and p_of(t) or t.p
      if not p then
        local m = 0
        for x in t.instruction:gmatch("%d+") do m = math.max(m, tonumber(x)) end
        p = m <= 1 and 1 or m >= 1000 and 0 or 0.5
      end
      local list, wins = {}, math.floor(p * k + 0.5)
      for j = 1, k do
        local ok
        if exact then ok = j <= wins else ok = rng:random() < p end
        list[j] = { success = ok, answer = ok and tostring(t.answer) or "?" }
      end
      out[i] = list
    end
    return out
  end
end

-- A proposer that hands out a fixed list (the corpus), in order.
local function fixed_proposer(list, seeds)
  local p = { seeds = seeds or {}, group = 1, at = 0 }
  function p:propose(_, n)
    local items = {}
    for i = 1, n do
      self.at = self.at + 1
      local x = list[self.at]
      items[i] = type(x) == "string" and { text = x } or { task = x }
    end
    return items
  end
  return p
end

-- A curriculum pool stand-in that records what the loop asks of it.
local function recording_pool()
  local pool = { admitted = {}, retired = {}, regressed = {}, active = {} }
  function pool:admit(t, meta)
    if self.active[t.key] then return nil, "already held" end
    self.admitted[#self.admitted + 1] = { task = t, meta = meta }
    self.active[t.key] = t
    return t
  end
  function pool:retire(key, why) self.retired[#self.retired + 1] = { key = key, why = why } self.active[key] = nil return true end
  function pool:regress(key) self.regressed[#self.regressed + 1] = key return true end
  function pool:sample() error("not used") end
  return pool
end

describe("rl.synth", function()
  -- ---------------------------------------------------------------- the contract

  it("reads proposals as tables, JSON or field lines, and names what a proposal lacks", function()
    local t = problem(7, "+", 5)
    local text = CONTRACT:render(t)
    local back = assert(CONTRACT:validate(text))
    for _, f in ipairs { "instruction", "answer", "check", "solution" } do assert.are.equal(t[f], back[f], f) end
    assert.are.same(t.failures, back.failures)
    local js = assert(CONTRACT:validate("Here it is: " .. rl.json.encode(t) .. " -- done"))
    assert.are.equal("12", js.answer)
    local inline = assert(CONTRACT:validate("instruction: What is 2+2?\nanswer: 4\ncheck: local a = ... return a == '4'\n"
      .. "solution: return 4\nfailures: 3 | 5"))
    assert.are.same({ "3", "5" }, inline.failures)
    assert.are.equal("12", assert(CONTRACT:validate(with(t, { answer = 12 }))).answer)
    local none, why, msg = CONTRACT:validate("I cannot think of a task")
    assert.is_nil(none)
    assert.are.equal("unparsable", why)
    assert.is_string(msg)
    none, why, msg = CONTRACT:validate(with(t, { check = "" }))
    assert.are.equal("missing_field", why)
    assert.truthy(msg:find("check", 1, true))
    none, why, msg = CONTRACT:validate(with(t, { failures = {} }))
    assert.are.equal("bad_field", why)
    assert.truthy(msg:find("failures", 1, true))
    none, why = CONTRACT:validate(with(t, { instruction = 7 }))
    assert.are.equal("bad_field", why)
    local custom = S.contract { "topic", "a", parse = function(s)
      local topic, a = s:match("^(%a+) (%-?%d+)$")
      if not topic then return nil, "not \"topic n\"" end
      return { topic = topic, a = tonumber(a) }
    end, render = function(x) return x.topic .. " " .. x.a end }
    assert.are.equal(-3, assert(custom:validate("temp -3")).a)
    assert.are.equal("temp -3", custom:render { topic = "temp", a = -3 })
    local _, r2, m2 = custom:validate("temp minus three")
    assert.are.equal("unparsable", r2)
    assert.truthy(m2:find("topic n", 1, true))
  end)

  -- ---------------------------------------------------------------- acceptance test 15

  it("classifies a corpus of 30 proposals with 30/30 correct reasons (acceptance test 15)", function()
    local seed = problem(2, "+", 3, "Sam", "shells")
    local corpus = {
      -- valid
      { problem(7, "+", 5), "admitted" },
      { problem(9, "-", 4, "Bob", "cards"), "admitted" },
      { problem(3, "*", 6, "Eve", "pens"), "admitted" },
      { CONTRACT:render(problem(12, "+", 30, "Kim", "coins")), "admitted" },
      { rl.json.encode(problem(8, "*", 7, "Lee", "eggs")), "admitted" },
      -- wrong answer: the stated answer fails the check; all three agree on a wrong sum (the
      -- oracle disagrees); the check and solution agree on a wrong sum the answer does not give
      { with(problem(6, "+", 6, "Ivy", "stamps"), { answer = "13" }), "wrong_answer" },
      { with(problem(4, "+", 9, "Jo", "marbles"), { answer = "14", check = "local x = ... return tonumber(x) == 14",
        solution = "return 14", failures = { "13", "15" } }), "wrong_answer" },
      { with(problem(5, "-", 2, "Hal", "keys"), { check = "local x = ... return tonumber(x) == 4",
        solution = "return 4", failures = { "2" } }), "wrong_answer" },
      -- non-deterministic: an answer drawn at random; a check that flips coins
      { with(problem(6, "*", 2, "Gus", "cups"), { solution = "local g = { 11, 12, 13, 14 } return g[math.random(4)]" }),
        "nondeterministic" },
      { with(problem(8, "-", 3, "Fay", "hats"), { check = "local x = ... return tonumber(x) == 5 or math.random() < 0.5",
        failures = { "4", "6", "7", "8", "9", "10" } }), "nondeterministic" },
      -- the solution fails its own check
      { with(problem(7, "*", 3, "Dee", "bells"), { solution = "return 7 * 3 + 1" }), "solution_fails_check" },
      { with(problem(9, "+", 1, "Cy", "rings"), { solution = "return 'ten'" }), "solution_fails_check" },
      { with(problem(6, "-", 1, "Al", "pins"), { solution = "return 5.5" }), "solution_fails_check" },
      -- a failure case passes
      { with(problem(4, "*", 4, "Mo", "tiles"), { failures = { "15", "16" } }), "failure_passes" },
      { with(problem(7, "-", 2, "Ned", "nuts"), { check = "local x = ... return tonumber(x) ~= nil" }), "failure_passes" },
      { with(problem(5, "+", 5, "Oz", "bolts"), { check = "local x = ... return math.abs(tonumber(x) - 10) <= 1" }),
        "failure_passes" },
      -- sandbox escapes
      { with(problem(3, "+", 8, "Pia", "figs"), { check = "os.execute('id') local x = ... return tonumber(x) == 11" }),
        "sandbox_escape" },
      { with(problem(9, "*", 2, "Quin", "pots"), { solution = "local f = io.open('/etc/passwd') return 18" }), "sandbox_escape" },
      { with(problem(8, "+", 4, "Rae", "jars"), { solution = "local os = require('os') return 12" }), "sandbox_escape" },
      -- over time
      { with(problem(6, "+", 3, "Tom", "logs"), { solution = "local n = 0 while true do n = n + 1 end return 9" }), "over_time" },
      { with(problem(7, "+", 7, "Uma", "mugs"), { check = "local x = ... repeat until false return true" }), "over_time" },
      -- duplicates: again, again with other case and spacing, with other numbers, of a seed
      { problem(7, "+", 5), "duplicate" },
      { with(problem(40, "-", 11, "Bob", "cards"), { instruction = "BOB has 40 cards  and gives away 11.   How many cards does Bob have left?" }),
        "duplicate" },
      { problem(2, "+", 3, "Sam", "shells"), "duplicate" },
      -- paraphrase duplicates: clauses reordered, a word changed
      { with(problem(12, "+", 30, "Kim", "coins"), { instruction = "How many coins does Kim have now? Kim has 12 coins and finds 30 more." }),
        "near_duplicate" },
      { with(problem(8, "*", 7, "Lee", "eggs"), { instruction = "Lee fills 8 boxes with 7 eggs each. How many eggs are there in total? (Lee counts)" }),
        "near_duplicate" },
      -- trivial and impossible for the policy
      { problem(1, "*", 1, "Vic", "dice"), "too_easy" },
      { problem(0, "+", 1, "Wes", "bats"), "too_easy" },
      { problem(123456, "*", 654321, "Xia", "grains"), "too_hard" },
      { problem(99999, "-", 1234, "Yul", "ants"), "too_hard" },
    }
    local list, expected = {}, {}
    for i, e in ipairs(corpus) do list[i], expected[i] = e[1], e[2] end
    local loop = S.loop { propose = fixed_proposer(list, { seed }), contract = CONTRACT,
      verify = { S.exec { runs = 2, budget = 200000 }, S.oracle(oracle) },
      calibrate = S.pass_rate { k = 8, band = { 0.125, 0.875 } }, per_step = #list,
      novelty = S.novelty { ngram = 5, minhash = 128, threshold = 0.7 } }
    local r = loop:step { solve = simulated(true) }
    local got, right, kinds = {}, 0, {}
    for i, rec in ipairs(loop:archive()) do
      got[i] = rec.status == "admitted" and "admitted" or rec.reason
      if got[i] == expected[i] then right = right + 1 end
      kinds[expected[i]] = true
    end
    assert.are.same(expected, got)
    local n = 0
    for _ in pairs(kinds) do n = n + 1 end
    assert.are.equal(11, n)
    assert.are.equal(30, #list)
    assert.are.equal(30, right)
    print(string.format("\n  [15] %d/%d proposals classified with the right reason", right, #list))
    assert.are.equal(5, r.admitted)
    assert.are.equal(5, r.duplicate) -- 3 exact (after normalising), 2 paraphrases
    assert.are.equal(2, r.too_easy)
    assert.are.equal(2, r.too_hard)
    assert.are.same({ wrong_answer = 3, nondeterministic = 2, solution_fails_check = 3, failure_passes = 3,
      sandbox_escape = 3, over_time = 2 }, r.invalid)
    -- provenance: the duplicates name what they repeat; the verifiers' verdicts are kept
    local arc = loop:archive()
    assert.are.equal(1, arc[22].similar.id)
    assert.are.equal(2, arc[23].similar.id)
    assert.are.equal("seed:1", arc[24].similar.id)
    assert.are.equal("pool", arc[24].similar.index)
    assert.are.equal(4, arc[25].similar.id)
    assert.is_true(arc[25].similar.similarity >= 0.7 and arc[25].similar.similarity < 1)
    assert.are.equal("oracle", arc[7].verifiers[2].name)
    assert.is_false(arc[7].verifiers[2].ok)
    assert.is_true(arc[7].verifiers[1].ok) -- exec alone cannot see a consistent wrong answer
    assert.are.same({ { step = 1, p = 0.5, n = 8, source = "calibrate" } }, arc[1].p)
  end)

  -- ---------------------------------------------------------------- acceptance test 16

  it("admits by the current policy's pass rate; >= 80% of admitted tasks measure inside the band on 32 fresh rollouts (acceptance test 16)", function()
    local N = 400
    local tasks = {}
    for i = 1, N do tasks[i] = with(problem(i, "+", 1), { p = ((i * 37) % N + 0.5) / N }) end
    local pool = recording_pool()
    local loop = S.loop { propose = fixed_proposer(tasks), contract = CONTRACT, verify = {},
      calibrate = S.pass_rate { k = 8, band = { 0.125, 0.875 } }, per_step = 100, pool = pool,
      novelty = false }
    local ctx = { solve = simulated(false) }
    for _ = 1, 4 do loop:step(ctx) end
    local admitted = {}
    for _, a in ipairs(pool.admitted) do admitted[#admitted + 1] = a.task end
    assert.is_true(#admitted > 200, #admitted)
    local fresh = S.pass_rate { k = 32 }:measure(ctx, admitted, 12345)
    local inside = 0
    for _, f in ipairs(fresh) do if f.p >= 0.125 and f.p <= 0.875 then inside = inside + 1 end end
    local share = inside / #admitted
    print(string.format("\n  [16] admitted %d of %d; inside the band on 32 fresh rollouts: %.1f%%", #admitted, N, 100 * share))
    assert.is_true(share >= 0.8, share)
    -- the band is what decides: every admitted task's calibration p is in it, none outside
    for _, rec in ipairs(loop:archive()) do
      local p = rec.p[1].p
      if rec.status == "admitted" then assert.is_true(p >= 0.125 and p <= 0.875)
      elseif rec.status == "too_easy" then assert.is_true(p > 0.875)
      else assert.are.equal("too_hard", rec.status) assert.is_true(p < 0.125) end
    end
  end)

  -- ---------------------------------------------------------------- acceptance test 17

  local NAMES = { "Ann", "Bob", "Cara", "Dmitri", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas" }
  local PROBLEMS = {
    "%s bakes %d loaves every morning and sells %d of them before noon. How many loaves remain?",
    "A train leaves the station with %d passengers; at the first stop %d more climb aboard. Count the riders now.",
    "The library lends %d novels on Monday and %d atlases on Tuesday; what is the total number of loans?",
    "%s plants %d rows of tulips with %d bulbs in each row. How many bulbs went into the garden?",
    "A tank holds %d litres of water and leaks %d litres an hour. After one hour, how much water is left?",
    "During the match the home team scored %d goals and the visitors %d. By how many goals did the home team win?",
    "%s saves %d coins a week for %d weeks. What is the size of the savings at the end?",
    "There are %d chairs in the hall; the janitor stacks away %d of them. How many chairs still stand?",
    "A recipe needs %d grams of flour per cake and the baker makes %d cakes. How much flour is used?",
    "The thermometer read %d degrees at dawn and climbed %d degrees by lunch. What did it read at lunch?",
    "%s reads %d pages of a mystery on Saturday and %d pages on Sunday. How many pages over the weekend?",
    "A farmer collects %d eggs and breaks %d while carrying the basket home. How many eggs are whole?",
    "Each of %d buses carries %d schoolchildren to the museum. How many children visit the museum?",
    "A shop had %d umbrellas before the storm and sold %d during the rain. How many umbrellas are unsold?",
    "The river rose %d centimetres overnight after standing at %d centimetres. What is its level now?",
    "%s runs %d laps around the track, each lap being %d metres long. What distance did the run cover?",
    "An orchard has %d apple trees and %d pear trees. How many fruit trees grow in the orchard altogether?",
    "A cinema sells %d tickets for the early show and %d for the late show. How many tickets are sold?",
    "A box of %d crayons loses %d crayons to a curious toddler. How many crayons stay in the box?",
    "The ferry makes %d crossings a day and carries %d cars each trip. How many cars cross in a day?",
  }
  local function text_of(k, a, b, who)
    local s = PROBLEMS[k]
    if s:sub(1, 2) == "%s" then return string.format(s, who, a, b) end
    return string.format(s, a, b)
  end
  -- Reorders a problem's two sentences (or its clauses around ";").
  local function reorder(s)
    local first, second = s:match("^(.-[%.;])%s+(.+)$")
    if not first then return s end
    first = first:gsub(";$", ".")
    return second .. " " .. first
  end

  it("rejects >= 90% of near-duplicates and accepts >= 95% of distinct tasks on a fixed corpus (acceptance test 17)", function()
    local nov = S.novelty { ngram = 5, minhash = 128, threshold = 0.7, against = { "pool" } }
    local rng = rl.rng(17)
    -- the pool: each problem with one name and one pair of numbers
    for k = 1, #PROBLEMS do
      nov:add({ instruction = text_of(k, 10 + k, 3 + k, NAMES[k % #NAMES + 1]) }, "pool", k)
    end
    local near, rejected = 0, 0
    for k = 1, #PROBLEMS do
      local who = NAMES[k % #NAMES + 1]
      local variants = {
        text_of(k, rng:random(20, 99), rng:random(1, 19), who),                -- renamed numbers
        reorder(text_of(k, 10 + k, 3 + k, who)),                              -- reordered clauses
        reorder(text_of(k, rng:random(20, 99), rng:random(1, 19), who)),      -- both
        text_of(k, 10 + k, 3 + k, who):upper(),                               -- case and spacing
      }
      for _, v in ipairs(variants) do
        near = near + 1
        local ok = nov:check { instruction = v }
        if not ok then rejected = rejected + 1 end
      end
    end
    -- distinct tasks: other problems (a second set), and the pool's problems asked differently
    local DISTINCT = {
      "A painter needs %d brushes for the hall and %d brushes for the porch; how many brushes in total?",
      "Our class collected %d bottle caps in March. In April the total dropped by %d caps. What remains?",
      "A spider spins %d webs and each web catches %d flies. How many flies are caught?",
      "In a parking lot there are %d red cars and %d blue cars. How many cars are parked there?",
      "%d geese fly south; later %d of them land on the lake. How many keep flying?",
      "Grandma knits %d scarves per month. How many scarves does she knit in %d months?",
      "A clock gains %d seconds every day. How many seconds has it gained after %d days?",
      "The museum owns %d paintings and lends %d of them to a gallery abroad. How many stay home?",
      "Every crate holds %d melons, and the truck brings %d crates. How many melons arrive?",
      "A puzzle has %d pieces; the dog hides %d under the sofa. How many pieces are on the table?",
      "%d scouts share %d sandwiches equally on a hike. How many sandwiches does each scout eat?",
      "A printer prints %d pages a minute for %d minutes. How many pages come out?",
      "On a shelf stand %d jars of jam and %d jars of honey. Count the jars on the shelf.",
      "The bakery's oven fits %d trays of %d rolls. How many rolls bake at once?",
      "A kite string is %d metres long; %d metres get tangled in a tree. How much string is free?",
      "Ships in the harbour: %d sailboats and %d tugboats. What is the number of ships?",
      "A bee visits %d flowers every hour for %d hours. How many visits does it make?",
      "The choir has %d sopranos and %d altos. How many singers are in the choir?",
      "A snail climbs %d centimetres and slides back %d. How high is it now?",
      "Twins %s and friend each hold %d balloons, and %d pop. How many balloons are left?",
    }
    local distinct, accepted = 0, 0
    for k, s in ipairs(DISTINCT) do
      for j = 1, 3 do
        local a, b = rng:random(2, 60), rng:random(2, 30)
        local text = s:find("%%s") and string.format(s, NAMES[(k + j) % #NAMES + 1], a, b) or string.format(s, a, b)
        distinct = distinct + 1
        if nov:check { instruction = text } then accepted = accepted + 1 end
      end
    end
    local rej, acc = rejected / near, accepted / distinct
    -- the time per candidate against a pool of 10,000 distinct tasks (reported, not asserted)
    local big = S.novelty { ngram = 5, minhash = 128, threshold = 0.7, against = { "pool" }, numbers = "keep" }
    local words = { "red", "blue", "green", "small", "large", "old", "new", "wooden", "silver", "striped", "heavy",
      "bright", "quiet", "rusty", "golden", "paper" }
    local things = { "boats", "kites", "lamps", "drums", "coats", "maps", "tents", "bells", "vases", "ropes", "cups", "gloves" }
    local made = 0
    local trng = rl.rng(4)
    while made < 10000 do
      made = made + 1
      local s = string.format("%s %s sees %d %s %s near the %s %s and %d %s %s; problem %d", NAMES[trng:random(#NAMES)],
        words[trng:random(#words)], trng:random(1, 999), words[trng:random(#words)], things[trng:random(#things)],
        words[trng:random(#words)], things[trng:random(#things)], trng:random(1, 999), words[trng:random(#words)],
        things[trng:random(#things)], made)
      big:add({ instruction = s }, "pool", made)
    end
    local t0 = rl.clock()
    local n = 200
    for i = 1, n do
      big:check { instruction = string.format("%s counts %d %s and %d %s; question %d", NAMES[i % #NAMES + 1],
        i, things[i % #things + 1], 3 * i, things[(i * 7) % #things + 1], i) }
    end
    local ms = (rl.clock() - t0) * 1000 / n
    print(string.format("\n  [17] near-duplicates rejected %d/%d (%.1f%%), distinct accepted %d/%d (%.1f%%); "
      .. "%.3f ms per candidate against a 10k pool (bands %d x rows %d)", rejected, near, 100 * rej, accepted,
      distinct, 100 * acc, ms, big.bands, big.rows))
    assert.is_true(rej >= 0.9, rej)
    assert.is_true(acc >= 0.95, acc)
    assert.are.equal(10000, big:size("pool"))
    -- exact and near: the same text is a "duplicate", a reordering a "near_duplicate"
    local ok, why, info = nov:check { instruction = text_of(3, 13, 6, "x") }
    assert.is_false(ok)
    assert.are.equal("duplicate", why)
    assert.are.equal(3, info.id)
    ok, why, info = nov:check { instruction = reorder(text_of(3, 13, 6, "x")) }
    assert.are.equal("near_duplicate", why)
    assert.is_true(info.similarity >= 0.7 and info.similarity < 1)
    -- removal, and the same signatures in every process (deterministic hashing)
    assert.is_true(nov:remove(3, "pool"))
    assert.is_true((nov:check { instruction = text_of(3, 13, 6, "x") }))
    local sig = nov:sketch("ann has # apples")
    local out, _, done = H.run_lua([[
      local rl = require "moonrl"
      local sig = rl.synth.novelty{}:sketch("ann has # apples")
      io.write(sig[1], " ", sig[64], " ", sig[128])
    ]])
    assert.is_true(done, out)
    assert.are.equal(string.format("%d %d %d", sig[1], sig[64], sig[128]), out)
  end)

  -- ---------------------------------------------------------------- the other verifiers

  it("compares packed signatures in C exactly as row by row in Lua (rl.equal_words)", function()
    local rng = rl.rng(17)
    for _ = 1, 200 do
      local k = rng:random(0, 40)
      local a, b, same = {}, {}, 0
      for i = 1, k do
        a[i] = rng:random(math.mininteger, math.maxinteger)
        b[i] = rng:random() < 0.5 and a[i] or a[i] ~ (1 << rng:random(0, 63)) -- one bit apart
        if a[i] == b[i] then same = same + 1 end
      end
      local fmt = "<" .. string.rep("j", k)
      assert.are.equal(same, rl.equal_words(string.pack(fmt, table.unpack(a)), string.pack(fmt, table.unpack(b))))
    end
    assert.has_error(function() rl.equal_words("1234567", "1234567") end,
      "bad argument #1 to 'equal_words' (a length that is a multiple of 8 expected)")
    assert.has_error(function() rl.equal_words("12345678", "1234567812345678") end,
      "bad argument #2 to 'equal_words' (a string as long as the first expected)")
    assert.has_error(function() rl.equal_words("12345678") end)
  end)

  it("runs shell tasks in the process sandbox with the same reasons", function()
    local pool = assert(rl.sandbox.pool {})
    local ex = S.exec { lang = "sh", sandbox = pool, timeout = 2 }
    local t = { instruction = "7 + 5?", answer = "12", check = '[ "$1" = 12 ]', solution = "echo $((7 + 5))",
      failures = { "11", "13" } }
    assert.is_true((ex:verify(t)))
    local function reason(over) local _, r = ex:verify(with(t, over)) return r end
    assert.are.equal("wrong_answer", reason { answer = "13" })
    assert.are.equal("solution_fails_check", reason { solution = "echo 11" })
    assert.are.equal("failure_passes", reason { check = '[ -n "$1" ]' })
    assert.are.equal("nondeterministic", reason { solution = "od -An -N4 -tu4 /dev/urandom" })
    assert.are.equal("over_time", reason { solution = "while :; do :; done" })
    assert.are.equal("solution_error", reason { solution = "exit 3" })
    -- lua with a wall clock: the process sandbox's worker
    -- (a wall clock long enough for a good solution on a loaded machine or under the sanitizers,
    -- which took more than 0.3 s there)
    local wall = S.exec { timeout = 1.5 }
    local good = problem(7, "+", 5)
    assert.is_true((wall:verify(good)))
    local _, r = wall:verify(with(good, { solution = "local s = string.rep('a', 40) while true do s:find('(a*)*b') end" }))
    assert.are.equal("over_time", r)
    pool:close()
  end)

  it("checks answers for environments, labels by vote and by judge, and asks the oracle", function()
    local t = problem(7, "+", 5)
    assert.is_true(S.check_answer(t, "12"))
    assert.is_false(S.check_answer(t, "13"))
    assert.is_false(S.check_answer(t, "twelve"))
    local esc, why = S.check_answer(with(t, { check = "return os.time()" }), "12")
    assert.is_nil(esc)
    assert.truthy(why:find("not available", 1, true))
    -- vote: the majority of the policy's answers becomes the label
    local answers = { ["What is 6 * 7?"] = { "42", "42", "42", "41", "42", "42", "43", "42" },
      ["Name a colour."] = { "red", "blue", "green", "red", "blue", "grey", "pink", "teal" } }
    local ctx = { solve = function(tasks, k)
      local out = {}
      for i, task in ipairs(tasks) do
        out[i] = {}
        for j = 1, k do out[i][j] = { success = false, answer = answers[task.instruction][j] } end
      end
      return out
    end }
    local vote = S.vote { k = 8, agree = 0.6 }
    local q = { instruction = "What is 6 * 7?" }
    local ok, info = vote:verify(q, ctx, 1)
    assert.is_true(ok)
    assert.are.equal("42", q.answer)
    assert.are.equal("vote", q.label)
    assert.are.equal("vote", info.label)
    assert.are.equal(0.75, info.share)
    local ok2, r2 = vote:verify({ instruction = "Name a colour." }, ctx, 1)
    assert.is_false(ok2)
    assert.are.equal("no_consensus", r2)
    local _, r3 = vote:verify({ instruction = "What is 6 * 7?", answer = "41" }, ctx, 1)
    assert.are.equal("wrong_answer", r3)
    -- judge over the client interface: yes, no, a failed call, a reply that is not a verdict
    local replies = { "Yes, it is sound.", "no: the answer is off", nil, "maybe" }
    local calls = 0
    local client = { chat = function(_, messages, opts)
      calls = calls + 1
      assert.are.equal("user", messages[1].role)
      assert.truthy(messages[1].content:find(t.instruction, 1, true))
      assert.are.equal("mock", opts.model)
      assert.are.equal(0, opts.temperature)
      local reply = replies[calls]
      if reply == nil then return nil, "timed out", { timeout = true } end
      return reply
    end }
    local judge = S.judge { client = client, model = "mock", sampling = { temperature = 0 }, retries = 0 }
    local tj = with(t, {})
    assert.is_true((judge:verify(tj)))
    assert.are.equal("judge", tj.label)
    assert.are.equal("judge_rejects", select(2, judge:verify(with(t, {}))))
    assert.are.equal("judge_error", select(2, judge:verify(with(t, {}))))
    assert.are.equal("judge_error", select(2, judge:verify(with(t, {}))))
    -- the oracle: it cannot solve, it disagrees, it raises
    local o = S.oracle(oracle)
    assert.is_true((o:verify(t)))
    assert.are.equal("oracle_failed", select(2, o:verify(with(t, { instruction = "What is the meaning of life?" }))))
    assert.are.equal("oracle_failed", select(2, S.oracle(function() error("boom") end):verify(t)))
  end)

  -- ---------------------------------------------------------------- the loop

  it("admits, retires what the policy masters, brings back what it forgets, and keeps provenance", function()
    local pool = recording_pool()
    local tasks = {}
    local who = { "Ann", "Bob", "Cara", "Dmitri", "Elena", "Farid" }
    local what = { "apples", "cards", "pens", "shells", "coins", "stamps" }
    for i = 1, 6 do tasks[i] = problem(10 + i, ({ "+", "-", "*" })[i % 3 + 1], 2, who[i], what[i]) end
    local p = {}
    for i = 1, 6 do p[tasks[i].instruction] = 0.5 end
    local loop = S.loop { propose = fixed_proposer(tasks), contract = CONTRACT, verify = { S.exec {} },
      pool = pool, per_step = 3, retire = { above = 0.9, window = 8 }, probe = 2, max_pool = 4,
      calibrate = S.pass_rate { k = 8 } }
    local ctx = { solve = simulated(true, function(t) return p[t.instruction] end) }
    local r = loop:step(ctx)
    assert.are.equal(3, r.admitted)
    assert.are.equal(3, #pool.admitted)
    assert.are.equal(1, pool.admitted[1].meta.synth)
    assert.are.equal(0.5, pool.admitted[1].meta.p)
    local key1 = pool.admitted[1].task.key
    assert.truthy(key1:match("^synth:%x+$"))
    assert.are.equal(r.reward, 1) -- 4 p (1 - p) at p = 1/2
    -- training rollouts: the first task always succeeds, the others half of the time
    local function batch(list)
      local eps = {}
      for _, e in ipairs(list) do
        for j = 1, e.n do
          eps[#eps + 1] = { task = e.task, success = j <= e.wins, ["end"] = "done", record = { { state = "q" } } }
        end
      end
      return { episodes = eps }
    end
    local held = {}
    for i = 1, 3 do held[i] = pool.admitted[i].task end
    loop:observe(batch { { task = held[1], n = 4, wins = 4 }, { task = held[2], n = 4, wins = 2 } })
    assert.are.equal(0, #pool.retired) -- 4 rollouts: fewer than the window of 8
    loop:observe(batch { { task = held[1], n = 4, wins = 4 }, { task = held[2], n = 4, wins = 2 } })
    assert.are.same({ { key = key1, why = "mastered" } }, pool.retired)
    local arc = loop:archive()
    assert.are.equal("retired", arc[1].status)
    assert.are.same({ step = 1, why = "mastered", p = 1 }, arc[1].retired[1])
    assert.are.same({ step = 1, p = 1, n = 4, source = "train" }, arc[1].p[2])
    -- the policy forgets task 1: the next step's probe brings it back
    p[tasks[1].instruction] = 0.5
    r = loop:step(ctx)
    assert.are.equal(1, r.regressed)
    assert.are.same({ key1 }, pool.regressed)
    arc = loop:archive()
    assert.are.equal("admitted", arc[1].status)
    assert.are.same({ step = 2, p = 0.5, n = 8, source = "probe" }, arc[1].p[4])
    assert.are.same({ { step = 2, p = 0.5 } }, arc[1].regressed)
    -- max_pool = 4: admitting 3 more retires the oldest admitted ones first
    assert.are.equal(4, r.pool)
    assert.are.equal(2, r.retired)
    assert.are.equal("max_pool", pool.retired[2].why)
    assert.are.equal(4, loop:stats().pool)
    assert.are.equal(6, loop:stats().admitted)
    -- what each record says: proposer step, verifiers, p history
    for _, rec in ipairs(arc) do
      assert.is_number(rec.step)
      assert.are.equal("exec", rec.verifiers[1].name)
      assert.are.equal("calibrate", rec.p[1].source)
    end
  end)

  it("hands a contract's generator the novelty index, so it can draw again instead of proposing a duplicate", function()
    local kinds = {}
    local gen = S.contract { "instruction", "answer", "check", "solution", "failures",
      parse = function(_, _, rng, known)
        kinds[#kinds + 1] = type(known)
        local t
        for _ = 1, 20 do
          t = problem(rng:random(11, 13), "+", 2)
          if not known or not known(t) then return t end
        end
        return t
      end }
    local function run(novelty)
      local loop = S.loop { propose = fixed_proposer { "a", "b", "c", "d", "e", "f" }, contract = gen,
        verify = { S.exec {} }, pool = recording_pool(), per_step = 3, retire = false,
        calibrate = S.pass_rate { k = 8 }, novelty = novelty }
      local ctx = { solve = simulated(true, function() return 0.5 end) }
      return loop:step(ctx), loop:step(ctx), loop
    end
    local first, second = run(S.novelty { key = function(t) return t.solution end, numbers = "keep" })
    -- three operands in all: the first step finds all three, the second only duplicates
    assert.are.same({ 3, 0 }, { first.admitted, first.duplicate })
    assert.are.same({ 0, 3 }, { second.admitted, second.duplicate })
    for _, k in ipairs(kinds) do assert.are.equal("function", k) end
    -- without a novelty index parse gets no `known`
    kinds = {}
    run(false)
    assert.are.equal(6, #kinds)
    for _, k in ipairs(kinds) do assert.are.equal("nil", k) end
  end)

  it("retires failing tasks with retire.below, and brings a mastered task back only under the bar it was retired at", function()
    local pool = recording_pool()
    local tasks = {}
    for i = 1, 3 do tasks[i] = problem(20 + i, "+", 3) end
    local p = {}
    for i = 1, 3 do p[tasks[i].instruction] = 0.5 end
    local loop = S.loop { propose = fixed_proposer(tasks), contract = CONTRACT, verify = { S.exec {} },
      pool = pool, per_step = 3, retire = { above = 0.8, below = 0.125, window = 8 }, probe = 3,
      calibrate = S.pass_rate { k = 8 }, novelty = false }
    local ctx = { solve = simulated(true, function(t) return p[t.instruction] end) }
    assert.are.equal(3, loop:step(ctx).admitted)
    local held = {}
    for i = 1, 3 do held[i] = pool.admitted[i].task end
    local function batch(wins)
      local eps = {}
      for i, w in ipairs(wins) do
        for j = 1, 8 do eps[#eps + 1] = { task = held[i], success = j <= w, ["end"] = "done", record = { { state = "q" } } } end
      end
      return { episodes = eps }
    end
    -- 8 of 8: mastered; 1 of 8 (0.125): failing; 4 of 8: stays
    local o = loop:observe(batch { 8, 1, 4 })
    assert.are.same({ retired = 1, failing = 1 }, o)
    assert.are.same({ { key = held[1].key, why = "mastered" }, { key = held[2].key, why = "failing" } }, pool.retired)
    assert.are.equal(1, loop:stats().pool)
    -- probes: the mastered task measured at 7 of 8 (0.875, at or over the bar .8) stays out, and
    -- the failing one is never probed
    p[tasks[1].instruction], p[tasks[2].instruction] = 0.875, 0.875
    local r = loop:step(ctx)
    assert.are.equal(0, r.regressed)
    assert.are.same({}, pool.regressed)
    -- at 6 of 8 (0.75, under the bar) it comes back
    p[tasks[1].instruction] = 0.75
    r = loop:step(ctx)
    assert.are.equal(1, r.regressed)
    assert.are.same({ held[1].key }, pool.regressed)
    local arc = loop:archive()
    assert.are.equal("retired", arc[2].status)
    assert.are.same({ step = 1, why = "failing", p = 0.125 }, arc[2].retired[1])
  end)

  it("keys admitted tasks as a pool with its own key function does, so its training rollouts retire them", function()
    local tasks = {}
    for i = 1, 3 do tasks[i] = problem(20 + i, "+", 3) end
    local cur = rl.curriculum.new { source = rl.curriculum.pool { tasks = { problem(1, "+", 1) },
      key = function(t) return "sum " .. t.answer end }, seed = 1 }
    local loop = S.loop { propose = fixed_proposer(tasks), contract = CONTRACT, verify = { S.exec {} },
      pool = cur, per_step = 3, retire = { above = 0.9, window = 4 }, calibrate = S.pass_rate { k = 8 }, novelty = false }
    local r = loop:step { solve = simulated(true, function() return 0.5 end) }
    assert.are.equal(3, r.admitted)
    assert.are.same({ "sum 24", "sum 25", "sum 26" }, loop.active)
    local eps = {}
    for _, key in ipairs { "sum 24", "sum 25", "sum 26", "sum 2" } do
      for _ = 1, 4 do
        eps[#eps + 1] = { task = cur.tasks[key], success = true, ["end"] = "done", record = { { state = "q" } } }
      end
    end
    local o = loop:observe { episodes = eps }
    assert.are.equal(3, o.retired)
    assert.are.equal(3, loop:stats().retired)
    assert.is_truthy(cur.retired["sum 24"])
    assert.are.equal("train", loop:archive()[1].p[2].source)
  end)

  it("continues exactly from its state (as rl.train resumes it)", function()
    local function mk()
      return S.loop { propose = S.mutate { fn = function(t, rng)
        local a, b = tonumber(t.answer) + rng:random(-4, 4), rng:random(1, 9)
        return problem(a, "+", b, "Ann", "apples")
      end, seeds = { problem(3, "+", 4) } }, contract = CONTRACT, verify = { S.exec {} }, per_step = 6,
        target = S.target { by = { "state" } }, pool = recording_pool(), seed = 5,
        retire = { above = 0.75, window = 4 }, novelty = S.novelty { numbers = "keep", key = function(t) return t.solution end } }
    end
    local ctx = { solve = simulated(false, function(t) return math.min(1, math.abs(tonumber(t.answer)) / 20) end) }
    local function feed(loop, s)
      local eps = {}
      for _, key in ipairs(loop.active) do
        local rec = loop.records[loop.by_key[key]]
        for j = 1, 3 do
          eps[#eps + 1] = { task = rec.task, success = (s + j + #key) % 7 ~= 0, ["end"] = "done",
            record = { { state = tonumber(rec.task.answer) > 9 and "big" or "small" } } }
        end
      end
      loop:observe { episodes = eps }
    end
    local a = mk()
    local outs = {}
    for s = 1, 6 do
      outs[s] = rl.json.encode(a:step(ctx))
      feed(a, s)
      if s == 3 then
        local saved = rl.json.decode(rl.json.encode(a:state()))
        local b = mk()
        b:load(saved)
        for s2 = 4, 6 do
          local ob = rl.json.encode(b:step(ctx))
          feed(b, s2)
          if s2 == 4 then b.first = ob end
        end
        a.resumed = b
      end
    end
    local b = a.resumed
    assert.are.equal(outs[4], b.first)
    assert.are.equal(rl.json.encode(a:archive()), rl.json.encode(b:archive()))
    assert.are.equal(rl.json.encode(a:state()), rl.json.encode(b:state()))
    assert.is_true(#a:archive() == 36)
    assert.is_true(a:stats().retired > 0, rl.json.encode(a:stats()))
    assert.is_true(#a:stats().clusters > 0)
  end)

  -- ---------------------------------------------------------------- failure targeting

  it("clusters failures by what the engine records and hands out their exemplars", function()
    local tg = S.target { by = { "end", "tool_error", "cell", "state" }, clusters = 2, exemplars = 2, decay = 0.5 }
    local function ep(task, success, fin, state, tool_error)
      return { task = task, success = success, ["end"] = fin, record = { { state = "start" }, { state = state, tool_error = tool_error } } }
    end
    local a, b, c, d = { key = "a", cell = "x" }, { key = "b", cell = "x" }, { key = "c", cell = "y" }, { key = "d", cell = "x" }
    -- cell x, state neg: 3 failures of 3; cell y: 1 of 2 with a tool error; cell x, pos: 4 of 6
    local eps = { ep(a, false, "done", "neg"), ep(b, false, "done", "neg"), ep(a, false, "done", "neg"),
      ep(c, false, "max_turns", "pos", true), ep(c, true, "max_turns", "pos", true),
      { task = a, success = false, reward_status = "unscorable" } }
    for i = 1, 6 do eps[#eps + 1] = ep(d, i > 4, "done", "pos") end
    tg:observe { episodes = eps }
    local cl = tg:clusters()
    assert.are.equal(2, #cl)
    assert.are.equal("end=done | tool_error=no | cell=x | state=neg", cl[1].signature)
    assert.are.equal(0.8, cl[1].weight) -- (3 + 1) / (3 + 2)
    assert.are.equal(1, cl[1].rate)
    assert.are.same({ "b", "a" }, { cl[1].exemplars[1].key, cl[1].exemplars[2].key }) -- latest last, distinct
    assert.are.equal("end=done | tool_error=no | cell=x | state=pos", cl[2].signature)
    assert.are.equal(4, cl[2].failures)
    -- weight = "count": where most failures are
    local tc = S.target { by = { "end", "tool_error", "cell", "state" }, clusters = 3, weight = "count" }
    tc:observe { episodes = eps }
    assert.are.equal("end=done | tool_error=no | cell=x | state=pos", tc:clusters()[1].signature)
    assert.are.equal("end=max_turns | tool_error=yes | cell=y | state=pos", tc:clusters()[3].signature)
    -- decay: older evidence weighs less; a new, always-failing signature comes first
    tg:observe { episodes = { ep(c, false, "budget", "pos"), ep(c, false, "budget", "pos") } }
    cl = tg:clusters()
    assert.are.equal("end=budget | tool_error=no | cell=y | state=pos", cl[1].signature)
    assert.are.equal(0.75, cl[1].weight)
    assert.are.equal((1.5 + 1) / (1.5 + 2), cl[2].weight)
    local ex = tg:exemplars(40, rl.rng(3))
    assert.are.equal(40, #ex)
    local from_first = 0
    for _, t in ipairs(ex) do
      assert.truthy(t.target)
      if t.target == cl[1].signature then from_first = from_first + 1 end
    end
    assert.is_true(from_first > 10 and from_first < 30, from_first)
    -- state and load
    local other = S.target { by = { "end", "tool_error", "cell", "state" }, clusters = 2, exemplars = 2, decay = 0.5 }
    other:load(rl.json.decode(rl.json.encode(tg:state())))
    assert.are.equal(rl.json.encode(tg:clusters()), rl.json.encode(other:clusters()))
    local fn = S.target { by = { function(e) return e.task.key == "c" and "hard" or "easy" end } }
    fn:observe { episodes = { ep(a, false, "done", "neg"), ep(c, false, "done", "neg") } }
    assert.are.equal("easy", fn:clusters()[1].signature)
  end)

  -- A simulated learner with a weakness: tasks with a negative operand start at p = 0.05, the
  -- others at 0.5; every training rollout of a task raises the p of its kind.
  local function weakness_run(targeted, steps)
    local skill = { neg = 0.05, pos = 0.5 }
    local function kind(t) return (t.a < 0 or t.b < 0) and "neg" or "pos" end
    local seeds = { problem(3, "+", 4, "Ann"), problem(-2, "+", 6, "Bob", "pens"), problem(8, "-", 3, "Cara", "cards"),
      problem(5, "+", 2, "Dmitri", "cups"), problem(6, "-", 1, "Elena", "hats"), problem(2, "*", 3, "Farid", "eggs") }
    local pool = recording_pool()
    local rng = rl.rng(8)
    local mutate = S.mutate { seeds = seeds, fn = function(t, r)
      local function jitter(x)
        local y = x + r:random(-9, 9)
        if (x < 0) ~= (y < 0) or y == 0 or math.abs(y) > 30 then y = x end
        return y
      end
      local op = t.solution:match("^return %-?%d+ ([%+%-%*])")
      return problem(jitter(t.a), op, jitter(t.b), ({ "Gus", "Hal", "Ivy", "Jo" })[r:random(4)], ({ "keys", "nuts", "pins" })[r:random(3)])
    end }
    local loop = S.loop { propose = mutate, contract = CONTRACT, verify = { S.exec {} }, pool = pool, per_step = 16,
      target = targeted and S.target { by = { "state" }, clusters = 4 } or nil,
      novelty = S.novelty { key = function(t) return t.solution end, numbers = "keep" }, retire = false }
    local ctx = { solve = simulated(false, function(t) return skill[kind(t)] end) }
    local share_by_step, held = {}, {}
    for step = 1, steps do
      local r = loop:step(ctx)
      local neg = 0
      for _, rec in ipairs(loop:archive()) do
        if rec.step == step and rec.task and kind(rec.task) == "neg" then neg = neg + 1 end
      end
      share_by_step[step] = neg / r.proposed
      -- a training step: 16 rollouts of the pool's tasks (seeds and admitted)
      local list = {}
      for _, t in ipairs(seeds) do list[#list + 1] = t end
      for _, a in ipairs(pool.admitted) do list[#list + 1] = a.task end
      local eps = {}
      for _ = 1, 16 do
        local t = list[rng:random(#list)]
        local ok = rng:random() < skill[kind(t)]
        eps[#eps + 1] = { task = t, success = ok, ["end"] = "done", record = { { state = kind(t) } } }
        skill[kind(t)] = math.min(0.95, skill[kind(t)] + 0.004)
      end
      loop:observe { episodes = eps }
      held[step] = skill.neg
    end
    return share_by_step, held
  end

  it("targets the failure cluster: >= 50% of proposals land in it within 5 steps, and it improves >= 2x more (a quick acceptance test 19 on a simulated learner)", function()
    local share_t, held_t = weakness_run(true, 12)
    local share_u, held_u = weakness_run(false, 12)
    local within5 = 0
    for s = 2, 5 do within5 = math.max(within5, share_t[s]) end
    local gain_t, gain_u = held_t[12] - 0.05, held_u[12] - 0.05
    print(string.format("\n  [19, simulated] share of proposals in the failure cluster at steps 1..5: targeted %s, "
      .. "untargeted %s; cluster success gain after 12 steps: targeted %+.3f, untargeted %+.3f (%.1fx)",
      table.concat({ string.format("%.2f", share_t[1]), string.format("%.2f", share_t[2]), string.format("%.2f", share_t[3]),
        string.format("%.2f", share_t[4]), string.format("%.2f", share_t[5]) }, " "),
      table.concat({ string.format("%.2f", share_u[1]), string.format("%.2f", share_u[2]), string.format("%.2f", share_u[3]),
        string.format("%.2f", share_u[4]), string.format("%.2f", share_u[5]) }, " "), gain_t, gain_u, gain_t / gain_u))
    assert.is_true(within5 >= 0.5, within5)
    assert.is_true(share_u[5] < 0.5, share_u[5])
    assert.is_true(gain_t >= 2 * gain_u, string.format("%g vs %g; %s / %s", gain_t, gain_u, table.concat(share_t, " "), table.concat(share_u, " ")))
  end)

  -- ---------------------------------------------------------------- bad input

  it("names the field of every bad option and refuses unknown ones", function()
    local seeds = { problem(1, "+", 2) }
    local prop = S.proposer { policy = "self", contract = CONTRACT, seeds = seeds }
    local cases = {
      { function() S.contract "instruction" end, "rl.synth.contract: a list of field names expected" },
      { function() S.contract {} end, "name at least one field" },
      { function() S.contract { "instruction", "instruction" } end, "[2]: field 'instruction' appears twice" },
      { function() S.contract { "instruction", 3 } end, "[2]: a field name" },
      { function() S.contract { "instruction", parse = "json" } end, "rl.synth.contract: parse: a function" },
      { function() S.contract { "instruction", pares = print } end, "unknown field 'pares' (did you mean 'parse'?)" },
      { function() S.exec { lang = "python" } end, "rl.synth.exec: lang: one of \"lua\", \"sh\"" },
      { function() S.exec { runs = 0 } end, "rl.synth.exec: runs: a positive integer expected, got 0" },
      { function() S.exec { timeout = -1 } end, "rl.synth.exec: timeout:" },
      { function() S.exec { sandbox = {} } end, "rl.synth.exec: sandbox: an rl.sandbox.pool expected" },
      { function() S.exec { timeuot = 1 } end, "unknown field 'timeuot' (did you mean 'timeout'?)" },
      { function() S.oracle(42) end, "rl.synth.oracle: fn: a function(task) -> answer expected, got 42" },
      { function() S.vote { k = 0 } end, "rl.synth.vote: k: a positive integer expected, got 0" },
      { function() S.vote { agree = 2 } end, "rl.synth.vote: agree:" },
      { function() S.judge {} end, "rl.synth.judge: client: a client with :chat(messages, opts) expected (it is required)" },
      { function() S.judge { client = { chat = print }, parse = "score" } end, "rl.synth.judge: parse:" },
      { function() S.pass_rate { k = 1.5 } end, "rl.synth.pass_rate: k: a positive integer expected, got 1.5" },
      { function() S.pass_rate { band = { 0.9, 0.1 } } end, "rl.synth.pass_rate: band: a band {low, high}" },
      { function() S.pass_rate { bands = {} } end, "unknown field 'bands' (did you mean 'band'?)" },
      { function() S.novelty { ngram = 0 } end, "rl.synth.novelty: ngram: a positive integer expected, got 0" },
      { function() S.novelty { threshold = 1.5 } end, "rl.synth.novelty: threshold:" },
      { function() S.novelty { against = { "pool", "history" } } end, "rl.synth.novelty: against:" },
      { function() S.novelty { numbers = "hide" } end, "rl.synth.novelty: numbers: one of \"mask\", \"keep\"" },
      { function() S.novelty { minhahs = 64 } end, "unknown field 'minhahs' (did you mean 'minhash'?)" },
      { function() S.novelty {}:add({ instruction = "x" }, "cache", 1) end, "rl.synth.novelty: add: index:" },
      { function() S.novelty {}:add({ instruction = "x" }, "pool", {}) end, "rl.synth.novelty: add: id:" },
      { function() S.novelty {}:check({ question = "x" }) end, "rl.synth.novelty: key: a string expected" },
      { function() S.target { by = {} } end, "rl.synth.target: by: a non-empty list" },
      { function() S.target { by = { "end", "ending" } } end, "rl.synth.target: by[2]: \"end\", \"tool_error\"" },
      { function() S.target { by = { "stat" } } end, "(did you mean \"state\"?)" },
      { function() S.target { clusters = 0 } end, "rl.synth.target: clusters: a positive integer expected, got 0" },
      { function() S.target { from = 3 } end, "rl.synth.target: from: a curriculum" },
      { function() S.target {}:load(3) end, "rl.synth.target: load: a state" },
      { function() S.proposer { contract = CONTRACT, seeds = seeds } end, "rl.synth.proposer: policy:" },
      { function() S.proposer { policy = "other", contract = CONTRACT, seeds = seeds } end, "rl.synth.proposer: policy: \"self\", an rl.model or a client" },
      { function() S.proposer { policy = "self", seeds = seeds } end, "rl.synth.proposer: contract: an rl.synth.contract{...} expected (it is required)" },
      { function() S.proposer { policy = "self", contract = CONTRACT } end, "rl.synth.proposer: seeds:" },
      { function() S.proposer { policy = "self", contract = CONTRACT, seeds = { { instruction = "x" } } } end,
        "rl.synth.proposer: seeds[1]: the proposal has no answer" },
      { function() S.proposer { policy = "self", contract = CONTRACT, seeds = seeds, group = 0 } end, "rl.synth.proposer: group:" },
      { function() S.proposer { policy = "self", contract = CONTRACT, seeds = seeds, temprature = 1 } end,
        "unknown field 'temprature' (did you mean 'temperature'?)" },
      { function() S.proposer { policy = { chat = print }, contract = CONTRACT, seeds = seeds, learn = true } end,
        "rl.synth.proposer: learn: only a local policy" },
      { function() S.proposer { policy = rl.model.new { vocab = 264, dim = 8, layers = 1, heads = 1, ffn = 8, ctx = 16 },
        contract = CONTRACT, seeds = seeds } end, "rl.synth.proposer: tokenizer: an rl.tokenizer expected (it is required" },
      { function() S.mutate {} end, "rl.synth.mutate: fn: a function(task, rng) -> task expected (it is required)" },
      { function() S.mutate { fn = print, from = 1 } end, "rl.synth.mutate: from: a curriculum" },
      { function() S.loop {} end, "rl.synth.loop: propose: a proposer" },
      { function() S.loop { propose = prop, verify = S.exec {} } end, "rl.synth.loop: verify: a list of verifiers" },
      { function() S.loop { propose = prop, verify = { 1 } } end, "rl.synth.loop: verify: a list of verifiers" },
      { function() S.loop { propose = prop, calibrate = { k = 8 } } end, "rl.synth.loop: calibrate: an rl.synth.pass_rate" },
      { function() S.loop { propose = prop, novelty = true } end, "rl.synth.loop: novelty: false or an rl.synth.novelty" },
      { function() S.loop { propose = prop, pool = {} } end, "rl.synth.loop: pool: a curriculum with a pool source" },
      { function() S.loop { propose = prop, reward = "learnabilty" } end, "(did you mean \"learnability\"?)" },
      { function() S.loop { propose = prop, penalties = { invalid = -1, duplicat = -1 } } end, "rl.synth.loop: penalties: unknown field 'duplicat' (did you mean 'duplicate'?)" },
      { function() S.loop { propose = prop, penalties = { invalid = "x" } } end, "rl.synth.loop: penalties: invalid: a finite number expected" },
      { function() S.loop { propose = prop, per_step = 0 } end, "rl.synth.loop: per_step: a positive integer expected, got 0" },
      { function() S.loop { propose = prop, every = "1" } end, "rl.synth.loop: every: a positive integer expected" },
      { function() S.loop { propose = prop, max_pool = -5 } end, "rl.synth.loop: max_pool:" },
      { function() S.loop { propose = prop, retire = { above = 2 } } end, "rl.synth.loop: retire: above: a number in (0, 1] expected, got 2" },
      { function() S.loop { propose = prop, retire = { windw = 2 } } end, "rl.synth.loop: retire: unknown field 'windw' (did you mean 'window'?)" },
      { function() S.loop { propose = prop, retire = { above = 0.5, below = 0.5 } } end, "rl.synth.loop: retire: below (0.5) must be under above (0.5)" },
      { function() S.loop { propose = prop, retire = { below = -1 } } end, "rl.synth.loop: retire: below: a number in [0, 1] expected, got -1" },
      { function() S.loop { propose = prop, pre_step = 4 } end, "unknown field 'pre_step' (did you mean 'per_step'?)" },
      { function() S.loop { propose = prop }:load { version = 99 } end, "rl.synth.loop: load: a state from loop:state() expected" },
      { function() S.check_answer({}, "1") end, "rl.synth.check_answer: task: a table with check" },
      { function() S.check_answer(problem(1, "+", 1), 2) end, "rl.synth.check_answer: candidate: a string expected, got 2" },
    }
    for i, c in ipairs(cases) do
      local msg = H.error_of(c[1])
      assert.truthy(msg:find(c[2], 1, true), string.format("case %d: %q lacks %q", i, msg, c[2]))
      assert.truthy(msg:find("synth_spec.lua", 1, true), string.format("case %d raised at %s, not at the caller", i, msg))
    end
    -- expected failures are returned, not raised: a proposer outside rl.train, a policy-less vote
    local loop = S.loop { propose = prop, pool = recording_pool() }
    local ok, err = pcall(loop.step, loop, {})
    assert.is_false(ok)
    assert.truthy(tostring(err):find("policy \"self\" proposes inside rl.train", 1, true))
    local _, r = S.vote {}:verify({ instruction = "x" }, { solve = function(t, k)
      local o = {} for i = 1, #t do o[i] = {} for j = 1, k do o[i][j] = { success = false } end end return o end }, 1)
    assert.are.equal("no_consensus", r)
  end)
end)

-- ---------------------------------------------------------------- diagnosis and the generator

-- A hand-made episode: its task's tags, whether it succeeded, and the turn types it went through.
local function tagged_ep(tags, success, turns)
  local record = {}
  for i, s in ipairs(turns) do record[i] = { state = s } end
  return { task = { key = table.concat(tags, "+") .. #turns .. tostring(success), tags = tags }, success = success,
    record = record, ["end"] = "done" }
end

describe("rl.synth diagnosis (target tags and contrast) and generator", function()
  it("gives per-tag pass rates, the weakest tags and the turn types failures end at", function()
    local tg = S.target { by = { "state" }, decay = 1 }
    tg:observe { episodes = {
      tagged_ep({ "lookup" }, true, { "call1", "answer" }),
      tagged_ep({ "lookup", "recover" }, false, { "call1", "retry" }),
      tagged_ep({ "lookup", "recover" }, false, { "call1", "retry" }),
      tagged_ep({ "arith", "recover" }, true, { "call1", "retry", "answer" }),
      tagged_ep({ "arith", "chain3" }, false, { "call1", "call2", "call3" }),
      tagged_ep({ "arith" }, true, { "call1", "answer" }),
    } }
    local rates = {}
    for _, r in ipairs(tg:tags()) do rates[r.tag] = r end
    -- lookup: 1 of 3 passes; recover: 1 of 3; arith: 2 of 3; chain3: 0 of 1
    assert.are.same({ "lookup", "recover", "arith", "chain3" }, (function()
      local o = {} for i, r in ipairs(tg:tags()) do o[i] = r.tag end return o end)())
    assert.are.equal(3, rates.lookup.episodes)
    assert.near(1 / 3, rates.lookup.pass, 1e-12)
    assert.near(1 / 3, rates.recover.pass, 1e-12)
    assert.near(2 / 3, rates.arith.pass, 1e-12)
    assert.are.equal(0, rates.chain3.pass)
    assert.are.same({ "chain3", "lookup" }, tg:weakest(2))
    assert.are.same({ "lookup", "recover" }, tg:weakest(2, 2)) -- chain3 seen once only
    local con = tg:contrast()
    -- call3: 1 turn, 1 failure ends there; retry: 3 turns, 2 failures; call1: 6 turns, 0
    assert.are.equal("call3", con[1].turn)
    assert.are.equal(1, con[1].fail_rate)
    assert.are.equal("retry", con[2].turn)
    assert.near(2 / 3, con[2].fail_rate, 1e-12)
    local by = {}
    for _, c in ipairs(con) do by[c.turn] = c end
    assert.are.equal(0, by.call1.fail_rate)
    assert.are.equal(0, by.answer.fail_rate)
    -- shares: failed episodes have 7 turns (2 of them retry), successful ones 7 (1 retry)
    assert.near(2 / 7, by.retry.share_failed, 1e-12)
    assert.near(1 / 7, by.retry.share_success, 1e-12)
    -- state round trip, and decay 0 forgets at the next observation
    local copy = S.target { by = { "state" } }
    copy:load(rl.json.decode(rl.json.encode(tg:state())))
    assert.are.same(tg:tags(), copy:tags())
    assert.are.same(tg:contrast(), copy:contrast())
    local fresh = S.target { by = { "state" }, decay = 0 }
    fresh:observe { episodes = { tagged_ep({ "lookup" }, false, { "call1" }) } }
    fresh:observe { episodes = { tagged_ep({ "arith" }, true, { "call1", "answer" }) } }
    assert.are.same({ "arith" }, fresh:weakest(3, 0.5))
    -- tags = fn and tags = false
    local fn = S.target { tags = function(ep) return { ep.success and "won" or "lost" } end }
    fn:observe { episodes = { tagged_ep({ "x" }, false, { "a" }) } }
    assert.are.equal("lost", fn:tags()[1].tag)
    local off = S.target { tags = false }
    off:observe { episodes = { tagged_ep({ "x" }, false, { "a" }) } }
    assert.are.same({}, off:tags())
    assert.has_error(function() S.target { tags = "tasks" } end)
    assert.has_error(function() tg:weakest(-1) end, "rl.synth.target: weakest: n: a non-negative integer expected, got -1")
  end)

  -- A generator over tasks {tag =, level =}: the simulated policy passes tag t at level l with
  -- probability skill[t] / l; the probe is target-like tasks of every tag.
  local TAGS = { "a", "b", "c", "d" }
  local function gen_task(params, rng)
    local tag = params.focus[1] or TAGS[rng:random(#TAGS)]
    return { tag = tag, level = params.level, tags = { tag }, key = tag .. params.level .. rng:random(1, 1e9) }
  end
  local function skilled(skill)
    return simulated(false, function(t) return skill[t.tag] / (t.level or 1) end)
  end
  local function probe(n)
    local out = {}
    for i = 1, n do local tag = TAGS[(i - 1) % #TAGS + 1] out[i] = { tag = tag, tags = { tag }, level = 1, key = "p" .. i } end
    return out
  end

  it("probes, proposes for the weakest tags and moves their levels by the loop's calibration", function()
    local gen = S.generator { gen = gen_task, diagnose = S.target { by = { "state" }, decay = 0 }, probe = probe,
      probe_tasks = 40, weakest = 2, levels = { 1, 2, 3 }, level = 2 }
    local loop = S.loop { propose = gen, verify = { function(t) return t.tag ~= nil end },
      calibrate = S.pass_rate { k = 8, band = { 0.2, 0.8 } }, novelty = false, per_step = 8, seed = 3 }
    -- a and b are the gaps; c and d are mastered
    local ctx = { solve = skilled { a = 0.2, b = 0.4, c = 1, d = 1 } }
    local r = loop:step(ctx)
    assert.are.equal(40, gen.probed)
    assert.are.same({ "a", "b" }, gen.last.weakest)
    assert.are.same({ a = 2, b = 2 }, gen.last.levels)
    local focus = {}
    for _, rec in ipairs(loop.records) do focus[rec.task.tag] = (focus[rec.task.tag] or 0) + 1 end
    assert.are.same({ a = 4, b = 4 }, focus)
    assert.are.equal(8, r.proposed)
    -- at level 2, a (p = .1) is too hard: its level goes down; b (p = .2) stays or is admitted
    assert.are.equal(1, gen:level_index("a"))
    local b_level = gen.levels[gen:level_index("b")]
    loop:step(ctx)
    assert.are.same({ a = 1, b = b_level }, gen.last.levels) -- the next round proposes at the moved levels
    -- with an easy tag proposed, its level climbs
    local up = S.generator { gen = gen_task, diagnose = S.target { decay = 0 }, probe = probe, probe_tasks = 8,
      weakest = 1, level = 1, min_episodes = 1 }
    local loop2 = S.loop { propose = up, verify = {}, calibrate = S.pass_rate { k = 4, band = { 0.2, 0.8 } },
      novelty = false, per_step = 4, seed = 1 }
    loop2:step { solve = skilled { a = 1, b = 1, c = 1, d = 1 } } -- a (seen first) is weakest, too easy at level 1
    assert.are.equal(2, up:level_index("a"))
    -- the generator's state travels with the loop's, and a fresh loop starts from level 1
    local st = rl.json.decode(rl.json.encode(loop2:state()))
    local again = S.generator { gen = gen_task, diagnose = S.target { decay = 0 }, probe = probe, probe_tasks = 8,
      weakest = 1, min_episodes = 1 }
    local loop3 = S.loop { propose = again, verify = {}, novelty = false, per_step = 4, seed = 1 }
    assert.are.equal(1, again:level_index("a"))
    loop3:load(st)
    assert.are.equal(2, again:level_index("a"))
    assert.are.equal(8, again.probed)
    loop3:reset()
    assert.are.equal(1, again:level_index("a"))
    assert.are.equal(0, again.probed)
  end)

  it("is deterministic from the seed and refuses bad options", function()
    local function run(seed)
      local gen = S.generator { gen = gen_task, diagnose = S.target { decay = 0 }, probe = probe, probe_tasks = 16 }
      local loop = S.loop { propose = gen, verify = {}, novelty = false, per_step = 6, seed = seed,
        calibrate = S.pass_rate { k = 4 } }
      loop:step { solve = skilled { a = 0.3, b = 0.5, c = 0.9, d = 0.7 } }
      return rl.json.encode(loop:state())
    end
    assert.are.equal(run(4), run(4))
    assert.are_not.equal(run(4), run(5))
    for _, case in ipairs {
      { function() S.generator { diagnose = S.target {} } end, "rl.synth.generator: gen" },
      { function() S.generator { gen = gen_task } end, "rl.synth.generator: diagnose" },
      { function() S.generator { gen = gen_task, diagnose = {} } end, "rl.synth.generator: diagnose: an rl.synth.target" },
      { function() S.generator { gen = gen_task, diagnose = S.target {}, level = 9 } end, "rl.synth.generator: level: one of levels" },
      { function() S.generator { gen = gen_task, diagnose = S.target {}, weakets = 2 } end, "did you mean 'weakest'" },
    } do
      local ok, err = pcall(case[1])
      assert.is_false(ok)
      assert.truthy(tostring(err):find(case[2], 1, true), tostring(err))
    end
    local bad = S.generator { gen = gen_task, diagnose = S.target {}, probe = function() return {} end }
    local ok, err = pcall(function() S.loop { propose = bad, novelty = false }:step { solve = skilled { a = 1 } } end)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("probe returned", 1, true))
  end)
end)
