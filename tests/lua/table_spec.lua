-- table_spec.lua - envs/table.lua (the ops its header states, silent errors, undo, the budget,
-- the split, determinism, the oracles), its two scripted PRMs on hand-written trajectories (the
-- env-aware verifier's 1 / 0.5 / 0, the naive one's blindness to silent errors), and a smoke run
-- of recipes/dataprm.lua (it runs, prints both tables with every arm, the same for the same seed,
-- and the process term is 0.5 x the mean step score; not that it learns).
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"

local T = dofile(H.root .. "/envs/table.lua")

-- Plays actions through the engine's step path; returns the records and the first observation.
local function play(task, actions)
  local inst, record = T.new(), {}
  local first = inst:reset(task, rl.rng(1))
  for _, a in ipairs(actions) do
    local _, _, done = rl.env.step(T, inst, a, record)
    if done then break end
  end
  return record, first
end

-- A hand-made task: sum (or agg) of b where a > 3 on a table with a 3 in a.
local function task_of(agg, answer)
  return { cols = { a = { 1, 3, 5, 7, 9 }, b = { 2, 4, 6, 8, 1 }, c = { 9, 9, 9, 9, 9 } }, agg = agg or "sum",
    col = "b", fcol = "a", cmp = ">", thr = 3, answer = answer or 15 }
end

