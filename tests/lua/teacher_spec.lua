-- teacher_spec.lua - TT-OPD's teacher (moonrl.train.teacher, rl.objective.turn_kl / ema): its
-- log-probs of the student's tokens under the privileged context and the turn-level KL against a
-- direct computation with the model API (each context rendered whole, scored on its own), the
-- KL term's gradient against its formula and against finite differences through the weights, the
-- EMA against arithmetic on the weights, token alignment when the privileged text changes the
-- prompt's length (and past the model's context), determinism, resume equal to an uninterrupted
-- run, and option errors that name the option.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"
local teacher = require "moonrl.train.teacher"
local batchlib = require "moonrl.batch"

local tok = rl.tokenizer.bytes()
local END = tok:token_id("<|end|>")
local guess = dofile(H.root .. "/envs/guess_letter.lua")

local function model(seed, ctx)
  return rl.model.new { vocab = 264, dim = 32, layers = 1, heads = 2, ffn = 64, ctx = ctx or 256, seed = seed }
end

local function cat(a, b)
  local out = {}
  for _, x in ipairs(a) do out[#out + 1] = x end
  for _, x in ipairs(b) do out[#out + 1] = x end
  return out
end

-- An episode as the rollout lays it out: prompt (system?, user obs) with the generation prompt,
-- then per turn the action's bytes and <|end|> (sampled: mask 1) and the next observation rendered
-- (mask 0). Returns ids, mask, turns (lists) and the turns' actions.
local function episode(system, obs, actions, replies)
  local msgs = {}
  if system then msgs[#msgs + 1] = { role = "system", content = system } end
  msgs[#msgs + 1] = { role = "user", content = obs }
  local ids = tok:chat(msgs, { add_generation_prompt = true })
  local mask, turns = {}, {}
  for i = 1, #ids do mask[i], turns[i] = 0, -1 end
  for k, a in ipairs(actions) do
    for _, id in ipairs(cat(tok:encode(a), { END })) do
      ids[#ids + 1], mask[#mask + 1], turns[#turns + 1] = id, 1, k - 1
    end
    if replies[k] then
      for _, id in ipairs(tok:chat({ { role = "user", content = replies[k] } }, { add_generation_prompt = true })) do
        ids[#ids + 1], mask[#mask + 1], turns[#turns + 1] = id, 0, k - 1
      end
    end
  end
  return ids, mask, turns
end

-- The test's episodes: {task, obs, actions, replies} each.
local EPISODES = {
  { task = { secret = "dx=flu" }, obs = "new patient", actions = { "hello", "ask fever", "dx flu" },
    replies = { "cough 3d", "yes" } },
  { task = { secret = "dx=pneumonia, xray infiltrate" }, obs = "new patient", actions = { "ask cough", "dx copd" },
    replies = { "no" } },
  { task = { secret = "x" }, obs = "hi", actions = { "a" }, replies = {} },
}

-- A batch of EPISODES under system (or nil).
local function make_batch(system)
  local ids, mask, turns, offsets, eps = {}, {}, {}, { 0 }, {}
  for i, e in ipairs(EPISODES) do
    local a, m, t = episode(system, e.obs, e.actions, e.replies)
    ids, mask, turns = cat(ids, a), cat(mask, m), cat(turns, t)
    offsets[i + 1] = #ids
    eps[i] = { task = e.task, group = 1, reward = 0, turns = #e.actions }
  end
  local z = {}
  for i = 1, #ids do z[i] = 0 end
  return batchlib.new { tokens = rl.tensor.from(ids), mask = rl.tensor.from(mask), turns = rl.tensor.from(turns),
    logprobs = rl.tensor.from(z), offsets = offsets, episodes = eps }
end

local function checked(o)
  local c = assert(rl.train.options.check(o))
  return c
end

-- A context for the teacher's functions: the checked options of a run with this teacher.
local function context(student, t, system, tc)
  local c = checked { model = student, tokenizer = tok, env = guess, system = system, minibatch = 2,
    teacher = tc }
  return { cfg = c, model = student, teacher = t, tokenizer = tok }
end

local function privileged(task) return task.secret end

-- The direct computation: each episode's student and teacher sequences rendered whole with
-- tok:chat and scored with m:logprobs; per token the log-probs of the sampled tokens (in order),
-- with their turns.
local function direct(student, t, system)
  local out = {}
  for i, e in ipairs(EPISODES) do
    local s_ids, mask, turns = episode(system, e.obs, e.actions, e.replies)
    local t_ids, t_mask = episode(system and (system .. "\n" .. e.task.secret) or e.task.secret, e.obs,
      e.actions, e.replies)
    local ls = student:logprobs { tokens = { s_ids } }[1]
    local lt = t:logprobs { tokens = { t_ids } }[1]
    local rec = { student = {}, teacher = {}, turns = {} }
    for p = 2, #s_ids do
      if mask[p] == 1 then
        rec.student[#rec.student + 1] = ls[p - 1]
        rec.turns[#rec.turns + 1] = turns[p]
      end
    end
    for p = 2, #t_ids do
      if t_mask[p] == 1 then rec.teacher[#rec.teacher + 1] = lt[p - 1] end
    end
    out[i] = rec
  end
  return out
end

-- The per-turn mean KL (k1 or k3) of one direct record: {[k] = KL_k}, and the episode's mean.
local function turn_means(rec, kind, truncate)
  local sum, count, seen = {}, {}, {}
  for j, k in ipairs(rec.turns) do
    seen[k] = (seen[k] or 0) + 1
    if not truncate or seen[k] <= truncate then
      local d = rec.student[j] - rec.teacher[j]
      local v = kind == "k3" and (math.exp(-d) + d - 1) or d
      sum[k], count[k] = (sum[k] or 0) + v, (count[k] or 0) + 1
    end
  end
  local per, total, n = {}, 0, 0
  for k, s in pairs(sum) do
    per[k + 1] = s / count[k]
    total, n = total + per[k + 1], n + 1
  end
  return per, total / n
end

local function flat_sampled(tensor, batch, i)
  local out, a, b = {}, batch:range(i)
  for p = a, b do
    if batch.mask:get(p) == 1 then out[#out + 1] = tensor:get(p) end
  end
  return out
end

describe("moonrl.train.teacher", function()
  for _, system in ipairs { false, "be brief" } do
    local sys = system or nil
    it("scores the student's tokens under the privileged context, token for token, and its turn KL "
      .. "equals a direct computation (system " .. tostring(system) .. ")", function()
      local student, t = model(1), model(2)
      for _, kind in ipairs { "k1", "k3" } do
        local ctx = context(student, t, sys, { privileged = privileged, kl = kind })
        local b = make_batch(sys)
        local tt = teacher.prepare(ctx, b)
        local ref = direct(student, t, sys)
        for i, rec in ipairs(ref) do
          local got = flat_sampled(tt.logp, b, i)
          assert.are.equal(#rec.teacher, #got)
          for j = 1, #got do assert.is_true(math.abs(got[j] - rec.teacher[j]) < 1e-4, i .. ":" .. j) end
        end
        local logp = student:forward_batch { tokens = b.tokens, mask = b.mask, offsets = b.offsets, episodes = { 1, 2, 3 } }
        local stats, dlogp = { loss = 0 }, rl.tensor.zeros(b.tokens:numel())
        teacher.add_loss(ctx, tt, b, logp, { 1, 2, 3 }, dlogp, stats)
        local want, per_want = 0, {}
        for i, rec in ipairs(ref) do
          local per, mean = turn_means(rec, kind)
          want = want + mean / #ref
          for k, v in pairs(per) do
            per_want[k] = per_want[k] or {}
            table.insert(per_want[k], v)
          end
        end
        assert.is_true(math.abs(stats.teacher_kl - want) < 1e-4, kind .. " " .. stats.teacher_kl .. " vs " .. want)
        assert.is_true(math.abs(stats.loss - want) < 1e-4) -- coef 1
        teacher.finish(ctx, tt)
        for k, list in pairs(per_want) do
          local m = 0
          for _, v in ipairs(list) do m = m + v / #list end
          assert.is_true(math.abs(ctx.teacher_metrics["teacher/kl_turn_" .. k] - m) < 1e-4, "turn " .. k)
        end
      end
    end)
  end

  it("aligns the tokens whatever the privileged text's length, and without one leaves the context", function()
    local ids = episode("sys", "obs", { "go" }, {})
    for _, text in ipairs { "", "a", "a much longer hint of thirty b" } do
      local seq, shift = teacher.context(tok, "sys", text, ids)
      local whole = episode("sys\n" .. text, "obs", { "go" }, {})
      assert.are.same(whole, seq)
      assert.are.equal(#whole - #ids, shift)
      for p = 1 + #tok:chat { { role = "system", content = "sys" } }, #ids do
        assert.are.equal(ids[p], seq[p + shift])
      end
    end
    local same, zero = teacher.context(tok, "sys", nil, ids)
    assert.are.same(ids, same)
    assert.are.equal(0, zero)
    assert.has_error(function() teacher.context(tok, "other", "x", ids) end,
      "train: teacher: the episode does not start with the run's system message as the chat template renders it")
  end)

  it("leaves out of the KL the tokens pushed past the model's context, and counts a turn's first "
    .. "`truncate` tokens", function()
    local b = make_batch(nil)
    local len1 = b.offsets[2]
    -- a context three tokens shorter than episode 1's teacher sequence
    local shift1 = #tok:chat { { role = "system", content = EPISODES[1].task.secret } }
    local student, t = model(1, len1 + shift1 - 3), model(2, len1 + shift1 - 3)
    local ctx = context(student, t, nil, { privileged = privileged })
    local tt = teacher.prepare(ctx, b)
    local total = 0
    for i = 1, 3 do
      local shift = #tok:chat { { role = "system", content = EPISODES[i].task.secret } }
      local a, e = b:range(i)
      for p = a, e do
        local local_p = p - a + 1
        local fits = local_p + shift <= student:config().ctx
        local want = (b.mask:get(p) == 1 and fits) and 1 or 0
        assert.are.equal(want, tt.mask:get(p), "episode " .. i .. " position " .. local_p)
        if b.mask:get(p) == 1 and not fits then total = total + 1 end
      end
    end
    assert.is_true(total > 0) -- the test reached past the context
    local ctx2 = context(model(1), model(2), nil, { privileged = privileged, truncate = 2 })
    local tt2 = teacher.prepare(ctx2, b)
    for i = 1, 3 do
      local seen = {}
      local a, e = b:range(i)
      for p = a, e do
        if b.mask:get(p) == 1 then
          local k = b.turns:get(p)
          seen[k] = (seen[k] or 0) + 1
          assert.are.equal(seen[k] <= 2 and 1 or 0, tt2.mask:get(p))
        end
      end
    end
  end)

  it("adds coef times the KL's gradient: the formula, and finite differences through the weights", function()
    local b = make_batch("s")
    local student, t = model(3), model(4)
    local ctx = context(student, t, "s", { privileged = privileged, coef = 0.5, weights = { 2, 1, 3 } })
    local tt = teacher.prepare(ctx, b)
    local eps = { 1, 2, 3 }
    local logp = student:forward_batch { tokens = b.tokens, mask = b.mask, offsets = b.offsets, episodes = eps }
    local stats, dlogp = { loss = 0 }, rl.tensor.zeros(b.tokens:numel())
    teacher.add_loss(ctx, tt, b, logp, eps, dlogp, stats)
    -- k1: d/dlogp of 0.5 * mean_b sum_k w_k mean_{t in k} d_t / sum_k w_k (turns of the episode)
    local W = { 2, 1, 3 }
    for i = 1, 3 do
      local count, wsum = {}, 0
      local a, e = b:range(i)
      for p = a, e do
        if b.mask:get(p) == 1 then
          local k = b.turns:get(p)
          if not count[k] then wsum = wsum + W[k + 1] end
          count[k] = (count[k] or 0) + 1
        end
      end
      for p = a, e do
        local want = 0
        if b.mask:get(p) == 1 then
          local k = b.turns:get(p)
          want = 0.5 * W[k + 1] / (wsum * count[k] * 3)
        end
        assert.is_true(math.abs(dlogp:get(p) - want) < 1e-6, p .. ": " .. dlogp:get(p) .. " vs " .. want)
      end
    end
    -- through the weights: backward_batch with dlogp against central differences of the KL
    local function kl_of(m)
      local lp = m:forward_batch { tokens = b.tokens, mask = b.mask, offsets = b.offsets, episodes = eps }
      local st = rl.objective.turn_kl { logp = lp, teacher_logp = tt.logp, mask = tt.mask, turns = b.turns,
        offsets = b.offsets, episodes = eps, kind = "k3", coef = 1 }
      return st.kl
    end
    local m = model(3)
    local lp = m:forward_batch { tokens = b.tokens, mask = b.mask, offsets = b.offsets, episodes = eps }
    local _, d = rl.objective.turn_kl { logp = lp, teacher_logp = tt.logp, mask = tt.mask, turns = b.turns,
      offsets = b.offsets, episodes = eps, kind = "k3" }
    m:backward_batch { tokens = b.tokens, mask = b.mask, offsets = b.offsets, episodes = eps, dlogprobs = d }
    local grads, weights = m:gradients(), m:parameters()
    local checked_n = 0
    for _, name in ipairs { "model.layers.0.mlp.down_proj.weight", "model.norm.weight" } do
      local w, g = weights[name], grads[name]
      assert.is_truthy(w, name)
      local flat_w, flat_g = w:reshape { w:numel() }, g:reshape { g:numel() }
      for _, idx in ipairs { 1, 7, 29 } do
        local x, h = flat_w:get(idx), 1e-2
        flat_w:set(idx, x + h)
        local up = kl_of(m)
        flat_w:set(idx, x - h)
        local down = kl_of(m)
        flat_w:set(idx, x)
        local fd, an = (up - down) / (2 * h), flat_g:get(idx)
        assert.is_true(math.abs(fd - an) <= 2e-3 + 0.05 * math.abs(fd), name .. "[" .. idx .. "]: " .. fd .. " vs " .. an)
        checked_n = checked_n + 1
      end
    end
    assert.are.equal(6, checked_n)
  end)

  it("moves the teacher's weights by EMA toward the student's", function()
    local student, t = model(5), model(6)
    local before, s = {}, {}
    for name, w in pairs(t:parameters()) do before[name] = w:reshape { w:numel() }:totable() end
    for name, w in pairs(student:parameters()) do s[name] = w:reshape { w:numel() }:totable() end
    local ctx = context(student, t, nil, { privileged = privileged, decay = 0.9 })
    teacher.finish(ctx, { sums = {}, counts = {} })
    local n = 0
    for name, w in pairs(t:parameters()) do
      local now = w:reshape { w:numel() }:totable()
      for i, v in ipairs(now) do
        local want = 0.9 * before[name][i] + 0.1 * s[name][i]
        assert.is_true(math.abs(v - want) <= 1e-6 * math.max(1, math.abs(want)), name .. "[" .. i .. "]")
        n = n + 1
      end
    end
    assert.are.equal(t:config().params, n)
    -- the student is unchanged
    for name, w in pairs(student:parameters()) do
      assert.are.same(s[name], w:reshape { w:numel() }:totable())
    end
  end)

  describe("in rl.train", function()
    local RUN = { tokenizer = tok, env = guess, seed = 7, steps = 4, tasks_per_step = 2, group_size = 4,
      max_turn_tokens = 3, lr = 3e-3, minibatch = 4, sft = { examples = 16, epochs = 1, batch_size = 8 },
      eval = false, progress = false, plot = false, overwrite = true,
      rewards = { length = function(ep) return -0.01 * ep.length end }, -- (groups whose rewards differ)
      teacher = { privileged = function(task) return string.format("letter %d", task.letter) end, decay = 0.5,
        coef = 0.3, kl = "k3" } }
    local function run(dir, name, extra)
      local o = {}
      for k, v in pairs(RUN) do o[k] = v end
      for k, v in pairs(extra or {}) do o[k] = v end
      if o.teacher == false then o.teacher = nil end
      o.model, o.dir, o.name = model(8, 128), dir, name
      return rl.train(o), o.model
    end

    it("logs the teacher's KL, is deterministic, and resumes bit-exactly (teacher included)", function()
      local dir = H.tmpdir()
      local r1, m1 = run(dir, "a")
      local r2, m2 = run(dir, "b")
      local _, m3 = run(dir, "cut", { stop_after = 2 })
      local r3, m3r = run(dir, "cut", { resume = true, overwrite = false })
      local updated = 0
      for _, h in ipairs(r1.history) do
        if (h["loss/updates"] or 0) > 0 then
          updated = updated + 1
          assert.is_number(h["loss/teacher_kl"])
          assert.is_number(h["teacher/kl_turn_1"])
          assert.are_not.equal(0, h["loss/teacher_kl"])
        end
      end
      assert.is_true(updated >= 2, updated .. " updates")
      for i, h in ipairs(r1.history) do
        for k, v in pairs(h) do
          if not k:match("^time/") and k ~= "tokens_per_s" then
            assert.are.equal(v, r2.history[i][k], "run b step " .. h.step .. " " .. k)
            assert.are.equal(v, r3.history[i][k], "resumed step " .. h.step .. " " .. k)
          end
        end
      end
      local function weights_equal(a, b)
        local pa, pb = a:parameters(), b:parameters()
        for name, w in pairs(pa) do assert.are.equal(0, w:max_abs_diff(pb[name]), name) end
      end
      weights_equal(m1, m2)
      weights_equal(m1, m3r)
      assert.is_truthy(m3)
      -- the teachers saved last: equal, and not the student
      local function saved_teacher(name)
        local st = rl.json.decode(assert(io.open(dir .. "/" .. name .. "/state.json")):read("a"))
        assert.are.equal("teacher-000004.bin", st.teacher)
        local t = model(0, 128)
        assert.are.equal(4, t:load_checkpoint(dir .. "/" .. name .. "/" .. st.teacher))
        return t
      end
      local ta, tc = saved_teacher("a"), saved_teacher("cut")
      weights_equal(ta, tc)
      local differs = false
      for name, w in pairs(ta:parameters()) do differs = differs or w:max_abs_diff(m1:parameters()[name]) > 0 end
      assert.is_true(differs)
      -- only the last teacher file is kept
      local out = H.sh("ls " .. H.shell_quote(dir .. "/cut"))
      assert.is_nil(out:find("teacher-000002.bin", 1, true))
      H.sh("rm -rf " .. H.shell_quote(dir))
    end)

    it("leaves the student's training as it is with coef = 0, and changes it with coef > 0", function()
      local dir = H.tmpdir()
      local r0, plain = run(dir, "plain", { teacher = false })
      local r1, zero = run(dir, "zero", { teacher = { privileged = RUN.teacher.privileged, coef = 0 } })
      local _, some = run(dir, "some")
      local pp, pz, ps = plain:parameters(), zero:parameters(), some:parameters()
      local differs = false
      for name, w in pairs(pp) do
        assert.are.equal(0, w:max_abs_diff(pz[name]), name)
        differs = differs or w:max_abs_diff(ps[name]) > 0
      end
      assert.is_true(differs)
      assert.are.equal(r0.history[#r0.history]["loss/pg_loss"], r1.history[#r1.history]["loss/pg_loss"])
      H.sh("rm -rf " .. H.shell_quote(dir))
    end)

    it("starts a teacher from the resumed policy when resume = \"force\" turns it on", function()
      local dir = H.tmpdir()
      run(dir, "late", { teacher = false, stop_after = 2 })
      local ok, e = pcall(run, dir, "late", { resume = true, overwrite = false })
      assert.is_false(ok)
      assert.matches("teacher %(unset, now", tostring(e))
      local r = run(dir, "late", { resume = "force", overwrite = false })
      assert.are.equal(4, r.history[#r.history].step)
      local st = rl.json.decode(assert(io.open(dir .. "/late/state.json")):read("a"))
      assert.are.equal("teacher-000004.bin", st.teacher)
      H.sh("rm -rf " .. H.shell_quote(dir))
    end)

    it("raises naming the option", function()
      local function err(tc)
        local ok, e = pcall(rl.train, { model = model(1), tokenizer = tok, env = guess, teacher = tc })
        assert.is_false(ok)
        return tostring(e)
      end
      assert.matches("teacher.privileged: a function expected %(it is required%)", err {})
      assert.matches("teacher.decay: a number in %[0, 1%] expected, got 2", err { privileged = privileged, decay = 2 })
      assert.matches("teacher.coef: ", err { privileged = privileged, coef = -1 })
      assert.matches("teacher.kl: ", err { privileged = privileged, kl = "k9" })
      assert.matches("teacher.weights: a list of per%-turn weights", err { privileged = privileged, weights = { "a" } })
      assert.matches("teacher.truncate: ", err { privileged = privileged, truncate = 0 })
      assert.matches("unknown option 'teacher.decy' %(did you mean 'teacher.decay'%?%)",
        err { privileged = privileged, decy = 1 })
      assert.matches("teacher: a table", err(true))
      -- at run time: what privileged and weights return
      local ctx = context(model(1), model(2), nil, { privileged = function() return 3 end })
      assert.has_error(function() teacher.prepare(ctx, make_batch(nil)) end,
        "train: teacher.privileged: a string (or nil) expected, got number")
      ctx = context(model(1), model(2), nil, { privileged = privileged, weights = function() return 1 end })
      assert.has_error(function() teacher.prepare(ctx, make_batch(nil)) end,
        "train: teacher.weights: the function returned number, not a list of numbers")
    end)
  end)
end)

describe("rl.objective.turn_kl and rl.objective.ema", function()
  local function args(extra)
    local t = { logp = rl.tensor.from { 0, -1, -2, 0 }, teacher_logp = rl.tensor.from { 0, -1.5, -1, 0 },
      mask = rl.tensor.from { 0, 1, 1, 0 }, turns = rl.tensor.from { -1, 0, 1, 1 }, offsets = { 0, 4 },
      episodes = { 1 } }
    for k, v in pairs(extra or {}) do t[k] = v end
    return t
  end

  it("computes a hand-worked example", function()
    -- turn 0: d = 0.5; turn 1: d = -1; weights 1, 3: (0.5 + 3 * -1) / 4 = -0.625
    local st, d = rl.objective.turn_kl(args { turn_weights = { { 1, 3 } }, coef = 2 })
    assert.is_true(math.abs(st.kl + 0.625) < 1e-6)
    assert.is_true(math.abs(st.loss + 1.25) < 1e-6)
    assert.are.equal(2, st.tokens)
    assert.is_true(math.abs(st.per_turn[1][1] - 0.5) < 1e-6 and math.abs(st.per_turn[1][2] + 1) < 1e-6)
    assert.is_true(math.abs(d:get(2) - 2 * 0.25) < 1e-6 and math.abs(d:get(3) - 2 * 0.75) < 1e-6)
    assert.are.equal(0, d:get(1))
  end)

  it("raises on bad inputs, naming them", function()
    local function err(t, f)
      local ok, e = pcall(f or rl.objective.turn_kl, t)
      assert.is_false(ok)
      return tostring(e)
    end
    assert.matches("turns%[3%]: 0.5", err(args { turns = rl.tensor.from { -1, 0, 0.5, 1 } }))
    assert.matches("turns%[2%]: %-2", err(args { turns = rl.tensor.from { -1, -2, 0, 1 } }))
    assert.matches("turn_weights: 1 lists expected", err(args { turn_weights = { { 1 }, { 1 } } }))
    assert.matches("turn_weights%[1%]%[2%]: a finite number >= 0", err(args { turn_weights = { { 1, -1 } } }))
    assert.matches("turn_weights%[1%]: a list", err(args { turn_weights = { 3 } }))
    assert.matches("kind: unknown value 'k9'", err(args { kind = "k9" }))
    assert.matches("teacher_logp: tensor expected, got boolean", err(args { teacher_logp = false }))
    assert.matches("unknown", err(args { extra = 1 }))
    local a, b = rl.tensor.from { 1, 2 }, rl.tensor.from { 1, 2, 3 }
    assert.matches("student: 3 elements, teacher has 2", err({ teacher = a, student = b }, rl.objective.ema))
    assert.matches("decay", err({ teacher = a, student = rl.tensor.from { 0, 0 }, decay = 2 }, rl.objective.ema))
    local t = rl.objective.ema { teacher = a, student = rl.tensor.from { 3, 4 }, decay = 0.25 }
    assert.are.same({ 2.5, 3.5 }, t:totable())
    assert.are.same({ 2.5, 3.5 }, a:totable()) -- in place
  end)
end)
