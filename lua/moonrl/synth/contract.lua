-- moonrl.synth.contract: what a proposal must hold before anything runs it (rl.synth.contract).
--
--   local c = rl.synth.contract { "instruction", "answer", "check", "solution", "failures",
--     parse = function(text, exemplar, rng, known) return fields or nil, why end,  -- optional:
--                                               -- the proposer's text (exemplar: the task its
--                                               -- prompt showed, for templates relative to it;
--                                               -- rng: an rl.rng the loop seeds per proposal,
--                                               -- for templates a generator fills in; known:
--                                               -- fn(fields) -> whether the loop's novelty
--                                               -- index already holds such a task, so that a
--                                               -- generator can draw again; nil without one)
--     render = function(task) return text end }   -- optional: its inverse (prompts, demos)
--   local task, why, detail = c:validate(proposal [, exemplar [, rng [, known]]])   -- a table or text
--
-- A proposal is the proposer's text or a table. Text is read by `parse` (default: a JSON object
-- somewhere in the text, else "field: value" sections, a field's value running to the next
-- field's line; failures as "- item" lines, a JSON list or "a | b | c"). The fields named are
-- required; the five of the design have fixed kinds: instruction (a non-empty string), answer
-- (a string, or a number written as one), check and solution (non-empty strings: code for the
-- exec verifier), failures (a non-empty list of strings, or numbers written as strings). Other
-- fields only need to be present. A violation is an expected failure: validate returns nil, a
-- reason ("unparsable", "missing_field", "bad_field") and a message naming the field; the loop
-- counts it as an invalid proposal, never as a solver task.
local argcheck = require "moonrl.argcheck"
local core = require "moonrl.core"

local json = core.json
local M = {}
local Contract = { __name = "moonrl.synth.contract" }
Contract.__index = Contract
M.Contract = Contract

local KNOWN = { "instruction", "answer", "check", "solution", "failures" }

local function trim(s) return (s:gsub("^%s+", ""):gsub("%s+$", "")) end

local function number_text(v)
  if math.type(v) == "integer" then return string.format("%d", v) end
  if math.type(v) == "float" then
    if v == math.floor(v) and math.abs(v) < 2 ^ 53 then return string.format("%d", math.tointeger(v)) end
    return string.format("%.17g", v)
  end
  return nil
end

-- field -> function(v) -> normalised value, or nil, what was expected.
local KINDS = {
  instruction = function(v)
    if type(v) == "string" and v:match("%S") then return v end
    return nil, "a non-empty string"
  end,
  answer = function(v)
    if type(v) == "string" then return v end
    local s = number_text(v)
    if s then return s end
    return nil, "a string or a number"
  end,
  check = function(v)
    if type(v) == "string" and v:match("%S") then return v end
    return nil, "code (a non-empty string)"
  end,
  failures = function(v)
    if type(v) ~= "table" or #v == 0 then return nil, "a non-empty list of answers" end
    local out = {}
    for k in pairs(v) do
      if math.type(k) ~= "integer" or k < 1 or k > #v then return nil, "a non-empty list of answers" end
    end
    for i, x in ipairs(v) do
      local s = type(x) == "string" and x or number_text(x)
      if not s then return nil, "a non-empty list of answers (strings or numbers)" end
      out[i] = s
    end
    return out
  end,
}
KINDS.solution = KINDS.check

-- ---------------------------------------------------------------- the default text format

-- A JSON object in text (from its first "{" to its last "}"), or nil.
local function json_object(text)
  local a, b = text:find("{", 1, true), nil
  for p = #text, 1, -1 do if text:byte(p) == 125 then b = p break end end
  if not a or not b or b < a then return nil end
  local ok, v = pcall(json.decode, text:sub(a, b))
  if ok and type(v) == "table" then return v end
  return nil
end

