-- sandbox_spec.lua: busted spec of the tool sandbox from Lua (`rl.sandbox`): pools, calls and
-- their result tables, jobs, capabilities and refusals, argument errors, a few of the process
-- bad inputs through this API, and the restricted-Lua runner rl.sandbox.lua with the spec's bad
-- inputs 26-30 (shared/spec/sandbox.md), in-process and in the sandboxed worker. The bad inputs
-- 1-25 are tests/c/test_sandbox.c's. After each bad input the host must have the same open
-- fds, mounts and no process of the tools' uid.
--   MOONRL_ROOT=$PWD MOONRL_BUILD=$PWD/build ./build/moonrl run /usr/bin/busted -o TAP \
--     tests/lua/sandbox_spec.lua
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"

-- ---- the host's state ----

local function own_pid()
  local f = assert(io.open("/proc/self/stat"))
  local pid = f:read("a"):match("^(%d+)")
  f:close()
  return pid
end

local PID = own_pid()
-- tools run as a host uid of this run's own, so that leftovers can be counted
local UID = 300000 + tonumber(PID) % 100000

local read = H.read_file

local get_pool

local function snapshot()
  get_pool() -- made before, so that its fds are in both pictures
  -- listed by a child into a file: a pipe of io.popen would be one more fd of ours
  local list = os.tmpname()
  -- what the fds are, without numbers: a pool keeps a warm reaper whose fds are new each call
  os.execute("ls -l /proc/" .. PID .. "/fd | awk 'NR > 1 {sub(/:.*/, \"\", $11); print $11}' | sort > "
    .. list)
  local fds = read(list)
  os.remove(list)
  return {fds = fds, mounts = read("/proc/self/mountinfo")}
end

local function processes_of_uid()
  -- ls complains about a process that ends while /proc is listed: its stderr is not the count
  local out = H.sh("ls -ln /proc 2>/dev/null | awk '$3 == " .. UID .. "' | wc -l")
  return tonumber(out:match("(%d+)%s*$")), out
end

local function assert_host_unchanged(before)
  local after = snapshot()
  assert.are.equal(before.fds, after.fds)
  assert.are.equal(before.mounts, after.mounts)
  local n, out = processes_of_uid()
  assert.are.equal(0, n, out)
end

local pool
function get_pool()
  if not pool then pool = assert(rl.sandbox.pool{uid = UID, gid = UID, wall_ms = 5000}) end
  return pool
end

local function sh(script, opts)
  local call = {argv = {"/bin/sh", "-c", script}}
  for k, v in pairs(opts or {}) do call[k] = v end
  return get_pool():run(call)
end

-- ---- pools and calls ----

