-- clinic.lua - MedExAgent's diagnosis POMDP in miniature (shared/spec/reproductions.md §2.1): a
-- hidden case (one of 10 diseases in 5 confusable pairs, 16 symptoms, 4 history items), and three
-- kinds of action: question the patient, order an exam (a tool call with a money cost and a
-- discomfort), issue a diagnosis. Patients are noisy (the released code's 7 patient and 3 exam
-- noise types, planned per case from its seed with rl.envkit) and have personas.
--
--   observation  new patient                action  hello
--   observation  cough 4d severe            action  ask fever
--   observation  yes                        action  hist smoke
--   observation  unsure                     action  exam xray chest
--   observation  xray: infiltrate r lung    action  dx pneum      -> reward 1 (0.5: its partner)
--
-- Actions (at most ~15 bytes): `hello`, `ask <symptom>`, `hist <item>`, `exam <name> [<region>]`
-- (xray, us, ct and mri take a region: chest, abd, head, joint), `dx <disease>`. Anything else is
-- answered `?` (info.malformed; R_fmt counts it). An exam the case has no record of (a region the
-- exam does not image, an unknown name) is answered `n/a` and charged nothing.
--
-- Everything about a case is drawn from its seed (task.seed): the disease, the symptoms, the
-- persona, the noise plans. So one task always plays out the same way against the same actions,
-- in every process and every arm (common random numbers); the rng reset gets is not used.
--
-- Splits: "train" draws case seeds >= 1000; "test" is the fixed list of case seeds 1..500 (the
-- held-out patients, patient noise 0.3, exam noise 0.1 as in the released RL config); "clean"
-- and "noisy" are the same 500 cases at patient noise 0 and 0.6. A task may carry its own
-- `noise` (patient noise level) and `exam_noise`.
--
-- Policies for the tables: M.oracle (the imperfect Calgary-Cambridge demonstrations for SFT),
-- M.perfect (knows the disease: the ceiling), M.order_all (asks like the oracle, then orders every
-- exam that images the complaint's region). M.play(task, policy) runs a scripted policy.
-- M.reward{...} is the composite reward graph, M.tool_score the ToolRL-style R_tool.
local rl = require "moonrl"
local kit = rl.envkit
local argcheck = require "moonrl.argcheck"

local M = { name = "clinic", max_turns = 14, format = "line" }

M.SYMPTOMS = { "fever", "cough", "sob", "chestp", "wheeze", "sputum", "nausea", "vomit", "diarr",
  "abdp", "headac", "neck", "photo", "jointp", "swell", "fatig" }
M.HISTORY = { "smoke", "meds", "travel", "family" }
M.REGIONS = { "chest", "abd", "head", "joint" }
local DEFAULT_P = 0.05 -- a symptom or history item that is not typical of the disease

-- Exams: money and discomfort levels (1-3, in the spirit of the released 66-entry table), the
-- regions it images (nil: it takes no parameter).
M.EXAMS = {
  { name = "xray", money = 1, discomfort = 1, regions = { "chest", "abd", "joint" } },
  { name = "ecg", money = 1, discomfort = 1 },
  { name = "cbc", money = 1, discomfort = 1 },
  { name = "uric", money = 1, discomfort = 1 },
  { name = "us", money = 2, discomfort = 1, regions = { "abd", "joint" } },
  { name = "ct", money = 3, discomfort = 1, regions = { "chest", "abd", "head" } },
  { name = "mri", money = 3, discomfort = 2, regions = { "abd", "head", "joint" } },
  { name = "lp", money = 3, discomfort = 3 },
  { name = "biopsy", money = 3, discomfort = 3 },
}
local EXAM = {}
for _, e in ipairs(M.EXAMS) do EXAM[e.name] = e end

-- The diseases, in confusable pairs sharing a chief complaint and a region. sym/hist: the chance
-- a case has each symptom / history item (DEFAULT_P otherwise); gt: the exams whose findings
-- decide it (the ground-truth calls; each name is one free call); find: exam findings, keyed
-- "name" or "name region" ("normal" otherwise); days: the duration band; sev: the usual severity.
M.DISEASES = {
  { name = "pneum", partner = "bronch", region = "chest", chief = "cough", days = { 2, 5 }, sev = 3,
    sym = { fever = .85, cough = 1, sob = .65, chestp = .4, sputum = .5, fatig = .5 }, hist = { smoke = .3 },
    gt = { { "xray", "chest" } },
    find = { ["xray chest"] = "infiltrate r lung", ["ct chest"] = "consolid r lung", cbc = "wbc high" } },
  { name = "bronch", partner = "pneum", region = "chest", chief = "cough", days = { 4, 14 }, sev = 2,
    sym = { fever = .4, cough = 1, sob = .35, wheeze = .55, sputum = .7, fatig = .4 }, hist = { smoke = .6 },
    gt = { { "xray", "chest" } },
    find = { ["xray chest"] = "clear lungs", ["ct chest"] = "thick bronchi" } },
  { name = "mi", partner = "gerd", region = "chest", chief = "chestp", days = { 1, 2 }, sev = 3,
    sym = { chestp = 1, sob = .6, nausea = .45, fatig = .35, abdp = .15 }, hist = { smoke = .6, family = .45 },
    gt = { { "ecg" } },
    find = { ecg = "st elevation", ["ct chest"] = "coronary block", cbc = "troponin high" } },
  { name = "gerd", partner = "mi", region = "chest", chief = "chestp", days = { 3, 20 }, sev = 1,
    sym = { chestp = 1, nausea = .4, abdp = .45, sob = .15 }, hist = { meds = .55, smoke = .25 },
    gt = { { "ecg" } },
    find = {} },
  { name = "append", partner = "gastro", region = "abd", chief = "abdp", days = { 1, 3 }, sev = 3,
    sym = { abdp = 1, nausea = .7, vomit = .5, fever = .55, diarr = .15 }, hist = {},
    gt = { { "cbc" }, { "us", "abd" } },
    find = { cbc = "wbc high, crp high", ["us abd"] = "inflamed appendix", ["ct abd"] = "inflamed appendix",
      ["mri abd"] = "inflamed appendix" } },
  { name = "gastro", partner = "append", region = "abd", chief = "abdp", days = { 1, 5 }, sev = 2,
    sym = { abdp = 1, nausea = .75, vomit = .65, diarr = .75, fever = .3 }, hist = { travel = .5 },
    gt = { { "cbc" } },
    find = { ["ct abd"] = "thick bowel wall", ["mri abd"] = "thick bowel wall" } },
  { name = "mening", partner = "migrn", region = "head", chief = "headac", days = { 1, 3 }, sev = 3,
    sym = { headac = 1, fever = .8, neck = .7, photo = .45, nausea = .4, vomit = .3 }, hist = {},
    gt = { { "cbc" } },
    find = { cbc = "wbc high, crp high", lp = "cloudy csf", ["mri head"] = "meninges enhanced" } },
  { name = "migrn", partner = "mening", region = "head", chief = "headac", days = { 1, 3 }, sev = 2,
    sym = { headac = 1, photo = .7, nausea = .6, vomit = .25, neck = .15, fever = .1 }, hist = { family = .6 },
    gt = { { "cbc" } },
    find = { lp = "clear csf" } },
  { name = "gout", partner = "arthr", region = "joint", chief = "jointp", days = { 1, 4 }, sev = 3,
    sym = { jointp = 1, swell = .85, fever = .2, fatig = .15 }, hist = { meds = .35, family = .3 },
    gt = { { "uric" } },
    find = { uric = "urate high", ["us joint"] = "crystals in joint", ["mri joint"] = "crystals in joint" } },
  { name = "arthr", partner = "gout", region = "joint", chief = "jointp", days = { 30, 90 }, sev = 2,
    sym = { jointp = 1, swell = .45, fatig = .5, fever = .05 }, hist = { family = .5 },
    gt = { { "uric" }, { "xray", "joint" } },
    find = { ["xray joint"] = "joint erosion", ["us joint"] = "synovitis", ["mri joint"] = "joint erosion" } },
}
local DISEASE = {}
for i, d in ipairs(M.DISEASES) do
  d.index = i
  DISEASE[d.name] = d
end
M.BY_NAME = DISEASE
local SEVERITY = { "barely", "mild", "moderate", "severe" } -- levels 0..3 (index - 1)

-- The finding an exam shows for a disease ("normal" when the disease leaves no trace in it).
function M.finding(d, exam, region)
  if exam == "biopsy" then return "no malignancy" end
  return d.find[region and (exam .. " " .. region) or exam] or "normal"
end

-- ---------------------------------------------------------------- noise and personas

M.PATIENT_NOISE = { "swap", "confusion", "severity", "temporal", "omission", "selfdx", "vague" }
M.EXAM_NOISE = { "exam_swap", "exam_omit", "exam_ambig" }
-- body-part swap: a symptom reported in the adjacent region; symptom confusion: a similar one
local ADJACENT = { chestp = "abdp", abdp = "chestp", headac = "neck", neck = "headac", sob = "chestp",
  jointp = "swell", swell = "jointp" }
local CONFUSED = { sob = "wheeze", wheeze = "sob", nausea = "vomit", vomit = "nausea", fever = "fatig",
  fatig = "fever", cough = "sputum", sputum = "cough", photo = "headac", diarr = "abdp" }
M.ADJACENT, M.CONFUSED = ADJACENT, CONFUSED
-- exam-finding region words and their neighbours (exam body-part swap)
local FINDING_SWAP = { { "r lung", "l lung" }, { "appendix", "ovary" }, { "bowel", "bladder" },
  { "joint", "bone" }, { "meninges", "sinus" }, { "bronchi", "trachea" } }

local function is_patient_turn(action)
  local verb = type(action) == "string" and action:match("^%s*(%a+)") or nil
  return verb == "hello" or verb == "ask" or verb == "hist"
end

local noise_models = {}
-- The patient and exam noise models of a (patient level, exam level) pair (kept: same levels,
-- same models, hence the same plans for a seed).
local function noise_models_of(level, exam_level)
  local key = level .. "/" .. exam_level
  if not noise_models[key] then
    noise_models[key] = {
      patient = kit.noise { types = M.PATIENT_NOISE, rate = level, count = { 1, 3 }, within = 7,
        on = is_patient_turn },
      exam = exam_level > 0 and kit.noise { types = M.EXAM_NOISE, rate = 1, count = { 1, 1 },
        per_turn = exam_level, on = "^%s*exam%s" } or kit.noise { types = M.EXAM_NOISE, rate = 0 },
    }
  end
  return noise_models[key]
end

-- The released code's three persona traits, one value of each drawn uniformly per patient. The
-- miniature realises three behaviours (the rest answer plainly): impatient (asking a seventh
-- question ends the episode undiagnosed), distrust (the first history question is answered
-- "why ask?" and must be asked again), low recall (a history answer is "unsure" half the time).
M.personas = kit.personas { traits = {
  { name = "personality", values = { "verbose", "pleasing", "impatient", "distrust", "overanxious", "plain" } },
  { name = "language", values = { "A", "B", "C" } },
  { name = "recall", values = { "low", "high" } },
} }

M.prices = kit.costs {
  currencies = { "money", "discomfort", "exams", "unneeded", "unneeded_n" },
}

-- ---------------------------------------------------------------- cases and tasks

local function contains(list, x)
  for _, v in ipairs(list) do if v == x then return true end end
  return false
end

-- The case of a seed, all drawn from it: {seed, disease (name), present = {symptom = true}, hist
-- = {item = true}, days, severity (0-3)}.
function M.case(seed)
  local rng = rl.rng(kit.seed(seed, "clinic:case"))
  local d = M.DISEASES[rng:random(#M.DISEASES)]
  local present, hist = {}, {}
  for _, s in ipairs(M.SYMPTOMS) do
    if rng:random() < (d.sym[s] or DEFAULT_P) then present[s] = true end
  end
  present[d.chief] = true
  for _, h in ipairs(M.HISTORY) do
    if rng:random() < (d.hist[h] or DEFAULT_P) then hist[h] = true end
  end
  local sev = d.sev
  local u = rng:random()
  if u < 0.2 then sev = math.max(1, sev - 1) elseif u > 0.9 then sev = math.min(3, sev + 1) end
  return { seed = seed, disease = d.name, present = present, hist = hist,
    days = rng:random(d.days[1], d.days[2]), severity = sev }
end

local LEVELS = { train = 0.3, test = 0.3, clean = 0, noisy = 0.6 }

-- tasks(split, n, seed): n tasks {seed =, noise =, exam_noise =}. "train" draws case seeds >= 1000
-- with seed; "test", "clean" and "noisy" are the first n of the 500 held-out cases (seeds 1..500;
-- seed is not used), at patient noise 0.3, 0 and 0.6.
function M.tasks(split, n, seed)
  local level = LEVELS[split]
  if not level then error("clinic.tasks: split: train, test, clean or noisy expected, got " .. tostring(split), 2) end
  if math.type(n) ~= "integer" or n < 0 then error("clinic.tasks: n: a non-negative integer expected", 2) end
  local out = {}
  if split == "train" then
    local rng = rl.rng(seed or 0)
    for i = 1, n do out[i] = { seed = rng:random(1000, 0x7FFFFFFF), noise = level, exam_noise = 0.1 } end
  else
    if n > 500 then error("clinic.tasks: the held-out splits have 500 cases, asked for " .. n, 2) end
    for i = 1, n do out[i] = { seed = i, noise = level, exam_noise = level > 0 and 0.1 or 0 } end
  end
  return out
end

-- ---------------------------------------------------------------- the episode

local Episode = {}
Episode.__index = Episode

function M.new() return setmetatable({}, Episode) end

-- The ground-truth calls of a disease as {name =, region =} records.
local function gt_calls(d)
  local out = {}
  for i, g in ipairs(d.gt) do out[i] = { name = g[1], region = g[2] } end
  return out
end
M.gt_calls = function(name) return gt_calls(DISEASE[name]) end

function Episode:reset(task)
  if type(task) ~= "table" or math.type(task.seed) ~= "integer" then
    error("clinic: reset: a task {seed = integer} expected", 2)
  end
  self.task = task
  self.case = M.case(task.seed)
  self.d = DISEASE[self.case.disease]
  local models = noise_models_of(task.noise or 0.3, task.exam_noise or 0.1)
  self.persona = M.personas:draw(kit.seed(task.seed, "clinic:persona"))
  self.patient = models.patient:plan(kit.seed(task.seed, "clinic:patient"), { eligible = function(t)
    return self:eligible(t)
  end })
  self.exam_plan = models.exam:plan(kit.seed(task.seed, "clinic:exam"))
  self.ledger = M.prices:ledger()
  self.turn, self.questions, self.hist_asked = 0, 0, 0
  self.free = {}
  for _, g in ipairs(self.d.gt) do self.free[g[1]] = (self.free[g[1]] or 0) + 1 end
  self.applied = {}
  return "new patient"
end

-- Whether a patient noise type can apply to this case at all (the released code's eligibility,
-- which reads the symptom text): swap and confusion need a present symptom they map, omission two
-- present symptoms.
function Episode:eligible(t)
  local present, n = self.case.present, 0
  for _ in pairs(present) do n = n + 1 end
  if t == "swap" or t == "confusion" then
    local map = t == "swap" and ADJACENT or CONFUSED
    for s in pairs(present) do if map[s] then return true end end
    return false
  end
  if t == "omission" then return n >= 2 end
  return true
end

-- A number in [lo, hi] drawn from the case seed and a salt (the realisations of noise: the same
-- in every replay).
local function draw(seed, salt, lo, hi)
  local r = rl.rng(kit.seed(seed, salt))
  return lo + (hi - lo) * r:random()
end

-- The plain answer to a patient turn: {text =, yes = bool or nil, symptom =}.
function Episode:answer(verb, what)
  local c = self.case
  if verb == "hello" then
    return string.format("%s %dd %s", self.d.chief, c.days, SEVERITY[c.severity + 1]), self.d.chief
  end
  if verb == "ask" then
    if not c.present[what] then return "no", what end
    if what == self.d.chief then
      return string.format("yes %dd %s", c.days, SEVERITY[c.severity + 1]), what
    end
    return "yes", what
  end
  -- hist
  return c.hist[what] and "yes" or "no", what
end

-- Applies the noise types firing this turn to a patient answer; returns the text and the list of
-- types that changed it (a type that fires where it cannot apply changes nothing).
function Episode:patient_noise(fired, verb, what, text)
  local applied = {}
  local present = self.case.present[what]
  local seed = self.task.seed
  for _, t in ipairs(fired) do
    local new
    if t == "swap" and present and ADJACENT[what] then
      new = verb == "hello" and text:gsub("^%S+", ADJACENT[what]) or ("no, " .. ADJACENT[what] .. " hurts")
    elseif t == "confusion" and present and CONFUSED[what] then
      new = verb == "hello" and text:gsub("^%S+", CONFUSED[what]) or ("no, " .. CONFUSED[what])
    elseif t == "severity" and present and verb ~= "hist" then
      local changed = false
      new = text:gsub("%a+$", function(w)
        for k, s in ipairs(SEVERITY) do
          if s == w then
            changed = true
            return SEVERITY[math.max(1, k - 1)]
          end
        end
        return w
      end)
      if not changed then new = text .. ", a bit" end
    elseif t == "temporal" and present and verb ~= "hist" then
      local changed = false
      new = text:gsub("(%d+)d", function(n)
        changed = true
        local f = draw(seed, "clinic:temporal:" .. self.turn, 0.3, 2.0)
        return math.max(1, math.floor(tonumber(n) * f + 0.5)) .. "d"
      end)
      if not changed then new = text .. ", a while" end
    elseif t == "omission" and present and verb == "ask" then
      new = "no"
    elseif t == "selfdx" then
      new = text .. ", " .. self.d.partner .. "?"
    elseif t == "vague" then
      new = "unsure"
    end
    if new then
      text = new
      applied[#applied + 1] = t
    end
  end
  return text, applied
end

-- Applies an exam noise type to a finding (exam swap and omission fall back to ambiguity where
-- they cannot apply, as in the released code).
local function exam_noise(t, finding)
  if t == "exam_swap" then
    for _, p in ipairs(FINDING_SWAP) do
      local a, b = finding:find(p[1], 1, true)
      if a then return finding:sub(1, a - 1) .. p[2] .. finding:sub(b + 1), t end
    end
  elseif t == "exam_omit" then
    local first = finding:match("^(.-), ")
    if first then return first, t end
  end
  return "eqv " .. finding, t == "exam_ambig" and t or (t .. ">exam_ambig")
end

local function words(s)
  local out = {}
  for w in s:gmatch("%S+") do out[#out + 1] = w end
  return out
end

-- One turn. Returns observation, reward, done, info ({success =, costs = the turn's charges,
-- tool_call = true for an exam, malformed = true, noise = {types applied}, left = true}).
function Episode:step(action)
  self.turn = self.turn + 1
  local text = type(action) == "string" and (action:match("^[^\n]*") or "") or ""
  local w = words(text)
  local verb = w[1]
  -- the noise plans count every turn, in order, before the observation is realised
  local fired_patient = self.patient:step(text)
  local fired_exam = self.exam_plan:step(text)
  local info = {}
  local function finish(obs, reward, done)
    info.costs = self.ledger:turn()
    if info.noise then
      for _, t in ipairs(info.noise) do self.applied[#self.applied + 1] = { turn = self.turn, type = t } end
    end
    return obs, reward, done, info
  end
  local function malformed()
    info.malformed = true
    return finish("?", 0, false)
  end
  if verb == "hello" and #w == 1 then
    local obs, sym = self:answer("hello")
    local noisy, applied = self:patient_noise(fired_patient, "hello", sym, obs)
    if #applied > 0 then info.noise = applied end
    return finish(noisy, 0, false)
  elseif (verb == "ask" or verb == "hist") and #w == 2 then
    local list = verb == "ask" and M.SYMPTOMS or M.HISTORY
    if not contains(list, w[2]) then return malformed() end
    self.questions = self.questions + 1
    if self.persona.personality == "impatient" and self.questions > 6 then
      info.left, info.success = true, false
      return finish(nil, 0, true)
    end
    if verb == "hist" then
      self.hist_asked = self.hist_asked + 1
      if self.persona.personality == "distrust" and self.hist_asked == 1 then return finish("why ask?", 0, false) end
      if self.persona.recall == "low" and draw(self.task.seed, "clinic:recall:" .. w[2] .. ":" .. self.hist_asked, 0, 1) < 0.5 then
        return finish("unsure", 0, false)
      end
    end
    local obs, sym = self:answer(verb, w[2])
    local noisy, applied = self:patient_noise(fired_patient, verb, sym, obs)
    if #applied > 0 then info.noise = applied end
    return finish(noisy, 0, false)
  elseif verb == "exam" and (#w == 2 or #w == 3) then
    local e = EXAM[w[2]]
    info.tool_call = true
    if not e then return finish("n/a", 0, false) end
    local region = w[3]
    if (e.regions == nil) ~= (region == nil) then
      if e.regions then return malformed() end
      return finish("n/a", 0, false)
    end
    if region and not contains(e.regions, region) then return finish("n/a", 0, false) end
    local charge = { money = e.money, discomfort = e.discomfort, exams = 1 }
    -- R_cost as released: each ground-truth exam name grants one free call; the others (and
    -- repeats) are charged (cost + discomfort) / 6, or 1 each under uniform_exam_cost
    if (self.free[e.name] or 0) > 0 then
      self.free[e.name] = self.free[e.name] - 1
    else
      charge.unneeded, charge.unneeded_n = (e.money + e.discomfort) / 6, 1
    end
    self.ledger:charge(charge)
    local finding = M.finding(self.d, e.name, region)
    for _, t in ipairs(fired_exam) do
      local realised
      finding, realised = exam_noise(t, finding)
      info.noise = info.noise or {}
      info.noise[#info.noise + 1] = realised
    end
    return finish(e.name .. ": " .. finding, 0, false)
  elseif verb == "dx" and #w == 2 then
    local guess = DISEASE[w[2]]
    if not guess then return malformed() end
    local right = guess == self.d
    info.success = right
    info.dx = guess.name
    return finish(nil, right and 1 or (guess.name == self.d.partner and 0.5 or 0), true)
  end
  return malformed()
end

function Episode:clone()
  local c = setmetatable({}, Episode)
  for k, v in pairs(self) do c[k] = v end
  c.patient, c.exam_plan, c.ledger = self.patient:clone(), self.exam_plan:clone(), self.ledger:clone()
  c.free, c.applied = {}, {}
  for k, v in pairs(self.free) do c.free[k] = v end
  for i, a in ipairs(self.applied) do c.applied[i] = { turn = a.turn, type = a.type } end
  return c
end

-- Per-episode facts for episodes.jsonl: the disease, the persona, both noise plans (planned
-- types, schedule, fired turns) and the noise types applied, turn by turn.
function Episode:episode_info()
  local applied = {}
  for i, a in ipairs(self.applied) do applied[i] = { turn = a.turn, type = a.type } end
  return { disease = self.d.name, persona = self.persona, patient_noise = self.patient:log(),
    exam_noise = self.exam_plan:log(), applied = rl.json.array(applied) }
end

-- ---------------------------------------------------------------- scripted policies

-- Runs a scripted policy: policy(obs, state) -> action (state is a table it keeps across turns)
-- against a fresh episode of task until it ends or max_turns. Returns {actions, observations,
-- reward, success, turns, costs = the ledger's totals, calls = {{name =, region =}}, info =
-- episode_info()}.
function M.play(task, policy, max_turns)
  local ep = M.new()
  local obs = ep:reset(task)
  local out = { actions = {}, observations = { obs }, reward = 0, success = false, calls = {} }
  local state = { task = task }
  for _ = 1, max_turns or M.max_turns do
    local a = policy(obs, state)
    out.actions[#out.actions + 1] = a
    local r, done, info
    obs, r, done, info = ep:step(a)
    out.reward = out.reward + r
    out.observations[#out.observations + 1] = obs
    if info.tool_call then
      local w = words(a)
      out.calls[#out.calls + 1] = { name = w[2], region = w[3] }
    end
    if info.success then out.success = true end
    if done then break end
  end
  out.turns = #out.actions
  out.costs = ep.ledger:totals()
  out.info = ep:episode_info()
  return out
end

-- The noise-naive posterior over the diseases (a list of probabilities in M.DISEASES order)
-- after the observations so far: answers are read at face value ("yes..." / "no..."; anything
-- else tells nothing), findings match a disease's exactly or tell nothing.
local function posterior(evidence)
  local p = {}
  for i, d in ipairs(M.DISEASES) do
    local lp = 0
    for _, e in ipairs(evidence) do
      if e.kind == "sym" or e.kind == "hist" then
        local q = (e.kind == "sym" and d.sym or d.hist)[e.what] or DEFAULT_P
        q = math.min(math.max(q, 0.02), 0.98)
        lp = lp + math.log(e.yes and q or 1 - q)
      elseif e.kind == "exam" then
        lp = lp + math.log(M.finding(d, e.name, e.region) == e.finding and 0.95 or 0.05)
      end
    end
    p[i] = lp
  end
  local m = -math.huge
  for _, v in ipairs(p) do m = math.max(m, v) end
  local s = 0
  for i, v in ipairs(p) do p[i] = math.exp(v - m); s = s + p[i] end
  for i in ipairs(p) do p[i] = p[i] / s end
  return p
end
M.posterior = posterior

local function entropy(p)
  local h = 0
  for _, v in ipairs(p) do if v > 0 then h = h - v * math.log(v) end end
  return h
end

-- The question (ask or hist) with the largest expected information gain under the posterior,
-- among those not asked yet.
local function best_question(evidence, asked)
  local p = posterior(evidence)
  local best, best_h
  local function try(kind, what)
    local key = kind .. " " .. what
    if asked[key] then return end
    local py = 0
    for i, d in ipairs(M.DISEASES) do py = py + p[i] * ((kind == "sym" and d.sym or d.hist)[what] or DEFAULT_P) end
    local h = 0
    for _, yes in ipairs { true, false } do
      local e = { kind = kind, what = what, yes = yes }
      evidence[#evidence + 1] = e
      h = h + (yes and py or 1 - py) * entropy(posterior(evidence))
      evidence[#evidence] = nil
    end
    if not best_h or h < best_h - 1e-12 then best, best_h = key, h end
  end
  for _, s in ipairs(M.SYMPTOMS) do try("sym", s) end
  for _, h in ipairs(M.HISTORY) do try("hist", h) end
  local kind, what = best:match("^(%S+) (%S+)$")
  return (kind == "sym" and "ask " or "hist ") .. what
end

-- What an observation tells the noise-naive reader about the last action, added to evidence.
local function read(evidence, action, obs)
  if obs == nil then return end
  local w = words(action)
  if w[1] == "hello" then
    local s = obs:match("^(%a+)")
    if s and contains(M.SYMPTOMS, s) then evidence[#evidence + 1] = { kind = "sym", what = s, yes = true } end
    return s and "sym " .. s
  elseif w[1] == "ask" or w[1] == "hist" then
    local yes = obs:match("^yes") and true or (obs:match("^no") and false) or nil
    if yes ~= nil then
      evidence[#evidence + 1] = { kind = w[1] == "ask" and "sym" or "hist", what = w[2], yes = yes }
    end
  elseif w[1] == "exam" then
    local name, finding = obs:match("^(%a+): (.*)$")
    if name == w[2] then evidence[#evidence + 1] = { kind = "exam", name = name, region = w[3], finding = finding } end
  end
end

local function argmax(p)
  local best = 1
  for i, v in ipairs(p) do if v > p[best] then best = i end end
  return M.DISEASES[best]
end

local function exam_action(name, region) return region and ("exam " .. name .. " " .. region) or ("exam " .. name) end

-- The region of the complaint: the region of the likeliest disease after the greeting.
local function complaint_region(evidence) return argmax(posterior(evidence)).region end

-- A Calgary-Cambridge policy as a state machine: greeting, inquiry (n questions chosen by
-- information gain, a random one at `random_at` when given, "why ask?" asked again), the exams of
-- `exams(state)` one per turn, then the diagnosis by posterior argmax.
local function interview(opts)
  return function(obs, st)
    st.evidence = st.evidence or {}
    st.asked = st.asked or {}
    if st.last then
      local complaint = read(st.evidence, st.last, obs)
      if complaint then st.asked[complaint] = true end -- the complaint is not asked about again
    end
    local a
    if not st.last then
      a = "hello"
    elseif st.last:match("^hist") and obs == "why ask?" and not st.reasked then
      st.reasked = true
      a = st.last
    elseif (st.q or 0) < opts.questions then
      st.q = (st.q or 0) + 1
      if opts.random_at == st.q then
        local s = M.SYMPTOMS[opts.random_symptom]
        a = "ask " .. s
      else
        a = best_question(st.evidence, st.asked)
      end
      local w = words(a)
      st.asked[(w[1] == "ask" and "sym " or "hist ") .. w[2]] = true
    else
      st.exams = st.exams or opts.exams(st)
      st.e = (st.e or 0) + 1
      local ex = st.exams[st.e]
      if ex then
        a = exam_action(ex.name, ex.region)
      else
        a = "dx " .. argmax(posterior(st.evidence)).name
      end
    end
    st.last = a
    return a
  end
end

-- oracle(task, rng) -> the demonstration's actions (SFT data), played against the case itself:
-- hello, 3-5 questions by information gain, the case's ground-truth exams one per turn, dx by the
-- noise-naive posterior's argmax. Imperfect on purpose: 15% of demos ask one random question,
-- 20% add one unnecessary exam (70% of those an expensive one: ct, mri, lp or biopsy), and the
-- posterior ignores the noise, so it errs on noisy patients.
function M.oracle(task, rng)
  local case = M.case(task.seed)
  local d = DISEASE[case.disease]
  local n = rng:random(3, 5)
  local random_at = rng:random() < 0.15 and rng:random(1, n) or nil
  local random_symptom = rng:random(#M.SYMPTOMS)
  local extra
  if rng:random() < 0.20 then
    local pool = rng:random() < 0.7 and { "ct", "mri", "lp", "biopsy" } or { "xray", "ecg", "cbc", "uric", "us" }
    local e = EXAM[pool[rng:random(#pool)]]
    extra = { name = e.name, region = e.regions and e.regions[rng:random(#e.regions)] or nil }
  end
  local policy = interview { questions = n, random_at = random_at, random_symptom = random_symptom,
    exams = function()
      local list = gt_calls(d)
      if extra then list[#list + 1] = extra end
      return list
    end }
  return M.play(task, policy).actions
end

-- perfect(task) -> the ceiling's actions: hello, the ground-truth exams, the right diagnosis.
function M.perfect(task)
  local d = DISEASE[M.case(task.seed).disease]
  local out = { "hello" }
  for _, g in ipairs(gt_calls(d)) do out[#out + 1] = exam_action(g.name, g.region) end
  out[#out + 1] = "dx " .. d.name
  return out
end

-- order_all(task) -> the "order every exam" policy's actions: hello, 3 questions by information
-- gain, every exam that images the complaint's region (or takes no region), dx by the posterior.
function M.order_all(task)
  local policy = interview { questions = 3, exams = function(st)
    local region, list = complaint_region(st.evidence), {}
    for _, e in ipairs(M.EXAMS) do
      if not e.regions then
        list[#list + 1] = { name = e.name }
      elseif contains(e.regions, region) then
        list[#list + 1] = { name = e.name, region = region }
      end
    end
    return list
  end }
  return M.play(task, policy).actions
end

-- no_exam(task) -> the oracle's inquiry (4 questions, no random one) and a diagnosis without any
-- exam: what the history alone tells.
function M.no_exam(task)
  return M.play(task, interview { questions = 4, exams = function() return {} end }).actions
end

-- A policy that replays a list of actions (for M.play).
function M.replay(actions)
  return function(_, st)
    st.k = (st.k or 0) + 1
    return actions[st.k] or "dx none"
  end
end

-- ---------------------------------------------------------------- the composite reward

-- tool_score(calls, gt) -> R_tool in [0, 1], ToolRL-style as in the released code: the multiset
-- Jaccard of the tool names, plus, per ground-truth call greedily matched to an unused predicted
-- call of the same name, the Jaccard of the parameter names and the count of equal parameter
-- values; the sum divided by the most it can be (1 + #gt + the number of gt parameters). Calls
-- are {name =, region =} (region nil for a call without parameter).
function M.tool_score(calls, gt)
  local cg, cp, names = {}, {}, {}
  for _, c in ipairs(gt) do cg[c.name] = (cg[c.name] or 0) + 1; names[c.name] = true end
  for _, c in ipairs(calls) do cp[c.name] = (cp[c.name] or 0) + 1; names[c.name] = true end
  local inter, union = 0, 0
  for n in pairs(names) do
    inter = inter + math.min(cg[n] or 0, cp[n] or 0)
    union = union + math.max(cg[n] or 0, cp[n] or 0)
  end
  local r_name = union > 0 and inter / union or 1
  local used, r_param, r_value, max = {}, 0, 0, 1 + #gt
  for _, g in ipairs(gt) do
    local keys_g = g.region and 1 or 0
    max = max + keys_g
    local best, best_s, best_v
    for j, p in ipairs(calls) do
      if not used[j] and p.name == g.name then
        local keys_p = p.region and 1 or 0
        local both = (g.region and p.region) and 1 or 0
        local any = math.max(keys_g, keys_p)
        local jac = any > 0 and both / any or 1
        local val = (g.region and g.region == p.region) and 1 or 0
        if not best_s or jac + val > best_s then best, best_s, best_v = j, jac + val, { jac, val } end
      end
    end
    if best then
      used[best] = true
      r_param, r_value = r_param + best_v[1], r_value + best_v[2]
    end
  end
  return (r_name + r_param + r_value) / max
end

-- The exam calls of a trained episode (turns whose action is a well-formed exam on a known name).
function M.episode_calls(ep)
  local out = {}
  for _, r in ipairs(ep.record or {}) do
    if type(r.info) == "table" and r.info.tool_call then
      local w = words(r.action:match("^[^\n]*") or "")
      out[#out + 1] = { name = w[2], region = w[3] }
    end
  end
  return out
end

-- reward{dx =, tool =, cost =, fmt =, uniform_exam_cost = false, name = "clinic"} -> the
-- composite reward graph R = w_dx R_dx + w_tool R_tool - w_cost R_cost - w_fmt R_fmt, with the
-- released RL config's weights by default (1, 0.5, 0.1, 0):
--   dx    the environment's return: 1 for the right disease, 0.5 for its confusable partner (the
--         scripted judge standing in for the LLM judge's partial Jaccard)
--   tool  M.tool_score of the episode's exam calls against the case's ground-truth calls
--   cost  rl.reward.budget{costs = {unneeded = 1}}: (cost + discomfort) / 6 for each exam beyond
--         the ground-truth names' free calls (uniform_exam_cost: 1 each, currency unneeded_n)
--   fmt   the share of turns the environment answered "?" (weight 0 as released: logged)
-- plus weight-0 metrics exams, money and discomfort.
function M.reward(opts)
  local o = argcheck.fields("clinic.reward", opts or {}, {
    { "dx", 1, argcheck.number() }, { "tool", 0.5, argcheck.number() }, { "cost", 0.1, argcheck.number(0) },
    { "fmt", 0, argcheck.number(0) }, { "uniform_exam_cost", false, argcheck.boolean },
    { "name", "clinic", argcheck.name },
  }, 2)
  local R = rl.reward
  local terms = {
    R.env { name = "dx", weight = o.dx },
    R.fn { name = "tool", weight = o.tool, fn = function(ep)
      local case = M.case(ep.task.seed)
      return M.tool_score(M.episode_calls(ep), gt_calls(DISEASE[case.disease]))
    end },
    R.budget { name = "cost", weight = o.cost,
      costs = o.uniform_exam_cost and { unneeded_n = 1 } or { unneeded = 1 } },
    R.fn { name = "fmt", weight = -o.fmt, fn = function(ep)
      local bad, n = 0, 0
      for _, r in ipairs(ep.record or {}) do
        n = n + 1
        if type(r.info) == "table" and r.info.malformed then bad = bad + 1 end
      end
      return n > 0 and bad / n or 0
    end },
    R.metric("exams", function(ep) return (ep.costs or {}).exams or 0 end),
    R.metric("money", function(ep) return (ep.costs or {}).money or 0 end),
    R.metric("discomfort", function(ep) return (ep.costs or {}).discomfort or 0 end),
  }
  return R.graph { name = o.name, terms = terms }
end

return M
