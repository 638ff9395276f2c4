-- delayed_spec.lua - delayed rewards (FutureWorld's backfill): rl.replay's pending entries
-- (add_pending, pending, backfill, discard, sample{resolved = true}, state/load across
-- processes) and rl.train{delayed = ...}: pending episodes stay out of every update until their
-- reward arrives, then join one with importance weights checked against the log-probs; two runs
-- are identical, a resumed run equals the uninterrupted one, and bad options name themselves.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"

-- A batch of `groups` groups of `size` two-turn episodes of 5 tokens (tokens 2-3 and 5 sampled),
-- group g's tasks {g = base + g}; reward(g, m) each episode's (its last turn's) reward. As
-- source text, so that another process builds the same batches.
local MAKE_BATCH = [==[
local rl = require "moonrl"
return function(groups, size, reward, base)
  base = base or 0
  local tokens, lp, mask, turns, offsets, eps = {}, {}, {}, {}, { 0 }, {}
  for g = 1, groups do
    for m = 1, size do
      for t = 1, 5 do
        tokens[#tokens + 1] = (g * 11 + m * 5 + t) % 256
        local sampled = t == 2 or t == 3 or t == 5
        lp[#lp + 1] = sampled and -0.125 * (t + m) or 0
        mask[#mask + 1] = sampled and 1 or 0
        turns[#turns + 1] = t <= 3 and 0 or 1
      end
      offsets[#offsets + 1] = #tokens
      local r = reward(g, m)
      eps[#eps + 1] = { group = base + g, reward = 0.25 + r, rewards = { 0.25, r },
        task = { g = base + g }, seed = m,
        record = { { action = "a", reward = 0.25, info = {} }, { action = "b", reward = r, info = {} } } }
    end
  end
  return rl.batch.new { tokens = rl.tensor.from(tokens), logprobs = rl.tensor.from(lp),
    mask = rl.tensor.from(mask), turns = rl.tensor.from(turns), offsets = offsets, episodes = eps }
end
]==]
local make_batch = assert(load(MAKE_BATCH, "=make_batch"))()

local function zero() return 0 end
local function keys_of(batch, key)
  local out = {}
  for i = 1, batch:size() do out[i] = type(key) == "function" and key(batch.episodes[i]) or key end
  return out
end

-- Every drawable and held record of a state, by episode key, as JSON.
local function records_by_key(state)
  local out = {}
  for _, list in ipairs { state.entries, state.held } do
    for _, e in ipairs(list) do
      for _, r in ipairs(e.records) do out[r.key] = rl.json.encode(r) end
    end
  end
  return out
end

local function drawn_keys(buf, step, n)
  local seen = {}
  for s = 1, n do
    local b = buf:sample(3, step + s)
    for _, k in ipairs(b and b.keys or {}) do seen[k] = true end
  end
  return seen
end

describe("rl.replay: pending entries", function()
  it("holds pending episodes out of every draw, and backfill changes only its key's episodes", function()
    local buf = rl.replay.new { capacity = 64, priority = "reward", staleness = 0.5, seed = 3 }
    buf:add(make_batch(2, 3, function(g, m) return g + m / 10 end), 1)        -- keys 1-6
    buf:add_pending(make_batch(1, 3, zero, 10), 1, { "ev-a", "ev-a", "ev-a" }) -- keys 7-9
    buf:add_pending(make_batch(1, 2, zero, 20), 2, { 7, 7 })                 -- keys 10-11, as "7"
    buf:add(make_batch(1, 2, function(_, m) return m end, 30), 2)            -- keys 12-13
    local st = buf:stats()
    assert.are.same({ 8, 5, 2, 2, 5 }, { st.size, st.pending, st.pending_keys, st.held_entries, st.held })
    assert.are.same({ { key = "ev-a", step = 1, episodes = 3, task = { g = 11 } },
      { key = "7", step = 2, episodes = 2, task = { g = 21 } } }, buf:pending())
    -- no draw ever returns a pending episode, and weights and batch() never list them
    local seen = drawn_keys(buf, 2, 40)
    for k = 7, 11 do assert.is_nil(seen[k], "pending episode " .. k .. " drawn") end
    for _, k in ipairs { 1, 4, 12 } do assert.is_true(seen[k]) end -- (the entries' first keys)
    assert.is_nil(buf:weights(50)[7])
    assert.are.same({ 1, 2, 3, 4, 5, 6, 12, 13 }, buf:batch().keys)
    -- backfill: every other record stays exactly as it was
    local before = records_by_key(buf:state())
    local given = {}
    assert.is_true(buf:backfill("ev-a", function(ep)
      given[#given + 1] = ep.seed
      return 0.5 * ep.seed
    end, 6))
    assert.are.same({ 1, 2, 3 }, given)
    local state = buf:state()
    local after = records_by_key(state)
    for key, text in pairs(before) do
      if key < 7 or key > 9 then assert.are.equal(text, after[key], "record " .. key .. " changed") end
    end
    -- the resolved episodes: the reward added to the last turn and the total, nothing else moved
    for m = 1, 3 do
      local old, new = rl.json.decode(before[6 + m]), rl.json.decode(after[6 + m])
      local e_old, e_new = old.episode, new.episode
      assert.are.equal(0.25 + 0.5 * m, e_new.reward)
      assert.are.same({ 0.25, 0.5 * m }, e_new.rewards)
      assert.are.equal(0.5 * m, e_new.record[2].reward)
      assert.are.equal(0.5 * m, e_new.backfilled)
      assert.are.equal(6, e_new.resolved_step)
      assert.is_true(e_new.success)
      e_new.reward, e_new.rewards, e_new.record, e_new.backfilled, e_new.resolved_step, e_new.success =
        e_old.reward, e_old.rewards, e_old.record, nil, nil, e_old.success
      assert.are.same(e_old, e_new)
      for _, f in ipairs { "tokens", "logprobs", "mask", "turns" } do assert.are.same(old[f], new[f]) end
      assert.is_nil(new.pending)
      -- priority "reward": |reward| once drawable
      assert.are.equal(0.25 + 0.5 * m, new.priority)
    end
    st = buf:stats()
    assert.are.same({ 11, 2, 1, 3 }, { st.size, st.pending, st.pending_keys, st.resolved })
    -- the resolved entry comes first in the next draw with resolved = true, weight 1, once
    local b = buf:sample(2, 6, { resolved = true })
    assert.are.same({ 7, 8, 9 }, { b.keys[1], b.keys[2], b.keys[3] })
    assert.are.same({ true, true, true, false }, { b.resolved[1], b.resolved[2], b.resolved[3], b.resolved[4] })
    assert.are.same({ 1, 1, 1 }, { b.weights[1], b.weights[2], b.weights[3] })
    assert.are.same({ 5, 5, 5 }, { b.ages[1], b.ages[2], b.ages[3] }) -- from its rollout step
    assert.are.equal(3 + 2 + 3, b:size()) -- and 2 drawn entries (3 and 2 episodes, or 3 and 3)
      -- (groups: {1-3}, {4-6}, {12-13} are the candidates; the draw took two of them)
    b = buf:sample(2, 7, { resolved = true })
    for j = 1, b:size() do assert.is_false(b.resolved[j]) end
    assert.is_nil(seen[10])
  end)

  it("gives nil and a message for unknown, resolved and discarded keys; integer keys are their text", function()
    local buf = rl.replay.new { capacity = 16, unit = "episode", priority = "reward" }
    buf:add_pending(make_batch(1, 3, zero), 4, { "a", 12, "12" })
    local ok, why = buf:backfill("zz", 1)
    assert.is_nil(ok)
    assert.matches('no episode waits under key "zz"', why, 1, true)
    assert.is_true(buf:backfill(12, 2, 5)) -- both episodes of key 12 = "12"
    assert.are.equal(2, buf:stats().size)
    ok, why = buf:backfill("12", 1)
    assert.is_nil(ok)
    assert.matches('key "12" was resolved at step 5 already', why, 1, true)
    assert.is_true(buf:discard("a", 6))
    ok, why = buf:backfill("a", 1)
    assert.is_nil(ok)
    assert.matches('key "a" was discarded at step 6 already', why, 1, true)
    ok, why = buf:discard("a")
    assert.is_nil(ok)
    assert.matches("replay: discard:", why, 1, true)
    local st = buf:stats()
    assert.are.same({ 2, 0, 0, 2, 1 }, { st.size, st.pending, st.pending_keys, st.resolved, st.discarded })
    -- a closed key held again waits again
    buf:add_pending(make_batch(1, 1, zero), 7, { "a" })
    assert.is_true(buf:backfill("a", 1, 8))
  end)

  it("makes a group drawable only once every member's key has closed; discarded members leave", function()
    local buf = rl.replay.new { capacity = 16, priority = "sigma", seed = 1 }
    buf:add_pending(make_batch(1, 3, zero), 1, { "x", "y", "z" })
    assert.is_true(buf:backfill("x", 1))
    assert.is_nil(buf:sample(1, 2)) -- (nothing drawable: below min_fill)
    assert.is_true(buf:backfill("y", 3))
    assert.are.same({ 0, 1 }, { buf:stats().size, buf:stats().pending })
    assert.is_true(buf:discard("z"))
    local b = buf:sample(1, 4, { resolved = true })
    assert.are.same({ 1, 2 }, b.keys)
    -- priority "sigma": the population standard deviation of the two rewards (1.25, 1.25 + 2)
    local r1, r2 = 0.25 + 1, 0.25 + 3
    assert.are.same({ r1, r2 }, { b.episodes[1].reward, b.episodes[2].reward })
    local mean = (r1 + r2) / 2
    local sd = math.sqrt(((r1 - mean) ^ 2 + (r2 - mean) ^ 2) / 2)
    assert.is_true(math.abs(b.priorities[1] - sd) < 1e-12)
    local st = buf:stats()
    assert.are.same({ 2, 0, 2, 1 }, { st.size, st.held_entries, st.resolved, st.discarded })
    -- "abs_adv" (no advantages without a reward): the largest stored priority, as PER starts
    local abs = rl.replay.new { capacity = 16 }
    local fresh = make_batch(1, 2, function(_, m) return m end)
    fresh.advantages = rl.tensor.zeros(fresh.tokens:numel())
    fresh.advantages:set(2, 3)
    fresh.advantages:set(3, 3)
    fresh.advantages:set(5, 3) -- episode 1's three sampled tokens: mean |A| = 3
    abs:add(fresh, 1)
    abs:add_pending(make_batch(1, 1, zero, 5), 1, { "k" })
    abs:backfill("k", 0.5)
    local pr = abs:sample(1, 2, { resolved = true }).priorities
    assert.are.equal(3, pr[1])
  end)

  it("spares resolved entries from capacity eviction until a draw with resolved = true has taken them", function()
    local buf = rl.replay.new { capacity = 4, unit = "episode", priority = "reward", staleness = 0, seed = 1 }
    buf:add(make_batch(1, 4, function() return 10 end), 1)        -- keys 1-4, priority 10.25
    buf:add_pending(make_batch(1, 2, zero, 5), 1, { "low", "low" }) -- keys 5-6
    buf:backfill("low", -0.25, 2)                                -- reward 0: the lowest weights
    local st = buf:stats()
    assert.are.same({ 4, 2 }, { st.size, st.evicted_capacity })
    assert.are.same({ 3, 4, 5, 6 }, buf:batch().keys) -- the oldest high ones went (ties: the oldest)
    local b = buf:sample(0, 2, { resolved = true })
    assert.are.same({ 5, 6 }, b.keys)
    -- once taken they are ordinary entries, and the lowest weights go first again
    buf:add(make_batch(1, 1, function() return 10 end, 9), 3)
    assert.are.same({ 3, 4, 6, 7 }, buf:batch().keys)
  end)

  it("weighs a resolved entry's tokens by min(pi / pi_behaviour, max_ratio), its ratio exp(mean log ratio)", function()
    local cap = 1.5
    local buf = rl.replay.new { capacity = 16, max_ratio = cap, seed = 2 }
    local pend = make_batch(2, 2, zero)
    buf:add_pending(pend, 3, keys_of(pend, function(ep) return "g" .. ep.task.g end))
    buf:backfill("g1", 1, 8)
    buf:backfill("g2", 1, 8)
    -- the current policy's log-probs: the behaviour's moved by a different amount per token
    local shift = function(p) return 0.07 * ((p * 7) % 5) - 0.12 end
    local b = buf:sample(0, 8, { resolved = true, logprobs = function(batch)
      local t = batch.logprobs:clone()
      for p = 1, t:numel() do
        if batch.mask:get(p) ~= 0 then t:set(p, batch.logprobs:get(p) + shift(p)) end
      end
      return t
    end })
    assert.are.equal(4, b:size())
    local max_err = 0
    for i = 1, b:size() do
      local sum, n = 0, 0
      for p = b.offsets[i] + 1, b.offsets[i + 1] do
        local w = b.token_weights:get(p)
        if b.mask:get(p) ~= 0 then
          local d = b.policy_logprobs:get(p) - b.logprobs:get(p)
          assert.is_true(math.abs(d - shift(p)) < 1e-6)
          max_err = math.max(max_err, math.abs(w - math.min(math.exp(shift(p)), cap)))
          sum, n = sum + shift(p), n + 1
        else
          assert.are.equal(1, w)
        end
      end
      assert.is_true(math.abs(b.ratios[i] - math.exp(sum / n)) < 1e-6, "ratio of episode " .. i)
      assert.is_true(b.resolved[i])
    end
    assert.is_true(max_err < 1e-6, "max token-weight error " .. max_err)
    -- an episode whose ratio is beyond max_ratio takes its entry out instead
    local far = rl.replay.new { capacity = 16, max_ratio = cap }
    far:add_pending(make_batch(1, 2, zero), 1, { "k", "k" })
    far:backfill("k", 1)
    local none = far:sample(0, 2, { resolved = true, logprobs = function(batch)
      local t = batch.logprobs:clone()
      for p = 1, t:numel() do t:set(p, t:get(p) + batch.mask:get(p)) end -- ratio e > 1.5
      return t
    end })
    assert.are.equal(0, none:size())
    assert.are.same({ 0, 2 }, { far:stats().size, far:stats().evicted_ratio })
  end)

  it("keeps pending entries and closed keys through state() and load(), in another process too", function()
    local function fill()
      local buf = rl.replay.new { capacity = 24, priority = "reward", staleness = 0.25, seed = 9,
        age_decay = 20 }
      for step = 1, 6 do
        buf:add(make_batch(1, 2, function(_, m) return (step * m) % 3 end, step * 10), step)
        local p = make_batch(2, 2, zero, step * 10 + 5)
        buf:add_pending(p, step, keys_of(p, function(ep) return "e" .. ep.task.g end))
        if step > 2 then buf:backfill("e" .. ((step - 2) * 10 + 6), step / 4, step) end
        if step == 5 then buf:discard("e27", step) end
        if step % 2 == 0 then buf:sample(2, step, { resolved = true }) end
      end
      assert(buf:backfill("e17", 0.75, 6)) -- resolved, not yet taken: taken after the restore
      return buf
    end
    local a = fill()
    local text = rl.json.encode(a:state())
    assert.are.same({ 12, 6 }, { a:stats().pending, a:stats().pending_keys })
    local b = rl.replay.new { capacity = 24, priority = "reward", staleness = 0.25, seed = 9, age_decay = 20 }
    b:load(rl.json.decode(text))
    assert.are.equal(text, rl.json.encode(b:state()))
    local CONTINUE = [==[
      local rl = require "moonrl"
      return function(buf)
        local out = {}
        for step = 7, 10 do
          out[#out + 1] = rl.json.encode(buf:pending())
          for _, p in ipairs(buf:pending()) do
            if step - p.step >= 3 then assert(buf:backfill(p.key, function(ep) return ep.seed / 8 end, step)) end
          end
          local s = buf:sample(2, step, { resolved = true })
          out[#out + 1] = rl.json.encode { s.keys, s.weights, s.resolved, s.ages, s.priorities,
            s.logprobs:totable() }
        end
        local ok, why = buf:backfill("e27", 1)
        out[#out + 1] = tostring(ok) .. " " .. why
        return table.concat(out, "\n")
      end
    ]==]
    local continue = assert(load(CONTINUE, "=continue"))()
    local want = continue(a)
    assert.are.equal(want, continue(b))
    local state_path, cont_path = H.write_temp(text), H.write_temp(CONTINUE)
    local out, _, ok = H.run_lua([[
      local rl = require "moonrl"
      local buf = rl.replay.new { capacity = 24, priority = "reward", staleness = 0.25, seed = 9, age_decay = 20 }
      buf:load(rl.json.decode(assert(io.open(arg[1])):read("a")))
      io.write(loadfile(arg[2])()(buf))
    ]], state_path, cont_path)
    os.remove(state_path)
    os.remove(cont_path)
    assert.is_true(ok, out)
    assert.are.equal(want, out)
    assert.matches('nil replay: backfill: key "e27" was discarded at step 5 already', want, 1, true)
    -- a state of the first format (no delayed rewards) still loads
    local old = rl.json.decode(rl.json.encode(rl.replay.new { capacity = 4 }:state()))
    old.format, old.held, old.closed = "moonrl.replay/1", nil, nil
    b:load(old)
    assert.are.same({ 0, 0 }, { b:stats().size, b:stats().pending })
  end)

  it("refuses bad calls naming the argument, and a failing reward leaves the buffer as it was", function()
    local buf = rl.replay.new { capacity = 4 }
    local b = make_batch(1, 2, zero)
    H.assert_error(function() buf:add_pending({}, 1, {}) end, "replay: add_pending: batch: an rl.batch expected")
    H.assert_error(function() buf:add_pending(b, 1.5, { "a", "a" }) end, "replay: add_pending: step: an integer expected, got 1.5")
    H.assert_error(function() buf:add_pending(b, 1, { "a" }) end, "replay: add_pending: keys: a list of 2 pending keys expected")
    H.assert_error(function() buf:add_pending(b, 1, { "a", "" }) end, "keys[2]: a non-empty string or an integer expected")
    H.assert_error(function() buf:add_pending(b, 1, { "a", 1.5 }) end, "keys[2]: a non-empty string or an integer expected, got 1.5")
    H.assert_error(function() buf:add_pending(make_batch(1, 5, zero), 1, { 1, 1, 1, 1, 1 }) end,
      "a group of 5 episodes does not fit capacity = 4")
    buf:add_pending(b, 1, { "a", "a" })
    H.assert_error(function() buf:backfill({}, 1) end, "replay: backfill: key: a non-empty string or an integer expected")
    H.assert_error(function() buf:backfill("a", "x") end, "replay: backfill: reward: a finite number or a function")
    H.assert_error(function() buf:backfill("a", 0 / 0) end, "replay: backfill: reward: a finite number")
    H.assert_error(function() buf:backfill("a", 1, 2.5) end, "replay: backfill: step: an integer expected, got 2.5")
    H.assert_error(function() buf:discard(true) end, "replay: discard: key:")
    local before = rl.json.encode(buf:state())
    local calls = 0
    H.assert_error(function()
      buf:backfill("a", function() calls = calls + 1; return calls == 2 and math.huge or 1 end)
    end, "replay: backfill: reward(episode) returned inf, not a finite number")
    assert.are.equal(before, rl.json.encode(buf:state()))
    H.assert_error(function() buf:sample(1, 1, { resolved = 1 }) end, "replay: sample: opts.resolved: a boolean expected, got 1")
    H.assert_error(function() buf:sample(1, 1, { resolve = true }) end, "unknown option 'resolve' (known: logprobs, resolved)")
    local st = buf:state()
    st.held[1].records[1].pending = 3
    H.assert_error(function() buf:load(st) end, "held[1].records[1]: a stored episode expected")
    st = buf:state()
    st.closed = { { key = "a", how = "lost", step = 1 } }
    H.assert_error(function() buf:load(st) end, "closed[1]: {key =, how =, step =} expected")
    assert.are.equal(before, rl.json.encode(buf:state()))
  end)
end)

-- ---------------------------------------------------------------- rl.train{delayed = ...}

local read_lines = H.read_json_lines

-- The run: envs/forecast.lua with delays of 2 steps (a quarter of the questions resolve at
-- once), a resolver whose rewards differ between the members of a group (the episode's seed,
-- so that every resolved group has something to learn), the default update, and a log of what
-- each update saw (the update stage wraps rl.train.update.run).
local DELAYED_RUN = [==[
local rl = require "moonrl"
local root = ...
local F = dofile(root .. "/envs/forecast.lua")
local M = {}
function M.reward(ep) return (ep.seed % 7) / 6 + F.score(ep) end
function M.run(dir, name, extra, delayed_opts)
  local seen = { updates = {}, resolved = {} }
  local buf = rl.replay.new { capacity = 64, priority = "reward", seed = 4, max_ratio = false }
  local delayed = { mode = "backfill", resolve = function(step, pending)
    local out = {}
    for _, p in ipairs(pending) do
      if step - p.step >= 2 then
        out[#out + 1] = { key = p.key, reward = M.reward }
        seen.resolved[p.key] = { at = step, rolled = p.step, episodes = p.episodes }
      end
    end
    return out
  end }
  for k, v in pairs(delayed_opts or {}) do delayed[k] = v end
  local o = { model = rl.model.new { vocab = 264, dim = 32, layers = 1, heads = 2, ffn = 64,
      ctx = 128, seed = 2 }, tokenizer = rl.tokenizer.bytes(), env = F, dir = dir, name = name,
    seed = 5, steps = 6, tasks_per_step = 3, group_size = 4, max_turn_tokens = 8, lr = 3e-3,
    sft = { examples = 32, epochs = 1, batch_size = 16, lr = 3e-3 }, eval = false,
    progress = false, plot = false, checkpoint_every = 1,
    tasks = function(_, _, count, s)
      local rng, out = rl.rng(s), {}
      for i = 1, count do out[i] = F.gen({ delay = 2, quick = 0.25 }, rng) end
      return out
    end,
    replay = { buffer = buf, ratio = 0 }, delayed = delayed,
    update = function(ctx, batch, adv, step)
      -- the policy's log-probs as a forward pass of the model gives them now (before the update)
      local all = {}
      for i = 1, batch:size() do all[i] = i end
      local logp = ctx.model:forward_batch { tokens = batch.tokens, mask = batch.mask,
        offsets = batch.offsets, episodes = all }
      local u = { episodes = {} }
      for i, ep in ipairs(batch.episodes) do
        local a, b = batch:range(i)
        local w = {}
        for p = a, b do
          if batch.mask:get(p) ~= 0 then
            w[#w + 1] = { batch.is_weights and batch.is_weights:get(p) or 1,
              batch.policy_logprobs and batch.policy_logprobs:get(p) or batch.logprobs:get(p),
              batch.logprobs:get(p), logp:get(p) }
          end
        end
        local last = ep.record[#ep.record]
        u.episodes[i] = { pending = last.info and last.info.pending, resolved_step = ep.resolved_step, reward = ep.reward,
          seed = ep.seed, weights = w, expected = ep.pending and M.reward(ep) or nil }
      end
      seen.updates[step] = u
      return rl.train.update.run(ctx, batch, adv, step)
    end }
  for k, v in pairs(extra or {}) do o[k] = v end
  if o.replay == false then o.replay = nil end
  for k, v in pairs(delayed) do if v == false then delayed[k] = nil end end
  return rl.train(o), o.model, buf, seen
end
return M
]==]

describe("rl.train{delayed = ...}", function()
  it("keeps pending episodes out of every update until their reward, then trains them once with importance weights", function()
    local dir = H.tmpdir()
    local config = H.script(dir .. "/run.lua", DELAYED_RUN)
    local run = assert(loadfile(config))(H.root)
    local r, _, buf, seen = run.run(dir, "full")
    local h = r.history
    local held, resolved, trained, moved = 0, 0, {}, 0
    for step = 1, 6 do
      local mt = h[step + 1]
      held, resolved = held + mt["delayed/held"], resolved + mt["delayed/resolved"]
      local u = seen.updates[step]
      local n_resolved, wsum, wn = 0, 0, 0
      for i, ep in ipairs(u and u.episodes or {}) do
        if ep.pending then
          -- only once resolved, at the step it resolved, with the backfilled reward
          local res = seen.resolved[ep.pending]
          assert.is_table(res, "an unresolved pending episode was in the update of step " .. step)
          assert.are.equal(step, res.at)
          assert.are.equal(step, ep.resolved_step)
          assert.is_true(step - res.rolled >= 2)
          assert.is_true(math.abs(ep.reward - ep.expected) < 1e-12)
          local k = ep.pending .. "/" .. ep.seed
          assert.is_nil(trained[k], "trained twice: " .. k)
          trained[k] = step
          n_resolved = n_resolved + 1
          -- importance weights: exp(pi - pi_behaviour) per sampled token (max_ratio = false: no
          -- cap), pi the policy's log-prob as a forward pass of the model gives it before the
          -- update, pi_behaviour the rollout's
          for _, w in ipairs(ep.weights) do
            assert.is_true(math.abs(w[2] - w[4]) < 2e-5, "policy log-prob " .. w[2] .. " vs " .. w[4])
            local want = math.exp(w[4] - w[3])
            assert.is_true(math.abs(w[1] - want) <= 1e-4 * want, "is weight " .. w[1] .. " vs " .. want)
            if math.abs(w[1] - 1) > 1e-3 then moved = moved + 1 end
            wsum, wn = wsum + w[1], wn + 1
          end
        else
          assert.is_nil(ep.resolved_step)
        end
      end
      assert.are.equal(mt["delayed/trained"], n_resolved)
      if n_resolved > 0 then
        assert.is_true(math.abs(mt["delayed/is_weight_mean"] - wsum / wn) < 1e-6)
      end
    end
    assert.is_true(held > 0 and resolved > 0, "episodes were held and resolved")
    assert.is_true(moved > 0, "the policy had moved from the behaviour policy")
    -- every episode held by step 4 was resolved (two steps later) and trained exactly once
    local count = 0
    for key, res in pairs(seen.resolved) do
      assert.is_true(res.rolled <= 4, key)
      count = count + res.episodes
    end
    local n = 0
    for _ in pairs(trained) do n = n + 1 end
    assert.are.equal(count, n)
    assert.are.equal(resolved, n)
    -- what is left waits: those of steps 5 and 6
    assert.are.equal(held - resolved, buf:stats().pending)
    assert.are.equal(held - resolved, h[7]["delayed/pending"])
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)

  it("runs identically twice and resumes bit-exactly in another process with episodes pending", function()
    local dir = H.tmpdir()
    local config = H.script(dir .. "/run.lua", DELAYED_RUN)
    local run = assert(loadfile(config))(H.root)
    local _, m_full = run.run(dir, "full")
    local _, m_again = run.run(dir, "again")
    local a, b = m_full:parameters(), m_again:parameters()
    for name, w in pairs(a) do assert.are.equal(0, w:max_abs_diff(b[name]), name) end
    local function same_metrics(x, y)
      local lx, ly = read_lines(dir .. "/" .. x .. "/metrics.jsonl"), read_lines(dir .. "/" .. y .. "/metrics.jsonl")
      assert.are.equal(#lx, #ly)
      for i, rec in ipairs(lx) do
        for k, v in pairs(rec) do
          if not k:match("^time/") and k ~= "tokens_per_s" then
            assert.are.equal(v, ly[i][k], x .. " vs " .. y .. ": step " .. rec.step .. " " .. k)
          end
        end
      end
    end
    same_metrics("full", "again")
    -- stopped after step 3 (episodes of steps 2 and 3 pending), resumed in another process
    run.run(dir, "cut", { stop_after = 3 })
    local cut = rl.json.decode(assert(io.open(dir .. "/cut/state.json")):read("a"))
    assert.is_true(#cut.replay.held > 0, "episodes were pending at the cut")
    local out, _, ok = H.run_lua([[
      local run = loadfile(arg[1])(arg[2])
      run.run(arg[3], "cut", { resume = true })
    ]], config, H.root, dir)
    assert.is_true(ok, out)
    local full = rl.json.decode(assert(io.open(dir .. "/full/state.json")):read("a"))
    local state = rl.json.decode(assert(io.open(dir .. "/cut/state.json")):read("a"))
    assert.are.equal(6, state.step)
    assert.are.equal(rl.json.encode(full.replay), rl.json.encode(state.replay))
    local m_res = rl.model.new { vocab = 264, dim = 32, layers = 1, heads = 2, ffn = 64, ctx = 128, seed = 2 }
    assert.are.equal(6, m_res:load_checkpoint(dir .. "/cut/" .. state.checkpoint))
    local c = m_res:parameters()
    for name, w in pairs(a) do assert.are.equal(0, w:max_abs_diff(c[name]), name) end
    same_metrics("full", "cut")
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)

  it("discard drops pending episodes; max_wait discards keys that wait too long; the env's resolve is the default", function()
    local dir = H.tmpdir()
    local run = assert(loadfile(H.script(dir .. "/run.lua", DELAYED_RUN)))(H.root)
    local r, _, buf, seen = run.run(dir, "discard", { replay = false }, { mode = "discard", resolve = false })
    local held = 0
    for step = 1, 6 do
      local mt = r.history[step + 1]
      assert.are.equal(mt["delayed/held"], mt["delayed/discarded"])
      held = held + mt["delayed/held"]
      for _, ep in ipairs(seen.updates[step] and seen.updates[step].episodes or {}) do assert.is_nil(ep.pending) end
    end
    assert.is_true(held > 0)
    assert.are.equal(0, buf:stats().pending)
    -- max_wait = 1 with a resolver that never resolves: each key goes one step after its rollout
    r = run.run(dir, "expire", nil, { resolve = function() return {} end, max_wait = 1 })
    local discarded = 0
    for step = 1, 6 do discarded = discarded + r.history[step + 1]["delayed/discarded"] end
    assert.are.equal(r.history[7]["delayed/pending"], r.history[7]["delayed/held"])
    local total_held = 0
    for step = 1, 6 do total_held = total_held + r.history[step + 1]["delayed/held"] end
    assert.are.equal(total_held - r.history[7]["delayed/held"], discarded)
    -- forecast's own resolve (task.delay steps after the rollout) when resolve is not given
    r = run.run(dir, "env", nil, { resolve = false })
    local resolved = 0
    for step = 1, 6 do
      local mt = r.history[step + 1]
      resolved = resolved + mt["delayed/resolved"]
      if step <= 2 then assert.are.equal(0, mt["delayed/resolved"]) end
    end
    assert.is_true(resolved > 0)
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)

  it("refuses a pending episode without the delayed option, bad resolver results and bad options, naming them", function()
    local F = dofile(H.root .. "/envs/forecast.lua")
    local m = rl.model.new { vocab = 264, dim = 16, layers = 1, heads = 2, ffn = 32, ctx = 96, seed = 1 }
    local dir = H.tmpdir()
    local n = 0
    local function train(delayed, extra)
      n = n + 1
      local o = { model = m, tokenizer = rl.tokenizer.bytes(), env = F, progress = false, plot = false,
        dir = dir, name = "r" .. n, steps = 3, tasks_per_step = 2, group_size = 2, max_turn_tokens = 4,
        eval = false, delayed = delayed, replay = { buffer = rl.replay.new { capacity = 16 }, ratio = 0 },
        tasks = function(_, _, count, s)
          local rng, out = rl.rng(s), {}
          for i = 1, count do out[i] = F.gen({ delay = 1 }, rng) end
          return out
        end }
      for k, v in pairs(extra or {}) do o[k] = v end
      if o.replay == false then o.replay = nil end
      return rl.train(o)
    end
    H.assert_error(function() train(nil) end, { "train: episode 1 is pending (its last turn's info.pending = \"q",
      "rl.train has no delayed option" })
    H.assert_error(function() train(5) end, "delayed: a table {resolve =, mode =, max_wait =} expected, got 5")
    H.assert_error(function() train { mode = "later" } end, "delayed.mode: one of \"backfill\", \"discard\" expected, got \"later\"")
    H.assert_error(function() train { resolv = print } end, "unknown option 'delayed.resolv' (did you mean 'delayed.resolve'?)")
    H.assert_error(function() train { resolve = 3 } end, "delayed.resolve: a function expected, got 3")
    H.assert_error(function() train { max_wait = 0 } end, "delayed.max_wait: a positive integer expected, got 0")
    H.assert_error(function() train({}, { replay = false }) end, "delayed: mode \"backfill\" keeps pending episodes in the replay buffer")
    H.assert_error(function() train({ mode = "discard", resolve = print }) end, "delayed: mode \"discard\" drops pending episodes at once: leave resolve out")
    H.assert_error(function() train({}, { replay = { buffer = rl.replay.new { capacity = 8, rescore = { version = 1, rescore = print } } } }) end,
      "delayed: the replay buffer re-scores episodes (rescore = g)")
    H.assert_error(function() train({}, { replay = { buffer = rl.replay.new { capacity = 8 }, advantages = "stored" } }) end,
      "delayed: resolved episodes have no stored advantages")
    local bare = setmetatable({ resolve = false }, { __index = F })
    bare.name = "bare"
    H.assert_error(function() train({}, { env = bare }) end, "delayed.resolve: a function(step, pending)")
    -- what resolve returns
    H.assert_error(function() train { resolve = function() return 3 end } end, "train: delayed.resolve: a list {{key =, reward =}, ...} expected, got number")
    H.assert_error(function() train { resolve = function() return { { key = "nope", reward = 1 } } end } end,
      "train: delayed.resolve: item 1: replay: backfill: no episode waits under key \"nope\"")
    H.assert_error(function() train { resolve = function() return { { key = "x" } } end } end,
      "train: delayed.resolve: item 1: reward: a finite number or a function(episode) -> number expected")
    H.assert_error(function() train { resolve = function() return { { key = "x", reward = 1, rewrd = 2 } } end } end,
      "train: delayed.resolve: item 1: unknown field 'rewrd'")
    H.assert_error(function() train { resolve = function() return { { key = "x", reward = 1, discard = true } } end } end,
      "train: delayed.resolve: item 1: give one of reward and discard = true")
    H.assert_error(function()
      train { resolve = function(_, pending) return { { key = pending[1].key, reward = 1 }, { key = pending[1].key, reward = 1 } } end }
    end, "item 2: replay: backfill: key \"q")
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)
end)
