-- recipe_spec.lua - rl.recipe: command-line options checked against a recipe's defaults, runs
-- over seeds, the mean ± spread of their tables (checked against hand-computed values), and the
-- shared SFT start (against doing it by hand).
local rl = require "moonrl"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
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

describe("rl.recipe.warm_start", function()
  local function setup()
    local tok = rl.tokenizer.bytes()
    local data = {}
    for i = 1, 12 do
      local ids = tok:encode("ab" .. string.char(97 + i % 5) .. "cd")
      local mask = {}
      for k = 1, #ids do mask[k] = k > 2 and 1 or 0 end
      data[i] = { tokens = ids, mask = mask }
    end
    return rl.model.new { vocab = 264, dim = 16, layers = 1, heads = 2, ffn = 32, ctx = 16, seed = 5 }, data
  end
  local function bytes(path)
    local f = assert(io.open(path, "rb"))
    local s = f:read("a")
    f:close()
    return s
  end

  it("saves the SFT'd weights with a fresh optimizer, as doing it by hand does", function()
    local dir = H.tmpdir()
    local m, data = setup()
    local r = R.warm_start { model = m, data = data, epochs = 2, path = dir .. "/sub/start.bin", seed = 9 }
    assert.is_number(r.final_loss)
    local by_hand, same = setup()
    local r2 = rl.sft { model = by_hand, data = same, epochs = 2, batch_size = 16, lr = 3e-3, warmup = 10, seed = 9 }
    by_hand:reset_optimizer()
    assert(by_hand:save_checkpoint(dir .. "/by_hand.bin"))
    assert.are.equal(r2.final_loss, r.final_loss)
    assert.is_true(bytes(dir .. "/sub/start.bin") == bytes(dir .. "/by_hand.bin"))
    os.execute("rm -rf " .. H.shell_quote(dir))
  end)

  it("refuses unknown options and says why a checkpoint could not be written", function()
    local m, data = setup()
    H.assert_error(function() R.warm_start { model = m, data = data, path = "x.bin", epoch = 1 } end,
      { "rl.recipe.warm_start: unknown option 'epoch'" })
    H.assert_error(function() R.warm_start { model = m, data = data } end, { "path: a file name expected" })
    local file = H.write_temp("not a folder")
    H.assert_error(function() R.warm_start { model = m, data = data, epochs = 1, path = file .. "/start.bin" } end,
      { "rl.recipe.warm_start: " })
    os.remove(file)
  end)
end)

describe("rl.recipe.oracle_start", function()
  -- one turn: the oracle answers "ab", anything pays 0
  local env = { name = "one", max_turns = 1,
    tasks = function(_, n) local t = {} for i = 1, n do t[i] = { i = i } end return t end,
    oracle = function() return { "ab" } end,
    new = function() return { reset = function() return "go" end, step = function() return nil, 0, true end } end }
  local function new_model(seed)
    return rl.model.new { vocab = 264, dim = 16, layers = 1, heads = 2, ffn = 32, ctx = 16, seed = seed }, rl.tokenizer.bytes()
  end
  local function bytes(path)
    local f = assert(io.open(path, "rb"))
    local s = f:read("a")
    f:close()
    return s
  end

  it("is warm_start on the oracle's examples, and with reuse loads what it wrote", function()
    local dir = H.tmpdir()
    local path, info = R.oracle_start { env = env, path = dir .. "/s.bin", new_model = new_model, seed = 3,
      examples = 6, epochs = 1 }
    assert.are.equal(dir .. "/s.bin", path)
    assert.are.equal(6, info.examples)
    -- by hand: the same examples and seeds
    local m, tok = new_model(3)
    local data = rl.train.oracle_examples({ cfg = { env = env, max_turns = 1 }, tokenizer = tok }, 6, rl.train.mix(3, 0x5EA))
    local r = R.warm_start { model = m, data = data, epochs = 1, path = dir .. "/hand.bin", seed = rl.train.mix(3, 0x5F7) }
    assert.are.equal(r.final_loss, info.loss)
    assert.is_true(bytes(dir .. "/s.bin") == bytes(dir .. "/hand.bin"))
    local called = false
    local p2, again = R.oracle_start { env = env, path = dir .. "/s.bin", reuse = true, seed = 3, examples = 6, epochs = 1,
      new_model = function(seed) called = true return new_model(seed) end }
    assert.are.equal(path, p2)
    assert.are.equal(0, again.examples)
    assert.is_false(called)
    os.execute("rm -rf " .. H.shell_quote(dir))
  end)

  it("refuses unknown and missing options", function()
    H.assert_error(function() R.oracle_start { env = env, path = "x.bin", new_model = new_model, seed = 1, examples = 2, epoch = 1 } end,
      { "rl.recipe.oracle_start: unknown option 'epoch'" })
    H.assert_error(function() R.oracle_start { env = env, new_model = new_model, seed = 1, examples = 2 } end, { "path: a file name expected" })
    H.assert_error(function() R.oracle_start { env = env, path = "x.bin", new_model = new_model, seed = 1, examples = 0 } end,
      { "examples: a positive integer expected" })
    H.assert_error(function() R.oracle_start { env = env, path = "x.bin", seed = 1, examples = 2 } end, { "new_model:" })
  end)
end)

