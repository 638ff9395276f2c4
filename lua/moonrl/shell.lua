-- moonrl.shell (rl.shell): a simulated Linux host for privilege-escalation environments. The host
-- is plain Lua data (users with uids and passwords, files with an owner, a mode and content,
-- sudoers rules, SUID bits, capabilities, cron jobs, ssh keys); a small command interpreter runs
-- on it INSIDE the restricted Lua sandbox (rl.sandbox.lua: a fresh state per command, no io, no
-- os, no require, text-only load), so a command can only ever read and change the simulated
-- host: the state goes in as a Lua literal and the new state comes back as one.
--
--   local sh = assert(rl.shell.new({
--     user = "bob",
--     users = { root = { uid = 0, password = "x9!" }, bob = { uid = 1000, password = "sunny7" } },
--     files = { ["/usr/bin/vim"] = { owner = "root", mode = "755" },
--               ["/etc/passwd"] = { owner = "root", mode = "644", content = "root:x:0:0" } },
--     sudoers = { bob = { "/usr/bin/vim" } },           -- (root) NOPASSWD rules
--   }, { width = 24 }))
--   print(sh:run("sudo -l"))      --> (root) NOPASSWD: /usr/bi   (cut at width bytes)
--   print(sh:run("sudo vim"))     --> # root shell
--   print(sh:uid())               --> 0
--   local other = sh:clone()      -- an independent copy of the host
--
-- A binary is named by its path or by its basename when it is in /usr/bin, /bin, /usr/local/bin,
-- /opt/bin, /usr/sbin or /sbin (searched in that order). Commands: id, whoami, sudo -l, ls <dir>, cat <file>, find suid, getcap, crontab, su <u> <pw>,
-- ssh <u> -i <keyfile>, sudo <bin>, <bin> -p (the GTFOBins-style escape: a root shell when the
-- binary is a shell-capable one and is SUID root, or an interpreter with cap_setuid), echo
-- <text>><file> (writes the file when the user may), wait (time passes: root's cron jobs run;
-- a job's script lines `chmod u+s <file>` set the SUID bit). Anything else answers
-- "sh: <word>: not found" and is reported as not a command (known = false).
--
-- Modes are octal strings ("644", "4755"); only the owner and other bits count (no groups);
-- root passes every permission check. A directory listed in `dirs` ({owner =, mode =}) needs its
-- read bit for `ls`; others are readable.
local core = require "moonrl.core"
local argcheck = require "moonrl.argcheck"

local M = {}

-- The shell-capable binaries (basenames) a `sudo <bin>` or a SUID `<bin> -p` turns into a root
-- shell, and those of them that are interpreters (a cap_setuid capability suffices).
M.SHELLS = { "bash", "sh", "dash", "zsh", "vim", "vi", "less", "more", "find", "awk", "gawk", "nmap",
  "env", "tar", "man", "ed", "python3", "python", "perl", "ruby", "node", "php", "lua", "gdb" }
M.INTERPRETERS = { "python3", "python", "perl", "ruby", "node", "php", "lua", "gdb" }
M.WIDTH = 24
M.MAX_LINE = 512

-- The interpreter: the source that runs in the restricted state. It defines run(host, line,
-- width) and ser(v); the call appends `return run(<host>, <line>, <width>)`.
local INTERP = [==[
local SHELLS, INTERP = {}, {}
for w in ("@SHELLS@"):gmatch("%S+") do SHELLS[w] = true end
for w in ("@INTERP@"):gmatch("%S+") do INTERP[w] = true end
local BIN_DIRS = { "/usr/bin/", "/bin/", "/usr/local/bin/", "/opt/bin/", "/usr/sbin/", "/sbin/" }

local function ser(v)
  local t = type(v)
  if t == "string" then return (string.format("%q", v):gsub("\\\n", "\\n")) end
  if t == "number" or t == "boolean" then return tostring(v) end
  if t ~= "table" then return "nil" end
  local keys = {}
  for k in pairs(v) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b)
    if type(a) == type(b) then return a < b end
    return type(a) == "number"
  end)
  local parts = {}
  for _, k in ipairs(keys) do parts[#parts + 1] = "[" .. ser(k) .. "]=" .. ser(v[k]) end
  return "{" .. table.concat(parts, ",") .. "}"
end

local function uid_of(h, name) local u = h.users[name]; return u and u.uid end
local function me(h) return h.users[h.user].uid end
local function base(p) return p:match("([^/]+)$") or p end
local function mode(m) return tonumber(m, 8) or 0 end

-- Whether the current user has permission bit (4 r, 2 w, 1 x) on node (a file or dir entry).
local function allowed(h, node, bit)
  local uid = me(h)
  if uid == 0 then return true end
  local m = mode(node.mode)
  if uid_of(h, node.owner) == uid then return (m >> 6) & bit ~= 0 end
  return m & bit ~= 0
end

local function resolve(h, name)
  if name:find("/", 1, true) then return h.files[name] and name or nil end
  for _, d in ipairs(BIN_DIRS) do
    if h.files[d .. name] then return d .. name end
  end
  return nil
end

local function suid_root(h, path)
  local f = h.files[path]
  return f and mode(f.mode) & 0x800 ~= 0 and uid_of(h, f.owner) == 0
end

local function become(h, name) h.user = name; return "now " .. name end

local function sorted_keys(t)
  local out = {}
  for k in pairs(t) do out[#out + 1] = k end
  table.sort(out)
  return out
end

local CMD = {}
function CMD.id(h) return string.format("uid=%d(%s)", me(h), h.user) end
function CMD.whoami(h) return h.user end
function CMD.ls(h, a)
  local dir = a[1]
  if not dir or a[2] then return nil end
  dir = dir:gsub("(.)/$", "%1")
  local node = h.dirs and h.dirs[dir]
  if node and not allowed(h, node, 4) then return "ls: permission denied" end
  local prefix = dir == "/" and "/" or dir .. "/"
  local names, seen = {}, {}
  for _, p in ipairs(sorted_keys(h.files)) do
    if p:sub(1, #prefix) == prefix then
      local rest = p:sub(#prefix + 1)
      local first = rest:match("^[^/]+")
      if first and not seen[first] then seen[first] = true; names[#names + 1] = first end
    end
  end
  if #names == 0 and not node then return "ls: no such dir" end
  return table.concat(names, " ")
end
function CMD.cat(h, a)
  if not a[1] or a[2] then return nil end
  local f = h.files[a[1]]
  if not f then return "cat: no such file" end
  if not allowed(h, f, 4) then return "cat: permission denied" end
  return f.content or ""
end
function CMD.find(h, a)
  if a[1] ~= "suid" or a[2] then return nil end
  local out = {}
  for _, p in ipairs(sorted_keys(h.files)) do
    if mode(h.files[p].mode) & 0x800 ~= 0 then out[#out + 1] = p end
  end
  return table.concat(out, " ")
end
function CMD.getcap(h, a)
  if a[1] then return nil end
  local out = {}
  for _, p in ipairs(sorted_keys(h.caps or {})) do out[#out + 1] = p .. " " .. h.caps[p] end
  return table.concat(out, "; ")
end
function CMD.crontab(h, a)
  if a[1] then return nil end
  local out = {}
  for _, j in ipairs(h.cron or {}) do out[#out + 1] = j.user .. " " .. j.script end
  return #out > 0 and table.concat(out, "; ") or "no crontab"
end
function CMD.su(h, a)
  if not a[1] or not a[2] or a[3] then return nil end
  local u = h.users[a[1]]
  if not u then return "su: no such user" end
  if u.password ~= a[2] then return "su: auth failure" end
  return become(h, a[1])
end
function CMD.ssh(h, a)
  if not a[1] or a[2] ~= "-i" or not a[3] or a[4] then return nil end
  local u = h.users[a[1]]
  if not u then return "ssh: no such user" end
  local f = h.files[a[3]]
  if not f then return "ssh: no such key" end
  if not allowed(h, f, 4) then return "ssh: key not readable" end
  if not u.key or f.content ~= u.key then return "ssh: denied" end
  return become(h, a[1])
end
function CMD.sudo(h, a)
  if not a[1] or a[2] then return nil end
  local rules = (h.sudoers or {})[h.user] or {}
  if a[1] == "-l" then
    if #rules == 0 then return h.user .. " may not sudo" end
    local out = {}
    for _, r in ipairs(rules) do out[#out + 1] = "(root) NOPASSWD: " .. r end
    return table.concat(out, "; ")
  end
  local path = resolve(h, a[1])
  if not path then return "sudo: not found" end
  for _, r in ipairs(rules) do
    if r == path or r == "ALL" then
      if SHELLS[base(path)] then become(h, "root"); return "# root shell" end
      return "ran " .. base(path)
    end
  end
  return "sudo: not allowed"
end
function CMD.echo(h, a, rest)
  local text, target = rest:match("^echo%s+(.-)%s*>%s*(%S+)$")
  if not text then return nil end
  local f = h.files[target]
  if f then
    if not allowed(h, f, 2) then return "echo: permission denied" end
    f.content = text
  else
    local dir = target:match("^(.*)/[^/]*$") or ""
    local node = h.dirs and h.dirs[dir]
    local tmp = dir == "/tmp" or dir == "/dev/shm"
    if not tmp and not (node and allowed(h, node, 2)) and me(h) ~= 0 then return "echo: permission denied" end
    h.files[target] = { owner = h.user, mode = "644", content = text }
  end
  return "ok"
end
function CMD.wait(h, a)
  if a[1] then return nil end
  for _, j in ipairs(h.cron or {}) do
    local f = h.files[j.script]
    if uid_of(h, j.user) == 0 and f and f.content then
      for line in f.content:gmatch("[^;\n]+") do
        local target = line:match("^%s*chmod%s+u?%+s%s+(%S+)%s*$")
        local t = target and h.files[target]
        if t then
          local m = mode(t.mode) | 0x800
          t.mode = string.format("%o", m)
        end
      end
    end
  end
  return "time passes"
end

-- <bin> -p: the GTFOBins-style escape.
local function escape(h, word, a)
  if a[1] ~= "-p" or a[2] then return nil end
  local path = resolve(h, word)
  if not path then return nil end
  local f = h.files[path]
  if not allowed(h, f, 1) then return base(path) .. ": permission denied" end
  local b = base(path)
  local cap = (h.caps or {})[path]
  if SHELLS[b] and (suid_root(h, path) or (INTERP[b] and cap and cap:find("cap_setuid", 1, true))) then
    become(h, "root")
    return "# root shell"
  end
  return b .. ": no privileges"
end

function run(h, line, width)
  local out, known
  if #line > @MAX_LINE@ then
    out, known = "sh: line too long", false
  else
    line = line:gsub("^%s+", ""):gsub("%s+$", "")
    local words = {}
    for w in line:gmatch("%S+") do words[#words + 1] = w end
    local cmd = table.remove(words, 1)
    if cmd == nil then
      out, known = "", false
    else
      local fn = CMD[cmd]
      if fn then out = fn(h, words, line) end
      if out == nil and words[1] == "-p" then out = escape(h, cmd, words) end
      known = out ~= nil
      if out == nil then
        out = fn and (cmd .. ": bad arguments") or ("sh: " .. cmd:sub(1, 16) .. ": not found")
      end
    end
  end
  out = out:gsub("[%c]", " ")
  if #out > width then out = out:sub(1, width) end
  return ser({ host = h, out = out, known = known })
end
]==]
INTERP = INTERP:gsub("@SHELLS@", table.concat(M.SHELLS, " ")):gsub("@INTERP@", table.concat(M.INTERPRETERS, " "))
  :gsub("@MAX_LINE@", tostring(M.MAX_LINE))
M.SOURCE = INTERP

-- A value as Lua source (sorted keys: one host, one text), for the host going in.
local function literal(v)
  local t = type(v)
  if t == "string" then return (string.format("%q", v):gsub("\\\n", "\\n")) end
  if t == "number" or t == "boolean" then return tostring(v) end
  local keys = {}
  for k in pairs(v) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b)
    if type(a) == type(b) then return a < b end
    return type(a) == "number"
  end)
  local parts = {}
  for _, k in ipairs(keys) do parts[#parts + 1] = "[" .. literal(k) .. "]=" .. literal(v[k]) end
  return "{" .. table.concat(parts, ",") .. "}"
end
M.literal = literal

local function deep_copy(v)
  if type(v) ~= "table" then return v end
  local out = {}
  for k, x in pairs(v) do out[k] = deep_copy(x) end
  return out
end

local function octal(m) return type(m) == "string" and m:match("^[0-7][0-7][0-7][0-7]?$") ~= nil end

-- rl.shell.host(spec) -> a checked copy of a host description, or nil and a message saying what
-- is wrong with it. spec = {user =, users = {name = {uid =, password =, key =}}, files = {path =
-- {owner =, mode =, content =}}, dirs = {path = {owner =, mode =}}, sudoers = {user = {path or
-- "ALL", ...}}, caps = {path = "cap_setuid+ep"}, cron = {{user =, script =}, ...}, hostname =}.
function M.host(spec)
  if type(spec) ~= "table" then return nil, "host: a table expected, got " .. argcheck.describe(spec) end
  local known = { user = true, users = true, files = true, dirs = true, sudoers = true, caps = true,
    cron = true, hostname = true }
  for k in pairs(spec) do
    if not known[k] then return nil, "host: unknown field " .. argcheck.describe(k) end
  end
  if type(spec.users) ~= "table" then return nil, "host: users: a table {name = {uid =, password =}} expected" end
  local h = { user = spec.user, users = {}, files = {}, dirs = {}, sudoers = {}, caps = {}, cron = {},
    hostname = spec.hostname }
  if h.hostname ~= nil and type(h.hostname) ~= "string" then return nil, "host: hostname: a string expected" end
  for name, u in pairs(spec.users) do
    if type(name) ~= "string" or not name:match("^[%w_%-]+$") then
      return nil, "host: users: names of letters, digits, '_' and '-' expected, got " .. argcheck.describe(name)
    end
    if type(u) ~= "table" or math.type(u.uid) ~= "integer" or u.uid < 0 then
      return nil, string.format("host: users.%s.uid: a non-negative integer expected", name)
    end
    for k, v in pairs(u) do
      if k ~= "uid" and k ~= "password" and k ~= "key" then
        return nil, string.format("host: users.%s: unknown field %s", name, argcheck.describe(k))
      end
      if k ~= "uid" and type(v) ~= "string" then
        return nil, string.format("host: users.%s.%s: a string expected", name, k)
      end
    end
    h.users[name] = { uid = u.uid, password = u.password, key = u.key }
  end
  if type(spec.user) ~= "string" or not h.users[spec.user] then
    return nil, "host: user: the name of one of users expected, got " .. argcheck.describe(spec.user)
  end
  local function node_of(where, path, n, with_content)
    if type(path) ~= "string" or not path:match("^/%S*$") then
      return nil, string.format("host: %s: absolute paths without blanks as keys expected, got %s", where,
        argcheck.describe(path))
    end
    if type(n) ~= "table" then return nil, string.format("host: %s[%q]: a table expected", where, path) end
    for k in pairs(n) do
      if k ~= "owner" and k ~= "mode" and not (with_content and k == "content") then
        return nil, string.format("host: %s[%q]: unknown field %s", where, path, argcheck.describe(k))
      end
    end
    if not h.users[n.owner] then return nil, string.format("host: %s[%q].owner: one of users expected", where, path) end
    if not octal(n.mode) then
      return nil, string.format("host: %s[%q].mode: an octal string such as \"644\" or \"4755\" expected", where, path)
    end
    if n.content ~= nil and type(n.content) ~= "string" then
      return nil, string.format("host: %s[%q].content: a string expected", where, path)
    end
    return { owner = n.owner, mode = n.mode, content = n.content }
  end
  for field, content in pairs { files = true, dirs = false } do
    if spec[field] ~= nil and type(spec[field]) ~= "table" then return nil, "host: " .. field .. ": a table expected" end
    for path, n in pairs(spec[field] or {}) do
      local node, why = node_of(field, path, n, content)
      if not node then return nil, why end
      h[field][path] = node
    end
  end
  if spec.sudoers ~= nil and type(spec.sudoers) ~= "table" then return nil, "host: sudoers: a table expected" end
  for name, rules in pairs(spec.sudoers or {}) do
    if not h.users[name] then return nil, "host: sudoers: " .. argcheck.describe(name) .. " is not one of users" end
    if not argcheck.is_list(rules) then return nil, "host: sudoers." .. name .. ": a list of paths expected" end
    for i, r in ipairs(rules) do
      if type(r) ~= "string" or not (r == "ALL" or r:match("^/%S+$")) then
        return nil, string.format("host: sudoers.%s[%d]: a path or \"ALL\" expected", name, i)
      end
    end
    h.sudoers[name] = table.move(rules, 1, #rules, 1, {})
  end
  if spec.caps ~= nil and type(spec.caps) ~= "table" then return nil, "host: caps: a table expected" end
  for path, cap in pairs(spec.caps or {}) do
    if type(path) ~= "string" or not h.files[path] then return nil, "host: caps: " .. argcheck.describe(path) .. " is not one of files" end
    if type(cap) ~= "string" or not cap:match("^[%w_+=,]+$") then return nil, "host: caps." .. path .. ": a string such as \"cap_setuid+ep\" expected" end
    h.caps[path] = cap
  end
  if spec.cron ~= nil and not argcheck.is_list(spec.cron) then return nil, "host: cron: a list of {user =, script =} expected" end
  for i, j in ipairs(spec.cron or {}) do
    if type(j) ~= "table" or not h.users[j.user] or type(j.script) ~= "string" or not j.script:match("^/%S+$") then
      return nil, string.format("host: cron[%d]: {user = one of users, script = an absolute path} expected", i)
    end
    h.cron[i] = { user = j.user, script = j.script }
  end
  return h
end

local function check_opts(where, opts)
  return argcheck.fields(where, opts or {}, {
    { "width", M.WIDTH, argcheck.integer(1) },
    { "sandbox", true, argcheck.boolean },
    { "budget", 2000000, argcheck.integer(1000) },
  }, 3)
end

-- The direct interpreter (sandbox = false): the same source, loaded once into a table of its own
-- that holds only string, table, math and the base functions it uses (faster; for comparison).
local direct
local function direct_run()
  if not direct then
    local env = { string = string, table = table, math = math, tostring = tostring, tonumber = tonumber,
      pairs = pairs, ipairs = ipairs, type = type }
    assert(load(INTERP, "=shell", "t", env))()
    direct = env.run
  end
  return direct
end

-- Decodes the interpreter's reply (a table literal it wrote itself) in an empty environment.
local function decode(text)
  if type(text) ~= "string" or text:sub(1, 1) ~= "{" then return nil, "shell: the interpreter returned no state" end
  local fn, err = load("return " .. text, "=state", "t", {})
  if not fn then return nil, "shell: unreadable state: " .. tostring(err) end
  local ok, v = pcall(fn)
  if not ok or type(v) ~= "table" or type(v.host) ~= "table" then return nil, "shell: unreadable state" end
  return v
end

-- rl.shell.exec(host, line [, {width = 24, sandbox = true, budget = 2e6}]) -> new host, output,
-- known: runs one command line on a host (as rl.shell.host returns it; not changed) and returns
-- the host after it, the output (control characters blanked, cut at width bytes) and whether it
-- was a command of the set. nil and a message when the sandbox did not finish the command.
function M.exec(host, line, opts)
  if type(host) ~= "table" then error("rl.shell.exec: host: a table expected, got " .. argcheck.describe(host), 2) end
  if type(line) ~= "string" then error("rl.shell.exec: line: a string expected, got " .. argcheck.describe(line), 2) end
  local o = check_opts("rl.shell.exec", opts)
  local text
  if o.sandbox then
    local res = core.sandbox.lua { code = INTERP .. "\nreturn run(" .. literal(host) .. "," .. literal(line) .. ","
      .. o.width .. ")", budget = o.budget, mem_mb = 16 }
    if res.status ~= "ok" then return nil, "shell: " .. res.status .. ": " .. tostring(res.error) end
    text = res.value
  else
    local ok, v = pcall(direct_run(), deep_copy(host), line, o.width)
    if not ok then return nil, "shell: " .. tostring(v) end
    text = v
  end
  local v, err = decode(text)
  if not v then return nil, err end
  return v.host, v.out, v.known
end

-- ---------------------------------------------------------------- the shell object

local Shell = { __name = "moonrl.shell" }
Shell.__index = Shell

-- rl.shell.new(spec [, {width =, sandbox =, budget =}]) -> a shell on the host spec describes, or
-- nil and a message (a bad host).
function M.new(spec, opts)
  local o = check_opts("rl.shell.new", opts)
  local h, why = M.host(spec)
  if not h then return nil, why end
  return setmetatable({ host = h, opts = o, turns = 0 }, Shell)
end

-- sh:run(line) -> output, known (see exec); nil and a message when the sandbox failed (the host
-- is then left as it was).
function Shell:run(line)
  if type(line) ~= "string" then error("shell:run: line: a string expected, got " .. argcheck.describe(line), 2) end
  local h, out, known = M.exec(self.host, line, self.opts)
  if not h then return nil, out end
  self.host, self.turns = h, self.turns + 1
  return out, known
end

function Shell:uid() return self.host.users[self.host.user].uid end
function Shell:user() return self.host.user end
-- A copy of the host as plain data.
function Shell:state() return deep_copy(self.host) end
-- An independent shell on a copy of the host (the host forks).
function Shell:clone()
  return setmetatable({ host = deep_copy(self.host), opts = self.opts, turns = self.turns }, Shell)
end

M.Shell = Shell
return M
