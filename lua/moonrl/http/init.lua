-- moonrl.http (rl.http): HTTP requests from Lua over the engine's libcurl client (core.http),
-- with a base URL, an API key, JSON bodies, Server-Sent-Events streaming, and many requests in
-- flight at once from coroutines.
--
--   local c = rl.http.client{base_url = "http://127.0.0.1:8000", api_key = "k", timeout = 60,
--                            max_connections = 16, retries = 2}
--   local status, headers, body = c:request{method = "POST", path = "/v1/x", body = {a = 1}}
--   -- nil, message, info on failure (info = {outcome =, attempts =, timeout =, status =})
--   c:request{path = "/events", stream = function(ev) ... end}  -- ev = {type, data, id, done, json}
--
-- Concurrency: inside a task started by client:spawn(fn, ...) (or client:run{fn, ...}), a
-- request yields its coroutine while in flight, and client:wait() drives every request of the
-- client until the tasks are done, resuming each task when its request has news. Outside a task
-- a request blocks, driving the client (and so its tasks) until it is done.
local core = require "moonrl.core"
local argcheck = require "moonrl.argcheck"

local json = core.json
local M = {}

local Client = {}
Client.__index = Client

local YIELD = {} -- what a task yields while its request is in flight

local client_fields = {
  { "base_url", nil, argcheck.string },
  { "api_key", nil, argcheck.string },
  { "headers", {}, argcheck.table },
  { "timeout", 600, argcheck.positive },
  { "connect_timeout", 10, argcheck.positive },
  { "idle_timeout", 0, argcheck.number(0) },
  { "max_connections", 16, argcheck.integer(1) },
  { "retries", 2, argcheck.integer(0, 1000) },
  { "backoff", 0.5, argcheck.number(0) },
  { "backoff_max", 8, argcheck.number(0) },
  { "retry_after_max", 60, argcheck.number(0) },
  { "seed", 0, argcheck.integer() },
}
M.client_fields = client_fields

-- rl.http.client{...}: see the top. Unknown option names are errors that name the key.
function M.client(opts, level)
  local o = argcheck.fields("rl.http.client", opts, client_fields, (level or 1) + 1)
  for k, v in pairs(o.headers) do
    if type(k) ~= "string" or type(v) ~= "string" then
      argcheck.fail("rl.http.client", "headers: a table of string names to string values expected",
        (level or 1) + 1)
    end
  end
  local self = setmetatable({ opts = o, tasks = {}, waiting = {}, ntasks = 0 }, Client)
  self.base_url = o.base_url and o.base_url:gsub("/+$", "")
  self.core = core.http.client{
    max_connections = o.max_connections, retries = o.retries, timeout = o.timeout,
    connect_timeout = o.connect_timeout, idle_timeout = o.idle_timeout, backoff = o.backoff,
    backoff_max = o.backoff_max, retry_after_max = o.retry_after_max, seed = o.seed,
  }
  return self
end

-- client:request{...}'s fields (the cassette's request takes the same).
local request_fields = {
  { "method", nil, argcheck.string },
  { "path", nil, argcheck.string },
  { "url", nil, argcheck.string },
  { "body", nil, argcheck.either(argcheck.string, argcheck.table) },
  { "headers", {}, argcheck.table },
  { "stream", nil, argcheck.func },
  { "timeout", nil, argcheck.positive },
}
M.request_fields = request_fields

