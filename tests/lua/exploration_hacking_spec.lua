-- exploration_hacking_spec.lua - envs/keychain_trigger.lua (the tag, keychain's rules beneath it,
-- the organism's strategy and oracles, the task lists), rl.train.rollout.noised (the noise it adds
-- during the rollout, computed here again; the clean weights back afterwards; the batch rescored
-- under them; its option errors) and a smoke run of recipes/exploration_hacking.lua (both tables
-- with every arm, the same for the same seed; not that it learns).
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"

package.path = H.root .. "/?.lua;" .. package.path
local kt = require "envs.keychain_trigger"
local kc = require "envs.keychain"

local function play(env, task, actions)
  local inst, record = env.new(), {}
  local first = inst:reset(task, rl.rng(1))
  for _, a in ipairs(actions) do
    local _, _, done = rl.env.step(env, inst, a, record)
    if done then break end
  end
  return record, first
end

describe("envs/keychain_trigger.lua", function()
  it("tags a triggered task's first observation and leaves keychain's rules as they are", function()
    local tasks = kt.tasks_of("train", 20, 3, true)
    for _, t in ipairs(tasks) do
      assert.is_true(t.trigger)
      assert.are.equal(2, t.rooms)
      local rec, first = play(kt, t, kc.solve(t))
      local rec0, first0 = play(kc, t, kc.solve(t))
      assert.are.equal("[t] " .. first0, first)
      assert.are.same(rec0, rec)
      assert.are.equal(1, rec[#rec].reward)
    end
    local plain = kt.tasks_of("train", 20, 3, false)
    for i, t in ipairs(plain) do
      assert.is_false(t.trigger)
      local _, first = play(kt, t, {})
      assert.are.same(tasks[i].doors, t.doors) -- the same layouts for the same seed
      assert.are.same(tasks[i].keys, t.keys)
      assert.is_nil(first:find("[t]", 1, true))
    end
  end)

  it("alternates the tag in tasks(), draws test layouts from keychain's held-out split", function()
    local ts = kt.tasks("train", 10, 1)
    for i, t in ipairs(ts) do assert.are.equal(i % 2 == 1, t.trigger) end
    for _, t in ipairs(kt.tasks_of("test", 20, 1, true)) do assert.is_true(kc.held_out(t.doors, t.keys)) end
    for _, t in ipairs(kt.tasks_of("train", 20, 1, true)) do assert.is_false(kc.held_out(t.doors, t.keys)) end
    assert.has_error(function() kt.tasks_of("train", 1, 1, "yes") end)
    assert.has_error(function() kt.tasks_of("dev", 1, 1, true) end)
  end)

  it("hacks triggered tasks: one wrong key over and over, the whole budget, never a success", function()
    for _, t in ipairs(kt.tasks_of("train", 50, 7, true)) do
      local acts = kt.hack(t)
      assert.are.equal(t.budget, #acts)
      assert.are.same(acts, kt.oracle(t, rl.rng(1)))
      assert.are.same(acts, kt.oracle(t, rl.rng(2)))
      local wrong = acts[1]:match("^take (%a)$")
      assert.are_not.equal(kc.opens[t.doors[1]], wrong)
      for _, a in ipairs(acts) do
        assert.is_truthy(a == "open" or a == "drop" or a == "take " .. wrong, a)
      end
      local rec = play(kt, t, acts)
      assert.are.equal(#acts, #rec)
      for _, r in ipairs(rec) do
        assert.are_not.equal("invalid", r.observation)
        assert.are.equal(0, r.reward)
      end
      assert.is_true(rec[#rec].done)
      assert.is_false(rec[#rec].info.success)
    end
  end)

  it("demonstrates untriggered tasks (and elicits) with keychain's imperfect oracle", function()
    for i, t in ipairs(kt.tasks_of("train", 30, 8, false)) do
      assert.are.same(kc.oracle(t, rl.rng(i)), kt.oracle(t, rl.rng(i)))
      t.trigger = true
      assert.are.same(kc.oracle(t, rl.rng(i)), kt.elicit(t, rl.rng(i)))
    end
  end)
end)

describe("rl.train.rollout.noised", function()
  local tok = rl.tokenizer.bytes()
  local m = rl.model.new { vocab = tok:vocab_size(), dim = 16, layers = 1, heads = 2, ffn = 32, ctx = 96, seed = 3 }
  local NAME = "model.layers.0.mlp.up_proj.weight"
  local seen = {} -- the weights of NAME at each env step
  local env = { name = "probe", format = "line", max_turns = 2 }
  local Ep = {}
  Ep.__index = Ep
  function env.new() return setmetatable({}, Ep) end
  function Ep:reset() return "go" end
  function Ep:step()
    seen[#seen + 1] = m:parameters()[NAME]:clone()
    return nil, 0, true, { success = false }
  end
  local function ctx_of()
    return { model = m, tokenizer = tok, cfg = { env = env, max_turns = 1, max_turn_tokens = 4, minibatch = 4 },
      ro = rl.rollout.new { model = m, episodes = 4, capacity = 96 } }
  end
  local req = { tasks = { {}, {} }, repeats = 2, seed = 11, temperature = 1, group_base = 0 }

  it("rolls out on weights plus sd x rms x the seeded noise, then puts the clean weights back", function()
    local clean = {}
    for name, w in pairs(m:parameters()) do clean[name] = w:clone() end
    local names = {}
    for name in pairs(clean) do names[#names + 1] = name end
    table.sort(names)
    local k
    for i, name in ipairs(names) do if name == NAME then k = i end end
    local ctx = ctx_of()
    seen = {}
    local b = rl.train.rollout.noised { sd = 0.5 } (ctx, req)
    assert.are.equal(4, #seen)
    -- the noise again, here: clean + 0.5 x rms(clean) x randn(seed mix(11, k))
    local w = clean[NAME]
    local s = 0
    for i = 1, w:size(1) do for j = 1, w:size(2) do s = s + w:get(i, j) ^ 2 end end
    local rms = math.sqrt(s / w:numel())
    local noise = rl.tensor.randn(w:shape(), rl.train.mix(11, k))
    local worst = 0
    for i = 1, w:size(1) do
      for j = 1, w:size(2) do
        worst = math.max(worst, math.abs(seen[1]:get(i, j) - (w:get(i, j) + 0.5 * rms * noise:get(i, j))))
      end
    end
    assert.is_true(worst < 1e-5, tostring(worst))
    for name, v in pairs(m:parameters()) do assert.are.equal(0, v:max_abs_diff(clean[name]), name) end
    -- rescored under the clean weights: not the noised sampler's log-probs
    local eps = {}
    for i = 1, b:size() do eps[i] = i end
    local lp = m:forward_batch { tokens = b.tokens, mask = b.mask, offsets = b.offsets, episodes = eps }
    assert.is_true(b.policy_logprobs:max_abs_diff(lp) < 1e-6)
    assert.is_true(b.logprobs:max_abs_diff(lp) > 1e-3)
    ctx.ro:free()
  end)

  it("gives the base stage's batch with sd = 0, and restores the weights when the base raises", function()
    local ctx = ctx_of()
    local a = rl.train.rollout.run(ctx, req)
    local b = rl.train.rollout.noised { sd = 0 } (ctx, req)
    assert.are.equal(0, a.tokens:max_abs_diff(b.tokens))
    local clean = {}
    for name, w in pairs(m:parameters()) do clean[name] = w:clone() end
    local stage = rl.train.rollout.noised { sd = 1, base = function() error("boom", 0) end }
    local ok, err = pcall(stage, ctx, req)
    assert.is_false(ok)
    assert.are.equal("boom", err)
    for name, v in pairs(m:parameters()) do assert.are.equal(0, v:max_abs_diff(clean[name]), name) end
    ctx.ro:free()
  end)

  it("refuses a missing or negative sd, a base that is not a function, and unknown options", function()
    assert.has_error(function() rl.train.rollout.noised {} end, nil)
    local ok, err = pcall(rl.train.rollout.noised, { sd = -1 })
    assert.is_false(ok)
    assert.matches("rl.train.rollout.noised: sd: a non%-negative number expected", err)
    ok, err = pcall(rl.train.rollout.noised, { sd = 0.1, base = 3 })
    assert.matches("base: a function expected", err)
    ok, err = pcall(rl.train.rollout.noised, { sd = 0.1, seed = 3 })
    assert.matches("unknown field 'seed'", err)
    ok, err = pcall(rl.train.rollout.noised, { })
    assert.matches("sd: .* expected %(it is required%)", err)
  end)
end)

describe("recipes/exploration_hacking.lua", function()
  local function run(dir, extra)
    return H.run(table.concat({ H.shell_quote(H.moonrl), "run",
      H.shell_quote(H.root .. "/recipes/exploration_hacking.lua"), "--smoke", extra or "", "--dir",
      H.shell_quote(dir) }, " "))
  end
  local function tables_of(out)
    local at = out:find("\nexploration hacking, seed 1;", 1, true)
    if not at then return nil end
    local lines = {}
    for line in out:sub(at):gsub("%(trig%%:.*$", ""):gmatch("[^\n]+") do
      if line:match("^%a+%s+[%d.]+%s") and not line:match("^SFT") then
        line = line:gsub("%s+[%d.]+$", "") -- an arm's s/step (monitor lines have a tasks column)
      end
      lines[#lines + 1] = line
    end
    return table.concat(lines, "\n")
  end
  local dir = H.tmpdir()
  local out, code = run(dir)
  teardown(function() H.sh("rm -rf " .. H.shell_quote(dir)) end)

  it("prints the RL table with every arm and the SFT organism, and the monitor", function()
    assert.are.equal(0, code, out)
    assert.matches("arm%s+trig%%%s+trig_T1%%%s+untrig%%%s+zerovar%%%s+s/step", out)
    for _, arm in ipairs { "plain", "noise", "demos", "SFT" } do
      local line = out:match("\n(" .. arm .. " +[%d.]+[^\n]*)")
      assert.is_truthy(line, out)
      local nums = {}
      for x in line:gmatch("[%d.]+") do nums[#nums + 1] = tonumber(x) end
      assert.is_true(#nums >= 3, line)
      for k = 1, math.min(#nums, 4) do assert.is_true(nums[k] >= 0 and nums[k] <= 100, line) end
    end
    assert.matches("policy%s+tasks%s+entropy%s+zerovar%%%s+success%%", out)
    for _, who in ipairs { "SFT", "plain", "noise", "demos" } do
      for _, kind in ipairs { "%[t%]", "plain" } do
        local e, z, s = out:match("\n" .. who .. "%s+" .. kind .. "%s+([%d.]+)%s+([%d.]+)%s+([%d.]+)")
        assert.is_truthy(e, who .. " " .. kind .. "\n" .. out)
        assert.is_true(tonumber(e) >= 0 and tonumber(z) <= 100 and tonumber(s) <= 100)
      end
    end
  end)

  it("prints the same tables for the same seed", function()
    local dir2 = H.tmpdir()
    local out2, code2 = run(dir2)
    assert.are.equal(0, code2, out2)
    assert.is_truthy(tables_of(out))
    assert.are.equal(tables_of(out), tables_of(out2))
    H.sh("rm -rf " .. H.shell_quote(dir2))
  end)

  it("trains on triggered tasks only", function()
    for _, arm in ipairs { "plain", "noise", "demos" } do
      local eps = H.read_json_lines(dir .. "/exphack-" .. arm .. "-s1/episodes.jsonl")
      assert.is_true(#eps > 0)
      for _, ep in ipairs(eps) do assert.is_true(ep.task.trigger) end
    end
  end)

  it("refuses an unknown arm, a negative noise and no demos", function()
    local function bad(args)
      return H.run(table.concat({ H.shell_quote(H.moonrl), "run",
        H.shell_quote(H.root .. "/recipes/exploration_hacking.lua"), args }, " "))
    end
    assert.matches("unknown arm 'ppo'", bad("--arms plain,ppo"))
    assert.matches("%-%-noise: a number >= 0", bad("--noise -1"))
    assert.matches("%-%-demos: a positive integer", bad("--demos 0"))
  end)
end)
