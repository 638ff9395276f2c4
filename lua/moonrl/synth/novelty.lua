-- moonrl.synth.novelty: near-duplicate detection for synthesised tasks (rl.synth.novelty):
-- character n-gram shingles of a normalised key text, a MinHash signature, and LSH banding, so
-- that a candidate is compared only with the few stored tasks that share a band with it.
--
--   local nov = rl.synth.novelty { key = function(task) return task.instruction end,
--     ngram = 5, minhash = 128, threshold = .7, against = { "pool", "archive" },
--     numbers = "mask" }                         -- "mask": every number reads as "#"
--   local ok, why, info = nov:check(task)        -- true, or false, "duplicate" | "near_duplicate",
--                                                -- {id =, index =, similarity =}
--   nov:add(task, "pool", id); nov:remove(id, "pool")
--
-- The key text is lowercased, its punctuation dropped and its spaces collapsed (and, with
-- numbers = "mask", each number replaced by "#", so "7 apples" and "8 apples" read the same).
-- The same normalised text is a "duplicate"; an estimated Jaccard similarity of the shingle sets
-- >= threshold is a "near_duplicate". Hashing is FNV-1a and splitmix64 on the bytes, so the same
-- text gives the same signature in every process. The signature: minhash values h_i = min over
-- shingles of mix(shingle hash, i); LSH: b bands of r rows (b * r <= minhash), r chosen so that
-- the band threshold (1/b)^(1/r) sits below `threshold` and pairs at the threshold almost surely
-- share a band; a candidate's estimate is the fraction of equal values over all minhash rows.
local argcheck = require "moonrl.argcheck"
local core = require "moonrl.core"

local M = {}
local Novelty = { __name = "moonrl.synth.novelty" }
Novelty.__index = Novelty
M.Novelty = Novelty

local INDEXES = { "pool", "archive" }

-- ---------------------------------------------------------------- text and hashes

-- The normalised text of a key.
local function normalise(text, mask)
  local s = text:lower()
  if mask then s = s:gsub("%-?%d+%.?%d*", "#") end
  s = s:gsub("[^%w#%s]", " "):gsub("%s+", " ")
  return (s:gsub("^ ", ""):gsub(" $", ""))
end
M.normalise = normalise

-- FNV-1a (64-bit) of s[i .. j].
local function fnv(s, i, j)
  local h = 0xcbf29ce484222325
  for p = i, j do h = (h ~ s:byte(p)) * 0x100000001b3 end
  return h
end

-- splitmix64's finaliser.
local function mix64(x)
  x = (x ~ (x >> 30)) * 0xBF58476D1CE4E5B9
  x = (x ~ (x >> 27)) * 0x94D049BB133111EB
  return x ~ (x >> 31)
end

