-- planact.lua - a planner and an executor on keychain layouts: the multi-agent miniature of
-- Dr. MAS and planner-centric RL (spec reproductions.md, section 3.5), an rl.multi environment.
-- A task is K rooms (K = 2 or 3) in a row, each with a door of one of six colours and three keys
-- on the floor, one of which opens it (envs/keychain.lua's layouts and hidden table: red door ->
-- green key, ...). Two agents, each in its own context:
--   planner   sees the whole layout and answers with one plan, a key per room:
--               given  "d:r k:b g o | d:y k:r b p"      returns  "plan g b"
--   executor  does not see the doors, only the room, its keys and the plan's key for it; each
--             turn it tries one key (the budget is K + 1 tries: one spare):
--               given  "r1/2 k:b g o plan:g"            returns  "try g"
--               given  "open! r2/2 k:r b p plan:b"      returns  "try b"     ... done
--             A wrong key gets "locked r1/2 k:b g o plan:g", a key not on the floor (or anything
--             else) "invalid ..."; either way the try is spent.
-- Rewards, so that the two reward distributions differ by construction:
--   planner   team success, 0 or 1 (finish(): every door opened within the budget);
--   executor  per step, on a 0-10 scale: 10 for a door that opens, 3 for a locked try with a
--             key from the floor, 0 for an invalid one (an invocation's return is 0 .. 10 K).
-- A plan that does not parse ("plan" and K colour letters) gives the executor plan:? in every
-- room. Since the executor never sees a door, team success needs the planner to know the table;
-- the executor's part is to follow the plan and to retry with an untried key after "locked".
--
-- Tasks {rooms =, doors =, keys =}: held-out layouts (keychain's hash, about one in five) are the
-- "test" split only; K cycles over 2, 3. Scripted imperfect oracles (the SFT warm start of each
-- role): the planner's knows the keys of two door colours of six (r, b; keychain's
-- oracle_knows) and plans a random floor key at the others; the executor's follows the plan with
-- probability 0.75 (else a random floor key) and after "locked" tries a random untried key.
-- M.solve_plan(task) is the perfect plan.
--
--   local planact = require "envs.planact"
--   rl.multi.train{ env = planact, agents = { planner = {...}, executor = {...} }, ... }
local rl = require "moonrl"
local keychain = require "envs.keychain"

local OPENS = keychain.opens
local M = { name = "planact", format = "line", agents = { "planner", "executor" }, rooms = { 2, 3 },
  max_turns = { planner = 1, executor = 4 }, opens = OPENS, oracle_knows = keychain.oracle_knows,
  follow = 0.75, reward_open = 10, reward_locked = 3 }

-- gen(params, rng) -> a task of params.rooms rooms; params.split = "test" draws held-out layouts.
function M.gen(params, rng)
  local t = keychain.gen({ rooms = params.rooms, split = params.split }, rng)
  return { rooms = t.rooms, doors = t.doors, keys = t.keys }
end

function M.tasks(split, n, seed)
  assert(split == "train" or split == "test", "planact: split must be \"train\" or \"test\"")
  local rng, out = rl.rng(seed or 0), {}
  for i = 1, n do out[i] = M.gen({ rooms = M.rooms[(i - 1) % #M.rooms + 1], split = split }, rng) end
  return out
end

-- "d:r k:b g o | d:y k:r b p": what the planner is given.
function M.layout_text(task)
  local parts = {}
  for i = 1, task.rooms do
    parts[i] = string.format("d:%s k:%s", task.doors[i], table.concat(task.keys[i], " "))
  end
  return table.concat(parts, " | ")
end

-- The plan in an action ("plan g b"): a list of K colour letters, or nil.
function M.parse_plan(text, rooms)
  local rest = tostring(text):match("^%s*plan%s+(.-)%s*$")
  if not rest then return nil end
  local out = {}
  for w in rest:gmatch("%S+") do
    if #w ~= 1 or not OPENS[w] then return nil end
    out[#out + 1] = w
  end
  if #out ~= rooms then return nil end
  return out
end

function M.solve_plan(task)
  local out = {}
  for i = 1, task.rooms do out[i] = OPENS[task.doors[i]] end
  return "plan " .. table.concat(out, " ")
end

local Episode = {}
Episode.__index = Episode
function M.new() return setmetatable({}, Episode) end

function Episode:reset(task)
  self.task, self.room, self.tries, self.phase, self.opened = task, 1, 0, "plan", 0
  self.plan = nil
end

function Episode:room_text()
  local t = self.task
  return string.format("r%d/%d k:%s plan:%s", self.room, t.rooms, table.concat(t.keys[self.room], " "),
    self.plan and self.plan[self.room] or "?")
end

function Episode:next()
  if self.phase == "plan" then return "planner", M.layout_text(self.task) end
  if self.phase == "act" then
    self.phase = "acting"
    return "executor", self:room_text()
  end
  return nil
end

local function on_floor(keys, c)
  for _, k in ipairs(keys) do if k == c then return true end end
  return false
end

function Episode:step(agent, action)
  local t = self.task
  if agent == "planner" then
    self.plan = M.parse_plan(action, t.rooms)
    self.phase = "act"
    return "ok", 0, true, { plan_valid = self.plan ~= nil }
  end
  self.tries = self.tries + 1
  local budget = t.rooms + 1
  local c = tostring(action):match("^%s*try%s+(%a)%s*$")
  local obs, reward, done, info
  if c and on_floor(t.keys[self.room], c) and OPENS[t.doors[self.room]] == c then
    self.opened, reward = self.opened + 1, M.reward_open
    if self.room == t.rooms then
      self.phase = "over"
      return nil, reward, true, { success = true, milestone = true }
    end
    self.room = self.room + 1
    obs, info = "open! " .. self:room_text(), { milestone = true }
  elseif c and on_floor(t.keys[self.room], c) then
    obs, reward, info = "locked " .. self:room_text(), M.reward_locked, {}
  else
    obs, reward, info = "invalid " .. self:room_text(), 0, { error = "invalid" }
  end
  done = self.tries >= budget
  if done then
    self.phase = "over"
    info.success = false
    obs = nil
  end
  return obs, reward, done, info
end

function Episode:success() return self.opened == self.task.rooms end
function Episode:finish() return { planner = self:success() and 1 or 0 } end

-- ---------------------------------------------------------------- the oracles (SFT)

local function pick(rng, list) return list[rng:random(#list)] end

M.oracles = {
  planner = function(task, _, rng)
    local out = {}
    for i = 1, task.rooms do
      local d = task.doors[i]
      out[i] = M.oracle_knows[d] and OPENS[d] or pick(rng, task.keys[i])
    end
    return "plan " .. table.concat(out, " ")
  end,
  executor = function(_, turns, rng)
    local cur = turns[#turns].given
    local keys, plan = {}, cur:match("plan:(%S+)")
    for k in (cur:match("k:(.-) plan:") or ""):gmatch("%S+") do keys[#keys + 1] = k end
    -- the keys tried in this room: the invocation's turns since the room's first observation
    local tried, room = {}, cur:match("r(%d+)/")
    for i = #turns - 1, 1, -1 do
      if turns[i].given:match("r(%d+)/") ~= room then break end
      tried[turns[i].returned:match("try%s+(%a)") or ""] = true
      if not turns[i].given:match("^locked") and not turns[i].given:match("^invalid") then break end
    end
    if next(tried) == nil then
      if plan ~= "?" and on_floor(keys, plan) and rng:random() < M.follow then return "try " .. plan end
      return "try " .. pick(rng, keys)
    end
    local left = {}
    for _, k in ipairs(keys) do if not tried[k] then left[#left + 1] = k end end
    return "try " .. pick(rng, #left > 0 and left or keys)
  end,
}

return M
