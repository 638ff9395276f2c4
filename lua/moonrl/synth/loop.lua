-- moonrl.synth.loop: the closed synthesis loop in one process (rl.synth.loop): propose ->
-- contract -> verify (all verifiers) -> novelty -> calibrate by the current policy's pass rate
-- -> admit into the curriculum pool; retire what the policy has mastered, bring back what it
-- forgot; every task's provenance in an archive.
--
--   local loop = rl.synth.loop {
--     propose = rl.synth.proposer{...} | rl.synth.mutate{...},
--     verify = { rl.synth.exec{}, rl.synth.oracle(env.solve) },   -- all must pass
--     calibrate = rl.synth.pass_rate{ k = 8, band = { .125, .875 } },
--     novelty = rl.synth.novelty{...} | false,
--     target = rl.synth.target{...},             -- optional: exemplars from failure clusters
--     pool = cur,                                -- an rl.curriculum with a pool source
--     reward = "learnability",                   -- "one_minus", "min" or fn(p, task) -> number
--     penalties = { invalid = -1, duplicate = -0.5 },
--     every = 1, per_step = 16, max_pool = 5000,
--     retire = { above = 0.9, window = 16 },     -- mastered: the last `window` training
--                                                -- rollouts of a task succeed at >= above;
--                                                -- with below = q also failing: at <= q
--     probe = 2,                                 -- mastered tasks re-measured per step; one
--                                                -- measured under `above` comes back
--     contract = c,                              -- for proposers without one (mutate)
--     key = fn(task) -> string, seed = 0,
--   }
--   local r = loop:step(ctx)   -- {proposed =, invalid = {reason = n}, duplicate =, too_easy =,
--                              --  too_hard =, admitted =, mean_p =, reward =, retired =,
--                              --  regressed =, pool =, pool_median_p =, targeted =}
--   loop:observe(batch)        -- after a training step: retirement, failure clusters
--   loop:archive()             -- every proposal with its provenance
--   loop:state(), loop:load(s) -- JSON data; rl.train{synth = loop} checkpoints it
--
-- In rl.train, ctx is the trainer's: proposals by "self" are sampled from the policy being
-- trained and learn from their rewards, and calibration rolls the candidates out through the
-- trainer's rollout stage. Elsewhere ctx may be {solve = fn(tasks, k, seed)} (a simulated
-- policy; moonrl.synth.solver). The k-th step draws from seeds mix(seed, k, ...), so a loop
-- restored by load continues exactly.
local core = require "moonrl.core"
local argcheck = require "moonrl.argcheck"
local contractlib = require "moonrl.synth.contract"
local verifylib = require "moonrl.synth.verify"
local calibrate = require "moonrl.synth.calibrate"
local noveltylib = require "moonrl.synth.novelty"
local targetlib = require "moonrl.synth.target"
local proposerlib = require "moonrl.synth.proposer"
local seedlib = require "moonrl.train.seed"

local json, mix = core.json, seedlib.mix
local M = {}
local Loop = { __name = "moonrl.synth.loop" }
Loop.__index = Loop
M.Loop = Loop

local STATE_VERSION = 1
local REWARDS = { "learnability", "one_minus", "min" }

-- The proposer rewards of a measured pass rate p.
local REWARD_FN = {
  learnability = function(p) return 4 * p * (1 - p) end,
  -- Absolute Zero's: 1 - p for a task the solver sometimes solves, nothing for 0 or 1
  one_minus = function(p) if p <= 0 or p >= 1 then return 0 end return 1 - p end,
  -- R-Zero's: 1 - 2|p - 1/2|
  min = function(p) return 2 * math.min(p, 1 - p) end,
}

local function hash(s) return require("moonrl.reward.judge").hash(s) end

-- A deep copy of plain data with lists marked as JSON arrays.
local function data(v)
  if type(v) ~= "table" then return v end
  local out, n = {}, 0
  for k, x in pairs(v) do out[k] = data(x) n = n + 1 end
  if n > 0 and #v == n then json.array(out) end
  return out
