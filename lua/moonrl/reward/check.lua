-- moonrl.reward.check: moonrl.argcheck's checks for the rl.reward constructors, whose field lists
-- read {name, check, default = v, required = true} ("rl.reward.judge: rpm: a positive number
-- expected, got -1", "rl.reward.judge: unknown field 'modle' (did you mean 'model'?)").
local argcheck = require "moonrl.argcheck"

local M = setmetatable({ enum = argcheck.one_of }, { __index = argcheck })

local function list_of(spec)
  local list = {}
  for i, f in ipairs(spec) do list[i] = { f[1], f.default, f[2], required = f.required } end
  return list
end

-- M.fields(where, t, spec, level) -> t with defaults filled in (a new table), raising at `level`.
function M.fields(where, t, spec, level)
  local out = argcheck.fields(where, t, list_of(spec), (level or 1) + 1)
  return out
end

function M.sub(where, spec) return argcheck.sub(where, list_of(spec)) end

return M
