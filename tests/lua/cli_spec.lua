-- cli_spec.lua - the moonrl command: run, -e, stdin scripts, exit statuses and tracebacks, help,
-- version, env (stock lua5.4 finds the built module), OpenBLAS core selection, Ctrl-C.
local BUILD = assert(os.getenv("MOONRL_BUILD"), "MOONRL_BUILD must name the build directory")
local ROOT = assert(os.getenv("MOONRL_ROOT"), "MOONRL_ROOT must name the repository")
local MOONRL = BUILD .. "/moonrl"
local PRELOAD = os.getenv("MOONRL_PRELOAD") or ""

local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local q, sh = H.shell_quote, H.sh
local tmpfile = H.write_temp

describe("moonrl run", function()
  it("passes arguments in arg and as varargs, arg[0] being the script", function()
    local script = tmpfile([[
      local a, b = ...
      print(arg[0], arg[1], arg[2], a, b, #arg)
    ]])
    local out, status = sh(MOONRL .. " run " .. script .. " first 'sec ond'")
    os.remove(script)
    assert.are.equal(0, status)
    assert.are.equal(script .. "\tfirst\tsec ond\tfirst\tsec ond\t2\n", out)
  end)

  it("exits with status 1 and a traceback when the script raises", function()
    local script = tmpfile("local function inner() error('deliberate failure') end\ninner()\n")
    local out, status = sh(MOONRL .. " run " .. script)
    os.remove(script)
    assert.are.equal(1, status)
    assert.truthy(out:find("deliberate failure", 1, true))
    assert.truthy(out:find(":1: deliberate failure", 1, true), out)
    assert.truthy(out:find("stack traceback:", 1, true))
    assert.truthy(out:find("in local 'inner'", 1, true) or out:find("in function 'inner'", 1, true)
      or out:find("inner", 1, true))
  end)

  it("reports a syntax error with the file and line", function()
    local script = tmpfile("local x = = 1\n")
    local out, status = sh(MOONRL .. " run " .. script)
    os.remove(script)
    assert.are.equal(1, status)
    assert.truthy(out:find(":1:", 1, true), out)
  end)

  it("fails clearly on a missing file", function()
    local out, status = sh(MOONRL .. " run /nonexistent/recipe.lua")
    assert.are.equal(1, status)
    assert.truthy(out:find("cannot open /nonexistent/recipe.lua", 1, true), out)
  end)

  it("runs a file given directly, and os.exit sets the status", function()
    local script = tmpfile("print('direct'); os.exit(7)")
    local out, status = sh(MOONRL .. " " .. script)
    os.remove(script)
    assert.are.equal(7, status)
    assert.are.equal("direct\n", out)
  end)

  it("runs standard input as a script when it is not a terminal", function()
    local out, status = sh("echo 'print(require(\"moonrl\").tensor.ones{3}:sum())' | " .. MOONRL)
    assert.are.equal(0, status)
    assert.are.equal("3.0\n", out)
  end)

  it("stops running code on Ctrl-C with an 'interrupted!' error", function()
    local out, status = sh(MOONRL .. " -e 'while true do end' & pid=$!; sleep 0.5; " ..
      "kill -INT $pid; wait $pid")
    assert.are.equal(1, status)
    assert.truthy(out:find("interrupted!", 1, true), out)
  end)
end)

describe("moonrl -e", function()
  it("runs a chunk with require 'moonrl' available", function()
    local out, status = sh(MOONRL .. " -e " ..
      q("local rl = require 'moonrl'; print(rl.tensor.from{{1,2},{3,4}}:matmul(rl.tensor.from{{1},{1}}):totable()[2][1])"))
    assert.are.equal(0, status)
    assert.are.equal("7.0\n", out)
  end)

  it("gives extra arguments in arg", function()
    local out = sh(MOONRL .. " -e 'print(arg[1], arg[2])' x y")
    assert.are.equal("x\ty\n", out)
  end)

  it("exits non-zero on an error", function()
    local out, status = sh(MOONRL .. " -e 'error(\"nope\")'")
    assert.are.equal(1, status)
    assert.truthy(out:find("nope", 1, true))
  end)
end)

describe("moonrl help, version, usage errors", function()
  it("help lists every command", function()
    local out, status = sh(MOONRL .. " help")
    assert.are.equal(0, status)
    for _, word in ipairs { "run FILE", "-e CODE", "repl", "version", "env", "help" } do
      assert.truthy(out:find(word, 1, true), word)
    end
  end)

  it("version names moonrl, Lua and the OpenBLAS core", function()
    local out, status = sh(MOONRL .. " version")
    assert.are.equal(0, status)
    assert.truthy(out:match("^moonrl 0%.1%.0 %(Lua 5%.4%.%d+; OpenBLAS core %S+ chosen by %a+"), out)
  end)

  it("rejects an unknown command with status 2 and the usage", function()
    local out, status = sh(MOONRL .. " frobnicate")
    assert.are.equal(2, status)
    assert.truthy(out:find("unknown command or file 'frobnicate'", 1, true))
    assert.truthy(out:find("usage: moonrl", 1, true))
  end)

  it("rejects run without a file", function()
    local out, status = sh(MOONRL .. " run")
    assert.are.equal(2, status)
    assert.truthy(out:find("run needs FILE", 1, true))
  end)
end)

describe("moonrl env", function()
  it("lets stock lua5.4 require the built module", function()
    local out, status = sh("eval \"$(" .. MOONRL .. " env)\" && LD_PRELOAD='" .. PRELOAD ..
      "' lua5.4 -e 'local rl = require \"moonrl\"; print(rl.version, rl.tensor.ones{2,2}:sum())'")
    assert.are.equal(0, status, out)
    assert.are.equal("0.1.0\t4.0\n", out)
  end)

  it("points LUA_PATH_5_4 at the repository's lua directory", function()
    local out = sh(MOONRL .. " env")
    assert.truthy(out:find("LUA_PATH_5_4='" .. ROOT .. "/lua/?.lua", 1, true), out)
    assert.truthy(out:find("MOONRL_LIB='" .. BUILD .. "/libmoonrl.so.0'", 1, true), out)
  end)
end)

describe("OpenBLAS core type", function()
  local probe = "local i = require('moonrl').blas_info(); print(i.core, i.source, i.recommended)"

  it("is chosen by moonrl for this CPU when the user sets nothing", function()
    local out, status = sh("env -u OPENBLAS_CORETYPE " .. MOONRL .. " -e " .. q(probe))
    assert.are.equal(0, status)
    local core, source, recommended = out:match("^(%S+)\t(%S+)\t(%S+)\n$")
    assert.truthy(core, out)
    if recommended ~= "nil" then
      assert.are.equal("moonrl", source)
      assert.are.equal(recommended, core)
    else
      assert.are.equal("openblas", source)
    end
  end)

  it("respects a core type the user set", function()
    local out = sh("OPENBLAS_CORETYPE=Haswell " .. MOONRL .. " -e " .. q(probe))
    assert.truthy(out:match("^Haswell\tuser\t"), out)
  end)
end)
