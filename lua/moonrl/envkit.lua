-- moonrl.envkit (rl.envkit): pieces for writing environments: costs in named currencies, noise
-- planned per episode and fired per turn, personas, and macro actions. Each draws only from the
-- seed it is given, so one seed gives one plan in every process. Also a state block (a compact
-- state line rendered into each observation, for constant-context agents) and copies (one
-- agent acting in n copies of an environment per turn, one action for all or one per copy,
-- DPEPO-style).
--
--   local block = kit.state_block { fields = { "user", { name = "found", kind = "set" } } }
--   self.state = block:tracker(); self.state:set("user", "bob"); self.state:add("found", "sudo")
--   return self.state:wrap(obs)                 --> "[user=bob found=sudo] obs"
--   local twin = kit.copies { env = require "envs.shell_lite", n = 3 }  -- an environment module
--
--   local kit = rl.envkit
--   local prices = kit.costs { currencies = { "money", "discomfort" },
--     actions = { cbc = { money = 1, discomfort = 1 }, ct = { money = 3, discomfort = 1 } } }
--   local patient = kit.noise { types = { "vague", "omits", "contradictory" }, rate = 0.3,
--     count = { 1, 3 }, within = 7, on = "^ask" }
--   local people = kit.personas { traits = { { name = "mood", values = { "plain", "impatient" },
--     weights = { 3, 1 } } } }
--   local macros = kit.macros { macros = { workup = { "exam cbc", "exam ct" } } }
--
--   function Episode:reset(task, rng)
--     self.ledger = prices:ledger()
--     self.plan = patient:plan(rng, { eligible = function(name) return ... end })
--     self.persona = people:draw(rng)
--     ...
--   end
--   function Episode:step(action, parsed) return macros:step(self, action, parsed, primitive) end
--   -- primitive(self, action, parsed): self.ledger:charge("ct"); local fired =
--   -- self.plan:step(action, parsed); ...; return obs, 0, false, {costs = self.ledger:turn()}
--   function Episode:episode_info() return { persona = self.persona, noise = self.plan:log() } end
--
-- A turn's info.costs becomes the episode's cost totals (ep.costs, summed in turn order by
-- rl.batch, logged in episodes.jsonl, read by rl.reward.budget{costs = {money = 0.1}}); what an
-- instance's episode_info() returns is logged per episode as env_info.
local core = require "moonrl.core"
local argcheck = require "moonrl.argcheck"
local parse = require "moonrl.parse"
local seedlib = require "moonrl.train.seed"

local M = {}

local name_check, finite = argcheck.name, argcheck.finite

