-- report_spec.lua - report.html (moonrl.report), `moonrl report` and `moonrl runs` (moonrl.runs):
-- the metric groups, the episode cap, escaping and invalid UTF-8, broken lines and missing
-- folders, the trainer's rewrites during a run, and the commands on good and broken run folders.
-- (The page in a browser: tests/report/report_browser.test.mjs.)
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"
local report = require "moonrl.report"
local runs = require "moonrl.runs"

local json = rl.json
local q = H.shell_quote

local function write(path, text)
  local f = assert(io.open(path, "wb"))
  assert(f:write(text))
  assert(f:close())
end

local read = H.read_file

-- A run folder written by hand: metrics rows (tables), episodes (tables), options.
local function fake_run(dir, rows, eps, options)
  assert(rl.fs.mkdir(dir))
  local lines = {}
  for i, r in ipairs(rows) do lines[i] = json.encode(r) end
  write(dir .. "/metrics.jsonl", table.concat(lines, "\n") .. "\n")
  lines = {}
  for i, e in ipairs(eps or {}) do lines[i] = json.encode(e) end
  if eps then write(dir .. "/episodes.jsonl", table.concat(lines, "\n") .. "\n") end
  if options then
    write(dir .. "/state.json", json.encode { step = 1, checkpoint = "checkpoint-000001.bin",
      history = json.array {}, options = options })
  end
end

