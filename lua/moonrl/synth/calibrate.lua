-- moonrl.synth.calibrate: difficulty calibration by the current policy (rl.synth.pass_rate).
--
--   local cal = rl.synth.pass_rate { k = 8, band = { .125, .875 }, temperature = nil }
--   local ps = cal:measure(ctx, tasks, seed)   -- for each task {p =, successes =, k =}
--   cal:verdict(p)                             -- "ok", "too_easy" (p > band[2]) or "too_hard"
--
-- p is the success rate of k rollouts of the task by the policy as it is now (the trainer's
-- rollout stage at the run's temperature, or ctx.solve; moonrl.synth.solver); a task is admitted
-- when band[1] <= p <= band[2]. The loop keeps each task's p history in its archive.
local argcheck = require "moonrl.argcheck"
local solver = require "moonrl.synth.solver"

local M = {}
local PassRate = { __name = "moonrl.synth.pass_rate" }
PassRate.__index = PassRate
M.PassRate = PassRate

local function band_check(v)
  if argcheck.range(v) == nil and v[1] >= 0 and v[2] <= 1 then return nil end
  return "a band {low, high} with 0 <= low <= high <= 1"
end

-- rl.synth.pass_rate{k = 8, band = {.125, .875}, temperature =}.
function M.pass_rate(opts)
  local o = argcheck.fields("rl.synth.pass_rate", opts or {}, {
    { "k", 8, argcheck.integer(1) },
    { "band", { 0.125, 0.875 }, band_check },
    { "temperature", nil, argcheck.number(0) },
  }, 2)
  return setmetatable({ k = o.k, band = { o.band[1], o.band[2] }, temperature = o.temperature }, PassRate)
end

function M.is_pass_rate(v) return getmetatable(v) == PassRate end

-- cal:measure(ctx, tasks, seed) -> for each task {p =, successes =, k =}.
function PassRate:measure(ctx, tasks, seed)
  local outs = solver.rollouts(ctx, tasks, self.k, seed, "pass_rate", self.temperature)
  local ps = {}
  for i, list in ipairs(outs) do
    local s = 0
    for _, out in ipairs(list) do if out.success then s = s + 1 end end
    ps[i] = { p = s / self.k, successes = s, k = self.k }
  end
  return ps
end

function PassRate:verdict(p)
  if p > self.band[2] then return "too_easy" end
  if p < self.band[1] then return "too_hard" end
  return "ok"
end

function PassRate:config()
  return { k = self.k, band = { self.band[1], self.band[2] }, temperature = self.temperature }
end

return M