-- The header lines of a request: the client's, the key's, then the request's own (which win).
local function header_lines(self, headers, json_body)
  local merged, order = {}, {}
  local function put(k, v)
    local lk = k:lower()
    if not merged[lk] then order[#order + 1] = lk end
    merged[lk] = k .. ": " .. v
  end
  if self.opts.api_key then put("Authorization", "Bearer " .. self.opts.api_key) end
  if json_body then put("Content-Type", "application/json") end
  for k, v in pairs(self.opts.headers) do put(k, v) end
  for k, v in pairs(headers) do
    if type(k) ~= "string" or type(v) ~= "string" then
      error("request: headers: a table of string names to string values expected", 3)
    end
    put(k, v)
  end
  table.sort(order)
  local lines = {}
  for i, k in ipairs(order) do lines[i] = merged[k] end
  return lines
end

local function deliver(req, stream)
  local events = req:events()
  for _, ev in ipairs(events) do
    ev.done = ev.data == "[DONE]"
    if not ev.done and ev.data:match("^%s*[{%[]") then ev.json = json.decode(ev.data) end
    if stream(ev) == false then
      req:cancel()
      return false
    end
  end
  return true
end

-- client:request{method =, path = | url =, body = (string, or a table sent as JSON), headers =,
-- stream = function(event), timeout = seconds} -> status, headers, body | nil, message, info.
-- A response of any status is returned as such (status 4xx/5xx included, after the retries);
-- nil comes with a transport failure, a timeout, a cancellation or a stream the callback
-- stopped. Streamed bodies are not returned (body is ""), except for non-2xx statuses.
function Client:request(args)
  local a = argcheck.fields("request", args, request_fields, 2)
  local url = a.url
  if not url then
    if not a.path then argcheck.fail("request", "path or url expected", 2) end
    if not self.base_url then argcheck.fail("request", "path given, but the client has no base_url", 2) end
    url = self.base_url .. (a.path:sub(1, 1) == "/" and "" or "/") .. a.path
  end
  local body = a.body
  local is_json = type(body) == "table"
  if is_json then body = json.encode(body) end
  local req = self.core:submit{
    url = url, method = a.method, body = body, headers = header_lines(self, a.headers, is_json),
    stream = a.stream ~= nil, timeout = a.timeout,
  }
  local co = coroutine.running()
  local stopped = false
  while not req:done() do
    if self.tasks[co] then
      self.waiting[req] = co
      coroutine.yield(YIELD)
    else
      self:step(0.05)
    end
    if a.stream and not stopped then stopped = not deliver(req, a.stream) end
  end
  if a.stream and not stopped then stopped = not deliver(req, a.stream) end
  local r = req:result()
  req:close()
  if r.outcome == "done" then return r.status, r.headers, r.body end
  local message = stopped and "stopped by the stream callback" or r.message
  return nil, message, { outcome = stopped and "stopped" or r.outcome, attempts = r.attempts,
    timeout = r.outcome == "timeout", status = r.status ~= 0 and r.status or nil,
    delivered = r.delivered }
end

-- client:get(path [, headers]) and client:post(path, body [, headers]): shorthands.
function Client:get(path, headers) return self:request{ path = path, headers = headers } end
function Client:post(path, body, headers)
  return self:request{ method = "POST", path = path, body = body, headers = headers }
end

-- Resumes the task co; a finished task keeps its results (or its error).
local function resume(self, co, ...)
  local task = self.tasks[co]
  local res = table.pack(coroutine.resume(co, ...))
  if coroutine.status(co) == "dead" then
    self.tasks[co] = nil
    self.ntasks = self.ntasks - 1
    task.done = true
    if res[1] then
      task.results = table.pack(table.unpack(res, 2, res.n))
    else
      task.error = debug.traceback(co, tostring(res[2]))
    end
  end
end

-- client:step([seconds]): one round of the driver: polls the client (waiting up to seconds for
-- news) and resumes the tasks whose requests have finished or streamed something.
function Client:step(seconds)
  self.core:poll(seconds or 0)
  local ready = {}
  for req in pairs(self.waiting) do
    if req:done() or req:has_events() then ready[#ready + 1] = req end
  end
  for _, req in ipairs(ready) do
    local co = self.waiting[req]
    self.waiting[req] = nil
    resume(self, co)
  end
end

-- client:spawn(fn, ...) -> task: runs fn(...) as a task (it starts at once and runs up to its
-- first request).
function Client:spawn(fn, ...)
  if type(fn) ~= "function" then
    error("spawn: a function expected, got " .. argcheck.describe(fn), 2)
  end
  local co = coroutine.create(fn)
  local task = { co = co }
  self.tasks[co] = task
  self.ntasks = self.ntasks + 1
  resume(self, co, ...)
  return task
end

-- client:wait([task]) drives the client until task (or every task) is done; with a task,
-- returns what its function returned, and raises the error it raised.
function Client:wait(task)
  while (task and not task.done) or (not task and self.ntasks > 0) do self:step(0.05) end
  if task then
    if task.error then error(task.error, 2) end
    return table.unpack(task.results, 1, task.results.n)
  end
end

-- client:run{fn1, fn2, ...} -> {results1, results2, ...}: each function as a task, all at once;
-- results_i = table.pack(fn_i()). Raises the first task's error once all are done.
function Client:run(fns)
  if not argcheck.is_list(fns) then error("run: a list of functions expected", 2) end
  local tasks = {}
  for i, fn in ipairs(fns) do tasks[i] = self:spawn(fn) end
  self:wait()
  local out = {}
  for i, t in ipairs(tasks) do
    if t.error then error(t.error, 2) end
    out[i] = t.results
  end
  return out
end

-- client:tasks_left(): tasks not yet done (for driving several clients in turn with step).
function Client:tasks_left() return self.ntasks end
function Client:pending() return self.core:pending() end
function Client:close() self.core:close() end
Client.__close = Client.close
Client.__name = "rl.http.client"

M.Client = Client

-- rl.http.openai{...}: the OpenAI-compatible layer (moonrl.http.openai), loaded on first use.
function M.openai(opts) return require("moonrl.http.openai").new(opts) end

-- rl.http.cassette{path =, mode =, client =, ...}: record/replay of a client's traffic
-- (moonrl.http.cassette), loaded on first use.
function M.cassette(opts) return require("moonrl.http.cassette").new(opts) end

return M
