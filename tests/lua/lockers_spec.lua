-- lockers_spec.lua - envs/lockers.lua (the rules its header states: recall from the experience
-- base, open, wrong, bad, the budget; the base as a pure function of the stream, recomputed here
-- from the stream's prompts; the splits by world; determinism; the oracles), rl.train.paired
-- (branch B's prefix equals A's, the refused action replaced, the process reward and the
-- estimator against a computation written here, bad options), and smoke runs of
-- recipes/proact.lua (the table, its arms, numbers in range, the same table twice).
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"

local L = dofile(H.root .. "/envs/lockers.lua")

-- Plays actions through the engine's step path (at most max_turns); returns the records and
-- the first observation.
local function play(task, actions)
  local inst, record = L.new(), {}
  local first = inst:reset(task, rl.rng(1))
  for k, a in ipairs(actions) do
    if k > L.max_turns then break end
    local _, _, done = rl.env.step(L, inst, a, record)
    if done then break end
  end
  return record, first
end

local function task_with(fields)
  local t = { stream = 1, pos = 5, lockers = { 3, 5 }, codes = { "k", "q" }, shown = { true, false },
    memory = { [5] = "q", [2] = "d" }, need = true }
  for k, v in pairs(fields) do t[k] = v end
  return t
end

describe("envs/lockers.lua", function()
  it("recalls from the experience base for a turn, opens the locker at hand with its code, and ends after both", function()
    local rec, first = play(task_with {}, { "open k", "recall 5", "open q" })
    assert.are.equal("lkr 3 k", first)
    assert.are.same({ "ok; lkr 5 ?", "5=q" }, { rec[1].observation, rec[2].observation })
    assert.is_true(rec[2].info.recall)
    assert.are.same({ 0, 0, 1 }, { rec[1].reward, rec[2].reward, rec[3].reward })
    assert.is_true(rec[3].done)
    assert.is_true(rec[3].info.success)
    -- any key of the base, a key not in it, a wrong code, other text; the budget
    rec = play(task_with {}, { "recall 2", "recall 3", "open a", "open 3 k" })
    assert.are.same({ "2=d", "none", "wrong", "bad" }, { rec[1].observation, rec[2].observation,
      rec[3].observation, rec[4].observation })
    assert.are.equal(4, #rec)
    assert.is_false(rec[4].done) -- the engine's max_turns ends it, reward 0
    rec = play(task_with {}, { "hello", "recall", "open q", "open k" })
    assert.are.same({ "bad", "bad", "wrong", "ok; lkr 5 ?" }, { rec[1].observation, rec[2].observation,
      rec[3].observation, rec[4].observation })
    assert.is_nil(rec[2].info.recall)
    assert.are.equal("lkr 5 q", L.at(task_with { shown = { true, true } }, 2))
    -- a clone goes on on its own
    local inst = L.new()
    inst:reset(task_with {})
    local r0 = {}
    rl.env.step(L, inst, "open k", r0)
    local twin = inst:clone()
    local _, reward, done = rl.env.step(L, twin, "open q", r0)
    assert.are.same({ 1, true }, { reward, done })
    assert.are.equal("wrong", (rl.env.step(L, inst, "open k", r0)))
    assert.are.equal(0, (select(2, rl.env.step(L, inst, "open q", r0))) - 1)
  end)

  it("gives each task the codes its stream showed before it, and hides only codes shown before", function()
    local tasks = L.tasks("train", 3 * L.stream_length, 7)
    local base, stream, hidden, need = {}, nil, 0, 0
    for _, t in ipairs(tasks) do
      if t.stream ~= stream then base, stream = {}, t.stream end
      assert.are.same(base, t.memory)
      assert.are_not.equal(t.lockers[1], t.lockers[2])
      local any = false
      for i, l in ipairs(t.lockers) do
        local obs = L.at(t, i)
        assert.is_true(#obs <= 24)
        local shown = obs:match("^lkr " .. l .. " (%a)$")
        assert.are.equal(t.shown[i], shown ~= nil)
        if shown then assert.are.equal(t.codes[i], shown) else
          hidden, any = hidden + 1, true
          assert.are.equal(t.codes[i], base[l]) -- a hidden code was shown earlier in the stream
        end
      end
      assert.are.equal(any, t.need)
      if any then need = need + 1 end
      for i, l in ipairs(t.lockers) do if t.shown[i] then base[l] = t.codes[i] end end
    end
    assert.is_true(hidden > 0 and need > 6 and need < 30, "need " .. need)
    -- a task's snapshot is its own table
    assert.are_not.equal(tasks[2].memory, tasks[3].memory)
    assert.are.same(L.tasks("train", 30, 7), L.tasks("train", 30, 7))
  end)

  it("splits by world: no held-out world in training, about one in five held out", function()
    local function world(t)
      local m = {}
      for i, l in ipairs(t.lockers) do m[l] = t.codes[i] end
      return m
    end
    local seen = {}
    for _, t in ipairs(L.tasks("train", 50 * L.stream_length, 1)) do
      seen[t.stream] = seen[t.stream] or {}
      for l, c in pairs(world(t)) do seen[t.stream][l] = c end
    end
    local full = 0
    for _, w in pairs(seen) do
      local codes = {}
      for l = 1, L.lockers do codes[l] = w[l] end
      if #codes == L.lockers then
        full = full + 1
        assert.is_false(L.held_out(codes))
      end
    end
    assert.is_true(full > 10)
    local held, rng = 0, rl.rng(3)
    for _ = 1, 2000 do
      local codes = {}
      for l = 1, L.lockers do codes[l] = L.letter(rng:random(26)) end
      if L.held_out(codes) then held = held + 1 end
    end
    assert.is_true(held > 300 and held < 500, "held out " .. held)
    local s = L.stream("test", rl.rng(4), 1)
    local codes = {}
    for _, t in ipairs(s) do for i, l in ipairs(t.lockers) do codes[l] = t.codes[i] end end
    if #codes == L.lockers then assert.is_true(L.held_out(codes)) end
  end)

  it("has a perfect solve and an oracle biased to guess at even hidden lockers and recall at high shown ones", function()
    local tasks = L.tasks("train", 1000, 2)
    local solved, won = 0, 0
    local n = { even = 0, even_guess = 0, odd = 0, odd_recall = 0, high = 0, high_recall = 0, low = 0, low_recall = 0 }
    for i, t in ipairs(tasks) do
      local rec = play(t, L.solve(t))
      if rec[#rec].info.success then solved = solved + 1 end
      local want = {}
      for k, l in ipairs(t.lockers) do
        if not t.shown[k] then want[#want + 1] = "recall " .. l end
        want[#want + 1] = "open " .. t.codes[k]
      end
      assert.are.same(want, L.solve(t))
      local o = L.oracle(t, rl.rng(i))
      rec = play(t, o)
      if rec[#rec].info.success then won = won + 1 end
      -- the oracle's first action, for the first locker
      local l, first = t.lockers[1], o[1]
      local kind = t.shown[1] and (l >= 6 and "high" or "low") or (l % 2 == 0 and "even" or "odd")
      n[kind] = n[kind] + 1
      if first == "recall " .. l then
        if kind ~= "even" then n[kind .. "_recall"] = n[kind .. "_recall"] + 1 end
      elseif first == "open " .. t.codes[1] then
        assert.is_true(t.shown[1])
      else
        assert.matches("^open %a$", first)
        assert.is_false(t.shown[1])
        if kind == "even" then n.even_guess = n.even_guess + 1 end
        assert.are.equal("recall " .. l, o[2])
      end
    end
    assert.are.equal(1000, solved)
    assert.is_true(won > 700 and won < 950, "oracle " .. won)
    local function near(a, b, p) return math.abs(n[a] / n[b] - p) < 0.1 end
    assert.is_true(near("even_guess", "even", 0.6) and near("odd_recall", "odd", 0.8)
      and near("high_recall", "high", 0.6) and near("low_recall", "low", 0.15))
  end)
end)

describe("rl.train.paired", function()
  local tok = rl.tokenizer.bytes()
  local function ctx_for(seed)
    local m = rl.model.new { vocab = tok:vocab_size(), dim = 16, layers = 1, heads = 2, ffn = 32, ctx = 128, seed = seed }
    local cfg = { env = L, max_turns = L.max_turns, max_turn_tokens = 8, tasks_per_step = 3, group_size = 2,
      batch_invariant = true }
    return { model = m, tokenizer = tok, cfg = cfg, ro = rl.rollout.new { model = m, episodes = 6, capacity = 128 } }
  end
  -- An untrained policy's text turned into actions by the marks: every turn marked, and the
  -- refused action is any whose first byte is the one A took (so B's differs at that turn).
  it("pairs each marked turn with a branch from A's very prefix, the action there replaced", function()
    local ctx = ctx_for(3)
    local tasks = L.tasks("train", 3, 1)
    local refused_first = {}
    local calls = {}
    local stage = rl.train.paired.rollout {
      mark = function(r) return #r.action > 0 end,
      refuse = function(action) return action:sub(1, 1) == refused_first.byte end,
      reward = function(a, b, turn)
        calls[#calls + 1] = { a = a, b = b, turn = turn }
        return #a.record - b.turns + 0.5 * turn
      end,
      max_resamples = 64,
    }
    -- refuse whatever A's turn-2 actions start with: one byte the untrained policy used
    local plain = rl.train.rollout.run(ctx, { tasks = tasks, repeats = 2, seed = 11, temperature = 1, group_base = 0 })
    refused_first.byte = plain.episodes[1].record[2] and plain.episodes[1].record[2].action:sub(1, 1) or "x"
    local b = stage(ctx, { tasks = tasks, repeats = 2, seed = 11, temperature = 1, group_base = 0 })
    assert.are.equal(6, b:size())
    for i, ep in ipairs(b.episodes) do
      assert.are.same(plain.episodes[i].record, ep.record) -- A is the plain rollout
    end
    local marked = 0
    for _, ep in ipairs(b.episodes) do
      for _, r in ipairs(ep.record) do if #r.action > 0 then marked = marked + 1 end end
    end
    assert.are.equal(marked, b.paired.marked)
    assert.are.equal(b.paired.marked, b.paired.paired + b.paired.refused + b.paired.differed)
    assert.are.equal(0, b.paired.differed) -- batch_invariant: the prefixes are A's
    assert.is_true(b.paired.paired > 0)
    local sum, replaced = 0, 0
    for _, c in ipairs(calls) do
      for t = 1, c.turn - 1 do assert.are.equal(c.a.record[t].action, c.b.record[t].action) end
      local ba = c.b.record[c.turn].action
      assert.are_not.equal(refused_first.byte, ba:sub(1, 1))
      if c.a.record[c.turn].action:sub(1, 1) == refused_first.byte then replaced = replaced + 1 end
      assert.are.equal(c.a.process[c.turn], #c.a.record - c.b.turns + 0.5 * c.turn)
      local ret = 0
      for _, v in ipairs(c.b.rewards) do ret = ret + v end
      assert.are.equal(ret, c.b.return_)
      sum = sum + c.a.process[c.turn]
    end
    assert.is_true(replaced > 0) -- A's refused action was replaced in B at that very turn
    assert.is_true(math.abs(b.paired.mean - sum / #calls) < 1e-12)

    -- the estimator: grpo's advantage plus weight x the turn's process reward on its tokens
    for i, ep in ipairs(b.episodes) do ep.reward = (i % 3) * 0.5 end
    local est = rl.train.paired.advantage { base = "grpo", weight = 2 }
    local adv, per = est(ctx, b)
    local base, per0 = rl.train.advantage.get("grpo").fn(ctx, b)
    assert.are.same(per0, per)
    local extra = 0
    for i, ep in ipairs(b.episodes) do
      local first, last = b:range(i)
      for p = first, last do
        local want = base:get(p)
        local turn = math.floor(b.turns:get(p)) + 1
        if b.mask:get(p) ~= 0 and ep.process and ep.process[turn] then
          want = want + 2 * ep.process[turn]
          extra = extra + 1
        end
        assert.is_true(math.abs(adv:get(p) - want) < 1e-6, string.format("position %d: %g vs %g", p, adv:get(p), want))
      end
    end
    assert.is_true(extra > 0)
  end)

  it("refuses bad options and a reward that is not a finite number", function()
    local ok = function() return true end
    H.assert_error(function() rl.train.paired.rollout { mark = ok, refuse = ok } end,
      "rl.train.paired.rollout: reward: a function expected (it is required)")
    H.assert_error(function() rl.train.paired.rollout { mark = ok, refuse = ok, reward = ok, max_resamples = 0 } end,
      "max_resamples: a positive integer expected, got 0")
    H.assert_error(function() rl.train.paired.rollout { mark = ok, refuse = ok, reward = ok, resamples = 2 } end,
      "rl.train.paired.rollout: unknown field 'resamples'")
    H.assert_error(function() rl.train.paired.advantage { base = "nope" } end,
      "rl.train.paired.advantage: base: no estimator named \"nope\"")
    H.assert_error(function() rl.train.paired.advantage { base = "gae" } end,
      "base: an estimator without a critic expected")
    H.assert_error(function() rl.train.paired.advantage { weight = 0 / 0 } end, "weight: a finite number expected")
    local ctx = ctx_for(4)
    local stage = rl.train.paired.rollout { mark = ok, refuse = function() return false end,
      reward = function() return 0 / 0 end }
    H.assert_error(function()
      stage(ctx, { tasks = L.tasks("train", 3, 1), repeats = 2, seed = 5, temperature = 1, group_base = 0 })
    end, "rl.train.paired.rollout: reward: a finite number expected, got ")
  end)
end)

describe("recipes/proact.lua", function()
  it("runs every arm on a tiny budget and prints the same table twice", function()
    local function run()
      local dir = H.tmpdir()
      local out, code = H.run(table.concat({ H.shell_quote(H.moonrl), "run",
        H.shell_quote(H.root .. "/recipes/proact.lua"), "--smoke", "--dir", H.shell_quote(dir) }, " "))
      assert.are.equal(0, code, out)
      H.sh("rm -rf " .. H.shell_quote(dir))
      return out
    end
    local out = run()
    assert.matches("\n  measured: [%d.]+ s per RL step", out)
    assert.matches("proactrl branches: %d+ recall turns, %d+ paired", out)
    local tbl = out:match("\n(proact, seed 1;.-)\n%(succ")
    assert.is_not_nil(tbl, out)
    assert.matches("\narm +succ%% +need%% +recall +prec%% +turns +s/step\n", tbl)
    for _, arm in ipairs { "never", "passive", "every", "SFT", "grpo", "grpo_cost", "proactrl", "ideal" } do
      local s, n, r, p, t = tbl:match("\n" .. arm .. " +([%d.]+) +([%d.]+) +([%d.]+) +([%d.-]+) +([%d.]+)")
      assert.is_not_nil(s, arm .. " row missing:\n" .. tbl)
      for _, v in ipairs { tonumber(s), tonumber(n) } do assert.is_true(v >= 0 and v <= 100) end
      assert.is_true(tonumber(r) >= 0 and tonumber(r) <= 4)
      assert.is_true(p == "-" or (tonumber(p) >= 0 and tonumber(p) <= 100))
      assert.is_true(tonumber(t) >= 1 and tonumber(t) <= 4)
    end
    assert.matches("\nideal +100%.0 +100%.0 ", tbl)
    assert.matches("\nevery +100%.0 +100%.0 +2%.00 ", tbl)
    local again = run():match("\n(proact, seed 1;.-)\n%(succ")
    -- the same table digit for digit, the s/step column (a timing) aside
    local function no_timing(t) return (t:gsub(" +[%d.-]+\n", "\n"):gsub(" +[%d.-]+$", "")) end
    assert.are.equal(no_timing(tbl), no_timing(again))
  end)
end)
