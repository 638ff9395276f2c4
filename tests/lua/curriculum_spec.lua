-- curriculum_spec.lua - rl.curriculum: levels and sources, the Beta posterior maths, the band
-- controller against a simulated learner (acceptance test 11), learnability sampling frequencies
-- (test 12, chi-square), pools and gates, what observe counts, the pool's admission, state and
-- load (the task stream reproduced, across processes: test 14), backward starts through clone(),
-- and bad input for every constructor.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"

local C = rl.curriculum

-- ---------------------------------------------------------------- helpers

-- A grid of one parameter, level = 1..n, whose tasks are {level =}.
local function level_source(n)
  return C.procedural { gen = function(p) return { level = p.level } end, params = { level = C.range { 1, n } } }
end

-- Episodes for tasks: G per task, success with probability p(task) drawn from rng.
local function episodes(tasks, G, p, rng)
  local eps = {}
  for g, t in ipairs(tasks) do
    local q = p(t)
    for _ = 1, G do
      local ok = rng:random() < q
      eps[#eps + 1] = { task = t, success = ok, reward = ok and 1 or 0, group = g, ["end"] = "done" }
    end
  end
  return eps
end

-- The keys and cells of a task list, as one string.
local function stream(tasks)
  local out = {}
  for i, t in ipairs(tasks) do out[i] = t.cell .. "|" .. t.key end
  return table.concat(out, "\n")
end

-- P(X >= x) for X chi-square with df degrees of freedom (df a positive integer): Q(df/2, x/2),
-- the regularized upper incomplete gamma function: 1 - the series P(s, y) = e^-y y^s / Gamma(s +
-- 1) * sum_n y^n / ((s + 1) ... (s + n)) when y < s + 1, else its continued fraction
-- e^-y y^s / Gamma(s) / (y + 1 - s - 1 (1 - s) / (y + 3 - s - 2 (2 - s) / ...)) (Lentz).
-- Gamma of an integer or half-integer from its recurrence, from 1 or sqrt(pi).
local function chi2_sf(x, df)
  local s, y = df / 2, x / 2
  local lg = df % 2 == 0 and 0 or 0.5 * math.log(math.pi) -- log Gamma(1) or log Gamma(1/2)
  local v = df % 2 == 0 and 1 or 0.5
  while v < s do lg = lg + math.log(v) v = v + 1 end -- now log Gamma(s)
  if y < s + 1 then
    local log_term = -y + s * math.log(y) - lg - math.log(s) -- n = 0: e^-y y^s / Gamma(s + 1)
    local sum = 0
    for n = 0, 10000 do
      if n > 0 then log_term = log_term + math.log(y) - math.log(s + n) end
      local t = math.exp(log_term)
      sum = sum + t
      if t < 1e-17 * sum then break end
    end
    return 1 - sum
  end
  local tiny = 1e-300
  local b = y + 1 - s
  local c, d = 1 / tiny, 1 / b
  local h = d
  for n = 1, 10000 do
    local a = -n * (n - s)
    b = b + 2
    d = a * d + b
    if math.abs(d) < tiny then d = tiny end
    c = b + a / c
    if math.abs(c) < tiny then c = tiny end
    d = 1 / d
    local delta = d * c
    h = h * delta
    if math.abs(delta - 1) < 1e-15 then break end
  end
  return math.exp(-y + s * math.log(y) - lg) * h
end

-- The chi-square statistic of counts against probabilities.
local function chi2(counts, probs, total)
  local x = 0
  for i, p in ipairs(probs) do
    local e = total * p
    x = x + (counts[i] - e) ^ 2 / e
  end
  return x
end

-- ---------------------------------------------------------------- the simulated learner

-- Acceptance test 11's learner: success at level L is 1 / (1 + exp(-slope (skill - L))); every
-- episode adds eta * 4 p (1 - p) to the skill (practice counts most where success is even).
-- Runs `steps` steps of `tasks` tasks x G episodes; returns per-step figures and the history.
local function simulate(cur, o)
  local skill, rng = o.skill or 1, rl.rng(o.seed)
  local out = { front_rate = {}, batch_rate = {}, levels = {}, front_n = {} }
  for step = 1, o.steps do
    local front = cur:brief().levels.level
    local tasks = cur:sample(o.tasks, rl.rng(o.seed * 1000 + step))
    local eps, fs, fn, succ = {}, 0, 0, 0
    for g, t in ipairs(tasks) do
      local p = 1 / (1 + math.exp(-o.slope * (skill - t.params.level)))
      for _ = 1, o.G do
        local ok = rng:random() < p
        eps[#eps + 1] = { task = t, success = ok, reward = ok and 1 or 0, group = g }
        succ = succ + (ok and 1 or 0)
        if t.params.level == front then fs, fn = fs + (ok and 1 or 0), fn + 1 end
        skill = skill + o.eta * 4 * p * (1 - p)
      end
    end
    cur:observe(eps)
    out.front_rate[step] = fn > 0 and fs / fn or nil
    out.front_n[step] = fn
    out.batch_rate[step] = succ / #eps
    out.levels[step] = cur:brief().levels.level
  end
  out.skill = skill
  return out
end

-- Direction changes in a list of moves.
local function reversals(moves)
  local n, last = 0, 0
  for _, m in ipairs(moves) do
    if last ~= 0 and m.dir ~= last then n = n + 1 end
    last = m.dir
  end
  return n
end

describe("rl.curriculum", function()
  -- ---------------------------------------------------------------- levels
  it("makes parameter levels: lists, ranges (integers or not) and max_turns horizons, in order", function()
    assert.are.same({ 3, "x", true }, C.levels { 3, "x", true }.values)
    assert.are.same({ 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 }, C.range { 1, 10 }.values)
    assert.are.same({ 0, 0.25, 0.5, 0.75, 1 }, C.range { 0, 1, 0.25 }.values)
    assert.are.same({ 1, 5, 9, 10 }, C.range { lo = 1, hi = 10, step = 4 }.values) -- hi is always last
    assert.are.equal("integer", math.type(C.range { 1, 10 }.values[3]))
    local h = C.horizon { start = 2, stop = 12, step = 3 }
    assert.are.same({ 2, 5, 8, 11, 12 }, h.values)
    assert.is_true(h.horizon)
  end)

  it("computes the Beta CDF as binomial tail sums, and its quantiles", function()
    local B = C.beta
    local function tail(n, k, x) -- P(Binomial(n, x) >= k)
      local s = 0
      for j = k, n do
        local c = 1
        for i = 1, j do c = c * (n - i + 1) / i end
        s = s + c * x ^ j * (1 - x) ^ (n - j)
      end
      return s
    end
    local worst = 0
    for _, ab in ipairs { { 1, 1 }, { 2, 3 }, { 5, 1 }, { 1, 7 }, { 10, 30 }, { 40, 3 }, { 3, 40 }, { 25, 25 } } do
      for _, x in ipairs { 0.01, 0.1, 0.3, 0.5, 0.77, 0.95 } do
        worst = math.max(worst, math.abs(B.cdf(x, ab[1], ab[2]) - tail(ab[1] + ab[2] - 1, ab[1], x)))
      end
    end
    assert.is_true(worst < 1e-12, "largest difference " .. worst)
    assert.is_true(math.abs(B.cdf(0.5, 3.7, 3.7) - 0.5) < 1e-12) -- symmetric, non-integer
    for _, q in ipairs { 0.05, 0.5, 0.9 } do
      assert.is_true(math.abs(B.cdf(B.quantile(q, 12.5, 3.25), 12.5, 3.25) - q) < 1e-9)
    end
    assert.is_true(math.abs(B.lgamma(0.5) - math.log(math.sqrt(math.pi))) < 1e-12)
    assert.is_true(math.abs(B.lgamma(10) - math.log(362880)) < 1e-12)
  end)

  -- ---------------------------------------------------------------- procedural sources
  it("tags every task with its cell, params and key; the stream is a function of the rng", function()
    local function make()
      return C.new { source = C.procedural { gen = function(p, rng) return { x = rng:random(100), d = p.digits, op = p.op } end,
        params = { digits = C.range { 1, 3 }, op = C.levels { "add", "mul" } }, order = { "op", "digits" } } }
    end
    local a, b = make(), make()
    local ta, tb = a:sample(40, rl.rng(5)), b:sample(40, rl.rng(5))
    assert.are.equal(stream(ta), stream(tb))
    assert.are_not.equal(stream(ta), stream(make():sample(40, rl.rng(6))))
    for _, t in ipairs(ta) do
      assert.are.equal(string.format("op=%s,digits=%d", t.params.op, t.params.digits), t.cell)
      assert.are.equal(t.d, t.params.digits)
      assert.are.equal(t.cell .. "|", t.key:sub(1, #t.cell + 1))
    end
    -- the curriculum's own stream (no rng given) is a function of its seed and the calls so far
    local c1 = C.new { source = level_source(10), seed = 9 }
    local c2 = C.new { source = level_source(10), seed = 9 }
    assert.are.equal(stream(c1:sample(8)) .. stream(c1:sample(8)), stream(c2:sample(8)) .. stream(c2:sample(8)))
    -- a horizon parameter sets each task's max_turns
    local cur = C.new { source = C.procedural { gen = function(p) return { size = p.size } end,
      params = { size = C.levels { 1, 2 }, turns = C.horizon { start = 2, stop = 6, step = 2 } } } }
    for _, t in ipairs(cur:sample(30, rl.rng(1))) do assert.are.equal(t.params.turns, t.max_turns) end
  end)

  it("samples uniformly over the cells with rl.curriculum.uniform()", function()
    local cur = C.new { source = level_source(10), sampler = C.uniform() }
    local counts, total = {}, 20000
    for i = 1, 10 do counts[i] = 0 end
    for _, t in ipairs(cur:sample(total, rl.rng(3))) do counts[t.level] = counts[t.level] + 1 end
    local probs = {}
    for i = 1, 10 do probs[i] = 0.1 end
    local p = chi2_sf(chi2(counts, probs, total), 9)
    assert.is_true(p > 0.01, "chi-square p " .. p)
  end)

  -- ---------------------------------------------------------------- band
  it("keeps a simulated learner's success in band (acceptance test 11)", function()
    local cur = C.new { source = level_source(10), sampler = C.band {}, seed = 3 }
    local r = simulate(cur, { steps = 400, tasks = 16, G = 8, slope = 2.5, eta = 0.00015, seed = 7 })
    local inside, counted, batch_inside = 0, 0, 0
    for step = 1, 400 do
      local f = r.front_rate[step]
      if f then
        counted = counted + 1
        if f >= 0.2 and f <= 0.8 then inside = inside + 1 end
      end
      if r.batch_rate[step] >= 0.2 and r.batch_rate[step] <= 0.8 then batch_inside = batch_inside + 1 end
    end
    local st = cur:stats()
    local rev = reversals(st.moves)
    print(string.format("\n    test 11: frontier success in [.2, .8] on %.1f%% of steps (batch: %.1f%%), "
      .. "%d moves, %d reversals in 400 steps, level 1 -> %d, skill %.2f", 100 * inside / counted,
      100 * batch_inside / 400, #st.moves, rev, r.levels[400], r.skill))
    assert.is_true(inside / counted >= 0.8, "in band on " .. inside .. " of " .. counted .. " steps")
    assert.is_true(rev <= 3 * 4, "reversals " .. rev)
    assert.is_true(r.levels[400] >= 5, "the level should follow the skill, got " .. r.levels[400])
    for _, m in ipairs(st.moves) do assert.is_true(m.n >= 32, "a move on " .. m.n .. " samples") end
    -- a controller that never moves lets the learner's success leave the band
    local still = C.new { source = level_source(10), sampler = C.band { high = 0.999999, confidence = 0.999999 }, seed = 3 }
    local s = simulate(still, { steps = 400, tasks = 16, G = 8, slope = 2.5, eta = 0.00015, seed = 7 })
    local stuck = 0
    for step = 1, 400 do if (s.front_rate[step] or 0) > 0.8 then stuck = stuck + 1 end end
    assert.is_true(stuck > 200, "without moves success stays high: " .. stuck)
  end)

  it("moves no level on fewer than min_samples episodes, and moves as soon as it may", function()
    -- 4 episodes a step, all successes: the posterior is sure after ~10; min_samples = 32 waits
    for _, min in ipairs { 32, 12 } do
      local cur = C.new { source = level_source(10), sampler = C.band { min_samples = min, cooldown = 0 },
        mix = { frontier = 1 } }
      local seen = 0
      for step = 1, 40 do
        local tasks = cur:sample(1, rl.rng(step))
        cur:observe(episodes(tasks, 4, function() return 1 end, rl.rng(step)))
        seen = seen + 4
        if #cur:stats().moves > 0 then break end
      end
      local m = cur:stats().moves[1]
      assert.is_table(m)
      assert.is_true(m.n >= min and m.n < min + 4, string.format("min_samples %d: moved after %d", min, m.n))
      assert.are.same({ dir = 1, from = 1, to = 2, param = "level" }, { dir = m.dir, from = m.from, to = m.to, param = m.param })
    end
  end)

  it("moves one parameter at a time, round-robin, waits out the cooldown, and undoes the last move first", function()
    local cur = C.new { source = C.procedural { gen = function(p) return { a = p.a, b = p.b } end,
      params = { a = C.range { 1, 3 }, b = C.range { 1, 3 } } }, sampler = C.band { min_samples = 8, cooldown = 2 },
      mix = { frontier = 1 } }
    local when = {}
    local function run(steps, p)
      for _ = 1, steps do
        local before = #cur:stats().moves
        cur:observe(episodes(cur:sample(2, rl.rng(#when + 1)), 8, p, rl.rng(#when + 100)))
        when[#when + 1] = #cur:stats().moves - before
      end
    end
    run(12, function() return 1 end) -- always solved: a, b, a, b up to the top
    local moves = cur:stats().moves
    local params = {}
    for i, m in ipairs(moves) do params[i] = m.param .. m.dir end
    assert.are.same({ "a1", "b1", "a1", "b1" }, params)
    assert.are.same({ a = 3, b = 3 }, cur:stats().levels)
    -- after a move, `cooldown` observations pass without one
    local last = -10
    for i, n in ipairs(when) do
      if n > 0 then
        assert.is_true(i - last > 2, "moves at observations " .. last .. " and " .. i)
        last = i
      end
    end
    run(40, function() return 0 end) -- now never solved: b (moved last) goes down first
    moves = cur:stats().moves
    assert.are.same({ "b", -1 }, { moves[5].param, moves[5].dir })
    assert.are.same({ "a", -1 }, { moves[6].param, moves[6].dir })
  end)

  -- ---------------------------------------------------------------- learnability
  local function known_pool(n)
    local tasks = {}
    for i = 1, n do tasks[i] = { id = i } end
    return C.pool { tasks = tasks, key = function(t) return "t" .. t.id end }
  end
  -- Scores every task of cur (a pool of known_pool) once: task i succeeds k_i of 100 times.
  local function score_all(cur, k)
    local eps = {}
    for i, key in ipairs(cur.active) do
      local t = cur.tasks[key]
      for j = 1, 100 do
        local ok = j <= k[i]
        eps[#eps + 1] = { task = t, success = ok, reward = ok and 1 or 0, group = i }
      end
    end
    cur:observe(eps)
  end

  it("draws tasks in proportion to p(1 - p) (acceptance test 12: chi-square p > .01, 50k draws)", function()
    local n, k = 50, {}
    for i = 1, n do k[i] = 2 + (i * 37) % 97 end -- 2..98 successes of 100
    local cur = C.new { source = known_pool(n), sampler = C.learnability { weighting = "value", staleness = 0, replay_prob = 1 } }
    score_all(cur, k)
    local counts, probs, raw, sum = {}, {}, {}, 0
    for i = 1, n do
      local p = k[i] / 100
      probs[i] = p * (1 - p)
      raw[i] = probs[i]
      sum = sum + probs[i]
      counts[i] = 0
    end
    for i = 1, n do probs[i] = probs[i] / sum end
    local total = 0
    for call = 1, 50 do
      for _, t in ipairs(cur:sample(1000, rl.rng(call))) do counts[t.id] = counts[t.id] + 1 total = total + 1 end
    end
    local x = chi2(counts, probs, total)
    local p = chi2_sf(x, n - 1)
    print(string.format("\n    test 12: chi-square %.1f on %d degrees of freedom, p = %.3f", x, n - 1, p))
    assert.is_true(p > 0.01, "p " .. p)
    -- the test can fail: frequencies proportional to p instead are rejected
    local wrong = {}
    for i = 1, n do wrong[i] = k[i] / 100 end
    local ws = 0
    for i = 1, n do ws = ws + wrong[i] end
    for i = 1, n do wrong[i] = wrong[i] / ws end
    assert.is_true(chi2_sf(chi2(counts, wrong, total), n - 1) < 1e-6)
    -- rank weighting (PLR's, the default): probability ∝ (1 / rank)^(1 / temperature)
    local rank = C.new { source = known_pool(n), sampler = C.learnability { temperature = 0.5, staleness = 0, replay_prob = 1 } }
    score_all(rank, k)
    local order = {}
    for i = 1, n do order[i] = i end
    table.sort(order, function(x1, y1)
      local a, b = raw[x1], raw[y1]
      if a ~= b then return a > b end
      return x1 < y1
    end)
    local rp, rs, rc = {}, 0, {}
    for r, i in ipairs(order) do rp[i] = (1 / r) ^ 2 rs = rs + rp[i] end
    for i = 1, n do rp[i] = rp[i] / rs rc[i] = 0 end
    for _, t in ipairs(rank:sample(50000, rl.rng(77))) do rc[t.id] = rc[t.id] + 1 end
    local big = {} -- pool the rare ranks (expected counts below 5) into one bin
    local bp, bc, tail_p, tail_c = {}, {}, 0, 0
    for i = 1, n do
      if rp[i] * 50000 >= 5 then bp[#bp + 1], bc[#bc + 1] = rp[i], rc[i] else tail_p, tail_c = tail_p + rp[i], tail_c + rc[i] end
    end
    if tail_p > 0 then bp[#bp + 1], bc[#bc + 1] = tail_p, tail_c end
    big.p = chi2_sf(chi2(bc, bp, 50000), #bp - 1)
    assert.is_true(big.p > 0.01, "rank weighting: p " .. big.p)
  end)

  it("draws every task within 500 draws with staleness .3, even those of score 0", function()
    local n, k = 50, {}
    for i = 1, n do k[i] = i <= 5 and 0 or (i <= 10 and 100 or 2 + (i * 37) % 97) end -- 10 of score 0
    for _, weighting in ipairs { "value", "rank" } do
      local cur = C.new { source = known_pool(n), sampler = C.learnability { weighting = weighting, staleness = 0.3, replay_prob = 1 } }
      score_all(cur, k)
      local first = {}
      local tasks = cur:sample(500, rl.rng(11))
      for d, t in ipairs(tasks) do first[t.id] = first[t.id] or d end
      local latest = 0
      for i = 1, n do
        assert.is_number(first[i], weighting .. ": task " .. i .. " never drawn in 500")
        latest = math.max(latest, first[i])
      end
      -- and without staleness the tasks of score 0 are never drawn (value weighting)
      if weighting == "value" then
        local none = C.new { source = known_pool(n), sampler = C.learnability { weighting = "value", staleness = 0, replay_prob = 1 } }
        score_all(none, k)
        for _, t in ipairs(none:sample(500, rl.rng(11))) do assert.is_true(t.id > 10) end
      end
      print(string.format("\n    test 12: staleness .3 (%s weighting): every task drawn by draw %d of 500", weighting, latest))
    end
  end)

  it("learnability: draws unscored arms with 1 - replay_prob, keeps capacity arms, scores regret", function()
    local cur = C.new { source = known_pool(20), sampler = C.learnability { replay_prob = 0.75, capacity = 5 } }
    local first = cur:sample(20, rl.rng(1)) -- nothing scored: all new
    local ids = {}
    for _, t in ipairs(first) do ids[t.id] = true end
    local k = {}
    for i = 1, 20 do k[i] = 50 + i end
    score_all(cur, k)
    assert.are.equal(5, #cur.sst.scored) -- capacity: the highest scores stay (p near .5)
    local kept = {}
    for _, key in ipairs(cur.sst.scored) do kept[#kept + 1] = key end
    table.sort(kept)
    assert.are.same({ "t1", "t2", "t3", "t4", "t5" }, kept)
    local new = 0
    for _, t in ipairs(cur:sample(4000, rl.rng(2))) do if t.id > 5 then new = new + 1 end end
    assert.is_true(math.abs(new / 4000 - 0.25) < 0.03, "new draws " .. new / 4000)
    -- regret: the best reward a task ever gave less its latest mean
    local reg = C.new { source = known_pool(2), sampler = C.learnability { score = "regret" } }
    local t1, t2 = reg.tasks.t1, reg.tasks.t2
    reg:observe { { task = t1, reward = 2 }, { task = t2, reward = 1 } }
    reg:observe { { task = t1, reward = 0.5 }, { task = t2, reward = 1 } }
    assert.are.equal(1.5, reg:stats().keys.t1.score)
    assert.are.equal(0, reg:stats().keys.t2.score)
  end)

  -- ---------------------------------------------------------------- pools
  it("pools: buckets over posterior means, a bucket by weight, a task uniformly within it", function()
    local cur = C.new { source = known_pool(30), sampler = C.pools { { max = 0.25, weight = 1 }, { max = 0.75, weight = 3 }, { max = 1, weight = 0 } } }
    local k = {}
    for i = 1, 30 do k[i] = i <= 10 and 5 or (i <= 20 and 50 or 95) end
    score_all(cur, k)
    local low, mid, high = 0, 0, 0
    for _, t in ipairs(cur:sample(8000, rl.rng(4))) do
      if t.id <= 10 then low = low + 1 elseif t.id <= 20 then mid = mid + 1 else high = high + 1 end
    end
    assert.are.equal(0, high)
    assert.is_true(math.abs(low / 8000 - 0.25) < 0.02 and math.abs(mid / 8000 - 0.75) < 0.02,
      string.format("low %.3f mid %.3f", low / 8000, mid / 8000))
  end)

  -- ---------------------------------------------------------------- observe
  it("observes success per arm, leaving out errors, unscorable episodes and tasks it did not give", function()
    local cur = C.new { source = level_source(3), sampler = C.uniform() }
    local t = cur:sample(1, rl.rng(1))[1]
    local seen = cur:observe { { task = t, success = true, reward = 1, group = 1 },
      { task = t, success = false, reward = 0, group = 1 },
      { task = t, success = true, reward = 1, ["end"] = "env_error", group = 1 },
      { task = t, success = true, reward = 1, error = "boom", group = 1 },
      { task = t, success = true, reward = 0, reward_status = "unscorable", group = 1 },
      { task = { level = 2, cell = "level=2", key = "x" }, success = true, reward = 1 }, -- not drawn
      { task = { a = 1 }, success = true, reward = 1 } }
    assert.are.equal(2, seen.episodes)
    assert.are.equal(3, seen.ignored)
    assert.are.same({ { cell = t.cell, n = 2, success = 0.5, reward = 0.5 } }, seen.cells)
    assert.are.equal(0, seen.zero_variance)
    local st = cur:stats().cells[t.cell]
    assert.are.equal(2, st.n)
    assert.are.equal(0.5, st.mean)
    assert.is_true(st.lo < 0.5 and st.hi > 0.5)
    assert.are.equal(2, st.ends.done) -- an episode without an end reason counts as done
  end)

  -- ---------------------------------------------------------------- pools: admission
  it("keeps a pool's keys unique; admits, retires and regresses tasks", function()
    local cur = C.new { source = C.pool { tasks = { { q = "1+1" }, { q = "2+2" } } }, sampler = C.uniform() }
    assert.are.equal(2, #cur.active)
    local t, err = cur:admit({ q = "3+3" }, { by = "proposer", step = 4 })
    assert.is_table(t, err)
    assert.are.equal("pool", t.cell)
    local again, why = cur:admit { q = "3+3" }
    assert.is_nil(again)
    assert.matches("already holds", why)
    assert.is_nil(cur:admit { q = "x", f = print })
    assert.is_true(cur:retire(t.key, "mastered"))
    assert.are.equal(2, #cur.active)
    assert.is_nil(cur:retire(t.key))
    local _, back = cur:admit { q = "3+3" }
    assert.matches("retired", back)
    for _, s in ipairs(cur:sample(50, rl.rng(1))) do assert.are_not.equal("3+3", s.q) end
    assert.is_true(cur:regress(t.key))
    assert.are.equal(3, #cur.active)
    assert.is_nil(cur:regress("nope"))
    -- an empty pool: sample says so
    for _, key in ipairs { cur.active[1], cur.active[2], cur.active[3] } do cur:retire(key) end
    local none, msg = cur:sample(4, rl.rng(1))
    assert.is_nil(none)
    assert.matches("no active task", msg)
    -- a pool from an env drops repeated tasks
    local env = dofile(H.root .. "/envs/calculator.lua")
    local p = C.pool { env = env, size = 400 }
    assert.is_true(#p.initial < 100 and #p.initial > 50) -- 80 training pairs
  end)

  -- ---------------------------------------------------------------- gates
  it("gates groups: zero variance, a small advantage range, or a function", function()
    local g = C.gate {}
    local eps = function(...)
      local out = {}
      for i, r in ipairs { ... } do out[i] = { reward = r } end
      return out
    end
    assert.is_true(g:rejects(eps(1, 1, 1)))
    assert.is_false(g:rejects(eps(1, 0, 1)))
    local r = C.gate { reject = "adv_range", min_adv = 0.1 }
    assert.is_true(r:rejects(eps(0.5, 0.52, 0.49)))
    assert.is_false(r:rejects(eps(0.5, 0.9, 0.5)))
    local f = C.gate { reject = function(group) return #group.episodes < 3 end }
    assert.is_true(f:rejects(eps(0, 1)))
    assert.matches("true or false", H.error_of(function() C.gate { reject = function() return 1 end }:rejects(eps(1)) end))
  end)

  -- ---------------------------------------------------------------- state
  local function samplers()
    return {
      band = function() return C.band { min_samples = 8, cooldown = 1 } end,
      uniform = function() return C.uniform() end,
      pools = function() return C.pools() end,
      learnability = function() return C.learnability { capacity = 6 } end,
    }
  end

  -- Runs steps a..b of a curriculum against a fixed learner; returns the stream.
  local function drive(cur, a, b)
    local out = {}
    for step = a, b do
      local tasks = cur:sample(6, rl.rng(step))
      out[#out + 1] = stream(tasks)
      cur:observe(episodes(tasks, 4, function(t)
        local level = t.params and t.params.level or t.id
        return 1 / (1 + math.exp(level - 4.3))
      end, rl.rng(1000 + step)))
    end
    return table.concat(out, "\n")
  end

  it("state() and load() reproduce the task stream exactly, for every sampler", function()
    for name, make in pairs(samplers()) do
      local source = name == "band" and function() return level_source(8) end or function() return known_pool(12) end
      if name == "uniform" or name == "pools" then source = function() return level_source(8) end end
      local full = C.new { source = source(), sampler = make(), seed = 5 }
      local whole = drive(full, 1, 30)
      local cut = C.new { source = source(), sampler = make(), seed = 5 }
      local first = drive(cut, 1, 12)
      local saved = rl.json.encode(cut:state())
      local resumed = C.new { source = source(), sampler = make(), seed = 5 }
      resumed:load(rl.json.decode(saved))
      assert.are.equal(whole, first .. "\n" .. drive(resumed, 13, 30), name)
      assert.are.equal(rl.json.encode(full:state()), rl.json.encode(resumed:state()), name)
    end
    -- a pool with admitted and retired tasks
    local function pool_run(cur, a, b)
      local out = {}
      for step = a, b do
        if step % 3 == 0 then assert(cur:admit({ id = 100 + step }, { step = step })) end
        if step % 5 == 0 then assert(cur:retire(cur.active[1], "old")) end
        out[#out + 1] = drive(cur, step, step)
      end
      return table.concat(out, "\n")
    end
    local full = C.new { source = known_pool(6), sampler = C.learnability {} }
    local whole = pool_run(full, 1, 20)
    local cut = C.new { source = known_pool(6), sampler = C.learnability {} }
    local first = pool_run(cut, 1, 9)
    local resumed = C.new { source = known_pool(6), sampler = C.learnability {} }
    resumed:load(rl.json.decode(rl.json.encode(cut:state())))
    assert.are.equal(whole, first .. "\n" .. pool_run(resumed, 10, 20))
    -- a state of another kind is refused
    assert.matches("band sampler", H.error_of(function()
      C.new { source = level_source(8), sampler = C.uniform() }:load(C.new { source = level_source(8), sampler = C.band {} }:state())
    end))
  end)

  it("continues the task stream and level history in another process (acceptance test 14)", function()
    local script = [[
      local rl = require "moonrl"
      local C = rl.curriculum
      local mode, path = arg[1], arg[2]
      local cur = C.new { source = C.procedural { gen = function(p, rng) return { level = p.level, x = rng:random(1000) } end,
        params = { level = C.range { 1, 8 } } }, sampler = C.band { min_samples = 8, cooldown = 1 }, seed = 5 }
      local a, b = 1, 40
      if mode == "second" then
        local f = assert(io.open(path .. ".state"))
        cur:load(rl.json.decode(f:read("a")))
        f:close()
        a = 21
      elseif mode == "first" then
        b = 20
      end
      local out = assert(io.open(path .. "." .. mode, "w"))
      local skill = 1
      for step = a, b do
        skill = 1 + step * 0.12
        local tasks = cur:sample(6, rl.rng(step))
        for _, t in ipairs(tasks) do out:write(t.cell, " ", t.key, "\n") end
        local eps, rng = {}, rl.rng(1000 + step)
        for g, t in ipairs(tasks) do
          for _ = 1, 4 do
            local ok = rng:random() < 1 / (1 + math.exp(-2.5 * (skill - t.level)))
            eps[#eps + 1] = { task = t, success = ok, reward = ok and 1 or 0, group = g }
          end
        end
        cur:observe(eps)
      end
      out:write("moves ", rl.json.encode(cur:stats().moves), "\n")
      out:close()
      if mode == "first" then
        local f = assert(io.open(path .. ".state", "w"))
        f:write(rl.json.encode(cur:state()))
        f:close()
      end
    ]]
    local path = os.tmpname()
    for _, mode in ipairs { "whole", "first", "second" } do
      local out, _, ok = H.run_lua(script, mode, path)
      assert.is_true(ok, out)
    end
    local function read(name)
      local f = assert(io.open(path .. "." .. name))
      local t = f:read("a")
      f:close()
      return t
    end
    local whole, first, second = read("whole"), read("first"), read("second")
    local first_tasks = first:gsub("moves [^\n]*\n$", "")
    assert.are.equal(whole, first_tasks .. second)
    local moves = whole:match("moves ([^\n]*)")
    assert.is_true(#rl.json.decode(moves) >= 3, "the levels moved: " .. moves)
    for _, s in ipairs { "", ".whole", ".first", ".second", ".state" } do os.remove(path .. s) end
  end)

  -- ---------------------------------------------------------------- backward
  it("starts backward tasks k turns before the end of the demonstration, from a clone", function()
    -- walk from 0 to task.goal one "+" at a time; the observation is the position
    local clones = 0
    local Walk = {}
    Walk.__index = Walk
    local env = { name = "walk", max_turns = 8 }
    function env.tasks(_, n, seed)
      local rng, out = rl.rng(seed), {}
      for i = 1, n do out[i] = { goal = rng:random(5, 8) } end
      return out
    end
    function env.new() return setmetatable({}, Walk) end
    function Walk:reset(task) self.goal, self.at = task.goal, 0 return "at 0" end
    function Walk:step(action)
      if action:match("^%+") then self.at = self.at + 1 end
      if self.at == self.goal then return nil, 1, true, { success = true } end
      return "at " .. self.at, 0, false
    end
    function Walk:clone()
      clones = clones + 1
      return setmetatable({ goal = self.goal, at = self.at }, Walk)
    end
    local function demos(task)
      local out = {}
      for i = 1, task.goal do out[i] = "+" end
      return out
    end
    local cur = C.new { source = C.backward { demos = demos, env = env, k = C.range { 1, 8 } } }
    local tasks = cur:sample(40, rl.rng(3))
    local wrapped = cur:wrap_env(env)
    assert.are_not.equal(env, wrapped)
    assert.are.equal("walk", wrapped.name)
    for _, t in ipairs(tasks) do
      local k = t.params.k
      assert.are.equal(math.max(0, t.goal - k), t.start_turn)
      local inst = wrapped.new()
      local before = clones
      local obs = inst:reset(t, rl.rng(1))
      assert.are.equal("at " .. t.start_turn, obs)
      assert.are.equal(t.start_turn > 0 and before + 1 or before, clones)
      local turns, done = 0, false
      repeat
        local _, _, d = inst:step("+", {})
        turns, done = turns + 1, d
      until done
      assert.are.equal(t.goal - t.start_turn, turns) -- k turns, or all of them when k >= goal
      local copy = inst:clone()
      assert.are.equal(inst.inner.at, copy.inner.at)
    end
    -- tasks without a snapshot (a held-out task) start as usual
    local plain = wrapped.new()
    assert.are.equal("at 0", plain:reset({ goal = 3 }, rl.rng(1)))
    -- the environment's instances need clone()
    local noclone = { name = "n", tasks = env.tasks, new = function() return { reset = Walk.reset, step = Walk.step } end, max_turns = 4 }
    assert.matches("clone", H.error_of(C.backward, { demos = demos, env = noclone }))
  end)

  -- ---------------------------------------------------------------- bad input
  it("refuses bad input naming the field, and unknown fields with the nearest known one", function()
    local src = level_source(3)
    local cases = {
      { function() C.levels {} end, "levels: a non-empty list" },
      { function() C.levels { 1, 1 } end, "levels: [2]: 1 appears twice" },
      { function() C.levels { {} } end, "levels: [1]: a number, string or boolean" },
      { function() C.range { 10, 1 } end, "range: hi (1) is below lo (10)" },
      { function() C.range { 1, 2, 0 } end, "range: step: a number > 0" },
      { function() C.range { lo = 1, hgh = 2 } end, "unknown field 'hgh' (did you mean 'hi'?)" },
      { function() C.horizon { start = 0, stop = 3 } end, "horizon: start: a positive integer" },
      { function() C.horizon { start = 4, stop = 3 } end, "horizon: stop (3) is below start (4)" },
      { function() C.procedural { params = { d = C.range { 1, 2 } } } end, "procedural: gen: a function expected (it is required)" },
      { function() C.procedural { gen = print, params = { d = { 1, 2 } } } end, "procedural: params.d: rl.curriculum.levels" },
      { function() C.procedural { gen = print, params = {} } end, "procedural: params: at least one parameter" },
      { function() C.procedural { gen = print, params = { d = C.range { 1, 2 } }, order = { "e" } } end, "order[1]" },
      { function() C.procedural { gen = print, prams = {} } end, "unknown field 'prams' (did you mean 'params'?)" },
      { function() C.pool {} end, "pool: give tasks (a list) or env" },
      { function() C.pool { tasks = { { x = 1 }, { x = 1 } } } end, "tasks[2] has the key of tasks[1]" },
      { function() C.pool { tasks = { 5 } } end, "tasks[1]: a task table" },
      { function() C.band { low = 2 } end, "band: low: a number in [0, 1] expected, got 2" },
      { function() C.band { low = 0.9, high = 0.1 } end, "band: low (0.9) must be below high (0.1)" },
      { function() C.band { min_sample = 3 } end, "unknown field 'min_sample' (did you mean 'min_samples'?)" },
      { function() C.pools { { max = 0.5, weight = 1 } } end, "pools: the last bucket's max must be 1" },
      { function() C.pools { { max = 0.5, wieght = 1 } } end, "unknown field 'wieght' (did you mean 'weight'?)" },
      { function() C.learnability { score = "p1p" } end, "learnability: score:" },
      { function() C.learnability { weighting = "ranks" } end, "did you mean \"rank\"?" },
      { function() C.learnability { staleness = 2 } end, "learnability: staleness: a number in [0, 1]" },
      { function() C.gate { reject = "zero" } end, "gate: reject:" },
      { function() C.gate { max_tries = 0 } end, "gate: max_tries: a positive integer" },
      { function() C.new {} end, "new: source: a source" },
      { function() C.new { source = src, smapler = C.band {} } end, "unknown field 'smapler' (did you mean 'sampler'?)" },
      { function() C.new { source = src, sampler = C.band {}, mix = { frontier = 0.5 } } end, "mix: frontier + review + explore must be 1" },
      { function() C.new { source = src, mix = { frontier = 1 } } end, "mix: only the band sampler" },
      { function() C.new { source = src, sampler = C.band {}, mix = { fronteir = 1 } } end, "unknown field 'fronteir' (did you mean 'frontier'?)" },
      { function() C.new { source = known_pool(3), sampler = C.band {} } end, "band moves levels; a pool has none" },
      { function() C.new { source = C.horizon { start = 1, stop = 3 } } end, "a horizon without env is a parameter" },
      { function() C.new { source = src, seed = 1.5 } end, "new: seed: an integer" },
      { function() C.new { source = src }:sample(0) end, "sample: n: a positive integer" },
      { function() C.new { source = src }:sample(2, "x") end, "sample: rng: an rl.rng or an integer seed" },
      { function() C.new { source = src }:observe(5) end, "observe: batch: an rl.batch or a list" },
      { function() C.new { source = src }:admit { x = 1 } end, "admit: only a pool source admits tasks" },
      { function() C.new { source = known_pool(2) }:retire(3) end, "retire: key: a string" },
      { function() C.new { source = src }:load { version = 1 } end, "load: not a curriculum state" },
    }
    for _, c in ipairs(cases) do
      local msg = H.error_of(c[1])
      assert.is_truthy(msg:find(c[2], 1, true), string.format("%q lacks %q", msg, c[2]))
    end
    -- a gen that returns no table is named at sample time
    local bad = C.new { source = C.procedural { gen = function() return 3 end, params = { d = C.range { 1, 2 } } } }
    assert.matches("gen returned 3 for d=", H.error_of(bad.sample, bad, 1, rl.rng(1)))
  end)
end)
