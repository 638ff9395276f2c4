-- arith.lua - a procedural arithmetic environment with ten difficulty levels: add two 10-digit
-- numbers column by column, one turn per column from the right, where the level is the number
-- of carries (0 to 9). Each turn shows the column's digit sum and the carry into it; the agent
-- answers the sum's last digit; a wrong digit ends the episode (reward 0); ten right digits
-- give reward 1.
--
--   observation  "12+0"      action  "2"      (column 1: 7 + 5, no carry in)
--   observation  "4+1"       action  "5"      (column 2: 1 + 3, carry 1)
--   ...                                       (10 columns)           -> reward 1
--
-- The oracle (for the SFT warm start) adds each column but usually forgets the carry (it adds
-- it with probability oracle_carry, .2), so the warm-started policy solves 0-carry tasks, 20% of
-- 1-carry tasks, 4% of 2-carry tasks and next to none with more: what the policy knows of
-- carries it learns from reward. The skill is the same in every column, so tasks with few
-- carries teach what tasks with many need. gen(params, rng) makes a task with params.carries
-- carries (for rl.curriculum.procedural); the "test" split is held out (pairs whose hash says
-- so, 7 to 9 carries: levels 8 to 10), and neither gen nor the "train" split returns one.
local rl = require "moonrl"

local M = { name = "arith", format = "line", max_turns = 10, columns = 10, oracle_carry = 0.2 }

local POW = {}
for t = 1, 11 do POW[t] = math.tointeger(10 ^ (t - 1)) end

-- Whether the pair is held out (about one in eight).
local function held_out(a, b) return (a * 7919 + b * 104729) % 8 == 0 end

-- Two 10-digit numbers (leading zeros allowed) whose sum has a carry into exactly the columns
-- of `into` (a set of columns 2..10); the carry out of column 10 is free.
local function pair(rng, into)
  local a, b, carry = 0, 0, 0
  for t = 1, M.columns do
    local want = into[t + 1] and 1 or 0
    local x, y
    repeat
      x, y = rng:random(0, 9), rng:random(0, 9)
    until t == M.columns or ((x + y + carry >= 10) and 1 or 0) == want
    a, b = a + x * POW[t], b + y * POW[t]
    carry = (x + y + carry >= 10) and 1 or 0
  end
  return a, b
end

-- gen(params, rng) -> {a =, b =, carries =}: a task with params.carries (0..9) carries, at
-- random columns; params.split = "test" draws a held-out pair, otherwise a training one.
function M.gen(params, rng)
  local k = params.carries
  assert(math.type(k) == "integer" and k >= 0 and k <= M.columns - 1, "arith.gen: carries must be an integer in 0..9")
  local test = params.split == "test"
  while true do
    local cols = {}
    for t = 2, M.columns do cols[#cols + 1] = t end
    local into = {}
    for i = 1, k do -- k distinct columns, a partial Fisher-Yates shuffle
      local j = rng:random(i, #cols)
      cols[i], cols[j] = cols[j], cols[i]
      into[cols[i]] = true
    end
    local a, b = pair(rng, into)
    if held_out(a, b) == test then return { a = a, b = b, carries = k } end
  end
end

-- tasks(split, n, seed): "train": 0 to 9 carries in turn; "test": held out, 7 to 9 carries in
-- turn (levels 8 to 10).
function M.tasks(split, n, seed)
  assert(split == "train" or split == "test", "split must be \"train\" or \"test\"")
  local rng, out = rl.rng(seed or 0), {}
  for i = 1, n do
    local k = split == "train" and (i - 1) % 10 or 7 + (i - 1) % 3
    out[i] = M.gen({ carries = k, split = split }, rng)
  end
  return out
end

-- The digit of x at column t (1 = units).
local function digit(x, t) return (x // POW[t]) % 10 end

local Episode = {}
Episode.__index = Episode
function M.new() return setmetatable({}, Episode) end

function Episode:observation()
  local t = self.col
  return string.format("%d+%d", digit(self.task.a, t) + digit(self.task.b, t), self.carry)
end

function Episode:reset(task)
  self.task, self.col, self.carry = task, 1, 0
  return self:observation()
end

function Episode:step(action, parsed)
  local t = self.col
  local sum = digit(self.task.a, t) + digit(self.task.b, t) + self.carry
  local g = (parsed.text or action):match("^%s*(%d)")
  if tonumber(g) ~= sum % 10 then return nil, 0, true, { success = false } end
  if t == M.columns then return nil, 1, true, { success = true } end
  self.col, self.carry = t + 1, sum // 10
  return self:observation(), 0, false, { success = false }
end

function Episode:clone()
  return setmetatable({ task = self.task, col = self.col, carry = self.carry }, Episode)
end

function Episode:state_key() return self:observation() end

-- The oracle: adds each column's two digits and usually forgets the carry (it adds it with
-- probability M.oracle_carry).
function M.oracle(task, rng)
  local out, carry = {}, 0
  for t = 1, M.columns do
    local s = digit(task.a, t) + digit(task.b, t)
    local shown = s + carry
    out[t] = tostring((carry == 1 and rng:random() < M.oracle_carry and shown or s) % 10)
    carry = shown // 10
  end
  return out
end

-- The right answers (for checks).
function M.solve(task)
  local out, carry = {}, 0
  for t = 1, M.columns do
    local s = digit(task.a, t) + digit(task.b, t) + carry
    out[t] = tostring(s % 10)
    carry = s // 10
  end
  return out
end

return M
