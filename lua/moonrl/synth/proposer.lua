-- moonrl.synth.proposer: where proposals come from (rl.synth.proposer, rl.synth.mutate).
--
--   rl.synth.proposer { policy = "self" | <rl.model> | <client>, tokenizer =, contract = c,
--     prompt = string | fn(exemplar, ctx) -> string, seeds = { task, ... }, temperature =,
--     group = 4, max_tokens = 48, demos = fn(exemplar, rng) -> text, warm_start = 0, learn = true }
--   rl.synth.mutate { from = cur, fn = fn(task, rng) -> task | nil }
--   rl.synth.generator { gen = fn(params, rng) -> task, diagnose = rl.synth.target{...},
--     probe = fn(n, seed) -> tasks, probe_tasks = 128, probe_temperature = 0, weakest = 2,
--     levels = { 1, 2, 3 }, level = 1, min_episodes = 4 }
--
-- Both are objects with p:propose(ctx, n, seed, exemplars) -> n proposals {text = or task =,
-- exemplar =, group =}; the loop validates each with the contract and verifies it. A proposer
-- writes n / group prompts, one per exemplar (a task the loop chooses: a failure cluster's,
-- else a seed or an admitted task), and samples `group` proposals from each. Its policy is
--   "self"       the policy being trained (ctx.model, through the trainer's rollout engine);
--   an rl.model  another local model (with tokenizer =), rolled out on a rollout engine of its own;
--   a client     anything with client:chat(messages, opts) -> text (rl.reward's client interface).
-- With learn (the default for local models), p:learn(ctx, rewards, step) trains the proposal
-- episodes on their rewards (the loop's: 4p(1-p) by default, penalties for invalid and duplicate
-- proposals): GRPO over the proposals of one prompt, then the trainer's update stage (its loss,
-- optimizer and learning rate). The prompt is `prompt` with {exemplar} replaced by the contract's
-- rendering of the exemplar (a function gets the exemplar itself). p:sft_examples(tok, n, seed)
-- are warm-start demonstrations: a prompt for a seed and the text demos(seed, rng) returns (by
-- default another seed's rendering); rl.train adds warm_start of them to its SFT data when the
-- proposer is the policy ("self") and the run has an sft warm start.
local core = require "moonrl.core"
local argcheck = require "moonrl.argcheck"
local batchlib = require "moonrl.batch"
local contractlib = require "moonrl.synth.contract"
local seedlib = require "moonrl.train.seed"
local sftlib = require "moonrl.sft"

local mix = seedlib.mix
local M = {}

local Proposer = { __name = "moonrl.synth.proposer" }
Proposer.__index = Proposer
M.Proposer = Proposer

local Mutator = { __name = "moonrl.synth.mutate" }
Mutator.__index = Mutator
M.Mutator = Mutator

function M.is_proposer(v)
  local mt = getmetatable(v)
  if mt == Proposer or mt == Mutator then return true end
  return type(v) == "table" and type(v.propose) == "function"
end

local function is_model(v)
  local mt = getmetatable(v)
  return type(v) == "userdata" and type(mt) == "table" and mt.__name == "moonrl.model"
end

local function is_tokenizer(v)
  local mt = getmetatable(v)
  return type(v) == "userdata" and type(mt) == "table" and mt.__name == "moonrl.tokenizer"
end

local function is_client(v)
  return (type(v) == "table" or type(v) == "userdata") and pcall(function() return v.chat end)
    and type(v.chat) == "function"
end

local function policy_check(v)
  if v == "self" or is_model(v) or is_client(v) then return nil end
  return "\"self\", an rl.model or a client with :chat(messages, opts)"
end

local list_of_tables = argcheck.list_of(argcheck.table, "a non-empty list of tasks")

local DEFAULT_PROMPT = "Write a new task in this form, different from the example:\n{exemplar}"

-- The environment of a proposal episode: the prompt, one reply, done.
local PROPOSE_ENV = { name = "synth.proposer", max_turns = 1, format = "line" }
function PROPOSE_ENV.tasks() error("synth.proposer: proposals are not drawn from a split", 2) end
local Episode = {}
Episode.__index = Episode
function PROPOSE_ENV.new() return setmetatable({}, Episode) end
function Episode:reset(task) return task.prompt end
function Episode:step() return nil, 0, true, { success = false } end
M.env = PROPOSE_ENV

-- rl.synth.proposer{...}: see the top of this file.
function M.proposer(opts)
  local o = argcheck.fields("rl.synth.proposer", opts, {
    { "policy", nil, policy_check, required = true },
    { "tokenizer", nil, function(v) if is_tokenizer(v) then return nil end return "an rl.tokenizer" end },
    { "contract", nil, function(v) if contractlib.is_contract(v) then return nil end
      return "an rl.synth.contract{...}" end, required = true },
    { "prompt", DEFAULT_PROMPT, argcheck.either(argcheck.kind("string", "a string"),
      argcheck.kind("function", "a function(exemplar, ctx) -> string")) },
    { "seeds", nil, list_of_tables, required = true },
    { "temperature", nil, argcheck.number(0) },
    { "group", 4, argcheck.integer(1) },
    { "max_tokens", 48, argcheck.integer(1) },
    { "demos", nil, argcheck.kind("function", "a function(exemplar, rng) -> text") },
    { "warm_start", 0, argcheck.integer(0) },
    { "learn", nil, argcheck.kind("boolean", "true or false") },
  }, 2)
  local local_model = o.policy == "self" or is_model(o.policy)
  if is_model(o.policy) and not o.tokenizer then
    error("rl.synth.proposer: tokenizer: an rl.tokenizer expected (it is required with policy = an rl.model)", 2)
  end
  if o.learn and not local_model then
    error("rl.synth.proposer: learn: only a local policy (\"self\" or an rl.model) learns; a client's does not", 2)
  end
  local seeds = {}
  for i, t in ipairs(o.seeds) do
    local task, _, why = o.contract:validate(t)
    if not task then error(string.format("rl.synth.proposer: seeds[%d]: %s", i, why), 2) end
    seeds[i] = task
  end
  local kind = o.policy == "self" and "self" or is_model(o.policy) and "model" or "client"
  return setmetatable({ policy = o.policy, kind = kind, tokenizer = o.tokenizer, contract = o.contract,
    prompt = o.prompt, seeds = seeds, temperature = o.temperature, group = o.group,
    max_tokens = o.max_tokens, demos = o.demos, warm_start = o.warm_start, learns = (o.learn == nil and local_model) or o.learn == true },
    Proposer)
end

-- The prompt for an exemplar.
function Proposer:prompt_for(exemplar, ctx)
  if type(self.prompt) == "function" then
    local s = self.prompt(exemplar, ctx)
    if type(s) ~= "string" then
      error("rl.synth.proposer: prompt returned " .. argcheck.describe(s) .. " (a string expected)", 0)
    end
    return s
  end
  local text = self.contract:render(exemplar)
  return (self.prompt:gsub("{exemplar}", function() return text end))
end

-- The rollout engine and model of a local policy.
function Proposer:engine(ctx, n)
  if self.kind == "self" then
    if type(ctx) ~= "table" or not ctx.model or not ctx.ro then
      error("rl.synth.proposer: policy \"self\" proposes inside rl.train (the context has no model)", 0)
    end
    local c = ctx.cfg
    return ctx.ro, ctx.model, ctx.tokenizer, math.max(1, c.tasks_per_step * c.group_size)
  end
  if not self.ro or self.ro_size < n then
    if self.ro then self.ro:free() end
    self.ro = core.rollout.new { model = self.policy, episodes = n, capacity = self.policy:config().ctx }
    self.ro_size = n
  end
  return self.ro, self.policy, self.tokenizer, self.ro_size
end

-- p:propose(ctx, n, seed, exemplars) -> n proposals {text =, exemplar =, group =}. exemplars:
-- at least ceil(n / group) tasks (the loop's choice).
function Proposer:propose(ctx, n, seed, exemplars)
  local prompts, items = {}, {}
  local groups = math.ceil(n / self.group)
  for g = 1, groups do
    local ex = exemplars[(g - 1) % #exemplars + 1]
    prompts[g] = { prompt = self:prompt_for(ex, ctx), exemplar = ex }
  end
  for i = 1, n do
    local g = (i - 1) // self.group + 1
    items[i] = { exemplar = prompts[g].exemplar, group = g, prompt = prompts[g].prompt }
  end
  self.pending = nil
  if self.kind == "client" then
    for i, it in ipairs(items) do
      local ok, text, err = pcall(self.policy.chat, self.policy, { { role = "user", content = it.prompt } },
        { temperature = self.temperature, max_tokens = self.max_tokens, seed = mix(seed, i) })
      if ok and type(text) == "string" then it.text = text
      else it.error = tostring(ok and (err or "no reply") or text) end
    end
    return items
  end
  local ro, _, tok, cap = self:engine(ctx, n)
  local temperature = self.temperature or (ctx.cfg and ctx.cfg.temperature) or 1
  local parts = {}
  for first = 1, n, cap do
    local tasks, seeds, grp = {}, {}, {}
    for i = first, math.min(n, first + cap - 1) do
      tasks[#tasks + 1] = { prompt = items[i].prompt }
      seeds[#seeds + 1] = mix(seed, i)
      grp[#grp + 1] = items[i].group
    end
    local results = ro:run { tokenizer = tok, env = PROPOSE_ENV, tasks = tasks, seeds = seeds,
      max_turns = 1, max_turn_tokens = self.max_tokens, temperature = temperature }
    parts[#parts + 1] = batchlib.from_rollout(ro, results, grp)
  end
  local batch = #parts == 1 and parts[1] or batchlib.concat(parts)
  for i, ep in ipairs(batch.episodes) do
    local rec = ep.record and ep.record[1]
    items[i].text = rec and rec.action or ""
    ep.task = nil -- (the prompt is in the tokens)
  end
  self.pending = batch
  return items
end

-- p:learn(ctx, rewards, step) -> the update's stats (nil when nothing was learnt: a client, learn
-- = false, or every group's rewards equal).
function Proposer:learn(ctx, rewards, step)
  local batch = self.pending
  self.pending = nil
  if not self.learns or not batch then return nil end
  local scores, groups = {}, {}
  for i, ep in ipairs(batch.episodes) do
    scores[i], groups[i] = rewards[i], ep.group
    ep.reward, ep.success = rewards[i], rewards[i] > 0
  end
  local a = core.objective.advantage { method = "grpo", scores = scores, groups = groups,
    counts = batch:sampled_counts() }
  local any = false
  for _, v in ipairs(a) do any = any or v ~= 0 end
  if not any then return nil end
  local adv = core.objective.broadcast { values = a, mask = batch.mask, offsets = batch.offsets }
  -- the update stage without the solver's critic (proposals have no value targets), and for
  -- another model without the solver's reference
  local pctx = {}
  for k, v in pairs(ctx) do pctx[k] = v end
  pctx.value = nil
  if self.kind == "model" then pctx.model, pctx.ref = self.policy, nil end
  local update = ctx.stages and ctx.stages.update or require("moonrl.train.update").run
  return update(pctx, batch, adv, step)
end

-- p:sft_examples(tokenizer, n, seed) -> n SFT examples: a seed's prompt and a demonstration.
function Proposer:sft_examples(tok, n, seed)
  local out = {}
  for i = 1, n do
    local rng = core.rng(mix(seed, i))
    local ex = self.seeds[rng:random(#self.seeds)]
    local text
    if self.demos then
      text = self.demos(ex, rng)
      if type(text) ~= "string" then
        error("rl.synth.proposer: demos returned " .. argcheck.describe(text) .. " (a string expected)", 0)
      end
    else
      local other = self.seeds[rng:random(#self.seeds)]
      text = self.contract:render(other)
    end
    out[i] = sftlib.example(tok, { { role = "user", content = self:prompt_for(ex, nil) },
      { role = "assistant", content = text } })
  end
  return out
end

function Proposer:config()
  return { kind = self.kind, group = self.group, max_tokens = self.max_tokens,
    temperature = self.temperature, seeds = #self.seeds, learn = self.learns, warm_start = self.warm_start }
end

-- ---------------------------------------------------------------- mutate

local function is_curriculum(v)
  return type(v) == "table" and type(v.sample) == "function"
end

-- rl.synth.mutate{from = cur, fn = fn(task, rng) -> task | nil}: ACCEL-style: each proposal is
-- fn applied to an exemplar (the loop's: a failure cluster's, a seed, an admitted task; with no
-- exemplars, a task from:sample draws); nil from fn is an invalid proposal ("mutation_failed").
function M.mutate(opts)
  local o = argcheck.fields("rl.synth.mutate", opts, {
    { "from", nil, function(v) if is_curriculum(v) then return nil end
      return "a curriculum (an object with :sample(n, rng))" end },
    { "fn", nil, argcheck.kind("function", "a function(task, rng) -> task"), required = true },
    { "seeds", nil, list_of_tables },
  }, 2)
  return setmetatable({ from = o.from, fn = o.fn, seeds = o.seeds or {}, group = 1 }, Mutator)
end

function Mutator:propose(_, n, seed, exemplars)
  local rng = core.rng(mix(seed, 0x3A7))
  if (not exemplars or #exemplars == 0) and self.from then exemplars = self.from:sample(n, rng) end
  local items = {}
  for i = 1, n do
    local ex = exemplars[(i - 1) % #exemplars + 1]
    local base = {}
    for k, v in pairs(ex) do base[k] = v end
    base.key, base.cell, base.target = nil, nil, nil
    local ok, t = pcall(self.fn, base, core.rng(mix(seed, i)))
    if not ok then items[i] = { exemplar = ex, group = i, error = "the mutation raised: " .. tostring(t) }
    elseif type(t) ~= "table" then items[i] = { exemplar = ex, group = i, error = "mutation_failed" }
    else items[i] = { exemplar = ex, group = i, task = t } end
  end
  return items
end

function Mutator:learn() return nil end

function Mutator:config() return { kind = "mutate" } end

-- ---------------------------------------------------------------- generator

local Generator = { __name = "moonrl.synth.generator" }
Generator.__index = Generator
M.Generator = Generator

local solverlib = require "moonrl.synth.solver"

-- rl.synth.generator{...}: failure-targeted synthesis from a task generator (TRACE's diagnose
-- then synthesise, CoEvolve's difficulty by execution). Each p:propose(ctx, n, seed) first
-- probes: probe(probe_tasks, seed) target-like tasks, rolled out once each by the current
-- policy at probe_temperature (0: greedy; moonrl.synth.solver, so through the trainer's rollout
-- stage), observed by diagnose (an rl.synth.target: per-tag pass rates, the turn-type contrast);
-- without probe, diagnose holds whatever it was given to observe. Then its `weakest` tags of
-- lowest pass rate (in at least min_episodes probe episodes) are the focus: proposal i is
-- gen({focus = {tag}, level = that tag's level}, rng) for the focus tags in turn, or with an
-- empty focus when nothing is diagnosed yet. Levels (one per tag, from `level`, within
-- `levels`, easiest first) follow the loop's calibration (p:feedback): a tag whose proposals
-- were mostly too easy moves one level up, mostly too hard one down. p.last is the latest
-- diagnosis {tags =, weakest =, contrast =, levels =, probed =}; p.probed counts the probe
-- episodes (rollouts the run spends on diagnosis).
function M.generator(opts)
  local o = argcheck.fields("rl.synth.generator", opts, {
    { "gen", nil, argcheck.kind("function", "a function(params, rng) -> task"), required = true },
    { "diagnose", nil, function(v)
      if getmetatable(v) == require("moonrl.synth.target").Target then return nil end
      return "an rl.synth.target{...}" end, required = true },
    { "probe", nil, argcheck.kind("function", "a function(n, seed) -> a list of tasks") },
    { "probe_tasks", 128, argcheck.integer(1) },
    { "probe_temperature", 0, argcheck.number(0) },
    { "weakest", 2, argcheck.integer(1) },
    { "levels", { 1, 2, 3 }, argcheck.list_of(function(x) if x == nil then return "a level" end return nil end,
      "a non-empty list of levels, easiest first") },
    { "level", nil, function() return nil end },
    { "min_episodes", 4, argcheck.number(0) },
  }, 2)
  local levels = {}
  for i, v in ipairs(o.levels) do levels[i] = v end
  local start = 1
  if o.level ~= nil then
    start = nil
    for i, v in ipairs(levels) do if v == o.level then start = i end end
    if not start then error("rl.synth.generator: level: one of levels expected, got " .. argcheck.describe(o.level), 2) end
  end
  local self = setmetatable({ gen = o.gen, diagnose = o.diagnose, probe = o.probe, probe_tasks = o.probe_tasks,
    probe_temperature = o.probe_temperature, n_weakest = o.weakest, levels = levels, start = start,
    min_episodes = o.min_episodes, group = 1 }, Generator)
  self:reset()
  return self
end

function Generator:reset()
  self.level_of, self.pending, self.probed, self.last = {}, {}, 0, nil
  self.diagnose:load({ clusters = {} })
end

-- The level index of a tag.
function Generator:level_index(tag) return self.level_of[tag] or self.start end

function Generator:propose(ctx, n, seed, _)
  if self.probe then
    local tasks = self.probe(self.probe_tasks, mix(seed, 0x9B0))
    if type(tasks) ~= "table" or #tasks == 0 then
      error("rl.synth.generator: probe returned " .. argcheck.describe(tasks) .. " (a non-empty list of tasks expected)", 0)
    end
    local outs = solverlib.rollouts(ctx, tasks, 1, mix(seed, 0x9B1), "generator probe", self.probe_temperature)
    local eps = {}
    for i, list in ipairs(outs) do
      local out = list[1]
      eps[i] = out.ep or { task = tasks[i], success = out.success, record = out.record or {} }
    end
    self.diagnose:observe({ episodes = eps })
    self.probed = self.probed + #tasks
  end
  local weak = self.diagnose:weakest(self.n_weakest, self.min_episodes)
  local lv = {}
  for _, tag in ipairs(weak) do lv[tag] = self.levels[self:level_index(tag)] end
  self.last = { tags = self.diagnose:tags(), weakest = weak, contrast = self.diagnose:contrast(), levels = lv,
    probed = self.probed }
  local items = {}
  self.pending = {}
  for i = 1, n do
    local tag = #weak > 0 and weak[(i - 1) % #weak + 1] or nil
    local params = { focus = tag and { tag } or {}, level = tag and lv[tag] or self.levels[self.start] }
    local ok, t = pcall(self.gen, params, core.rng(mix(seed, i)))
    self.pending[i] = tag or false
    if not ok then items[i] = { group = i, error = "the generator raised: " .. tostring(t) }
    elseif type(t) ~= "table" then items[i] = { group = i, error = "the generator returned no task" }
    else items[i] = { group = i, task = t } end
  end
  return items
end

-- p:feedback(records): the loop's records of this step's proposals, in proposal order (their
-- status: "admitted", "too_easy", "too_hard", "invalid", "duplicate"): each focus tag's level
-- moves up when its too-easy proposals outnumber the rest that were measured, down when its
-- too-hard ones do.
function Generator:feedback(records)
  local votes = {}
  for i, rec in ipairs(records) do
    local tag = self.pending[i]
    if tag then
      local v = votes[tag] or { too_easy = 0, too_hard = 0, admitted = 0 }
      votes[tag] = v
      if v[rec.status] then v[rec.status] = v[rec.status] + 1 end
    end
  end
  for tag, v in pairs(votes) do
    local k = self:level_index(tag)
    if v.too_easy > v.too_hard + v.admitted then k = math.min(#self.levels, k + 1)
    elseif v.too_hard > v.too_easy + v.admitted then k = math.max(1, k - 1) end
    self.level_of[tag] = k
  end
end

function Generator:learn() return nil end

function Generator:state()
  local lv = {}
  for tag, k in pairs(self.level_of) do lv[tag] = k end
  return { levels = lv, probed = self.probed, diagnose = self.diagnose:state() }
end

function Generator:load(st)
  self.level_of, self.probed = {}, st.probed or 0
  for tag, k in pairs(st.levels or {}) do self.level_of[tag] = k end
  if st.diagnose then self.diagnose:load(st.diagnose) end
end

function Generator:config()
  return { kind = "generator", probe_tasks = self.probe and self.probe_tasks or 0, weakest = self.n_weakest,
    levels = #self.levels, probe_temperature = self.probe_temperature }
end

return M
