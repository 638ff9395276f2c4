-- grid.lua - FrozenLake 6x6 with slips, for the grid-world recipe (recipes/grid.lua,
-- shared/spec/reproductions.md §3.6: TSR, T²PO, AEM, DPEPO). A task is a 6x6 map of frozen
-- cells (.) and holes (H), a start and a goal (G) at Manhattan distance 3-6 with a path of at most 7 moves between
-- them. Actions are u, d, l, r (the first letter of the reply counts); a move off the map stays
-- put. With probability M.SLIP (0.2) a move slips to one of the two perpendicular directions.
-- Slips come from the episode's own stream (a number drawn from reset's rng, mixed with the
-- turn index), so an episode is deterministic given its seed and clones exactly.
--
-- The observation is a cropped 3x3 view around the agent (@) with rows joined by "/", cells off
-- the map as #, then the goal's offset: "..H/.@./#.G d1r1" (the goal one down, one right); 16
-- bytes at most, so ten turns fit a 256-token context. Reaching G gives reward 1 and ends the
-- episode; a hole ends it with 0; max_turns is 10.
--
-- The demonstrator (M.demo_action) walks a shortest path with probability 0.75 and a random
-- direction otherwise; M.plan_action is the shortest-path walk alone (replanned each turn after
-- slips: the ceiling row). Held out: maps whose hash says so (about one in five); neither split
-- returns the other's.
local rl = require "moonrl"

local M = { name = "grid", format = "line", max_turns = 10, SLIP = 0.2, N = 6 }

local N = M.N
local MOVES = { u = { -1, 0 }, d = { 1, 0 }, l = { 0, -1 }, r = { 0, 1 } }
local SIDE = { u = { "l", "r" }, d = { "l", "r" }, l = { "u", "d" }, r = { "u", "d" } }
M.ACTIONS = { "u", "d", "l", "r" }

local function cell(task, r, c)
  if r < 1 or r > N or c < 1 or c > N then return "#" end
  if r == task.goal[1] and c == task.goal[2] then return "G" end
  return task.rows[r]:sub(c, c)
end

