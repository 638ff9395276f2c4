-- haggle.lua - split 10 coins with a scripted opponent of hidden type: the miniature of SAVOIR's
-- social dialogue (spec reproductions.md, section 3.10), with the pieces of its Shapley credit:
-- coalition values from continuations of a cheap default policy, Shapley values by sampled
-- permutations.
--
--   observation  "split 10 coins"     action  "say fair"   -> "nice"
--   observation  "nice"               action  "offer 9"    -> "no, i want 4"
--   observation  "no, i want 4"       action  "accept"     -> "deal"  (6 coins; score 6 + 1)
--
-- The opponent needs a share of at least its threshold: its type's base (task.base: greedy 6..8,
-- fair 4..6, anxious 3..5) less one for each `say fair` among the agent's first two utterances
-- (rapport; never below 2). Utterances, at most five agent turns:
--   offer N   (N 0..10, the agent's coins): "deal" when 10 - N reaches the threshold; an anxious
--             opponent offered less than 2 says "bye" and leaves; else "no, i want T" (T the
--             threshold), which it stands by;
--   say fair  "nice" (rapport only counts in the first two turns; the reply is the same later);
--   ask why   "i need T";
--   accept    takes the opponent's standing "i want T": 10 - T coins, "deal"; with none, "no offer";
--   walk      ends with no deal; ok: "ok" (nothing said: SAVOIR's absent player); else "what?".
-- The score (the episode's only reward, at its last turn) is coins + a relationship term: +1 with
-- a deal, -1 without one (walked, left, or five turns). info = {coins =, deal =, score =,
-- rapport =, threshold =} at the end; every turn's info has the utterance's kind (`kind`).
--
-- Tasks are {id =, type =, base =}; a (type, base) pair with the middle base (greedy 7, fair 5,
-- anxious 4) is held out: tasks("test") draws only those, tasks("train") the other six.
-- M.oracle(task, rng), the SFT demonstrator, is imperfect: rapport first a quarter of the time,
-- a question a fifth, else an offer of 6..9; then it accepts or matches a stated want, or offers
-- again. M.solve(task) is the ceiling (two rapport turns, the question, the exact offer).
--
-- SAVOIR's credit (M.coalition_value, M.shapley, M.shapley_credit): the players are an episode's
-- utterances; v(S) is the mean score of `continuations` (4) runs of the dialogue in which the
-- utterances outside S are replaced by `ok` (replayed, stopping where it ends), each finished
-- from a clone by M.default_policy (scripted: matches a stated threshold, accepts a standing want
-- half of the time, else offers 5..7); Shapley values by `permutations` (8) permutations drawn
-- from the seed, each utterance's mean marginal value v(P ∪ {i}) - v(P) over them. The values
-- sum to v(all) - v(none) for any permutations. Everything is a function of the task and seeds.
local rl = require "moonrl"

local BASES = { greedy = { 6, 7, 8 }, fair = { 4, 5, 6 }, anxious = { 3, 4, 5 } }
local TYPES = { "greedy", "fair", "anxious" }
local HELD = { greedy = 7, fair = 5, anxious = 4 }
local TURNS, FLOOR = 5, 2

local M = { name = "haggle", format = "line", max_turns = TURNS, types = TYPES, bases = BASES, opening = "split 10 coins" }

-- held_out(type, base) -> whether the pair is a test pair.
function M.held_out(type, base) return HELD[type] == base end

-- tasks(split, n, seed) -> n opponents of the split.
function M.tasks(split, n, seed)
  assert(split == "train" or split == "test", "split must be \"train\" or \"test\"")
  local pairs_ = {}
  for _, t in ipairs(TYPES) do
    for _, b in ipairs(BASES[t]) do
      if M.held_out(t, b) == (split == "test") then pairs_[#pairs_ + 1] = { t, b } end
    end
  end
  local rng, out = rl.rng(seed or 0), {}
  for i = 1, n do
    local p = pairs_[rng:random(#pairs_)]
    out[i] = { id = string.format("%s%d-%d", p[1], p[2], i), type = p[1], base = p[2] }
  end
  return out
end

-- parse(text) -> {kind = "offer", n =} | {kind = "fair" | "ask" | "accept" | "walk" | "ok"} | {kind = "bad"}.
function M.parse(text)
  local s = tostring(text):match("^%s*(.-)%s*$")
  local n = s:match("^offer (%d+)$")
  if n and tonumber(n) <= 10 then return { kind = "offer", n = tonumber(n) } end
  local kinds = { ["say fair"] = "fair", ["ask why"] = "ask", accept = "accept", walk = "walk", ok = "ok" }
  return { kind = kinds[s] or "bad" }
end

local Episode = {}
Episode.__index = Episode

function M.new() return setmetatable({}, Episode) end

function Episode:reset(task)
  self.task, self.turn, self.rapport, self.want, self.over = task, 0, 0, nil, false
  return M.opening
end

function Episode:threshold() return math.max(FLOOR, self.task.base - self.rapport) end

-- The end of the dialogue with coins (nil: no deal).
function Episode:finish(obs, coins)
  self.over = true
  local deal = coins ~= nil
  local score = (coins or 0) + (deal and 1 or -1)
  return obs, score, true, { coins = coins or 0, deal = deal, score = score, rapport = self.rapport,
    threshold = self:threshold() }
end

function Episode:step(action)
  if self.over then error("haggle: step after the end", 2) end
  self.turn = self.turn + 1
  local u = M.parse(action)
  local obs, r, done, info
  if u.kind == "offer" then
    local share = 10 - u.n
    if share >= self:threshold() then
      obs, r, done, info = self:finish("deal", u.n)
    elseif self.task.type == "anxious" and share < 2 then
      obs, r, done, info = self:finish("bye", nil)
    else
      self.want = self:threshold()
      obs = "no, i want " .. self.want
    end
  elseif u.kind == "fair" then
    if self.turn <= 2 then self.rapport = self.rapport + 1 end
    obs = "nice"
  elseif u.kind == "ask" then
    obs = "i need " .. self:threshold()
  elseif u.kind == "accept" then
    if self.want then
      obs, r, done, info = self:finish("deal", 10 - self.want)
    else
      obs = "no offer"
    end
  elseif u.kind == "walk" then
    obs, r, done, info = self:finish("bye", nil)
  elseif u.kind == "ok" then
    obs = "ok"
  else
    obs = "what?"
  end
  if not done and self.turn >= TURNS then obs, r, done, info = self:finish(obs, nil) end
  info = info or {}
  info.kind = u.kind
  return obs, r or 0, done, info
end

function Episode:clone()
  local c = setmetatable({}, Episode)
  for k, v in pairs(self) do c[k] = v end
  return c
end

function Episode:state_key()
  return string.format("%d:%d:%s", self.turn, self.rapport, tostring(self.want))
end

-- What the agent has heard: the want the opponent stands by and the need it told (or nil).
local function heard(obs, known)
  local w = obs and obs:match("^no, i want (%d+)$")
  if w then known.want = tonumber(w) end
  local nd = obs and obs:match("^i need (%d+)$")
  if nd then known.need = tonumber(nd) end
end

-- oracle(task, rng) -> the demonstrator's utterances (played against the opponent to the end).
function M.oracle(task, rng)
  local inst, out, known = M.new(), {}, {}
  inst:reset(task)
  for t = 1, TURNS do
    local a
    local u = rng:random()
    if t == 1 then
      a = u < 0.25 and "say fair" or u < 0.45 and "ask why" or ("offer " .. rng:random(6, 9))
    elseif known.need then
      a = "offer " .. (10 - known.need)
    elseif known.want then
      a = u < 0.6 and "accept" or ("offer " .. math.max(0, 10 - known.want - rng:random(0, 1)))
    else
      a = u < 0.15 and "say fair" or u < 0.3 and "ask why" or ("offer " .. rng:random(5, 8))
    end
    out[#out + 1] = a
    local obs, _, done = inst:step(a)
    if done then break end
    heard(obs, known)
  end
  return out
end

-- solve(task) -> the ceiling: rapport twice, the question, the exact offer.
function M.solve(task)
  local need = math.max(FLOOR, task.base - 2)
  return { "say fair", "say fair", "ask why", "offer " .. (10 - need) }
end

-- default_policy(obs, known, rng) -> the next utterance of the cheap continuation policy.
function M.default_policy(known, rng)
  if known.need then return "offer " .. (10 - known.need) end
  if known.want then
    if rng:random() < 0.5 then return "accept" end
    return "offer " .. (10 - known.want)
  end
  return "offer " .. rng:random(5, 7)
end

-- play(task, utterances) -> an instance after the utterances (stopping where the dialogue ends),
-- its return so far, whether it ended, and what the agent heard.
local function play(task, utterances)
  local inst, ret, known = M.new(), 0, {}
  inst:reset(task)
  for _, a in ipairs(utterances) do
    local obs, r, done = inst:step(a)
    ret = ret + r
    if done then return inst, ret, true, known end
    heard(obs, known)
  end
  return inst, ret, false, known
end

-- continue(inst, known, rng) -> the return of finishing the dialogue with the default policy.
local function continue(inst, known, rng)
  known = { want = known.want, need = known.need }
  local ret = 0
  while true do
    local obs, r, done = inst:step(M.default_policy(known, rng))
    ret = ret + r
    if done then return ret end
    heard(obs, known)
  end
end

-- coalition_value(task, utterances, members, opts) -> v(S): members[i] true keeps utterance i,
-- the others become "ok"; the mean score over opts.continuations (4) default-policy finishes,
-- continuation j drawn from rl.rng(mix(opts.seed, j)) (the same streams for every coalition).
function M.coalition_value(task, utterances, members, opts)
  local played = {}
  for i, a in ipairs(utterances) do played[i] = members[i] and a or "ok" end
  local inst, ret, done, known = play(task, played)
  if done then return ret end
  local n, sum = opts.continuations or 4, 0
  for j = 1, n do
    sum = sum + ret + continue(inst:clone(), known, rl.rng(rl.train.mix(opts.seed or 0, j)))
  end
  return sum / n
end

-- shapley(n, v, permutations, rng) -> phi[1..n]: the mean over `permutations` permutations of
-- 1..n (Fisher-Yates with rng) of each player's marginal value v(before + {i}) - v(before);
-- v(members) takes a table {[i] = true}, and is asked once per distinct coalition.
function M.shapley(n, v, permutations, rng)
  local cache = {}
  local function value(members, key)
    if cache[key] == nil then cache[key] = v(members) end
    return cache[key]
  end
  local phi = {}
  for i = 1, n do phi[i] = 0 end
  for _ = 1, permutations do
    local order = {}
    for i = 1, n do order[i] = i end
    for i = n, 2, -1 do
      local j = rng:random(i)
      order[i], order[j] = order[j], order[i]
    end
    local members, key = {}, 0
    local before = value(members, key)
    for _, i in ipairs(order) do
      members[i], key = true, key | (1 << (i - 1))
      local after = value(members, key)
      phi[i] = phi[i] + (after - before) / permutations
      before = after
    end
  end
  return phi
end

-- shapley_credit(task, utterances, opts) -> phi (one value per utterance), v(all), v(none):
-- SAVOIR's credit of one dialogue; opts {continuations = 4, permutations = 8, seed =}.
function M.shapley_credit(task, utterances, opts)
  opts = opts or {}
  local function v(members) return M.coalition_value(task, utterances, members, opts) end
  local all = {}
  for i = 1, #utterances do all[i] = true end
  local phi = M.shapley(#utterances, v, opts.permutations or 8, rl.rng(rl.train.mix(opts.seed or 0, 0x5A)))
  return phi, v(all), v({})
end

return M
