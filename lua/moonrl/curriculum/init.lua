-- moonrl.curriculum (rl.curriculum): which tasks to train on, chosen from measured success: a
-- source of tasks (a pool, or a grid of difficulty levels), a sampler that picks among its arms
-- (the pool's tasks or the grid's cells) from per-arm statistics, and an optional gate on the
-- rolled-out groups. rl.train{curriculum = cur} drives its task stage with it.
--
--   local C = rl.curriculum
--   local cur = C.new {
--     source = C.procedural { gen = function(params, rng) return env.gen(params, rng) end,
--       params = { digits = C.range { 1, 10 } } },
--     sampler = C.band { low = .2, high = .8 },         -- or C.uniform(), C.pools{...}, C.learnability{...}
--     gate = C.gate { reject = "zero_variance" },        -- optional
--     mix = { frontier = .7, review = .2, explore = .1 }, -- band only
--     seed = 1,
--   }
--   local tasks = cur:sample(16, rl.rng(7))   -- tagged task.cell, task.params, task.key
--   cur:observe(batch)                          -- success per arm (errors, unscorable: ignored)
--   cur:stats(); cur:state(); cur:load(state)   -- state: JSON data, resume is exact
--   cur:admit(task, meta); cur:retire(key, why); cur:regress(key)   -- pools (synthesis)
--
-- Sources: C.pool, C.procedural (with C.levels, C.range, C.horizon parameters), C.horizon{...,
-- env =}, C.backward (moonrl.curriculum.sources). Samplers: moonrl.curriculum.samplers. Gate:
-- moonrl.curriculum.gate. Everything is deterministic from the rng given to sample (or the
-- curriculum's seed) and its state; nothing depends on pairs() order.
local core = require "moonrl.core"
local check = require "moonrl.curriculum.check"
local sources = require "moonrl.curriculum.sources"
local samplers = require "moonrl.curriculum.samplers"
local gatelib = require "moonrl.curriculum.gate"
local beta = require "moonrl.curriculum.beta"
local seedlib = require "moonrl.train.seed"

local json, mix = core.json, seedlib.mix

local M = {
  levels = sources.levels, range = sources.range, procedural = sources.procedural,
  horizon = sources.horizon, backward = sources.backward, pool = sources.pool,
  uniform = samplers.uniform, band = samplers.band, pools = samplers.pools,
  learnability = samplers.learnability, gate = gatelib.gate, beta = beta,
}

local Curriculum = { __name = "moonrl.curriculum" }
Curriculum.__index = Curriculum
M.Curriculum = Curriculum

function M.is_curriculum(v) return getmetatable(v) == Curriculum end

local MAX_ENUMERATED = 100000
local STATE_VERSION = 1

local function is_source(v)
  local mt = getmetatable(v)
  return mt == sources.Grid or mt == sources.Pool or (mt == sources.Levels and v.horizon)
end

local function mix_check(v)
  if type(v) ~= "table" then return "a table {frontier =, review =, explore =}" end
  return nil
end

-- rl.curriculum.new{source =, sampler = uniform(), gate =, mix =, seed = 0}.
function M.new(opts)
  local who = "rl.curriculum.new"
  local o = check.fields(who, opts, {
    { "source", function(v) if is_source(v) then return nil end
      return "a source (rl.curriculum.pool, procedural, horizon{..., env =} or backward)" end, nil, required = true },
    { "sampler", function(v) if samplers.is_sampler(v) then return nil end
      return "a sampler (rl.curriculum.uniform(), band, pools or learnability)" end, nil },
    { "gate", function(v) if gatelib.is_gate(v) then return nil end return "an rl.curriculum.gate{...}" end, nil },
    { "mix", mix_check, nil }, { "seed", check.integer(), 0 },
  }, 2)
  local src = o.source
  if getmetatable(src) == sources.Levels then
    if not src.env then
      check.fail(who, "source: a horizon without env is a parameter: put it in procedural's params, "
        .. "or give it env = (its tasks' environment)", 2)
    end
    src = sources.horizon_source(src)
  end
  local sampler = o.sampler or samplers.uniform()
  local grid = src.kind ~= "pool"
  if sampler.needs_grid and not grid then
    check.fail(who, string.format("sampler: %s moves levels; a pool has none (use pools, learnability "
      .. "or uniform, or a procedural source)", sampler.name), 2)
  end
  if sampler.enumerates and grid and src:size() > MAX_ENUMERATED then
    check.fail(who, string.format("sampler: %s weighs every cell; this grid has %d (at most %d)",
      sampler.name, src:size(), MAX_ENUMERATED), 2)
  end
  local mx = o.mix
  if mx and not sampler.uses_mix then
    check.fail(who, string.format("mix: only the band sampler splits its draws into frontier, review "
      .. "and explore; %s has its own rule", sampler.name), 2)
  end
  if sampler.uses_mix then
    local m = check.fields(who .. ": mix", mx or { frontier = 0.7, review = 0.2, explore = 0.1 }, {
      { "frontier", check.number(0, 1), 0 }, { "review", check.number(0, 1), 0 },
      { "explore", check.number(0, 1), 0 },
    }, 2)
    if math.abs(m.frontier + m.review + m.explore - 1) > 1e-9 then
      check.fail(who, string.format("mix: frontier + review + explore must be 1, got %g",
        m.frontier + m.review + m.explore), 2)
    end
    mx = m
  end
  local cur = setmetatable({ src = src, sampler = sampler, gate = o.gate, mix = mx, seed = o.seed,
    grid = grid, forget = sampler.forget_rate or 1, arms = {}, order = {}, calls = 0, draws = 0,
    observes = 0, frontier_draws = 0 }, Curriculum)
  if grid then
    if sampler.enumerates then
      cur.cells_all = {}
      for k = 1, src:size() do
        local idx = src:cell_at(k)
        cur.cells_all[k] = { id = src:cell(idx), idx = idx }
      end
    end
  else
    cur.active, cur.tasks, cur.retired, cur.retired_order, cur.admitted = {}, {}, {}, {}, {}
    for _, t in ipairs(src.initial) do
      cur.tasks[t.key] = t
      cur.active[#cur.active + 1] = t.key
    end
  end
  cur.sst = sampler:init(cur)
  return cur
end

-- ---------------------------------------------------------------- arms

-- The statistics record of arm id (created on first use).
function Curriculum:arm(id, idx)
  local a = self.arms[id]
  if a then return a end
  a = { id = id, idx = idx, a = 1, b = 1, n = 0, s = 0, r = 0, ends = {}, draws = 0, frontier = 0,
    last_draw = 0, last_call = 0, last_obs = 0 }
  if not self.grid then a.cell = self.tasks[id] and self.tasks[id].cell or (self.retired[id] and self.retired[id].task.cell) end
  self.arms[id] = a
  self.order[#self.order + 1] = id
  return a
end

-- ---------------------------------------------------------------- sampling

local function as_rng(self, rng, level)
  if rng == nil then return core.rng(mix(self.seed, self.calls + 1)) end
  if math.type(rng) == "integer" then return core.rng(rng) end
  local mt = getmetatable(rng)
  if type(rng) == "userdata" and type(mt) == "table" and mt.__name == "moonrl.rng" then return rng end
  error("rl.curriculum: sample: rng: an rl.rng or an integer seed expected, got " .. check.describe(rng), level + 1)
end

-- cur:sample(n [, rng]) -> a list of n tasks, each tagged task.cell, task.params, task.key (and
-- task.max_turns for a horizon, task.start_turn for backward starts); nil, message when a pool
-- has no active task. rng: an rl.rng, an integer seed, or nil (the curriculum's own stream,
-- from its seed and the number of calls so far).
function Curriculum:sample(n, rng)
  if math.type(n) ~= "integer" or n < 1 then
    error("rl.curriculum: sample: n: a positive integer expected, got " .. check.describe(n), 2)
  end
  local r = as_rng(self, rng, 2)
  if not self.grid and #self.active == 0 then return nil, "rl.curriculum: the pool has no active task" end
  self.calls = self.calls + 1
  local picks = self.sampler:draw(self, n, r)
  local tasks
  if self.grid then
    local cells = {}
    for i, p in ipairs(picks) do cells[i] = p.idx end
    tasks = self.src:make(cells, r)
  else
    tasks = {}
    for i, p in ipairs(picks) do tasks[i] = self.tasks[p.id] end
  end
  for i, p in ipairs(picks) do
    local id = self.grid and tasks[i].cell or p.id
    local arm = self:arm(id, p.idx)
    self.draws = self.draws + 1
    arm.draws, arm.last_draw, arm.last_call = arm.draws + 1, self.draws, self.calls
    if p.kind == "frontier" then
      arm.frontier = arm.frontier + 1
      self.frontier_draws = self.frontier_draws + 1
    end
  end
  return tasks
end

-- ---------------------------------------------------------------- observing

-- Why an episode does not count (nil when it does): it ended in an error, or the reward graph
-- could not score it.
local function ignored(ep)
  if ep["end"] == "env_error" then return "env_error" end
  if ep.error ~= nil then return "error" end
  if ep.reward_status == "unscorable" then return "unscorable" end
  return nil
end

-- cur:observe(batch) -> {episodes =, ignored =, cells = {{cell =, n =, success =, reward =},
-- ...}, groups =, zero_variance =, moves = {...}}: each episode's success and reward counted
-- for its arm (episodes of tasks the curriculum did not give, of retired tasks, that ended in
-- env_error or an error, or whose reward_status is "unscorable" are left out); then the sampler
-- decides (band: level moves). batch: an rl.batch or a list of episode tables {task =, success
-- =, reward =, ["end"] =, group =}.
function Curriculum:observe(batch)
  local eps = type(batch) == "table" and (batch.episodes or (check.is_list(batch) and batch))
  if type(eps) ~= "table" then
    error("rl.curriculum: observe: batch: an rl.batch or a list of episodes expected, got " .. check.describe(batch), 2)
  end
  self.observes = self.observes + 1
  local touched, index, used, skipped = {}, {}, 0, 0
  local groups, group_order = {}, {}
  local f = self.forget
  for i, ep in ipairs(eps) do
    if type(ep) ~= "table" then
      error(string.format("rl.curriculum: observe: episode %d is %s, not a table", i, check.describe(ep)), 2)
    end
    local task = ep.task
    local id = type(task) == "table" and (self.grid and task.cell or task.key) or nil
    if type(id) == "string" and (self.grid and self.arms[id] or (not self.grid and self.tasks[id])) then
      if ignored(ep) then
        skipped = skipped + 1
      else
        used = used + 1
        local ok = ep.success and 1 or 0
        local r = check.finite(ep.reward) and ep.reward or 0
        local arm = self:arm(id)
        arm.a = 1 + f * (arm.a - 1) + ok
        arm.b = 1 + f * (arm.b - 1) + (1 - ok)
        arm.n, arm.s, arm.r = arm.n + 1, arm.s + ok, arm.r + r
        local e = ep["end"] or "done"
        arm.ends[e] = (arm.ends[e] or 0) + 1
        if arm.max_r == nil or r > arm.max_r then arm.max_r = r end
        local t = index[id]
        if not t then
          t = { id = id, n = 0, s = 0, r = 0 }
          index[id] = t
          touched[#touched + 1] = t
        end
        t.n, t.s, t.r = t.n + 1, t.s + ok, t.r + r
        if ep.group ~= nil then
          local g = groups[ep.group]
          if not g then
            g = {}
            groups[ep.group] = g
            group_order[#group_order + 1] = ep.group
          end
          g[#g + 1] = r
        end
      end
    end
  end
  for _, t in ipairs(touched) do
    local arm = self.arms[t.id]
    arm.latest_n, arm.latest_s, arm.latest_r, arm.last_obs = t.n, t.s, t.r, self.observes
  end
  local before = self.sst.moves and #self.sst.moves or 0
  self.sampler:observed(self, touched)
  local moves = {}
  if self.sst.moves then
    for k = before + 1, #self.sst.moves do moves[#moves + 1] = self.sst.moves[k] end
  end
  local flat, counted = 0, 0
  for _, g in ipairs(group_order) do
    local rs = groups[g]
    if #rs > 1 then
      counted = counted + 1
      local same = true
      for k = 2, #rs do same = same and rs[k] == rs[1] end
      if same then flat = flat + 1 end
    end
  end
  -- per cell (a pool's tasks summed by their cell), in first-appearance order
  local cells, cindex = {}, {}
  for _, t in ipairs(touched) do
    local cell = self.grid and t.id or self.arms[t.id].cell or "pool"
    local c = cindex[cell]
    if not c then
      c = { cell = cell, n = 0, s = 0, r = 0 }
      cindex[cell] = c
      cells[#cells + 1] = c
    end
    c.n, c.s, c.r = c.n + t.n, c.s + t.s, c.r + t.r
  end
  for _, c in ipairs(cells) do
    c.success, c.reward = c.s / c.n, c.r / c.n
    c.s, c.r = nil, nil
  end
  return { episodes = used, ignored = skipped, cells = cells, groups = counted,
    zero_variance = counted > 0 and flat / counted or 0, moves = moves }
end

-- ---------------------------------------------------------------- statistics

-- cur:stats() -> {sampler =, draws =, samples = (sample calls), observes =, frontier_share =,
-- cells = {[cell] = {n =, successes =, mean =, lo =, hi =, level = {param = value},
-- share =, frontier_share =, revisit_age =, reward_mean =, ends =, score =}}, order = {cells in
-- first-use order}, and for band: frontier = cell, levels = {param = value}, moves = {{at =,
-- param =, from =, to =, dir =, n =, mean =}, ...}; for a pool also keys = {[key] = the same
-- per task}, active =, retired =}. mean is the posterior mean of success (prior Beta(1, 1));
-- lo, hi its (1 - c) and c quantiles (c: the band's confidence, else .9); share the fraction of
-- all draws, frontier_share the fraction of all draws made as frontier draws; revisit_age the
-- sample calls since the arm was last drawn.
function Curriculum:stats()
  local conf = self.sampler.confidence or 0.9
  local out = { sampler = self.sampler.name, draws = self.draws, samples = self.calls,
    observes = self.observes, frontier_share = self.draws > 0 and self.frontier_draws / self.draws or 0,
    cells = {}, order = {} }
  local function entry(arm)
    local e = { n = arm.n, successes = arm.s, mean = samplers.mean(arm),
      lo = beta.quantile(1 - conf, arm.a, arm.b), hi = beta.quantile(conf, arm.a, arm.b),
      share = self.draws > 0 and arm.draws / self.draws or 0,
      frontier_share = self.draws > 0 and arm.frontier / self.draws or 0,
      revisit_age = arm.draws > 0 and self.calls - arm.last_call or nil,
      reward_mean = arm.n > 0 and arm.r / arm.n or nil, ends = arm.ends, score = arm.score }
    if self.grid and arm.idx then e.level = self.src:params(arm.idx) end
    return e
  end
  if self.grid then
    for _, id in ipairs(self.order) do
      out.cells[id] = entry(self.arms[id])
      out.order[#out.order + 1] = id
    end
  else
    out.keys, out.active, out.retired = {}, #self.active, #self.retired_order
    local sums, corder = {}, {}
    for _, id in ipairs(self.order) do
      local arm = self.arms[id]
      out.keys[id] = entry(arm)
      local cell = arm.cell or "pool"
      local c = sums[cell]
      if not c then
        c = { id = cell, a = 1, b = 1, n = 0, s = 0, r = 0, ends = {}, draws = 0, frontier = 0,
          last_call = 0 }
        sums[cell] = c
        corder[#corder + 1] = cell
      end
      c.n, c.s, c.r = c.n + arm.n, c.s + arm.s, c.r + arm.r
      c.a, c.b = c.a + (arm.a - 1), c.b + (arm.b - 1)
      c.draws, c.frontier = c.draws + arm.draws, c.frontier + arm.frontier
      c.last_call = math.max(c.last_call, arm.last_call)
      for k, v in pairs(arm.ends) do c.ends[k] = (c.ends[k] or 0) + v end
    end
    for _, cell in ipairs(corder) do
      out.cells[cell] = entry(sums[cell])
      out.order[#out.order + 1] = cell
    end
  end
  if self.sampler.name == "band" then
    local st = self.sst
    out.frontier = self.src:cell(st.level)
    out.levels = self.src:params(st.level)
    out.moves = {}
    for i, m in ipairs(st.moves) do out.moves[i] = m end
  end
  return out
end

-- cur:brief() -> {draws =, frontier_share =, frontier = cell, levels = {param = value}} (the
-- last two for band): what rl.train logs every step, without stats()'s per-arm bounds.
function Curriculum:brief()
  local out = { draws = self.draws, frontier_share = self.draws > 0 and self.frontier_draws / self.draws or 0 }
  if self.sampler.name == "band" then
    out.frontier, out.levels = self.src:cell(self.sst.level), self.src:params(self.sst.level)
  end
  return out
end

-- ---------------------------------------------------------------- pools: synthesis

local function need_pool(self, what)
  if self.grid then
    error(string.format("rl.curriculum: %s: only a pool source %s (this curriculum's source is %s)",
      what, what == "admit" and "admits tasks" or "retires tasks", self.src.kind), 3)
  end
end

-- cur:admit(task [, meta]) -> the task as the pool holds it (a tagged copy), or nil, message
-- when its key is already in the pool or was retired, or it is not JSON data (the pool's state
-- keeps it). meta: JSON data kept with it (provenance).
function Curriculum:admit(task, meta)
  need_pool(self, "admit")
  if type(task) ~= "table" then error("rl.curriculum: admit: task: a table expected, got " .. check.describe(task), 2) end
  local key, cell = self.src:key_of(task)
  if not key then return nil, "rl.curriculum: admit: " .. cell end
  local ok, why = pcall(json.encode, { task, meta })
  if not ok then return nil, "rl.curriculum: admit: the task or meta is not JSON data: " .. tostring(why):gsub("^json%.encode: ", "") end
  if self.tasks[key] then return nil, "rl.curriculum: admit: the pool already holds a task with key " .. key end
  if self.retired[key] then return nil, "rl.curriculum: admit: the task with key " .. key .. " was retired (regress brings it back)" end
  local t = self.src:tagged(task, key, cell)
  self.tasks[key] = t
  self.active[#self.active + 1] = key
  self.admitted[#self.admitted + 1] = { key = key, task = t, meta = meta }
  return t
end

local function remove_value(list, v)
  for i = #list, 1, -1 do if list[i] == v then table.remove(list, i) return true end end
  return false
end

-- cur:retire(key [, why]) -> true, or nil, message when no active task has that key. The task
-- leaves the draws (its statistics stay); why (a string) is kept.
function Curriculum:retire(key, why)
  need_pool(self, "retire")
  if type(key) ~= "string" then error("rl.curriculum: retire: key: a string expected, got " .. check.describe(key), 2) end
  if why ~= nil and type(why) ~= "string" then error("rl.curriculum: retire: why: a string expected, got " .. check.describe(why), 2) end
  if not self.tasks[key] then return nil, "rl.curriculum: retire: no active task with key " .. key end
  remove_value(self.active, key)
  self.retired[key] = { task = self.tasks[key], why = why or "retired", at = self.observes }
  self.retired_order[#self.retired_order + 1] = key
  self.tasks[key] = nil
  if self.sst.scored then
    remove_value(self.sst.scored, key)
    if self.arms[key] then self.arms[key].score = nil end
  end
  return true
end

-- cur:regress(key) -> true, or nil, message. A pool: the task (retired or active) is back in the
-- draws with fresh evidence (its posterior reset to the prior, its learnability score dropped),
-- as when a mastered task is forgotten. A band grid: key names a parameter, moved one level down.
function Curriculum:regress(key)
  if type(key) ~= "string" then error("rl.curriculum: regress: key: a string expected, got " .. check.describe(key), 2) end
  if self.grid then
    if self.sampler.name ~= "band" then
      return nil, "rl.curriculum: regress: a " .. self.sampler.name .. " grid has no level to move down"
    end
    for i, name in ipairs(self.src.names) do
      if name == key then
        local st = self.sst
        if st.level[i] <= 1 then return nil, "rl.curriculum: regress: " .. key .. " is at its first level" end
        local arm = self:arm(self.src:cell(st.level), { table.unpack(st.level) })
        local from = st.level[i]
        st.level[i] = from - 1
        st.last_dir[i] = -1
        remove_value(st.stack, i)
        st.moves[#st.moves + 1] = { at = self.observes, param = key, from = self.src.values[i][from],
          to = self.src.values[i][from - 1], dir = -1, n = st.since, mean = samplers.mean(arm), regress = true }
        st.since, st.cool = 0, self.sampler.cooldown
        return true
      end
    end
    return nil, "rl.curriculum: regress: no parameter named " .. key
  end
  local back = self.retired[key]
  if back then
    self.retired[key] = nil
    remove_value(self.retired_order, key)
    self.tasks[key] = back.task
    self.active[#self.active + 1] = key
  elseif not self.tasks[key] then
    return nil, "rl.curriculum: regress: no task with key " .. key
  end
  local arm = self.arms[key]
  if arm then
    arm.a, arm.b, arm.score = 1, 1, nil
    if self.sst.scored then remove_value(self.sst.scored, key) end
  end
  return true
end

-- ---------------------------------------------------------------- state

local ARM_FIELDS = { "id", "a", "b", "n", "s", "r", "draws", "frontier", "last_draw", "last_call",
  "last_obs", "latest_n", "latest_s", "latest_r", "max_r", "score", "cell" }

-- A deep copy of plain data with every list marked as a JSON array (so that an empty list
-- stays a list).
local function data(v)
  if type(v) ~= "table" then return v end
  local out = {}
  for k, x in pairs(v) do out[k] = data(x) end
  if check.is_list(v) and #v > 0 then json.array(out) end
  return out
end

local function list(v) return json.array(data(v) or {}) end

-- cur:state() -> JSON data: every statistic, the sampler's state (levels, moves, scores), the
-- counters and the pool's membership; cur:load(state) restores it exactly (across processes).
function Curriculum:state()
  local arms = {}
  for i, id in ipairs(self.order) do
    local a, rec = self.arms[id], {}
    for _, k in ipairs(ARM_FIELDS) do rec[k] = a[k] end
    rec.idx = a.idx and list(a.idx) or nil
    rec.ends = data(a.ends)
    arms[i] = rec
  end
  local st = { version = STATE_VERSION, kind = self.src.kind, sampler = self.sampler.name,
    calls = self.calls, draws = self.draws, observes = self.observes,
    frontier_draws = self.frontier_draws, arms = json.array(arms), sst = {} }
  for k, v in pairs(self.sst) do st.sst[k] = type(v) == "table" and list(v) or v end
  if self.sst.moves then
    local moves = {}
    for i, m in ipairs(self.sst.moves) do moves[i] = data(m) end
    st.sst.moves = json.array(moves)
  end
  if not self.grid then
    local admitted, retired = {}, {}
    for i, a in ipairs(self.admitted) do admitted[i] = { key = a.key, task = data(a.task), meta = data(a.meta) } end
    for i, key in ipairs(self.retired_order) do
      local r = self.retired[key]
      retired[i] = { key = key, why = r.why, at = r.at, task = data(r.task) }
    end
    st.pool = { active = list(self.active), admitted = json.array(admitted), retired = json.array(retired) }
  end
  return st
end

local function load_fail(msg) error("rl.curriculum: load: " .. msg, 3) end

function Curriculum:load(st)
  if type(st) ~= "table" or st.version ~= STATE_VERSION or type(st.arms) ~= "table" or type(st.sst) ~= "table" then
    load_fail("not a curriculum state (cur:state()'s value expected)")
  end
  if st.kind ~= self.src.kind or st.sampler ~= self.sampler.name then
    load_fail(string.format("the state is of a %s source with the %s sampler; this curriculum has a %s "
      .. "source with %s", tostring(st.kind), tostring(st.sampler), self.src.kind, self.sampler.name))
  end
  local pool_state
  if not self.grid then
    local p = st.pool
    if type(p) ~= "table" then load_fail("the state has no pool membership") end
    local known = {}
    for _, t in ipairs(self.src.initial) do known[t.key] = t end
    self.admitted = {}
    for _, a in ipairs(p.admitted or {}) do
      known[a.key] = a.task
      self.admitted[#self.admitted + 1] = { key = a.key, task = a.task, meta = a.meta }
    end
    local retired, rorder = {}, {}
    for _, r in ipairs(p.retired or {}) do
      retired[r.key] = { task = r.task, why = r.why, at = r.at }
      rorder[#rorder + 1] = r.key
    end
    local active, tasks = {}, {}
    for _, key in ipairs(p.active or {}) do
      if not known[key] then
        load_fail("the pool has no task with key " .. tostring(key) .. " (built from other tasks?)")
      end
      active[#active + 1] = key
      tasks[key] = known[key]
    end
    pool_state = { active = active, tasks = tasks, retired = retired, rorder = rorder }
  end
  local arms, order = {}, {}
  for _, rec in ipairs(st.arms) do
    local a = { ends = {} }
    for _, k in ipairs(ARM_FIELDS) do a[k] = rec[k] end
    for k, v in pairs(rec.ends or {}) do a.ends[k] = v end
    if rec.idx then
      a.idx = {}
      for i, v in ipairs(rec.idx) do a.idx[i] = v end
    end
    arms[a.id] = a
    order[#order + 1] = a.id
  end
  local sst = {}
  for k, v in pairs(st.sst) do
    if type(v) == "table" then
      local t = {}
      for i, x in ipairs(v) do t[i] = type(x) == "table" and data(x) or x end
      sst[k] = t
    else
      sst[k] = v
    end
  end
  self.arms, self.order, self.sst = arms, order, sst
  self.calls, self.draws, self.observes, self.frontier_draws = st.calls, st.draws, st.observes, st.frontier_draws
  if pool_state then
    self.active, self.tasks = pool_state.active, pool_state.tasks
    self.retired, self.retired_order = pool_state.retired, pool_state.rorder
  end
end

-- ---------------------------------------------------------------- rl.train's use

-- The settings, as JSON data (rl.train keeps them in state.json's options, so that resuming
-- with another curriculum is refused).
function Curriculum:config()
  return { source = self.src:config(), sampler = self.sampler:config(),
    gate = self.gate and self.gate:config() or nil, mix = self.mix, seed = self.seed }
end

-- The environment rl.train should roll out: env wrapped to start backward tasks from their
-- snapshots, else env itself.
function Curriculum:wrap_env(env)
  if self.src.wrap then return self.src:wrap(env) end
  return env
end

-- The environment the source draws its tasks from (nil for a procedural source or a list pool).
function Curriculum:env() return self.src.env end

function Curriculum:__tostring()
  return string.format("rl.curriculum (%s source, %s sampler, %d draws)", self.src.kind, self.sampler.name, self.draws)
end

return M
