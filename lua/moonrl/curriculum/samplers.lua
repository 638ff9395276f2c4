-- moonrl.curriculum.samplers: how a curriculum picks the next arms (cells of a grid, tasks of a
-- pool): uniform, band (a Beta-posterior level controller), pools (buckets over posterior means)
-- and learnability (PLR/SFL score-and-staleness replay).
--
-- A sampler is configuration only. Its state lives in the curriculum (cur.sst, plain data saved
-- by cur:state()); the per-arm statistics in cur.arms (see moonrl.curriculum). Each sampler has
--   init(cur) -> sst                       the state of a fresh curriculum
--   draw(cur, n, rng) -> picks             n picks {id =, idx = (grids), kind = "..."}
--   observed(cur, touched)                 after cur:observe updated the arms in touched
--   config() -> JSON-ready settings
local beta = require "moonrl.curriculum.beta"
local check = require "moonrl.curriculum.check"

local M = {}
local Sampler = { __name = "moonrl.curriculum.sampler" }
Sampler.__index = Sampler
M.Sampler = Sampler

function M.is_sampler(v) return getmetatable(v) == Sampler end

local function new(name, fields) fields.name = name return setmetatable(fields, Sampler) end

-- The posterior mean of an arm (prior Beta(1, 1)).
local function mean(arm) return arm.a / (arm.a + arm.b) end
M.mean = mean

