-- evolve_spec.lua - envs/evolve.lua (the implementer's rules, the reward against the engine's
-- PACEvolve++ shaping, the splits, the greedy and imperfect advisors), the phase-adaptive
-- estimator recipes/pacevolve.lua uses against a direct enumeration of best-of-k subsets, and
-- smoke runs of the recipe (its table, its arms, numbers in range, the same table twice).
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"

local E = dofile(H.root .. "/envs/evolve.lua")

local function play(task, action)
  local inst, record = E.new(), {}
  local first = inst:reset(task, rl.rng(1))
  rl.env.step(E, inst, action, record)
  return record[1], first
end

local problem = { id = "x", c = { 10, 20, 30, 40 }, x0 = { 0, 20, 50, 40 } }
problem.y0 = E.score(problem, problem.x0)

describe("envs/evolve.lua", function()
  it("scores 400 minus the L1 distance from the peak and applies inc, dec and swap to the current best", function()
    assert.are.equal(400 - 10 - 20, problem.y0)
    assert.are.equal(400, E.score(problem, problem.c))
    local x = { 5, 20, 50, 40 }
    local rec, first = play({ problem = problem, x = x }, "inc p1 3")
    assert.are.equal("x 5 20 50 40", first)
    assert.is_true(rec.done)
    assert.are.same({ 8, 20, 50, 40 }, rec.info.x)
    assert.are.same({ 5, 20, 50, 40 }, x) -- the current best is not changed in place
    assert.are.equal(400 - 2 - 20, rec.info.y)
    assert.is_true(rec.info.success)
    assert.are.same({ 5, 20, 41, 40 }, play({ problem = problem, x = x }, "dec p3 9").info.x)
    assert.are.same({ 50, 20, 5, 40 }, play({ problem = problem, x = x }, "swap p1 p3").info.x)
    rec = play({ problem = problem, x = x }, "dec p2 1")
    assert.is_false(rec.info.success) -- worse than the current best
    assert.are.equal(#E.hypotheses(), 4 * 9 * 2 + 6)
    assert.is_true(#E.observe { 99, 99, 99, 99 } <= 24)
  end)

  it("pays 5 clip(progress) as the engine's PACEvolve++ shaping does, and -1 for invalid or failing hypotheses", function()
    local xs = { { 5, 20, 50, 40 }, { 0, 20, 50, 40 }, { 0, 30, 50, 40 }, { 10, 20, 30, 40 }, { 9, 20, 30, 40 } }
    local moves = { "inc p1 3", "dec p2 1", "inc p2 1", "dec p3 9", "inc p1 1" }
    local ys, rewards = {}, {}
    for i, x in ipairs(xs) do
      local rec = play({ problem = problem, x = x }, moves[i])
      ys[i], rewards[i] = rec.info.y, rec.reward
      local p = (rec.info.y - problem.y0) / (400 - problem.y0)
      assert.is_true(math.abs(rec.info.progress - p) < 1e-12)
      assert.is_true(math.abs(rec.reward - 5 * math.min(1, math.max(0, p))) < 1e-12)
    end
    local shaped = rl.advantage.pace_shape_reward({ y = ys }, { y_init = problem.y0, y_target = 400 }).reward
    for i = 1, #ys do assert.is_true(math.abs(shaped[i] - rewards[i]) < 1e-9, i) end
    for _, bad in ipairs { "inc p5 1", "inc p1 0", "inc p1 10", "swap p2 p2", "swap p1", "hello", "" } do
      local rec = play({ problem = problem, x = { 5, 20, 50, 40 } }, bad)
      assert.are.equal(-1, rec.reward, bad)
      assert.are.equal("invalid", rec.info.why, bad)
      assert.is_nil(rec.info.x)
    end
    for _, fail in ipairs { { "dec p1 6", { 5, 20, 50, 40 } }, { "inc p4 2", { 5, 20, 50, 98 } } } do
      local rec = play({ problem = problem, x = fail[2] }, fail[1])
      assert.are.equal(-1, rec.reward)
      assert.are.equal("failed", rec.info.why)
      assert.is_true(rec.info.failed)
    end
  end)

  it("holds out problems by their peak, draws them deterministically and far from the peak", function()
    local train = {}
    for _, p in ipairs(E.problems("train", 300, 1)) do
      train[table.concat(p.c, ",")] = true
      assert.is_false(E.held_out(p.c))
      local d = 400 - p.y0
      assert.is_true(d >= 160 and d <= 240, d)
      assert.are.equal(p.y0, E.score(p, p.x0))
    end
    for _, p in ipairs(E.problems("test", 100, 2)) do
      assert.is_true(E.held_out(p.c))
      assert.is_nil(train[table.concat(p.c, ",")])
    end
    assert.are.same(E.problems("test", 4, 7), E.problems("test", 4, 7))
    assert.are.same(E.tasks("train", 4, 7), E.tasks("train", 4, 7))
    assert.are_not.same(E.problems("test", 4, 7), E.problems("test", 4, 8))
  end)

  it("has a greedy advisor that takes the best hypothesis and an imperfect demonstrator", function()
    local tasks = E.tasks("train", 200, 3)
    local greedy_share = 0
    for i, t in ipairs(tasks) do
      local g = E.greedy(t.problem, t.x)
      local gy = E.score(t.problem, assert(E.apply(t.x, g)))
      for _, h in ipairs(E.hypotheses()) do
        local nx = E.apply(t.x, h)
        if nx then assert.is_true(E.score(t.problem, nx) <= gy) end
      end
      local a = E.oracle(t, rl.rng(i))[1]
      assert.is_truthy(E.apply(t.x, a), a) -- the demonstrator's hypotheses always evaluate
      if a == g then greedy_share = greedy_share + 1 end
    end
    greedy_share = greedy_share / #tasks
    assert.is_true(greedy_share > 0.2 and greedy_share < 0.45, greedy_share)
  end)
end)

-- C(n, k) subsets of 1..n, as lists.
local function subsets(n, k)
  local out, cur = {}, {}
  local function rec(start)
    if #cur == k then out[#out + 1] = table.move(cur, 1, k, 1, {}) return end
    for i = start, n do
      cur[#cur + 1] = i
      rec(i + 1)
      cur[#cur] = nil
    end
  end
  rec(1)
  return out
end

local function z(v)
  local n, mean, sq = #v, 0, 0
  for _, x in ipairs(v) do mean = mean + x / n end
  for _, x in ipairs(v) do sq = sq + (x - mean) ^ 2 / n end
  local sd, out = math.sqrt(sq), {}
  for i, x in ipairs(v) do out[i] = sd == 0 and 0 or (x - mean) / (sd + 1e-8) end
  return out
end

describe("the phase-adaptive estimator recipes/pacevolve.lua uses", function()
  it("equals (1 - a) z(r - mean) + a z(SLOO best-of-k credit) enumerated over every subset, a = s / (T - 1)", function()
    local r = { 3.2, -1, 4.1, 4.1, 0.5, -1, 2.0, 4.4 }
    local n, k = #r, 4
    local credit = {}
    for i = 1, n do credit[i] = 0 end
    local all = subsets(n, k)
    for _, S in ipairs(all) do
      for _, i in ipairs(S) do
        local with, without = -math.huge, -math.huge
        for _, j in ipairs(S) do
          with = math.max(with, r[j])
          if j ~= i then without = math.max(without, r[j]) end
        end
        credit[i] = credit[i] + (with - without) / #all
      end
    end
    local mean = 0
    for _, x in ipairs(r) do mean = mean + x / n end
    local centred = {}
    for i, x in ipairs(r) do centred[i] = x - mean end
    local zg, zk = z(centred), z(credit)
    for _, case in ipairs { { step = 0, T = 40 }, { step = 13, T = 40 }, { step = 39, T = 40 } } do
      local a = case.step / (case.T - 1)
      local out = rl.advantage.pacevolve_pp({ rewards = r, step = case.step }, { k = k, total_steps = case.T })
      assert.is_false(out.skip)
      assert.is_true(math.abs(out.alpha - a) < 1e-12)
      for i = 1, n do
        assert.is_true(math.abs(out.a_topk[i] - credit[i]) < 1e-9, i)
        assert.is_true(math.abs(out.advantages[i] - ((1 - a) * zg[i] + a * zk[i])) < 1e-6, i)
      end
    end
    -- the two ties at 4.1 earn no frontier credit where they tie for the best
    assert.is_true(credit[8] > credit[3])
    -- all rewards equal: the update is skipped
    assert.is_true(rl.advantage.pacevolve_pp({ rewards = { 1, 1, 1, 1, 1, 1, 1, 1 }, step = 0 },
      { k = 4, total_steps = 40 }).skip)
  end)
end)

describe("recipes/pacevolve.lua", function()
  local function run(options, dir)
    return H.run(table.concat({ H.shell_quote(H.moonrl), "run", H.shell_quote(H.root .. "/recipes/pacevolve.lua"),
      options, "--dir", H.shell_quote(dir) }, " "))
  end

  it("runs the four arms on a tiny budget, prints its table and prints it the same twice", function()
    local dir = H.tmpdir()
    local out, code = run("--smoke", dir)
    assert.are.equal(0, code, out)
    assert.matches("%(measured: [%d.]+ s per generation", out)
    assert.matches("\narm +best@4 +to90%% +to_peak +peaks +failed%% +s/gen\n", out)
    local tables = {}
    for _, arm in ipairs { "frozen", "group", "frontier", "phase", "uniform", "greedy" } do
      local best, to90, topeak, peaks, failed = out:match("\n" .. arm .. " +([%d.]+) +([%d.]+) +([%d.]+) +(%d+) +([%d.]+) ")
      assert.is_truthy(best, arm)
      best, to90, topeak, peaks, failed = tonumber(best), tonumber(to90), tonumber(topeak), tonumber(peaks), tonumber(failed)
      assert.is_true(best >= 0 and best <= 100 and failed >= 0 and failed <= 100)
      assert.is_true(to90 >= 1 and to90 <= 5 and topeak >= to90 and topeak <= 5)
      assert.is_true(peaks >= 0 and peaks <= 2)
    end
    tables[1] = out:match("\n(evolve, seed 1.-)\n%(best@g")
    local lines = H.read_json_lines(dir .. "/evolve-phase-p1-s1/metrics.jsonl")
    assert.are.equal(5, #lines) -- step 0 and four generations
    local out2, code2 = run("--smoke", dir)
    assert.are.equal(0, code2, out2)
    tables[2] = out2:match("\n(evolve, seed 1.-)\n%(best@g")
    -- the same table but for the measured seconds (the last column)
    local function strip(t) return (t:gsub(" +[%d.]+\n", "\n"):gsub(" +[%d.]+$", "")) end
    assert.are.equal(strip(tables[1]), strip(tables[2]))
    local _, bad = run("--smoke --arms frozen,best", dir)
    assert.are_not.equal(0, bad)
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)
end)