end

local function is_curriculum(v)
  return type(v) == "table" and type(v.admit) == "function" and type(v.retire) == "function"
    and type(v.regress) == "function"
end

local function verify_list(v)
  if v ~= nil and argcheck.is_list(v) then
    local all = true
    for _, x in ipairs(v) do all = all and verifylib.is_verifier(x) end
    if all then return nil end
  end
  return "a list of verifiers (rl.synth.exec{}, oracle(fn), vote{}, judge{} or functions)"
end

local penalty_check = argcheck.sub("rl.synth.loop: penalties", {
  { "invalid", -1, argcheck.number() },
  { "duplicate", -0.5, argcheck.number() },
})

local retire_fields = argcheck.sub("rl.synth.loop: retire", {
  { "above", nil, argcheck.number(0, 1, true) },
  { "below", nil, argcheck.number(0, 1) },
  { "window", nil, argcheck.integer(1) },
})
local function retire_check(v)
  if v == false then return nil end
  if type(v) ~= "table" then return "false or a table {above =, below =, window =}" end
  local bad = retire_fields(v)
  if bad then return bad end
  if v.below and v.below >= (v.above or 0.9) then
    return { string.format("rl.synth.loop: retire: below (%g) must be under above (%g)", v.below, v.above or 0.9) }
  end
  return nil
end

-- rl.synth.loop{...}: see the top of this file.
function M.loop(opts)
  local who = "rl.synth.loop"
  local o = argcheck.fields(who, opts, {
    { "propose", nil, function(v) if proposerlib.is_proposer(v) then return nil end
      return "a proposer (rl.synth.proposer{...}, rl.synth.mutate{...} or an object with :propose)" end,
      required = true },
    { "verify", {}, verify_list },
    { "calibrate", nil, function(v) if calibrate.is_pass_rate(v) then return nil end
      return "an rl.synth.pass_rate{...}" end },
    { "novelty", nil, argcheck.either(argcheck.literal(false, "false"), function(v)
      if noveltylib.is_novelty(v) then return nil end return "an rl.synth.novelty{...}" end) },
    { "target", nil, function(v) if targetlib.is_target(v) then return nil end return "an rl.synth.target{...}" end },
    { "pool", nil, function(v) if is_curriculum(v) then return nil end
      return "a curriculum with a pool source (rl.curriculum.new{source = rl.curriculum.pool{...}})" end },
    { "reward", "learnability", argcheck.either(argcheck.one_of(REWARDS),
      argcheck.kind("function", "a function(p, task) -> number")) },
    { "penalties", nil, penalty_check },
    { "every", 1, argcheck.integer(1) },
    { "per_step", 16, argcheck.integer(1) },
    { "max_pool", 5000, argcheck.integer(1) },
    { "retire", nil, retire_check },
    { "probe", 2, argcheck.integer(0) },
    { "contract", nil, function(v) if contractlib.is_contract(v) then return nil end
      return "an rl.synth.contract{...}" end },
    { "key", nil, argcheck.kind("function", "a function(task) -> string") },
    { "seed", 0, argcheck.integer() },
  }, 2)
  local pen = o.penalties or {}
  local ret = o.retire
  local self = setmetatable({
    proposer = o.propose, verifiers = {}, calibrator = o.calibrate or calibrate.pass_rate {},
    novelty = o.novelty == nil and noveltylib.novelty {} or o.novelty or nil, target = o.target,
    pool = o.pool, reward_name = type(o.reward) == "string" and o.reward or "<function>",
    reward_fn = type(o.reward) == "function" and o.reward or REWARD_FN[o.reward],
    penalties = { invalid = pen.invalid or -1, duplicate = pen.duplicate or -0.5 },
    every = o.every, per_step = o.per_step, max_pool = o.max_pool,
    retire = ret ~= false and { above = ret and ret.above or 0.9, below = ret and ret.below or nil,
      window = ret and ret.window or 16 } or nil,
    probe = o.probe, contract = o.contract or (getmetatable(o.propose) == proposerlib.Proposer and o.propose.contract) or nil,
    key_fn = o.key, seed = o.seed,
  }, Loop)
  for i, v in ipairs(o.verify) do self.verifiers[i] = v end
  if self.target and self.target.from and self.pool and self.target.from ~= self.pool then
    error(who .. ": target: its from is another curriculum than pool", 2)
  end
  self:reset()
  return self
