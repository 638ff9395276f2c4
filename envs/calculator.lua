-- calculator.lua - a tool-use environment in about 50 lines, written the way the README shows:
-- add two digits; the agent may call the `add` tool and then answer. Calling the tool and copying
-- its result always works; the oracle does so only half of the time and otherwise guesses a sum
-- that is often off, so RL has to learn to use the tool.
--
--   observation "add 7 8"          action "CALL add 7 8"
--   observation "15"               action "ANSWER 15"          -> reward 1
local rl = require "moonrl"

local M = { name = "calculator", max_turns = 3, format = "line" }

M.tools = {
  rl.tool { name = "add", description = "add two integers", args = { "a", "b" },
    run = function(args)
      local a, b = tonumber(args[1]), tonumber(args[2])
      if not (a and b) then return "error: add needs two numbers" end
      return tostring(math.tointeger(a + b) or a + b)
    end },
}

-- Tasks: pairs of digits; a pair is held out when (a * 7 + b) % 5 == 0.
function M.tasks(split, n, seed)
  local rng, out = rl.rng(seed or 0), {}
  while #out < n do
    local a, b = rng:random(0, 9), rng:random(0, 9)
    if ((a * 7 + b) % 5 == 0) == (split == "test") then out[#out + 1] = { a = a, b = b } end
  end
  return out
end

local Episode = {}
Episode.__index = Episode
function M.new() return setmetatable({}, Episode) end

function Episode:reset(task)
  self.task = task
  return string.format("add %d %d", task.a, task.b)
end

-- Tool calls never reach step (the engine runs them); anything that is not an answer is wasted.
function Episode:step(_, parsed)
  if parsed.kind ~= "answer" then return "answer with ANSWER n, or CALL add a b", 0, false end
  local right = tonumber(parsed.text) == self.task.a + self.task.b
  return nil, right and 1 or 0, true, { success = right }
end

-- The oracle: half of the time it calls the tool, otherwise it guesses a sum (often off).
function M.oracle(task, rng)
  local sum = task.a + task.b
  if rng:random() < 0.5 then return { string.format("CALL add %d %d", task.a, task.b), "ANSWER " .. sum } end
  return { "ANSWER " .. (sum + rng:random(-3, 3)) }
end

return M
