-- moonrl.synth.target: failure clusters from what the engine records per episode, and exemplars
-- of them for the proposer's prompt (rl.synth.target).
--
--   local tg = rl.synth.target { from = cur, by = { "end", "tool_error", "cell", "state" },
--     clusters = 8, exemplars = 3, decay = 0.9, weight = "rate" }
--   tg:observe(batch)              -- the loop feeds it each training batch
--   tg:clusters()                  -- {{signature =, weight =, share =, rate =, failures =,
--                                  --   episodes =, exemplars = {task...}}, ...}
--   tg:exemplars(n, rng)           -- n exemplar tasks, clusters drawn by their weight
--   tg:tags()                      -- per capability tag: {tag =, episodes =, failures =, pass =}
--   tg:weakest(n [, min_episodes]) -- the n tags of lowest pass rate
--   tg:contrast()                  -- per turn type: {turn =, turns =, failed_at =, fail_rate =,
--                                  --   share_failed =, share_success =}, worst first
--
-- An episode has a signature: its features joined with " | ", each "name=value": "end"
-- (ep["end"]: done, max_turns, budget, env_error), "tool_error" (whether a turn's tool call
-- failed), "fatal" (whether fatal-aware masking cut the episode), "cell" (task.cell, the
-- curriculum's), "state" (the state_key of the turn that ended the episode), or fn(ep) -> string.
-- Per signature the target counts episodes and failures (not ep.success; unscorable episodes
-- are left out), both multiplied by decay at each observe. A signature with failures is a
-- cluster; its weight is its failure rate (failures + 1) / (episodes + 2) with weight = "rate"
-- (the default: a kind of task the policy fails on most, however rare), or its failure count
-- with weight = "count" (where most failures are). The `clusters` heaviest are kept (ties: the
-- one seen first), each with its `exemplars` latest distinct failed tasks.
--
-- The diagnosis of TRACE (contrast failed with successful trajectories to name the missing
-- capabilities) comes from the same observations. Tags: `tags = "task"` (the default) reads
-- ep.task.tags (a list of capability names), or fn(ep) -> a list, or false (none); every tag of
-- an episode counts it, so tg:tags() gives per-tag pass rates (pass = 1 - failures / episodes)
-- and tg:weakest(n) the n lowest (ties: the tag seen first; tags seen in fewer than
-- min_episodes = 1 episodes are left out). Turn types are the state_key of each turn
-- (ep.record[i].state): a failed episode fails at its last turn, so for each turn type the
-- contrast counts its turns,
-- the failed episodes that ended at it (fail_rate = failed_at / turns: how often a turn of the
-- type is where an episode fails), and the share of turns of that type among the failed and
-- among the successful episodes' turns. Both are decayed like the clusters.
local argcheck = require "moonrl.argcheck"
local core = require "moonrl.core"

local json = core.json
local M = {}
local Target = { __name = "moonrl.synth.target" }
Target.__index = Target
M.Target = Target

local FEATURES = { "end", "tool_error", "fatal", "cell", "state" }

local function feature(name, ep)
  if type(name) == "function" then return tostring(name(ep)) end
  if name == "end" then return "end=" .. tostring(ep["end"]) end
  if name == "tool_error" then
    for _, r in ipairs(ep.record or {}) do if r.tool_error then return "tool_error=yes" end end
    return "tool_error=no"
  end
  if name == "fatal" then return ep.fatal_turn and "fatal=yes" or "fatal=no" end
  if name == "cell" then return "cell=" .. tostring(type(ep.task) == "table" and ep.task.cell or nil) end
  local last = ep.record and ep.record[#ep.record]
  return "state=" .. tostring(last and last.state or nil)
end

local feature_check = argcheck.one_of(FEATURES, argcheck.func, "a function(ep) -> string")
local function by_check(v)
  if not argcheck.is_list(v) or #v == 0 then
    return "a non-empty list of \"end\", \"tool_error\", \"fatal\", \"cell\", \"state\" or functions(ep) -> string"
  end
  for i, x in ipairs(v) do
    local want = feature_check(x)
    if want then
      return { string.format("rl.synth.target: by[%d]: %s expected, got %s", i, want, argcheck.describe(x)) }
    end
  end
  return nil
end

local function is_curriculum(v)
  return type(v) == "table" and type(v.admit) == "function" and type(v.sample) == "function"
end

-- rl.synth.target{...}: see the top of this file.
function M.target(opts)
  local o = argcheck.fields("rl.synth.target", opts or {}, {
    { "from", nil, function(v) if is_curriculum(v) then return nil end
      return "a curriculum (rl.curriculum.new{...}: sample, admit)" end },
    { "by", { "end", "tool_error", "cell", "state" }, by_check },
    { "clusters", 8, argcheck.integer(1) },
    { "exemplars", 3, argcheck.integer(1) },
    { "decay", 0.9, argcheck.number(0, 1) },
    { "weight", "rate", argcheck.one_of { "rate", "count" } },
    { "tags", "task", argcheck.either(argcheck.literal("task", "\"task\""), argcheck.literal(false, "false"),
      argcheck.kind("function", "a function(ep) -> a list of tags")) },
  }, 2)
  local by = {}
  for i, x in ipairs(o.by) do by[i] = x end
  return setmetatable({ from = o.from, by = by, max_clusters = o.clusters, max_exemplars = o.exemplars,
    decay = o.decay, weight = o.weight, tags_from = o.tags, sigs = {}, order = {}, observed = 0, failures = 0,
    tag_stats = {}, tag_order = {}, turn_stats = {}, turn_order = {} }, Target)
end

-- The capability tags of an episode (a list of strings; empty when it has none).
local function tags_of(self, ep)
  local list
  if self.tags_from == "task" then list = type(ep.task) == "table" and ep.task.tags or nil
  elseif self.tags_from then list = self.tags_from(ep) end
  if type(list) ~= "table" then return {} end
  local out, seen = {}, {}
  for _, t in ipairs(list) do
    local s = tostring(t)
    if not seen[s] then seen[s] = true out[#out + 1] = s end
  end
  return out
end

-- Counts an episode's tags and turn types.
local function observe_diagnosis(self, ep)
  local failed = not ep.success
  for _, tag in ipairs(tags_of(self, ep)) do
    local c = self.tag_stats[tag]
    if not c then
      c = { episodes = 0, failures = 0 }
      self.tag_stats[tag] = c
      self.tag_order[#self.tag_order + 1] = tag
    end
    c.episodes = c.episodes + 1
    if failed then c.failures = c.failures + 1 end
  end
  local record = ep.record or {}
  for i, r in ipairs(record) do
    if r.state ~= nil then
      local name = tostring(r.state)
      local c = self.turn_stats[name]
      if not c then
        c = { turns = 0, failed_at = 0, in_failed = 0, in_success = 0 }
        self.turn_stats[name] = c
        self.turn_order[#self.turn_order + 1] = name
      end
      c.turns = c.turns + 1
      if failed then c.in_failed = c.in_failed + 1 else c.in_success = c.in_success + 1 end
      if failed and i == #record then c.failed_at = c.failed_at + 1 end
    end
  end
end

function M.is_target(v) return getmetatable(v) == Target end

-- The signature of an episode.
function Target:signature(ep)
  local parts = {}
  for i, name in ipairs(self.by) do
    parts[i] = feature(name, ep)
  end
  return table.concat(parts, " | ")
end

local function task_id(task)
  if type(task) ~= "table" then return tostring(task) end
  if type(task.key) == "string" then return task.key end
  local ok, s = pcall(json.encode, task)
  return ok and s or tostring(task)
end

-- tg:observe(batch): its episodes count towards their signatures, its failures join them.
function Target:observe(batch)
  for _, name in ipairs(self.order) do
    local c = self.sigs[name]
    c.fails, c.total = c.fails * self.decay, c.total * self.decay
  end
  for _, c in pairs(self.tag_stats) do c.episodes, c.failures = c.episodes * self.decay, c.failures * self.decay end
  for _, c in pairs(self.turn_stats) do
    c.turns, c.failed_at = c.turns * self.decay, c.failed_at * self.decay
    c.in_failed, c.in_success = c.in_failed * self.decay, c.in_success * self.decay
  end
  for _, ep in ipairs(batch.episodes) do
    if ep.reward_status ~= "unscorable" and type(ep.task) == "table" then
      self.observed = self.observed + 1
      observe_diagnosis(self, ep)
      local sig = self:signature(ep)
      local c = self.sigs[sig]
      if not c then
        c = { fails = 0, total = 0, count = 0, exemplars = {}, first = #self.order + 1 }
        self.sigs[sig] = c
        self.order[#self.order + 1] = sig
      end
      c.total = c.total + 1
      if not ep.success then
        self.failures = self.failures + 1
        c.fails, c.count = c.fails + 1, c.count + 1
        local id = task_id(ep.task)
        for i = #c.exemplars, 1, -1 do
          if task_id(c.exemplars[i]) == id then table.remove(c.exemplars, i) end
        end
        c.exemplars[#c.exemplars + 1] = ep.task
        while #c.exemplars > self.max_exemplars do table.remove(c.exemplars, 1) end
      end
    end
  end
end

local function weight_of(self, c)
  if self.weight == "count" then return c.fails end
  return (c.fails + 1) / (c.total + 2)
end

-- tg:clusters() -> the heaviest signatures with failures, {signature =, weight =, share =,
-- rate =, failures =, episodes =, count =, exemplars = {task, ...}} (latest last), heaviest
-- first; failures and episodes are the decayed counts, count the failures ever seen.
function Target:clusters()
  local list = {}
  for _, sig in ipairs(self.order) do
    local c = self.sigs[sig]
    if c.fails > 1e-9 and #c.exemplars > 0 then list[#list + 1] = { sig = sig, c = c, w = weight_of(self, c) } end
  end
  table.sort(list, function(a, b)
    if a.w ~= b.w then return a.w > b.w end
    return a.c.first < b.c.first
  end)
  local total = 0
  for i = 1, math.min(#list, self.max_clusters) do total = total + list[i].w end
  local out = {}
  for i = 1, math.min(#list, self.max_clusters) do
    local c = list[i].c
    local ex = {}
    for j, t in ipairs(c.exemplars) do ex[j] = t end
    out[i] = { signature = list[i].sig, weight = list[i].w, share = list[i].w / total, rate = c.fails / c.total,
      failures = c.fails, episodes = c.total, count = c.count, exemplars = ex }
  end
  return out
end

-- tg:exemplars(n, rng) -> up to n tasks: a cluster drawn in proportion to its weight, then one
-- of its exemplars uniformly; each with task.target = the cluster's signature (in a copy).
function Target:exemplars(n, rng)
  local cl = self:clusters()
  local out = {}
  if #cl == 0 then return out end
  for _ = 1, n do
    local u, acc, pick = rng:random(), 0, cl[#cl]
    for _, c in ipairs(cl) do
      acc = acc + c.share
      if u < acc then pick = c break end
    end
    local t = pick.exemplars[rng:random(#pick.exemplars)]
    local copy = {}
    for k, v in pairs(t) do copy[k] = v end
    copy.target = pick.signature
    out[#out + 1] = copy
  end
  return out
end

-- tg:tags() -> per tag seen, in the order first seen: {tag =, episodes =, failures =, pass =}
-- (decayed counts; pass = 1 - failures / episodes).
function Target:tags()
  local out = {}
  for _, tag in ipairs(self.tag_order) do
    local c = self.tag_stats[tag]
    if c.episodes > 1e-9 then
      out[#out + 1] = { tag = tag, episodes = c.episodes, failures = c.failures, pass = 1 - c.failures / c.episodes }
    end
  end
  return out
end

-- tg:weakest(n [, min_episodes = 1]) -> up to n tags, lowest pass rate first (ties: seen first).
function Target:weakest(n, min_episodes)
  if math.type(n) ~= "integer" or n < 0 then
    error("rl.synth.target: weakest: n: a non-negative integer expected, got " .. argcheck.describe(n), 2)
  end
  min_episodes = min_episodes or 1
  local list = {}
  for i, r in ipairs(self:tags()) do
    if r.episodes >= min_episodes - 1e-9 then r.i = i list[#list + 1] = r end
  end
  table.sort(list, function(a, b)
    if a.pass ~= b.pass then return a.pass < b.pass end
    return a.i < b.i
  end)
  local out = {}
  for i = 1, math.min(n, #list) do out[i] = list[i].tag end
  return out
end

-- tg:contrast() -> per turn type: {turn =, turns =, failed_at =, fail_rate =, share_failed =,
-- share_success =}, highest fail_rate first (ties: seen first).
function Target:contrast()
  local nf, ns = 0, 0
  for _, c in pairs(self.turn_stats) do nf, ns = nf + c.in_failed, ns + c.in_success end
  local list = {}
  for i, name in ipairs(self.turn_order) do
    local c = self.turn_stats[name]
    if c.turns > 1e-9 then
      list[#list + 1] = { turn = name, turns = c.turns, failed_at = c.failed_at, fail_rate = c.failed_at / c.turns,
        share_failed = nf > 0 and c.in_failed / nf or 0, share_success = ns > 0 and c.in_success / ns or 0, i = i }
    end
  end
  table.sort(list, function(a, b)
    if a.fail_rate ~= b.fail_rate then return a.fail_rate > b.fail_rate end
    return a.i < b.i
  end)
  for _, r in ipairs(list) do r.i = nil end
  return list
end

-- ---------------------------------------------------------------- state

function Target:state()
  local sigs = {}
  for i, sig in ipairs(self.order) do
    local c = self.sigs[sig]
    sigs[i] = { signature = sig, fails = c.fails, total = c.total, count = c.count, first = c.first,
      exemplars = json.array(c.exemplars) }
  end
  local tags, turns = {}, {}
  for i, tag in ipairs(self.tag_order) do
    local c = self.tag_stats[tag]
    tags[i] = { tag = tag, episodes = c.episodes, failures = c.failures }
  end
  for i, name in ipairs(self.turn_order) do
    local c = self.turn_stats[name]
    turns[i] = { turn = name, turns = c.turns, failed_at = c.failed_at, in_failed = c.in_failed, in_success = c.in_success }
  end
  return { observed = self.observed, failures = self.failures, clusters = json.array(sigs),
    tags = json.array(tags), turns = json.array(turns) }
end

function Target:load(st)
  if type(st) ~= "table" or type(st.clusters) ~= "table" then
    error("rl.synth.target: load: a state from target:state() expected, got " .. argcheck.describe(st), 2)
  end
  self.sigs, self.order = {}, {}
  for i, c in ipairs(st.clusters) do
    self.sigs[c.signature] = { fails = c.fails, total = c.total, count = c.count, first = c.first or i,
      exemplars = c.exemplars or {} }
    self.order[i] = c.signature
  end
  self.observed, self.failures = st.observed or 0, st.failures or 0
  self.tag_stats, self.tag_order, self.turn_stats, self.turn_order = {}, {}, {}, {}
  for i, c in ipairs(st.tags or {}) do
    self.tag_stats[c.tag] = { episodes = c.episodes, failures = c.failures }
    self.tag_order[i] = c.tag
  end
  for i, c in ipairs(st.turns or {}) do
    self.turn_stats[c.turn] = { turns = c.turns, failed_at = c.failed_at, in_failed = c.in_failed, in_success = c.in_success }
    self.turn_order[i] = c.turn
  end
end

function Target:config()
  local by = {}
  for i, x in ipairs(self.by) do by[i] = type(x) == "function" and "<function>" or x end
  return { by = by, clusters = self.max_clusters, exemplars = self.max_exemplars, decay = self.decay,
    weight = self.weight, tags = type(self.tags_from) == "function" and "<function>" or self.tags_from }
end

return M
