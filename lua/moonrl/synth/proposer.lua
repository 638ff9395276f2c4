-- moonrl.synth.proposer: where proposals come from (rl.synth.proposer, rl.synth.mutate).
--
--   rl.synth.proposer { policy = "self" | <rl.model> | <client>, tokenizer =, contract = c,
--     prompt = string | fn(exemplar, ctx) -> string, seeds = { task, ... }, temperature =,
--     group = 4, max_tokens = 48, demos = fn(exemplar, rng) -> text, warm_start = 0, learn = true }
--   rl.synth.mutate { from = cur, fn = fn(task, rng) -> task | nil }
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

return M