end

function M.is_loop(v) return getmetatable(v) == Loop end

-- The tasks the loop knows before it has synthesised anything: the proposer's seeds.
local function seed_tasks(self)
  return self.proposer.seeds or {}
end

-- Back to the state of a new loop (rl.train calls it when a run starts fresh).
function Loop:reset()
  self.t = 0
  self.records = {}   -- the archive, by id
  self.active = {}    -- keys of admitted tasks still in the pool, in admission order
  self.by_key = {}    -- key -> record id
  self.windows = {}   -- key -> the latest training outcomes (0/1), oldest first
  self.retired = {}   -- keys retired by the loop, oldest first (probed round-robin)
  self.probe_at = 1
  self.totals = { proposed = 0, admitted = 0, invalid = 0, duplicate = 0, too_easy = 0, too_hard = 0,
    retired = 0, regressed = 0 }
  if self.novelty then
    self.novelty:clear()
    for i, t in ipairs(seed_tasks(self)) do self.novelty:add(t, "pool", "seed:" .. i) end
  end
  if self.target then self.target:load({ clusters = {} }) end
  if self.proposer.reset and self.proposer.state then self.proposer:reset() end
end

-- The key of a synthesised task in the pool: the loop's key, else the pool's own (a pool with a
-- key function keys what it admits by it, and the training episodes carry that key: another
-- one here would leave retirement and the p history blind), else a hash of the task.
function Loop:key_of(task)
  local src = not self.key_fn and self.pool and self.pool.src
  if type(src) == "table" and src.key_fn and type(src.key_of) == "function" then
    local k = src:key_of(task)
    if type(k) == "string" then return k end
  end
  if self.key_fn then
    local k = self.key_fn(task)
    if type(k) ~= "string" then error("rl.synth.loop: key returned " .. argcheck.describe(k) .. " (a string expected)", 0) end
    return k
  end
  local copy = {}
  for k, v in pairs(task) do if k ~= "key" and k ~= "cell" and k ~= "params" and k ~= "target" then copy[k] = v end end
  return "synth:" .. hash(json.encode(copy)):sub(1, 16)
end

