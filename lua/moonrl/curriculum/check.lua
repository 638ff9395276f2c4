-- moonrl.curriculum.check: argument checks for rl.curriculum's constructors: named fields, each
-- with its check and default; an unknown field is refused with the nearest known name.
--
-- A check is function(v) -> nil when v is acceptable, else what was expected ("a number in
-- [0, 1]"). M.fields(who, t, spec, level) returns t's fields with defaults filled in, or raises
-- "<who>: <field>: <expected> expected, got <value>" at the caller `level` levels up.
local options = require "moonrl.train.options"

local M = {}
M.describe = options.describe

local function finite(v) return type(v) == "number" and v == v and v ~= math.huge and v ~= -math.huge end
M.finite = finite

function M.number(lo, hi, open_lo)
  local what = lo and hi and string.format("a number in %s%g, %g]", open_lo and "(" or "[", lo, hi)
    or lo and string.format("a number %s %g", open_lo and ">" or ">=", lo) or "a finite number"
  return function(v)
    if finite(v) and (not lo or (open_lo and v > lo or not open_lo and v >= lo)) and (not hi or v <= hi) then
      return nil
    end
    return what
  end
end

function M.integer(lo, hi)
  local what = lo and hi and string.format("an integer in [%d, %d]", lo, hi)
    or lo and string.format("an integer >= %d", lo) or "an integer"
  return function(v)
    if math.type(v) == "integer" and (not lo or v >= lo) and (not hi or v <= hi) then return nil end
    return what
  end
end

function M.kind(t, what) return function(v) if type(v) == t then return nil end return what end end
M.func = M.kind("function", "a function")
M.boolean = M.kind("boolean", "true or false")
M.string = M.kind("string", "a string")

-- One of list's strings, or (with other) whatever other accepts.
function M.oneof(list, other, other_what)
  local quoted = {}
  for i, s in ipairs(list) do quoted[i] = string.format("%q", s) end
  local what = table.concat(quoted, ", ")
  what = other and what .. " or " .. other_what or "one of " .. what
  return function(v)
    for _, s in ipairs(list) do if v == s then return nil end end
    if other and other(v) == nil then return nil end
    local near = type(v) == "string" and options.nearest(v, list)
    return near and string.format("%s (did you mean %q?)", what, near) or what
  end
end

-- Whether t is a plain list 1..#t (and nothing else).
function M.is_list(t)
  if type(t) ~= "table" then return false end
  local n = #t
  for k in pairs(t) do
    if math.type(k) ~= "integer" or k < 1 or k > n then return false end
  end
  return true
end

-- spec: an ordered list of {name, check, default [, required = true]}; a default that is a
-- function is called with the fields resolved so far.
function M.fields(who, t, spec, level)
  level = (level or 1) + 1
  if t == nil then t = {} end
  if type(t) ~= "table" then
    error(string.format("%s: a table of fields expected, got %s", who, M.describe(t)), level)
  end
  local known, names = {}, {}
  for _, f in ipairs(spec) do known[f[1]] = f; names[#names + 1] = f[1] end
  local bad = {}
  for k in pairs(t) do
    if type(k) ~= "string" then
      bad[#bad + 1] = string.format("fields are named (name = value), got a value at [%s]", tostring(k))
    elseif not known[k] then
      local near = options.nearest(k, names)
      bad[#bad + 1] = string.format("unknown field '%s'%s", k,
        near and string.format(" (did you mean '%s'?)", near) or
          string.format(" (known: %s)", table.concat(names, ", ")))
    end
  end
  if #bad > 0 then
    table.sort(bad)
    error(who .. ": " .. table.concat(bad, "; "), level)
  end
  local out = {}
  for _, f in ipairs(spec) do
    local name, check, default = f[1], f[2], f[3]
    local v = t[name]
    if v == nil then
      if f.required then error(string.format("%s: %s: %s expected (it is required)", who, name, check(nil)), level) end
      if type(default) == "function" then v = default(out) else v = default end
    else
      local want = check(v)
      if want then error(string.format("%s: %s: %s expected, got %s", who, name, want, M.describe(v)), level) end
    end
    out[name] = v
  end
  return out
end

-- Raises "<who>: <msg>" at the caller `level` levels up.
function M.fail(who, msg, level) error(who .. ": " .. msg, (level or 1) + 1) end

return M
