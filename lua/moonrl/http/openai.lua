-- moonrl.http.openai (rl.http.openai): an OpenAI-compatible client over rl.http, for judges, task
-- synthesizers and remote policies, with a profile per server family:
--
--   local c = rl.http.openai{base_url = "http://127.0.0.1:8000", profile = "vllm", model = "m",
--                            api_key =, timeout =, max_connections =, retries =, ...}
--   c:chat{messages = {...}, tools =, tool_choice =, n =, logprobs =, temperature =,
--          max_tokens =, stream = function(delta, chunk) end, ...} -> text, info
--   c:chat(messages, opts) -> text, info             (the judge client interface, moonrl.reward)
--   c:complete(prompt, opts) / c:complete{prompt =, ...} -> text, info
--   c:generate{prompt_ids =, max_tokens =, temperature =, seed =}
--     -> {token_ids =, logprobs = (float32 values), finish_reason = "stop"|"length"|..., usage =}
--   c:batch{{messages =, opts =}, ...} -> {{text, info} | {nil, message, info}, ...}, all at once
-- A failed call returns nil, message, info with info.status, info.timeout and info.retry_after
-- (seconds, from a 429/503). info of a chat holds prompt_tokens, completion_tokens,
-- finish_reason, tool_calls, logprobs (per token), choices and the decoded response; replies that
-- went through a server's chat template are not token-exact (info.token_exact = false).
--
-- Profiles (what generate posts, the token-in/token-out path):
--   vllm, moonrl  POST /v1/completions {prompt = ids, max_tokens, logprobs = 1, return_token_ids}
--   sglang        POST /generate {input_ids, sampling_params{max_new_tokens, ...}, return_logprob}
--   llamacpp      POST /completion {prompt = ids, n_predict, n_probs = 1, return_tokens}
--   openai        none (the API has no token-in/token-out endpoint): generate fails
-- chat posts /v1/chat/completions everywhere; its length field is max_completion_tokens for
-- openai and max_tokens for the others. complete posts /v1/completions, /completion for llamacpp.
local core = require "moonrl.core"
local argcheck = require "moonrl.argcheck"
local http = require "moonrl.http"

local json = core.json
local M = {}

local PROFILES = {
  openai = { length_field = "max_completion_tokens" },
  vllm = { length_field = "max_tokens", generate = "vllm" },
  moonrl = { length_field = "max_tokens", generate = "vllm" },
  sglang = { length_field = "max_tokens", generate = "sglang" },
  llamacpp = { length_field = "max_tokens", generate = "llamacpp", complete_path = "/completion" },
}
local PROFILE_NAMES = { "openai", "vllm", "sglang", "llamacpp", "moonrl" }
M.profiles = PROFILE_NAMES

local Client = {}
Client.__index = Client
Client.__name = "rl.http.openai"

local fields = { { "profile", "openai", argcheck.one_of(PROFILE_NAMES) },
                 { "model", "default", argcheck.string } }
