-- dist_spec.lua - moonrl.train.dist's pieces that need no MPI: how groups are shared out over
-- ranks, and the exact encoding that carries episodes between ranks.
local rl = require "moonrl"
local dist = require "moonrl.train.dist"

describe("dist.share", function()
  it("gives every rank a contiguous part, in rank order, covering 1..n once", function()
    for size = 1, 5 do
      for n = 0, 13 do
        local next_first, counts = 1, {}
        for rank = 0, size - 1 do
          local a, b = dist.share(n, rank, size)
          assert.equal(next_first, a, string.format("n %d size %d rank %d", n, size, rank))
          assert.is_true(b >= a - 1)
          counts[#counts + 1] = b - a + 1
          next_first = b + 1
        end
        assert.equal(n + 1, next_first)
        -- equal shares: no two ranks differ by more than one
        table.sort(counts)
        assert.is_true(counts[#counts] - counts[1] <= 1)
      end
    end
  end)

  it("is the whole list on one rank", function()
    assert.same({ 3, 4, 5 }, dist.part { 3, 4, 5 })
    assert.equal(1, dist.size())
    assert.is_true(dist.lead())
  end)
end)

describe("dist.encode / dist.decode", function()
  it("rebuild numbers bit for bit, integers as integers, and every plain value", function()
    local v = {
      1, 2.0, -0.0, 0.1, 1 / 3, math.huge, -math.huge, math.maxinteger, math.mininteger,
      2 ^ -1074, "a\0b\n\"\\", true, false, rl.json.null,
      nested = { deep = { x = { 1, { 2, { 3 } } } } }, [7.5] = "float key", [true] = "bool key",
      arr = rl.json.array {}, arr2 = rl.json.array { 1, 2 },
    }
    local back = dist.decode(dist.encode(v))
    for i = 1, 14 do
      assert.equal(math.type(v[i]), math.type(back[i]))
      if type(v[i]) == "number" then
        assert.equal(string.format("%a", v[i]), string.format("%a", back[i]), "item " .. i)
      else
        assert.equal(v[i], back[i])
      end
    end
    assert.equal(1 / v[3], 1 / back[3]) -- the sign of zero
    local nan = dist.decode(dist.encode { 0 / 0 })[1]
    assert.is_true(nan ~= nan)
    assert.same(v.nested, back.nested)
    assert.equal("float key", back[7.5])
    assert.equal("bool key", back[true])
    assert.equal("[]", rl.json.encode(back.arr)) -- the array mark survives
    assert.equal("[1,2]", rl.json.encode(back.arr2))
  end)

  it("refuses what cannot cross ranks, naming where it was", function()
    local ok, err = pcall(dist.encode, { episodes = { { record = { { f = print } } } } }, "the batch")
    assert.is_false(ok)
    assert.truthy(err:find("the batch.episodes.1.record.1.f is a function", 1, true), err)
    ok, err = pcall(dist.encode, { x = setmetatable({}, {}) }, "v")
    assert.is_false(ok)
    assert.truthy(err:find("v.x is a table with a metatable", 1, true), err)
    local cyc = {}
    cyc.self = cyc
    ok, err = pcall(dist.encode, cyc, "v")
    assert.is_false(ok)
    assert.truthy(err:find("nested too deep", 1, true), err)
  end)
end)

describe("dist.gather_batch", function()
  it("is the batch itself on one rank", function()
    local b = rl.batch.concat {}
    assert.equal(b, dist.gather_batch(b, function() end))
  end)
end)
