-- moonrl.http.cassette (rl.http.cassette): records an rl.http client's traffic to a JSON Lines
-- file and replays it offline, so that an environment's or a judge's web calls run the same
-- without the network.
--
--   local cas = rl.http.cassette{client = c, path = "site.jsonl", mode = "auto"}
--   cas:episode("task-3/0")                      -- the key that orders repeated requests
--   local status, headers, body = cas:request{path = "/cart", method = "POST", body = "..."}
--   cas:stats()                                  -- {hits =, misses =, recorded =, passthrough =}
--
-- One line per interaction: {"episode", "seq", "key", "request": {method, url, headers, body},
-- "response": {status, headers, body}} (a body that is not UTF-8 is stored as "body_base64").
-- A request matches a recorded one on its method, its URL less the ignored query parameters and
-- its body (each can be turned off); the n-th matching request of an episode gets the episode's
-- n-th recorded answer (the last one again once they run out, unless repeat_last = false).
-- Secrets are scrubbed before anything is written: the headers named in scrub.headers get the
-- value "<scrubbed>", their values (and the client's API key) are replaced wherever they appear
-- in URLs and bodies, and so is every match of the Lua patterns in scrub.patterns. Matching uses
-- the scrubbed request, so a request carrying a secret still finds its recording.
local core = require "moonrl.core"
local argcheck = require "moonrl.argcheck"

local json = core.json
local M = {}

local SCRUBBED = "<scrubbed>"

local Cassette = {}
Cassette.__index = Cassette
Cassette.__name = "rl.http.cassette"

-- ---------------------------------------------------------------- base64 (non-UTF-8 bodies)

local B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
local B64_INDEX = {}
for i = 1, 64 do B64_INDEX[B64:byte(i)] = i - 1 end

local function b64_encode(s)
  local out = {}
  for i = 1, #s, 3 do
    local a, b, c = s:byte(i, i + 2)
    local n = (a << 16) | ((b or 0) << 8) | (c or 0)
    local q = {}
    for k = 1, 4 do q[k] = B64:sub(((n >> (6 * (4 - k))) & 63) + 1, ((n >> (6 * (4 - k))) & 63) + 1) end
    if not b then q[3], q[4] = "=", "=" elseif not c then q[4] = "=" end
    out[#out + 1] = table.concat(q)
  end
  return table.concat(out)
end

local function b64_decode(s)
  local out = {}
  s = s:gsub("[^%w%+/]", "")
  for i = 1, #s, 4 do
    local n, k = 0, 0
    for j = i, math.min(i + 3, #s) do
      n = (n << 6) | B64_INDEX[s:byte(j)]
      k = k + 1
    end
    n = n << (6 * (4 - k))
    local bytes = string.char((n >> 16) & 255, (n >> 8) & 255, n & 255)
    out[#out + 1] = bytes:sub(1, k - 1)
  end
  return table.concat(out)
end

M.b64_encode, M.b64_decode = b64_encode, b64_decode

-- Puts body s into entry part t as "body" (UTF-8) or "body_base64".
local function put_body(t, s)
  if s == nil then return end
  if utf8.len(s) then t.body = s else t.body_base64 = b64_encode(s) end
end

local function get_body(t)
  if t.body_base64 then return b64_decode(t.body_base64) end
  return t.body
end

-- ---------------------------------------------------------------- options

local WHERE = "rl.http.cassette"

-- A list (perhaps empty) of strings.
local function strings(what)
  return function(v)
    if argcheck.is_list(v) then
      local ok = true
      for _, x in ipairs(v) do if type(x) ~= "string" then ok = false end end
      if ok then return nil end
    end
    return what
  end
end

local match_fields = {
  { "method", true, argcheck.boolean },
  { "url", true, argcheck.boolean },
  { "body", true, argcheck.boolean },
  { "ignore_query", {}, strings("a list of query parameter names") },
}

local scrub_fields = {
  { "headers", { "authorization", "cookie", "set-cookie", "x-api-key", "proxy-authorization" },
    strings("a list of header names") },
  { "patterns", {}, strings("a list of Lua patterns") },
}

local function is_client(v)
  local mt = getmetatable(v)
  if type(mt) == "table" and type(v) == "table" and type(v.request) == "function" then return nil end
  return "an rl.http.client"
end

local fields = {
  { "path", nil, argcheck.string, required = true },
  { "mode", "auto", argcheck.one_of { "record", "replay", "auto" } },
  { "client", nil, is_client },
  { "base_url", nil, argcheck.string },
  { "match", {}, argcheck.sub(WHERE .. ": match", match_fields) },
  { "scrub", {}, argcheck.sub(WHERE .. ": scrub", scrub_fields) },
  { "on_miss", "error", argcheck.one_of { "error", "passthrough", "record" } },
  { "overwrite", false, argcheck.boolean },
  { "repeat_last", true, argcheck.boolean },
  { "episode", "", argcheck.string },
}
M.fields = fields

-- ---------------------------------------------------------------- matching and scrubbing

-- url less the query parameters named in `ignore` (a set), the others kept in their order.
local function strip_query(url, ignore)
  local head, query, frag = url:match("^([^?#]*)%??([^#]*)(#?.*)$")
  if not head or query == "" or next(ignore) == nil then return url end
  local kept = {}
  for part in query:gmatch("[^&]+") do
    local name = part:match("^([^=]*)")
    if not ignore[name] then kept[#kept + 1] = part end
  end
  return head .. (#kept > 0 and "?" .. table.concat(kept, "&") or "") .. frag
end

-- Replaces every occurrence of the secret strings and every match of the patterns in s.
local function scrub_text(self, s)
  if s == nil or s == "" then return s end
  for _, secret in ipairs(self.secrets) do
    local i = 1
    while true do
      local a, b = s:find(secret, i, true)
      if not a then break end
      s = s:sub(1, a - 1) .. SCRUBBED .. s:sub(b + 1)
      i = a + #SCRUBBED
    end
  end
  for _, p in ipairs(self.patterns) do s = s:gsub(p, SCRUBBED) end
  return s
end

-- The secrets a request brings: the client's API key and the values of the scrubbed headers.
local function note_secret(self, v)
  if type(v) ~= "string" or #v < 4 or v == SCRUBBED then return end
  for _, s in ipairs(self.secrets) do if s == v then return end end
  self.secrets[#self.secrets + 1] = v
  local token = v:match("^%a+%s+(%S+)$")  -- "Bearer sk-..." also hides "sk-..."
  if token and #token >= 4 then note_secret(self, token) end
  table.sort(self.secrets, function(a, b) return #a > #b end)
end

local function scrub_headers(self, headers)
  local out = {}
  for k, v in pairs(headers or {}) do
    local lk = k:lower()
    if self.scrub_names[lk] then out[lk] = SCRUBBED else out[lk] = scrub_text(self, v) end
  end
  return out
end

local function match_key(self, method, url, body)
  local m = self.opts.match
  return table.concat({
    m.method and method or "*",
    m.url and strip_query(url, self.ignore) or "*",
    m.body and (body or "") or "*",
  }, "\n")
end

-- ---------------------------------------------------------------- the file

local function load_entries(self)
  local f = io.open(self.opts.path, "r")
  if not f then return end
  for line in f:lines() do
    local ok, e = pcall(json.decode, line)
    if ok and type(e) == "table" and type(e.request) == "table" and type(e.response) == "table" then
      local req = e.request
      local key = match_key(self, req.method, req.url, get_body(req))
      local ep = e.episode or ""
      local byep = self.index[ep] or {}
      self.index[ep] = byep
      local list = byep[key] or {}
      byep[key] = list
      list[#list + 1] = e
    end
  end
  f:close()
end

local function append(self, entry)
  if not self.file then
    local f, err = io.open(self.opts.path, self.truncate and "w" or "a")
    if not f then argcheck.fail(WHERE, "cannot write " .. self.opts.path .. ": " .. tostring(err), 3) end
    self.file, self.truncate = f, false
  end
  self.file:write(json.encode(entry), "\n")
  self.file:flush()
end

-- rl.http.cassette{...}: see the top.
function M.new(opts, level)
  level = (level or 1) + 1
  local o = argcheck.fields(WHERE, opts, fields, level)
  o.match = argcheck.fields(WHERE .. ": match", o.match, match_fields, level)
  o.scrub = argcheck.fields(WHERE .. ": scrub", o.scrub, scrub_fields, level)
  local self = setmetatable({ opts = o, client = o.client, index = {}, cursors = {}, counts = {},
    secrets = {}, patterns = o.scrub.patterns or {}, scrub_names = {}, ignore = {},
    n = { hits = 0, misses = 0, recorded = 0, passthrough = 0 }, ep = o.episode,
    eps = setmetatable({}, { __mode = "k" }) }, Cassette)
  for _, h in ipairs(o.scrub.headers or {}) do self.scrub_names[h:lower()] = true end
  for _, q in ipairs(o.match.ignore_query or {}) do self.ignore[q] = true end
  for _, p in ipairs(self.patterns) do
    local ok, err = pcall(string.find, "", p)
    if not ok then argcheck.fail(WHERE, "scrub: patterns: bad Lua pattern " .. string.format("%q", p) ..
      ": " .. tostring(err):gsub("^[^:]*:%d+: ", ""), level) end
  end
  self.base_url = (o.base_url or (o.client and o.client.base_url) or nil)
  if self.base_url then self.base_url = self.base_url:gsub("/+$", "") end
  local f = io.open(o.path, "r")
  local exists = f ~= nil
  if f then f:close() end
  local mode = o.mode
  if mode == "auto" then mode = exists and "replay" or "record" end
  self.mode = mode
  if mode == "record" then
    if exists and not o.overwrite then
      argcheck.fail(WHERE, o.path .. " exists; record onto it with overwrite = true, or replay it", level)
    end
    self.truncate = true
    if not o.client then argcheck.fail(WHERE, "client: an rl.http.client expected to record with", level) end
  else
    if not exists then argcheck.fail(WHERE, "no cassette at " .. o.path .. " to replay", level) end
    if o.on_miss ~= "error" and not o.client then
      argcheck.fail(WHERE, "client: an rl.http.client expected for on_miss = \"" .. o.on_miss .. "\"", level)
    end
    load_entries(self)
  end
  if self.client and self.client.opts and self.client.opts.api_key then
    note_secret(self, self.client.opts.api_key)
  end
  return self
end

-- ---------------------------------------------------------------- requests

local request_fields = require("moonrl.http").request_fields -- the client's own

-- cas:episode(name): the episode later requests of the calling coroutine belong to (their
-- order is counted per episode; a task started with cas:spawn or cas:run sets its own, the
-- others fall back to the main thread's or the `episode` option); returns the previous one.
function Cassette:episode(name)
  if type(name) ~= "string" then error("episode: a string expected, got " .. argcheck.describe(name), 2) end
  local co = coroutine.running()
  local prev = self.eps[co] or self.ep
  if coroutine.isyieldable() then self.eps[co] = name else self.ep = name end
  return prev
end

local function current_episode(self)
  return self.eps[coroutine.running()] or self.ep
end

-- cas:spawn(fn, ...), cas:wait([task]), cas:run{fn, ...}: the client's tasks (requests in flight
-- at once while recording). Without a client (replay only), requests never wait: run calls the
-- functions in turn and spawn runs fn at once.
function Cassette:run(fns)
  if self.client then return self.client:run(fns) end
  if not argcheck.is_list(fns) then error("run: a list of functions expected", 2) end
  local out = {}
  for i, fn in ipairs(fns) do
    local co = coroutine.create(fn)
    local res = table.pack(coroutine.resume(co))
    if not res[1] then error(debug.traceback(co, tostring(res[2])), 2) end
    out[i] = table.pack(table.unpack(res, 2, res.n))
  end
  return out
end

function Cassette:spawn(fn, ...)
  if self.client then return self.client:spawn(fn, ...) end
  local co = coroutine.create(fn)
  local res = table.pack(coroutine.resume(co, ...))
  local task = { co = co, done = true }
  if res[1] then task.results = table.pack(table.unpack(res, 2, res.n))
  else task.error = debug.traceback(co, tostring(res[2])) end
  return task
end

function Cassette:wait(task)
  if self.client then return self.client:wait(task) end
  if task then
    if task.error then error(task.error, 2) end
    return table.unpack(task.results, 1, task.results.n)
  end
end

local function live(self, a, url, body)
  return self.client:request{ method = a.method, url = url, body = body, headers = a.headers,
    timeout = a.timeout }
end

local function record(self, req, key, status, headers, body)
  local ep = current_episode(self)
  local byep = self.counts[ep] or {}
  self.counts[ep] = byep
  byep[key] = (byep[key] or 0) + 1
  local entry = { episode = ep, seq = byep[key], key = key:gsub("\n.*", ""),
    request = req, response = { status = status, headers = scrub_headers(self, headers) } }
  put_body(entry.response, scrub_text(self, body))
  append(self, entry)
  self.n.recorded = self.n.recorded + 1
end

-- cas:request{...}: the client's request (same arguments and results), recorded or replayed.
-- A replay miss with on_miss = "error" returns nil, "cassette miss: <method> <url> ...",
-- {outcome = "miss"}; "passthrough" asks the client and records nothing; "record" asks it and
-- appends the answer to the cassette. Streaming requests are not recorded yet.
function Cassette:request(args)
  local a = argcheck.fields("request", args, request_fields, 2)
  if a.stream then argcheck.fail("request", "stream: streamed requests are not recorded by cassettes yet", 2) end
  local url = a.url
  if not url then
    if not a.path then argcheck.fail("request", "path or url expected", 2) end
    if not self.base_url then argcheck.fail("request", "path given, but the cassette has no base_url", 2) end
    url = self.base_url .. (a.path:sub(1, 1) == "/" and "" or "/") .. a.path
  end
  local body = a.body
  if type(body) == "table" then body = json.encode(body) end
  local method = (a.method or (body and "POST" or "GET")):upper()
  -- the headers the client sends: its own, its key, the request's
  local sent = {}
  local copts = self.client and self.client.opts or {}
  for k, v in pairs(copts.headers or {}) do sent[k:lower()] = v end
  if copts.api_key then sent.authorization = "Bearer " .. copts.api_key end
  if type(a.body) == "table" then sent["content-type"] = "application/json" end
  for k, v in pairs(a.headers) do
    if type(k) ~= "string" or type(v) ~= "string" then
      argcheck.fail("request", "headers: a table of string names to string values expected", 2)
    end
    sent[k:lower()] = v
  end
  for k, v in pairs(sent) do if self.scrub_names[k] then note_secret(self, v) end end
  local surl, sbody = scrub_text(self, url), scrub_text(self, body)
  local req = { method = method, url = surl, headers = scrub_headers(self, sent) }
  put_body(req, sbody)
  local key = match_key(self, method, surl, sbody)

  if self.mode == "record" then
    local status, headers, rbody = live(self, a, url, body)
    if status then record(self, req, key, status, headers, rbody) end
    return status, headers, rbody
  end

  local ep_name = current_episode(self)
  local list = self.index[ep_name] and self.index[ep_name][key]
  local cur = self.cursors[ep_name] or {}
  self.cursors[ep_name] = cur
  local i = (cur[key] or 0) + 1
  local e = list and (list[i] or (self.opts.repeat_last and list[#list]))
  if e then
    cur[key] = i
    self.n.hits = self.n.hits + 1
    local headers = {}
    for k, v in pairs(e.response.headers or {}) do headers[k] = v end
    return e.response.status, headers, get_body(e.response) or ""
  end
  self.n.misses = self.n.misses + 1
  local on_miss = self.opts.on_miss
  if on_miss == "error" then
    local msg = string.format("cassette miss: %s %s (episode %q, request %d of its kind) not in %s",
      method, surl, ep_name, i, self.opts.path)
    return nil, msg, { outcome = "miss", attempts = 0, timeout = false }
  end
  local status, headers, rbody = live(self, a, url, body)
  if on_miss == "passthrough" then
    self.n.passthrough = self.n.passthrough + 1
  elseif status then
    cur[key] = i
    local byep = self.counts[ep_name] or {}
    self.counts[ep_name] = byep
    byep[key] = math.max(byep[key] or 0, list and #list or 0)
    record(self, req, key, status, headers, rbody)
    local e2 = { response = { status = status, headers = headers } }
    put_body(e2.response, rbody)
    local ep = self.index[ep_name] or {}
    self.index[ep_name] = ep
    ep[key] = ep[key] or {}
    table.insert(ep[key], e2)
  end
  return status, headers, rbody
end

function Cassette:get(path, headers) return self:request{ path = path, headers = headers } end
function Cassette:post(path, body, headers)
  return self:request{ method = "POST", path = path, body = body, headers = headers }
end

-- cas:stats() -> {hits =, misses =, recorded =, passthrough =, mode =}
function Cassette:stats()
  local n = self.n
  return { hits = n.hits, misses = n.misses, recorded = n.recorded, passthrough = n.passthrough,
    mode = self.mode }
end

-- cas:close(): closes the file (the client is the caller's).
function Cassette:close()
  if self.file then self.file:close(); self.file = nil end
end
Cassette.__close = Cassette.close

M.Cassette = Cassette
return M
