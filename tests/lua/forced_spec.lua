-- forced_spec.lua - ro:run{forced = fn}: the text fn returns is scored after the prompt and after
-- each turn the episode goes on from, each score equals the model's own log-probabilities of the
-- concatenated sequence, a scored run decodes bit for bit as an unscored one, and misuse (a
-- forced that is not a function, returns a number or an empty string, runs with a tree) is named
-- in the errors.
local rl = require "moonrl"

local tok = rl.tokenizer.bytes()

local function seq(n, f)
  local t = {}
  for i = 1, n do t[i] = f(i) end
  return t
end

-- The environment: the observation names the turn; done after three turns.
local counter = {
  name = "counter",
  new = function()
    return {
      reset = function(self) self.n = 0 return "turn 0" end,
      step = function(self, action)
        self.n = self.n + 1
        return "turn " .. self.n, #action % 2, self.n >= 3
      end,
    }
  end,
}

local m = rl.model.new { vocab = 264, dim = 32, layers = 2, heads = 2, ffn = 64, ctx = 200, seed = 5 }
local ro = rl.rollout.new { model = m, episodes = 6, capacity = 180 }

local function run(n, extra)
  local opts = { tokenizer = tok, env = counter, tasks = seq(n, function(i) return { i = i } end),
    seeds = seq(n, function(i) return 700 + i end), max_turns = 4, max_turn_tokens = 6,
    temperature = 1, batch_invariant = true }
  for k, v in pairs(extra or {}) do opts[k] = v end
  return ro:run(opts)
end

local function record_of(batch, i)
  local a, b = batch:range(i)
  local t, lp = {}, {}
  for p = a, b do
    t[#t + 1] = math.tointeger(batch.tokens:get(p))
    lp[#lp + 1] = batch.logprobs:get(p)
  end
  return t, lp
end

local function answer(task) return "answer " .. task.i .. "<|end|>" end

describe("rl.rollout forced", function()
  it("scores the text after the prompt and each continuing turn, as the model's logprobs", function()
    local lengths = {}
    local res = run(4, { forced = function(view)
      local l = lengths[view.episode] or {}
      lengths[view.episode] = l
      l[#l + 1] = view.length
      return answer(view.task)
    end })
    local batch = rl.batch.from_rollout(ro, res, seq(#res, function(i) return i end))
    local worst = 0
    for i, s in ipairs(res) do
      assert.are.equal(s.turns, #s.forced) -- after the prompt and turns 1 .. turns - 1
      local tokens = record_of(batch, i)
      local forced = tok:encode(answer(s.task), { special = true })
      for k, entry in ipairs(s.forced) do
        assert.are.equal(k - 1, entry.turn)
        assert.are.equal(#forced, entry.tokens)
        local sum = 0
        for _, v in ipairs(entry.logprobs) do sum = sum + v end
        assert.is_true(math.abs(sum - entry.logp) < 1e-9)
        local whole = { table.unpack(tokens, 1, lengths[i][k]) }
        for _, t in ipairs(forced) do whole[#whole + 1] = t end
        local ref = m:logprobs { tokens = { whole } }[1]
        for j = 1, #forced do
          worst = math.max(worst, math.abs(ref[lengths[i][k] - 1 + j] - entry.logprobs[j]))
        end
      end
    end
    assert.is_true(worst < 1e-4, "max difference " .. worst)
  end)

  it("leaves the episodes as they were: the same tokens and log-probabilities bit for bit", function()
    local plain = run(4)
    local pb = rl.batch.from_rollout(ro, plain, seq(#plain, function(i) return i end))
    local want = {}
    for i = 1, #plain do want[i] = { record_of(pb, i) } end
    local calls = 0
    local scored = run(4, { forced = function(view)
      calls = calls + 1
      if view.turns ~= 1 then return answer(view.task) end -- nil skips a point
    end })
    local sb = rl.batch.from_rollout(ro, scored, seq(#scored, function(i) return i end))
    for i = 1, #scored do
      local t, lp = record_of(sb, i)
      assert.are.same(want[i][1], t)
      assert.are.same(want[i][2], lp)
      assert.are.equal(scored[i].turns - 1, #scored[i].forced)
    end
    assert.is_true(calls >= 12)
  end)

  it("names misuse in its errors", function()
    local function fails(extra, needle)
      local ok, err = pcall(run, 2, extra)
      assert.is_false(ok)
      assert.is_truthy(tostring(err):find(needle, 1, true), tostring(err))
    end
    fails({ forced = 3 }, "forced: a function expected, got number")
    fails({ forced = function() return 7 end }, "forced (episode 1): returned number")
    fails({ forced = function() return "" end }, "forced (episode 1): returned an empty string")
    fails({ forced = function() error("boom") end }, "boom")
    fails({ forced = function() return string.rep("x", 400) end }, "has no room")
    fails({ forced = function() return "a" end, branch = { turn = 1, k = 2 } }, "forced")
  end)
end)
