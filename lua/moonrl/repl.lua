-- moonrl.repl: the value printer and tab completion of the `moonrl repl` prompt.
local M = {}

local keywords = {
  "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "goto", "if", "in",
  "local", "nil", "not", "or", "repeat", "return", "then", "true", "until", "while",
}

local function is_identifier(s)
  return type(s) == "string" and s:match("^[%a_][%w_]*$") ~= nil
end

local function sorted_keys(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b)
    local ta, tb = type(a), type(b)
    if ta ~= tb then return ta < tb end
    if ta == "number" or ta == "string" then return a < b end
    return tostring(a) < tostring(b)
  end)
  return keys
end

-- Formats a value for display: tables one or two levels deep, strings quoted, the rest with
-- tostring (so tensors show their own display).
local function format(v, depth, seen)
  if type(v) == "string" then return string.format("%q", v) end
  if type(v) ~= "table" or getmetatable(v) and getmetatable(v).__tostring then
    return tostring(v)
  end
  if seen[v] then return "<cycle>" end
  if depth <= 0 then return "{...}" end
  seen[v] = true
  local parts, n = {}, #v
  for i = 1, n do parts[#parts + 1] = format(v[i], depth - 1, seen) end
  local shown = 0
  for _, k in ipairs(sorted_keys(v)) do
    if not (math.type(k) == "integer" and k >= 1 and k <= n) then
      shown = shown + 1
      if shown > 30 then parts[#parts + 1] = "..."; break end
      local key = is_identifier(k) and k or "[" .. format(k, 0, seen) .. "]"
      parts[#parts + 1] = key .. " = " .. format(v[k], depth - 1, seen)
    end
  end
  seen[v] = nil
  return "{" .. table.concat(parts, ", ") .. "}"
end

-- Formats the values returned by a REPL line, tab-separated like the stock interpreter.
function M.format_results(...)
  local out = {}
  for i = 1, select("#", ...) do out[i] = format((select(i, ...)), 2, {}) end
  return table.concat(out, "\t")
end

-- Fields reachable with `.` or `:` from a value: its own keys (tables) and those of a table
-- __index (classes, tensor methods).
local function fields(v, methods_only)
  local names = {}
  local function add(t)
    for k, x in pairs(t) do
      if is_identifier(k) and (not methods_only or type(x) == "function") then names[k] = true end
    end
  end
  if type(v) == "table" then add(v) end
  local mt = getmetatable(v)
  if type(mt) == "table" then
    if type(mt.__index) == "table" then add(mt.__index) end
    if type(mt.methods) == "table" then add(mt.methods) end
  end
  return names
end

-- Candidates completing `word` (e.g. "rl.tensor.ze" or "t:sh"), as whole words.
function M.complete(word, env)
  env = env or _G
  local prefix, sep, partial = word:match("^(.-)([.:])([%w_]*)$")
  local names, head = {}, ""
  if prefix then
    local v = env
    for name in prefix:gmatch("[^.:]+") do
      if type(v) ~= "table" and type(v) ~= "userdata" then return {} end
      local ok, next_v = pcall(function() return v[name] end)
      if not ok then return {} end
      v = next_v
    end
    if v == nil then return {} end
    names = fields(v, sep == ":")
    head = prefix .. sep
  else
    partial = word
    names = fields(env)
    for _, k in ipairs(keywords) do names[k] = true end
  end
  local out = {}
  for name in pairs(names) do
    if name:sub(1, #partial) == partial then out[#out + 1] = head .. name end
  end
  table.sort(out)
  return out
end

return M