-- A uniformly random cell of a grid, as level indices.
local function random_cell(src, rng)
  local idx = {}
  for i, v in ipairs(src.values) do idx[i] = rng:random(#v) end
  return idx
end

-- Picks i from weights w[1..n] (sum total > 0) with one uniform draw.
local function pick(w, total, rng)
  local u = rng:random() * total
  for i = 1, #w do
    u = u - w[i]
    if u < 0 then return i end
  end
  for i = #w, 1, -1 do if w[i] > 0 then return i end end
  return #w
end
M.pick = pick

-- ---------------------------------------------------------------- uniform

-- rl.curriculum.uniform(): every cell (each parameter's level uniformly), or every active task
-- of a pool, equally likely.
function M.uniform(opts)
  check.fields("rl.curriculum.uniform", opts, {}, 2)
  local s = new("uniform", {})
  function s.init() return {} end
  function s.draw(_, cur, n, rng)
    local out = {}
    for i = 1, n do
      if cur.grid then
        out[i] = { idx = random_cell(cur.src, rng), kind = "uniform" }
      else
        out[i] = { id = cur.active[rng:random(#cur.active)], kind = "uniform" }
      end
    end
    return out
  end
  function s.observed() end
  function s.config() return { name = "uniform" } end
  return s
end

-- ---------------------------------------------------------------- band

-- rl.curriculum.band{low = .2, high = .8, confidence = .9, min_samples = 32, forget = .98,
-- cooldown = 4, hysteresis = .05}: one Beta posterior of success per cell, every episode
-- multiplying the cell's evidence so far by forget (an effective memory of 1 / (1 - forget)
-- episodes). The frontier is one level per parameter. After an observation, when the
-- frontier cell has min_samples episodes since it became the frontier and cooldown
-- observations have passed since the last move: P(p > high) >= confidence moves one parameter
-- a level up (round-robin over the parameters not at their last level); P(p < low) >=
-- confidence moves one down (the parameter that moved up last, else round-robin). A move
-- against a parameter's previous move needs the bound past the band by hysteresis.
-- cur.mix splits the draws: frontier (the frontier cell), review (a cell at or below the
-- frontier on every parameter, below on at least one), explore (any cell).
function M.band(opts)
  local who = "rl.curriculum.band"
  local o = check.fields(who, opts, {
    { "low", check.number(0, 1), 0.2 }, { "high", check.number(0, 1), 0.8 },
    { "confidence", check.number(0.5, 1), 0.9 }, { "min_samples", check.integer(1), 32 },
    { "forget", check.number(0, 1, true), 0.98 }, { "cooldown", check.integer(0), 4 },
    { "hysteresis", check.number(0, 1), 0.05 },
  }, 2)
  if o.low >= o.high then check.fail(who, string.format("low (%g) must be below high (%g)", o.low, o.high), 2) end
  local s = new("band", o)
  s.forget_rate = o.forget
  s.needs_grid = true
  s.uses_mix = true

  function s.init(_, cur)
    local n = #cur.src.names
    local level, last = {}, {}
    for i = 1, n do level[i], last[i] = 1, 0 end
    return { level = level, rr = 1, stack = {}, last_dir = last, cool = 0, since = 0, moves = {} }
  end

  local function review_cell(st, rng)
    local lower = {}
    for i, l in ipairs(st.level) do if l > 1 then lower[#lower + 1] = i end end
    if #lower == 0 then return nil end
    local j = lower[rng:random(#lower)]
    local idx = {}
    for i, l in ipairs(st.level) do idx[i] = i == j and rng:random(l - 1) or rng:random(l) end
    return idx
  end

  function s.draw(_, cur, n, rng)
    local st, mx, out = cur.sst, cur.mix, {}
    for i = 1, n do
      local u = rng:random()
      local idx, kind
      if u < mx.frontier then
        kind = "frontier"
      elseif u < mx.frontier + mx.review then
        kind, idx = "review", review_cell(st, rng)
      else
        kind, idx = "explore", random_cell(cur.src, rng)
      end
      if not idx then
        idx = {}
        for k, l in ipairs(st.level) do idx[k] = l end
      end
      out[i] = { idx = idx, kind = kind }
    end
    return out
  end

  -- P(p > x) and P(p < x) under the frontier cell's posterior.
  local function above(arm, x) return 1 - beta.cdf(x, arm.a, arm.b) end
  local function below(arm, x) return beta.cdf(x, arm.a, arm.b) end

  local function move(cur, st, i, dir, arm)
    local vals = cur.src.values[i]
    local from = st.level[i]
    st.level[i] = from + dir
    st.last_dir[i] = dir
    if dir > 0 then st.stack[#st.stack + 1] = i else
      for k = #st.stack, 1, -1 do if st.stack[k] == i then table.remove(st.stack, k) break end end
    end
    st.moves[#st.moves + 1] = { at = cur.observes, param = cur.src.names[i], from = vals[from],
      to = vals[from + dir], dir = dir, n = st.since, mean = mean(arm) }
    st.since, st.cool = 0, o.cooldown
  end

  function s.observed(_, cur, touched)
    local st = cur.sst
    local front = cur.src:cell(st.level)
    for _, t in ipairs(touched) do if t.id == front then st.since = st.since + t.n end end
    if st.cool > 0 then st.cool = st.cool - 1 return end
    local arm = cur.arms[front]
    if not arm or st.since < o.min_samples then return end
    local np = #st.level
    -- up: the next parameter round-robin that is not at its last level
    local up
    for k = 0, np - 1 do
      local i = (st.rr - 1 + k) % np + 1
      if st.level[i] < #cur.src.values[i] then up = i break end
    end
    if up then
      local bar = st.last_dir[up] < 0 and math.min(o.high + o.hysteresis, 0.999) or o.high
      if above(arm, bar) >= o.confidence then
        move(cur, st, up, 1, arm)
        st.rr = up % np + 1
        return
      end
    end
    -- down: the parameter that moved up last, else round-robin among those above their first
    local down = st.stack[#st.stack]
    if not down then
      for k = 0, np - 1 do
        local i = (st.rr - 1 + k) % np + 1
        if st.level[i] > 1 then down = i break end
      end
    end
    if down then
      local bar = st.last_dir[down] > 0 and math.max(o.low - o.hysteresis, 0.001) or o.low
      if below(arm, bar) >= o.confidence then move(cur, st, down, -1, arm) end
    end
  end

  function s.frontier(_, cur) return cur.src:cell(cur.sst.level) end

  function s.config()
    return { name = "band", low = o.low, high = o.high, confidence = o.confidence,
      min_samples = o.min_samples, forget = o.forget, cooldown = o.cooldown, hysteresis = o.hysteresis }
  end
  return s
end

-- ---------------------------------------------------------------- pools

-- The arms a sampler may draw from: every cell of a grid or every active task of a pool, as
-- {id =, idx =} in a fixed order.
local function all_arms(cur)
  if not cur.grid then
    local out = {}
    for i, key in ipairs(cur.active) do out[i] = { id = key } end
    return out
  end
  return cur.cells_all
end

-- rl.curriculum.pools{ {max = .25, weight = .2}, {max = .75, weight = 1}, {max = 1, weight = .2},
-- forget = 1 }: prime-rl's buckets over each arm's posterior mean of success (a bucket holds the
-- arms whose mean is at most its max and above the previous bucket's): a bucket is drawn in
-- proportion to its weight among the non-empty ones, then an arm uniformly within it.
function M.pools(opts)
  local who = "rl.curriculum.pools"
  if opts == nil then
    opts = { { max = 0.25, weight = 0.2 }, { max = 0.75, weight = 1 }, { max = 1, weight = 0.2 } }
  end
  if type(opts) ~= "table" then check.fail(who, "a list of buckets {max =, weight =} expected, got " .. check.describe(opts), 2) end
  local buckets, forget = {}, 1
  for k, v in pairs(opts) do
    if k == "forget" then
      local want = check.number(0, 1, true)(v)
      if want then check.fail(who, string.format("forget: %s expected, got %s", want, check.describe(v)), 2) end
      forget = v
    elseif math.type(k) ~= "integer" or k < 1 or k > #opts then
      check.fail(who, string.format("unknown field '%s' (a list of buckets, and forget)", tostring(k)), 2)
    end
  end
  if #opts == 0 then check.fail(who, "at least one bucket {max =, weight =} expected", 2) end
  for i, b in ipairs(opts) do
    local f = check.fields(string.format("%s: [%d]", who, i), b, {
      { "max", check.number(0, 1, true), nil, required = true },
      { "weight", check.number(0), nil, required = true },
    }, 2)
    if i > 1 and f.max <= buckets[i - 1].max then
      check.fail(who, string.format("[%d].max (%g) must be above [%d].max (%g)", i, f.max, i - 1, buckets[i - 1].max), 2)
    end
    buckets[i] = f
  end
  if buckets[#buckets].max < 1 then check.fail(who, string.format("the last bucket's max must be 1, got %g", buckets[#buckets].max), 2) end
  local s = new("pools", { buckets = buckets })
  s.forget_rate = forget
  s.enumerates = true
  function s.init() return {} end
  function s.draw(_, cur, n, rng)
    local members = {}
    for i = 1, #buckets do members[i] = {} end
    for _, a in ipairs(all_arms(cur)) do
      local arm = cur.arms[a.id]
      local m = arm and mean(arm) or 0.5
      for i, b in ipairs(buckets) do
        if m <= b.max or i == #buckets then
          local list = members[i]
          list[#list + 1] = a
          break
        end
      end
    end
    local w, total = {}, 0
    for i, b in ipairs(buckets) do
      w[i] = #members[i] > 0 and b.weight or 0
      total = total + w[i]
    end
    local out = {}
    for k = 1, n do
      local i
      if total > 0 then i = pick(w, total, rng) else
        repeat i = rng:random(#buckets) until #members[i] > 0
      end
      local a = members[i][rng:random(#members[i])]
      out[k] = { id = a.id, idx = a.idx, kind = "pool" .. i }
    end
    return out
  end
  function s.observed() end
  function s.config()
    local bs = {}
    for i, b in ipairs(buckets) do bs[i] = { max = b.max, weight = b.weight } end
    return { name = "pools", buckets = bs, forget = forget }
  end
  return s
end

-- ---------------------------------------------------------------- learnability

-- rl.curriculum.learnability{score = "p(1-p)" | "regret" | fn(info) -> number >= 0, weighting =
-- "rank" | "value", temperature = 1, staleness = .3, replay_prob = .5, capacity = 4000}:
-- Prioritized Level Replay. An arm's score is computed from its latest observation (PLR updates
-- a level's score each time it is played): p(1-p) of its success rate p (SFL's learnability),
-- or regret = the best reward it ever gave minus its latest mean reward, or fn({p =, n =,
-- reward =, max_reward =, mean =, id =}). Among the scored arms (at most capacity; the lowest
-- score leaves first) a replay draws arm i with probability
--   (1 - staleness) h_i^(1/T) / sum_j h_j^(1/T) + staleness (c - C_i) / sum_j (c - C_j),
-- h = 1 / rank of the score (weighting "rank", PLR) or the score itself ("value"), c the draws
-- so far, C_i the draw count when i was last drawn. With probability 1 - replay_prob (and
-- always while nothing is scored) the draw is instead a new arm, uniformly among the unscored.
function M.learnability(opts)
  local who = "rl.curriculum.learnability"
  local o = check.fields(who, opts, {
    { "score", check.oneof({ "p(1-p)", "regret" }, check.func, "a function(info) -> number"), "p(1-p)" },
    { "weighting", check.oneof { "rank", "value" }, "rank" },
    { "temperature", check.number(0, nil, true), 1 },
    { "staleness", check.number(0, 1), 0.3 }, { "replay_prob", check.number(0, 1), 0.5 },
    { "capacity", check.integer(1), 4000 },
  }, 2)
  local s = new("learnability", o)
  s.forget_rate = 1
  s.enumerates = true

  local function score_of(arm)
    if o.score == "p(1-p)" then
      local p = arm.latest_s / arm.latest_n
      return p * (1 - p)
    end
    local r = arm.latest_r / arm.latest_n
    if o.score == "regret" then return math.max(arm.max_r - r, 0) end
    local v = o.score({ p = arm.latest_s / arm.latest_n, n = arm.latest_n, reward = r,
      max_reward = arm.max_r, mean = mean(arm), id = arm.id })
    if not check.finite(v) or v < 0 then
      error(string.format("%s: score returned %s for %s (a number >= 0 expected)", who, check.describe(v), arm.id), 0)
    end
    return v
  end

  function s.init() return { scored = {} } end

  -- The score weights h_i^(1/T) of the scored arms, in cur.sst.scored order.
  local function weights(cur)
    local ids = cur.sst.scored
    local sc = {}
    for i, id in ipairs(ids) do sc[i] = cur.arms[id].score end
    local h = {}
    if o.weighting == "rank" then
      local order = {}
      for i = 1, #ids do order[i] = i end
      table.sort(order, function(x, y) if sc[x] ~= sc[y] then return sc[x] > sc[y] end return x < y end)
      for r, i in ipairs(order) do h[i] = (1 / r) ^ (1 / o.temperature) end
    else
      for i = 1, #ids do h[i] = sc[i] ^ (1 / o.temperature) end
    end
    local total = 0
    for i = 1, #h do total = total + h[i] end
    return h, total
  end

  function s.draw(_, cur, n, rng)
    local st = cur.sst
    local h, htotal = weights(cur)
    local scored_set = {}
    for _, id in ipairs(st.scored) do scored_set[id] = true end
    local unscored = {}
    for _, a in ipairs(all_arms(cur)) do
      if not scored_set[a.id] then unscored[#unscored + 1] = a end
    end
    local out = {}
    for k = 1, n do
      local draws = cur.draws + k - 1 -- draws before this one (staleness counts within the call)
      if #st.scored == 0 or (#unscored > 0 and rng:random() >= o.replay_prob) then
        local a = unscored[rng:random(#unscored)]
        out[k] = { id = a.id, idx = a.idx, kind = "new" }
      else
        local i
        if rng:random() < o.staleness then
          local age, total = {}, 0
          for j, id in ipairs(st.scored) do
            local arm = cur.arms[id]
            local last = arm.pending or arm.last_draw
            age[j] = draws - last
            total = total + age[j]
          end
          if total > 0 then i = pick(age, total, rng) else i = rng:random(#st.scored) end
        elseif htotal > 0 then
          i = pick(h, htotal, rng)
        else
          i = rng:random(#st.scored)
        end
        local arm = cur.arms[st.scored[i]]
        arm.pending = draws + 1 -- drawn now: its staleness restarts within this call
        out[k] = { id = arm.id, idx = arm.idx, kind = "replay" }
      end
    end
    for _, id in ipairs(st.scored) do cur.arms[id].pending = nil end
    return out
  end

  function s.observed(_, cur, touched)
    local st = cur.sst
    local in_list = {}
    for _, id in ipairs(st.scored) do in_list[id] = true end
    for _, t in ipairs(touched) do
      local arm = cur.arms[t.id]
      arm.score = score_of(arm)
      if not in_list[t.id] then
        st.scored[#st.scored + 1] = t.id
        in_list[t.id] = true
      end
    end
    while #st.scored > o.capacity do -- the lowest score leaves (ties: the one observed longest ago)
      local worst
      for i, id in ipairs(st.scored) do
        local a, w = cur.arms[id], worst and cur.arms[st.scored[worst]]
        if not w or a.score < w.score or (a.score == w.score and a.last_obs < w.last_obs) then worst = i end
      end
      cur.arms[st.scored[worst]].score = nil
      table.remove(st.scored, worst)
    end
  end

  function s.config()
    return { name = "learnability", score = type(o.score) == "function" and "<function>" or o.score,
      weighting = o.weighting, temperature = o.temperature, staleness = o.staleness,
      replay_prob = o.replay_prob, capacity = o.capacity }
  end
  return s
end

return M
