-- moonrl.synth.verify: the verifiers a synthesised task must pass, each
-- verifier:verify(task, ctx) -> true [, info] or false, reason, message:
--   rl.synth.exec{sandbox =, lang = "lua" | "sh", timeout =, budget =, mem_mb =, runs = 2}
--     runs the task's code: its solution gives an answer that passes its check, the stated answer
--     passes, every failure case fails, and all of it comes out the same in each run;
--   rl.synth.oracle(fn)      fn(task) -> the environment's own answer, which must match;
--   rl.synth.vote{k = 8, agree = .6}   the current policy's majority answer over k rollouts
--     becomes the label (info.label = "vote");
--   rl.synth.judge{client =, ...}      a language model says yes (info.label = "judge").
-- A plain function(task, ctx) -> ok, reason is a verifier too.
--
-- Reasons: "wrong_answer", "nondeterministic", "solution_fails_check", "failure_passes",
-- "sandbox_escape", "over_time", "over_memory", "check_error" (the check does not compile or
-- has no function), "solution_error" (the solution raised or returned no answer),
-- "sandbox_error" (the sandbox could not run the code: not the task's fault), "oracle_failed",
-- "no_consensus", "judge_rejects", "judge_error".
--
-- Task code, lang = "lua": `solution` is a Lua chunk that returns the answer; `check` is a Lua
-- chunk called with the candidate answer (a string) as its argument (`local a = ...`), which
-- returns true when it is right. Both run in restricted Lua states (rl.sandbox.lua: no io, os,
-- require, debug; an instruction budget; a memory cap), in this process with `budget`
-- instructions, or with `timeout` (seconds) in the process sandbox under a wall clock. Each run
-- seeds math.random differently and shifts the state's allocations, so code that depends on
-- randomness or addresses differs between runs. lang = "sh": `solution` is a shell script that
-- prints the answer; `check` a script given the candidate as $1 and on stdin, exit status 0 =
-- right; both run in the sandbox pool (rl.sandbox.pool, default the engine's default pool).
local core = require "moonrl.core"
local argcheck = require "moonrl.argcheck"
local solver = require "moonrl.synth.solver"
local seedlib = require "moonrl.train.seed"

local sandbox, json, mix = core.sandbox, core.json, seedlib.mix
local M = {}

local Verifier = { __name = "moonrl.synth.verifier" }
Verifier.__index = Verifier
M.Verifier = Verifier

function M.is_verifier(v)
  return getmetatable(v) == Verifier or type(v) == "function"
end

-- ---------------------------------------------------------------- answers

-- The text of an answer, for comparisons: trimmed; a number by its value ("12.0" = "12").
function M.normal_answer(v)
  if v == nil then return nil end
  local s = type(v) == "string" and v or tostring(v)
  s = s:gsub("^%s+", ""):gsub("%s+$", "")
  local n = tonumber(s)
  if n and n == n and n ~= math.huge and n ~= -math.huge then
    if n == math.floor(n) and math.abs(n) < 2 ^ 53 then return string.format("%d", math.tointeger(n)) end
    return string.format("%.12g", n)
  end
  return s
end

-- ---------------------------------------------------------------- exec

local function is_pool(v)
  local mt = getmetatable(v)
  return type(v) == "userdata" and type(mt) == "table" and mt.__name == "moonrl.sandbox.pool"
end

-- One run's prefix: a seeded math.random and a shifted allocation pattern (one line, so that
-- the task's line numbers stay its own).
local function lua_prefix(run)
  return string.format("math.randomseed(%d) do local _p = {} for _i = 1, %d do _p[_i] = {} end end ",
    mix(0x5EED, run) % 2147483647, 3 + 7 * run)
end

-- A restricted-Lua call: {status =, value =, error =} with status one of the outcome names
-- below ("ok", "error", "escape", "over_time", "over_memory", "sandbox_error").
local function outcome_of_lua(r)
  local st = r.status
  if st == "ok" then return { status = "ok", value = r.value } end
  if st == "budget" or st == "timeout" then return { status = "over_time", error = r.error } end
  if st == "oom" then return { status = "over_memory", error = r.error } end
  if st == "setup_error" then return { status = "sandbox_error", error = r.error } end
  local err = tostring(r.error or "")
  if err:find("is not available in the sandbox", 1, true) then return { status = "escape", error = err } end
  if err:find("check does not compile", 1, true) then return { status = "compile", error = err } end
  return { status = "error", error = err }
end

local function run_lua(self, code)
  local call = { code = code, budget = self.budget, mem_mb = self.mem_mb }
  if self.timeout then
    call.wall_ms = math.max(1, math.floor(self.timeout * 1000 + 0.5))
    call.pool = self.sandbox
  end
  local ok, r = pcall(sandbox.lua, call)
  if not ok then return { status = "sandbox_error", error = tostring(r) } end
  return outcome_of_lua(r)
end

local function lua_solution(self, task, run)
  return run_lua(self, lua_prefix(run) .. task.solution)
end

local function lua_check(self, task, candidate, run)
  local code = lua_prefix(run) .. string.format("local __f, __e = load(%q, \"=check\", \"t\") "
    .. "if not __f then error(\"check does not compile: \" .. tostring(__e), 0) end "
    .. "return __f(%q) == true", task.check, candidate)
  return run_lua(self, code)
end

local function outcome_of_sh(r)
  local st = r.status
  if st == "exited" then return { status = "ok", exit_code = r.exit_code, stdout = r.stdout } end
  if st == "timeout" or st == "cpu_limit" then return { status = "over_time", error = r.message } end
  if st == "oom" then return { status = "over_memory", error = r.message } end
  if st == "seccomp" or st == "pids_limit" then return { status = "escape", error = r.message or st } end
  if st == "setup_error" then return { status = "sandbox_error", error = r.message } end
  return { status = "error", error = (r.message or st) }
end

local function run_sh(self, call)
  local pool = self.sandbox
  if not pool then
    local ok, p = pcall(sandbox.default_pool)
    if not ok or not p then return { status = "sandbox_error", error = tostring(p) } end
    pool = p
  end
  call.wall_ms = math.max(1, math.floor((self.timeout or 5) * 1000 + 0.5))
  call.cpu_ms = call.wall_ms
  if self.mem_mb then call.mem_mb = self.mem_mb end
  local ok, r = pcall(pool.run, pool, call)
  if not ok then return { status = "sandbox_error", error = tostring(r) } end
  return outcome_of_sh(r)
end

local function sh_solution(self, task)
  local o = run_sh(self, { argv = { "sh", "-c", task.solution, "solution" } })
  if o.status ~= "ok" then return o end
  if o.exit_code ~= 0 then return { status = "error", error = "exit code " .. tostring(o.exit_code) } end
  return { status = "ok", value = (o.stdout:gsub("%s+$", "")) }
end

local function sh_check(self, task, candidate)
  local o = run_sh(self, { argv = { "sh", "-c", task.check, "check", candidate }, stdin = candidate .. "\n" })
  if o.status ~= "ok" then return o end
  return { status = "ok", value = o.exit_code == 0 }
end

-- What differs between two runs' outcomes (status and value).
local function same(a, b) return a.status == b.status and a.value == b.value end

local PRECEDENCE = { "escape", "over_time", "over_memory", "sandbox_error" }
local REASON_OF = { escape = "sandbox_escape", over_time = "over_time", over_memory = "over_memory",
  sandbox_error = "sandbox_error" }

-- exec:verify(task) -> true, info {runs =, answer =} or false, reason, message.
local function exec_verify(self, task)
  local runs = {}
  for run = 1, self.runs do
    local r = {}
    if self.lang == "lua" then
      r.solution = lua_solution(self, task, run)
    else
      r.solution = sh_solution(self, task)
    end
    local sol = r.solution.status == "ok" and r.solution.value ~= nil and tostring(r.solution.value) or nil
    local function check(c)
      if self.lang == "lua" then return lua_check(self, task, c, run) end
      return sh_check(self, task, c)
    end
    r.check_solution = sol and check(sol) or nil
    r.check_answer = check(task.answer)
    r.failures = {}
    for i, f in ipairs(task.failures) do r.failures[i] = check(f) end
    runs[run] = r
  end
  local function each(fn)
    for _, r in ipairs(runs) do
      fn("solution", r.solution)
      if r.check_solution then fn("check(solution)", r.check_solution) end
      fn("check(answer)", r.check_answer)
      for i, f in ipairs(r.failures) do fn("check(failures[" .. i .. "])", f) end
    end
  end
  for _, status in ipairs(PRECEDENCE) do
    local where, err
    each(function(name, o) if not where and o.status == status then where, err = name, o.error end end)
    if where then return false, REASON_OF[status], string.format("%s: %s", where, tostring(err)) end
  end
  local compile
  each(function(_, o) if not compile and o.status == "compile" then compile = o.error end end)
  if compile then return false, "check_error", compile end
  local first = runs[1]
  if first.solution.status ~= "ok" or first.solution.value == nil then
    return false, "solution_error", "solution: " .. tostring(first.solution.error or "it returned no answer")
  end
  for run = 2, #runs do
    local r, diff = runs[run], nil
    if not same(first.solution, r.solution) then diff = "solution" end
    if not diff and not (r.check_solution and same(first.check_solution, r.check_solution)) then diff = "check(solution)" end
    if not diff and not same(first.check_answer, r.check_answer) then diff = "check(answer)" end
    for i, f in ipairs(r.failures) do
      if not diff and not same(first.failures[i], f) then diff = "check(failures[" .. i .. "])" end
    end
    if diff then
      return false, "nondeterministic", string.format("%s differs between run 1 and run %d", diff, run)
    end
  end
  local cs = first.check_solution
  if cs.status ~= "ok" or cs.value ~= true then
    return false, "solution_fails_check", string.format("the solution's answer %q %s", tostring(first.solution.value),
      cs.status == "ok" and "fails the check" or "makes the check raise: " .. tostring(cs.error))
  end
  for i, f in ipairs(first.failures) do
    if f.status == "ok" and f.value == true then
      return false, "failure_passes", string.format("failures[%d] (%q) passes the check", i, task.failures[i])
    end
  end
  local ca = first.check_answer
  if ca.status ~= "ok" or ca.value ~= true then
    return false, "wrong_answer", string.format("the stated answer %q fails the check (the solution gives %q)",
      task.answer, tostring(first.solution.value))
  end
  return true, { runs = self.runs, answer = tostring(first.solution.value) }
end

-- rl.synth.exec{...}: see the top of this file.
function M.exec(opts)
  local o = argcheck.fields("rl.synth.exec", opts or {}, {
    { "sandbox", nil, function(v) if is_pool(v) then return nil end return "an rl.sandbox.pool" end },
    { "lang", "lua", argcheck.one_of { "lua", "sh" } },
    { "timeout", nil, argcheck.number(0, nil, true) },
    { "budget", 1000000, argcheck.integer(1) },
    { "mem_mb", 16, argcheck.integer(1) },
    { "runs", 2, argcheck.integer(1) },
  }, 2)
  local v = setmetatable({ name = "exec", sandbox = o.sandbox, lang = o.lang, timeout = o.timeout,
    budget = o.budget, mem_mb = o.mem_mb, runs = o.runs }, Verifier)
  v.verify = function(self, task)
    for _, f in ipairs { "check", "solution", "answer" } do
      if type(task[f]) ~= "string" then
        return false, "check_error", "exec needs task." .. f .. " (a string); put it in the contract"
      end
    end
    if type(task.failures) ~= "table" then
      return false, "check_error", "exec needs task.failures (a list); put it in the contract"
    end
    return exec_verify(self, task)
  end
  v.config = function(self)
    return { kind = "exec", lang = self.lang, timeout = self.timeout, budget = self.budget,
      mem_mb = self.mem_mb, runs = self.runs }
  end
  return v
end

-- rl.synth.check_answer(task, candidate [, opts]) -> true | false, or nil, message when the check
-- could not run: an environment's success test for a synthesised task (task.check on the
-- candidate in a restricted Lua state; opts: budget =, mem_mb =).
function M.check_answer(task, candidate, opts)
  if type(task) ~= "table" or type(task.check) ~= "string" then
    error("rl.synth.check_answer: task: a table with check (Lua code) expected, got " .. argcheck.describe(task), 2)
  end
  if type(candidate) ~= "string" then
    error("rl.synth.check_answer: candidate: a string expected, got " .. argcheck.describe(candidate), 2)
  end
  opts = opts or {}
  local code = string.format("local __f, __e = load(%q, \"=check\", \"t\") "
    .. "if not __f then error(\"check does not compile: \" .. tostring(__e), 0) end "
    .. "return __f(%q) == true", task.check, candidate)
  local r = sandbox.lua { code = code, budget = opts.budget or 1000000, mem_mb = opts.mem_mb or 16 }
  if r.status == "ok" then return r.value == true end
  if r.status == "error" and not tostring(r.error):find("not available in the sandbox", 1, true)
      and not tostring(r.error):find("check does not compile", 1, true) then
    return false -- the check raised on this candidate: not right
  end
  return nil, tostring(r.error or r.status)
end

-- ---------------------------------------------------------------- oracle

-- rl.synth.oracle(fn): fn(task) -> the answer (a string or a number), or nil when it cannot
-- solve the task ("oracle_failed"); an answer other than task.answer is "wrong_answer".
function M.oracle(fn)
  if type(fn) ~= "function" then
    error("rl.synth.oracle: fn: a function(task) -> answer expected, got " .. argcheck.describe(fn), 2)
  end
  local v = setmetatable({ name = "oracle" }, Verifier)
  v.verify = function(_, task)
    local ok, ans = pcall(fn, task)
    if not ok then return false, "oracle_failed", "the oracle raised: " .. tostring(ans) end
    if ans == nil then return false, "oracle_failed", "the oracle cannot solve the task" end
    local want, got = M.normal_answer(ans), M.normal_answer(task.answer)
    if want ~= got then
      return false, "wrong_answer", string.format("the oracle answers %q, the task says %q", want, tostring(got))
    end
    return true, { answer = want }
  end
  v.config = function() return { kind = "oracle" } end
  return v
end

-- ---------------------------------------------------------------- vote

-- rl.synth.vote{k = 8, agree = .6, answer = fn(outcome) -> string, temperature =}: k rollouts of
-- the task by the current policy; the most frequent answer (ties: the first seen) is the task's
-- answer when its share is at least agree, and the task is labelled "vote"; a stated answer
-- that disagrees with it is "wrong_answer", no majority "no_consensus".
function M.vote(opts)
  local o = argcheck.fields("rl.synth.vote", opts or {}, {
    { "k", 8, argcheck.integer(1) },
    { "agree", 0.6, argcheck.number(0, 1, true) },
    { "answer", nil, argcheck.kind("function", "a function(outcome) -> string") },
    { "temperature", nil, argcheck.number(0) },
  }, 2)
  local v = setmetatable({ name = "vote", k = o.k, agree = o.agree, answer_fn = o.answer,
    temperature = o.temperature }, Verifier)
  v.verify = function(self, task, ctx, seed)
    local outs = solver.rollouts(ctx, { task }, self.k, mix(seed or 0, 0x707E), "vote", self.temperature)[1]
    local count, order = {}, {}
    for _, out in ipairs(outs) do
      local a = self.answer_fn and self.answer_fn(out) or out.answer
      a = M.normal_answer(a)
      if a and a ~= "" then
        if not count[a] then count[a] = 0 order[#order + 1] = a end
        count[a] = count[a] + 1
      end
    end
    local best, n = nil, 0
    for _, a in ipairs(order) do if count[a] > n then best, n = a, count[a] end end
    local share = n / self.k
    if not best or share < self.agree then
      return false, "no_consensus", string.format("the largest share of one answer is %.2f (%d of %d), below %g",
        share, n, self.k, self.agree)
    end
    if task.answer ~= nil and task.answer ~= "" and M.normal_answer(task.answer) ~= best then
      return false, "wrong_answer", string.format("the vote says %q (%d of %d), the task says %q", best, n,
        self.k, tostring(task.answer))
    end
    task.answer, task.label = best, "vote"
    return true, { label = "vote", answer = best, share = share }
  end
  v.config = function(self) return { kind = "vote", k = self.k, agree = self.agree } end
  return v
end

-- ---------------------------------------------------------------- judge

local function render(template, task)
  return (template:gsub("{(%w+)}", function(name)
    if name == "task" then return json.encode(task) end
    local v = task[name]
    if v == nil then return "{" .. name .. "}" end
    if type(v) == "table" then return json.encode(v) end
    return tostring(v)
  end))
end

local function parse_yesno(text)
  local w = tostring(text):lower():match("%a+")
  if w == "yes" then return true end
  if w == "no" then return false end
  return nil
end

-- rl.synth.judge{client =, model =, prompt = string | fn(task), parse = "yesno" | fn(text) ->
-- bool, sampling = {}, retries = 1, timeout =}: a language model behind the client interface
-- (client:chat(messages, opts) -> text, info, as rl.reward.judge's) says whether the task is
-- sound. Yes: labelled "judge"; no: "judge_rejects"; a failed call or an unreadable reply:
-- "judge_error" (the task is not admitted on no evidence).
function M.judge(opts)
  local o = argcheck.fields("rl.synth.judge", opts or {}, {
    { "client", nil, function(v)
      if (type(v) == "table" or type(v) == "userdata") and pcall(function() return v.chat end)
        and type(v.chat) == "function" then return nil end
      return "a client with :chat(messages, opts)"
    end, required = true },
    { "model", nil, argcheck.kind("string", "a string") },
    { "prompt", "Is this task well-posed, and is its answer right? Reply yes or no.\nTask: {instruction}\n"
      .. "Answer: {answer}", argcheck.either(argcheck.kind("string", "a string"),
        argcheck.kind("function", "a function(task) -> string")) },
    { "parse", "yesno", argcheck.either(argcheck.literal("yesno", "\"yesno\""),
      argcheck.kind("function", "a function(text) -> boolean")) },
    { "sampling", {}, argcheck.kind("table", "a table of sampling fields") },
    { "retries", 1, argcheck.integer(0) },
    { "timeout", nil, argcheck.number(0, nil, true) },
  }, 2)
  local v = setmetatable({ name = "judge", client = o.client, model = o.model, prompt = o.prompt,
    parse = o.parse, sampling = o.sampling, retries = o.retries, timeout = o.timeout }, Verifier)
  v.verify = function(self, task)
    local text = type(self.prompt) == "function" and self.prompt(task) or render(self.prompt, task)
    local call_opts = { model = self.model, timeout = self.timeout }
    for k, x in pairs(self.sampling) do call_opts[k] = x end
    local reply, err
    for _ = 0, self.retries do
      local ok, a, b = pcall(self.client.chat, self.client, { { role = "user", content = text } }, call_opts)
      if ok and type(a) == "string" then reply = a break end
      err = ok and (b or "no reply") or a
    end
    if not reply then return false, "judge_error", "the judge's call failed: " .. tostring(err) end
    local verdict
    if self.parse == "yesno" then verdict = parse_yesno(reply) else
      local ok, r = pcall(self.parse, reply)
      verdict = ok and r or nil
    end
    if verdict == nil then return false, "judge_error", "the judge's reply is not a verdict: " .. reply:sub(1, 80) end
    if not verdict then return false, "judge_rejects", "the judge says no: " .. reply:sub(1, 80) end
    task.label = task.label or "judge"
    return true, { label = "judge" }
  end
  v.config = function(self) return { kind = "judge", model = self.model, retries = self.retries } end
  return v
end

return M