for _, f in ipairs(http.client_fields) do fields[#fields + 1] = f end

function M.new(opts)
  local o = argcheck.fields("rl.http.openai", opts, fields, 2)
  if not o.base_url then argcheck.fail("rl.http.openai", "base_url: a string expected (it is required)", 2) end
  local hopts = {}
  for _, f in ipairs(http.client_fields) do hopts[f[1]] = o[f[1]] end
  return setmetatable({ profile = o.profile, model = o.model, p = PROFILES[o.profile],
                        http = http.client(hopts, 2) }, Client)
end

-- ---------------------------------------------------------------- calls

local function f32(x) return (string.unpack("<f", string.pack("<f", x))) end

-- A JSON POST; returns the decoded reply, or nil, message, info.
local function post(self, path, body, timeout)
  local status, headers, text = self.http:request{ method = "POST", path = path, body = body,
                                                   timeout = timeout }
  if not status then return nil, headers, text end
  local reply = json.decode(text)
  if status < 200 or status >= 300 then
    local msg = type(reply) == "table" and type(reply.error) == "table" and reply.error.message
    local info = { status = status, timeout = status == 408 or nil,
                   retry_after = tonumber(headers["retry-after-ms"]) and tonumber(headers["retry-after-ms"]) / 1000
                     or tonumber(headers["retry-after"]) }
    return nil, string.format("HTTP %d from %s: %s", status, path, tostring(msg or text:sub(1, 200))), info
  end
  if type(reply) ~= "table" then
    return nil, string.format("%s: the reply is not a JSON object", path), { status = status }
  end
  return reply
end

local sampling_fields = {
  { "model", nil, argcheck.string }, { "timeout", nil, argcheck.positive },
  { "temperature", nil, argcheck.number(0) }, { "top_p", nil, argcheck.number(0, 1) },
  { "top_k", nil, argcheck.integer() }, { "min_p", nil, argcheck.number(0, 1) },
  { "seed", nil, argcheck.integer() }, { "max_tokens", nil, argcheck.integer(1) },
  { "stop", nil, argcheck.either(argcheck.string, argcheck.table) },
  { "presence_penalty", nil, argcheck.number() }, { "frequency_penalty", nil, argcheck.number() },
  { "repetition_penalty", nil, argcheck.number(0) },
  { "extra", nil, argcheck.table }, -- more body fields, sent as they are
}

local chat_fields = {
  { "messages", nil, argcheck.table, required = true }, { "tools", nil, argcheck.table },
  { "tool_choice", nil, argcheck.either(argcheck.string, argcheck.table) },
  { "parallel_tool_calls", nil, argcheck.boolean }, { "n", nil, argcheck.integer(1) },
  { "logprobs", nil, argcheck.boolean }, { "top_logprobs", nil, argcheck.integer(0, 20) },
  { "response_format", nil, argcheck.table }, { "stream", nil, argcheck.func },
}
for _, f in ipairs(sampling_fields) do chat_fields[#chat_fields + 1] = f end

local complete_fields = { { "prompt", nil, argcheck.string, required = true },
                          { "logprobs", nil, argcheck.integer(0, 20) } }
for _, f in ipairs(sampling_fields) do complete_fields[#complete_fields + 1] = f end

-- The body fields shared by every call.
local function sampling_body(self, a, body, length_field)
  body.model = a.model or self.model
  for _, k in ipairs{ "temperature", "top_p", "top_k", "min_p", "seed", "stop", "presence_penalty",
                      "frequency_penalty", "repetition_penalty" } do
    body[k] = a[k]
  end
  if a.max_tokens then body[length_field] = a.max_tokens end
  for k, v in pairs(a.extra or {}) do body[k] = v end
  return body
end

-- The table form ({messages =, ...}) or the judge's (messages, opts) as one table of arguments.
local function arguments(first, opts, key)
  if type(first) == "table" and first[key] ~= nil and opts == nil then return first end
  local a = {}
  for k, v in pairs(opts or {}) do a[k] = v end
  a[key] = first
  return a
end

local function chat_info(reply)
  local choice = type(reply.choices) == "table" and reply.choices[1] or {}
  local usage = type(reply.usage) == "table" and reply.usage or {}
  local lps
  if type(choice.logprobs) == "table" and type(choice.logprobs.content) == "table" then
    lps = {}
    for i, t in ipairs(choice.logprobs.content) do lps[i] = t.logprob end
  end
  local msg = type(choice.message) == "table" and choice.message or {}
  return {
    prompt_tokens = usage.prompt_tokens, completion_tokens = usage.completion_tokens,
    finish_reason = choice.finish_reason, tool_calls = msg.tool_calls ~= json.null and msg.tool_calls or nil,
    logprobs = lps, choices = reply.choices, response = reply, token_exact = false,
  }
end

-- Streams a chat: the deltas of choice 0 go to a.stream(delta, chunk) and are joined.
local function chat_stream(self, body, a)
  body.stream = true
  body.stream_options = { include_usage = true }
  local parts, usage, finish, err, done = {}, nil, nil, nil, false
  local calls = {} -- tool calls joined from their deltas, by index (arguments arrive in pieces)
  local status, headers, text = self.http:request{ method = "POST", path = "/v1/chat/completions",
    body = body, timeout = a.timeout, stream = function(ev)
      if ev.done then done = true return true end
      local chunk = ev.json
      if type(chunk) ~= "table" then return true end
      if type(chunk.error) == "table" then err = tostring(chunk.error.message) return false end
      if type(chunk.usage) == "table" then usage = chunk.usage end
      local c = type(chunk.choices) == "table" and chunk.choices[1]
      if type(c) == "table" then
        local d = type(c.delta) == "table" and c.delta.content
        if type(d) == "string" and d ~= "" then
          parts[#parts + 1] = d
          a.stream(d, chunk)
        end
        local tc = type(c.delta) == "table" and c.delta.tool_calls
        if type(tc) == "table" then
          for _, piece in ipairs(tc) do
            local at = (math.tointeger(piece.index) or #calls) + 1
            local call = calls[at] or { type = "function", ["function"] = { name = "", arguments = "" } }
            calls[at] = call
            if type(piece.id) == "string" then call.id = piece.id end
            local f = type(piece["function"]) == "table" and piece["function"] or {}
            if type(f.name) == "string" then call["function"].name = call["function"].name .. f.name end
            if type(f.arguments) == "string" then
              call["function"].arguments = call["function"].arguments .. f.arguments
            end
          end
        end
        if type(c.finish_reason) == "string" then finish = c.finish_reason end
      end
      return true
    end }
  if err then return nil, "the stream reported an error: " .. err, {} end
  if not status then return nil, headers, text end
  if status < 200 or status >= 300 then
    return nil, string.format("HTTP %d from /v1/chat/completions: %s", status, text:sub(1, 200)), { status = status }
  end
  if not done then return nil, "the stream ended before [DONE]", {} end
  usage = usage or {}
  return table.concat(parts), { prompt_tokens = usage.prompt_tokens,
    completion_tokens = usage.completion_tokens, finish_reason = finish, token_exact = false,
    tool_calls = #calls > 0 and calls or nil }
end

function Client:chat(first, opts)
  local a = argcheck.fields("chat", arguments(first, opts, "messages"), chat_fields, 2)
  local body = sampling_body(self, a, { messages = a.messages }, self.p.length_field)
  for _, k in ipairs{ "tools", "tool_choice", "parallel_tool_calls", "n", "logprobs", "top_logprobs",
                      "response_format" } do
    if a[k] ~= nil then body[k] = a[k] end
  end
  if a.stream then return chat_stream(self, body, a) end
  local reply, msg, info = post(self, "/v1/chat/completions", body, a.timeout)
  if not reply then return nil, msg, info end
  local out = chat_info(reply)
  local choice = type(reply.choices) == "table" and reply.choices[1]
  if type(choice) ~= "table" or type(choice.message) ~= "table" then
    return nil, "/v1/chat/completions: the reply has no choices[1].message", out
  end
  local content = choice.message.content
  return type(content) == "string" and content or "", out
end

function Client:complete(first, opts)
  local a = argcheck.fields("complete", arguments(first, opts, "prompt"), complete_fields, 2)
  if self.profile == "llamacpp" then
    local body = sampling_body(self, a, { prompt = a.prompt }, "n_predict")
    local reply, msg, info = post(self, "/completion", body, a.timeout)
    if not reply then return nil, msg, info end
    return tostring(reply.content or ""), { prompt_tokens = reply.tokens_evaluated,
      completion_tokens = reply.tokens_predicted, finish_reason = reply.stop_type, response = reply }
  end
  local body = sampling_body(self, a, { prompt = a.prompt, logprobs = a.logprobs }, "max_tokens")
  local reply, msg, info = post(self, "/v1/completions", body, a.timeout)
  if not reply then return nil, msg, info end
  local choice = type(reply.choices) == "table" and reply.choices[1]
  if type(choice) ~= "table" then return nil, "/v1/completions: the reply has no choices[1]", {} end
  local usage = type(reply.usage) == "table" and reply.usage or {}
  return tostring(choice.text or ""), { prompt_tokens = usage.prompt_tokens,
    completion_tokens = usage.completion_tokens, finish_reason = choice.finish_reason, response = reply }
end

-- ---------------------------------------------------------------- generate (token ids)

local generate_fields = { { "prompt_ids", nil, argcheck.list_of(argcheck.integer(0), "a non-empty list of token ids"), required = true } }
for _, f in ipairs(sampling_fields) do generate_fields[#generate_fields + 1] = f end

local LLAMA_STOP = { eos = "stop", word = "stop", limit = "length" }

-- The reply of each profile's endpoint as {token_ids, logprobs, finish_reason, usage}, or nil,
-- what is missing.
local readers = {}

function readers.vllm(r)
  local c = type(r.choices) == "table" and r.choices[1]
  if type(c) ~= "table" or type(c.token_ids) ~= "table" then
    return nil, "no choices[1].token_ids (a vLLM with return_token_ids support is needed)"
  end
  local lp = type(c.logprobs) == "table" and c.logprobs.token_logprobs
  if type(lp) ~= "table" then return nil, "no choices[1].logprobs.token_logprobs" end
  local usage = type(r.usage) == "table" and r.usage or {}
  return c.token_ids, lp, c.finish_reason, usage.prompt_tokens
end

function readers.sglang(r)
  local meta = type(r.meta_info) == "table" and r.meta_info
  if type(r.output_ids) ~= "table" or not meta or type(meta.output_token_logprobs) ~= "table" then
    return nil, "no output_ids and meta_info.output_token_logprobs"
  end
  local lp = {}
  for i, t in ipairs(meta.output_token_logprobs) do lp[i] = type(t) == "table" and t[1] or nil end
  local fr = type(meta.finish_reason) == "table" and meta.finish_reason.type or meta.finish_reason
  return r.output_ids, lp, fr, meta.prompt_tokens
end

function readers.llamacpp(r)
  local probs = r.completion_probabilities
  if type(probs) ~= "table" then return nil, "no completion_probabilities (n_probs)" end
  local ids, lp = {}, {}
  for i, p in ipairs(probs) do ids[i], lp[i] = p.id, p.logprob end
  if type(r.tokens) == "table" and #r.tokens == #ids then ids = r.tokens end
  return ids, lp, LLAMA_STOP[r.stop_type] or r.stop_type, r.tokens_evaluated
end

-- The extra fields that SGLang's /generate takes inside sampling_params, not beside it.
local SGLANG_SAMPLING = {}
for _, k in ipairs{ "stop_token_ids", "ignore_eos", "min_new_tokens", "skip_special_tokens",
                    "spaces_between_special_tokens", "no_stop_trim", "repetition_penalty",
                    "presence_penalty", "frequency_penalty", "n", "json_schema", "regex", "ebnf" } do
  SGLANG_SAMPLING[k] = true
end

local function generate_request(self, a)
  local kind = self.p.generate
  local sampling = { "temperature", "top_p", "top_k", "min_p", "seed", "stop" }
  if kind == "vllm" then
    local body = sampling_body(self, a, { prompt = a.prompt_ids, logprobs = 1, return_token_ids = true },
      "max_tokens")
    return "/v1/completions", body
  elseif kind == "sglang" then
    local sp = { max_new_tokens = a.max_tokens }
    for _, k in ipairs(sampling) do sp[k] = a[k] end
    sp.sampling_seed, sp.seed = a.seed, nil
    local body = { input_ids = a.prompt_ids, sampling_params = sp, return_logprob = true }
    -- SGLang reads its sampling options (stop ids, ignore_eos, ...) inside sampling_params
    for k, v in pairs(a.extra or {}) do
      if SGLANG_SAMPLING[k] then sp[k] = v else body[k] = v end
    end
    return "/generate", body
  else
    local body = { prompt = a.prompt_ids, n_predict = a.max_tokens, n_probs = 1, return_tokens = true }
    for _, k in ipairs(sampling) do body[k] = a[k] end
    for k, v in pairs(a.extra or {}) do body[k] = v end
    return "/completion", body
  end
end

function Client:generate(args)
  local a = argcheck.fields("generate", args, generate_fields, 2)
  if not self.p.generate then
    return nil, string.format("generate: the %s profile has no token-in/token-out endpoint", self.profile), {}
  end
  local path, body = generate_request(self, a)
  local reply, msg, info = post(self, path, body, a.timeout)
  if not reply then return nil, msg, info end
  local ids, lps, finish, prompt_tokens = readers[self.p.generate](reply)
  if not ids then return nil, string.format("generate: %s: %s", path, lps), { response = reply } end
  if #lps ~= #ids then
    return nil, string.format("generate: %s: %d logprobs for %d tokens", path, #lps, #ids), { response = reply }
  end
  local out_ids, out_lps = {}, {}
  for i = 1, #ids do
    if math.type(ids[i]) ~= "integer" or type(lps[i]) ~= "number" then
      return nil, string.format("generate: %s: token %d is not an id with a logprob", path, i), { response = reply }
    end
    out_ids[i], out_lps[i] = ids[i], f32(lps[i])
  end
  return { token_ids = out_ids, logprobs = out_lps, finish_reason = finish,
           usage = { prompt_tokens = prompt_tokens, completion_tokens = #out_ids } }
end

-- ---------------------------------------------------------------- many at once

function Client:batch(requests)
  if not argcheck.is_list(requests) then error("batch: a list of {messages =, opts =} expected", 2) end
  local fns = {}
  for i, r in ipairs(requests) do
    fns[i] = function()
      local ok, text, info, extra = pcall(self.chat, self, r.messages, r.opts)
      if not ok then return nil, "the client raised: " .. tostring(text), {} end
      return text, info, extra
    end
  end
  local res = self.http:run(fns)
  local out = {}
  for i, r in ipairs(res) do out[i] = { r[1], r[2], r[3] } end
  return out
end

-- client:spawn / wait / run: the underlying rl.http client's tasks (many calls in flight).
function Client:spawn(fn, ...) return self.http:spawn(fn, ...) end
function Client:wait(task) return self.http:wait(task) end
function Client:step(seconds) return self.http:step(seconds) end
function Client:tasks_left() return self.http:tasks_left() end
function Client:run(fns) return self.http:run(fns) end
function Client:close() self.http:close() end

return M
