-- act_spec.lua - smoke runs of recipes/act.lua (ACT in miniature on the keychain): it prints its
-- five pipelines with the ACT rows' pair accuracy, the same table twice for the same seed, its
-- judging episodes pair the door's opening key (the keychain's hidden table) with another key on
-- the floor and reward exactly the reply that names it, and it refuses bad options. Not that ACT
-- helps (the README's table is the measurement).
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local keychain = dofile(H.root .. "/envs/keychain.lua")

local SMALL = "--demos 6 --il-epochs 2 --act-steps 2 --rl-steps 1 --tasks 2 --group 4 --eval-tasks 4"

local function run(dir, extra)
  return H.run(table.concat({ H.shell_quote(H.moonrl), "run", H.shell_quote(H.root .. "/recipes/act.lua"),
    SMALL, extra or "", "--dir", H.shell_quote(dir) }, " "))
end

local function table_of(out)
  local at = out:find("\nACT on keychain K=2, 6 demonstrations, seed 1", 1, true)
  return at and out:sub(at) or nil
end

describe("recipes/act.lua", function()
  local dir = H.tmpdir()
  local out, code = run(dir)

  it("prints the five pipelines, the ACT ones with their pair accuracy", function()
    assert.are.equal(0, code, out)
    local tbl = table_of(out)
    assert.is_truthy(tbl, out)
    assert.matches("pipeline%s+held%-out %%%s+pairs %%%s+s\n", tbl)
    for _, p in ipairs { "IL", "IL%+", "IL>RL" } do
      assert.matches("\n" .. p .. "%s+[%d.]+%s+%-%s+%d+", tbl)
    end
    for _, p in ipairs { "ACT>IL", "ACT>IL>RL" } do
      assert.matches("\n" .. p .. "%s+[%d.]+%s+[%d.]+%s+%d+", tbl)
    end
    assert.matches("ACT pair accuracy on held%-out layouts: [%d.]+%% after the format warm%-up, [%d.]+%% after ACT", out)
  end)

  it("prints the same table for the same seed", function()
    local dir2 = H.tmpdir()
    local out2, code2 = run(dir2)
    assert.are.equal(0, code2, out2)
    -- the seconds column differs between runs; the rest does not
    local function strip(t) return (t:gsub("%s+%d+\n", "\n")) end
    assert.are.equal(strip(table_of(out)), strip(table_of(out2)))
    H.sh("rm -rf " .. H.shell_quote(dir2))
  end)

  it("pairs the opening key with another key on the floor and rewards exactly the reply naming it", function()
    local eps = H.read_json_lines(dir .. "/act-act-s1/episodes.jsonl")
    assert.is_true(#eps > 0)
    for _, ep in ipairs(eps) do
      local t = ep.task
      local door = t.obs:match("d:(%a)")
      local floor = t.obs:match("k:([%a ]+)$")
      assert.is_truthy(door, t.obs)
      local right = keychain.opens[door]
      local named = t.answer == "A" and t.a or t.b
      local other = t.answer == "A" and t.b or t.a
      assert.are.equal(right, named, t.obs)
      assert.are_not.equal(right, other)
      assert.is_truthy(floor:find(other, 1, true), t.obs)
      local action = ep.record[1].action
      assert.are.equal(action == t.answer and 1 or 0, ep.reward)
    end
  end)

  it("refuses an unknown option and a bad value, naming them", function()
    local bad = H.run(table.concat({ H.shell_quote(H.moonrl), "run", H.shell_quote(H.root .. "/recipes/act.lua"),
      "--act-step 3" }, " "))
    assert.matches("unknown option %-%-act_step %(did you mean %-%-act_steps%?%)", bad)
    bad = H.run(table.concat({ H.shell_quote(H.moonrl), "run", H.shell_quote(H.root .. "/recipes/act.lua"),
      "--rooms 9" }, " "))
    assert.matches("%-%-rooms: at most 6", bad)
  end)

  teardown(function() H.sh("rm -rf " .. H.shell_quote(dir)) end)
end)