describe("rl.sandbox.pool", function()
  it("reports every protection with a note, and lists the missing ones", function()
    local caps = get_pool():capabilities()
    local names = {"user", "mount", "pid", "net", "ipc", "uts", "seccomp", "pids", "memory", "cpu"}
    local missing = {}
    for _, n in ipairs(names) do
      assert.is_boolean(caps[n])
      assert.is_string(caps.notes[n])
      assert.is_true(#caps.notes[n] > 0, n)
      if not caps[n] then missing[#missing + 1] = n end
    end
    assert.are.same(missing, caps.missing)
    assert.is_true(caps.mount and caps.pid)
  end)

  it("returns the issue's result table for a call", function()
    local r = sh("printf out; printf err >&2; exit 3")
    assert.are.equal("exited", r.status)
    assert.are.equal(3, r.exit_code)
    assert.is_nil(r.signal)
    assert.are.equal("out", r.stdout)
    assert.are.equal("err", r.stderr)
    assert.is_false(r.stdout_truncated)
    assert.is_false(r.stderr_truncated)
    assert.is_number(r.wall_ms)
    assert.is_number(r.cpu_ms)
    assert.is_true(math.type(r.max_rss_kb) == "integer" and r.max_rss_kb > 0)
    assert.are.same({}, r.files)
  end)

  it("passes stdin, files, env and limits; returns written files byte-exact", function()
    local bin = "\0\255\254 not utf-8 \192\128"
    local r = get_pool():run{argv = {"sh", "-c", "cat; cat in.bin > out.bin; echo $NAME > d/e.txt"},
      stdin = "from stdin\n", files = {["in.bin"] = bin, ["d/keep"] = "k"}, env = {NAME = "value"},
      wall_ms = 2000, out_cap = 1000}
    assert.are.equal("from stdin\n", r.stdout)
    assert.are.same({["out.bin"] = bin, ["d/e.txt"] = "value\n"}, r.files)
  end)

  it("keeps head and tail of a long output and says how much there was", function()
    local r = sh("printf 0123456789abcdefghij", {out_cap = 10})
    assert.is_true(r.stdout_truncated)
    assert.are.equal("01234fghij", r.stdout)
    assert.are.equal(20, r.stdout_bytes)
  end)

  it("runs 32 jobs at once: start, fd, done, wait, kill", function()
    local jobs = {}
    for i = 1, 32 do
      -- each job writes the wall clock (ns) when it starts and when it ends
      jobs[i] = get_pool():start{argv = {"sh", "-c", "date +%s%N; sleep 1; date +%s%N; echo " .. i}}
      assert.is_true(math.type(jobs[i]:fd()) == "integer" and jobs[i]:fd() >= 0)
    end
    local latest_start, earliest_end = math.mininteger, math.maxinteger
    for i = 1, 32 do
      local r = jobs[i]:wait()
      local start, finish, rest = r.stdout:match("^(%d+)\n(%d+)\n(.*)$")
      assert.are.equal(i .. "\n", rest)
      start, finish = math.tointeger(start), math.tointeger(finish)
      assert.is_true(start < finish)
      latest_start, earliest_end = math.max(latest_start, start), math.min(earliest_end, finish)
      assert.are.equal(r, jobs[i]:wait()) -- the same table again
      assert.is_true(jobs[i]:done())
      jobs[i]:close()
    end
    -- they ran at once: every job had started before the first one ended
    assert.is_true(latest_start < earliest_end)
    local j = get_pool():start{argv = {"sleep", "100"}}
    assert.is_false(j:done())
    j:kill()
    local r = j:wait()
    assert.are.equal("signaled", r.status)
    assert.are.equal(9, r.signal)
    j:close()
    assert.has_error(function() j:wait() end)
  end)

  it("raises argument errors for misuse, naming the field", function()
    local p = get_pool()
    H.assert_error(function() p:run{} end, "argv")
    H.assert_error(function() p:run{argv = {}} end, "argv")
    H.assert_error(function() p:run{argv = {"true"}, nonsense = 1} end, "unknown field 'nonsense'")
    H.assert_error(function() p:run{argv = {"true"}, files = {["../x"] = "y"}} end, "files")
    H.assert_error(function() p:run{argv = {"true"}, wall_ms = -1} end, "wall_ms")
    H.assert_error(function() p:run{argv = {"true"}, wall_ms = "soon"} end, "wall_ms")
    H.assert_error(function() p:run{argv = {"true"}, env = {["A=B"] = "x"}} end, "env")
    H.assert_error(function() p:run{argv = {true}} end, "argv[1]")
    H.assert_error(function() p.run({}, {argv = {"true"}}) end, "sandbox pool expected")
    H.assert_error(function() rl.sandbox.pool{require = {"bogus"}} end, "unknown protection 'bogus'")
    H.assert_error(function() rl.sandbox.pool{disable = {"mount"}} end, "cannot be turned off")
    H.assert_error(function() rl.sandbox.pool{require = {"net"}, disable = {"net"}} end, "both")
    H.assert_error(function() rl.sandbox.pool{ro_paths = {"relative"}} end, "ro_paths")
    local closed = assert(rl.sandbox.pool{uid = UID, gid = UID})
    closed:close()
    H.assert_error(function() closed:run{argv = {"true"}} end, "closed")
  end)

  it("refuses a required protection the host lacks with nil and a message", function()
    local caps = get_pool():capabilities()
    for _, name in ipairs(caps.missing) do
      local p, msg = rl.sandbox.pool{require = {name}}
      assert.is_nil(p)
      assert.truthy(msg:find(name, 1, true), msg)
    end
    -- and a protection turned off is off, and said to be
    local p = assert(rl.sandbox.pool{disable = {"net", "uts"}, uid = UID, gid = UID})
    local c = p:capabilities()
    assert.is_false(c.net)
    assert.are.equal("disabled by the caller", c.notes.net)
    assert.are.same({"net", "uts"}, c.missing)
    p:close()
  end)

  it("a missing program is a setup_error with a message", function()
    local r = get_pool():run{argv = {"no-such-tool-abc"}}
    assert.are.equal("setup_error", r.status)
    assert.truthy(r.message:find("no-such-tool-abc", 1, true))
    assert.is_nil(r.exit_code)
  end)
end)

describe("process bad inputs through the Lua API", function()
  it("sleep -> timeout, host unchanged", function()
    local before = snapshot()
    local r = get_pool():run{argv = {"sleep", "1000"}, wall_ms = 200}
    assert.are.equal("timeout", r.status)
    assert.are.equal(9, r.signal)
    assert.is_true(r.wall_ms >= 190 and r.wall_ms < 5000)
    assert_host_unchanged(before)
  end)

  it("output flood -> output_limit, host unchanged", function()
    local before = snapshot()
    local r = get_pool():run{argv = {"yes"}, out_cap = 100, out_kill = 1 << 20}
    assert.are.equal("output_limit", r.status)
    assert.is_true(r.stdout_truncated)
    assert.are.equal(100, #r.stdout)
    assert_host_unchanged(before)
  end)

  it("a daemon and a grandchild holding stdout are gone when the call returns", function()
    local before = snapshot()
    local r = sh("setsid sleep 1000 >/dev/null 2>&1 & (sleep 1000 &); echo ok")
    assert.are.equal("ok\n", r.stdout)
    assert.is_true(r.wall_ms < 5000) -- not the sleeps' 1000 s
    assert_host_unchanged(before)
  end)

  it("busy loop -> cpu_limit; fork bomb -> pids_limit (where the host has the cgroup)", function()
    local before = snapshot()
    local r = sh("while :; do :; done", {cpu_ms = 200, wall_ms = 30000})
    assert.are.equal("cpu_limit", r.status)
    if get_pool():capabilities().pids then
      r = sh("b() { b | b & }; b; sleep 10", {pids = 16})
      assert.are.equal("pids_limit", r.status)
    end
    assert_host_unchanged(before)
  end)
end)

-- ---- restricted Lua ----

-- Runs code both in-process and in the sandboxed worker; both must agree on status and value.
local function both(opts)
  local a = rl.sandbox.lua(opts)
  local w = {}
  for k, v in pairs(opts) do w[k] = v end
  w.wall_ms = w.wall_ms or 10000
  w.pool = get_pool()
  local b = rl.sandbox.lua(w)
  assert.are.equal(a.status, b.status)
  assert.are.equal(a.value, b.value)
  assert.are.equal(a.output, b.output)
  assert.are.equal(a.error, b.error)
  return a
end

describe("rl.sandbox.lua", function()
  it("returns status, value, output and error", function()
    local r = both{code = "print('hello', 1, nil) return 42"}
    assert.are.equal("ok", r.status)
    assert.are.equal(42, r.value)
    assert.are.equal("hello\t1\tnil\n", r.output)
    assert.is_nil(r.error)
    assert.are.equal(1.5, both{code = "return 1.5"}.value)
    assert.are.equal(true, both{code = "return 1 < 2"}.value)
    assert.are.equal("\0bytes\255", both{code = "return '\\0bytes\\255'"}.value)
    assert.is_nil(both{code = "x = 1"}.value)
    assert.truthy(both{code = "return {}"}.value:match("^table: "))
    assert.are.equal("shown", both{code = "return setmetatable({}, {__tostring = function() return 'shown' end})"}.value)
    r = both{code = "error('boom')"}
    assert.are.equal("error", r.status)
    assert.truthy(r.error:find("boom", 1, true))
    r = both{code = "return +"}
    assert.are.equal("error", r.status)
    assert.truthy(r.error:find("unexpected symbol", 1, true))
  end)

  it("gives every call a fresh state", function()
    rl.sandbox.lua{code = "leak = 1"}
    local r = rl.sandbox.lua{code = "return rawget(_G, 'leak')"}
    assert.is_nil(r.value)
    assert.is_nil(rawget(_G, "leak"))
  end)

  it("caps print", function()
    local r = both{code = "for i = 1, 1000 do print(i) end", output_cap = 10}
    assert.are.equal("1\n2\n3\n4\n5\n", r.output)
    assert.is_true(r.output_truncated)
  end)

  it("raises argument errors for misuse", function()
    H.assert_error(function() rl.sandbox.lua{} end, "code")
    H.assert_error(function() rl.sandbox.lua{code = 1} end, "code")
    H.assert_error(function() rl.sandbox.lua{code = "", budget = 0} end, "budget")
    H.assert_error(function() rl.sandbox.lua{code = "", mem_mb = 1.5} end, "mem_mb")
    H.assert_error(function() rl.sandbox.lua{code = "", stuff = 1} end, "unknown field 'stuff'")
    H.assert_error(function() rl.sandbox.lua{code = "", pool = {}} end, "pool")
  end)

  describe("bad input 26: endless loops exceed the budget", function()
    local loops = {
      plain = "while true do end",
      pcall = "while true do pcall(function() while true do end end) end",
      xpcall = "xpcall(function() while true do end end, function(e) while true do end end)",
      coroutine = "local co = coroutine.wrap(function() while true do end end) co()",
      ["coroutine in pcall"] = [[
        while true do
          local co = coroutine.create(function() while true do end end)
          coroutine.resume(co)
          pcall(error, "again")
        end]],
      ["error handler loop"] = "local ok = pcall(function() error(setmetatable({}, {__tostring = function() while true do end end})) end) while true do end",
      ["xpcall handler after an ordinary error"] = "xpcall(error, function(e) while true do end end)",
    }
    for name, code in pairs(loops) do
      it(name, function()
        local before = snapshot()
        local r = both{code = code, budget = 100000}
        assert.are.equal("budget", r.status)
        assert.truthy(r.error:find("instruction budget of 100000 exceeded", 1, true))
        assert_host_unchanged(before)
      end)
    end
  end)

  describe("bad input 27: memory bombs end in oom, the engine intact", function()
    local bombs = {
      ["string.rep of 1 GiB"] = "return #string.rep('x', 1 << 30)",
      ["doubling concatenation"] = "local s = 'x' while true do s = s .. s end",
      ["table growth"] = "local t = {} for i = 1, 1e10 do t[i] = i end",
      ["table.concat"] = "local t = {} for i = 1, 1e6 do t[i] = ('y'):rep(100) end return #table.concat(t)",
    }
    for name, code in pairs(bombs) do
      it(name, function()
        local before = snapshot()
        local used = rl.memory().used
        local r = both{code = code, mem_mb = 16}
        assert.are.equal("oom", r.status)
        assert.are.equal("not enough memory", r.error)
        assert.are.equal(used, rl.memory().used)
        assert.are.equal("fine", rl.sandbox.lua{code = "return 'fine'"}.value)
        assert_host_unchanged(before)
      end)
    end

    it("a memory error caught by pcall is the code's business", function()
      local r = rl.sandbox.lua{code = "local ok, e = pcall(string.rep, 'x', 1 << 30) return e", mem_mb = 16}
      assert.are.equal("ok", r.status)
      assert.are.equal("not enough memory", r.value)
    end)
  end)

  it("refuses __gc metamethods, which Lua would run without the budget", function()
    local r = both{code = "setmetatable({}, {__gc = function() while true do end end})"}
    assert.are.equal("error", r.status)
    assert.truthy(r.error:find("__gc metamethods are not available", 1, true))
    r = both{code = "local mt = {} local t = setmetatable({}, mt) mt.__gc = function() while true do end end "
      .. "for i = 1, 1e5 do local x = {} end return 'collected without running it'"}
    assert.are.equal("collected without running it", r.value)
  end)

  it("bad input 28: deep recursion is a stack overflow error, the engine intact", function()
    local before = snapshot()
    local r = both{code = "local function f(n) return 1 + f(n + 1) end return f(1)"}
    assert.are.equal("error", r.status)
    assert.truthy(r.error:find("stack overflow", 1, true), r.error)
    r = both{code = "local t = setmetatable({}, {__index = function(t, k) return t[k] end}) return t.x"}
    assert.are.equal("error", r.status)
    assert.truthy(r.error:find("C stack overflow", 1, true), r.error)
    -- caught by pcall at the deepest level, the overflow is the code's own business
    r = both{code = "local function f() return pcall(f) end return (f())"}
    assert.are.equal("ok", r.status)
    assert.are.equal(3, rl.sandbox.lua{code = "return 1 + 2"}.value)
    assert_host_unchanged(before)
  end)

  it("bad input 29: io, os, require, bytecode, string.dump and debug are unavailable", function()
    local before = snapshot()
    for _, name in ipairs{"io", "os", "require", "debug", "package", "dofile", "loadfile",
                          "collectgarbage"} do
      local r = both{code = "return " .. name}
      assert.are.equal("error", r.status)
      assert.truthy(r.error:find("'" .. name .. "' is not available in the sandbox", 1, true), r.error)
    end
    local r = both{code = "return string.dump"}
    assert.are.equal("ok", r.status)
    assert.is_nil(r.value)
    r = both{code = "return load('\\27Lua\\84\\0')"}
    assert.are.equal("ok", r.status)
    assert.is_nil(r.value)
    r = both{code = "local f, e = load('\\27Lua\\84\\0') return e"}
    assert.truthy(r.value:find("attempt to load a binary chunk", 1, true), r.value)
    r = both{code = "local f, e = load('\\27Lua\\84\\0', 'x', 'b') return e"}
    assert.truthy(r.value:find("binary chunk", 1, true), r.value)
    assert.are.equal(7, both{code = "return load('return 7')()"}.value)
    assert.are.equal("string", both{code = "return getmetatable('').__index == string and 'string'"}.value)
    r = both{code = "return undefined_name"}
    assert.truthy(r.error:find("global 'undefined_name' is not defined", 1, true))
    assert_host_unchanged(before)
  end)

  it("bad input 30: a catastrophic pattern is stopped by the wall clock", function()
    local before = snapshot()
    local t0 = rl.clock()
    local r = rl.sandbox.lua{code = "local n = 40 return (('a?'):rep(n) .. ('a'):rep(n)):find(('a?'):rep(n) .. ('a'):rep(n) .. 'b')",
      wall_ms = 300, pool = get_pool()}
    local took = (rl.clock() - t0) * 1000
    assert.are.equal("timeout", r.status)
    assert.truthy(r.error:find("300 ms", 1, true))
    assert.is_true(took < 5000, took)
    assert_host_unchanged(before)
  end)

  it("runs in the default pool when given wall_ms alone", function()
    local r = rl.sandbox.lua{code = "print('w') return 1", wall_ms = 2000}
    assert.are.equal("ok", r.status)
    assert.are.equal("w\n", r.output)
    assert.are.equal(rl.sandbox.default_pool(), rl.sandbox.default_pool())
  end)
end)
