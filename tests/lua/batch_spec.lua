-- batch_spec.lua - rl.batch beyond what rollouts exercise: to_jsonl reports write errors (a full
-- disk, a missing folder) as nil, message naming the file, and round-trips through rl.batch.load;
-- sft_examples turns episodes back into rl.sft examples.
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

  it("sft_examples: the kept episodes' tokens as sampled, mask 1 on the sampled tokens", function()
    local b = small_batch()
    local all = b:sft_examples()
    assert.are.same({ { tokens = { 1, 97, 2 }, mask = { 0, 1, 0 } }, { tokens = { 1, 98, 2 }, mask = { 0, 1, 0 } } }, all)
    assert.are.equal("integer", math.type(all[2].tokens[2]))
    local seen = {}
    local won = b:sft_examples(function(ep, i)
      seen[#seen + 1] = i
      return ep.reward > 0
    end)
    assert.are.same({ 1, 2 }, seen)
    assert.are.same({ { tokens = { 1, 97, 2 }, mask = { 0, 1, 0 } } }, won)
    assert.are.same({}, b:sft_examples(function() return false end))
    -- what rl.sft trains on: a loss over the masked token
    local m = rl.model.new { vocab = 128, dim = 16, layers = 1, heads = 2, ffn = 32, ctx = 8, seed = 1 }
    local r = rl.sft { model = m, data = won, epochs = 1, batch_size = 1, lr = 1e-3 }
    assert.are.equal(1, r.steps)
    assert.is_true(r.final_loss > 0)
    assert.matches("sft_examples: keep: a function%(episode, i%) expected, got string",
      H.error_of(function() b:sft_examples("success") end))
  end)
end)
