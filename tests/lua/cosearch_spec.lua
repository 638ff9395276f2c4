-- cosearch_spec.lua - CoSearch's pieces on envs/kbqa.lua: kbqa.retrieve (what search shows is its
-- top two), kbqa.parse_rank (the ranker's "rank 3 1 2 4"), kbqa.gold_index, the multi-agent
-- environment kbqa.cosearch played by hand (who acts when, what each is given, what the reasoner
-- is shown under each ranker, the rewards and the tally), its oracles and option errors, and smoke
-- runs of recipes/cosearch.lua (every arm and its start in the table, the same table twice for the
-- same seed, its option errors). Not that it learns (the README's table).
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"
package.path = H.root .. "/?.lua;" .. package.path
local kbqa = require "envs.kbqa"

-- A task whose first search ("<start> <relation>") does not get the gold document first from BM25.
local function task_with_distractor_first()
  for _, t in ipairs(kbqa.tasks("train", 400, 9)) do
    local q = t.start .. " " .. t.chain[1]
    local docs = kbqa.retrieve(q, 4)
    local g = kbqa.gold_index(q, docs)
    if t.hops == 2 and g and g > 1 then return t, q, docs, g end
  end
  error("no such task")
end

describe("kbqa's retrieval and ranking helpers", function()
  it("retrieve's top two are what search shows; its list is BM25's order", function()
    for _, q in ipairs { "ann boss", "kim", "tex city", "zzz" } do
      local two = kbqa.retrieve(q, 2)
      assert.are.equal(#two > 0 and table.concat(two, " | ") or "no results", kbqa.search(q))
      local four = kbqa.retrieve(q, 4)
      for j = 1, #two do assert.are.equal(two[j], four[j]) end
    end
    assert.are.same({}, kbqa.retrieve("", 4))
  end)

  it("gold_index finds the candidate whose subject and relation the query names", function()
    local docs = { "kim boss ann", "ann pet tex", "ann boss bob", "bob boss ann" }
    assert.are.equal(3, kbqa.gold_index("ann boss", docs))
    assert.are.equal(3, kbqa.gold_index("  ANN   boss ", docs))
    assert.are.equal(2, kbqa.gold_index("ann pet", docs))
    assert.is_nil(kbqa.gold_index("ann city", docs))
    assert.is_nil(kbqa.gold_index("", docs))
  end)

  it("parse_rank takes a permutation of 1..n after 'rank' and nothing else", function()
    assert.are.same({ 3, 1, 2, 4 }, kbqa.parse_rank("rank 3 1 2 4", 4))
    assert.are.same({ 1, 2, 3, 4 }, kbqa.parse_rank("  rank 1 2 3 4 ", 4))
    assert.are.same({ 2, 1 }, kbqa.parse_rank("rank 2 1", 2))
    local cases = {
      { "rank 3 1 2", "3 of 4 candidates ranked" }, { "rank 1 1 2 3", "1 is ranked twice" },
      { "rank 1 2 3 5", "'5' is not one of 1..4" }, { "rank 1 2 3 x", "'x' is not one of 1..4" },
      { "order 1 2 3 4", "not \"rank i j ...\"" }, { "rank 12 3 4", "'12' is not one of 1..4" },
      { "rank", "not \"rank i j ...\"" },
    }
    for _, c in ipairs(cases) do
      local p, why = kbqa.parse_rank(c[1], 4)
      assert.is_nil(p, c[1])
      assert.are.equal(c[2], why, c[1])
    end
    assert.is_nil(kbqa.parse_rank(nil, 4))
  end)
end)

describe("kbqa.cosearch", function()
  local task, query, docs, gold = task_with_distractor_first()

  -- Plays one episode: the reasoner searches `query`, the ranker (with policy) ranks `ranking`,
  -- the reasoner answers `answer`. Returns the (agent, observation) pairs and the step results.
  local function play(env, ranking, answer)
    local inst, seen, steps = env.new(), {}, {}
    inst:reset(task, rl.rng(1))
    local prev
    for _ = 1, 10 do
      local agent, obs = inst:next(prev)
      if not agent then break end
      seen[#seen + 1] = { agent, obs }
      local action
      if agent == "ranker" then action = ranking
      elseif #seen == 1 then action = "search " .. query
      else action = answer end
      local o, r, done, info = inst:step(agent, action)
      steps[#steps + 1] = { agent = agent, obs = o, reward = r, done = done, info = info }
      prev = { agent = agent, turns = 1, ["end"] = "done" }
    end
    return seen, steps, inst:finish(), inst:success()
  end

  it("asks the ranker with the query and 4 numbered candidates, and shows the reasoner its top two", function()
    local env = kbqa.cosearch {}
    assert.are.same({ "reasoner", "ranker" }, env.agents)
    local ranking = "rank " .. gold .. " " .. table.concat((function()
      local rest = {}
      for i = 1, 4 do if i ~= gold then rest[#rest + 1] = i end end
      return rest
    end)(), " ")
    local seen, steps, fin, ok = play(env, ranking, "answer " .. task.answer)
    assert.are.same({ "reasoner", "ranker", "reasoner" }, { seen[1][1], seen[2][1], seen[3][1] })
    assert.are.equal(task.question, seen[1][2])
    local want = "q: " .. query
    for i, d in ipairs(docs) do want = want .. " | " .. i .. " " .. d end
    assert.are.equal(want, seen[2][2])
    local second = gold == 1 and docs[2] or docs[1]
    assert.are.equal(task.question .. " > " .. docs[gold] .. " | " .. second, seen[3][2])
    assert.are.equal(0.5, steps[2].reward) -- gold ranked first
    assert.are.equal(0, steps[3].reward)   -- the outcome comes with finish
    assert.are.same({ reasoner = 1, ranker = 0.5 }, fin)
    assert.is_true(ok)
    local t = env.tally.train
    assert.are.same({ ranked = 1, gold_in = 1, gold_first = 1, gold_shown = 1, ep2 = 1, win2 = 1 }, t)
  end)

  it("keeps BM25's order after a ranking it cannot parse, with no gold reward", function()
    local env = kbqa.cosearch {}
    local seen, steps, fin = play(env, "rank 1 1", "answer zzz")
    assert.are.equal(task.question .. " > " .. docs[1] .. " | " .. docs[2], seen[3][2])
    assert.are.equal(0, steps[2].reward)
    assert.is_true(steps[2].info.invalid)
    assert.are.same({ reasoner = 0, ranker = 0 }, fin)
  end)

  it("shows BM25's top two with the bm25 ranker and the gold one first with the oracle, no ranker agent", function()
    local env = kbqa.cosearch { ranker = "bm25" }
    assert.are.same({ "reasoner" }, env.agents)
    local seen = play(env, nil, "answer x")
    assert.are.equal(2, #seen)
    assert.are.equal(task.question .. " > " .. docs[1] .. " | " .. docs[2], seen[2][2])
    assert.are.equal(0, env.tally.train.gold_first or 0)
    local oracle = kbqa.cosearch { ranker = "oracle" }
    seen = play(oracle, nil, "answer x")
    assert.are.equal(task.question .. " > " .. docs[gold] .. " | " .. docs[1], seen[2][2])
    assert.are.equal(1, oracle.tally.train.gold_first)
  end)

  it("costs the reasoner 0.1 for an invalid action and ends after max_turns reasoner turns", function()
    local env = kbqa.cosearch { ranker = "bm25" }
    local inst = env.new()
    inst:reset(task, rl.rng(1))
    local turns = 0
    while true do
      local agent = inst:next(turns > 0 and { agent = "reasoner", turns = 1, ["end"] = "done" } or nil)
      if not agent then break end
      local _, r, done, info = inst:step(agent, "hello")
      assert.are.equal(-0.1, r)
      assert.is_true(done and info.invalid)
      turns = turns + 1
    end
    assert.are.equal(kbqa.max_turns, turns)
    assert.are.same({ reasoner = 0, ranker = 0 }, inst:finish())
  end)

  it("has oracles that search each hop and rank the gold document first, or keep BM25's order", function()
    local env = kbqa.cosearch { demo_gold = 1 }
    assert.are.equal("search " .. task.path[1] .. " " .. task.chain[1], env.oracles.reasoner(task, { { given = task.question } }))
    assert.are.equal("search " .. task.path[2] .. " " .. task.chain[2],
      env.oracles.reasoner(task, { { given = task.question .. " > a b c | d e f" } }))
    assert.are.equal(kbqa.gold(task), env.oracles.reasoner(task, { { given = task.question .. " > a | b > c | d" } }))
    local given = "q: " .. query
    for i, d in ipairs(docs) do given = given .. " | " .. i .. " " .. d end
    local ranking = kbqa.parse_rank(env.oracles.ranker(task, { { given = given } }, rl.rng(1)), 4)
    assert.are.equal(gold, ranking[1])
    local never = kbqa.cosearch { demo_gold = 0 }
    assert.are.equal("rank 1 2 3 4", never.oracles.ranker(task, { { given = given } }, rl.rng(1)))
    assert.is_nil(kbqa.cosearch({ ranker = "bm25" }).oracles.ranker)
  end)

  it("refuses unknown options and values", function()
    H.assert_error(function() kbqa.cosearch { ranker = "llm" } end, "ranker")
    H.assert_error(function() kbqa.cosearch { candidates = 1 } end, "candidates")
    H.assert_error(function() kbqa.cosearch { demo_gold = 2 } end, "demo_gold")
    H.assert_error(function() kbqa.cosearch { rankr = "bm25" } end, "unknown field 'rankr'")
  end)
end)

local run = H.smoke_runner("cosearch.lua")

local function table_of(out) return H.table_without_seconds(out, "cosearch, seed 1;") end -- s/step dropped

describe("recipes/cosearch.lua", function()
  local dir = H.tmpdir()
  local out, code = run(dir)
  teardown(function() H.sh("rm -rf " .. H.shell_quote(dir)) end)

  it("prints every arm after RL and at its start, with success per hop and the gold rates", function()
    assert.are.equal(0, code, out)
    local tbl = table_of(out)
    assert.is_truthy(tbl, out)
    assert.matches("arm%s+1%-hop%%%s+2%-hop%%%s+3%-hop%%%s+4%-hop%%%s+all%%%s+gold1%%%s+seen%%%s+rank1%-1%s+rank2%-2", out)
    for _, arm in ipairs { "joint", "bm25", "oracle", "joint@0", "bm25@0", "oracle@0" } do
      local line = tbl:match("\n" .. arm:gsub("@", "%%@") .. "%s[^\n]*")
      assert.is_truthy(line, arm .. "\n" .. tbl)
      local nums = {}
      for v in line:gmatch("%s([%d.]+)") do nums[#nums + 1] = tonumber(v) end
      assert.is_true(#nums >= 7, line)
      for _, v in ipairs(nums) do assert.is_true(v >= 0 and v <= 100, line) end
    end
    assert.is_truthy(H.read_json_lines(dir .. "/cosearch-joint-s1/metrics.jsonl")[1])
  end)

  it("prints the same table for the same seed", function()
    local dir2 = H.tmpdir()
    local out2, code2 = run(dir2)
    assert.are.equal(0, code2, out2)
    assert.are.equal(table_of(out), table_of(out2))
    H.sh("rm -rf " .. H.shell_quote(dir2))
  end)

  it("refuses an unknown arm and bad options", function()
    local function bad(args)
      return H.run(table.concat({ H.shell_quote(H.moonrl), "run", H.shell_quote(H.root .. "/recipes/cosearch.lua"), args }, " "))
    end
    assert.matches("unknown arm 'llm'", bad("--arms joint,llm"))
    assert.matches("%-%-threshold: a number in %[0, 1%]", bad("--threshold 2"))
    assert.matches("%-%-demo%-gold: a probability", bad("--demo-gold -1"))
    assert.matches("%-%-steps: at least 2", bad("--steps 1"))
  end)
end)
