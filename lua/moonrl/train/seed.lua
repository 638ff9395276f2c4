-- moonrl.train.seed: deterministic seed mixing for the trainer's per-step, per-episode and
-- per-epoch seeds (the same integers give the same seed in every process).
local M = {}

-- Mixes integers into one non-negative 63-bit seed (splitmix64's finaliser).
function M.mix(...)
  local h = 0x2545F4914F6CDD1D
  for _, v in ipairs { ... } do
    h = h ~ (v + 0x9E3779B97F4A7C15 + (h << 6) + (h >> 2))
    h = (h ~ (h >> 30)) * 0xBF58476D1CE4E5B9
    h = (h ~ (h >> 27)) * 0x94D049BB133111EB
    h = h ~ (h >> 31)
  end
  return h & 0x7FFFFFFFFFFFFFFF
end

return M
