-- ffi_spec.lua: busted spec of the LuaJIT FFI binding (`require "moonrl.ffi"`): the generated
-- cdef matches moonrl.h and the library, results equal the Lua 5.4 binding's bit for bit, errors
-- name their argument, tensor memory goes back to the engine, and the raw C API (rl.C) builds,
-- runs and scores a model as the Lua 5.4 binding does.
--
-- Run under LuaJIT with the test runner's environment:
--   MOONRL_ROOT=$PWD MOONRL_BUILD=$PWD/build LUA_PATH="$PWD/lua/?.lua;$PWD/build/lua/?.lua;;" \
--   MOONRL_LIB=$PWD/build/libmoonrl.so.0 luajit /usr/bin/busted -o TAP tests/luajit

-- The runner's environment; a missing variable fails the tests that need it.
local function env(name)
  local v = os.getenv(name)
  assert(v and v ~= "", name .. " is not set (see the run command at the top of ffi_spec.lua)")
  return v
end

local loaded, rl = pcall(require, "moonrl.ffi")
local T = loaded and rl.tensor

-- s quoted for a POSIX shell.
local function quote(s) return "'" .. (s:gsub("'", [['\'']])) .. "'" end

-- Runs a shell command; returns its output, stdout and stderr together.
local function run(cmd)
  local f = assert(io.popen(cmd .. " 2>&1", "r"))
  local out = f:read("*a")
  f:close()
  return out
end