-- Exemplars for the proposer's prompts: the failure clusters' (with a target that has seen
-- failures), else seeds and admitted tasks, uniformly.
function Loop:exemplars(n, rng)
  if self.target then
    local ex = self.target:exemplars(n, rng)
    if #ex > 0 then return ex, true end
  end
  local known = {}
  for _, t in ipairs(seed_tasks(self)) do known[#known + 1] = t end
  for _, key in ipairs(self.active) do known[#known + 1] = self.records[self.by_key[key]].task end
  local out = {}
  if #known == 0 then return out, false end
  for i = 1, n do out[i] = known[rng:random(#known)] end
  return out, false
end

local function median(list)
  if #list == 0 then return nil end
  local s = {}
  for i, v in ipairs(list) do s[i] = v end
  table.sort(s)
  local m = #s // 2
  if #s % 2 == 1 then return s[m + 1] end
  return (s[m] + s[m + 1]) / 2
end

local function last_p(rec)
  local h = rec.p
  return h and #h > 0 and h[#h].p or nil
end

-- Retires the key's task from the pool (why) and records it.
local function retire(self, key, why, p)
  local rec = self.records[self.by_key[key]]
  if self.pool then self.pool:retire(key, why) end
  for i = #self.active, 1, -1 do if self.active[i] == key then table.remove(self.active, i) end end
  if self.novelty then self.novelty:remove(rec.id, "pool") end
  rec.retired = rec.retired or {}
  rec.retired[#rec.retired + 1] = { step = self.t, why = why, p = p }
  rec.status = "retired"
  self.retired[#self.retired + 1] = key
  self.windows[key] = nil
  self.totals.retired = self.totals.retired + 1
end

-- Re-measures up to `probe` tasks retired as mastered; one the policy no longer masters goes
-- back into the pool: measured under retire.above (the bar it was retired at; without
-- retirement windows, within or below the calibration band). A task measured at the bar or over
-- stays out, so a task whose pass rate sits near the bar is not retired and readmitted by turns.
local function probe_retired(self, ctx, seed, out)
  local mastered = {}
  for _, key in ipairs(self.retired) do
    local rec = self.records[self.by_key[key]]
    local last = rec.retired[#rec.retired]
    if last.why == "mastered" then mastered[#mastered + 1] = key end
  end
  if self.probe == 0 or #mastered == 0 then return end
  local keys, tasks = {}, {}
  for i = 0, math.min(self.probe, #mastered) - 1 do
    local key = mastered[(self.probe_at - 1 + i) % #mastered + 1]
    keys[#keys + 1] = key
    tasks[#tasks + 1] = self.records[self.by_key[key]].task
  end
  self.probe_at = (self.probe_at - 1 + #keys) % #mastered + 1
  local ps = self.calibrator:measure(ctx, tasks, mix(seed, 0xB0B))
  for i, key in ipairs(keys) do
    local rec = self.records[self.by_key[key]]
    rec.p[#rec.p + 1] = { step = self.t, p = ps[i].p, n = ps[i].k, source = "probe" }
    local bar_ok -- whether the probe says the task is no longer mastered
    if self.retire then bar_ok = ps[i].p < self.retire.above else bar_ok = ps[i].p <= self.calibrator.band[2] end
    if bar_ok then
      local ok = not self.pool or self.pool:regress(key)
      if ok then
        for j = #self.retired, 1, -1 do if self.retired[j] == key then table.remove(self.retired, j) end end
        self.active[#self.active + 1] = key
        self.windows[key] = {}
        if self.novelty then self.novelty:add(rec.task, "pool", rec.id) end
        rec.regressed = rec.regressed or {}
        rec.regressed[#rec.regressed + 1] = { step = self.t, p = ps[i].p }
        rec.status = "admitted"
        out.regressed = out.regressed + 1
        self.totals.regressed = self.totals.regressed + 1
      end
    end
  end
end

local function count(t, reason) t[reason] = (t[reason] or 0) + 1 end

-- The text kept in the archive of a proposal (its first 400 bytes).
local function short(s) if type(s) ~= "string" then return nil end return #s > 400 and s:sub(1, 400) .. "..." or s end

-- Admits a calibrated record's task into the pool (retiring the oldest admitted task first
-- when max_pool are in it).
local function admit(self, rec, out)
  local task = rec.task
  local key = self:key_of(task)
  if self.by_key[key] then
    rec.status, rec.reason = "refused", "key_taken"
    out.refused = out.refused + 1
    return
  end
  while #self.active >= self.max_pool do
    retire(self, self.active[1], "max_pool")
    out.retired = out.retired + 1
  end
  local admitted = {}
  for k, v in pairs(task) do admitted[k] = v end
  admitted.key = key
  if self.pool then
    local held, why = self.pool:admit(admitted, { synth = rec.id, step = self.t, p = last_p(rec) })
    if not held then
      rec.status, rec.reason, rec.message = "refused", "pool_refused", tostring(why)
      out.refused = out.refused + 1
      return
    end
  end
  rec.key, rec.status, rec.admitted = key, "admitted", self.t
  rec.task = admitted
  self.by_key[key] = rec.id
  self.active[#self.active + 1] = key
  self.windows[key] = {}
  if self.novelty then self.novelty:add(task, "pool", rec.id) end
  out.admitted = out.admitted + 1
end

-- loop:step(ctx [, train_step]) -> this step's figures (see the top of this file).
function Loop:step(ctx, train_step)
  self.t = self.t + 1
  local t = self.t
  local seed = mix(self.seed, t)
  local rng = core.rng(mix(seed, 1))
  local out = { step = t, proposed = 0, invalid = {}, duplicate = 0, too_easy = 0, too_hard = 0, admitted = 0,
    refused = 0, retired = 0, regressed = 0, targeted = 0 }
  probe_retired(self, ctx, seed, out)
  local groups = math.ceil(self.per_step / math.max(self.proposer.group or 1, 1))
  local exemplars, targeted = self:exemplars(groups, rng)
  local items = self.proposer:propose(ctx, self.per_step, mix(seed, 2), exemplars)
  if type(items) ~= "table" or #items ~= self.per_step then
    error(string.format("rl.synth.loop: the proposer returned %s for %d proposals", type(items) == "table"
      and #items .. " proposals" or type(items), self.per_step), 0)
  end
  local rewards, recs, candidates, cand_recs = {}, {}, {}, {}
  -- for a contract's generator: whether the novelty index already holds such a task
  local known = self.novelty and function(fields)
    local ok, novel = pcall(self.novelty.check, self.novelty, fields)
    return ok and novel ~= true
  end or nil
  for i, it in ipairs(items) do
    out.proposed = out.proposed + 1
    local rec = { id = #self.records + 1, step = t, text = short(it.text),
      exemplar = it.exemplar and (it.exemplar.key or it.exemplar.instruction) or nil,
      target = targeted and it.exemplar and it.exemplar.target or nil, verifiers = {}, p = {} }
    if rec.target then out.targeted = out.targeted + 1 end
    self.records[rec.id] = rec
    recs[i] = rec
    local task, reason, msg
    if it.error then
      reason, msg = it.error == "mutation_failed" and "mutation_failed" or "proposer_error", it.error
    elseif self.contract then
      task, reason, msg = self.contract:validate(it.task or it.text, it.exemplar, core.rng(mix(seed, 5, i)), known)
    elseif type(it.task) == "table" then
      task = {}
      for k, v in pairs(it.task) do task[k] = v end
    else
      reason, msg = "unparsable", "the proposal is text and the loop has no contract to read it"
    end
    if task then
      task.key, task.cell, task.target = nil, nil, nil
      for vi, v in ipairs(self.verifiers) do
        local ok, a, b
        if type(v) == "function" then ok, a, b = v(task, ctx)
        else ok, a, b = v:verify(task, ctx, mix(seed, 3, i, vi)) end
        local vr = { name = type(v) == "table" and v.name or "fn", ok = ok and true or false }
        if ok then
          if type(a) == "table" and a.label then vr.label = a.label end
        else
          vr.reason, vr.message = tostring(a or "rejected"), b and tostring(b) or nil
        end
        rec.verifiers[#rec.verifiers + 1] = vr
        if not ok then reason, msg, task = vr.reason, vr.message, nil break end
      end
    end
    if task then rec.task = task end
    if not task then
      rec.status, rec.reason, rec.message = "invalid", reason, msg
      count(out.invalid, reason)
      rewards[i] = self.penalties.invalid
    else
      local novel, why, info = true, nil, nil
      if self.novelty then novel, why, info = self.novelty:check(task) end
      if not novel then
        rec.status, rec.reason = "duplicate", why
        rec.similar = { id = info.id, index = info.index, similarity = info.similarity }
        out.duplicate = out.duplicate + 1
        rewards[i] = self.penalties.duplicate
      else
        if self.novelty then self.novelty:add(task, "archive", rec.id) end
        candidates[#candidates + 1] = task
        cand_recs[#cand_recs + 1] = { rec = rec, i = i }
      end
    end
  end
  local psum = 0
  if #candidates > 0 then
    local ps = self.calibrator:measure(ctx, candidates, mix(seed, 4))
    for j, c in ipairs(cand_recs) do
      local rec, p = c.rec, ps[j].p
      psum = psum + p
      rec.p[#rec.p + 1] = { step = t, p = p, n = ps[j].k, source = "calibrate" }
      local r = self.reward_fn(p, rec.task)
      if type(r) ~= "number" or r ~= r then
        error("rl.synth.loop: reward returned " .. argcheck.describe(r) .. " (a number expected)", 0)
      end
      rewards[c.i] = r
      local verdict = self.calibrator:verdict(p)
      if verdict ~= "ok" then
        rec.status, rec.reason = verdict, verdict
        out[verdict] = out[verdict] + 1
      else
        admit(self, rec, out)
      end
    end
  end
  for i, rec in ipairs(recs) do rec.reward = rewards[i] end
  out.mean_p = #candidates > 0 and psum / #candidates or nil
  local rsum = 0
  for i = 1, #items do rsum = rsum + rewards[i] end
  out.reward = rsum / #items
  if self.proposer.feedback then self.proposer:feedback(recs) end
  local lstats = self.proposer.learn and self.proposer:learn(ctx, rewards, train_step or t) or nil
  if lstats then out.learn = lstats end
  local ps = {}
  for _, key in ipairs(self.active) do
    local p = last_p(self.records[self.by_key[key]])
    if p then ps[#ps + 1] = p end
  end
  out.pool, out.pool_median_p = #self.active, median(ps)
  for _, k in ipairs { "proposed", "admitted", "duplicate", "too_easy", "too_hard" } do
    self.totals[k] = self.totals[k] + out[k]
  end
  for _, n in pairs(out.invalid) do self.totals.invalid = self.totals.invalid + n end
  self.last = out
  return out
end

-- loop:observe(batch): the training rollouts of admitted tasks count towards retirement (and
-- the p history), the failures towards the target's clusters.
function Loop:observe(batch)
  if self.target then self.target:observe(batch) end
  local seen, order = {}, {}
  for _, ep in ipairs(batch.episodes) do
    local key = type(ep.task) == "table" and ep.task.key or nil
    if key and self.windows[key] and ep.reward_status ~= "unscorable" and ep["end"] ~= "env_error" then
      local w = self.windows[key]
      w[#w + 1] = ep.success and 1 or 0
      if not seen[key] then seen[key] = { n = 0, s = 0 } order[#order + 1] = key end
      seen[key].n, seen[key].s = seen[key].n + 1, seen[key].s + (ep.success and 1 or 0)
    end
  end
  local retired, failing = 0, 0
  for _, key in ipairs(order) do
    local rec = self.records[self.by_key[key]]
    rec.p[#rec.p + 1] = { step = self.t, p = seen[key].s / seen[key].n, n = seen[key].n, source = "train" }
    local w = self.windows[key]
    if self.retire then
      while #w > self.retire.window do table.remove(w, 1) end
      if #w >= self.retire.window then
        local s = 0
        for _, x in ipairs(w) do s = s + x end
        if s / #w >= self.retire.above then
          retire(self, key, "mastered", s / #w)
          retired = retired + 1
        elseif self.retire.below and s / #w <= self.retire.below then
          retire(self, key, "failing", s / #w)
          failing = failing + 1
        end
      end
    end
  end
  return { retired = retired, failing = failing }
end

-- loop:archive() -> every proposal so far, oldest first: {id =, step =, status = "admitted" |
-- "retired" | "invalid" | "duplicate" | "too_easy" | "too_hard" | "refused", reason =, message =,
-- text =, task =, key =, exemplar =, target =, verifiers = {{name =, ok =, reason =, message =,
-- label =}}, similar = {id =, index =, similarity =}, p = {{step =, p =, n =, source =
-- "calibrate" | "train" | "probe"}}, reward =, admitted = step, retired = {{step =, why =, p =}},
-- regressed = {{step =, p =}}} (a copy).
function Loop:archive()
  return data(self.records)
end

-- loop:stats() -> totals over the run, the pool's size and median p, the last step's figures.
function Loop:stats()
  local ps = {}
  for _, key in ipairs(self.active) do
    local p = last_p(self.records[self.by_key[key]])
    if p then ps[#ps + 1] = p end
  end
  local out = {}
  for k, v in pairs(self.totals) do out[k] = v end
  out.pool, out.pool_median_p, out.steps, out.last = #self.active, median(ps), self.t, self.last
  out.clusters = self.target and self.target:clusters() or nil
  return out
end

-- ---------------------------------------------------------------- state

function Loop:state()
  local windows = {}
  for _, key in ipairs(self.active) do windows[#windows + 1] = { key = key, w = json.array(data(self.windows[key])) } end
  return { version = STATE_VERSION, t = self.t, records = json.array(data(self.records)),
    active = json.array(data(self.active)), retired = json.array(data(self.retired)), probe_at = self.probe_at,
    windows = json.array(windows), totals = data(self.totals),
    target = self.target and self.target:state() or nil,
    proposer = self.proposer.state and self.proposer:state() or nil }
end

function Loop:load(st)
  if type(st) ~= "table" or st.version ~= STATE_VERSION or type(st.records) ~= "table" then
    error("rl.synth.loop: load: a state from loop:state() expected, got " .. argcheck.describe(st), 2)
  end
  self:reset()
  self.t, self.probe_at = st.t, st.probe_at or 1
  for i, rec in ipairs(st.records) do self.records[i] = rec end
  for _, key in ipairs(st.active) do self.active[#self.active + 1] = key end
  for _, key in ipairs(st.retired) do self.retired[#self.retired + 1] = key end
  for _, rec in ipairs(self.records) do
    if rec.key then self.by_key[rec.key] = rec.id end
    rec.verifiers = rec.verifiers or {}
    rec.p = rec.p or {}
  end
  for _, w in ipairs(st.windows or {}) do
    local list = {}
    for i, x in ipairs(w.w) do list[i] = x end
    self.windows[w.key] = list
  end
  for k, v in pairs(st.totals or {}) do self.totals[k] = v end
  if self.novelty then
    local active = {}
    for _, key in ipairs(self.active) do active[key] = true end
    for _, rec in ipairs(self.records) do
      -- the archive index holds every task that passed its checks and was not a duplicate
      if rec.task and rec.status ~= "duplicate" and rec.status ~= "invalid" then
        self.novelty:add(rec.task, "archive", rec.id)
        if rec.key and active[rec.key] then self.novelty:add(rec.task, "pool", rec.id) end
      end
    end
  end
  if self.target and st.target then self.target:load(st.target) end
  if st.proposer and self.proposer.load then self.proposer:load(st.proposer) end
end

-- What the options were, for state.json's record of the run's options.
function Loop:config()
  local verifiers = {}
  for i, v in ipairs(self.verifiers) do verifiers[i] = type(v) == "table" and v.config and v:config() or "<function>" end
  return { propose = self.proposer.config and self.proposer:config() or "<object>", verify = verifiers,
    calibrate = self.calibrator:config(), novelty = self.novelty and self.novelty:config() or false,
    target = self.target and self.target:config() or nil, reward = self.reward_name, penalties = self.penalties,
    every = self.every, per_step = self.per_step, max_pool = self.max_pool, retire = self.retire or false,
    probe = self.probe, seed = self.seed }
end

return M
