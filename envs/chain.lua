-- chain.lua - chained arithmetic with ten levels whose skills come in order. Ten operations on
-- a value 0..3, op k: v -> (A[k] * v + B[k]) mod 4, each with its own letter (a..j) and its own
-- four answer symbols (op a answers in A B C D, op b in E F G H, ...); a level-L task applies ops
-- 1 to L, each once, in a random order, to a start value, one turn per op. Each turn shows the
-- current value and the op's letter; the agent answers the result's symbol; a wrong answer ends
-- the episode (reward 0); the last right answer gives reward 1.
--
--   observation  "2c"   action  "J"    (op c is v -> 3v + 3: 2 -> 9 -> 1, op c's symbol for 1)
--   observation  "1a"   action  "C"    (op a is v -> v + 1: 1 -> 2, op a's symbol for 2)
--   ...                                (L turns)                   -> reward 1
--
-- Every level adds one op that no lower level uses, so what level L needs beyond level L - 1 can
-- only be learnt on tasks that already get ops 1 to L - 1 right: the skills come in order, unlike
-- envs/arith.lua, where every level exercises the same carry. Each op answering in symbols of its
-- own keeps what is learnt of one op from reading as a confident wrong answer of another. The
-- oracle (for the SFT warm start) knows ops a and b and answers any other op with a random one of
-- its four symbols, so the warm-started policy solves levels 1 and 2 and a quarter of each further
-- op by chance: level L succeeds about 4^-(L - 2) of the time. gen(params, rng) makes a task
-- with params.ops ops (for rl.curriculum.procedural); the "test" split is held out (start value
-- and order whose hash says so, about one in eight), and neither gen nor the "train" split
-- returns one.
local rl = require "moonrl"

local M = { name = "chain", format = "line", max_turns = 10, levels = 10, known = 2, base = 4 }

local LETTERS = "abcdefghij"
local A = { 1, 3, 3, 1, 3, 1, 1, 3, 3, 1 }
local B = { 1, 2, 3, 1, 0, 3, 2, 1, 2, 3 }

-- The result of op k on value v.
function M.apply(k, v) return (A[k] * v + B[k]) % M.base end

-- Op k's symbol for value v: op a answers in A B C D, op b in E F G H, ..., op g in Y Z k l,
-- ..., op j in u v w x (40 symbols, none of them an op's letter).
local OUT = "ABCDEFGHIJKLMNOPQRSTUVWXYZklmnopqrstuvwx"
local function symbol(k, v)
  local i = (k - 1) * M.base + v + 1
  return OUT:sub(i, i)
end
M.symbol = symbol

-- Whether the task (start value and order) is held out.
local function held_out(v0, order)
  local h = v0
  for _, k in ipairs(order) do h = h * 11 + k end
  return rl.train.mix(h, 0xC4A1) % 8 == 0
end

-- gen(params, rng) -> {v0 =, order = {...}, ops =}: a task applying ops 1..params.ops (1..10) in
-- a random order; params.split = "test" draws a held-out one, otherwise a training one.
function M.gen(params, rng)
  local n = params.ops
  assert(math.type(n) == "integer" and n >= 1 and n <= M.levels, "chain.gen: ops must be an integer in 1..10")
  local test = params.split == "test"
  while true do
    local order = {}
    for k = 1, n do order[k] = k end
    for i = n, 2, -1 do
      local j = rng:random(1, i)
      order[i], order[j] = order[j], order[i]
    end
    local v0 = rng:random(0, M.base - 1)
    if held_out(v0, order) == test then return { v0 = v0, order = order, ops = n } end
  end
end

-- tasks(split, n, seed): "train": 1 to 10 ops in turn; "test": held out, 8 to 10 ops in turn.
function M.tasks(split, n, seed)
  assert(split == "train" or split == "test", "split must be \"train\" or \"test\"")
  local rng, out = rl.rng(seed or 0), {}
  for i = 1, n do
    local k = split == "train" and 1 + (i - 1) % M.levels or 8 + (i - 1) % 3
    out[i] = M.gen({ ops = k, split = split }, rng)
  end
  return out
end

local Episode = {}
Episode.__index = Episode
function M.new() return setmetatable({}, Episode) end

function Episode:observation()
  local k = self.task.order[self.t]
  return string.format("%d%s", self.v, LETTERS:sub(k, k))
end

function Episode:reset(task)
  self.task, self.t, self.v = task, 1, task.v0
  return self:observation()
end

function Episode:step(action, parsed)
  local k = self.task.order[self.t]
  local want = M.apply(k, self.v)
  local g = (parsed.text or action):match("^%s*(%S)")
  if g ~= symbol(k, want) then return nil, 0, true, { success = false } end
  if self.t == #self.task.order then return nil, 1, true, { success = true } end
  self.t, self.v = self.t + 1, want
  return self:observation(), 0, false, { success = false }
end

function Episode:clone()
  return setmetatable({ task = self.task, t = self.t, v = self.v }, Episode)
end

function Episode:state_key() return self:observation() end

-- The right answers, turn by turn.
function M.solve(task)
  local out, v = {}, task.v0
  for t, k in ipairs(task.order) do
    v = M.apply(k, v)
    out[t] = symbol(k, v)
  end
  return out
end

-- The oracle: right on ops 1..M.known; on the others a random one of the op's symbols.
function M.oracle(task, rng)
  local out = M.solve(task)
  for t, k in ipairs(task.order) do
    if k > M.known then out[t] = symbol(k, rng:random(0, M.base - 1)) end
  end
  return out
end

return M
