-- orchestra_spec.lua - envs/orchestra.lua (Uno-Orchestra's routing rules: the accuracy and cost
-- table, the split into subtasks, reward = correct - 0.02 x cost, invalid actions, the held-out
-- split, the orchestration trace in rl.multi's schema), envs/router.lua (the solvers' skills, the
-- team reward and each part's marginal contribution against a direct computation), and smoke
-- runs of recipes/orchestra.lua and recipes/marginal.lua (their tables, the same twice, the
-- trace lines, the budget of exact counterfactual evaluations, their option errors). Not that
-- they learn (the README's tables).
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"

package.path = H.root .. "/?.lua;" .. package.path
local orch = require "envs.orchestra"
local router = require "envs.router"

-- The tables as the header states them, written out again: p(right) by {one op small, one op
-- large, two ops} and cost.
local P = { ["cheap direct"] = { 0.95, 0.75, 0.55 }, ["cheap tool"] = { 0.95, 0.95, 0.60 },
  ["strong direct"] = { 0.95, 0.95, 0.95 }, ["strong tool"] = { 0.99, 0.99, 0.99 } }
local COST = { ["cheap direct"] = 1, ["cheap tool"] = 3, ["strong direct"] = 10, ["strong tool"] = 12 }
local ROUTES = { "cheap direct", "cheap tool", "strong direct", "strong tool" }

local function calc(a, op, b)
  if op == "+" then return a + b elseif op == "-" then return a - b end
  return a * b
end

-- The three dispatch slots' uniforms of a task, drawn as the header says: from the task's seed,
-- solve, s1, s2, two each.
local function slots(task)
  local rng = rl.rng(rl.envkit.seed(task.seed, "orchestra workers"))
  local u = {}
  for _, s in ipairs { "solve", "s1", "s2" } do u[s] = { rng:random(), rng:random() } end
  return u
end

local function large(...)
  for _, x in ipairs { ... } do if x >= 10 or x <= -10 then return true end end
  return false
end

-- Plays a list of actions; returns the step results and the instance.
local function play(task, actions)
  local inst, steps = orch.new(), {}
  steps.first = inst:reset(task)
  for _, a in ipairs(actions) do
    local o, r, d, info = inst:step(a, nil)
    steps[#steps + 1] = { obs = o, reward = r, done = d, info = info }
    if d then break end
  end
  return steps, inst
end

describe("envs/orchestra.lua", function()
  local tasks = orch.tasks("train", 300, 11)

  it("solves with the chosen worker and primitive: p(right) and cost from the table", function()
    local seen = 0
    for _, t in ipairs(tasks) do
      local u = slots(t)
      for _, route in ipairs(ROUTES) do
        local s = play(t, { "solve " .. route })
        assert.are.equal(1, #s)
        local big = t.ops == 1 and large(t.a, t.b) or large(t.a, t.b, t.c)
        local p = P[route][t.ops == 2 and 3 or (big and 2 or 1)]
        local right = u.solve[1] < p
        local last = s[1]
        assert.is_true(last.done)
        assert.are.equal(right, last.info.success)
        assert.are.equal(right, last.info.dispatch.right)
        assert.are.equal(COST[route], last.info.cost)
        assert.are.same({ cost = COST[route] }, last.info.costs)
        assert.is_near((right and 1 or 0) - 0.02 * COST[route], last.reward, 1e-12)
        assert.are.equal(t.text, last.info.dispatch.given)
        if not right then
          local off = tonumber(last.info.answer) - t.answer
          assert.is_truthy(({ [1] = true, [-1] = true, [2] = true, [-2] = true, [10] = true, [-10] = true })[off])
        end
        seen = seen + 1
      end
    end
    assert.are.equal(4 * #tasks, seen)
  end)

  it("splits a two-op problem by precedence and passes the first worker's value on", function()
    local n = 0
    for _, t in ipairs(tasks) do
      if t.ops == 2 then
        local u = slots(t)
        local s = play(t, { "split", "cheap direct", "cheap tool" })
        assert.are.equal(3, #s)
        local fa, fop, fb, rest_left
        if t.op2 == "*" and t.op1 ~= "*" then fa, fop, fb, rest_left = t.b, "*", t.c, true
        else fa, fop, fb = t.a, t.op1, t.b end
        assert.are.equal(string.format("s1 %d%s%d", fa, fop, fb), s[1].obs)
        assert.are.same({ 0, false }, { s[1].reward, s[1].done })
        local v1 = calc(fa, fop, fb)
        local r1 = u.s1[1] < (large(fa, fb) and 0.75 or 0.95)
        assert.are.equal(r1, s[2].info.dispatch.right)
        local got1 = tonumber(s[2].info.dispatch.returned)
        if r1 then assert.are.equal(v1, got1) else assert.are_not.equal(v1, got1) end
        local second = rest_left and string.format("%d%s%d", t.a, t.op1, got1) or string.format("%d%s%d", got1, t.op2, t.c)
        assert.are.equal("s2 " .. second, s[2].obs)
        assert.is_near(-0.02, s[2].reward, 1e-12)
        local r2 = u.s2[1] < 0.95 -- cheap tool, one op: 0.95 whatever the size
        local final = rest_left and calc(t.a, t.op1, got1) or calc(got1, t.op2, t.c)
        local value = r2 and final or nil
        if value then assert.are.equal(tostring(value), s[3].info.answer) end
        local correct = tonumber(s[3].info.answer) == t.answer
        assert.are.equal(correct, s[3].info.success)
        assert.are.equal(4, s[3].info.cost)
        assert.is_near((correct and 1 or 0) - 0.02 * 3, s[3].reward, 1e-12)
        assert.is_near((correct and 1 or 0) - 0.02 * 4, s[2].reward + s[3].reward, 1e-12)
        n = n + 1
      end
    end
    assert.is_true(n > 50)
  end)

  it("ends an invalid action at -0.1, not correct: a split of one op, an unknown worker, garbage", function()
    local one, two
    for _, t in ipairs(tasks) do
      if t.ops == 1 and not one then one = t end
      if t.ops == 2 and not two then two = t end
    end
    for _, case in ipairs { { one, { "split" } }, { one, { "solve medium direct" } }, { one, { "xyz" } },
      { two, { "split", "strong fast" } }, { two, { "split", "solve cheap tool" } } } do
      local s = play(case[1], case[2])
      local last = s[#s]
      assert.is_true(last.done)
      assert.are.equal(-0.1, last.reward)
      assert.is_false(last.info.success)
      assert.is_string(last.info.invalid)
    end
  end)

  it("gives the cheap worker about 70% and the strong one about 95% on the held-out problems", function()
    local held = orch.tasks("test", 3000, 5)
    local acc = {}
    for _, route in ipairs { "cheap direct", "strong direct" } do
      local ok = 0
      for _, t in ipairs(held) do
        if orch.play(t, orch.always(route:match("^(%S+) (%S+)$"))).success then ok = ok + 1 end
      end
      acc[route] = ok / #held
    end
    assert.is_near(0.70, acc["cheap direct"], 0.03)
    assert.is_near(0.95, acc["strong direct"], 0.015)
  end)

  it("keeps the held-out problems out of training, one text in four, and is deterministic", function()
    local train = {}
    for _, t in ipairs(orch.tasks("train", 2000, 3)) do train[t.text] = true end
    local held = orch.tasks("test", 500, 3)
    for _, t in ipairs(held) do assert.is_nil(train[t.text]) end
    local a, b = orch.tasks("test", 20, 9), orch.tasks("test", 20, 9)
    assert.are.same(a, b)
    for _, t in ipairs(a) do
      assert.are.same(play(t, { "solve cheap direct" }), play(t, { "solve cheap direct" }))
    end
    H.assert_error(function() orch.tasks("dev", 1, 1) end, "split: \"train\" or \"test\" expected")
  end)

  it("routes at random in the SFT demonstrations (every valid action) and best by the table", function()
    local counts = {}
    for i, t in ipairs(tasks) do
      local acts = orch.oracle(t, rl.rng(i))
      counts[acts[1]] = (counts[acts[1]] or 0) + 1
      local s = play(t, acts)
      assert.is_nil(s[#s].info.invalid)
    end
    for _, a in ipairs { "split", "solve cheap direct", "solve cheap tool", "solve strong direct", "solve strong tool" } do
      assert.is_true((counts[a] or 0) > 15, a)
    end
    -- the best router: a one-op small problem goes to cheap direct, a one-op large one to cheap tool
    local best = orch.best_router()
    assert.are.equal("solve cheap direct", best("q 3*4"))
    assert.are.equal("solve cheap tool", best("q 13*4"))
    assert.are.equal("split", best("q 2+3*4"))
  end)

  it("writes an episode as an rl.multi trace record: the orchestrator's turns and each dispatch", function()
    local two
    for _, t in ipairs(tasks) do if t.ops == 2 then two = t break end end
    local s = play(two, { "split", "strong tool", "cheap direct" })
    local record = {}
    for k, st in ipairs(s) do
      record[k] = { action = ({ "split", "strong tool", "cheap direct" })[k], reward = st.reward, done = st.done,
        observation = st.obs, info = st.info }
    end
    local ep = { task = two, record = record, group = 7, success = s[3].info.success,
      reward = s[1].reward + s[2].reward + s[3].reward, ["end"] = "done" }
    local tr = orch.trace_record(4, 2, ep)
    assert.are.same({ 4, 2, 7 }, { tr.step, tr.episode, tr.group })
    local agents = {}
    for i, turn in ipairs(tr.turns) do
      assert.are.equal(i, turn.turn)
      agents[i] = turn.agent
    end
    assert.are.same({ "orchestrator", "orchestrator", "strong", "orchestrator", "cheap" }, agents)
    assert.are.equal("q " .. two.text, tr.turns[1].given)
    assert.are.equal("split", tr.turns[1].returned)
    assert.are.equal(s[1].obs, tr.turns[2].given)
    local w1 = tr.turns[3]
    assert.are.same({ "orchestrator", 12, 2 }, { w1.called_by, w1.cost, w1.invocation })
    assert.are.equal(s[2].info.dispatch.given .. " tool", w1.given)
    assert.are.equal(s[2].info.dispatch.returned, w1.returned)
    assert.is_near(-0.24, w1.reward, 1e-12)
    assert.are.same({ "orchestrator", 1, 3 }, { tr.turns[5].called_by, tr.turns[5].cost, tr.turns[5].invocation })
    assert.is_near(-0.24, tr.rewards.strong, 1e-12)
    assert.is_near(-0.02, tr.rewards.cheap, 1e-12)
    assert.are.equal(ep.reward, tr.rewards.orchestrator)
    assert.are.equal("done", tr.turns[4]["end"])
    assert.is_nil(tr.turns[2]["end"])
  end)
end)

describe("envs/router.lua", function()
  local SKILL = { ann = { ["+"] = 0.95, ["-"] = 0.50, ["*"] = 0.40 }, bo = { ["+"] = 0.50, ["-"] = 0.95, ["*"] = 0.40 },
    cy = { ["+"] = 0.55, ["-"] = 0.55, ["*"] = 0.90 } }

  it("routes each part to the named solver with its skill, and scores the team only when all are right", function()
    local tasks = router.tasks("train", 400, 2)
    local names = { "ann", "bo", "cy" }
    for i, t in ipairs(tasks) do
      local acts = { names[i % 3 + 1], names[(i // 3) % 3 + 1], names[(i // 9) % 3 + 1] }
      local inst = router.new()
      assert.are.equal(string.format("1: %d%s%d", t.parts[1].a, t.parts[1].op, t.parts[1].b), inst:reset(t))
      local o1, r1, d1 = inst:step(acts[1], nil)
      assert.are.same({ string.format("2: %d%s%d", t.parts[2].a, t.parts[2].op, t.parts[2].b), 0, false }, { o1, r1, d1 })
      inst:step(acts[2], nil)
      local o3, r3, d3, info = inst:step(acts[3], nil)
      assert.is_nil(o3)
      assert.is_true(d3)
      -- the draws, as the header says: per part {u, offset}, for the routed solver and the default
      local rng = rl.rng(rl.envkit.seed(t.seed, "router solvers"))
      local all = true
      for k, q in ipairs(t.parts) do
        local u, _ = rng:random(), rng:random()
        local gold = calc(q.a, q.op, q.b)
        assert.are.equal(gold, info.gold[k])
        assert.are.equal(u < SKILL[acts[k]][q.op], info.outputs[k] == gold)
        assert.are.equal(u < 0.5, info.defaults[k] == gold) -- the same luck, the default's skill
        all = all and info.outputs[k] == gold
      end
      assert.are.equal(all and 1 or 0, r3)
      assert.are.equal(all, info.success)
    end
  end)

  it("gives each part's marginal contribution: team reward minus the team's with its output defaulted", function()
    local tasks = router.tasks("train", 500, 8)
    local nonzero, background = 0, 0
    for i, t in ipairs(tasks) do
      local info = router.play(t, router.oracle(t, rl.rng(i)))
      local mc = router.marginal(info)
      local right = {}
      for k = 1, 3 do right[k] = info.outputs[k] == info.gold[k] end
      local team = (right[1] and right[2] and right[3]) and 1 or 0
      for k = 1, 3 do
        local others = true
        for j = 1, 3 do if j ~= k then others = others and right[j] end end
        local cf = (others and info.defaults[k] == info.gold[k]) and 1 or 0
        assert.are.equal(cf, router.counterfactual(info, k))
        assert.are.equal(team - cf, mc[k])
        if mc[k] ~= 0 then nonzero = nonzero + 1 end
        if not others then
          assert.are.equal(0, mc[k]) -- background-dependent: no credit while another part is wrong
          background = background + 1
        end
      end
    end
    assert.is_true(nonzero > 50 and background > 50)
  end)

  it("names the expert per operation and counts an unknown solver as no output", function()
    assert.are.same({ "ann", "bo", "cy" }, { router.expert("+"), router.expert("-"), router.expert("*") })
    local t = router.tasks("test", 1, 1)[1]
    local info = router.play(t, { "zed", "ann", "ann" })
    assert.is_nil(info.outputs[1])
    assert.are.equal("none", info.solvers[1])
    assert.is_false(info.success)
    H.assert_error(function() router.tasks("x", 1, 1) end, "split: \"train\" or \"test\" expected")
  end)
end)

local function recipe(name, dir, extra)
  return H.run(table.concat({ H.shell_quote(H.moonrl), "run", H.shell_quote(H.root .. "/recipes/" .. name .. ".lua"),
    "--smoke", extra or "", "--dir", H.shell_quote(dir) }, " "))
end

-- The final table of a run's output without its s/step column (a timing).
local function table_of(out, title)
  local at = out:find("\n" .. title .. ", seed 1;", 1, true)
  if not at then return nil end
  local lines = {}
  for line in out:sub(at + 1):gmatch("[^\n]+") do lines[#lines + 1] = (line:gsub("%s+[%d.]+$", "")) end
  return table.concat(lines, "\n")
end

describe("recipes/orchestra.lua", function()
  local dir = H.tmpdir()
  local out, code = recipe("orchestra", dir)
  teardown(function() H.sh("rm -rf " .. H.shell_quote(dir)) end)

  it("prints the GRPO row, the warm start and the scripted baselines, numbers in range", function()
    assert.are.equal(0, code, out)
    local tbl = table_of(out, "orchestra")
    assert.is_truthy(tbl, out)
    assert.matches("arm%s+acc%%%s+cost%s+reward%s+split%%%s+strong%%%s+tool%%%s+s/step", tbl)
    for _, arm in ipairs { "drgrpo", "grpo", "SFT", "always cheap", "always strong", "random", "best" } do
      local acc, cost, reward = tbl:match("\n" .. arm .. "%s+([%d.]+)%s+([%d.]+)%s+(%-?[%d.]+)")
      assert.is_truthy(acc, arm .. "\n" .. tbl)
      acc, cost, reward = tonumber(acc), tonumber(cost), tonumber(reward)
      assert.is_true(acc >= 0 and acc <= 100 and cost >= 0 and cost <= 24 and reward >= -0.5 and reward <= 1, arm)
    end
    assert.matches("\nalways strong%s+[%d.]+%s+10%.00%s", tbl)
    assert.matches("\nalways cheap%s+[%d.]+%s+1%.00%s", tbl)
  end)

  it("prints the same table for the same seed", function()
    local dir2 = H.tmpdir()
    local out2, code2 = recipe("orchestra", dir2)
    assert.are.equal(0, code2, out2)
    assert.are.equal(table_of(out, "orchestra"), table_of(out2, "orchestra"))
    H.sh("rm -rf " .. H.shell_quote(dir2))
  end)

  it("writes the orchestration trace: the logged episodes' turns, every dispatch after the turn that made it", function()
    local lines = H.read_json_lines(dir .. "/orchestra-drgrpo-s1/trace.jsonl")
    local eps = H.read_json_lines(dir .. "/orchestra-drgrpo-s1/episodes.jsonl")
    assert.are.equal(2 * 2, #lines) -- --trace 2 episodes a step, 2 steps
    assert.are.equal(#eps, #lines)  -- the same episodes as episodes.jsonl (the first of each group)
    for n, tr in ipairs(lines) do
      local ep, mine = eps[n], {}
      assert.are.same({ ep.step, ep.group, ep.task.text }, { tr.step, tr.group, tr.task.text })
      for _, turn in ipairs(tr.turns) do
        if turn.agent == "orchestrator" then mine[#mine + 1] = { turn.returned, turn.reward } end
      end
      local theirs = {}
      for k, r in ipairs(ep.record) do theirs[k] = { r.action, r.reward } end
      assert.are.same(theirs, mine)
      assert.is_near(ep.reward, tr.rewards.orchestrator, 1e-12)
      assert.is_number(tr.step)
      assert.is_table(tr.task)
      assert.is_number(tr.rewards.orchestrator)
      for i, turn in ipairs(tr.turns) do
        if turn.agent ~= "orchestrator" then
          local prev = tr.turns[i - 1]
          assert.are.equal("orchestrator", turn.called_by)
          assert.are.equal("orchestrator", prev.agent)
          local w, p = prev.returned:match("(%l+) (%l+)%s*$")
          assert.are.same({ w, p }, { turn.agent, turn.given:match("(%l+)$") })
          assert.are.equal(COST[w .. " " .. p], turn.cost)
        end
      end
    end
  end)

  it("refuses an unknown arm and a negative --trace", function()
    local bad = H.run(H.shell_quote(H.moonrl) .. " run " .. H.shell_quote(H.root .. "/recipes/orchestra.lua") .. " --arms ppo")
    assert.matches("unknown arm 'ppo'", bad)
    bad = H.run(H.shell_quote(H.moonrl) .. " run " .. H.shell_quote(H.root .. "/recipes/orchestra.lua") .. " --trace -1")
    assert.matches("%-%-trace: an integer >= 0", bad)
  end)
end)

describe("recipes/marginal.lua", function()
  local dir = H.tmpdir()
  local out, code = recipe("marginal", dir)
  teardown(function() H.sh("rm -rf " .. H.shell_quote(dir)) end)

  it("prints the three arms, the warm start and the scripted rows, with the exact evaluations per batch", function()
    assert.are.equal(0, code, out)
    local tbl = table_of(out, "marginal")
    assert.is_truthy(tbl, out)
    assert.matches("arm%s+team%%%s+part%%%s+expert%%%s+exact/b%s+s/step", tbl)
    for _, arm in ipairs { "wta", "mc", "mc_budget", "SFT", "random", "expert" } do
      local team, part, expert = tbl:match("\n" .. arm .. "%s+([%d.]+)%s+([%d.]+)%s+([%d.]+)")
      assert.is_truthy(team, arm .. "\n" .. tbl)
      for _, v in ipairs { team, part, expert } do assert.is_true(tonumber(v) >= 0 and tonumber(v) <= 100, arm) end
    end
    -- 4 problems x 4 episodes x 3 turns a batch: every turn exact, a quarter of them, none
    assert.matches("\nmc%s+[%d.]+%s+[%d.]+%s+[%d.]+%s+48", tbl)
    assert.matches("\nmc_budget%s+[%d.]+%s+[%d.]+%s+[%d.]+%s+12", tbl)
    assert.matches("\nwta%s+[%d.]+%s+[%d.]+%s+[%d.]+%s+0", tbl)
    assert.matches("\nexpert%s+[%d.]+%s+[%d.]+%s+100%.0", tbl)
  end)

  it("prints the same table for the same seed", function()
    local dir2 = H.tmpdir()
    local out2, code2 = recipe("marginal", dir2)
    assert.are.equal(0, code2, out2)
    assert.are.equal(table_of(out, "marginal"), table_of(out2, "marginal"))
    H.sh("rm -rf " .. H.shell_quote(dir2))
  end)

  it("refuses an unknown arm and a budget outside (0, 1]", function()
    local cmd = H.shell_quote(H.moonrl) .. " run " .. H.shell_quote(H.root .. "/recipes/marginal.lua")
    assert.matches("unknown arm 'coma'", (H.run(cmd .. " --arms wta,coma")))
    assert.matches("%-%-budget: a fraction in %(0, 1%]", (H.run(cmd .. " --budget 0")))
    assert.matches("%-%-budget: a fraction in %(0, 1%]", (H.run(cmd .. " --budget 1.5")))
  end)
end)
