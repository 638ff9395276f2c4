-- rulebook.lua - task streams governed by a hidden rule (spec reproductions.md, section 2.5),
-- for the skill-library recipe (recipes/skills.lua). Two environments share the rule book:
--
-- The executor (this module): a door shows a letter d (a..p, 16 letters); its code is the letter
-- d + SHIFT[rule] (mod 16), the rule being one of 8 families. The executor tries letters
-- ("try f"); a wrong try answers "no", the right one ends the episode with reward 1; 8 turns.
-- Without help it can only explore (16 letters, 8 tries: about half the time it runs out); with
-- the right one-line skill "skill: +5" in its prompt it opens the door on the first try. The
-- prompt holds the repo's entries, one `skill:` line each (a `+k` rule, or a bare letter: "try
-- this letter first"), or one `last:` line (raw memory: the previous task's compressed
-- trajectory), then "door c".
--
--   observation  "skill: +5\ndoor c"   action  "try h"   -> done, reward 1
--
-- The executor's oracle (SFT) reads each `skill:` line in order and tries what it says (d + k,
-- or the letter), reuses the last trajectory's successful letter when given raw memory, then
-- explores the untried letters from a on: deliberately imperfect, it never infers a rule itself.
--
-- The curator (M.curator): after task i of a stream it sees the repo and the compressed
-- trajectory of task i ("r:+5;f\nc>abh!": door c, tried a, b, h, the last one opened it; "."
-- when it ran out) and emits one operation: "add <text>", "upd <n> <text>", "del <n>" or
-- "none". M.apply(repo, op) gives the repo after it. Its reward is computed by the recipe (the
-- frozen executor on the stream's later tasks), so its own step returns 0.
--
-- Streams: M.streams(split, n, seed, families) -> {{rule =, doors = {4 letters}}, ...}; "train"
-- and "test" draw from disjoint seed spaces; families 7 and 8 are held out of the curator's
-- training (M.TRAIN_FAMILIES) for the domain-transfer rows.
local M = {
  name = "rulebook",
  max_turns = 8,
  format = "line",
  LETTERS = 16,
  SHIFT = { 1, 3, 4, 6, 9, 10, 12, 15 },
  TRAIN_FAMILIES = { 1, 2, 3, 4, 5, 6 },
  HELD_FAMILIES = { 7, 8 },
  MAX_REPO = 4,
  MAX_ENTRY = 16,
  TASKS = 4,
}

local A = string.byte("a")
local function letter(i) return string.char(A + i % M.LETTERS) end
local function index(ch)
  if type(ch) ~= "string" or #ch ~= 1 then return nil end
  local i = ch:byte() - A
  if i < 0 or i >= M.LETTERS then return nil end
  return i
end
M.letter, M.index = letter, index

local function rng_of(seed) return require("moonrl").rng(seed) end

-- The skill text of a rule family.
function M.skill(rule) return "+" .. M.SHIFT[rule] end

-- code(rule, door) -> the letter index that opens the door.
function M.code(rule, door) return (door + M.SHIFT[rule]) % M.LETTERS end

-- The letter a skill line says to try first at door (nil: the line says nothing usable).
function M.suggest(text, door)
  local k = type(text) == "string" and text:match("^%+(%d+)$")
  if k then return (door + tonumber(k)) % M.LETTERS end
  return index(text)
end

-- streams(split, n, seed, families): n streams of the split; each a rule from families (a list of
-- family numbers, default all 8) and TASKS door letters.
function M.streams(split, n, seed, families)
  if split ~= "train" and split ~= "test" then error("rulebook.streams: split: \"train\" or \"test\" expected", 2) end
  if math.type(n) ~= "integer" or n < 0 then error("rulebook.streams: n: a non-negative integer expected", 2) end
  families = families or { 1, 2, 3, 4, 5, 6, 7, 8 }
  for _, f in ipairs(families) do
    if not M.SHIFT[f] then error("rulebook.streams: families: unknown family " .. tostring(f), 2) end
  end
  local rng = rng_of(((seed or 0) * 2 + (split == "test" and 1 or 0)) * 7919 + 13)
  local out = {}
  for i = 1, n do
    local s = { rule = families[rng:random(#families)], doors = {} }
    for t = 1, M.TASKS do s.doors[t] = rng:random(M.LETTERS) - 1 end
    out[i] = s
  end
  return out
end

-- An executor task: {rule =, door =, repo = {texts} or nil, last = trajectory text or nil}.
function M.task(rule, door, repo, last)
  return { rule = rule, door = door, repo = repo or {}, last = last }
end

-- tasks(split, n, seed): executor tasks for SFT / evaluation: a random rule and door, and a
-- repo of 0-3 entries (the right skill in about half of them, wrong rules and letters in the
-- rest) or, one time in six, raw memory.
function M.tasks(split, n, seed)
  if split ~= "train" and split ~= "test" then error("rulebook.tasks: split: \"train\" or \"test\" expected", 2) end
  local rng = rng_of(((seed or 0) * 2 + (split == "test" and 1 or 0)) * 104729 + 7)
  local out = {}
  for i = 1, n do
    local rule, door = rng:random(8), rng:random(M.LETTERS) - 1
    local repo, last = {}, nil
    if rng:random() < 1 / 6 then
      local d = rng:random(M.LETTERS) - 1
      last = rng:random() < 0.7 and (letter(d) .. ">" .. letter(M.code(rule, d)) .. "!") or (letter(d) .. ">abc.")
    else
      local k = rng:random(4) - 1
      for j = 1, k do
        local r = rng:random()
        repo[j] = r < 0.45 and M.skill(rule) or r < 0.8 and M.skill(rng:random(8)) or letter(rng:random(M.LETTERS) - 1)
      end
    end
    out[i] = M.task(rule, door, repo, last)
  end
  return out
end

function M.prompt(task)
  local lines = {}
  for _, s in ipairs(task.repo or {}) do lines[#lines + 1] = "skill: " .. s end
  if task.last then lines[#lines + 1] = "last: " .. task.last end
  lines[#lines + 1] = "door " .. letter(task.door)
  return table.concat(lines, "\n")
end

local Episode = {}
Episode.__index = Episode

function M.new() return setmetatable({}, Episode) end

function Episode:reset(task)
  self.task, self.code, self.tried = task, M.code(task.rule, task.door), {}
  return M.prompt(task)
end

-- "try x": x is tried; anything else wastes the turn ("say try x").
function Episode:step(action)
  local x = index(type(action) == "string" and action:match("^%s*try%s+(%a)%s*$"))
  if not x then return "say try x", 0, false, { success = false } end
  self.tried[#self.tried + 1] = x
  if x == self.code then return nil, 1, true, { success = true, tried = letter(x) } end
  return "no", 0, false, { success = false, tried = letter(x) }
end

function Episode:clone()
  local c = setmetatable({}, Episode)
  c.task, c.code, c.tried = self.task, self.code, table.move(self.tried, 1, #self.tried, 1, {})
  return c
end

-- The executor's imperfect oracle: the skills' suggestions in order, the raw memory's successful
-- letter, then the untried letters from a on (a fixed order, so that a greedy executor can follow
-- it; random exploration decoded greedily repeats one letter). rng is unused.
function M.oracle(task, rng)
  local order, seen = {}, {}
  local function add(i) if i and not seen[i] then seen[i] = true; order[#order + 1] = i end end
  for _, s in ipairs(task.repo or {}) do add(M.suggest(s, task.door)) end
  if task.last then add(index(task.last:match(">%a*(%a)!$"))) end
  for i = 0, M.LETTERS - 1 do add(i) end
  local out = {}
  for k = 1, M.max_turns do out[k] = "try " .. letter(order[k]) end
  return out
end

-- trajectory(door, tried, success) -> the compressed trajectory "c>abh!" (or "c>abcdefgh.").
function M.trajectory(door, tried, success)
  return letter(door) .. ">" .. table.concat(tried) .. (success and "!" or ".")
end

-- The tried letters and success of an executor episode record (rl.batch episode).
function M.outcome(ep)
  local tried = {}
  for _, r in ipairs(ep.record or {}) do
    if type(r.info) == "table" and r.info.tried then tried[#tried + 1] = r.info.tried end
  end
  return tried, ep.success and true or false, #(ep.record or {})
end

-- apply(repo, op) -> the new repo (a copy), or nil, why for an operation that is malformed or
-- does not fit (an entry longer than MAX_ENTRY bytes, a fifth entry, a number out of range).
function M.apply(repo, op)
  if type(repo) ~= "table" then error("rulebook.apply: repo: a list of strings expected", 2) end
  if type(op) ~= "string" then return nil, "not an operation" end
  op = op:match("^%s*(.-)%s*$")
  local new = table.move(repo, 1, #repo, 1, {})
  if op == "none" then return new end
  local text = op:match("^add%s+(%S+)$")
  if text then
    if #text > M.MAX_ENTRY then return nil, "entry too long" end
    if #new >= M.MAX_REPO then return nil, "repo full" end
    new[#new + 1] = text
    return new
  end
  local n, t = op:match("^upd%s+(%d+)%s+(%S+)$")
  if n then
    n = tonumber(n)
    if not new[n] then return nil, "no entry " .. n end
    if #t > M.MAX_ENTRY then return nil, "entry too long" end
    new[n] = t
    return new
  end
  n = op:match("^del%s+(%d+)$")
  if n then
    n = tonumber(n)
    if not new[n] then return nil, "no entry " .. n end
    table.remove(new, n)
    return new
  end
  return nil, "not an operation"
end

-- The curator environment: one turn; task = {repo =, traj =, stream =, i =}.
local C = { name = "rulebook_curator", max_turns = 1, format = "line" }
M.curator = C

function C.prompt(task)
  return "r:" .. table.concat(task.repo, ";") .. "\n" .. task.traj
end

local Cur = {}
Cur.__index = Cur
function C.new() return setmetatable({}, Cur) end
function Cur:reset(task) self.task = task; return C.prompt(task) end
function Cur:step(action)
  local new, why = M.apply(self.task.repo, action)
  return nil, 0, true, { success = new ~= nil, op_error = why }
end

-- The curator's imperfect oracle: after a success, add the rule it implies (the code minus the
-- door) unless the repo has it, 65% of the time, else a random rule or the letter; after a
-- failure, delete the first entry when there is one (it misled), else nothing.
function C.oracle(task, rng)
  local door, tried, ok = task.traj:match("^(%a)>(%a*)([!.])$")
  if ok == "!" then
    local d, c = index(door), index(tried:sub(-1))
    local right = "+" .. ((c - d) % M.LETTERS)
    for _, s in ipairs(task.repo) do if s == right then return { "none" } end end
    local pick = rng:random() < 0.65 and right or (rng:random() < 0.5 and M.skill(rng:random(8)) or tried:sub(-1))
    if #task.repo >= M.MAX_REPO then return { "upd 1 " .. pick } end
    return { "add " .. pick }
  end
  if #task.repo > 0 then return { "del 1" } end
  return { "none" }
end

-- tasks for the curator's SFT: random repos and trajectories of the training families.
function C.tasks(split, n, seed)
  local rng = rng_of(((seed or 0) * 2 + (split == "test" and 1 or 0)) * 15485863 + 3)
  local out = {}
  for i = 1, n do
    local rule = M.TRAIN_FAMILIES[rng:random(#M.TRAIN_FAMILIES)]
    local door = rng:random(M.LETTERS) - 1
    local repo = {}
    for j = 1, rng:random(3) - 1 do
      repo[j] = rng:random() < 0.4 and M.skill(rule) or M.skill(rng:random(8))
    end
    local tried = {}
    local k = rng:random(8)
    for j = 1, k - 1 do tried[j] = letter((M.code(rule, door) + j) % M.LETTERS) end
    local ok = rng:random() < 0.6
    if ok then tried[k] = letter(M.code(rule, door)) end
    out[i] = { repo = repo, traj = M.trajectory(door, tried, ok) }
  end
  return out
end

-- The Skill1 environment (M.skill1, recipes/skill1.lua): one policy in four roles on streams of
-- four doors in one room; every door of the room opens to one hidden code letter, drawn per
-- stream, so no policy can know it without memory. The doors differ: exploring from the door's
-- letter on (d, d+1, ...: the oracle's order) finds the code in 8 tries half the time, and
-- independently on each task. A skill is two letters, room and code ("cq": in room c try q).
-- One episode is one task of the stream:
--
--   "room c door f" -> "query c"   -> "1 cq 2 ck"  (the repo's entries of that room, or "none")
--                   -> "pick 1"    -> "skill: cq"  (pick 0 or no candidate: "no skill")
--                   -> "try q" ... -> "f>q!"       (solve: 8 tries; the compressed trajectory)
--                   -> "distil cq" -> done         (the new skill, admitted by the recipe)
--
-- Candidates: the entries whose first letter (the room they were written in) is a word of the
-- query, newest first, at most 3. A task is {room =, door =, code =, repo = {texts, oldest
-- first}, nomem = true (the query answers "none": the no-memory baseline)}; each turn's info
-- has role ("query", "pick", "solve", "distil"), success (the task's so far), and picked (the
-- picked text), tried (the letter) or distil (the text, when it is two letters a..p).
local S1 = { name = "rulebook_skill1", max_turns = 3 + M.max_turns, format = "line", CANDIDATES = 3,
  MAX_REPO = 6 }
M.skill1 = S1

-- Whether text is a skill: two letters a..p.
function S1.valid(text)
  return type(text) == "string" and #text == 2 and index(text:sub(1, 1)) ~= nil and index(text:sub(2, 2)) ~= nil
end

-- candidates(repo, words) -> up to CANDIDATES texts of repo, best first (see above).
function S1.candidates(repo, words)
  local want = {}
  for _, w in ipairs(words) do want[w] = true end
  local out = {}
  for i = #repo, 1, -1 do
    if want[repo[i]:sub(1, 1)] and #out < S1.CANDIDATES then out[#out + 1] = repo[i] end
  end
  return out
end

-- admit(repo, text) -> the repo with text as its newest entry (the oldest retired past MAX_REPO),
-- or the repo unchanged when text is not a skill. In place.
function S1.admit(repo, text)
  if S1.valid(text) then
    repo[#repo + 1] = text
    if #repo > S1.MAX_REPO then table.remove(repo, 1) end
  end
  return repo
end

-- teach(repo, failed, val, opts) -> repo, added: SkillRL's scripted teacher, one bank update.
-- failed is a list of the tasks ({room =, code =}) of failed trajectories, oldest first; val maps
-- a room (0-based) to its validation success (a room missing from val counts as 0). For each
-- failed task in order whose room's success is below opts.threshold (default 0.4), the teacher
-- reads the task's hidden code (it is a teacher) and admits the task-specific skill room + code,
-- unless the repo already holds it, at most opts.max_new (default 3) new skills per update. In
-- place; added is the list of admitted texts.
local TEACH = { threshold = true, max_new = true }
function S1.teach(repo, failed, val, opts)
  opts = opts or {}
  if type(repo) ~= "table" then error("rulebook.skill1.teach: repo: a list of skills expected", 2) end
  if type(failed) ~= "table" then error("rulebook.skill1.teach: failed: a list of tasks expected", 2) end
  if type(val) ~= "table" then error("rulebook.skill1.teach: val: a table room -> success expected", 2) end
  for k in pairs(opts) do
    if not TEACH[k] then error("rulebook.skill1.teach: unknown option '" .. tostring(k) .. "'", 2) end
  end
  local threshold, max_new = opts.threshold or 0.4, opts.max_new or 3
  if type(threshold) ~= "number" then error("rulebook.skill1.teach: threshold: a number expected", 2) end
  if math.type(max_new) ~= "integer" or max_new < 0 then
    error("rulebook.skill1.teach: max_new: a non-negative integer expected", 2)
  end
  local added = {}
  for _, task in ipairs(failed) do
    if #added >= max_new then break end
    if (val[task.room] or 0) < threshold then
      local text = letter(task.room) .. letter(task.code)
      local have = false
      for _, r in ipairs(repo) do if r == text then have = true end end
      if not have then
        S1.admit(repo, text)
        added[#added + 1] = text
      end
    end
  end
  return repo, added
end

-- The order a solver without a skill tries letters in: the door's letter, then the next ones.
function S1.explore(door, k) return (door + k - 1) % M.LETTERS end

-- A room's starting repo: two stale skills of the room (wrong codes) and two of other rooms,
-- interleaved, oldest first, drawn with rng.
local function starting_repo(rng, room, code)
  local function other(not_this)
    local x
    repeat x = rng:random(M.LETTERS) - 1 until x ~= not_this
    return x
  end
  local repo = {}
  for _ = 1, 2 do
    repo[#repo + 1] = letter(room) .. letter(other(code))
    repo[#repo + 1] = letter(other(room)) .. letter(rng:random(M.LETTERS) - 1)
  end
  return repo
end

-- streams(split, n, seed) -> {{room =, code =, doors = {TASKS letters}, repo = {starting
-- texts}}, ...}; "train" and "test" draw from disjoint seed spaces.
function S1.streams(split, n, seed)
  if split ~= "train" and split ~= "test" then error("rulebook.skill1.streams: split: \"train\" or \"test\" expected", 2) end
  if math.type(n) ~= "integer" or n < 0 then error("rulebook.skill1.streams: n: a non-negative integer expected", 2) end
  local rng = rng_of(((seed or 0) * 2 + (split == "test" and 1 or 0)) * 611953 + 29)
  local out = {}
  for i = 1, n do
    local room, code = rng:random(M.LETTERS) - 1, rng:random(M.LETTERS) - 1
    local doors = {}
    for t = 1, M.TASKS do doors[t] = rng:random(M.LETTERS) - 1 end
    out[i] = { room = room, code = code, doors = doors, repo = starting_repo(rng, room, code) }
  end
  return out
end

-- tasks(split, n, seed): single tasks for SFT: a room's starting repo, with one or two later
-- entries of the room half the time (the right code in 60% of them), no memory one time in 5.
function S1.tasks(split, n, seed)
  local rng = rng_of(((seed or 0) * 2 + (split == "test" and 1 or 0)) * 32452843 + 5)
  local out = {}
  for i = 1, n do
    local room, code, door = rng:random(M.LETTERS) - 1, rng:random(M.LETTERS) - 1, rng:random(M.LETTERS) - 1
    local repo = starting_repo(rng, room, code)
    if rng:random() < 0.5 then
      for _ = 1, rng:random(2) do
        S1.admit(repo, letter(room) .. letter(rng:random() < 0.6 and code or rng:random(M.LETTERS) - 1))
      end
    end
    out[i] = { room = room, door = door, code = code, repo = repo, nomem = rng:random() < 0.2 or nil }
  end
  return out
end

local S1E = {}
S1E.__index = S1E
function S1.new() return setmetatable({}, S1E) end

function S1E:reset(task)
  self.task, self.phase, self.tried, self.ok, self.cands, self.tries = task, "query", {}, false, {}, 0
  return "room " .. letter(task.room) .. " door " .. letter(task.door)
end

function S1E:step(action)
  action = type(action) == "string" and action or ""
  local task = self.task
  if self.phase == "query" then
    self.phase = "pick"
    local q = action:match("^%s*query%s+(.-)%s*$")
    if q and not task.nomem then self.cands = S1.candidates(task.repo or {}, require("moonrl").skills.words(q)) end
    local parts = {}
    for k, c in ipairs(self.cands) do parts[#parts + 1] = k .. " " .. c end
    return #parts > 0 and table.concat(parts, " ") or "none", 0, false, { role = "query", success = false, query = q }
  elseif self.phase == "pick" then
    self.phase = "solve"
    local n = tonumber(action:match("^%s*pick%s+(%d+)%s*$"))
    self.picked = n and self.cands[n]
    return self.picked and ("skill: " .. self.picked) or "no skill", 0, false,
      { role = "pick", success = false, picked = self.picked }
  elseif self.phase == "solve" then
    local x = index(action:match("^%s*try%s+(%a)%s*$"))
    if x then self.tried[#self.tried + 1] = letter(x) end
    if x == task.code then self.ok = true end
    self.tries = self.tries + 1
    local info = { role = "solve", success = self.ok, tried = x and letter(x) }
    if self.ok or self.tries >= M.max_turns then
      self.phase = "distil"
      return M.trajectory(task.door, self.tried, self.ok), self.ok and 1 or 0, false, info
    end
    return x and "no" or "say try x", 0, false, info
  end
  local text = action:match("^%s*distil%s+(%S+)%s*$")
  return nil, 0, true, { role = "distil", success = self.ok, distil = S1.valid(text) and text or nil }
end

function S1E:clone()
  local c = setmetatable({}, S1E)
  for k, v in pairs(self) do c[k] = v end
  c.tried, c.cands = table.move(self.tried, 1, #self.tried, 1, {}), table.move(self.cands, 1, #self.cands, 1, {})
  return c
end

-- The imperfect oracle: query the room (80%, else the door's letter); pick the first candidate
-- (70%, else any, or none); try the picked skill's code, then the untried letters from the
-- door's on; after a success distil room + the letter that opened the door in rooms a..h, but
-- room + the first letter it tried in rooms i..p (a systematic slip, which greedy decoding keeps:
-- right only when the first try opened it); after a failure room + the last letter tried. With
-- perfect = true: query the room, pick the candidate with the right code (none when there is
-- none), distil room + code after a success.
function S1.oracle(task, rng, perfect)
  local room, code = letter(task.room), task.code
  local q = (perfect or rng:random() < 0.8) and room or letter(task.door)
  local cands = task.nomem and {} or S1.candidates(task.repo or {}, { q })
  local pick = 0
  if perfect then
    for k, c in ipairs(cands) do if c:sub(2, 2) == letter(code) and pick == 0 then pick = k end end
  elseif #cands > 0 then
    pick = rng:random() < 0.7 and 1 or rng:random(#cands + 1) - 1
  end
  local out = { "query " .. q, "pick " .. pick }
  local seen, order = {}, {}
  local function add(i) if i and not seen[i] then seen[i] = true; order[#order + 1] = i end end
  if pick > 0 then add(index(cands[pick]:sub(2, 2))) end
  for k = 1, M.LETTERS do add(S1.explore(task.door, k)) end
  local last
  for k = 1, M.max_turns do
    out[#out + 1], last = "try " .. letter(order[k]), order[k]
    if order[k] == code then break end
  end
  local d = last
  if last == code and not perfect and task.room >= 8 then d = order[1] end
  out[#out + 1] = "distil " .. room .. letter(d)
  return out
end

-- The turns (1-based) of role in an episode's record, and the info of its first such turn ({}).
function S1.turns_of(ep, role)
  local out = {}
  for k, r in ipairs(ep.record or {}) do
    if type(r.info) == "table" and r.info.role == role then out[#out + 1] = k end
  end
  return out
end
function S1.info_of(ep, role)
  local k = S1.turns_of(ep, role)[1]
  return k and ep.record[k].info or {}
end

-- credit(eps, keys, opts, trends): Skill1's credit for chains of tasks. eps[t][c] is chain c's
-- episode of task t ({record =, success =}), keys[c] its stream's key, trends the EMA table
-- (key .. ":" .. picked text or "-" -> trend), updated in order (task 1 of every chain, then
-- task 2, ...). opts = {trend = true, distil = true, rate = 0.1}. Sets each episode's
-- turn_rewards[k]: solve turns the outcome s; query and pick turns the picked skill's trend
-- after this use (with trend = false: s); the distil turn of task t < #eps the later success of
-- the distilled skill (task t+1's s when task t+1 picked it, else 0) minus its trend before that
-- use (PRIOR for a text never picked; with distil = false: s); task #eps's distil turn none.
S1.PRIOR = 0.5
function S1.credit(eps, keys, opts, trends)
  local rate = opts.rate or 0.1
  for t = 1, #eps do
    for c, ep in ipairs(eps[t]) do
      local s = ep.success and 1 or 0
      local picked = S1.info_of(ep, "pick").picked
      local key = keys[c] .. ":" .. (picked or "-")
      local before = trends[key] or S1.PRIOR
      trends[key] = before + rate * (s - before)
      local select = opts.trend and trends[key] or s
      local tr = {}
      for k, r in ipairs(ep.record or {}) do
        local role = type(r.info) == "table" and r.info.role
        if role == "query" or role == "pick" then tr[k] = select
        elseif role == "solve" or (role == "distil" and not opts.distil) then tr[k] = s end
      end
      ep.turn_rewards = tr
      local prev = t > 1 and eps[t - 1][c]
      local k = prev and opts.distil and S1.turns_of(prev, "distil")[1]
      if k then
        local d = S1.info_of(prev, "distil").distil
        local used = d ~= nil and picked == d
        prev.turn_rewards[k] = (used and s or 0) - (used and before or S1.PRIOR)
      end
    end
  end
end

-- comp_credit(eps, without): Complementary RL's credit for chains of tasks, eps[t][c] as in
-- credit. without[t][c] (t >= 2) is whether chain c's task t succeeded when rolled out again,
-- same task and seed, with the repo before task t-1's distil joined it. Sets each episode's
-- turn_rewards[k]: query, pick and solve turns the outcome s; the distil turn of task t < #eps
-- (the extractor's entry) task t+1's s minus without[t+1][c] (the entry's help to the actor);
-- task #eps's distil turn none.
function S1.comp_credit(eps, without)
  for t = 1, #eps do
    for c, ep in ipairs(eps[t]) do
      local s = ep.success and 1 or 0
      local tr = {}
      for k, r in ipairs(ep.record or {}) do
        local role = type(r.info) == "table" and r.info.role
        if role == "query" or role == "pick" or role == "solve" then
          tr[k] = s
        elseif role == "distil" and t < #eps then
          tr[k] = (eps[t + 1][c].success and 1 or 0) - (without[t + 1][c] and 1 or 0)
        end
      end
      ep.turn_rewards = tr
    end
  end
end

-- normalise(episodes) -> per[i][k]: GRPO per group and role ("query" and "pick" one role): each
-- turn's turn_rewards[k] minus the mean of its group's turns of that role, over their population
-- sd (+ 1e-6); 0 where that sd is below 1e-6; nil for a turn without a reward.
local SELECT = { query = "select", pick = "select" }
function S1.normalise(episodes)
  local sets, order = {}, {}
  for i, ep in ipairs(episodes) do
    for k, r in ipairs(ep.record or {}) do
      local v = ep.turn_rewards and ep.turn_rewards[k]
      if v then
        local role = type(r.info) == "table" and r.info.role or "other"
        local key = tostring(ep.group) .. "|" .. (SELECT[role] or role)
        local set = sets[key]
        if not set then set = { sum = 0 }; sets[key] = set; order[#order + 1] = key end
        set.sum = set.sum + v
        set[#set + 1] = { i, k, v }
      end
    end
  end
  local per = {}
  for i = 1, #episodes do per[i] = {} end
  for _, key in ipairs(order) do
    local set = sets[key]
    local mean, var = set.sum / #set, 0
    for _, x in ipairs(set) do var = var + (x[3] - mean) ^ 2 end
    local sd = math.sqrt(var / #set)
    for _, x in ipairs(set) do per[x[1]][x[2]] = sd >= 1e-6 and (x[3] - mean) / (sd + 1e-6) or 0 end
  end
  return per
end

return M
