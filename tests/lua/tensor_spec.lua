-- tensor_spec.lua: busted spec of the Lua 5.4 tensor API (`require "moonrl"`): module fields,
-- constructors, every tensor method and metamethod against naive references, error messages,
-- and tensor lifetime (close, free, garbage collection).
--
-- Run inside the moonrl command, which has `require "moonrl"` built in:
--   MOONRL_ROOT=$PWD MOONRL_BUILD=$PWD/build ./build/moonrl run /usr/bin/busted -o TAP \
--     tests/lua/tensor_spec.lua
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"
local T = rl.tensor

-- float32 results checked against double references
local TOL = 1e-5

-- A small tensor with distinct, exactly representable entries: {{1, 2, 3}, {4, 5, 6}}.
local function m23() return T.from { { 1, 2, 3 }, { 4, 5, 6 } } end

-- Tensor memory now held by the engine, after collecting every unreachable tensor.
local function settled_memory()
  collectgarbage()
  collectgarbage()
  return rl.memory().used
end

describe("the moonrl module", function()
  it("has a version string", function()
    assert.is_string(rl.version)
    assert.truthy(rl.version:match("^%d+%.%d+%.%d+$"), rl.version)
  end)

  it("has the tensor constructors", function()
    for _, name in ipairs { "zeros", "ones", "full", "rand", "randn", "arange", "from", "matmul",
      "is_tensor" } do
      assert.is_function(T[name], name)
    end
  end)

  it("reports BLAS in rl.blas_info()", function()
    local info = rl.blas_info()
    assert.is_table(info)
    assert.is_string(info.core)
    assert.truthy(#info.core > 0)
    assert.equal("integer", math.type(info.threads))
    assert.truthy(info.threads >= 1)
    assert.is_string(info.config)
    local sources = { moonrl = true, user = true, preloaded = true, openblas = true, none = true }
    assert.truthy(sources[info.source], "unexpected source " .. tostring(info.source))
    assert.truthy(info.recommended == nil or type(info.recommended) == "string")
    if info.source == "none" then assert.equal("none", info.core) end
  end)

  it("sets the BLAS thread count with rl.blas_threads", function()
    local before = rl.blas_info().threads
    rl.blas_threads(1)
    if rl.blas_info().source ~= "none" then assert.equal(1, rl.blas_info().threads) end
    rl.blas_threads(before)
    assert.equal(before, rl.blas_info().threads)
  end)

  it("reports tensor memory in rl.memory()", function()
    settled_memory()
    local m = rl.memory()
    assert.equal("integer", math.type(m.used))
    assert.equal("integer", math.type(m.peak))
    assert.truthy(m.peak >= m.used)
    local t = T.zeros { 1000 }
    local m2 = rl.memory()
    assert.truthy(m2.used >= m.used + 4000, "used grows by the tensor's bytes")
    assert.truthy(m2.peak >= m2.used)
    t:free()
    assert.equal(m.used, rl.memory().used)
  end)

  it("makes randn and rand without a seed reproducible through rl.seed", function()
    rl.seed(1234)
    local a, u = T.randn { 50 }, T.rand { 50 }
    rl.seed(1234)
    local b, v = T.randn { 50 }, T.rand { 50 }
    assert.same(a:totable(), b:totable())
    assert.same(u:totable(), v:totable())
    rl.seed(1235)
    assert.truthy(T.randn({ 50 }):max_abs_diff(a) > 0)
  end)

  it("keeps randn(shape, seed) independent of rl.seed", function()
    rl.seed(1)
    local a = T.randn({ 20 }, 99)
    rl.seed(2)
    local b = T.randn({ 20 }, 99)
    assert.same(a:totable(), b:totable())
  end)
end)

describe("constructors", function()
  it("zeros takes the shape as a table or as integers", function()
    local a = T.zeros { 2, 3 }
    assert.same({ 2, 3 }, a:shape())
    assert.same({ { 0, 0, 0 }, { 0, 0, 0 } }, a:totable())
    assert.same({ 4, 1, 2 }, T.zeros(4, 1, 2):shape())
    assert.equal(8, T.zeros(4, 1, 2):numel())
  end)

  it("zeros{} is a scalar and zeros{0} is empty", function()
    local s = T.zeros {}
    assert.same({}, s:shape())
    assert.equal(0, s:dim())
    assert.equal(1, s:numel())
    assert.equal(0, s:totable())
    local e = T.zeros { 2, 0 }
    assert.same({ 2, 0 }, e:shape())
    assert.equal(0, e:numel())
    assert.same({ {}, {} }, e:totable())
  end)

  it("ones and full fill every entry", function()
    assert.same({ { 1, 1 }, { 1, 1 }, { 1, 1 } }, T.ones { 3, 2 }:totable())
    assert.same({ 3, 2 }, T.ones(3, 2):shape())
    assert.same({ { 2.5, 2.5, 2.5 } }, T.full({ 1, 3 }, 2.5):totable())
    assert.same({ -7 }, T.full({ 1 }, -7):totable())
    assert.equal(0, T.full({ 0 }, 1):numel())
  end)

  it("rand draws from [0, 1) with mean 1/2", function()
    local t = T.rand({ 100, 100 }, 7)
    assert.same({ 100, 100 }, t:shape())
    local flat = H.flatten(t:totable())
    local lo, hi = math.huge, -math.huge
    for _, v in ipairs(flat) do
      lo, hi = math.min(lo, v), math.max(hi, v)
    end
    assert.truthy(lo >= 0, "min " .. lo)
    assert.truthy(hi < 1, "max " .. hi)
    local m = H.mean_std(flat)
    assert.truthy(math.abs(m - 0.5) < 0.02, "mean " .. m)
  end)

  it("randn draws with mean 0 and standard deviation 1", function()
    local flat = H.flatten(T.randn({ 20000 }, 3):totable())
    local m, s = H.mean_std(flat)
    assert.truthy(math.abs(m) < 0.03, "mean " .. m)
    assert.truthy(math.abs(s - 1) < 0.03, "std " .. s)
  end)

  it("gives the same values for the same seed and different ones for another", function()
    for _, make in ipairs { T.rand, T.randn } do
      local a, b, c = make({ 4, 5 }, 42), make({ 4, 5 }, 42), make({ 4, 5 }, 43)
      assert.same(a:totable(), b:totable())
      assert.truthy(a:max_abs_diff(c) > 0)
    end
    local n1, n2 = T.randn({ 10 }, -5), T.randn({ 10 }, -5)
    assert.same(n1:totable(), n2:totable())
  end)

  it("uses every bit of the seed", function()
    local seeds = { 0, 1, 2, 42, 44, -1, 1 << 32, 1 + (1 << 32), 1 << 62, math.mininteger }
    local draws = {}
    for i, seed in ipairs(seeds) do draws[i] = T.randn({ 8 }, seed) end
    for i = 1, #seeds do
      for j = i + 1, #seeds do
        assert.truthy(draws[i]:max_abs_diff(draws[j]) > 0,
          ("seeds %d and %d give the same values"):format(seeds[i], seeds[j]))
      end
    end
  end)

  it("draws new values on each unseeded call", function()
    assert.truthy(T.randn({ 30 }):max_abs_diff(T.randn { 30 }) > 0)
    assert.truthy(T.rand({ 30 }):max_abs_diff(T.rand { 30 }) > 0)
  end)

  it("arange(stop) counts from 0", function()
    local t = T.arange(5)
    assert.same({ 5 }, t:shape())
    assert.same({ 0, 1, 2, 3, 4 }, t:totable())
    assert.same({ 0, 1 }, T.arange(1.5):totable())
    assert.same({ 0 }, T.arange(0):shape())
  end)

  it("arange(start, stop) stops below stop", function()
    assert.same({ 2, 3, 4, 5 }, T.arange(2, 6):totable())
    assert.same({ -2, -1 }, T.arange(-2, 0):totable())
    assert.same({ 0 }, T.arange(3, 1):shape())
  end)

  it("arange(start, stop, step) takes fractional and negative steps", function()
    assert.same({ 0, 0.25, 0.5, 0.75 }, T.arange(0, 1, 0.25):totable())
    assert.same({ 5, 3, 1 }, T.arange(5, 0, -2):totable())
    assert.same({ 0 }, T.arange(0, 5, -1):shape())
    local t = T.arange(0, 1, 0.1)
    assert.same({ 10 }, t:shape())
    H.assert_close(t:totable(), H.map(H.range(0, 9), function(k) return k * 0.1 end), 1e-6)
  end)

  it("from reads nested tables of any rank", function()
    local a = T.from { { 1, 2, 3 }, { 4, 5, 6 } }
    assert.same({ 2, 3 }, a:shape())
    assert.same({ { 1, 2, 3 }, { 4, 5, 6 } }, a:totable())
    local data = { { { 1, 2 }, { 3, 4 }, { 5, 6 } }, { { 7, 8 }, { 9, 10 }, { 11, 12 } } }
    local b = T.from(data)
    assert.same({ 2, 3, 2 }, b:shape())
    assert.same(data, b:totable())
    assert.same({ -1.5, 2 }, T.from({ -1.5, 2 }):totable())
  end)

  it("from(number) is a rank-0 tensor", function()
    local s = T.from(2.5)
    assert.same({}, s:shape())
    assert.equal(0, s:dim())
    assert.equal(2.5, s:totable())
    assert.equal(2.5, s:get())
  end)

  it("from{} is empty", function()
    local e = T.from {}
    assert.same({ 0 }, e:shape())
    assert.equal(0, e:numel())
    assert.same({}, e:totable())
    assert.same({ 2, 0 }, T.from({ {}, {} }):shape())
  end)

  it("from stores float32 copies", function()
    local data = { 16777217, 0.1 }
    local t = T.from(data)
    local back = t:totable()
    assert.equal(16777216, back[1]) -- 2^24 + 1 rounds to 2^24 in float32
    assert.truthy(back[2] ~= 0.1 and math.abs(back[2] - 0.1) < 1e-8)
    data[1] = 5 -- the tensor is a copy
    assert.equal(16777216, t:totable()[1])
  end)

  it("is_tensor tells tensors apart", function()
    assert.is_true(T.is_tensor(T.zeros { 1 }))
    assert.is_false(T.is_tensor({}))
    assert.is_false(T.is_tensor(3))
    assert.is_false(T.is_tensor(io.stdout))
    local c = T.zeros { 1 }
    c:free()
    assert.is_true(T.is_tensor(c))
  end)
end)

describe("queries", function()
  it("shape returns a fresh table", function()
    local t = T.zeros { 2, 3 }
    local s = t:shape()
    s[1] = 99
    assert.same({ 2, 3 }, t:shape())
  end)

  it("size gives the shape or one size, negative dims counting from the end", function()
    local t = T.zeros { 2, 3, 4 }
    assert.same({ 2, 3, 4 }, t:size())
    assert.equal(2, t:size(1))
    assert.equal(4, t:size(3))
    assert.equal(4, t:size(-1))
    assert.equal(2, t:size(-3))
  end)

  it("stride, dim and numel describe the layout", function()
    local t = T.zeros { 2, 3, 4 }
    assert.same({ 12, 4, 1 }, t:stride())
    assert.equal(3, t:dim())
    assert.equal(24, t:numel())
    assert.same({ 1, 4, 12 }, t:permute(3, 2, 1):stride())
  end)

  it("is_contiguous is false for transposed and stepped views", function()
    local t = T.zeros { 3, 4 }
    assert.is_true(t:is_contiguous())
    assert.is_false(t:t():is_contiguous())
    assert.is_false(t:slice(2, 1, -1, 2):is_contiguous())
    assert.is_true(t:narrow(1, 2, 2):is_contiguous())
    assert.is_true(t:t():contiguous():is_contiguous())
  end)
end)

describe("element access", function()
  it("get and set use 1-based indices; set returns the tensor", function()
    local t = m23()
    assert.equal(1, t:get(1, 1))
    assert.equal(6, t:get(2, 3))
    assert.equal(t, t:set(2, 1, -9))
    assert.same({ { 1, 2, 3 }, { -9, 5, 6 } }, t:totable())
    local s = T.from(4)
    s:set(8)
    assert.equal(8, s:get())
  end)

  it("t[i] is a number for rank 1 and a row view otherwise", function()
    local v = T.from { 10, 20, 30 }
    assert.equal(20, v[2])
    assert.equal("number", type(v[3]))
    local t = m23()
    local row = t[2]
    assert.is_true(T.is_tensor(row))
    assert.same({ 3 }, row:shape())
    assert.same({ 4, 5, 6 }, row:totable())
    assert.equal(6, t[2][3])
  end)

  it("t[i] = v sets an entry, fills a row or copies a tensor into it", function()
    local v = T.from { 10, 20, 30 }
    v[2] = 7
    assert.same({ 10, 7, 30 }, v:totable())
    local t = m23()
    t[1] = 0
    assert.same({ { 0, 0, 0 }, { 4, 5, 6 } }, t:totable())
    t[2] = T.from { 7, 8, 9 }
    assert.same({ { 0, 0, 0 }, { 7, 8, 9 } }, t:totable())
    t[1] = T.from(3) -- broadcasts
    assert.same({ { 3, 3, 3 }, { 7, 8, 9 } }, t:totable())
    t[2][1] = -1 -- through the row view
    assert.equal(-1, t:get(2, 1))
  end)

  it("#t is the size of the first dimension", function()
    assert.equal(2, #m23())
    assert.equal(5, #T.zeros { 5 })
    assert.equal(0, #T.zeros { 0, 3 })
  end)

  it("t.name finds methods, and Lua code can add methods", function()
    local t = m23()
    assert.is_function(t.shape)
    assert.is_nil(t.no_such_method)
    local methods = getmetatable(t).methods
    methods.first_entry = function(self) return self:totable()[1][1] end
    local ok, v = pcall(function() return t:first_entry() end)
    methods.first_entry = nil
    assert.is_true(ok, v)
    assert.equal(1, v)
  end)
end)

describe("views", function()
  it("narrow selects a range and shares memory", function()
    local t = T.arange(12):reshape(3, 4)
    local v = t:narrow(2, 2, 2)
    assert.same({ { 1, 2 }, { 5, 6 }, { 9, 10 } }, v:totable())
    assert.same({ 0, 4 }, t:narrow(1, 2, 0):shape())
    v:set(3, 1, 100)
    assert.equal(100, t:get(3, 2))
  end)

  it("slice(dim, i, j, step) is inclusive and counts like string.sub", function()
    local letters = "abcdefghij"
    local cases = { { 1, 10 }, { 2, 4 }, { -3 }, { -3, -2 }, { 0 }, { -20 }, { 5, 2 }, { 11 },
      { 3, 3 }, { 4, 100 }, { 10, 10 }, { 1, 0 }, { 1, -1, 3 }, { 2, 9, 2 }, { -4, nil, 2 },
      { 3, 4, 5 } }
    for _, c in ipairs(cases) do
      local i, j, step = c[1], c[2], c[3]
      local got = {}
      for _, v in ipairs(T.arange(10):slice(1, i, j, step):totable()) do
        got[#got + 1] = letters:sub(v + 1, v + 1)
      end
      local want, sub = {}, letters:sub(i, j)
      for k = 1, #sub, step or 1 do want[#want + 1] = sub:sub(k, k) end
      assert.equal(table.concat(want), table.concat(got),
        ("slice(1, %s, %s, %s)"):format(i, j, step))
    end
  end)

  it("slice works on any dim and shares memory", function()
    local t = T.arange(12):reshape(3, 4)
    assert.same({ { 1, 3 }, { 5, 7 }, { 9, 11 } }, t:slice(2, 2, -1, 2):totable())
    assert.same({ { 4, 5, 6, 7 } }, t:slice(-2, 2, 2):totable())
    local v = t:slice(2, 1, 4, 3)
    v:fill(-1)
    assert.same({ { -1, 1, 2, -1 }, { -1, 5, 6, -1 }, { -1, 9, 10, -1 } }, t:totable())
  end)

  it("select drops a dim, takes negative indices and shares memory", function()
    local t = T.arange(24):reshape(2, 3, 4)
    assert.same({ 2, 4 }, t:select(2, 3):shape())
    assert.same({ { 8, 9, 10, 11 }, { 20, 21, 22, 23 } }, t:select(2, 3):totable())
    assert.same({ { 3, 7, 11 }, { 15, 19, 23 } }, t:select(-1, -1):totable())
    assert.same(t:select(1, 2):totable(), t:select(1, -1):totable())
    t:select(3, 1):fill(0)
    assert.equal(0, t:get(2, 3, 1))
    assert.equal(21, t:get(2, 3, 2))
    assert.same({}, T.from({ 5, 6 }):select(1, 2):shape())
  end)

  it("transpose and t swap dims as views", function()
    local t = m23()
    assert.same(H.transpose(t:totable()), t:t():totable())
    assert.same(H.transpose(t:totable()), t:transpose(1, 2):totable())
    assert.same(t:totable(), t:transpose(2, 2):totable())
    local x = T.arange(24):reshape(2, 3, 4)
    assert.same(H.transpose_last(x:totable()), x:t():totable())
    assert.same(H.permute(x:totable(), { 3, 2, 1 }), x:transpose(1, -1):totable())
    t:t():set(3, 1, 99)
    assert.equal(99, t:get(1, 3))
  end)

  it("permute takes a table or integers and shares memory", function()
    local x = T.randn({ 2, 3, 4 }, 5)
    local want = H.permute(x:totable(), { 2, 3, 1 })
    assert.same(want, x:permute { 2, 3, 1 }:totable())
    assert.same(want, x:permute(2, 3, 1):totable())
    assert.same(want, x:permute(-2, -1, 1):totable())
    x:permute(3, 1, 2):set(4, 2, 3, 42)
    assert.equal(42, x:get(2, 3, 4))
  end)

  it("reshape is a view of contiguous tensors and a copy otherwise", function()
    local t = T.arange(6)
    local r = t:reshape(2, 3)
    assert.same({ { 0, 1, 2 }, { 3, 4, 5 } }, r:totable())
    assert.same({ 3, 2 }, t:reshape { 3, -1 }:shape())
    assert.same({ 6 }, r:reshape(-1):shape())
    assert.same({}, T.from({ 7 }):reshape():shape())
    r:set(2, 1, 30)
    assert.equal(30, t[4])
    local tr = r:t() -- not contiguous: reshape copies
    local flat = tr:reshape(6)
    assert.same({ 0, 30, 1, 4, 2, 5 }, flat:totable())
    flat:fill(0)
    assert.equal(30, r:get(2, 1))
  end)

  it("contiguous is a view when already contiguous, a copy otherwise", function()
    local t = m23()
    local same = t:contiguous()
    same:set(1, 1, 50)
    assert.equal(50, t:get(1, 1))
    local c = t:t():contiguous()
    assert.same(H.transpose(t:totable()), c:totable())
    assert.same({ 2, 1 }, c:stride())
    c:fill(0)
    assert.equal(50, t:get(1, 1))
  end)

  it("clone is an independent contiguous copy", function()
    local t = m23()
    local c = t:t():clone()
    assert.is_true(c:is_contiguous())
    assert.same(H.transpose(t:totable()), c:totable())
    c:fill(1)
    assert.same({ { 1, 2, 3 }, { 4, 5, 6 } }, t:totable())
  end)

  it("views keep their storage alive after the base is freed", function()
    local t = m23()
    local v = t:select(1, 2)
    t:free()
    assert.same({ 4, 5, 6 }, v:totable())
    v:set(1, 0)
    assert.same({ 0, 5, 6 }, v:totable())
  end)
end)

describe("fills", function()
  it("fill sets every entry and returns the tensor", function()
    local t = T.zeros { 2, 2 }
    assert.equal(t, t:fill(3))
    assert.same({ { 3, 3 }, { 3, 3 } }, t:totable())
    t:t():slice(1, 2):fill(-1)
    assert.same({ { 3, -1 }, { 3, -1 } }, t:totable())
  end)

  it("copy writes src (broadcast) into the tensor and returns it", function()
    local t = T.zeros { 2, 3 }
    assert.equal(t, t:copy(T.from { 1, 2, 3 }))
    assert.same({ { 1, 2, 3 }, { 1, 2, 3 } }, t:totable())
    t:copy(T.from { { 7 }, { 8 } })
    assert.same({ { 7, 7, 7 }, { 8, 8, 8 } }, t:totable())
    t:t():copy(T.arange(6):reshape(3, 2))
    assert.same({ { 0, 2, 4 }, { 1, 3, 5 } }, t:totable())
  end)
end)

describe("elementwise arithmetic", function()
  local ops = {
    add = function(x, y) return x + y end,
    sub = function(x, y) return x - y end,
    mul = function(x, y) return x * y end,
    div = function(x, y) return x / y end,
  }
  local meta = {
    add = function(a, b) return a + b end,
    sub = function(a, b) return a - b end,
    mul = function(a, b) return a * b end,
    div = function(a, b) return a / b end,
  }
  -- shape pairs that broadcast, including rank 0 and missing leading dims
  local pairs_of_shapes = {
    { { 2, 3 }, { 2, 3 } }, { { 2, 3 }, { 3 } }, { { 2, 1 }, { 1, 3 } }, { { 4, 1, 3 }, { 2, 1 } },
    { {}, { 2, 2 } }, { { 3 }, {} }, { { 1 }, { 5 } }, { { 2, 0 }, { 1 } },
  }
  -- operands away from zero so that division is well conditioned
  local function operand(shape, seed) return T.rand(shape, seed):add(0.5) end

  for _, name in ipairs { "add", "sub", "mul", "div" } do
    it(name .. " broadcasts like the nested-table reference", function()
      for k, sh in ipairs(pairs_of_shapes) do
        local a, b = operand(sh[1], k), operand(sh[2], 100 + k)
        local want = H.broadcast(a:totable(), b:totable(), ops[name])
        H.assert_close(a[name](a, b):totable(), want, TOL, name)
        H.assert_close(meta[name](a, b):totable(), want, TOL, "metamethod " .. name)
        local shape = H.broadcast_shape(sh[1], sh[2])
        assert.same(shape, a[name](a, b):shape())
      end
    end)

    it(name .. " takes numbers on either side as scalars", function()
      local a = operand({ 2, 3 }, 9)
      local x = a:totable()
      H.assert_close(a[name](a, 2):totable(), H.broadcast(x, 2, ops[name]), TOL)
      H.assert_close(meta[name](a, 2):totable(), H.broadcast(x, 2, ops[name]), TOL)
      H.assert_close(meta[name](2, a):totable(), H.broadcast(2, x, ops[name]), TOL)
    end)

    it(name .. " writes into out, returns it, and reads strided views", function()
      local a, b = operand({ 3, 2 }, 11), operand({ 2, 3 }, 12)
      local want = H.broadcast(H.transpose(a:totable()), b:totable(), ops[name])
      local out = T.zeros { 2, 3 }
      local r = a:t()[name](a:t(), b, out)
      assert.equal(out, r)
      H.assert_close(out:totable(), want, TOL)
      local base = T.zeros { 3, 2 } -- a transposed out writes through to its base
      a:t()[name](a:t(), b, base:t())
      H.assert_close(base:totable(), H.transpose(want), TOL)
      local c = b:clone() -- in place: out is the first operand
      assert.equal(c, c[name](c, a:t(), c))
      H.assert_close(c:totable(), H.broadcast(b:totable(), H.transpose(a:totable()), ops[name]),
        TOL)
    end)
  end

  it("unary minus negates", function()
    local a = T.randn({ 3, 4 }, 2)
    H.assert_close((-a):totable(), H.map(a:totable(), function(x) return -x end), 0)
    assert.same({ 3, 4 }, (-a):shape())
  end)

  local unary = {
    neg = function(x) return -x end,
    exp = math.exp,
    log = math.log,
    tanh = function(x) return (math.exp(x) - math.exp(-x)) / (math.exp(x) + math.exp(-x)) end,
    silu = function(x) return x / (1 + math.exp(-x)) end,
  }
  for _, name in ipairs { "neg", "exp", "log", "tanh", "silu" } do
    it(name .. " matches the math library, with out and on views", function()
      local a = T.rand({ 3, 4 }, 21):mul(4):sub(name == "log" and -0.01 or 2)
      local want = H.map(a:totable(), unary[name])
      H.assert_close(a[name](a):totable(), want, TOL, name)
      local out = T.full({ 4, 3 }, 9)
      assert.equal(out, a:t()[name](a:t(), out))
      H.assert_close(out:totable(), H.transpose(want), TOL, name .. " into out")
      local c = a:clone()
      c[name](c, c)
      H.assert_close(c:totable(), want, TOL, name .. " in place")
    end)
  end

  it("log gives -inf at 0 and NaN below", function()
    local r = T.from({ 0, -1 }):log():totable()
    assert.equal(-math.huge, r[1])
    assert.truthy(H.is_nan(r[2]))
  end)

  it("scale multiplies by a number, with out", function()
    local a = T.randn({ 2, 5 }, 4)
    local want = H.map(a:totable(), function(x) return -2.5 * x end)
    H.assert_close(a:scale(-2.5):totable(), want, TOL)
    local out = T.zeros { 2, 5 }
    assert.equal(out, a:scale(-2.5, out))
    H.assert_close(out:totable(), want, TOL)
  end)
end)

describe("reductions", function()
  local x = T.randn({ 3, 4, 5 }, 31)
  local xt = x:totable()

  it("sum() and mean() return numbers", function()
    local s, m = x:sum(), x:mean()
    assert.equal("number", type(s))
    H.assert_close(s, H.sum_all(xt), 1e-5)
    H.assert_close(m, H.sum_all(xt) / 60, 1e-5)
    assert.equal(21, m23():sum())
    assert.equal(3.5, m23():mean())
    H.assert_close(x:t():sum(), s, 1e-5)
  end)

  it("sum of an empty tensor is 0 and its mean NaN", function()
    assert.equal(0, T.zeros({ 0 }):sum())
    assert.truthy(H.is_nan(T.zeros({ 2, 0 }):mean()))
  end)

  it("sum(dim, keepdim) and mean(dim, keepdim) match the reference on every dim", function()
    for _, dim in ipairs { 1, 2, 3, -1, -3 } do
      for _, keep in ipairs { false, true } do
        local s, m = x:sum(dim, keep), x:mean(dim, keep)
        assert.is_true(T.is_tensor(s))
        H.assert_close(s:totable(), H.sum(xt, dim, keep), TOL, ("sum(%d, %s)"):format(dim, keep))
        H.assert_close(m:totable(), H.mean(xt, dim, keep), TOL, ("mean(%d)"):format(dim))
      end
    end
    assert.same({ 3, 1, 5 }, x:sum(2, true):shape())
    assert.same({ 3, 5 }, x:sum(2):shape())
    assert.same({}, T.from({ 1, 2 }):sum(1):shape())
    assert.equal(3, T.from({ 1, 2 }):sum(1):totable())
  end)

  it("reductions read strided views", function()
    local v = x:permute(3, 1, 2)
    local vt = v:totable()
    H.assert_close(v:sum(2):totable(), H.sum(vt, 2), TOL)
    local vals, idx = v:max(3)
    local wv, wi = H.max(vt, 3)
    H.assert_close(vals:totable(), wv, 0)
    assert.same(wi, idx:totable())
  end)

  it("max() returns the value and its 1-based flat index", function()
    local v, i = x:max()
    local wv, wi = H.max_all(xt)
    assert.equal(wv, v)
    assert.equal(wi, i)
    assert.equal("integer", math.type(i))
    local a, b = T.from({ { 1, 9 }, { 9, 2 } }):max()
    assert.equal(9, a)
    assert.equal(2, b) -- the first maximum
    local n, ni = T.from({ 1, 0 / 0, 3 }):max()
    assert.truthy(H.is_nan(n))
    assert.equal(2, ni)
  end)

  it("max(dim, keepdim) returns values and 1-based indices", function()
    for _, dim in ipairs { 1, 2, 3, -2 } do
      for _, keep in ipairs { false, true } do
        local v, i = x:max(dim, keep)
        local wv, wi = H.max(xt, dim, keep)
        H.assert_close(v:totable(), wv, 0, "max values")
        assert.same(wi, i:totable())
      end
    end
    local _, i = T.from({ { 5, 5, 1 }, { 0, 7, 7 } }):max(2)
    assert.same({ 1, 2 }, i:totable())
  end)

  it("argmax matches max's indices", function()
    local _, wi = H.max_all(xt)
    assert.equal(wi, x:argmax())
    assert.equal("integer", math.type(x:argmax()))
    for _, dim in ipairs { 1, 3, -1 } do
      for _, keep in ipairs { false, true } do
        local _, want = H.max(xt, dim, keep)
        assert.same(want, x:argmax(dim, keep):totable())
      end
    end
  end)

  it("argmax(dim) without keepdim drops the dim, like sum(dim) and max(dim)", function()
    assert.same({ 4, 5 }, x:sum(1):shape())
    assert.same({ 4, 5 }, x:max(1):shape())
    assert.same({ 4, 5 }, x:argmax(1):shape())
    assert.same(select(2, H.max(xt, 3)), x:argmax(3):totable())
    assert.same({ 3 }, T.from({ { 1 }, { 2 }, { 3 } }):argmax(1):totable())
  end)
end)

describe("softmax", function()
  it("softmax and log_softmax match the reference along the last dim", function()
    for _, shape in ipairs { { 7 }, { 3, 5 }, { 2, 3, 4 } } do
      local a = T.randn(shape, 17):mul(3)
      local at = a:totable()
      H.assert_close(a:softmax():totable(), H.softmax(at), TOL, "softmax")
      H.assert_close(a:log_softmax():totable(), H.log_softmax(at), TOL, "log_softmax")
    end
  end)

  it("softmax rows sum to 1 and read strided views", function()
    local a = T.randn({ 4, 6 }, 8)
    local s = a:t():softmax()
    H.assert_close(s:totable(), H.softmax(H.transpose(a:totable())), TOL)
    H.assert_close(s:sum(2):totable(), { 1, 1, 1, 1, 1, 1 }, 1e-6)
  end)

  it("is stable for large entries and handles -inf", function()
    H.assert_close(T.from({ 1000, 1000 }):softmax():totable(), { 0.5, 0.5 }, 1e-7)
    H.assert_close(T.from({ -1000, 0 }):log_softmax():totable(), { -1000, 0 }, 1e-4)
    local r = T.from({ -math.huge, 0, 0 }):softmax():totable()
    H.assert_close(r, { 0, 0.5, 0.5 }, 1e-7)
    local l = T.from({ -math.huge, 0 }):log_softmax():totable()
    assert.equal(-math.huge, l[1])
  end)

  it("writes into out and returns it", function()
    local a = T.randn({ 2, 3 }, 5)
    for _, name in ipairs { "softmax", "log_softmax" } do
      local out = T.zeros { 2, 3 }
      assert.equal(out, a[name](a, out))
      H.assert_close(out:totable(), H[name](a:totable()), TOL, name)
    end
  end)
end)

describe("matmul", function()
  local function rnd(shape, seed) return T.randn(shape, seed) end

  it("multiplies matrices like the triple loop", function()
    local a, b = rnd({ 3, 4 }, 1), rnd({ 4, 5 }, 2)
    local want = H.matmul(a:totable(), b:totable())
    local c = a:matmul(b)
    assert.same({ 3, 5 }, c:shape())
    H.assert_close(c:totable(), want, 1e-4)
    H.assert_close(T.matmul(a, b):totable(), want, 1e-4)
    assert.same({ { 19, 22 }, { 43, 50 } },
      T.from({ { 1, 2 }, { 3, 4 } }):matmul(T.from { { 5, 6 }, { 7, 8 } }):totable())
  end)

  it("handles larger odd sizes", function()
    local a, b = rnd({ 17, 33 }, 3), rnd({ 33, 9 }, 4)
    H.assert_close(a:matmul(b):totable(), H.matmul(a:totable(), b:totable()), 1e-4)
  end)

  it("takes trans_a and trans_b", function()
    local a, b = rnd({ 4, 3 }, 5), rnd({ 5, 4 }, 6)
    local at, bt = H.transpose(a:totable()), H.transpose(b:totable())
    H.assert_close(a:matmul(rnd({ 4, 5 }, 7), { trans_a = true }):totable(),
      H.matmul(at, rnd({ 4, 5 }, 7):totable()), 1e-4, "trans_a")
    H.assert_close(rnd({ 3, 4 }, 8):matmul(b, { trans_b = true }):totable(),
      H.matmul(rnd({ 3, 4 }, 8):totable(), bt), 1e-4, "trans_b")
    H.assert_close(a:matmul(b, { trans_a = true, trans_b = true }):totable(),
      H.matmul(at, bt), 1e-4, "both")
    H.assert_close(T.matmul(b, a, { trans_a = false, trans_b = nil }):totable(),
      H.matmul(b:totable(), a:totable()), 1e-4, "false flags")
  end)

  it("reads transposed and strided views", function()
    local a = rnd({ 4, 3 }, 9)
    local rows = rnd({ 8, 5 }, 10):slice(1, 1, -1, 2) -- 4x5, row stride 10: BLAS reads it as is
    local cols = rnd({ 4, 10 }, 12):slice(2, 1, -1, 2) -- 4x5, column stride 2: copied first
    for _, b in ipairs { rows, cols } do
      H.assert_close(a:t():matmul(b):totable(), H.matmul(H.transpose(a:totable()), b:totable()),
        1e-4)
    end
    local c = rnd({ 6, 6 }, 11):narrow(2, 2, 4) -- row stride 6 with 4 columns
    H.assert_close(c:matmul(rows):totable(), H.matmul(c:totable(), rows:totable()), 1e-4)
    H.assert_close(c:matmul(cols:t(), { trans_b = true }):totable(),
      H.matmul(c:totable(), cols:totable()), 1e-4)
  end)

  it("multiplies batches, broadcasting the batch dims", function()
    local cases = {
      { { 2, 3, 4 }, { 2, 4, 5 } }, { { 2, 3, 4 }, { 4, 5 } }, { { 3, 4 }, { 2, 4, 5 } },
      { { 1, 3, 4 }, { 2, 4, 5 } }, { { 2, 1, 3, 4 }, { 3, 4, 2 } },
    }
    for k, c in ipairs(cases) do
      local a, b = rnd(c[1], 20 + k), rnd(c[2], 40 + k)
      local want = H.matmul(a:totable(), b:totable())
      local got = a:matmul(b)
      assert.same(H.shape_of(want), got:shape())
      H.assert_close(got:totable(), want, 1e-4, "batch case " .. k)
    end
    local a, b = rnd({ 2, 4, 3 }, 60), rnd({ 2, 5, 4 }, 61)
    H.assert_close(a:matmul(b, { trans_a = true, trans_b = true }):totable(),
      H.matmul(H.transpose_last(a:totable()), H.transpose_last(b:totable())), 1e-4)
  end)

  it("writes into out and returns it", function()
    local a, b = rnd({ 3, 4 }, 70), rnd({ 4, 5 }, 71)
    local want = H.matmul(a:totable(), b:totable())
    local out = T.full({ 3, 5 }, 7)
    assert.equal(out, a:matmul(b, { out = out }))
    H.assert_close(out:totable(), want, 1e-4)
    local base = T.zeros { 5, 3 } -- a transposed out writes through to its base
    local view = base:t()
    assert.equal(view, a:matmul(b, { out = view }))
    H.assert_close(base:totable(), H.transpose(want), 1e-4)
    local out2 = T.zeros { 3, 5 }
    assert.equal(out2, T.matmul(a, b, { out = out2 }))
    H.assert_close(out2:totable(), want, 1e-4)
  end)

  it("accepts an out that is one of its inputs", function()
    local a, b = rnd({ 4, 4 }, 80), rnd({ 4, 4 }, 81)
    local want = H.matmul(a:totable(), b:totable())
    a:matmul(b, { out = a })
    H.assert_close(a:totable(), want, 1e-4)
    local c = rnd({ 4, 4 }, 82)
    local want2 = H.matmul(c:totable(), H.transpose(c:totable()))
    c:matmul(c, { trans_b = true, out = c })
    H.assert_close(c:totable(), want2, 1e-4)
  end)

  it("gives zeros for an empty inner dimension and empty results for empty rows", function()
    local z = T.full({ 3, 0 }, 1):matmul(T.full({ 0, 4 }, 1))
    assert.same({ 3, 4 }, z:shape())
    assert.same({ { 0, 0, 0, 0 }, { 0, 0, 0, 0 }, { 0, 0, 0, 0 } }, z:totable())
    local out = T.full({ 3, 4 }, 5)
    T.full({ 3, 0 }, 1):matmul(T.full({ 0, 4 }, 1), { out = out })
    assert.equal(0, out:sum())
    assert.same({ 0, 4 }, T.zeros({ 0, 2 }):matmul(T.zeros { 2, 4 }):shape())
  end)
end)

describe("gather and index_select", function()
  local x = T.arange(12):reshape(3, 4)
  local xt = x:totable()

  it("index_select picks 1-based entries along a dim", function()
    assert.same(H.index_select(xt, 1, { 3, 1, 1 }), x:index_select(1, { 3, 1, 1 }):totable())
    assert.same(H.index_select(xt, 2, { 4, 2 }), x:index_select(2, { 4, 2 }):totable())
    assert.same(H.index_select(xt, -1, { 1 }), x:index_select(-1, { 1 }):totable())
    assert.same({ { 3, 1 }, { 7, 5 }, { 11, 9 } }, x:index_select(2, T.from { 4, 2 }):totable())
    assert.same({ 3, 0 }, x:index_select(2, {}):shape())
    assert.same(H.index_select(xt, 2, { 2, 3 }), x:t():index_select(1, { 2, 3 }):t():totable())
  end)

  it("gather follows torch.gather with 1-based indices", function()
    local idx2 = { { 4, 1 }, { 2, 2 }, { 3, 4 } }
    assert.same(H.gather(xt, 2, idx2), x:gather(2, idx2):totable())
    assert.same({ { 3, 0 }, { 5, 5 }, { 10, 11 } }, x:gather(2, idx2):totable())
    local idx1 = { { 3, 1, 2, 3 } }
    assert.same(H.gather(xt, 1, idx1), x:gather(1, idx1):totable())
    assert.same(H.gather(xt, -2, idx1), x:gather(-2, T.from(idx1)):totable())
    local r = T.randn({ 2, 3, 4 }, 3)
    local idx3 = { { { 1, 3, 2, 1 } }, { { 3, 3, 1, 2 } } }
    assert.same(H.gather(r:totable(), 2, idx3), r:gather(2, idx3):totable())
  end)
end)

describe("comparisons", function()
  it("allclose compares within rtol and atol", function()
    local a = T.from { 1, 2, 3 }
    assert.is_true(a:allclose(T.from { 1, 2, 3 }))
    assert.is_false(a:allclose(T.from { 1, 2, 3.1 }))
    assert.is_true(a:allclose(T.from { 1, 2, 3.1 }, 0, 0.2))
    assert.is_true(a:allclose(T.from { 1, 2, 3.1 }, 0.05))
    assert.is_false(a:allclose(T.from { 1, 2, 3.1 }, 0.01, 0.01))
    assert.is_false(a:allclose(T.from { 1, 2 }))
    assert.is_false(T.from({ 0 / 0 }):allclose(T.from { 0 / 0 }))
    local m = T.from { { 1, 2 }, { 3, 4 } }
    assert.is_true(m:t():allclose(T.from { { 1, 3 }, { 2, 4 } }))
  end)

  it("max_abs_diff is the largest absolute difference", function()
    local a = T.from { { 1, 2 }, { 3, 4 } }
    assert.equal(0, a:max_abs_diff(a))
    H.assert_close(a:max_abs_diff(T.from { { 1, 2.5 }, { 3, 3 } }), 1, 0)
    assert.truthy(H.is_nan(a:max_abs_diff(T.from { { 1, 0 / 0 }, { 3, 4 } })))
    H.assert_close(a:t():max_abs_diff(a), 1, 0)
  end)
end)

describe("tostring", function()
  -- the numbers printed after the header line
  local function numbers(s)
    local body, out = s:match("^[^\n]*\n(.*)$") or s:match("^tensor%(scalar%)(.*)$"), {}
    for n in body:gmatch("[-+]?[%d.]+e?[-+]?%d*") do out[#out + 1] = tonumber(n) end
    return out
  end

  it("shows the shape and the values", function()
    local s = tostring(T.from { { 1, -2.5 }, { 3e-7, 4 } })
    assert.truthy(s:find("tensor(2x2)", 1, true), s)
    H.assert_close(numbers(s), { 1, -2.5, 3e-7, 4 }, 1e-6)
    local s3 = tostring(T.arange(8):reshape(2, 2, 2))
    assert.truthy(s3:find("tensor(2x2x2)", 1, true), s3)
    assert.same(H.range(0, 7), numbers(s3))
  end)

  it("shows scalars, empty tensors, NaN and infinities", function()
    assert.equal("tensor(scalar) 2.5", tostring(T.from(2.5)))
    assert.truthy(tostring(T.zeros { 0 }):find("tensor(0)", 1, true))
    assert.truthy(tostring(T.zeros { 2, 0 }):find("[]", 1, true))
    local s = tostring(T.from { 0 / 0, math.huge, -math.huge })
    assert.truthy(s:find("nan", 1, true) and s:find("inf", 1, true) and s:find("-inf", 1, true), s)
  end)

  it("summarises big tensors with ...", function()
    local small = tostring(T.arange(6))
    assert.is_nil(small:find("...", 1, true), small)
    assert.same({ 0, 1, 2, 3, 4, 5 }, numbers(small))
    local s = tostring(T.arange(7))
    assert.truthy(s:find("...", 1, true), s)
    local big = tostring(T.arange(100):reshape(10, 10))
    assert.truthy(big:find("tensor(10x10)", 1, true), big)
    assert.truthy(big:find("...", 1, true), big)
    local shown = {}
    for _, v in ipairs(numbers(big)) do shown[v] = true end
    assert.truthy(shown[0] and shown[9] and shown[90] and shown[99], big)
    assert.is_nil(shown[55], big)
    assert.truthy(#big < 400, "summary stays short")
  end)

  it("shows a view's own values", function()
    local s = tostring(T.arange(6):reshape(2, 3):t())
    assert.truthy(s:find("tensor(3x2)", 1, true), s)
    assert.same({ 0, 3, 1, 4, 2, 5 }, numbers(s))
  end)
end)

describe("errors name the argument", function()
  local A = m23()      -- 2x3
  local S = T.from(1)  -- a scalar
  local E = T.zeros(0) -- empty
  -- each case: a description, a call that must raise, strings the message must contain
  local cases = {
    -- module functions
    { "seed with a string", function() rl.seed("x") end, { "bad argument #1 to 'seed'" } },
    { "seed with a fraction", function() rl.seed(1.5) end, { "bad argument #1 to 'seed'" } },
    { "blas_threads(0)", function() rl.blas_threads(0) end,
      { "bad argument #1 to 'blas_threads'", "threads" } },
    { "blas_threads with a string", function() rl.blas_threads("x") end,
      { "bad argument #1 to 'blas_threads'" } },
    -- constructors
    { "zeros with a string", function() T.zeros("a") end,
      { "bad argument #1 to 'zeros'", "shape" } },
    { "zeros without a shape", function() T.zeros() end,
      { "bad argument #1 to 'zeros'", "shape" } },
    { "zeros with a negative size", function() T.zeros { -1 } end,
      { "bad argument #1 to 'zeros'", "shape", "entry 1" } },
    { "zeros with a non-integer size", function() T.zeros { 2, 1.5 } end,
      { "bad argument #1 to 'zeros'", "shape", "entry 2" } },
    { "zeros with a negative size as integer", function() T.zeros(2, -3) end,
      { "bad argument #2 to 'zeros'", "shape" } },
    { "zeros above rank 8", function() T.zeros { 1, 1, 1, 1, 1, 1, 1, 1, 1 } end,
      { "bad argument #1 to 'zeros'", "shape", "rank 9" } },
    { "zeros whose size overflows", function() T.zeros { 2 ^ 31, 2 ^ 31, 2 ^ 31 } end,
      { "bad argument #1 to 'zeros'", "overflow" } },
    { "ones with a bad shape", function() T.ones { "a" } end,
      { "bad argument #1 to 'ones'", "shape" } },
    { "full without a table", function() T.full(2, 1) end,
      { "bad argument #1 to 'full'", "table" } },
    { "full with a string value", function() T.full({ 2 }, "x") end,
      { "bad argument #2 to 'full'", "number" } },
    { "full with a bad shape", function() T.full({ -1 }, 0) end,
      { "bad argument #1 to 'full'", "shape" } },
    { "rand without a table", function() T.rand(3) end, { "bad argument #1 to 'rand'", "table" } },
    { "rand with a fractional seed", function() T.rand({ 2 }, 1.5) end,
      { "bad argument #2 to 'rand'" } },
    { "randn without a table", function() T.randn(3) end, { "bad argument #1 to 'randn'" } },
    { "randn with a string seed", function() T.randn({ 2 }, "x") end,
      { "bad argument #2 to 'randn'" } },
    { "randn with a bad shape", function() T.randn { -2 } end,
      { "bad argument #1 to 'randn'", "shape" } },
    { "arange with a string", function() T.arange("x") end, { "bad argument #1 to 'arange'" } },
    { "arange with a string stop", function() T.arange(0, "x") end,
      { "bad argument #2 to 'arange'" } },
    { "arange with step 0", function() T.arange(0, 5, 0) end,
      { "bad argument #3 to 'arange'", "step" } },
    { "arange with a NaN step", function() T.arange(0, 5, 0 / 0) end,
      { "bad argument #3 to 'arange'", "step" } },
    { "arange with a NaN start", function() T.arange(0 / 0, 1) end,
      { "bad argument #1 to 'arange'", "start" } },
    { "arange with too many entries", function() T.arange(0, 1e16) end,
      { "bad argument #2 to 'arange'", "stop" } },
    { "arange with an infinite stop", function() T.arange(0, math.huge) end,
      { "bad argument #2 to 'arange'", "stop", "finite" } },
    { "arange with an infinite single stop", function() T.arange(math.huge) end,
      { "bad argument #1 to 'arange'", "stop", "finite" } },
    { "zeros with a numeric string size", function() T.zeros { "3" } end,
      { "bad argument #1 to 'zeros'", "shape", "entry 1" } },
    { "from a boolean", function() T.from(true) end, { "bad argument #1 to 'from'", "data" } },
    { "from a ragged table", function() T.from { { 1, 2 }, { 3 } } end,
      { "bad argument #1 to 'from'", "ragged", "[2]" } },
    { "from a table with a number among rows", function() T.from { { 1, 2 }, 3 } end,
      { "bad argument #1 to 'from'", "ragged", "[2]", "not a table" } },
    { "from a string element", function() T.from { 1, "2" } end,
      { "bad argument #1 to 'from'", "element [2]", "string" } },
    { "from a nested non-number", function() T.from { { 1, 2 }, { 3, true } } end,
      { "bad argument #1 to 'from'", "element [2][2]", "boolean" } },
    { "from a table nested too deep", function()
      local t = {}
      t[1] = t
      T.from(t)
    end, { "bad argument #1 to 'from'", "deeper" } },
    { "tensor.matmul with a number", function() T.matmul(1, A) end,
      { "bad argument #1 to 'matmul'", "self" } },
    { "tensor.matmul with a string", function() T.matmul(A, "x") end,
      { "bad argument #2 to 'matmul'", "other" } },
    { "tensor.matmul with bad options", function() T.matmul(A, A:t(), 5) end,
      { "bad argument #3 to 'matmul'", "table" } },
    -- queries and element access
    { "size(3) of a matrix", function() A:size(3) end, { "bad argument #1 to 'size'", "dim" } },
    { "size(0)", function() A:size(0) end, { "bad argument #1 to 'size'", "dim" } },
    { "get out of range", function() A:get(3, 1) end,
      { "bad argument #1 to 'get'", "index 3", "1..2" } },
    { "get with too few indices", function() A:get(1) end, { "get", "expected 2 indices" } },
    { "get with a string index", function() A:get(1, "x") end, { "bad argument #2 to 'get'" } },
    { "set out of range", function() A:set(1, 9, 0) end,
      { "bad argument #2 to 'set'", "index 9", "1..3" } },
    { "set with a string value", function() A:set(1, 1, "x") end, { "bad argument #3 to 'set'" } },
    { "set without a value", function() A:set(1) end, { "set", "expected 2 indices" } },
    { "t[i] out of range", function() local _ = A[3] end, { "index 3", "1..2" } },
    { "t[0]", function() local _ = A[0] end, { "index 0", "1..2" } },
    { "indexing a scalar", function() local _ = S[1] end, { "scalar" } },
    { "t[i] = v out of range", function() A[3] = 1 end, { "index 3", "1..2" } },
    { "assigning a field", function() A.x = 1 end, { "cannot be assigned" } },
    { "t[1.5]", function() local _ = A[1.5] end, { "index 1.5 is not an integer" } },
    { "t[1.5] = v", function() A[1.5] = 1 end, { "index 1.5 is not an integer" } },
    { "t['1'] = v (a string key is a field, not an index)", function() A["1"] = 1 end,
      { "cannot be assigned", "string" } },
    { "assigning a string", function() A[1] = "x" end, { "number or a tensor", "string" } },
    { "assigning a tensor of the wrong shape", function() A[1] = T.zeros { 4 } end,
      { "(4)", "(3)" } },
    { "assigning into a scalar", function() S[1] = 1 end, { "scalar" } },
    { "#scalar", function() local _ = #S end, { "scalar", "no length" } },
    -- views
    { "narrow on a missing dim", function() A:narrow(3, 1, 1) end,
      { "bad argument #1 to 'narrow'", "dim" } },
    { "narrow with a string length", function() A:narrow(1, 1, "x") end,
      { "bad argument #3 to 'narrow'" } },
    { "narrow past the end", function() A:narrow(2, 3, 5) end,
      { "bad argument #2 to 'narrow'", "length 5" } },
    { "slice on a missing dim", function() A:slice(3, 1) end,
      { "bad argument #1 to 'slice'", "dim" } },
    { "slice with step 0", function() A:slice(1, 1, 2, 0) end,
      { "bad argument #4 to 'slice'", "step" } },
    { "slice with a string start", function() A:slice(1, "x") end,
      { "bad argument #2 to 'slice'" } },
    { "select out of range", function() A:select(1, 3) end,
      { "bad argument #2 to 'select'", "index 3", "1..2" } },
    { "select index 0", function() A:select(2, 0) end, { "bad argument #2 to 'select'", "1..3" } },
    { "select on a missing dim", function() A:select(5, 1) end,
      { "bad argument #1 to 'select'", "dim" } },
    { "transpose to a missing dim", function() A:transpose(1, 3) end,
      { "bad argument #2 to 'transpose'", "dim2" } },
    { "transpose from dim 0", function() A:transpose(0, 1) end,
      { "bad argument #1 to 'transpose'", "dim1" } },
    { "t of a vector", function() T.zeros({ 3 }):t() end, { "'t'", "rank >= 2" } },
    { "permute with too few dims", function() A:permute(1) end,
      { "bad argument #1 to 'permute'", "perm", "expected 2" } },
    { "permute with a missing dim as integer", function() A:permute(1, 5) end,
      { "bad argument #2 to 'permute'", "perm entry" } },
    { "reshape to another size", function() A:reshape { 4, 2 } end,
      { "bad argument #1 to 'reshape'", "(2x3)", "(4x2)" } },
    { "reshape with a string entry", function() A:reshape { "a" } end,
      { "bad argument #1 to 'reshape'", "shape" } },
    { "reshape with two -1", function() A:reshape(-1, -1) end,
      { "bad argument #1 to 'reshape'", "-1" } },
    { "reshape with a string", function() A:reshape(3, "x") end,
      { "bad argument #2 to 'reshape'" } },
    -- fills
    { "copy from a number", function() A:copy(5) end, { "bad argument #1 to 'copy'", "src" } },
    { "copy of the wrong shape", function() A:copy(T.zeros { 4 }) end,
      { "bad argument #1 to 'copy'", "(4)", "(2x3)" } },
    { "fill with a string", function() A:fill("x") end, { "bad argument #1 to 'fill'" } },
    -- elementwise
    { "add a string", function() A:add("x") end, { "bad argument #1 to 'add'", "other" } },
    { "add shapes that do not broadcast", function() A:add(T.zeros { 4 }) end,
      { "bad argument #1 to 'add'", "(2x3)", "(4)", "broadcast" } },
    { "add into a string", function() A:add(1, "q") end, { "bad argument #2 to 'add'", "out" } },
    { "add into an out of the wrong shape", function() A:add(1, T.zeros { 3 }) end,
      { "bad argument #2 to 'add'", "out has shape (3)" } },
    { "sub a table", function() A:sub({}) end, { "bad argument #1 to 'sub'", "other" } },
    { "mul a boolean", function() A:mul(true) end, { "bad argument #1 to 'mul'", "other" } },
    { "div by nil", function() A:div() end, { "bad argument #1 to 'div'", "other" } },
    { "t + string", function() local _ = A + "x" end, { "bad argument #2 to 'add'", "other" } },
    { "t - table", function() local _ = A - {} end, { "bad argument #2 to 'sub'", "other" } },
    { "t * boolean", function() local _ = A * true end, { "bad argument #2 to 'mul'", "other" } },
    { "t / shapes that do not broadcast", function() local _ = A / T.zeros { 2 } end,
      { "'div'", "broadcast" } },
    { "scale by a string", function() A:scale("x") end, { "bad argument #1 to 'scale'" } },
    { "scale into a string", function() A:scale(2, "x") end,
      { "bad argument #2 to 'scale'", "out" } },
    { "neg into a number", function() A:neg(1) end, { "bad argument #1 to 'neg'", "out" } },
    { "exp into the wrong shape", function() A:exp(T.zeros { 3, 2 }) end,
      { "bad argument #1 to 'exp'", "out has shape (3x2)" } },
    { "log into a string", function() A:log("x") end, { "bad argument #1 to 'log'", "out" } },
    { "tanh into a table", function() A:tanh({}) end, { "bad argument #1 to 'tanh'", "out" } },
    { "silu into the wrong shape", function() A:silu(T.zeros { 6 }) end,
      { "bad argument #1 to 'silu'", "out has shape" } },
    -- reductions and softmax
    { "sum over a missing dim", function() A:sum(3) end, { "bad argument #1 to 'sum'", "dim" } },
    { "sum over a string dim", function() A:sum("x") end, { "bad argument #1 to 'sum'" } },
    { "mean over dim 0", function() A:mean(0) end, { "bad argument #1 to 'mean'", "dim" } },
    { "max over a missing dim", function() A:max(-3) end, { "bad argument #1 to 'max'", "dim" } },
    { "max of an empty tensor", function() E:max() end, { "'max'", "empty" } },
    { "max over an empty dim", function() T.zeros({ 2, 0 }):max(2) end, { "'max'", "empty" } },
    { "argmax over a missing dim", function() A:argmax(3) end,
      { "bad argument #1 to 'argmax'", "dim" } },
    { "argmax of an empty tensor", function() E:argmax() end, { "'argmax'", "empty" } },
    { "softmax of a scalar", function() S:softmax() end, { "'softmax'", "rank >= 1" } },
    { "log_softmax into a string", function() A:log_softmax("x") end,
      { "bad argument #1 to 'log_softmax'", "out" } },
    { "softmax into the wrong shape", function() A:softmax(T.zeros { 3 }) end,
      { "bad argument #1 to 'softmax'", "out has shape" } },
    -- matmul
    { "matmul with nil", function() A:matmul(nil) end, { "bad argument #1 to 'matmul'", "other" } },
    { "matmul with a vector", function() A:matmul(T.zeros { 3 }) end,
      { "bad argument #1 to 'matmul'", "rank >= 2" } },
    { "matmul with mismatched inner dims", function() A:matmul(A) end,
      { "bad argument #1 to 'matmul'", "inner dimensions" } },
    { "matmul with mismatched transposed inner dims", function()
      A:matmul(A:t(), { trans_b = true })
    end,
      { "bad argument #1 to 'matmul'", "transposed" } },
    { "matmul with batches that do not broadcast", function()
      T.zeros(2, 2, 3):matmul(T.zeros(3, 3, 2))
    end, { "bad argument #1 to 'matmul'", "batch" } },
    { "matmul with a number for options", function() A:matmul(A:t(), 5) end,
      { "bad argument #2 to 'matmul'", "table" } },
    { "matmul into a number", function() A:matmul(A:t(), { out = 5 }) end,
      { "bad argument #2 to 'matmul'", "opts.out" } },
    { "matmul into the wrong shape", function() A:matmul(A:t(), { out = T.zeros { 3 } }) end,
      { "bad argument #2 to 'matmul'", "out has shape (3)" } },
    -- gather / index_select
    { "index_select on a missing dim", function() A:index_select(3, { 1 }) end,
      { "bad argument #1 to 'index_select'", "dim" } },
    { "index_select with a string", function() A:index_select(2, "x") end,
      { "bad argument #2 to 'index_select'", "index" } },
    { "index_select with a string entry", function() A:index_select(2, { 1, "x" }) end,
      { "bad argument #2 to 'index_select'", "index: element [2] is string" } },
    { "gather with a ragged index", function() A:gather(2, { { 1 }, { 1, 2 } }) end,
      { "bad argument #2 to 'gather'", "index: ragged" } },
    { "index_select with a closed tensor", function()
        local i = T.ones { 1 }
        i:free()
        A:index_select(2, i)
      end, { "bad argument #2 to 'index_select'", "index: tensor is closed" } },
    { "add of shapes that do not broadcast, with an out", function()
        A:add(T.zeros { 7 }, T.zeros { 2, 3 })
      end, { "bad argument #1 to 'add'", "do not broadcast" } },
    { "index_select with a nested table", function() A:index_select(2, { { 1 } }) end,
      { "bad argument #2 to 'index_select'", "index", "flat" } },
    { "index_select with a fraction", function() A:index_select(2, { 1.5 }) end,
      { "bad argument #2 to 'index_select'", "integers" } },
    { "index_select with a string entry", function() A:index_select(2, { 1, "x" }) end,
      { "bad argument #2 to 'index_select'", "[2]" } },
    { "gather on a missing dim", function() A:gather(3, { { 1 } }) end,
      { "bad argument #1 to 'gather'", "dim" } },
    { "gather with the wrong rank", function() A:gather(2, { 1 }) end,
      { "bad argument #2 to 'gather'", "index", "rank" } },
    { "gather with a string", function() A:gather(2, "x") end,
      { "bad argument #2 to 'gather'", "index" } },
    { "gather with a ragged index", function() A:gather(2, { { 1 }, { 1, 2 } }) end,
      { "bad argument #2 to 'gather'", "ragged" } },
    -- comparisons and lifetime
    { "allclose with a number", function() A:allclose(5) end,
      { "bad argument #1 to 'allclose'", "other" } },
    { "allclose with a negative rtol", function() A:allclose(A, -1) end,
      { "bad argument #2 to 'allclose'", "rtol" } },
    { "allclose with a string atol", function() A:allclose(A, 0, "x") end,
      { "bad argument #3 to 'allclose'" } },
    { "max_abs_diff of different shapes", function() A:max_abs_diff(T.zeros { 2 }) end,
      { "bad argument #1 to 'max_abs_diff'", "(2x3)", "(2)" } },
    { "max_abs_diff with a number", function() A:max_abs_diff(5) end,
      { "bad argument #1 to 'max_abs_diff'", "other" } },
    { "free of a number", function() A.free(5) end, { "bad argument #1 to 'free'" } },
    { "is_closed of a table", function() A.is_closed({}) end,
      { "bad argument #1 to 'is_closed'" } },
  }
  for _, c in ipairs(cases) do
    it(c[1], function() H.assert_error(c[2], c[3]) end)
  end

  -- Messages that come from the engine must speak the Lua API's 1-based language, and errors in
  -- a table argument must name that argument (not a stack slot).
  it("permute names the table argument for a bad entry", function()
    H.assert_error(function() A:permute { 1, 5 } end, { "bad argument #1 to 'permute'", "perm" })
    H.assert_error(function() A:permute { 1, "x" } end, { "bad argument #1 to 'permute'", "perm" })
  end)

  it("permute names a repeated dim 1-based", function()
    H.assert_error(function() A:permute { 1, 1 } end,
      { "bad argument #1 to 'permute'", "dimension 1" })
  end)

  it("narrow reports start and dim 1-based", function()
    H.assert_error(function() A:narrow(2, 3, 5) end, { "start 3", "dimension 2" })
  end)

  it("index_select and gather report out-of-range indices against 1..n", function()
    H.assert_error(function() A:index_select(2, { 1, 7 }) end,
      { "bad argument #2 to 'index_select'", "7", "1..3" })
    H.assert_error(function() A:index_select(2, { 0 }) end,
      { "bad argument #2 to 'index_select'", "1..3" })
    H.assert_error(function() A:gather(2, { { 1 }, { 9 } }) end,
      { "bad argument #2 to 'gather'", "9", "1..3" })
  end)

  it("gather reports an index larger than self along a dim 1-based", function()
    H.assert_error(function() A:gather(2, { { 1 }, { 1 }, { 1 } }) end,
      { "bad argument #2 to 'gather'", "dimension 1" })
  end)
end)

describe("failed calls change nothing", function()
  it("a failed elementwise op leaves out unchanged", function()
    local out = T.full({ 2, 3 }, 7)
    assert.is_false(pcall(function() m23():add(T.zeros { 4 }, out) end))
    assert.is_false(pcall(function() m23():add(1, T.full({ 3 }, 7)) end))
    assert.is_false(pcall(function() m23():exp(T.full({ 3, 2 }, 7)) end))
    assert.same({ { 7, 7, 7 }, { 7, 7, 7 } }, out:totable())
  end)

  it("a failed matmul leaves out unchanged", function()
    local out = T.full({ 2, 2 }, 7)
    assert.is_false(pcall(function() m23():matmul(m23(), { out = out }) end))
    assert.is_false(pcall(function() T.zeros(2, 3):matmul(T.zeros(3, 3), { out = out }) end))
    assert.same({ { 7, 7 }, { 7, 7 } }, out:totable())
  end)

  it("a failed copy, fill or assignment leaves the tensor unchanged", function()
    local t = m23()
    assert.is_false(pcall(function() t:copy(T.zeros { 4 }) end))
    assert.is_false(pcall(function() t[1] = T.zeros { 2 } end))
    assert.is_false(pcall(function() t[1] = "x" end))
    assert.is_false(pcall(function() t:set(1, 9, 0) end))
    assert.is_false(pcall(function() t:fill("x") end))
    assert.same({ { 1, 2, 3 }, { 4, 5, 6 } }, t:totable())
  end)

  it("failed calls leak no tensor memory", function()
    local before = settled_memory()
    local a = m23()
    for _ = 1, 20 do
      pcall(T.from, { { 1, 2 }, { 3 } })
      pcall(T.from, { 1, 2, "x" })
      pcall(function() return a + T.zeros { 4 } end)
      pcall(function() return 2 * a + "x" end)
      pcall(function() return a:matmul(a) end)
      pcall(function() return a:gather(2, { { 1 }, { 9 } }) end)
      pcall(function() return a:index_select(2, { 1, 7 }) end)
    end
    a = nil
    assert.equal(before, settled_memory())
  end)
end)

describe("lifetime", function()
  it("a <close> variable frees its tensor at the end of the block", function()
    local before = settled_memory()
    do
      local t <close> = T.zeros { 1000 }
      assert.truthy(rl.memory().used >= before + 4000)
      t:fill(1)
    end
    assert.equal(before, rl.memory().used)
  end)

  it("free closes the tensor at once", function()
    local before = settled_memory()
    local t = T.zeros { 1000 }
    assert.is_false(t:is_closed())
    t:free()
    assert.is_true(t:is_closed())
    assert.equal(before, rl.memory().used)
    t:free() -- a second free is harmless
    assert.is_true(t:is_closed())
    assert.equal("tensor(closed)", tostring(t))
  end)

  it("every method of a closed tensor raises 'closed'", function()
    local t = T.zeros { 2, 2 }
    t:free()
    local methods = getmetatable(t).methods
    for name, f in pairs(methods) do
      if name ~= "free" and name ~= "is_closed" then
        local msg = H.assert_error(function() f(t) end, "closed")
        assert.truthy(msg:find("self", 1, true), name .. ": " .. msg)
      end
    end
    H.assert_error(function() t:matmul(t) end, { "'matmul'", "closed" })
    H.assert_error(function() t:shape() end, { "'shape'", "closed" })
  end)

  it("metamethods of a closed tensor raise 'closed'", function()
    local t = T.zeros { 2 }
    t:free()
    H.assert_error(function() local _ = t + 1 end, "closed")
    H.assert_error(function() local _ = 1 - t end, "closed")
    H.assert_error(function() local _ = t * t end, "closed")
    H.assert_error(function() local _ = t / 2 end, "closed")
    H.assert_error(function() local _ = -t end, "closed")
    H.assert_error(function() local _ = #t end, "closed")
    H.assert_error(function() local _ = t[1] end, "closed")
    H.assert_error(function() t[1] = 0 end, "closed")
  end)

  it("a closed tensor as another argument is named", function()
    local a, c = m23(), T.zeros { 2, 3 }
    c:free()
    H.assert_error(function() a:add(c) end, { "other", "closed" })
    H.assert_error(function() a:add(1, c) end, { "out", "closed" })
    H.assert_error(function() a:exp(c) end, { "out", "closed" })
    H.assert_error(function() a:copy(c) end, { "src", "closed" })
    H.assert_error(function() a:matmul(c) end, { "other", "closed" })
    H.assert_error(function() T.matmul(c, a) end, { "self", "closed" })
    H.assert_error(function() a:matmul(a:t(), { out = c }) end, { "opts.out" })
    H.assert_error(function() a:allclose(c) end, { "other", "closed" })
    H.assert_error(function() a:max_abs_diff(c) end, { "other", "closed" })
    H.assert_error(function() a:index_select(1, c) end, { "index" })
  end)

  it("dropped tensors are collected", function()
    local before = settled_memory()
    for _ = 1, 50 do
      local t = T.zeros { 1000 }
      local v = t:narrow(1, 1, 10)
      local _ = t + v:sum()
    end
    assert.equal(before, settled_memory())
  end)

  it("has every method the binding registers, and the metamethods", function()
    local names = {}
    for name in pairs(getmetatable(T.zeros { 1 }).methods) do names[#names + 1] = name end
    table.sort(names)
    assert.same({ "add", "allclose", "argmax", "clone", "contiguous", "copy", "dim", "div", "exp",
      "fill", "free", "gather", "get", "index_select", "is_closed", "is_contiguous", "log",
      "log_softmax", "matmul", "max", "max_abs_diff", "mean", "mul", "narrow", "neg", "numel",
      "permute", "reshape", "scale", "select", "set", "shape", "silu", "size", "slice", "softmax",
      "stride", "sub", "sum", "t", "tanh", "totable", "transpose" }, names)
    local mt = getmetatable(T.zeros { 1 })
    for _, mm in ipairs { "__add", "__sub", "__mul", "__div", "__unm", "__len", "__tostring",
      "__gc", "__close", "__index", "__newindex" } do
      assert.is_function(mt[mm], mm)
    end
  end)
end)

-- The collector must be charged for tensor memory: a loop that drops a 4 MB result each round
-- must not pile up garbage tensors. Each producer runs in a fresh process so that
-- rl.memory().peak measures that loop alone.
describe("garbage collection is charged for tensor memory", function()
  local ROUNDS, LIMIT = 80, 200e6 -- 80 x 4 MB = 320 MB if nothing were collected
  local script = [[
local rl = require "moonrl"
local T = rl.tensor
local N = 1024 * 1024 -- 4 MB of float32
local col, sq, idx = T.ones { N, 1 }, T.zeros { 1024, 1024 }, {}
for i = 1, 1024 do idx[i] = i end
local make = {
  zeros = function() return T.zeros { N } end,
  ones = function() return T.ones { N } end,
  full = function() return T.full({ N }, 2) end,
  rand = function() return T.rand({ N }, 1) end,
  randn = function() return T.randn { N } end,
  arange = function() return T.arange(N) end,
  clone = function() return sq:clone() end,
  contiguous = function() return sq:t():contiguous() end,
  reshape = function() return sq:t():reshape(N) end,
  add = function() return sq + 1 end,
  scale = function() return sq:scale(2) end,
  neg = function() return -sq end,
  exp = function() return sq:exp() end,
  softmax = function() return sq:softmax() end,
  sum = function() return col:sum(2) end,
  mean = function() return col:mean(2) end,
  max = function() return col:max(2) end,
  argmax = function() return col:argmax(2) end,
  matmul = function() return col:matmul(T.ones { 1, 1 }) end,
  index_select = function() return sq:index_select(1, idx) end,
  gather = function() return col:gather(2, col) end,
}
local name, rounds = arg[1], tonumber(arg[2])
for _ = 1, rounds do local t = make[name]() end
print(("peak %d"):format(rl.memory().peak))
]]
  for _, name in ipairs { "zeros", "ones", "full", "rand", "randn", "arange", "clone",
    "contiguous", "reshape", "add", "scale", "neg", "exp", "softmax", "sum", "mean", "max",
    "argmax", "matmul", "index_select", "gather" } do
    it(("dropping %d results of %s keeps the peak under %d MB"):format(ROUNDS, name, LIMIT // 1e6),
      function()
        local out, code = H.run_lua(script, name, ROUNDS)
        assert.equal(0, code, out)
        local peak = tonumber(out:match("peak (%d+)"))
        assert.truthy(peak, out)
        assert.truthy(peak < LIMIT, ("%s: peak %.0f MB"):format(name, peak / 1e6))
      end)
  end
end)
