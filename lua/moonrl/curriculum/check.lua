-- moonrl.curriculum.check: moonrl.argcheck's checks for rl.curriculum's constructors, whose field
-- lists read {name, check, default [, required = true]}; a default that is a function is called
-- with the fields resolved so far, and no options at all means every default.
local argcheck = require "moonrl.argcheck"

local M = setmetatable({ oneof = argcheck.one_of }, { __index = argcheck })

-- M.fields(who, t, spec, level) -> t's fields with defaults filled in, raising at `level`.
function M.fields(who, t, spec, level)
  local list = {}
  for i, f in ipairs(spec) do
    list[i] = { f[1], f[3], f[2], required = f.required, lazy = type(f[3]) == "function" }
  end
  local out = argcheck.fields(who, t == nil and {} or t, list, (level or 1) + 1)
  return out
end

return M
