-- threads_spec.lua - rl.threads: the engine's thread count from Lua (reading, setting, argument
-- errors), and results that do not change with it: logits, log-probabilities and generated
-- tokens bit for bit on 1 and 3 threads.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"

describe("rl.threads", function()
  local default = rl.threads()
  after_each(function() rl.threads(0) end)

  it("reads and sets the count (0: the cores the process may run on)", function()
    assert.is_true(math.type(default) == "integer" and default >= 1)
    assert.are.equal(3, rl.threads(3))
    assert.are.equal(3, rl.threads())
    assert.are.equal(1, rl.threads(1))
    assert.are.equal(default, rl.threads(0))
  end)

  it("defaults to the cores the process may run on: one under taskset -c 0", function()
    local out, code = H.run("taskset -c 0 " .. H.shell_quote(H.moonrl) .. " -e 'print(require(\"moonrl\").threads())'")
    assert.equal(0, code, out)
    assert.equal("1\n", out)
  end)

  it("names its argument when misused", function()
    H.assert_error(function() rl.threads(-1) end,
      { "bad argument #1", "threads: expected 0..1024 (0: the cores the process may run on)" })
    H.assert_error(function() rl.threads(1025) end, { "bad argument #1", "expected 0..1024" })
    H.assert_error(function() rl.threads("many") end, { "bad argument #1", "number expected" })
    H.assert_error(function() rl.threads(1.5) end, { "bad argument #1" })
    assert.are.equal(default, rl.threads())
  end)
end)

describe("results on any thread count", function()
  after_each(function() rl.threads(0) end)

  -- everything the model computes from one fixed input, as plain numbers
  local function outcome(threads)
    rl.threads(threads)
    local m = rl.model.new { arch = "qwen3", vocab = 61, dim = 48, layers = 2, heads = 6,
                             kv_heads = 2, ffn = 64, ctx = 96, seed = 5 }
    local seqs = {}
    for b = 1, 3 do
      local s = {}
      for t = 1, 20 + 17 * b do s[t] = (t * 7 + b * 13) % 61 end
      seqs[b] = s
    end
    local lp, ent = m:logprobs { tokens = seqs, entropy = true }
    local out = m:generate { prompts = { seqs[1], seqs[2], { 3 } }, max_new_tokens = 12,
                             temperature = 0.9, top_p = 0.95, seed = 11 }
    local loss = (m:accumulate { tokens = seqs })
    local flat = {}
    for _, rows in ipairs { lp, ent, out.tokens, out.logprobs } do
      for _, row in ipairs(rows) do
        for _, x in ipairs(row) do flat[#flat + 1] = x end
      end
    end
    flat[#flat + 1] = loss
    m:free()
    return flat
  end

  it("gives the same bits on 1 and 3 threads", function()
    local one, three = outcome(1), outcome(3)
    assert.are.equal(#one, #three)
    local differ = 0
    for i = 1, #one do
      if one[i] ~= three[i] then differ = differ + 1 end
    end
    assert.are.equal(0, differ)
  end)
end)
