-- moonrl.replay: a replay buffer of trajectory episodes (rl.replay), aware of rewards and
-- staleness: priority x age decay (Freshness-Aware PER), staleness revisits (PLR), re-scoring
-- under the current reward version, and eviction of episodes the policy has moved too far from.
--
--   local buf = rl.replay.new{ capacity = 4096, priority = "abs_adv", alpha = 0.6,
--     age_decay = 500, staleness = 0.1, min_fill = 64, max_ratio = 5, rescore = g, seed = 1 }
--   buf:add(batch, step)            -- the batch's episodes (tokens, behaviour log-probs, masks,
--                                   -- batch.advantages when there are); every group is kept
--   local b = buf:sample(n, step, { logprobs = function(b) return policy_logprobs end })
--   -- b: an rl.batch of up to n entries with b.keys, b.priorities, b.weights (importance
--   -- weights), b.ratios and b.token_weights (with logprobs), b.advantages (when stored), ...
--   buf:update(b.keys, new_priorities)
--   buf:stats(), buf:state(), buf:load(state)
--
-- Delayed rewards (FutureWorld's backfill): episodes whose reward is not known when they are
-- rolled out wait in the buffer as pending entries, out of every draw, until it arrives:
--   buf:add_pending(batch, step, keys)  -- keys[i]: episode i's pending key (a string or an
--                                       -- integer; one key may name many episodes: an event)
--   buf:pending()                       -- {{key =, step =, episodes =, task =}, ...}
--   buf:backfill(key, reward [, step])  -- reward: a number or function(episode) -> number;
--                                       -- true, or nil and a message (unknown or closed key)
--   buf:discard(key [, step])           -- the key's episodes dropped; true | nil, message
--   buf:sample(n, step, { logprobs = f, resolved = true })  -- every entry that became drawable
--                                       -- since the last such call first, then n draws
-- A backfilled reward is added to the episode's last turn (ep.rewards, ep.record) and to
-- ep.reward (ep.backfilled, ep.resolved_step record it); an entry becomes drawable (with the
-- age of its rollout step) once none of its episodes waits, its priority then taken under the
-- buffer's rule ("abs_adv", which needs advantages, starts at the largest stored priority, as
-- PER gives new transitions). Pending entries do not count towards capacity or size.
--
-- An entry is a whole group of episodes (unit = "group", the default: group estimators see
-- every member again) or one episode (unit = "episode"). Its sampling weight is
--   w = max(priority, 1e-6)^alpha * exp(-age / age_decay),      age = step - the step it was added
-- (the decay after alpha, so a weight halves every age_decay * ln 2 steps); a draw takes, with
-- probability `staleness`, the entry used least recently instead (ties: the oldest), and
-- otherwise an entry in proportion to w; one call draws distinct entries. The arithmetic is in C
-- (moonrl.core.replay, engine/src/objective/replay.c). Everything is deterministic from `seed`:
-- the k-th call to sample draws from rl.rng(mix(seed, k)).
local core = require "moonrl.core"
local batchlib = require "moonrl.batch"
local argcheck = require "moonrl.argcheck"
local seedlib = require "moonrl.train.seed"

local json, creplay = core.json, core.replay
local mix = seedlib.mix

local M = {}
local Buffer = {}
Buffer.__index = Buffer
M.Buffer = Buffer

