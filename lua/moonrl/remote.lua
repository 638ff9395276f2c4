-- moonrl.remote (rl.remote): rollouts whose turns a remote endpoint generates, token in and token
-- out, into the same trajectory batch the local rollout makes.
--
--   local c = rl.http.openai{base_url = "http://127.0.0.1:8000", profile = "moonrl"}
--   local b = rl.remote.rollout{client = c, tokenizer = tok, env = env, tasks = {...},
--     seeds = {...}, groups = {...}, max_turns = 4, max_turn_tokens = 8, temperature = 1,
--     top_k =, top_p =, min_p =, system =, observation_role = "user", capacity = 128}
--   rl.remote.rollout{clients = {c1, c2, ...}, ...}   -- several endpoints (give one of the two)
--
-- With several clients, each is probed first (GET /health, health_timeout seconds, 5 by
-- default); episodes go to the healthy endpoint with the fewest episodes so far, in order (so
-- the split is even and the same for the same list), and each stays on its endpoint for all its
-- turns (ep.endpoint is its index). An endpoint that fails mid-run fails only its own episodes ("infra"); with no
-- healthy endpoint every episode is infra.
--
-- Each episode is rendered exactly as the engine's rollout renders it (moonrl's own tokenizer
-- and chat template, rollout_run.c): the first observation with the generation prompt, each
-- later one after the end-of-turn token (added when the turn was cut by the token limit) and
-- what the template puts after it. Every turn posts the episode's tokens so far as prompt ids
-- (client:generate) and appends the sampled ids with the behaviour log-probs the endpoint
-- reports; the end-of-turn token is the only stop (ignore_eos, stop_token_ids). The request
-- seed of turn t is mix(episode seed, t), so the same seeds give the same episodes. All
-- episodes are tasks of the client (many requests in flight from one thread).
--
-- An episode whose request failed (after the client's retries) or whose reply does not fit
-- (no tokens, more than asked, ids outside the vocabulary) ends "infra": its error says why,
-- its reward_status is "unscorable" (so the trainer leaves it out of group baselines and reward
-- statistics) and its mask is all 0 (no token of it reaches the loss). Environment failures end
-- "env_error" as in the local rollout.
local core = require "moonrl.core"
local argcheck = require "moonrl.argcheck"
local envlib = require "moonrl.env"
local batchlib = require "moonrl.batch"
local seedlib = require "moonrl.train.seed"

local M = {}

-- The template the engine's rollout uses with this tokenizer (its MRL_CHAT_AUTO choice), its
-- end-of-turn token, the leading token a continuation drops, and what follows an end-of-turn.
function M.template(tok)
  local name, stop
  if tok:vocab_size() == 264 and tok:token_id("<|end|>") == 263 then
    name, stop = "roles", "<|end|>"
  elseif tok:token_id("<|im_start|>") then
    name, stop = "chatml", "<|im_end|>"
  elseif tok:token_id("<|start_header_id|>") then
    name, stop = "llama3", "<|eot_id|>"
  end
  local id = stop and tok:token_id(stop)
  if not id then return nil, "no chat template with an end-of-turn token fits this tokenizer" end
  return { name = name, stop = id, bos = name == "llama3" and tok:token_id("<|begin_of_text|>") or nil,
    sep = name == "chatml" and tok:encode("\n") or {} }
end

local function client_check(v)
  if type(v) == "table" and type(v.generate) == "function" and type(v.spawn) == "function"
    and type(v.wait) == "function" then return nil end
  return "a client with generate, spawn and wait (rl.http.openai{...})"
end
M.client_check = client_check

local function clients_check(v)
  if not argcheck.is_list(v) or #v == 0 then return "a non-empty list of clients (rl.http.openai{...})" end
  for i, c in ipairs(v) do
    local why = client_check(c)
    if not why and (type(c.step) ~= "function" or type(c.tasks_left) ~= "function") then
      why = "a client that can be driven with others (step, tasks_left: rl.http.openai{...})"
    end
    if why then return "[" .. i .. "]: " .. why end
  end
end
M.clients_check = clients_check

local fields = {
  { "client", nil, client_check },
  { "clients", nil, clients_check },
  { "health_timeout", 5, argcheck.positive },
  { "tokenizer", nil, argcheck.instance_of("moonrl.tokenizer", "an rl.tokenizer"), required = true },
  { "env", nil, argcheck.table, required = true },
  { "tasks", nil, argcheck.table, required = true },
  { "seeds", nil, argcheck.table, required = true },
  { "groups", nil, argcheck.table },
  { "max_turns", 8, argcheck.integer(1) },
  { "max_turn_tokens", 64, argcheck.integer(1) },
  { "temperature", 1.0, argcheck.number(0) },
  { "top_k", nil, argcheck.integer(0) },
  { "top_p", nil, argcheck.number(0, 1) },
  { "min_p", nil, argcheck.number(0, 1) },
  { "system", nil, argcheck.string },
  { "observation_role", "user", argcheck.string },
  { "capacity", 256, argcheck.integer(1) },
}

local function append(ep, ids, mask, lps, turn)
  local t = ep.t
  for i, id in ipairs(ids) do
    local n = #t.tokens + 1
    t.tokens[n], t.mask[n], t.logprobs[n], t.turns[n] = id, mask, lps and lps[i] or 0, turn
  end
end

-- The ids an endpoint sent, checked: nil, why when they do not fit.
local function check_reply(g, want, vocab)
  local ids = g.token_ids
  if #ids == 0 then return nil, "the endpoint returned no tokens" end
  if #ids > want then return nil, string.format("the endpoint returned %d tokens, %d asked", #ids, want) end
  for _, id in ipairs(ids) do
    if id < 0 or id >= vocab then return nil, "the endpoint returned token id " .. id .. ", outside the vocabulary" end
  end
  return true
end

local function fail(ep, kind, msg)
  ep["end"], ep.error = kind, msg
end

-- One episode, as a task of the client.
local function run_episode(o, tpl, ep)
  local tok, env = o.tokenizer, o.env
  local instance = env.new()
  if type(instance) ~= "table" then return fail(ep, "env_error", "env.new() did not return a table") end
  ep.instance = instance
  local ok, obs = pcall(instance.reset, instance, ep.task, core.rng(ep.seed))
  if not ok or type(obs) ~= "string" then
    return fail(ep, "env_error", "reset: " .. (ok and "reset returned " .. type(obs) .. ", not an observation string" or tostring(obs)))
  end
  local msgs = {}
  if o.system then msgs[1] = { role = "system", content = o.system } end
  msgs[#msgs + 1] = { role = "user", content = obs }
  local ids = tok:chat(msgs, { template = tpl.name, add_generation_prompt = true })
  if #ids >= o.capacity then return fail(ep, "budget") end -- no room for a sampled token (as the engine)
  append(ep, ids, 0, nil, -1)
  local toks, vocab = ep.t.tokens, tok:vocab_size()
  while true do
    local turn = ep.turns + 1
    ep.turns = turn
    ep.rewards[turn] = 0 -- a failed turn earns nothing
    local want = math.min(o.max_turn_tokens, o.capacity - #toks)
    local g, err = ep.client:generate { prompt_ids = table.move(toks, 1, #toks, 1, {}), max_tokens = want,
      temperature = o.temperature, top_k = o.top_k, top_p = o.top_p, min_p = o.min_p,
      seed = seedlib.mix(ep.seed, turn), extra = { ignore_eos = true, stop_token_ids = { tpl.stop } } }
    local fits, why = true, nil
    if g then fits, why = check_reply(g, want, vocab) end
    if not g or not fits then return fail(ep, "infra", "turn " .. turn .. ": " .. tostring(g and why or err)) end
    local out = g.token_ids
    append(ep, out, 1, g.logprobs, turn - 1)
    local stopped = out[#out] == tpl.stop
    local action = tok:decode(table.move(out, 1, #out - (stopped and 1 or 0), 1, {}))
    local sok, sobs, reward, done = pcall(envlib.step, env, instance, action, ep.record)
    if not sok then return fail(ep, "env_error", "step: " .. tostring(sobs)) end
    ep.rewards[turn] = reward
    if done then return fail(ep, "done") end
    if turn >= o.max_turns then return fail(ep, "max_turns") end
    if #toks >= o.capacity and not stopped and sobs ~= nil then return fail(ep, "budget") end
    if sobs == nil then return fail(ep, "env_error", "step: no observation for a continuing episode") end
    local next_ids = tok:chat({ { role = o.observation_role, content = sobs } },
      { template = tpl.name, add_generation_prompt = true })
    if tpl.bos and next_ids[1] == tpl.bos then table.remove(next_ids, 1) end
    local pre = {}
    if not stopped then pre[1] = tpl.stop end
    for _, id in ipairs(tpl.sep) do pre[#pre + 1] = id end
    if #toks + #pre + #next_ids >= o.capacity then return fail(ep, "budget") end
    append(ep, pre, 0, nil, turn - 1)
    append(ep, next_ids, 0, nil, turn - 1)
  end
end

local function flat(list)
  if #list == 0 then return core.tensor.zeros(1):narrow(1, 1, 0) end
  return core.tensor.from(list)
end

-- Which of the clients answer GET /health with 200 (a lone client is not probed: its failures
-- show in its episodes).
function M.healthy(clients, timeout)
  local ok = {}
  for i, c in ipairs(clients) do
    if #clients == 1 then
      ok[i] = true
    else
      local http = c.http or c
      local status = type(http.request) == "function" and
        http:request { path = "/health", timeout = timeout } or nil
      ok[i] = status == 200
    end
  end
  return ok
end

-- Drives the clients until none has a task left (each client's own requests; several clients
-- take turns, none waiting long on its own while another has news).
function M.drive(clients)
  if #clients == 1 then return clients[1]:wait() end
  while true do
    local busy = 0
    for _, c in ipairs(clients) do
      if c:tasks_left() > 0 then busy = busy + 1 end
    end
    if busy == 0 then return end
    for _, c in ipairs(clients) do
      if c:tasks_left() > 0 then c:step(busy > 1 and 0.002 or 0.05) end
    end
  end
end

-- rl.remote.rollout{...} -> a batch (see the top; groups default to 1, 2, ...). Misuse raises;
-- endpoint failures end their episodes "infra".
function M.rollout(opts)
  local o = argcheck.fields("rl.remote.rollout", opts, fields, 2)
  local n = #o.tasks
  if n < 1 then argcheck.fail("rl.remote.rollout", "tasks: a non-empty list expected", 2) end
  if #o.seeds ~= n then argcheck.fail("rl.remote.rollout", "seeds: a list as long as tasks expected", 2) end
  if o.groups and #o.groups ~= n then argcheck.fail("rl.remote.rollout", "groups: a list as long as tasks expected", 2) end
  for i = 1, n do
    if math.type(o.seeds[i]) ~= "integer" then
      argcheck.fail("rl.remote.rollout", "seeds[" .. i .. "]: an integer expected", 2)
    end
  end
  if type(o.env.new) ~= "function" then argcheck.fail("rl.remote.rollout", "env: the module has no new() function", 2) end
  if (o.client == nil) == (o.clients == nil) then
    argcheck.fail("rl.remote.rollout", "give one of client and clients", 2)
  end
  local tpl, terr = M.template(o.tokenizer)
  if not tpl then argcheck.fail("rl.remote.rollout", terr, 2) end
  local clients = o.clients or { o.client }
  local healthy = M.healthy(clients, o.health_timeout)
  local load = {}
  for i = 1, #clients do load[i] = 0 end
  local eps, tasks = {}, {}
  for i = 1, n do
    local ep = { task = o.tasks[i], seed = o.seeds[i], group = o.groups and o.groups[i] or i,
      record = {}, rewards = {}, turns = 0, t = { tokens = {}, mask = {}, logprobs = {}, turns = {} } }
    eps[i] = ep
    -- the healthy endpoint with the fewest episodes so far; the episode stays on it
    local at
    for k = 1, #clients do
      if healthy[k] and (not at or load[k] < load[at]) then at = k end
    end
    if not at then
      fail(ep, "infra", "no healthy endpoint (" .. #clients .. " probed at /health)")
    else
      load[at] = load[at] + 1
      ep.endpoint, ep.client = at, clients[at]
      tasks[#tasks + 1] = ep.client:spawn(run_episode, o, tpl, ep)
    end
  end
  M.drive(clients)
  for _, t in ipairs(tasks) do
    if t.error then error(t.error, 0) end
  end
  local tokens, logprobs, mask, turns, offsets = {}, {}, {}, {}, { 0 }
  for i, ep in ipairs(eps) do
    local t, infra = ep.t, ep["end"] == "infra"
    for k = 1, #t.tokens do
      local at = #tokens + 1
      tokens[at], logprobs[at], turns[at] = t.tokens[k], t.logprobs[k], t.turns[k]
      mask[at] = infra and 0 or t.mask[k]
    end
    offsets[i + 1] = #tokens
    if ep["end"] ~= "infra" then batchlib.set_env_info(ep, ep.instance) end
    ep.length, ep.t, ep.instance, ep.client = #t.tokens, nil, nil, nil
    if not o.clients then ep.endpoint = nil end
    local sum = 0
    for _, r in ipairs(ep.rewards) do sum = sum + r end
    ep.reward = sum
    if infra then
      ep.reward_status, ep.infra, ep.success = "unscorable", true, false
    end
  end
  return batchlib.new { tokens = flat(tokens), logprobs = flat(logprobs), mask = flat(mask),
    turns = flat(turns), offsets = offsets, episodes = eps }
end

return M
