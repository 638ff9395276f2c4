-- keychain_spec.lua - envs/keychain.lua (the rules its header states: locked doors, drop and
-- take, a milestone per door, the budget, the invalid-action penalty, the split, determinism,
-- the oracles' success rates, the macro and decompose variants) and a smoke run of
-- recipes/keychain.lua (it runs, logs and prints its table; not that it learns).
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"

local kc = dofile(H.root .. "/envs/keychain.lua")

-- Plays actions through the engine's step path; returns the records and the instance.
local play = H.play

local function task_key(t) return rl.json.encode { t.rooms, t.doors, t.keys } end

-- A wrong key of room r (one on the floor that does not open the door).
local function wrong_key(task, r)
  for _, k in ipairs(task.keys[r]) do
    if k ~= kc.opens[task.doors[r]] then return k end
  end
end

describe("envs/keychain.lua", function()
  local task = kc.gen({ rooms = 3 }, rl.rng(7))

  it("shows the room, its door and its keys in at most 24 bytes", function()
    local _, inst, first = play(kc, task, {})
    assert.are.equal(string.format("r1/3 d:%s k:%s", task.doors[1], table.concat(task.keys[1], " ")), first)
    assert.are.equal("1:-", inst:state_key())
    local long = kc.gen({ rooms = 12 }, rl.rng(1))
    local rec = play(kc, long, kc.solve(long))
    for _, r in ipairs(rec) do
      if r.observation then assert.is_true(#r.observation <= 24, r.observation) end
    end
  end)

  it("locks a wrong key; drop, then take the right one, opens the door: a milestone", function()
    local right, wrong = kc.opens[task.doors[1]], wrong_key(task, 1)
    local rec, inst = play(kc, task, { "take " .. wrong, "open", "drop", "take " .. right, "open" })
    assert.are.same({ "holding " .. wrong, "locked", "dropped", "holding " .. right },
      { rec[1].observation, rec[2].observation, rec[3].observation, rec[4].observation })
    assert.are.same({ "1:-", "1:" .. wrong, "1:" .. wrong, "1:-", "1:" .. right },
      { rec[1].state, rec[2].state, rec[3].state, rec[4].state, rec[5].state })
    for k = 1, 4 do
      assert.are.equal(0, rec[k].reward)
      assert.is_nil(rec[k].info.milestone)
    end
    assert.is_true(rec[5].info.milestone)
    assert.are.equal(string.format("open! r2/3 d:%s k:%s", task.doors[2], table.concat(task.keys[2], " ")),
      rec[5].observation)
    assert.are.equal("2:-", inst:state_key())
    -- the full name of a colour works too
    local names = { r = "red", g = "green", b = "blue", y = "yellow", p = "purple", o = "orange" }
    local rec2 = play(kc, task, { "take " .. names[right] })
    assert.are.equal("holding " .. right, rec2[1].observation)
  end)

  it("marks every opened door as a milestone and pays 1 only on leaving the last room", function()
    for _, K in ipairs { 2, 4, 6, 12 } do
      local t = kc.gen({ rooms = K }, rl.rng(K))
      local rec = play(kc, t, kc.solve(t))
      assert.are.equal(2 * K, #rec)
      local milestones, total = 0, 0
      for _, r in ipairs(rec) do
        milestones = milestones + (r.info.milestone and 1 or 0)
        total = total + r.reward
      end
      assert.are.equal(K, milestones)
      assert.are.equal(1, total)
      assert.is_true(rec[#rec].done and rec[#rec].info.success)
      assert.is_nil(rec[#rec].observation)
    end
  end)

  it("costs 0.1 for an invalid action and spends the turn", function()
    local right, wrong = kc.opens[task.doors[1]], wrong_key(task, 1)
    local bad = { "open", "drop", "take", "take x", "dance", "try " .. right, "open door" }
    for _, a in ipairs(bad) do
      local rec, inst = play(kc, task, { a })
      assert.are.equal(-0.1, rec[1].reward, a)
      assert.are.equal("invalid", rec[1].observation, a)
      assert.is_true(rec[1].info.invalid, a)
      assert.are.equal(1, inst.steps, a)
    end
    -- taking with a key in hand, and a key not on the floor, are invalid too
    local rec = play(kc, task, { "take " .. wrong, "take " .. right, "drop", "take " .. right, "take " .. right })
    assert.are.same({ 0, -0.1, 0, 0, -0.1 }, { rec[1].reward, rec[2].reward, rec[3].reward, rec[4].reward, rec[5].reward })
    local absent
    for _, c in ipairs(kc.colours) do
      local here = false
      for _, k in ipairs(task.keys[1]) do here = here or k == c end
      if not here then absent = c end
    end
    assert.are.equal(-0.1, play(kc, task, { "take " .. absent })[1].reward)
    assert.are.equal(0, play(kc, task, { "look" })[1].reward)
  end)

  it("ends the episode, unpaid, when the budget of 3K + 2 actions is spent", function()
    for _, K in ipairs { 2, 4, 6 } do
      local t = kc.gen({ rooms = K }, rl.rng(K))
      assert.are.equal(3 * K + 2, t.budget)
      assert.are.equal(t.budget, t.max_turns)
      local looks = {}
      for i = 1, 100 do looks[i] = "look" end
      local rec = play(kc, t, looks)
      assert.are.equal(3 * K + 2, #rec)
      assert.is_true(rec[#rec].done and rec[#rec].info.budget)
      assert.is_false(rec[#rec].info.success)
      for k = 1, #rec - 1 do assert.is_false(rec[k].done) end
    end
    -- the last door opened on the last action still counts
    local t = kc.gen({ rooms = 2 }, rl.rng(3))
    local acts = { "look", "look", "look", "look" }
    for _, a in ipairs(kc.solve(t)) do acts[#acts + 1] = a end
    local rec = play(kc, t, acts)
    assert.are.equal(8, #rec)
    assert.is_true(rec[8].info.success)
  end)

  it("keeps held-out layouts out of the training split and K = 12 out of training", function()
    local train = {}
    for _, t in ipairs(kc.tasks("train", 3000, 1)) do
      assert.is_false(kc.held_out(t.doors, t.keys))
      assert.is_true(t.rooms == 2 or t.rooms == 4 or t.rooms == 6)
      train[task_key(t)] = true
    end
    local test, twelve = kc.tasks("test", 400, 2), 0
    for _, t in ipairs(test) do
      assert.is_true(kc.held_out(t.doors, t.keys))
      assert.is_nil(train[task_key(t)])
      twelve = twelve + (t.rooms == 12 and 1 or 0)
    end
    assert.are.equal(100, twelve)
    assert.is_true(kc.held_out(kc.gen({ rooms = 12 }, rl.rng(9)).doors, kc.gen({ rooms = 12 }, rl.rng(9)).keys))
    -- every room holds the right key and two others, all different
    for _, t in ipairs(test) do
      for r = 1, t.rooms do
        local ks = t.keys[r]
        assert.are.equal(3, #ks)
        assert.is_true(ks[1] ~= ks[2] and ks[2] ~= ks[3] and ks[1] ~= ks[3])
        local has = false
        for _, k in ipairs(ks) do has = has or k == kc.opens[t.doors[r]] end
        assert.is_true(has)
      end
    end
  end)

  it("is deterministic from the seed", function()
    assert.are.same(kc.tasks("train", 50, 4), kc.tasks("train", 50, 4))
    assert.are_not.same(kc.tasks("train", 50, 4), kc.tasks("train", 50, 5))
    local t = kc.gen({ rooms = 6 }, rl.rng(2))
    assert.are.same(kc.oracle(t, rl.rng(11)), kc.oracle(t, rl.rng(11)))
    local a = play(kc, t, kc.oracle(t, rl.rng(11)))
    local b = play(kc, t, kc.oracle(t, rl.rng(11)))
    for k = 1, #a do assert.are.same({ a[k].observation, a[k].reward }, { b[k].observation, b[k].reward }) end
  end)

  it("has an SFT oracle that knows two doors' keys (first key right 56% of the time) and a perfect one", function()
    local first_right, rooms, wins = 0, 0, { [2] = 0, [6] = 0 }
    local known_right, known_rooms = 0, 0
    local n = 600
    for _, K in ipairs { 2, 6 } do
      local rng = rl.rng(K)
      for i = 1, n do
        local t = kc.gen({ rooms = K }, rng)
        local acts = kc.oracle(t, rl.rng(i))
        local rec = play(kc, t, acts)
        wins[K] = wins[K] + (rec[#rec].info.success and 1 or 0)
        -- the first key taken in each room (the room changes once the right one is taken)
        local room, first = 1, true
        for _, a in ipairs(acts) do
          local c = a:match("^take (%l)$")
          if c then
            local right = c == kc.opens[t.doors[room]]
            if first then rooms, first_right = rooms + 1, first_right + (right and 1 or 0) end
            if first and kc.oracle_knows[t.doors[room]] then
              known_rooms, known_right = known_rooms + 1, known_right + (right and 1 or 0)
            end
            first = right
            if right then room = room + 1 end
          end
        end
        assert.is_true(play(kc, t, kc.solve(t))[2 * K].info.success)
      end
    end
    local p = first_right / rooms
    assert.is_true(p > 0.51 and p < 0.60, tostring(p)) -- 1/3 + 2/3 x 1/3 = 0.556
    assert.is_true(known_right == known_rooms and known_rooms > 100)
    -- its success falls with K as the budget runs out (measured: 57% at K = 2, 23% at K = 6)
    assert.is_true(wins[2] / n > 0.48 and wins[2] / n < 0.66, tostring(wins[2] / n))
    assert.is_true(wins[6] / n > 0.16 and wins[6] / n < 0.30, tostring(wins[6] / n))
  end)

  it("clones an episode into an independent copy", function()
    local t = kc.gen({ rooms = 2 }, rl.rng(5))
    local _, inst = play(kc, t, { "take " .. wrong_key(t, 1) })
    local copy = inst:clone()
    inst:step("drop")
    assert.are.equal("1:" .. wrong_key(t, 1), copy:state_key())
    assert.are.equal("1:-", inst:state_key())
    assert.are.equal(3, #inst.floor)
    assert.are.equal(2, #copy.floor)
  end)
end)

describe("envs/keychain.lua variants", function()
  it("macro: try <c> takes and opens in one action, the budget halved", function()
    local mk = kc.variant { macro = true }
    assert.are.equal("keychain-macro", mk.name)
    local t = mk.gen({ rooms = 4 }, rl.rng(3))
    assert.is_true(t.macro)
    assert.are.equal(7, t.budget) -- ceil((3 * 4 + 2) / 2)
    local sol = mk.solve(t)
    assert.are.equal(4, #sol)
    assert.matches("^try %l$", sol[1])
    local rec = play(mk, t, sol)
    assert.are.equal(4, #rec)
    assert.is_true(rec[4].info.success)
    for _, r in ipairs(rec) do assert.is_true(r.info.milestone) end
    -- a wrong try leaves the key in hand; the next try drops it first
    local wrong, right = wrong_key(t, 1), kc.opens[t.doors[1]]
    local rec2, inst = play(mk, t, { "try " .. wrong, "try " .. right })
    assert.are.equal("locked", rec2[1].observation)
    assert.are.equal("1:" .. wrong, rec2[2].state)
    assert.is_true(rec2[2].info.milestone)
    assert.are.equal("2:-", inst:state_key())
    -- the primitives still work, and a colour that is not there is invalid
    assert.are.equal("holding " .. right, play(mk, t, { "take " .. right })[1].observation)
    assert.are.equal(-0.1, play(mk, t, { "try x" })[1].reward)
    -- its oracle plays tries only
    for _, a in ipairs(mk.oracle(t, rl.rng(1))) do assert.matches("^try %l$", a) end
  end)

  it("decompose: training tasks start with 1 or 2 rooms to go, held-out ones in room 1", function()
    local dk = kc.variant { decompose = true }
    local togo = {}
    for _, t in ipairs(dk.tasks("train", 300, 1)) do
      local left = t.rooms - t.start + 1
      assert.is_true(left == 1 or left == 2)
      togo[left] = true
      assert.are.equal(3 * left + 2, t.budget)
      local rec, _, first = play(dk, t, dk.solve(t))
      assert.are.equal(string.format("r%d/%d", t.start, t.rooms), first:match("^(r%d+/%d+)"))
      assert.are.equal(2 * left, #rec)
      assert.is_true(rec[#rec].info.success)
    end
    assert.is_true(togo[1] and togo[2])
    for _, t in ipairs(dk.tasks("test", 40, 2)) do assert.are.equal(1, t.start) end
  end)

  it("constant_context: a state block of room, door, floor and tried keys before every observation; 0.1 a door", function()
    local cc = kc.variant { constant_context = true }
    assert.are.equal("keychain-cc", cc.name)
    for _, t in ipairs(cc.tasks("train", 30, 4)) do
      -- the partly-knowing oracle tries wrong keys: the block must list them until the door opens
      local inst, record = cc.new(), {}
      local obs = inst:reset(t, rl.rng(1))
      local tried, ret, opened = {}, 0, 0
      for _, a in ipairs(kc.oracle(t, rl.rng(rl.train.mix(4, t.rooms)))) do
        local held = inst.held
        local next_obs, r, done = rl.env.step(cc, inst, a, record)
        ret = ret + r
        if done then break end
        local room = inst.room
        if record[#record].info.subgoal then
          opened, tried = opened + 1, {}
          assert.are.equal(0.1, r)
        elseif next_obs:find("] locked$") then
          tried[#tried + 1] = held
        end
        local floor = table.concat(inst.floor)
        local want = string.format("[r=%d/%d d=%s%s%s] ", room, t.rooms, t.doors[room],
          floor ~= "" and " k=" .. floor or "", #tried > 0 and " tried=" .. table.concat(tried, ",") or "")
        assert.are.equal(want, next_obs:sub(1, #want), next_obs)
        obs = next_obs
      end
      assert.is_string(obs)
      local last = record[#record]
      if last.info.success then
        assert.are.equal(t.rooms - 1, opened)
        assert.is_true(math.abs(ret - (1 + 0.1 * (t.rooms - 1))) < 1e-9)
      end
      -- the plain observation follows the block: the same text as the plain environment's
      local _, _, first = play(kc, t, {})
      assert.are.equal(first, select(3, play(cc, t, {})):gsub("^%[[^%]]*%] ", ""), nil)
    end
    -- a clone keeps its own tracker
    local t = cc.tasks("train", 1, 9)[1]
    local inst = cc.new()
    inst:reset(t, rl.rng(1))
    local wrong = wrong_key(t, 1)
    rl.env.step(cc, inst, "take " .. wrong, {})
    local twin = inst:clone()
    local o1 = select(1, rl.env.step(cc, inst, "open", {}))
    assert.truthy(o1:find("tried=" .. wrong, 1, true))
    local o2 = select(1, rl.env.step(cc, twin, "look", {}))
    assert.falsy(o2:find("tried=", 1, true))
  end)

  it("refuses an unknown variant option", function()
    local ok, err = pcall(kc.variant, { macros = true })
    assert.is_false(ok)
    assert.matches("unknown field 'macros' %(did you mean 'macro'%?%)", err)
  end)
end)

describe("recipes/keychain.lua", function()
  -- Runs the recipe with the options given (a string); its output and exit code.
  local function recipe(options)
    return H.run(table.concat({ H.shell_quote(H.moonrl), "run", H.shell_quote(H.root .. "/recipes/keychain.lua"),
      options }, " "))
  end

  -- Runs it with its files in a new temporary folder and asserts it succeeded; the output and
  -- the folder (the caller removes it).
  local function recipe_ok(options)
    local dir = H.tmpdir()
    local out, code = recipe(options .. " --dir " .. H.shell_quote(dir))
    assert.are.equal(0, code, out)
    return out, dir
  end

  it("runs a few steps, logs utilisation and prints its table", function()
    local out, dir = recipe_ok("--steps 2 --tasks 2 --group 2 --sft-examples 24 --sft-epochs 1 --eval-tasks 4 "
      .. "--rooms 2,6 --methods beacon,grpo")
    assert.matches("\nmethod +K=2 +K=6 +K=12 +util2 +util6 +s/st2 +s/st6\n", out)
    for _, arm in ipairs { "beacon", "grpo", "SFT", "oracle", "perfect", "beacon%-grpo" } do
      assert.matches("\n" .. arm .. " +%-?[%d.]+ ", out)
    end
    assert.matches("\nfull +[%d.]+ +[%d.]+ ", out)
    assert.matches("\ncurriculum +[%d.]+ +[%d.]+ ", out)
    assert.matches("in all%)\n$", out)
    local f = assert(io.open(dir .. "/keychain-beacon-k6-s1/metrics.jsonl"))
    local lines = {}
    for line in f:lines() do lines[#lines + 1] = rl.json.decode(line) end
    f:close()
    assert.are.equal(3, #lines) -- step 0 and two RL steps
    assert.is_number(lines[3]["adv/utilisation"])
    assert.is_number(lines[3]["eval/k12"])
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)

  it("runs --seeds 2 and reports mean ± spread; refuses an unknown option", function()
    local out, dir = recipe_ok("--seeds 2 --steps 1 --tasks 2 --group 2 --sft-examples 8 --sft-epochs 1 "
      .. "--eval-tasks 2 --rooms 2 --methods grpo --horizon-arms none --eval12=false")
    assert.matches("keychain, seed 1;.*keychain, seed 2;.*keychain, seeds 1%-2 %(mean ± spread over 2%)", out)
    assert.matches("\nperfect +100%.0 ± 0%.0", out)
    assert.is_nil(out:find("horizon:", 1, true))
    local out2, code2 = recipe("--methds grpo")
    assert.are_not.equal(0, code2)
    assert.matches("keychain.lua: unknown option %-%-methds %(did you mean %-%-methods%?%)", out2)
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)
end)
