-- rulebook_spec.lua - envs/rulebook.lua (the door rule against a direct computation, try/no
-- turns, the oracles' reading of skills and raw memory, exploration's success rate, the repo
-- operations and their bad inputs, the splits) and a smoke run of recipes/skills.lua (its table
-- and arms, numbers in range, the same table twice; not that the curator learns).
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"

local B = dofile(H.root .. "/envs/rulebook.lua")
local C = B.curator

local function play(task, actions)
  local record, _, first = H.play(B, task, actions)
  return record, first
end

describe("envs/rulebook.lua", function()
  it("opens the door at the door letter plus the family's shift, mod 16, and says no otherwise", function()
    local shifts = { 1, 3, 4, 6, 9, 10, 12, 15 }
    for rule = 1, 8 do
      for door = 0, 15 do
        local code = string.char(97 + (door + shifts[rule]) % 16)
        local record, first = play(B.task(rule, door), { "try " .. code })
        assert.are.equal("door " .. string.char(97 + door), first)
        assert.is_true(record[1].done and record[1].reward == 1 and record[1].info.success)
      end
    end
    local record = play(B.task(2, 0), { "try a", "open d", "try d" })
    assert.are.equal("no", record[1].observation)
    assert.are.equal("say try x", record[2].observation)
    assert.are.equal(0, record[1].reward + record[2].reward)
    assert.is_true(record[3].info.success)
  end)

  it("puts one skill line per repo entry and the raw memory in the prompt", function()
    local _, first = play(B.task(1, 2, { "+4", "k" }, "c>d!"), {})
    assert.are.equal("skill: +4\nskill: k\nlast: c>d!\ndoor c", first)
  end)

  it("has an oracle that follows the right skill at once, wrong ones first, and explores without", function()
    local t = B.task(3, 5, { B.skill(3) })
    local acts = B.oracle(t, rl.rng(1))
    assert.are.equal("try j", acts[1]) -- 5 + 4 = 9 -> j
    acts = B.oracle(B.task(3, 5, { "+1", "b", "+4" }), rl.rng(1))
    assert.are.same({ "try g", "try b", "try j" }, { acts[1], acts[2], acts[3] })
    acts = B.oracle(B.task(3, 5, {}, "a>cde!"), rl.rng(1))
    assert.are.equal("try e", acts[1])
    -- exploring: 8 distinct letters of 16 (a on), so it opens the door half of the time
    local wins, n = 0, 2000
    for i = 1, n do
      local task = B.task(1 + i % 8, i % 16)
      local a = B.oracle(task, rl.rng(i))
      local seen = {}
      for _, x in ipairs(a) do assert.is_nil(seen[x]); seen[x] = true end
      local record = play(task, a)
      if record[#record].info.success then wins = wins + 1 end
    end
    assert.is_true(math.abs(wins / n - 0.5) < 0.04, "explore success " .. wins / n)
  end)

  it("applies add, upd, del and none to a copy of the repo, and refuses what does not fit", function()
    local repo = { "+1" }
    assert.are.same({ "+1", "+3" }, B.apply(repo, "add +3"))
    assert.are.same({ "k" }, B.apply(repo, "upd 1 k"))
    assert.are.same({}, B.apply(repo, "del 1"))
    assert.are.same({ "+1" }, B.apply(repo, " none "))
    assert.are.same({ "+1" }, repo)
    for _, bad in ipairs { "add", "upd 2 k", "del 0", "del 2", "drop 1", "add " .. ("x"):rep(17), "" } do
      local new, why = B.apply(repo, bad)
      assert.is_nil(new, bad)
      assert.is_string(why)
    end
    local _, why = B.apply({ "a", "b", "c", "d" }, "add e")
    assert.are.equal("repo full", why)
    local _, w2 = B.apply(repo, 7)
    assert.are.equal("not an operation", w2)
    H.assert_error(function() B.apply(nil, "none") end, "repo")
  end)

  it("has a curator prompt and an oracle that adds the rule a success implies", function()
    local task = { repo = { "+1" }, traj = B.trajectory(2, { "a", "h" }, true) }
    assert.are.equal("r:+1\nc>ah!", C.prompt(task))
    local right = 0
    for i = 1, 400 do
      local op = C.oracle(task, rl.rng(i))[1]
      assert.is_not_nil(B.apply(task.repo, op), op)
      if op == "add +5" then right = right + 1 end -- h - c = 7 - 2
    end
    assert.is_true(right > 220 and right < 300, right)
    assert.are.same({ "none" }, C.oracle({ repo = { "+5" }, traj = "c>ah!" }, rl.rng(1)))
    assert.are.same({ "del 1" }, C.oracle({ repo = { "+9" }, traj = "c>abcdefgh." }, rl.rng(1)))
    local inst = C.new()
    inst:reset(task)
    local _, r, done, info = inst:step("del 3")
    assert.is_true(done and r == 0 and not info.success)
  end)

  it("draws streams of one rule and four doors, disjoint splits, the held-out families apart", function()
    local a, b = B.streams("train", 50, 1, B.TRAIN_FAMILIES), B.streams("train", 50, 1, B.TRAIN_FAMILIES)
    assert.are.same(a, b)
    local test = B.streams("test", 50, 1, B.TRAIN_FAMILIES)
    assert.are_not.same(a, test)
    for _, s in ipairs(a) do
      assert.is_true(s.rule <= 6)
      assert.are.equal(4, #s.doors)
    end
    for _, s in ipairs(B.streams("test", 50, 1, B.HELD_FAMILIES)) do assert.is_true(s.rule >= 7) end
    H.assert_error(function() B.streams("dev", 1, 1) end, "split")
    H.assert_error(function() B.streams("train", -1, 1) end, "n")
    H.assert_error(function() B.streams("train", 1, 1, { 9 }) end, "families")
    H.assert_error(function() B.tasks("dev", 1, 1) end, "split")
  end)
end)

describe("recipes/skills.lua", function()
  local function smoke(dir)
    local out, code = H.run(table.concat({ H.shell_quote(H.moonrl), "run",
      H.shell_quote(H.root .. "/recipes/skills.lua"), "--smoke", "--dir", H.shell_quote(dir) }, " "))
    assert.are.equal(0, code, out)
    return out
  end

  it("runs every arm on a tiny budget, prints one table in range, the same twice", function()
    local dir = H.tmpdir()
    local out = smoke(dir)
    local table_of = out:match("\n(skills %(seed 1%).*)$")
    assert.is_string(table_of, out)
    for _, arm in ipairs { "%(a%) none", "%(b%) raw memory", "%(c%) heuristic", "curator SFT", "%(d%) curator RL",
        "oracle curator", "swap: none", "swap: curator RL" } do
      local s, t, r, x = table_of:match("\n" .. arm .. " +([%d.]+) +([%d.]+) +([%d.]+) +([%d.]+)")
      assert.is_not_nil(s, arm)
      s, t, r, x = tonumber(s), tonumber(t), tonumber(r), tonumber(x)
      assert.is_true(s >= 0 and s <= 100 and x >= 0 and x <= 100, arm)
      assert.is_true(t >= 1 and t <= 8 and r >= 0 and r <= 4, arm)
    end
    local lines = H.read_json_lines(dir .. "/skills-curator-s1/metrics.jsonl")
    assert.are.equal(3, #lines) -- step 0 and two RL steps
    assert.is_number(lines[2]["reward/exec_success"])
    local again = smoke(dir):match("\n(skills %(seed 1%).*)$")
    assert.are.equal(table_of, again)
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)
end)