local FLOOR = 1e-6 -- priorities are floored here (FA-PER's update path) before alpha
local PRIORITIES = { "abs_adv", "sigma", "reward" }

local function positive_or_false(what)
  return function(v)
    if v == false or (type(v) == "number" and v > 0 and v == v) then return nil end
    return what
  end
end

local function rescorer(v)
  local ok = (type(v) == "table" or type(v) == "userdata") and pcall(function()
    return type(v.rescore) == "function"
  end)
  if ok and type(v.rescore) == "function" then return nil end
  return "a reward graph (an object with g:rescore(batch) and g.version)"
end

local function beta_check(v)
  if type(v) == "number" and v >= 0 and v < math.huge then return nil end
  if type(v) == "table" then
    for k in pairs(v) do
      if k ~= "start" and k ~= "stop" and k ~= "steps" then return "{start =, stop =, steps =}" end
    end
    if type(v.start) == "number" and type(v.stop) == "number" and math.type(v.steps) == "integer"
        and v.steps >= 1 then
      return nil
    end
  end
  return "a non-negative number or {start =, stop =, steps =} (annealed linearly)"
end

local FIELDS = {
  { "capacity", nil, argcheck.integer(1), required = true },
  { "priority", "abs_adv", argcheck.either(argcheck.one_of(PRIORITIES),
    argcheck.kind("function", "a function(ep, info) -> number")) },
  { "alpha", 0.6, argcheck.number(0) },
  { "beta", 0.4, beta_check },
  { "age_decay", 500, positive_or_false("a positive number (steps) or false (no decay)") },
  { "staleness", 0.1, argcheck.number(0, 1) },
  { "min_fill", 1, argcheck.integer(0) },
  { "max_ratio", 5, function(v)
    if v == false or (type(v) == "number" and v > 1 and v == v) then return nil end
    return "a number > 1 or false (no eviction by ratio)"
  end },
  { "rescore", nil, rescorer },
  { "unit", "group", argcheck.one_of { "group", "episode" } },
  { "seed", 0, argcheck.integer() },
}

-- rl.replay.new{...}: see the top of this file.
function M.new(opts)
  local o = argcheck.fields("rl.replay.new", opts, FIELDS, 2)
  local buf = setmetatable({ cfg = o }, Buffer)
  buf:clear()
  return buf
end

-- Empties the buffer (its options and seed stay; the counters restart).
function Buffer:clear()
  self.entries = {}   -- drawable entries, in the order they became drawable (added, resolved)
  self.by_key = {}    -- episode key -> {entry =, record =} (drawable entries' episodes)
  self.size = 0       -- episodes in drawable entries
  self.next_key = 1
  self.draws = 0      -- sample calls so far (the k of the k-th call's stream)
  self.now = 0        -- the latest step seen
  self.held = {}      -- entries with a pending episode, in the order they were added
  self.waiting = {}   -- pending key -> episodes waiting under it
  self.closed = {}    -- pending key -> {how = "resolved" | "discarded", step =}
  self.counts = { added = 0, evicted_capacity = 0, evicted_ratio = 0, sampled = 0,
    stale_picks = 0, rescored = 0, held = 0, resolved = 0, discarded = 0 }
end

-- ---------------------------------------------------------------- episodes as plain data

-- A JSON-ready deep copy of v: functions, userdata and threads dropped; nested tables copied.
local function plain(v, depth)
  local t = type(v)
  if t == "table" then
    if depth > 32 then return nil end
    local out = {}
    for k, x in pairs(v) do
      if type(k) == "string" or math.type(k) == "integer" then out[k] = plain(x, depth + 1) end
    end
    return out
  elseif t == "number" or t == "string" or t == "boolean" then
    return v
  end
  return nil
end

-- The episode as the buffer keeps it: what JSON holds (so that a buffer restored from state()
-- in another process holds exactly the same), without what only the rollout needs.
local function stored_episode(ep)
  local copy = {}
  for k, v in pairs(ep) do
    if k ~= "instance" and k ~= "fatal_turn" then copy[k] = plain(v, 0) end
  end
  return json.decode(json.encode(copy))
end

-- The values of a one-dimensional tensor as a JSON array.
local function array_of(t) return json.array(t:numel() > 0 and t:totable() or {}) end

local function tensor_of(list)
  if #list == 0 then return core.tensor.zeros(1):narrow(1, 1, 0) end
  return core.tensor.from(list)
end

-- One stored episode record: {key =, priority =, batch = a one-episode rl.batch, adv = tensor}.
local function record_from(batch, i, key, priority)
  local one = batch:select { i }
  one.episodes[1] = stored_episode(batch.episodes[i])
  local rec = { key = key, priority = priority, batch = one }
  if batch.advantages then
    local a, b = batch:range(i)
    rec.adv = batch.advantages:narrow(1, a, b - a + 1):clone()
  end
  return rec
end

-- ---------------------------------------------------------------- priorities

local function check_batch(batch, where)
  if type(batch) ~= "table" or type(batch.episodes) ~= "table" or type(batch.offsets) ~= "table"
      or not core.tensor.is_tensor(batch.mask) then
    error(where .. ": batch: an rl.batch expected, got " .. argcheck.describe(batch), 3)
  end
  local total = batch.offsets[#batch.episodes + 1]
  if batch.advantages ~= nil and (not core.tensor.is_tensor(batch.advantages)
      or batch.advantages:numel() ~= total) then
    error(string.format("%s: batch.advantages: per-token advantages expected (a tensor of %d "
      .. "values, like batch.mask)", where, total), 3)
  end
end

-- Mean |advantage| over each episode's sampled tokens (batch.advantages), else |ep.advantage|.
local function abs_advantages(batch)
  local out, adv, mask = {}, batch.advantages, batch.mask
  for i, ep in ipairs(batch.episodes) do
    if adv then
      local sum, count = 0, 0
      for p = batch.offsets[i] + 1, batch.offsets[i + 1] do
        if mask:get(p) ~= 0 then sum, count = sum + math.abs(adv:get(p)), count + 1 end
      end
      out[i] = count > 0 and sum / count or 0
    elseif type(ep.advantage) == "number" then
      out[i] = math.abs(ep.advantage)
    end
  end
  return out
end

-- The population standard deviation of the rewards of each episode's group in the batch.
local function group_sigmas(batch)
  local out = {}
  for _, g in ipairs(batch:groups()) do
    local sum, sq, n = 0, 0, #g.members
    for _, i in ipairs(g.members) do
      local r = batch.episodes[i].reward
      sum, sq = sum + r, sq + r * r
    end
    local mean = sum / n
    local sd = math.sqrt(math.max(sq / n - mean * mean, 0))
    for _, i in ipairs(g.members) do out[i] = sd end
  end
  return out
end

-- buf:priorities(batch) -> one priority per episode under the buffer's rule: "abs_adv" the mean
-- |advantage| over its sampled tokens (batch.advantages, else |ep.advantage|), "sigma" the
-- standard deviation of its group's rewards, "reward" |ep.reward|, or fn(ep, info) with info =
-- {batch =, index =, abs_adv =, sigma =}.
function Buffer:priorities(batch)
  check_batch(batch, "replay: priorities")
  local rule = self.cfg.priority
  local abs = (rule == "abs_adv" or type(rule) == "function") and abs_advantages(batch) or {}
  local sig = (rule == "sigma" or type(rule) == "function") and group_sigmas(batch) or {}
  local out = {}
  for i, ep in ipairs(batch.episodes) do
    local p
    if rule == "abs_adv" then
      p = abs[i]
      if p == nil then
        error("replay: priority \"abs_adv\" needs batch.advantages (per-token advantages, a "
          .. "tensor like batch.mask) or ep.advantage", 3)
      end
    elseif rule == "sigma" then
      p = sig[i]
    elseif rule == "reward" then
      p = math.abs(ep.reward)
    else
      p = rule(ep, { batch = batch, index = i, abs_adv = abs[i], sigma = sig[i] })
    end
    if type(p) ~= "number" or p ~= p or p < 0 or p == math.huge then
      error(string.format("replay: priority of episode %d: a non-negative finite number "
        .. "expected, got %s", i, argcheck.describe(p)), 3)
    end
    out[i] = p
  end
  return out
end

-- The entry's priority: the mean of its episodes'.
local function entry_priority(entry)
  local sum = 0
  for _, r in ipairs(entry.records) do sum = sum + r.priority end
  return sum / #entry.records
end

-- The sampling weight at step of every entry of list (default: every drawable entry) (C:
-- moonrl.core.replay.weights).
function Buffer:_weights(step, list)
  local pr, age = {}, {}
  for i, e in ipairs(list or self.entries) do pr[i], age[i] = entry_priority(e), step - e.step end
  if #pr == 0 then return {} end
  local decay = self.cfg.age_decay or math.huge
  return creplay.weights { priority = pr, age = age, alpha = self.cfg.alpha, decay = decay,
    floor = FLOOR }
end

-- buf:weights(step) -> {key = weight} of every entry (keyed by the entry's first episode key);
-- for inspection and tests.
function Buffer:weights(step)
  if math.type(step) ~= "integer" then error("replay: weights: step: an integer expected", 2) end
  local out = {}
  for i, w in ipairs(self:_weights(step)) do out[self.entries[i].records[1].key] = w end
  return out
end

-- ---------------------------------------------------------------- add and evict

local function remove_entries(self, doomed)
  local keep = {}
  for _, e in ipairs(self.entries) do
    if doomed[e] then
      for _, r in ipairs(e.records) do self.by_key[r.key] = nil end
      self.size = self.size - #e.records
    else
      keep[#keep + 1] = e
    end
  end
  self.entries = keep
end

-- Evicts the entries of lowest weight at step (ties: the oldest) until the buffer fits; entries
-- resolved but not yet taken by sample{resolved = true} go last.
local function fit(self, step)
  if self.size <= self.cfg.capacity then return end
  local w = self:_weights(step)
  local order = {}
  for i = 1, #self.entries do order[i] = i end
  table.sort(order, function(a, b)
    local fa, fb = self.entries[a].fresh == true, self.entries[b].fresh == true
    if fa ~= fb then return fb end
    if w[a] ~= w[b] then return w[a] < w[b] end
    return self.entries[a].records[1].key < self.entries[b].records[1].key
  end)
  local doomed, size = {}, self.size
  for _, i in ipairs(order) do
    if size <= self.cfg.capacity then break end
    local e = self.entries[i]
    doomed[e] = true
    size = size - #e.records
    self.counts.evicted_capacity = self.counts.evicted_capacity + #e.records
  end
  remove_entries(self, doomed)
end

-- The units of a batch: lists of episode numbers (groups, or one episode each).
local function units_of(self, batch)
  local units = {}
  if self.cfg.unit == "group" then
    for _, g in ipairs(batch:groups()) do units[#units + 1] = g.members end
  else
    for i = 1, batch:size() do units[#units + 1] = { i } end
  end
  return units
end

-- buf:add(batch, step) -> the number of episodes added: every episode of the batch, in groups
-- (unit = "group": one entry per group, however many groups the batch holds) or one by one.
-- Stored episodes get a group id of their own entry (-key), so that replayed groups never mix
-- with fresh ones. Entries past capacity go, lowest weight first.
function Buffer:add(batch, step)
  check_batch(batch, "replay: add")
  if math.type(step) ~= "integer" then
    error("replay: add: step: an integer expected, got " .. argcheck.describe(step), 2)
  end
  local prio = self:priorities(batch)
  local units = units_of(self, batch)
  for _, members in ipairs(units) do
    if #members > self.cfg.capacity then
      error(string.format("replay: add: a group of %d episodes does not fit capacity = %d",
        #members, self.cfg.capacity), 2)
    end
  end
  self.now = math.max(self.now, step)
  for _, members in ipairs(units) do
    local entry = { step = step, last = step, records = {} }
    local gid = -self.next_key
    for _, i in ipairs(members) do
      local rec = record_from(batch, i, self.next_key, prio[i])
      rec.batch.episodes[1].group = gid
      self.next_key = self.next_key + 1
      entry.records[#entry.records + 1] = rec
      self.by_key[rec.key] = { entry = entry, record = rec }
    end
    self.entries[#self.entries + 1] = entry
    self.size = self.size + #members
  end
  self.counts.added = self.counts.added + batch:size()
  fit(self, step)
  return batch:size()
end

-- ---------------------------------------------------------------- delayed rewards

-- A pending key as the buffer keeps it (a string; an integer becomes its decimal text), or nil.
local function pending_key(v)
  if type(v) == "string" and v ~= "" then return v end
  if math.type(v) == "integer" then return tostring(v) end
  return nil
end
M.pending_key = pending_key

-- buf:add_pending(batch, step, keys) -> the number of episodes held: the batch's episodes (with
-- their behaviour log-probs) as pending entries, episode i waiting under keys[i] (a string or
-- an integer) until buf:backfill or buf:discard closes its key. They are never drawn, evicted
-- or counted in size meanwhile.
function Buffer:add_pending(batch, step, keys)
  check_batch(batch, "replay: add_pending")
  if math.type(step) ~= "integer" then
    error("replay: add_pending: step: an integer expected, got " .. argcheck.describe(step), 2)
  end
  if type(keys) ~= "table" or #keys ~= batch:size() then
    error(string.format("replay: add_pending: keys: a list of %d pending keys expected (one per "
      .. "episode), got %s", batch:size(), argcheck.describe(keys)), 2)
  end
  local norm = {}
  for i = 1, batch:size() do
    norm[i] = pending_key(keys[i])
    if not norm[i] then
      error(string.format("replay: add_pending: keys[%d]: a non-empty string or an integer "
        .. "expected, got %s", i, argcheck.describe(keys[i])), 2)
    end
  end
  local units = units_of(self, batch)
  for _, members in ipairs(units) do
    if #members > self.cfg.capacity then
      error(string.format("replay: add_pending: a group of %d episodes does not fit capacity = %d",
        #members, self.cfg.capacity), 2)
    end
  end
  self.now = math.max(self.now, step)
  for _, members in ipairs(units) do
    local entry = { step = step, last = step, records = {}, waiting = #members }
    local gid = -self.next_key
    for _, i in ipairs(members) do
      local rec = record_from(batch, i, self.next_key, 0)
      rec.adv = nil -- (advantages of an episode without its reward mean nothing)
      rec.pending = norm[i]
      rec.batch.episodes[1].group = gid
      rec.batch.episodes[1].pending = norm[i]
      self.next_key = self.next_key + 1
      entry.records[#entry.records + 1] = rec
      self.waiting[norm[i]] = (self.waiting[norm[i]] or 0) + 1
    end
    self.held[#self.held + 1] = entry
  end
  self.counts.held = self.counts.held + batch:size()
  return batch:size()
end

-- buf:pending() -> the keys episodes wait under, in the order they were first held: {{key =,
-- step = the earliest rollout step among its episodes, episodes = how many wait, task = the
-- first one's task}, ...}.
function Buffer:pending()
  local out, at = {}, {}
  for _, e in ipairs(self.held) do
    for _, r in ipairs(e.records) do
      local k = r.pending
      if k then
        local p = at[k]
        if not p then
          p = { key = k, step = e.step, episodes = 0, task = r.batch.episodes[1].task }
          at[k] = p
          out[#out + 1] = p
        end
        p.episodes = p.episodes + 1
        p.step = math.min(p.step, e.step)
      end
    end
  end
  return out
end

-- Why key cannot be closed (nil, message), or its normalised form.
local function open_key(self, key, where)
  local k = pending_key(key)
  if not k then
    error(string.format("replay: %s: key: a non-empty string or an integer expected, got %s",
      where, argcheck.describe(key)), 3)
  end
  if self.waiting[k] then return k end
  local done = self.closed[k]
  if done then
    return nil, string.format("replay: %s: key %q was %s at step %d already", where, k, done.how,
      done.step)
  end
  return nil, string.format("replay: %s: no episode waits under key %q", where, k)
end

local function step_arg(self, step, where)
  if step == nil then return self.now end
  if math.type(step) ~= "integer" then
    error(string.format("replay: %s: step: an integer expected, got %s", where,
      argcheck.describe(step)), 3)
  end
  return step
end

-- The largest priority among the drawable episodes (1 when there is none).
local function max_priority(self)
  local m
  for _, e in ipairs(self.entries) do
    for _, r in ipairs(e.records) do m = math.max(m or r.priority, r.priority) end
  end
  return m or 1
end

-- A held entry none of whose episodes waits any more becomes drawable: its priorities under
-- the buffer's rule, its episodes keyed, marked fresh (sample's resolved = true takes it).
local function promote(self, entry)
  entry.waiting = nil
  entry.fresh = true
  if self.cfg.priority == "abs_adv" then
    local p = max_priority(self)
    for _, r in ipairs(entry.records) do r.priority = p end
  else
    local parts = {}
    for j, r in ipairs(entry.records) do parts[j] = r.batch end
    local pr = self:priorities(batchlib.concat(parts))
    for j, r in ipairs(entry.records) do r.priority = pr[j] end
  end
  for _, r in ipairs(entry.records) do self.by_key[r.key] = { entry = entry, record = r } end
  self.entries[#self.entries + 1] = entry
  self.size = self.size + #entry.records
end

-- Closes key: f(record) on each record waiting under it (in order), then the entries left
-- without a waiting episode become drawable (those left with no episode at all go).
local function close_key(self, k, how, step, f)
  local keep = {}
  for _, e in ipairs(self.held) do
    local left = {}
    for _, r in ipairs(e.records) do
      if r.pending == k then
        r.pending = nil
        e.waiting = e.waiting - 1
        if f(r) then left[#left + 1] = r end
      else
        left[#left + 1] = r
      end
    end
    e.records = left
    if #left == 0 then
      e.waiting = nil
    elseif e.waiting == 0 then
      promote(self, e)
    else
      keep[#keep + 1] = e
    end
  end
  self.held = keep
  self.waiting[k] = nil
  self.closed[k] = { how = how, step = step }
  self.now = math.max(self.now, step)
end

-- buf:backfill(key, reward [, step = the latest step seen]) -> true, or nil and a message when
-- no episode waits under key (never held, or resolved or discarded already). reward is a finite
-- number, or a function(episode) -> a finite number called on each waiting episode (the stored
-- table, not to be changed); it is added to the episode's last turn and total. Entries whose
-- episodes all have their rewards become drawable (entries past capacity then go).
function Buffer:backfill(key, reward, step)
  local k, why = open_key(self, key, "backfill")
  if type(reward) ~= "function" and not argcheck.finite(reward) then
    error("replay: backfill: reward: a finite number or a function(episode) -> number expected, "
      .. "got " .. argcheck.describe(reward), 2)
  end
  step = step_arg(self, step, "backfill")
  if not k then return nil, why end
  -- every value first, so that a failing function leaves the buffer as it was
  local values = {}
  for _, e in ipairs(self.held) do
    for _, r in ipairs(e.records) do
      if r.pending == k then
        local v = reward
        if type(reward) == "function" then v = reward(r.batch.episodes[1]) end
        if not argcheck.finite(v) then
          error(string.format("replay: backfill: reward(episode) returned %s, not a finite number",
            argcheck.describe(v)), 2)
        end
        values[r] = v
      end
    end
  end
  local n = 0
  close_key(self, k, "resolved", step, function(r)
    local ep, v = r.batch.episodes[1], values[r]
    ep.reward = ep.reward + v
    if type(ep.rewards) == "table" and #ep.rewards > 0 then
      ep.rewards[#ep.rewards] = ep.rewards[#ep.rewards] + v
    end
    local last = type(ep.record) == "table" and ep.record[#ep.record]
    if type(last) == "table" then last.reward = (last.reward or 0) + v end
    if not (type(last) == "table" and type(last.info) == "table" and last.info.success ~= nil) then
      ep.success = ep.reward > 0 -- (as rl.batch.new decides without info.success)
    end
    ep.backfilled, ep.resolved_step = v, step
    n = n + 1
    return true
  end)
  self.counts.resolved = self.counts.resolved + n
  fit(self, step)
  return true
end

-- buf:discard(key [, step]) -> true, or nil and a message (as backfill): the episodes waiting
-- under key leave the buffer; entries left with others, all resolved, become drawable.
function Buffer:discard(key, step)
  local k, why = open_key(self, key, "discard")
  step = step_arg(self, step, "discard")
  if not k then return nil, why end
  local n = 0
  close_key(self, k, "discarded", step, function() n = n + 1 return false end)
  self.counts.discarded = self.counts.discarded + n
  fit(self, step)
  return true
end

-- ---------------------------------------------------------------- rescoring

-- Re-scores the listed entries whose episodes were scored under another reward version than
-- rescore.version (g:rescore on one batch of them, in place); their priorities follow under
-- "reward" and "sigma". Returns the number of episodes re-scored.
local function rescore_entries(self, entries)
  local g = self.cfg.rescore
  if not g then return 0 end
  local stale, parts = {}, {}
  for _, e in ipairs(entries) do
    local old = false
    for _, r in ipairs(e.records) do old = old or r.batch.episodes[1].reward_version ~= g.version end
    if old then
      stale[#stale + 1] = e
      for _, r in ipairs(e.records) do parts[#parts + 1] = r.batch end
    end
  end
  if #parts == 0 then return 0 end
  local b = batchlib.concat(parts) -- shares the stored episode tables
  g:rescore(b)
  for j, ep in ipairs(b.episodes) do
    if type(ep.reward) ~= "number" or ep.reward ~= ep.reward then
      error("replay: rescore: the reward graph left an episode without a numeric reward", 0)
    end
    ep.reward_version = g.version
    -- kept as JSON holds it (as add does), whether the graph wrote in place or not
    parts[j].episodes[1] = stored_episode(ep)
  end
  local rule = self.cfg.priority
  if rule == "reward" or rule == "sigma" then
    local at = 0
    local pr = self:priorities(b)
    for _, e in ipairs(stale) do
      for _, r in ipairs(e.records) do
        at = at + 1
        r.priority = pr[at]
      end
    end
  end
  self.counts.rescored = self.counts.rescored + #parts
  return #parts
end

-- buf:rescore() -> the number of episodes re-scored: every stored episode whose reward version
-- differs from the rescore graph's (sample does this for the entries it draws).
function Buffer:rescore()
  return rescore_entries(self, self.entries)
end

-- ---------------------------------------------------------------- sampling

-- The beta of step (a number, or annealed from start to stop over steps).
local function beta_at(cfg, step)
  local b = cfg.beta
  if type(b) == "number" then return b end
  return core.advantage.freshper_beta_schedule({ steps = { math.max(step, 0) } },
    { total = b.steps, start = b.start, ["end"] = b.stop }).beta[1]
end

-- A batch of records (tokens copied; episode tables copied one level, so that what a trainer
-- sets on them stays out of the buffer), with the stored advantages when every record has them.
local function assemble(records)
  local parts = {}
  for j, r in ipairs(records) do parts[j] = r.batch end
  local b = batchlib.concat(parts)
  for j, ep in ipairs(b.episodes) do
    local copy = {}
    for k, v in pairs(ep) do copy[k] = v end
    b.episodes[j] = copy
  end
  local all = #records > 0
  for _, r in ipairs(records) do all = all and r.adv ~= nil end
  if all then
    local total = b.offsets[#records + 1]
    local adv = core.tensor.zeros(math.max(total, 1)):narrow(1, 1, total)
    for j, r in ipairs(records) do
      local len = b.offsets[j + 1] - b.offsets[j]
      if len > 0 then adv:narrow(1, b.offsets[j] + 1, len):copy(r.adv) end
    end
    b.advantages = adv
  end
  return b
end

-- buf:sample(n, step [, opts]) -> an rl.batch of up to n distinct entries (unit = "group": n
-- groups), or nil and a message when fewer than min_fill episodes are stored. With
-- opts.resolved = true, every entry that became drawable through backfill since the last such
-- call comes first (importance weight 1, not stale; below min_fill they come alone), then the
-- n draws from the other entries; batch.resolved[j] says which. opts.logprobs =
-- function(batch) -> the current policy's log-probs of the batch's tokens (a flat tensor like
-- batch.mask): then each episode's importance ratio exp(mean log(pi / pi_behaviour)) is taken
-- and entries with an episode beyond max_ratio (or below 1 / max_ratio) are evicted, not
-- returned. Entries scored under an old reward version are re-scored first (rescore). The batch
-- holds the behaviour log-probs (batch.logprobs) and per episode: keys, priorities, weights
-- (importance weights (N P)^-beta / their max), ages, stale (drawn as a staleness revisit); with
-- logprobs also ratios, batch.token_weights (min(pi / pi_behaviour, max_ratio) per token) and
-- batch.policy_logprobs; batch.advantages when the stored batches had them.
function Buffer:sample(n, step, opts)
  if math.type(n) ~= "integer" or n < 0 then
    error("replay: sample: n: a non-negative integer expected, got " .. argcheck.describe(n), 2)
  end
  if math.type(step) ~= "integer" then
    error("replay: sample: step: an integer expected, got " .. argcheck.describe(step), 2)
  end
  if opts ~= nil then
    if type(opts) ~= "table" then error("replay: sample: opts: a table {logprobs =} expected", 2) end
    for k in pairs(opts) do
      if k ~= "logprobs" and k ~= "resolved" then
        error(string.format("replay: sample: unknown option '%s' (known: logprobs, resolved)",
          tostring(k)), 2)
      end
    end
    if opts.logprobs ~= nil and type(opts.logprobs) ~= "function" then
      error("replay: sample: opts.logprobs: a function(batch) -> log-probs expected", 2)
    end
    if opts.resolved ~= nil and type(opts.resolved) ~= "boolean" then
      error("replay: sample: opts.resolved: a boolean expected, got "
        .. argcheck.describe(opts.resolved), 2)
    end
  end
  -- the entries resolved since the last call with resolved = true, and the others
  local taken, candidates = {}, self.entries
  if opts and opts.resolved then
    candidates = {}
    for _, e in ipairs(self.entries) do
      if e.fresh then
        e.fresh = nil
        taken[#taken + 1] = e
      else
        candidates[#candidates + 1] = e
      end
    end
  end
  local filled = self.size >= math.max(self.cfg.min_fill, 1)
  if not filled and #taken == 0 then
    return nil, string.format("replay: %d episodes stored, fewer than min_fill = %d", self.size,
      math.max(self.cfg.min_fill, 1))
  end
  self.now = math.max(self.now, step)
  self.draws = self.draws + 1
  local rng = core.rng(mix(self.cfg.seed, self.draws))
  local k = filled and math.min(n, #candidates) or 0
  local drawn, isw, stale = {}, {}, {}
  for j, e in ipairs(taken) do drawn[j], isw[j], stale[j] = e, 1, false end
  if k > 0 then
    local u = {}
    for j = 1, 2 * k do u[j] = rng:random() end
    local last = {}
    for i, e in ipairs(candidates) do last[i] = e.last end
    local picks, _, w, st = creplay.draw { w = self:_weights(step, candidates), last = last,
      uniforms = u, k = k, staleness = self.cfg.staleness, beta = beta_at(self.cfg, step) }
    for j, i in ipairs(picks) do
      local at = #taken + j
      drawn[at], isw[at], stale[at] = candidates[i], w[j], st[j]
    end
  end
  rescore_entries(self, drawn)
  local records, rec_entry = {}, {}
  for j, e in ipairs(drawn) do
    for _, r in ipairs(e.records) do records[#records + 1] = r; rec_entry[#records] = j end
  end
  local b = assemble(records)
  local ratios, token_w, logp
  if opts and opts.logprobs and #records > 0 then
    logp = opts.logprobs(b)
    local total = b.offsets[#records + 1]
    if not core.tensor.is_tensor(logp) or logp:numel() ~= total then
      error(string.format("replay: sample: opts.logprobs returned %s, not a tensor of %d "
        .. "log-probs (like batch.mask)", argcheck.describe(logp), total), 2)
    end
    logp = logp:contiguous()
    ratios, token_w = creplay.ratios { logp = logp, behaviour = b.logprobs, mask = b.mask,
      offsets = b.offsets, cap = self.cfg.max_ratio or math.huge }
  end
  -- eviction by ratio: an entry goes when one of its episodes is too far from the policy
  local evict = {}
  if ratios and self.cfg.max_ratio then
    local bound = self.cfg.max_ratio
    for at, r in ipairs(ratios) do
      if r > bound or r < 1 / bound then evict[rec_entry[at]] = true end
    end
  end
  local keep_rec, doomed = {}, {}
  for at = 1, #records do
    if not evict[rec_entry[at]] then keep_rec[#keep_rec + 1] = at end
  end
  for j, e in ipairs(drawn) do
    if evict[j] then
      doomed[e] = true
      self.counts.evicted_ratio = self.counts.evicted_ratio + #e.records
    else
      e.last = step
      if stale[j] then self.counts.stale_picks = self.counts.stale_picks + 1 end
    end
  end
  remove_entries(self, doomed)
  local out = b
  if #keep_rec < #records then
    out = b:select(keep_rec)
  end
  -- the per-episode fields, for the episodes kept
  out.keys, out.priorities, out.weights, out.ages, out.stale = {}, {}, {}, {}, {}
  out.resolved = {}
  out.ratios = ratios and {} or nil
  for j, at in ipairs(keep_rec) do
    local e = drawn[rec_entry[at]]
    out.keys[j] = records[at].key
    out.priorities[j] = records[at].priority
    out.weights[j] = isw[rec_entry[at]]
    out.ages[j] = step - e.step
    out.stale[j] = stale[rec_entry[at]]
    out.resolved[j] = rec_entry[at] <= #taken
    if ratios then out.ratios[j] = ratios[at] end
  end
  if #keep_rec < #records then
    -- the token tensors of the kept episodes, copied out of the drawn batch's
    local function pick(t)
      if not t then return nil end
      local total = out.offsets[#keep_rec + 1]
      local dst = core.tensor.zeros(math.max(total, 1)):narrow(1, 1, total)
      for j, at in ipairs(keep_rec) do
        local len = out.offsets[j + 1] - out.offsets[j]
        if len > 0 then
          dst:narrow(1, out.offsets[j] + 1, len):copy(t:narrow(1, b.offsets[at] + 1, len))
        end
      end
      return dst
    end
    out.advantages = pick(b.advantages)
    token_w, logp = pick(token_w), pick(logp)
  end
  out.token_weights, out.policy_logprobs = token_w, logp
  self.counts.sampled = self.counts.sampled + #keep_rec
  return out
end

-- ---------------------------------------------------------------- priorities from outside

-- buf:update(keys, priorities) -> the number of episodes updated: new priorities for stored
-- episodes by key (keys of episodes evicted since are skipped).
function Buffer:update(keys, priorities)
  if type(keys) ~= "table" then error("replay: update: keys: a list of episode keys expected", 2) end
  if type(priorities) ~= "table" or #priorities ~= #keys then
    error(string.format("replay: update: priorities: a list of %d numbers expected (one per key)",
      #keys), 2)
  end
  local done = 0
  for i, key in ipairs(keys) do
    local p = priorities[i]
    if math.type(key) ~= "integer" then
      error(string.format("replay: update: keys[%d]: an integer key expected, got %s", i,
        argcheck.describe(key)), 2)
    end
    if type(p) ~= "number" or p ~= p or p < 0 or p == math.huge then
      error(string.format("replay: update: priorities[%d]: a non-negative finite number expected, "
        .. "got %s", i, argcheck.describe(p)), 2)
    end
    local at = self.by_key[key]
    if at then
      at.record.priority = p
      done = done + 1
    end
  end
  return done
end

-- ---------------------------------------------------------------- views

-- buf:batch() -> an rl.batch of every stored episode, in the order they were added, sharing the
-- stored episode tables (a reward graph may re-score it in place); batch.keys as in sample.
function Buffer:batch()
  local parts, keys = {}, {}
  for _, e in ipairs(self.entries) do
    for _, r in ipairs(e.records) do parts[#parts + 1] = r.batch; keys[#keys + 1] = r.key end
  end
  local b = batchlib.concat(parts)
  b.keys = keys
  return b
end

function Buffer:__len() return self.size end

-- buf:stats([step]) -> {size = episodes, entries, capacity, fill, added, evicted_capacity,
-- evicted_ratio, sampled, stale_picks, rescored, draws, priority_mean, age_mean, age_max} (ages
-- at step, default the latest step seen; drawable entries only), and for delayed rewards
-- pending (episodes waiting for their reward), pending_keys, held_entries (entries with one),
-- and the counts held, resolved and discarded (episodes, since the start).
function Buffer:stats(step)
  step = step or self.now
  local s = { size = self.size, entries = #self.entries, capacity = self.cfg.capacity,
    fill = self.size / self.cfg.capacity, draws = self.draws, held_entries = #self.held }
  local pending, keys = 0, 0
  for _, n in pairs(self.waiting) do pending, keys = pending + n, keys + 1 end
  s.pending, s.pending_keys = pending, keys
  for k, v in pairs(self.counts) do s[k] = v end
  local psum, asum, amax = 0, 0, 0
  for _, e in ipairs(self.entries) do
    local age = step - e.step
    for _, r in ipairs(e.records) do psum = psum + r.priority end
    asum = asum + age * #e.records
    amax = math.max(amax, age)
  end
  s.priority_mean = self.size > 0 and psum / self.size or 0
  s.age_mean = self.size > 0 and asum / self.size or 0
  s.age_max = amax
  return s
end

-- ---------------------------------------------------------------- state

local function entries_state(list)
  local entries = {}
  for i, e in ipairs(list) do
    local recs = {}
    for j, r in ipairs(e.records) do
      local b = r.batch
      recs[j] = { key = r.key, priority = r.priority, episode = b.episodes[1],
        tokens = array_of(b.tokens), logprobs = array_of(b.logprobs), mask = array_of(b.mask),
        turns = array_of(b.turns), adv = r.adv and array_of(r.adv) or nil, pending = r.pending }
    end
    entries[i] = { step = e.step, last = e.last, records = json.array(recs), fresh = e.fresh }
  end
  return json.array(entries)
end

-- buf:state() -> a JSON-ready table with everything the buffer holds (entries with their tokens,
-- log-probs, masks, turns, advantages, priorities, steps; the pending entries with their keys;
-- the closed keys) and its counters and draw count, so that load in another process continues
-- bit for bit.
function Buffer:state()
  local counts = {}
  for k, v in pairs(self.counts) do counts[k] = v end
  local closed = {}
  for k, c in pairs(self.closed) do closed[#closed + 1] = { key = k, how = c.how, step = c.step } end
  table.sort(closed, function(a, b) return a.key < b.key end)
  return { format = "moonrl.replay/2", next_key = self.next_key, draws = self.draws,
    now = self.now, counts = counts, entries = entries_state(self.entries),
    held = entries_state(self.held), closed = json.array(closed) }
end

local function bad_state(why, level) error("replay: load: " .. why, level or 3) end

-- The entries of a state's list (where names it: "entries" or "held"); held ones count their
-- waiting episodes, drawable ones are keyed.
local function load_entries(fresh, list, where, held)
  local out = {}
  for i, e in ipairs(list) do
    if type(e) ~= "table" or math.type(e.step) ~= "integer" or math.type(e.last) ~= "integer"
        or type(e.records) ~= "table" or #e.records == 0 then
      bad_state(string.format("%s[%d]: {step =, last =, records =} expected", where, i), 4)
    end
    local entry = { step = e.step, last = e.last, records = {}, fresh = e.fresh == true or nil }
    local waiting = 0
    for j, r in ipairs(e.records) do
      local n = type(r.tokens) == "table" and #r.tokens or -1
      if math.type(r.key) ~= "integer" or type(r.priority) ~= "number" or type(r.episode) ~= "table"
          or n < 0 or type(r.logprobs) ~= "table" or #r.logprobs ~= n or type(r.mask) ~= "table"
          or #r.mask ~= n or type(r.turns) ~= "table" or #r.turns ~= n
          or (r.adv ~= nil and (type(r.adv) ~= "table" or #r.adv ~= n))
          or (r.pending ~= nil and (not held or pending_key(r.pending) ~= r.pending)) then
        bad_state(string.format("%s[%d].records[%d]: a stored episode expected", where, i, j), 4)
      end
      local one = batchlib.new { tokens = tensor_of(r.tokens), logprobs = tensor_of(r.logprobs),
        mask = tensor_of(r.mask), turns = tensor_of(r.turns), offsets = { 0, n },
        episodes = { r.episode } }
      local rec = { key = r.key, priority = r.priority, batch = one,
        adv = r.adv and tensor_of(r.adv) or nil, pending = r.pending }
      entry.records[j] = rec
      if r.pending then
        waiting = waiting + 1
        fresh.waiting[r.pending] = (fresh.waiting[r.pending] or 0) + 1
      end
    end
    if held then
      if waiting == 0 then bad_state(string.format("%s[%d]: no episode waits in it", where, i), 4) end
      entry.waiting = waiting
    else
      for _, rec in ipairs(entry.records) do fresh.by_key[rec.key] = { entry = entry, record = rec } end
      fresh.size = fresh.size + #entry.records
    end
    out[i] = entry
  end
  return out
end

-- buf:load(state): the buffer becomes the one state() described (its own options stay); a
-- state of the first format (without delayed rewards) loads too.
function Buffer:load(state)
  if type(state) ~= "table" or (state.format ~= "moonrl.replay/2"
      and state.format ~= "moonrl.replay/1") then
    bad_state("state: a table from buf:state() expected")
  end
  if math.type(state.next_key) ~= "integer" or math.type(state.draws) ~= "integer"
      or type(state.entries) ~= "table" or type(state.counts) ~= "table"
      or (state.format == "moonrl.replay/2" and (type(state.held) ~= "table"
        or type(state.closed) ~= "table")) then
    bad_state("state: next_key, draws, counts, entries (and held, closed) expected")
  end
  local fresh = setmetatable({ cfg = self.cfg }, Buffer)
  fresh:clear()
  fresh.entries = load_entries(fresh, state.entries, "entries", false)
  fresh.held = load_entries(fresh, state.held or {}, "held", true)
  for i, c in ipairs(state.closed or {}) do
    if type(c) ~= "table" or pending_key(c.key) ~= c.key or math.type(c.step) ~= "integer"
        or (c.how ~= "resolved" and c.how ~= "discarded") then
      bad_state(string.format("closed[%d]: {key =, how =, step =} expected", i))
    end
    fresh.closed[c.key] = { how = c.how, step = c.step }
  end
  fresh.next_key, fresh.draws = state.next_key, state.draws
  fresh.now = math.type(state.now) == "integer" and state.now or 0
  for k in pairs(fresh.counts) do
    if math.type(state.counts[k]) == "integer" then fresh.counts[k] = state.counts[k] end
  end
  for k, v in pairs(fresh) do self[k] = v end
end

M.is_buffer = function(v) return getmetatable(v) == Buffer end

return M
