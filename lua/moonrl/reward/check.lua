-- moonrl.reward.check: argument checks for the rl.reward constructors: every field of an options
-- table is known and of the right kind, or the error names it ("rl.reward.judge: rpm: a positive
-- number expected, got -1", "rl.reward.judge: unknown field 'modle' (did you mean 'model'?)").
local options = require "moonrl.train.options"

local M = {}

M.describe = options.describe

local function finite(v) return type(v) == "number" and v == v and v ~= math.huge and v ~= -math.huge end
M.finite = finite

-- Checks: each is function(v) -> nil when v is acceptable, else what was expected (or, in a
-- table, a whole message: a sub-table's field).
function M.number(lo, hi)
  local what = not lo and "a finite number" or hi and string.format("a number in [%g, %g]", lo, hi)
    or lo == 0 and "a non-negative number" or string.format("a number >= %g", lo)
  return function(v)
    if finite(v) and (not lo or v >= lo) and (not hi or v <= hi) then return nil end
    return what
  end
end

function M.positive(v)
  if finite(v) and v > 0 then return nil end
  return "a positive number"
end

function M.integer(lo)
  local what = lo == 0 and "a non-negative integer" or lo == 1 and "a positive integer" or "an integer"
  return function(v)
    if math.type(v) == "integer" and (not lo or v >= lo) then return nil end
    return what
  end
end

local function kind(t, what) return function(v) if type(v) == t then return nil end return what end end
M.boolean = kind("boolean", "true or false")
M.func = kind("function", "a function")
M.string = kind("string", "a string")
M.table = kind("table", "a table")

function M.enum(list)
  local quoted = {}
  for i, s in ipairs(list) do quoted[i] = string.format("%q", s) end
  local what = "one of " .. table.concat(quoted, ", ")
  return function(v)
    for _, s in ipairs(list) do if v == s then return nil end end
    local near = type(v) == "string" and options.nearest(v, list)
    return near and string.format("%s (did you mean %q?)", what, near) or what
  end
end

-- The first check that accepts v, or all the expectations joined with "or".
function M.either(...)
  local checks = { ... }
  return function(v)
    local wants = {}
    for i, c in ipairs(checks) do
      local want = c(v)
      if not want then return nil end
      wants[i] = want
    end
    return table.concat(wants, " or ")
  end
end

-- A term or episode name: letters, digits, '_', '.', '-'.
function M.name(v)
  if type(v) == "string" and v:match("^[%w_.%-]+$") then return nil end
  return "a name of letters, digits, '_', '.', '-'"
end

-- {lo, hi} with lo <= hi.
function M.range(v)
  if type(v) == "table" and #v == 2 and finite(v[1]) and finite(v[2]) and v[1] <= v[2] then
    local n = 0
    for _ in pairs(v) do n = n + 1 end
    if n == 2 then return nil end
  end
  return "a pair {lo, hi} of numbers with lo <= hi"
end

-- A sub-table's check: its fields checked by M.fields (where: "budget"); the message of the
-- first that is wrong, in a table.
function M.sub(name, spec)
  return function(v)
    if type(v) ~= "table" then return "a table" end
    local ok, err = pcall(M.fields, name, v, spec)
    if ok then return nil end
    return { (tostring(err):gsub("^[^:]*:%d+: ", "")) }
  end
end

-- M.fields(where, t, spec, level) -> t with defaults filled in (a new table), raising at `level`
-- on a field that is unknown, missing or of the wrong kind. spec is a list of
-- {name, check, default = v, required = true}; where names the constructor ("rl.reward.judge").
function M.fields(where, t, spec, level)
  level = (level or 1) + 1
  if type(t) ~= "table" then
    error(string.format("%s: a table of options expected, got %s", where, M.describe(t)), level)
  end
  local known, order = {}, {}
  for _, f in ipairs(spec) do
    known[f[1]] = f
    order[#order + 1] = f[1]
  end
  local bad = {}
  for k in pairs(t) do
    if type(k) ~= "string" then
      bad[#bad + 1] = string.format("%s: options are named (key = value), got a value at [%s]",
        where, tostring(k))
    elseif not known[k] then
      local near = options.nearest(k, order)
      bad[#bad + 1] = string.format("%s: unknown field '%s'%s", where, k,
        near and string.format(" (did you mean '%s'?)", near) or "")
    end
  end
  if #bad > 0 then
    table.sort(bad)
    error(bad[1], level)
  end
  local out = {}
  for _, f in ipairs(spec) do
    local v = t[f[1]]
    if v == nil then
      if f.required then
        error(string.format("%s: %s: %s expected (it is required)", where, f[1], f[2](nil)), level)
      end
      v = f.default
    else
      local want = f[2](v)
      if type(want) == "table" then -- a sub-table's own full message
        error(string.format("%s: %s", where, want[1]), level)
      elseif want then
        error(string.format("%s: %s: %s expected, got %s", where, f[1], want, M.describe(v)), level)
      end
    end
    out[f[1]] = v
  end
  return out
end

return M
