-- guess_letter.lua - a multi-turn environment: find a hidden letter between two given letters,
-- with "later" / "earlier" replies after each guess. Bisection finds it within max_turns; a
-- policy that ignores the replies does not. Each task has its own interval and letter; the
-- "train" and "test" splits never share a task.
--
--   observation  "find the letter from d to q"     action  "j"
--   observation  "later"                            action  "n"
--   observation  "earlier"                          action  "l"      -> "found", reward 1
local M = {
  name = "guess_letter",
  max_turns = 5,
  system = nil,
  format = "line",
}

local A = string.byte("a")

-- Every (from, to, letter) with an interval of 6 to 16 letters inside a..x, split by a hash so
-- that about one task in five is held out.
local function all_tasks(split)
  local list = {}
  for lo = 0, 23 do
    for hi = lo + 5, math.min(lo + 15, 23) do
      for s = lo, hi do
        local held_out = (lo * 31 + hi * 17 + s * 7) % 5 == 0
        if (split == "test") == held_out then
          list[#list + 1] = { from = lo, to = hi, letter = s }
        end
      end
    end
  end
  return list
end

-- tasks(split, n, seed): n tasks of the split, drawn with the seed (repeats only if n exceeds
-- the split's size).
function M.tasks(split, n, seed)
  assert(split == "train" or split == "test", "split must be \"train\" or \"test\"")
  local pool, rng, out = all_tasks(split), require("moonrl").rng(seed or 0), {}
  for i = 1, n do out[i] = pool[rng:random(#pool)] end
  return out
end

local function letter(i) return string.char(A + i) end

local function first_observation(task)
  return string.format("find the letter from %s to %s", letter(task.from), letter(task.to))
end

local Episode = {}
Episode.__index = Episode

function M.new() return setmetatable({}, Episode) end

function Episode:reset(task, rng)
  self.task, self.rng, self.lo, self.hi, self.turn = task, rng, task.from, task.to, 0
  return first_observation(task)
end

-- The first letter of the reply decides; anything else is an invalid guess (no reward).
function Episode:step(action, parsed)
  self.turn = self.turn + 1
  local text = parsed.text or action
  local g = text:match("^%s*(%l)")
  if not g then return "invalid", 0, false, { success = false } end
  local i = g:byte() - A
  if i == self.task.letter then return nil, 1, true, { success = true, turns = self.turn } end
  if i < self.task.letter then
    self.lo = math.max(self.lo, i + 1)
    return "later", 0, false, { success = false }
  end
  self.hi = math.min(self.hi, i - 1)
  return "earlier", 0, false, { success = false }
end

function Episode:clone()
  local copy = setmetatable({}, Episode)
  for k, v in pairs(self) do copy[k] = v end
  return copy
end

function Episode:state_key()
  return string.format("%d-%d", self.lo, self.hi)
end

-- oracle(task, rng): a deliberately imperfect demonstration: bisection, except that 40% of the
-- guesses are a random letter of the interval still possible. Returns the list of actions.
function M.oracle(task, rng)
  local lo, hi, actions = task.from, task.to, {}
  for _ = 1, M.max_turns do
    local g = (lo + hi) // 2
    if rng:random() < 0.4 then g = rng:random(lo, hi) end
    actions[#actions + 1] = letter(g)
    if g == task.letter then break end
    if g < task.letter then lo = g + 1 else hi = g - 1 end
  end
  return actions
end

-- The conversation an action list produces (for SFT): messages alternating user/assistant.
function M.demonstration(task, actions)
  local msgs = { { role = "user", content = first_observation(task) } }
  local lo, hi = task.from, task.to
  for _, a in ipairs(actions) do
    msgs[#msgs + 1] = { role = "assistant", content = a }
    local i = a:byte() - A
    if i == task.letter then break end
    msgs[#msgs + 1] = { role = "user", content = i < task.letter and "later" or "earlier" }
  end
  return msgs
end

return M
