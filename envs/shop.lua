-- shop.lua - a tiny web environment: the agent browses a site of a few linked pages over HTTP
-- and is rewarded for reaching the target page. The site is the mock server's /shop route
-- (tests/c/mock_server.c: home, hats, shoes, sale, cart), reached through anything with the
-- rl.http client's get (a client, or an rl.http.cassette that recorded or replays it). Each
-- observation is the page's text ("page hats\nlinks home cart\nvisit 3\n") and the goal; each
-- action names a link to follow (a name that is not a link of the page wastes the turn).
--
--   local env = require "envs.shop"
--   local ep = env.new{ http = rl.http.cassette{ path = "shop.jsonl", base_url = base } }
--   local obs = ep:reset{ target = "cart" }
--   obs, reward, done = ep:step("hats")
--
-- M.oracle(task) follows the shortest path on the site's map (what a crawl would give).
local M = { name = "shop", max_turns = 6, format = "line" }

-- The site's links, as the server serves them (M.oracle's map).
M.links = { home = { "hats", "shoes" }, hats = { "home", "cart" }, shoes = { "home", "sale" },
  sale = { "shoes", "cart" }, cart = { "home" } }
M.pages = { "hats", "shoes", "sale", "cart" }

-- tasks(split, n, seed): n tasks {target = page}; the held-out split is the one target "sale".
function M.tasks(split, n, seed)
  assert(split == "train" or split == "test", "split must be \"train\" or \"test\"")
  local rng = require("moonrl").rng(seed or 0)
  local train = { "hats", "shoes", "cart" }
  local out = {}
  for i = 1, n do out[i] = { target = split == "test" and "sale" or train[rng:random(#train)] } end
  return out
end

local Episode = {}
Episode.__index = Episode

-- new{http = a client or cassette} (or M.http).
function M.new(opts)
  local http = opts and opts.http or M.http
  assert(http and http.get, "shop.new: http (an rl.http client or cassette) expected")
  return setmetatable({ http = http }, Episode)
end

-- Fetches a page: its text, or nil and why.
function Episode:visit(page)
  local status, _, body = self.http:get("/shop?page=" .. page)
  if status ~= 200 then return nil, body end
  self.page, self.text = page, body
  self.links = {}
  for link in (body:match("links ([^\n]*)") or ""):gmatch("%S+") do self.links[link] = true end
  return body
end

function Episode:observation() return self.text .. "goal " .. self.task.target end

function Episode:reset(task)
  self.task = task
  assert(self:visit("home"))
  return self:observation()
end

function Episode:step(action, parsed)
  local link = ((parsed and parsed.text) or action):match("^%s*(%l+)") or ""
  if not self.links[link] then
    return self:observation(), 0, false, { success = false, invalid = true }
  end
  local text, err = self:visit(link)
  if not text then return nil, 0, true, { success = false, error = err } end
  if link == self.task.target then return nil, 1, true, { success = true } end
  return self:observation(), 0, false, { success = false }
end

function Episode:state_key() return self.page end

-- oracle(task): the shortest path from home to the target (breadth first on M.links).
function M.oracle(task)
  local prev, queue, seen = {}, { "home" }, { home = true }
  local i = 1
  while queue[i] do
    local p = queue[i]
    i = i + 1
    for _, q in ipairs(M.links[p]) do
      if not seen[q] then seen[q], prev[q] = true, p; queue[#queue + 1] = q end
    end
  end
  local path, p = {}, task.target
  while p ~= "home" do table.insert(path, 1, p); p = prev[p] end
  return path
end

return M
