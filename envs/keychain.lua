-- keychain.lua - K rooms in a row, each with a locked door and three keys on the floor: the
-- miniature of BEACON's milestone credit and of the horizon-length study (spec
-- reproductions.md, section 2.2). Each door has one of six colours (r g b y p o) and opens with
-- the key of the colour a fixed hidden table gives (red door -> green key, ...); one of the three
-- keys on the floor is always that one. The agent takes a key, tries the door, and on "locked"
-- drops the key and takes another. Leaving room K within the budget (3K + 2 actions, 2K at best)
-- gives reward 1; an invalid action costs 0.1; every door that opens is a milestone
-- (info.milestone = true, what advantage = "beacon" segments on).
--
--   observation  "r1/2 d:r k:b g o"      action  "take g"     (room 1 of 2, red door)
--   observation  "holding g"             action  "open"
--   observation  "open! r2/2 d:y k:r b p" action "take r"
--   observation  "holding r"             action  "open"
--   observation  "locked"                action  "drop"       (r does not open a yellow door)
--   observation  "dropped"               action  "take b"     ...  "open" -> done, reward 1
--
-- Actions: take <c> (with empty hands, a key on the floor; the colour's letter or its word),
-- drop, open (with a key in hand), look (the room again). Anything else, or one of them when it
-- cannot be done, is invalid: reward -0.1, observation "invalid", the turn spent.
--
-- Tasks are {rooms = K, doors = {...}, keys = {{...}, ...}, start = 1, budget =, max_turns =
-- budget}; the table of keys is the same for every task, so the policy has to learn it. Splits by
-- construction: a layout (doors and keys in order) whose hash says so (about one in five) is
-- held out, and training tasks have K in M.train_rooms (2, 4, 6) only: K = 12 is held out for
-- horizon generalisation (gen{rooms = 12} draws held-out layouts only). M.gen(params, rng) makes
-- one task (params.rooms, params.split); M.tasks(split, n, seed) cycles K over 2, 4, 6 (and 12
-- in "test"). M.oracle(task, rng), the SFT warm start's, knows the table only partly: the keys
-- of two of the six door colours (M.oracle_knows); at any other door it takes a random key it has
-- not tried there and retries after "locked", so its first key is right 1/3 + 2/3 x 1/3 = 56% of
-- the time (the spec's 55%) and what RL has to learn is the other four entries of the table.
-- (An oracle right 55% of the time at every door would not do: imitation learns its most likely
-- key, the right one, and greedy decoding of the warm start is then nearly perfect.)
-- M.solve(task) is the perfect oracle (the ceiling).
-- GiGPO's state_key is the room and the key in hand. Instances have clone(). Everything is a
-- function of the task and the seeds given.
--
-- M.variant{macro =, decompose =} is the module with a horizon reduction of section 2.2:
--   macro      adds try <c> (drop any key in hand, take c, open: one action), with a budget of
--              ceil((3K + 2) / 2) actions;
--   decompose  training tasks start in a random room with 1 or 2 rooms to go (subgoal
--              decomposition; task.start, the budget counts the rooms to go); "test" tasks
--              start in room 1.
--   constant_context  every observation starts with a state block a deterministic tracker
--              keeps (rl.envkit.state_block): "[r=3/6 d=y k=g tried=r,b] locked" (the room,
--              its door, the keys on its floor, the keys tried at this door), so a policy that sees only the current
--              observation (rl.train.window with turns = 0) still knows where it is; and each
--              door that opens before the last pays the tracker's subgoal reward, 0.1
--              [chosen: the paper's aligned subgoal reward has no published scale].
local rl = require "moonrl"
local argcheck = require "moonrl.argcheck"

local COLOURS = { "r", "g", "b", "y", "p", "o" }
local WORDS = { red = "r", green = "g", blue = "b", yellow = "y", purple = "p", orange = "o" }
-- the hidden table: door colour -> the key that opens it
local OPENS = { r = "g", g = "o", b = "r", y = "b", p = "y", o = "p" }

local M = { name = "keychain", format = "line", train_rooms = { 2, 4, 6 }, test_rooms = { 2, 4, 6, 12 },
  max_rooms = 12, colours = COLOURS, opens = OPENS, oracle_knows = { r = true, b = true } }
M.max_turns = 3 * 6 + 2 -- the budget of the longest training task (K = 6)

-- The action budget of a task with `togo` rooms to go.
function M.budget(togo, macro)
  local b = 3 * togo + 2
  return macro and (b + 1) // 2 or b
end

local function colour_of(word)
  if not word or word == "" then return nil end
  if #word == 1 then return OPENS[word] and word or nil end
  return WORDS[word]
end

-- Whether a layout is held out: about one in five, by a hash of the doors and keys in order.
local function held_out(doors, keys)
  local h = #doors
  for i, d in ipairs(doors) do
    h = rl.train.mix(h, d:byte())
    for _, k in ipairs(keys[i]) do h = rl.train.mix(h, k:byte()) end
  end
  return h % 5 == 0
end
M.held_out = held_out

-- gen(params, rng) -> a task of params.rooms rooms (1..12; 12 only from the held-out layouts)
-- drawn with rng: params.split = "test" draws held-out layouts, otherwise training ones;
-- params.togo (1..rooms) starts the task that many rooms before the end; params.macro gives it
-- the macro budget and try <c>.
function M.gen(params, rng)
  local K = params.rooms
  assert(math.type(K) == "integer" and K >= 1 and K <= M.max_rooms, "keychain.gen: rooms must be an integer in 1..12")
  local test = params.split == "test" or K == M.max_rooms
  local togo = params.togo or K
  assert(math.type(togo) == "integer" and togo >= 1 and togo <= K, "keychain.gen: togo must be an integer in 1..rooms")
  while true do
    local doors, keys = {}, {}
    for i = 1, K do
      local d = COLOURS[rng:random(#COLOURS)]
      local others = {}
      for _, c in ipairs(COLOURS) do if c ~= OPENS[d] then others[#others + 1] = c end end
      local a = table.remove(others, rng:random(#others))
      local b = table.remove(others, rng:random(#others))
      local ks = { OPENS[d], a, b }
      for j = 3, 2, -1 do
        local s = rng:random(j)
        ks[j], ks[s] = ks[s], ks[j]
      end
      doors[i], keys[i] = d, ks
    end
    if held_out(doors, keys) == test then
      local budget = M.budget(togo, params.macro)
      return { rooms = K, doors = doors, keys = keys, start = K - togo + 1, budget = budget,
        max_turns = budget, macro = params.macro or nil }
    end
  end
end

-- The tasks(split, n, seed) of a gen: n tasks, K cycling over train_rooms ("train") or
-- test_rooms ("test").
local function tasks_of(gen)
  return function(split, n, seed)
    assert(split == "train" or split == "test", "split must be \"train\" or \"test\"")
    local rooms = split == "train" and M.train_rooms or M.test_rooms
    local rng, out = rl.rng(seed or 0), {}
    for i = 1, n do out[i] = gen({ rooms = rooms[(i - 1) % #rooms + 1], split = split }, rng) end
    return out
  end
end
M.tasks = tasks_of(M.gen)

local Episode = {}
Episode.__index = Episode
function M.new() return setmetatable({}, Episode) end

-- "r3/6 d:r k:g b o": the room, its door and the keys on its floor.
function Episode:room_text()
  return string.format("r%d/%d d:%s k:%s", self.room, self.task.rooms, self.task.doors[self.room],
    table.concat(self.floor, " "))
end

function Episode:enter(room)
  self.room, self.held = room, nil
  self.floor = table.move(self.task.keys[room], 1, 3, 1, {})
end

function Episode:reset(task)
  self.task, self.steps = task, 0
  self:enter(task.start or 1)
  return self:room_text()
end

local function invalid()
  return "invalid", -0.1, { success = false, invalid = true }
end

function Episode:take(c)
  if self.held or not c then return invalid() end
  for i, k in ipairs(self.floor) do
    if k == c then
      table.remove(self.floor, i)
      self.held = c
      return "holding " .. c, 0, { success = false }
    end
  end
  return invalid()
end

function Episode:drop()
  if not self.held then return invalid() end
  self.floor[#self.floor + 1] = self.held
  self.held = nil
  return "dropped", 0, { success = false }
end

-- open: "locked" with a wrong key; the right one opens the door (a milestone; the key stays
-- in the lock) into the next room, or out of the last one (done, reward 1).
function Episode:open()
  if not self.held then return invalid() end
  if OPENS[self.task.doors[self.room]] ~= self.held then return "locked", 0, { success = false } end
  if self.room == self.task.rooms then return nil, 1, { success = true, milestone = true }, true end
  self:enter(self.room + 1)
  return "open! " .. self:room_text(), 0, { success = false, milestone = true }
end

-- One action's observation, reward, info and whether it ended the task.
function Episode:act(text)
  local verb, obj = text:lower():match("^%s*(%a+)%s*(%a*)")
  if verb == "take" then return self:take(colour_of(obj)) end
  if verb == "drop" and obj == "" then return self:drop() end
  if verb == "open" and obj == "" then return self:open() end
  if verb == "look" and obj == "" then return self:room_text(), 0, { success = false } end
  if verb == "try" and self.task.macro then
    local c = colour_of(obj)
    if not c then return invalid() end
    local on_floor = c == self.held
    for _, k in ipairs(self.floor) do on_floor = on_floor or k == c end
    if not on_floor then return invalid() end
    if self.held ~= c then
      if self.held then self:drop() end
      self:take(c)
    end
    return self:open()
  end
  return invalid()
end

function Episode:step(action, parsed)
  self.steps = self.steps + 1
  local obs, reward, info, finished = self:act((parsed and parsed.text) or action)
  if finished then return nil, reward, true, info end
  if self.steps >= self.task.budget then
    info.budget = true
    return nil, reward, true, info
  end
  return obs, reward, false, info
end

function Episode:clone()
  return setmetatable({ task = self.task, steps = self.steps, room = self.room, held = self.held,
    floor = table.move(self.floor, 1, #self.floor, 1, {}) }, Episode)
end

-- The state an action acts on: the room and the key in hand ("3:g", "3:-").
function Episode:state_key() return self.room .. ":" .. (self.held or "-") end

-- The demonstration of one room: the keys pick(keys, tried, right, door) chooses in turn, up to
-- the right one.
local function attempts(task, room, pick)
  local right, tried, out = OPENS[task.doors[room]], {}, {}
  while true do
    local c = pick(task.keys[room], tried, right, task.doors[room])
    out[#out + 1] = c
    if c == right then return out end
    tried[c] = true
  end
end

-- The actions of a demonstration that tries the keys `pick` chooses, room by room.
local function demo(task, pick)
  local out = {}
  for room = task.start or 1, task.rooms do
    for i, c in ipairs(attempts(task, room, pick)) do
      if task.macro then
        out[#out + 1] = "try " .. c
      else
        if i > 1 then out[#out + 1] = "drop" end
        out[#out + 1] = "take " .. c
        out[#out + 1] = "open"
      end
    end
  end
  return out
end

-- solve(task) -> the perfect oracle's actions: the right key in every room.
function M.solve(task)
  return demo(task, function(_, _, right) return right end)
end

-- oracle(task, rng) -> the SFT oracle's actions: the right key at a door whose colour it knows
-- (oracle_knows), else a random untried key, with a retry after each wrong one (the budget may
-- run out).
function M.oracle(task, rng)
  return demo(task, function(keys, tried, right, door)
    if M.oracle_knows[door] then return right end
    local left = {}
    for _, k in ipairs(keys) do if not tried[k] then left[#left + 1] = k end end
    return left[rng:random(#left)]
  end)
end

-- variant{macro = false, decompose = false, constant_context = false} -> the module with those horizon reductions (see the
-- top of the file); its name says which ("keychain-macro", "keychain-decompose", ...).
local BLOCK = rl.envkit.state_block { fields = { "r", "d", "k", { name = "tried", kind = "set", keep = 3 } },
  max_bytes = 32, sep = " ", prefix = "[", suffix = "] " }
M.state_block = BLOCK

-- The constant-context instance: the plain one, its observations behind the tracker's block.
local Tracked = setmetatable({}, { __index = Episode })
Tracked.__index = Tracked

function Tracked:track()
  self.tracker:set("r", self.room .. "/" .. self.task.rooms)
  self.tracker:set("d", self.task.doors[self.room])
  self.tracker:set("k", table.concat(self.floor))
end

function Tracked:reset(task)
  local obs = Episode.reset(self, task)
  self.tracker = BLOCK:tracker()
  self:track()
  return self.tracker:wrap(obs)
end

function Tracked:step(action, parsed)
  local room = self.room
  local obs, reward, done, info = Episode.step(self, action, parsed)
  if self.room ~= room then -- a door opened: a new room, nothing tried there yet
    self.tracker = BLOCK:tracker()
    reward = reward + 0.1
    info.subgoal = true
  elseif obs == "locked" then
    self.tracker:add("tried", self.held)
  end
  self:track()
  if obs then obs = self.tracker:wrap(obs) end
  return obs, reward, done, info
end

function Tracked:clone()
  local c = setmetatable(Episode.clone(self), Tracked)
  c.tracker = self.tracker:clone()
  return c
end

function M.variant(opts)
  local o = argcheck.fields("keychain.variant", opts or {}, {
    { "macro", false, argcheck.boolean }, { "decompose", false, argcheck.boolean },
    { "constant_context", false, argcheck.boolean },
  }, 2)
  local V = {}
  for k, v in pairs(M) do V[k] = v end
  V.name = "keychain" .. (o.macro and "-macro" or "") .. (o.decompose and "-decompose" or "")
    .. (o.constant_context and "-cc" or "")
  if o.constant_context then V.new = function() return setmetatable({}, Tracked) end end
  V.max_turns = M.budget(6, o.macro)
  function V.gen(params, rng)
    local p = {}
    for k, v in pairs(params) do p[k] = v end
    p.macro = o.macro or nil
    if o.decompose and p.split ~= "test" and p.togo == nil then
      p.togo = math.min(p.rooms, rng:random(1, 2))
    end
    return M.gen(p, rng)
  end
  V.tasks = tasks_of(V.gen)
  return V
end

return M
