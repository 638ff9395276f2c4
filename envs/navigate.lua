-- navigate.lua - a key-and-door environment with a 12-step horizon: on a 6 x 6 grid, walk to the
-- key (picked up on arrival), then to the door. Each observation names the current target and a
-- compass bearing towards it: "K r" (the key; moving right brings you closer), "D u" (the door,
-- up). The agent replies u, d, l or r (a move into the wall, or any other reply, wastes the
-- turn). Reaching the door with the key gives reward 1. Following the compass is all there is to
-- learn; what makes the full task hard for RL is finding any reward at all: a policy that moves
-- at random almost never walks 10 moves the right way within 12 turns.
--
--   observation  "K r"     action  "r"      (the key is picked up)
--   observation  "D u"     action  "u"
--   observation  "D u"     action  "u"      -> done, reward 1
--
-- Training tasks (M.tasks) need exactly 10 moves (start -> key -> door), and max_turns is 12: two
-- moves to spare. M.gen(params, rng) makes tasks of params.length moves (2 to 10; for a horizon
-- curriculum). M.solve(task, rng) is a shortest path (the demonstrations of a backward
-- curriculum); M.oracle(task, rng), for the SFT warm start, knows the action format but not the
-- way: it moves at random. Instances have clone() (backward starts, tree rollouts). Held out:
-- tasks whose hash says so (about one in five); neither split returns the other's.
local rl = require "moonrl"

local M = { name = "navigate", max_turns = 12, format = "line", size = 6, length = 10 }

local MOVES = { u = { 0, 1 }, d = { 0, -1 }, l = { -1, 0 }, r = { 1, 0 } }
local NAMES = { "u", "d", "l", "r" }

local function dist(ax, ay, bx, by) return math.abs(ax - bx) + math.abs(ay - by) end

local function held_out(t)
  return (t.sx * 131 + t.sy * 71 + t.kx * 37 + t.ky * 17 + t.dx * 7 + t.dy * 3) % 5 == 0
end

-- gen(params, rng) -> {sx, sy, kx, ky, dx, dy}: start, key and door (distinct cells) with
-- |start - key| + |key - door| = params.length (2..10); params.split = "test" draws held-out
-- tasks, otherwise training ones.
function M.gen(params, rng)
  local L = params.length or M.length
  assert(math.type(L) == "integer" and L >= 2 and L <= 10, "navigate.gen: length must be an integer in 2..10")
  local test = params.split == "test"
  local n = M.size - 1
  while true do
    local t = { sx = rng:random(0, n), sy = rng:random(0, n), kx = rng:random(0, n), ky = rng:random(0, n),
      dx = rng:random(0, n), dy = rng:random(0, n) }
    local a, b = dist(t.sx, t.sy, t.kx, t.ky), dist(t.kx, t.ky, t.dx, t.dy)
    if a >= 1 and b >= 1 and a + b == L and held_out(t) == test then return t end
  end
end

-- tasks(split, n, seed): n tasks of 10 moves.
function M.tasks(split, n, seed)
  assert(split == "train" or split == "test", "split must be \"train\" or \"test\"")
  local rng, out = rl.rng(seed or 0), {}
  for i = 1, n do out[i] = M.gen({ length = M.length, split = split }, rng) end
  return out
end

local Episode = {}
Episode.__index = Episode
function M.new() return setmetatable({}, Episode) end

-- The observation: the target (K the key, D the door) and the move that brings the agent
-- closer to it along x if it can, else along y.
function Episode:observation()
  local tx, ty, name = self.task.dx, self.task.dy, "D"
  if not self.key then tx, ty, name = self.task.kx, self.task.ky, "K" end
  local dir = tx > self.x and "r" or tx < self.x and "l" or ty > self.y and "u" or "d"
  return name .. " " .. dir
end

function Episode:reset(task)
  self.task, self.x, self.y, self.key = task, task.sx, task.sy, false
  return self:observation()
end

function Episode:step(action, parsed)
  local m = MOVES[((parsed and parsed.text) or action):match("^%s*(%l)") or ""]
  if m then
    local x, y = self.x + m[1], self.y + m[2]
    if x >= 0 and x < M.size and y >= 0 and y < M.size then self.x, self.y = x, y end
  end
  if not self.key and self.x == self.task.kx and self.y == self.task.ky then self.key = true end
  if self.key and self.x == self.task.dx and self.y == self.task.dy then
    return nil, 1, true, { success = true }
  end
  return self:observation(), 0, false, { success = false, invalid = m == nil or nil }
end

function Episode:clone()
  return setmetatable({ task = self.task, x = self.x, y = self.y, key = self.key }, Episode)
end

function Episode:state_key() return self:observation() end

-- solve(task [, rng]) -> a shortest path: to the key, then to the door, each leg along x then y,
-- or (with rng, at random per leg) y then x.
function M.solve(task, rng)
  local out = {}
  local function axis(from, to, up, down)
    while from ~= to do
      out[#out + 1] = from < to and up or down
      from = from + (from < to and 1 or -1)
    end
  end
  local function leg(fx, fy, tx, ty)
    if rng and rng:random() < 0.5 then
      axis(fy, ty, "u", "d")
      axis(fx, tx, "r", "l")
    else
      axis(fx, tx, "r", "l")
      axis(fy, ty, "u", "d")
    end
  end
  leg(task.sx, task.sy, task.kx, task.ky)
  leg(task.kx, task.ky, task.dx, task.dy)
  return out
end

-- The SFT oracle: random moves (the format, not the way).
function M.oracle(_, rng)
  local out = {}
  for i = 1, M.max_turns do out[i] = NAMES[rng:random(4)] end
  return out
end

return M
