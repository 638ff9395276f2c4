-- grid_spec.lua - envs/grid.lua (FrozenLake 6x6 with slips): the splits are disjoint and every map
-- is solvable, the cropped view by hand, moves, walls, holes and the goal, slips that follow the
-- episode's seed (and clone with it), the planner's distance by an independent search; and a
-- smoke run of recipes/grid.lua (its table, its arms, numbers in range, the same twice).
local rl = require "moonrl"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
package.path = H.root .. "/?.lua;" .. package.path
local env = require "envs.grid"

local function key(t) return table.concat(t.rows, "/") .. t.start[1] .. t.start[2] .. t.goal[1] .. t.goal[2] end

-- A map with no slips possible in the first turns: SLIP is patched per test where it matters.
local function fixed(rows, start, goal) return { rows = rows, start = start, goal = goal } end

describe("envs/grid", function()
  it("gives disjoint train and test maps, each solvable within 7 moves, start and goal 3-6 apart", function()
    local train = {}
    for _, t in ipairs(env.tasks("train", 300, 1)) do train[key(t)] = true end
    for _, t in ipairs(env.tasks("test", 100, 1)) do
      assert.is_nil(train[key(t)])
      local far = math.abs(t.start[1] - t.goal[1]) + math.abs(t.start[2] - t.goal[2])
      assert.is_true(far >= 3 and far <= 6)
      assert.is_true(env.distance(t, t.start[1], t.start[2]) <= 7)
    end
    assert.are.same(env.tasks("test", 5, 9), env.tasks("test", 5, 9))
  end)

  it("shows the 3x3 view (# off the map) and the goal's offset, and moves, bumps, falls and arrives", function()
    local t = fixed({ "......", ".H....", "......", "......", "......", "......" }, { 1, 1 }, { 3, 3 })
    local slip = env.SLIP
    env.SLIP = 0 -- no slips: the moves are the actions
    local inst = env.new()
    assert.are.equal("###/#@./#.H d2r2", inst:reset(t, rl.rng(1)))
    local obs, r, done = inst:step("u")            -- off the map: stays
    assert.are.equal("###/#@./#.H d2r2", obs)
    assert.are.same({ 0, false }, { r, done })
    obs = inst:step("r")
    assert.are.equal("###/.@./.H. d2r1", obs)
    local _, _, _, info = inst:step("xyz")         -- no direction: stays, marked invalid
    assert.is_true(info.invalid)
    local c = inst:clone()
    obs, r, done, info = inst:step("d")            -- into the hole
    assert.is_nil(obs)
    assert.are.same({ 0, true, true }, { r, done, info.hole })
    c:step("r"); c:step("d")
    obs, r, done, info = c:step("d")
    assert.are.same({ 1, true, true }, { r, done, info.success })
    env.SLIP = slip
  end)

  it("slips about a fifth of the moves, sideways, from the episode's seed; a clone slips the same", function()
    local t = fixed({ "......", "......", "......", "......", "......", "......" }, { 3, 3 }, { 6, 6 })
    local slips, n = 0, 0
    for s = 1, 400 do
      local a, b = env.new(), env.new()
      a:reset(t, rl.rng(s))
      b:reset(t, rl.rng(s))
      for turn = 1, 5 do
        local d = a:slipped("u", turn)
        assert.are.equal(d, b:slipped("u", turn))
        assert.is_true(d == "u" or d == "l" or d == "r")
        if d ~= "u" then slips = slips + 1 end
        n = n + 1
      end
      a:step("d")
      local c = a:clone()
      c:step("r"); a:step("r")
      assert.are.same(a.pos, c.pos)
    end
    assert.is_true(math.abs(slips / n - env.SLIP) < 0.03, tostring(slips / n))
  end)

  it("plans by shortest paths: distance agrees with an exhaustive search, the planner beats the demonstrator", function()
    local tasks = env.tasks("test", 40, 3)
    for _, t in ipairs(tasks) do
      -- Bellman-Ford style relaxation over all cells, written independently of env.distance
      local INF, d = 1e9, {}
      for r = 1, 6 do d[r] = {} for c = 1, 6 do d[r][c] = INF end end
      d[t.goal[1]][t.goal[2]] = 0
      for _ = 1, 36 do
        for r = 1, 6 do
          for c = 1, 6 do
            if t.rows[r]:sub(c, c) ~= "H" or (r == t.goal[1] and c == t.goal[2]) then
              for _, m in ipairs { { 1, 0 }, { -1, 0 }, { 0, 1 }, { 0, -1 } } do
                local nr, nc = r + m[1], c + m[2]
                if d[nr] and d[nr][nc] and d[nr][nc] + 1 < d[r][c] then d[r][c] = d[nr][nc] + 1 end
              end
            end
          end
        end
      end
      for r = 1, 6 do
        for c = 1, 6 do
          if t.rows[r]:sub(c, c) ~= "H" then
            local got = env.distance(t, r, c)
            assert.are.equal(d[r][c] == INF and math.huge or d[r][c], got)
          end
        end
      end
    end
    local plan, demo = 0, 0
    for i, t in ipairs(env.tasks("test", 200, 4)) do
      if env.play(t, env.plan_action, i).success then plan = plan + 1 end
      local rng = rl.rng(i)
      if env.play(t, function(tk, p) return env.demo_action(tk, p, rng) end, i).success then demo = demo + 1 end
    end
    assert.is_true(plan > demo + 20, plan .. " vs " .. demo)
  end)
end)