local function list_value(s)
  s = trim(s)
  if s:sub(1, 1) == "[" then
    local ok, v = pcall(json.decode, s)
    if ok and type(v) == "table" then return v end
  end
  local items = {}
  if s:find("\n") or s:match("^%-") then
    for line in s:gmatch("[^\n]+") do
      local item = line:match("^%s*%-%s*(.-)%s*$")
      if item and item ~= "" then items[#items + 1] = item
      elseif line:match("%S") then items[#items + 1] = trim(line) end
    end
  else
    for item in (s .. "|"):gmatch("(.-)|") do
      if item:match("%S") then items[#items + 1] = trim(item) end
    end
  end
  return items
end

-- "field: value" sections for the contract's fields; nil when none is found.
local function sections(text, names)
  local known = {}
  for _, n in ipairs(names) do known[n] = true end
  local out, cur, buf, found = {}, nil, nil, false
  local function close()
    if cur then
      local v = trim(table.concat(buf, "\n"))
      if cur == "failures" then out[cur] = list_value(v) else out[cur] = v end
    end
  end
  for line in (text .. "\n"):gmatch("(.-)\n") do
    local name, rest = line:match("^%s*([%a_][%w_]*)%s*:%s?(.*)$")
    if name and known[name:lower()] then
      close()
      cur, buf, found = name:lower(), { rest }, true
    elseif cur then
      buf[#buf + 1] = line
    end
  end
  close()
  if not found then return nil end
  return out
end

local function default_parse(self, text)
  local t = json_object(text)
  if t then return t end
  t = sections(text, self.fields)
  if t then return t end
  return nil, "no JSON object and no \"field:\" lines"
end

-- The default rendering: "field: value" lines in the contract's order, failures as "- " lines.
local function default_render(self, task)
  local lines = {}
  for _, name in ipairs(self.fields) do
    local v = task[name]
    if name == "failures" and type(v) == "table" then
      lines[#lines + 1] = "failures:"
      for _, f in ipairs(v) do lines[#lines + 1] = "- " .. tostring(f) end
    elseif type(v) == "table" then
      lines[#lines + 1] = name .. ": " .. json.encode(v)
    elseif v ~= nil then
      lines[#lines + 1] = name .. ": " .. tostring(v)
    end
  end
  return table.concat(lines, "\n")
end

-- ---------------------------------------------------------------- the contract

local function field_names(t)
  local names = {}
  for i = 1, #t do
    local v = t[i]
    if type(v) ~= "string" or not v:match("^[%a_][%w_]*$") then
      error(string.format("rl.synth.contract: [%d]: a field name (letters, digits, '_') expected, got %s",
        i, argcheck.describe(v)), 3)
    end
    for j = 1, i - 1 do
      if names[j] == v then error(string.format("rl.synth.contract: [%d]: field '%s' appears twice", i, v), 3) end
    end
    names[i] = v
  end
  if #names == 0 then error("rl.synth.contract: name at least one field ({\"instruction\", \"answer\", ...})", 3) end
  return names
end

-- rl.synth.contract{"field", ..., parse =, render =}: see the top of this file.
function M.contract(t)
  if type(t) ~= "table" then
    error("rl.synth.contract: a list of field names expected, got " .. argcheck.describe(t), 2)
  end
  local named = {}
  for k, v in pairs(t) do
    if math.type(k) ~= "integer" then named[k] = v end
  end
  local o = argcheck.fields("rl.synth.contract", named, {
    { "parse", nil, argcheck.kind("function", "a function(text, exemplar, rng) -> fields or nil, why") },
    { "render", nil, argcheck.kind("function", "a function(task) -> text") },
  }, 2)
  for k in pairs(t) do
    if math.type(k) == "integer" and (k < 1 or k > #t) then
      error("rl.synth.contract: the field names must be a list (1, 2, ...)", 2)
    end
  end
  return setmetatable({ fields = field_names(t), parse_fn = o.parse, render_fn = o.render }, Contract)
end

function M.is_contract(v) return getmetatable(v) == Contract end

-- The five fields of the design.
M.known = KNOWN

-- c:parse(text [, exemplar [, rng [, known]]]) -> a table of fields, or nil, why.
function Contract:parse(text, exemplar, rng, known)
  if self.parse_fn then
    local ok, t, why = pcall(self.parse_fn, text, exemplar, rng, known)
    if not ok then return nil, "parse raised: " .. tostring(t) end
    if type(t) ~= "table" then return nil, why and tostring(why) or "parse returned no fields" end
    return t
  end
  return default_parse(self, text)
end

-- c:validate(proposal [, exemplar [, rng [, known]]]) -> task (a new table: the proposal's fields
-- normalised), or nil, reason, message. reason is "unparsable", "missing_field" or "bad_field".
function Contract:validate(p, exemplar, rng, known)
  if type(p) == "string" then
    local t, why = self:parse(p, exemplar, rng, known)
    if not t then return nil, "unparsable", "the proposal could not be read: " .. tostring(why) end
    p = t
  elseif type(p) ~= "table" then
    return nil, "unparsable", "a proposal is text or a table, got " .. argcheck.describe(p)
  end
  local task = {}
  for k, v in pairs(p) do task[k] = v end
  for _, name in ipairs(self.fields) do
    local v = p[name]
    if v == nil or v == "" then return nil, "missing_field", "the proposal has no " .. name end
    local kind = KINDS[name]
    if kind then
      local norm, want = kind(v)
      if norm == nil then
        return nil, "bad_field", string.format("%s: %s expected, got %s", name, want, argcheck.describe(v))
      end
      task[name] = norm
    end
  end
  return task
end

-- c:render(task) -> the task as proposer text (the render function's, else "field: value" lines).
function Contract:render(task)
  if self.render_fn then return self.render_fn(task) end
  return default_render(self, task)
end

return M
