-- ledger_spec.lua - envs/ledger.lua (Ledger-QA, UMA): the memory ops against the true ledger,
-- QA from a bank, the held-out split, the demonstrator's slips, the QA branches and both credit
-- rules (outcome GRPO and Task-Stratified GRPO) against sums done by hand here; and a smoke run
-- of recipes/ledger.lua, twice, for its table and its determinism.
local rl = require "moonrl"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
package.path = H.root .. "/?.lua;" .. package.path
local ledger = require "envs.ledger"

local function play(task, actions)
  local inst, out = ledger.new(), {}
  local obs = inst:reset(task)
  for _, a in ipairs(actions) do
    local nxt, r, done, info = inst:step(a)
    out[#out + 1] = { obs = obs, reward = r, done = done, info = info }
    obs = nxt
    if done then break end
  end
  return out
end

-- The true ledger of a stream, computed here from the update texts alone.
local function ledger_of(task, t)
  local value = {}
  for k = 1, t do
    local name, rest = task.updates[k].text:match("^(%a+) (.+)$")
    if rest == "x" then value[name] = nil else value[name] = (value[name] or 0) + tonumber(rest) end
  end
  return value
end

describe("envs/ledger", function()
  it("the perfect demonstrator keeps the bank equal to the ledger, op by op", function()
    for _, len in ipairs { 4, 8 } do
      for _, t in ipairs(ledger.tasks("test", 30, 7, { len = len })) do
        assert.are.equal(len, #t.updates)
        local steps = play(t, ledger.perfect(t))
        assert.are.equal(len, #steps)
        for k, s in ipairs(steps) do
          assert.are.equal(t.updates[k].text, s.obs)
          assert.are.equal(0, s.reward)
          assert.is_true(s.info.op_ok)
          local want = ledger_of(t, k)
          for _, name in ipairs(t.names) do
            assert.are.equal(want[name] and tostring(want[name]) or nil, ledger.lookup(s.info.bank, name))
          end
          assert.are.equal(s.info.truth, s.info.bank)
          assert.are.equal(k == len, s.done)
        end
        assert.is_true(steps[len].info.success)
      end
    end
  end)

  it("applies set and del, ignores a malformed op with the format penalty", function()
    local t = { kind = "memory", names = { "ann", "bob", "cal" }, max_turns = 4, updates = {
      { name = "ann", delta = 5, text = "ann +5" }, { name = "bob", delta = 2, text = "bob +2" },
      { name = "ann", delta = -1, text = "ann -1" }, { name = "bob", close = true, text = "bob x" } } }
    local s = play(t, { "set ann 5", "set bob 2", "sett ann 4", "del bob" })
    assert.are.equal("ann=5", s[1].info.bank)
    assert.are.equal("ann=5 bob=2", s[2].info.bank)
    assert.are.equal(ledger.invalid, s[3].reward)
    assert.are.equal("ann=5 bob=2", s[3].info.bank)
    assert.is_false(s[3].info.op_ok)
    assert.are.equal("ann=4 bob=2", s[3].info.truth)
    assert.are.equal("ann=5", s[4].info.bank)
    assert.is_true(s[4].info.op_ok) -- bob is gone in both
    assert.is_false(s[4].info.success)
    assert.is_nil(ledger.parse_op("set ann 10"))
    assert.is_nil(ledger.parse_op("del"))
    assert.are.same({ op = "none" }, ledger.parse_op(" none "))
  end)

  it("scores each op against the memory guideline: running total, delete closed, never delete open", function()
    local t = { kind = "memory", names = { "ann", "bob", "cal" }, max_turns = 5, updates = {
      { name = "ann", delta = 5, text = "ann +5" }, { name = "bob", delta = 2, text = "bob +2" },
      { name = "ann", delta = -1, text = "ann -1" }, { name = "bob", close = true, text = "bob x" },
      { name = "ann", delta = 3, text = "ann +3" } } }
    -- by hand: ann's totals 5, 4, 7; bob 2 then closed
    local cases = {
      { { "set ann 5", "set bob 2", "set ann 4", "del bob", "set ann 7" }, { 1, 1, 1, 1, 1 } },
      { { "set ann 4", "set bob 3", "del ann", "none", "set ann 3" }, { 0, 0, -1, 0, 0 } },
      { { "set bob 5", "del ann", "set ann 9", "del ann", "del cal" }, { 0, -1, 0, -1, 0 } },
      { { "sett ann 5", "none", "set ann 4", "del bob", "set bob 7" }, { 0, 0, 1, 1, 0 } },
    }
    for k, c in ipairs(cases) do
      local got = {}
      for i, s in ipairs(play(t, c[1])) do got[i] = s.info.guideline end
      assert.are.same(c[2], got, "case " .. k)
    end
    -- the same rule on its own: an open account deleted is -1 whatever the update
    local truth = ledger.truth(t, 2)
    assert.are.equal(-1, ledger.guideline_score(ledger.parse_op("del ann"), t.updates[2], truth))
    assert.are.equal(0, ledger.guideline_score(nil, t.updates[2], truth))
    assert.are.equal(1, ledger.guideline_score(ledger.parse_op("set bob 2"), t.updates[2], truth))
    -- the perfect demonstrator follows it on every op
    for _, task in ipairs(ledger.tasks("test", 20, 11, { len = 8 })) do
      for _, s in ipairs(play(task, ledger.perfect(task))) do assert.are.equal(1, s.info.guideline) end
    end
  end)

  it("answers QA from the bank it shows, against the true ledger", function()
    local q = ledger.qa_task("ann=5 bob=2", "ann=4", "bob")
    assert.are.equal("none", q.answer)
    local inst = ledger.new()
    assert.are.equal("ann=5 bob=2|bob?", inst:reset(q))
    local _, r, done = inst:step("2")
    assert.are.equal(0, r)
    assert.is_true(done)
    q = ledger.qa_task("ann=4", "ann=4", "ann")
    inst:reset(q)
    assert.are.equal(1, select(2, inst:step("4")))
    assert.are.same({ "4" }, ledger.oracle(q, rl.rng(1)))
  end)

  it("keeps held-out streams out of training and refuses a bad length", function()
    local train = {}
    for _, t in ipairs(ledger.tasks("train", 400, 3, { kind = "memory", len = 4 })) do
      local parts = {}
      for k, u in ipairs(t.updates) do parts[k] = u.text end
      train[table.concat(parts, ";")] = true
    end
    local seen = 0
    for _, t in ipairs(ledger.tasks("test", 400, 4246, { len = 4 })) do
      local parts = {}
      for k, u in ipairs(t.updates) do parts[k] = u.text end
      assert.is_nil(train[table.concat(parts, ";")])
      seen = seen + 1
    end
    assert.are.equal(400, seen)
    assert.has_error(function() ledger.stream(0, "train", rl.rng(1)) end)
    assert.has_error(function() ledger.stream(4, "dev", rl.rng(1)) end)
  end)

  it("the demonstrator slips on about 15% of ops, forgetting the update", function()
    local ops, bad = 0, 0
    for i, t in ipairs(ledger.tasks("train", 400, 5, { kind = "memory", len = 8 })) do
      for _, s in ipairs(play(t, ledger.oracle(t, rl.rng(i)))) do
        ops, bad = ops + 1, bad + (s.info.op_ok and 0 or 1)
      end
    end
    -- a slip on an account's first update or a closing is "none" (wrong too); a slip can be
    -- right by chance only never, since every update changes the value
    assert.is_true(bad / ops > 0.12 and bad / ops < 0.18, bad .. "/" .. ops)
  end)

  it("mixes memory streams and QA tasks for SFT", function()
    local kinds = {}
    for _, t in ipairs(ledger.tasks("train", 20, 1)) do kinds[t.kind] = (kinds[t.kind] or 0) + 1 end
    assert.are.equal(10, kinds.memory)
    assert.are.equal(10, kinds.qa)
  end)
end)

describe("ledger credit", function()
  local function rec(bank, truth, touched, reward)
    return { reward = reward or 0, info = { bank = bank, truth = truth, touched = touched } }
  end

  it("branches one question per op and every account after the last", function()
    local ep = { task = { names = { "ann", "bob", "cal" } }, record = {
      rec("ann=1", "ann=1", "ann"), rec("ann=1 bob=3", "ann=1 bob=2", "bob") } }
    local qa = ledger.branches { ep }
    assert.are.equal(4, #qa)
    assert.are.same({ "ann", 1, false, "1" }, { qa[1].question, qa[1].state, qa[1].final, qa[1].answer })
    local finals = {}
    for k = 2, 4 do
      assert.are.equal(2, qa[k].state)
      assert.is_true(qa[k].final)
      assert.are.equal("ann=1 bob=3", qa[k].bank)
      finals[qa[k].question] = qa[k].answer
    end
    assert.are.same({ ann = "1", bob = "2", cal = "none" }, finals)
  end)

  -- Two memory episodes of one stream (group 1), two ops each; QA rewards chosen by hand.
  local memory = {
    { group = 1, record = { { reward = 0 }, { reward = -0.1 } } },
    { group = 1, record = { { reward = 0 }, { reward = 0 } } },
  }
  local function q(mem, state, final, group, reward)
    return { group = group, reward = reward, task = { mem = mem, state = state, final = final } }
  end
  local qa = {
    q(1, 1, false, 10, 1), q(1, 1, false, 10, 0),
    q(1, 2, true, 11, 1), q(1, 2, true, 11, 1),
    q(2, 1, false, 12, 1), q(2, 1, false, 12, 1),
    q(2, 2, true, 13, 0), q(2, 2, true, 13, 1),
  }
  local EPS = 1e-6

  it("outcome: final QA accuracy plus format, one normalisation per group", function()
    local out = ledger.outcomes(memory, qa)
    H.assert_close(out, { 1 - 0.1, 0.5 })
    -- two values x, y: (x - m) / (|x - y| / 2 + eps) = +-1
    local d = (0.9 - 0.5) / 2
    local a1 = d / (d + EPS)
    local turn, qadv = ledger.credit("outcome", memory, qa)
    H.assert_close(turn, { { a1, a1 }, { -a1, -a1 } })
    H.assert_close(qadv, { a1, a1, a1, a1, -a1, -a1, -a1, -a1 })
  end)

  it("stratified: each op by the QA from its state, each question by its own samples", function()
    local turn, qadv = ledger.credit("stratified", memory, qa)
    -- op 1: values 0.5 (episode 1) and 1 (episode 2); op 2: 1 - 0.1 = 0.9 and 0.5
    local d1, d2 = 0.25, 0.2
    H.assert_close(turn, { { -d1 / (d1 + EPS), d2 / (d2 + EPS) }, { d1 / (d1 + EPS), -d2 / (d2 + EPS) } })
    -- QA groups: {1, 0} -> +-1; {1, 1} -> 0; {1, 1} -> 0; {0, 1} -> -+1
    local h = 0.5 / (0.5 + EPS)
    H.assert_close(qadv, { h, -h, 0, 0, 0, 0, -h, h })
  end)

  it("guideline: outcome's advantage plus weight x the op's guideline score less its group's mean", function()
    local gmem = {
      { group = 1, record = { { reward = 0, info = { guideline = 1 } }, { reward = -0.1, info = { guideline = 0 } } } },
      { group = 1, record = { { reward = 0, info = { guideline = -1 } }, { reward = 0, info = { guideline = 1 } } } },
    }
    local w = 0.5
    local out_turn, out_qa = ledger.credit("outcome", memory, qa)
    local turn, qadv = ledger.credit("guideline", gmem, qa, w)
    -- op 1: scores 1 and -1 (mean 0); op 2: 0 and 1 (mean 0.5)
    H.assert_close(turn, { { out_turn[1][1] + w * 1, out_turn[1][2] + w * -0.5 },
      { out_turn[2][1] + w * -1, out_turn[2][2] + w * 0.5 } })
    H.assert_close(qadv, out_qa)
    -- weight 0 is the outcome arm; records without a score count 0
    H.assert_close(ledger.credit("guideline", gmem, qa, 0), out_turn)
    H.assert_close(ledger.credit("guideline", memory, qa, 2), out_turn)
  end)

  it("refuses an unknown credit kind and a bad guideline weight", function()
    H.assert_error(function() ledger.credit("mean", memory, qa) end, "kind")
    H.assert_error(function() ledger.credit("guideline", memory, qa) end, "weight")
    H.assert_error(function() ledger.credit("guideline", memory, qa, -1) end, "weight")
  end)
end)

describe("recipes/ledger.lua", function()
  it("runs a smoke run: the three arms, the SFT and demonstrator rows, the same table twice", function()
    local tables = {}
    for k = 1, 2 do
      local dir = os.tmpname()
      os.remove(dir)
      local out, code = H.run(string.format("cd %s && %s run recipes/ledger.lua --smoke --dir %s",
        H.shell_quote(H.root), H.shell_quote(H.moonrl), H.shell_quote(dir)))
      assert.are.equal(0, code, out)
      assert.matches("measured: [%d.]+ s per RL step", out)
      local tbl = out:match("\n(arm +qa4%%.-)\n%(qaN")
      assert.is_string(tbl, out)
      assert.matches("rule8%%", tbl)
      for _, row in ipairs { "SFT", "outcome", "stratified", "guideline", "demonstrator" } do
        local cells = tbl:match("\n" .. row .. " +([%d. ]+)")
        assert.is_string(cells, row)
        local n = 0
        for v in cells:gmatch("[%d.]+") do
          n = n + 1
          if n <= 7 then assert.is_true(tonumber(v) >= 0 and tonumber(v) <= 100, row .. " " .. v) end
        end
        assert.is_true(n >= 7, row)
      end
      local lines = H.read_json_lines(dir .. "/ledger-stratified-s1/metrics.jsonl")
      assert.is_number(lines[#lines]["eval/qa8"])
      assert.is_number(lines[#lines]["reward/qa_all"])
      -- the guideline arm's batches carry each op's score; its mean is logged
      lines = H.read_json_lines(dir .. "/ledger-guideline-s1/metrics.jsonl")
      local g = lines[#lines]["reward/guideline"]
      assert.is_true(type(g) == "number" and g >= -1 and g <= 1)
      assert.is_number(lines[#lines]["eval/rule8"])
      -- the timing column differs between runs; the figures must not
      local kept = {}
      for line in tbl:gmatch("[^\n]+") do kept[#kept + 1] = (line:gsub("%s+%S+$", "")) end
      tables[k] = table.concat(kept, "\n")
      H.sh("rm -rf " .. H.shell_quote(dir))
    end
    assert.are.equal(tables[1], tables[2])
  end)

  it("refuses an unknown arm and a negative guideline weight", function()
    local out, code = H.run(string.format("cd %s && %s run recipes/ledger.lua --smoke --arms outcome,memo",
      H.shell_quote(H.root), H.shell_quote(H.moonrl)))
    assert.are_not.equal(0, code)
    assert.matches("unknown arm 'memo'", out)
    out, code = H.run(string.format("cd %s && %s run recipes/ledger.lua --smoke --guideline-weight -1",
      H.shell_quote(H.root), H.shell_quote(H.moonrl)))
    assert.are_not.equal(0, code)
    assert.matches("%-%-guideline%-weight: a number >= 0", out)
  end)
end)
