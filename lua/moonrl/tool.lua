-- moonrl.tool: the tools an agent may call. A tool is a table {name=, description=, args=, run=}
-- whose run(args) returns the observation text for the model.
--
--   rl.tool{name=, description=, args=, run=function(args) return text end}
--       a tool from a Lua function (which runs in the engine's own state, unsandboxed);
--   rl.tool.shell{name=, description=, args=, command=function(args) return argv end, pool=,
--                 wall_ms=, cpu_ms=, mem_mb=, pids=, out_cap=, out_kill=, ...}
--       runs a command in the process sandbox (rl.sandbox; the default pool unless pool= is
--       given). command may also be a fixed argv list, or a string (run by /bin/sh -c), and may
--       return, after argv, a table {stdin=, files=, env=} for pool:run;
--   rl.tool.lua{name=, description=, args=, code=function(args) return source end or a fixed
--               source, budget=, mem_mb=, wall_ms=, output_cap=, pool=}
--       runs Lua source in a restricted state (rl.sandbox.lua); a fixed source sees the call's
--       arguments as the local `args`. With wall_ms it runs inside the process sandbox.
-- The runners' run(args) returns the text and, second, the full result table. The text is what a
-- model can act on: the output, then (when the call did not end cleanly) stderr or the error,
-- and one status line in brackets.
local core = require "moonrl.core"

local sandbox = core.sandbox

local M = {}

local function check(cond, msg)
  if not cond then error(msg, 3) end
end

-- Checks the fields every tool has; `extra` lists the other fields the constructor takes.
local function check_spec(spec, kind, extra)
  check(type(spec) == "table", kind .. ": a table expected, got " .. type(spec))
  for k in pairs(spec) do
    local known = k == "name" or k == "description" or k == "args"
    for _, e in ipairs(extra) do known = known or k == e end
    check(known, ("%s: unknown field '%s'"):format(kind, tostring(k)))
  end
  check(type(spec.name) == "string" and spec.name:match("^[%w_%.%-]+$") ~= nil,
    kind .. ": name must be a non-empty string of letters, digits, '_', '.' and '-'")
  check(spec.description == nil or type(spec.description) == "string",
    kind .. ": description must be a string")
  check(spec.args == nil or type(spec.args) == "table",
    kind .. ": args must be a table (the argument schema)")
end

local function make(spec, run)
  return {name = spec.name, description = spec.description or "", args = spec.args or {}, run = run}
end

local function new_tool(spec)
  check_spec(spec, "rl.tool", {"run"})
  check(type(spec.run) == "function", "rl.tool: run must be a function(args) returning text")
  return make(spec, spec.run)
end

-- ---- the observation text ----

local signal_names = {[1] = "SIGHUP", [2] = "SIGINT", [3] = "SIGQUIT", [4] = "SIGILL",
  [6] = "SIGABRT", [7] = "SIGBUS", [8] = "SIGFPE", [9] = "SIGKILL", [11] = "SIGSEGV",
  [13] = "SIGPIPE", [14] = "SIGALRM", [15] = "SIGTERM", [24] = "SIGXCPU", [25] = "SIGXFSZ",
  [31] = "SIGSYS"}

-- A stream as kept by the sandbox: when truncated it holds the first half and the last half.
local function stream_text(text, truncated, total)
  if not truncated then return text end
  local head = #text - #text // 2
  return text:sub(1, head) .. ("\n[... %d bytes omitted ...]\n"):format(total - #text)
    .. text:sub(head + 1)
end

local function status_line(res)
  local s = res.status
  if s == "exited" then return ("[exit code %d]"):format(res.exit_code) end
  if s == "signaled" then
    return ("[killed by signal %d%s]"):format(res.signal or 0,
      signal_names[res.signal] and " (" .. signal_names[res.signal] .. ")" or "")
  end
  if s == "timeout" then return "[timed out: " .. (res.message or "wall-clock limit") .. "]" end
  if s == "setup_error" then return "[could not run: " .. (res.message or "setup error") .. "]" end
  return ("[stopped (%s): %s]"):format(s, res.message or s)
end

local function join(parts)
  local out = {}
  for _, p in ipairs(parts) do
    if p ~= "" then out[#out + 1] = p:sub(-1) == "\n" and p:sub(1, -2) or p end
  end
  return table.concat(out, "\n")
end

-- The text of a pool:run result: stdout; when the call did not exit with 0, stderr and a status
-- line (stderr also when stdout is empty).
function M.format_shell(res)
  local out = stream_text(res.stdout, res.stdout_truncated, res.stdout_bytes)
  local err = stream_text(res.stderr, res.stderr_truncated, res.stderr_bytes)
  local clean = res.status == "exited" and res.exit_code == 0
  local parts = {out}
  if err ~= "" and (not clean or out == "") then parts[#parts + 1] = "[stderr]\n" .. err end
  if not clean then parts[#parts + 1] = status_line(res) end
  return join(parts)
end

-- The text of an rl.sandbox.lua result: what the code printed, its value, and a status line
-- when it did not end well.
function M.format_lua(res)
  local parts = {res.output}
  if res.output_truncated then parts[#parts + 1] = "[... output truncated ...]" end
  if res.value ~= nil then parts[#parts + 1] = tostring(res.value) end
  local s = res.status
  if s == "error" then parts[#parts + 1] = "[error: " .. tostring(res.error) .. "]"
  elseif s == "budget" then parts[#parts + 1] = "[stopped: " .. tostring(res.error) .. "]"
  elseif s == "oom" then parts[#parts + 1] = "[stopped: out of memory]"
  elseif s == "timeout" then parts[#parts + 1] = "[timed out: " .. tostring(res.error) .. "]"
  elseif s ~= "ok" then parts[#parts + 1] = "[could not run: " .. tostring(res.error) .. "]" end
  return join(parts)
end

-- ---- rl.tool.shell ----

local limit_fields = {"wall_ms", "cpu_ms", "mem_mb", "pids", "out_cap", "out_kill", "fsize",
  "nofile", "disk_mb", "files_cap"}

function M.shell(spec)
  local extra = {"command", "pool"}
  for _, f in ipairs(limit_fields) do extra[#extra + 1] = f end
  check_spec(spec, "rl.tool.shell", extra)
  local command = spec.command
  check(type(command) == "function" or type(command) == "string" or type(command) == "table",
    "rl.tool.shell: command must be a function(args) returning argv, an argv list or a string")
  return make(spec, function(args)
    local argv, more = command, nil
    if type(command) == "function" then argv, more = command(args) end
    if type(argv) == "string" then argv = {"/bin/sh", "-c", argv} end
    if type(argv) ~= "table" or #argv == 0 then
      error("tool " .. spec.name .. ": command gave no argv (a list of strings)", 2)
    end
    local call = {argv = argv}
    for _, f in ipairs(limit_fields) do call[f] = spec[f] end
    if more ~= nil then
      if type(more) ~= "table" then error("tool " .. spec.name .. ": command's second value must be a table", 2) end
      call.stdin, call.files, call.env = more.stdin, more.files, more.env
    end
    local pool = spec.pool or sandbox.default_pool()
    local res, err = pool:run(call)
    if not res then error("tool " .. spec.name .. ": " .. tostring(err), 2) end
    return M.format_shell(res), res
  end)
end

-- ---- rl.tool.lua ----

-- args as Lua source text on one line (nested tables; other values become nil).
local function literal(v, depth)
  local t = type(v)
  if t == "string" then return (("%q"):format(v):gsub("\\\n", "\\n")) end
  if t == "number" then
    if math.type(v) == "integer" then return tostring(v) end
    if v ~= v then return "(0/0)" end
    if v == math.huge then return "math.huge" end
    if v == -math.huge then return "-math.huge" end
    return ("%.17g"):format(v)
  end
  if t == "boolean" then return tostring(v) end
  if t ~= "table" then return "nil" end
  if depth > 64 then error("args nest too deeply", 0) end
  local items = {}
  for k, x in pairs(v) do
    items[#items + 1] = "[" .. literal(k, depth + 1) .. "]=" .. literal(x, depth + 1)
  end
  table.sort(items)
  return "{" .. table.concat(items, ",") .. "}"
end

function M.lua(spec)
  check_spec(spec, "rl.tool.lua", {"code", "budget", "mem_mb", "wall_ms", "output_cap", "pool"})
  local code = spec.code
  check(type(code) == "function" or type(code) == "string",
    "rl.tool.lua: code must be a function(args) returning Lua source, or the source itself")
  return make(spec, function(args)
    local source
    if type(code) == "function" then
      source = code(args)
      if type(source) ~= "string" then
        error("tool " .. spec.name .. ": code gave no Lua source (a string)", 2)
      end
    else
      -- on the first line, so that line numbers in messages stay those of the source
      source = "local args = " .. literal(args, 0) .. "; " .. code
    end
    local res = sandbox.lua{code = source, budget = spec.budget, mem_mb = spec.mem_mb,
      wall_ms = spec.wall_ms, output_cap = spec.output_cap, pool = spec.pool}
    return M.format_lua(res), res
  end)
end

return setmetatable(M, {__call = function(_, spec) return new_tool(spec) end})
