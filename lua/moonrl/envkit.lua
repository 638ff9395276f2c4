-- moonrl.envkit (rl.envkit): pieces for writing environments: costs in named currencies, noise
-- planned per episode and fired per turn, personas, and macro actions. Each draws only from the
-- seed it is given, so one seed gives one plan in every process.
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

M.Costs, M.Ledger, M.Noise, M.Plan, M.Personas, M.Macros = Costs, Ledger, Noise, Plan, Personas, Macros
return M
