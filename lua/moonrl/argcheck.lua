-- moonrl.argcheck: checks a constructor's options table against its fields, for the library's
-- objects (rl.replay.new, rl.skills.repo, ...): unknown keys are errors naming the nearest known
-- field, a bad value names the field and what was expected, defaults fill in the rest.
--
--   local opts = argcheck.fields("rl.replay.new", t, {
--     { "capacity", nil, argcheck.integer(1), required = true },
--     { "alpha", 0.6, argcheck.number(0) },
--   }, level)
-- raises "rl.replay.new: capacity: a positive integer expected, got 0" at `level` (as error's).
local options = require "moonrl.train.options"

local M = {}

local describe = options.describe
M.describe = describe

local function finite(v) return type(v) == "number" and v == v and v ~= math.huge and v ~= -math.huge end

-- Checks: function(v) -> nil when v is acceptable, else what was expected.
function M.integer(lo)
  local what = lo == 1 and "a positive integer" or lo == 0 and "a non-negative integer"
    or lo and string.format("an integer >= %d", lo) or "an integer"
  return function(v)
    if math.type(v) == "integer" and (not lo or v >= lo) then return nil end
    return what
  end
end

function M.number(lo, hi, open_lo)
  local what = not lo and "a finite number"
    or hi and string.format("a number in %s%g, %g]", open_lo and "(" or "[", lo, hi)
    or string.format("a number %s %g", open_lo and ">" or ">=", lo)
  return function(v)
    if finite(v) and (not lo or (open_lo and v > lo or not open_lo and v >= lo))
        and (not hi or v <= hi) then
      return nil
    end
    return what
  end
end

function M.one_of(list)
  local quoted = {}
  for i, s in ipairs(list) do quoted[i] = string.format("%q", s) end
  local what = "one of " .. table.concat(quoted, ", ")
  return function(v)
    for _, s in ipairs(list) do if v == s then return nil end end
    local near = type(v) == "string" and options.nearest(v, list)
    return near and string.format("%s (did you mean %q?)", what, near) or what
  end
end

function M.kind(t, what)
  return function(v) if type(v) == t then return nil end return what end
end

-- Either check; the descriptions joined with " or ".
function M.either(a, b)
  return function(v)
    local wa = a(v)
    if not wa then return nil end
    local wb = b(v)
    if not wb then return nil end
    return wa .. " or " .. wb
  end
end

function M.literal(x, what)
  return function(v) if v == x then return nil end return what end
end

-- The options t of constructor `where` checked against fields ({name, default, check,
-- required = true}); returns a new table with every field (defaults filled in). Errors are
-- raised at `level` (1 = the caller of fields).
function M.fields(where, t, list, level)
  level = (level or 1) + 1
  if type(t) ~= "table" then
    error(string.format("%s: a table of options expected, got %s", where, describe(t)), level)
  end
  local known, order = {}, {}
  for _, f in ipairs(list) do known[f[1]] = f; order[#order + 1] = f[1] end
  local bad = {}
  for k in pairs(t) do
    if type(k) ~= "string" then
      bad[#bad + 1] = string.format("%s: options are named (key = value), got a value at [%s]",
        where, tostring(k))
    elseif not known[k] then
      local near = options.nearest(k, order)
      bad[#bad + 1] = string.format("%s: unknown option '%s'%s", where, k,
        near and string.format(" (did you mean '%s'?)", near) or "")
    end
  end
  if #bad > 0 then
    table.sort(bad)
    error(table.concat(bad, "; "), level)
  end
  local out = {}
  for _, f in ipairs(list) do
    local name, v = f[1], t[f[1]]
    if v == nil then
      if f.required then
        error(string.format("%s: %s: %s expected (it is required)", where, name, f[3](nil)), level)
      end
      v = f[2]
    else
      local want = f[3](v)
      if want then error(string.format("%s: %s: %s expected, got %s", where, name, want, describe(v)), level) end
    end
    out[name] = v
  end
  return out
end

return M
