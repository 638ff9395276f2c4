-- window_spec.lua - history windows (rl.train.window): one row per turn whose prompt shows only
-- the last N turns; the rows' tokens, the trainer's re-scoring of them (the update is
-- on-policy), the episodes' summaries on their last rows, the environment stepped as the
-- actions say, the per-episode estimator against a direct GRPO over episode returns, a
-- training run that is the same twice, and the errors.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"
local score = require "moonrl.train.score"

local tok = rl.tokenizer.bytes()

-- Up to four turns. Observation k is "o<k>:<first byte of the last action>"; an action that
-- contains "a" ends the episode with reward 1, any other turn pays 0.1 per distinct byte.
local env = {
  name = "echo",
  max_turns = 4,
  tasks = H.numbered_tasks,
  new = function()
    return {
      reset = function(self, task, rng)
        self.n, self.salt = 0, rng:random(9)
        return "start" .. task.i .. "/" .. self.salt
      end,
      step = function(self, action)
        self.n = self.n + 1
        if action:find("a", 1, true) then return nil, 1, true, { success = true } end
        local seen, d = {}, 0
        for ch in action:gmatch(".") do
          if not seen[ch] then seen[ch], d = true, d + 1 end
        end
        return "o" .. self.n .. ":" .. action:sub(1, 1), 0.1 * d, false, { success = false }
      end,
    }
  end,
}

local function model() return rl.model.new { vocab = 264, dim = 32, layers = 1, heads = 2, ffn = 64, ctx = 128, seed = 7 } end

local function context(m, extra)
  local cfg = { env = env, max_turns = 4, max_turn_tokens = 3, adv_epsilon = 1e-6 }
  for k, v in pairs(extra or {}) do cfg[k] = v end
  return { model = m, tokenizer = tok, cfg = cfg,
    ro = rl.rollout.new { model = m, episodes = 8, capacity = 128 } }
end

