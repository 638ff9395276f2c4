-- moonrl.batch: a trajectory batch, what rollouts produce and the trainer consumes.
--
-- The token data are flat engine tensors (no copy into Lua tables): episode i owns the positions
-- offsets[i] .. offsets[i + 1] - 1 (0-based; offsets[1] = 0) of
--   tokens    token ids (as floats)
--   logprobs  the behaviour policy's log-probability of each sampled token (0 elsewhere)
--   mask      1 exactly on the tokens the policy sampled (its actions), 0 on prompts and
--             observations
--   turns     the 0-based turn each token belongs to
-- and batch.episodes[i] holds the rest:
--   group, agent          prompt-group id (episodes of one task) and agent id
--   task, seed            what the episode was given
--   ["end"]               termination: "done", "max_turns", "budget" (token budget or
--                         context full), "env_error" (the environment or a tool failed),
--                         "infra" (a remote endpoint failed: rl.remote)
--   turns, length         turn count, token count
--   rewards, reward       per-turn rewards and their sum (the episode's return)
--   success               info.success of the last turn (else reward > 0)
--   record                per turn {action, parsed, observation, reward, done, info, state,
--                         tool_error}
--   costs                 the episode's cost totals per currency (rl.envkit): the sum, in turn
--                         order, of each turn's info.costs; nil when no turn was charged
--   env_info              what the instance's optional episode_info() returned once the episode
--                         ended (a persona, the planned noise, ...)
--   branch                {root =, index =} for episodes of a tree rollout
--   error                 the message when the episode ended in an error
-- and, once a reward graph (rl.reward) scored it: reward (its total), rewards (its dense terms
-- per turn), reward_terms, reward_status ("ok" | "unscorable"), reward_version, reward_detail
local core = require "moonrl.core"

local M = {}
local Batch = {}
Batch.__index = Batch

local END_NAMES = { "done", "max_turns", "budget", "env_error", "infra" }
M.ends = END_NAMES

-- Whether a turn record is a tool call: parsed as one, or marked by the environment
-- (info.tool_call = true, for actions it parses itself, as "exam xray"). The tool-call rate and
-- rl.reward.budget's tool_calls count these.
function M.is_tool_call(r)
  return (type(r.parsed) == "table" and r.parsed.kind == "call")
    or (type(r.info) == "table" and r.info.tool_call == true)
end

-- The cost totals of a turn list: each currency's info.costs summed in turn order; nil when no
-- turn has costs.
function M.cost_totals(record)
  local totals
  for _, r in ipairs(record or {}) do
    local c = type(r.info) == "table" and r.info.costs
    if type(c) == "table" then
      totals = totals or {}
      local names = {}
      for name in pairs(c) do names[#names + 1] = name end
      table.sort(names) -- (each currency's sum has one order: the turns')
      for _, name in ipairs(names) do totals[name] = (totals[name] or 0) + c[name] end
    end
  end
  return totals
end

-- The instance's episode_info() (an optional method: per-episode facts an environment logs,
-- such as its persona or planned noise), or nil; nil and a message when it raised or returned
-- something that is not a table.
function M.env_info(instance)
  if type(instance) ~= "table" or type(instance.episode_info) ~= "function" then return nil end
  local ok, info = pcall(instance.episode_info, instance)
  if not ok then return nil, "episode_info() failed: " .. tostring(info) end
  if info ~= nil and type(info) ~= "table" then
    return nil, "episode_info() returned a " .. type(info) .. ", not a table"
  end
  return info
end

-- Sets ep.env_info from the instance; a failing episode_info() is an environment error, as a
-- failing step is (end "env_error", the message in ep.error unless it has one).
function M.set_env_info(ep, instance)
  local info, err = M.env_info(instance)
  ep.env_info = info
  if err then
    ep["end"] = "env_error"
    ep.error = ep.error or err
  end
end

local function success_of(ep)
  local last = ep.record and ep.record[#ep.record]
  if last and type(last.info) == "table" and last.info.success ~= nil then
    return last.info.success and true or false
  end
  return (ep.reward or 0) > 0
end

-- rl.batch.new{tokens=, logprobs=, mask=, turns=, offsets=, episodes=}: checks the layout. An
-- episode table needs reward and group; length (from offsets), turns (#record), end ("done"),
-- agent (1), success and costs (M.cost_totals) are filled in when missing (batches made by hand
-- or imported).
function M.new(t)
  assert(type(t) == "table", "batch: a table expected")
  local n = #t.episodes
  assert(#t.offsets == n + 1, "batch: offsets must have one entry more than episodes")
  for _, k in ipairs { "tokens", "logprobs", "mask", "turns" } do
    assert(core.tensor.is_tensor(t[k]), "batch: " .. k .. " must be a tensor")
    assert(t[k]:numel() == t.offsets[n + 1], "batch: " .. k .. " does not match offsets")
  end
  for i, ep in ipairs(t.episodes) do
    ep.agent = ep.agent or 1
    if ep.success == nil then ep.success = success_of(ep) end
    ep.length = ep.length or (t.offsets[i + 1] - t.offsets[i])
    ep.turns = ep.turns or (ep.record and #ep.record or 0)
    ep["end"] = ep["end"] or "done"
    if ep.costs == nil then ep.costs = M.cost_totals(ep.record) end
  end
  return setmetatable(t, Batch)
end

-- A batch from rollout results (ro:run's list) and the rollout's tensors; groups: the prompt
-- group of each episode. A run with hooks lists only the episodes it kept: results.slots holds
-- their episode numbers in the rollout.
function M.from_rollout(ro, results, groups)
  local t = ro:tensors(results.slots or #results)
  local eps = {}
  for i, r in ipairs(results) do
    local ep = {}
    for k, v in pairs(r) do ep[k] = v end
    M.set_env_info(ep, r.instance)
    ep.instance = nil
    ep.reward = r.return_
    ep.return_ = nil
    ep.group = groups[i]
    eps[i] = ep
  end
  t.episodes = eps
  return M.new(t)
end

function Batch:size() return #self.episodes end

-- The token positions (1-based, for tensor:get) of episode i.
function Batch:range(i) return self.offsets[i] + 1, self.offsets[i + 1] end

-- Number of sampled tokens of each episode.
function Batch:sampled_counts()
  local counts, mask, off = {}, self.mask, self.offsets
  for i = 1, #self.episodes do
    local len = off[i + 1] - off[i]
    counts[i] = len > 0 and math.floor(mask:narrow(1, off[i] + 1, len):sum() + 0.5) or 0
  end
  return counts
end

-- Groups in order of first appearance: list of {id =, members = {episode numbers}}.
function Batch:groups()
  local list, index = {}, {}
  for i, ep in ipairs(self.episodes) do
    local g = index[ep.group]
    if not g then
      g = { id = ep.group, members = {} }
      index[ep.group] = g
      list[#list + 1] = g
    end
    g.members[#g.members + 1] = i
  end
  return list
end

local function scorable(ep) return ep.reward_status ~= "unscorable" end

-- batch:stats() -> {episodes, groups, reward_mean, reward_std, success, length_mean,
-- sampled_tokens, tokens, turns_mean, turns_max, tool_calls_per_turn (M.is_tool_call turns /
-- all turns), zero_variance_groups (fraction), ends = {name = count}, errors, unscorable}. The
-- reward figures leave out episodes a reward graph could not score (unscorable, infra). A group
-- of two or more episodes is zero-variance when its scorable episodes all got one reward (one
-- scorable episode left is too: it has nothing to be compared with); a group with no scorable
-- episode is left out of the fraction, and a group of one is never zero-variance.
function Batch:stats()
  local n = #self.episodes
  local s = { episodes = n, ends = {}, errors = 0, tokens = self.offsets[n + 1], unscorable = 0 }
  for _, name in ipairs(END_NAMES) do s.ends[name] = 0 end
  local sum, sq, succ, len, turns, scored, tmax, calls, records = 0, 0, 0, 0, 0, 0, 0, 0, 0
  for _, ep in ipairs(self.episodes) do
    if scorable(ep) then
      sum, sq, scored = sum + ep.reward, sq + ep.reward * ep.reward, scored + 1
    else
      s.unscorable = s.unscorable + 1
    end
    succ = succ + (ep.success and 1 or 0)
    len, turns = len + ep.length, turns + ep.turns
    tmax = math.max(tmax, ep.turns)
    for _, r in ipairs(ep.record or {}) do
      records = records + 1
      if M.is_tool_call(r) then calls = calls + 1 end
    end
    s.ends[ep["end"]] = (s.ends[ep["end"]] or 0) + 1
    if ep.error then s.errors = s.errors + 1 end
  end
  local mean = scored > 0 and sum / scored or 0
  s.reward_mean = mean
  s.reward_std = scored > 1 and math.sqrt(math.max(sq / scored - mean * mean, 0)) or 0
  s.success = n > 0 and succ / n or 0
  s.length_mean = n > 0 and len / n or 0
  s.turns_mean = n > 0 and turns / n or 0
  s.turns_max = tmax
  s.tool_calls_per_turn = records > 0 and calls / records or 0
  s.sampled_tokens = n > 0 and self.mask:sum() or 0
  local groups, flat, counted = self:groups(), 0, 0
  for _, g in ipairs(groups) do
    local first, same, count = nil, true, 0
    for _, i in ipairs(g.members) do
      local ep = self.episodes[i]
      if scorable(ep) then
        count = count + 1
        if first == nil then first = ep.reward else same = same and ep.reward == first end
      end
    end
    if count > 0 then
      counted = counted + 1
      if same and #g.members > 1 then flat = flat + 1 end
    end
  end
  s.groups = #groups
  s.zero_variance_groups = counted > 0 and flat / counted or 0
  return s
end

-- A new batch of the episodes parts lists as {batch, episode number} pairs (copies the tokens).
local function gather(parts)
  local total = 0
  for _, p in ipairs(parts) do total = total + p[1].offsets[p[2] + 1] - p[1].offsets[p[2]] end
  local out = { offsets = { 0 }, episodes = {} }
  for _, k in ipairs { "tokens", "logprobs", "mask", "turns" } do
    out[k] = core.tensor.zeros(math.max(total, 1)):narrow(1, 1, total)
  end
  local at = 0
  for j, p in ipairs(parts) do
    local b, i = p[1], p[2]
    local a, len = b.offsets[i], b.offsets[i + 1] - b.offsets[i]
    for _, k in ipairs { "tokens", "logprobs", "mask", "turns" } do
      out[k]:narrow(1, at + 1, len):copy(b[k]:narrow(1, a + 1, len))
    end
    at = at + len
    out.offsets[j + 1] = at
    out.episodes[j] = b.episodes[i]
  end
  return M.new(out)
end

-- batch:select{i, j, ...} -> a new batch holding the listed episodes.
function Batch:select(list)
  local parts = {}
  for j, i in ipairs(list) do parts[j] = { self, i } end
  return gather(parts)
end

-- batch:sft_examples([keep]) -> {{tokens =, mask =}, ...}: the episodes (those for which
-- keep(episode, i) is true, or all) as rl.sft examples, their tokens as sampled (0-based integer
-- ids) and mask 1 exactly on the sampled tokens; e.g. SFT on a policy's own successful rollouts.
function Batch:sft_examples(keep)
  if keep ~= nil and type(keep) ~= "function" then
    error("sft_examples: keep: a function(episode, i) expected, got " .. type(keep), 2)
  end
  local out = {}
  for i, ep in ipairs(self.episodes) do
    if keep == nil or keep(ep, i) then
      local tokens, mask = {}, {}
      for p = self.offsets[i] + 1, self.offsets[i + 1] do
        tokens[#tokens + 1] = math.floor(self.tokens:get(p))
        mask[#mask + 1] = self.mask:get(p) ~= 0 and 1 or 0
      end
      out[#out + 1] = { tokens = tokens, mask = mask }
    end
  end
  return out
end

-- rl.batch.concat{b1, b2, ...} -> one batch with every episode, in order.
function M.concat(batches)
  local parts = {}
  for _, b in ipairs(batches) do
    for i = 1, b:size() do parts[#parts + 1] = { b, i } end
  end
  return gather(parts)
end

local function values(t, a, b, integer)
  local out = {}
  for p = a, b do
    local v = t:get(p)
    out[#out + 1] = integer and math.floor(v) or v
  end
  return core.json.array(out)
end

-- The episode's turns as plain data (no instances; of the parse, its kind and a call's name).
local function turn_records(ep)
  local out = {}
  for k, r in ipairs(ep.record or {}) do
    local parsed = type(r.parsed) == "table" and { kind = r.parsed.kind, name = r.parsed.name } or nil
    out[k] = { action = r.action, observation = r.observation, reward = r.reward, done = r.done,
      info = type(r.info) == "table" and r.info or nil, state = r.state, parsed = parsed,
      tool_error = r.tool_error, tool_cpu_ms = r.tool_cpu_ms }
  end
  return core.json.array(out)
end

-- One episode as a JSON-ready table; with tokens = false, without the token arrays (readable
-- logs).
function Batch:episode_record(i, opts)
  local ep = self.episodes[i]
  local rec = { group = ep.group, agent = ep.agent, task = ep.task, seed = ep.seed,
    ["end"] = ep["end"], turns = ep.turns, length = ep.length, reward = ep.reward,
    rewards = core.json.array(ep.rewards or {}), success = ep.success, error = ep.error,
    branch = ep.branch, record = turn_records(ep), reward_terms = ep.reward_terms,
    reward_status = ep.reward_status, reward_version = ep.reward_version, costs = ep.costs,
    env_info = ep.env_info }
  if not (opts and opts.tokens == false) then
    local a, b = self:range(i)
    rec.tokens = values(self.tokens, a, b, true)
    rec.logprobs = values(self.logprobs, a, b)
    rec.mask = values(self.mask, a, b, true)
    rec.turn_index = values(self.turns, a, b, true)
  end
  return rec
end

-- batch:to_jsonl(path [, opts]) -> true | nil, message: one JSON object per episode, with its
-- token arrays (so rl.batch.load restores the batch) unless opts.tokens is false. The message
-- names the file when it cannot be opened, written or closed (a full disk shows at close).
function Batch:to_jsonl(path, opts)
  if type(path) ~= "string" then error("to_jsonl: path: a string expected, got " .. type(path), 2) end
  local lines = {}
  for i = 1, #self.episodes do lines[i] = core.json.encode(self:episode_record(i, opts)) end
  local f, err = io.open(path, "w")
  if not f then return nil, err end
  local ok, werr = f:write(table.concat(lines, "\n"), #lines > 0 and "\n" or "")
  local closed, cerr = f:close()
  if not ok or not closed then return nil, path .. ": " .. tostring(werr or cerr) end
  return true
end

-- rl.batch.load(path) -> batch | nil, message: the batch a to_jsonl file holds.
function M.load(path)
  local f, err = io.open(path, "r")
  if not f then return nil, err end
  local eps, arrays, lineno = {}, { tokens = {}, logprobs = {}, mask = {}, turns = {} }, 0
  local offsets = { 0 }
  for line in f:lines() do
    lineno = lineno + 1
    if line:match("%S") then
      local rec, perr = core.json.decode(line)
      if type(rec) ~= "table" then
        f:close()
        return nil, string.format("%s:%d: %s", path, lineno, perr or "not a JSON object")
      end
      if type(rec.tokens) ~= "table" or type(rec.mask) ~= "table" or type(rec.logprobs) ~= "table"
          or type(rec.turn_index) ~= "table" or #rec.mask ~= #rec.tokens
          or #rec.logprobs ~= #rec.tokens or #rec.turn_index ~= #rec.tokens then
        f:close()
        return nil, string.format("%s:%d: the episode has no token arrays of one length "
          .. "(written with tokens = false?)", path, lineno)
      end
      for k, src in pairs { tokens = rec.tokens, logprobs = rec.logprobs, mask = rec.mask,
        turns = rec.turn_index } do
        local dst = arrays[k]
        for _, v in ipairs(src) do dst[#dst + 1] = v end
      end
      offsets[#offsets + 1] = #arrays.tokens
      local ep = { group = rec.group, agent = rec.agent, task = rec.task, seed = rec.seed,
        ["end"] = rec["end"], turns = rec.turns, length = rec.length, reward = rec.reward,
        rewards = rec.rewards, success = rec.success, error = rec.error, record = rec.record,
        branch = rec.branch, reward_terms = rec.reward_terms, reward_status = rec.reward_status,
        reward_version = rec.reward_version, costs = rec.costs, env_info = rec.env_info }
      eps[#eps + 1] = ep
    end
  end
  f:close()
  local t = { offsets = offsets, episodes = eps }
  for k, list in pairs(arrays) do
    t[k] = #list > 0 and core.tensor.from(list) or core.tensor.zeros(1):narrow(1, 1, 0)
  end
  return M.new(t)
end

M.Batch = Batch
return M