local function history(n)
  local rows = { { step = 0, ["eval/greedy_success"] = 0.25 } }
  for s = 1, n do
    rows[#rows + 1] = { step = s, ["reward/mean"] = s / n, success = s / (2 * n), ["loss/kl"] = 0.01,
      ["time/step"] = 0.5 }
  end
  rows[#rows + 1] = { step = n, ["eval/greedy_success"] = 0.75 }
  return rows
end

local function episode(step, action, extra)
  local e = { step = step, task = { lo = step }, success = step % 2 == 0, reward = step % 2,
    ["end"] = "done", turns = 1, record = { { action = action or "guess c", observation = "later",
      reward = step % 2, done = true } } }
  for k, v in pairs(extra or {}) do e[k] = v end
  return e
end

-- Trains a policy on a one-turn task (reward 1 for a lowercase letter) for `steps` steps.
local letter_env = H.letter_env()

local function train(dir, extra)
  local o = { model = rl.model.new { vocab = 264, dim = 32, layers = 1, heads = 2, ffn = 64, ctx = 32,
    seed = 3 }, tokenizer = rl.tokenizer.bytes(), env = letter_env, dir = dir, name = "letter",
    seed = 4, steps = 5, tasks_per_step = 2, group_size = 4, max_turn_tokens = 1, lr = 1e-2,
    minibatch = 8, eval = false, progress = false, overwrite = true }
  for k, v in pairs(extra or {}) do o[k] = v end
  return rl.train(o)
end

describe("moonrl.report", function()
  local dir
  before_each(function() dir = H.tmpdir() end)
  after_each(function() H.sh("rm -rf " .. q(dir)) end)

  it("puts every metric in exactly one group, reward terms and diagnostics apart", function()
    local keys = { "reward/mean", "reward/std", "reward/env", "reward/fmt/mean", "reward/fmt/alarm",
      "success", "eval/greedy_success", "eval/tasks", "loss/pg_loss", "loss/kl", "loss/entropy",
      "loss/grad_norm", "grad/spike", "loss/clipfrac", "time/step", "turns_mean", "end/done",
      "curriculum/level", "synth/accepted", "gate/cut_rate", "oddity", "step" }
    local groups = report.groups(keys)
    local where, seen = {}, 0
    for _, g in ipairs(groups) do
      for _, k in ipairs(g.keys) do
        assert.is_nil(where[k], k .. " in two groups")
        where[k] = g.id
        seen = seen + 1
      end
    end
    assert.equal(#keys - 1, seen) -- all but step
    assert.is_nil(where.step)
    assert.equal("rewards", where["reward/mean"])
    assert.equal(where["reward/env"], where["reward/fmt/mean"]) -- the terms' means together
    assert.equal("reward/fmt", where["reward/fmt/alarm"])
    assert.equal(where.success, where["eval/greedy_success"])
    assert.are_not.equal(where["eval/tasks"], where["eval/greedy_success"]) -- a count apart
    assert.equal("kl", where["loss/kl"])
    assert.equal("entropy", where["loss/entropy"])
    assert.equal(where["grad/spike"], where["loss/grad_norm"])
    assert.equal("clip", where["loss/clipfrac"])
    assert.equal("time", where["time/step"])
    assert.equal("curriculum", where["curriculum/level"])
    assert.equal("synth", where["synth/accepted"])
    assert.equal("diag/gate", where["gate/cut_rate"])
    assert.equal("rewards", groups[1].id)
  end)

  it("writes one page with a plot per group, the options and the episodes", function()
    local run = dir .. "/r"
    fake_run(run, history(8), { episode(1), episode(2), episode(8) }, { lr = 0.002, advantage = "grpo" })
    local path = assert(report.write(run))
    assert.equal(run .. "/report.html", path)
    local page = read(path)
    assert.truthy(page:find("<!DOCTYPE html>", 1, true))
    local n = select(2, page:gsub('<div class="plot" data%-group="', ""))
    assert.equal(#report.groups { "reward/mean", "success", "eval/greedy_success", "loss/kl", "time/step" }, n)
    assert.truthy(page:find("advantage</td><td><code>grpo", 1, true))
    assert.truthy(page:find("25.0%% &rarr; 75.0%%")) -- held-out before and after
    assert.is_nil(page:find("https?://"), "no network reference")
    assert.is_nil(page:find("<script src", 1, true))
    local data = json.decode(page:match('<script type="application/json" id="episode%-data">(.-)</script>'))
    assert.equal(3, #data)
    assert.equal(page, (report.html(assert(report.read(run))))) -- the same files, the same page
  end)

  it("escapes text, shows invalid UTF-8 as U+FFFD and keeps </script> inside the data", function()
    local run = dir .. "/r"
    fake_run(run, { { step = 1, ["reward/<b>"] = 1 } },
      { episode(1, "</script><b>x\xff\xfe y"), episode(2, "plain") }, { name = "a<b>\xc3" })
    local page = read(assert(report.write(run)))
    assert.truthy(utf8.len(page), "the page is UTF-8")
    local data_text = page:match('id="episode%-data">(.-)</script>')
    assert.is_nil(data_text:find("</", 1, true)) -- the data cannot close its script element
    local markup = page:gsub('id="episode%-data">.-</script>', "")
    assert.is_nil(markup:find("<b>", 1, true)) -- text outside the data is escaped
    assert.truthy(markup:find("reward/&lt;b&gt;", 1, true))
    assert.truthy(markup:find("a&lt;b&gt;\u{FFFD}", 1, true))
    local data = json.decode(data_text)
    assert.equal("</script><b>x\u{FFFD}\u{FFFD} y", data[1].record[1].action)
    assert.equal("a\u{FFFD}\u{FFFD}b", report.utf8_clean("a\xff\xfeb"))
    assert.equal("ok \u{e9}", report.utf8_clean("ok \u{e9}"))
  end)

  it("caps the embedded episodes to evenly spaced steps, the first and the last, and says so", function()
    local run, eps = dir .. "/r", {}
    for s = 1, 100 do eps[#eps + 1] = episode(s); eps[#eps + 1] = episode(s) end
    fake_run(run, history(100), eps)
    local r = assert(report.read(run, { episode_steps = 10 }))
    assert.equal(20, #r.episodes)
    assert.equal(1, r.episodes[1].step)
    assert.equal(100, r.episodes[20].step)
    assert.equal(200, r.episodes_total)
    local page = report.html(r)
    assert.truthy(page:find("200 episodes of 100 steps", 1, true))
    assert.truthy(page:find("at most 10 steps", 1, true))
    local long = assert(report.read(run, { text_limit = 16 }))
    assert.equal(2 * report.EPISODE_STEPS, #long.episodes)
    fake_run(run, history(3), { episode(1, string.rep("x", 100)) })
    local cut = assert(report.read(run, { text_limit = 16 }))
    assert.equal(string.rep("x", 16) .. " ... (84 more bytes)", cut.episodes[1].record[1].action)
  end)

  it("skips broken lines and names them; a missing folder or no run files is an error", function()
    local run = dir .. "/r"
    fake_run(run, history(3), { episode(1) })
    write(run .. "/metrics.jsonl", read(run .. "/metrics.jsonl") .. '{"step": 9, "reward/me\n[1,2]\n')
    write(run .. "/episodes.jsonl", "not json\n" .. read(run .. "/episodes.jsonl"))
    local r = assert(report.read(run))
    assert.equal(#history(3), #r.history)
    local problems = table.concat(r.problems, "\n")
    assert.truthy(problems:find("metrics.jsonl line 6: not JSON", 1, true), problems)
    assert.truthy(problems:find("metrics.jsonl row", 1, true), problems) -- [1,2] has no step
    assert.truthy(problems:find("episodes.jsonl line 1: not JSON", 1, true), problems)
    assert.equal(1, #r.episodes)
    assert.truthy(report.write(run))
    local none, err = report.read(dir .. "/missing")
    assert.is_nil(none)
    assert.equal(dir .. "/missing: no such folder", err)
    assert(rl.fs.mkdir(dir .. "/empty"))
    none, err = report.write(dir .. "/empty")
    assert.is_nil(none)
    assert.truthy(err:find("not a run folder", 1, true))
    assert.is_nil(read(dir .. "/empty/report.html"))
  end)

  it("raises for misuse: a dir that is not a string, unknown or wrong options", function()
    H.assert_error(function() report.read(42) end, "report.read: dir: a string expected, got number")
    H.assert_error(function() report.write(dir, { episode_step = 3 }) end,
      "unknown field 'episode_step' (did you mean 'episode_steps'?)")
    H.assert_error(function() report.read(dir, { episode_steps = 0 }) end, "episode_steps: a positive integer")
    H.assert_error(function() report.html({}) end, "report.html: run:")
  end)

  it("is rewritten by the trainer at step 0, every checkpoint step and the last; not with plot = false", function()
    local seen = {}
    local r = train(dir, { checkpoint_every = 2, on_step = function(step)
      local page = read(dir .. "/letter/report.html")
      seen[step] = page and tonumber(page:match("written at step (%d+)"))
    end })
    assert.same({ 0, 2, 2, 4, 5 }, { seen[1], seen[2], seen[3], seen[4], seen[5] })
    local page = read(r.dir .. "/report.html")
    local data = json.decode(page:match('id="episode%-data">(.-)</script>'))
    assert.equal(5 * 2, #data) -- log_episodes = 2 a step
    assert.truthy(page:find("lr</td><td><code>0.01", 1, true))
    H.sh("rm -rf " .. q(dir .. "/letter"))
    train(dir, { plot = false })
    assert.is_nil(read(dir .. "/letter/report.html"))
    assert.truthy(read(dir .. "/letter/metrics.jsonl"))
  end)
end)

describe("moonrl report and moonrl runs", function()
  local dir
  before_each(function() dir = H.tmpdir() end)
  after_each(function() H.sh("rm -rf " .. q(dir)) end)

  it("moonrl report rebuilds the page of a run written without one", function()
    train(dir, { plot = false }) -- as before report.html existed
    local run = dir .. "/letter"
    assert.is_nil(read(run .. "/report.html"))
    local out, code = H.run(q(H.moonrl) .. " report " .. q(run))
    assert.equal(0, code, out)
    assert.equal(run .. "/report.html\n", out)
    assert.truthy(read(run .. "/report.html"):find("written at step 5", 1, true))
    out, code = H.run(q(H.moonrl) .. " report " .. q(dir .. "/nothing") .. " " .. q(run))
    assert.equal(1, code)
    assert.truthy(out:find(dir .. "/nothing: no such folder", 1, true), out)
    assert.truthy(out:find(run .. "/report.html", 1, true), out) -- the others go on
    out, code = H.run(q(H.moonrl) .. " report")
    assert.equal(1, code)
    assert.truthy(out:find("usage: moonrl report", 1, true), out)
  end)

  it("moonrl runs lists the runs, reports a broken one and goes on", function()
    fake_run(dir .. "/alpha", history(12), { episode(1) }, { lr = 0.001 })
    fake_run(dir .. "/beta", history(4), nil, { lr = 0.002 })
    assert(rl.fs.mkdir(dir .. "/broken"))
    write(dir .. "/broken/metrics.jsonl", "{\"step\": 1, \"rew\n")
    assert(rl.fs.mkdir(dir .. "/not_a_run"))
    write(dir .. "/notes.txt", "hello")
    local out, code = H.run(q(H.moonrl) .. " runs " .. q(dir))
    assert.equal(0, code, out)
    local lines = {}
    for line in out:gmatch("[^\n]+") do lines[#lines + 1] = line end
    assert.truthy(lines[1]:find("run%s+steps%s+held%-out before%s+after%s+time%s+reward"), lines[1])
    assert.truthy(lines[2]:find("^alpha%s+12%s+25.0%%%s+75.0%%%s+6 s%s+1.000"), lines[2])
    assert.truthy(lines[3]:find("^beta%s+4%s+25.0%%%s+75.0%%%s+2 s%s+1.000"), lines[3])
    assert.truthy(lines[4]:find("^broken%s+%-.*broken$"), lines[4])
    assert.truthy(out:find("broken: metrics.jsonl line 1: not JSON", 1, true), out)
    assert.is_nil(out:find("not_a_run", 1, true))
    out, code = H.run(q(H.moonrl) .. " runs --compare " .. q(dir .. "/alpha") .. " " .. q(dir .. "/beta"))
    assert.equal(0, code, out)
    assert.truthy(out:find("steps%s+12%s+4"), out)
    assert.truthy(out:find("options that differ: lr (0.001, now 0.002)", 1, true), out)
    out, code = H.run(q(H.moonrl) .. " runs --compare " .. q(dir .. "/alpha") .. " " .. q(dir .. "/broken"))
    assert.equal(1, code)
    assert.truthy(out:find("no metrics", 1, true), out)
    out, code = H.run(q(H.moonrl) .. " runs " .. q(dir .. "/missing"))
    assert.equal(1, code)
    assert.truthy(out:find("moonrl runs: " .. dir .. "/missing", 1, true), out)
    out, code = H.run(q(H.moonrl) .. " runs --nope")
    assert.equal(1, code)
    assert.truthy(out:find("unknown arguments", 1, true), out)
    assert.equal("no runs\n", runs.table {})
  end)
end)