describe("recipes/grid.lua", function()
  local dir = H.tmpdir()
  local function smoke(extra)
    local out, code = H.run(string.format("cd %s && %s run recipes/grid.lua --smoke --dir %s%s",
      H.shell_quote(H.root), H.shell_quote(H.moonrl), H.shell_quote(dir), extra or ""))
    return out, code
  end

  it("--smoke prints the table with every arm, numbers in range, the same on a second run", function()
    local out, code = smoke()
    assert.are.equal(0, code, out)
    for _, label in ipairs { "SFT %(demonstrator walks%)", "SFT %+ GRPO", "SFT %+ GiGPO ", "SFT %+ GiGPO %+ T2PO turns", "SFT %+ AEM %(GRPO%)", "SFT %+ GRPO %+ TSR best%-of%-4", "demonstrator %(scripted%)",
      "planner %(ceiling%)" } do
      local line = out:match("\n(" .. label .. "[^\n]*)")
      assert.is_truthy(line, label .. " missing in:\n" .. out)
      local pct, turns = line:match("(%d+%.%d)%%%s+(%d+%.%d%d)")
      assert.is_truthy(pct, line)
      assert.is_true(tonumber(pct) >= 0 and tonumber(pct) <= 100)
      assert.is_true(tonumber(turns) >= 1 and tonumber(turns) <= env.max_turns)
    end
    local function table_of(text) return text:match("(seed 1:.-)\nseconds:") end
    assert.is_truthy(table_of(out), out)
    assert.are.equal(table_of(out), table_of((smoke())))
    assert.is_falsy(out:find("copies: held-out", 1, true)) -- no parallel table without a parallel arm
  end)

  it("--smoke --arms grpo,pgrpo,dpepo prints the parallel table, numbers in range, the same on a second run", function()
    local out, code = smoke(" --arms grpo,pgrpo,dpepo")
    assert.are.equal(0, code, out)
    local ptable = out:match("(seed 1, 3 copies:.-)\nseconds:")
    assert.is_truthy(ptable, out)
    local pct = "(%d+%.%d)%%"
    for _, label in ipairs { "SFT%-par %(parallel walks%)", "SFT%-par %+ parallel GRPO", "SFT%-par %+ DPEPO",
      "demonstrator x3", "planner x3" } do
      local line = ptable:match("\n(" .. label .. "[^\n]*)")
      assert.is_truthy(line, label .. " missing in:\n" .. ptable)
      local per, all, any, turns, red = line:match(pct .. "%s+" .. pct .. "%s+" .. pct .. "%s+(%d+%.%d%d)%s+" .. pct)
      assert.is_truthy(per, line)
      per, all, any, turns, red = tonumber(per), tonumber(all), tonumber(any), tonumber(turns), tonumber(red)
      -- every copy succeeding counts in the share per copy, which counts in "any copy"
      assert.is_true(all <= per + 0.05 and per <= any + 0.05, line)
      assert.is_true(any <= 100 and red >= 0 and red <= 100, line)
      assert.is_true(turns >= 1 and turns <= env.max_turns, line)
    end
    -- the sequential GRPO row is there with its success per copy only
    assert.is_truthy(ptable:match("\nSFT %+ GRPO%s+%d+%.%d%%%s+%-%s+%-%s+%d+%.%d%d%s+%-"), ptable)
    -- the planner in 3 copies reaches the goal in some copy of most maps, and its copies mostly agree
    local pany, pred = ptable:match("\nplanner x3%s+%S+%s+%S+%s+(%d+%.%d)%%%s+%S+%s+(%d+%.%d)%%")
    assert.is_true(tonumber(pany) > 50 and tonumber(pred) > 30, ptable)
    assert.is_truthy(out:match("seconds: SFT %d+ %b(); parallel SFT %d+ %b(); grpo .* pgrpo .* dpepo "), out)
    assert.are.equal(ptable, (smoke(" --arms grpo,pgrpo,dpepo")):match("(seed 1, 3 copies:.-)\nseconds:"))
  end)

  it("refuses an unknown arm", function()
    local out, code = smoke(" --arms grpo,nope")
    assert.are_not.equal(0, code)
    assert.matches("unknown arm 'nope'", out)
  end)
end)
