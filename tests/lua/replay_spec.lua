-- replay_spec.lua - rl.replay, the replay buffer: age decay (acceptance test 20: an entry's weight
-- halves every tau ln 2 steps; FA-PER's failure mode without decay and its cure; TRL #6804: every
-- group of a batch is buffered), staleness revisits, re-scoring under a new reward version,
-- eviction by importance ratio and by capacity, priorities, state across processes, bad input,
-- and rl.train{replay = ...}, which resumes bit-exactly in another process.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"

-- A batch of `groups` groups of `size` one-turn episodes of 4 tokens (the last 3 sampled);
-- reward(g, m) gives each episode's reward; advantages = reward - the group's mean. As source
-- text, so that another process can build the same batches.
local MAKE_BATCH = [==[
local rl = require "moonrl"
return function(groups, size, reward, base)
  base = base or 0
  local tokens, lp, mask, turns, offsets, eps = {}, {}, {}, {}, { 0 }, {}
  for g = 1, groups do
    local rs, mean = {}, 0
    for m = 1, size do rs[m] = reward(g, m); mean = mean + rs[m] / size end
    for m = 1, size do
      for t = 1, 4 do
        tokens[#tokens + 1] = (g * 7 + m * 3 + t) % 256
        lp[#lp + 1] = t > 1 and -0.25 * t or 0
        mask[#mask + 1] = t > 1 and 1 or 0
        turns[#turns + 1] = 0
      end
      offsets[#offsets + 1] = #tokens
      eps[#eps + 1] = { group = base + g, reward = rs[m], task = { g = base + g }, seed = m,
        advantage = rs[m] - mean }
    end
  end
  local b = rl.batch.new { tokens = rl.tensor.from(tokens), logprobs = rl.tensor.from(lp),
    mask = rl.tensor.from(mask), turns = rl.tensor.from(turns), offsets = offsets, episodes = eps }
  local adv = rl.tensor.zeros(#tokens)
  for i, ep in ipairs(eps) do
    for p = offsets[i] + 1, offsets[i + 1] do
      if mask[p] == 1 then adv:set(p, ep.advantage) end
    end
  end
  b.advantages = adv
  return b
end
]==]
local make_batch = assert(load(MAKE_BATCH, "=make_batch"))()

-- Four draws and adds after a restore, as text (the same in every process).
local DRAWS = [==[
local rl = require "moonrl"
local make_batch = ...
return function(buf)
  local out = {}
  for step = 13, 16 do
    local s = buf:sample(3, step)
    out[#out + 1] = rl.json.encode { s.keys, s.weights, s.priorities, s.ages,
      s.logprobs:totable(), s.advantages:totable() }
    buf:add(make_batch(1, 3, function(_, m) return m / 7 end, step * 10), step)
  end
  return table.concat(out, "\n")
end
]==]

local function one(reward) return make_batch(1, 1, function() return reward end) end

local tmpdir = H.tmpdir

describe("rl.replay", function()
  -- acceptance test 20, part 1
  it("age decay: an entry's sampling weight halves every age_decay * ln 2 steps (+-5%)", function()
    local tau = 100 / math.log(2) -- a half-life of 100 steps
    local buf = rl.replay.new { capacity = 10, unit = "episode", priority = "reward",
      age_decay = tau, staleness = 0, seed = 1 }
    buf:add(one(2), 0)   -- key 1
    buf:add(one(2), 100) -- key 2, 100 steps younger
    -- the weights themselves: halved per half-life, for any alpha (the decay follows alpha)
    local w = buf:weights(300)
    assert.is_true(math.abs(w[1] / w[2] - 0.5) < 1e-12, "weights " .. w[1] .. ", " .. w[2])
    local w2 = buf:weights(400)
    assert.is_true(math.abs(w2[1] / w[1] - 0.5) < 1e-12)
    assert.is_true(math.abs(w[2] - 2 ^ 0.6 * 2 ^ -2) < 1e-12) -- 2^alpha, two half-lives old
    -- and as measured: the share of single draws
    local count, draws = { 0, 0 }, 30000
    for _ = 1, draws do
      local b = buf:sample(1, 300)
      count[b.keys[1]] = count[b.keys[1]] + 1
    end
    local ratio = count[1] / count[2]
    print(string.format("# age decay: measured weight ratio after one half-life %.4f (want 0.5)", ratio))
    assert.is_true(math.abs(ratio / 0.5 - 1) <= 0.05, "ratio " .. ratio)
  end)

  -- acceptance test 20, part 2: Freshness-Aware PER's failure mode. 60 entries of priority 10
  -- are added at step 0 and never re-prioritised; every step adds 2 fresh entries of priority 1
  -- and draws 8. Without decay the stale entries keep 63% of the weight forever; with the
  -- default age_decay they fade and are evicted.
  it("age decay: stale high-priority entries take >= 50% of draws after 1000 steps without it, <= 10% with it", function()
    local function share(age_decay)
      local buf = rl.replay.new { capacity = 200, unit = "episode", priority = "reward",
        age_decay = age_decay, staleness = 0, seed = 7 }
      buf:add(make_batch(60, 1, function() return 10 end), 0) -- keys 1..60
      local old, total = 0, 0
      for step = 1, 1000 do
        buf:add(make_batch(2, 1, function() return 1 end, step * 10), step)
        local b = buf:sample(8, step)
        if step > 900 then
          for _, key in ipairs(b.keys) do
            if key <= 60 then old = old + 1 end
            total = total + 1
          end
        end
      end
      return old / total, buf:stats()
    end
    local without, s1 = share(false)
    local with, s2 = share(500)
    print(string.format("# FA-PER toy, steps 901-1000: stale share %.3f without decay, %.3f with age_decay = 500", without, with))
    assert.is_true(without >= 0.5, "without decay " .. without)
    assert.is_true(with <= 0.1, "with decay " .. with)
    assert.are.equal(200, s1.size)
    assert.are.equal(200, s2.size)
    assert.is_true(s2.age_max < 200, "with decay the old entries were evicted: " .. s2.age_max)
  end)

  -- acceptance test 20, part 3: TRL #6804 kept only the first group of a batch
  it("buffers every group of a batch, not only the first (TRL #6804), and keeps groups whole", function()
    local buf = rl.replay.new { capacity = 100, seed = 2 }
    local b = make_batch(4, 3, function(g, m) return (g + m) % 2 end)
    assert.are.equal(12, buf:add(b, 1))
    local s = buf:stats()
    assert.are.equal(12, s.size)
    assert.are.equal(4, s.entries)
    local all = buf:sample(10, 2)
    assert.are.equal(12, all:size()) -- 4 groups of 3
    local members = {}
    for _, ep in ipairs(all.episodes) do members[ep.group] = (members[ep.group] or 0) + 1 end
    local groups = 0
    for _, count in pairs(members) do
      groups = groups + 1
      assert.are.equal(3, count)
    end
    assert.are.equal(4, groups)
    local tasks = {}
    for _, ep in ipairs(all.episodes) do tasks[ep.task.g] = true end
    for g = 1, 4 do assert.is_true(tasks[g], "group " .. g .. " was buffered") end
    -- each replayed group id is the buffer's own (negative), never a fresh batch's
    for _, ep in ipairs(all.episodes) do assert.is_true(ep.group < 0) end
  end)

  it("draws like its naive Lua reference, deterministically from the seed", function()
    local function run()
      local buf = rl.replay.new { capacity = 64, unit = "episode", priority = "reward",
        alpha = 0.7, age_decay = 50, staleness = 0.25, seed = 9 }
      for step = 1, 20 do buf:add(make_batch(3, 1, function(g) return g * step % 5 end, step * 10), step) end
      local keys = {}
      for step = 21, 30 do
        for _, k in ipairs(buf:sample(5, step).keys) do keys[#keys + 1] = k end
      end
      return keys, buf
    end
    local a, buf = run()
    local b = run()
    assert.are.same(a, b)
    -- the weights against the formula written out in Lua
    local w = buf:weights(40)
    for _, e in ipairs(buf.entries) do
      local r = e.records[1]
      local want = math.max(r.priority, 1e-6) ^ 0.7 * math.exp(-(40 - e.step) / 50)
      assert.is_true(math.abs(w[r.key] - want) <= 1e-12 * want, "key " .. r.key)
    end
  end)

  it("revisits the least recently used entries (staleness)", function()
    local buf = rl.replay.new { capacity = 64, unit = "episode", priority = "reward",
      staleness = 1, seed = 3 }
    buf:add(make_batch(10, 1, function(g) return g == 1 and 100 or 1 end), 0)
    local seen = {}
    for step = 1, 10 do
      local b = buf:sample(1, step)
      assert.is_true(b.stale[1])
      seen[b.keys[1]] = (seen[b.keys[1]] or 0) + 1
    end
    for key = 1, 10 do assert.are.equal(1, seen[key], "key " .. key) end -- round robin
    -- with staleness 0.3 and one dominant entry, every entry is still drawn within 200 draws
    buf = rl.replay.new { capacity = 64, unit = "episode", priority = "reward", staleness = 0.3,
      seed = 4 }
    buf:add(make_batch(10, 1, function(g) return g == 1 and 1000 or 0 end), 0)
    seen = {}
    for step = 1, 200 do seen[buf:sample(1, step).keys[1]] = true end
    for key = 1, 10 do assert.is_true(seen[key], "key " .. key .. " was never drawn") end
    assert.is_true(buf:stats().stale_picks > 30)
  end)

  it("re-scores stored episodes when the reward graph's version changes", function()
    local calls = 0
    local g = { version = 1 }
    function g:rescore(batch)
      calls = calls + 1
      for _, ep in ipairs(batch.episodes) do
        ep.reward = ep.reward * 10
        ep.reward_version = self.version
      end
    end
    local buf = rl.replay.new { capacity = 16, unit = "episode", priority = "reward", rescore = g,
      seed = 5 }
    local b = make_batch(2, 1, function(gi) return gi end)
    for _, ep in ipairs(b.episodes) do ep.reward_version = 1 end
    buf:add(b, 0)
    local s = buf:sample(2, 1)
    assert.are.equal(0, calls) -- same version: nothing to do
    assert.are.same({ 1, 2 }, { s.episodes[1].reward + s.episodes[2].reward - 2,
      math.max(s.episodes[1].reward, s.episodes[2].reward) })
    g.version = 2
    s = buf:sample(2, 2)
    assert.are.equal(1, calls)
    local rewards = {}
    for j, ep in ipairs(s.episodes) do rewards[s.keys[j]] = ep.reward; assert.are.equal(2, ep.reward_version) end
    assert.are.same({ 10, 20 }, rewards)
    assert.are.equal(2, buf:stats().rescored)
    -- priorities follow the new rewards ("reward"), and nothing is re-scored twice
    local w = buf:weights(2)
    assert.is_true(math.abs(w[2] / w[1] - 2 ^ 0.6) < 1e-12)
    buf:sample(2, 3)
    assert.are.equal(1, calls)
    -- episodes without a version (scored before the graph) are re-scored on first use
    buf:add(make_batch(1, 1, function() return 3 end, 50), 3)
    assert.are.equal(1, buf:rescore())
    assert.are.equal(2, calls)
    -- what the trainer sets on a sampled episode stays out of the buffer
    s = buf:sample(3, 4)
    s.episodes[1].reward = -99
    for _, ep in ipairs(buf:batch().episodes) do assert.is_true(ep.reward ~= -99) end
  end)

  it("re-scores under a real reward graph once a reload bumps its version", function()
    local dir = tmpdir()
    local path = dir .. "/reward.lua"
    local SRC = 'return rl.reward.graph { terms = { rl.reward.fn("short", function(ep) ' ..
      'return -(%s) * ep.length * ep.task.g + ep.seed end) } }'
    local function write(k)
      local f = assert(io.open(path, "w"))
      f:write(SRC:format(k))
      f:close()
    end
    write("0.01")
    local g = assert(rl.reward.load(path))
    local b = make_batch(2, 2, function() return 0 end)
    g:score(b)
    local buf = rl.replay.new { capacity = 16, priority = "reward", rescore = g, seed = 3 }
    buf:add(b, 0)
    write("0.5")
    assert.is_true(g:reload())
    assert.are.equal(2, g.version)
    local s = buf:sample(2, 1)
    local fresh = make_batch(2, 2, function() return 0 end)
    g:score(fresh)
    local want = {}
    for _, ep in ipairs(fresh.episodes) do want[ep.task.g .. "/" .. ep.seed] = ep.reward end
    assert.are.equal(4, #s.episodes)
    for _, ep in ipairs(s.episodes) do
      assert.are.equal(2, ep.reward_version)
      assert.are.equal(want[ep.task.g .. "/" .. ep.seed], ep.reward)
    end
    assert.are.equal(4, buf:stats().rescored)
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)

  it("evicts entries whose importance ratio exceeds max_ratio, and weighs tokens up to it", function()
    local buf = rl.replay.new { capacity = 16, unit = "episode", priority = "reward",
      max_ratio = 5, seed = 6 }
    buf:add(make_batch(4, 1, function(g) return g end), 0)
    -- the policy now gives entry 2's tokens e^2 (7.4) times and entry 4's e^-2 times their
    -- behaviour probability; entries 1 and 3 e^0.5
    local shift = { 0.5, 2, 0.5, -2 }
    local function logprobs(b)
      local lp = b.logprobs:clone()
      for j = 1, b:size() do
        local key = b.episodes[j].task.g
        for p = b.offsets[j] + 1, b.offsets[j + 1] do lp:set(p, lp:get(p) + shift[key]) end
      end
      return lp
    end
    local s = buf:sample(4, 1, { logprobs = logprobs })
    assert.are.equal(2, s:size())
    local kept = {}
    for j, key in ipairs(s.keys) do
      kept[key] = true
      assert.is_true(math.abs(s.ratios[j] - math.exp(0.5)) < 1e-6)
    end
    assert.is_true(kept[1] and kept[3])
    local st = buf:stats()
    assert.are.equal(2, st.evicted_ratio)
    assert.are.equal(2, st.size)
    -- token weights: min(pi / pi_behaviour, max_ratio) on sampled tokens, 1 elsewhere
    assert.are.equal(s.offsets[s:size() + 1], s.token_weights:numel())
    assert.is_true(math.abs(s.token_weights:get(2) - math.exp(0.5)) < 1e-6)
    assert.are.equal(1, s.token_weights:get(1))
    assert.are.equal(s.policy_logprobs:numel(), s.logprobs:numel())
    -- behaviour log-probs are the stored ones
    assert.are.equal(-0.5, s.logprobs:get(2))
  end)

  it("evicts the lowest weights past capacity (ties: the oldest) and takes new priorities", function()
    local buf = rl.replay.new { capacity = 4, unit = "episode", priority = "reward",
      age_decay = false, seed = 8 }
    buf:add(make_batch(4, 1, function(g) return ({ 3, 1, 2, 1 })[g] end), 0) -- keys 1-4
    buf:add(one(5), 1) -- key 5: evicts key 2 (weight 1, older than key 4)
    local w = buf:weights(1)
    assert.is_nil(w[2])
    assert.is_number(w[4])
    assert.are.equal(1, buf:stats().evicted_capacity)
    assert.are.equal(1, buf:update({ 4, 2, 99 }, { 50, 1, 1 })) -- 2 and 99 are gone
    buf:add(one(4), 2) -- evicts key 3 (priority 2), the lowest now
    w = buf:weights(2)
    assert.is_nil(w[3])
    assert.is_true(math.abs(w[4] - 50 ^ 0.6) < 1e-9)
    -- groups are evicted whole
    local g = rl.replay.new { capacity = 6, seed = 1, priority = "reward", age_decay = false }
    g:add(make_batch(2, 3, function(gi) return gi end), 0)
    g:add(make_batch(1, 3, function() return 5 end, 10), 1)
    assert.are.equal(6, g:stats().size)
    assert.are.equal(2, g:stats().entries)
  end)

  it("priorities: mean |advantage|, the group's reward sigma, |reward| or a function", function()
    local b = make_batch(2, 2, function(g, m) return g == 1 and m or 7 end)
    local p = rl.replay.new { capacity = 8 }:priorities(b)
    assert.are.same({ 0.5, 0.5, 0, 0 }, p)
    p = rl.replay.new { capacity = 8, priority = "sigma" }:priorities(b)
    assert.are.same({ 0.5, 0.5, 0, 0 }, p)
    p = rl.replay.new { capacity = 8, priority = "reward" }:priorities(b)
    assert.are.same({ 1, 2, 7, 7 }, p)
    p = rl.replay.new { capacity = 8, priority = function(ep, info) return info.index + ep.reward end }:priorities(b)
    assert.are.same({ 2, 4, 10, 11 }, p)
    b.advantages = nil
    p = rl.replay.new { capacity = 8 }:priorities(b) -- from ep.advantage
    assert.are.same({ 0.5, 0.5, 0, 0 }, p)
    for _, ep in ipairs(b.episodes) do ep.advantage = nil end
    H.assert_error(function() rl.replay.new { capacity = 8 }:add(b, 1) end,
      "priority \"abs_adv\" needs batch.advantages")
    H.assert_error(function() rl.replay.new { capacity = 8, priority = function() return -1 end }:add(b, 1) end,
      "a non-negative finite number expected, got -1")
  end)

  it("returns nil and a message below min_fill; samples the stored advantages", function()
    local buf = rl.replay.new { capacity = 8, min_fill = 4 }
    local b, err = buf:sample(2, 0)
    assert.is_nil(b)
    assert.matches("0 episodes stored, fewer than min_fill = 4", err, 1, true)
    buf:add(make_batch(1, 3, function(_, m) return m end), 0)
    assert.is_nil((buf:sample(2, 1)))
    buf:add(make_batch(1, 3, function(_, m) return m end, 5), 0)
    b = assert(buf:sample(1, 1))
    assert.are.equal(3, b:size())
    local want = { -1, 0, 1 }
    for j = 1, 3 do
      local a = b.offsets[j]
      assert.are.equal(0, b.advantages:get(a + 1))
      assert.are.equal(want[j], b.advantages:get(a + 2))
    end
    assert.are.equal(0, buf:sample(0, 1):size())
  end)

  it("state() and load() continue bit for bit, in this process and in another", function()
    local function fill()
      local buf = rl.replay.new { capacity = 40, priority = "abs_adv", staleness = 0.2, seed = 12,
        age_decay = 30 }
      for step = 1, 12 do
        buf:add(make_batch(2, 3, function(g, m) return ((g * m * step) % 7) / 3 end, step * 10), step)
        if step % 3 == 0 then buf:sample(2, step) end
      end
      return buf
    end
    local a = fill()
    local text = rl.json.encode(a:state())
    local b = rl.replay.new { capacity = 40, priority = "abs_adv", staleness = 0.2, seed = 12,
      age_decay = 30 }
    b:load(rl.json.decode(text))
    assert.are.equal(text, rl.json.encode(b:state()))
    local draws = assert(load(DRAWS, "=draws"))(make_batch)
    local want = draws(a)
    assert.are.equal(want, draws(b))
    local state_path, batch_path, draws_path = H.write_temp(text), H.write_temp(MAKE_BATCH),
      H.write_temp(DRAWS)
    local out, _, ok = H.run_lua([[
      local rl = require "moonrl"
      local make_batch = dofile(arg[2])
      local draws = loadfile(arg[3])(make_batch)
      local buf = rl.replay.new { capacity = 40, priority = "abs_adv", staleness = 0.2, seed = 12,
        age_decay = 30 }
      buf:load(rl.json.decode(assert(io.open(arg[1])):read("a")))
      io.write(draws(buf))
    ]], state_path, batch_path, draws_path)
    os.remove(state_path)
    os.remove(batch_path)
    os.remove(draws_path)
    assert.is_true(ok, out)
    assert.are.equal(want, out)
  end)

  it("refuses bad options naming the field, and bad calls naming the argument", function()
    local new = rl.replay.new
    H.assert_error(function() new() end, "rl.replay.new: a table of options expected")
    H.assert_error(function() new {} end, "rl.replay.new: capacity: a positive integer expected (it is required)")
    H.assert_error(function() new { capacity = 0 } end, "capacity: a positive integer expected, got 0")
    H.assert_error(function() new { capacity = 2.5 } end, "capacity: a positive integer expected, got 2.5")
    H.assert_error(function() new { capacity = 8, capacty = 9 } end, "unknown field 'capacty' (did you mean 'capacity'?)")
    H.assert_error(function() new { capacity = 8, alpah = 1 } end, "unknown field 'alpah' (did you mean 'alpha'?)")
    H.assert_error(function() new { capacity = 8, 5 } end, "options are named")
    H.assert_error(function() new { capacity = 8, priority = "abs" } end, { "priority:", "did you mean \"abs_adv\"?" })
    H.assert_error(function() new { capacity = 8, priority = 3 } end, "priority:")
    H.assert_error(function() new { capacity = 8, alpha = -1 } end, "alpha: a non-negative number expected, got -1")
    H.assert_error(function() new { capacity = 8, beta = -1 } end, "beta:")
    H.assert_error(function() new { capacity = 8, beta = { start = 0.4 } } end, "beta:")
    H.assert_error(function() new { capacity = 8, age_decay = 0 } end, "age_decay: a positive number (steps) or false")
    H.assert_error(function() new { capacity = 8, age_decay = true } end, "age_decay:")
    H.assert_error(function() new { capacity = 8, staleness = 1.5 } end, "staleness: a number in [0, 1] expected, got 1.5")
    H.assert_error(function() new { capacity = 8, min_fill = -1 } end, "min_fill: a non-negative integer expected")
    H.assert_error(function() new { capacity = 8, max_ratio = 1 } end, "max_ratio: a number > 1 or false")
    H.assert_error(function() new { capacity = 8, rescore = {} } end, "rescore: a reward graph")
    H.assert_error(function() new { capacity = 8, rescore = function() end } end, "rescore: a reward graph")
    H.assert_error(function() new { capacity = 8, unit = "groups" } end, { "unit:", "did you mean \"group\"?" })
    H.assert_error(function() new { capacity = 8, seed = 1.5 } end, "seed: an integer expected, got 1.5")
    assert.is_table(new { capacity = 8, beta = { start = 0.4, stop = 1, steps = 100 }, age_decay = false,
      max_ratio = false, priority = function() return 1 end })
    local buf = new { capacity = 2 }
    H.assert_error(function() buf:add({}, 1) end, "replay: add: batch: an rl.batch expected")
    H.assert_error(function() buf:add(make_batch(1, 1, function() return 1 end), 1.5) end, "replay: add: step: an integer expected, got 1.5")
    H.assert_error(function() buf:add(make_batch(1, 3, function() return 1 end), 1) end, "a group of 3 episodes does not fit capacity = 2")
    local b = make_batch(1, 1, function() return 1 end)
    b.advantages = rl.tensor.zeros(2)
    H.assert_error(function() buf:add(b, 1) end, "batch.advantages: per-token advantages expected")
    H.assert_error(function() buf:sample(-1, 1) end, "replay: sample: n: a non-negative integer expected")
    H.assert_error(function() buf:sample(1, "x") end, "replay: sample: step: an integer expected")
    H.assert_error(function() buf:sample(1, 1, { logprob = print }) end, "unknown option 'logprob'")
    H.assert_error(function() buf:sample(1, 1, { logprobs = 1 }) end, "opts.logprobs: a function")
    buf:add(make_batch(1, 1, function() return 1 end), 1)
    H.assert_error(function() buf:sample(1, 1, { logprobs = function() return 3 end }) end, "opts.logprobs returned 3, not a tensor of 4")
    H.assert_error(function() buf:update({ 1 }, {}) end, "replay: update: priorities: a list of 1 numbers expected")
    H.assert_error(function() buf:update({ "a" }, { 1 }) end, "keys[1]: an integer key expected")
    H.assert_error(function() buf:update({ 1 }, { 0 / 0 }) end, "priorities[1]: a non-negative finite number expected")
    H.assert_error(function() buf:load({}) end, "replay: load: state: a table from buf:state() expected")
    local st = buf:state()
    st.entries[1].records[1].mask = { 1 }
    H.assert_error(function() buf:load(st) end, "entries[1].records[1]: a stored episode expected")
    assert.are.equal(1, buf:stats().size) -- a refused load changes nothing
    H.assert_error(function() buf:weights(nil) end, "replay: weights: step: an integer expected")
  end)
end)

-- ---------------------------------------------------------------- rl.train{replay = ...}

local read_lines = H.read_json_lines

-- The run: guess_letter (multi-turn) with GiGPO, KL, an SFT warm start, evaluation, and a
-- replay buffer with a reward graph whose version differs from the episodes' (every replayed
-- episode is re-scored once), loaded here and, for the resumed half, in another process.
local REPLAY_RUN = [==[
local rl = require "moonrl"
local root = ...
local guess = dofile(root .. "/envs/guess_letter.lua")
return function(dir, name, extra, replay_opts)
  local g = { version = 2 }
  function g:rescore(batch)
    for _, ep in ipairs(batch.episodes) do
      ep.reward = ep.reward + 0.125 * ep.turns
      ep.reward_version = self.version
    end
  end
  local buf = rl.replay.new { capacity = 24, seed = 5, staleness = 0.25, age_decay = 3,
    max_ratio = 4, rescore = g }
  local replay = { buffer = buf, ratio = 1 }
  for k, v in pairs(replay_opts or {}) do replay[k] = v end
  local o = { model = rl.model.new { vocab = 264, dim = 32, layers = 2, heads = 2, ffn = 64,
      ctx = 128, seed = 2 }, tokenizer = rl.tokenizer.bytes(), env = guess, dir = dir, name = name,
    seed = 11, steps = 5, tasks_per_step = 3, group_size = 4, max_turn_tokens = 3, lr = 1e-3,
    minibatch = 6, epochs = 2, advantage = "gigpo", gamma = 0.8, kl_coef = 0.05,
    sft = { examples = 24, epochs = 1, batch_size = 8, lr = 1e-3 },
    eval = { every = 2, tasks = 6, k = 2 }, progress = false, plot = false, replay = replay }
  for k, v in pairs(extra or {}) do o[k] = v end
  return rl.train(o), o.model, buf
end
]==]

describe("rl.train{replay = ...}", function()
  it("mixes replayed groups into the update, logs replay metrics, and resumes bit-exactly in another process", function()
    local dir = tmpdir()
    local config = H.script(dir .. "/run.lua", REPLAY_RUN)
    local runner = assert(loadfile(config))(H.root)
    local r, m_full, buf = runner(dir, "full")
    local h = r.history
    -- step 1: nothing to replay yet; all 3 groups of the step are buffered (TRL #6804)
    assert.are.equal(0, h[2]["replay/sampled"])
    assert.are.equal(12, h[2]["replay/size"])
    assert.are.equal(3, h[2]["replay/entries"])
    local replayed, rescored = 0, 0
    for s = 3, #h do
      replayed = replayed + h[s]["replay/sampled"]
      rescored = rescored + h[s]["replay/rescored"]
      assert.is_number(h[s]["replay/ratio_mean"] or 0)
      assert.is_true(h[s]["replay/size"] <= 24)
    end
    assert.is_true(replayed > 0, "episodes were replayed")
    assert.is_true(rescored > 0, "episodes were re-scored")
    assert.are.equal(24, buf:stats().size)
    -- the same run stopped after step 2 and resumed in another `moonrl run` process
    runner(dir, "cut", { stop_after = 2 })
    H.resume_cut(config, dir)
    local state = rl.json.decode(assert(io.open(dir .. "/cut/state.json")):read("a"))
    assert.are.equal(5, state.step)
    local full_state = rl.json.decode(assert(io.open(dir .. "/full/state.json")):read("a"))
    assert.are.equal(rl.json.encode(full_state.replay), rl.json.encode(state.replay))
    local m_res = rl.model.new { vocab = 264, dim = 32, layers = 2, heads = 2, ffn = 64, ctx = 128, seed = 2 }
    assert.are.equal(5, m_res:load_checkpoint(dir .. "/cut/" .. state.checkpoint))
    local a, b = m_full:parameters(), m_res:parameters()
    for name, w in pairs(a) do assert.are.equal(0, w:max_abs_diff(b[name]), name) end
    local lf, lr = read_lines(dir .. "/full/metrics.jsonl"), read_lines(dir .. "/cut/metrics.jsonl")
    assert.are.equal(#lf, #lr)
    for i, rec in ipairs(lf) do
      for k, v in pairs(rec) do
        if not k:match("^time/") and k ~= "tokens_per_s" then
          assert.are.equal(v, lr[i][k], "step " .. rec.step .. " " .. k)
        end
      end
    end
    -- resuming with other replay options is refused, naming them
    local err = H.error_of(runner, dir, "cut", { resume = true, steps = 6 }, { ratio = 2 })
    assert.matches("replay", err, 1, true)
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)

  it("trains with stored advantages and per-episode entries", function()
    local dir = tmpdir()
    local guess = dofile(H.root .. "/envs/guess_letter.lua")
    local buf = rl.replay.new { capacity = 32, unit = "episode", seed = 1 }
    -- the update stage records each episode's advantage (by its seed, unique to the episode)
    -- and checks that a replayed episode gets the one it had when it was fresh
    local first_adv, replayed_seen = {}, 0
    local function update(_, batch, adv)
      for i, ep in ipairs(batch.episodes) do
        local a, b = batch:range(i)
        local v
        for p = a, b do if batch.mask:get(p) ~= 0 then v = adv:get(p) break end end
        if ep.group < 0 then
          replayed_seen = replayed_seen + 1
          assert.are.equal(first_adv[ep.seed], v)
        else
          first_adv[ep.seed] = v
        end
      end
      return { updates = 1 }
    end
    local r = rl.train { model = rl.model.new { vocab = 264, dim = 32, layers = 1, heads = 2,
        ffn = 64, ctx = 128, seed = 2 }, tokenizer = rl.tokenizer.bytes(), env = guess, dir = dir,
      seed = 3, steps = 4, tasks_per_step = 2, group_size = 4, max_turn_tokens = 3,
      eval = false, progress = false, plot = false, update = update,
      rewards = { length = function(ep) return ep.length / 50 end },
      replay = { buffer = buf, ratio = 0.5, advantages = "stored", correction = false } }
    local h = r.history
    for s = 3, 5 do assert.are.equal(4, h[s]["replay/sampled"] + h[s]["replay/evicted_ratio"]) end
    assert.is_true(replayed_seen > 0)
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)

  it("checks the replay option", function()
    local guess = dofile(H.root .. "/envs/guess_letter.lua")
    local m = rl.model.new { vocab = 264, dim = 16, layers = 1, heads = 2, ffn = 32, ctx = 64, seed = 1 }
    local function train(replay, extra)
      local o = { model = m, tokenizer = rl.tokenizer.bytes(), env = guess, replay = replay,
        progress = false, dir = "/nonexistent-never-written" }
      for k, v in pairs(extra or {}) do o[k] = v end
      return rl.train(o)
    end
    local buf = rl.replay.new { capacity = 8 }
    H.assert_error(function() train(5) end, "replay: a replay buffer or a table {buffer =")
    H.assert_error(function() train { buffer = buf, ratoi = 1 } end, "unknown option 'replay.ratoi' (did you mean 'replay.ratio'?)")
    H.assert_error(function() train { ratio = 1 } end, "replay.buffer:")
    H.assert_error(function() train { buffer = buf, ratio = -1 } end, "replay.ratio: a non-negative number expected, got -1")
    H.assert_error(function() train { buffer = buf, advantages = "stale" } end, "replay.advantages:")
    H.assert_error(function() train({ buffer = buf, advantages = "stored" }, { advantage = "gae" }) end,
      "replay.advantages: \"stored\" does not go with an estimator that has a critic")
    H.assert_error(function() train { buffer = {} } end, "replay.buffer: a replay buffer")
  end)
end)
