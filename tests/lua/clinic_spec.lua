-- clinic_spec.lua - envs/clinic.lua (MedExAgent's diagnosis POMDP in miniature): exam costs and
-- discomfort accounted exactly, noise planned from the case's seed and logged, the diagnosis and
-- its reward, malformed actions, personas; the composite reward graph's terms on hand-made
-- episodes; and a smoke run of recipes/clinic.lua.
local rl = require "moonrl"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
package.path = H.root .. "/?.lua;" .. package.path
local env = require "envs.clinic"
local T = rl.tensor

-- A case seed whose disease, persona and patient noise satisfy pred(case, episode_info).
local function find_case(pred, opts)
  for s = 1, 5000 do
    local task = { seed = s, noise = opts and opts.noise or 0, exam_noise = opts and opts.exam_noise or 0 }
    local ep = env.new()
    ep:reset(task)
    if pred(env.case(s), ep:episode_info()) then return task end
  end
  error("no such case")
end

-- Plays actions through the environment protocol (rl.env.step, as a rollout does): the records,
-- the instance and its episode_info().
local function play(task, actions)
  local inst, record = env.new(), {}
  inst:reset(task)
  for _, a in ipairs(actions) do
    local _, _, done = rl.env.step(env, inst, a, record)
    if done then break end
  end
  return record, inst
end

-- A batch of hand-made episodes (one token per turn) from {task =, record =} tables, one group.
local function batch_of(eps)
  local tokens, mask, turns, offsets = {}, {}, {}, { 0 }
  for i, ep in ipairs(eps) do
    tokens[#tokens + 1], mask[#mask + 1], turns[#turns + 1] = 1, 0, -1
    for k = 1, #ep.record do
      tokens[#tokens + 1], mask[#mask + 1], turns[#turns + 1] = 97, 1, k - 1
    end
    offsets[#offsets + 1] = #tokens
    ep.group, ep.seed = 1, i
    local r = 0
    for _, rec in ipairs(ep.record) do r = r + rec.reward end
    ep.reward = r
  end
  return rl.batch.new { tokens = T.from(tokens), logprobs = T.zeros { #tokens }, mask = T.from(mask),
    turns = T.from(turns), offsets = offsets, episodes = eps }
end

describe("envs/clinic", function()
  it("charges each exam's money and discomfort exactly, and only unneeded exams to R_cost", function()
    local task = find_case(function(c) return c.disease == "append" end) -- gt: cbc, us abd
    local record = play(task, { "hello", "exam cbc", "exam cbc", "exam us abd", "exam ct abd",
      "exam ecg chest", "exam foo", "exam xray", "exam us head", "dx append" })
    local obs = {}
    for k, r in ipairs(record) do obs[k] = r.observation end
    assert.are.equal("cbc: wbc high, crp high", obs[2])
    assert.are.equal("us: inflamed appendix", obs[4])
    assert.are.equal("ct: inflamed appendix", obs[5])
    assert.are.same({ "n/a", "n/a", "?", "n/a" }, { obs[6], obs[7], obs[8], obs[9] })
    -- per turn: cbc free (ground truth), cbc again charged, us free, ct charged, the rest nothing
    local want = {
      { money = 0, discomfort = 0, exams = 0, unneeded = 0, unneeded_n = 0 },
      { money = 1, discomfort = 1, exams = 1, unneeded = 0, unneeded_n = 0 },
      { money = 1, discomfort = 1, exams = 1, unneeded = 2 / 6, unneeded_n = 1 },
      { money = 2, discomfort = 1, exams = 1, unneeded = 0, unneeded_n = 0 },
      { money = 3, discomfort = 1, exams = 1, unneeded = 4 / 6, unneeded_n = 1 },
    }
    for k = 1, 5 do assert.are.same(want[k], record[k].info.costs) end
    for k = 6, 10 do
      for _, v in pairs(record[k].info.costs) do assert.are.equal(0, v) end
    end
    assert.is_true(record[8].info.malformed)
    for k = 2, 9 do assert.is_true(record[k].info.tool_call, "turn " .. k) end
    local b = batch_of { { task = task, record = record } }
    assert.are.same({ money = 7, discomfort = 4, exams = 4, unneeded = 2 / 6 + 4 / 6, unneeded_n = 2 }, b.episodes[1].costs)
  end)

  it("ends the episode at a diagnosis: 1 right, 0.5 the confusable partner, 0 otherwise", function()
    local task = find_case(function(c) return c.disease == "pneum" end)
    for _, case in ipairs { { "dx pneum", 1, true }, { "dx bronch", 0.5, false }, { "dx gout", 0, false } } do
      local inst = env.new()
      inst:reset(task)
      local obs, r, done, info = inst:step(case[1])
      assert.is_nil(obs)
      assert.are.equal(case[2], r)
      assert.is_true(done)
      assert.are.equal(case[3], info.success)
    end
    -- an unknown disease, extra words or an unknown verb are malformed: "?", the episode goes on
    for _, a in ipairs { "dx flu", "dx pneum now", "order pizza", "", "ask", "ask pain", "hist dog", "hello there" } do
      local inst = env.new()
      inst:reset(task)
      local obs, r, done, info = inst:step(a)
      assert.are.equal("?", obs, a)
      assert.are.equal(0, r)
      assert.is_false(done)
      assert.is_true(info.malformed)
    end
  end)

  it("answers from the case: the complaint, symptoms with duration and severity, history", function()
    local task = find_case(function(c, i) return c.disease == "mening" and i.persona.personality == "plain"
      and i.persona.recall == "high" end)
    local c = env.case(task.seed)
    local sev = ({ "barely", "mild", "moderate", "severe" })[c.severity + 1]
    local inst = env.new()
    assert.are.equal("new patient", inst:reset(task))
    assert.are.equal(string.format("headac %dd %s", c.days, sev), (inst:step("hello")))
    assert.are.equal(string.format("yes %dd %s", c.days, sev), (inst:step("ask headac")))
    for _, s in ipairs(env.SYMPTOMS) do
      if s ~= "headac" then assert.are.equal(c.present[s] and "yes" or "no", (inst:step("ask " .. s))) end
    end
    assert.are.equal(c.hist.family and "yes" or "no", (inst:step("hist family")))
  end)

  it("plans the noise from the case's seed, logs what was planned, fired and applied", function()
    local tasks = env.tasks("test", 500)
    local noisy, applied_types = 0, {}
    for _, t in ipairs(tasks) do
      local function run()
        local _, inst = play(t, env.order_all(t))
        return inst:episode_info()
      end
      local a, b = run(), run()
      assert.are.equal(rl.json.encode(a), rl.json.encode(b)) -- deterministic from the seed
      local pn = a.patient_noise
      if pn.noisy then
        noisy = noisy + 1
        assert.is_true(#pn.planned >= 1 and #pn.planned <= 3)
        for _, ty in ipairs(pn.planned) do assert.is_true(pn.at[ty] >= 1 and pn.at[ty] <= 7) end
      end
      for _, f in ipairs(pn.fired) do assert.is_truthy(pn.at[f.type]) end
      -- every applied type fired on that turn (an exam fallback names both)
      for _, ap in ipairs(a.applied) do
        local ty = ap.type:match("^[^>]+")
        local fired = false
        for _, f in ipairs(pn.fired) do fired = fired or (f.turn == ap.turn and f.type == ty) end
        for _, f in ipairs(a.exam_noise.fired) do fired = fired or (f.turn == ap.turn and f.type == ty) end
        assert.is_true(fired, rl.json.encode(a))
        applied_types[ty] = true
      end
    end
    -- 30% of the patients get patient noise (500 cases: within about 3 standard errors)
    assert.is_true(noisy > 0.3 * 500 - 32 and noisy < 0.3 * 500 + 32, tostring(noisy))
    for _, ty in ipairs(env.PATIENT_NOISE) do assert.is_true(applied_types[ty], ty) end
    for _, ty in ipairs(env.EXAM_NOISE) do assert.is_true(applied_types[ty], ty) end
    -- other seeds, other plans; the clean split has none
    local plans = {}
    for s = 1, 40 do
      local inst = env.new()
      inst:reset { seed = s, noise = 0.6 }
      plans[rl.json.encode(inst:episode_info().patient_noise)] = true
    end
    local distinct = 0
    for _ in pairs(plans) do distinct = distinct + 1 end
    assert.is_true(distinct > 10)
    for _, t in ipairs(env.tasks("clean", 100)) do
      local _, inst = play(t, env.order_all(t))
      local i = inst:episode_info()
      assert.is_false(i.patient_noise.noisy)
      assert.are.equal(0, #i.applied)
    end
  end)

  it("realises the noise types in the answers", function()
    -- vague on the greeting: "unsure"; omission denies a present symptom
    local vague = find_case(function(_, i) return i.patient_noise.at.vague == 1 end, { noise = 1 })
    local inst = env.new()
    inst:reset(vague)
    local obs, _, _, info = inst:step("hello")
    assert.are.equal("unsure", obs)
    assert.are.same({ "vague" }, info.noise)
    local omit = find_case(function(c, i) return i.patient_noise.at.omission == 2 and #i.patient_noise.planned == 1
      and c.present.fever and c.disease ~= "mening" end, { noise = 1 })
    inst = env.new()
    inst:reset(omit)
    inst:step("hello")
    assert.are.equal("no", (inst:step("ask fever")))
    assert.are.equal("yes", (inst:step("ask fever"))) -- it fires once
    -- an exam's ambiguity wraps the finding
    local amb = find_case(function(c, i) return c.disease == "gout" and i.exam_noise.planned[1] == "exam_ambig" end,
      { exam_noise = 0.99 })
    inst = env.new()
    inst:reset(amb)
    obs, _, _, info = inst:step("exam uric")
    assert.are.equal("uric: eqv urate high", obs)
    assert.are.same({ "exam_ambig" }, info.noise)
  end)

  it("personas: the impatient patient leaves at a seventh question, distrust and low recall", function()
    local task = find_case(function(_, i) return i.persona.personality == "impatient" end)
    local inst = env.new()
    inst:reset(task)
    inst:step("hello")
    for k = 1, 6 do
      local _, _, done = inst:step(k % 2 == 0 and "ask cough" or "hist smoke")
      assert.is_false(done)
    end
    assert.is_false(select(3, inst:step("exam cbc"))) -- exams are not questions
    local obs, r, done, info = inst:step("ask fever")
    assert.is_nil(obs)
    assert.are.same({ 0, true, true, false }, { r, done, info.left, info.success })
    task = find_case(function(_, i) return i.persona.personality == "distrust" and i.persona.recall == "high" end)
    inst = env.new()
    inst:reset(task)
    assert.are.equal("why ask?", (inst:step("hist smoke")))
    assert.are.equal(env.case(task.seed).hist.smoke and "yes" or "no", (inst:step("hist smoke")))
    local unsure, n = 0, 0
    for s = 1, 400 do
      inst = env.new()
      inst:reset { seed = s, noise = 0 }
      local i = inst:episode_info()
      if i.persona.recall == "low" and i.persona.personality ~= "distrust" then
        n = n + 1
        if inst:step("hist meds") == "unsure" then unsure = unsure + 1 end
      end
    end
    assert.is_true(unsure > 0.3 * n and unsure < 0.7 * n, unsure .. " of " .. n)
  end)

  it("splits: disjoint case seeds, a fixed held-out list, the oracles' figures", function()
    local test = env.tasks("test", 500)
    assert.are.same({ seed = 1, noise = 0.3, exam_noise = 0.1 }, test[1])
    assert.are.equal(500, test[500].seed)
    for _, t in ipairs(env.tasks("train", 200, 7)) do assert.is_true(t.seed >= 1000) end
    assert.are.same(env.tasks("train", 5, 3), env.tasks("train", 5, 3))
    assert.has_error(function() env.tasks("test", 501) end)
    assert.has_error(function() env.tasks("dev", 1) end)
    local acc, cost = {}, {}
    for _, p in ipairs { "perfect", "oracle", "order_all", "no_exam" } do
      local right, c = 0, 0
      for _, t in ipairs(env.tasks("test", 200)) do
        local actions = p == "oracle" and env.oracle(t, rl.rng(t.seed)) or env[p](t)
        local out = env.play(t, env.replay(actions))
        right = right + (out.success and 1 or 0)
        c = c + out.costs.money + out.costs.discomfort
        for _, a in ipairs(actions) do assert.is_true(#a <= 15, a) end
        for _, ob in ipairs(out.observations) do assert.is_true(#ob <= 28, ob) end
      end
      acc[p], cost[p] = right / 200, c / 200
    end
    assert.are.equal(1, acc.perfect)
    -- the imperfect oracle: accurate (its exams decide), dearer than the ceiling, far cheaper than
    -- ordering everything; history alone is well below
    assert.is_true(acc.oracle > 0.9 and acc.oracle < 1, tostring(acc.oracle))
    assert.is_true(cost.oracle > cost.perfect and cost.order_all > 5 * cost.oracle)
    assert.is_true(acc.no_exam < 0.8 and acc.no_exam > 0.5, tostring(acc.no_exam))
  end)
end)

describe("envs/clinic reward graph", function()
  it("scores dx, R_tool, R_cost and R_fmt on hand-made episodes", function()
    local task = find_case(function(c) return c.disease == "arthr" end) -- gt: uric, xray joint
    local eps = {
      { task = task, record = (play(task, { "hello", "exam uric", "exam xray joint", "dx arthr" })) },
      { task = task, record = (play(task, { "hello", "exam uric", "exam xray chest", "exam mri joint", "dx gout" })) },
      { task = task, record = (play(task, { "hello", "what?", "dx lupus", "exam uric", "dx migrn" })) },
    }
    local b = batch_of(eps)
    local g = env.reward()
    g:score(b)
    local t1, t2, t3 = b.episodes[1].reward_terms, b.episodes[2].reward_terms, b.episodes[3].reward_terms
    assert.are.same({ 1, 1, 0 }, { t1.dx, t1.tool, t1.cost })
    assert.are.equal(1 + 0.5, b.episodes[1].reward)
    -- 2: names {uric, xray, mri} vs {uric, xray}: 2/3; uric matched (1 + 0), xray matched with the
    -- wrong region (1 + 0): (2/3 + 2 + 0) / (1 + 2 + 1); mri joint charged (3 + 2) / 6
    assert.are.equal(0.5, t2.dx)
    assert.is_near((2 / 3 + 2) / 4, t2.tool, 1e-12)
    assert.is_near(-5 / 6, t2.cost, 1e-12)
    assert.is_near(0.5 + 0.5 * (2 / 3 + 2) / 4 - 0.1 * 5 / 6, b.episodes[2].reward, 1e-12)
    -- 3: two malformed turns of five; uric alone: (1/2 + 1 + 0) / 4, free
    assert.are.same({ 0, 2 / 5, 0, 1 }, { t3.dx, t3.fmt, t3.cost, t3.exams })
    assert.is_near(1.5 / 4, t3.tool, 1e-12)
    -- the weights: accuracy only, uniform exam cost, a format penalty
    local acc = env.reward { tool = 0, cost = 0 }
    acc:score(b)
    assert.are.same({ 1, 0.5, 0 }, { b.episodes[1].reward, b.episodes[2].reward, b.episodes[3].reward })
    local uni = env.reward { uniform_exam_cost = true, fmt = 1 }
    uni:score(b)
    assert.are.equal(-1, b.episodes[2].reward_terms.cost)
    assert.is_near(0 + 0.5 * 1.5 / 4 - 2 / 5, b.episodes[3].reward, 1e-12)
    assert.matches("clinic.reward: unknown field 'tol'", H.error_of(env.reward, { tol = 1 }))
  end)

  it("R_tool: names, parameter names and values, greedily matched", function()
    local S = env.tool_score
    assert.are.equal(1, S({}, {}))
    assert.are.equal(0, S({}, { { name = "ecg" } }))
    assert.are.equal(0, S({ { name = "cbc" } }, { { name = "ecg" } }))
    assert.are.equal(1, S({ { name = "ecg" } }, { { name = "ecg" } }))
    assert.is_near((1 / 2 + 1) / 2, S({ { name = "ecg" }, { name = "ecg" } }, { { name = "ecg" } }), 1e-12)
    assert.is_near((1 + 1 + 0) / 3, S({ { name = "xray", region = "abd" } }, { { name = "xray", region = "chest" } }), 1e-12)
    -- the better of two same-name calls is matched
    assert.is_near((1 / 2 + 2) / 3, S({ { name = "xray", region = "abd" }, { name = "xray", region = "chest" } },
      { { name = "xray", region = "chest" } }), 1e-12)
  end)
end)

describe("envs/clinic in the trainer", function()
  it("logs each episode's persona and noise plans with its costs, the same for one seed", function()
    local dir = H.tmpdir()
    local function run(name)
      rl.train { model = rl.model.new { vocab = 264, dim = 32, layers = 1, heads = 2, ffn = 64, ctx = 256,
        seed = 3 }, tokenizer = rl.tokenizer.bytes(), env = env, dir = dir, name = name, seed = 7,
        steps = 1, tasks_per_step = 2, group_size = 3, max_turns = 4, max_turn_tokens = 8, eval = false,
        progress = false, plot = false, log_episodes = 6, reward = env.reward() }
      return H.read_json_lines(dir .. "/" .. name .. "/episodes.jsonl")
    end
    local eps = run("a")
    assert.are.equal(6, #eps)
    for _, ep in ipairs(eps) do
      local i = ep.env_info
      assert.is_string(i.persona.personality)
      assert.is_string(i.persona.recall)
      assert.is_boolean(i.patient_noise.noisy)
      assert.is_table(i.exam_noise.planned)
      assert.are.equal(env.case(ep.task.seed).disease, i.disease)
      local sum = 0
      for _, r in ipairs(ep.record) do sum = sum + r.info.costs.money end
      assert.are.equal(sum, ep.costs.money)
      assert.are.equal(-ep.costs.unneeded, ep.reward_terms.cost)
    end
    local again = run("b")
    for i, ep in ipairs(eps) do assert.are.equal(rl.json.encode(ep.env_info), rl.json.encode(again[i].env_info)) end
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)
end)

describe("recipes/clinic.lua", function()
  it("runs end to end in a smoke run: SFT, both DAPO arms, the table, the logs", function()
    local dir = os.tmpname()
    os.remove(dir)
    local out, code = H.run(string.format("cd %s && %s run recipes/clinic.lua --smoke --dir %s", H.shell_quote(H.root),
      H.shell_quote(H.moonrl), H.shell_quote(dir)))
    assert.are.equal(0, code, out)
    for _, row in ipairs { "SFT policy", "RL composite %(DAPO%)", "RL accuracy only %(DAPO%)",
      "order every exam %(scripted%)", "perfect oracle %(ceiling%)" } do
      assert.matches("\n" .. row .. " +[%d.]+%%", out)
    end
    assert.matches("composite %d+ s %([%d.]+ s/step%)", out)
    assert.matches("composite vs order%-every%-exam", out)
    for _, arm in ipairs { "composite", "accuracy" } do
      local lines = H.read_json_lines(dir .. "/clinic-" .. arm .. "-s1/metrics.jsonl")
      assert.are.equal(3, #lines) -- step 0 and two RL steps
      for k = 1, 3 do assert.are.equal(k - 1, lines[k].step) end
      assert.is_number(lines[1]["eval/accuracy"])
      assert.is_number(lines[1]["eval/cost"])
      assert.is_number(lines[3]["eval/r_tool"])
      assert.is_number(lines[2]["sampling/groups_dropped"])
    end
    local f = io.open(dir .. "/clinic-sft-s1.bin", "rb")
    assert.is_truthy(f, "the shared SFT checkpoint")
    f:close()
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)
end)
