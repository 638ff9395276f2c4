-- moonrl.reward.judge: reward terms scored by a language model behind a client — judge (one call
-- per episode) and rank (one call per group, candidates shown in a random order and mapped back)
-- — with a persistent on-disk cache, rate limits (rpm, tpm) on an injectable clock, call, token
-- and cost budgets, retries; and rl.reward.model_client, which makes a local rl.model a client.
--
-- The client interface: any Lua value with a method
--   client:chat(messages, opts) -> text, info      messages = {{role =, content =}, ...}
-- or, without chat,
--   client:complete(prompt, opts) -> text, info    prompt = the messages' contents, joined
-- opts = {model = (when the judge names one; else the client uses its own), timeout = (seconds,
-- when the judge has one), and the judge's sampling table's fields (temperature =, max_tokens =,
-- top_p =, seed =, ...)}. text is the reply; info, optional,
-- is {prompt_tokens =, completion_tokens =, cost =}. A failed call returns nil, message [, info]
-- where info may say {timeout = true} or {retry_after = seconds} (a rate-limited server); a
-- client that raises counts as a failed call. Optionally client:batch(requests) -> results, with
-- requests = {{messages =, opts =}, ...} and results[i] = {text, info} or {nil, message, info}:
-- with concurrency = k the judge hands it k requests at a time.
local core = require "moonrl.core"
local check = require "moonrl.reward.check"
local terms = require "moonrl.reward.terms"
local seedlib = require "moonrl.train.seed"

local json = core.json
local M = {}

-- ---------------------------------------------------------------- hashing

