-- moonrl.reward.terms: the reward terms that need no judge (fn, metric, format, group, process,
-- budget, overlong, env), the options every term shares, and how a term's return becomes a
-- result {status =, value =, message =, turns =}.
--
-- A term is a table of its checked options plus kind (its constructor's name), dense (its
-- per-turn values land on the turns) and eval(term, batch, sel, ctx, out): it scores the
-- episodes whose numbers are listed in sel (those its `when` admits), setting out[i] to a result.
-- status is "ok" (value is a finite number), "na" (not applicable), "unscorable" (SKIP, a judge
-- that failed) or "error" (the term raised; message says why). Dense terms also set turns, one
-- value per turn (value is their sum).
local core = require "moonrl.core"
local check = require "moonrl.reward.check"
local batchlib = require "moonrl.batch"

local M = {}

local Term = { __name = "moonrl.reward.term" }
Term.__index = Term

-- ---------------------------------------------------------------- SKIP

local Skip = { __name = "moonrl.reward.skip" }
Skip.__index = Skip
Skip.__tostring = function(s) return "rl.reward.SKIP" .. (s.message and ": " .. s.message or "") end

-- rl.reward.SKIP: what a term returns for an episode it cannot score; rl.reward.skip(why) says
-- why.
M.SKIP = setmetatable({}, Skip)
function M.skip(why)
  if type(why) ~= "string" then error("rl.reward.skip: why: a string expected, got " .. check.describe(why), 2) end
  return setmetatable({ message = why }, Skip)
end
function M.is_skip(v) return getmetatable(v) == Skip end

-- The result of a user function's return (ok, v as pcall gives them).
function M.interpret(ok, v)
  if not ok then return { status = "error", message = tostring(v) } end
  if v == nil then return { status = "na" } end
  if getmetatable(v) == Skip then return { status = "unscorable", message = v.message or "skipped" } end
  if type(v) ~= "number" then return { status = "error", message = "returned " .. check.describe(v) } end
  if not check.finite(v) then return { status = "error", message = "returned " .. tostring(v) } end
  return { status = "ok", value = v }
end
local interpret = M.interpret

-- ---------------------------------------------------------------- the shared options

-- The options every term takes, with the constructor's own after them.
local COMMON = {
  { "name", check.name },
  { "weight", check.number(), default = 1 },
  { "gate", check.either(check.name, check.func) },
  { "when", check.func },
  { "clip", check.range },
}

