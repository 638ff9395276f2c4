-- moonrl.curriculum.gate: which rolled-out groups a training step keeps. rl.train drops a
-- rejected group (its episodes still reach cur:observe) and, with resample, draws more tasks
-- in its place, up to max_tries rollouts per step.
--
-- rl.curriculum.gate{reject = "zero_variance" | "adv_range" | fn(group) -> bool, resample =
-- true, max_tries = 4, min_adv = .05}: "zero_variance" rejects a group whose rewards are all
-- equal (it has no advantage to learn from); "adv_range" one whose largest |reward - group mean|
-- is below min_adv (advantages a std normalisation would inflate from noise); fn gets {episodes
-- = {...}, rewards = {...}, task =} and returns true to reject.
local check = require "moonrl.curriculum.check"

local M = {}
local Gate = { __name = "moonrl.curriculum.gate" }
Gate.__index = Gate
M.Gate = Gate

function M.is_gate(v) return getmetatable(v) == Gate end

function M.gate(opts)
  local who = "rl.curriculum.gate"
  local o = check.fields(who, opts, {
    { "reject", check.oneof({ "zero_variance", "adv_range" }, check.func, "a function(group) -> bool"),
      "zero_variance" },
    { "resample", check.boolean, true }, { "max_tries", check.integer(1), 4 },
    { "min_adv", check.number(0), 0.05 },
  }, 2)
  return setmetatable(o, Gate)
end

-- Whether the gate rejects the group of these episodes (a list of episode tables).
function Gate:rejects(episodes)
  local rewards = {}
  for i, ep in ipairs(episodes) do rewards[i] = ep.reward end
  if self.reject == "zero_variance" then
    for i = 2, #rewards do if rewards[i] ~= rewards[1] then return false end end
    return true
  elseif self.reject == "adv_range" then
    local sum = 0
    for _, r in ipairs(rewards) do sum = sum + r end
    local m, spread = sum / #rewards, 0
    for _, r in ipairs(rewards) do spread = math.max(spread, math.abs(r - m)) end
    return spread < self.min_adv
  end
  local v = self.reject({ episodes = episodes, rewards = rewards, task = episodes[1] and episodes[1].task })
  if type(v) ~= "boolean" then
    error("rl.curriculum.gate: reject returned " .. check.describe(v) .. " (true or false expected)", 0)
  end
  return v
end

function Gate:config()
  return { reject = type(self.reject) == "function" and "<function>" or self.reject,
    resample = self.resample, max_tries = self.max_tries, min_adv = self.min_adv }
end

return M
