-- rng_spec.lua - rl.rng's random streams: rng:random(m, n) over every interval of Lua integers
-- (spans past 2^63 included) stays inside it, is spread evenly and is the same for a seed; the
-- draws of ordinary intervals are those of floor(u * count); rng:random(n) edge cases; errors.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"

local MIN, MAX = math.mininteger, math.maxinteger

-- intervals named by n - m: 2^62, 2^63 - 1, 2^63 + 1, and every integer
local WIDE = {
  { name = "2^62", m = 0, n = 1 << 62 },
  { name = "2^63 - 1", m = 0, n = MAX },
  { name = "2^63 + 1", m = -(1 << 62) - 1, n = 1 << 62 },
  { name = "2^64 - 1", m = MIN, n = MAX },
}

describe("rng:random(m, n)", function()
  for _, w in ipairs(WIDE) do
    it("stays inside [m, n] and fills both halves evenly when n - m is " .. w.name, function()
      local r, low = rl.rng(11), 0
      local mid = w.m // 2 + w.n // 2 -- the middle, without overflowing n - m
      for _ = 1, 2000 do
        local k = r:random(w.m, w.n)
        assert.is_true(math.type(k) == "integer" and w.m <= k and k <= w.n, tostring(k))
        if k <= mid then low = low + 1 end
      end
      -- binomial(2000, 1/2): the standard deviation is 22
      assert.is_true(low > 900 and low < 1100, "draws in the lower half: " .. low)
    end)
  end

  it("splits an interval of 3 * 2^61 integers into even thirds (no bias past 2^53)", function()
    local r, thirds = rl.rng(5), { 0, 0, 0 }
    local third = 1 << 61
    for _ = 1, 3000 do
      local k = r:random(0, 3 * third - 1)
      thirds[k // third + 1] = thirds[k // third + 1] + 1
    end
    for i = 1, 3 do assert.is_true(thirds[i] > 900 and thirds[i] < 1100, tostring(thirds[i])) end
  end)

  it("gives the same integers for the same seed, other ones for another", function()
    local function draws(seed)
      local r, t = rl.rng(seed), {}
      for i = 1, 20 do t[i] = r:random(MIN, MAX) end
      for i = 21, 40 do t[i] = r:random(-(1 << 62) - 1, 1 << 62) end
      return t
    end
    assert.are.same(draws(3), draws(3))
    assert.are_not.same(draws(3), draws(4))
  end)

  it("keeps the draws of ordinary intervals: m + floor(u * (n - m + 1)) for the same stream", function()
    local r, u = rl.rng(8), rl.rng(8)
    for _, b in ipairs { { 1, 6 }, { -3, 3 }, { 0, 255 }, { -1000, 123456789 }, { 0, (1 << 40) + 7 } } do
      for _ = 1, 200 do
        local m, n = b[1], b[2]
        assert.are.equal(m + math.floor(u:random() * (n - m + 1)), r:random(m, n))
      end
    end
  end)

  it("returns the bound of a one-integer interval", function()
    local r = rl.rng(1)
    assert.are.equal(MIN, r:random(MIN, MIN))
    assert.are.equal(MAX, r:random(MAX, MAX))
    assert.are.equal(-7, r:random(-7, -7))
  end)
end)

describe("rng:random(n)", function()
  it("draws from 1..n, n = 1 and n = maxinteger included", function()
    local r = rl.rng(2)
    assert.are.equal(1, r:random(1))
    local seen = {}
    for _ = 1, 300 do
      local k = r:random(3)
      assert.is_true(k >= 1 and k <= 3)
      seen[k] = true
    end
    assert.are.same({ true, true, true }, seen)
    for _ = 1, 100 do
      local k = r:random(MAX)
      assert.is_true(k >= 1 and k <= MAX)
    end
  end)

  it("refuses an empty interval and bad arguments, naming them", function()
    local r = rl.rng(2)
    H.assert_error(function() r:random(0) end, { "bad argument #1", "interval is empty" })
    H.assert_error(function() r:random(MIN) end, "interval is empty")
    H.assert_error(function() r:random(5, 2) end, { "bad argument #2", "interval is empty" })
    H.assert_error(function() r:random(MAX, MIN) end, "interval is empty")
    H.assert_error(function() r:random(1.5) end, "number has no integer representation")
    H.assert_error(function() r:random(1, 2.5) end, { "bad argument #2", "no integer representation" })
    H.assert_error(function() r:random("x") end, { "bad argument #1", "number expected" })
    H.assert_error(function() r:random(nil) end, { "bad argument #1", "number expected, got nil" })
    H.assert_error(function() r:random(1, 2, 3) end, { "bad argument #3", "at most two bounds" })
    local u = r:random()
    assert.is_true(math.type(u) == "float" and u >= 0 and u < 1)
  end)
end)