-- A term of kind `kind` from opts, checked against COMMON plus extra (a fields list); default_name
-- is used when opts has no name (nil: the name is required). Raises at level (the caller's).
function M.new(kind, opts, extra, default_name, level)
  level = (level or 1) + 1
  local where = "rl.reward." .. kind
  local spec = {}
  for _, f in ipairs(COMMON) do spec[#spec + 1] = f end
  for _, f in ipairs(extra or {}) do spec[#spec + 1] = f end
  local t = check.fields(where, opts, spec, level)
  if t.name == nil then
    if not default_name then error(where .. ": name: a name of letters, digits, '_', '.', '-' expected (it is required)", level) end
    t.name = default_name
  end
  t.kind = kind
  return setmetatable(t, Term)
end

function M.is_term(v) return getmetatable(v) == Term end

-- A term keeps no state unless its kind does (judges: their counters).
function Term:state() return {} end
function Term:load() end

-- ---------------------------------------------------------------- helpers

-- The text of an episode's last turn ("" when it has none).
function M.final_action(ep)
  local rec = ep.record
  local last = rec and rec[#rec]
  return last and last.action or ""
end

-- Number of turns an episode has values for.
local function turn_count(ep) return math.max(ep.turns or 0, ep.record and #ep.record or 0) end
M.turn_count = turn_count

-- ---------------------------------------------------------------- fn and metric

local function eval_fn(term, batch, sel, ctx, out)
  for _, i in ipairs(sel) do
    out[i] = interpret(pcall(term.fn, batch.episodes[i], ctx:episode(i)))
  end
end

-- fn(name, f [, opts]) or fn{name =, fn =, ...}.
local function positional(kind, a, b, c, level)
  if type(a) == "string" then
    if type(b) ~= "function" then
      error(string.format("rl.reward.%s: fn: a function(ep, ctx) expected, got %s", kind, check.describe(b)), level + 1)
    end
    if c ~= nil and type(c) ~= "table" then
      error(string.format("rl.reward.%s: opts: a table expected, got %s", kind, check.describe(c)), level + 1)
    end
    local t = {}
    for k, v in pairs(c or {}) do t[k] = v end
    t.name, t.fn = a, b
    return t
  end
  return a
end

-- rl.reward.fn{name =, fn = function(ep, ctx) -> number | nil | SKIP, weight =, ...}, or
-- rl.reward.fn(name, f [, opts]).
function M.fn(a, b, c)
  local t = M.new("fn", positional("fn", a, b, c, 2), { { "fn", check.func, required = true } }, nil, 2)
  t.eval = eval_fn
  return t
end

-- rl.reward.metric: fn with weight 0 (logged, never in the total).
function M.metric(a, b, c)
  local opts = positional("metric", a, b, c, 2)
  if type(opts) == "table" and opts.weight ~= nil and opts.weight ~= 0 then
    error("rl.reward.metric: weight: a metric has weight 0 (use rl.reward.fn for a weighted term)", 2)
  end
  local t = M.new("metric", opts, { { "fn", check.func, required = true } }, nil, 2)
  t.weight = 0
  t.eval = eval_fn
  return t
end

-- ---------------------------------------------------------------- format

local lpeg = require "lpeg"

local function matches(pattern, text)
  if type(pattern) == "string" then return text:find(pattern) ~= nil end
  return lpeg.match(pattern, text) ~= nil
end

-- rl.reward.format{pattern = <Lua pattern or lpeg pattern>, where = "final" | "each_turn"}: 1 when
-- the last turn's text matches ("final"), or the share of turns that match ("each_turn").
function M.format(opts)
  local t = M.new("format", opts, {
    { "pattern", function(v)
      if type(v) == "string" or lpeg.type(v) == "pattern" then return nil end
      return "a Lua pattern (a string) or an lpeg pattern"
    end, required = true },
    { "where", check.enum { "final", "each_turn" }, default = "final" },
  }, "format", 2)
  if type(t.pattern) == "string" then
    local ok, err = pcall(string.find, "", t.pattern)
    if not ok then error("rl.reward.format: pattern: " .. tostring(err):gsub("^[^:]*:%d+: ", ""), 2) end
  end
  t.eval = function(term, batch, sel, _, out)
    for _, i in ipairs(sel) do
      local ep = batch.episodes[i]
      if term.where == "final" then
        out[i] = { status = "ok", value = matches(term.pattern, M.final_action(ep)) and 1 or 0 }
      else
        local n, hit = 0, 0
        for _, r in ipairs(ep.record or {}) do
          n = n + 1
          if matches(term.pattern, r.action or "") then hit = hit + 1 end
        end
        out[i] = n > 0 and { status = "ok", value = hit / n } or { status = "na" }
      end
    end
  end
  return t
end

-- ---------------------------------------------------------------- group

-- rl.reward.group{name =, fn = function(episodes, ctx) -> {value per episode}}: a term over a
-- whole group (the episodes of one task) at once: diversity, pass@k bonuses. Each value is a
-- number, nil or SKIP, as fn's; an error counts for the whole group.
function M.group(a, b, c)
  local t = M.new("group", positional("group", a, b, c, 2), { { "fn", check.func, required = true } }, nil, 2)
  t.eval = function(term, batch, sel, ctx, out)
    for _, g in ipairs(ctx:groups(sel)) do
      local eps = {}
      for k, i in ipairs(g.members) do eps[k] = batch.episodes[i] end
      local ok, values = pcall(term.fn, eps, ctx:group(g))
      if ok and type(values) ~= "table" then
        ok, values = false, "returned " .. check.describe(values) .. " (a list of one value per episode expected)"
      end
      for k, i in ipairs(g.members) do
        if ok then out[i] = interpret(true, values[k]) else out[i] = interpret(false, values) end
      end
    end
  end
  return t
end

-- ---------------------------------------------------------------- process

-- rl.reward.process{name =, turn = function(record, ep, ctx) -> number | nil | SKIP, reduce =
-- "dense" | "sum" | "min"}: one value per turn. "dense" lands each (times the weight) on its
-- turn (ep.rewards[t]: the token rewards GAE, GiGPO and BEACON read); "sum" and "min" reduce
-- them to one value. A turn that is SKIP or raises makes the episode's term unscorable (error);
-- turns that return nil count 0 (dense) or are left out; none at all: not applicable.
function M.process(opts)
  if type(opts) == "table" and opts.model ~= nil then
    error("rl.reward.process: model: no process reward model is built in; score turns with turn = "
      .. "function(record, ep, ctx) (a judge client, rl.reward.model_client, can do it)", 2)
  end
  local t = M.new("process", opts, {
    { "turn", check.func, required = true },
    { "reduce", check.enum { "dense", "sum", "min" }, default = "dense" },
  }, nil, 2)
  t.dense = t.reduce == "dense"
  t.eval = function(term, batch, sel, ctx, out)
    for _, i in ipairs(sel) do
      local ep = batch.episodes[i]
      local ectx = ctx:episode(i)
      local turns, any, res = {}, false, nil
      for k = 1, turn_count(ep) do
        ectx.turn = k
        local r = interpret(pcall(term.turn, ep.record and ep.record[k] or {}, ep, ectx))
        if r.status == "error" or r.status == "unscorable" then
          r.message = string.format("turn %d: %s", k, r.message)
          res = r
          break
        end
        if r.status == "ok" then any = true end
        turns[k] = r.value
      end
      if not res then
        if not any then
          res = { status = "na" }
        elseif term.reduce == "min" then
          local m
          for k = 1, turn_count(ep) do if turns[k] and (not m or turns[k] < m) then m = turns[k] end end
          res = { status = "ok", value = m }
        else
          local s, dense = 0, {}
          for k = 1, turn_count(ep) do
            dense[k] = turns[k] or 0
            s = s + dense[k]
          end
          res = { status = "ok", value = s, turns = term.dense and dense or nil }
        end
      end
      out[i] = res
    end
  end
  return t
end

-- ---------------------------------------------------------------- env

-- rl.reward.env{}: the environment's own return, each turn's reward on its turn (a dense term).
-- Named "env" unless named otherwise.
function M.env(opts)
  local t = M.new("env", opts or {}, nil, "env", 2)
  t.dense = true
  t.eval = function(_, batch, sel, _, out)
    for _, i in ipairs(sel) do
      local ep = batch.episodes[i]
      local turns, s = {}, 0
      for k = 1, turn_count(ep) do
        local r = ep.record and ep.record[k]
        turns[k] = r and r.reward or 0
        s = s + turns[k]
      end
      out[i] = { status = "ok", value = s, turns = turns }
    end
  end
  return t
end

-- ---------------------------------------------------------------- budget

local COUNTERS = { "tokens", "turns", "tool_calls", "cpu_seconds", "judge_cost" }

-- An episode's engine counters: sampled tokens, turns, tool calls (turns parsed as a call or
-- marked info.tool_call, rl.batch.is_tool_call), the sandbox CPU seconds its tools used (where
-- the sandbox measured them), what the judges before this term spent on it, and costs: its
-- cost totals per currency (ep.costs, what rl.envkit's ledgers charged; {} when none).
function M.counters(ep, ctx, i)
  local calls, cpu = 0, 0
  for _, r in ipairs(ep.record or {}) do
    if batchlib.is_tool_call(r) then calls = calls + 1 end
    if type(r.tool_cpu_ms) == "number" then cpu = cpu + r.tool_cpu_ms / 1000 end
  end
  return { tokens = ctx:sampled(i), turns = ep.turns or (ep.record and #ep.record) or 0,
    tool_calls = calls, cpu_seconds = cpu, judge_cost = ctx.costs[i] or 0,
    costs = ep.costs or {} }
end

-- {currency = coefficient, ...}: names and non-negative numbers.
local function cost_coefficients(v)
  if type(v) ~= "table" or next(v) == nil then
    return "a table {currency = coefficient} (rl.envkit.costs's currencies)"
  end
  for name, coef in pairs(v) do
    if type(name) ~= "string" or check.name(name) then
      return "a table {currency = coefficient} with currency names as keys"
    end
    if check.number(0)(coef) then
      return { string.format("costs.%s: a non-negative number expected, got %s",
        name, check.describe(coef)) }
    end
  end
  return nil
end

-- rl.reward.budget{tokens =, turns =, tool_calls =, cpu_seconds =, judge_cost =, costs =
-- {currency = coefficient}}: a linear penalty, minus the sum of each coefficient times its
-- counter (M.counters; an episode never charged in a currency counts 0 of it). Named "budget"
-- unless named otherwise; scored after every other term, so judge_cost sees the judges' spend.
function M.budget(opts)
  local extra = {}
  for k, name in ipairs(COUNTERS) do extra[k] = { name, check.number(0) } end
  extra[#extra + 1] = { "costs", cost_coefficients }
  local t = M.new("budget", opts, extra, "budget", 2)
  local any = t.costs ~= nil
  for _, name in ipairs(COUNTERS) do any = any or t[name] ~= nil end
  if not any then
    error("rl.reward.budget: at least one of tokens, turns, tool_calls, cpu_seconds, judge_cost, "
      .. "costs expected", 2)
  end
  local currencies = {}
  for name in pairs(t.costs or {}) do currencies[#currencies + 1] = name end
  table.sort(currencies) -- one order of the sum in every process
  t.late = true
  t.eval = function(term, batch, sel, ctx, out)
    for _, i in ipairs(sel) do
      local c = M.counters(batch.episodes[i], ctx, i)
      local pen = 0
      for _, name in ipairs(COUNTERS) do
        if term[name] then pen = pen + term[name] * c[name] end
      end
      for _, name in ipairs(currencies) do pen = pen + term.costs[name] * (c.costs[name] or 0) end
      out[i] = { status = "ok", value = -pen }
    end
  end
  return t
end

-- ---------------------------------------------------------------- overlong

-- rl.reward.overlong{max_len =, buffer =, factor = 1, floor = true}: DAPO's soft overlong
-- penalty on each episode's token count (rl.objective.overlong, the trainer's own). Named
-- "overlong" unless named otherwise.
function M.overlong(opts)
  local t = M.new("overlong", opts, {
    { "max_len", check.integer(1), required = true },
    { "buffer", check.integer(1), required = true },
    { "factor", check.number(), default = 1 },
    { "floor", check.boolean, default = true },
  }, "overlong", 2)
  if t.buffer > t.max_len then error("rl.reward.overlong: buffer: at most max_len expected", 2) end
  t.eval = function(term, batch, sel, _, out)
    if #sel == 0 then return end
    local lengths = {}
    for k, i in ipairs(sel) do lengths[k] = batch.episodes[i].length end
    local pen = core.objective.overlong { lengths = lengths, max_len = term.max_len,
      buffer = term.buffer, factor = term.factor, floor = term.floor }
    for k, i in ipairs(sel) do out[i] = { status = "ok", value = pen[k] } end
  end
  return t
end

return M
