-- recipe_spec.lua - rl.recipe: command-line options checked against a recipe's defaults, runs
-- over seeds, and the mean ± spread of their tables (checked against hand-computed values).
local rl = require "moonrl"
local R = rl.recipe

describe("rl.recipe.args", function()
  local defaults = { seed = 1, seeds = 1, lr = 0.5, arms = "a,b", quick = false, horizon_arms = "x" }

  it("fills in the defaults and reads --name value, --name=value and flags", function()
    assert.are.same(defaults, R.args(nil, defaults))
    local o = R.args({ "--seeds", "3", "--lr=0.25", "--arms", "c", "--quick", "--horizon-arms", "y" }, defaults)
    assert.are.same({ seed = 1, seeds = 3, lr = 0.25, arms = "c", quick = true, horizon_arms = "y" }, o)
    assert.are.equal("integer", math.type(o.seeds))
    assert.is_false(R.args({ "--quick=false" }, defaults).quick)
  end)

  it("refuses unknown names, wrong types, missing values and bare words", function()
    local cases = {
      { { "--sedes", "2" }, "unknown option %-%-sedes %(did you mean %-%-seed" },
      { { "--zzzzzz", "2" }, "unknown option %-%-zzzzzz %(known: %-%-arms, " },
      { { "--seeds", "2.5" }, "%-%-seeds: an integer expected, got \"2.5\"" },
      { { "--lr", "fast" }, "%-%-lr: a number expected" },
      { { "--quick=maybe" }, "%-%-quick: true or false expected" },
      { { "--seeds" }, "%-%-seeds: a value expected" },
      { { "3" }, "\"3\": options are %-%-name value" },
    }
    for _, c in ipairs(cases) do
      local o, err = R.args(c[1], defaults)
      assert.is_nil(o)
      assert.matches(c[2], err)
    end
    assert.has_error(function() R.args({}, nil) end)
    assert.has_error(function() R.args({}, { f = function() end }) end)
  end)
end)

describe("rl.recipe over seeds", function()
  it("runs the body once per seed, in order", function()
    local seen = {}
    local out = R.over_seeds(4, 3, function(seed)
      seen[#seen + 1] = seed
      return seed * 10
    end)
    assert.are.same({ 4, 5, 6 }, seen)
    assert.are.same({ 40, 50, 60 }, out)
    assert.has_error(function() R.over_seeds(1, 0, function() end) end)
  end)

  it("gives the mean and the sample standard deviation", function()
    local mean, spread, n = R.mean_spread { 0.5, 0.7, 0.9 }
    assert.are.equal(3, n)
    assert.is_true(math.abs(mean - 0.7) < 1e-12)
    assert.is_true(math.abs(spread - 0.2) < 1e-12) -- sqrt((0.04 + 0 + 0.04) / 2)
    local m1, s1 = R.mean_spread { 0.25 }
    assert.are.same({ 0.25, 0 }, { m1, s1 })
    local m0, _, n0 = R.mean_spread {}
    assert.are.same({ nil, 0 }, { m0, n0 })
  end)

  it("summarises rows by key across seeds and prints mean ± spread", function()
    local runs = {
      { { arm = "a", k2 = 0.5, note = "x" }, { arm = "b", k2 = 0.1 } },
      { { arm = "a", k2 = 0.7, note = "y" }, { arm = "b", k2 = 0.3 } },
      { { arm = "a", k2 = 0.9 }, { arm = "c", k2 = 1 } },
    }
    local rows = R.summarise(runs, "arm")
    assert.are.same({ "a", "b", "c" }, { rows[1].arm, rows[2].arm, rows[3].arm })
    assert.are.equal("x", rows[1].note)
    assert.are.equal(3, rows[1].k2.n)
    assert.are.equal("70.0 ± 20.0", R.pm(rows[1].k2))
    assert.are.equal(2, rows[2].k2.n)
    assert.are.equal("100.0", R.pm(rows[3].k2)) -- one seed: the value alone
    assert.are.equal("12.5", R.pm(0.125))
    assert.are.equal("-", R.pm(nil))
    assert.are.equal("1.50 ± 0.50", R.pm({ mean = 1.5, spread = 0.5, n = 2 }, 1, "%.2f"))
  end)

  it("reports each seed's table, then the one over all seeds", function()
    local printed = {}
    local function print_table(runs, title) printed[#printed + 1] = { title = title, n = #runs } end
    local runs = R.report(3, 2, function(seed) return { { arm = "a", v = seed } } end, print_table)
    assert.are.same({ { { arm = "a", v = 3 } }, { { arm = "a", v = 4 } } }, runs)
    assert.are.same({ { title = "seed 3", n = 1 }, { title = "seed 4", n = 1 },
      { title = "seeds 3-4 (mean ± spread over 2)", n = 2 } }, printed)
    printed = {}
    R.report(5, 1, function(seed) return { { v = seed } } end, print_table)
    assert.are.same({ { title = "seed 5", n = 1 } }, printed) -- one seed: its table once
    assert.has_error(function() R.report(1, 0, function() end, print_table) end,
      "rl.recipe.report: n: a positive integer expected")
    assert.has_error(function() R.report(1, 1, nil, print_table) end,
      "rl.recipe.report: run: a function(seed) -> rows expected")
  end)
end)
