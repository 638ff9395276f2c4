-- drmm_spec.lua - DR-MMSearch's pieces: rl.train.advantage.structure_term (the batch-wide
-- comparison of trajectories of like structure) against a direct computation, the structure
-- estimator (GRPO plus weight x that term on every sampled token) on a real batch, their argument
-- errors, and smoke runs of recipes/drmm.lua (every arm and the SFT row in its table, the same
-- table twice for the same seed, the Gaussian search bonus only where it belongs and equal to
-- 0.2 exp(-(searches - hops)^2 / 2), its option errors). Not that it learns (the README's table).
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"
local advantage = require "moonrl.train.advantage"
local batchlib = require "moonrl.batch"

-- The term written out: for each episode, the mean and sample sd of the scores of every episode
-- with its key, found by scanning the whole list.
local function direct(scores, keys, eps)
  local out = {}
  for i = 1, #scores do
    local xs = {}
    for j = 1, #scores do if keys[j] == keys[i] then xs[#xs + 1] = scores[j] end end
    if #xs < 2 then
      out[i] = 0
    else
      local m = 0
      for _, x in ipairs(xs) do m = m + x / #xs end
      local v = 0
      for _, x in ipairs(xs) do v = v + (x - m) ^ 2 / (#xs - 1) end
      out[i] = (scores[i] - m) / (math.sqrt(v) + eps)
    end
  end
  return out
end

describe("rl.train.advantage.structure_term", function()
  it("normalises each score within the episodes of its key across the whole list", function()
    local scores = { 1, 0, 0.5, 1, 1, 0, -0.1, 0.2 }
    local keys = { "ssa", "sa", "ssa", "sa", "ssa", "sa", "x", "ssa" }
    local got = advantage.structure_term(scores, keys, 1e-6)
    local want = direct(scores, keys, 1e-6)
    for i = 1, #scores do assert.is_true(math.abs(got[i] - want[i]) < 1e-12, "episode " .. i) end
    assert.are.equal(0, got[7]) -- a class of one
    -- keys ignore prompt groups: two equal scores of one key are 0 whatever else there is
    local same = advantage.structure_term({ 1, 1, 0 }, { "a", "a", "b" })
    assert.are.same({ 0, 0, 0 }, same)
  end)

  it("refuses lists that are not scores and keys", function()
    H.assert_error(function() advantage.structure_term("x", {}) end, "scores: a list of numbers expected")
    H.assert_error(function() advantage.structure_term({ 1, 2 }, { "a" }) end, "keys: a list as long as scores")
    H.assert_error(function() advantage.structure_term({ 1, 0 / 0 }, { "a", "b" }) end, "scores[2]: a finite number")
    H.assert_error(function() advantage.structure_term({ 1, 2 }, { "a", 3 }) end, "keys[2]: a string expected")
  end)
end)

describe("rl.train.advantage.structure", function()
  local tok = rl.tokenizer.bytes()
  -- Up to three turns; an action with an "a" in it ends the episode with reward 1.
  local env = {
    name = "structure_toy", max_turns = 3,
    tasks = function(_, n) local t = {} for i = 1, n do t[i] = { i = i } end return t end,
    new = function()
      return {
        reset = function(self) self.n = 0 return "go" end,
        step = function(self, action)
          self.n = self.n + 1
          local hit = action:find("a", 1, true) ~= nil
          return "more", hit and 1 or 0, hit or self.n >= 3, { success = hit }
        end,
      }
    end,
  }

  it("adds weight x the term of the episodes' keys to GRPO's advantage on every sampled token", function()
    local m = rl.model.new { vocab = tok:vocab_size(), dim = 16, layers = 1, heads = 2, ffn = 32, ctx = 64, seed = 5 }
    local ro = rl.rollout.new { model = m, episodes = 12, capacity = 64 }
    local tasks, seeds, groups = {}, {}, {}
    for i = 1, 12 do tasks[i], seeds[i], groups[i] = { i = i }, 50 + i, (i - 1) // 4 + 1 end
    local res = ro:run { tokenizer = tok, env = env, tasks = tasks, seeds = seeds, max_turns = 3, max_turn_tokens = 3 }
    local batch = batchlib.from_rollout(ro, res, groups)
    ro:free()
    for i, ep in ipairs(batch.episodes) do ep.reward = ep.reward + 0.05 * (i % 5) end
    local key = function(ep) return "k" .. (#ep.record % 2) end
    local est = advantage.structure { base = "grpo", weight = 0.7, key = key }
    local ctx = { model = m, cfg = { adv_epsilon = 1e-6 } }
    local adv, per = est(ctx, batch)
    local base, per0 = advantage.get("grpo").fn(ctx, batch)
    local scores, keys = {}, {}
    for i, ep in ipairs(batch.episodes) do scores[i], keys[i] = ep.reward, key(ep) end
    local term = direct(scores, keys, 1e-6)
    local nonzero = 0
    for i = 1, batch:size() do
      assert.is_true(math.abs(per[i] - (per0[i] + 0.7 * term[i])) < 1e-9, "episode " .. i)
      if math.abs(term[i]) > 1e-3 then nonzero = nonzero + 1 end
      local first, last = batch:range(i)
      for p = first, last do
        local want = batch.mask:get(p) ~= 0 and base:get(p) + 0.7 * term[i] or 0
        assert.is_true(math.abs(adv:get(p) - want) < 1e-5, string.format("position %d: %g vs %g", p, adv:get(p), want))
      end
    end
    assert.is_true(nonzero > 0) -- the term changed something
    assert.is_true(math.abs(batch.structure[1] - term[1]) < 1e-12)
  end)

  it("refuses a missing key, an unknown option or base, and a key that is not a string", function()
    H.assert_error(function() advantage.structure { base = "grpo" } end, "key")
    H.assert_error(function() advantage.structure { key = tostring, wieght = 1 } end, "unknown field 'wieght'")
    H.assert_error(function() advantage.structure { key = tostring, base = "nope" } end, "base: no estimator named")
    H.assert_error(function() advantage.structure { key = tostring, base = "gae" } end, "without a critic")
    local est = advantage.structure { key = function() return 1 end }
    local batch = { episodes = { { reward = 1, group = 1 } } }
    local ok, err = pcall(est, { cfg = {} }, batch)
    assert.is_false(ok)
    assert.matches("key%(ep%) returned 1, not a string", tostring(err))
  end)
end)

local run = H.smoke_runner("drmm.lua")

local function table_of(out) return H.table_without_seconds(out, "drmm, seed 1;") end -- s/step dropped

describe("recipes/drmm.lua", function()
  local dir = H.tmpdir()
  local out, code = run(dir)
  teardown(function() H.sh("rm -rf " .. H.shell_quote(dir)) end)

  it("prints every arm and the SFT start, with searches, short answers and search-turn rates", function()
    assert.are.equal(0, code, out)
    local tbl = table_of(out)
    assert.is_truthy(tbl, out)
    assert.matches("arm%s+1%-hop%%%s+2%-hop%%%s+3%-hop%%%s+4%-hop%%%s+all%%%s+searches%s+short%%%s+call1%-1%s+call2%-2", out)
    for _, arm in ipairs { "grpo", "gauss", "full" } do
      local line = tbl:match("\n" .. arm .. "[^\n]*")
      assert.is_truthy(line, tbl)
      local nums = {}
      for v in line:gmatch("%s([%d.]+)") do nums[#nums + 1] = tonumber(v) end
      assert.are.equal(9, #nums, line) -- 4 hops, all, searches, short, two windows
      for k, v in ipairs(nums) do
        if k ~= 6 then assert.is_true(v >= 0 and v <= 100, line) end
      end
      assert.is_true(nums[8] <= 1 and nums[9] <= 1, line) -- search turns per turn
    end
    assert.matches("\nSFT%s+[%d.]+%s+[%d.]+%s+[%d.]+%s+[%d.]+%s+[%d.]+%s+[%d.]+%s+[%d.]+", tbl)
  end)

  it("prints the same table for the same seed", function()
    local dir2 = H.tmpdir()
    local out2, code2 = run(dir2)
    assert.are.equal(0, code2, out2)
    assert.are.equal(table_of(out), table_of(out2))
    H.sh("rm -rf " .. H.shell_quote(dir2))
  end)

  it("adds the Gaussian search bonus in the gauss and full arms only, 0.2 exp(-(searches - hops)^2 / 2)", function()
    for _, arm in ipairs { "gauss", "full" } do
      local eps = H.read_json_lines(dir .. "/drmm-" .. arm .. "-s1/episodes.jsonl")
      assert.is_true(#eps > 0)
      for _, ep in ipairs(eps) do
        local n = 0
        for _, r in ipairs(ep.record) do if r.info.tool_call then n = n + 1 end end
        assert.is_near(0.2 * math.exp(-(n - ep.task.hops) ^ 2 / 2), ep.reward_terms.gauss, 1e-12)
      end
    end
    for _, ep in ipairs(H.read_json_lines(dir .. "/drmm-grpo-s1/episodes.jsonl")) do assert.is_nil(ep.reward_terms.gauss) end
  end)

  it("refuses an unknown arm and bad weights", function()
    local function bad(args)
      return H.run(table.concat({ H.shell_quote(H.moonrl), "run", H.shell_quote(H.root .. "/recipes/drmm.lua"), args }, " "))
    end
    assert.matches("unknown arm 'ppo'", bad("--arms grpo,ppo"))
    assert.matches("%-%-bonus: a number >= 0", bad("--bonus -1"))
    assert.matches("%-%-sigma: a number > 0", bad("--sigma 0"))
    assert.matches("%-%-structure: a number >= 0", bad("--structure -0.5"))
  end)
end)