local function fnv(s, h, salt)
  for i = 1, #s, 256 do
    local bytes = { s:byte(i, math.min(i + 255, #s)) }
    for k = 1, #bytes do h = (h ~ (bytes[k] ~ salt)) * 0x100000001b3 end
  end
  return h
end

-- A 128-bit hash of a string as 32 hex digits (two FNV-1a streams), the same in every process.
function M.hash(s)
  return string.format("%016x%016x", fnv(s, 0xcbf29ce484222325, 0), fnv(s, 0x6c62272e07bb0142, 0x5c))
end

-- ---------------------------------------------------------------- the cache

local Cache = {}
Cache.__index = Cache

-- rl.reward.cache(path): judge replies by key, kept in memory and, with a path, appended to a
-- JSONL file that later caches of the same path (another process, a resumed run) read back.
function M.cache(path)
  if path ~= nil and type(path) ~= "string" then
    error("rl.reward.cache: path: a string expected, got " .. check.describe(path), 2)
  end
  return setmetatable({ path = path, entries = {}, loaded = path == nil, size = 0 }, Cache)
end

function Cache:load_file()
  self.loaded = true
  local f = io.open(self.path, "r")
  if not f then return end
  for line in f:lines() do
    local e = line:match("%S") and json.decode(line)
    -- a line cut short by a crash is skipped
    if type(e) == "table" and type(e.key) == "string" and type(e.text) == "string" then
      if not self.entries[e.key] then self.size = self.size + 1 end
      self.entries[e.key] = e
    end
  end
  f:close()
end

-- cache:state() -> {path =, size =}; cache:load(state) points it at that file (read on next use).
function Cache:state() return { path = self.path, size = self.size } end
function Cache:load(s)
  if type(s) ~= "table" then error("load: state: a table expected, got " .. check.describe(s), 2) end
  self.path, self.entries, self.size = s.path, {}, 0
  self.loaded = self.path == nil
end

function Cache:get(key)
  if not self.loaded then self:load_file() end
  return self.entries[key]
end

-- Adds entries (a list of {key =, text =, info =}); returns true or nil, message (the file could
-- not be written).
function Cache:put(list)
  if not self.loaded then self:load_file() end
  local lines = {}
  for _, e in ipairs(list) do
    if not self.entries[e.key] then self.size = self.size + 1 end
    self.entries[e.key] = e
    lines[#lines + 1] = json.encode(e) .. "\n"
  end
  if not self.path or #lines == 0 then return true end
  local f, err = io.open(self.path, "a")
  if not f then return nil, err end
  local ok, werr = f:write(table.concat(lines))
  local closed, cerr = f:close()
  if not ok or not closed then return nil, self.path .. ": " .. tostring(werr or cerr) end
  return true
end

-- ---------------------------------------------------------------- rate limits

local function default_sleep(s) os.execute(string.format("sleep %.3f", s)) end
M.default_clock = { now = core.clock, sleep = default_sleep }

local Limiter = {}
Limiter.__index = Limiter

-- A sliding 60-second window of calls: at most rpm calls and tpm tokens in any 60 seconds of
-- clock.now(); clock.sleep(seconds) waits (a test's clock advances instead). A call counts from
-- its admission until its reply and for 60 seconds after that: the server sees it somewhere in
-- between, so no 60 seconds of the server's holds more than rpm calls either, whatever the
-- network's delays.
function M.limiter(rpm, tpm, clock)
  return setmetatable({ rpm = rpm, tpm = tpm, clock = clock, window = {} }, Limiter)
end

-- If a call of about `tokens` tokens fits now, counts it and returns its window entry (whose
-- tokens the caller corrects once the reply says how many there were); else nil and how long
-- to wait.
function Limiter:try(tokens)
  local w, now = self.window, self.clock.now()
  while #w > 0 and w[1].t <= now - 60 do table.remove(w, 1) end
  local used = 0
  for _, e in ipairs(w) do used = used + e.tokens end
  if (self.rpm and #w >= self.rpm) or (self.tpm and #w > 0 and used + tokens > self.tpm) then
    return nil, math.max(w[1].t + 60 - now, 1e-6)
  end
  local e = { t = now, tokens = tokens }
  w[#w + 1] = e
  return e
end

-- Waits until a call fits, then counts it (as try does).
function Limiter:acquire(tokens)
  while true do
    local e, wait = self:try(tokens)
    if e then return e end
    self.clock.sleep(wait)
  end
end

-- The calls of entries have their replies: they count from now. (The window stays in time
-- order: the entries in flight are its newest.)
function Limiter:finish(entries)
  local now = self.clock.now()
  for _, e in ipairs(entries) do e.t = now end
end

-- ---------------------------------------------------------------- calling

local function client_check(v)
  local ok, has = pcall(function() return type(v.chat) == "function" or type(v.complete) == "function" end)
  if ok and has then return nil end
  return "a client (an object with a chat(messages, opts) or complete(prompt, opts) method)"
end
M.client_check = client_check

local function clock_check(v)
  if type(v) == "table" and type(v.now) == "function" and type(v.sleep) == "function" then return nil end
  return "a table {now = function() -> seconds, sleep = function(seconds)}"
end

-- The options judge and rank share.
local function calling_fields()
  return {
    { "client", client_check, required = true },
    { "model", check.string, default = "" },
    { "system", check.string },
    { "sampling", check.table, default = {} },
    { "cache", check.either(check.boolean, check.string), default = true },
    { "id", check.name },
    { "timeout", check.positive },
    { "retries", check.integer(0), default = 0 },
    { "backoff", check.number(0), default = 1 },
    { "rpm", check.positive },
    { "tpm", check.positive },
    { "concurrency", check.integer(1), default = 1 },
    { "on_error", check.enum { "skip", "fail" }, default = "skip" },
    { "budget", check.sub("budget", { { "calls", check.integer(0) },
      { "tokens", check.number(0) }, { "cost", check.number(0) } }) },
    { "price", check.sub("price", { { "prompt", check.number(0), default = 0 },
      { "completion", check.number(0), default = 0 } }) },
    { "clock", clock_check },
  }
end

local COUNTERS = { "calls", "hits", "errors", "timeouts", "tokens", "cost" }

-- Sets up what judge and rank share: counters, the limiter, the cache key's fixed parts.
local function calling_setup(t)
  t.counters = {}
  for _, k in ipairs(COUNTERS) do t.counters[k] = 0 end
  t.clock = t.clock or M.default_clock
  if t.rpm or t.tpm then t.limiter = M.limiter(t.rpm, t.tpm, t.clock) end
  t.judge_id = t.id or t.name
  -- the model in the cache key: the judge's, else the one the client asks (rl.http.openai's model)
  local ok, client_model = pcall(function() return t.client.model end)
  t.model_key = t.model ~= "" and t.model or (ok and type(client_model) == "string" and client_model) or ""
  t.sampling_key = json.encode(t.sampling)
  t.calls_judge = true
  t.state = function(self)
    local s = {}
    for _, k in ipairs(COUNTERS) do s[k] = self.counters[k] end
    return s
  end
  t.load = function(self, s)
    for _, k in ipairs(COUNTERS) do
      if type(s) == "table" and type(s[k]) == "number" then self.counters[k] = s[k] end
    end
  end
end

-- Why the next call may not be made (its budget is spent), or nil.
local function over_budget(t)
  local b, c = t.budget, t.counters
  if not b then return nil end
  if b.calls and c.calls >= b.calls then return string.format("judge budget spent: %d calls of %d", c.calls, b.calls) end
  if b.tokens and c.tokens >= b.tokens then return string.format("judge budget spent: %g tokens of %g", c.tokens, b.tokens) end
  if b.cost and c.cost >= b.cost then return string.format("judge budget spent: cost %g of %g", c.cost, b.cost) end
  return nil
end

local function joined(messages)
  local parts = {}
  for k, m in ipairs(messages) do parts[k] = m.content end
  return table.concat(parts, "\n\n")
end

-- One raw call: text, info or nil, message, info.
local function raw_call(t, messages, opts)
  local c = t.client
  local ok, text, info, extra
  if type(c.chat) == "function" then
    ok, text, info, extra = pcall(c.chat, c, messages, opts)
  else
    ok, text, info, extra = pcall(c.complete, c, joined(messages), opts)
  end
  if not ok then return nil, "the client raised: " .. tostring(text), {} end
  if type(text) == "string" then return text, type(info) == "table" and info or {} end
  return nil, tostring(info or "the client returned no text"), type(extra) == "table" and extra or {}
end

local function call_opts(t)
  local o = {}
  for k, v in pairs(t.sampling) do o[k] = v end
  -- no model: the client's own (a server would take "" for a model's name)
  o.model = t.model ~= "" and t.model or nil
  o.timeout = t.timeout
  return o
end

-- Counts a successful reply's tokens and cost; returns the cost.
local function account(t, req, info, entry)
  local tokens = (tonumber(info.prompt_tokens) or 0) + (tonumber(info.completion_tokens) or 0)
  if tokens == 0 then tokens = req.estimate end
  if entry then entry.tokens = tokens end
  local cost = tonumber(info.cost)
  if not cost and t.price then
    cost = t.price.prompt * (tonumber(info.prompt_tokens) or 0)
      + t.price.completion * (tonumber(info.completion_tokens) or 0)
  end
  cost = cost or 0
  t.counters.tokens = t.counters.tokens + tokens
  t.counters.cost = t.counters.cost + cost
  return cost
end

-- Makes requests (a list of {messages =, estimate =}), with budget, rate limit and retries:
-- sets req.text, req.info, req.cost, or req.failure (a message). Up to concurrency requests go
-- out together; one the rate limit makes wait is not held back with them (waiting, the others'
-- admissions would age while they were not yet sent), but starts the next chunk.
local function send(t, reqs)
  local pending = {}
  for _, r in ipairs(reqs) do pending[#pending + 1] = r end
  local attempt = 0
  while #pending > 0 do
    attempt = attempt + 1
    local retry = {}
    local k = 1
    while k <= #pending do
      local chunk, entries = {}, {}
      while k <= #pending and #chunk < t.concurrency do
        local r = pending[k]
        local why = over_budget(t)
        if why then
          r.failure = why
        elseif t.limiter then
          r.entry = t.limiter:try(r.estimate)
          if not r.entry and #chunk > 0 then break end
          r.entry = r.entry or t.limiter:acquire(r.estimate)
          entries[#entries + 1] = r.entry
        end
        k = k + 1
        if not why then
          t.counters.calls = t.counters.calls + 1
          chunk[#chunk + 1] = r
        end
      end
      local results
      if #chunk > 1 and type(t.client.batch) == "function" then
        local list = {}
        for j, r in ipairs(chunk) do list[j] = { messages = r.messages, opts = call_opts(t) } end
        local ok, res = pcall(t.client.batch, t.client, list)
        results = {}
        for j = 1, #chunk do
          local x = ok and type(res) == "table" and res[j]
          if type(x) == "table" and type(x[1]) == "string" then
            results[j] = { x[1], type(x[2]) == "table" and x[2] or {} }
          elseif type(x) == "table" then
            results[j] = { nil, tostring(x[2] or "the client returned no text"), type(x[3]) == "table" and x[3] or {} }
          else
            results[j] = { nil, ok and "the client's batch returned no result" or "the client raised: " .. tostring(res), {} }
          end
        end
      else
        results = {}
        for j, r in ipairs(chunk) do results[j] = { raw_call(t, r.messages, call_opts(t)) } end
      end
      if t.limiter then t.limiter:finish(entries) end
      for j, r in ipairs(chunk) do
        local text, info, extra = results[j][1], results[j][2], results[j][3]
        if text then
          r.text, r.info, r.failure = text, info, nil
          r.cost = account(t, r, info, r.entry)
        else
          t.counters.errors = t.counters.errors + 1
          if extra.timeout then t.counters.timeouts = t.counters.timeouts + 1 end
          r.failure = (extra.timeout and "timed out: " or "failed: ") .. info
          if attempt <= t.retries then
            retry[#retry + 1] = r
            r.wait = math.max(r.wait or 0, tonumber(extra.retry_after) or t.backoff * 2 ^ (attempt - 1))
          end
        end
      end
    end
    if #retry > 0 then
      local wait = 0
      for _, r in ipairs(retry) do wait = math.max(wait, r.wait) end
      if wait > 0 then t.clock.sleep(wait) end
    end
    pending = retry
  end
end

-- Cache keys and calls for a list of requests: duplicates (the same key) are asked once; a
-- cache hit is not asked at all. Sets req.text/info/cost/hit or req.failure.
local function resolve(t, reqs)
  local store = t.store
  local first, todo = {}, {}
  for _, r in ipairs(reqs) do
    r.key = table.concat({ t.judge_id, t.model_key, M.hash(json.encode(r.messages)), t.sampling_key }, "\0")
    local e = store and store:get(r.key)
    if e then
      r.text, r.info, r.cost, r.hit = e.text, e.info or {}, 0, true
      t.counters.hits = t.counters.hits + 1
    elseif first[r.key] then
      r.same = first[r.key]
    else
      first[r.key] = r
      todo[#todo + 1] = r
    end
  end
  send(t, todo)
  local new = {}
  for _, r in ipairs(todo) do
    if r.text then new[#new + 1] = { key = r.key, text = r.text, info = r.info } end
  end
  for _, r in ipairs(reqs) do
    if r.same then
      local s = r.same
      r.text, r.info, r.failure, r.cost, r.hit = s.text, s.info, s.failure, 0, s.text ~= nil
      if r.hit then t.counters.hits = t.counters.hits + 1 end
    end
  end
  if store and #new > 0 then
    local ok, err = store:put(new)
    if not ok then error("rl.reward: judge " .. t.name .. ": cache: " .. err, 0) end
  end
end

-- A failed request's result: unscorable, or (on_error = "fail") an error raised.
local function failed(t, why)
  if t.on_error == "fail" then error(string.format("rl.reward: judge %s: %s", t.name, why), 0) end
  return { status = "unscorable", message = why }
end

-- ---------------------------------------------------------------- rendering

-- The task as text: a string as it is, else its prompt, question, text or instruction field, else
-- its JSON.
function M.task_text(task)
  if type(task) == "string" then return task end
  if type(task) == "table" then
    for _, k in ipairs { "prompt", "question", "text", "instruction" } do
      if type(task[k]) == "string" then return task[k] end
    end
  end
  if task == nil then return "" end
  local ok, s = pcall(json.encode, task)
  return ok and s or tostring(task)
end

local function reference_text(task)
  if type(task) ~= "table" then return "" end
  for _, k in ipairs { "answer", "reference", "solution" } do
    if task[k] ~= nil then return tostring(task[k]) end
  end
  return ""
end

-- The episode's turns: "assistant: <action>" and "observation: <text>" lines.
function M.transcript(ep)
  local lines = {}
  for _, r in ipairs(ep.record or {}) do
    lines[#lines + 1] = "assistant: " .. tostring(r.action or "")
    if r.observation then lines[#lines + 1] = "observation: " .. tostring(r.observation) end
  end
  return table.concat(lines, "\n")
end

local PLACEHOLDERS = {
  task = function(ep) return M.task_text(ep.task) end,
  answer = function(ep) return terms.final_action(ep) end,
  transcript = M.transcript,
  reference = function(ep) return reference_text(ep.task) end,
}

local function template_check(v)
  if type(v) == "function" then return nil end
  if type(v) ~= "string" then return "a template string or a function(ep, ctx) -> string | messages" end
  for name in v:gmatch("{(%w+)}") do
    if not PLACEHOLDERS[name] then
      return string.format("a template whose placeholders are {task}, {answer}, {transcript}, "
        .. "{reference} (not {%s})", name)
    end
  end
  return nil
end

-- The messages of a prompt that is a template or a function's string or list.
local function messages_of(t, prompt, ep, ctx)
  local content
  if type(prompt) == "function" then
    local ok, v = pcall(prompt, ep, ctx)
    if not ok then return nil, "prompt: " .. tostring(v) end
    if type(v) == "table" then
      for k, m in ipairs(v) do
        if type(m) ~= "table" or type(m.role) ~= "string" or type(m.content) ~= "string" then
          return nil, string.format("prompt: message %d is not {role =, content =}", k)
        end
      end
      return v
    end
    if type(v) ~= "string" then return nil, "prompt: returned " .. check.describe(v) end
    content = v
  else
    content = prompt:gsub("{(%w+)}", function(name) return PLACEHOLDERS[name](ep) end)
  end
  local msgs = {}
  if t.system then msgs[1] = { role = "system", content = t.system } end
  msgs[#msgs + 1] = { role = "user", content = content }
  return msgs
end

local function estimate(messages, sampling)
  return math.ceil(#json.encode(messages) / 4) + (tonumber(sampling.max_tokens) or 0)
end

-- ---------------------------------------------------------------- parsing replies

local function parse_yesno(text)
  local w = text:match("^[%s%p]*(%a+)")
  w = w and w:lower()
  if w == "yes" then return 1 end
  if w == "no" then return 0 end
  return nil, "the reply is neither yes nor no"
end

local function parse_score(text)
  local s = text:match("[-+]?%d*%.?%d+")
  local v = s and tonumber(s)
  if v then return v end
  return nil, "the reply holds no number"
end

-- choices {A = 1, B = 0.5, ...}: the choice that appears first in the reply (as a whole word;
-- at one position the longer, then the bytewise smaller).
local function choice_parser(choices)
  local names = {}
  for k in pairs(choices) do names[#names + 1] = k end
  table.sort(names, function(a, b) if #a ~= #b then return #a > #b end return a < b end)
  return function(text)
    local best, at
    for _, name in ipairs(names) do
      local p = text:find("%f[%w]" .. name:gsub("%p", "%%%0") .. "%f[%W]")
      if p and (not at or p < at) then best, at = name, p end
    end
    if best then return choices[best] end
    return nil, "the reply names none of the choices"
  end
end

local function parse_check(v)
  if v == "yesno" or v == "score" or type(v) == "function" then return nil end
  if type(v) == "table" then
    local n = 0
    for k, x in pairs(v) do
      if type(k) ~= "string" or not check.finite(x) then return "a table {choice = number, ...}" end
      n = n + 1
    end
    if n > 0 then return nil end
  end
  return "\"yesno\", \"score\", a table {choice = number, ...} or a function(text, info, ep)"
end

-- ---------------------------------------------------------------- judge

-- rl.reward.judge{name =, client =, model =, prompt =, parse = "yesno", sampling = {}, cache =
-- true, ...}: one call per episode (cached; identical prompts in a batch are asked once).
function M.judge(opts)
  local extra = calling_fields()
  extra[#extra + 1] = { "prompt", template_check, required = true }
  extra[#extra + 1] = { "parse", parse_check, default = "yesno" }
  local t = terms.new("judge", opts, extra, nil, 2)
  calling_setup(t)
  if t.parse == "yesno" then t.parser = parse_yesno
  elseif t.parse == "score" then t.parser = parse_score
  elseif type(t.parse) == "table" then t.parser = choice_parser(t.parse)
  end
  t.eval = function(term, batch, sel, ctx, out)
    local reqs = {}
    for _, i in ipairs(sel) do
      local ep = batch.episodes[i]
      local msgs, err = messages_of(term, term.prompt, ep, ctx:episode(i))
      if msgs then
        reqs[#reqs + 1] = { i = i, messages = msgs, estimate = estimate(msgs, term.sampling) }
      else
        out[i] = { status = "error", message = err }
      end
    end
    resolve(term, reqs)
    for _, r in ipairs(reqs) do
      local i = r.i
      if r.text then
        ctx.costs[i] = (ctx.costs[i] or 0) + r.cost
        local res
        if term.parser then
          local v, why = term.parser(r.text)
          res = v and { status = "ok", value = v } or { status = "unscorable", message = why .. ": " .. r.text:sub(1, 80) }
        else
          res = terms.interpret(pcall(term.parse, r.text, r.info, batch.episodes[i]))
        end
        res.cost, res.cached = r.cost, r.hit or nil
        out[i] = res
      else
        out[i] = failed(term, r.failure)
      end
    end
  end
  return t
end

-- ---------------------------------------------------------------- rank

local function show_check(v)
  if v == "answer" or v == "transcript" or type(v) == "function" then return nil end
  return "\"answer\", \"transcript\" or a function(ep) -> string"
end

-- The candidates' order in the reply: the positions 1..n named in the order they first appear, or
-- nil and why (when some position is never named).
local function read_ranking(text, n)
  local seen, order = {}, {}
  for s in text:gmatch("%d+") do
    local k = tonumber(s)
    if k >= 1 and k <= n and not seen[k] then
      seen[k] = true
      order[#order + 1] = k
    end
  end
  if #order < n then return nil, string.format("the ranking names %d of %d candidates", #order, n) end
  return order
end

-- rl.reward.rank{name =, client =, model =, rubric =, show = "answer", shuffle = true, ...}: one
-- call per group; the group's episodes are shown in a random order (from the graph's seed, the
-- scoring count and the group), the reply's ranking is mapped back, and the episode ranked r of n
-- scores (n - r) / (n - 1): 1 for the best, 0 for the worst. A group of one: not applicable.
function M.rank(opts)
  local extra = calling_fields()
  extra[#extra + 1] = { "rubric", check.string, required = true }
  extra[#extra + 1] = { "show", show_check, default = "answer" }
  extra[#extra + 1] = { "shuffle", check.boolean, default = true }
  local t = terms.new("rank", opts, extra, nil, 2)
  calling_setup(t)
  local function shown(term, ep)
    if term.show == "answer" then return terms.final_action(ep) end
    if term.show == "transcript" then return M.transcript(ep) end
    local ok, s = pcall(term.show, ep)
    return ok and tostring(s) or ("(show failed: " .. tostring(s) .. ")")
  end
  t.eval = function(term, batch, sel, ctx, out)
    local reqs = {}
    for k, g in ipairs(ctx:groups(sel)) do
      local n = #g.members
      if n == 1 then
        out[g.members[1]] = { status = "na" }
      else
        local perm = {}
        for p = 1, n do perm[p] = p end
        if term.shuffle then
          local rng = core.rng(seedlib.mix(ctx.seed, ctx.scored, k))
          for p = n, 2, -1 do
            local q = rng:random(p)
            perm[p], perm[q] = perm[q], perm[p]
          end
        end
        local lines = { term.rubric, "", "Task:", M.task_text(batch.episodes[g.members[1]].task), "",
          "Candidates:" }
        for p = 1, n do
          lines[#lines + 1] = string.format("[%d] %s", p, shown(term, batch.episodes[g.members[perm[p]]]))
        end
        lines[#lines + 1] = ""
        lines[#lines + 1] = "Rank the candidates from best to worst: reply with their numbers, best first, separated by spaces."
        local msgs = {}
        if term.system then msgs[1] = { role = "system", content = term.system } end
        msgs[#msgs + 1] = { role = "user", content = table.concat(lines, "\n") }
        reqs[#reqs + 1] = { group = g, perm = perm, messages = msgs, estimate = estimate(msgs, term.sampling) }
      end
    end
    resolve(term, reqs)
    for _, r in ipairs(reqs) do
      local members, n = r.group.members, #r.group.members
      local order, why
      if r.text then order, why = read_ranking(r.text, n) else why = r.failure end
      if order then
        local first = members[r.perm[order[1]]]
        ctx.costs[first] = (ctx.costs[first] or 0) + r.cost
        for rank, p in ipairs(order) do
          local i = members[r.perm[p]]
          out[i] = { status = "ok", value = (n - rank) / (n - 1), cost = i == first and r.cost or 0,
            cached = r.hit or nil }
        end
      else
        local res = r.text and { status = "unscorable", message = why } or failed(term, why)
        for _, i in ipairs(members) do out[i] = { status = res.status, message = res.message } end
      end
    end
  end
  return t
end

-- ---------------------------------------------------------------- a local model as a client

-- rl.reward.model_client{model =, tokenizer =, max_new_tokens = 32, template =}: a client whose
-- chat renders the messages with the tokenizer's chat template and samples the reply from the
-- model (greedy unless opts.temperature says otherwise; opts.seed, top_k, top_p, max_tokens are
-- read too). info has prompt_tokens and completion_tokens, cost 0.
function M.model_client(opts)
  local t = check.fields("rl.reward.model_client", opts, {
    { "model", function(v)
      local mt = getmetatable(v)
      if type(v) == "userdata" and type(mt) == "table" and mt.__name == "moonrl.model" then return nil end
      return "an rl.model"
    end, required = true },
    { "tokenizer", function(v)
      local mt = getmetatable(v)
      if type(v) == "userdata" and type(mt) == "table" and mt.__name == "moonrl.tokenizer" then return nil end
      return "an rl.tokenizer"
    end, required = true },
    { "max_new_tokens", check.integer(1), default = 32 },
    { "template", check.enum { "roles", "chatml", "llama3" } },
  }, 2)
  local stop = {}
  for _, s in ipairs { "<|end|>", "<|im_end|>", "<|eot_id|>", "<|eos|>" } do
    local id = t.tokenizer:token_id(s)
    if id then stop[#stop + 1] = id end
  end
  local client = {}
  function client.chat(_, messages, o)
    o = o or {}
    local ids = t.tokenizer:chat(messages, { add_generation_prompt = true, template = t.template })
    local out = t.model:generate { prompts = { ids }, max_new_tokens = o.max_tokens or t.max_new_tokens,
      temperature = o.temperature or 0, top_k = o.top_k, top_p = o.top_p,
      seed = math.tointeger(o.seed) or 0, stop = stop }
    local toks, keep = out.tokens[1], {}
    for _, id in ipairs(toks) do
      local is_stop = false
      for _, s in ipairs(stop) do is_stop = is_stop or id == s end
      if not is_stop then keep[#keep + 1] = id end
    end
    return t.tokenizer:decode(keep), { prompt_tokens = #ids, completion_tokens = #toks, cost = 0 }
  end
  return client
end

return M