-- Runs a chunk in a fresh LuaJIT process (with this process's environment unless prefixed).
local function run_luajit(code, env_prefix)
  return run((env_prefix or "") .. "luajit -e " .. quote(code))
end

-- The message of the error f raises (f must raise).
local function error_of(f)
  local ok, err = pcall(f)
  assert(not ok, "expected an error")
  return tostring(err)
end

local function assert_finds(text, wanted)
  assert(text:find(wanted, 1, true), ("expected %q in %q"):format(wanted, text))
end

-- Tensor memory held by the engine after collecting every unreachable tensor.
local function settled_memory()
  collectgarbage()
  collectgarbage()
  return rl.memory().used
end

describe("the test environment", function()
  it("provides MOONRL_ROOT, MOONRL_BUILD, MOONRL_LIB and a loadable moonrl.ffi", function()
    env("MOONRL_ROOT")
    env("MOONRL_BUILD")
    env("MOONRL_LIB")
    assert(loaded, "require 'moonrl.ffi' failed: " .. tostring(rl))
  end)
end)

-- ---- the generated cdef ----------------------------------------------------------------------

describe("the generated cdef", function()
  local built_path = function() return env("MOONRL_BUILD") .. "/lua/moonrl/ffi_cdef.lua" end

  -- A fresh ffi_cdef.lua made from the current header; returns its path (the caller removes it).
  local function regenerate()
    local root, path = env("MOONRL_ROOT"), os.tmpname()
    local out = run("lua5.4 " .. quote(root .. "/scripts/gen_cdef.lua") .. " "
                    .. quote(root .. "/engine/include/moonrl.h") .. " " .. quote(path))
    assert.equal("", out)
    return path
  end

  it("is what gen_cdef.lua makes of the current header", function()
    local path = regenerate()
    local fresh, built = dofile(path), dofile(built_path())
    os.remove(path)
    assert.equal(fresh.version, built.version)
    assert.equal(fresh.cdef, built.cdef)
    assert.is_nil(built.libdir) -- only `make install` sets it
  end)

  it("is the one moonrl.ffi declared", function()
    assert.equal(dofile(built_path()).cdef, package.loaded["moonrl.ffi_cdef"].cdef)
  end)

  it("carries the header's version, which is the library's", function()
    local f = assert(io.open(env("MOONRL_ROOT") .. "/engine/include/moonrl.h"))
    local header = f:read("*a")
    f:close()
    local version = header:match('#define MRL_VERSION_STRING "([^"]+)"')
    assert.equal(version, dofile(built_path()).version)
    assert.equal(version, rl.version)
  end)

  it("parses in a fresh LuaJIT, and the library defines every function it declares", function()
    local out = run_luajit(([[
      local ffi = require "ffi"
      local cdef = dofile(%q).cdef
      ffi.cdef(cdef)
      local lib = ffi.load(%q)
      local count, missing = 0, {}
      for name in cdef:gmatch("(mrl_[%%w_]+)%%(") do
        count = count + 1
        if not pcall(function() return lib[name] end) then missing[#missing + 1] = name end
      end
      assert(ffi.typeof("mrl_tensor *") and ffi.typeof("mrl_engine *"))
      print(count, "missing: " .. table.concat(missing, " "))
    ]]):format(built_path(), env("MOONRL_LIB")))
    local count, missing = out:match("^(%d+)\tmissing: (.-)\n$")
    assert(count, out)
    assert.is_true(tonumber(count) >= 70, out)
    assert.equal("", missing)
  end)

  it("leaves out the Lua 5.4 script API", function()
    local cdef = dofile(built_path()).cdef
    assert.is_nil(cdef:find("mrl_script_new", 1, true))
    assert.truthy(cdef:find("mrl_status mrl_tensor_matmul(", 1, true))
  end)
end)

-- ---- loading ------------------------------------------------------------------------------

describe("loading moonrl.ffi", function()
  -- A chunk that makes require "moonrl.ffi_cdef" return the built declarations with `changes`
  -- applied (Lua source setting fields of `c`), then requires moonrl.ffi and prints the outcome.
  local function load_with(changes)
    return ([[
      package.preload["moonrl.ffi_cdef"] = function()
        local c = dofile(%q)
        %s
        return c
      end
      local ok, rl = pcall(require, "moonrl.ffi")
      print(ok and "loaded " .. rl.version .. " " .. rl.tensor.ones({2}):sum() or rl)
    ]]):format(env("MOONRL_BUILD") .. "/lua/moonrl/ffi_cdef.lua", changes)
  end

  it("refuses a library whose version is not the cdef's", function()
    local out = run_luajit(load_with('c.version = "0.0.0-other"'))
    assert_finds(out, "is libmoonrl version " .. rl.version)
    assert_finds(out, "declares version 0.0.0-other")
    assert.is_nil(out:find("loaded", 1, true))
  end)

  it("finds the library in the installed libdir when MOONRL_LIB is unset", function()
    local build = env("MOONRL_BUILD")
    local out = run_luajit(load_with(("c.libdir = %q"):format(build)), "env -u MOONRL_LIB ")
    assert.equal("loaded " .. rl.version .. " 2\n", out)
  end)

  it("falls back to libdir when MOONRL_LIB names no library", function()
    local build = env("MOONRL_BUILD")
    local out = run_luajit(load_with(("c.libdir = %q"):format(build)),
                           "MOONRL_LIB=/nonexistent/libmoonrl.so.0 ")
    assert.equal("loaded " .. rl.version .. " 2\n", out)
  end)
end)

-- ---- the API surface ------------------------------------------------------------------------

describe("the API surface", function()
  -- The names registered in a luaL_Reg array of a C file of the Lua 5.4 binding.
  local function registered(file, array)
    local f = assert(io.open(env("MOONRL_ROOT") .. "/engine/src/lua/" .. file))
    local src = f:read("*a")
    f:close()
    local block = assert(src:match(array .. "%[%] = (%b{})"), array .. " not found in " .. file)
    local names = {}
    for name in block:gmatch('{"([%w_]+)",') do names[#names + 1] = name end
    assert.is_true(#names > 0)
    return names
  end

  it("has every tensor method of lua_tensor.c's tensor_methods[]", function()
    local t = T.zeros({2})
    for _, name in ipairs(registered("lua_tensor.c", "tensor_methods")) do
      assert.is_function(t[name], name)
    end
  end)

  it("has every constructor of tensor_funcs[] and every function of core_funcs[]", function()
    for _, name in ipairs(registered("lua_tensor.c", "tensor_funcs")) do
      assert.is_function(T[name], name)
    end
    for _, name in ipairs(registered("lua_module.c", "core_funcs")) do
      assert.is_function(rl[name], name)
    end
    assert.is_string(rl.version)
  end)

  it("rl.rng draws the same stream as the Lua 5.4 binding, and checks its arguments", function()
    -- wide intervals too: bounds of +-2^53 are exact in both, and n - m = 2^54 is past what a
    -- double-based draw could cover evenly
    local code = "local rl = require \"moonrl\" local r = rl.rng(7) local t = {} for i = 1, 4 do t[#t + 1] = string.format('%.17g', r:random()) end "
      .. "t[#t + 1] = r:random(6) t[#t + 1] = r:random(-3, 3) t[#t + 1] = string.format('%.17g', r:normal()) "
      .. "for i = 1, 8 do t[#t + 1] = string.format('%d', r:random(-(1 << 53), 1 << 53)) end "
      .. "print(table.concat(t, ' '))"
    local lua54 = run(quote(env("MOONRL_BUILD") .. "/moonrl") .. " -e " .. quote(code))
    local r, t = rl.rng(7), {}
    for _ = 1, 4 do t[#t + 1] = string.format("%.17g", r:random()) end
    t[#t + 1] = r:random(6)
    t[#t + 1] = r:random(-3, 3)
    t[#t + 1] = string.format("%.17g", r:normal())
    for _ = 1, 8 do t[#t + 1] = string.format("%d", r:random(-2 ^ 53, 2 ^ 53)) end
    assert.are.equal(lua54:gsub("%s+$", ""), table.concat(t, " "))
    local a, b = rl.rng(3), rl.rng(4)
    assert.are_not.equal(a:random(), b:random())
    assert.matches("interval is empty", error_of(function() a:random(5, 2) end))
    assert.matches("interval is empty", error_of(function() a:random(0) end))
    assert.matches("bad argument #3 to 'random' %(at most two bounds", error_of(function() a:random(1, 2, 3) end))
    assert.matches("no integer representation", error_of(function() a:random(1.5) end))
    assert.matches("bad argument #1", error_of(function() rl.rng("x") end))
  end)

  it("rl.equal_words counts what the Lua 5.4 binding counts, and checks its arguments", function()
    local code = "local rl = require \"moonrl\" print(rl.equal_words('abcdefgh12345678ABCDEFGH', 'abcdefgh1234567xABCDEFGH'), rl.equal_words('', ''))"
    local lua54 = run(quote(env("MOONRL_BUILD") .. "/moonrl") .. " -e " .. quote(code))
    local t = { rl.equal_words("abcdefgh12345678ABCDEFGH", "abcdefgh1234567xABCDEFGH"), rl.equal_words("", "") }
    assert.are.equal("2\t0", lua54:gsub("%s+$", ""))
    assert.are.equal("2\t0", table.concat(t, "\t"))
    assert.matches("bad argument #1 to 'equal_words' %(a length that is a multiple of 8", error_of(function() rl.equal_words("1234567", "1234567") end))
    assert.matches("bad argument #2 to 'equal_words' %(a string as long as the first", error_of(function() rl.equal_words("12345678", "") end))
    assert.matches("bad argument #2", error_of(function() rl.equal_words("12345678") end))
  end)

  it("rl.rng draws inside intervals as wide as LuaJIT numbers go", function()
    local r, low = rl.rng(11), 0
    local lo, hi = -2 ^ 63, 2 ^ 63 - 1024 -- the widest interval of doubles that are int64 values
    for _ = 1, 1000 do
      local k = r:random(lo, hi)
      assert.is_true(k >= lo and k <= hi and k == math.floor(k), tostring(k))
      if k < 0 then low = low + 1 end
    end
    assert.is_true(low > 430 and low < 570, "draws below 0: " .. low)
  end)

  it("reports BLAS, sets its threads and the memory figures", function()
    local info = rl.blas_info()
    assert.is_string(info.core)
    assert.is_string(info.config)
    assert.is_string(info.source)
    assert.is_number(info.threads)
    rl.blas_threads(info.threads)
    local mem = rl.memory()
    assert.is_number(mem.used)
    assert.is_true(mem.peak >= mem.used)
  end)

  it("reports the naive kernel when no BLAS loads, and says so once on stderr", function()
    local code = "local rl = require 'moonrl.ffi' local a = rl.tensor.ones({2, 3}) "
      .. "local c = rl.tensor.matmul(a, a:t()) rl.tensor.matmul(a, a:t()) local i = rl.blas_info() "
      .. "io.write(c:get(1, 1), '|', i.core, '|', i.source, '|', i.config, '\\n')"
    local out = run_luajit(code, "MOONRL_BLAS=/nonexistent/libopenblas.so.0 ")
    local _, warnings = out:gsub("moonrl: [^\n]*naive reference kernel", "")
    assert.are.equal(1, warnings, out)
    assert_finds(out, "3|none|none|naive reference kernel (no BLAS: /nonexistent/libopenblas.so.0")
  end)

  it("tells tensors from other values", function()
    assert.is_true(T.is_tensor(T.zeros({1})))
    assert.is_false(T.is_tensor({}))
    assert.is_false(T.is_tensor(nil))
    assert.is_false(T.is_tensor(require("ffi").new("int[1]")))
  end)
end)

-- ---- parity with the Lua 5.4 binding ----------------------------------------------------------
-- The chunk below runs here over FFI and in `moonrl -e` over the Lua 5.4 binding. Each case
-- prints one line: its results serialized exactly (%.17g round-trips doubles and floats), or its
-- error message. Error cases call the API in a statement, not in a tail call: LuaJIT drops a
-- tail-called Lua function's name, which the message reports.

local PARITY = [==[
local rl = ...
local T = rl.tensor
local lines = {}

local function ser(v)
  if type(v) == "number" then return v ~= v and "nan" or string.format("%.17g", v) end
  if type(v) == "string" then return '"' .. v:gsub("\n", "\\n") .. '"' end
  if type(v) == "table" then
    local parts = {}
    for i, x in ipairs(v) do parts[i] = ser(x) end
    return "{" .. table.concat(parts, ",") .. "}"
  end
  if T.is_tensor(v) then
    if v:is_closed() then return "closed tensor" end
    return "tensor" .. ser(v:shape()) .. ser(v:stride()) .. (v:is_contiguous() and "c" or "s")
           .. ser(v:totable())
  end
  return tostring(v)
end

local function record(name, ok, ...)
  local parts = {}
  if ok then
    for i = 1, select("#", ...) do parts[i] = ser((select(i, ...))) end
  else
    parts[1] = "error: " .. tostring((...))
  end
  lines[#lines + 1] = name .. "\t" .. table.concat(parts, " | ")
end

local function case(name, f) record(name, pcall(f)) end

-- constructors and random numbers
case("randn seeded", function() return T.randn({3, 4}, 7), T.randn({5}, 0) end)
case("rand seeded", function() return T.rand({2, 3}, 123) end)
case("randn negative seed", function() return T.randn({3}, -1) end)
case("randn odd count", function() return T.randn({3}, 5), T.randn({1}, 5) end)
case("seed then unseeded draws", function()
  rl.seed(42)
  local a, b = T.randn({5}), T.rand({3})
  return a, b, T.randn({2, 2})
end)
case("negative seed", function() rl.seed(-5) return T.rand({2}) end)
case("zeros ones full", function()
  return T.zeros(2, 3), T.ones({2}), T.full({2, 2}, -0.0), T.full({1}, 1 / 3), T.zeros({})
end)
case("arange", function()
  return T.arange(5), T.arange(1, 2, 0.25), T.arange(3, 0, -1), T.arange(0, 1, 0.1), T.arange(2, 1)
end)
case("from", function()
  return T.from({{1, 2, 3}, {4, 5, 6}}), T.from(2.5), T.from({}), T.from({0.1, 1e-40, 1e39, -1e39})
end)
case("from nested 3", function() return T.from({{{1}, {2}}, {{3}, {4}}}) end)

-- matmul
local a, b = T.randn({3, 4}, 1), T.randn({4, 5}, 2)
case("matmul", function() return a:matmul(b), T.matmul(a, b) end)
case("matmul trans_b", function() return a:matmul(T.randn({5, 4}, 3), {trans_b = true}) end)
case("matmul trans_a", function() return T.randn({4, 3}, 4):matmul(b, {trans_a = true}) end)
case("matmul both", function()
  return T.matmul(T.randn({4, 3}, 4), T.randn({5, 4}, 3), {trans_a = true, trans_b = true})
end)
case("matmul transposed views", function() return a:t():t():matmul(b), b:t():matmul(a:t()) end)
case("matmul batched", function() return T.randn({2, 3, 4}, 5):matmul(T.randn({4, 2}, 6)) end)
case("matmul batch broadcast", function()
  return T.randn({2, 1, 3, 4}, 7):matmul(T.randn({3, 4, 2}, 8))
end)
case("matmul out", function()
  local out = T.zeros({3, 5})
  local r = a:matmul(b, {out = out})
  return rawequal(r, out), out
end)

-- elementwise with broadcasting
local x, y = T.randn({2, 3}, 4), T.randn({3}, 5)
case("add", function() return x + y, x + 1, 1 + x, x:add(y), x:add(2.5) end)
case("sub", function() return x - y, x - 1, 2 - x, x:sub(y, T.zeros({2, 3})) end)
case("mul", function() return x * y, x * 3, 3 * x, x:mul(T.randn({2, 1}, 6)) end)
case("div", function() return x / y, x / 3, 3 / x, x:div(y:reshape(1, 3)) end)
case("neg scale", function() return -x, x:neg(), x:scale(0.5), x:scale(-2, T.zeros({2, 3})) end)
case("unary", function()
  local p = T.rand({2, 3}, 9)
  return x:exp(), p:log(), x:tanh(), x:silu(), x:t():exp()
end)
case("in place", function()
  local z = T.randn({2, 3}, 10)
  z:add(1, z)
  z:exp(z)
  return z
end)

-- reductions and softmax
case("sum mean", function()
  return x:sum(), x:mean(), x:sum(1), x:sum(-1, true), x:mean(2), x:t():sum(1), T.zeros({0}):mean()
end)
case("max all", function() return x:max() end)
case("max dim", function() return x:max(1) end)
case("max dim keep", function() return x:max(2, true) end)
case("argmax", function() return x:argmax(), x:argmax(1), x:argmax(-1, true) end)
case("softmax", function()
  local s = T.randn({2, 5}, 11)
  return s:softmax(), s:log_softmax(), s:t():softmax(), T.from({-1 / 0, -1 / 0}):softmax()
end)

-- gather, index_select
case("gather", function()
  return x:gather(2, {{1, 3}, {2, 2}}), x:gather(1, T.from({{2, 1, 2}})), x:gather(-1, {{3}, {1}})
end)
case("index_select", function()
  return x:index_select(2, {3, 1}), x:index_select(1, T.from({2, 1, 2})), x:index_select(2, {})
end)

-- views, shapes, element access
local z = T.arange(24):reshape(2, 3, 4)
case("narrow slice", function()
  return z:narrow(3, 2, 2), z:slice(3, 1, -1, 2), z:slice(2, -2), z:slice(1, 3), z:slice(2, 2, 1)
end)
case("slice clamps", function()
  return z:slice(3, -10), z:slice(3, 0, 2), z:slice(2, 5), z:slice(3, 2, 10), z:slice(3, -2, -1),
         z:slice(1, 2, 1, 3), z:slice(3, 2, -10)
end)
case("select", function() return z:select(1, 2), z:select(3, -1), z:select(-2, 1) end)
case("transpose permute", function()
  return z:transpose(1, 3), z:transpose(2), z:t(), z:permute(3, 1, 2), z:permute({2, 3, 1})
end)
case("reshape contiguous clone", function()
  return z:reshape({4, -1}), z:t():reshape(-1), z:t():contiguous(), z:clone(),
         T.from({7}):reshape()
end)
case("queries", function()
  return z:size(), z:size(2), z:size(-1), z:dim(), z:numel(), #z, z:is_contiguous(),
         z:t():is_contiguous(), z:stride(), T.from(3):dim()
end)
case("index reading", function()
  return z[2], z[2][3], z[2][3][4], z:get(2, 3, 4), z:t()[2][4][3],
         T.arange(6):slice(1, 2, -1, 2)[2]
end)
case("index writing", function()
  local c = T.zeros({2, 3})
  c[1] = 5
  c[2] = T.from({1, 2, 3})
  local r = c:set(1, 2, 7)
  local v = T.zeros({3})
  v[2] = 4.5
  return c, rawequal(r, c), v
end)
case("copy fill", function()
  return T.zeros({2, 3}):copy(T.from({1, 2, 3})), T.zeros(2):fill(3), T.zeros(2, 2):t():fill(-1)
end)
case("totable", function() return z:totable(), T.from(1.5):totable(), z:t():totable() end)
case("tostring", function()
  return tostring(T.arange(10):reshape(2, 5)), tostring(T.randn({8, 8}, 3)), tostring(T.from(1.5)),
         tostring(T.zeros({0, 3})), tostring(T.from({0 / 0, 1 / 0, -1 / 0})),
         tostring(T.randn({2, 2, 2}, 1):t())
end)
case("compare", function()
  local p = T.randn({3}, 1)
  return p:allclose(p), p:allclose(p + 1e-3), p:allclose(p + 1e-3, 0, 1e-2), p:max_abs_diff(p * 2),
         p:allclose(T.zeros({2}))
end)
case("memory of a tensor and a view", function()
  collectgarbage()
  collectgarbage()
  local before = rl.memory().used
  local m = T.zeros({10, 10})
  local v = m:t()
  local during = rl.memory().used - before
  m, v = nil, nil
  collectgarbage()
  collectgarbage()
  return during, rl.memory().used - before
end)

-- errors, with the same messages
case("error matmul method", function() local r = a:matmul(a) return r end)
case("error matmul field", function() local r = T.matmul(a, a) return r end)
case("error matmul batch", function()
  local r = T.zeros(2, 3, 4):matmul(T.zeros(3, 4, 2))
  return r
end)
case("error add metamethod", function() local r = x + "s" return r end)
case("error add method", function() local r = x:add({}) return r end)
case("error broadcast", function() local r = x + T.zeros({2}) return r end)
case("error out shape", function() local r = x:exp(T.zeros({3})) return r end)
case("error narrow dim", function() local r = z:narrow(5, 1, 1) return r end)
case("error narrow range", function() local r = z:narrow(1, 2, 5) return r end)
case("error select", function() local r = z:select(1, 3) return r end)
case("error zeros", function() local r = T.zeros({-1}) return r end)
case("error zeros args", function() local r = T.zeros(2, "x") return r end)
case("error full", function() local r = T.full(3, 1) return r end)
case("error arange", function() local r = T.arange(0, 1, 0) return r end)
case("error from ragged", function() local r = T.from({{1, 2}, {3}}) return r end)
case("error from element", function() local r = T.from({{1, 2}, {3, true}}) return r end)
case("error from type", function() local r = T.from("x") return r end)
case("error reshape", function() local r = z:reshape(5, -1) return r end)
case("error integer", function() local r = z:sum(1.5) return r end)
case("error number type", function() local r = z:narrow({}, 1, 1) return r end)
case("error get count", function() local r = z:get(1) return r end)
case("error get range", function() local r = z:get(1, 4, 1) return r end)
case("error index", function() local r = z[3] return r end)
case("error scalar length", function() local r = #T.from(1) return r end)
case("error field assign", function() z.foo = 1 end)
case("error max empty", function() local r = T.zeros({0}):max() return r end)
case("error gather rank", function() local r = x:gather(1, {1}) return r end)
case("error gather range", function() local r = x:gather(1, {{5, 1, 1}}) return r end)
case("error index_select flat", function() local r = x:index_select(1, {{1}}) return r end)
case("error index not integer", function() local r = x:index_select(1, {1.5}) return r end)
case("error transpose rank", function() local r = T.zeros({3}):transpose() return r end)
case("error slice step", function() local r = z:slice(1, 1, 2, 0) return r end)
case("error permute count", function() local r = z:permute(1, 2) return r end)
case("error permute twice", function() local r = z:permute(1, 1, 2) return r end)
case("error matmul opts", function() local r = a:matmul(b, {out = 1}) return r end)
case("error blas_threads", function() rl.blas_threads(0) end)

-- Checks the binding makes itself (not the engine): each message, and the argument it names
-- when called as a method and as a function.
-- narrow: start and length against the dimension, 1-based
case("error narrow start", function() local r = z.narrow(z, 3, 6, 0) return r end)
case("error narrow start 0", function() local r = z:narrow(-1, 0, 1) return r end)
case("error narrow negative length", function() local r = z:narrow(2, 1, -1) return r end)
case("narrow up to the end", function() return z:narrow(3, 5, 0), z:narrow(-1, 1, 4) end)

-- permute: table entries, and dimensions named twice
case("error permute table entry", function() local r = z:permute({1, 5, 2}) return r end)
case("error permute table entry call", function() local r = z.permute(z, {1, 0, 2}) return r end)
case("error permute table string", function() local r = z:permute({1, "x", 2}) return r end)
case("error permute table fraction", function() local r = z:permute({1, 2.5, 3}) return r end)
case("error permute table twice", function() local r = z:permute({3, 1, -1}) return r end)
case("error permute table twice call", function() local r = z.permute(z, {2, 2, 1}) return r end)
case("error permute twice call", function() local r = z.permute(z, 1, 2, -2) return r end)
case("error permute twice first", function() local r = z:permute(1, 1, 9) return r end)
case("permute numeric strings", function() return z:permute({"3", 1, 2}), z:permute("2", 3, 1) end)

-- index_select / gather: index ranges and sizes, and the "index" name in messages
case("error index_select range", function() local r = x:index_select(2, {1, 4}) return r end)
case("error index_select zero call", function() local r = x.index_select(x, 1, {0}) return r end)
case("error index_select tensor", function()
  local r = x:index_select(-1, T.from({3, -2}))
  return r
end)
case("error index_select large", function() local r = x:index_select(1, {1e15}) return r end)
case("error gather index range", function() local r = x:gather(2, {{1, 3}, {2, 9}}) return r end)
case("error gather tensor range", function()
  local r = x:gather(1, T.from({{1, 3, 1}}))
  return r
end)
case("error gather size", function() local r = x:gather(2, {{1}, {1}, {1}}) return r end)
case("error gather size call", function() local r = x.gather(x, 1, {{1, 1, 1, 1}}) return r end)
case("error index element", function() local r = x:index_select(1, {1, "x"}) return r end)
case("error index tensor element", function() local r = x:index_select(1, {T.from(1)}) return r end)
case("error index ragged", function() local r = x:gather(1, {{1, 1, 1}, {1}}) return r end)
case("error index not a table", function() local r = x:gather(1, {{1, 1, 1}, 2}) return r end)
case("error index closed", function()
  local c = T.from({1})
  c:free()
  local ok1, e1 = pcall(function() local r = x:index_select(1, c) return r end)
  local ok2, e2 = pcall(function() local r = x.gather(x, 1, c) return r end)
  return ok1, e1, ok2, e2
end)

-- arange: which bound is not finite, and which argument holds stop
case("error arange nan stop", function() local r = T.arange(0 / 0) return r end)
case("error arange infinite start", function() local r = T.arange(-1 / 0, 2) return r end)
case("error arange infinite stop", function() local r = T.arange(0, 1 / 0) return r end)
case("error arange too many", function() local r = T.arange(1e16) return r end)
case("error arange too many stop", function() local r = T.arange(0, 1e16) return r end)
case("error arange step first", function() local r = T.arange(0 / 0, 1, 0) return r end)

-- shapes: entries must be numbers, not numeric strings
case("error zeros string entry", function() local r = T.zeros({"3"}) return r end)
case("error zeros string argument", function() local r = T.zeros(2, "3") return r end)
case("error zeros tensor argument", function() local r = T.zeros(2, T.from(1)) return r end)
case("error ones string entry", function() local r = T.ones({2, "1"}) return r end)
case("error full string entry", function() local r = T.full({"2"}, 1) return r end)
case("error rand string entry", function() local r = T.rand({"2"}, 1) return r end)
case("error reshape string entry", function() local r = z:reshape({"24"}) return r end)
case("error reshape string entry call", function() local r = z.reshape(z, {6, "4"}) return r end)
case("reshape string arguments", function() return z:reshape(6, "4") end)

-- t[i] and t[i] = v: integer keys only, and no fields
case("error index fraction", function() local r = z[1.5] return r end)
case("error index near integer", function() local r = z[1.0000000000000002] return r end)
case("error index nan", function() local r = z[0 / 0] return r end)
case("error index huge", function() local r = z[2 ^ 63] return r end)
case("error index scalar fraction", function() local r = T.from(1)[1.5] return r end)
case("error assign fraction", function() z[1.5] = 1 end)
case("error assign scalar fraction", function() T.from(1)[1.5] = 1 end)
case("error assign string key", function() z["1"] = 1 end)
case("error assign boolean key", function() z[true] = 1 end)
case("error assign tensor key", function() z[T.from(1)] = 1 end)
case("error assign closed value", function()
  local c = T.from({1})
  c:free()
  z[1] = c
end)
case("index integral floats", function() return z[2.0][3.0], T.arange(3)[3.0] end)

-- out arguments: blamed when the operands fit each other
case("error add out shape", function() local r = x:add(y, T.zeros({3})) return r end)
case("error add out shape call", function() local r = x.add(x, 1, T.zeros({2})) return r end)
case("error mul number out shape", function() local r = x.mul(2, x, T.zeros({3, 2})) return r end)
case("error sub operands and out", function()
  local r = x:sub(T.zeros({4}), T.zeros({2, 3}))
  return r
end)
case("error matmul out shape", function() local r = a:matmul(b, {out = T.zeros({5, 3})}) return r end)
case("error matmul out shape call", function() local r = T.matmul(a, b, {out = T.zeros({3})}) return r end)
case("error matmul trans out shape", function()
  local r = T.matmul(T.randn({4, 3}, 4), b, {trans_a = true, out = T.zeros({4, 5})})
  return r
end)
case("error matmul batch out shape", function()
  local r = T.matmul(T.zeros(2, 1, 3, 4), T.zeros(3, 4, 2), {out = T.zeros(2, 3, 3, 3)})
  return r
end)
case("error matmul operands and out", function()
  local r = T.matmul(a, a, {out = T.zeros({3, 5})})
  return r
end)
case("error matmul batch and out", function()
  local r = T.matmul(T.zeros(2, 3, 4), T.zeros(3, 4, 2), {out = T.zeros(2, 3, 2)})
  return r
end)
case("error matmul rank and out", function()
  local r = T.matmul(T.zeros(3), b, {out = T.zeros(3, 5)})
  return r
end)
case("error closed", function()
  local c = T.ones({2})
  c:free()
  local closed = tostring(c) .. " " .. tostring(c:is_closed())
  local ok1, e1 = pcall(function() local r = c:sum() return r end)
  local ok2, e2 = pcall(function() local r = x:copy(c) return r end)
  local ok3, e3 = pcall(function() local r = c + 1 return r end)
  local ok4, e4 = pcall(function() local r = -c return r end)
  local ok5, e5 = pcall(function() local r = c[1] return r end)
  return closed, ok1, e1, ok2, e2, ok3, e3, ok4, e4, ok5, e5
end)

return table.concat(lines, "\n") .. "\nEND\n"
]==]

describe("parity with the Lua 5.4 binding", function()
  local outputs -- {ffi = {name = line}, lua54 = {name = line}, raw = {ffi = text, lua54 = text}}

  local function parse(text)
    local lines = {}
    for line in text:gmatch("[^\n]+") do
      local name = line:match("^([^\t]+)\t")
      if name then lines[name] = line end
    end
    return lines
  end

  local function results()
    if outputs then return outputs end
    local ffi_text = assert(load(PARITY, "=parity"))(rl)
    local runner = ("io.write(assert(load(%q, '=parity'))(require 'moonrl'))"):format(PARITY)
    local lua54_text = run(quote(env("MOONRL_BUILD") .. "/moonrl") .. " -e " .. quote(runner))
    outputs = {ffi = parse(ffi_text), lua54 = parse(lua54_text),
               raw = {ffi = ffi_text, lua54 = lua54_text}}
    return outputs
  end

  it("runs every case to the end in both", function()
    local r = results()
    assert.truthy(r.raw.ffi:find("\nEND\n$"), r.raw.ffi)
    assert.truthy(r.raw.lua54:find("\nEND\n$"), r.raw.lua54)
  end)

  for name in PARITY:gmatch('\ncase%("([^"]+)"') do
    it("gives the same results: " .. name, function()
      local r = results()
      assert.is_string(r.ffi[name], "no FFI result for " .. name)
      assert.equal(r.lua54[name], r.ffi[name])
    end)
  end

  it("compares real results (the cases do not all fail alike)", function()
    local r = results()
    assert_finds(r.ffi["matmul"], "matmul\ttensor{3,5}")
    assert_finds(r.ffi["error matmul method"], "bad argument #1 to 'matmul' (inner dimensions")
    assert_finds(r.ffi["error broadcast"], "(shapes (2x3) and (2) do not broadcast (3 vs 2))")
    assert_finds(r.ffi["error matmul batch"], "(batch dimensions of (2x3x4) and (3x4x2) do not "
                                              .. "broadcast (2 vs 3))")
    assert_finds(r.ffi["error add out shape call"], "bad argument #3 to 'add' (out has shape (2)")
  end)
end)

-- ---- errors ---------------------------------------------------------------------------------

describe("errors", function()
  it("name the argument, counting self only in function-style calls", function()
    local a, b = T.zeros({2, 3}), T.zeros({2, 3})
    local m = error_of(function() local r = a:matmul(b) return r end)
    assert_finds(m, "bad argument #1 to 'matmul' (inner dimensions differ: a (2x3) gives K = 3, "
                    .. "b (2x3) gives K = 2)")
    m = error_of(function() local r = T.matmul(a, b) return r end)
    assert_finds(m, "bad argument #2 to 'matmul' (inner dimensions differ")
    m = error_of(function() local r = a + "x" return r end)
    assert_finds(m, "bad argument #2 to 'add' (other: tensor or number expected, got string)")
    m = error_of(function() local r = a:add("x") return r end)
    assert_finds(m, "bad argument #1 to 'add' (other: tensor or number expected, got string)")
    m = error_of(function() local r = a.add(a, "x") return r end)
    assert_finds(m, "bad argument #2 to 'add' (other:")
  end)

  it("carry the caller's position", function()
    local m = error_of(function() local r = T.zeros({-1}) return r end)
    assert.truthy(m:find("^[^\n]*ffi_spec%.lua:%d+: bad argument #1 to 'zeros' %(shape: entry 1 "
                         .. "must be a non%-negative integer%)"), m)
  end)

  it("drop the C function's name from engine messages", function()
    local m = error_of(function() local r = T.zeros({2, 3}) + T.zeros({4}) return r end)
    assert_finds(m, "bad argument #2 to 'add' (shapes (2x3) and (4) do not broadcast (3 vs 4))")
    assert.is_nil(m:find("mrl_", 1, true), m)
  end)

  it("count start and dims from 1 in narrow's range check", function()
    local m = error_of(function() local r = T.zeros({2, 3}):narrow(2, 3, 5) return r end)
    assert_finds(m, "bad argument #2 to 'narrow' (start 3, length 5 do not fit dimension 2 of "
                    .. "size 3)")
  end)

  it("blame out when the operands fit each other", function()
    local t = T.zeros({2, 3})
    assert_finds(error_of(function() local r = t:add(1, T.zeros({3})) return r end),
                 "bad argument #2 to 'add' (out has shape (3), the result has shape (2x3))")
    assert_finds(error_of(function() local r = t:add(T.zeros({4}), T.zeros({3})) return r end),
                 "bad argument #1 to 'add' (shapes (2x3) and (4) do not broadcast (3 vs 4))")
    assert_finds(error_of(function() local r = T.matmul(t, t:t(), {out = t}) return r end),
                 "bad argument #3 to 'matmul' (out has shape (2x3), the result has shape (2x2))")
  end)

  it("check dims, integers and types", function()
    local t = T.zeros({2, 3})
    assert_finds(error_of(function() local r = t:narrow(5, 1, 1) return r end),
                 "bad argument #1 to 'narrow' (dim: 5 is out of range for a rank-2 tensor (1..2 "
                 .. "or -2..-1))")
    assert_finds(error_of(function() local r = t:sum(1.5) return r end),
                 "bad argument #1 to 'sum' (number has no integer representation)")
    assert_finds(error_of(function() local r = t:fill("x") return r end),
                 "bad argument #1 to 'fill' (number expected, got string)")
    assert_finds(error_of(function() local r = t:narrow(t, 1, 1) return r end),
                 "(number expected, got moonrl.tensor)")
    assert_finds(error_of(function() rl.blas_threads(0) end),
                 "bad argument #1 to 'blas_threads' (threads: expected 1..1024)")
    assert_finds(error_of(function() local r = T.randn({2}, 1.5) return r end),
                 "bad argument #2 to 'randn' (number has no integer representation)")
  end)

  it("report a bad permutation entry as argument 2 (the table)", function()
    local t = T.zeros({2, 3})
    assert_finds(error_of(function() local r = t:permute({1, 5}) return r end),
                 "bad argument #1 to 'permute' (perm: entry 2 must be a dim in 1..2 or -2..-1)")
    assert_finds(error_of(function() local r = t.permute(t, {1, 5}) return r end),
                 "bad argument #2 to 'permute' (perm: entry 2 must be a dim in 1..2 or -2..-1)")
    assert_finds(error_of(function() local r = t.permute(t, {2, -1}) return r end),
                 "bad argument #2 to 'permute' (perm: dimension 2 is named twice)")
    assert_finds(error_of(function() local r = t.permute(t, 2, -1) return r end),
                 "bad argument #3 to 'permute' (perm: dimension 2 is named twice)")
  end)

  it("name 'index' for index arguments given as tables", function()
    local t = T.zeros({2, 3})
    assert_finds(error_of(function() local r = t:index_select(1, {1, "x"}) return r end),
                 "bad argument #2 to 'index_select' (index: element [2] is string, expected a "
                 .. "number)")
    assert_finds(error_of(function() local r = t:gather(1, {{1, 1, 1}, {1}}) return r end),
                 "(index: ragged nested table: element [2] has a different length (expected 3 "
                 .. "entries))")
  end)

  it("come from every method of a closed tensor, and free releases at once", function()
    local t = T.ones({2, 2})
    t:free()
    assert.is_true(t:is_closed())
    t:free() -- a second free does nothing
    assert.equal("tensor(closed)", tostring(t))
    for _, name in ipairs({"shape", "size", "stride", "dim", "numel", "is_contiguous", "get",
                           "set", "totable", "narrow", "slice", "select", "transpose", "t",
                           "permute", "reshape", "contiguous", "clone", "copy", "fill", "add",
                           "sub", "mul", "div", "scale", "neg", "exp", "log", "tanh", "silu",
                           "sum", "mean", "max", "argmax", "softmax", "log_softmax", "matmul",
                           "gather", "index_select", "allclose", "max_abs_diff"}) do
      local call = assert(load("local t = ... local r = t:" .. name .. "() return r"))
      local m = error_of(function() call(t) end)
      assert_finds(m, "calling '" .. name .. "' on bad self (self: tensor")
      assert.truthy(m:find("closed", 1, true), m)
    end
    assert_finds(error_of(function() local r = #t return r end), "self: tensor is closed")
    assert_finds(error_of(function() local r = t[1] return r end), "self: tensor is closed")
    assert_finds(error_of(function() t[1] = 0 end), "self: tensor is closed")
    assert_finds(error_of(function() local r = T.ones({2}):exp(t) return r end),
                 "bad argument #1 to 'exp' (out: tensor is closed)")
    assert_finds(error_of(function() local r = T.ones({2}) * t return r end),
                 "bad argument #2 to 'mul' (other: tensor or number expected, got a closed tensor)")
  end)

  it("reject misuse of indexing", function()
    local t = T.zeros({2, 3})
    assert_finds(error_of(function() local r = t[0] return r end), "index 0 is outside 1..2")
    assert_finds(error_of(function() local r = t[1.5] return r end), "index 1.5 is not an integer")
    assert_finds(error_of(function() t[1.5] = 1 end), "index 1.5 is not an integer")
    assert_finds(error_of(function() t[3] = 1 end), "index 3 is outside 1..2")
    assert_finds(error_of(function() t.x = 1 end),
                 "tensor fields cannot be assigned (key of type string)")
    assert_finds(error_of(function() t["1"] = 1 end),
                 "tensor fields cannot be assigned (key of type string)")
    assert_finds(error_of(function() t[1] = "x" end),
                 "assigned value must be a number or a tensor, got string")
    assert_finds(error_of(function() t[1] = T.zeros({4}) end), "does not broadcast")
    assert.is_nil(t.no_such_method)
  end)
end)

-- ---- memory -----------------------------------------------------------------------------------

describe("tensor memory", function()
  it("goes back to the engine when dropped tensors are collected", function()
    local base = settled_memory()
    local peak = base
    for i = 1, 300 do
      local t = T.randn({16, 8}, i)
      local v = t:t():reshape(-1) -- a copy
      local s = (t * 2 + 1):exp():sum(1)
      local vals, idx = t:max(2)
      local g = t:gather(2, {{1}}) -- index tensor smaller than t along dim 1
      local w = t[3] + v:narrow(1, 1, 8) - s + vals:sum() + idx:mean() + g:sum()
      peak = math.max(peak, rl.memory().used)
      assert.is_true(T.is_tensor(w))
    end
    assert.is_true(peak > base)
    assert.equal(base, settled_memory())
  end)

  it("is released at once by t:free()", function()
    local base = settled_memory()
    local t = T.zeros({1000})
    assert.is_true(rl.memory().used >= base + 4000)
    t:free()
    assert.equal(base, rl.memory().used)
  end)

  it("is not held for number operands after the operation", function()
    local x = T.ones({4})
    local base = settled_memory()
    local r, q = 2 * x, x:div(3)
    r:free()
    q:free()
    assert.equal(base, rl.memory().used)
  end)

  it("stays alive for views after the tensor is freed", function()
    local base = settled_memory()
    local t = T.zeros({1000})
    local v = t:narrow(1, 1, 10)
    t:free()
    assert.is_true(rl.memory().used >= base + 4000)
    v[1] = 3
    assert.equal(3, v[1])
    v:free()
    assert.equal(base, rl.memory().used)
  end)

  it("is collected at the pace it is allocated", function()
    local base = settled_memory()
    local high = base
    for _ = 1, 400 do
      local t = T.zeros({256 * 1024}) -- 1 MiB, dropped at once
      assert.is_true(T.is_tensor(t))
      high = math.max(high, rl.memory().used)
    end
    -- without telling the collector, all 400 MiB would be held before a collection
    assert.is_true(high - base < 64 * 1024 * 1024, ("held %d bytes"):format(high - base))
    assert.equal(base, settled_memory())
  end)
end)

-- The C API beyond tensors is raw FFI: rl.C is the library, rl.engine the module's engine, and
-- what a call hands to the caller is freed through ffi.gc (or by hand).
describe("the raw C API (rl.C)", function()
  local ffi = require "ffi"
  local C = rl and rl.C

  -- A small model from raw calls, owned by the collector.
  local function raw_model(seed)
    local cfg = ffi.new("mrl_model_config")
    C.mrl_model_config_default(cfg)
    cfg.vocab, cfg.dim, cfg.layers, cfg.heads, cfg.kv_heads, cfg.ffn, cfg.ctx = 264, 16, 1, 2, 2, 32, 16
    cfg.tie_embeddings = 1
    local slot = ffi.new("mrl_model *[1]")
    assert.are.equal(0, C.mrl_model_new(rl.engine, cfg, seed, slot))
    return ffi.gc(slot[0], C.mrl_model_free)
  end

  local TOKENS = { 72, 105, 33, 10, 256 }

  it("builds a model, runs a forward pass and reads log-probabilities", function()
    local m = raw_model(7)
    local n = #TOKENS
    local tokens = ffi.new("int32_t[?]", n, TOKENS)
    local lengths = ffi.new("int32_t[1]", n)
    local targets = ffi.new("int32_t[?]", n)
    for t = 0, n - 2 do targets[t] = TOKENS[t + 2] end -- each position scores the next token
    targets[n - 1] = -1
    assert.are.equal(0, C.mrl_model_forward(m, tokens, lengths, 1, n))
    local logprobs = ffi.new("float[?]", n)
    assert.are.equal(0, C.mrl_model_score(m, targets, logprobs, nil))
    assert.are.equal(0, logprobs[n - 1]) -- an unscored position

    -- the same numbers from the logits, by log-softmax written out, through rl.tensor.own
    local slot = ffi.new("mrl_tensor *[1]")
    assert.are.equal(0, C.mrl_model_logits(m, slot))
    local logits = T.own(slot[0])
    assert.are.same({ 1, n, 264 }, logits:shape())
    for t = 1, n - 1 do
      local top = -math.huge
      for v = 1, 264 do top = math.max(top, logits:get(1, t, v)) end
      local sum = 0
      for v = 1, 264 do sum = sum + math.exp(logits:get(1, t, v) - top) end
      local want = logits:get(1, t, TOKENS[t + 1] + 1) - top - math.log(sum)
      assert.is_true(math.abs(want - logprobs[t - 1]) < 1e-4, ("position %d: %.7g vs %.7g")
        :format(t, logprobs[t - 1], want))
      assert.is_true(logprobs[t - 1] < 0)
    end

    -- and the same as the Lua 5.4 binding's m:logprobs for the same configuration and seed
    local code = "local rl = require 'moonrl' local m = rl.model.new{vocab = 264, dim = 16, "
      .. "layers = 1, heads = 2, kv_heads = 2, ffn = 32, ctx = 16, seed = 7} "
      .. "local lp = m:logprobs{tokens = {{" .. table.concat(TOKENS, ", ") .. "}}}[1] "
      .. "local t = {} for i = 1, #lp do t[i] = string.format('%.9g', lp[i]) end "
      .. "print(table.concat(t, ' '))"
    local lua54 = run(quote(env("MOONRL_BUILD") .. "/moonrl") .. " -e " .. quote(code))
    local mine = {}
    for t = 0, n - 2 do mine[#mine + 1] = string.format("%.9g", logprobs[t]) end
    assert.are.equal(lua54:gsub("%s+$", ""), table.concat(mine, " "))
  end)

  it("gives back what a raw call allocated when its owner frees it", function()
    local base = settled_memory()
    local m = raw_model(1)
    assert.is_true(rl.memory().used > base)
    C.mrl_model_free(ffi.gc(m, nil)) -- freed by hand: the finalizer is dropped first
    assert.are.equal(base, rl.memory().used)
    do local _ = raw_model(2) end -- dropped at once: the collector frees it
    assert.are.equal(base, settled_memory())
  end)

  it("reports failures through the engine's last error", function()
    local cfg = ffi.new("mrl_model_config")
    C.mrl_model_config_default(cfg)
    cfg.heads, cfg.kv_heads = 3, 2 -- kv_heads must divide heads
    local slot = ffi.new("mrl_model *[1]")
    local st = C.mrl_model_new(rl.engine, cfg, 1, slot)
    assert.is_true(st < 0)
    assert.is_true(#ffi.string(C.mrl_engine_last_error(rl.engine)) > 0)
    assert.is_true(#ffi.string(C.mrl_strerror(st)) > 0)
    C.mrl_engine_clear_error(rl.engine)
  end)

  it("rl.tensor.own takes only an mrl_tensor *", function()
    assert.matches("mrl_tensor %* expected, got number", error_of(function() T.own(3) end))
    assert.matches("NULL mrl_tensor %*", error_of(function() T.own(ffi.new("mrl_tensor *")) end))
    local slot = ffi.new("mrl_tensor *[1]")
    local shape = ffi.new("int64_t[2]", { 2, 3 })
    assert.are.equal(0, C.mrl_tensor_new(rl.engine, 2, shape, slot))
    local t = T.own(slot[0])
    t:fill(2)
    assert.are.equal(12, t:sum())
  end)
end)

describe("rl.comm (LuaJIT)", function()
  it("is a group of one in the default build, with the Lua 5.4 module's calls", function()
    assert.are.equal("self", rl.comm.backends())
    assert.are.equal("self", rl.comm.backend())
    assert.are.equal(0, rl.comm.rank())
    assert.are.equal(1, rl.comm.size())
    local t = T.full({ 3 }, 2.5)
    assert.are.equal(t, rl.comm.allreduce(t))
    assert.are.equal(2.5, t:get(3))
    assert.are.same({ 1.5, -2 }, rl.comm.allreduce { 1.5, -2 })
    rl.comm.barrier()
  end)

  it("names the argument when misused", function()
    assert.matches("bad argument #1 to 'allreduce' %(%[2%]: a number expected%)",
      error_of(function() rl.comm.allreduce { 1, "x" } end))
    assert.matches("a tensor or a list of numbers expected", error_of(function() rl.comm.allreduce(4) end))
    assert.matches("contiguous", error_of(function() rl.comm.allreduce(T.zeros(2, 3):t()) end))
  end)
end)
