-- haggle_spec.lua - envs/haggle.lua (the opponent's rules: thresholds, early rapport, wants,
-- accepting, leaving, the turn limit, the score; the splits; the demonstrator and the ceiling),
-- SAVOIR's credit (coalition values of replaced utterances, sampled-permutation Shapley values
-- against the exact subset formula written here) and smoke runs of recipes/savoir.lua.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"

local Hg = dofile(H.root .. "/envs/haggle.lua")

-- Plays utterances through the engine's step path; returns the records.
local function play(task, actions)
  local inst, record = Hg.new(), {}
  inst:reset(task, rl.rng(1))
  for _, a in ipairs(actions) do
    local _, _, done = rl.env.step(Hg, inst, a, record)
    if done then break end
  end
  return record
end

local function obs(record)
  local out = {}
  for i, r in ipairs(record) do out[i] = r.observation end
  return out
end

local fair5 = { id = "f", type = "fair", base = 5 }

describe("envs/haggle.lua", function()
  it("deals when the opponent's share reaches its threshold, else states its want, which accept takes", function()
    local rec = play(fair5, { "offer 5" })
    assert.are.same({ "deal" }, obs(rec))
    assert.are.same({ coins = 5, deal = true, score = 6, rapport = 0, threshold = 5, kind = "offer" }, rec[1].info)
    assert.are.equal(6, rec[1].reward)
    rec = play(fair5, { "offer 8", "accept" })
    assert.are.same({ "no, i want 5", "deal" }, obs(rec))
    assert.are.equal(0, rec[1].reward)
    assert.are.equal(5 + 1, rec[2].reward)
    rec = play(fair5, { "accept", "ask why", "offer 6" })
    assert.are.same({ "no offer", "i need 5", "no, i want 5" }, obs(rec))
    for _, r in ipairs(play(fair5, { "say fair", "ask why", "offer 10", "hello", "ok" })) do
      assert.is_true(#(r.observation or "") <= 24)
    end
  end)

  it("lowers the threshold once per say fair in the first two turns only, never below 2", function()
    local rec = play(fair5, { "say fair", "say fair", "ask why" })
    assert.are.same({ "nice", "nice", "i need 3" }, obs(rec))
    rec = play(fair5, { "ask why", "say fair", "say fair", "ask why" })
    assert.are.same({ "i need 5", "nice", "nice", "i need 4" }, obs(rec))
    rec = play({ type = "anxious", base = 3 }, { "say fair", "say fair", "offer 8" })
    assert.are.equal("deal", rec[3].observation)
    assert.are.equal(2, rec[3].info.threshold)
    assert.are.equal(9, rec[3].reward)
  end)

  it("ends without a deal on walk, an anxious opponent offered under 2, or the fifth turn; score -1", function()
    local rec = play(fair5, { "walk" })
    assert.are.same({ "bye" }, obs(rec))
    assert.are.equal(-1, rec[1].reward)
    assert.is_false(rec[1].info.deal)
    rec = play({ type = "anxious", base = 4 }, { "offer 9" })
    assert.are.same({ "bye" }, obs(rec))
    assert.are.equal(-1, rec[1].reward)
    rec = play({ type = "greedy", base = 7 }, { "offer 9" }) -- a greedy one only counters
    assert.are.same({ "no, i want 7" }, obs(rec))
    rec = play(fair5, { "ok", "what", "offer 9", "say fair", "ok", "offer 5" })
    assert.are.equal(5, #rec)
    assert.is_true(rec[5].done)
    assert.are.equal(-1, rec[5].reward)
    assert.are.same({ "ok", "bad", "offer", "fair", "ok" }, { rec[1].info.kind, rec[2].info.kind, rec[3].info.kind,
      rec[4].info.kind, rec[5].info.kind })
    local inst = Hg.new()
    inst:reset(fair5)
    inst:step("walk")
    assert.has_error(function() inst:step("ok") end)
  end)

  it("holds out the middle base of each type, draws tasks deterministically, clones independently", function()
    for _, t in ipairs(Hg.tasks("test", 60, 1)) do assert.is_true(Hg.held_out(t.type, t.base)) end
    local seen = {}
    for _, t in ipairs(Hg.tasks("train", 300, 2)) do
      assert.is_false(Hg.held_out(t.type, t.base))
      seen[t.type .. t.base] = true
    end
    local n = 0
    for _ in pairs(seen) do n = n + 1 end
    assert.are.equal(6, n)
    assert.are.same(Hg.tasks("train", 5, 3), Hg.tasks("train", 5, 3))
    local a = Hg.new()
    a:reset(fair5)
    a:step("say fair")
    local b = a:clone()
    b:step("say fair")
    assert.are.equal("i need 4", (a:step("ask why")))
    assert.are.equal("i need 3", (b:step("ask why")))
  end)

  it("has an imperfect demonstrator (rapport first about a quarter of the time) below the ceiling", function()
    local tasks = Hg.tasks("train", 800, 4)
    local sum, first, best = 0, 0, 0
    for i, t in ipairs(tasks) do
      local acts = Hg.oracle(t, rl.rng(i))
      if acts[1] == "say fair" then first = first + 1 end
      local rec = play(t, acts)
      assert.is_true(rec[#rec].done)
      sum = sum + rec[#rec].reward
      local srec = play(t, Hg.solve(t))
      assert.are.equal(10 - math.max(2, t.base - 2) + 1, srec[#srec].reward)
      best = best + srec[#srec].reward
    end
    first = first / #tasks
    assert.is_true(first > 0.2 and first < 0.3, first)
    assert.is_true(sum / #tasks < best / #tasks - 1.5, sum / #tasks .. " vs " .. best / #tasks)
  end)
end)

-- The exact Shapley values of an n-player game v(set) by the subset formula
-- phi_i = sum over S without i of |S|! (n - |S| - 1)! / n! (v(S + i) - v(S)).
local function exact_shapley(n, v)
  local fact = { [0] = 1 }
  for i = 1, n do fact[i] = fact[i - 1] * i end
  local phi = {}
  for i = 1, n do
    phi[i] = 0
    for mask = 0, (1 << n) - 1 do
      if mask & (1 << (i - 1)) == 0 then
        local S, size = {}, 0
        for j = 1, n do
          if mask & (1 << (j - 1)) ~= 0 then S[j], size = true, size + 1 end
        end
        local with = {}
        for j in pairs(S) do with[j] = true end
        with[i] = true
        phi[i] = phi[i] + fact[size] * fact[n - size - 1] / fact[n] * (v(with) - v(S))
      end
    end
  end
  return phi
end

describe("SAVOIR's credit in envs/haggle.lua", function()
  local function game(members) -- a 3-player game with synergy between 1 and 2
    local a, b, c = members[1] and 1 or 0, members[2] and 1 or 0, members[3] and 1 or 0
    return 2 * a + b + 0.5 * c + 3 * a * b - a * c
  end

  it("gives sampled-permutation Shapley values with efficiency for any permutations, exact on additive games", function()
    local phi = Hg.shapley(3, game, 8, rl.rng(5))
    assert.is_true(math.abs(phi[1] + phi[2] + phi[3] - (game { true, true, true } - game {})) < 1e-12)
    local additive = function(m) return (m[1] and 4 or 0) + (m[2] and -1 or 0) + (m[3] and 0.25 or 0) end
    local pa = Hg.shapley(3, additive, 8, rl.rng(6))
    assert.is_true(math.abs(pa[1] - 4) < 1e-12 and math.abs(pa[2] + 1) < 1e-12 and math.abs(pa[3] - 0.25) < 1e-12)
    local asked = 0
    Hg.shapley(3, function(m) asked = asked + 1 return game(m) end, 8, rl.rng(7))
    assert.is_true(asked <= 8) -- once per distinct coalition
    assert.are.same(Hg.shapley(3, game, 8, rl.rng(9)), Hg.shapley(3, game, 8, rl.rng(9)))
  end)

  it("converges to the exact subset-formula values with many permutations", function()
    local exact = exact_shapley(3, game)
    assert.is_true(math.abs(exact[1] - (2 + 1.5 - 0.5)) < 1e-12) -- 2 + half of 3ab - half of ac
    local phi = Hg.shapley(3, game, 20000, rl.rng(11))
    for i = 1, 3 do assert.is_true(math.abs(phi[i] - exact[i]) < 0.03, i .. ": " .. phi[i] .. " vs " .. exact[i]) end
  end)

  it("values coalitions by replacing absent utterances with ok and finishing with the default policy", function()
    local u = { "say fair", "offer 6" }
    local opts = { seed = 3, continuations = 4 }
    -- both: rapport (threshold 4), then 6 coins: score 7, no continuation
    assert.are.equal(7, Hg.coalition_value(fair5, u, { true, true }, opts))
    -- without the rapport: ok, "offer 6" is countered with want 5; the default finish deals 5 coins
    assert.are.equal(6, Hg.coalition_value(fair5, u, { [2] = true }, opts))
    local v1 = Hg.coalition_value(fair5, u, { true }, opts)
    assert.is_true(v1 >= 6 and v1 <= 7, v1) -- after the rapport any default finish deals 5 or 6 coins
    local phi, all, none = Hg.shapley_credit(fair5, u, { seed = 3 })
    assert.are.equal(7, all)
    assert.are.equal(Hg.coalition_value(fair5, u, {}, { seed = 3 }), none)
    assert.is_true(math.abs(phi[1] + phi[2] - (all - none)) < 1e-12)
    -- three utterances: the sampled values approach the exact ones computed from the same v
    local u3 = { "say fair", "offer 9", "accept" }
    local exact = exact_shapley(3, function(m) return Hg.coalition_value(fair5, u3, m, opts) end)
    local many = Hg.shapley_credit(fair5, u3, { seed = 3, permutations = 4000 })
    for i = 1, 3 do assert.is_true(math.abs(many[i] - exact[i]) < 0.05, i) end
    assert.is_true(exact[1] > 0.5) -- the early rapport is worth a coin later
  end)
end)

describe("recipes/savoir.lua", function()
  local function run(options, dir)
    return H.run(table.concat({ H.shell_quote(H.moonrl), "run", H.shell_quote(H.root .. "/recipes/savoir.lua"),
      options, "--dir", H.shell_quote(dir) }, " "))
  end

  it("runs the four arms on a tiny budget, prints its table, the same twice", function()
    local dir = H.tmpdir()
    local out, code = run("--smoke", dir)
    assert.are.equal(0, code, out)
    assert.matches("%(measured: [%d.]+ s per RL step", out)
    assert.matches("\narm +greedy +score@1 +score +coins +deal%% +rapport%% +s/step\n", out)
    for _, arm in ipairs { "grpo", "uniform", "last", "savoir", "SFT" } do
      local line = out:match("\n(" .. arm .. " [^\n]*)")
      assert.is_truthy(line, arm)
      local f = {}
      for w in line:gmatch("%S+") do f[#f + 1] = w end
      assert.are.equal(8, #f, line)
      local g, s1, s, c, d, r = tonumber(f[2]), tonumber(f[3]), tonumber(f[4]), tonumber(f[5]), tonumber(f[6]),
        tonumber(f[7])
      assert.is_true(g >= -1 and g <= 11 and s >= -1 and s <= 11 and c >= 0 and c <= 10, line)
      assert.is_true(d >= 0 and d <= 100 and r >= 0 and r <= 100, line)
      if arm == "SFT" then assert.are.equal("-", f[3]) else assert.is_true(s1 >= -1 and s1 <= 11, line) end
    end
    assert.matches("\nsolve +[%d.]+ ", out)
    local lines = H.read_json_lines(dir .. "/savoir-savoir-s1/metrics.jsonl")
    assert.are.equal(3, #lines) -- step 0 and two RL steps
    local function table_of(text)
      return (text:match("\n(haggle, seed 1.-)\n%(greedy"):gsub(" +[%d.]+\n", "\n"))
    end
    local out2, code2 = run("--smoke", dir)
    assert.are.equal(0, code2, out2)
    assert.are.equal(table_of(out), table_of(out2))
    local _, bad = run("--smoke --arms grpo,shap", dir)
    assert.are_not.equal(0, bad)
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)
end)