-- distance(task, r, c) -> the number of moves of a shortest slip-free path from (r, c) to the
-- goal around the holes (math.huge when there is none).
function M.distance(task, r, c)
  local dist, queue, head = { [r * 16 + c] = 0 }, { { r, c } }, 1
  while queue[head] do
    local p = queue[head]
    head = head + 1
    if p[1] == task.goal[1] and p[2] == task.goal[2] then return dist[p[1] * 16 + p[2]] end
    for _, a in ipairs(M.ACTIONS) do
      local nr, nc = p[1] + MOVES[a][1], p[2] + MOVES[a][2]
      local ch = cell(task, nr, nc)
      if ch ~= "#" and ch ~= "H" and not dist[nr * 16 + nc] then
        dist[nr * 16 + nc] = dist[p[1] * 16 + p[2]] + 1
        queue[#queue + 1] = { nr, nc }
      end
    end
  end
  return math.huge
end

local function held_out(task)
  local h = task.start[1] * 7 + task.start[2]
  for r = 1, N do
    for c = 1, N do h = rl.train.mix(h, task.rows[r]:byte(c)) end
  end
  return rl.train.mix(h, task.goal[1], task.goal[2]) % 5 == 0
end

-- gen(split, rng) -> a task {rows = {6 strings}, start = {r, c}, goal = {r, c}} of the split.
function M.gen(split, rng)
  while true do
    local rows = {}
    for r = 1, N do
      local s = {}
      for c = 1, N do s[c] = rng:random() < 0.15 and "H" or "." end
      rows[r] = table.concat(s)
    end
    local task = { rows = rows, start = { rng:random(N), rng:random(N) }, goal = { rng:random(N), rng:random(N) } }
    local sr, sc, gr, gc = task.start[1], task.start[2], task.goal[1], task.goal[2]
    local far = math.abs(sr - gr) + math.abs(sc - gc)
    if far >= 3 and far <= 6 and rows[sr]:sub(sc, sc) == "." and rows[gr]:sub(gc, gc) == "."
      and M.distance(task, sr, sc) <= 7 and held_out(task) == (split == "test") then
      return task
    end
  end
end

-- tasks(split, n, seed): n maps of "train" or "test".
function M.tasks(split, n, seed)
  assert(split == "train" or split == "test", "grid.tasks: split must be \"train\" or \"test\"")
  local rng, out = rl.rng(seed or 0), {}
  for i = 1, n do out[i] = M.gen(split, rng) end
  return out
end

local Episode = {}
Episode.__index = Episode
function M.new() return setmetatable({}, Episode) end

function Episode:observation()
  local t, r, c = self.task, self.pos[1], self.pos[2]
  local rows = {}
  for dr = -1, 1 do
    local s = {}
    for dc = -1, 1 do s[#s + 1] = (dr == 0 and dc == 0) and "@" or cell(t, r + dr, c + dc) end
    rows[#rows + 1] = table.concat(s)
  end
  local dr, dc = t.goal[1] - r, t.goal[2] - c
  return string.format("%s %s%d%s%d", table.concat(rows, "/"), dr < 0 and "u" or "d", math.abs(dr),
    dc < 0 and "l" or "r", math.abs(dc))
end

-- reset(task, rng): the slip stream's seed is drawn from rng (the episode's stream).
function Episode:reset(task, rng)
  self.task, self.pos, self.t = task, { task.start[1], task.start[2] }, 0
  self.seed = rng and rng:random(1, 0x7fffffff) or 1
  return self:observation()
end

-- The direction a move in direction a takes at turn t: a, or a perpendicular one on a slip.
function Episode:slipped(a, t)
  local h = rl.train.mix(self.seed, t) -- 63 bits (rl.train.mix clears the sign bit)
  local u = (h >> 10) * 2.0 ^ -53
  if u < M.SLIP then return SIDE[a][u < M.SLIP / 2 and 1 or 2] end
  return a
end

function Episode:step(action, parsed)
  local a = ((parsed and parsed.text) or action or ""):match("^%s*([udlr])")
  self.t = self.t + 1
  if not a then return self:observation(), 0, false, { success = false, invalid = true } end
  local m = MOVES[self:slipped(a, self.t)]
  local nr, nc = self.pos[1] + m[1], self.pos[2] + m[2]
  local ch = cell(self.task, nr, nc)
  if ch ~= "#" then self.pos = { nr, nc } end
  if ch == "G" then return nil, 1, true, { success = true } end
  if ch == "H" then return nil, 0, true, { success = false, hole = true } end
  return self:observation(), 0, false, { success = false }
end

function Episode:clone()
  return setmetatable({ task = self.task, pos = { self.pos[1], self.pos[2] }, t = self.t, seed = self.seed }, Episode)
end

function Episode:state_key() return self.pos[1] .. "," .. self.pos[2] end

-- The episode's shortest-path distance to the goal (0 there; math.huge in a hole or cut off).
function Episode:distance()
  if cell(self.task, self.pos[1], self.pos[2]) == "H" then return math.huge end
  return M.distance(self.task, self.pos[1], self.pos[2])
end

-- plan_action(task, pos) -> the first move of a shortest slip-free path from pos (u when none).
function M.plan_action(task, pos)
  local best, bd = "u", math.huge
  for _, a in ipairs(M.ACTIONS) do
    local nr, nc = pos[1] + MOVES[a][1], pos[2] + MOVES[a][2]
    local ch = cell(task, nr, nc)
    if ch ~= "#" and ch ~= "H" then
      local d = M.distance(task, nr, nc)
      if d < bd then best, bd = a, d end
    end
  end
  return best
end

-- demo_action(task, pos, rng) -> the demonstrator's move: the plan with probability 0.75, else a
-- random direction.
function M.demo_action(task, pos, rng)
  if rng:random() < 0.25 then return M.ACTIONS[rng:random(4)] end
  return M.plan_action(task, pos)
end

-- play(task, policy, seed) -> {success =, turns =, messages =}: a closed-loop scripted walk,
-- policy(task, pos) -> action, slips from rl.rng(seed); messages is the conversation (for SFT).
function M.play(task, policy, seed)
  local inst = M.new()
  local msgs = { { role = "user", content = inst:reset(task, rl.rng(seed)) } }
  for turn = 1, M.max_turns do
    local a = policy(task, inst.pos)
    msgs[#msgs + 1] = { role = "assistant", content = a }
    local obs, _, done, info = inst:step(a)
    if done then return { success = info.success, turns = turn, messages = msgs } end
    msgs[#msgs + 1] = { role = "user", content = obs }
  end
  return { success = false, turns = M.max_turns, messages = msgs }
end

-- oracle(task, rng): the demonstrator's moves on one slip-free plan (the interface's open-loop
-- form; recipes/grid.lua makes its SFT data from closed-loop M.play walks instead).
function M.oracle(task, rng)
  local out, pos = {}, { task.start[1], task.start[2] }
  for _ = 1, M.max_turns do
    local a = M.demo_action(task, pos, rng)
    out[#out + 1] = a
    local nr, nc = pos[1] + MOVES[a][1], pos[2] + MOVES[a][2]
    local ch = cell(task, nr, nc)
    if ch == "G" or ch == "H" then break end
    if ch ~= "#" then pos = { nr, nc } end
  end
  return out
end

return M
