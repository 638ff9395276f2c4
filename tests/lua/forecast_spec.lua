-- forecast_spec.lua - envs/forecast.lua (the rules its header states: looks, seen, invalid, the
-- forecasting third turn, immediate and pending rewards, resolve after task.delay steps, the
-- posterior against a pooled-binomial computation, the splits, determinism, the oracles'
-- figures) and smoke runs of recipes/forecast.lua, both modes (they run, log the delayed
-- metrics and print their tables; not that they learn).
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"

local F = dofile(H.root .. "/envs/forecast.lua")

-- Plays actions through the engine's step path; returns the records and the first observation.
local function play(task, actions)
  local inst, record = F.new(), {}
  local first = inst:reset(task, rl.rng(1))
  for _, a in ipairs(actions) do
    local _, _, done = rl.env.step(F, inst, a, record)
    if done then break end
  end
  return record, first
end

local function task_with(fields)
  local t = F.gen({ delay = 0 }, rl.rng(5))
  for k, v in pairs(fields) do t[k] = v end
  return t
end

describe("envs/forecast.lua", function()
  it("shows each source's snippet in at most 24 bytes, 'seen' on a second look, and ends on a forecast", function()
    local t = task_with { wire = { 4, 6 }, poll = { 1, 4 }, blog = { 3, 4 }, y = 1 }
    local rec, first = play(t, { "look wire", "look wire", "p 7" })
    assert.are.equal("will it land up?", first)
    assert.are.same({ "wire 4/6 up", "seen" }, { rec[1].observation, rec[2].observation })
    assert.are.equal("wire", rec[1].info.look)
    assert.is_true(rec[3].done)
    assert.are.equal(0.75, rec[3].info.p)
    assert.are.equal(1 - (0.75 - 1) ^ 2, rec[3].reward)
    assert.is_true(rec[3].info.success)
    assert.is_nil(rec[3].info.pending)
    rec = play(t, { "look poll", "look blog", "p 0" })
    assert.are.same({ "poll 1/4 up", "blog 3/4 up" }, { rec[1].observation, rec[2].observation })
    assert.are.equal(1 - (0.05 - 1) ^ 2, rec[3].reward)
    assert.is_false(rec[3].info.success)
    for _, r in ipairs(rec) do assert.is_true(#(r.observation or "") <= 24) end
    -- a forecast at once is fine; an invalid action spends a turn
    rec = play(t, { "p 9" })
    assert.are.equal(1, #rec)
    assert.are.equal(0.95, rec[1].info.p)
    rec = play(t, { "hello", "look news", "look wire" })
    assert.are.same({ "invalid", "invalid" }, { rec[1].observation, rec[2].observation })
    assert.is_true(rec[3].done) -- the third turn had to forecast: no forecast, reward 0
    assert.is_nil(rec[3].info.p)
    assert.are.equal(0, rec[3].reward)
    assert.is_false(rec[3].info.success)
  end)

  it("pays a delayed question nothing at rollout, marks it pending, and resolve scores it task.delay steps later", function()
    local t = F.gen({ delay = 5 }, rl.rng(9))
    assert.are.equal(5, t.delay)
    local rec = play(t, { "look wire", "p 3" })
    assert.are.equal(0, rec[2].reward)
    assert.are.equal(t.id, rec[2].info.pending)
    assert.are.equal(0.35, rec[2].info.p)
    assert.is_nil(rec[2].info.success)
    local pending = { { key = t.id, step = 10, episodes = 4, task = t } }
    assert.are.same({}, F.resolve(14, pending))
    local out = F.resolve(15, pending)
    assert.are.equal(1, #out)
    assert.are.equal(t.id, out[1].key)
    local ep = { task = t, record = rec }
    assert.are.equal(1 - (0.35 - t.y) ^ 2, out[1].reward(ep))
    assert.are.equal(0, F.score { task = t, record = play(t, { "look wire", "look poll", "x" }) })
    -- the same question with delay 0 pays the same reward at once
    local now = play(task_with { delay = 0, y = t.y, wire = t.wire }, { "look wire", "p 3" })
    assert.are.equal(out[1].reward(ep), now[2].reward)
  end)

  it("computes the posterior of the coin as a pooled binomial over the grid, and solve forecasts its bucket", function()
    for _, case in ipairs { { 6, 4 }, { 0, 0 }, { 3, 2 }, { 5, 1 } } do
      local t = task_with { wire = { case[1], 6 }, poll = { case[2], 4 } }
      local k, n = case[1] + case[2], 10
      local num, den = 0, 0
      for _, q in ipairs { 0.1, 0.2, 0.3, 0.7, 0.8, 0.9 } do
        local l = math.exp(k * math.log(q) + (n - k) * math.log(1 - q))
        num, den = num + l * q, den + l
      end
      assert.is_true(math.abs(F.posterior(t) - num / den) < 1e-12)
      local d = math.floor(10 * num / den)
      assert.are.same({ "look wire", "look poll", "p " .. d }, F.solve(t))
    end
  end)

  it("splits questions by their evidence, draws them deterministically, and resolves a quick fraction at once", function()
    local function sig(t) return table.concat({ t.q, t.wire[1], t.poll[1], t.blog[1] }, ",") end
    local train, test = {}, {}
    for _, t in ipairs(F.tasks("train", 600, 1)) do
      train[sig(t)] = true
      assert.are.equal(0, t.delay)
      assert.are.equal("q", t.id:sub(1, 1))
    end
    for _, t in ipairs(F.tasks("test", 300, 2)) do
      test[sig(t)] = true
      assert.are.equal("t", t.id:sub(1, 1))
    end
    for s in pairs(test) do assert.is_nil(train[s], "a held-out question in training: " .. s) end
    assert.are.same(F.tasks("train", 5, 7), F.tasks("train", 5, 7))
    local rng, quick = rl.rng(3), 0
    for _ = 1, 2000 do
      local t = F.gen({ delay = 5, quick = 0.25 }, rng)
      if t.delay == 0 then quick = quick + 1 else assert.are.equal(5, t.delay) end
    end
    assert.is_true(quick > 400 and quick < 600, "quick " .. quick)
    -- the same questions with another delay: only the delay differs
    local a, b = F.gen({ delay = 5, quick = 0.25 }, rl.rng(8)), F.gen({ delay = 0 }, rl.rng(8))
    a.delay, b.delay = nil, nil
    assert.are.same(a, b)
  end)

  it("has an imperfect oracle (blog first, one look often, overconfident) well below solve", function()
    local tasks = F.tasks("test", 1500, 3)
    local function brier(fn)
      local sum, blog_first = 0, 0
      for i, t in ipairs(tasks) do
        local actions = fn(t, rl.rng(i))
        if actions[1] == "look blog" then blog_first = blog_first + 1 end
        local rec = play(t, actions)
        local p = rec[#rec].info.p
        sum = sum + (p - t.q) ^ 2 + t.q * (1 - t.q) -- in expectation over the toss
      end
      return sum / #tasks, blog_first / #tasks
    end
    local b_oracle, blog = brier(F.oracle)
    local b_solve = brier(F.solve)
    local b_half = brier(function() return { "p 5" } end)
    assert.is_true(blog > 0.35 and blog < 0.45, "blog first " .. blog)
    assert.is_true(b_solve < b_oracle - 0.04, b_solve .. " vs " .. b_oracle)
    assert.is_true(b_solve < b_half - 0.06)
  end)
end)

describe("recipes/forecast.lua", function()
  local function recipe_ok(options)
    local dir = H.tmpdir()
    local out, code = H.run(table.concat({ H.shell_quote(H.moonrl), "run",
      H.shell_quote(H.root .. "/recipes/forecast.lua"), options, "--dir", H.shell_quote(dir) }, " "))
    assert.are.equal(0, code, out)
    return out, dir
  end

  it("runs the three FutureWorld arms on a tiny budget, logs the delayed metrics and prints its table", function()
    local out, dir = recipe_ok("--smoke")
    assert.matches("%(measured: [%d.]+ s per RL step", out)
    assert.matches("\narm +acc%% +Brier +ECE +Brier@1 +Brier@2 +wire%% +poll%% +blog%% +s/step\n", out)
    for _, arm in ipairs { "immediate", "backfill", "discard", "SFT", "oracle", "perfect" } do
      assert.matches("\n" .. arm .. " +[%d.]+ +[%d.]+ +[%d.]+ ", out)
    end
    assert.matches("in all%)\n$", out)
    local lines = H.read_json_lines(dir .. "/forecast-backfill-s1/metrics.jsonl")
    assert.are.equal(5, #lines) -- step 0 and four RL steps
    local held, resolved = 0, 0
    for i = 2, 5 do
      held, resolved = held + lines[i]["delayed/held"], resolved + lines[i]["delayed/resolved"]
      assert.is_number(lines[i]["delayed/pending"])
    end
    assert.is_true(held > 0 and resolved > 0)
    lines = H.read_json_lines(dir .. "/forecast-discard-s1/metrics.jsonl")
    assert.are.equal(lines[2]["delayed/held"], lines[2]["delayed/discarded"])
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)

  it("runs the PER comparison with --per", function()
    local out, dir = recipe_ok("--smoke --per")
    for _, arm in ipairs { "onpolicy", "per", "freshper" } do
      assert.matches("\n" .. arm .. " +[%d.]+ +[%d.]+ +[%d.]+ ", out)
    end
    local lines = H.read_json_lines(dir .. "/forecast-freshper-s1/metrics.jsonl")
    assert.is_number(lines[5]["replay/sampled"])
    H.sh("rm -rf " .. H.shell_quote(dir))
    local _, code = H.run(table.concat({ H.shell_quote(H.moonrl), "run",
      H.shell_quote(H.root .. "/recipes/forecast.lua"), "--per --arms backfill" }, " "))
    assert.are_not.equal(0, code)
  end)
end)
