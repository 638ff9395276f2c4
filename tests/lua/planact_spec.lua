-- planact_spec.lua - envs/planact.lua (the rules its header states: the planner's layout and
-- plan, the executor's view without doors, the 10 / 3 / 0 step rewards, the K + 1 budget, team
-- success as the planner's finish() reward, the split, the oracles) and a smoke run of
-- recipes/multi_agent.lua (it runs, logs and prints its table; not that it learns).
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"

package.path = H.root .. "/?.lua;" .. package.path
local pa = require "envs.planact"

-- Plays a plan and the executor's actions; returns what each was given, the step results, the
-- instance.
local function play(task, plan, actions)
  local inst = pa.new()
  inst:reset(task, rl.rng(1))
  local out = { given = {}, steps = {} }
  local agent, obs = inst:next(nil)
  out.given[1] = { agent, obs }
  local o, r, d = inst:step("planner", plan)
  out.steps[1] = { o, r, d }
  agent, obs = inst:next({ agent = "planner", turns = 1, ["end"] = "done" })
  out.given[2] = { agent, obs }
  for _, a in ipairs(actions) do
    o, r, d = inst:step("executor", a)
    out.steps[#out.steps + 1] = { o, r, d }
    if d then break end
  end
  out.after = { inst:next({ agent = "executor" }) }
  return out, inst
end

local function wrong_key(task, r)
  for _, k in ipairs(task.keys[r]) do if k ~= pa.opens[task.doors[r]] then return k end end
end

local function off_floor(task, r)
  for _, c in ipairs { "r", "g", "b", "y", "p", "o" } do
    local on = false
    for _, k in ipairs(task.keys[r]) do on = on or k == c end
    if not on then return c end
  end
end

describe("envs/planact.lua", function()
  local task = pa.gen({ rooms = 2 }, rl.rng(5))
  local right1, right2 = pa.opens[task.doors[1]], pa.opens[task.doors[2]]

  it("shows the planner the layout and the executor its room, keys and the plan's key, never a door", function()
    local out = play(task, pa.solve_plan(task), { "try " .. right1, "try " .. right2 })
    assert.are.same({ "planner", string.format("d:%s k:%s | d:%s k:%s", task.doors[1], table.concat(task.keys[1], " "),
      task.doors[2], table.concat(task.keys[2], " ")) }, out.given[1])
    assert.are.same({ "executor", string.format("r1/2 k:%s plan:%s", table.concat(task.keys[1], " "), right1) },
      out.given[2])
    assert.is_nil(out.given[2][2]:find("d:", 1, true))
    assert.are.same({ "ok", 0, true }, out.steps[1])
    assert.are.same({ string.format("open! r2/2 k:%s plan:%s", table.concat(task.keys[2], " "), right2), 10, false },
      out.steps[2])
    assert.are.same({ nil, 10, true }, out.steps[3])
    assert.are.same({}, out.after) -- the episode is over
  end)

  it("pays the planner team success and the executor 10 / 3 / 0 a try, within K + 1 tries", function()
    local _, inst = play(task, pa.solve_plan(task), { "try " .. right1, "try " .. right2 })
    assert.is_true(inst:success())
    assert.are.same({ planner = 1 }, inst:finish())
    -- a wrong key (3), then the right one (10), then a key not on the floor (0): budget spent
    local out, inst2 = play(task, pa.solve_plan(task), { "try " .. wrong_key(task, 1), "try " .. right1,
      "try " .. off_floor(task, 2), "try " .. right2 })
    assert.are.same({ 3, 10, 0 }, { out.steps[2][2], out.steps[3][2], out.steps[4][2] })
    assert.matches("^locked r1/2", out.steps[2][1])
    assert.is_true(out.steps[4][3])
    assert.are.equal(4, #out.steps) -- the fourth try never happened
    assert.is_false(inst2:success())
    assert.are.same({ planner = 0 }, inst2:finish())
  end)

  it("gives the executor plan:? for a plan that does not parse", function()
    for _, bad in ipairs { "plan g", "plan g b r", "plan gg b", "go g b", "" } do
      local out = play(task, bad, {})
      assert.matches("plan:%?$", out.given[2][2])
    end
    assert.are.same({ "g", "b" }, pa.parse_plan(" plan g b ", 2))
  end)

  it("keeps held-out layouts out of training, cycles K over 2 and 3, and is deterministic", function()
    local train, test = pa.tasks("train", 40, 1), pa.tasks("test", 40, 1)
    local seen = {}
    for i, t in ipairs(train) do
      assert.are.equal(i % 2 == 1 and 2 or 3, t.rooms)
      assert.is_false(require("envs.keychain").held_out(t.doors, t.keys))
      seen[rl.json.encode { t.doors, t.keys }] = true
    end
    for _, t in ipairs(test) do
      assert.is_true(require("envs.keychain").held_out(t.doors, t.keys))
      assert.is_nil(seen[rl.json.encode { t.doors, t.keys }])
    end
    assert.are.same(train, pa.tasks("train", 40, 1))
  end)

  it("has imperfect oracles: the planner right on known doors only, the executor following mostly", function()
    local tasks = pa.tasks("train", 400, 2)
    local rng = rl.rng(3)
    local known, known_right, other, other_right = 0, 0, 0, 0
    for _, t in ipairs(tasks) do
      local plan = pa.parse_plan(pa.oracles.planner(t, {}, rng), t.rooms)
      for r = 1, t.rooms do
        local ok = plan[r] == pa.opens[t.doors[r]]
        if pa.oracle_knows[t.doors[r]] then
          known, known_right = known + 1, known_right + (ok and 1 or 0)
        else
          other, other_right = other + 1, other_right + (ok and 1 or 0)
        end
      end
    end
    assert.are.equal(known, known_right)
    assert.is_true(math.abs(other_right / other - 1 / 3) < 0.06, tostring(other_right / other))
    -- the executor: the plan's key 0.75 + 0.25 / 3 of the time on a room's first try
    local follow, n = 0, 600
    for i = 1, n do
      local a = pa.oracles.executor(nil, { { given = "r1/2 k:b g o plan:g" } }, rng)
      follow = follow + (a == "try g" and 1 or 0)
      assert.matches("^try [bgo]$", a)
    end
    assert.is_true(math.abs(follow / n - (0.75 + 0.25 / 3)) < 0.06, tostring(follow / n))
    -- after "locked" it never repeats a key it tried in the room
    for _ = 1, 50 do
      local a = pa.oracles.executor(nil, { { given = "r1/2 k:b g o plan:g", returned = "try g" },
        { given = "locked r1/2 k:b g o plan:g", returned = "try b" }, { given = "locked r1/2 k:b g o plan:g" } }, rng)
      assert.are.equal("try o", a)
    end
  end)
end)

describe("recipes/multi_agent.lua", function()
  local function recipe(options)
    return H.run(table.concat({ H.shell_quote(H.moonrl), "run", H.shell_quote(H.root .. "/recipes/multi_agent.lua"),
      options }, " "))
  end

  it("runs a few steps of each arm, writes its trace and prints its table", function()
    local dir = H.tmpdir()
    local out, code = recipe("--steps 2 --tasks 2 --group 2 --sft-examples 16 --sft-epochs 1 --eval-tasks 4 "
      .. "--dim 16 --layers 1 --arms drmas,grpo,planner_only --dir " .. H.shell_quote(dir))
    assert.are.equal(0, code, out)
    assert.matches("measured: [%d.]+ s per RL step", out)
    assert.is_true(out:find("measured:", 1, true) < out:find("drmas ", 1, true))
    assert.matches("\narm +success +r_plan +r_exec +spk_plan +spk_exec +s/step\n", out)
    assert.matches("\ndrmas +[%d.]+ +[%d.]+ +[%d.]+ +[%d.]+ +[%d.]+ +[%d.]+\n", out)
    assert.matches("\ngrpo +[%d.]+ ", out)
    assert.matches("\nplanner_only +[%d.]+ +[%d.]+ +[%d.]+ +[%d.]+ +%- +[%d.]+\n", out)
    assert.matches("\nSFT +[%d.]+ ", out)
    local trace = H.read_json_lines(dir .. "/multi-drmas-s1/trace.jsonl")
    assert.are.equal(4, #trace) -- 2 a step
    assert.are.equal("planner", trace[1].turns[1].agent)
    assert.are.equal("executor", trace[1].turns[2].agent)
    local metrics = H.read_json_lines(dir .. "/multi-planner_only-s1/metrics.jsonl")
    assert.is_nil(metrics[#metrics]["loss/executor/updates"])
    assert.is_number(metrics[#metrics]["loss/planner/updates"])
    H.sh("rm -rf " .. H.shell_quote(dir))
    local bad, bcode = recipe("--arms drmas,nope")
    assert.are_not.equal(0, bcode)
    assert.matches("unknown arm 'nope'", bad)
  end)
end)
