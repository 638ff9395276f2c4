-- rollout_hooks_spec.lua - the hooks of ro:run (on_turn forks, on_branches outcomes, on_action
-- resampling, gate): forks equal a branch tree's episodes bit for bit, dropped forks and cut
-- groups leave no trace in the batch, a gated run shares its first K turns with an ungated one,
-- the selective gate and the edit distance against hand-computed cases, and bad input (hooks
-- that raise, wrong types, unknown fields) named in the errors.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"

local tok = rl.tokenizer.bytes()

local function seq(n, f)
  local t = {}
  for i = 1, n do t[i] = f(i) end
  return t
end

-- The environment: the observation names the turn, the reward is the action's length modulo 2,
-- done after task.turns turns (4); it keeps the actions it saw.
local counter
local function instance(state)
  return {
    task = state.task, n = state.n or 0, seen = state.seen or {},
    reset = function(self, task)
      self.task, self.n, self.seen = task, 0, {}
      return "turn 0"
    end,
    step = function(self, action)
      self.n = self.n + 1
      self.seen[#self.seen + 1] = action
      return "turn " .. self.n, #action % 2, self.n >= (self.task.turns or 4)
    end,
    clone = function(self)
      return instance { task = self.task, n = self.n, seen = { table.unpack(self.seen) } }
    end,
  }
end
counter = {
  name = "counter",
  tasks = function(_, n) return seq(n, function(i) return { i = i } end) end,
  new = function() return instance {} end,
}

local m = rl.model.new { vocab = 264, dim = 32, layers = 2, heads = 2, ffn = 64, ctx = 160, seed = 3 }

local function run(ro, n, extra)
  local opts = { tokenizer = tok, env = counter, tasks = counter.tasks("train", n),
    seeds = seq(n, function(i) return 500 + i end), max_turns = 4, max_turn_tokens = 5,
    temperature = 1, batch_invariant = true }
  for k, v in pairs(extra or {}) do opts[k] = v end
  return ro:run(opts)
end

-- The tokens and log-probabilities of summary i of a batch, as lists.
local function record_of(batch, i)
  local a, b = batch:range(i)
  local t, lp = {}, {}
  for p = a, b do
    t[#t + 1] = batch.tokens:get(p)
    lp[#lp + 1] = batch.logprobs:get(p)
  end
  return t, lp
end

local function actions(summary)
  local out = {}
  for k, r in ipairs(summary.record) do out[k] = r.action end
  return out
end

describe("rl.rollout on_turn forks", function()
  local ro = rl.rollout.new { model = m, episodes = 12, capacity = 160 }

  it("equal a branch tree's episodes bit for bit: tokens, log-probs, rewards, records", function()
    local tree = run(ro, 3, { branch = { turn = 2, k = 3 } })
    local tb = rl.batch.from_rollout(ro, tree, seq(#tree, function(i) return tree[i].branch.root end))
    local forks = {}
    local res = run(ro, 3, {
      on_turn = function(ep) if ep.turns == 2 and not ep.branch then return 3 end end,
      on_branches = function(fork) forks[#forks + 1] = fork end,
    })
    assert.are.equal(9, #res)
    assert.are.same(seq(9, function(i) return i end), res.slots)
    local hb = rl.batch.from_rollout(ro, res, seq(#res, function() return 1 end))
    local matched = 0
    for i, s in ipairs(res) do
      -- the tree's summary of the same episode: the root itself, or its branch of that index
      local j = i
      if s.branch then
        assert.are.equal(2, s.branch.turn)
        j = 3 + (s.branch.root - 1) * 2 + s.branch.index - 1
        assert.are.same({ root = s.branch.root, index = s.branch.index }, tree[j].branch)
      end
      local t1, lp1 = record_of(hb, i)
      local t2, lp2 = record_of(tb, j)
      assert.are.same(t2, t1)
      assert.are.same(lp2, lp1) -- exactly: the same floats
      assert.are.same(tree[j].rewards, s.rewards)
      assert.are.same(actions(tree[j]), actions(s))
      assert.are.equal(tree[j]["end"], s["end"])
      assert.are.equal(tree[j].seed, s.seed)
      matched = matched + 1
    end
    assert.are.equal(9, matched)
    -- every fork's outcomes reached on_branches once all three had ended
    assert.are.equal(3, #forks)
    for _, f in ipairs(forks) do
      assert.are.equal(2, f.turn)
      assert.are.equal(3, #f.branches)
      assert.are.equal(f.episode, f.branches[1].episode)
      for _, b in ipairs(f.branches) do
        assert.are_not.equal("running", b["end"])
        assert.are.same(res[b.episode].rewards, b.rewards)
        local t = record_of(hb, b.episode)
        assert.are.same(t, b.tokens)
      end
    end
  end)

  it("with drop = true reports the branches, then leaves them out of the results", function()
    local values = {}
    local res = run(ro, 4, {
      on_turn = function(ep)
        if ep.turns == 1 and not ep.branch then return { k = 3, drop = true } end
      end,
      on_branches = function(fork) -- a per-turn value: the mean return of the continuations
        local sum = 0
        for _, b in ipairs(fork.branches) do sum = sum + b.return_ end
        values[fork.episode] = sum / #fork.branches
      end,
    })
    assert.are.equal(4, #res)
    assert.are.same({ 1, 2, 3, 4 }, res.slots)
    for i = 1, 4 do
      assert.is_nil(res[i].branch)
      assert.is_number(values[i])
    end
    local b = rl.batch.from_rollout(ro, res, { 1, 2, 3, 4 })
    assert.are.equal(4, b:size())
    -- the batch holds exactly the four roots' tokens
    local plain = rl.batch.from_rollout(ro, run(ro, 4), { 1, 2, 3, 4 })
    assert.are.same(plain.offsets, b.offsets)
    assert.are.equal(0, plain.tokens:max_abs_diff(b.tokens))
  end)

  it("on_action samples a turn again before the environment sees it", function()
    local taken_back, calls = nil, 0
    local res = run(ro, 2, {
      on_action = function(ep, action, attempt)
        if ep.episode ~= 1 or ep.turns ~= 2 then return false end
        calls = calls + 1
        assert.are.equal(calls - 1, attempt)
        taken_back = taken_back or action
        return true
      end,
      max_resamples = 2,
    })
    assert.are.equal(2, calls)
    local seen = res[1].instance.seen
    assert.are.equal(4, #seen)
    assert.are.same(actions(res[1]), seen) -- the environment saw what the record holds
    assert.are_not.equal(taken_back, seen[2])
    -- episode 2 went on as in a run without hooks
    local plain = run(ro, 2)
    assert.are.same(actions(plain[2]), actions(res[2]))
  end)
end)

describe("rl.rollout gate", function()
  local ro = rl.rollout.new { model = m, episodes = 12, capacity = 160 }
  local groups = seq(12, function(i) return 10 + (i - 1) // 3 end) -- 10, 10, 10, 11, ...
  local plain = run(ro, 12, { groups = groups })
  local pb = rl.batch.from_rollout(ro, plain, groups)
  local plain_actions = seq(12, function(i) return actions(plain[i]) end)
  local plain_tokens = seq(12, function(i) return (record_of(pb, i)) end)

  it("cuts groups that leave no trace in the batch; the others decode as without it", function()
    local seen_at_cut = {}
    local res = run(ro, 12, { groups = groups, gate = { turn = 2, fn = function(g)
      assert.are.equal(2, g.turn)
      assert.are.equal(3, #g.episodes)
      if g.id % 2 == 1 then
        for _, ep in ipairs(g.episodes) do
          assert.are.equal(2, ep.turns) -- it waited at K
          seen_at_cut[ep.episode] = actions(ep)
        end
        return true
      end
    end } })
    assert.are.equal(6, #res)
    assert.are.same({ 1, 2, 3, 7, 8, 9 }, res.slots)
    assert.are.same({ 10, 10, 10, 12, 12, 12 }, res.groups)
    local b = rl.batch.from_rollout(ro, res, res.groups)
    local st = b:stats()
    assert.are.equal(6, st.episodes)
    assert.are.equal(2, st.groups)
    for i, slot in ipairs(res.slots) do
      assert.are.same(plain_tokens[slot], (record_of(b, i)))
    end
    -- counts for the trainer
    local g = res.gate
    assert.are.equal(2, g.turn)
    assert.are.equal(4, g.groups)
    assert.are.equal(2, g.cut)
    assert.are.equal(6, g.episodes_cut)
    assert.is_false(g.finish)
    assert.are.equal(4, #g.decisions)
    assert.are.same({ group = 11, cut = true, episodes = { 4, 5, 6 } }, g.decisions[2])
    -- a cut group's first K turns are the ungated run's
    for e, acts in pairs(seen_at_cut) do
      assert.are.same({ plain_actions[e][1], plain_actions[e][2] }, acts)
    end
  end)

  it("decodes an episode the same alone, among others and in another order (own streams)", function()
    local picked = { 7, 2, 11 }
    local res = ro:run { tokenizer = tok, env = counter, max_turns = 4, max_turn_tokens = 5,
      temperature = 1, batch_invariant = true,
      tasks = seq(3, function(j) return counter.tasks("train", 12)[picked[j]] end),
      seeds = seq(3, function(j) return 500 + picked[j] end) }
    local b = rl.batch.from_rollout(ro, res, { 1, 2, 3 })
    for j, e in ipairs(picked) do
      local t, lp = record_of(b, j)
      local t2, lp2 = record_of(pb, e)
      assert.are.same(t2, t)
      assert.are.same(lp2, lp)
    end
  end)

  it("with finish = true runs cut groups to the end, off the batch, and says whether they were flat", function()
    local res = run(ro, 12, { groups = groups, gate = { turn = 2, finish = true,
      fn = function(g) return g.id == 11 end } })
    assert.are.equal(9, #res)
    local d = res.gate.decisions[2]
    assert.is_true(d.cut)
    local want = seq(3, function(j) return plain[3 + j].return_ end)
    assert.are.same(want, d.returns) -- the returns the group would have had
    assert.are.equal(want[1] == want[2] and want[2] == want[3], d.zero_variance)
    assert.are.equal(d.zero_variance and 1 or 0, res.gate.cut_zero_variance)
  end)

  it("the selective gate cuts groups that act alike and keeps those that do not", function()
    -- greedy: every episode of a group acts alike (distance 0); all cut, the batch is empty
    local res = run(ro, 12, { groups = groups, temperature = 0, gate = { turn = 2 } })
    assert.are.equal(0, #res)
    assert.are.equal(4, res.gate.cut)
    for _, d in ipairs(res.gate.decisions) do
      assert.are.equal(0, d.distance)
      assert.are.equal(0, d.termination)
    end
    local empty = rl.batch.from_rollout(ro, res, res.groups)
    assert.are.equal(0, empty:size())
    -- five random tokens an action: no two alike (distance 1); none cut
    res = run(ro, 12, { groups = groups, gate = { turn = 2, d_low = 0.12 } })
    assert.are.equal(12, #res)
    assert.are.equal(0, res.gate.cut)
    for _, d in ipairs(res.gate.decisions) do assert.are.equal(1, d.distance) end
    -- the gate's distance is rl.advantage's over the same actions
    res = run(ro, 12, { groups = groups, top_k = 2, max_turn_tokens = 1,
      gate = { turn = 3, d_low = 0.5 } })
    local got = {}
    for i, s in ipairs(res) do got[res.slots[i]] = s end
    for _, d in ipairs(res.gate.decisions) do
      if not d.cut then
        local per = {}
        for j, e in ipairs(d.episodes) do
          per[j] = { table.unpack(actions(got[e]), 1, 3) }
        end
        local want = rl.advantage.selective_rollout_gate({ actions_per_traj = per },
          { K = 3, d_low = 0.5, t_high = 2 })
        assert.is_near(want.prefix_edit_distance_mean, d.distance, 1e-12)
      end
    end
  end)
end)

describe("the edit distance (rl.advantage), hand-computed", function()
  local A = rl.advantage
  local function chars(s)
    local t = {}
    for c in s:gmatch(".") do t[#t + 1] = c end
    return t
  end

  it("is Levenshtein over symbols divided by the longer length", function()
    assert.are.equal(3 / 7, A.normalized_edit_distance { a = chars "kitten", b = chars "sitting" }.distance)
    assert.are.equal(0, A.normalized_edit_distance { a = chars "abc", b = chars "abc" }.distance)
    assert.are.equal(2 / 3, A.normalized_edit_distance { a = chars "abc", b = chars "cba" }.distance)
    assert.are.equal(1 / 3, A.normalized_edit_distance { a = chars "abc", b = chars "ab" }.distance)
    -- whole action strings are one symbol each
    assert.are.equal(1 / 2, A.normalized_edit_distance { a = { "go north", "take key" },
      b = { "go north", "take lamp" } }.distance)
  end)

  it("pads prefixes that ended before K and averages over pairs", function()
    -- {ab}, {ac}, {a<END>} at K = 2: each pair differs in one of two places
    local g = A.selective_rollout_gate({ actions_per_traj = { { "a", "b" }, { "a", "c" }, { "a" } } },
      { K = 2, d_low = 0.6, t_high = 2 })
    assert.are.equal(0.5, g.prefix_edit_distance_mean)
    assert.is_near(1 / 3, g.termination_fraction, 1e-15)
    assert.is_true(g.cut)
    g = A.selective_rollout_gate({ actions_per_traj = { { "x", "y", "z" }, { "z", "y", "x" }, { "x" } } },
      { K = 3, d_low = 0.12, t_high = 2 })
    assert.is_near(7 / 9, g.prefix_edit_distance_mean, 1e-15)
    assert.is_false(g.cut)
  end)
end)

describe("rl.rollout hooks refuse bad input", function()
  local ro = rl.rollout.new { model = m, episodes = 6, capacity = 160 }
  local groups = { 1, 1, 2, 2 }

  it("raise a hook's error with its name and episode; the rollout stays usable", function()
    H.assert_error(function() run(ro, 2, { on_turn = function() error("boom") end }) end,
      { "on_turn (episode ", "boom" })
    H.assert_error(function() run(ro, 2, { on_turn = function() error({}) end }) end,
      { "on_turn (episode ", "(error object is a table value)" })
    H.assert_error(function() run(ro, 2, { on_turn = function() return "two" end }) end,
      "returned string; expected nil, a number of episodes k >= 2 or {k =, drop =}")
    H.assert_error(function() run(ro, 2, { on_turn = function() return { k = 2, keep = 1 } end }) end,
      "a field other than k and drop")
    H.assert_error(function() run(ro, 2, { on_turn = function() return { k = 1 } end }) end,
      "returned table; expected nil, a number of episodes k >= 2")
    H.assert_error(function() run(ro, 2, { on_turn = function() return 9 end }) end,
      { "on_turn (episode ", "no room for 8 branches: the rollout holds 6 episodes and 2 are in use" })
    H.assert_error(function()
      run(ro, 2, { on_turn = function(ep) if ep.turns == 1 and not ep.branch then return 2 end end,
        on_branches = function() error("no thanks") end })
    end, { "on_branches (episode ", "no thanks" })
    H.assert_error(function() run(ro, 2, { on_action = function() error("bad action") end }) end,
      { "on_action (episode ", "bad action" })
    H.assert_error(function()
      run(ro, 4, { groups = groups, gate = { turn = 1, fn = function() error("gate broke") end } })
    end, { "gate (group 1)", "gate broke" })
    local noclone = { name = "noclone", tasks = counter.tasks,
      new = function() local i = counter.new() i.clone = nil return i end }
    H.assert_error(function()
      ro:run { tokenizer = tok, env = noclone, tasks = { {} }, seeds = { 1 }, max_turns = 2,
        on_turn = function() return 2 end }
    end, "on_turn (episode 1): the episode's environment has no clone()")
    local res = run(ro, 2)
    assert.are.equal(2, #res)
  end)

  it("name the option of a wrong type or field", function()
    H.assert_error(function() run(ro, 2, { on_turn = 3 }) end, "on_turn: a function expected, got number")
    H.assert_error(function() run(ro, 2, { on_branches = {} }) end, "on_branches: a function expected")
    H.assert_error(function() run(ro, 2, { on_action = "x" }) end, "on_action: a function expected")
    H.assert_error(function() run(ro, 2, { max_resamples = 0 }) end, "max_resamples")
    H.assert_error(function() run(ro, 2, { batch_invariant = 1 }) end, "batch_invariant: true or false expected")
    H.assert_error(function() run(ro, 4, { gate = { turn = 1 } }) end, "gate: groups (the group of each task) is required")
    H.assert_error(function() run(ro, 4, { groups = groups, gate = 1 }) end, "gate: a table")
    H.assert_error(function() run(ro, 4, { groups = groups, gate = { turn = 0 } }) end, "gate.turn: a turn number >= 1")
    H.assert_error(function() run(ro, 4, { groups = groups, gate = { turn = 1, dlow = 0.1 } }) end,
      "gate: unknown field 'dlow'")
    H.assert_error(function() run(ro, 4, { groups = groups, gate = { turn = 1, d_low = "x" } }) end,
      "gate.d_low: a number expected")
    H.assert_error(function() run(ro, 4, { groups = groups, gate = { turn = 1, finish = "yes" } }) end,
      "gate.finish: true or false expected")
    H.assert_error(function() run(ro, 4, { groups = groups, gate = { turn = 1, fn = 2 } }) end,
      "gate.fn: a function expected, got number")
    H.assert_error(function()
      run(ro, 4, { groups = groups, gate = { turn = 1, d_low = 0.2, fn = function() end } })
    end, "gate.d_low: the built-in gate's, not fn's")
    H.assert_error(function() run(ro, 4, { groups = { 1, 2 } }) end, "groups: a list as long as tasks")
    H.assert_error(function() run(ro, 4, { groups = { 1, 2, "x", 4 } }) end, "groups[3]: an integer expected")
    H.assert_error(function()
      run(ro, 2, { branch = { turn = 1, k = 2 }, on_turn = function() end })
    end, "branch: a tree does not run with hooks")
    H.assert_error(function() run(ro, 2, { on_turns = function() end }) end,
      { "unknown field 'on_turns'", "on_turn" })
    assert.are.equal(2, #run(ro, 2))
  end)
end)

describe("rl.train's rollout stage with rollout_hooks", function()
  local function config(extra)
    local o = { model = m, tokenizer = tok, env = counter, tasks_per_step = 4, group_size = 3,
      max_turns = 3, max_turn_tokens = 4, eval = false, progress = false, plot = false }
    for k, v in pairs(extra or {}) do o[k] = v end
    return assert(rl.train.options.check(o))
  end
  local function context(c)
    return { cfg = c, model = m, tokenizer = tok, stages = { rollout = rl.train.rollout.run },
      ro = rl.rollout.new { model = m, episodes = 12, capacity = 160 } }
  end
  local odd = function(g) return g.id % 2 == 1 end

  it("returns the batch the hooks kept with the gate's counts in batch.gate", function()
    local c = config { batch_invariant = true, rollout_hooks = { gate = { turn = 1, fn = odd } } }
    local ctx = context(c)
    local req = { tasks = counter.tasks("train", 4), repeats = 3, seed = 9, temperature = 1,
      group_base = 100, hooks = c.rollout_hooks }
    local b = rl.train.rollout.run(ctx, req)
    assert.are.equal(6, b:size())
    for _, ep in ipairs(b.episodes) do assert.is_true(ep.group == 102 or ep.group == 104) end
    assert.are.same({ 2, 4, 6 }, { b.gate.turn * 2, b.gate.groups, b.gate.episodes_cut })
    assert.are.equal(2, b.gate.cut)
    -- the kept groups are the episodes of an ungated run, token for token
    req.hooks = nil
    local plain = rl.train.rollout.run(ctx, req)
    assert.is_nil(plain.gate)
    local kept = plain:select { 4, 5, 6, 10, 11, 12 }
    assert.are.same(kept.offsets, b.offsets)
    assert.are.equal(0, kept.tokens:max_abs_diff(b.tokens))
    assert.are.equal(0, kept.logprobs:max_abs_diff(b.logprobs))
  end)

  it("forks from on_turn in a rollout with room for the branches; sample sums the gate over tries", function()
    local c = config { rollout_hooks = { fork_room = 12,
      on_turn = function(ep) if ep.turns == 1 and not ep.branch then return 2 end end } }
    local ctx = context(c)
    local b = rl.train.rollout.run(ctx, { tasks = counter.tasks("train", 4), repeats = 3, seed = 9,
      temperature = 1, group_base = 0, hooks = c.rollout_hooks })
    assert.are.equal(24, b:size())
    local per_group = {}
    for _, ep in ipairs(b.episodes) do per_group[ep.group] = (per_group[ep.group] or 0) + 1 end
    assert.are.same({ 6, 6, 6, 6 }, per_group) -- a branch is in its parent's group
    -- rollout.sample: the gate's counts come back in info.gate (and on the batch)
    c = config { dynamic_sampling = true, max_sampling_tries = 2,
      rollout_hooks = { gate = { turn = 1, fn = odd } } }
    ctx = context(c)
    local batch, info = rl.train.rollout.sample(ctx, 1)
    assert.is_true(info.tries > 1) -- the cut groups did not fill the batch
    assert.are.equal(info.groups_drawn, info.gate.groups)
    assert.are.equal(info.groups_drawn, #info.gate.decisions)
    local cut = 0
    for _, d in ipairs(info.gate.decisions) do
      assert.are.equal(d.group % 2 == 1, d.cut)
      cut = cut + (d.cut and 1 or 0)
    end
    assert.are.equal(cut, info.gate.cut)
    if batch then assert.are.equal(info.gate, batch.gate) end
    -- a gate that cuts every group leaves no batch: the step is skipped
    c = config { rollout_hooks = { gate = { turn = 1, fn = function() return true end } } }
    local none, why = rl.train.rollout.sample(context(c), 1)
    assert.is_nil(none)
    assert.are.equal(4, why.gate.cut)
  end)

  it("trains with a gate, steps whose groups were all cut skipped", function()
    local dir = H.tmpdir()
    local seen = {}
    local calls = 0
    local r = rl.train { model = rl.model.new { vocab = 264, dim = 16, layers = 1, heads = 2, ffn = 32,
      ctx = 96, seed = 5 }, tokenizer = tok, env = counter, dir = dir, seed = 2, steps = 3,
      tasks_per_step = 2, group_size = 2, max_turns = 2, max_turn_tokens = 3, eval = false,
      progress = false, plot = false,
      rollout_hooks = { gate = { turn = 1, fn = function(g)
        calls = calls + 1
        return calls > 2 -- the first step keeps both groups, the others cut all
      end } },
      on_step = function(step, mt) seen[step] = mt end }
    assert.are.equal(3, #r.history - 1)
    assert.are.equal(4, seen[1].episodes)
    assert.are.equal(1, seen[2].skipped)
    assert.are.equal(1, seen[3].skipped)
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)

  it("checks the option: unknown fields, wrong types, and what it cannot go with", function()
    local function refused(extra, wanted)
      local o = { model = m, tokenizer = tok, env = counter }
      for k, v in pairs(extra) do o[k] = v end
      local cfg, err = rl.train.options.check(o)
      assert.is_nil(cfg)
      for _, w in ipairs(type(wanted) == "table" and wanted or { wanted }) do
        assert.is_truthy(err:find(w, 1, true), err)
      end
    end
    refused({ rollout_hooks = { gat = {} } }, "rollout_hooks: unknown field 'gat' (did you mean 'gate'?)")
    refused({ rollout_hooks = 3 }, "rollout_hooks: a table {on_turn =")
    refused({ rollout_hooks = { on_turn = "x" } }, "rollout_hooks: on_turn: a function expected")
    refused({ rollout_hooks = { max_resamples = 0 } }, "rollout_hooks: max_resamples: a positive integer")
    refused({ rollout_hooks = { gate = {} } }, "rollout_hooks: gate: turn: a positive integer expected (it is required)")
    refused({ rollout_hooks = { gate = { turn = 1, dl = 1 } } }, "gate: unknown field 'dl'")
    refused({ rollout_hooks = { gate = { turn = 1, d_low = 0.1, fn = print } } },
      "d_low and t_high are the built-in gate's")
    refused({ rollout_hooks = { gate = { turn = 1 } }, tree = { turn = 1, k = 2 }, group_size = 2 },
      "rollout_hooks: a tree does not run with hooks")
    refused({ batch_invariant = "yes" }, "batch_invariant: true or false expected")
    local ok = rl.train.options.check { model = m, tokenizer = tok, env = counter,
      rollout_hooks = { gate = { turn = 2 } }, batch_invariant = true }
    assert.are.equal(1, ok.rollout_hooks.max_resamples or 1)
    -- state.json can hold the option (functions by name)
    local rec = rl.train.options.record(config { rollout_hooks = { on_turn = print,
      gate = { turn = 1, fn = odd } } })
    assert.are.same({ on_turn = "<function>", gate = { turn = 1, fn = "<function>" } }, rec.rollout_hooks)
    assert.is_string(rl.json.encode(rec))
  end)
end)
