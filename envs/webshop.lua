-- webshop.lua - webshop-lite on procedurally synthesised text shops (Weblica, spec
-- reproductions.md section 3.12): find and buy an item with given attributes on a site the agent
-- reaches over HTTP, through anything with the rl.http client's request (a client, or an
-- rl.http.cassette that records or replays it).
--
-- A site is a function of its seed (M.site): three departments in the order the home page lists
-- them, six product types two to a department, two colours to a type; twelve items. Its pages
-- (M.serve, the site's server; bodies are "title|links"):
--   GET  /              "home|barn den yard"        the departments
--   GET  /d/<dept>      "barn|mug hat"              its product types
--   GET  /t/<type>      "mug|red tan"               its colours
--   GET  /i/<col>-<t>   "red mug|add"               an item
--   GET  /s?q=<w>+<w>   "found|barn"                the departments holding an item that has
--                                                   every word (a colour or a type); "found|none"
--   POST /cart  <item>  "cart|red mug"              the server names what was added (the page
--                                                   the agent then sees; its only link is home)
--   POST /buy   <items> "order|red mug"             checkout of the comma-joined cart
-- The server keeps no state (the cart is the client's), so every answer is a function of the
-- request, which is what a cassette keyed by request replays.
--
-- An observation is the page and the goal, "mug|red tan|g red mug". Actions: "go <link>" (a link
-- of the page, or "home"), "search <words>" (from any page), "add" (on an item page), "buy"
-- (ends the episode: reward 1 when the cart holds exactly the goal item, else 0). Anything else
-- wastes the turn (info.invalid). At most M.max_turns turns.
--
-- M.web() is the synthetic web: an object with request{method =, url =, body =} serving every
-- site by host ("http://s<seed>.shop/..."), counting the requests it answered (web.requests);
-- it has a metatable and request, which is what rl.http.cassette takes as a client.
-- M.variant{http =, sites =} is the environment on one transport and a list of training sites.
-- M.oracle(task, rng): the demonstrator, imperfect: half the time it searches for the type
-- (6 steps), else it browses the departments in the home page's order, going home after each
-- one without the type (5, 7 or 9 steps: the third department does not fit in 8 turns).
-- M.perfect(task) knows the site's map (5 steps).
local rl = require "moonrl"

local M = { name = "webshop", format = "line", max_turns = 8 }

M.depts = { "attic", "barn", "cove", "deck", "den", "hall", "loft", "yard", "nook", "shed", "dock", "cave" }
M.types = { "hat", "mug", "bag", "cap", "pen", "cup", "box", "jar", "fan", "rug", "map", "kit" }
M.colors = { "red", "tan", "blue", "gray", "pink", "gold", "jade", "teal" }

-- k distinct entries of pool, in draw order.
local function draw(pool, k, rng)
  local left, out = {}, {}
  for i, v in ipairs(pool) do left[i] = v end
  for i = 1, k do out[i] = table.remove(left, rng:random(#left)) end
  return out
end

local site_cache = setmetatable({}, { __mode = "v" })

-- site(seed) -> {seed =, depts = {3 names, home order}, types = {dept = {2 types}},
-- colors = {type = {2 colours}}, where = {type = dept}}; the same seed gives the same site.
function M.site(seed)
  if math.type(seed) ~= "integer" then error("webshop.site: seed: an integer expected", 2) end
  local s = site_cache[seed]
  if s then return s end
  local rng = rl.rng(rl.train.mix(seed, 0x5E7))
  s = { seed = seed, depts = draw(M.depts, 3, rng), types = {}, colors = {}, where = {} }
  local types = draw(M.types, 6, rng)
  for d, dept in ipairs(s.depts) do
    s.types[dept] = { types[2 * d - 1], types[2 * d] }
    for _, t in ipairs(s.types[dept]) do
      s.where[t] = dept
      s.colors[t] = draw(M.colors, 2, rng)
    end
  end
  site_cache[seed] = s
  return s
end

function M.url(seed, path) return "http://s" .. seed .. ".shop" .. path end

-- Whether the site sells the item "<colour>-<type>".
local function sells(site, item)
  local c, t = item:match("^(%l+)%-(%l+)$")
  if not c or not site.colors[t] then return false end
  return site.colors[t][1] == c or site.colors[t][2] == c
end

-- serve(site, method, path, body) -> status, body: the site's server.
function M.serve(site, method, path, body)
  if method == "GET" then
    if path == "/" then return 200, "home|" .. table.concat(site.depts, " ") end
    local d = path:match("^/d/(%l+)$")
    if d and site.types[d] then return 200, d .. "|" .. table.concat(site.types[d], " ") end
    local t = path:match("^/t/(%l+)$")
    if t and site.colors[t] then return 200, t .. "|" .. table.concat(site.colors[t], " ") end
    local item = path:match("^/i/(%l+%-%l+)$")
    if item and sells(site, item) then return 200, item:gsub("%-", " ") .. "|add" end
    local q = path:match("^/s%?q=([%l+]*)$")
    if q then
      local found = {}
      for _, dept in ipairs(site.depts) do
        local hit = false
        for _, ty in ipairs(site.types[dept]) do
          for _, c in ipairs(site.colors[ty]) do
            local all = q ~= ""
            for w in q:gmatch("[^+]+") do if w ~= ty and w ~= c then all = false end end
            hit = hit or all
          end
        end
        if hit then found[#found + 1] = dept end
      end
      return 200, "found|" .. (#found > 0 and table.concat(found, " ") or "none")
    end
    return 404, "missing|"
  elseif method == "POST" then
    if path == "/cart" and sells(site, body or "") then return 200, "cart|" .. body:gsub("%-", " ") end
    if path == "/buy" then
      local names = {}
      for item in (body or ""):gmatch("[^,]+") do
        if not sells(site, item) then return 400, "bad order|" end
        names[#names + 1] = (item:gsub("%-", " "))
      end
      return 200, "order|" .. (#names > 0 and table.concat(names, " ") or "empty")
    end
    return 404, "missing|"
  end
  return 405, "method|"
end

-- ---------------------------------------------------------------- the synthetic web

local Web = {}
Web.__index = Web
Web.__name = "webshop.web"

-- web() -> an object with request{method =, url =, body =, headers =, timeout =} -> status,
-- headers, body for "http://s<seed>.shop/<path>"; web.requests counts the answered requests.
function M.web() return setmetatable({ requests = 0, opts = {} }, Web) end

function Web:request(a)
  if type(a) ~= "table" or type(a.url) ~= "string" then error("webshop.web: request: url (a string) expected", 2) end
  local seed, path = a.url:match("^http://s(%d+)%.shop(/.*)$")
  self.requests = self.requests + 1
  local headers = { ["content-type"] = "text/plain" }
  if not seed then return 404, headers, "no such site|" end
  local status, body = M.serve(M.site(math.tointeger(tonumber(seed))), (a.method or "GET"):upper(), path, a.body)
  return status, headers, body
end

function Web:get(url) return self:request { url = url } end

-- ---------------------------------------------------------------- tasks

-- n tasks {site =, type =, color =} on the listed site seeds (round robin from a seeded start),
-- each item drawn from its site.
function M.tasks_on(sites, n, seed)
  if type(sites) ~= "table" or #sites == 0 then error("webshop.tasks_on: sites: a list of site seeds expected", 2) end
  local rng, out = rl.rng(seed or 0), {}
  local first = rng:random(#sites)
  for i = 1, n do
    local s = M.site(sites[(first + i - 2) % #sites + 1])
    local t = s.types[s.depts[rng:random(3)]][rng:random(2)]
    out[i] = { site = s.seed, type = t, color = s.colors[t][rng:random(2)] }
  end
  return out
end

-- The module's own split (used without a variant): training sites 1..4, held-out 1001..1016.
M.train_sites, M.test_sites = { 1, 2, 3, 4 }, {}
for i = 1, 16 do M.test_sites[i] = 1000 + i end

function M.tasks(split, n, seed)
  assert(split == "train" or split == "test", "split must be \"train\" or \"test\"")
  return M.tasks_on(split == "train" and M.train_sites or M.test_sites, n, seed)
end

-- ---------------------------------------------------------------- episodes

local Episode = {}
Episode.__index = Episode

function M.new(opts)
  local http = opts and opts.http or M.http
  if not (type(http) == "table" and type(http.request) == "function") then
    error("webshop.new: http (an rl.http client or cassette, or webshop.web()) expected", 2)
  end
  return setmetatable({ http = http }, Episode)
end

-- Fetches a page (method, path, body) of the episode's site; the page's links on success.
function Episode:fetch(method, path, body)
  local status, headers_or_why, text = self.http:request { method = method, url = M.url(self.task.site, path),
    body = body }
  if not status then error("webshop: " .. tostring(headers_or_why), 0) end -- a transport failure or a cassette miss
  return status, text
end

function Episode:visit(path)
  local status, text = self:fetch("GET", path)
  if status ~= 200 then return false end
  self.path, self.text = path, text
  self.links = {}
  for w in (text:match("|(.*)$") or ""):gmatch("%l+") do self.links[w] = true end
  return true
end

function Episode:observation()
  return self.text .. "|g " .. self.task.color .. " " .. self.task.type
end

function Episode:reset(task)
  self.task, self.cart, self.turns = task, {}, 0
  assert(self:visit("/"), "webshop: the home page did not load")
  return self:observation()
end

-- The path a link of the current page leads to (nil: not a link here).
function Episode:target(link)
  if link == "home" then return "/" end
  if not self.links[link] then return nil end
  local p = self.path
  if p == "/" or p:match("^/s%?") then return "/d/" .. link end
  if p:match("^/d/") then return "/t/" .. link end
  if p:match("^/t/") then return "/i/" .. link .. "-" .. p:match("^/t/(%l+)$") end
  return nil
end

function Episode:step(action, parsed)
  local text = ((parsed and parsed.text) or action):match("^%s*(.-)%s*$")
  local verb, rest = text:match("^(%l+)%s*(.-)$")
  local t = self.task
  self.turns = self.turns + 1
  local info = { success = false }
  if verb == "go" then
    local path = self:target(rest)
    if path and self:visit(path) then return self:observation(), 0, false, info end
  elseif verb == "search" and (rest:match("^%l+$") or rest:match("^%l+ %l+$")) then
    if self:visit("/s?q=" .. rest:gsub(" ", "+")) then return self:observation(), 0, false, info end
  elseif verb == "add" and rest == "" and self.path:match("^/i/") then
    local item = self.path:match("^/i/(.*)$")
    local status, reply = self:fetch("POST", "/cart", item)
    if status == 200 then
      local seen = false
      for _, c in ipairs(self.cart) do seen = seen or c == item end
      if not seen then self.cart[#self.cart + 1] = item end
      self.path, self.text, self.links = "/cart", reply, {} -- the server's "cart|red mug"; only home
      return self:observation(), 0, false, info
    end
  elseif verb == "buy" and rest == "" then
    local status = self:fetch("POST", "/buy", table.concat(self.cart, ","))
    info.success = status == 200 and #self.cart == 1 and self.cart[1] == t.color .. "-" .. t.type
    info.bought = #self.cart
    return nil, info.success and 1 or 0, true, info
  end
  info.invalid = true
  return self:observation(), 0, false, info
end

function Episode:state_key() return self.task.site .. self.path end

-- ---------------------------------------------------------------- demonstrations

local function direct(site, task)
  return { "go " .. site.where[task.type], "go " .. task.type, "go " .. task.color, "add", "buy" }
end

-- oracle(task, rng): half the time search for the type, else browse the departments in order.
function M.oracle(task, rng)
  local site = M.site(task.site)
  if rng:random() < 0.5 then
    local out = direct(site, task)
    table.insert(out, 1, "search " .. task.type)
    return out
  end
  local out = {}
  for _, dept in ipairs(site.depts) do
    if dept == site.where[task.type] then
      for _, a in ipairs(direct(site, task)) do out[#out + 1] = a end
      return out
    end
    out[#out + 1] = "go " .. dept
    out[#out + 1] = "go home"
  end
  return out
end

function M.perfect(task) return direct(M.site(task.site), task) end

-- variant{http =, sites =} -> the environment on that transport, its "train" tasks on the
-- listed site seeds and its "test" tasks on M.test_sites.
function M.variant(opts)
  if type(opts) ~= "table" then error("webshop.variant: a table of options expected", 2) end
  for k in pairs(opts) do
    if k ~= "http" and k ~= "sites" then error("webshop.variant: unknown option '" .. tostring(k) .. "'", 2) end
  end
  if not (type(opts.http) == "table" and type(opts.http.request) == "function") then
    error("webshop.variant: http (an rl.http client or cassette, or webshop.web()) expected", 2)
  end
  local sites = opts.sites or M.train_sites
  if type(sites) ~= "table" or #sites == 0 then error("webshop.variant: sites: a list of site seeds expected", 2) end
  for _, s in ipairs(sites) do
    if math.type(s) ~= "integer" then error("webshop.variant: sites: integer seeds expected", 2) end
  end
  local V = {}
  for k, v in pairs(M) do V[k] = v end
  V.train_sites = sites
  function V.new() return M.new { http = opts.http } end
  function V.tasks(split, n, seed)
    assert(split == "train" or split == "test", "split must be \"train\" or \"test\"")
    return M.tasks_on(split == "train" and sites or M.test_sites, n, seed)
  end
  return V
end

return M
