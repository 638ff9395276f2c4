-- moonrl.skills: a repository of Markdown skills an agent retrieves and curates (rl.skills), as
-- forkable episode state: a group works on its own copy-on-write fork, retrieval and edits are
-- ordinary tools, and an edit's worth is measured by paired continuations from one prefix.
--
--   local repo = assert(rl.skills.repo{ dir = "skills", index = "bm25", max_skills = 500 })
--   repo:put("binary-search", "# Binary search\nHalve the interval ...")   -- true | nil, why
--   repo:search("halve an interval", 3)     -- {{name =, score =}, ...}, best first
--   repo:get("binary-search")               -- the Markdown | nil, why
--   repo:remove("binary-search")            -- true | nil, why
--   local f = repo:fork()                   -- copy-on-write: f's edits stay in f ...
--   repo:merge(f)                           -- ... until merged
--   rl.skills.tools(repo)                   -- search_skills, read_skill, write_skill (rl.tool)
--   rl.skills.paired{ env =, turn =, with =, without = }   -- a reward term: fn(ep) -> number
--
-- A skill is `<dir>/<name>.md`; names are letters, digits, '_', '-' and '.', never '..', '/' or a
-- leading '.', so no name reaches outside dir. The repo reads the .md files of dir when it is
-- made and writes or deletes only `<dir>/<name>.md` of the skills it is told to put, remove or
-- load; nothing else in dir (or outside it) is ever touched. A fork lives in memory; merging it
-- into a repo with a dir writes the merged skills there. Without dir the repo is in memory.
local core = require "moonrl.core"
local argcheck = require "moonrl.argcheck"
local envlib = require "moonrl.env"
local tool = require "moonrl.tool"
local seedlib = require "moonrl.train.seed"

local M = {}
local Repo = {}
Repo.__index = Repo
M.Repo = Repo

local NAME_RULE = "a skill name (letters, digits, '_', '-', '.'; not starting with '.', no '..'; "
  .. "at most 100 bytes)"

-- Whether name is a valid skill name.
function M.valid_name(name)
  return type(name) == "string" and #name <= 100 and name:match("^[%w_%-][%w_%-%.]*$") ~= nil
    and not name:find("..", 1, true)
end

local function check_name(name, where, level)
  if not M.valid_name(name) then
    error(string.format("%s: name: %s expected, got %s", where, NAME_RULE, argcheck.describe(name)),
      level + 1)
  end
end

-- ---------------------------------------------------------------- documents

