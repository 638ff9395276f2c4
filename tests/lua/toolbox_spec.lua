-- toolbox_spec.lua - envs/toolbox.lua (the tagged tool tasks of failure-targeted synthesis): its
-- rules and tags, the scripted solver as verifier (every family solvable, broken tasks
-- rejected), the SFT split's gaps, the held-out suite, determinism from the seed, the per-tag
-- diagnosis of real episodes, and a smoke run of recipes/toolbox.lua.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"

package.path = H.root .. "/?.lua;" .. package.path
local tb = require "envs.toolbox"

-- Plays actions through the environment as the engine does; returns the records.
local function play(task, actions)
  local inst = tb.new()
  local obs = { inst:reset(task) }
  local record = {}
  for _, a in ipairs(actions) do
    local o, _, done = rl.env.step(tb, inst, a, record)
    obs[#obs + 1] = o
    if done then break end
  end
  return record, obs
end

local function has(list, x)
  for _, v in ipairs(list) do if v == x then return true end end
  return false
end

describe("envs/toolbox", function()
  it("follows its rules: calls, busy retries, distractors, the answer; a wrong turn ends it", function()
    local t = tb.make { ops = { { "get", "k3" }, { "add", "5" }, { "mul", "3" } }, tab = { k3 = 7 }, busy = { 2 }, noise = 1 }
    assert.are.equal("get k3,add 5,mul 3", t.prompt)
    assert.are.equal("36", t.answer)
    assert.are.same({ "lookup", "arith", "chain3", "recover", "distract" }, t.tags)
    local rec, obs = play(t, { "CALL get k3", "CALL add 7 5", "CALL add 7 5", "CALL mul 12 3", "ANSWER 36" })
    assert.are.equal("get k3,add 5,mul 3", obs[1])
    assert.truthy(obs[2]:match("^k%d=%d+ =7$"), obs[2])
    assert.are.equal("err busy", obs[3])
    assert.truthy(obs[4]:match("^k%d=%d+ =12$"), obs[4])
    assert.truthy(obs[5]:match("=36$"), obs[5])
    assert.are.same({ "call1", "call2", "retry", "call3", "answer" },
      { rec[1].state, rec[2].state, rec[3].state, rec[4].state, rec[5].state })
    assert.are.equal(1, rec[5].reward)
    assert.is_true(rec[5].info.success)
    assert.is_true(rec[1].info.tool_call)
    -- not retrying after "err busy", a wrong copy, answering early, a wrong answer: each ends it
    for _, case in ipairs {
      { { "CALL get k3", "ANSWER 7" }, "call2" },
      { { "CALL get k3", "CALL add 7 5", "ANSWER 12" }, "retry" },
      { { "CALL get k3", "CALL add 9 5" }, "call2" },
      { { "CALL get k3", "CALL add 7 5", "CALL add 7 5", "CALL mul 12 3", "ANSWER 37" }, "answer" },
      { { "ANSWER 36" }, "call1" },
    } do
      local r = play(t, case[1])
      local last = r[#r]
      assert.is_true(last.done)
      assert.are.equal(0, last.reward)
      assert.is_false(last.info.success)
      assert.are.equal(case[2], last.info.wrong)
    end
    -- one-op tasks carry one capability tag
    assert.are.same({ "arith" }, tb.make { ops = { { "add", "17", "25" } } }.tags)
    assert.are.same({ "lookup" }, tb.make { ops = { { "get", "k1" } }, tab = { k1 = 4 } }.tags)
    assert.are.same({ "arith", "chain2" }, tb.make { ops = { { "add", "1", "2" }, { "mul", "3" } } }.tags)
    assert.are.equal("42", tb.make { ops = { { "add", "17", "25" } } }.answer)
  end)

  it("solves every task family with its scripted solver and rejects broken tasks", function()
    for _, split in ipairs { "train", "test", "sft", "random" } do
      for i, t in ipairs(tb.tasks(split, 150, 11)) do
        local ok, why = tb.verify(t)
        assert.is_true(ok, split .. " " .. i .. " " .. tostring(why))
      end
    end
    local rng = rl.rng(5)
    for _, tag in ipairs(tb.tags) do
      for _, level in ipairs(tb.levels) do
        for _ = 1, 20 do
          local t = tb.gen({ focus = { tag }, level = level }, rng)
          assert.is_true(has(t.tags, tag), tag)
          assert.are.equal(level, t.level)
          assert.is_true(tb.verify(t), t.key)
          assert.is_false(tb.is_held_out(t))
          local _, actions = tb.solve(t)
          local rec = play(t, actions)
          assert.are.equal(1, rec[#rec].reward)
        end
      end
    end
    -- broken: a stated answer the tools do not give, a key the table lacks, more busy answers
    -- than the turns allow, a tool that does not exist
    local good = tb.make { ops = { { "add", "2", "3" } } }
    assert.is_true(tb.verify(good))
    local bad = {
      tb.make { ops = { { "add", "2", "3" } }, answer = "6" },
      tb.make { ops = { { "get", "k5" } }, tab = { k1 = 3 } },
      tb.make { ops = { { "add", "2", "3" } }, busy = { 1, 1, 1, 1, 1, 1 } },
      tb.make { ops = { { "sub", "2", "3" } } },
    }
    for i, t in ipairs(bad) do
      local ok, why = tb.verify(t)
      assert.is_false(ok, "broken task " .. i)
      assert.are.equal("unsolvable", why)
    end
    assert.are.equal("malformed", select(2, tb.verify { prompt = 3 }))
    -- as an rl.synth.loop verifier: a broken proposal is invalid, never calibrated or admitted
    local items = { good, bad[1] }
    local loop = rl.synth.loop { propose = { propose = function(_, _, n)
      local out = {} for i = 1, n do out[i] = { task = items[i] } end return out end },
      verify = { tb.verify }, novelty = false, per_step = 2, calibrate = rl.synth.pass_rate { k = 2, band = { 0, 1 } } }
    local r = loop:step { solve = function(tasks, k)
      local o = {} for i = 1, #tasks do o[i] = {} for j = 1, k do o[i][j] = { success = j == 1 } end end return o end }
    assert.are.equal(1, r.admitted)
    assert.are.equal(1, r.invalid.unsolvable)
  end)

  it("under-represents recover and chain3 in the SFT split, and its held-out suite covers every tag", function()
    local function shares(list)
      local n = {}
      for _, t in ipairs(list) do for _, tag in ipairs(t.tags) do n[tag] = (n[tag] or 0) + 1 / #list end end
      return n
    end
    local sft, train = shares(tb.tasks("sft", 2000, 1)), shares(tb.tasks("train", 2000, 1))
    for _, tag in ipairs { "recover", "chain3" } do
      assert.is_true(sft[tag] < 0.07, tag .. " " .. sft[tag])
      assert.is_true(train[tag] > 0.25, tag .. " " .. train[tag])
    end
    for _, tag in ipairs { "lookup", "arith", "chain2", "distract" } do assert.is_true(sft[tag] > 0.2, tag) end
    local suite = tb.suite()
    assert.are.equal(400, #suite)
    local s = shares(suite)
    for _, tag in ipairs(tb.tags) do assert.is_true(s[tag] * 400 >= 60, tag .. " " .. s[tag] * 400) end
    local levels = {}
    for _, t in ipairs(suite) do
      assert.is_true(tb.is_held_out(t))
      levels[#t.ops] = true
    end
    assert.are.same({ true, true, true }, levels)
    -- held out by construction: no training, SFT or random task is in the suite
    local keys = {}
    for _, t in ipairs(suite) do keys[tb.key(t)] = true end
    for _, split in ipairs { "train", "sft", "random" } do
      for _, t in ipairs(tb.tasks(split, 1000, 2)) do assert.is_nil(keys[tb.key(t)], split) end
    end
    assert.has_error(function() tb.tasks("tset", 1, 1) end)
    assert.has_error(function() tb.gen({ focus = { "recovery" } }, rl.rng(1)) end)
    assert.has_error(function() tb.gen({ level = 4 }, rl.rng(1)) end)
  end)

  it("is deterministic from the seed", function()
    local function keys(list) local o = {} for i, t in ipairs(list) do o[i] = tb.key(t) end return o end
    for _, split in ipairs { "train", "test", "sft", "random" } do
      assert.are.same(keys(tb.tasks(split, 50, 3)), keys(tb.tasks(split, 50, 3)))
      assert.are_not.same(keys(tb.tasks(split, 50, 3)), keys(tb.tasks(split, 50, 4)))
    end
    assert.are.same(keys(tb.suite(400)), keys(tb.suite(400)))
    local a = tb.gen({ focus = { "recover" }, level = 2 }, rl.rng(9))
    local b = tb.gen({ focus = { "recover" }, level = 2 }, rl.rng(9))
    assert.are.equal(tb.key(a), tb.key(b))
    -- the distractors of an episode depend on the task only
    local t = tb.tasks("train", 1, 8)[1]
    t = tb.make { ops = t.ops, tab = t.tab, busy = {}, noise = 2, seed = 5 }
    local _, o1 = play(t, { tb.oracle(t)[1] })
    local _, o2 = play(t, { tb.oracle(t)[1] })
    assert.are.equal(o1[2], o2[2])
  end)

  it("diagnoses per-tag pass rates and the failing turn types from played episodes", function()
    local tg = rl.synth.target { by = { "state" }, decay = 0 }
    local eps = {}
    local rng = rl.rng(3)
    -- a scripted agent with gaps: it never retries after "err busy" and answers after two calls
    for i = 1, 60 do
      local t = tb.gen({ focus = { tb.tags[(i - 1) % #tb.tags + 1] }, level = 1 }, rng)
      local _, actions = tb.solve(t)
      local acts, calls = {}, 0
      for _, a in ipairs(actions) do
        if a:match("^CALL") then
          if acts[#acts] == a then acts[#acts + 1] = "ANSWER 0" break end
          calls = calls + 1
          if calls == 3 then acts[#acts + 1] = "ANSWER 0" break end
        end
        acts[#acts + 1] = a
      end
      local rec = play(t, acts)
      eps[i] = { task = t, success = rec[#rec].reward == 1, record = rec }
    end
    tg:observe { episodes = eps }
    local pass = {}
    for _, r in ipairs(tg:tags()) do pass[r.tag] = r.pass end
    assert.are.equal(0, pass.recover)
    assert.are.equal(0, pass.chain3)
    assert.is_true(pass.lookup > 0 and pass.arith > 0 and pass.chain2 > 0 and pass.distract > 0)
    local weak = tg:weakest(2)
    table.sort(weak)
    assert.are.same({ "chain3", "recover" }, weak)
    local con = tg:contrast()
    local worst = { con[1].turn, con[2].turn }
    table.sort(worst)
    assert.are.same({ "call3", "retry" }, worst)
    assert.are.equal(1, con[1].fail_rate)
  end)

  it("runs its recipe in a smoke configuration: logs, the table and the comparison lines", function()
    local dir = os.tmpname()
    os.remove(dir)
    local out, code = H.run(string.format("MOONRL_ROOT=%s %s run %s/recipes/toolbox.lua --smoke --dir %s",
      H.shell_quote(H.root), H.shell_quote(H.moonrl), H.shell_quote(H.root), H.shell_quote(dir)))
    assert.are.equal(0, code, out)
    assert.truthy(out:find("| arm | rollouts (train/all) | held-out | lookup | arith | chain2 | chain3 | recover | distract | s/step |", 1, true), out)
    for _, name in ipairs { "SFT warm start", "(a) GRPO, target distribution", "(b) GRPO, random synthetic",
      "(c) targeted loop", "(d) targeted loop, 1/4 rollouts", "round 1 (step 1): probe pass", "(c) > (a): " } do
      assert.truthy(out:find(name, 1, true), name .. "\n" .. out)
    end
    -- the targeted arm stays within the budget of the others, the probes and calibration counted
    local a = tonumber(out:match("arm a: %d+ steps, (%d+) rollouts"))
    local c, ctrain, cprobe = out:match("arm c: %d+ steps, (%d+) rollouts %((%d+) training, (%d+) probe")
    assert.is_true(tonumber(c) <= a and tonumber(cprobe) > 0 and tonumber(ctrain) < tonumber(c), out)
    for _, arm in ipairs { "a", "b", "c", "d" } do
      local f = io.open(dir .. "/toolbox-" .. arm .. "-s1/metrics.jsonl")
      assert.is_not_nil(f, arm)
      local last
      for line in f:lines() do last = rl.json.decode(line) end
      f:close()
      assert.is_number(last["eval/greedy_success"], arm)
      assert.is_number(last["eval/recover"], arm)
    end
    local function metrics(d)
      local out = {}
      for line in io.lines(d .. "/toolbox-c-s1/metrics.jsonl") do
        local m = rl.json.decode(line)
        for k in pairs(m) do if k:match("^time") or k:match("seconds") or k:match("per_s") then m[k] = nil end end
        out[#out + 1] = m
      end
      return out
    end
    local first = metrics(dir)
    assert.are.equal(0, first[1].step)          -- the evaluation after the warm start
    assert.is_number(first[2]["synth/proposed"]) -- step 1: a round of the loop
    assert.is_number(first[2].success)
    -- the same seed gives the same run: arm (c) again, alone, in another folder
    local dir2 = dir .. "-again"
    local out2, code2 = H.run(string.format("MOONRL_ROOT=%s %s run %s/recipes/toolbox.lua --smoke --arms c --dir %s",
      H.shell_quote(H.root), H.shell_quote(H.moonrl), H.shell_quote(H.root), H.shell_quote(dir2)))
    assert.are.equal(0, code2, out2)
    assert.are.same(first, metrics(dir2))
    local row = "(| %(c%) targeted loop |[^\n]*|) [%d.]+ |\n" -- its cells but the seconds per step
    assert.are.equal(out:match(row), out2:match(row))
    assert.is_string(out:match(row))
    os.execute("rm -rf " .. H.shell_quote(dir) .. " " .. H.shell_quote(dir2))
    local said, bad = H.run(string.format("MOONRL_ROOT=%s %s run %s/recipes/toolbox.lua --smoke --sedes 3",
      H.shell_quote(H.root), H.shell_quote(H.moonrl), H.shell_quote(H.root)))
    assert.are_not.equal(0, bad)
    assert.truthy(said:find("unknown option --sedes (did you mean --seed", 1, true), said)
  end)
end)
