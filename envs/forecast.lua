-- forecast.lua - forecasting questions whose outcomes are known only later: the miniature of
-- FutureWorld's delayed rewards (spec reproductions.md, section 3.4). Each question is about a
-- hidden biased coin (its chance of landing up, q, one of 0.1 .. 0.9); three sources each hold
-- one noisy evidence snippet about it, and the agent may look at two of them before it
-- forecasts the chance that the coin lands up as a bucket 0..9 (the probability (d + 0.5) / 10).
-- The coin is tossed once to settle the question; the reward is the Brier score's complement
-- 1 - (p - y)^2 (y = 1 when it lands up; 0 without a forecast), known only when the question
-- resolves: task.delay training steps after the rollout.
--
--   observation  "will it land up?"     action  "look wire"
--   observation  "wire 5/6 up"          action  "look poll"
--   observation  "poll 2/3 up"          action  "p 7"       -> done; the forecast 0.75
--
-- The sources: wire tosses the coin 6 times, poll 3 times, blog reports 3 tosses of some other
-- coin (a q of its own, drawn like the question's: no evidence at all). Looking at a source a
-- second time shows "seen" and spends the look. Actions: look <wire|poll|blog>, p <0-9>;
-- anything else is "invalid" and spends the turn. Three turns at most: after two looks (or
-- two spent turns) the third action must be a forecast, and anything else ends the episode
-- without one.
--
-- Delayed questions (task.delay > 0): the forecast turn returns reward 0 with info.pending =
-- task.id (rl.train's delayed option holds such episodes until M.resolve backfills them) and
-- info.p = the forecast; task.delay = 0 pays the reward at once (info.success: the forecast on
-- the side of 0.5 the toss fell). M.resolve(step, pending) -> {{key =, reward = M.score}, ...}
-- for the keys whose task.delay steps have passed since their rollout: the delayed option's
-- resolver; M.score(ep) is an episode's reward from its forecast and its task's outcome.
--
-- Tasks are {id =, q =, wire = {k, n}, poll = {k, n}, blog = {k, n}, y = 0 | 1, delay =};
-- M.gen(params, rng) draws one (params.split "train" | "test"; params.delay, default 5;
-- params.quick: the fraction of questions, chosen by a hash of the id, that resolve at once
-- whatever the delay, default 0). Splits by construction: a question whose evidence (q, the
-- three counts) hashes to one in five is held out. M.tasks(split, n, seed) as every
-- environment's. M.posterior(task) is E[q | wire, poll] under the uniform prior (the best
-- forecast); M.solve(task) looks at wire and poll and forecasts the bucket of the posterior
-- (the ceiling); M.oracle(task, rng), the SFT warm start's, is imperfect: its first look is at
-- a random source (blog too), its second (at another random source) only half of the time,
-- and it forecasts the raw fraction of ups it saw (overconfident), a bucket off 30% of the
-- time. Everything is a function of the task and the seeds given.
local rl = require "moonrl"

local SOURCES = { "wire", "poll", "blog" }
local TOSSES = { wire = 6, poll = 4, blog = 4 }
local GRID = { 0.1, 0.2, 0.3, 0.7, 0.8, 0.9 }

local M = { name = "forecast", format = "line", max_turns = 3, sources = SOURCES,
  tosses = TOSSES, grid = GRID, question = "will it land up?" }

-- The probability of forecast bucket d (0..9).
function M.prob(d) return (d + 0.5) / 10 end

local function tosses(q, n, rng)
  local k = 0
  for _ = 1, n do if rng:random() < q then k = k + 1 end end
  return k
end

-- Whether a question is held out: about one in five, by a hash of its evidence.
local function held_out(q10, w, p, b)
  local h = rl.train.mix(q10, w, p, b)
  return h % 5 == 0
end
M.held_out = held_out

-- gen(params, rng) -> a question of params.split ("train", the default, or "test").
function M.gen(params, rng)
  params = params or {}
  local test = params.split == "test"
  local delay, quick = params.delay or 5, params.quick or 0
  assert(math.type(delay) == "integer" and delay >= 0, "forecast.gen: delay must be a non-negative integer")
  assert(type(quick) == "number" and quick >= 0 and quick <= 1, "forecast.gen: quick must be in [0, 1]")
  while true do
    local qi = rng:random(#GRID)
    local q = GRID[qi]
    local w, p = tosses(q, TOSSES.wire, rng), tosses(q, TOSSES.poll, rng)
    local b = tosses(GRID[rng:random(#GRID)], TOSSES.blog, rng)
    local y = rng:random() < q and 1 or 0
    local nonce = rng:random(0, 0x7fffffff)
    if held_out(qi, w, p, b) == test then
      local id = string.format("%s%08x", test and "t" or "q", nonce)
      local fast = rl.train.mix(nonce, 0x9) % 1000 < quick * 1000
      return { id = id, q = q, wire = { w, TOSSES.wire }, poll = { p, TOSSES.poll },
        blog = { b, TOSSES.blog }, y = y, delay = fast and 0 or delay }
    end
  end
end

-- tasks(split, n, seed): n questions of the split, resolving at once (delay 0).
function M.tasks(split, n, seed)
  assert(split == "train" or split == "test", "split must be \"train\" or \"test\"")
  local rng, out = rl.rng(seed or 0), {}
  for i = 1, n do out[i] = M.gen({ split = split, delay = 0 }, rng) end
  return out
end

-- The reward of a forecast p (nil: none) of a question whose outcome is y.
local function reward_of(p, y)
  if p == nil then return 0 end
  return 1 - (p - y) ^ 2
end
M.reward_of = reward_of

local Episode = {}
Episode.__index = Episode

function M.new() return setmetatable({}, Episode) end

function Episode:reset(task)
  self.task, self.turn, self.looked = task, 0, {}
  return M.question
end

-- The end of an episode, with forecast p (or nil): paid now, or pending until resolution.
function Episode:finish(p)
  local t = self.task
  local info = { p = p }
  if t.delay > 0 then
    info.pending = t.id
    return nil, 0, true, info
  end
  if p ~= nil then info.success = (p > 0.5) == (t.y == 1) else info.success = false end
  return nil, reward_of(p, t.y), true, info
end

function Episode:step(action, parsed)
  self.turn = self.turn + 1
  local text = (parsed and parsed.text or action):lower()
  local d = text:match("^%s*p%s*(%d)%s*$")
  if d then return self:finish(M.prob(tonumber(d))) end
  if self.turn >= M.max_turns then return self:finish(nil) end -- the third turn had to forecast
  local src = text:match("^%s*look%s+(%a+)%s*$")
  if not (src and TOSSES[src]) then return "invalid", 0, false, { invalid = true } end
  if self.looked[src] then return "seen", 0, false, {} end
  self.looked[src] = true
  local e = self.task[src]
  return string.format("%s %d/%d up", src, e[1], e[2]), 0, false, { look = src }
end

function Episode:clone()
  local looked = {}
  for k, v in pairs(self.looked) do looked[k] = v end
  return setmetatable({ task = self.task, turn = self.turn, looked = looked }, Episode)
end

-- The sources seen so far (GiGPO groups turns that saw the same ones).
function Episode:state_key()
  local seen = {}
  for _, s in ipairs(SOURCES) do if self.looked[s] then seen[#seen + 1] = s end end
  return table.concat(seen, "+")
end

-- The forecast of an episode (its last turn's info.p), or nil.
function M.forecast(ep)
  local last = ep.record and ep.record[#ep.record]
  return last and type(last.info) == "table" and last.info.p or nil
end

-- score(ep) -> the episode's reward: 1 - (p - y)^2 for its forecast p and its task's outcome y.
function M.score(ep) return reward_of(M.forecast(ep), ep.task.y) end

-- resolve(step, pending) -> the keys of pending (buf:pending()'s list) whose questions have
-- resolved by step (task.delay steps after their rollout), each with reward = M.score.
function M.resolve(step, pending)
  local out = {}
  for _, p in ipairs(pending) do
    if step - p.step >= p.task.delay then out[#out + 1] = { key = p.key, reward = M.score } end
  end
  return out
end

-- posterior(task) -> E[q | the wire and poll counts] under the uniform prior on the grid: the
-- chance the coin lands up given everything the sources say (blog says nothing).
function M.posterior(task)
  local num, den = 0, 0
  for _, q in ipairs(GRID) do
    local like = 1
    for _, s in ipairs { "wire", "poll" } do
      local k, n = task[s][1], task[s][2]
      like = like * q ^ k * (1 - q) ^ (n - k)
    end
    num, den = num + q * like, den + like
  end
  return num / den
end

-- The bucket nearest a probability.
function M.bucket(p) return math.max(0, math.min(9, math.floor(10 * p))) end

-- solve(task) -> the best play: look at wire and poll, forecast the posterior's bucket.
function M.solve(task)
  return { "look wire", "look poll", "p " .. M.bucket(M.posterior(task)) }
end

-- oracle(task, rng) -> the imperfect demonstration (see the top of this file).
function M.oracle(task, rng)
  local u = rng:random()
  local first = u < 0.4 and "blog" or (u < 0.7 and "wire" or "poll")
  local seen = { first }
  if rng:random() < 0.4 then
    local others = {}
    for _, s in ipairs(SOURCES) do if s ~= first then others[#others + 1] = s end end
    seen[2] = others[rng:random(#others)]
  end
  local k, n = 0, 0
  for _, s in ipairs(seen) do k, n = k + task[s][1], n + task[s][2] end
  local f = math.max(0, math.min(1, 0.5 + 1.5 * (k / n - 0.5))) -- overconfident
  local d = math.floor(9 * f + 0.5)
  if rng:random() < 0.3 then d = d + (rng:random() < 0.5 and -1 or 1) end
  d = math.max(0, math.min(9, d))
  local actions = {}
  for i, s in ipairs(seen) do actions[i] = "look " .. s end
  actions[#actions + 1] = "p " .. d
  return actions
end

return M
