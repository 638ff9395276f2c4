-- train_spec.lua - the trainer (`rl.train`): a policy learns a trivial task from reward alone
-- (and does not without updates), a resumed run equals an uninterrupted one bit for bit, the run
-- folder holds metrics, episodes, a plot and a checkpoint, and the options are checked.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"

local guess = dofile(H.root .. "/envs/guess_letter.lua")
local tok = rl.tokenizer.bytes()

local function tmpdir()
  local path = os.tmpname()
  os.remove(path)
  assert(rl.fs.mkdir(path))
  return path
end

local function read_lines(path)
  local out = {}
  for line in io.lines(path) do out[#out + 1] = assert(rl.json.decode(line)) end
  return out
end

-- One turn: the reward is 1 when the reply starts with a lowercase letter (about 10% of a
-- fresh byte model's first tokens).
local letter_env = {
  name = "letter",
  max_turns = 1,
  tasks = function(_, n)
    local t = {}
    for i = 1, n do t[i] = { i = i } end
    return t
  end,
  new = function()
    return {
      reset = function() return "say a letter" end,
      step = function(_, action)
        local ok = action:match("^%l") ~= nil
        return nil, ok and 1 or 0, true, { success = ok }
      end,
    }
  end,
}

local function learn(lr, dir)
  local m = rl.model.new { vocab = 264, dim = 32, layers = 1, heads = 2, ffn = 64, ctx = 32, seed = 3 }
  local r = rl.train {
    model = m, tokenizer = tok, env = letter_env, dir = dir, seed = 4, steps = 15,
    tasks_per_step = 4, group_size = 16, max_turn_tokens = 1, lr = lr, minibatch = 16,
    eval = false, progress = false, plot = false,
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

  it("continues bit-exactly after an interruption (resume = true)", function()
    local dir = tmpdir()
    local full, m_full = run(dir, "full")
    local _, m_cut = run(dir, "cut", { stop_after = 2 })
    local part = read_lines(dir .. "/cut/metrics.jsonl")
    assert.are.equal(3, #part) -- step 0 (after SFT) and steps 1, 2
    -- a fresh process would start from a new model: the weights must come from the checkpoint
    local resumed, m_res = run(dir, "cut", { resume = true })
    assert.are_not.equal(m_cut, m_res)
    local a, b = m_full:parameters(), m_res:parameters()
    local n = 0
    for name, w in pairs(a) do
      assert.are.equal(0, w:max_abs_diff(b[name]), name)
      n = n + 1
    end
    assert.is_true(n > 5)
    local lf, lr = read_lines(dir .. "/full/metrics.jsonl"), read_lines(dir .. "/cut/metrics.jsonl")
    assert.are.equal(#lf, #lr)
    for i, rec in ipairs(lf) do
      for k, v in pairs(rec) do
        if not k:match("^time/") and k ~= "tokens_per_s" then
          assert.are.equal(v, lr[i][k], "step " .. rec.step .. " " .. k)
        end
      end
    end
    assert.are.equal(full.after["eval/greedy_success"], resumed.after["eval/greedy_success"])
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

  it("names bad options", function()
    local function err(extra)
      local o = { model = model(), tokenizer = tok, env = guess, progress = false }
      for k, v in pairs(extra) do o[k] = v end
      local ok, msg = pcall(rl.train, o)
      assert.is_false(ok)
      return msg
    end
    assert.matches("advantage: unknown estimator", err { advantage = "magic" })
    assert.matches("steps: a positive integer", err { steps = 0 })
    assert.matches("name: letters", err { name = "../x" })
    assert.matches("tasks%(%) is missing", err { env = { name = "x", new = function() end } })
    local ok, msg = pcall(rl.train, { tokenizer = tok, env = guess })
    assert.is_false(ok)
    assert.matches("model", msg)
  end)
end)