-- The distinct shingle hashes of a normalised text (a text shorter than n is one shingle).
local function shingles(s, n)
  local out, seen = {}, {}
  local last = math.max(#s - n + 1, 1)
  for i = 1, last do
    local h = fnv(s, i, math.min(i + n - 1, #s))
    if not seen[h] then seen[h] = true out[#out + 1] = h end
  end
  return out
end

-- Per-row salts of the signature: fixed odd constants from splitmix64.
local SALTS = {}
local function salts(k)
  for i = #SALTS + 1, k do SALTS[i] = mix64(i * 0x9E3779B97F4A7C15) | 1 end
  return SALTS
end

-- The MinHash signature (k values) of a shingle set: row i orders the shingle hashes by
-- (h ~ salt_i) * an odd constant, a bijection of the 64-bit integers whose high bits depend on
-- every bit of h, compared as signed integers (any fixed total order serves).
local function signature(hashes, k)
  local salt, sig = salts(k), {}
  for i = 1, k do
    local a, best = salt[i], math.maxinteger
    for j = 1, #hashes do
      local v = (hashes[j] ~ a) * 0x9E3779B97F4A7C15
      if v < best then best = v end
    end
    sig[i] = best
  end
  return sig
end

-- Bands b and rows r for minhash k and threshold t: the most rows whose band threshold
-- (1/b)^(1/r) is still at least 0.15 below t (at least 1 row, b = k // r bands).
local function banding(k, t)
  local best_r = 1
  for r = 1, k do
    local b = k // r
    if b < 1 then break end
    if (1 / b) ^ (1 / r) <= t - 0.15 then best_r = r end
  end
  return k // best_r, best_r
end
M.banding = banding

-- ---------------------------------------------------------------- the index

local list_of_indexes = argcheck.list_of(argcheck.one_of(INDEXES), "a non-empty list of \"pool\" and \"archive\"")

-- rl.synth.novelty{...}: see the top of this file.
function M.novelty(opts)
  local o = argcheck.fields("rl.synth.novelty", opts or {}, {
    { "key", nil, argcheck.kind("function", "a function(task) -> string") },
    { "ngram", 5, argcheck.integer(1) },
    { "minhash", 128, argcheck.integer(1) },
    { "threshold", 0.7, argcheck.number(0, 1, true) },
    { "against", INDEXES, list_of_indexes },
    { "numbers", "mask", argcheck.one_of { "mask", "keep" } },
  }, 2)
  local bands, rows = banding(o.minhash, o.threshold)
  local self = setmetatable({ key = o.key, ngram = o.ngram, k = o.minhash, threshold = o.threshold,
    mask = o.numbers == "mask", numbers = o.numbers, bands = bands, rows = rows, against = {},
    index = {} }, Novelty)
  for _, name in ipairs(o.against) do self.against[#self.against + 1] = name end
  for _, name in ipairs(INDEXES) do
    -- entries: id -> {text =, sig =, keys =}; exact: text -> id; buckets[b]: band key -> {id...};
    -- order: the ids
    self.index[name] = { entries = {}, exact = {}, buckets = {}, order = {} }
  end
  return self
end

function M.is_novelty(v) return getmetatable(v) == Novelty end

-- The key text of a task (the key function's, else task.instruction, else an error naming it).
function Novelty:text(task)
  local t
  if self.key then t = self.key(task) else t = type(task) == "table" and task.instruction or nil end
  if type(t) ~= "string" then
    error(string.format("rl.synth.novelty: key: a string expected for the task, got %s",
      argcheck.describe(t)), 3)
  end
  return normalise(t, self.mask)
end

-- The band keys of a signature.
local function band_keys(self, sig)
  local keys = {}
  for b = 1, self.bands do
    local h = 0x84222325 + b
    for r = (b - 1) * self.rows + 1, b * self.rows do h = mix64(h ~ sig[r]) end
    keys[b] = h
  end
  return keys
end

-- The signature and band keys of a normalised text.
function Novelty:sketch(text)
  local sig = signature(shingles(text, self.ngram), self.k)
  return sig, band_keys(self, sig)
end

-- A fixed order of ids (integers first, ascending, then strings), so that which stored task a
-- check names does not depend on the order the index was built in.
local function before(a, b)
  local ia, ib = math.type(a) == "integer", math.type(b) == "integer"
  if ia ~= ib then return ia end
  return a < b
end

-- A signature packed into one string (8 bytes a row), compared with core.equal_words in C: the
-- comparison with every candidate in the shared buckets is the check's inner loop.
local function pack(sig) return string.pack("<" .. string.rep("j", #sig), table.unpack(sig)) end

local equal_words = core.equal_words

-- nov:check(task) -> true, or false, "duplicate" | "near_duplicate", {id =, index =,
-- similarity =} (the most similar stored task; ties: the first index of `against`, then the
-- lowest id).
function Novelty:check(task)
  local text = self:text(task)
  for _, name in ipairs(self.against) do
    local id = self.index[name].exact[text]
    if id ~= nil then return false, "duplicate", { id = id, index = name, similarity = 1 } end
  end
  local sig, keys = self:sketch(text)
  local packed = pack(sig)
  self.last = { text = text, sig = sig, keys = keys, packed = packed } -- for an add that follows
  local best, best_s, best_index
  for _, name in ipairs(self.against) do
    local ix = self.index[name]
    local seen = {}
    for b = 1, self.bands do
      local bk = ix.buckets[b]
      local bucket = bk and bk[keys[b]]
      if bucket then
        for _, id in ipairs(bucket) do
          if not seen[id] then
            seen[id] = true
            local e = ix.entries[id]
            local s = equal_words(packed, e.packed) / self.k
            if s >= self.threshold and (not best or s > best_s
                or (s == best_s and best_index == name and before(id, best))) then
              best, best_s, best_index = id, s, name
            end
          end
        end
      end
    end
  end
  if best ~= nil then return false, "near_duplicate", { id = best, index = best_index, similarity = best_s } end
  return true
end

local function index_of(self, name, where)
  local ix = self.index[name]
  if not ix then
    error(string.format("rl.synth.novelty: %s: index: \"pool\" or \"archive\" expected, got %s",
      where, argcheck.describe(name)), 3)
  end
  return ix
end

-- nov:add(task, index, id): task joins the index ("pool" or "archive") under id (a string or an
-- integer; adding an id again replaces its entry).
function Novelty:add(task, name, id)
  local ix = index_of(self, name, "add")
  if type(id) ~= "string" and math.type(id) ~= "integer" then
    error("rl.synth.novelty: add: id: a string or an integer expected, got " .. argcheck.describe(id), 2)
  end
  if ix.entries[id] then self:remove(id, name) end
  local text = self:text(task)
  local last, sig, keys, packed = self.last, nil, nil, nil
  if last and last.text == text then
    sig, keys, packed = last.sig, last.keys, last.packed -- the check just before sketched it
  else
    sig, keys = self:sketch(text)
    packed = pack(sig)
  end
  ix.entries[id] = { text = text, sig = sig, keys = keys, packed = packed }
  ix.order[#ix.order + 1] = id
  if ix.exact[text] == nil or before(id, ix.exact[text]) then ix.exact[text] = id end
  for b = 1, self.bands do
    local bk = ix.buckets[b]
    if not bk then bk = {} ix.buckets[b] = bk end
    local list = bk[keys[b]]
    if not list then list = {} bk[keys[b]] = list end
    list[#list + 1] = id
  end
end

local function drop(list, v)
  for i = #list, 1, -1 do if list[i] == v then table.remove(list, i) return end end
end

-- nov:remove(id, index) -> true, or false when the index holds no such id.
function Novelty:remove(id, name)
  local ix = index_of(self, name, "remove")
  local e = ix.entries[id]
  if not e then return false end
  ix.entries[id] = nil
  drop(ix.order, id)
  if ix.exact[e.text] == id then
    ix.exact[e.text] = nil
    for _, other in ipairs(ix.order) do -- another entry with the same text takes its place
      if ix.entries[other].text == e.text and (ix.exact[e.text] == nil or before(other, ix.exact[e.text])) then
        ix.exact[e.text] = other
      end
    end
  end
  for b = 1, self.bands do
    local list = ix.buckets[b][e.keys[b]]
    drop(list, id)
    if #list == 0 then ix.buckets[b][e.keys[b]] = nil end
  end
  return true
end

-- nov:size(index) -> the number of tasks in the index.
function Novelty:size(name)
  local ix = index_of(self, name, "size")
  return #ix.order
end

-- Clears both indexes (the loop rebuilds them from its archive on load).
function Novelty:clear()
  for _, name in ipairs(INDEXES) do
    self.index[name] = { entries = {}, exact = {}, buckets = {}, order = {} }
  end
end

function Novelty:config()
  return { ngram = self.ngram, minhash = self.k, threshold = self.threshold, against = self.against,
    numbers = self.numbers, bands = self.bands, rows = self.rows, key = self.key and "<function>" or nil }
end

return M
