-- moonrl.argcheck: the one place the Lua library checks options tables: value checks, the
-- description of a wrong value, the nearest known name for a misspelt one, and `fields`, which
-- checks a constructor's options against its list of fields (rl.replay.new, rl.skills.repo,
-- rl.synth.*, rl.reward.*, rl.curriculum.*; rl.train's own option table uses the same pieces).
--
--   local opts = argcheck.fields("rl.replay.new", t, {
--     { "capacity", nil, argcheck.integer(1), required = true },
--     { "alpha", 0.6, argcheck.number(0) },
--   }, level)
-- raises "rl.replay.new: capacity: a positive integer expected, got 0" at `level` (as error's),
-- and "rl.replay.new: unknown field 'alfa' (did you mean 'alpha'?)" for a key it does not know.
local M = {}

-- ---------------------------------------------------------------- values

-- A short description of v for messages: 0, 1.5, "magic", true, a table, an rl.model.
function M.describe(v)
  local t = type(v)
  if t == "number" or t == "boolean" or t == "nil" then return tostring(v) end
  if t == "string" then return string.format("%q", #v > 40 and v:sub(1, 40) .. "..." or v) end
  local mt = getmetatable(v)
  if type(mt) == "table" and type(mt.__name) == "string" then return "a " .. mt.__name end
  return "a " .. t
end

function M.finite(v) return type(v) == "number" and v == v and v ~= math.huge and v ~= -math.huge end
local finite = M.finite

-- Whether t is a plain list 1..#t (and nothing else).
function M.is_list(t)
  if type(t) ~= "table" then return false end
  local n = #t
  for k in pairs(t) do
    if math.type(k) ~= "integer" or k < 1 or k > n then return false end
  end
  return true
end

-- ---------------------------------------------------------------- misspelt names

-- Levenshtein distance between two strings (bytes).
function M.distance(a, b)
  local prev = {}
  for j = 0, #b do prev[j] = j end
  for i = 1, #a do
    local cur = { [0] = i }
    for j = 1, #b do
      local cost = a:byte(i) == b:byte(j) and 0 or 1
      cur[j] = math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
    end
    prev = cur
  end
  return prev[#b]
end

-- How far word is from key: the edit distance, but 1 when one is the other plus "_..." (lr_rate
-- and lr, group and group_size).
local function closeness(word, key)
  local d = M.distance(word, key)
  local short, long = word, key
  if #short > #long then short, long = long, short end
  if #short >= 2 and long:sub(1, #short + 1) == short .. "_" then d = math.min(d, 1) end
  return d
end

-- The known name nearest to word (ties: the longer common prefix, then the first in `known`), or
-- nil when even the nearest needs more than a third of word rewritten (and more than 2 edits).
function M.nearest(word, known)
  local best, best_d, best_p
  for _, k in ipairs(known) do
    local d = closeness(word, k)
    local p = 0
    while p < #word and p < #k and word:byte(p + 1) == k:byte(p + 1) do p = p + 1 end
    if not best or d < best_d or (d == best_d and p > best_p) then best, best_d, best_p = k, d, p end
  end
  if best and best_d <= math.max(2, #word // 3) then return best end
  return nil
end

-- ---------------------------------------------------------------- checks
-- Each is function(v) -> nil when v is acceptable, else what was expected ("a number in [0, 1]").
-- A check may also return a table holding one whole message (a sub-table's field, see M.sub).

-- An integer, at least lo and at most hi when they are given.
function M.integer(lo, hi)
  local what = lo == 1 and not hi and "a positive integer"
    or lo == 0 and not hi and "a non-negative integer"
    or lo and hi and string.format("an integer in [%d, %d]", lo, hi)
    or lo and string.format("an integer >= %d", lo) or "an integer"
  return function(v)
    if math.type(v) == "integer" and (not lo or v >= lo) and (not hi or v <= hi) then return nil end
    return what
  end
end

-- A finite number, at least lo and at most hi when they are given; open = true (or "lo") leaves
-- lo itself out, open = "hi" leaves hi out.
function M.number(lo, hi, open)
  local open_lo, open_hi = open == true or open == "lo", open == "hi"
  local what = not lo and "a finite number"
    or hi and string.format("a number in %s%g, %g%s", open_lo and "(" or "[", lo, hi, open_hi and ")" or "]")
    or lo == 0 and not open_lo and "a non-negative number"
    or string.format("a number %s %g", open_lo and ">" or ">=", lo)
  return function(v)
    if finite(v) and (not lo or (open_lo and v > lo or not open_lo and v >= lo))
        and (not hi or (open_hi and v < hi or not open_hi and v <= hi)) then
      return nil
    end
    return what
  end
end

function M.positive(v)
  if finite(v) and v > 0 then return nil end
  return "a positive number"
end

function M.kind(t, what)
  return function(v) if type(v) == t then return nil end return what end
end
M.boolean = M.kind("boolean", "true or false")
M.func = M.kind("function", "a function")
M.string = M.kind("string", "a string")
M.table = M.kind("table", "a table")

-- One of list's strings (a string that is not gets the nearest one named), or, with `other`,
-- whatever other accepts (described as other_what).
function M.one_of(list, other, other_what)
  local quoted = {}
  for i, s in ipairs(list) do quoted[i] = string.format("%q", s) end
  local what = table.concat(quoted, ", ")
  what = other and what .. " or " .. other_what or "one of " .. what
  return function(v)
    for _, s in ipairs(list) do if v == s then return nil end end
    if other and other(v) == nil then return nil end
    local near = type(v) == "string" and M.nearest(v, list)
    return near and string.format("%s (did you mean %q?)", what, near) or what
  end
end

-- The first check that accepts v, or all the expectations joined with " or ".
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

function M.literal(x, what)
  return function(v) if v == x then return nil end return what end
end

-- A non-empty list whose entries each pass check.
function M.list_of(check, what)
  return function(v)
    if type(v) ~= "table" or #v == 0 or not M.is_list(v) then return what end
    for _, x in ipairs(v) do if check(x) then return what end end
    return nil
  end
end

-- A userdata of the named metatable (an rl.model, an rl.tokenizer).
function M.instance_of(name, what)
  return function(v)
    local mt = getmetatable(v)
    if type(v) == "userdata" and type(mt) == "table" and mt.__name == name then return nil end
    return what
  end
end

-- A name of letters, digits, '_', '.', '-'.
function M.name(v)
  if type(v) == "string" and v:match("^[%w_.%-]+$") then return nil end
  return "a name of letters, digits, '_', '.', '-'"
end

-- {lo, hi} with lo <= hi.
function M.range(v)
  if M.is_list(v) and #v == 2 and finite(v[1]) and finite(v[2]) and v[1] <= v[2] then return nil end
  return "a pair {lo, hi} of numbers with lo <= hi"
end

-- A sub-table checked by M.fields under `where`; its first wrong field's whole message.
function M.sub(where, list)
  return function(v)
    if type(v) ~= "table" then return "a table" end
    local ok, err = pcall(M.fields, where, v, list)
    if ok then return nil end
    return { (tostring(err):gsub("^[^:]*:%d+: ", "")) }
  end
end

-- ---------------------------------------------------------------- options tables

-- The options t of constructor `where` checked against `list` ({name, default, check,
-- required = true, lazy = true}; a lazy default is a function of the fields resolved before
-- it); returns a new table with every field, defaults filled in.
-- Errors are raised at `level` (1 = the caller of fields): unknown keys first (all of them, each
-- with the nearest known name or, when none is near, the known ones), then the first field that
-- is missing or wrong.
function M.fields(where, t, list, level)
  level = (level or 1) + 1
  if type(t) ~= "table" then
    error(string.format("%s: a table of options expected, got %s", where, M.describe(t)), level)
  end
  local known, order = {}, {}
  for _, f in ipairs(list) do known[f[1]] = f; order[#order + 1] = f[1] end
  local bad = {}
  for k in pairs(t) do
    if type(k) ~= "string" then
      bad[#bad + 1] = string.format("options are named (key = value), got a value at [%s]", tostring(k))
    elseif not known[k] then
      local near = M.nearest(k, order)
      bad[#bad + 1] = string.format("unknown field '%s' (%s)", k, near and
        string.format("did you mean '%s'?", near) or "known: " .. table.concat(order, ", "))
    end
  end
  if #bad > 0 then
    table.sort(bad)
    error(where .. ": " .. table.concat(bad, "; "), level)
  end
  local out = {}
  for _, f in ipairs(list) do
    local name, v = f[1], t[f[1]]
    if v == nil then
      if f.required then
        local want = f[3](nil)
        error(string.format("%s: %s: %s expected (it is required)", where, name,
          type(want) == "table" and "a table" or want), level)
      end
      if f.lazy then v = f[2](out) else v = f[2] end
    else
      local want = f[3](v)
      if type(want) == "table" then
        error(string.format("%s: %s", where, want[1]), level)
      elseif want then
        error(string.format("%s: %s: %s expected, got %s", where, name, want, M.describe(v)), level)
      end
    end
    out[name] = v
  end
  return out
end

-- Raises "<where>: <msg>" at `level` (1 = the caller of fail).
function M.fail(where, msg, level) error(where .. ": " .. msg, (level or 1) + 1) end

return M