describe("rl.recipe.spread_table", function()
  it("lays out a header and each row's mean ± sample sd over the runs", function()
    local runs = { { a = { x = 0.5, y = 2 } }, { a = { x = 0.7, y = 4 } }, { a = { x = 0.9, y = 6 } } }
    local lines = R.spread_table { runs = runs, rows = { { key = "a", label = "arm a" } }, headers = { "x%", "y" },
      label_width = 6, cell_width = 12, value = function(run, row, k)
        local v = run[row.key]
        return k == 1 and 100 * v.x or v.y
      end, fmt = function(k) return k == 1 and "%.1f" or "%.2f" end }
    assert.are.same({ "policy           x%            y", "arm a  70.0 ± 20.0 4.00 ± 2.00" }, lines) -- (widths in bytes, as string.format pads)
    local one = R.spread_table { runs = { runs[1] }, rows = { { key = "a", label = "a" } }, headers = { "y" },
      value = function(run) return run.a.y end }
    assert.are.same("a" .. string.rep(" ", 27) .. "2.00", one[2]) -- one seed: the value alone
    H.assert_error(function() R.spread_table { runs = runs, rows = {} } end, { "rl.recipe.spread_table:" })
  end)
end)

describe("rl.recipe.announced_start", function()
  local function capture(fn)
    local lines, saved = {}, _G.print
    _G.print = function(...) lines[#lines + 1] = table.concat({ ... }, "\t") end
    local ok, a, b = pcall(fn)
    _G.print = saved
    assert(ok, a)
    return lines, a, b
  end

  it("prints the start, runs it for the seed, and prints what it trained or reused", function()
    local seen
    local lines, path, sft = capture(function()
      return R.announced_start(7, function(seed)
        seen = seed
        return "/x/start.bin", { examples = 120, loss = 0.12345, seconds = 41.6 }
      end, 3)
    end)
    assert.are.equal(7, seen)
    assert.are.equal("/x/start.bin", path)
    assert.are.equal(120, sft.examples)
    assert.are.same({ "seed 7: SFT warm start ...", "  SFT: 120 examples x 3 epochs, final loss 0.123, 42 s" }, lines)
    lines = capture(function()
      return R.announced_start(2, function() return "/x/old.bin", { examples = 0 } end, 3)
    end)
    assert.are.same({ "seed 2: SFT warm start ...", "  SFT: reused /x/old.bin" }, lines)
  end)

  it("arms_of_seed: the start once, each arm on its path, the arms' rows then their start rows", function()
    local calls = {}
    local lines, rows = capture(function()
      return R.arms_of_seed(4, function(seed)
        calls[#calls + 1] = "start " .. seed
        return "/x/s4.bin", { examples = 5, loss = 1, seconds = 2 }
      end, 2, { "a", "b", "c" }, function(seed, path, arm)
        calls[#calls + 1] = arm .. " " .. seed .. " " .. path
        return { arm = arm }, arm ~= "b" and { arm = arm .. "@0" } or nil
      end)
    end)
    assert.are.same({ "start 4", "a 4 /x/s4.bin", "b 4 /x/s4.bin", "c 4 /x/s4.bin" }, calls)
    assert.are.same({ { arm = "a" }, { arm = "b" }, { arm = "c" }, { arm = "a@0" }, { arm = "c@0" } }, rows)
    assert.are.equal("seed 4: SFT warm start ...", lines[1])
    assert.matches("^seed 4: %d+ s$", lines[#lines])
    local start = function() return "/x", { examples = 0 } end
    H.assert_error(function() R.arms_of_seed(1, start, 1, {}, function() end) end, "arms: a list of arm names")
    H.assert_error(function() R.arms_of_seed(1, start, 1, { "a" }, nil) end, "run_arm: a function")
    capture(function()
      H.assert_error(function() R.arms_of_seed(1, start, 1, { "a" }, function() end) end, "no row for arm a")
    end)
  end)

  it("names a bad argument and a start that returns the wrong things", function()
    H.assert_error(function() R.announced_start(1.5, function() end, 1) end, "seed: an integer")
    H.assert_error(function() R.announced_start(1, "start", 1) end, "start: a function")
    H.assert_error(function() R.announced_start(1, function() end, nil) end, "epochs: an integer")
    capture(function()
      H.assert_error(function() R.announced_start(1, function() return nil end, 1) end, "must return a path")
    end)
  end)
end)