-- A string's 63-bit FNV-1a hash (a salt for seedlib.mix; the same in every process).
local function hash(s)
  local h = 0xcbf29ce484222325 -- (wraps to a negative integer, as the hash's arithmetic does)
  for i = 1, #s do h = (h ~ s:byte(i)) * 0x100000001b3 end
  return h & 0x7FFFFFFFFFFFFFFF
end

-- The seed a draw uses: an integer seed, or one integer taken from an rl.rng (so that an
-- environment's episode stream, the rng reset gets, seeds it), mixed with the salt.
local function seed_of(where, source, salt)
  local base
  if math.type(source) == "integer" then
    base = source
  elseif argcheck.instance_of("moonrl.rng", "")(source) == nil then
    base = source:random(0, 0x3FFFFFFFFFFFFFFF)
  else
    error(string.format("%s: seed: an integer or an rl.rng expected, got %s", where,
      argcheck.describe(source)), 3)
  end
  return seedlib.mix(base, hash(salt))
end

-- rl.envkit.seed(source, salt) -> the integer seed the pieces below derive from source (an
-- integer or an rl.rng) for a salt: an environment's own draws can use it too.
function M.seed(source, salt)
  if type(salt) ~= "string" then error("rl.envkit.seed: salt: a string expected, got " .. argcheck.describe(salt), 2) end
  return seed_of("rl.envkit.seed", source, salt)
end

local function names_list(what)
  return argcheck.list_of(name_check, "a non-empty list of " .. what
    .. " (letters, digits, '_', '.', '-')")
end

-- Whether a list has a name twice: the name, or nil.
local function duplicate(list)
  local seen = {}
  for _, v in ipairs(list) do
    if seen[v] then return v end
    seen[v] = true
  end
  return nil
end

local function copy(t)
  local out = {}
  for k, v in pairs(t) do out[k] = v end
  return out
end

-- ---------------------------------------------------------------- costs

local Costs = { __name = "moonrl.envkit.costs" }
Costs.__index = Costs
local Ledger = { __name = "moonrl.envkit.ledger" }
Ledger.__index = Ledger

-- rl.envkit.costs{currencies = {names}, actions = {name = {currency = amount}}}: the currencies
-- an environment charges in and, optionally, a price list of its actions. Amounts are finite
-- and non-negative.
function M.costs(opts)
  local where = "rl.envkit.costs"
  local o = argcheck.fields(where, opts, {
    { "currencies", nil, names_list("currency names"), required = true },
    { "actions", nil, argcheck.table },
  }, 2)
  local dup = duplicate(o.currencies)
  if dup then argcheck.fail(where, string.format("currencies: '%s' appears twice", dup), 2) end
  local known = {}
  for _, c in ipairs(o.currencies) do known[c] = true end
  local self = setmetatable({ currencies = o.currencies, known = known, actions = {} }, Costs)
  for action, price in pairs(o.actions or {}) do
    local at = "actions." .. tostring(action)
    if type(action) ~= "string" then argcheck.fail(where, "actions: action names (strings) as keys expected", 2) end
    local why = self:check_charge(price)
    if why then argcheck.fail(where, at .. ": " .. why, 2) end
    self.actions[action] = copy(price)
  end
  return self
end

-- Why `charge` is not a charge {currency = amount} in these currencies, or nil.
function Costs:check_charge(charge)
  if type(charge) ~= "table" then return "a table {currency = amount} expected, got " .. argcheck.describe(charge) end
  for c, v in pairs(charge) do
    if not self.known[c] then
      local near = type(c) == "string" and argcheck.nearest(c, self.currencies)
      return string.format("unknown currency %s (%s)", argcheck.describe(c),
        near and string.format("did you mean '%s'?", near) or "known: " .. table.concat(self.currencies, ", "))
    end
    if not finite(v) or v < 0 then
      return string.format("%s: a non-negative number expected, got %s", c, argcheck.describe(v))
    end
  end
  return nil
end

-- The price of a named action (a copy), or nil when the list has none.
function Costs:price(action)
  local p = self.actions[action]
  return p and copy(p) or nil
end

local function zeros(currencies)
  local t = {}
  for _, c in ipairs(currencies) do t[c] = 0 end
  return t
end

-- costs:ledger(): a new episode's account, nothing charged.
function Costs:ledger()
  return setmetatable({ costs = self, closed = zeros(self.currencies), open = zeros(self.currencies) }, Ledger)
end

-- ledger:charge(action) charges the action's price; ledger:charge{currency = amount} an amount
-- of one's own. Returns the charge. An action the price list lacks, an unknown currency or a
-- negative amount raises.
function Ledger:charge(what)
  local charge
  if type(what) == "string" then
    charge = self.costs.actions[what]
    if not charge then
      local names = {}
      for k in pairs(self.costs.actions) do names[#names + 1] = k end
      table.sort(names)
      local near = argcheck.nearest(what, names)
      error(string.format("ledger:charge: action: '%s' has no price (%s)", what,
        near and string.format("did you mean '%s'?", near) or "priced: " .. table.concat(names, ", ")), 2)
    end
  else
    local why = self.costs:check_charge(what)
    if why then error("ledger:charge: " .. why, 2) end
    charge = what
  end
  for _, c in ipairs(self.costs.currencies) do
    if charge[c] then self.open[c] = self.open[c] + charge[c] end
  end
  return copy(charge)
end

-- What the turn charged, every currency (0 for none): the table for the step's info.costs.
-- Closes the turn: later charges belong to the next one.
function Ledger:turn()
  local out = {}
  for _, c in ipairs(self.costs.currencies) do
    out[c] = self.open[c]
    self.closed[c] = self.closed[c] + self.open[c]
    self.open[c] = 0
  end
  return out
end

-- The episode's totals so far, every currency: the closed turns' sums in turn order (as rl.batch
-- sums info.costs into ep.costs) plus what the open turn charged.
function Ledger:totals()
  local out = {}
  for _, c in ipairs(self.costs.currencies) do out[c] = self.closed[c] + self.open[c] end
  return out
end

-- An independent copy (for an instance's clone()).
function Ledger:clone()
  return setmetatable({ costs = self.costs, closed = copy(self.closed), open = copy(self.open) }, Ledger)
end

-- ---------------------------------------------------------------- noise

local Noise = { __name = "moonrl.envkit.noise" }
Noise.__index = Noise
local Plan = { __name = "moonrl.envkit.plan" }
Plan.__index = Plan

local function trigger_check(v)
  if type(v) == "function" then return nil end
  if type(v) == "string" then
    if pcall(string.find, "", v) then return nil end
    return "a valid Lua pattern"
  end
  return "a Lua pattern or a function(action, parsed) -> boolean"
end

-- rl.envkit.noise{types =, rate = 1, count = {1, 1}, within = 7, on = nil, per_turn = nil,
-- salt = nil}: a noise model. Each episode's plan (noise:plan) is drawn from its seed: with
-- probability `rate` the episode is noisy and gets count[1]..count[2] of the eligible types (in
-- the order of `types`). Each planned type then fires once, on the k-th counted turn, k drawn
-- without repeats from 1..max(within, the number planned); or, with per_turn = p, each counted
-- turn fires with probability p, naming one of the planned types drawn uniformly. A turn counts
-- when its action matches `on` (a Lua pattern, or function(action, parsed) -> boolean; nil:
-- every turn). salt (default: the type names) separates the streams of two noise models drawn
-- from one seed.
function M.noise(opts)
  local where = "rl.envkit.noise"
  local o = argcheck.fields(where, opts, {
    { "types", nil, names_list("noise type names"), required = true },
    { "rate", 1, argcheck.number(0, 1) },
    { "count", { 1, 1 }, function(v)
      if argcheck.is_list(v) and #v == 2 and math.type(v[1]) == "integer" and math.type(v[2]) == "integer"
        and v[1] >= 1 and v[1] <= v[2] then return nil end
      return "a pair {lo, hi} of integers with 1 <= lo <= hi"
    end },
    { "within", 7, argcheck.integer(1) },
    { "on", nil, trigger_check },
    { "per_turn", nil, argcheck.number(0, 1, "lo") },
    { "salt", nil, argcheck.string },
  }, 2)
  local dup = duplicate(o.types)
  if dup then argcheck.fail(where, string.format("types: '%s' appears twice", dup), 2) end
  o.salt = o.salt or ("noise:" .. table.concat(o.types, ","))
  return setmetatable(o, Noise)
end

-- The eligible types, in declared order: opts.eligible is a list of names, a function(name) ->
-- boolean, or nil (all of them).
local function eligible_types(noise, eligible)
  local where = "noise:plan"
  if eligible == nil then return table.move(noise.types, 1, #noise.types, 1, {}) end
  local out = {}
  if type(eligible) == "function" then
    for _, t in ipairs(noise.types) do
      if eligible(t) then out[#out + 1] = t end
    end
    return out
  end
  if not argcheck.is_list(eligible) then
    error(where .. ": eligible: a list of type names or a function(name) -> boolean expected, got "
      .. argcheck.describe(eligible), 3)
  end
  local allowed = {}
  for _, t in ipairs(eligible) do
    local known = false
    for _, k in ipairs(noise.types) do known = known or k == t end
    if not known then
      local near = type(t) == "string" and argcheck.nearest(t, noise.types)
      error(string.format("%s: eligible: unknown noise type %s%s", where, argcheck.describe(t),
        near and string.format(" (did you mean '%s'?)", near) or ""), 3)
    end
    allowed[t] = true
  end
  for _, t in ipairs(noise.types) do
    if allowed[t] then out[#out + 1] = t end
  end
  return out
end

-- k distinct integers drawn from 1..n (a partial Fisher-Yates shuffle), in draw order.
local function sample(rng, n, k)
  local pool = {}
  for i = 1, n do pool[i] = i end
  local out = {}
  for i = 1, k do
    local j = rng:random(i, n)
    pool[i], pool[j] = pool[j], pool[i]
    out[i] = pool[i]
  end
  return out
end

-- noise:plan(seed [, {eligible =}]) -> the episode's plan; seed is an integer or an rl.rng (the
-- one reset gets: one integer is drawn from it). plan.noisy, plan.types (the planned types, in
-- declared order) and plan.at ({type = k}: it fires on the k-th counted turn; without per_turn).
function Noise:plan(seed, opts)
  if opts ~= nil then
    argcheck.fields("noise:plan", opts, { { "eligible", nil, function() return nil end } }, 2)
  end
  local s = seed_of("noise:plan", seed, self.salt)
  local rng = core.rng(s)
  local eligible = eligible_types(self, opts and opts.eligible)
  local noisy = rng:random() < self.rate
  local plan = setmetatable({ noise = self, seed = s, noisy = false, types = {}, at = {},
    counted = 0, turn = 0, fired = {} }, Plan)
  if not noisy or #eligible == 0 then return plan end
  local n = math.min(rng:random(self.count[1], self.count[2]), #eligible)
  local chosen = {}
  for _, i in ipairs(sample(rng, #eligible, n)) do chosen[eligible[i]] = true end
  for _, t in ipairs(eligible) do
    if chosen[t] then plan.types[#plan.types + 1] = t end
  end
  plan.noisy = true
  if not self.per_turn then
    local slots = sample(rng, math.max(self.within, n), n)
    for i, t in ipairs(plan.types) do plan.at[t] = slots[i] end
  end
  return plan
end

local function counts(on, action, parsed)
  if on == nil then return true end
  if type(on) == "function" then return on(action, parsed) and true or false end
  return type(action) == "string" and action:find(on) ~= nil
end

-- plan:step(action [, parsed]) -> the list of noise types that fire on this turn (often empty):
-- call it once per turn, in turn order, before realising the turn's observation.
function Plan:step(action, parsed)
  self.turn = self.turn + 1
  local out = {}
  if not self.noisy or not counts(self.noise.on, action, parsed) then return out end
  self.counted = self.counted + 1
  if self.noise.per_turn then
    -- each counted turn's draw has a seed of its own: a clone draws what the original would
    local rng = core.rng(seedlib.mix(self.seed, self.counted))
    if rng:random() < self.noise.per_turn then out[1] = self.types[rng:random(#self.types)] end
  else
    for _, t in ipairs(self.types) do
      if self.at[t] == self.counted then out[#out + 1] = t end
    end
  end
  for _, t in ipairs(out) do self.fired[#self.fired + 1] = { turn = self.turn, type = t } end
  return out
end

-- The plan as plain data for the episode's log: {noisy =, planned = {types}, at = {type = k},
-- fired = {{turn =, type =}, ...}}.
function Plan:log()
  local fired = {}
  for i, f in ipairs(self.fired) do fired[i] = { turn = f.turn, type = f.type } end
  return { noisy = self.noisy, planned = core.json.array(table.move(self.types, 1, #self.types, 1, {})),
    at = copy(self.at), fired = core.json.array(fired) }
end

-- An independent copy (for an instance's clone()): the same plan and schedule, its own counters.
function Plan:clone()
  local c = setmetatable(copy(self), Plan)
  c.types, c.at, c.fired = copy(self.types), copy(self.at), {}
  for i, f in ipairs(self.fired) do c.fired[i] = { turn = f.turn, type = f.type } end
  return c
end

-- ---------------------------------------------------------------- personas

local Personas = { __name = "moonrl.envkit.personas" }
Personas.__index = Personas

-- rl.envkit.personas{traits = {{name =, values = {...}, weights = {...}}, ...}, salt = nil}: one
-- value of each trait is drawn per episode (uniformly, or in proportion to weights).
function M.personas(opts)
  local where = "rl.envkit.personas"
  local o = argcheck.fields(where, opts, {
    { "traits", nil, argcheck.list_of(argcheck.table, "a non-empty list of traits {name =, values =, weights =}"),
      required = true },
    { "salt", nil, argcheck.string },
  }, 2)
  local traits, names = {}, {}
  for i, t in ipairs(o.traits) do
    local tr = argcheck.fields(string.format("%s: traits[%d]", where, i), t, {
      { "name", nil, name_check, required = true },
      { "values", nil, argcheck.list_of(function(v)
        if type(v) == "string" or type(v) == "number" or type(v) == "boolean" then return nil end
        return "x"
      end, "a non-empty list of values (strings, numbers or booleans)"), required = true },
      { "weights", nil, argcheck.list_of(argcheck.number(0), "a list of non-negative numbers") },
    }, 2)
    if tr.weights then
      local total = 0
      for _, w in ipairs(tr.weights) do total = total + w end
      if #tr.weights ~= #tr.values or total <= 0 then
        argcheck.fail(where, string.format("traits[%d].weights: one non-negative weight per value, "
          .. "not all 0, expected", i), 2)
      end
    end
    traits[i], names[i] = tr, tr.name
  end
  local dup = duplicate(names)
  if dup then argcheck.fail(where, string.format("traits: '%s' appears twice", dup), 2) end
  return setmetatable({ traits = traits, salt = o.salt or ("persona:" .. table.concat(names, ",")) }, Personas)
end

-- personas:draw(seed) -> {trait = value, ...}: seed is an integer or an rl.rng (one integer is
-- drawn from it).
function Personas:draw(seed)
  local rng = core.rng(seed_of("personas:draw", seed, self.salt))
  local out = {}
  for _, t in ipairs(self.traits) do
    if t.weights then
      local total = 0
      for _, w in ipairs(t.weights) do total = total + w end
      local u, pick = rng:random() * total, #t.values
      for k, w in ipairs(t.weights) do
        if u < w then pick = k break end
        u = u - w
      end
      out[t.name] = t.values[pick]
    else
      out[t.name] = t.values[rng:random(#t.values)]
    end
  end
  return out
end

-- ---------------------------------------------------------------- macro actions

local Macros = { __name = "moonrl.envkit.macros" }
Macros.__index = Macros

local function trim(s) return (s:gsub("^%s+", ""):gsub("%s+$", "")) end

-- rl.envkit.macros{macros = {name = {primitive action, ...}}, format = "line", join = "\n"}: one
-- action name that stands for a sequence of primitive actions (no macro inside a macro). format
-- is how the primitives are parsed (moonrl.parse), join what separates their observations.
function M.macros(opts)
  local where = "rl.envkit.macros"
  local o = argcheck.fields(where, opts, {
    { "macros", nil, argcheck.table, required = true },
    { "format", "line", argcheck.one_of { "line", "hermes" } },
    { "join", "\n", argcheck.string },
  }, 2)
  local list = {}
  for name, seq in pairs(o.macros) do
    if type(name) ~= "string" or not name:match("^%S+$") then
      argcheck.fail(where, "macros: names without blanks as keys expected, got " .. argcheck.describe(name), 2)
    end
    if not argcheck.is_list(seq) or #seq == 0 then
      argcheck.fail(where, string.format("macros.%s: a non-empty list of primitive actions expected", name), 2)
    end
    for k, a in ipairs(seq) do
      if type(a) ~= "string" then
        argcheck.fail(where, string.format("macros.%s[%d]: an action string expected, got %s", name, k,
          argcheck.describe(a)), 2)
      end
    end
    list[name] = table.move(seq, 1, #seq, 1, {})
  end
  for name, seq in pairs(list) do
    for k, a in ipairs(seq) do
      if list[trim(a)] then
        argcheck.fail(where, string.format("macros.%s[%d]: '%s' is a macro (macros do not nest)", name, k,
          trim(a)), 2)
      end
    end
  end
  return setmetatable({ list = list, format = o.format, join = o.join }, Macros)
end

-- The primitives the action stands for (a copy), or nil when it is not a macro's name (blanks
-- around it aside).
function Macros:expand(action)
  if type(action) ~= "string" then return nil end
  local seq = self.list[trim(action)]
  return seq and table.move(seq, 1, #seq, 1, {}) or nil
end

-- macros:step(instance, action, parsed, primitive) -> observation, reward, done, info: a
-- primitive action is primitive(instance, action, parsed)'s results as they are; a macro runs
-- its primitives in order through primitive (each parsed in the macros' format) until one ends
-- the episode. Then the observation is the primitives' observations joined, the reward their
-- sum, info the last primitive's info plus costs (each currency summed over the primitives'
-- info.costs, in order), tool_call (when any primitive was one) and macro = {name =, steps =
-- {{action =, observation =, reward =, done =, costs =}, ...}}.
function Macros:step(instance, action, parsed, primitive)
  if type(primitive) ~= "function" then
    error("macros:step: primitive: a function(instance, action, parsed) -> observation, reward, "
      .. "done, info expected, got " .. argcheck.describe(primitive), 2)
  end
  local seq = self:expand(action)
  if not seq then return primitive(instance, action, parsed) end
  local texts, steps, total, costs, last, any_call = {}, {}, 0, nil, nil, false
  local done = false
  for k, a in ipairs(seq) do
    local obs, r, d, info = primitive(instance, a, parse.parse(a, self.format))
    r = r or 0
    if type(r) ~= "number" then
      error(string.format("macros:step: primitive %d (%q) returned a reward that is not a number", k, a), 2)
    end
    total = total + r
    if obs ~= nil then texts[#texts + 1] = tostring(obs) end
    local c = type(info) == "table" and type(info.costs) == "table" and info.costs or nil
    if c then
      costs = costs or {}
      local names = {}
      for name in pairs(c) do names[#names + 1] = name end
      table.sort(names)
      for _, name in ipairs(names) do costs[name] = (costs[name] or 0) + c[name] end
    end
    if type(info) == "table" and info.tool_call == true then any_call = true end
    steps[k] = { action = a, observation = obs, reward = r, done = d and true or false,
      costs = c and copy(c) or nil }
    last = info
    if d then
      done = true
      break
    end
  end
  local info = type(last) == "table" and copy(last) or {}
  info.costs, info.tool_call = costs, any_call or nil
  info.macro = { name = trim(action), steps = core.json.array(steps) }
  local obs = #texts > 0 and table.concat(texts, self.join) or nil
  return obs, total, done, info
end

-- ---------------------------------------------------------------- state block

local StateBlock = { __name = "moonrl.envkit.state_block" }
StateBlock.__index = StateBlock
local Tracker = { __name = "moonrl.envkit.tracker" }
Tracker.__index = Tracker

-- rl.envkit.state_block{fields = {{name =, kind = "value" | "set", keep = 4}, ...}, max_bytes =
-- 64, sep = " ", prefix = "[", suffix = "] "}: a compact state line for constant-context agents.
-- The environment keeps what the agent has learnt in a tracker (block:tracker(), one per
-- episode) and renders it into each observation (tracker:wrap(obs)), so that a policy which sees
-- only the latest observation still knows the episode's state. A field is a value (set replaces
-- it) or a set (add appends a new item, keeping the last `keep`); names are a string (a field
-- `{name = "user"}` is a value). render() writes the non-empty fields in declared order,
-- `name=value` or `name=a,b`, cut at max_bytes.
function M.state_block(opts)
  local where = "rl.envkit.state_block"
  local o = argcheck.fields(where, opts, {
    { "fields", nil, argcheck.list_of(function(v)
      if type(v) == "string" or type(v) == "table" then return nil end
      return "x"
    end, "a non-empty list of field names or {name =, kind =, keep =}"), required = true },
    { "max_bytes", 64, argcheck.integer(1) },
    { "sep", " ", argcheck.string },
    { "prefix", "[", argcheck.string },
    { "suffix", "] ", argcheck.string },
  }, 2)
  local fields, names = {}, {}
  for i, f in ipairs(o.fields) do
    if type(f) == "string" then f = { name = f } end
    local fo = argcheck.fields(string.format("%s: fields[%d]", where, i), f, {
      { "name", nil, name_check, required = true },
      { "kind", "value", argcheck.one_of { "value", "set" } },
      { "keep", 4, argcheck.integer(1) },
    }, 2)
    fields[i], names[i] = fo, fo.name
  end
  local dup = duplicate(names)
  if dup then argcheck.fail(where, string.format("fields: '%s' appears twice", dup), 2) end
  local by = {}
  for _, f in ipairs(fields) do by[f.name] = f end
  return setmetatable({ fields = fields, by = by, max_bytes = o.max_bytes, sep = o.sep, prefix = o.prefix,
    suffix = o.suffix }, StateBlock)
end

-- block:tracker() -> an empty tracker for one episode.
function StateBlock:tracker()
  local values = {}
  for _, f in ipairs(self.fields) do values[f.name] = f.kind == "set" and {} or nil end
  return setmetatable({ block = self, values = values }, Tracker)
end

local function field_of(tracker, where, name, kind)
  local f = tracker.block.by[name]
  if not f then
    local near = type(name) == "string" and argcheck.nearest(name, (function()
      local l = {}
      for _, x in ipairs(tracker.block.fields) do l[#l + 1] = x.name end
      return l
    end)())
    error(string.format("%s: unknown field %s%s", where, argcheck.describe(name),
      near and string.format(" (did you mean '%s'?)", near) or ""), 3)
  end
  if kind and f.kind ~= kind then
    error(string.format("%s: field '%s' is a %s", where, name, f.kind), 3)
  end
  return f
end

local function item_check(where, v)
  if type(v) ~= "string" and type(v) ~= "number" and type(v) ~= "boolean" then
    error(string.format("%s: value: a string, number or boolean expected, got %s", where, argcheck.describe(v)), 3)
  end
  return tostring(v)
end

-- tracker:set(name, value): a value field's value (nil clears it). Returns whether it changed.
function Tracker:set(name, value)
  field_of(self, "tracker:set", name, "value")
  if value ~= nil then value = item_check("tracker:set", value) end
  local changed = self.values[name] ~= value
  self.values[name] = value
  return changed
end

-- tracker:add(name, item): appends item to a set field unless it is there already (the oldest
-- goes past `keep`). Returns whether it was new.
function Tracker:add(name, item)
  local f = field_of(self, "tracker:add", name, "set")
  item = item_check("tracker:add", item)
  local list = self.values[name]
  for _, x in ipairs(list) do
    if x == item then return false end
  end
  list[#list + 1] = item
  if #list > f.keep then table.remove(list, 1) end
  return true
end

-- tracker:get(name) -> the value (a string or nil) or a copy of the set's items.
function Tracker:get(name)
  local f = field_of(self, "tracker:get", name)
  local v = self.values[name]
  if f.kind == "set" then return table.move(v, 1, #v, 1, {}) end
  return v
end

-- tracker:render() -> the state line ("" when every field is empty).
function Tracker:render()
  local parts = {}
  for _, f in ipairs(self.block.fields) do
    local v = self.values[f.name]
    if f.kind == "set" then v = #v > 0 and table.concat(v, ",") or nil end
    if v ~= nil then parts[#parts + 1] = f.name .. "=" .. v end
  end
  local line = table.concat(parts, self.block.sep)
  if #line > self.block.max_bytes then line = line:sub(1, self.block.max_bytes) end
  return line
end

-- tracker:wrap(observation) -> prefix .. render() .. suffix .. observation (the observation alone
-- while the state is empty).
function Tracker:wrap(obs)
  local line = self:render()
  obs = obs == nil and "" or tostring(obs)
  if line == "" then return obs end
  return self.block.prefix .. line .. self.block.suffix .. obs
end

-- An independent copy (for an instance's clone()).
function Tracker:clone()
  local values = {}
  for _, f in ipairs(self.block.fields) do
    local v = self.values[f.name]
    values[f.name] = f.kind == "set" and table.move(v, 1, #v, 1, {}) or v
  end
  return setmetatable({ block = self.block, values = values }, Tracker)
end

-- ---------------------------------------------------------------- copies (DPEPO)

-- split_parts(action, n) -> parts, junk: DPEPO's per-copy action "1:u 2:r 3:l" (any order; a
-- part runs from its "i:" marker, at the start or after a blank, to the next marker, trimmed).
-- parts[i] is copy i's text or nil; junk lists what could not be given to a copy: text before
-- the first marker, markers outside 1..n, a second part for the same copy (both are dropped,
-- so that copy gets none), and empty parts.
local function split_parts(action, n)
  local marks, s, at = {}, tostring(action or ""), 1
  while true do
    local a, b, num = s:find("(%d+):", at)
    if not a then break end
    if a == 1 or s:sub(a - 1, a - 1):match("%s") then marks[#marks + 1] = { a = a, b = b, i = tonumber(num) } end
    at = b + 1
  end
  local parts, junk, seen = {}, {}, {}
  local head = s:sub(1, marks[1] and marks[1].a - 1 or #s):match("^%s*(.-)%s*$")
  if head ~= "" then junk[#junk + 1] = head end
  for k, m in ipairs(marks) do
    local text = s:sub(m.b + 1, marks[k + 1] and marks[k + 1].a - 1 or #s):match("^%s*(.-)%s*$")
    local piece = s:sub(m.a, m.b) .. text
    if m.i < 1 or m.i > n or text == "" then
      junk[#junk + 1] = piece
    elseif seen[m.i] then
      junk[#junk + 1] = piece
      if parts[m.i] then junk[#junk + 1] = m.i .. ":" .. parts[m.i] end
      parts[m.i] = nil
    else
      parts[m.i], seen[m.i] = text, true
    end
  end
  return parts, junk
end
M.split_parts = split_parts

-- rl.envkit.copies{env =, n = 2, variant = nil, join = "\n", success = "all" | "any" | "mean",
-- actions = "same" | "split", reward = "mean" | "max" | "best", name = nil}: an environment
-- module in which one agent acts in n copies of `env` each turn (DPEPO's parallel environments).
-- Copy i is reset with variant(task, i) (the task itself when unset) and an rng drawn from the
-- episode's. With actions = "same" the action is stepped in every copy not yet done (parsed
-- once); with "split" the turn is one action per copy, "1:u 2:r 3:l" (any order; split_parts):
-- copy i steps its own part, a copy that is done is skipped, and a copy whose part is missing or
-- malformed steps the empty action (its turn is wasted by env's own invalid-action handling).
-- The observation is the copies' observations, "i: obs" joined with `join` (a finished copy
-- shows "done"); the episode ends when every copy has. The turn's reward: the copies' mean
-- ("mean"), the largest of the stepped copies' ("max"), or the rise in the best copy's return
-- so far ("best": the episode's return is then its best copy's, a parallel success reward).
-- info.success: every copy succeeded ("all"), at least one ("any"), or the fraction as
-- info.success_rate with success = all ("mean"); info.copies = {{reward =, done =, success =},
-- ...} for the turn (split: also action =, the part copy i stepped, "" for none, missing = true
-- when it had none, skipped = true when it was done before the turn); split also gives
-- info.copy_actions = {"u", "r", ""} (each copy's action this turn, "" for none), info.missing
-- (how many live copies had none) and info.malformed (split_parts' junk, when any). costs are
-- summed over the copies. With split, each instance keeps every copy's actions
-- (inst:histories(), a copy; clone() copies them). tasks, format and system are env's; oracle
-- is copy 1's ("same") or each copy's oracle zipped turn by turn into parts ("split"); the
-- instance clones when env's does.
function M.copies(opts)
  local where = "rl.envkit.copies"
  local o = argcheck.fields(where, opts, {
    { "env", nil, argcheck.table, required = true },
    { "n", 2, argcheck.integer(1) },
    { "variant", nil, argcheck.func },
    { "join", "\n", argcheck.string },
    { "success", "all", argcheck.one_of { "all", "any", "mean" } },
    { "actions", "same", argcheck.one_of { "same", "split" } },
    { "reward", "mean", argcheck.one_of { "mean", "max", "best" } },
    { "name", nil, argcheck.string },
  }, 2)
  local env = o.env
  if type(env.new) ~= "function" or type(env.tasks) ~= "function" then
    argcheck.fail(where, "env: an environment module (new, tasks) expected", 2)
  end
  local split = o.actions == "split"
  local W = { name = o.name or (tostring(env.name) .. "-x" .. o.n), format = env.format, system = env.system,
    max_turns = env.max_turns, tasks = env.tasks, oracle = env.oracle, tools = env.tools, copies = o.n }
  if split and type(env.oracle) == "function" then
    function W.oracle(task, rng)
      local lists, out = {}, {}
      for i = 1, o.n do lists[i] = env.oracle(o.variant and o.variant(task, i) or task, rng) or {} end
      for k = 1, math.huge do
        local parts = {}
        for i = 1, o.n do
          if lists[i][k] ~= nil then parts[#parts + 1] = i .. ":" .. tostring(lists[i][k]) end
        end
        if #parts == 0 then break end
        out[k] = table.concat(parts, " ")
      end
      return out
    end
  end
  local Inst = { __name = "moonrl.envkit.copies" }
  Inst.__index = Inst
  local function blank()
    return setmetatable({ insts = {}, done = {}, success = {}, returns = {}, actions = {}, best = 0 }, Inst)
  end
  W.new = blank
  function Inst:reset(task, rng)
    local texts = {}
    for i = 1, o.n do
      local t = o.variant and o.variant(task, i) or task
      local sub = rng and core.rng(rng:random(0, 0x3FFFFFFFFFFFFFFF)) or core.rng(i)
      self.insts[i], self.done[i], self.success[i], self.returns[i], self.actions[i] = env.new(), false, false, 0, {}
      texts[i] = i .. ": " .. tostring(self.insts[i]:reset(t, sub))
    end
    self.best = 0
    return table.concat(texts, o.join)
  end
  -- Every copy's actions so far (copies of the lists; "" where a copy had none).
  function Inst:histories()
    local out = {}
    for i = 1, o.n do out[i] = table.move(self.actions[i] or {}, 1, #(self.actions[i] or {}), 1, {}) end
    return out
  end
  function Inst:step(action, parsed)
    local parts, junk
    if split then parts, junk = split_parts(action, o.n)
    else parsed = parsed or parse.parse(action, env.format or "line") end
    local texts, total, top, all_done, per, costs, any_call, acts, missing = {}, 0, nil, true, {}, nil, false, {}, 0
    for i = 1, o.n do
      if self.done[i] then
        texts[i] = i .. ": done"
        per[i] = { reward = 0, done = true, success = self.success[i], skipped = split or nil,
          action = split and "" or nil }
        acts[i] = ""
      else
        local a, p = action, parsed
        if split then
          a = parts[i] or ""
          p = parse.parse(a, env.format or "line")
          acts[i] = a
          self.actions[i][#self.actions[i] + 1] = a
          if a == "" then missing = missing + 1 end
        end
        local obs, r, d, info = self.insts[i]:step(a, p)
        r = r or 0
        if type(r) ~= "number" then error(string.format("copies: copy %d returned a reward that is not a number", i), 2) end
        total, top = total + r, math.max(top or r, r)
        self.returns[i] = self.returns[i] + r
        self.done[i] = d and true or false
        if type(info) == "table" and info.success ~= nil then self.success[i] = info.success and true or false end
        if type(info) == "table" and type(info.costs) == "table" then
          costs = costs or {}
          local names = {}
          for name in pairs(info.costs) do names[#names + 1] = name end
          table.sort(names)
          for _, name in ipairs(names) do costs[name] = (costs[name] or 0) + info.costs[name] end
        end
        if type(info) == "table" and info.tool_call == true then any_call = true end
        texts[i] = i .. ": " .. (obs == nil and (d and "done" or "") or tostring(obs))
        per[i] = { reward = r, done = self.done[i], success = self.success[i], action = split and a or nil,
          missing = (split and a == "") or nil }
      end
      all_done = all_done and self.done[i]
    end
    local wins = 0
    for i = 1, o.n do if self.success[i] then wins = wins + 1 end end
    local info = { copies = core.json.array(per), costs = costs, tool_call = any_call or nil }
    if split then
      info.copy_actions, info.missing = core.json.array(acts), missing
      if #junk > 0 then info.malformed = core.json.array(junk) end
    end
    if o.success == "any" then info.success = wins > 0
    else info.success = wins == o.n end
    if o.success == "mean" then info.success_rate = wins / o.n end
    local r = total / o.n
    if o.reward == "max" then r = top or 0
    elseif o.reward == "best" then
      local best = -math.huge
      for i = 1, o.n do best = math.max(best, self.returns[i]) end
      r, self.best = best - self.best, best
    end
    return table.concat(texts, o.join), r, all_done, info
  end
  if type(env.new().clone) == "function" then
    function Inst:clone()
      local c = blank()
      c.best = self.best
      for i = 1, o.n do
        c.insts[i], c.done[i], c.success[i] = self.insts[i]:clone(), self.done[i], self.success[i]
        c.returns[i] = self.returns[i]
        c.actions[i] = table.move(self.actions[i], 1, #self.actions[i], 1, {})
      end
      return c
    end
  end
  return W
end

M.Costs, M.Ledger, M.Noise, M.Plan, M.Personas, M.Macros = Costs, Ledger, Noise, Plan, Personas, Macros
M.StateBlock, M.Tracker = StateBlock, Tracker
return M
