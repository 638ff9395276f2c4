-- evolve.lua - one generation of an evolutionary search in which the agent is the advisor: the
-- miniature of PACEvolve++ (spec reproductions.md, section 3.9). A problem hides a peak c, four
-- integers in 0..19; the score of a vector x is M.score(problem, x) = 40 - |x - c|_1 (one narrow
-- peak: 40 at c alone). Each generation the advisor sees the search's current best vector and
-- emits one hypothesis; a fixed scripted implementer (M.apply) applies it to that vector and the
-- result is evaluated:
--
--   observation  "x 3 17 9 12"      action  "inc p2 2"   -> x 3 19 9 12 evaluated, done
--
-- Hypotheses: inc pK d, dec pK d (K 1..4, d 1..6: add or subtract d at position K), swap pK pJ
-- (exchange positions K and J, K ~= J). Anything else is invalid; a hypothesis that leaves
-- 0..19 fails to evaluate. Both pay -1 (PACEvolve++'s failed evaluation); a valid one pays
-- 5 clip(progress, 0, 1) with progress = (y - y0) / (40 - y0), y0 the score of the problem's
-- starting vector (advantage.md section 6.11, c = 5, alpha_r = 1). One turn per episode; info =
-- {x = the evaluated vector (nil when it failed), y =, progress =, failed =, success = (y above
-- the current best's)}.
--
-- A problem is {id =, c = {4}, x0 = {4}, y0 =}; M.problems(split, n, seed) draws n of them (x0 at
-- distance 28..44 from c); a problem whose peak hashes to one in five is held out ("test").
-- A task (one generation) is {problem =, x = the current best}; M.tasks(split, n, seed) draws
-- generations of random problems at random vectors (the SFT warm start's). M.oracle(task, rng),
-- the SFT demonstrator, is imperfect: the greedy hypothesis (M.greedy: the largest score gain)
-- 30% of the time, else a hypothesis drawn uniformly from those that evaluate. Everything is a
-- function of the task and the seeds given.
local rl = require "moonrl"

local N, LO, HI, MAXD, PEAK = 4, 0, 99, 9, 400

local M = { name = "evolve", format = "line", max_turns = 1, positions = N, lo = LO, hi = HI,
  max_delta = MAXD, peak = PEAK }

-- score(problem, x) -> 40 - the L1 distance of x from the problem's peak.
function M.score(problem, x)
  local d = 0
  for i = 1, N do d = d + math.abs(x[i] - problem.c[i]) end
  return PEAK - d
end

-- progress(problem, y) -> (y - y0) / (peak - y0), not clipped.
function M.progress(problem, y) return (y - problem.y0) / (PEAK - problem.y0) end

-- reward(problem, y) -> 5 clip(progress, 0, 1); y nil (a failed or invalid hypothesis) -> -1.
function M.reward(problem, y)
  if y == nil then return -1 end
  return 5 * math.min(1, math.max(0, M.progress(problem, y)))
end

-- parse(text) -> {op = "inc"|"dec"|"swap", k =, d = | j =}, or nil and why.
function M.parse(text)
  local op, k, d = tostring(text):match("^%s*(%a+) p(%d+) (%d+)%s*$")
  if op == "inc" or op == "dec" then
    k, d = tonumber(k), tonumber(d)
    if k >= 1 and k <= N and d >= 1 and d <= MAXD then return { op = op, k = k, d = d } end
    return nil, "invalid"
  end
  local j
  k, j = tostring(text):match("^%s*swap p(%d+) p(%d+)%s*$")
  if k then
    k, j = tonumber(k), tonumber(j)
    if k >= 1 and k <= N and j >= 1 and j <= N and k ~= j then return { op = "swap", k = k, j = j } end
  end
  return nil, "invalid"
end

-- apply(x, text) -> the new vector (a copy), or nil and "invalid" | "failed": the implementer.
function M.apply(x, text)
  local h, why = M.parse(text)
  if not h then return nil, why end
  local out = table.move(x, 1, N, 1, {})
  if h.op == "swap" then
    out[h.k], out[h.j] = out[h.j], out[h.k]
  else
    out[h.k] = out[h.k] + (h.op == "inc" and h.d or -h.d)
    if out[h.k] < LO or out[h.k] > HI then return nil, "failed" end
  end
  return out
end

-- hypotheses() -> every hypothesis text, in a fixed order (inc, dec by position and d; swaps).
function M.hypotheses()
  local out = {}
  for _, op in ipairs { "inc", "dec" } do
    for k = 1, N do
      for d = 1, MAXD do out[#out + 1] = string.format("%s p%d %d", op, k, d) end
    end
  end
  for k = 1, N - 1 do
    for j = k + 1, N do out[#out + 1] = string.format("swap p%d p%d", k, j) end
  end
  return out
end
local ALL = M.hypotheses()

-- The hypotheses that evaluate from x, in ALL's order.
local function valid_from(x)
  local out = {}
  for _, h in ipairs(ALL) do
    if M.apply(x, h) then out[#out + 1] = h end
  end
  return out
end
M.valid_from = valid_from

-- greedy(problem, x) -> the first hypothesis (in ALL's order) of the largest score.
function M.greedy(problem, x)
  local best, by
  for _, h in ipairs(ALL) do
    local nx = M.apply(x, h)
    if nx then
      local y = M.score(problem, nx)
      if by == nil or y > by then best, by = h, y end
    end
  end
  return best
end

local function vec_key(v) return table.concat(v, ",") end

-- Whether a problem (by its peak) is held out: one in five by a hash.
function M.held_out(c) return rl.train.mix(c[1], c[2], c[3], c[4], 0xE7) % 5 == 0 end

-- gen_problem(split, rng) -> a problem of the split.
function M.gen_problem(split, rng)
  local test = split == "test"
  while true do
    local c, x = {}, {}
    for i = 1, N do c[i] = rng:random(LO, HI) end
    for i = 1, N do x[i] = rng:random(LO, HI) end
    local p = { c = c, x0 = x }
    p.y0 = M.score({ c = c }, x)
    local dist = PEAK - p.y0
    if dist >= 160 and dist <= 240 and M.held_out(c) == test then
      p.id = string.format("%s%s", test and "t" or "p", vec_key(c))
      return p
    end
  end
end

-- problems(split, n, seed) -> n problems of the split.
function M.problems(split, n, seed)
  assert(split == "train" or split == "test", "split must be \"train\" or \"test\"")
  local rng, out = rl.rng(seed or 0), {}
  for i = 1, n do out[i] = M.gen_problem(split, rng) end
  return out
end

-- tasks(split, n, seed) -> n generations: random problems of the split at random vectors.
function M.tasks(split, n, seed)
  assert(split == "train" or split == "test", "split must be \"train\" or \"test\"")
  local rng, out = rl.rng(seed or 0), {}
  for i = 1, n do
    local p = M.gen_problem(split, rng)
    local x = {}
    for k = 1, N do x[k] = rng:random(LO, HI) end
    out[i] = { problem = p, x = x }
  end
  return out
end

-- The observation of a generation: the current best vector.
function M.observe(x) return "x " .. table.concat(x, " ") end

local Episode = {}
Episode.__index = Episode

function M.new() return setmetatable({}, Episode) end

function Episode:reset(task)
  self.task = task
  return M.observe(task.x)
end

function Episode:step(action)
  local t = self.task
  local nx, why = M.apply(t.x, action)
  local best = M.score(t.problem, t.x)
  if not nx then
    return nil, -1, true, { failed = true, why = why, success = false }
  end
  local y = M.score(t.problem, nx)
  return nil, M.reward(t.problem, y), true,
    { x = nx, y = y, progress = M.progress(t.problem, y), failed = false, success = y > best }
end

function Episode:clone()
  return setmetatable({ task = self.task }, Episode)
end

function Episode:state_key() return vec_key(self.task.x) end

-- oracle(task, rng) -> {hypothesis}: greedy 30% of the time, else uniform over those that evaluate.
function M.oracle(task, rng)
  if rng:random() < 0.3 then return { M.greedy(task.problem, task.x) } end
  local v = valid_from(task.x)
  return { v[rng:random(#v)] }
end

-- solve(task) -> {greedy hypothesis}: the upper bound.
function M.solve(task) return { M.greedy(task.problem, task.x) } end

return M
