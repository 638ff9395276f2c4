-- tool_spec.lua: busted spec of the tool constructors (`rl.tool`, lua/moonrl/tool.lua): the
-- plain constructor and its checks, the shell runner (argv from a function, a list or a string,
-- stdin and files, limits, the observation text for clean and failed calls, the result table),
-- the Lua runner (fixed source seeing `args`, generated source, budget, errors, wall clock), and
-- that environments accept the tools.
--   MOONRL_ROOT=$PWD MOONRL_BUILD=$PWD/build ./build/moonrl run /usr/bin/busted -o TAP \
--     tests/lua/tool_spec.lua
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"

local pool
local function get_pool()
  pool = pool or assert(rl.sandbox.pool{max_jobs = 4})
  return pool
end

describe("rl.tool", function()
  it("makes a tool table from name, description, args and run", function()
    local t = rl.tool{name = "add", description = "adds two numbers", args = {"a", "b"},
      run = function(args) return tostring(args[1] + args[2]) end}
    assert.are.equal("add", t.name)
    assert.are.equal("adds two numbers", t.description)
    assert.are.same({"a", "b"}, t.args)
    assert.are.equal("5", t.run({2, 3}))
    local bare = rl.tool{name = "noop", run = function() return "" end}
    assert.are.equal("", bare.description)
    assert.are.same({}, bare.args)
  end)

  it("checks its fields", function()
    H.assert_error(function() rl.tool("x") end, "a table expected")
    H.assert_error(function() rl.tool{run = function() end} end, "name")
    H.assert_error(function() rl.tool{name = "has space", run = function() end} end, "name")
    H.assert_error(function() rl.tool{name = "x"} end, "run must be a function")
    H.assert_error(function() rl.tool{name = "x", run = function() end, args = "a"} end, "args")
    H.assert_error(function() rl.tool{name = "x", run = function() end, description = 1} end,
      "description")
    H.assert_error(function() rl.tool{name = "x", run = function() end, extra = 1} end,
      "unknown field 'extra'")
  end)

  it("is accepted by environments", function()
    local env = rl.env.check{name = "e", new = function() end, tasks = function() end,
      tools = {rl.tool.shell{name = "ls", command = {"ls"}},
               rl.tool.lua{name = "calc", code = "return 1"},
               rl.tool{name = "f", run = function() return "" end}}}
    assert.are.equal(3, #env.tools)
  end)

  it("runs a call from an episode's action in the sandbox; the text is the observation", function()
    local env = rl.env.check{name = "e", format = "line", tasks = function() return {} end,
      new = function() return {step = function() return "no tool", 0.5, true end} end,
      tools = {rl.tool.shell{name = "wc", args = {"text"}, pool = get_pool(),
        command = function(args) return {"wc", "-c"}, {stdin = args[1]} end}}}
    local inst, record = env.new(), {}
    local obs, reward, done = rl.env.step(env, inst, "CALL wc abcdef", record)
    assert.are.equal("6", obs)
    assert.are.equal(0, reward)
    assert.is_false(done)
    assert.are.equal("call", record[1].parsed.kind)
    -- not a call to a tool: the instance steps
    obs, reward, done = rl.env.step(env, inst, "ANSWER 6", record)
    assert.are.same({"no tool", 0.5, true}, {obs, reward, done})
    assert.are.equal(2, #record)
  end)
end)

describe("rl.tool.shell", function()
  it("runs the argv its command function builds, in the sandbox", function()
    local t = rl.tool.shell{name = "echo", description = "echo the words", args = {"words"},
      command = function(args) return {"echo", table.unpack(args)} end, pool = get_pool()}
    local text, res = t.run({"hello", "world"})
    assert.are.equal("hello world", text)
    assert.are.equal("exited", res.status)
    assert.are.equal("hello world\n", res.stdout)
  end)

  it("takes a fixed argv or a shell string, and stdin and files from the command", function()
    local t = rl.tool.shell{name = "pwd", command = {"pwd"}, pool = get_pool()}
    assert.are.equal("/work", t.run({}))
    t = rl.tool.shell{name = "sum", command = "echo $((1 + 2))", pool = get_pool()}
    assert.are.equal("3", t.run({}))
    t = rl.tool.shell{name = "count2", pool = get_pool(),
      command = function(args)
        return "wc -l < data.txt; cat", {files = {["data.txt"] = args.text}, stdin = "in"}
      end}
    assert.are.equal("3\nin", t.run({text = "a\nb\nc\n"}))
  end)

  it("shows stderr and a status line when the call did not end cleanly", function()
    local t = rl.tool.shell{name = "fail", command = "echo out; echo err >&2; exit 3",
      pool = get_pool()}
    assert.are.equal("out\n[stderr]\nerr\n[exit code 3]", t.run({}))
    t = rl.tool.shell{name = "quiet", command = "echo only-err >&2", pool = get_pool()}
    assert.are.equal("[stderr]\nonly-err", t.run({}))
    t = rl.tool.shell{name = "noisy", command = "echo fine; echo warn >&2", pool = get_pool()}
    assert.are.equal("fine", t.run({}))
    t = rl.tool.shell{name = "slow", command = {"sleep", "100"}, wall_ms = 100, pool = get_pool()}
    local text, res = t.run({})
    assert.are.equal("timeout", res.status)
    assert.are.equal("[timed out: wall-clock limit of 100 ms]", text)
    t = rl.tool.shell{name = "segv", command = "kill -SEGV $$", pool = get_pool()}
    assert.are.equal("[killed by signal 11 (SIGSEGV)]", t.run({}))
    t = rl.tool.shell{name = "missing", command = {"no-such-program"}, pool = get_pool()}
    assert.truthy(t.run({}):find("^%[could not run: execute no%-such%-program: No such file"))
    t = rl.tool.shell{name = "loop", command = "while :; do :; done", cpu_ms = 100, wall_ms = 30000,
      pool = get_pool()}
    assert.are.equal("[stopped (cpu_limit): CPU limit of 100 ms]", t.run({}))
  end)

  it("marks where long output was cut", function()
    local t = rl.tool.shell{name = "long", command = "printf 0123456789abcdefghij", out_cap = 10,
      pool = get_pool()}
    assert.are.equal("01234\n[... 10 bytes omitted ...]\nfghij", t.run({}))
  end)

  it("raises when the command gives no argv", function()
    local t = rl.tool.shell{name = "bad", command = function() return 42 end, pool = get_pool()}
    H.assert_error(function() t.run({}) end, "gave no argv")
    H.assert_error(function() rl.tool.shell{name = "x"} end, "command must be")
    H.assert_error(function() rl.tool.shell{name = "x", command = "ls", walltime = 1} end,
      "unknown field 'walltime'")
  end)

  it("uses the default pool when given none", function()
    local t = rl.tool.shell{name = "true", command = {"true"}}
    local text, res = t.run({})
    assert.are.equal("", text)
    assert.are.equal(0, res.exit_code)
  end)
end)

describe("rl.tool.lua", function()
  it("runs a fixed source that sees the call's args", function()
    local t = rl.tool.lua{name = "calc", description = "evaluates", args = {expr = "string"},
      code = "print('computing') return args.x * 2 + #args.list"}
    local text, res = t.run({x = 20, list = {1, 2}, note = "a \"quoted\"\nline"})
    assert.are.equal("computing\n42", text)
    assert.are.equal("ok", res.status)
    assert.are.equal(42, res.value)
  end)

  it("keeps line numbers of a fixed source", function()
    local t = rl.tool.lua{name = "bad", code = "local a = 1\nlocal b = nil + 1"}
    local text = t.run({})
    assert.truthy(text:find("^%[error: tool:2: attempt to perform arithmetic on a nil value"), text)
  end)

  it("runs the source a code function builds", function()
    local t = rl.tool.lua{name = "expr", code = function(args) return "return " .. args[1] end}
    assert.are.equal("7", t.run({"3 + 4"}))
    assert.truthy(t.run({"3 +"}):find("^%[error: "))
    local bad = rl.tool.lua{name = "none", code = function() return nil end}
    H.assert_error(function() bad.run({}) end, "gave no Lua source")
  end)

  it("reports the budget, memory and the wall clock", function()
    local t = rl.tool.lua{name = "spin", code = "while true do end", budget = 1000}
    assert.are.equal("[stopped: instruction budget of 1000 exceeded]", t.run({}))
    t = rl.tool.lua{name = "hog", code = "return ('x'):rep(1 << 30)", mem_mb = 8}
    assert.are.equal("[stopped: out of memory]", t.run({}))
    t = rl.tool.lua{name = "pattern", wall_ms = 200, pool = get_pool(),
      code = "return (('a?'):rep(40) .. ('a'):rep(40)):find(('a?'):rep(40) .. ('a'):rep(40) .. 'b')"}
    local text, res = t.run({})
    assert.are.equal("timeout", res.status)
    assert.truthy(text:find("^%[timed out: "), text)
  end)

  it("reports error objects that are not strings, in this process and in the sandbox", function()
    for _, where in ipairs { {}, {wall_ms = 5000, pool = get_pool()} } do
      local function run(code, mem_mb)
        local spec = {name = "raises", code = code, mem_mb = mem_mb}
        for k, v in pairs(where) do spec[k] = v end
        local _, res = rl.tool.lua(spec).run({})
        return res
      end
      local res = run("error(42.5)")
      assert.are.same({"error", "42.5"}, {res.status, res.error})
      res = run("error(7)")
      assert.are.equal("7", res.error)
      res = run("error({})")
      assert.are.same({"error", "(error object is not a string)"}, {res.status, res.error})
      -- a number raised by code that holds all of its memory: converting it may find no room,
      -- which is an error result too, never a crash
      res = run([[
        T = {}
        for _, size in ipairs {4096, 256, 16, 1} do
          pcall(function() while true do local k = #T + 1 T[k] = ('x'):rep(size) .. k end end)
        end
        error(1.25)]], 1)
      assert.is_true(res.status == "error" or res.status == "oom", res.status)
      assert.is_string(res.error)
    end
    assert.are.equal("2", rl.tool.lua{name = "after", code = "return 1 + 1"}.run({}))
  end)

  it("checks its fields", function()
    H.assert_error(function() rl.tool.lua{name = "x"} end, "code must be")
    H.assert_error(function() rl.tool.lua{name = "x", code = "", pool2 = 1} end, "unknown field")
  end)
end)
