-- batch_spec.lua - rl.batch beyond what rollouts exercise: to_jsonl reports write errors (a full
-- disk, a missing folder) as nil, message naming the file, and round-trips through rl.batch.load.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"

-- Two hand-made episodes: a prompt token, then one action token and one observation token.
local function small_batch()
  local T = rl.tensor
  return rl.batch.new { tokens = T.from { 1, 97, 2, 1, 98, 2 }, logprobs = T.from { 0, -0.5, 0, 0, -1.25, 0 },
    mask = T.from { 0, 1, 0, 0, 1, 0 }, turns = T.from { -1, 0, 0, -1, 0, 0 }, offsets = { 0, 3, 6 },
    episodes = { { group = 1, reward = 1, record = { { action = "a", reward = 1 } } },
      { group = 1, reward = 0, record = { { action = "b", reward = 0 } } } } }
end

describe("rl.batch", function()
  it("to_jsonl writes what rl.batch.load reads back", function()
    local path = os.tmpname()
    assert.is_true(small_batch():to_jsonl(path))
    local back = assert(rl.batch.load(path))
    assert.are.equal(2, back:size())
    assert.are.equal(-1.25, back.logprobs:get(5))
    assert.are.equal("b", back.episodes[2].record[1].action)
    os.remove(path)
  end)

  it("to_jsonl returns nil and a message naming the file when writing fails", function()
    local ok, err = small_batch():to_jsonl("/dev/full") -- every write: no space left
    assert.is_nil(ok)
    assert.matches("^/dev/full: .*[Ss]pace", err)
    ok, err = small_batch():to_jsonl("/nonexistent-moonrl-dir/b.jsonl")
    assert.is_nil(ok)
    assert.matches("/nonexistent%-moonrl%-dir/b.jsonl", err)
    assert.matches("path: a string expected", H.error_of(function() small_batch():to_jsonl(3) end))
  end)
end)
