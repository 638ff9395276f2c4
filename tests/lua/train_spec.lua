-- train_spec.lua - the trainer (`rl.train`): a policy learns a trivial task from reward alone
-- (and does not without updates), a resumed run equals an uninterrupted one bit for bit, the run
-- folder holds metrics, episodes, a plot and a checkpoint, and the options are checked.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"

local guess = dofile(H.root .. "/envs/guess_letter.lua")
local tok = rl.tokenizer.bytes()

local tmpdir = H.tmpdir

local read_lines = H.read_json_lines

-- One turn: the reward is 1 when the reply starts with a lowercase letter (about 10% of a
-- fresh byte model's first tokens).
local letter_env = H.letter_env()

local function learn(lr, dir, advantage)
  local m = rl.model.new { vocab = 264, dim = 32, layers = 1, heads = 2, ffn = 64, ctx = 32, seed = 3 }
  local r = rl.train {
    model = m, tokenizer = tok, env = letter_env, dir = dir, seed = 4, steps = 15,
    tasks_per_step = 4, group_size = 16, max_turn_tokens = 1, lr = lr, minibatch = 16,
    eval = false, progress = false, plot = false, advantage = advantage, value_lr = 1e-2,
    overwrite = true, -- the second call (lr 0) replaces the first's run folder
  }
  local first = (r.history[2].success + r.history[3].success) / 2
  local last = (r.history[#r.history].success + r.history[#r.history - 1].success) / 2
  return first, last
end

describe("rl.train", function()
  it("raises the reward of a trivial task from reward alone, and not without updates", function()
    local dir = tmpdir()
    local first, last = learn(1e-2, dir)
    assert.is_true(first < 0.4, "success at the start " .. first)
    assert.is_true(last > 0.8, "success at the end " .. last)
    local f0, l0 = learn(0, dir) -- the same run with a zero learning rate learns nothing
    assert.is_true(l0 < 0.4 and f0 < 0.4, string.format("lr 0: %.2f -> %.2f", f0, l0))
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)

  it("learns it with PPO and a critic (advantage = \"gae\"), and not without updates", function()
    local dir = tmpdir()
    local first, last = learn(1e-2, dir, "gae")
    assert.is_true(first < 0.4, "success at the start " .. first)
    assert.is_true(last > 0.8, "success at the end " .. last)
    local f0, l0 = learn(0, dir, "gae")
    assert.is_true(l0 < 0.4 and f0 < 0.4, string.format("lr 0: %.2f -> %.2f", f0, l0))
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)

  -- GDPO on a two-term reward: the environment's (a letter first: 1) and a term of large noise
  -- that does not depend on the reply. GRPO normalises their sum, which the noise swamps; GDPO
  -- normalises each term in its group, so the letter's term keeps its full weight.
  it("GDPO learns a reward term that a noisier term hides from GRPO (advantage = \"gdpo\")", function()
    local dir = tmpdir()
    local function run(advantage, gdpo)
      local m = rl.model.new { vocab = 264, dim = 32, layers = 1, heads = 2, ffn = 64, ctx = 32, seed = 3 }
      local r = rl.train {
        model = m, tokenizer = tok, env = letter_env, dir = dir, seed = 4, steps = 15,
        tasks_per_step = 4, group_size = 16, max_turn_tokens = 1, lr = 1e-2, minibatch = 16,
        eval = false, progress = false, plot = false, overwrite = true, advantage = advantage,
        gdpo = gdpo, rewards = { noise = function(ep) return 100 * ((ep.seed * 7919) % 13 - 6) end },
      }
      local h = r.history
      return (h[2].success + h[3].success) / 2, (h[#h].success + h[#h - 1].success) / 2
    end
    local first, last = run("gdpo")
    assert.is_true(first < 0.4, "success at the start " .. first)
    assert.is_true(last > 0.8, "GDPO: success at the end " .. last)
    local _, grpo = run("grpo")
    assert.is_true(grpo < 0.4, "GRPO: success at the end " .. grpo)
    local _, noise_only = run("gdpo", { terms = { "noise" } }) -- without the env's term
    assert.is_true(noise_only < 0.4, "GDPO on the noise alone: success at the end " .. noise_only)
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)

  it("trains with verl 1dda039's losses, estimators and rollout correction", function()
    local dir = tmpdir()
    local function run(extra)
      local m = rl.model.new { vocab = 264, dim = 32, layers = 1, heads = 2, ffn = 64, ctx = 32, seed = 3 }
      local o = { model = m, tokenizer = tok, env = letter_env, dir = dir, seed = 4, steps = 3,
        tasks_per_step = 2, group_size = 8, max_turn_tokens = 2, lr = 1e-2, minibatch = 8,
        eval = false, progress = false, plot = false, overwrite = true }
      for k, v in pairs(extra) do o[k] = v end
      return rl.train(o).history
    end
    for _, extra in ipairs {
      { loss = "dppo_tv" }, { loss = "dppo_kl" }, { loss = "clip_cov", clip_cov_ratio = 0.2 },
      { loss = "kl_cov", kl_cov_ratio = 0.2 }, { loss = "dro", dro_beta = 0.1 }, { loss = "reinforce" },
      { advantage = "optimal_token_baseline" }, { advantage = "tir_optimal_token_baseline" },
      { advantage = "gdpo", agg = "token-sum", kl_coef = 0.01, kl = "low_var_kl+" },
    } do
      local h = run(extra)
      for s = 2, 4 do
        assert.is_true(h[s]["loss/updates"] >= 1, "an update each step")
        assert.is_true(h[s]["loss/loss"] == h[s]["loss/loss"], "a finite loss")
      end
    end
    -- sampling at temperature 0.7 is not the policy: decoupled correction weighs (and may
    -- reject) tokens before the advantage; bypass mode compares each minibatch with the rollout
    local h = run { temperature = 0.7, rollout_correction = { rollout_is = "token",
      rollout_is_threshold = 1.5, rollout_rs = "token_k1", rollout_rs_threshold = 4 } }
    assert.is_true(h[2]["rollout/is_mean"] > 0 and h[2]["rollout/is_mean"] <= 1.5)
    assert.is_true(h[2]["rollout/kl"] ~= 0, "the sampling distribution differs from the policy")
    h = run { temperature = 0.7, rollout_correction = { rollout_is = "sequence", bypass_mode = true,
      loss_type = "reinforce" } }
    assert.is_true(h[2]["loss/rollout_is_mean"] > 0)
    assert.is_nil(h[2]["rollout/is_mean"]) -- nothing before the advantage in bypass mode
    -- decoding from bfloat16 weights at temperature 1: the only mismatch left is the rounding,
    -- which the rollout correction measures (a KL well under that of temperature 0.7) and weighs
    local t07 = run { temperature = 0.7, rollout_correction = { rollout_is = "token", rollout_is_threshold = 2 } }
    h = run { temperature = 1, decode_bf16 = true, rollout_correction = { rollout_is = "token",
      rollout_is_threshold = 2 } }
    local f32 = run { temperature = 1, rollout_correction = { rollout_is = "token", rollout_is_threshold = 2 } }
    for s = 2, 4 do
      assert.is_true(h[s]["rollout/kl"] ~= 0, "bf16 decoding is not the float32 policy")
      assert.is_true(math.abs(h[s]["rollout/kl"]) < math.abs(t07[s]["rollout/kl"]))
      assert.is_true(math.abs(h[s]["rollout/is_mean"] - 1) < 0.05)
      assert.are.equal(0, f32[s]["rollout/kl"]) -- float32 plain sampling: the policy itself
    end
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)

  local base = {
    tokenizer = tok, env = guess, seed = 11, steps = 4, tasks_per_step = 3, group_size = 4,
    max_turn_tokens = 3, lr = 1e-3, minibatch = 6, epochs = 2, advantage = "gigpo", gamma = 0.8,
    kl_coef = 0.05, entropy_coef = 0.001,
    sft = { examples = 24, epochs = 1, batch_size = 8, lr = 1e-3 },
    eval = { every = 2, tasks = 6, k = 2 }, progress = false,
  }
  local function model() return rl.model.new { vocab = 264, dim = 32, layers = 2, heads = 2, ffn = 64, ctx = 128, seed = 2 } end
  local function run(dir, name, extra)
    local o = {}
    for k, v in pairs(base) do o[k] = v end
    for k, v in pairs(extra or {}) do o[k] = v end
    o.dir, o.name, o.model = dir, name, o.model or model()
    return rl.train(o), o.model
  end

  -- The resume tests' run: loaded here and, for the resumed half, in another `moonrl run`
  -- process (whose table order, pairs(), differs from this one's). Five reward terms whose sum
  -- depends on the order they are added in, KL to the reference, and a critic with gae.
  local RESUME_RUN = [==[
local rl = require "moonrl"
local root = ...
local guess = dofile(root .. "/envs/guess_letter.lua")
local rewards = {
  brevity = function(ep) return -0.013 * ep.turns end,
  length = function(ep) return -0.0071 * ep.length end,
  third = function() return 1 / 3 end,
  tenth = function(ep) return 0.1 * (ep.seed % 7) end,
  sqrt = function(ep) return math.sqrt(ep.length) / 97 end,
}
return function(dir, name, advantage, extra)
  local o = { model = rl.model.new { vocab = 264, dim = 32, layers = 2, heads = 2, ffn = 64,
      ctx = 128, seed = 2 }, tokenizer = rl.tokenizer.bytes(), env = guess, dir = dir, name = name,
    seed = 11, steps = 4, tasks_per_step = 3, group_size = 4, max_turn_tokens = 3, lr = 1e-3,
    minibatch = 6, epochs = 2, advantage = advantage, gamma = 0.8, kl_coef = 0.05,
    entropy_coef = 0.001, rewards = rewards, sft = { examples = 24, epochs = 1, batch_size = 8,
    lr = 1e-3 }, eval = { every = 2, tasks = 6, k = 2 }, progress = false }
  for k, v in pairs(extra or {}) do o[k] = v end
  return rl.train(o), o.model
end
]==]

  for _, advantage in ipairs { "gigpo", "gae" } do
    it("continues bit-exactly in another process (resume = true, reward terms, KL): " .. advantage, function()
      local dir = tmpdir()
      local config = H.script(dir .. "/run.lua", RESUME_RUN)
      local runner = assert(loadfile(config))(H.root)
      local _, m_full = runner(dir, "full", advantage)
      runner(dir, "cut", advantage, { stop_after = 2 })
      assert.are.equal(3, #read_lines(dir .. "/cut/metrics.jsonl")) -- step 0 (after SFT), 1, 2
      local out, _, ok = H.run_lua([[
        local runner = loadfile(arg[1])(arg[2])
        runner(arg[3], "cut", arg[4], { resume = true })
      ]], config, H.root, dir, advantage)
      assert.is_true(ok, out)
      -- the weights the other process saved last equal the uninterrupted run's
      local state = rl.json.decode(assert(io.open(dir .. "/cut/state.json")):read("a"))
      assert.are.equal(4, state.step)
      local m_res = model()
      assert.are.equal(4, m_res:load_checkpoint(dir .. "/cut/" .. state.checkpoint))
      local a, b = m_full:parameters(), m_res:parameters()
      local n = 0
      for name, w in pairs(a) do
        assert.are.equal(0, w:max_abs_diff(b[name]), name)
        n = n + 1
      end
      assert.is_true(n > 5)
      local full_state = rl.json.decode(assert(io.open(dir .. "/full/state.json")):read("a"))
      assert.are.equal(rl.json.encode(full_state.value_head), rl.json.encode(state.value_head))
      local lf, lr = read_lines(dir .. "/full/metrics.jsonl"), read_lines(dir .. "/cut/metrics.jsonl")
      assert.are.equal(#lf, #lr)
      for i, rec in ipairs(lf) do
        for k, v in pairs(rec) do
          if not k:match("^time/") and k ~= "tokens_per_s" then
            assert.are.equal(v, lr[i][k], "step " .. rec.step .. " " .. k)
          end
        end
      end
      assert.is_number(lf[2]["reward/sqrt"])
      assert.is_number(lf[5]["eval/greedy_success"])
      H.sh("rm -rf " .. H.shell_quote(dir))
    end)
  end

  -- The resume test's run with a reward graph: the environment's return, a dense process term, a
  -- judge and a rank term over deterministic mock clients (cached in the run folder), a term that
  -- cannot score some episodes, a budget and a metric.
  local GRAPH_RUN = [==[
local rl = require "moonrl"
local root = ...
local guess = dofile(root .. "/envs/guess_letter.lua")
local R = rl.reward
local judge = {}
function judge:chat(messages)
  local text, n = messages[#messages].content, 0
  for _ in text:gmatch("[a-m]") do n = n + 1 end
  return n % 3 == 0 and "yes" or "no", { prompt_tokens = #text, completion_tokens = 1 }
end
local ranker = {}
function ranker:chat(messages)
  local shown = {}
  for k, text in messages[#messages].content:gmatch("%[(%d+)%] ([^\n]*)") do
    local s = 0
    for p = 1, #text do s = s + text:byte(p) * p end
    shown[#shown + 1] = { k = tonumber(k), s = s }
  end
  table.sort(shown, function(a, b) if a.s ~= b.s then return a.s > b.s end return a.k < b.k end)
  local out = {}
  for _, x in ipairs(shown) do out[#out + 1] = x.k end
  return table.concat(out, " ")
end
local graph = R.graph { seed = 3, terms = {
  R.env(),
  R.process { name = "guess", weight = 0.1, turn = function(rec) return rec.action:match("^%l") and 0.2 or -0.1 end },
  R.judge { name = "judge", client = judge, model = "mock", prompt = "{task}: {transcript}", weight = 0.3 },
  R.rank { name = "rank", client = ranker, rubric = "Best guess first.", weight = 0.05 },
  R.fn("flaky", function(ep) if ep.seed % 5 == 0 then return R.SKIP end return 0.01 * ep.turns end),
  R.budget { tokens = 0.002, turns = 0.01 },
  R.metric("length", function(ep) return ep.length end),
} }
return function(dir, name, advantage, extra)
  local o = { model = rl.model.new { vocab = 264, dim = 32, layers = 2, heads = 2, ffn = 64,
      ctx = 128, seed = 2 }, tokenizer = rl.tokenizer.bytes(), env = guess, dir = dir, name = name,
    seed = 11, steps = 4, tasks_per_step = 3, group_size = 4, max_turn_tokens = 3, lr = 1e-3,
    minibatch = 6, epochs = 2, advantage = advantage, gamma = 0.8, kl_coef = 0.05,
    reward = graph, sft = { examples = 24, epochs = 1, batch_size = 8, lr = 1e-3 },
    eval = { every = 2, tasks = 6, k = 2 }, progress = false }
  for k, v in pairs(extra or {}) do o[k] = v end
  return rl.train(o), o.model
end
]==]

  for _, advantage in ipairs { "gigpo", "gae" } do
    it("continues bit-exactly in another process with a reward graph; its judge cache replays a lost step: " .. advantage, function()
      local dir = tmpdir()
      local config = H.script(dir .. "/run.lua", GRAPH_RUN)
      local runner = assert(loadfile(config))(H.root)
      local _, m_full = runner(dir, "full", advantage)
      -- the cut run is lost during step 3, after its judging and before its checkpoint
      local ok = pcall(runner, dir, "cut", advantage, { checkpoint_every = 2, on_step = function(step)
        if step == 3 then error("the machine went down") end
      end })
      assert.is_false(ok)
      assert.are.equal(2, rl.json.decode(assert(io.open(dir .. "/cut/state.json")):read("a")).step)
      local out, _, done = H.run_lua([[
        local runner = loadfile(arg[1])(arg[2])
        runner(arg[3], "cut", arg[4], { resume = true })
      ]], config, H.root, dir, advantage)
      assert.is_true(done, out)
      local state = rl.json.decode(assert(io.open(dir .. "/cut/state.json")):read("a"))
      assert.are.equal(4, state.step)
      local m_res = model()
      assert.are.equal(4, m_res:load_checkpoint(dir .. "/cut/" .. state.checkpoint))
      local a, b = m_full:parameters(), m_res:parameters()
      for name, w in pairs(a) do assert.are.equal(0, w:max_abs_diff(b[name]), name) end
      local full_state = rl.json.decode(assert(io.open(dir .. "/full/state.json")):read("a"))
      assert.are.equal(4, full_state.reward.scored)
      assert.are.equal(rl.json.encode(full_state.reward.history), rl.json.encode(state.reward.history))
      local lf, lr = read_lines(dir .. "/full/metrics.jsonl"), read_lines(dir .. "/cut/metrics.jsonl")
      assert.are.equal(#lf, #lr)
      local function judging(k) return k:match("^reward/[%w_]+/calls$") or k:match("^reward/[%w_]+/hits$")
        or k:match("^reward/[%w_]+/tokens$") end
      for i, rec in ipairs(lf) do
        for k, v in pairs(rec) do
          if not k:match("^time/") and k ~= "tokens_per_s" and not judging(k) then
            assert.are.equal(v, lr[i][k], "step " .. rec.step .. " " .. k)
          end
        end
      end
      -- step 3 was judged before the loss: the resumed process found every reply in the cache
      for _, term in ipairs { "judge", "rank" } do
        local calls, hits = "reward/" .. term .. "/calls", "reward/" .. term .. "/hits"
        assert.is_true(lf[4][calls] > 0, term)
        assert.are.equal(0, lr[4][calls], term)
        assert.are.equal(lf[4][calls] + lf[4][hits], lr[4][hits], term)
        assert.are.equal(lf[5][calls], lr[5][calls], term) -- step 4 was new to both
      end
      assert.is_true(lf[3]["reward/unscorable"] > 0, "some episodes were unscorable")
      assert.is_number(lf[5]["reward/judge/alarm"]) -- evaluated at step 4
      H.sh("rm -rf " .. H.shell_quote(dir))
    end)
  end

  it("adds reward terms in a defined order: names sorted, or a list's own order", function()
    local terms = require("moonrl.train.reward").terms
    local f = function() return 0 end
    local names = {}
    for _, t in ipairs(terms { zeta = f, alpha = f, Mid = f, beta = f, ["a.b"] = f }) do
      names[#names + 1] = t.name
    end
    assert.are.same({ "Mid", "a.b", "alpha", "beta", "zeta" }, names)
    names = {}
    for _, t in ipairs(terms { { name = "zeta", fn = f }, { name = "alpha", fn = f } }) do
      names[#names + 1] = t.name
    end
    assert.are.same({ "zeta", "alpha" }, names)
    -- each total is the sum in that order, exactly (0.1 + 0.2 + 0.3 ~= 0.3 + 0.2 + 0.1)
    local seen = {}
    local function last(ep) seen[#seen + 1] = { ep.env_reward, ep.reward } return 0 end
    local k = function(x) return function() return x end end
    local dir = tmpdir()
    local function train(name, rewards)
      seen = {}
      rl.train { model = rl.model.new { vocab = 264, dim = 32, layers = 1, heads = 2, ffn = 64, ctx = 32,
        seed = 3 }, tokenizer = tok, env = letter_env, dir = dir, name = name, steps = 1,
        tasks_per_step = 2, group_size = 2, max_turn_tokens = 1, eval = false, progress = false,
        plot = false, rewards = rewards }
      assert.are.equal(4, #seen)
      return seen
    end
    for _, s in ipairs(train("list", { { name = "z", fn = k(0.1) }, { name = "y", fn = k(0.2) },
      { name = "x", fn = k(0.3) }, { name = "w", fn = last } })) do
      assert.are.equal(((s[1] + 0.1) + 0.2) + 0.3, s[2])
    end
    for _, s in ipairs(train("map", { a = k(0.3), b = k(0.2), c = k(0.1), zz = last })) do
      assert.are.equal(((s[1] + 0.3) + 0.2) + 0.1, s[2])
    end
    assert.are_not.equal(((0 + 0.1) + 0.2) + 0.3, ((0 + 0.3) + 0.2) + 0.1)
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)

  it("evaluates with eval's default fields when the option is left out", function()
    local dir = tmpdir()
    local r = rl.train { model = model(), tokenizer = tok, env = guess, dir = dir, name = "noeval",
      steps = 1, tasks_per_step = 2, group_size = 2, max_turn_tokens = 1, progress = false,
      evaluate = function(ctx)
        return { tasks = ctx.cfg.eval.tasks, k = ctx.cfg.eval.k, every = ctx.cfg.eval.every }
      end }
    -- defaults: 32 tasks, k = 4, every 5 steps (step 1 is the last, so it evaluates)
    assert.are.same({ 32, 4, 5 }, { r.after["eval/tasks"], r.after["eval/k"], r.after["eval/every"] })
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)

  it("writes metrics, readable episodes, an SVG curve and one checkpoint", function()
    local dir = tmpdir()
    local r = run(dir, "files", { steps = 2, overlong = { max_len = 60, buffer = 20 },
      rewards = { brevity = function(ep) return -0.01 * ep.turns end } })
    local metrics = read_lines(dir .. "/files/metrics.jsonl")
    assert.are.equal(3, #metrics)
    local m1 = metrics[2]
    for _, k in ipairs { "reward/env", "reward/brevity", "reward/overlong", "reward/mean", "success",
      "sampling/tries", "zero_variance_groups", "end/done", "end/max_turns", "end/env_error" } do
      assert.is_number(m1[k], k)
    end
    assert.is_true(m1["reward/brevity"] < 0)
    assert.is_number(metrics[1]["eval/greedy_success"])
    assert.is_number(metrics[3]["eval/pass@2"])
    if m1["loss/updates"] > 0 then
      for _, k in ipairs { "loss/pg_loss", "loss/kl", "loss/kl_loss", "loss/entropy", "loss/grad_norm",
        "loss/clipfrac", "loss/ppo_kl" } do
        assert.is_number(m1[k], k)
      end
    end
    local eps = read_lines(dir .. "/files/episodes.jsonl")
    assert.is_true(#eps >= 1)
    assert.is_string(eps[1].record[1].action)
    assert.is_number(eps[1].step)
    local svg = assert(io.open(dir .. "/files/curve.svg")):read("a")
    assert.matches("^<svg", svg)
    assert.matches("held%-out", svg)
    local state = rl.json.decode(assert(io.open(dir .. "/files/state.json")):read("a"))
    assert.are.equal(2, state.step)
    local out = H.sh("ls " .. H.shell_quote(dir .. "/files"))
    local _, count = out:gsub("checkpoint%-", "")
    assert.are.equal(1, count)
    assert.is_table(r.before)
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)

  it("samples on until every group has different rewards (DAPO dynamic sampling)", function()
    local dir = tmpdir()
    local seen = {}
    local m = rl.model.new { vocab = 264, dim = 32, layers = 1, heads = 2, ffn = 64, ctx = 32, seed = 3 }
    rl.train { model = m, tokenizer = tok, env = letter_env, dir = dir, seed = 4, steps = 3,
      tasks_per_step = 8, group_size = 4, max_turn_tokens = 1, lr = 1e-3, dynamic_sampling = true,
      max_sampling_tries = 6, eval = false, progress = false, plot = false,
      on_step = function(_, mt) seen[#seen + 1] = mt end }
    local dropped, tries = 0, 0
    for _, mt in ipairs(seen) do
      dropped, tries = dropped + mt["sampling/groups_dropped"], tries + mt["sampling/tries"]
      if mt.episodes then
        assert.are.equal(0, mt.zero_variance_groups)
        assert.is_true(mt.episodes <= 8 * 4)
      end
    end
    -- groups of 4 with a 10% success rate are mostly all-zero: some must have been dropped
    assert.is_true(dropped > 0)
    assert.is_true(tries > 3)
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)

  it("dynamic_sampling = \"reward\" drops groups on the reward graph's totals", function()
    local dir = tmpdir()
    -- the environment's return (a letter, ~10%) is mostly flat; the graph pays the parity of the
    -- first byte, which varies within nearly every group
    local function graph()
      return rl.reward.graph { terms = { rl.reward.env { weight = 0 },
        rl.reward.fn("odd", function(ep) return ((ep.record[1].action:byte(1)) or 0) % 2 end) } }
    end
    local function sample(mode, name)
      local seen = {}
      rl.train { model = rl.model.new { vocab = 264, dim = 32, layers = 1, heads = 2, ffn = 64, ctx = 32, seed = 3 },
        tokenizer = tok, env = letter_env, dir = dir, name = name, seed = 4, steps = 3, tasks_per_step = 8,
        group_size = 4, max_turn_tokens = 1, lr = 1e-3, dynamic_sampling = mode, max_sampling_tries = 3,
        reward = graph(), eval = false, progress = false, plot = false,
        on_step = function(_, mt) seen[#seen + 1] = mt end }
      local dropped = 0
      for _, mt in ipairs(seen) do
        dropped = dropped + mt["sampling/groups_dropped"]
        if mt.episodes and mode == "reward" then assert.are.equal(0, mt.zero_variance_groups) end
      end
      return dropped
    end
    local by_env, by_graph = sample(true, "env"), sample("reward", "graph")
    assert.is_true(by_env > 8, tostring(by_env))
    assert.is_true(by_graph < by_env / 2, by_graph .. " vs " .. by_env)
    assert.matches("dynamic_sampling: \"reward\" filters groups on a reward graph's totals",
      H.error_of(rl.train, { model = rl.model.new { vocab = 264, dim = 16, layers = 1, heads = 2, ffn = 32, ctx = 32 },
        tokenizer = tok, env = letter_env, dir = dir, dynamic_sampling = "reward" }))
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)

  it("trains on tree rollouts: each task's group holds its roots and their branches", function()
    local dir = tmpdir()
    local seen = {}
    local r = run(dir, "tree", { tree = { turn = 1, k = 2 }, sft = false, eval = false,
      kl_coef = 0, log_episodes = 12, on_step = function(_, mt) seen[#seen + 1] = mt end })
    assert.are.equal(4 + 1, #r.history) -- step 0 and 4 steps
    assert.are.equal(4, #seen)
    for _, mt in ipairs(seen) do assert.are.equal(3 * 4, mt.episodes) end
    -- the logged episodes of a step: per task, 2 roots and one branch of each
    local eps = read_lines(dir .. "/tree/episodes.jsonl")
    local per_group = {}
    for _, ep in ipairs(eps) do
      if ep.step == 1 then
        local g = per_group[ep.group] or {}
        per_group[ep.group] = g
        g[#g + 1] = ep
      end
    end
    local groups = 0
    for _, g in pairs(per_group) do
      groups = groups + 1
      assert.are.equal(4, #g)
      local roots = {}
      for _, ep in ipairs(g) do
        roots[ep.branch.root] = (roots[ep.branch.root] or 0) + 1
        assert.are.same(g[1].task, ep.task)
      end
      for _, n in pairs(roots) do assert.are.equal(2, n) end
    end
    assert.are.equal(3, groups)
    local ok, msg = pcall(run, dir, "tree2", { tree = { turn = 1, k = 3 } })
    assert.is_false(ok)
    assert.matches("group_size must be a multiple of tree.k", msg)
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)

  -- A hand-made batch: episodes of `turns` turns, each turn one action token (mask 1) and one
  -- observation token; records as given.
  local function fake_batch(eps)
    local tokens, mask, turns, offsets = {}, {}, {}, { 0 }
    for _, ep in ipairs(eps) do
      tokens[#tokens + 1], mask[#mask + 1], turns[#turns + 1] = 1, 0, -1
      for k = 1, #ep.record do
        tokens[#tokens + 1], mask[#mask + 1], turns[#turns + 1] = 97, 1, k - 1
        tokens[#tokens + 1], mask[#mask + 1], turns[#turns + 1] = 2, 0, k - 1
      end
      offsets[#offsets + 1] = #tokens
      ep.turns = #ep.record
    end
    local T = rl.tensor
    return rl.batch.new { tokens = T.from(tokens), logprobs = T.zeros { #tokens }, mask = T.from(mask),
      turns = T.from(turns), offsets = offsets, episodes = eps }
  end
  local function turn_values(b, adv, i)
    local out = {}
    for p = b.offsets[i] + 1, b.offsets[i + 1] do
      local t = math.floor(b.turns:get(p))
      if t >= 0 and p % 2 == (b.offsets[i] + 2) % 2 then out[t + 1] = { adv:get(p), b.mask:get(p) } end
    end
    return out
  end
  local advantages = rl.train.advantage.compute

  it("BEACON: milestone segments are compared among episodes of a task (advantage = \"beacon\")", function()
    local rec = function(ms) local r = {} for k, m in ipairs(ms) do r[k] = { reward = 0, info = { milestone = m } } end return r end
    local eps = {
      { group = 1, reward = 1, record = rec { true, false, false } },
      { group = 1, reward = 0, record = rec { false, false, false } },
      { group = 1, reward = 1, record = rec { true, true, false } },
      { group = 1, reward = 0, record = rec { true, false, false } },
    }
    local b = fake_batch(eps)
    local ctx = { cfg = { advantage = "beacon", milestone = { gamma = 0.9, scale = 10, weight = 0.5 } } }
    local adv = advantages(ctx, b)
    -- the same rows straight through rl.advantage
    local flags, uids, index, rewards, mask = {}, {}, {}, {}, {}
    for i, ep in ipairs(eps) do
      for _, r in ipairs(ep.record) do
        flags[#flags + 1], uids[#uids + 1], index[#index + 1] = r.info.milestone, i, 1
        rewards[#rewards + 1], mask[#mask + 1] = { ep.reward }, { 1 }
      end
    end
    local sh = rl.advantage.beacon_step_rewards_dynamic({ milestone_flags = flags, traj_uids = uids },
      { gamma = 0.9, scale = 10 })
    local want = rl.advantage.beacon({ token_level_rewards = rewards, response_mask = mask,
      index = index, traj_uids = uids, step_rewards = sh.step_rewards, segment_ids = sh.segment_ids },
      { epsilon = 1e-6, step_advantage_w = 0.5, mode = "mean_norm" }).advantages
    local row = 0
    for i = 1, 4 do
      for k, v in ipairs(turn_values(b, adv, i)) do
        row = row + 1
        assert.is_near(want[row][1], v[1], 1e-6, "episode " .. i .. " turn " .. k)
      end
    end
    -- without milestones only the episode term is left: return minus the task's mean (0.5)
    for _, ep in ipairs(eps) do for _, r in ipairs(ep.record) do r.info.milestone = false end end
    b = fake_batch(eps)
    adv = advantages(ctx, b)
    for i = 1, 4 do
      for _, v in ipairs(turn_values(b, adv, i)) do assert.is_near(eps[i].reward - 0.5, v[1], 1e-6) end
    end
  end)

  it("fatal-aware: a run of failed turns leaves the loss, the rest keeps only positive credit", function()
    local function rec(kinds)
      local r = {}
      for k, kind in ipairs(kinds) do
        r[k] = { reward = 0, parsed = { kind = kind == "E" and "error" or "text" },
          tool_error = kind == "T" or nil }
      end
      return r
    end
    local eps = {
      { group = 1, reward = 0, ["end"] = "max_turns", record = rec { "ok", "E", "T", "E" } }, -- fatal at turn 1
      { group = 1, reward = 1, ["end"] = "done", record = rec { "ok", "ok", "ok", "ok" } },
      { group = 1, reward = 0, ["end"] = "done", record = rec { "ok", "E", "ok", "ok" } },       -- not fatal
      { group = 1, reward = 0, ["end"] = "max_turns", record = rec { "ok", "ok", "ok", "ok" } }, -- fatal at 4
    }
    local b = fake_batch(eps)
    local st = b:stats() -- a hand-made batch: lengths and turn counts filled in from the layout
    assert.are.equal(9, st.length_mean)
    assert.are.equal(4, st.turns_mean)
    assert.are.same({ 2, 2 }, { st.ends.done, st.ends.max_turns })
    local adv, _, fatal = advantages({ cfg = { advantage = "grpo", fatal = { threshold = 3 } } }, b)
    assert.are.equal(2, fatal)
    local v1, v3, v4 = turn_values(b, adv, 1), turn_values(b, adv, 3), turn_values(b, adv, 4)
    assert.are.same({ 0, 1 }, v1[1])                     -- before the run: GRPO < 0 clamped to 0
    for k = 2, 4 do assert.are.same({ 0, 0 }, v1[k]) end -- the run and after: out of the loss
    assert.is_true(v3[1][1] < 0 and v3[1][2] == 1)       -- not fatal: negative credit stays
    for k = 1, 4 do assert.are.same({ 0, 1 }, v4[k]) end -- no answer: clamped, nothing masked
    local v2 = turn_values(b, adv, 2)
    assert.is_true(v2[1][1] > 0)
  end)

  it("fatal.drop: fatal episodes leave the group statistics and the loss", function()
    local function rec(kinds)
      local r = {}
      for k, kind in ipairs(kinds) do
        r[k] = { reward = 0, parsed = { kind = "text" }, info = kind == "E" and { error = "down" } or {} }
      end
      return r
    end
    local function eps()
      return {
        { group = 1, reward = 0, ["end"] = "done", record = rec { "ok", "E", "E", "E" } }, -- fatal at turn 1
        { group = 1, reward = 1, ["end"] = "done", record = rec { "ok", "ok", "ok" } },
        { group = 1, reward = 0, ["end"] = "done", record = rec { "ok", "E", "ok" } },    -- not fatal
        { group = 1, reward = 1, ["end"] = "done", record = rec { "E", "E", "E" } },      -- fatal at 0
        { group = 2, reward = 0.5, ["end"] = "done", record = rec { "ok", "ok" } },
        { group = 2, reward = 0, ["end"] = "done", record = rec { "ok", "ok" } },
      }
    end
    local all = eps()
    local b = fake_batch(all)
    local adv, per, fatal = advantages({ cfg = { advantage = "grpo", fatal = { drop = true } } }, b)
    assert.are.equal(2, fatal)
    assert.are.equal(1, all[1].fatal_turn)
    assert.are.equal(0, all[4].fatal_turn)
    for _, i in ipairs { 1, 4 } do
      for p = b.offsets[i] + 1, b.offsets[i + 1] do
        assert.are.equal(0, b.mask:get(p))
        assert.are.equal(0, adv:get(p))
      end
      assert.are.equal(0, per[i])
    end
    -- the others get what GRPO gives the batch without the fatal episodes
    local kept = eps()
    local sub = fake_batch { kept[2], kept[3], kept[5], kept[6] }
    local want = advantages({ cfg = { advantage = "grpo" } }, sub)
    for k, i in ipairs { 2, 3, 5, 6 } do
      local got, exp = turn_values(b, adv, i), turn_values(sub, want, k)
      assert.are.equal(#exp, #got)
      for t = 1, #exp do
        assert.is_near(exp[t][1], got[t][1], 1e-6)
        assert.are.equal(1, got[t][2])
      end
    end
    assert.is_true(turn_values(b, adv, 3)[1][1] < 0) -- kept: its negative credit stays
    -- the same batch without drop: the fatal episodes stay in the statistics, masked after the run
    local b2 = fake_batch(eps())
    local adv2 = advantages({ cfg = { advantage = "grpo", fatal = true } }, b2)
    local v1 = turn_values(b2, adv2, 1)
    assert.are.same({ 0, 1 }, v1[1])
    assert.are.same({ 0, 0 }, v1[2])
    assert.are_not.equal(want:get(sub.offsets[1] + 2), adv2:get(b2.offsets[2] + 2))
  end)

  -- The message rl.train raises for base options plus extra (small sizes, so that a version
  -- that ignored a bad option would still end soon).
  local function train_error(extra)
    local dir = tmpdir()
    local o = { model = model(), tokenizer = tok, env = guess, progress = false, dir = dir,
      steps = 1, tasks_per_step = 1, group_size = 2, max_turn_tokens = 1, eval = false }
    for k, v in pairs(extra) do o[k] = v end
    local ok, msg = pcall(rl.train, o)
    H.sh("rm -rf " .. H.shell_quote(dir))
    assert.is_false(ok, "rl.train accepted the options")
    return msg
  end

  it("names bad options", function()
    local err = train_error
    assert.matches("advantage: unknown estimator", err { advantage = "magic" })
    assert.matches("steps: a positive integer", err { steps = 0 })
    assert.matches("name: letters", err { name = "../x" })
    assert.matches("tasks%(%) is missing", err { env = { name = "x", new = function() end } })
    local noclone = { name = "nc", max_turns = 3, tasks = function() return {} end,
      new = function() return { reset = function() return "" end, step = function() end } end }
    assert.matches("tree: the environment's instances need a clone%(%) method",
      err { env = noclone, tree = { turn = 1, k = 2 }, group_size = 4 })
    assert.matches("tree: turn must be less than max_turns", err { tree = { turn = 4, k = 2 }, group_size = 4 })
    assert.matches("lam: a number in %[0, 1%]", err { advantage = "gae", lam = 1.5 })
    assert.matches("value_clip", err { advantage = "gae", value_clip = -1 })
    assert.matches("fatal.threshold: a positive integer expected, got 0", err { fatal = { threshold = 0 } })
    assert.matches("fatal: true or false or a table", err { fatal = "yes" })
    assert.matches("fatal.drop: true or false expected, got 1", err { fatal = { drop = 1 } })
    assert.matches("milestone.mode", err { advantage = "beacon", milestone = { mode = "x" } })
    assert.matches("dro_beta: loss = \"dro\" needs", err { loss = "dro" })
    assert.matches("gdpo.weights: 1 weights expected", err { advantage = "gdpo", gdpo = { weights = { 1, 2 } } })
    assert.matches("gdpo: only with advantage", err { gdpo = { weights = { 1 } } })
    assert.matches("kl_reward_coef is not one of them", err { advantage = "gdpo", kl_reward_coef = 0.1 })
    assert.matches("rollout_correction: .*rs_threshold: needed with rs",
      err { rollout_correction = { rollout_rs = "token_k2" } })
    assert.matches("rollout_correction.rollout_rs: unknown criterion 'seq_maxx_k3' %(did you mean "
      .. "'seq_max_k3'%?%)", err { rollout_correction = { rollout_rs = "token_k1, seq_maxx_k3",
      rollout_rs_threshold = 1 } })
    assert.matches("rollout_correction.bypass_mode: the loss is",
      err { loss = "gspo", rollout_correction = { bypass_mode = true } })
    local ok, msg = pcall(rl.train, { tokenizer = tok, env = guess })
    assert.is_false(ok)
    assert.matches("model", msg)
  end)

  it("refuses unknown options, naming the nearest known one (top level and every table option)", function()
    local function unknown(extra, want)
      local msg = train_error(extra)
      assert.truthy(msg:find(want, 1, true), msg)
    end
    unknown({ lr_rate = 1e-3 }, "train: unknown option 'lr_rate' (did you mean 'lr'?)")
    unknown({ temprature = 0.7 }, "unknown option 'temprature' (did you mean 'temperature'?)")
    unknown({ grop_size = 4 }, "unknown option 'grop_size' (did you mean 'group_size'?)")
    unknown({ learning_rate = 1e-3 }, "unknown option 'learning_rate'")
    assert.is_nil(train_error({ learning_rate = 1e-3 }):find("did you mean", 1, true))
    unknown({ sft = { examples = 4, epoch = 1 } }, "unknown option 'sft.epoch' (did you mean 'sft.epochs'?)")
    unknown({ eval = { evry = 2, tasks = 2 } }, "unknown option 'eval.evry' (did you mean 'eval.every'?)")
    unknown({ tree = { turn = 1, k = 2, kk = 2 } }, "unknown option 'tree.kk' (did you mean 'tree.k'?)")
    unknown({ advantage = "beacon", milestone = { gama = 0.9 } },
      "unknown option 'milestone.gama' (did you mean 'milestone.gamma'?)")
    unknown({ fatal = { treshold = 2 } }, "unknown option 'fatal.treshold' (did you mean 'fatal.threshold'?)")
    unknown({ overlong = { max_len = 8, buffer = 2, factr = 1 } },
      "unknown option 'overlong.factr' (did you mean 'overlong.factor'?)")
    unknown({ rewards = { { name = "a", fn = function() return 0 end, weight = 2 } } },
      "rewards[1]: unknown option 'weight'")
    unknown({ advantage = "grpoo" }, "advantage: unknown estimator 'grpoo' (did you mean 'grpo'?)")
    unknown({ loss = "dppo-tv" }, 'loss: one of "ppo"')
    unknown({ loss = "dppo-tv" }, '(did you mean "dppo_tv"?)')
    unknown({ agg = "token_sum" }, '(did you mean "token-sum"?)')
    unknown({ kl = "low_var_kl++" }, '(did you mean "low_var_kl+"?)')
    unknown({ rollout_correction = { rollout_iss = "token" } },
      "unknown option 'rollout_correction.rollout_iss' (did you mean 'rollout_correction.rollout_is'?)")
    unknown({ rollout_correction = { rollout_is = "tokens" } }, '(did you mean "token"?)')
    unknown({ advantage = "gdpo", gdpo = { terms = { "envv" } } },
      "gdpo.terms: 'envv' is not a reward term (did you mean 'env'?)")
  end)

  it("checks the type of every option and raises at the caller's line", function()
    local line
    local ok, msg = pcall(function()
      line = debug.getinfo(1, "l").currentline + 1
      rl.train { model = 1, tokenizer = tok, env = guess, eval = false, steps = 1 }
    end)
    assert.is_false(ok)
    assert.truthy(msg:find("train_spec.lua:" .. line .. ": train: model: an rl.model expected, got 1",
      1, true), msg)
    local err = train_error
    assert.matches("tokenizer: an rl.tokenizer expected, got \"bytes\"", err { tokenizer = "bytes" })
    assert.matches("tokenizer: an rl.tokenizer expected, got a moonrl.model", err { tokenizer = model() })
    assert.matches("steps: a positive integer expected, got 1.5", err { steps = 1.5 })
    assert.matches("lr: a non%-negative number expected, got \"0.1\"", err { lr = "0.1" })
    assert.matches("temperature: a non%-negative number expected, got %-?nan", err { temperature = 0 / 0 })
    assert.matches("on_step: a function expected, got 3", err { on_step = 3 })
    assert.matches("eval: false or a table", err { eval = 5 })
    assert.matches("sft: false or a table", err { sft = true })
    assert.matches("sft.lr: a non%-negative number expected, got %-1", err { sft = { lr = -1 } })
    assert.matches("resume: true or false or \"force\" expected, got \"yes\"", err { resume = "yes" })
    assert.matches("loss: one of \"ppo\"", err { loss = "ppo2" })
    assert.matches("kl: one of", err { kl = "k4" })
    assert.matches("schedule: one of \"constant\", \"cosine\"", err { schedule = "linear" })
    assert.matches("advantage: a registered estimator's name or a function", err { advantage = 3 })
    assert.matches("rewards.a: a function%(episode%) %-> number expected, got 1", err { rewards = { a = 1 } })
    assert.matches("rewards.mean: 'mean' is a built%-in term's name", err { rewards = { mean = function() return 0 end } })
    assert.matches("tasks: a function%(ctx, step, n, seed%)", err { tasks = 4 })
    assert.matches("checkpoint.load: a function expected %(it is required%)",
      err { checkpoint = { save = function() end } })
    assert.matches("overlong.buffer: a positive integer expected %(it is required%)", err { overlong = { max_len = 8 } })
    assert.matches("sft: the environment letter has no oracle", err { env = letter_env, sft = { examples = 4 } })
  end)

  -- A small run of the letter environment in dir/name.
  local function letter_run(dir, extra)
    local o = { model = rl.model.new { vocab = 264, dim = 32, layers = 1, heads = 2, ffn = 64, ctx = 32,
      seed = 3 }, tokenizer = tok, env = letter_env, dir = dir, name = "again", seed = 4, steps = 3,
      tasks_per_step = 2, group_size = 4, max_turn_tokens = 1, lr = 1e-2, eval = false, progress = false }
    for k, v in pairs(extra or {}) do o[k] = v end
    return rl.train(o)
  end
  local slurp = H.read_file

  it("never replaces an earlier run's files unless told to (overwrite = true)", function()
    local dir = tmpdir()
    letter_run(dir)
    local run = dir .. "/again"
    assert(io.open(run .. "/notes.txt", "w")):close() -- the user's own file
    local names = { "state.json", "metrics.jsonl", "episodes.jsonl", "curve.svg", "checkpoint-000003.bin" }
    local before = {}
    for _, n in ipairs(names) do before[n] = assert(slurp(run .. "/" .. n), n) end
    local function unchanged()
      for _, n in ipairs(names) do assert.are.equal(before[n], slurp(run .. "/" .. n), n) end
      assert.is_string(slurp(run .. "/notes.txt"))
    end
    -- a fresh run of the same name is refused, at the recipe's line, and touches nothing
    local line
    local ok, msg = pcall(function()
      line = debug.getinfo(1, "l").currentline + 1
      letter_run(dir, { seed = 5 })
    end)
    assert.is_false(ok)
    assert.truthy(msg:find("train_spec.lua:" .. line .. ": train: " .. run .. " holds an earlier run", 1, true), msg)
    assert.truthy(msg:find("overwrite = true", 1, true) and msg:find("resume = true", 1, true), msg)
    assert.truthy(msg:find("state.json", 1, true), msg)
    unchanged()
    -- overwrite = true with an option that fails its check: still nothing touched
    ok, msg = pcall(letter_run, dir, { seed = 5, overwrite = true, sft = { examples = 4 } })
    assert.is_false(ok)
    assert.matches("no oracle", msg)
    unchanged()
    -- resume = true on a finished run continues it (nothing left to do) and keeps its files
    letter_run(dir, { resume = true })
    unchanged()
    -- overwrite = true replaces the run's files and leaves the user's
    letter_run(dir, { seed = 5, steps = 2, overwrite = true })
    local state = rl.json.decode(slurp(run .. "/state.json"))
    assert.are.equal(2, state.step)
    assert.are.equal("checkpoint-000002.bin", state.checkpoint)
    assert.is_nil(slurp(run .. "/checkpoint-000003.bin"))
    assert.are.equal(3, #read_lines(run .. "/metrics.jsonl"))
    assert.are_not.equal(before["episodes.jsonl"], slurp(run .. "/episodes.jsonl"))
    assert.is_string(slurp(run .. "/notes.txt"))
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)

  it("puts the KL of the untempered policy in the reward (kl_reward_coef): ~0 while it is the reference", function()
    for _, sampling in ipairs { { temperature = 0.7 }, { top_p = 0.8 }, { temperature = 0.7, top_p = 0.9 },
      { temperature = 1.3, top_k = 20 } } do
      local dir = tmpdir()
      local seen = {}
      local o = { model = rl.model.new { vocab = 264, dim = 32, layers = 1, heads = 2, ffn = 64, ctx = 32,
        seed = 3 }, tokenizer = tok, env = letter_env, dir = dir, seed = 4, steps = 1, tasks_per_step = 4,
        group_size = 4, max_turn_tokens = 4, kl_reward_coef = 1, eval = false, progress = false,
        plot = false, on_step = function(_, mt) seen[#seen + 1] = mt end }
      for k, v in pairs(sampling) do o[k] = v end
      rl.train(o)
      -- step 1 scores the batch before any update: the policy is still the reference
      local pen = seen[1]["reward/kl_penalty"]
      assert.is_number(pen)
      assert.is_true(math.abs(pen) < 1e-6, string.format("%s: KL penalty %g", next(sampling), pen))
      assert.is_true(seen[1].sampled_tokens >= 16)
      H.sh("rm -rf " .. H.shell_quote(dir))
    end
  end)

  it("keeps the options in state.json and refuses to resume with others unless resume = \"force\"", function()
    local dir = tmpdir()
    letter_run(dir, { stop_after = 1, rewards = { { name = "short", fn = function(ep) return -0.01 * ep.length end } } })
    local path = dir .. "/again/state.json"
    local state = rl.json.decode(slurp(path))
    assert.are.equal(0.01, state.options.lr)
    assert.are.equal("grpo", state.options.advantage)
    assert.are.equal("letter", state.options.env)
    assert.are.same({ "short" }, state.options.rewards)
    assert.is_nil(state.options.stop_after)
    local saved = slurp(path)
    local terms = { { name = "short", fn = function(ep) return -0.01 * ep.length end } }
    local function refused(extra, wants)
      extra.resume, extra.rewards = extra.resume or true, extra.rewards or terms
      local line
      local ok, msg = pcall(function()
        line = debug.getinfo(1, "l").currentline + 1
        letter_run(dir, extra)
      end)
      assert.is_false(ok, "resumed")
      assert.truthy(msg:find("train_spec.lua:" .. line .. ": train: resume: the options differ", 1, true), msg)
      for _, w in ipairs(wants) do assert.truthy(msg:find(w, 1, true), msg) end
      assert.truthy(msg:find('resume = "force"', 1, true), msg)
      assert.are.equal(saved, slurp(path)) -- nothing was touched
    end
    refused({ lr = 0.02 }, { "lr (0.01, now 0.02)" })
    refused({ advantage = "rloo" }, { 'advantage ("grpo", now "rloo")' })
    refused({ lr = 0.02, advantage = "rloo", group_size = 2 },
      { "group_size (4, now 2)", "advantage (", "lr (0.01, now 0.02)" })
    refused({ rewards = { { name = "shorter", fn = terms[1].fn } } }, { 'rewards (["short"], now ["shorter"])' })
    refused({ sft = false, top_p = 0.9 }, { "top_p (unset, now 0.9)" })
    -- what only says how to run may change: progress, plot, log_episodes, checkpoint_every, stop_after
    letter_run(dir, { resume = true, rewards = terms, plot = false, log_episodes = 1, checkpoint_every = 1,
      stop_after = 2 })
    assert.are.equal(2, rl.json.decode(slurp(path)).step)
    -- resume = "force" continues with the new options, which state.json then keeps
    letter_run(dir, { resume = "force", rewards = terms, lr = 0.02 })
    state = rl.json.decode(slurp(path))
    assert.are.equal(3, state.step)
    assert.are.equal(0.02, state.options.lr)
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)

  it("reports write errors in its files (metrics, episodes, curve, state) naming the file", function()
    -- after step 1, the file is swapped for one that cannot be written: a link to /dev/full (a
    -- full disk) or a folder in its place (the atomic rename fails); step 2 must raise
    local function broken(name, how)
      local dir = tmpdir()
      local path = dir .. "/again/" .. name
      local ok, msg = pcall(letter_run, dir, { checkpoint_every = 1, on_step = function(step)
        if step == 1 then
          os.remove(path)
          if how == "full" then H.sh("ln -s /dev/full " .. H.shell_quote(path)) else assert(rl.fs.mkdir(path)) end
        end
      end })
      H.sh("rm -rf " .. H.shell_quote(dir))
      assert.is_false(ok, name .. " could not be written, and nobody said so")
      assert.truthy(msg:find("train: " .. path .. ": ", 1, true), msg)
      return msg
    end
    assert.matches("[Ss]pace", broken("metrics.jsonl", "full"))
    assert.matches("[Ss]pace", broken("episodes.jsonl", "full"))
    broken("curve.svg", "folder")
    broken("state.json", "folder")
  end)

  it("writes valid UTF-8 JSON when the policy emits broken bytes, and rl.json.decode restores them", function()
    -- a fresh byte-level policy samples arbitrary bytes: most replies are not UTF-8
    local dir = tmpdir()
    local sampled = {}
    letter_run(dir, { max_turn_tokens = 6, log_episodes = 8, rewards = { seen = function(ep)
      sampled[ep.record[1].action] = true
      return 0
    end } })
    local path = dir .. "/again/episodes.jsonl"
    local text = slurp(path)
    assert.truthy(utf8.len(text), "episodes.jsonl is not UTF-8")
    local broken = 0
    for _, ep in ipairs(read_lines(path)) do
      local action = ep.record[1].action
      assert.is_true(sampled[action] == true, ("%q was not sampled"):format(action))
      if not utf8.len(action) then broken = broken + 1 end
    end
    assert.is_true(broken > 0, "no episode had broken bytes")
    assert.truthy(utf8.len(slurp(dir .. "/again/state.json")))
    assert.truthy(utf8.len(slurp(dir .. "/again/metrics.jsonl")))
    local python = io.open("/usr/bin/python3", "r")
    if python then
      python:close()
      local out, _, ok = H.run("/usr/bin/python3 -c 'import json, sys; "
        .. "[json.loads(l) for l in open(sys.argv[1], encoding=\"utf-8\", errors=\"strict\")]; print(\"read\")' "
        .. H.shell_quote(path))
      assert.is_true(ok, out)
      assert.matches("read", out)
    end
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)

  -- An advantage stage in Lua: each episode's reward less the mean of the others of its group.
  local function leave_one_out(_, batch)
    local sum, count = {}, {}
    for _, ep in ipairs(batch.episodes) do
      sum[ep.group], count[ep.group] = (sum[ep.group] or 0) + ep.reward, (count[ep.group] or 0) + 1
    end
    local per_episode = {}
    for i, ep in ipairs(batch.episodes) do
      local n = count[ep.group]
      per_episode[i] = n > 1 and ep.reward - (sum[ep.group] - ep.reward) / (n - 1) or 0
    end
    local adv = rl.tensor.zeros(batch.mask:numel())
    for i = 1, batch:size() do
      local a, b = batch:range(i)
      for p = a, b do if batch.mask:get(p) ~= 0 then adv:set(p, per_episode[i]) end end
    end
    return adv, per_episode
  end

  it("learns with the advantage stage a Lua function and the task stage its own sampler", function()
    local calls = { adv = 0 }
    local sampler = { drawn = 0, updates = 0, seen = {} }
    function sampler:sample(ctx, step, n, seed)
      assert.are.equal(letter_env, ctx.cfg.env)
      assert.is_true(math.type(seed) == "integer")
      local out = {}
      for k = 1, n do
        self.drawn = self.drawn + 1
        out[k] = { i = self.drawn, step = step }
      end
      return out
    end
    function sampler:update(_, step, batch)
      self.updates = self.updates + 1
      for _, ep in ipairs(batch.episodes) do self.seen[ep.task.step] = step end
    end
    function sampler:state() return { drawn = self.drawn } end
    function sampler:load(s) self.drawn = s.drawn end
    local dir = tmpdir()
    local m = rl.model.new { vocab = 264, dim = 32, layers = 1, heads = 2, ffn = 64, ctx = 32, seed = 3 }
    local r = rl.train {
      model = m, tokenizer = tok, env = letter_env, dir = dir, seed = 4, steps = 15,
      tasks_per_step = 4, group_size = 16, max_turn_tokens = 1, lr = 1e-2, minibatch = 16,
      eval = false, progress = false, plot = false, tasks = sampler,
      advantage = function(ctx, batch) calls.adv = calls.adv + 1 return leave_one_out(ctx, batch) end,
    }
    local first = (r.history[2].success + r.history[3].success) / 2
    local last = (r.history[#r.history].success + r.history[#r.history - 1].success) / 2
    assert.is_true(first < 0.4, "success at the start " .. first)
    assert.is_true(last > 0.8, "success at the end " .. last)
    assert.are.equal(15, calls.adv)
    assert.are.equal(15 * 4, sampler.drawn)
    assert.are.equal(15, sampler.updates)
    for step = 1, 15 do assert.are.equal(step, sampler.seen[step]) end -- each step had its tasks
    local state = rl.json.decode(slurp(dir .. "/letter/state.json"))
    assert.are.same({ drawn = 60 }, state.tasks)
    assert.are.equal("<function>", state.options.advantage)
    assert.are.equal("<object>", state.options.tasks)
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)

  -- ---------------------------------------------------------------- curricula
  -- One turn: levels 1 and 2 always win, level 3 wins with a reply that starts with a lowercase
  -- letter (learnt), levels 4 and 5 never win. A band curriculum climbs to level 3 or 4.
  local level_env = {
    name = "levels", max_turns = 1,
    tasks = function(_, n)
      local t = {}
      for i = 1, n do t[i] = { level = 1, i = i } end
      return t
    end,
    new = function()
      local e = {}
      function e.reset(self, task) self.level = task.level return "level " .. task.level end
      function e.step(self, action)
        local ok = self.level <= 2 or (self.level == 3 and action:match("^%l") ~= nil)
        return nil, ok and 1 or 0, true, { success = ok }
      end
      return e
    end,
  }
  local function level_curriculum(extra)
    local C = rl.curriculum
    local o = { source = C.procedural { gen = function(p, rng) return { level = p.level, x = rng:random(100) } end,
      params = { level = C.range { 1, 5 } } }, sampler = C.band { min_samples = 8, cooldown = 0 }, seed = 2 }
    for k, v in pairs(extra or {}) do o[k] = v end
    return C.new(o)
  end

  it("trains from a curriculum: its tasks, per-cell metrics, every rolled-out group observed, its state kept", function()
    local dir = tmpdir()
    local cur = level_curriculum { gate = rl.curriculum.gate { reject = "zero_variance", max_tries = 3 } }
    local seen = {}
    local m = rl.model.new { vocab = 264, dim = 32, layers = 1, heads = 2, ffn = 64, ctx = 32, seed = 3 }
    rl.train { model = m, tokenizer = tok, env = level_env, dir = dir, seed = 4, steps = 12,
      tasks_per_step = 4, group_size = 8, max_turn_tokens = 1, lr = 1e-2, minibatch = 16,
      eval = false, progress = false, plot = false, curriculum = cur,
      on_step = function(_, mt) seen[#seen + 1] = mt end }
    local rolled, observed, cells = 0, 0, 0
    for _, mt in ipairs(seen) do
      rolled = rolled + mt["sampling/tries"] * 4 * 8 -- the gate resamples only the dropped groups
      observed = observed + mt["curriculum/episodes"]
      for k in pairs(mt) do if k:match("^curriculum/level=%d/success$") then cells = cells + 1 end end
      assert.is_number(mt["curriculum/level/level"])
      if mt.episodes then assert.are.equal(0, mt.zero_variance_groups) end -- the gate's work
    end
    assert.is_true(observed > 12 * 4 * 8, "dropped groups are observed too: " .. observed)
    assert.is_true(observed <= rolled)
    assert.is_true(cells >= 12)
    local st = cur:stats()
    assert.is_true(#st.moves >= 2, "the level moved up as the policy learned")
    assert.is_true(st.levels.level >= 3)
    local state = rl.json.decode(slurp(dir .. "/levels/state.json"))
    assert.are.equal("procedural", state.tasks.kind)
    assert.are.equal(#st.moves, #state.tasks.sst.moves)
    assert.are.equal("band", state.options.curriculum.sampler.name)
    assert.are.equal(8, state.options.curriculum.sampler.min_samples)
    -- options: one task source; the gate or dynamic sampling; the source's env must be rl.train's
    local function opts(extra)
      local o = { model = m, tokenizer = tok, env = level_env, dir = dir, eval = false, progress = false }
      for k, v in pairs(extra) do o[k] = v end
      return o
    end
    assert.matches("curriculum: the tasks option chooses the tasks too",
      H.error_of(rl.train, opts { curriculum = level_curriculum(), tasks = function() end }))
    assert.matches("its gate and dynamic_sampling both drop groups",
      H.error_of(rl.train, opts { curriculum = cur, dynamic_sampling = true }))
    assert.matches("curriculum: an rl.curriculum", H.error_of(rl.train, opts { curriculum = {} }))
    local other = rl.curriculum.new { source = rl.curriculum.horizon { start = 1, stop = 2, env = guess } }
    assert.matches("draws tasks of the environment guess_letter, rl.train's is levels",
      H.error_of(rl.train, opts { curriculum = other }))
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)

  it("gives each task its horizon's max_turns, and starts backward tasks from their snapshots", function()
    -- never done by itself: an episode lasts exactly its max_turns
    local endless = { name = "endless", max_turns = 6,
      tasks = function(_, n) local t = {} for i = 1, n do t[i] = { i = i } end return t end,
      new = function() return { reset = function() return "go" end, step = function() return "more", 0, false end } end }
    local C = rl.curriculum
    local cur = C.new { source = C.horizon { start = 1, stop = 4, env = endless }, sampler = C.uniform() }
    local dir = tmpdir()
    local m = rl.model.new { vocab = 264, dim = 32, layers = 1, heads = 2, ffn = 64, ctx = 64, seed = 3 }
    local batches = {}
    rl.train { model = m, tokenizer = tok, env = endless, dir = dir, seed = 4, steps = 2, tasks_per_step = 8,
      group_size = 2, max_turn_tokens = 1, eval = false, progress = false, plot = false, curriculum = cur,
      log = function(_, _, _, batch) batches[#batches + 1] = batch end }
    local horizons = {}
    for _, b in ipairs(batches) do
      if b then
        for _, g in ipairs(b:groups()) do
          local t = b.episodes[g.members[1]].task
          horizons[t.max_turns] = true
          for _, i in ipairs(g.members) do
            local ep = b.episodes[i]
            assert.are.equal(t, ep.task)
            assert.are.equal(t.max_turns, ep.turns)
            assert.are.equal("max_turns", ep["end"])
          end
        end
      end
    end
    local n = 0
    for _ in pairs(horizons) do n = n + 1 end
    assert.is_true(n >= 3, "several horizons in one run")
    -- backward: walk to task.goal, one step per turn, whatever the reply
    local Walk = {}
    Walk.__index = Walk
    local walk = { name = "walk", max_turns = 8,
      tasks = function(_, k, seed)
        local rng, t = rl.rng(seed), {}
        for i = 1, k do t[i] = { goal = rng:random(4, 8) } end
        return t
      end,
      new = function() return setmetatable({}, Walk) end }
    function Walk:reset(task) self.goal, self.at = task.goal, 0 return "at 0" end
    function Walk:step()
      self.at = self.at + 1
      if self.at == self.goal then return nil, 1, true, { success = true } end
      return "at " .. self.at, 0, false
    end
    function Walk:clone() return setmetatable({ goal = self.goal, at = self.at }, Walk) end
    local back = C.new { source = C.backward { env = walk, k = C.levels { 2, 3 },
      demos = function(task) local a = {} for i = 1, task.goal do a[i] = "+" end return a end } }
    batches = {}
    rl.train { model = m, tokenizer = tok, env = walk, dir = dir, name = "walk", seed = 4, steps = 2,
      tasks_per_step = 6, group_size = 2, max_turn_tokens = 1, eval = false, progress = false, plot = false,
      curriculum = back, log = function(_, _, _, batch) batches[#batches + 1] = batch end }
    local checked = 0
    for _, b in ipairs(batches) do
      for _, ep in ipairs(b and b.episodes or {}) do
        assert.are.equal(ep.task.goal - ep.task.start_turn, ep.turns) -- k turns left to walk
        assert.are.equal(ep.task.params.k, ep.turns)
        assert.is_true(ep.success)
        checked = checked + 1
      end
    end
    assert.are.equal(2 * 6 * 2, checked)
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)

  -- The curriculum resume run, loaded here and, for its resumed half, in another process.
  local CURRICULUM_RUN = [==[
local rl = require "moonrl"
local level_env = {
  name = "levels", max_turns = 1,
  tasks = function(_, n) local t = {} for i = 1, n do t[i] = { level = 1, i = i } end return t end,
  new = function()
    local e = {}
    function e.reset(self, task) self.level = task.level return "level " .. task.level end
    function e.step(self, action)
      local ok = self.level <= 2 or (self.level == 3 and action:match("^%l") ~= nil)
      return nil, ok and 1 or 0, true, { success = ok }
    end
    return e
  end,
}
return function(dir, name, extra)
  local C = rl.curriculum
  local cur = C.new { source = C.procedural { gen = function(p, rng) return { level = p.level, x = rng:random(1000) } end,
    params = { level = C.range { 1, 5 } } }, sampler = C.band { min_samples = 8, cooldown = 0 },
    gate = C.gate { max_tries = 2 }, seed = 2 }
  local o = { model = rl.model.new { vocab = 264, dim = 32, layers = 1, heads = 2, ffn = 64, ctx = 32, seed = 3 },
    tokenizer = rl.tokenizer.bytes(), env = level_env, dir = dir, name = name, seed = 4, steps = 10,
    tasks_per_step = 4, group_size = 8, max_turn_tokens = 1, lr = 1e-2, minibatch = 16, eval = false,
    progress = false, plot = false, curriculum = cur, log_episodes = 1000, checkpoint_every = 1 }
  for k, v in pairs(extra or {}) do o[k] = v end
  return rl.train(o), cur
end
]==]

  it("resumes a curriculum run in another process: the same task stream and level history (acceptance test 14)", function()
    local dir = tmpdir()
    local config = H.script(dir .. "/run.lua", CURRICULUM_RUN)
    local runner = assert(loadfile(config))()
    local _, cur = runner(dir, "full")
    runner(dir, "cut", { stop_after = 4 })
    local out, _, ok = H.run_lua([[
      local runner = loadfile(arg[1])()
      runner(arg[2], "cut", { resume = true })
    ]], config, dir)
    assert.is_true(ok, out)
    local function tasks_of(name)
      local list = {}
      for _, ep in ipairs(read_lines(dir .. "/" .. name .. "/episodes.jsonl")) do
        list[#list + 1] = string.format("%d %s %s", ep.step, ep.task.cell, ep.task.key)
      end
      return list
    end
    local tf, tc = tasks_of("full"), tasks_of("cut")
    assert.is_true(#tf > 40)
    assert.are.same(tf, tc)
    local full = rl.json.decode(slurp(dir .. "/full/state.json"))
    local cut = rl.json.decode(slurp(dir .. "/cut/state.json"))
    assert.are.equal(rl.json.encode(full.tasks), rl.json.encode(cut.tasks)) -- every statistic
    assert.is_true(#full.tasks.sst.moves >= 2, "the level moved")
    assert.are.equal(#cur:stats().moves, #full.tasks.sst.moves)
    local lf, lr = read_lines(dir .. "/full/metrics.jsonl"), read_lines(dir .. "/cut/metrics.jsonl")
    assert.are.equal(#lf, #lr)
    for i, rec in ipairs(lf) do
      for k, v in pairs(rec) do
        if not k:match("^time/") and k ~= "tokens_per_s" then assert.are.equal(v, lr[i][k], "step " .. rec.step .. " " .. k) end
      end
    end
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)

  it("registers estimators by name, the built-ins among them, and checks what it is given", function()
    local A = rl.train.advantage
    for _, name in ipairs { "grpo", "rloo", "gigpo", "beacon", "gae", "step_gae" } do assert.is_table(A.get(name)) end
    assert.is_true(A.get("gae").critic)
    assert.is_true(A.get("step_gae").critic)
    A.register("spec_loo", leave_one_out)
    local found = false
    for _, name in ipairs(A.names()) do found = found or name == "spec_loo" end
    assert.is_true(found)
    local dir = tmpdir()
    local seen = {}
    letter_run(dir, { advantage = "spec_loo", steps = 2, on_step = function(_, mt) seen[#seen + 1] = mt end })
    assert.are.equal(2, #seen)
    assert.is_number(seen[1]["adv/abs_max"])
    -- an estimator that returns the wrong thing is named
    A.register("spec_bad", function() return 1, {} end)
    local ok, msg = pcall(letter_run, dir, { advantage = "spec_bad", overwrite = true })
    assert.is_false(ok)
    assert.matches("advantage spec_bad: per%-token advantages expected", msg)
    assert.matches("register: name: a string", H.error_of(A.register, 3, leave_one_out))
    assert.matches("register: fn: a function", H.error_of(A.register, "x", 3))
    assert.matches("register: opts: unknown option 'critc'", H.error_of(A.register, "x", leave_one_out, { critc = true }))
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)

  it("calls a recipe's evaluate, log, reward, rollout and checkpoint stages in place of its own", function()
    local dir = tmpdir()
    local logged, evals, saved, rolled = {}, {}, {}, 0
    local stages = rl.train
    letter_run(dir, { steps = 4, eval = { every = 2 },
      evaluate = function(_, step) evals[#evals + 1] = step return { score = step / 10 } end,
      log = function(ctx, step, mt, batch)
        logged[#logged + 1] = { step = step, has_batch = batch ~= nil, eval = mt["eval/score"] }
        assert.are.equal(mt, ctx.state.history[#ctx.state.history])
      end,
      reward = function(ctx, batch, step)
        local terms = stages.reward.run(ctx, batch, step)
        for _, ep in ipairs(batch.episodes) do ep.reward = ep.reward + 0.5 end
        terms.bonus = 0.5
        return terms
      end,
      rollout = function(ctx, req)
        rolled = rolled + 1
        return stages.rollout.run(ctx, req)
      end,
      checkpoint = { save = function(ctx, step) saved[#saved + 1] = step assert.is_table(ctx.state.history) end,
        load = function() return nil end } })
    assert.are.same({ 0, 2, 4 }, evals)
    assert.are.equal(5, #logged)
    assert.are.same({ step = 0, has_batch = false, eval = 0 }, logged[1])
    assert.are.same({ step = 2, has_batch = true, eval = 0.2 }, logged[3])
    assert.are.same({ 0, 2, 4 }, saved) -- every eval.every steps, and the last
    assert.are.equal(4, rolled)
    assert.is_nil(slurp(dir .. "/again/metrics.jsonl")) -- the default log did not run
    assert.is_nil(slurp(dir .. "/again/state.json"))    -- nor the default checkpoint
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)

  -- ---------------------------------------------------------------- task synthesis

  -- The synthesis test's run: "say <letter>" tasks; the policy proposes a task by writing text
  -- whose first lowercase letter is the letter to say (the contract's parse), exec checks the
  -- task's Lua check, calibration rolls it out 4 times, admitted tasks join the curriculum's pool.
  local SYNTH_RUN = [==[
local rl = require "moonrl"
local S = rl.synth
local function task(l)
  return { instruction = "say " .. l, answer = l, check = string.format("local a = ... return a:sub(1, 1) == %q", l),
    solution = string.format("return %q", l), failures = { l == "z" and "y" or "z", "" } }
end
local env = { name = "say", max_turns = 1,
  tasks = function(split, n, seed)
    local rng, out = rl.rng(seed or 0), {}
    for i = 1, n do out[i] = task(string.char(97 + (split == "test" and 13 or 0) + rng:random(0, 12))) end
    return out
  end,
  oracle = function(t) return { t.answer } end,
  new = function()
    return { reset = function(self, t) self.t = t return t.instruction end,
      step = function(self, action)
        local ok = S.check_answer(self.t, action:match("%S*")) == true
        return nil, ok and 1 or 0, true, { success = ok }
      end,
      state_key = function(self) return self.t.answer < "g" and "early" or "late" end }
  end }
local contract = S.contract { "instruction", "answer", "check", "solution", "failures", parse = function(text)
  local l = text:match("%l")
  if not l then return nil, "no letter" end
  return task(l)
end, render = function(t) return t.answer end }
return function(dir, name, extra)
  local seeds = { task("a"), task("e"), task("i") }
  local cur = rl.curriculum.new { source = rl.curriculum.pool { tasks = seeds }, sampler = rl.curriculum.learnability {}, seed = 3 }
  local loop = S.loop { propose = S.proposer { policy = "self", contract = contract, seeds = seeds, group = 3,
      max_tokens = 3, prompt = "propose like {exemplar}:", warm_start = 80 },
    verify = { S.exec {} }, calibrate = S.pass_rate { k = 4, band = { 0.2, 0.8 } },
    novelty = S.novelty { key = function(t) return t.answer end, numbers = "keep", ngram = 1 },
    target = S.target { from = cur, by = { "state" } }, pool = cur, per_step = 6, every = 1, seed = 9,
    retire = { above = 0.75, window = 4 } }
  local o = { model = rl.model.new { vocab = 264, dim = 32, layers = 1, heads = 2, ffn = 64, ctx = 48, seed = 5 },
    tokenizer = rl.tokenizer.bytes(), env = env, dir = dir, name = name, seed = 21, steps = 4, tasks_per_step = 3,
    group_size = 4, max_turn_tokens = 2, lr = 3e-3, minibatch = 6, sft = { examples = 160, epochs = 3, batch_size = 16, lr = 1e-2 },
    eval = { every = 2, tasks = 4, k = 2 }, progress = false, synth = loop }
  for k, v in pairs(extra or {}) do o[k] = v end
  return rl.train(o), o.model, loop, cur
end
]==]

  it("runs a synthesis loop in the training loop: proposals by the policy learn, tasks are admitted and drawn", function()
    local dir = tmpdir()
    local config = H.script(dir .. "/run.lua", SYNTH_RUN)
    local runner = assert(loadfile(config))(H.root)
    local before -- the proposer's first proposals change the weights: its update ran
    local r, m, loop, cur = runner(dir, "full", { on_step = function(step, mt)
      if step == 1 then before = mt end
    end })
    assert.is_number(before["synth/proposed"])
    assert.are.equal(6, before["synth/proposed"])
    local total, admitted, learned = 0, 0, 0
    for _, mt in ipairs(r.history) do
      if mt.step > 0 then
        total = total + mt["synth/proposed"]
        admitted = admitted + mt["synth/admitted"]
        if mt["synth/learn/updates"] then learned = learned + 1 end
        assert.are.equal(mt["synth/proposed"], mt["synth/invalid"] + mt["synth/duplicate"] + mt["synth/too_easy"]
          + mt["synth/too_hard"] + mt["synth/admitted"] + (mt["synth/refused"] or 0))
        assert.is_number(mt["time/synth"])
      end
    end
    assert.are.equal(24, total)
    assert.is_true(#loop:archive() == 24)
    -- the admitted tasks are the curriculum's: the training batches drew them
    local arc = loop:archive()
    local keys = {}
    for _, rec in ipairs(arc) do if rec.key then keys[#keys + 1] = rec.key end end
    assert.are.equal(admitted, #keys)
    local state = rl.json.decode(assert(io.open(dir .. "/full/state.json")):read("a"))
    assert.are.equal(24, #state.synth.records)
    assert.are.equal("self", state.options.synth.propose.kind)
    assert.is_true(learned > 0, "the proposer's episodes trained at least once")
    assert.is_table(m:parameters())
    -- options: a loop whose pool is another curriculum, a grid curriculum, a loop without a pool
    local o = { model = m, tokenizer = tok, env = letter_env, dir = dir, name = "bad", steps = 1, eval = false, progress = false }
    local function with(extra)
      local t = {}
      for k, v in pairs(o) do t[k] = v end
      for k, v in pairs(extra) do t[k] = v end
      return t
    end
    local other = rl.curriculum.new { source = rl.curriculum.pool { tasks = { { i = 1 } } } }
    assert.matches("synth: the loop admits tasks into another curriculum", H.error_of(rl.train, with { synth = loop, curriculum = other }))
    local lone = rl.synth.loop { propose = loop.proposer }
    assert.matches("synth: the loop needs a pool to admit into", H.error_of(rl.train, with { synth = lone }))
    assert.matches("synth: an rl.synth.loop", H.error_of(rl.train, with { synth = {} }))
    assert.matches("unknown option 'synht' %(did you mean 'synth'%?%)", H.error_of(rl.train, with { synht = loop }))
    assert.is_table(cur:stats())
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)

  it("continues bit-exactly in another process with a synthesis loop active (its archive, pool and the weights)", function()
    local dir = tmpdir()
    local config = H.script(dir .. "/run.lua", SYNTH_RUN)
    local runner = assert(loadfile(config))(H.root)
    local _, m_full = runner(dir, "full")
    runner(dir, "cut", { stop_after = 2 })
    H.resume_cut(config, dir)
    local full = rl.json.decode(assert(io.open(dir .. "/full/state.json")):read("a"))
    local cut = rl.json.decode(assert(io.open(dir .. "/cut/state.json")):read("a"))
    assert.are.equal(4, cut.step)
    assert.are.equal(rl.json.encode(full.synth), rl.json.encode(cut.synth))
    assert.are.equal(rl.json.encode(full.tasks), rl.json.encode(cut.tasks))
    local m_res = rl.model.new { vocab = 264, dim = 32, layers = 1, heads = 2, ffn = 64, ctx = 48, seed = 5 }
    assert.are.equal(4, m_res:load_checkpoint(dir .. "/cut/" .. cut.checkpoint))
    local a, b = m_full:parameters(), m_res:parameters()
    for name, w in pairs(a) do assert.are.equal(0, w:max_abs_diff(b[name]), name) end
    local lf, lr = read_lines(dir .. "/full/metrics.jsonl"), read_lines(dir .. "/cut/metrics.jsonl")
    assert.are.equal(#lf, #lr)
    local synth_keys = 0
    for i, rec in ipairs(lf) do
      for k, v in pairs(rec) do
        if not k:match("^time/") and k ~= "tokens_per_s" then
          assert.are.equal(v, lr[i][k], "step " .. rec.step .. " " .. k)
          if k:match("^synth/") then synth_keys = synth_keys + 1 end
        end
      end
    end
    assert.is_true(synth_keys > 20)
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)

  -- The synthesis run (whose loop admits into a learnability curriculum) with a reward graph as
  -- well: the environment's return, a judge over a deterministic mock client whose cache lives in
  -- the run folder, a term that skips some episodes, a token budget.
  local ALL_RUN = [==[
local rl = require "moonrl"
local R = rl.reward
local synth_run = ...
local judge = {}
function judge:chat(messages)
  local text, n = messages[#messages].content, 0
  for _ in text:gmatch("[a-m]") do n = n + 1 end
  return n % 2 == 0 and "yes" or "no", { prompt_tokens = #text, completion_tokens = 1 }
end
return function(dir, name, extra)
  local o = { steps = 6, reward = R.graph { seed = 7, terms = {
    R.env(),
    R.judge { name = "judge", client = judge, model = "mock", prompt = "{task}: {answer}", weight = 0.25 },
    R.fn("skipper", function(ep) if ep.seed % 3 == 0 then return R.SKIP end return 0.05 * ep.length end),
    R.budget { tokens = 0.01 },
  } } }
  for k, v in pairs(extra or {}) do o[k] = v end
  return synth_run(dir, name, o)
end
]==]

  it("continues bit-exactly in another process with a reward graph, a curriculum and a synthesis loop all active", function()
    local dir = tmpdir()
    local synth_config = H.script(dir .. "/synth_run.lua", SYNTH_RUN)
    local config = H.script(dir .. "/run.lua", ALL_RUN)
    local runner = assert(loadfile(config))(assert(loadfile(synth_config))(H.root))
    local r_full, m_full = runner(dir, "full")
    runner(dir, "cut", { stop_after = 3 })
    local out, _, ok = H.run_lua([[
      local runner = loadfile(arg[1])(loadfile(arg[2])(arg[3]))
      runner(arg[4], "cut", { resume = true })
    ]], config, synth_config, H.root, dir)
    assert.is_true(ok, out)
    local full = rl.json.decode(assert(io.open(dir .. "/full/state.json")):read("a"))
    local cut = rl.json.decode(assert(io.open(dir .. "/cut/state.json")):read("a"))
    assert.are.equal(6, cut.step)
    for _, part in ipairs { "synth", "tasks", "reward" } do
      assert.is_not_nil(full[part], part)
      assert.are.equal(rl.json.encode(full[part]), rl.json.encode(cut[part]), part)
    end
    local m_res = rl.model.new { vocab = 264, dim = 32, layers = 1, heads = 2, ffn = 64, ctx = 48, seed = 5 }
    assert.are.equal(6, m_res:load_checkpoint(dir .. "/cut/" .. cut.checkpoint))
    local a, b = m_full:parameters(), m_res:parameters()
    for name, w in pairs(a) do assert.are.equal(0, w:max_abs_diff(b[name]), name) end
    -- metrics.jsonl line for line, but for timings and the judge's calls and cache hits (the
    -- resumed process reads the cache the first one wrote)
    local lf, lr = read_lines(dir .. "/full/metrics.jsonl"), read_lines(dir .. "/cut/metrics.jsonl")
    assert.are.equal(7, #lf)
    assert.are.equal(#lf, #lr)
    local seen = { synth = 0, reward = 0, curriculum = 0 }
    for i, rec in ipairs(lf) do
      for k, v in pairs(rec) do
        if not k:match("^time/") and k ~= "tokens_per_s" and not k:match("^reward/judge/calls$")
            and not k:match("^reward/judge/hits$") and not k:match("^reward/judge/tokens$") then
          assert.are.equal(v, lr[i][k], "step " .. rec.step .. " " .. k)
          local head = k:match("^(%a+)/")
          if seen[head] then seen[head] = seen[head] + 1 end
        end
      end
    end
    for part, n in pairs(seen) do assert.is_true(n > 10, part .. " metrics: " .. n) end
    -- all three were at work: tasks admitted, the judge asked, some episodes skipped
    local admitted, skipped = 0, 0
    for _, mt in ipairs(r_full.history) do
      admitted = admitted + (mt["synth/admitted"] or 0)
      skipped = skipped + (mt["reward/unscorable"] or 0)
    end
    assert.is_true(admitted > 0, "no task was admitted")
    assert.is_true(skipped > 0, "no episode was skipped")
    assert.is_true(lf[2]["reward/judge/calls"] > 0)
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)
end)
