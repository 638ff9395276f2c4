-- moonrl.synth.target: failure clusters from what the engine records per episode, and exemplars
-- of them for the proposer's prompt (rl.synth.target).
--
--   local tg = rl.synth.target { from = cur, by = { "end", "tool_error", "cell", "state" },
--     clusters = 8, exemplars = 3, decay = 0.9, weight = "rate" }
--   tg:observe(batch)              -- the loop feeds it each training batch
--   tg:clusters()                  -- {{signature =, weight =, share =, rate =, failures =,
--                                  --   episodes =, exemplars = {task...}}, ...}
--   tg:exemplars(n, rng)           -- n exemplar tasks, clusters drawn by their weight
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
  }, 2)
  local by = {}
  for i, x in ipairs(o.by) do by[i] = x end
  return setmetatable({ from = o.from, by = by, max_clusters = o.clusters, max_exemplars = o.exemplars,
    decay = o.decay, weight = o.weight, sigs = {}, order = {}, observed = 0, failures = 0 }, Target)
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
  for _, ep in ipairs(batch.episodes) do
    if ep.reward_status ~= "unscorable" and type(ep.task) == "table" then
      self.observed = self.observed + 1
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

-- ---------------------------------------------------------------- state

function Target:state()
  local sigs = {}
  for i, sig in ipairs(self.order) do
    local c = self.sigs[sig]
    sigs[i] = { signature = sig, fails = c.fails, total = c.total, count = c.count, first = c.first,
      exemplars = json.array(c.exemplars) }
  end
  return { observed = self.observed, failures = self.failures, clusters = json.array(sigs) }
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
end

function Target:config()
  local by = {}
  for i, x in ipairs(self.by) do by[i] = type(x) == "function" and "<function>" or x end
  return { by = by, clusters = self.max_clusters, exemplars = self.max_exemplars, decay = self.decay,
    weight = self.weight }
end

return M