-- The query's answer computed here, the slow way.
local function answer(task)
  local vals = {}
  for r = 1, 5 do
    local v = task.cols[task.fcol][r]
    local keep = (task.cmp == ">" and v > task.thr) or (task.cmp == "<" and v < task.thr)
    if keep then vals[#vals + 1] = task.cols[task.col][r] end
  end
  local acc = task.agg == "sum" and 0 or vals[1]
  for _, v in ipairs(vals) do
    if task.agg == "sum" then acc = acc + v
    elseif task.agg == "max" then acc = math.max(acc, v)
    else acc = math.min(acc, v) end
  end
  return acc, #vals
end

local function observations(record)
  local out = {}
  for k, r in ipairs(record) do out[k] = r.observation end
  return out
end

describe("envs/table.lua", function()
  it("runs the gold plan: the query, kept rows, the aggregate, reward 1 for the right answer", function()
    local task = task_of()
    local rec, first = play(task, { "filt a>3", "sum b", "ans 15" })
    assert.are.equal("sum b a>3", first)
    assert.are.equal("kept 3", rec[1].observation)
    assert.are.equal("= 15", rec[2].observation)
    assert.is_true(rec[3].done)
    assert.are.equal(1, rec[3].reward)
    assert.is_true(rec[3].info.success)
    rec = play(task, { "filt a>3", "sum b", "ans 14" })
    assert.are.equal(0, rec[3].reward)
    assert.is_false(rec[3].info.success)
  end)

  it("runs a silent error like any op; undo drops the last filter; show lists the kept rows", function()
    local task = task_of()
    local rec = play(task, { "filt a>=3", "sum b", "show", "undo", "filt a>3", "show", "sum b" })
    assert.are.equal("kept 4", rec[1].observation)
    assert.are.equal("= 19", rec[2].observation)             -- 4 + 6 + 8 + 1
    assert.are.equal("a:3579 b:4681 c:9999", rec[3].observation)
    assert.are.equal("undone kept 5", rec[4].observation)
    assert.are.equal("kept 3", rec[5].observation)
    assert.are.equal("a:579 b:681 c:999", rec[6].observation)
    assert.is_true(rec[7].done)                               -- the 7-turn budget
    assert.is_true(rec[7].info.budget)
    assert.are.equal(0, rec[7].reward)
  end)

  it("calls malformed ops and an undo with nothing to undo invalid, at no cost", function()
    local rec = play(task_of(), { "undo", "filt d>3", "sum", "ans x", "max a", "min c" })
    for k = 1, 4 do
      assert.are.equal("invalid", rec[k].observation)
      assert.is_true(rec[k].info.invalid)
      assert.are.equal(0, rec[k].reward)
    end
    assert.are.equal("= 9", rec[5].observation)
    assert.are.equal("= 9", rec[6].observation)
  end)

  it("draws the same tasks for the same seed, answers them rightly, and splits by construction", function()
    local a, b = T.tasks("train", 200, 9), T.tasks("train", 200, 9)
    assert.are.same(a, b)
    local test = T.tasks("test", 200, 9)
    for _, t in ipairs(a) do assert.is_false(T.held_out(t)) end
    for _, t in ipairs(test) do assert.is_true(T.held_out(t)) end
    for _, t in ipairs(a) do
      local ans, kept = answer(t)
      assert.are.equal(ans, t.answer)
      assert.is_true(kept >= 1 and kept <= 4)
      assert.are_not.equal(t.col, t.fcol)
      local present = false
      for r = 1, 5 do present = present or t.cols[t.fcol][r] == t.thr end
      assert.is_true(present)
    end
    assert.has_error(function() T.tasks("dev", 1, 1) end)
  end)

  it("solves every task with the perfect oracle; the SFT oracle errs, repairs and answers its aggregate", function()
    local tasks = T.tasks("train", 400, 5)
    local wins, silent, lucky, undos = 0, 0, 0, 0
    for i, t in ipairs(tasks) do
      assert.is_true(T.check(t, T.solve(t)).success)
      local acts = T.oracle(t, rl.rng(i))
      assert.are.same(acts, T.oracle(t, rl.rng(i)))
      local rec = play(t, acts)
      assert.are.equal(#acts, #rec)
      assert.are.equal("ans " .. rec[#rec - 1].observation:match("^= (%d+)$"), acts[#acts])
      local c = T.check(t, acts)
      if c.success then wins = wins + 1 end
      if c.silent then silent = silent + 1 end
      if c.lucky then lucky = lucky + 1 end
      for _, a in ipairs(acts) do if a == "undo" then undos = undos + 1 end end
    end
    -- 40% slip, half repaired: about 20% live silent errors, some of them lucky
    assert.is_true(silent > 40 and silent < 130, tostring(silent))
    assert.is_true(lucky > 0 and lucky < silent)
    assert.is_true(undos > 40 and undos < 130, tostring(undos))
    assert.are.equal(400 - silent + lucky, wins)
  end)
end)

describe("envs/table.lua PRMs", function()
  it("scores the gold plan 1 per step under both, and an exploratory show 0.5 (aware) or 0 (naive)", function()
    local task = task_of()
    local acts = { "filt a>3", "sum b", "ans 15" }
    assert.are.same({ 1, 1, 1 }, T.prm_aware(task, acts))
    assert.are.same({ 1, 1, 1 }, T.prm_naive(acts, observations(play(task, acts))))
    acts = { "show", "filt a>3", "sum b", "ans 15" }
    assert.are.same({ 0.5, 1, 1, 1 }, T.prm_aware(task, acts))
    assert.are.same({ 0, 1, 1, 1 }, T.prm_naive(acts, observations(play(task, acts))))
  end)

  it("gives an unrepaired silent error 0 (aware) where the naive PRM sees nothing wrong", function()
    local task = task_of()
    local acts = { "filt a>=3", "sum b", "ans 19" }
    assert.are.same({ 0, 0, 0 }, T.prm_aware(task, acts))
    assert.are.same({ 1, 1, 1 }, T.prm_naive(acts, observations(play(task, acts))))
    -- a lucky one: max b is 8 with or without the row a = 3, the answer is right, the filter not
    local lucky = task_of("max", 8)
    acts = { "filt a>=3", "max b", "ans 8" }
    assert.is_true(T.check(lucky, acts).success)
    assert.is_true(T.check(lucky, acts).lucky)
    assert.are.same({ 0, 0, 1 }, T.prm_aware(lucky, acts))
    assert.are.same({ 1, 1, 1 }, T.prm_naive(acts, observations(play(lucky, acts))))
  end)

  it("compares filters by running them on every digit: a>=4 is a>3, a>=3 is not even without a 3", function()
    local task = task_of()
    assert.are.same({ 1, 1, 1 }, T.prm_aware(task, { "filt a>=4", "sum b", "ans 15" }))
    local no3 = task_of()
    no3.cols.a = { 1, 2, 5, 7, 9 }
    assert.is_true(T.check(no3, { "filt a>=3", "sum b", "ans 15" }).success)
    assert.are.same({ 0, 0, 1 }, T.prm_aware(no3, { "filt a>=3", "sum b", "ans 15" }))
    assert.are.same({ 0, 0, 1 }, T.prm_aware(task, { "filt b>3", "sum b", "ans 15" }))
  end)

  it("gives a mistake later undone 0.5 and the undo 1 (aware); the naive PRM gives the undo 0", function()
    local task = task_of()
    local acts = { "filt a>=3", "undo", "filt a>3", "sum b", "ans 15" }
    assert.are.same({ 0.5, 1, 1, 1, 1 }, T.prm_aware(task, acts))
    assert.are.same({ 1, 0, 1, 1, 1 }, T.prm_naive(acts, observations(play(task, acts))))
    -- undoing the right filter is a mistake, 0.5 once the filter is back; a redundant filter 0.5
    assert.are.same({ 1, 0.5, 1, 1, 1 }, T.prm_aware(task, { "filt a>3", "undo", "filt a>3", "sum b", "ans 15" }))
    assert.are.same({ 1, 0, 0, 0 }, T.prm_aware(task, { "filt a>3", "undo", "sum b", "ans 19" }))
    assert.are.same({ 1, 0.5, 1, 1 }, T.prm_aware(task, { "filt a>3", "filt a>=4", "sum b", "ans 15" }))
  end)

  it("gives invalid ops, a wrong aggregate and an episode that never answers 0", function()
    local task = task_of()
    local acts = { "dance", "filt a>3", "max b", "sum b", "ans 15" }
    assert.are.same({ 0, 1, 0, 1, 1 }, T.prm_aware(task, acts))
    assert.are.same({ 0, 1, 1, 1, 1 }, T.prm_naive(acts, observations(play(task, acts))))
    assert.are.same({ 1, 0 }, T.prm_aware(task, { "filt a>3", "sum b" }))
    -- the naive PRM's answer step: 1 when it repeats the last aggregate, whatever the truth
    acts = { "filt a>3", "sum b", "ans 14" }
    assert.are.same({ 1, 1, 0 }, T.prm_naive(acts, observations(play(task, acts))))
    assert.are.same({ 1, 1, 0 }, T.prm_aware(task, acts))
    assert.are.equal(0.5, T.mean { 1, 0, 0.5, 0.5 })
    assert.are.equal(0, T.mean {})
  end)
end)

describe("recipes/dataprm.lua", function()
  local function run(dir, extra)
    return H.run(table.concat({ H.shell_quote(H.moonrl), "run", H.shell_quote(H.root .. "/recipes/dataprm.lua"),
      "--smoke", extra or "", "--dir", H.shell_quote(dir) }, " "))
  end
  local function tables_of(out)
    local at = out:find("\ndataprm, seed 1;", 1, true)
    if not at then return nil end
    local lines = {}
    for line in out:sub(at):gsub("%(success:.*$", ""):gmatch("[^\n]+") do
      if line:match("^outcome ") or line:match("^aware ") or line:match("^naive ") then
        line = line:gsub("%s+[%d.]+$", "") -- the arm's s/step
      end
      lines[#lines + 1] = line
    end
    return table.concat(lines, "\n")
  end
  local dir = H.tmpdir()
  local out, code = run(dir)
  teardown(function() H.sh("rm -rf " .. H.shell_quote(dir)) end)

  it("prints the RL table with every arm and the SFT start, and the Best-of-8 table", function()
    assert.are.equal(0, code, out)
    assert.matches("arm%s+success%%%s+greedy%%%s+silent%%%s+lucky%%%s+aware%s+s/step", out)
    for _, arm in ipairs { "outcome", "aware", "naive", "SFT" } do
      local line = out:match("\n(" .. arm .. " [^\n]*)")
      assert.is_truthy(line, out)
      local nums = {}
      for x in line:gmatch("[%d.]+") do nums[#nums + 1] = tonumber(x) end
      assert.is_true(#nums >= 5, line)
      for k = 1, 4 do assert.is_true(nums[k] >= 0 and nums[k] <= 100, line) end
      assert.is_true(nums[5] >= 0 and nums[5] <= 1, line)
    end
    for _, label in ipairs { "first sample", "naive PRM", "env%-aware PRM", "pass@8 %(outcome%)" } do
      local v = tonumber(out:match("\n" .. label .. "%s+([%d.]+)"))
      assert.is_truthy(v, out)
      assert.is_true(v >= 0 and v <= 100)
    end
  end)

  it("prints the same tables for the same seed", function()
    local dir2 = H.tmpdir()
    local out2, code2 = run(dir2)
    assert.are.equal(0, code2, out2)
    assert.is_truthy(tables_of(out))
    assert.are.equal(tables_of(out), tables_of(out2))
    H.sh("rm -rf " .. H.shell_quote(dir2))
  end)

  it("adds 0.5 x the mean step score of its PRM in the PRM arms, nothing in the outcome arm", function()
    for _, arm in ipairs { "aware", "naive" } do
      local eps = H.read_json_lines(dir .. "/dataprm-" .. arm .. "-s1/episodes.jsonl")
      assert.is_true(#eps > 0)
      for _, ep in ipairs(eps) do
        local actions, obs = {}, {}
        for k, r in ipairs(ep.record) do actions[k], obs[k] = r.action, r.observation end
        local s = arm == "aware" and T.prm_aware(ep.task, actions) or T.prm_naive(actions, obs)
        local sum = 0
        for _, v in ipairs(s) do sum = sum + v end
        assert.is_near(sum / #s, ep.reward_terms["prm_" .. arm], 1e-12)
        assert.is_near(ep.reward_terms.outcome + 0.5 * sum / #s, ep.reward, 1e-12)
        for k = 1, #s do assert.is_near(0.5 * s[k] / #s + ep.record[k].reward, ep.rewards[k], 1e-12) end
      end
    end
    for _, ep in ipairs(H.read_json_lines(dir .. "/dataprm-outcome-s1/episodes.jsonl")) do
      assert.is_nil(ep.reward_terms.prm_aware)
      assert.is_nil(ep.reward_terms.prm_naive)
    end
  end)

  it("refuses an unknown arm and a negative weight", function()
    local bad = H.run(table.concat({ H.shell_quote(H.moonrl), "run", H.shell_quote(H.root .. "/recipes/dataprm.lua"),
      "--arms outcome,ppo" }, " "))
    assert.matches("unknown arm 'ppo'", bad)
    bad = H.run(table.concat({ H.shell_quote(H.moonrl), "run", H.shell_quote(H.root .. "/recipes/dataprm.lua"),
      "--weight -1" }, " "))
    assert.matches("%-%-weight: a number >= 0", bad)
  end)
end)
