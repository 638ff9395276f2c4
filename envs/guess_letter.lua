-- guess_letter.lua - a multi-turn environment: find a hidden letter in an interval of the
-- alphabet in at most 4 guesses. After each wrong guess the reply says "later" or "earlier" and
-- restates the letters still possible, so a policy that bisects on the replies always wins on
-- intervals of up to 15 letters; one that guesses near the low end wins about 60% of the time.
-- Each task has its own interval and letter; the "train" and "test" splits never share a task.
--
--   observation  "letters d to q"       action  "j"
--   observation  "later, k to q"        action  "n"
--   observation  "earlier, k to m"      action  "l"      -> done, reward 1
--
-- The oracle (for SFT) is deliberately imperfect: it usually guesses a sixth of the way into the
-- interval, sometimes the middle, sometimes at random. RL has to find out that the middle wins.
local M = {
  name = "guess_letter",
  max_turns = 4,
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

-- tasks(split, n, seed): n tasks of the split, drawn with the seed.
function M.tasks(split, n, seed)
  assert(split == "train" or split == "test", "split must be \"train\" or \"test\"")
  local pool, rng, out = all_tasks(split), require("moonrl").rng(seed or 0), {}
  for i = 1, n do out[i] = pool[rng:random(#pool)] end
  return out
end

local function letter(i) return string.char(A + i) end

local Episode = {}
Episode.__index = Episode

function M.new() return setmetatable({}, Episode) end

function Episode:reset(task)
  self.task, self.lo, self.hi, self.turn = task, task.from, task.to, 0
  return string.format("letters %s to %s", letter(self.lo), letter(self.hi))
end

-- The first letter of the reply is the guess; a reply without one is invalid (and wastes the
-- turn).
function Episode:step(action, parsed)
  self.turn = self.turn + 1
  local g = (parsed.text or action):match("^%s*(%l)")
  local range = function(word)
    return string.format("%s, %s to %s", word, letter(self.lo), letter(self.hi))
  end
  if not g then return range("invalid"), 0, false, { success = false, invalid = true } end
  local i = g:byte() - A
  if i == self.task.letter then return nil, 1, true, { success = true, turns = self.turn } end
  if i < self.task.letter then
    self.lo = math.max(self.lo, i + 1)
    return range("later"), 0, false, { success = false }
  end
  self.hi = math.min(self.hi, i - 1)
  return range("earlier"), 0, false, { success = false }
end

function Episode:clone()
  return setmetatable({ task = self.task, lo = self.lo, hi = self.hi, turn = self.turn }, Episode)
end

-- The state a guess acts on (GiGPO groups turns that saw the same interval).
function Episode:state_key() return string.format("%d-%d", self.lo, self.hi) end

-- oracle(task, rng) -> the demonstration's actions: 60% of guesses a sixth of the way into the
-- interval still possible, 25% its middle, 15% a random letter of it.
function M.oracle(task, rng)
  local lo, hi, actions = task.from, task.to, {}
  for _ = 1, M.max_turns do
    local u, g = rng:random(), nil
    if u < 0.60 then
      g = lo + (hi - lo) // 6
    elseif u < 0.85 then
      g = (lo + hi) // 2
    else
      g = rng:random(lo, hi)
    end
    actions[#actions + 1] = letter(g)
    if g == task.letter then break end
    if g < task.letter then lo = g + 1 else hi = g - 1 end
  end
  return actions
end

return M
