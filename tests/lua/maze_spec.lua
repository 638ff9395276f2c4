-- maze_spec.lua - envs/maze.lua: the rules its header states (corridors, rooms, junctions, dead
-- ends, the exit), the task kinds and their sizes, splits that never share a task, the perfect
-- walk and the oracle's coin at junctions; and a smoke run of recipes/gate.lua, which uses it.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"

local maze = dofile(H.root .. "/envs/maze.lua")

-- Replays actions; returns the records (observation, reward, done, info per turn).
local function replay(task, actions)
  local inst, record = maze.new(), {}
  inst:reset(task, rl.rng(1))
  for _, a in ipairs(actions) do
    local _, _, done = rl.env.step(maze, inst, a, record)
    if done then break end
  end
  return record
end

local function junctions(t)
  local n = 0
  for _, c in ipairs(t.cells) do if #c == 2 then n = n + 1 end end
  return n
end

describe("envs/maze.lua", function()
  it("walks corridors, rooms, junctions and dead ends as its header says", function()
    local t = { kind = "mixed", cells = { "r", "*", "Ul", "dR" } }
    local rec = replay(t, { "u", "r", "l", "d", "b", "u", "d", "b", "r" })
    local obs = {}
    for i, r in ipairs(rec) do obs[i] = r.observation end
    -- u bumps the corridor r; r leads on; the room takes l; d and b bump the junction; u is its
    -- way on; d is the next junction's dead end, b walks back; r leaves the maze
    assert.are.same({ "r", "*", "Ul", "Ul", "Ul", "dR", "x", "dR", nil }, obs)
    assert.is_true(rec[1].info.invalid)
    assert.is_nil(rec[2].info.invalid)
    assert.are.equal(9, #rec)
    assert.is_true(rec[9].done)
    assert.are.equal(1, rec[9].reward)
    assert.is_true(rec[9].info.success)
    for i = 1, 8 do assert.are.equal(0, rec[i].reward) end
    -- a junction's small letter is its dead end (both spellings)
    assert.are.same({ "u", "l" }, { maze.junction("Ul") })
    assert.are.same({ "r", "d" }, { maze.junction("dR") })
    assert.is_nil(maze.junction("r"))
  end)

  it("draws trivial, impossible and mixed tasks of the sizes stated, in proportions 2 : 1 : 5", function()
    local count = { trivial = 0, impossible = 0, mixed = 0 }
    local tasks = maze.tasks("train", 800, 3)
    for _, t in ipairs(tasks) do
      count[t.kind] = count[t.kind] + 1
      local n, j = #t.cells, junctions(t)
      if t.kind == "trivial" then
        assert.is_true(n >= 3 and n <= 6 and j == 0)
      elseif t.kind == "impossible" then
        assert.is_true(n >= 26 and n <= 30 and n > maze.max_turns and j == 0)
      else
        assert.is_true(j >= 2 and j <= 4)
        local slack = maze.max_turns - n
        assert.is_true(slack >= 0 and slack <= 2 * j + 2 and slack % 2 == 0, "slack " .. slack)
      end
    end
    assert.is_true(math.abs(count.trivial / 800 - 2 / 8) < 0.05, count.trivial)
    assert.is_true(math.abs(count.impossible / 800 - 1 / 8) < 0.04, count.impossible)
    assert.is_true(math.abs(count.mixed / 800 - 5 / 8) < 0.05, count.mixed)
    -- the same seed gives the same tasks
    assert.are.same(maze.tasks("train", 20, 9), maze.tasks("train", 20, 9))
  end)

  it("keeps the held-out split apart from the training split", function()
    local train = {}
    for _, t in ipairs(maze.tasks("train", 3000, 1)) do train[table.concat(t.cells, " ")] = true end
    local test = maze.tasks("test", 500, 2)
    assert.are.equal(500, #test)
    for _, t in ipairs(test) do assert.is_nil(train[table.concat(t.cells, " ")]) end
  end)

  it("solve wins every possible task without a dead end; the oracle's coin makes mixed tasks mixed", function()
    local rng = rl.rng(5)
    local oracle_won = { trivial = 0, impossible = 0, mixed = 0 }
    local count = { trivial = 0, impossible = 0, mixed = 0 }
    for _, t in ipairs(maze.tasks("train", 400, 4)) do
      count[t.kind] = count[t.kind] + 1
      local rec = replay(t, maze.solve(t, rng))
      assert.are.equal(t.kind ~= "impossible", rec[#rec].reward == 1)
      for _, r in ipairs(rec) do assert.are_not.equal("x", r.observation) end
      if t.kind ~= "impossible" then assert.are.equal(#t.cells, #rec) end
      local o = replay(t, maze.oracle(t, rng))
      for _, r in ipairs(o) do assert.is_nil(r.info.invalid) end -- the oracle never bumps a wall
      if o[#o].reward == 1 then oracle_won[t.kind] = oracle_won[t.kind] + 1 end
    end
    assert.are.equal(count.trivial, oracle_won.trivial)
    assert.are.equal(0, oracle_won.impossible)
    local p = oracle_won.mixed / count.mixed
    assert.is_true(p > 0.35 and p < 0.8, "the oracle wins mixed tasks " .. p)
  end)
end)

describe("recipes/gate.lua --tiny", function()
  it("runs its three arms, logs the gate's counts and prints its table", function()
    local dir = H.tmpdir()
    local out, code = H.sh(string.format("cd %s && %s run recipes/gate.lua --tiny --dir %s",
      H.shell_quote(H.root), H.shell_quote(H.moonrl), H.shell_quote(dir)))
    assert.are.equal(0, code, out)
    assert.matches("arm%s+train s%s+rollout%s+update", out)
    for _, arm in ipairs { "grpo", "gate", "dapo" } do
      assert.matches("\n" .. arm .. " +%d+%.%d", out)
      assert.matches("held%-out " .. arm, out)
    end
    assert.matches("gate offline over grpo's 6 groups", out)
    local gated = H.read_json_lines(dir .. "/gate-gate-1/metrics.jsonl")
    assert.are.equal(3, #gated) -- step 0 and two steps
    for s = 2, 3 do
      assert.are.equal(3, gated[s]["gate/groups"])
      assert.is_number(gated[s]["gate/cut_rate"])
      assert.is_number(gated[s]["time/rollout"])
    end
    local plain = H.read_json_lines(dir .. "/gate-grpo-1/metrics.jsonl")
    assert.is_nil(plain[2]["gate/groups"])
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)
end)
