-- kbqa_spec.lua - envs/kbqa.lua (the rules its header states: the knowledge base, search's top 2
-- documents by the BM25-style score with the distractors, answer and its reward, the invalid
-- action's format term, the turn budget, the held-out split, the oracles, determinism; the variants'
-- faulty search tool and guesses) and a
-- smoke run of recipes/search_qa.lua (it runs, prints its measured seconds per step first and
-- its table; not that it learns).
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"

local kb = dofile(H.root .. "/envs/kbqa.lua")

local function play(task, actions)
  local inst, record = kb.new(), {}
  local first = inst:reset(task, rl.rng(1))
  for _, a in ipairs(actions) do
    local _, _, done = rl.env.step(kb, inst, a, record)
    if done then break end
  end
  return record, first
end

describe("envs/kbqa.lua", function()
  it("holds 200 entities with a boss, a city and a pet each, one document per fact", function()
    assert.are.equal(200, #kb.kb.names)
    assert.are.equal(600, #kb.kb.docs)
    local seen = {}
    for _, n in ipairs(kb.kb.names) do
      assert.is_nil(seen[n])
      assert.matches("^%l%l%l$", n)
      seen[n] = true
    end
    for _, n in ipairs(kb.kb.names) do
      for _, r in ipairs(kb.relations) do
        local v = kb.kb.fact[n][r]
        assert.is_true(seen[v] and v ~= n, n .. " " .. r)
      end
    end
  end)

  it("asks the question, and search finds the fact and its distractor", function()
    local task = kb.gen({ hops = 2 }, rl.rng(3))
    local a, r1, r2 = task.start, task.chain[1], task.chain[2]
    assert.are.equal("Q: " .. r2 .. " of " .. r1 .. " of " .. a .. "?", task.question)
    assert.are.equal(kb.kb.fact[kb.kb.fact[a][r1]][r2], task.answer)
    local rec, first = play(task, { "search " .. a .. " " .. r1 })
    assert.are.equal(task.question, first)
    local docs = {}
    for d in rec[1].observation:gmatch("[^|]+") do docs[#docs + 1] = d:match("^%s*(.-)%s*$") end
    assert.are.equal(2, #docs)
    local fact = a .. " " .. r1 .. " " .. kb.kb.fact[a][r1]
    assert.is_true(docs[1] == fact or docs[2] == fact, rec[1].observation)
    -- the other one shares both words: the entity as the object of the relation, if any exists
    local other = docs[1] == fact and docs[2] or docs[1]
    local s, r, o = other:match("^(%l+) (%l+) (%l+)$")
    local reverse = false
    for _, d in ipairs(kb.kb.docs) do reverse = reverse or (d[2] == r1 and d[3] == a) end
    if reverse then assert.is_true(r == r1 and o == a, other) else assert.is_true(s == a or o == a, other) end
    assert.are.equal("no results", kb.search("zzzz"))
  end)

  it("rewards the right answer with 1, a wrong one with 0, an invalid action with -0.1", function()
    local task = kb.gen({ hops = 1 }, rl.rng(5))
    local rec = play(task, { "hello", kb.gold(task) })
    assert.are.equal("invalid", rec[1].observation)
    assert.are.equal(-0.1, rec[1].reward)
    assert.are.equal(1, rec[2].reward)
    assert.is_true(rec[2].info.success)
    local wrong = play(task, { "answer " .. (task.answer == "bab" and "bac" or "bab") })
    assert.are.equal(0, wrong[1].reward)
    assert.is_false(wrong[1].info.success)
    local long = play(task, { "search a", "search b", "search c", "search d", "search e", "search f", "search g" })
    assert.are.equal(kb.max_turns, #long) -- the budget ends it
  end)

  it("splits by held-out entities and chains; the oracles answer every question", function()
    local train, test = kb.tasks("train", 80, 1), kb.tasks("test", 80, 1)
    for i, t in ipairs(train) do
      assert.are.equal((i - 1) % 4 + 1, t.hops)
      assert.is_false(kb.held_entity(t.start) or kb.held_chain(t.chain))
    end
    for _, t in ipairs(test) do assert.is_true(kb.held_entity(t.start) or kb.held_chain(t.chain)) end
    local redundant, hops = 0, 0
    for i, t in ipairs(test) do
      hops = hops + t.hops
      local acts = kb.oracle(t, rl.rng(i))
      redundant = redundant + #acts - (t.hops + 1)
      local rec = play(t, acts)
      assert.is_true(rec[#rec].info.success, t.question)
      assert.is_true(#acts <= kb.max_turns)
      assert.are.same({}, (function()
        local s = kb.solve(t)
        return #s == t.hops + 1 and {} or s
      end)())
    end
    -- one search in four repeated, while the budget leaves room for the answer
    assert.is_true(redundant > hops / 8 and redundant < hops / 2.5, "redundant searches " .. redundant .. " of " .. hops)
    assert.are.same(kb.tasks("test", 10, 7), kb.tasks("test", 10, 7))
  end)
end)

describe("kbqa.success_by_hops", function()
  it("counts successes per hop count over chunked rollouts, with distinct seeds per chunk", function()
    local rng, tasks = rl.rng(3), {}
    for i = 1, 10 do tasks[i] = kb.gen({ hops = (i - 1) % 3 + 1 }, rng) end -- hops 1, 2, 3 (4 none)
    local calls = {}
    local ctx = { stages = { rollout = function(_, req)
      calls[#calls + 1] = { n = #req.tasks, seed = req.seed, temperature = req.temperature }
      local eps = {}
      for i, t in ipairs(req.tasks) do eps[i] = { success = t.hops ~= 2 and i % 2 == 1 } end
      return { episodes = eps }
    end } }
    local got = kb.success_by_hops(ctx, tasks, 4)
    -- by hand: chunks {1..4}, {5..8}, {9, 10}; a task succeeds when it is odd within its chunk
    -- and not a 2-hop one
    local wins, count = { 0, 0, 0 }, { 0, 0, 0 }
    for i, t in ipairs(tasks) do
      count[t.hops] = count[t.hops] + 1
      local within = (i - 1) % 4 + 1
      if t.hops ~= 2 and within % 2 == 1 then wins[t.hops] = wins[t.hops] + 1 end
    end
    assert.are.same({ 4, 4, 2 }, { calls[1].n, calls[2].n, calls[3].n })
    assert.are.same({ 6, 10, 14 }, { calls[1].seed, calls[2].seed, calls[3].seed })
    assert.are.equal(0, calls[1].temperature)
    for h = 1, 3 do assert.are.equal(wins[h] / count[h], got["h" .. h]) end
    assert.are.equal(0, got.h4)
    assert.are.equal((wins[1] + wins[3]) / 10, got.all)
  end)
end)

describe("envs/kbqa.lua variants (the faulty search tool, guesses)", function()
  -- plays actions on a fresh instance of module V reset with rl.rng(seed); the turn records
  local function run(V, task, seed, actions, inst)
    inst = inst or V.new()
    inst:reset(task, rl.rng(seed))
    local record = {}
    for _, a in ipairs(actions) do
      local _, _, done = rl.env.step(V, inst, a, record)
      if done then break end
    end
    return record, inst
  end
  local task = kb.gen({ hops = 4 }, rl.rng(9))
  local five = { "search a", "search b", "search c", "search d", "search e" }

  it("fails a search with the given probability, the same searches for the same episode seed", function()
    local V = kb.variant { faults = 0.1 }
    assert.are.equal("kbqa-faults", V.name)
    local failed, searches = 0, 0
    for seed = 1, 400 do
      local rec = run(V, task, seed, five)
      local other = run(V, task, seed, { "search x y", "search q", "search ann boss", "search z", "search w" })
      for k, r in ipairs(rec) do
        searches = searches + 1
        assert.is_true(r.info.tool_call)
        local bad = r.info.error == "search failed"
        if bad then
          failed = failed + 1
          assert.are.equal("error: search failed", r.observation)
          assert.are.equal(0, r.reward)
        else
          assert.is_nil(r.info.error)
          assert.are_not.equal("error: search failed", r.observation)
        end
        -- which searches fail does not depend on what was searched
        assert.are.equal(bad, other[k].info.error == "search failed", "seed " .. seed .. " search " .. k)
      end
    end
    assert.are.equal(2000, searches)
    -- binomial(2000, 0.1): mean 200, sd 13.4; four sd either side
    assert.is_true(failed > 146 and failed < 254, "failed " .. failed .. " of 2000")
    -- different episode seeds fail different searches
    local patterns = {}
    for seed = 1, 50 do
      local rec, p = run(V, task, seed, five), {}
      for k, r in ipairs(rec) do p[k] = r.info.error and "x" or "." end
      patterns[table.concat(p)] = true
    end
    local distinct = 0
    for _ in pairs(patterns) do distinct = distinct + 1 end
    assert.is_true(distinct > 3, "fault patterns " .. distinct)
    for _, r in ipairs(run(kb.variant { faults = 0 }, task, 3, five)) do assert.is_nil(r.info.error) end
    for _, r in ipairs(run(kb.variant { faults = 1 }, task, 3, five)) do assert.are.equal("search failed", r.info.error) end
  end)

  it("is down after a malformed call until reset (the cascade), answers still count", function()
    local V = kb.variant { cascade = true }
    local good = "search " .. task.path[1] .. " " .. task.chain[1]
    local rec, inst = run(V, task, 1, { good, "hello", good, good, kb.gold(task) })
    assert.is_nil(rec[1].info.error)
    assert.matches(task.path[2], rec[1].observation)
    assert.are.equal("invalid", rec[2].observation)
    assert.are.equal(-0.1, rec[2].reward)
    assert.are.equal("malformed call", rec[2].info.error)
    for k = 3, 4 do
      assert.are.equal("error: search down", rec[k].observation)
      assert.are.equal("search down", rec[k].info.error)
    end
    assert.are.equal(1, rec[5].reward) -- the answer does not need the tool
    assert.is_true(rec[5].info.success)
    -- a clone of a down episode is down too; a reset brings the tool back
    inst:reset(task, rl.rng(1))
    rl.env.step(V, inst, "hello", {})
    local copy, r2 = inst:clone(), {}
    rl.env.step(V, copy, good, r2)
    assert.are.equal("search down", r2[1].info.error)
    local again = run(V, task, 1, { good }, inst)
    assert.is_nil(again[1].info.error)
    assert.matches(task.path[2], again[1].observation)
    -- without the cascade a malformed call is only itself
    local nc = run(kb.variant { faults = 0 }, task, 1, { "hello", good })
    assert.are.equal("malformed call", nc[1].info.error)
    assert.is_nil(nc[2].info.error)
    -- the budget still ends it, down or not
    assert.are.equal(kb.max_turns, #run(V, task, 1, { "hello", good, good, good, good, good, good }))
    -- the plain module never fails and reports no errors
    for _, r in ipairs(run(kb, task, 1, { "hello", good, good })) do assert.is_true(r.info.error == nil) end
  end)

  it("guess: the searches before the first right guess are the minimal depth, the rest excess", function()
    local V = kb.variant { guess = true }
    assert.are.equal("kbqa-guess", V.name)
    local t2 = kb.gen({ hops = 2 }, rl.rng(4))
    local s1 = "search " .. t2.path[1] .. " " .. t2.chain[1]
    local s2 = "search " .. t2.path[2] .. " " .. t2.chain[2]
    local wrong = t2.answer == "bab" and "bac" or "bab"
    -- right guess with the third search: two were enough, one beyond
    local rec = run(V, t2, 1, { s1 .. " guess " .. wrong, s2 .. " guess " .. t2.path[2],
      s2 .. " guess " .. t2.answer, s2 .. " GUESS " .. t2.answer, kb.gold(t2) })
    assert.matches(t2.path[2], rec[1].observation) -- the guess is not part of the query
    assert.matches(t2.answer, rec[2].observation)
    for k = 1, 4 do assert.is_true(rec[k].info.tool_call) end
    local last = rec[5].info
    assert.is_true(last.success)
    assert.are.same({ 2, 2 }, { last.depth, last.excess })
    -- no right guess: every search was needed
    rec = run(V, t2, 1, { s1, s2, kb.gold(t2) })
    assert.are.same({ 2, 0 }, { rec[3].info.depth, rec[3].info.excess })
    -- a right guess before any search: all of them beyond
    rec = run(V, t2, 1, { s1 .. " guess " .. t2.answer, s2, kb.gold(t2) })
    assert.are.same({ 0, 2 }, { rec[3].info.depth, rec[3].info.excess })
    -- the budget ends it with the same account
    rec = run(V, t2, 1, { s1, s2 .. " guess x", s2 .. " guess " .. t2.answer, s2, s2, s2 })
    assert.are.equal(kb.max_turns, #rec)
    assert.are.same({ 2, 4 }, { rec[6].info.depth, rec[6].info.excess })
    -- the plain module reads "guess" as query words and reports no depth
    local plain = run(kb, t2, 1, { s1 .. " guess " .. t2.answer, kb.gold(t2) })
    assert.is_nil(plain[2].info.depth)
    -- the oracle guesses what it has found: right only on a repeat of the last hop's search
    local repeats, checked = 0, 0
    for i, t in ipairs(kb.tasks("test", 80, 2)) do
      local acts = V.oracle(t, rl.rng(i))
      assert.are.same(kb.oracle(t, rl.rng(i)), (function()
        local plain_acts = {}
        for k, a in ipairs(acts) do plain_acts[k] = a:gsub(" guess %S+$", "") end
        return plain_acts
      end)())
      local r = run(V, t, i, acts)
      local info = r[#r].info
      assert.is_true(info.success, t.question)
      local last_repeated = acts[#acts - 1] == "search " .. t.path[t.hops] .. " " .. t.chain[t.hops] .. " guess " .. t.answer
      if info.excess > 0 then repeats = repeats + 1 end
      assert.are.equal(last_repeated and 1 or 0, info.excess, t.question)
      checked = checked + 1
      local s = run(V, t, i, V.solve(t))
      assert.are.same({ t.hops, 0 }, { s[#s].info.depth, s[#s].info.excess })
    end
    assert.are.equal(80, checked)
    assert.is_true(repeats > 0)
  end)

  it("refuses bad options", function()
    local ok, err = pcall(kb.variant, { faults = 1.5 })
    assert.is_false(ok)
    assert.matches("kbqa.variant: faults: a number in %[0, 1%]", err)
    ok, err = pcall(kb.variant, { fault = 0.1 })
    assert.is_false(ok)
    assert.matches("unknown field 'fault' %(did you mean 'faults'%?%)", err)
    ok, err = pcall(kb.variant, { cascade = 1 })
    assert.is_false(ok)
    assert.matches("cascade: true or false", err)
    ok, err = pcall(kb.variant, { guess = "yes" })
    assert.is_false(ok)
    assert.matches("guess: true or false", err)
  end)
end)

describe("recipes/search_qa.lua", function()
  it("runs a few steps and prints the measured seconds per step, then its table", function()
    local dir = H.tmpdir()
    local out, code = H.run(table.concat({ H.shell_quote(H.moonrl), "run",
      H.shell_quote(H.root .. "/recipes/search_qa.lua"), "--steps 1 --tasks 2 --group 2",
      "--sft-examples 40 --sft-epochs 1 --eval-tasks 2 --dir", H.shell_quote(dir) }, " "))
    assert.are.equal(0, code, out)
    local rate = out:find("measured: [%d.]+ s per RL step")
    local tbl = out:find("method%s+1%-hop%%")
    assert.is_truthy(rate, out)
    assert.is_truthy(tbl, out)
    assert.is_true(rate < tbl)
    for _, arm in ipairs { "grpo", "igpo", "a2tgpo", "SFT" } do assert.matches("\n" .. arm .. " ", out) end
    -- --grid: PASS@(k,T) for SFT and each arm, 1-hop and 3-hop, k = 1, 2, 4 and T = 1..6
    local g, gcode = H.run(table.concat({ H.shell_quote(H.moonrl), "run",
      H.shell_quote(H.root .. "/recipes/search_qa.lua"), "--steps 1 --tasks 2 --group 2 --methods grpo --grid 4",
      "--sft-examples 40 --sft-epochs 1 --eval-tasks 2 --reuse-sft --dir", H.shell_quote(dir) }, " "))
    assert.are.equal(0, gcode, g)
    for _, h in ipairs { 1, 3 } do
      local at = g:find("PASS@%(k,T%) on the 2 held%-out " .. h .. "%-hop questions, 4 samples each")
      assert.is_truthy(at, g)
      local block = g:sub(at)
      assert.matches("policy%s+T%s+k=1%s+k=2%s+k=4\n", block)
      assert.matches("\nSFT%s+1%s+[%d.]+%s+[%d.]+%s+[%d.]+\n", block)
      assert.matches("\ngrpo%s+1%s+[%d.]+%s+[%d.]+%s+[%d.]+\n", block)
      assert.matches("\n%s+6%s+[%d.]+%s+[%d.]+%s+[%d.]+\n", block)
      assert.matches("\nsft%-rl%s+1%s+[%d.]+%s+[%d.]+%s+[%d.]+\n", block)
    end
    -- the matched-data policy: the SFT start fine-tuned on grpo's successful training rollouts
    assert.matches("\n  sft%-rl  %d+ successful grpo rollouts x 3 epochs %(lr 0.0002%)", g)
    assert.matches("%-%-rl%-sft%-epochs: a positive integer expected", H.run(table.concat({ H.shell_quote(H.moonrl),
      "run", H.shell_quote(H.root .. "/recipes/search_qa.lua"), "--rl-sft-epochs 0" }, " ")))
    local bad = H.run(table.concat({ H.shell_quote(H.moonrl), "run", H.shell_quote(H.root .. "/recipes/search_qa.lua"),
      "--methods ppo" }, " "))
    assert.matches("unknown method 'ppo'", bad)
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)

  it("runs StepPO's arms (--methods gae,step_gae): a critic each, both in the table", function()
    local dir = H.tmpdir()
    local out, code = H.run(table.concat({ H.shell_quote(H.moonrl), "run",
      H.shell_quote(H.root .. "/recipes/search_qa.lua"), "--steps 2 --tasks 2 --group 2 --methods gae,step_gae",
      "--sft-examples 40 --sft-epochs 1 --eval-tasks 2 --dir", H.shell_quote(dir) }, " "))
    assert.are.equal(0, code, out)
    for _, arm in ipairs { "gae", "step_gae", "SFT" } do assert.matches("\n" .. arm .. " ", out) end
    for _, arm in ipairs { "gae", "step_gae" } do
      local state = rl.json.decode(assert(io.open(dir .. "/search_qa-" .. arm .. "-s1/state.json")):read("a"))
      local moved = 0
      for _, w in ipairs(state.value_head.w) do moved = math.max(moved, math.abs(w)) end
      assert.is_true(moved > 0, arm .. ": the value head did not move")
    end
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)
end)