local function decode(batch, i, sampled)
  local first, last = batch:range(i)
  local ids = {}
  for p = first, last do
    if (batch.mask:get(p) ~= 0) == sampled then ids[#ids + 1] = math.floor(batch.tokens:get(p)) end
  end
  return tok:decode(ids)
end

-- The episodes of a batch of rows: {episode number = {rows in order}}.
local function episodes_of(batch)
  local out = {}
  for i, ep in ipairs(batch.episodes) do
    local k = ep.window.episode
    out[k] = out[k] or {}
    table.insert(out[k], i)
  end
  return out
end

describe("rl.train.window", function()
  local m, ctx, batch, tasks
  setup(function()
    m = model()
    ctx = context(m)
    tasks = env.tasks("train", 2)
    batch = rl.train.window.rollout { turns = 1 } (ctx, { tasks = tasks, repeats = 4, seed = 11,
      temperature = 1.0, group_base = 0 })
  end)
  teardown(function() ctx.ro:free() end)

  it("makes one row per turn, each prompt with only the last turn and the current observation", function()
    local eps = episodes_of(batch)
    assert.are.equal(8, #eps)
    local multi = 0
    for _, rows in ipairs(eps) do
      if #rows > 2 then multi = multi + 1 end
      for t, i in ipairs(rows) do
        local ep = batch.episodes[i]
        assert.are.equal(t, ep.window.turn)
        local prompt = decode(batch, i, false)
        local rec = ep.record[1]
        assert.are.equal(rec.action, decode(batch, i, true):sub(1, #rec.action))
        if t == 1 then
          assert.truthy(prompt:find("start" .. ep.task.i .. "/", 1, true))
        else
          local prev = batch.episodes[rows[t - 1]].record[1]
          assert.truthy(prompt:find("> " .. prev.action, 1, true), prompt)
          assert.truthy(prompt:find(prev.observation, 1, true))
          assert.falsy(prompt:find("start", 1, true)) -- the first observation is out of the window
          if t > 2 then
            local older = batch.episodes[rows[t - 2]].record[1]
            assert.falsy(prompt:find(older.observation, 1, true), prompt)
          end
        end
      end
    end
    assert.is_true(multi > 0, "some episode should run three turns or more")
  end)

  it("rows are scored by the trainer under the context they were sampled in", function()
    local lp = score.score(m, batch, 4)
    local n = 0
    for p = 1, batch.offsets[#batch.offsets] do
      if batch.mask:get(p) ~= 0 then
        assert.is_true(math.abs(lp:get(p) - batch.logprobs:get(p)) < 1e-4, "position " .. p)
        n = n + 1
      end
    end
    assert.is_true(n > 8)
  end)

  it("steps the environment as the actions say; the last row holds the episode's summary", function()
    local eps, succ = episodes_of(batch), 0
    for _, rows in ipairs(eps) do
      local first = batch.episodes[rows[1]]
      local inst = env.new()
      local obs = inst:reset(first.task, rl.rng(first.seed))
      local ret, done, success = 0, false, false
      for t, i in ipairs(rows) do
        local ep = batch.episodes[i]
        assert.is_false(done)
        local o, r, d, info = inst:step(ep.record[1].action)
        assert.are.equal(o, ep.record[1].observation)
        assert.are.equal(r, ep.rewards[1])
        ret, done, success, obs = ret + r, d, info.success, o
        assert.are.equal(t == #rows, ep.window.last)
        if t < #rows then
          assert.are.equal(0, ep.reward)
          assert.are.equal(0, ep.turns)
          assert.is_false(ep.success)
        end
      end
      local last = batch.episodes[rows[#rows]]
      assert.is_true(math.abs(last.reward - ret) < 1e-12)
      assert.is_true(math.abs(last.window.return_ - ret) < 1e-12)
      assert.are.equal(#rows, last.turns)
      assert.are.equal(success, last.success)
      assert.are.equal(done and "done" or "max_turns", last["end"])
      if not done then assert.are.equal(4, #rows) end
      succ = succ + (success and 1 or 0)
    end
    assert.are.equal(8, batch.window.episodes)
    assert.are.equal(batch:size(), batch.window.rows)
    assert.are.equal(succ / 8, batch.window.success)
    assert.is_true(batch.window.prompt_tokens > 0)
  end)

  it("the estimator gives every token of an episode's rows the GRPO advantage of its return", function()
    local est = rl.train.window.advantage { base = "grpo" }
    local adv, per_row = est(ctx, batch)
    local eps = episodes_of(batch)
    local by_group = {}
    for k, rows in ipairs(eps) do
      local ep = batch.episodes[rows[1]]
      by_group[ep.group] = by_group[ep.group] or {}
      table.insert(by_group[ep.group], { k = k, r = ep.window.return_ })
    end
    local want = {}
    for _, list in pairs(by_group) do
      local mean, sq = 0, 0
      for _, e in ipairs(list) do mean = mean + e.r / #list end
      for _, e in ipairs(list) do sq = sq + (e.r - mean) ^ 2 end
      local std = math.sqrt(sq / (#list - 1))
      for _, e in ipairs(list) do want[e.k] = (e.r - mean) / (std + 1e-6) end
    end
    local nonzero = 0
    for k, rows in ipairs(eps) do
      for _, i in ipairs(rows) do
        assert.is_true(math.abs(per_row[i] - want[k]) < 1e-6) -- (the engine keeps float32s)
        local first, last = batch:range(i)
        for p = first, last do
          local v = batch.mask:get(p) ~= 0 and want[k] or 0
          assert.is_true(math.abs(adv:get(p) - v) < 1e-6)
        end
      end
      if want[k] ~= 0 then nonzero = nonzero + 1 end
    end
    assert.is_true(nonzero > 0)
  end)

  it("turns = 0 shows only the current observation; the same seed gives the same rows", function()
    local stage = rl.train.window.rollout { turns = 0 }
    local req = { tasks = tasks, repeats = 4, seed = 3, temperature = 1.0, group_base = 0 }
    local a, b = stage(ctx, req), stage(ctx, req)
    assert.are.equal(a:size(), b:size())
    for i = 1, a:size() do
      assert.are.equal(decode(a, i, false), decode(b, i, false))
      assert.are.equal(a.episodes[i].record[1].action, b.episodes[i].record[1].action)
    end
    local checked = 0
    for _, rows in ipairs(episodes_of(a)) do
      for t = 2, #rows do
        local prompt = decode(a, rows[t], false)
        assert.falsy(prompt:find("> ", 1, true))
        assert.truthy(prompt:find(a.episodes[rows[t - 1]].record[1].observation, 1, true))
        checked = checked + 1
      end
    end
    assert.is_true(checked > 0)
  end)

  it("a custom render gets the window and the instance", function()
    local seen = {}
    local stage = rl.train.window.rollout { turns = 2, render = function(v)
      seen[#seen + 1] = #v.history
      assert.is_table(v.instance)
      return "[" .. v.turn .. "] " .. v.observation
    end }
    local b = stage(ctx, { tasks = tasks, repeats = 1, seed = 5, temperature = 1.0, group_base = 0 })
    for i = 1, b:size() do
      local t = b.episodes[i].window.turn
      assert.truthy(decode(b, i, false):find("[" .. t .. "] ", 1, true))
    end
    for _, n in ipairs(seen) do assert.is_true(n <= 2) end
  end)

  it("trains with rl.train: the same seed gives the same run, and evaluation counts episodes", function()
    local function run(dir)
      rl.train.advantage.register("window_test", rl.train.window.advantage {})
      return rl.train { model = model(), tokenizer = tok, env = env, dir = dir, name = "run", seed = 2,
        steps = 2, tasks_per_step = 2, group_size = 4, max_turn_tokens = 3, lr = 1e-3, minibatch = 8,
        rollout = rl.train.window.rollout { turns = 1 }, advantage = "window_test",
        eval = { tasks = 3, every = 2, k = 2 }, progress = false, plot = false }
    end
    local d1, d2 = H.tmpdir(), H.tmpdir()
    run(d1)
    run(d2)
    local la = H.read_json_lines(d1 .. "/run/metrics.jsonl")
    local lb = H.read_json_lines(d2 .. "/run/metrics.jsonl")
    assert.are.equal(#la, #lb)
    local evals = 0
    for s = 1, #la do
      for k, v in pairs(la[s]) do
        if type(v) == "number" and not k:match("^time") and not k:match("per_s$") then
          assert.are.equal(v, lb[s][k], k)
        end
      end
      local g = la[s]["eval/greedy_success"]
      if g then
        evals = evals + 1
        assert.is_true(g >= 0 and g <= 1)
        assert.is_true(la[s]["eval/greedy_turns"] >= 1 and la[s]["eval/greedy_turns"] <= 4)
      end
    end
    assert.is_true(evals >= 1)
  end)

  it("refuses what it cannot do, naming it", function()
    local e1 = H.error_of(function() rl.train.window.rollout { turns = -1 } end)
    assert.truthy(e1:find("turns", 1, true))
    local e2 = H.error_of(function() rl.train.window.rollout { window = 2 } end)
    assert.truthy(e2:find("window", 1, true))
    local e3 = H.error_of(function()
      rl.train.window.rollout { render = function() return 3 end } (ctx,
        { tasks = tasks, repeats = 1, seed = 1, temperature = 1, group_base = 0 })
    end)
    assert.truthy(e3:find("render", 1, true))
    local c2 = context(m, { dynamic_sampling = true })
    local e4 = H.error_of(function()
      rl.train.window.rollout {} (c2, { tasks = tasks, repeats = 1, seed = 1, temperature = 1, group_base = 0 })
    end)
    c2.ro:free()
    assert.truthy(e4:find("dynamic_sampling", 1, true))
    local e5 = H.error_of(function()
      rl.train.window.rollout {} (ctx, { tasks = tasks, repeats = 2, seed = 1, temperature = 1,
        group_base = 0, tree = { turn = 1, k = 2 } })
    end)
    assert.truthy(e5:find("tree", 1, true))
    local plain = rl.batch.new { tokens = rl.tensor.zeros(2), logprobs = rl.tensor.zeros(2),
      mask = rl.tensor.zeros(2), turns = rl.tensor.zeros(2), offsets = { 0, 2 },
      episodes = { { reward = 1, group = 1 } } }
    local e6 = H.error_of(function() rl.train.window.advantage {} (ctx, plain) end)
    assert.truthy(e6:find("not from rl.train.window.rollout", 1, true))
    local e7 = H.error_of(function() rl.train.window.advantage { base = 3 } end)
    assert.truthy(e7:find("base", 1, true))
  end)
end)

describe("rl.train.window.examples", function()
  it("are the rollout's rows token for token when the oracle takes the policy's actions", function()
    local m = model()
    local ctx = context(m)
    local tasks = env.tasks("train", 3, 9)
    for _, turns in ipairs { 0, 2 } do
      local b = rl.train.window.rollout { turns = turns } (ctx, { tasks = tasks, repeats = 1, seed = 21,
        temperature = 1.0, group_base = 0 })
      local eps = episodes_of(b)
      -- examples() draws its tasks and seeds itself: an oracle that replays each episode's
      -- actions, on an environment whose tasks are the rollout's and whose reset ignores the rng
      -- difference (the salt comes from the task here)
      local fixed = {}
      for k, v in pairs(env) do fixed[k] = v end
      fixed.tasks = function() return tasks end
      local salts = {}
      for k, rows in ipairs(eps) do salts[k] = b.episodes[rows[1]].seed end
      fixed.new = function()
        local inst = env.new()
        local reset = inst.reset
        inst.reset = function(self, task) return reset(self, task, rl.rng(salts[task.i])) end
        return inst
      end
      local n, compared = 0, 0
      local ex = rl.train.window.examples { env = fixed, tokenizer = tok, n = 3, seed = 1, turns = turns,
        oracle = function(task)
          local out = {}
          for _, i in ipairs(eps[task.i]) do out[#out + 1] = b.episodes[i].record[1].action end
          return out
        end }
      for _, rows in ipairs(eps) do
        -- (an untrained policy may sample a special token, whose text, "<|assistant|>", is other
        -- tokens when encoded again: such episodes are not compared)
        local plain = true
        for _, i in ipairs(rows) do
          local first, last = b:range(i)
          for p = first, last do
            local id = math.floor(b.tokens:get(p))
            if b.mask:get(p) ~= 0 and id >= 256 and not (p == last and id == 263) then plain = false end
          end
        end
        for _, i in ipairs(rows) do
          n = n + 1
          local e = ex[n]
          local first, last = b:range(i)
          -- the example ends with the end-of-turn token; a row whose action was cut at
          -- max_turn_tokens has none
          local len = last - first + 1
          if plain then
            assert.is_true(len == #e.tokens or len == #e.tokens - 1)
            for p = 1, len do
              assert.are.equal(math.floor(b.tokens:get(first + p - 1)), e.tokens[p], "row " .. i .. " token " .. p)
              assert.are.equal(b.mask:get(first + p - 1) ~= 0, e.mask[p] ~= 0, "row " .. i .. " mask " .. p)
            end
            compared = compared + 1
          end
        end
      end
      assert.are.equal(n, #ex)
      assert.is_true(compared >= 3, "too few rows compared: " .. compared)
    end
    ctx.ro:free()
  end)

  it("checks its options", function()
    local e1 = H.error_of(function() rl.train.window.examples { env = env, tokenizer = tok, n = 2 } end)
    assert.truthy(e1:find("seed", 1, true))
    local e2 = H.error_of(function() rl.train.window.examples { env = env, tokenizer = tok, n = 2, seed = 1 } end)
    assert.truthy(e2:find("oracle", 1, true))
    local e3 = H.error_of(function() rl.train.window.examples { env = env, tokenizer = tok, n = 2, seed = 1, k = 1 } end)
    assert.truthy(e3:find("'k'", 1, true) or e3:find("k", 1, true))
  end)
end)