-- The words of text: lowercased runs of ASCII letters and digits and of non-ASCII bytes.
local function words(text)
  local out = {}
  for w in text:lower():gmatch("[%w\128-\255]+") do out[#out + 1] = w end
  return out
end
M.words = words

-- A stored skill: its text, term frequencies and length in words (name words included).
local function document(name, text)
  local tf, len = {}, 0
  for _, w in ipairs(words(name:gsub("[_%-%.]", " ") .. "\n" .. text)) do
    tf[w] = (tf[w] or 0) + 1
    len = len + 1
  end
  return { text = text, tf = tf, len = len }
end

-- ---------------------------------------------------------------- the repo

local FIELDS = {
  { "dir", nil, argcheck.kind("string", "a folder path (a string)") },
  { "index", "bm25", argcheck.one_of { "bm25" } },
  { "max_skills", nil, argcheck.integer(1) },
  { "max_bytes", 65536, argcheck.integer(1) },
  { "k1", 1.2, argcheck.number(0) },
  { "b", 0.75, argcheck.number(0, 1) },
}

-- A repo over layers (bottom first; each maps name -> document or false for a removed skill;
-- only the top one is written to, the others are shared with forks and never change).
local function new_repo(cfg, layers, dir)
  return setmetatable({ cfg = cfg, layers = layers, dir = dir, changed = {} }, Repo)
end

-- rl.skills.repo{dir =, index = "bm25", max_skills =, max_bytes = 65536, k1 = 1.2, b = 0.75}
-- -> repo, or nil and a message when dir cannot be made or read or holds more than max_skills
-- skills.
function M.repo(opts)
  local o = argcheck.fields("rl.skills.repo", opts, FIELDS, 2)
  local base = {}
  if o.dir then
    if o.dir == "" then error("rl.skills.repo: dir: a folder path expected, got \"\"", 2) end
    local ok, err = core.fs.mkdir(o.dir)
    if not ok then return nil, "rl.skills.repo: " .. err end
    local names, lerr = core.fs.list(o.dir)
    if not names then return nil, "rl.skills.repo: " .. lerr end
    local count = 0
    for _, file in ipairs(names) do
      local name = file:match("^(.*)%.md$")
      if name and M.valid_name(name) then
        local f = io.open(o.dir .. "/" .. file, "rb")
        local text = f and f:read("a")
        if f then f:close() end
        if text then
          base[name] = document(name, text)
          count = count + 1
        end
      end
    end
    if o.max_skills and count > o.max_skills then
      return nil, string.format("rl.skills.repo: %s holds %d skills, more than max_skills = %d",
        o.dir, count, o.max_skills)
    end
  end
  return new_repo(o, { base }, o.dir)
end

-- The document of name in the repo's view, or nil.
local function lookup(self, name)
  for i = #self.layers, 1, -1 do
    local d = self.layers[i][name]
    if d ~= nil then return d or nil end
  end
  return nil
end

-- The view: sorted names and name -> document (cached until the next edit).
local function view(self)
  if self.cache then return self.cache end
  local docs, names = {}, {}
  for i = 1, #self.layers do
    for name, d in pairs(self.layers[i]) do docs[name] = d or nil end
  end
  for name in pairs(docs) do names[#names + 1] = name end
  table.sort(names)
  self.cache = { names = names, docs = docs }
  return self.cache
end

local function touched(self, name)
  self.cache = nil
  self.changed[name] = true
end

-- repo:names() -> the skills' names, sorted.
function Repo:names()
  local out = {}
  for i, n in ipairs(view(self).names) do out[i] = n end
  return out
end

-- repo:get(name) -> the skill's Markdown, or nil and a message.
function Repo:get(name)
  check_name(name, "skills: get", 2)
  local d = lookup(self, name)
  if not d then return nil, string.format("no skill named '%s'", name) end
  return d.text
end

-- repo:put(name, markdown) -> true, or nil and a message (the repo is full, the text too long,
-- the file cannot be written). Adds or replaces the skill.
function Repo:put(name, markdown)
  check_name(name, "skills: put", 2)
  if type(markdown) ~= "string" then
    error("skills: put: markdown: a string expected, got " .. argcheck.describe(markdown), 2)
  end
  if #markdown > self.cfg.max_bytes then
    return nil, string.format("skill '%s' has %d bytes, more than max_bytes = %d", name,
      #markdown, self.cfg.max_bytes)
  end
  local exists = lookup(self, name) ~= nil
  if not exists and self.cfg.max_skills and #view(self).names >= self.cfg.max_skills then
    return nil, string.format("the repo is full (max_skills = %d)", self.cfg.max_skills)
  end
  if self.dir then
    local ok, err = core.fs.write(self.dir .. "/" .. name .. ".md", markdown)
    if not ok then return nil, err end
  end
  self.layers[#self.layers][name] = document(name, markdown)
  touched(self, name)
  return true
end

-- repo:remove(name) -> true, or nil and a message (no such skill; its file cannot be deleted).
function Repo:remove(name)
  check_name(name, "skills: remove", 2)
  if not lookup(self, name) then return nil, string.format("no skill named '%s'", name) end
  if self.dir then
    local ok, err, code = os.remove(self.dir .. "/" .. name .. ".md")
    if not ok and code ~= 2 then return nil, err end -- (ENOENT: already gone)
  end
  -- a tombstone hides lower layers' copy; in a single-layer repo the entry just goes
  local top = self.layers[#self.layers]
  if #self.layers > 1 then top[name] = false else top[name] = nil end
  touched(self, name)
  return true
end

-- repo:fork() -> a copy-on-write fork: it sees the repo as it is now; its edits stay in it (and
-- the repo's later edits stay out of it) until repo:merge(fork). Forks live in memory. The
-- repo's top layer is frozen (shared from now on) and both go on in fresh layers of their own;
-- past 8 layers the repo's view is flattened into one (the old layers stay, unchanged, for the
-- forks that share them).
function Repo:fork()
  if next(self.layers[#self.layers]) ~= nil then self.layers[#self.layers + 1] = {} end
  if #self.layers > 8 then
    local flat = {}
    for name, d in pairs(view(self).docs) do flat[name] = d end
    self.layers = { flat, {} }
  end
  local shared = {}
  for i = 1, #self.layers - 1 do shared[i] = self.layers[i] end
  shared[#shared + 1] = {}
  local child = new_repo(self.cfg, shared, nil)
  child.parent = self
  return child
end

-- repo:merge(fork) -> the names it changed here (sorted), or nil and a message: the fork's edits
-- (puts and removes since it was made or loaded) applied to this repo, the fork's version
-- winning.
function Repo:merge(fork)
  if getmetatable(fork) ~= Repo or fork.parent ~= self then
    error("skills: merge: fork: a fork of this repo (repo:fork()) expected", 2)
  end
  local names = {}
  for name in pairs(fork.changed) do names[#names + 1] = name end
  table.sort(names)
  local merged = {}
  for _, name in ipairs(names) do
    local d, mine = lookup(fork, name), lookup(self, name)
    local ok, err = nil, nil
    if d and not (mine and mine.text == d.text) then
      ok, err = self:put(name, d.text)
    elseif not d and mine then
      ok, err = self:remove(name)
    end
    if ok then merged[#merged + 1] = name end
    if err then return nil, string.format("merge: %s: %s", name, err) end
  end
  return merged
end

-- ---------------------------------------------------------------- search

-- repo:search(query, k = 5) -> up to k {name =, score =} of the skills matching the query's
-- words, best first: BM25 (k1, b) over each skill's name and Markdown, with idf
-- ln(1 + (N - df + 0.5) / (df + 0.5)). Ties go to the smaller name, so the same repo and query
-- always give the same list.
function Repo:search(query, k)
  if type(query) ~= "string" then
    error("skills: search: query: a string expected, got " .. argcheck.describe(query), 2)
  end
  if k ~= nil and (math.type(k) ~= "integer" or k < 1) then
    error("skills: search: k: a positive integer expected, got " .. argcheck.describe(k), 2)
  end
  k = k or 5
  local v = view(self)
  local n = #v.names
  if n == 0 then return {} end
  local terms, seen = {}, {}
  for _, w in ipairs(words(query)) do
    if not seen[w] then seen[w] = true; terms[#terms + 1] = w end
  end
  local total = 0
  for _, name in ipairs(v.names) do total = total + v.docs[name].len end
  local avg = total / n
  local idf = {}
  for _, t in ipairs(terms) do
    local df = 0
    for _, name in ipairs(v.names) do if v.docs[name].tf[t] then df = df + 1 end end
    idf[t] = math.log(1 + (n - df + 0.5) / (df + 0.5))
  end
  local k1, b = self.cfg.k1, self.cfg.b
  local hits = {}
  for _, name in ipairs(v.names) do
    local d, score, matched = v.docs[name], 0, false
    for _, t in ipairs(terms) do
      local f = d.tf[t]
      if f then
        matched = true
        local norm = avg > 0 and d.len / avg or 0
        score = score + idf[t] * f * (k1 + 1) / (f + k1 * (1 - b + b * norm))
      end
    end
    if matched then hits[#hits + 1] = { name = name, score = score } end
  end
  table.sort(hits, function(x, y)
    if x.score ~= y.score then return x.score > y.score end
    return x.name < y.name
  end)
  for i = #hits, k + 1, -1 do hits[i] = nil end
  return hits
end

-- ---------------------------------------------------------------- state

-- repo:state() -> {format =, skills = {name = markdown}}: the repo's view (JSON-ready).
function Repo:state()
  local skills = {}
  local v = view(self)
  for _, name in ipairs(v.names) do skills[name] = v.docs[name].text end
  return { format = "moonrl.skills/1", skills = skills }
end

-- repo:load(state) -> true, or nil and a message: the repo's view becomes state's; with a dir,
-- the skills' files are written and the files of skills state lacks deleted (only those).
function Repo:load(state)
  if type(state) ~= "table" or state.format ~= "moonrl.skills/1" or type(state.skills) ~= "table" then
    error("skills: load: state: a table from repo:state() expected", 2)
  end
  local names = {}
  for name, text in pairs(state.skills) do
    if not M.valid_name(name) then
      error(string.format("skills: load: state.skills: %s expected, got %s", NAME_RULE,
        argcheck.describe(name)), 2)
    end
    if type(text) ~= "string" then
      error(string.format("skills: load: state.skills[%q]: a string expected", name), 2)
    end
    names[#names + 1] = name
  end
  table.sort(names)
  if self.cfg.max_skills and #names > self.cfg.max_skills then
    return nil, string.format("the state holds %d skills, more than max_skills = %d", #names,
      self.cfg.max_skills)
  end
  for _, name in ipairs(self:names()) do
    if state.skills[name] == nil then
      local ok, err = self:remove(name)
      if not ok then return nil, err end
    end
  end
  for _, name in ipairs(names) do
    local d = lookup(self, name)
    if not (d and d.text == state.skills[name]) then
      local ok, err = self:put(name, state.skills[name])
      if not ok then return nil, err end
    end
  end
  return true
end

-- ---------------------------------------------------------------- tools

-- The text of a tool call's argument: a named one, else the positional ones from `from` on,
-- joined by blanks (the "line" format splits CALL arguments at blanks).
local function arg_text(args, key, from)
  if type(args) ~= "table" then return nil end
  if args[key] ~= nil then return tostring(args[key]) end
  if args[from] == nil then return nil end
  local parts = {}
  for i = from, #args do parts[#parts + 1] = tostring(args[i]) end
  return table.concat(parts, " ")
end

local function failed(text) return "[error: " .. text .. "]", { status = "error", message = text } end
local function fine(text) return text, { status = "ok" } end

-- The first non-empty line of a skill, without Markdown heading marks.
local function summary(text)
  for line in text:gmatch("[^\n]+") do
    local s = line:gsub("^%s*#*%s*", ""):gsub("%s+$", "")
    if s ~= "" then return #s > 80 and s:sub(1, 77) .. "..." or s end
  end
  return ""
end

-- rl.skills.tools(repo [, {k = 5}]) -> {search_skills, read_skill, write_skill}: rl.tool objects
-- over repo. A failed call (no such skill, a bad name, a full repo) returns "[error: ...]" with
-- a result table of status "error", which the environment records as a failed tool call.
function M.tools(repo, opts)
  if getmetatable(repo) ~= Repo then
    error("rl.skills.tools: repo: an rl.skills repo expected, got " .. argcheck.describe(repo), 2)
  end
  local o = argcheck.fields("rl.skills.tools", opts or {}, { { "k", 5, argcheck.integer(1) } }, 2)
  local search = tool {
    name = "search_skills", args = { "query" },
    description = "search the skill library; returns the best matching skills' names",
    run = function(args)
      local q = arg_text(args, "query", 1)
      if not q or q == "" then return failed("search_skills needs a query") end
      local hits = repo:search(q, o.k)
      if #hits == 0 then return fine("no skills match") end
      local lines = {}
      for i, h in ipairs(hits) do
        lines[i] = string.format("%s: %s", h.name, summary(repo:get(h.name)))
      end
      return fine(table.concat(lines, "\n"))
    end,
  }
  local read = tool {
    name = "read_skill", args = { "name" }, description = "read one skill by its name",
    run = function(args)
      local name = arg_text(args, "name", 1)
      if not M.valid_name(name) then return failed("not a skill name: " .. tostring(name)) end
      local text, err = repo:get(name)
      if not text then return failed(err) end
      return fine(text)
    end,
  }
  local write = tool {
    name = "write_skill", args = { "name", "markdown" },
    description = "add or replace a skill: a name and its Markdown text",
    run = function(args)
      local name = type(args) == "table" and (args.name or args[1]) or nil
      local text = arg_text(args, "markdown", 2)
      if not M.valid_name(name) then return failed("not a skill name: " .. tostring(name)) end
      if not text then return failed("write_skill needs the skill's text") end
      local ok, err = repo:put(name, text)
      if not ok then return failed(err) end
      return fine("saved skill " .. name)
    end,
  }
  return { search, read, write }
end

-- ---------------------------------------------------------------- paired continuations

local function continuation(what)
  return function(v)
    if type(v) == "function" then return nil end
    if type(v) == "table" and #v > 0 then
      for _, a in ipairs(v) do if type(a) ~= "string" then return what end end
      return nil
    end
    return what
  end
end

local CONT = "a function(instance, ctx) -> outcome or a list of actions (strings)"

-- Runs a continuation on instance: a function's number, or the rewards of a list of actions
-- (stopping when the episode is done).
local function run_arm(arm, env, instance, ctx, which)
  if type(arm) == "function" then
    local v = arm(instance, ctx)
    if type(v) ~= "number" or v ~= v then
      error(string.format("rl.skills.paired: %s returned %s, not a number", which,
        argcheck.describe(v)), 0)
    end
    return v
  end
  local total, record = 0, {}
  for _, action in ipairs(arm) do
    local _, r, done = envlib.step(env, instance, action, record)
    total = total + r
    if done then break end
  end
  return total
end

-- rl.skills.paired{env =, turn =, with =, without =} -> fn(ep) -> number | nil: the outcome of
-- continuation `with` minus that of `without`, both run from the state ep reached after `turn`
-- turns (an integer >= 0, or fn(ep) -> integer). The environment replays ep's first turns from
-- reset(ep.task, rl.rng(ep.seed)), then clone() gives each continuation its own copy of that
-- state; both get ctx = {ep =, turn =, env =, rng = rl.rng(mix(ep.seed, turn))}, the same
-- stream, so identical continuations give exactly 0. nil when ep has fewer turns than `turn`
-- or ended before it (not applicable). A reward term for a skill edit or retrieval.
function M.paired(opts)
  local o = argcheck.fields("rl.skills.paired", opts, {
    { "env", nil, function(v)
      if type(v) == "table" and type(v.new) == "function" then return nil end
      return "an environment module (with new())"
    end, required = true },
    { "turn", nil, argcheck.either(argcheck.integer(0), argcheck.kind("function", "a function(ep) -> integer")),
      required = true },
    { "with", nil, continuation(CONT), required = true },
    { "without", nil, continuation(CONT), required = true },
  }, 2)
  local ok, err = pcall(envlib.check, o.env)
  if not ok then error("rl.skills.paired: env: " .. tostring(err):gsub("^[^:]*:%d+: ", ""), 2) end
  local probe = o.env.new()
  if type(probe) ~= "table" or type(probe.clone) ~= "function" then
    error("rl.skills.paired: env: the environment's instances need a clone() method", 2)
  end
  local env = o.env
  return function(ep)
    if type(ep) ~= "table" or type(ep.record) ~= "table" then
      error("rl.skills.paired: ep: an episode (with its turn record) expected", 2)
    end
    local turn = o.turn
    if type(turn) == "function" then turn = turn(ep) end
    if math.type(turn) ~= "integer" or turn < 0 then
      error("rl.skills.paired: turn returned " .. argcheck.describe(turn) .. ", not an integer >= 0", 2)
    end
    if #ep.record < turn then return nil end
    local instance = env.new()
    instance:reset(ep.task, core.rng(ep.seed or 0))
    local record = {}
    for t = 1, turn do
      local r = ep.record[t]
      local obs, _, done = envlib.step(env, instance, r.action, record)
      if obs ~= r.observation then
        error(string.format("rl.skills.paired: the environment did not replay turn %d of the "
          .. "episode (another observation): it must be deterministic from task and seed", t), 2)
      end
      if done then return nil end
    end
    local seed = seedlib.mix(ep.seed or 0, turn)
    local a, b = instance:clone(), instance:clone()
    local va = run_arm(o.with, env, a, { ep = ep, turn = turn, env = env, rng = core.rng(seed) }, "with")
    local vb = run_arm(o.without, env, b, { ep = ep, turn = turn, env = env, rng = core.rng(seed) }, "without")
    return va - vb
  end
end

return M
