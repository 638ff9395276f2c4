-- diagnostics_spec.lua - the trainer's diagnostics (moonrl.train.diagnostics and rl.batch's
-- stats): effective sample utilisation, zero-variance groups with unscorable episodes, the
-- gradient-norm spike rule on hand-made sequences, turns and the tool-call rate, the gate's
-- counts from the rollout stage, per-phase seconds, and the diagnostics plot; each against a
-- value worked out here by hand or from the step's own episodes.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"

local diag = rl.train.diagnostics
local T = rl.tensor
local tok = rl.tokenizer.bytes()

-- A batch of hand-made episodes: each {group =, reward =, len = tokens (all sampled but the
-- first), unscorable =, record =}.
local function batch_of(list)
  local tokens, mask, offsets, eps = {}, {}, { 0 }, {}
  for i, e in ipairs(list) do
    for k = 1, e.len or 2 do
      tokens[#tokens + 1] = 97
      mask[#mask + 1] = k == 1 and 0 or 1
    end
    offsets[i + 1] = #tokens
    eps[i] = { group = e.group, reward = e.reward, record = e.record or { { action = "a", reward = e.reward } },
      reward_status = e.unscorable and "unscorable" or nil }
  end
  local zeros = {}
  for k = 1, #tokens do zeros[k] = 0 end
  return rl.batch.new { tokens = T.from(tokens), logprobs = T.from(zeros), mask = T.from(mask),
    turns = T.from(zeros), offsets = offsets, episodes = eps }
end

-- One turn: reward 1 when the reply starts with a lowercase letter; such a reply is marked a
-- tool call (info.tool_call), so the tool-call rate of a step is its success rate.
local letter_env = H.letter_env("letter_calls", true)

local function model() return rl.model.new { vocab = 264, dim = 32, layers = 1, heads = 2, ffn = 64, ctx = 32, seed = 3 } end

describe("diagnostics", function()
  it("utilisation counts the episodes with a non-zero advantage on a sampled token", function()
    local b = batch_of { { group = 1, reward = 0, len = 3 }, { group = 1, reward = 1, len = 3 },
      { group = 2, reward = 0, len = 3 }, { group = 2, reward = 1, len = 3 } }
    -- episode 1: all zero; 2: one sampled token non-zero (a token-level estimator's way);
    -- 3: non-zero only on its prompt token (mask 0: not learnt from); 4: every token
    local adv = T.from { 0, 0, 0, 0, 0, -0.5, 2, 0, 0, 1, 1, 1 }
    assert.are.equal(0.5, diag.utilisation(b, adv))
    assert.are.equal(0, diag.utilisation(b, T.zeros(12)))
    assert.are.equal(1, diag.utilisation(b, T.ones(12)))
  end)

  it("counts zero-variance groups over the scorable episodes; a group with none is left out", function()
    local b = batch_of {
      { group = 1, reward = 1 }, { group = 1, reward = 1 }, { group = 1, reward = 1 }, -- flat
      { group = 2, reward = 1 }, { group = 2, reward = 0 }, { group = 2, reward = 1, unscorable = true },
      { group = 3, reward = 1 }, { group = 3, reward = 0, unscorable = true }, -- one scorable: flat
      { group = 4, reward = 0, unscorable = true }, { group = 4, reward = 1, unscorable = true }, -- out
      { group = 5, reward = 1 }, -- a group of one: never zero-variance
    }
    local s = b:stats()
    assert.are.equal(5, s.groups)
    assert.are.equal(2 / 4, s.zero_variance_groups) -- groups 1 and 3 of groups 1, 2, 3 and 5
    -- the reward of an unscorable episode does not break a group's equality either
    local c = batch_of { { group = 1, reward = 0.5 }, { group = 1, reward = 0.5 },
      { group = 1, reward = 9, unscorable = true } }
    assert.are.equal(1, c:stats().zero_variance_groups)
  end)

  it("stats count the most turns and the tool calls per turn (parsed calls and info.tool_call)", function()
    local call = { kind = "call", name = "calc", args = {} }
    local b = batch_of {
      { group = 1, reward = 0, record = { { action = "CALL calc", parsed = call }, { action = "x" },
        { action = "y", info = { tool_call = true } } } },
      { group = 2, reward = 0, record = { { action = "z", parsed = { kind = "text", text = "z" } } } },
    }
    local s = b:stats()
    assert.are.equal(3, s.turns_max)
    assert.are.equal(2, s.turns_mean)
    assert.are.equal(2 / 4, s.tool_calls_per_turn)
  end)

  it("a gradient norm is a spike above factor x the median of the last window steps'", function()
    assert.are.equal(1.5, diag.median { 3, 1, 2, 1 })
    assert.are.equal(2, diag.median { 3, 1, 2 })
    assert.is_nil(diag.median {})
    local opts = { factor = 3, window = 20, min_steps = 5 }
    -- too few earlier steps: no median, no spike
    assert.are.same({ false }, { diag.spike({ 1, 1, 1, 1 }, 100, opts) })
    assert.are.same({ true, 1 }, { diag.spike({ 1, 1, 1, 1, 1 }, 3.5, opts) })
    assert.are.same({ false, 1 }, { diag.spike({ 1, 1, 1, 1, 1 }, 3, opts) }) -- not above 3 x 1
    -- the window: only the last 3 earlier norms count
    assert.are.same({ true, 1 }, { diag.spike({ 50, 50, 50, 1, 1, 1 }, 4, { factor = 3, window = 3, min_steps = 3 }) })
    -- over a run's history: norms by step, the spikes worked out by hand
    local norms = { 1.0, 1.2, 0.8, 1.1, 0.9, 5.0, 1.0, 4.0, 1.0 }
    local want = {
      { nil, 0, 0 }, { nil, 0, 0 }, { nil, 0, 0 }, { nil, 0, 0 }, { nil, 0, 0 },
      { 1.0, 1, 1 },  -- median of 1.0 1.2 0.8 1.1 0.9 is 1.0: 5.0 > 3
      { 1.05, 0, 1 }, -- median of the six so far: (1.0 + 1.1) / 2
      { 1.0, 1, 2 },  -- median of 0.8 0.9 1.0 1.0 1.1 1.2 5.0: 4.0 > 3
      { 1.05, 0, 2 }, -- median of those and 4.0: (1.0 + 1.1) / 2
    }
    local history = { { step = 0 } }
    for s, v in ipairs(norms) do
      local mt = { step = s, ["loss/updates"] = 1, ["loss/grad_norm"] = v / 2, ["loss/grad_norm_max"] = v }
      for k, x in pairs(diag.grad_metrics(history, mt, opts)) do mt[k] = x end
      local w = want[s]
      if w[1] then assert.is_near(w[1], mt["grad/norm_median"], 1e-12, "step " .. s) else assert.is_nil(mt["grad/norm_median"]) end
      assert.are.equal(w[2], mt["grad/spike"], "step " .. s)
      assert.are.equal(w[3], mt["grad/spikes"], "step " .. s)
      history[#history + 1] = mt
      if s == 3 then history[#history + 1] = { step = 3.5, ["loss/updates"] = 0 } end -- no update: skipped
    end
    assert.are.same({}, diag.grad_metrics(history, { ["loss/updates"] = 0 }, opts))
  end)

  it("the gate's counts sum over the rollouts and give the cut rate and precision", function()
    local acc = diag.add_gate(nil, { groups = 8, cut = 2, cut_zero_variance = 2, note = "x" })
    acc = diag.add_gate(acc, { groups = 8, cut = 4, cut_zero_variance = 1 })
    assert.is_nil(diag.add_gate(nil, nil))
    local mt = diag.gate_metrics(acc)
    assert.are.equal(16, mt["gate/groups"])
    assert.are.equal(6, mt["gate/cut"])
    assert.are.equal(6 / 16, mt["gate/cut_rate"])
    assert.are.equal(3 / 6, mt["gate/precision"])
    assert.is_nil(mt["gate/note"])
    assert.is_nil(diag.gate_metrics { groups = 8, cut = 0, cut_zero_variance = 0 }["gate/precision"])
    assert.are.same({}, diag.gate_metrics(nil))
  end)

  it("a tiny run logs each diagnostic with the value its episodes give, and plots them", function()
    local dir = H.tmpdir()
    local seen = {}
    -- the default log stage, after noting what the step's own episodes give
    local function log(ctx, step, mt, batch)
      if batch then
        local groups, calls, turns, tmax = {}, 0, 0, 0
        for _, ep in ipairs(batch.episodes) do
          groups[ep.group] = groups[ep.group] or {}
          table.insert(groups[ep.group], ep.reward)
          for _, r in ipairs(ep.record) do
            turns = turns + 1
            if r.info and r.info.tool_call then calls = calls + 1 end
          end
          tmax = math.max(tmax, ep.turns)
        end
        local flat, n, mixed_eps = 0, 0, 0
        for _, rs in pairs(groups) do
          n = n + 1
          local same = true
          for _, r in ipairs(rs) do same = same and r == rs[1] end
          if same then flat = flat + 1 else mixed_eps = mixed_eps + #rs end
        end
        seen[step] = { zero = flat / n, calls = calls / turns, tmax = tmax,
          -- GRPO gives every episode of a group with two rewards a non-zero advantage, and
          -- none of a group with one
          used = mixed_eps / batch:size() }
      end
      rl.train.log.step(ctx, step, mt, batch)
    end
    local gate_seen = 0
    local function rollout(ctx, req)
      local b = rl.train.rollout.run(ctx, req)
      if req.group_base > 0 then -- training, not the evaluation: a gate's counts, injected
        gate_seen = gate_seen + 1
        b.gate = { groups = 6, cut = 2, cut_zero_variance = 1 }
      end
      return b
    end
    local r = rl.train { model = model(), tokenizer = tok, env = letter_env, dir = dir, seed = 4,
      steps = 6, tasks_per_step = 4, group_size = 4, max_turn_tokens = 1, lr = 1e-2, minibatch = 8,
      eval = { every = 3, tasks = 4, k = 1 }, progress = false, log = log, rollout = rollout,
      grad_spike = { factor = 1.5, window = 3, min_steps = 2 } }
    assert.are.equal(6, gate_seen)
    local metrics = H.read_json_lines(dir .. "/letter_calls/metrics.jsonl")
    assert.are.equal(7, #metrics)
    local norms = {}
    local spikes = 0
    for s = 1, 6 do
      local mt, want = metrics[s + 1], seen[s]
      assert.are.same(mt, r.history[s + 1]) -- what was logged is the history
      assert.are.equal(want.zero, mt.zero_variance_groups, "step " .. s)
      assert.are.equal(want.calls, mt.tool_calls_per_turn, "step " .. s)
      assert.are.equal(want.tmax, mt.turns_max)
      assert.are.equal(1, mt.turns_mean)
      assert.are.equal(want.used, mt["adv/utilisation"], "step " .. s)
      assert.are.equal(6, mt["gate/groups"])
      assert.are.equal(2 / 6, mt["gate/cut_rate"])
      assert.are.equal(1 / 2, mt["gate/precision"])
      -- the phases are parts of the step
      local phases = mt["time/rollout"] + mt["time/reward"] + mt["time/update"] + (mt["time/eval"] or 0)
      assert.is_true(phases <= mt["time/step"], "step " .. s)
      assert.are.equal(s % 3 == 0, mt["time/eval"] ~= nil)
      if mt["loss/updates"] > 0 then
        -- the spike rule again, on the logged norms
        assert.is_true(mt["loss/grad_norm_max"] >= mt["loss/grad_norm"])
        local spike = false
        if #norms >= 2 then
          local last = { table.unpack(norms, math.max(1, #norms - 2)) }
          table.sort(last)
          local med = #last % 2 == 1 and last[(#last + 1) // 2] or (last[#last // 2] + last[#last // 2 + 1]) / 2
          assert.are.equal(med, mt["grad/norm_median"])
          spike = mt["loss/grad_norm_max"] > 1.5 * med
        end
        if spike then spikes = spikes + 1 end
        assert.are.equal(spike and 1 or 0, mt["grad/spike"])
        assert.are.equal(spikes, mt["grad/spikes"])
        norms[#norms + 1] = mt["loss/grad_norm_max"]
      else
        assert.is_nil(mt["grad/spike"])
      end
    end
    assert.is_true(#norms >= 3, "updates happened")
    local svg = assert(io.open(dir .. "/letter_calls/diagnostics.svg")):read("a")
    assert.matches("^<svg", svg)
    for _, text in ipairs { "batch use", "utilisation", "zero%-var%. groups", "tool calls / turn",
      "gate cut rate", "gate precision", "turns per episode", "gradient norm", "seconds per step",
      "rollout", "update" } do
      assert.matches(text, svg)
    end
    local _, panels = svg:gsub('<g transform="translate%(', "")
    assert.are.equal(4, panels)
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)

  it("with dynamic sampling, the gate's counts of every try are summed", function()
    local dir = H.tmpdir()
    local tries = {}
    rl.train { model = model(), tokenizer = tok, env = letter_env, dir = dir, seed = 4, steps = 2,
      tasks_per_step = 8, group_size = 4, max_turn_tokens = 1, dynamic_sampling = true,
      max_sampling_tries = 3, eval = false, progress = false, plot = false,
      rollout = function(ctx, req)
        local b = rl.train.rollout.run(ctx, req)
        b.gate = { groups = #req.tasks, cut = 1 }
        return b
      end,
      on_step = function(_, mt) tries[#tries + 1] = mt end }
    for _, mt in ipairs(tries) do
      assert.is_true(mt["sampling/tries"] > 1) -- (groups of 4 at 10% success are mostly flat)
      assert.are.equal(mt["sampling/tries"], mt["gate/cut"]) -- one cut reported by each try
      assert.is_true(mt["gate/groups"] > 8) -- the first try's 8 groups and the later tries'
      assert.is_nil(mt["gate/precision"]) -- no cut_zero_variance given
    end
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)

  it("grad_spike's options are checked", function()
    local o = { model = model(), tokenizer = tok, env = letter_env, dir = "/nonexistent", steps = 1 }
    o.grad_spike = { factr = 2 }
    assert.matches("unknown option 'grad_spike.factr' %(did you mean 'grad_spike.factor'%?%)",
      H.error_of(rl.train, o))
    o.grad_spike = { window = 0 }
    assert.matches("grad_spike.window: a positive integer expected, got 0", H.error_of(rl.train, o))
  end)

  it("plot.render_panels lays figures out in a grid and checks its arguments", function()
    local fig = { title = "a", series = { { name = "s", points = { { 1, 1 }, { 2, 3 } } },
      { name = "marks", points = { { 2, 3 } }, dots = true, line = false } } }
    local svg = rl.plot.render_panels { title = "run", columns = 2, panels = { fig, fig, fig } }
    assert.matches('^<svg xmlns="http://www.w3.org/2000/svg" width="1280" height="834"', svg)
    local _, g = svg:gsub("<g transform", "")
    assert.are.equal(3, g)
    local _, lines = svg:gsub("<polyline", "")
    assert.are.equal(3, lines) -- the markers-only series draws no line
    assert.matches("panels: a non%-empty list of figures expected", H.error_of(rl.plot.render_panels, { panels = {} }))
    assert.matches("columns: a positive integer expected", H.error_of(rl.plot.render_panels, { panels = { fig }, columns = 0 }))
    assert.matches("panels%[1%]%.series: a list of series expected", H.error_of(rl.plot.render_panels, { panels = { {} } }))
  end)
end)
