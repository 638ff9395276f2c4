-- maze.lua - a corridor maze with a mixed-difficulty task pool, for the selective rollout gate
-- (recipes/gate.lua): many of its groups are zero-variance under the warm-started policy, some
-- of them recognisable early by how alike the episodes act. A task is a path of cells walked
-- one cell a turn; each observation is the current cell:
--
--   "r"    a corridor: the one way on is r (u, d, l, r); any other reply bumps a wall
--   "*"    a room: any of u, d, l, r leads on
--   "Ur"   a junction: the capital letter is the way on (u), the small one (r) a dead end
--   "x"    a dead end: the reply b (or any other) walks back to the junction
--
-- Leaving the last cell gives reward 1 and ends the episode; max_turns is 24, so each dead end
-- entered costs two turns of the path's slack. Three kinds of task (M.KINDS):
--   trivial     3-6 cells, corridors (half of them with rooms, where episodes act differently
--               yet all succeed)
--   impossible  26-30 cells, longer than the budget (half of them one straight corridor, where
--               the policy repeats one action)
--   mixed       j = 2-4 junctions on a path of 24 - s cells, the slack s one of 2j - 4, 2j - 2,
--               2j, 2j + 2 (at least 0): s / 2 dead ends are allowed, so the oracle's walk
--               succeeds about 30-80% of the time
-- drawn in proportions 2 : 1 : 5 (M.KINDS). Reproductions.md section 2.4 asks for a third
-- trivial and a sixth impossible, which alone make half the groups flat; it also asks for ~40%
-- flat groups, the paper's figure, so the pool keeps its shape (trivial twice impossible) at
-- 3/8 of the tasks, and mixed groups that come out flat by chance bring it to about 40% for the
-- oracle's own walks (a warm-started policy, less exact, makes more groups flat).
-- The SFT oracle (M.oracle) walks corridors and rooms correctly but takes a junction's two
-- exits at random (backing out of a dead end), so reading the capital letter is what RL can
-- learn; M.solve is the perfect walk. Held out: tasks whose hash says so (about one in five);
-- neither split returns the other's.
local rl = require "moonrl"

local M = { name = "maze", format = "line", max_turns = 24 }

local DIRS = { "u", "d", "l", "r" }
local env_turns = M.max_turns
M.KINDS = { "trivial", "trivial", "impossible", "mixed", "mixed", "mixed", "mixed", "mixed" }

local function held_out(cells)
  local h = #cells
  for _, c in ipairs(cells) do h = rl.train.mix(h, c:byte(1), c:byte(2) or 0) end
  return h % 5 == 0
end

local function corridor(rng) return DIRS[rng:random(4)] end

-- gen(params, rng) -> {kind =, cells = {...}}: a task of params.kind ("trivial", "impossible" or
-- "mixed"); params.split = "test" draws a held-out one, otherwise a training one.
function M.gen(params, rng)
  local kind = params.kind
  assert(kind == "trivial" or kind == "impossible" or kind == "mixed",
    "maze.gen: kind must be \"trivial\", \"impossible\" or \"mixed\"")
  local test = params.split == "test"
  while true do
    local cells = {}
    if kind == "trivial" then
      local rooms = rng:random() < 0.5
      for i = 1, rng:random(3, 6) do
        cells[i] = (rooms and i <= 3 and rng:random() < 0.7) and "*" or corridor(rng)
      end
    elseif kind == "impossible" then
      local straight = rng:random() < 0.5
      local d = corridor(rng)
      for i = 1, rng:random(26, 30) do
        cells[i] = straight and d or (i <= 6 and rng:random() < 0.5) and "*" or corridor(rng)
      end
    else
      local j = rng:random(2, 4)
      local n = env_turns - math.max(0, 2 * j + 2 * rng:random(-2, 1)) -- slack 2j - 4 .. 2j + 2
      for i = 1, n do cells[i] = corridor(rng) end
      local placed = 0
      while placed < j do
        local i = rng:random(1, n)
        if #cells[i] == 1 then
          local on = cells[i]
          local off = DIRS[rng:random(4)]
          while off == on do off = DIRS[rng:random(4)] end
          cells[i] = rng:random() < 0.5 and on:upper() .. off or off .. on:upper()
          placed = placed + 1
        end
      end
    end
    if held_out(cells) == test then return { kind = kind, cells = cells } end
  end
end

-- tasks(split, n, seed): n tasks, each of a kind drawn from M.KINDS (the pool's proportions).
function M.tasks(split, n, seed)
  assert(split == "train" or split == "test", "split must be \"train\" or \"test\"")
  local rng, out = rl.rng(seed or 0), {}
  for i = 1, n do out[i] = M.gen({ kind = M.KINDS[rng:random(#M.KINDS)], split = split }, rng) end
  return out
end

-- A junction's way on and dead end ("Ur" -> "u", "r"); nil for other cells.
local function junction(cell)
  if #cell ~= 2 then return nil end
  local a, b = cell:sub(1, 1), cell:sub(2, 2)
  if a:match("%u") then return a:lower(), b end
  return b:lower(), a
end
M.junction = junction

local Episode = {}
Episode.__index = Episode
function M.new() return setmetatable({}, Episode) end

function Episode:observation()
  if self.dead then return "x" end
  return self.task.cells[self.pos]
end

function Episode:reset(task)
  self.task, self.pos, self.dead = task, 1, false
  return self:observation()
end

function Episode:step(action, parsed)
  local a = ((parsed and parsed.text) or action):match("^%s*(%l)")
  local cell = self.task.cells[self.pos]
  local on, off = junction(cell)
  local moved, bumped = false, false
  if self.dead then
    self.dead = false
  elseif on then
    if a == on then moved = true elseif a == off then self.dead = true else bumped = true end
  elseif cell == "*" then
    moved = a == "u" or a == "d" or a == "l" or a == "r"
    bumped = not moved
  else
    moved = a == cell
    bumped = not moved
  end
  if moved then self.pos = self.pos + 1 end
  if self.pos > #self.task.cells then return nil, 1, true, { success = true } end
  return self:observation(), 0, false, { success = false, invalid = bumped or nil }
end

function Episode:clone()
  return setmetatable({ task = self.task, pos = self.pos, dead = self.dead }, Episode)
end

function Episode:state_key() return self.pos .. (self.dead and "x" or "") end

-- The walk of a task: each cell's way on; at a room a random direction (with rng) or u; at a
-- junction, with wrong(cell) true, the dead end and back first.
local function walk(task, rng, wrong)
  local out = {}
  for _, cell in ipairs(task.cells) do
    local on, off = junction(cell)
    if on then
      while wrong(cell) and #out < M.max_turns do
        out[#out + 1] = off
        out[#out + 1] = "b"
      end
      out[#out + 1] = on
    elseif cell == "*" then
      out[#out + 1] = rng and DIRS[rng:random(4)] or "u"
    else
      out[#out + 1] = cell
    end
    if #out >= M.max_turns then break end
  end
  return table.move(out, 1, math.min(#out, M.max_turns), 1, {})
end

-- solve(task [, rng]) -> the shortest walk (never a dead end), at most max_turns actions.
function M.solve(task, rng) return walk(task, rng, function() return false end) end

-- The SFT oracle: at each junction a fair coin between its two exits, again after each dead end.
function M.oracle(task, rng)
  return walk(task, rng, function() return rng:random() < 0.5 end)
end

return M
