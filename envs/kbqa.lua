-- kbqa.lua - multi-hop question answering over a synthetic knowledge base with a search tool:
-- the search-QA environment of spec reproductions.md, section 3.2 (A2TGPO, IGPO). 200 entities
-- (three-letter names), three relations (boss, city, pet) whose values are entities too; each
-- fact is a one-line document ("ann boss bob"). A question composes 1-4 relations from a start
-- entity ("city of boss of ann?": the city of ann's boss).
--
--   observation  "Q: city of boss of ann?"          action  "search ann boss"
--   observation  "ann boss bob | kim boss ann"      action  "search bob city"
--   observation  "bob city tex | tex pet bob"       action  "answer tex"  -> done, reward 1
--
-- Actions: search <words> (the top 2 documents by a BM25-style score of the words: an entity
-- alone, or an entity and a relation; documents that mention the entity the other way round are
-- the distractors), answer <x> (ends the episode; reward 1 when x is the answer, else 0). Anything
-- else is invalid: reward -0.1 (the format term), observation "invalid", the turn spent. The
-- episode also ends after task.max_turns actions (M.max_turns = 6: four searches, a spare one,
-- the answer).
--
-- Splits: one entity in five (by a hash of its name) is held out, and one two-or-more-hop relation
-- chain in five; "train" questions start at a kept entity and ask a kept chain, "test" questions
-- start at a held-out entity or ask a held-out chain (never both kept). M.gen({hops =, split =},
-- rng) makes one task {question =, start =, chain = {relations}, path = {entities}, answer =,
-- hops =, max_turns =}; M.tasks(split, n, seed) cycles hops over 1..4. M.oracle(task, rng): one
-- correct search per hop ("search <entity> <relation>"), with a redundant repeat of a search one
-- time in four, then the answer; M.solve(task): the same without the redundant searches (the
-- perfect oracle). M.gold(task) is the answer's text as an "answer <x>" action, which the
-- info_gain option forces after each turn. Instances have clone(). Everything is a function of
-- the seeds given; the knowledge base is fixed (M.kb).
--
-- M.variant{faults = 0, cascade = false, guess = false} is the module with
--   faults   a faulty search tool, the miniature of OpenSearch-VL's cascading tool failures (spec
--            3.2): each search fails with this probability ("error: search failed"). Whether the
--            n-th search of an episode fails is a function of n and a seed the episode draws
--            from its rng at reset, so it does not depend on the policy's other actions;
--   cascade  after a malformed call (an invalid action) the tool is down until the next reset
--            ("error: search down"). Failed searches and the malformed call set info.error (what
--            the trainer's fatal option counts as a failed turn);
--   guess    AutoSearch's self-answering (spec 3.2): a search may end with "guess <x>" ("search
--            bob city guess tex"); the searches before the first search whose guess is the
--            answer are the minimal depth (all of them when no guess is right), and the last
--            turn's info has depth and excess (the searches beyond it). Its oracle and solve
--            guess the entity found so far with each search.
-- Every search turn of a variant sets info.tool_call. The plain module draws nothing from the rng,
-- never fails and reads no guesses.
--
-- M.cosearch{ranker =, candidates =, demo_gold =} is a multi-agent environment (rl.multi) on the
-- same knowledge base for CoSearch (spec 3.2): a reasoner and a generative document ranker that
-- orders each search's top 4 (M.retrieve) before the reasoner is shown two (see its comment).
local rl = require "moonrl"
local argcheck = require "moonrl.argcheck"

local M = { name = "kbqa", format = "line", max_turns = 6, relations = { "boss", "city", "pet" },
  entities = 200, max_hops = 4 }

-- ---------------------------------------------------------------- the knowledge base

local CONS, VOWELS = "bdfgklmnprstvz", "aeiou"

local function hash(s, seed)
  local h = seed or 7
  for i = 1, #s do h = rl.train.mix(h, s:byte(i)) end
  return h
end

-- The fixed knowledge base: names, facts (subject -> relation -> object) and documents.
local function build()
  local rng, names, seen = rl.rng(20260301), {}, {}
  while #names < M.entities do
    local a, b, c = rng:random(#CONS), rng:random(#VOWELS), rng:random(#CONS)
    local name = CONS:sub(a, a) .. VOWELS:sub(b, b) .. CONS:sub(c, c)
    if not seen[name] then
      seen[name] = true
      names[#names + 1] = name
    end
  end
  local fact, docs = {}, {}
  for _, s in ipairs(names) do
    fact[s] = {}
    for _, r in ipairs(M.relations) do
      local o
      repeat o = names[rng:random(#names)] until o ~= s
      fact[s][r] = o
      docs[#docs + 1] = { s, r, o }
    end
  end
  -- document frequencies of each word, for the idf
  local df = {}
  for _, d in ipairs(docs) do
    local once = {}
    for _, w in ipairs(d) do
      if not once[w] then df[w], once[w] = (df[w] or 0) + 1, true end
    end
  end
  return { names = names, fact = fact, docs = docs, df = df }
end
M.kb = build()
local KB = M.kb

-- Whether an entity, or a relation chain (its names joined by spaces), is held out.
function M.held_entity(name) return hash(name, 11) % 5 == 0 end
function M.held_chain(chain) return #chain >= 2 and hash(table.concat(chain, " "), 13) % 5 == 0 end

-- retrieve(words [, k = 2]) -> the top k documents (a list of texts, "a r b") by BM25 (k1 = 1.2,
-- b = 0.75; every document has three words, so the length term is 1) over the query's words, ties
-- broken by a hash of the document and the query (so a distractor can come first); an empty
-- list when no document has any of the words.
function M.retrieve(text, k)
  local words, seen = {}, {}
  for w in text:lower():gmatch("%a+") do
    if not seen[w] then words[#words + 1], seen[w] = w, true end
  end
  if #words == 0 then return {} end
  local N, best = #KB.docs, {}
  for i, d in ipairs(KB.docs) do
    local s = 0
    for _, w in ipairs(words) do
      local tf = 0
      for _, x in ipairs(d) do if x == w then tf = tf + 1 end end
      if tf > 0 then
        local df = KB.df[w]
        s = s + math.log(1 + (N - df + 0.5) / (df + 0.5)) * tf * 2.2 / (tf + 1.2)
      end
    end
    if s > 0 then best[#best + 1] = { s = s, tie = hash(table.concat(d, " ") .. "/" .. text, 17), i = i } end
  end
  table.sort(best, function(a, b)
    if math.abs(a.s - b.s) > 1e-9 then return a.s > b.s end
    if a.tie ~= b.tie then return a.tie < b.tie end
    return a.i < b.i
  end)
  local out = {}
  for j = 1, math.min(k or 2, #best) do out[j] = table.concat(KB.docs[best[j].i], " ") end
  return out
end

-- search(words) -> the top 2 documents of retrieve as text ("a r b | c r d"), or "no results".
function M.search(text)
  local docs = M.retrieve(text, 2)
  if #docs == 0 then return "no results" end
  return table.concat(docs, " | ")
end

-- ---------------------------------------------------------------- tasks

-- gen({hops = 1..4, split = "train" | "test"}, rng) -> a task.
function M.gen(params, rng)
  local hops = params.hops
  assert(math.type(hops) == "integer" and hops >= 1 and hops <= M.max_hops, "kbqa.gen: hops must be an integer in 1..4")
  local test = params.split == "test"
  for _ = 1, 10000 do
    local start = KB.names[rng:random(#KB.names)]
    local chain = {}
    for h = 1, hops do chain[h] = M.relations[rng:random(#M.relations)] end
    local he, hc = M.held_entity(start), M.held_chain(chain)
    if (test and (he or hc)) or (not test and not he and not hc) then
      local path, cur = { start }, start
      for h = 1, hops do
        cur = KB.fact[cur][chain[h]]
        path[h + 1] = cur
      end
      local words = {}
      for h = hops, 1, -1 do words[#words + 1] = chain[h] .. " of" end
      return { question = "Q: " .. table.concat(words, " ") .. " " .. start .. "?", start = start,
        chain = chain, path = path, answer = cur, hops = hops, max_turns = M.max_turns }
    end
  end
  error("kbqa.gen: no task found", 2)
end

function M.tasks(split, n, seed)
  assert(split == "train" or split == "test", "split must be \"train\" or \"test\"")
  local rng, out = rl.rng(seed or 0), {}
  for i = 1, n do out[i] = M.gen({ hops = (i - 1) % M.max_hops + 1, split = split }, rng) end
  return out
end

-- held_out(n) -> the search recipes' held-out questions: n test questions of each hop count, 1
-- hop first, drawn from one fixed rng (seed 4242), so every recipe and arm gets the same ones.
function M.held_out(n)
  assert(math.type(n) == "integer" and n >= 1, "kbqa.held_out: n must be a positive integer")
  local rng, out = rl.rng(4242), {}
  for h = 1, M.max_hops do
    for _ = 1, n do out[#out + 1] = M.gen({ hops = h, split = "test" }, rng) end
  end
  return out
end

-- The answer as the action that gives it.
function M.gold(task) return "answer " .. task.answer end

-- ---------------------------------------------------------------- episodes

local Episode = {}
Episode.__index = Episode
function M.new() return setmetatable({}, Episode) end

function Episode:reset(task)
  self.task, self.steps, self.searches = task, 0, 0
  return task.question
end

function Episode:step(action, parsed)
  self.steps = self.steps + 1
  local text = (parsed and parsed.text) or action
  local verb, rest = text:match("^%s*(%a+)%s*(.-)%s*$")
  verb = verb and verb:lower()
  local obs, reward, done, info
  if verb == "answer" and rest ~= "" then
    local ok = rest:lower() == self.task.answer
    return nil, ok and 1 or 0, true, { success = ok, searches = self.searches, hops = self.task.hops }
  elseif verb == "search" and rest ~= "" then
    self.searches = self.searches + 1
    obs, reward, info = M.search(rest), 0, { success = false }
  else
    obs, reward, info = "invalid", -0.1, { success = false, invalid = true }
  end
  done = self.steps >= (self.task.max_turns or M.max_turns)
  info.hops = self.task.hops
  if done then return nil, reward, true, info end
  return obs, reward, false, info
end

function Episode:clone()
  return setmetatable({ task = self.task, steps = self.steps, searches = self.searches }, Episode)
end

-- ---------------------------------------------------------------- oracles

-- The demonstration: one correct search per hop, a repeat when redundant() says so, then the
-- answer; with guess, each search also guesses the entity found so far (what the searches before
-- it gave: the answer only once every hop is searched, so only on a repeat of the last one).
local function demo(task, redundant, guess)
  local out = {}
  for h = 1, task.hops do
    local q = "search " .. task.path[h] .. " " .. task.chain[h]
    out[#out + 1] = guess and q .. " guess " .. task.path[h] or q
    if redundant and redundant() then out[#out + 1] = guess and q .. " guess " .. task.path[h + 1] or q end
  end
  out[#out + 1] = M.gold(task)
  return out
end

local function oracle(task, rng, guess)
  local spare = M.max_turns - task.hops - 1 -- redundant searches that still leave room to answer
  return demo(task, function()
    if spare > 0 and rng:random(4) == 1 then
      spare = spare - 1
      return true
    end
    return false
  end, guess)
end

function M.solve(task) return demo(task) end
function M.oracle(task, rng) return oracle(task, rng) end

-- ---------------------------------------------------------------- variants

-- Whether search number n of an episode whose fault seed is seed fails, at probability p.
local function fails(seed, n, p)
  return p > 0 and (rl.train.mix(seed, n, 0xFA17) % 1000000) / 1000000 < p
end

-- variant{faults = 0, cascade = false, guess = false} -> the module with a faulty search tool
-- and/or self-answering guesses (see the top of the file), named "kbqa-faults", "kbqa-guess" or
-- "kbqa-faults-guess".
function M.variant(opts)
  local o = argcheck.fields("kbqa.variant", opts or {}, {
    { "faults", 0, argcheck.number(0, 1) }, { "cascade", false, argcheck.boolean },
    { "guess", false, argcheck.boolean },
  }, 2)
  local V = {}
  for k, v in pairs(M) do V[k] = v end
  V.name = "kbqa" .. ((o.faults > 0 or o.cascade) and "-faults" or "") .. (o.guess and "-guess" or "")
  V.faults, V.cascade, V.guess = o.faults, o.cascade, o.guess
  if o.guess then
    function V.solve(task) return demo(task, nil, true) end
    function V.oracle(task, rng) return oracle(task, rng, true) end
  end
  local Var = setmetatable({}, { __index = Episode })
  Var.__index = Var
  function V.new() return setmetatable({}, Var) end

  function Var:reset(task, rng)
    self.down, self.depth = false, nil
    self.fault_seed = o.faults > 0 and rng:random(0, 0x3fffffff) or 0
    return Episode.reset(self, task)
  end

  function Var:step(action, parsed)
    local text = (parsed and parsed.text) or action
    local verb, rest = text:match("^%s*(%a+)%s*(.-)%s*$")
    verb = verb and verb:lower()
    if verb == "search" and rest ~= "" then
      local words, guess = rest, nil
      if o.guess then
        local w, g = rest:match("^(.-)%s+[Gg][Uu][Ee][Ss][Ss]%s+(%S+)$")
        if w and w ~= "" then words, guess = w, g:lower() end
      end
      self.steps, self.searches = self.steps + 1, self.searches + 1
      -- a right guess with search n: the n - 1 searches before it were enough
      if guess == self.task.answer and not self.depth then self.depth = self.searches - 1 end
      local obs, info
      if self.down or fails(self.fault_seed, self.searches, o.faults) then
        local why = self.down and "search down" or "search failed"
        obs, info = "error: " .. why, { success = false, error = why }
      else
        obs, info = M.search(words), { success = false }
      end
      info.tool_call, info.hops = true, self.task.hops
      if self.steps >= (self.task.max_turns or M.max_turns) then return nil, 0, true, self:ended(info) end
      return obs, 0, false, info
    end
    local obs, reward, done, info = Episode.step(self, action, parsed)
    if info.invalid then
      info.error = "malformed call"
      if o.cascade then self.down = true end
    end
    return obs, reward, done, done and self:ended(info) or info
  end

  -- the last turn's info: with guess, the minimal depth (the searches before the first right
  -- guess; all of them when no guess was right) and the searches beyond it
  function Var:ended(info)
    if o.guess then
      info.depth = self.depth or self.searches
      info.excess = self.searches - info.depth
    end
    return info
  end

  function Var:clone()
    local c = setmetatable(Episode.clone(self), Var)
    c.fault_seed, c.down, c.depth = self.fault_seed, self.down, self.depth
    return c
  end
  return V
end

-- ---------------------------------------------------------------- CoSearch

-- The candidate of docs that answers query: the first whose subject and relation are both words
-- of the query (the fact a search "<entity> <relation>" asks for); nil when none is.
function M.gold_index(query, docs)
  local words = {}
  for w in query:lower():gmatch("%a+") do words[w] = true end
  for i, d in ipairs(docs) do
    local a, r = d:match("^(%a+) (%a+) %a+$")
    if a and words[a] and words[r] then return i end
  end
  return nil
end

-- parse_rank(text, n) -> a permutation of 1..n (a list), or nil, message: "rank 3 1 2 4", each of
-- 1..n once, nothing else.
function M.parse_rank(text, n)
  if type(text) ~= "string" then return nil, "not a string" end
  local rest = text:match("^%s*rank%s+(.-)%s*$")
  if not rest then return nil, "not \"rank i j ...\"" end
  local out, seen = {}, {}
  for w in rest:gmatch("%S+") do
    local k = w:match("^%d$") and tonumber(w)
    if not k or k < 1 or k > n then return nil, "'" .. w .. "' is not one of 1.." .. n end
    if seen[k] then return nil, k .. " is ranked twice" end
    seen[k], out[#out + 1] = true, k
  end
  if #out ~= n then return nil, string.format("%d of %d candidates ranked", #out, n) end
  return out
end

-- The ranker's observation: "q: ann boss | 1 kim boss ann | 2 ann boss bob | ..."
local function ranker_obs(query, docs)
  local parts = { "q: " .. query }
  for i, d in ipairs(docs) do parts[#parts + 1] = i .. " " .. d end
  return table.concat(parts, " | ")
end

-- cosearch{ranker = "policy", candidates = 4, demo_gold = 0.5} -> a multi-agent environment
-- (rl.multi) for CoSearch's joint training of a reasoner and a generative document ranker (spec
-- reproductions.md 3.2). The reasoner acts one turn an invocation; it is given the question and
-- every search's two documents so far ("Q: city of boss of ann? > ann boss bob | kim boss ann") and
-- answers ("answer tex") or searches ("search ann boss"). A search retrieves the top `candidates`
-- documents by BM25; with ranker = "policy" the ranker agent is then given the query and the
-- candidates, numbered (ranker_obs above) and replies "rank 2 1 3 4" (parse_rank; anything else
-- keeps BM25's order), and the reasoner gets the first two by its ranking. ranker = "bm25": no
-- ranker agent, BM25's top two; "oracle": no ranker agent, the gold candidate (gold_index) first,
-- then BM25's order. Rewards: the reasoner's invalid actions -0.1; at the end (finish) the
-- outcome (1 right answer, else 0) on every reasoner invocation; a ranker invocation gets 0.5
-- when it ranked the gold candidate first, plus 0.5 x the outcome. An episode ends with the
-- answer or after max_turns reasoner turns. Oracles (SFT): the reasoner searches each hop's
-- entity and relation (task.path, task.chain) and then answers; the ranker puts the gold candidate
-- first with probability demo_gold, else keeps BM25's order ("rank 1 2 3 4"). Tasks are M.tasks's
-- with split set; the module's tally[split] counts, over every episode: ranked (searches), gold_in
-- (with a gold candidate), gold_first and gold_shown (the gold candidate shown to the reasoner
-- first, or at all), and episodes and wins per hop count (ep1.., win1..); reset it with
-- C.tally = {}.
function M.cosearch(opts)
  local o = argcheck.fields("kbqa.cosearch", opts or {}, {
    { "ranker", "policy", argcheck.one_of { "policy", "bm25", "oracle" } },
    { "candidates", 4, argcheck.integer(2, 9) }, { "demo_gold", 0.5, argcheck.number(0, 1) },
  }, 2)
  local C = { name = "kbqa-cosearch-" .. o.ranker, format = "line", ranker = o.ranker, candidates = o.candidates,
    agents = o.ranker == "policy" and { "reasoner", "ranker" } or { "reasoner" },
    max_turns = { reasoner = 1, ranker = 1 }, tally = {} }
  function C.tasks(split, n, seed)
    local out = M.tasks(split, n, seed)
    for _, t in ipairs(out) do t.split = split end
    return out
  end
  local function count(split, key, by)
    local t = C.tally[split] or {}
    C.tally[split] = t
    t[key] = (t[key] or 0) + (by or 1)
  end

  local Co = {}
  Co.__index = Co
  function C.new() return setmetatable({}, Co) end

  function Co:reset(task)
    self.task, self.turns, self.shown, self.pending, self.answer = task, 0, {}, nil, nil
    self.over, self.outcome = false, 0
  end

  function Co:reasoner_obs()
    local parts = { self.task.question }
    for _, s in ipairs(self.shown) do parts[#parts + 1] = "> " .. s end
    return table.concat(parts, " ")
  end

  -- the documents the reasoner is shown, ordered by a ranking (a permutation of the candidates)
  function Co:show(order)
    local p = self.pending
    local docs = {}
    for j = 1, math.min(2, #order) do docs[j] = p.docs[order[j]] end
    local split = self.task.split or "train"
    count(split, "ranked")
    if p.gold then
      count(split, "gold_in")
      if order[1] == p.gold then count(split, "gold_first") end
      if order[1] == p.gold or order[2] == p.gold then count(split, "gold_shown") end
    end
    self.shown[#self.shown + 1] = #docs > 0 and table.concat(docs, " | ") or "no results"
    self.pending = nil
  end

  function Co:fixed_order()
    local p, order = self.pending, {}
    if o.ranker == "oracle" and p.gold then order[1] = p.gold end
    for i = 1, #p.docs do if i ~= p.gold or o.ranker ~= "oracle" then order[#order + 1] = i end end
    return order
  end

  function Co:next(prev)
    if self.over then return nil end
    if self.pending then
      if o.ranker == "policy" and prev and prev.agent == "reasoner" and #self.pending.docs > 0 then
        return "ranker", ranker_obs(self.pending.query, self.pending.docs)
      end
      self:show(self:fixed_order())
    end
    return "reasoner", self:reasoner_obs()
  end

  function Co:step(agent, action, parsed)
    local text = (parsed and parsed.text) or action
    if agent == "ranker" then
      local p = self.pending
      local order = M.parse_rank(text, #p.docs)
      local gold_first = order ~= nil and p.gold ~= nil and order[1] == p.gold
      self:show(order or self:fixed_order())
      return nil, gold_first and 0.5 or 0, true, { success = gold_first, invalid = order == nil or nil }
    end
    self.turns = self.turns + 1
    local verb, rest = text:match("^%s*(%a+)%s*(.-)%s*$")
    verb = verb and verb:lower()
    local reward, info = 0, { hops = self.task.hops }
    if verb == "answer" and rest ~= "" then
      self.over, self.outcome = true, rest:lower() == self.task.answer and 1 or 0
      info.success = self.outcome == 1
    elseif verb == "search" and rest ~= "" then
      local docs = M.retrieve(rest, o.candidates)
      self.pending = { query = rest:lower(), docs = docs, gold = M.gold_index(rest, docs) }
      info.tool_call = true
    else
      reward, info.invalid = -0.1, true
    end
    if not self.over and self.turns >= (self.task.max_turns or M.max_turns) then self.over = true end
    return nil, reward, true, info
  end

  function Co:finish()
    local split, h = self.task.split or "train", self.task.hops
    count(split, "ep" .. h)
    count(split, "win" .. h, self.outcome)
    return { reasoner = self.outcome, ranker = 0.5 * self.outcome }
  end

  function Co:success() return self.outcome == 1 end

  -- the oracles: the reasoner's from the task (which hop it is on: the searches shown so far)
  local function reasoner_oracle(task, turns)
    local given = turns[#turns].given
    local done = select(2, given:gsub(" > ", ""))
    if done >= task.hops then return M.gold(task) end
    return "search " .. task.path[done + 1] .. " " .. task.chain[done + 1]
  end
  local function ranker_oracle(_, turns, rng)
    local given = turns[#turns].given
    local query = given:match("^q: (.-) |")
    local docs = {}
    for d in given:gmatch("| %d (%a+ %a+ %a+)") do docs[#docs + 1] = d end
    local gold = M.gold_index(query or "", docs)
    local first = gold and rng:random() < o.demo_gold and gold or nil
    local order = { "rank", first }
    for i = 1, #docs do if i ~= first then order[#order + 1] = i end end
    return table.concat(order, " ")
  end
  C.oracles = { reasoner = reasoner_oracle, ranker = o.ranker == "policy" and ranker_oracle or nil }
  return C
end

-- success_by_hops(ctx, tasks, chunk [, each]) -> {all =, h1 =, ..., h<max_hops> =}: the greedy
-- success of a trainer context's policy (ctx.stages.rollout) on tasks, chunk episodes at a time;
-- all over every task, hK over the hop-K tasks (0 where there are none); each(ep, task), when
-- given, sees every episode (for a recipe's other measures from the same rollouts).
function M.success_by_hops(ctx, tasks, chunk, each)
  local wins, count, all = {}, {}, 0
  for h = 1, M.max_hops do wins[h], count[h] = 0, 0 end
  for _, t in ipairs(tasks) do count[t.hops] = count[t.hops] + 1 end
  for first = 1, #tasks, chunk do
    local part = table.move(tasks, first, math.min(#tasks, first + chunk - 1), 1, {})
    local b = ctx.stages.rollout(ctx, { tasks = part, repeats = 1, seed = 5 + first, temperature = 0,
      group_base = 0 })
    for i, ep in ipairs(b.episodes) do
      if ep.success then
        local h = part[i].hops
        wins[h], all = wins[h] + 1, all + 1
      end
      if each then each(ep, part[i]) end
    end
  end
  local out = { all = all / #tasks }
  for h = 1, M.max_hops do out["h" .. h] = count[h] > 0 and wins[h] / count[h] or 0 end
  return out
end

-- warm_start{env =, path =, reuse =, new_model =, seed =, examples =, epochs =} -> path,
-- {seconds =, loss =, examples =}: the search recipes' shared SFT start, rl.recipe.oracle_start
-- at the search-QA turn budget (M.max_turns).
function M.warm_start(o)
  return rl.recipe.oracle_start { env = o.env, path = o.path, reuse = o.reuse, new_model = o.new_model,
    seed = o.seed, examples = o.examples, epochs = o.epochs, max_turns = M.max_turns }
end

return M
