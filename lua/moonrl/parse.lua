-- moonrl.parse: reading tool calls and answers out of a model's turn, with lpeg. Parsing never
-- raises: a malformed call comes back as {kind = "error", message = ...} for the environment to
-- judge.
--
-- Two formats:
--   "line"   (small models): the first line that starts with CALL or ANSWER decides.
--              CALL name arg1 arg2 ...   -> {kind = "call", name = "name", args = {"arg1", ...}}
--              ANSWER some text          -> {kind = "answer", text = "some text"}
--            Arguments are separated by blanks; "double quoted" arguments may hold blanks and the
--            escapes \" and \\.
--   "hermes" (Hermes / Qwen style): <tool_call>{"name": ..., "arguments": {...}}</tool_call>
--              -> {kind = "call", name = ..., args = {...}} (the arguments object, decoded);
--            text without a <tool_call> block is {kind = "answer", text = <the text, trimmed>}.
-- Anything else is {kind = "text", text = ...} ("line") and a broken block is an error.
local lpeg = require "lpeg"
local core = require "moonrl.core"
local json = core.json

local P, S, C, Ct, Cs = lpeg.P, lpeg.S, lpeg.C, lpeg.Ct, lpeg.Cs
local R = lpeg.R

local M = {}

-- ---- line format ----

local blank = S " \t"
local eol = P "\r" ^ -1 * P "\n"
local name = C((R("az", "AZ", "09") + S "_-.") ^ 1)
local quoted = P '"' * Cs(((P "\\" * C(S '"\\')) / "%1" + (1 - S '"\\' - eol)) ^ 0) * P '"'
local bare = C((1 - blank - eol - P '"') ^ 1)
local arg = quoted + bare
local call = P "CALL" * blank ^ 1 * name * Ct((blank ^ 1 * arg) ^ 0) * blank ^ 0 * (eol + -1)
local answer = P "ANSWER" * (blank ^ 1 * C((1 - eol) ^ 0) + lpeg.Cc "") * (eol + -1)
local line_start = P "CALL" + P "ANSWER"
-- the first line starting with CALL or ANSWER, after any number of other lines
local other_line = (1 - eol) ^ 0 * eol
local line_grammar = (other_line - line_start) ^ 0 * lpeg.Cp() * line_start

local function trim(s) return (s:gsub("^%s+", ""):gsub("%s+$", "")) end

function M.line(text)
  if type(text) ~= "string" then
    return { kind = "error", message = "the turn is not text" }
  end
  local at = line_grammar:match(text)
  if not at then return { kind = "text", text = trim(text) } end
  local rest = text:sub(at)
  local n, args = call:match(rest)
  if n then return { kind = "call", name = n, args = args } end
  local a = answer:match(rest)
  if a then return { kind = "answer", text = trim(a) } end
  local first = rest:match("^[^\n]*")
  if first:match("^CALL") then
    return { kind = "error", message = "malformed CALL line (want: CALL name arg ...): " .. first }
  end
  return { kind = "error", message = "malformed ANSWER line: " .. first }
end

-- ---- Hermes / Qwen format ----

local open_tag, close_tag = P "<tool_call>", P "</tool_call>"
local block = open_tag * C((1 - close_tag) ^ 0) * close_tag
local hermes_grammar = (1 - open_tag) ^ 0 * lpeg.Cp() * open_tag

function M.hermes(text)
  if type(text) ~= "string" then
    return { kind = "error", message = "the turn is not text" }
  end
  local at = hermes_grammar:match(text)
  if not at then return { kind = "answer", text = trim(text) } end
  local body = block:match(text, at)
  if not body then return { kind = "error", message = "<tool_call> without </tool_call>" } end
  local obj, err = json.decode(body)
  if type(obj) ~= "table" then
    return { kind = "error", message = "tool call is not valid JSON: " .. tostring(err) }
  end
  if type(obj.name) ~= "string" or obj.name == "" then
    return { kind = "error", message = "tool call without a \"name\" string" }
  end
  local args = obj.arguments
  if args == nil or args == json.null then args = {} end
  if type(args) == "string" then -- some models put the arguments object in a string
    args = json.decode(args)
  end
  if type(args) ~= "table" then
    return { kind = "error", message = "tool call \"arguments\" must be an object" }
  end
  return { kind = "call", name = obj.name, args = args }
end

-- parse.parse(text, format): dispatch by format name ("line" by default).
function M.parse(text, format)
  local f = M[format or "line"]
  if type(f) ~= "function" or format == "parse" then
    return { kind = "error", message = "unknown tool-call format " .. tostring(format) }
  end
  return f(text)
end

return M
