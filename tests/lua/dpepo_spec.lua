-- dpepo_spec.lua - DPEPO's pieces: rl.envkit.copies{actions = "split"} (one action per copy,
-- "1:u 2:r 3:l": parsing, done copies skipped, missing and malformed parts wasted by the copy's
-- own invalid-action handling, per-copy histories, clone independence, the "max" and "best"
-- rewards, the zipped oracle, bad options), the diversity weight W
-- (rl.train.advantage.dpepo_weights) against a direct computation written here, and the
-- estimator (advantage = "dpepo": GRPO x W when positive, x (2 - W) when negative, per turn) on
-- a batch made by hand.
local rl = require "moonrl"
local advantage = require "moonrl.train.advantage"

local kit = rl.envkit
local T = rl.tensor

-- A walker: the task says how many "go" actions reach the goal; anything else is an invalid
-- action that costs the turn (reward -0.25, info.invalid). Copy i of variant needs task.n + i - 1.
local Walk = { name = "walk", format = "line", max_turns = 8 }
function Walk.tasks(_, n) local t = {} for i = 1, n do t[i] = { n = 2 } end return t end
function Walk.oracle(task) local a = {} for i = 1, task.n do a[i] = "go" end return a end
local WI = {}
WI.__index = WI
function Walk.new() return setmetatable({}, WI) end
function WI:reset(task) self.need, self.at, self.seen = task.n, 0, {} return "need " .. task.n end
function WI:step(action)
  self.seen[#self.seen + 1] = action
  if action ~= "go" then return "bad", -0.25, false, { success = false, invalid = true } end
  self.at = self.at + 1
  if self.at >= self.need then return nil, 1, true, { success = true } end
  return "at " .. self.at, 0, false, { success = false }
end
function WI:clone()
  return setmetatable({ need = self.need, at = self.at, seen = table.move(self.seen, 1, #self.seen, 1, {}) }, WI)
end

local function by_copy(task, i) return { n = task.n + i - 1 } end

describe("rl.envkit.copies with actions = \"split\"", function()
  it("split_parts reads one part per copy in any order and lists what it could not use", function()
    local parts, junk = kit.split_parts("2:r 1:u 3:l", 3)
    assert.are.same({ "u", "r", "l" }, parts)
    assert.are.same({}, junk)
    parts, junk = kit.split_parts("  1: take key   3:go north ", 3) -- parts may hold blanks
    assert.are.same({ [1] = "take key", [3] = "go north" }, parts)
    assert.are.same({}, junk)
    parts, junk = kit.split_parts("hi 1:u 4:d 0:l 2:", 3) -- leading text, copies out of range, an empty part
    assert.are.same({ [1] = "u" }, parts)
    assert.are.same({ "hi", "4:d", "0:l", "2:" }, junk)
    parts, junk = kit.split_parts("1:u 1:d 2:x1:r", 2) -- copy 1 twice: neither; "x1:" is no marker
    assert.are.same({ [2] = "x1:r" }, parts)
    assert.are.same({ "1:d", "1:u" }, junk)
    parts, junk = kit.split_parts("", 2)
    assert.are.same({}, parts)
    assert.are.same({}, junk)
  end)

  it("steps each copy with its own part, skips done copies, wastes missing parts and says so", function()
    local W = kit.copies { env = Walk, n = 3, actions = "split", variant = by_copy }
    local inst = W.new()
    assert.are.equal("1: need 2\n2: need 3\n3: need 4", inst:reset({ n = 2 }, rl.rng(1)))
    -- copy 2's part is missing, copy 3's is an action the walker does not know
    local obs, r, done, info = inst:step("3:jump 1:go")
    assert.are.equal("1: at 1\n2: bad\n3: bad", obs)
    assert.are.equal((0 - 0.25 - 0.25) / 3, r) -- reward = "mean" by default
    assert.is_false(done)
    assert.are.same({ "go", "", "jump" }, info.copy_actions)
    assert.are.equal(1, info.missing)
    assert.is_nil(info.malformed)
    assert.is_true(info.copies[2].missing)
    assert.is_nil(info.copies[1].missing)
    assert.are.same({ "" }, inst.insts[2].seen) -- the copy stepped the empty action
    assert.are.same({ "jump" }, inst.insts[3].seen)
    local c = inst:clone()
    obs, _, _, info = inst:step("1:go 2:go 3:go 9:go") -- copy 1 reaches its goal
    assert.are.equal("1: done\n2: at 1\n3: at 1", obs)
    assert.are.same({ "9:go" }, info.malformed)
    assert.are.equal(0, info.missing)
    obs, _, _, info = inst:step("1:go 2:go 3:go") -- copy 1 is done: its part is not used
    assert.are.equal("1: done\n2: at 2\n3: at 2", obs)
    assert.are.same({ "", "go", "go" }, info.copy_actions)
    assert.is_true(info.copies[1].skipped)
    assert.is_nil(info.copies[1].missing)
    assert.are.equal(0, info.missing)
    assert.are.equal(2, #inst.insts[1].seen) -- copy 1 stepped twice, not three times
    assert.are.same({ { "go", "go" }, { "", "go", "go" }, { "jump", "go", "go" } }, inst:histories())
    -- the clone went on from the state it was taken in, with its own histories
    assert.are.same({ { "go" }, { "" }, { "jump" } }, c:histories())
    obs = c:step("1:go 2:go")
    assert.are.equal("1: done\n2: at 1\n3: bad", obs)
    assert.are.same({ { "go", "go" }, { "", "go" }, { "jump", "" } }, c:histories())
    assert.are.same({ { "go", "go" }, { "", "go", "go" }, { "jump", "go", "go" } }, inst:histories())
    local h = inst:histories()
    h[1][1] = "changed" -- histories() hands out copies
    assert.are.equal("go", inst:histories()[1][1])
    -- the same action for every copy is still the default
    local same = kit.copies { env = Walk, n = 2 }.new()
    same:reset({ n = 2 })
    local o2, _, _, i2 = same:step("go")
    assert.are.equal("1: at 1\n2: at 1", o2)
    assert.is_nil(i2.copy_actions)
  end)

  it("the \"max\" and \"best\" rewards, and a parallel success through the rollout protocol", function()
    local max = kit.copies { env = Walk, n = 2, actions = "split", reward = "max", variant = by_copy }.new()
    max:reset({ n = 1 })
    local _, r = max:step("1:go 2:no")
    assert.are.equal(1, r) -- copy 1 wins, copy 2 loses 0.25: the larger
    local best = kit.copies { env = Walk, n = 2, actions = "split", reward = "best", success = "any",
      variant = by_copy }
    local inst, record = best.new(), {}
    inst:reset({ n = 1 }, rl.rng(2))
    rl.env.step(best, inst, "1:no 2:no", record) -- best return -0.25
    rl.env.step(best, inst, "1:go 2:go", record) -- copy 1 at 0.75
    rl.env.step(best, inst, "1:go 2:go", record) -- copy 2 reaches its goal too, at 0.75: no rise
    local sum = 0
    for _, rec in ipairs(record) do sum = sum + rec.reward end
    assert.are.same({ -0.25, 1, 0 }, { record[1].reward, record[2].reward, record[3].reward })
    assert.are.equal(0.75, sum) -- the episode's return is its best copy's
    assert.is_true(record[3].done)
    assert.is_true(record[3].info.success)
  end)

  it("zips each copy's oracle into parts, and rejects bad options naming them", function()
    local W = kit.copies { env = Walk, n = 3, actions = "split", variant = by_copy }
    assert.are.same({ "1:go 2:go 3:go", "1:go 2:go 3:go", "2:go 3:go", "3:go" }, W.oracle({ n = 2 }, rl.rng(1)))
    assert.are.equal(Walk.oracle, kit.copies { env = Walk, n = 3 }.oracle)
    local cases = {
      { { env = Walk, actions = "splt" }, "rl.envkit.copies: actions: one of \"same\", \"split\"" },
      { { env = Walk, reward = "min" }, "rl.envkit.copies: reward: one of \"mean\", \"max\", \"best\"" },
      { { env = Walk, action = "split" }, "unknown field 'action' (did you mean 'actions'?)" },
      { { env = Walk, actions = true }, "rl.envkit.copies: actions:" },
    }
    for _, c in ipairs(cases) do
      local ok, err = pcall(kit.copies, c[1])
      assert.is_false(ok)
      assert.truthy(tostring(err):find(c[2], 1, true), tostring(err))
    end
  end)
end)

-- The weight written out from its definition, by scanning the histories each turn.
local function direct_w(turns, al, ga, be, om)
  local out = {}
  for t = 1, #turns do
    local function seq(j) -- copy j's actions before turn t (those that are actions)
      local s = {}
      for u = 1, t - 1 do
        local a = turns[u][j]
        if type(a) == "string" and a ~= "" then s[#s + 1] = a end
      end
      return s
    end
    local function pair_count(s, p, c)
      local k = 0
      for q = 2, #s do if s[q - 1] == p and s[q] == c then k = k + 1 end end
      return k
    end
    local ws, acted = {}, {}
    local n = 0
    for j in pairs(turns[t]) do n = math.max(n, j) end
    for i = 1, n do
      local a = turns[t][i]
      if a == "" then
        ws[#ws + 1] = 0.5
      elseif a then
        local own = seq(i)
        local rep = 0
        for _, b in ipairs(own) do if b == a then rep = rep + 1 end end
        local prev, own_pairs, other_pairs = own[#own], 0, 0
        if prev then
          own_pairs = pair_count(own, prev, a)
          for j = 1, n do if j ~= i then other_pairs = other_pairs + pair_count(seq(j), prev, a) end end
        end
        ws[#ws + 1] = (al ^ rep + ga ^ own_pairs + be ^ other_pairs) / 3
        acted[#acted + 1] = a
      end
    end
    if #acted == 0 then
      out[t] = 0.5
    else
      local mean = 0
      for _, w in ipairs(ws) do mean = mean + w / #ws end
      local dup = 0
      for k = 1, #acted do
        for q = 1, k - 1 do
          if acted[q] == acted[k] then dup = dup + 1 break end
        end
      end
      out[t] = (mean + om ^ dup) / 2
    end
  end
  return out
end

local function close(want, got, tol)
  assert.are.equal(#want, #got)
  for k = 1, #want do
    assert(math.abs(want[k] - got[k]) < (tol or 1e-12), string.format("[%d]: want %.15g, got %.15g", k, want[k], got[k]))
  end
end

describe("DPEPO's diversity weight", function()
  it("matches a turn worked by hand", function()
    -- turn 1: three first actions (every term 1), one duplicate (u twice): (1 + 0.8) / 2
    -- turn 2: copies 1 and 2 repeat u (alpha^1) with a new pair (u,u) seen nowhere before (1, 1),
    -- copy 3 is done, the two u's are one duplicate
    local w = advantage.dpepo_weights { { "u", "u", "r" }, { "u", "u", false } }
    close({ 0.9, ((0.8 + 1 + 1) / 3 + 0.8) / 2 }, w)
    assert.are.same({ 0.5 }, advantage.dpepo_weights { { "", false } }) -- no action
    -- a copy without an action weighs 0.5 among the others: ((0.5 + 1) / 2 + 0.8^0) / 2
    close({ 0.875 }, advantage.dpepo_weights { { "", "u" } })
  end)

  it("matches the direct computation on random histories, defaults and other parameters", function()
    local rng = rl.rng(5)
    local acts = { "u", "d", "l", "r" }
    for trial = 1, 40 do
      local n, len, turns = rng:random(1, 4), rng:random(1, 9), {}
      for t = 1, len do
        local row = {}
        for i = 1, n do
          local u = rng:random()
          row[i] = u < 0.1 and false or u < 0.2 and "" or acts[rng:random(1, trial % 2 == 0 and 2 or 4)]
        end
        turns[t] = row
      end
      close(direct_w(turns, 0.8, 0.95, 0.95, 0.8), advantage.dpepo_weights(turns))
      close(direct_w(turns, 0.5, 0.7, 0.6, 0.3), advantage.dpepo_weights(turns, { alpha = 0.5, gamma = 0.7,
        beta = 0.6, omega = 0.3 }))
    end
  end)

  it("rejects bad input naming it", function()
    local cases = {
      { function() advantage.dpepo_weights({}, { alpha = 2 }) end, "dpepo_weights: alpha: a number in [0, 1]" },
      { function() advantage.dpepo_weights({}, { alpah = 0.5 }) end, "did you mean 'alpha'?" },
      { function() advantage.dpepo_weights("x") end, "dpepo_weights: turns: a list" },
      { function() advantage.dpepo_weights { "u" } end, "dpepo_weights: turns[1]: a list of actions" },
      { function() advantage.dpepo_weights { { 3 } } end, "dpepo_weights: turns[1][1]: an action string" },
      { function() advantage.dpepo { omega = -1 } end, "rl.train.advantage.dpepo: omega: a number in [0, 1]" },
    }
    for _, c in ipairs(cases) do
      local ok, err = pcall(c[1])
      assert.is_false(ok)
      assert.truthy(tostring(err):find(c[2], 1, true), tostring(err))
    end
  end)
end)

describe("advantage = \"dpepo\"", function()
  -- episodes of 2 or 3 turns; each turn is a prompt token and two sampled tokens
  local function make_batch(eps)
    local toks, mask, turns, offsets = {}, {}, {}, { 0 }
    for _, ep in ipairs(eps) do
      for k = 1, ep.turns do
        for q = 1, 3 do
          toks[#toks + 1], mask[#mask + 1], turns[#turns + 1] = 65 + q, q == 1 and 0 or 1, k - 1
        end
      end
      offsets[#offsets + 1] = #toks
    end
    return rl.batch.new { tokens = T.from(toks), logprobs = T.zeros(#toks), mask = T.from(mask),
      turns = T.from(turns), offsets = offsets, episodes = eps }
  end
  local function rec(acts, skipped)
    local copies = {}
    for i = 1, #acts do copies[i] = { skipped = skipped and skipped[i] or nil } end
    return { action = "", reward = 0, info = { copy_actions = acts, copies = copies } }
  end

  it("is GRPO times W when positive and times 2 - W when negative, per turn", function()
    local eps = {
      { group = 1, reward = 1, turns = 2, record = { rec { "u", "u" }, rec { "r", "d" } } },
      { group = 1, reward = 0, turns = 3, record = { rec { "u", "r" }, rec { "u", "" }, rec({ "", "u" }, { true }) } },
      { group = 1, reward = 0.5, turns = 2, record = { rec { "l", "l" }, rec { "l", "l" } } },
      { group = 2, reward = 1, turns = 2, record = { rec { "d", "r" }, rec { "d", "d" } } },
      { group = 2, reward = 1, turns = 2, record = { rec { "u", "d" } } }, -- its 2nd turn has no record
    }
    local batch = make_batch(eps)
    local adv, per = advantage.get("dpepo").fn({ cfg = { adv_epsilon = 1e-6 } }, batch)
    -- GRPO written out: (S - group mean) / (group sample sd + eps)
    local base = {}
    for i, ep in ipairs(eps) do
      local sum, n = 0, 0
      for _, e in ipairs(eps) do if e.group == ep.group then sum, n = sum + e.reward, n + 1 end end
      local mean, sq = sum / n, 0
      for _, e in ipairs(eps) do if e.group == ep.group then sq = sq + (e.reward - mean) ^ 2 end end
      base[i] = (ep.reward - mean) / (math.sqrt(sq / (n - 1)) + 1e-6)
    end
    local want, want_per = {}, {}
    for i, ep in ipairs(eps) do
      local turns = {}
      for k = 1, ep.turns do
        local r = ep.record[k]
        local row = {}
        if r then
          for c, a in ipairs(r.info.copy_actions) do row[c] = r.info.copies[c].skipped and false or a end
        end
        turns[k] = row
      end
      local w = direct_w(turns, 0.8, 0.95, 0.95, 0.8)
      local sum = 0
      for k = 1, ep.turns do
        local v = base[i] > 0 and base[i] * w[k] or base[i] < 0 and base[i] * (2 - w[k]) or 0
        for q = 1, 3 do want[#want + 1] = q == 1 and 0 or v end
        sum = sum + 2 * v
      end
      want_per[i] = sum / (2 * ep.turns)
    end
    local got = {}
    for p = 1, adv:numel() do got[p] = adv:get(p) end
    close(want, got, 1e-5)
    close(want_per, per, 1e-5)
    assert(base[2] < 0 and base[1] > 0 and math.abs(base[4]) < 1e-9, "the batch covers both signs and zero")
    close(direct_w({ { "u", "d" }, {} }, 0.8, 0.95, 0.95, 0.8), batch.dpepo_w[5])
    assert.are.equal(0.5, batch.dpepo_w[5][2])
  end)

  it("is an error on episodes that are not split copies", function()
    local batch = make_batch { { group = 1, reward = 1, turns = 1, record = { { action = "u", reward = 1, info = {} } } },
      { group = 1, reward = 0, turns = 1, record = { { action = "d", reward = 0 } } } }
    local ok, err = pcall(advantage.get("dpepo").fn, { cfg = { adv_epsilon = 1e-6 } }, batch)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("advantage dpepo: no turn has info.copy_actions", 1, true))
  end)
end)
