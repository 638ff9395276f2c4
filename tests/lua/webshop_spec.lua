-- webshop_spec.lua - envs/webshop.lua (Weblica's synthetic text shops): a site is a function of
-- its seed, its pages agree with its map (rebuilt here by crawling), search answers as a scan
-- written here does, the episode's rules (links, search, add, buy), the demonstrator's success
-- rule, the bad-input errors; a cassette in front of the synthetic web records an episode and
-- replays it with no live request; and a smoke run of recipes/weblica.lua, twice.
local rl = require "moonrl"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
package.path = H.root .. "/?.lua;" .. package.path
local W = require "envs.webshop"

local function fresh_module()
  package.loaded["envs.webshop"] = nil
  local m = require "envs.webshop"
  package.loaded["envs.webshop"] = W
  return m
end

local function get(web, seed, path)
  local status, _, body = web:request { url = W.url(seed, path) }
  return status, body
end

local function links(body) local out = {} for w in body:match("|(.*)$"):gmatch("%l+") do out[#out + 1] = w end return out end

-- The site's map as a crawl of its pages sees it: {dept = {type = {colours}}} and the home order.
local function crawl(seed)
  local web = W.web()
  local _, home = get(web, seed, "/")
  local map, order = {}, links(home)
  for _, d in ipairs(order) do
    map[d] = {}
    local _, dp = get(web, seed, "/d/" .. d)
    for _, t in ipairs(links(dp)) do
      local _, tp = get(web, seed, "/t/" .. t)
      map[d][t] = links(tp)
    end
  end
  return map, order
end

local function play(task, actions, http)
  local ep = W.new { http = http or W.web() }
  local out = { { obs = ep:reset(task) } }
  for _, a in ipairs(actions) do
    local obs, r, done, info = ep:step(a)
    out[#out + 1] = { obs = obs, reward = r, done = done, info = info }
    if done then break end
  end
  return out, ep
end

describe("envs/webshop sites", function()
  it("are a function of the seed: the same pages from a fresh module, other pages for other seeds", function()
    local W2 = fresh_module()
    local homes = {}
    for seed = 1, 20 do
      local a, b = W.web(), W2.web()
      local s = W.site(seed)
      for _, path in ipairs { "/", "/d/" .. s.depts[2], "/t/" .. s.types[s.depts[1]][1], "/s?q=red" } do
        assert.are.same({ get(a, seed, path) }, { get(b, seed, path) })
      end
      assert.are.same(W.site(seed), W2.site(seed))
      homes[select(2, get(a, seed, "/"))] = true
    end
    local n = 0
    for _ in pairs(homes) do n = n + 1 end
    assert.is_true(n >= 15, "distinct home pages: " .. n)
  end)

  it("serve pages that agree with the site's map: 3 departments, 2 types each, 2 colours a type", function()
    for seed = 1, 10 do
      local s = W.site(seed)
      local map, order = crawl(seed)
      assert.are.same(s.depts, order)
      local types, nt = {}, 0
      for d, ts in pairs(map) do
        local k = 0
        for t, cs in pairs(ts) do
          k, nt = k + 1, nt + 1
          assert.is_nil(types[t], "type in two departments")
          types[t] = true
          assert.are.equal(d, s.where[t])
          assert.are.equal(2, #cs)
          assert.are_not.equal(cs[1], cs[2])
          local status, body = get(W.web(), seed, "/i/" .. cs[1] .. "-" .. t)
          assert.are.equal(200, status)
          assert.are.equal(cs[1] .. " " .. t .. "|add", body)
        end
        assert.are.equal(2, k)
      end
      assert.are.equal(6, nt)
      assert.are.equal(404, (get(W.web(), seed, "/i/none-thing")))
    end
  end)

  it("search: the departments holding an item with every word, in home order", function()
    local seed = 5
    local map, order = crawl(seed)
    local queries = { "red", "mug", "tan hat" }
    for t in pairs(map[order[1]]) do
      queries[#queries + 1] = t
      queries[#queries + 1] = map[order[1]][t][2] .. " " .. t
    end
    for _, q in ipairs(queries) do
      local want = {}
      for _, d in ipairs(order) do
        local hit = false
        for t, cs in pairs(map[d]) do
          for _, c in ipairs(cs) do
            local all = true
            for w in q:gmatch("%S+") do all = all and (w == t or w == c) end
            hit = hit or all
          end
        end
        if hit then want[#want + 1] = d end
      end
      local _, body = get(W.web(), seed, "/s?q=" .. q:gsub(" ", "+"))
      assert.are.equal("found|" .. (#want > 0 and table.concat(want, " ") or "none"), body)
    end
  end)

  it("the web answers by host, counts its requests, and is a client a cassette takes", function()
    local web = W.web()
    assert.are.equal(404, (web:request { url = "http://example.org/" }))
    assert.are.equal(200, (web:request { url = W.url(3, "/") }))
    assert.are.equal(2, web.requests)
    H.assert_error(function() web:request {} end, "url")
    local path = os.tmpname()
    os.remove(path)
    local cas = rl.http.cassette { client = web, path = path, mode = "record" }
    assert.are.equal(200, (cas:request { url = W.url(3, "/") }))
    cas:close()
    os.remove(path)
  end)
end)

describe("envs/webshop episodes", function()
  local seed = 2
  local s = W.site(seed)
  local t = s.types[s.depts[3]][1]
  local task = { site = seed, type = t, color = s.colors[t][2] }

  it("the perfect path buys the goal in 5 turns; the observation is the page and the goal", function()
    local out = play(task, W.perfect(task))
    assert.are.equal("home|" .. table.concat(s.depts, " ") .. "|g " .. task.color .. " " .. t, out[1].obs)
    assert.are.equal(6, #out)
    assert.are.equal("cart|" .. task.color .. " " .. t .. "|g " .. task.color .. " " .. t, out[5].obs)
    assert.are.equal(1, out[6].reward)
    assert.is_true(out[6].done and out[6].info.success)
  end)

  it("a name that is not a link, add off an item page, a bad search waste the turn", function()
    local other = s.depts[1]
    for _, a in ipairs { "go " .. t, "add", "search", "search a b c", "jump", "go none" } do
      local out = play(task, { a })
      assert.is_true(out[2].info.invalid, a)
      assert.are.equal(out[1].obs, out[2].obs, a)
      assert.is_false(out[2].done)
    end
    local out = play(task, { "go " .. other, "go home" })
    assert.are.equal(out[1].obs, out[3].obs)
    assert.is_nil(out[3].info.invalid)
  end)

  it("buy ends the episode: reward 1 only for exactly the goal in the cart", function()
    local wrong = s.colors[t][1]
    local d = s.where[t]
    local cases = {
      { { "buy" }, 0 },
      { { "go " .. d, "go " .. t, "go " .. wrong, "add", "buy" }, 0 },
      { { "go " .. d, "go " .. t, "go " .. wrong, "add", "go home", "go " .. d, "go " .. t, "go " .. task.color }, nil },
      { { "go " .. d, "go " .. t, "go " .. task.color, "add", "go home", "go " .. d, "go " .. t, "go " .. task.color, "add", "buy" }, 1 },
    }
    for k, c in ipairs(cases) do
      local out, ep = play(task, c[1])
      local last = out[#out]
      if c[2] then
        assert.is_true(last.done, k)
        assert.are.equal(c[2], last.reward, k)
        assert.are.equal(c[2] == 1, last.info.success, k)
      else
        assert.is_false(last.done)
        assert.are.equal(1, #ep.cart)
      end
    end
    -- two different items in the cart: not the goal alone
    local out = play(task, { "go " .. d, "go " .. t, "go " .. wrong, "add", "go home", "go " .. d, "go " .. t,
      "go " .. task.color, "add", "buy" })
    assert.are.equal(0, out[#out].reward)
    assert.are.equal(2, out[#out].info.bought)
  end)

  it("search then the department found leads to the goal in 6 turns", function()
    local out = play(task, { "search " .. task.color .. " " .. t })
    assert.are.equal("found|" .. s.where[t] .. "|g " .. task.color .. " " .. t, out[2].obs)
    out = play(task, { "search " .. t, "go " .. s.where[t], "go " .. t, "go " .. task.color, "add", "buy" })
    assert.are.equal(1, out[#out].reward)
  end)

  it("the demonstrator succeeds when it searches or the type is in one of the first two departments", function()
    local tasks = W.tasks_on({ 1, 2, 3, 4, 5, 6 }, 200, 9)
    local wins, searched = 0, 0
    for i, tk in ipairs(tasks) do
      local acts = W.oracle(tk, rl.rng(i))
      local truncated = {}
      for k = 1, math.min(#acts, W.max_turns) do truncated[k] = acts[k] end
      local out = play(tk, truncated)
      local site = W.site(tk.site)
      local pos
      for k, d in ipairs(site.depts) do if d == site.where[tk.type] then pos = k end end
      local search = acts[1]:match("^search") ~= nil
      searched = searched + (search and 1 or 0)
      local won = out[#out].reward == 1
      assert.are.equal(search or pos <= 2, won, i)
      assert.are.equal(search and 6 or 2 * pos + 3, #acts)
      wins = wins + (won and 1 or 0)
    end
    assert.is_true(searched > 70 and searched < 130, "searched " .. searched)
    assert.is_true(wins > 140 and wins < 195, "wins " .. wins)
  end)

  it("held-out sites are not training sites; tasks are items their site sells", function()
    local train = {}
    for i = 1, 64 do train[i] = true end
    for _, sd in ipairs(W.test_sites) do assert.is_nil(train[sd]) end
    for _, tk in ipairs(W.tasks_on(W.test_sites, 50, 3)) do
      assert.are.equal(200, (get(W.web(), tk.site, "/i/" .. tk.color .. "-" .. tk.type)))
    end
    local env = W.variant { http = W.web(), sites = { 7, 8 } }
    for _, tk in ipairs(env.tasks("train", 20, 1)) do assert.is_true(tk.site == 7 or tk.site == 8) end
    for _, tk in ipairs(env.tasks("test", 20, 1)) do assert.is_true(tk.site > 1000) end
  end)

  it("refuses bad inputs, naming them", function()
    H.assert_error(function() W.new {} end, "http")
    H.assert_error(function() W.site(1.5) end, "seed")
    H.assert_error(function() W.tasks_on({}, 3, 1) end, "sites")
    H.assert_error(function() W.variant { http = W.web(), site = { 1 } } end, "unknown option 'site'")
    H.assert_error(function() W.variant { sites = { 1 } } end, "http")
    H.assert_error(function() W.variant { http = W.web(), sites = { 1.5 } } end, "sites")
    H.assert_error(function() W.variant { http = W.web(), sites = {} } end, "sites")
  end)
end)

describe("envs/webshop on a cassette", function()
  local seed = 11
  local s = W.site(seed)
  local ty = s.types[s.depts[2]][2]
  local task = { site = seed, type = ty, color = s.colors[ty][1] }
  local actions = { "search " .. ty, "go " .. s.where[ty], "go home", "go " .. s.where[ty], "go " .. ty,
    "go " .. task.color, "add", "buy" }

  it("records an episode, then replays it with no live request: the same observations and reward", function()
    local path = os.tmpname()
    os.remove(path)
    local web = W.web()
    local rec = rl.http.cassette { client = web, path = path, mode = "record" }
    local first = play(task, actions, rec)
    rec:close()
    local live = web.requests
    assert.are.equal(#actions + 1, live) -- home, then one request a turn
    assert.are.equal(live, rec:stats().recorded)
    local rep = rl.http.cassette { client = web, path = path, mode = "replay" }
    local second = play(task, actions, rep)
    assert.are.same(first, second)
    assert.are.equal(1, first[#first].reward)
    assert.are.equal(live, web.requests)
    assert.are.equal(live, rep:stats().hits)
    assert.are.equal(0, rep:stats().misses)
    -- a request the cassette never saw is a miss, and the episode ends with the cassette's message
    local _, ep = play(task, {}, rep)
    H.assert_error(function() ep:step("go " .. s.depts[3]) end, "webshop: cassette miss: GET " .. W.url(seed, "/d/" .. s.depts[3]))
    assert.are.equal(live, web.requests)
    os.remove(path)
  end)

  it("keyed by request: with record-on-miss, a repeated request goes live once", function()
    local path = os.tmpname()
    local web = W.web()
    local cas = rl.http.cassette { client = web, path = path, mode = "replay", on_miss = "record" }
    play(task, actions, cas)
    local once = web.requests
    -- home and the department, each fetched twice in the episode, went live once
    assert.are.equal(#actions - 1, once)
    play(task, actions, cas)
    assert.are.equal(once, web.requests)
    assert.are.equal(once, cas:stats().recorded)
    cas:close()
    os.remove(path)
  end)
end)

describe("recipes/weblica.lua", function()
  local function run(dir, extra)
    return H.run(string.format("cd %s && %s run recipes/weblica.lua --smoke --dir %s %s", H.shell_quote(H.root),
      H.shell_quote(H.moonrl), H.shell_quote(dir), extra or ""))
  end

  it("runs a smoke run: both arms, SFT, demonstrator and perfect rows, replay with no live request, twice alike", function()
    local tables = {}
    for k = 1, 2 do
      local dir = os.tmpname()
      os.remove(dir)
      local out, code = run(dir)
      assert.are.equal(0, code, out)
      assert.matches("measured: [%d.]+ s per RL step", out)
      for _, arm in ipairs { "sites4", "sites64" } do
        local live1, live2, hits, same = out:match(arm .. " +replay check: held%-out evaluation onto an empty cassette (%d+) "
          .. "live requests; again from it (%d+) live, (%d+) replayed; same outcomes: (%a+)")
        assert.is_string(live1, out)
        assert.is_true(tonumber(live1) > 0)
        assert.are.equal("0", live2)
        assert.is_true(tonumber(hits) >= tonumber(live1))
        assert.are.equal("yes", same)
        assert.is_true(#H.read_json_lines(dir .. "/weblica-" .. arm .. "-s1/cassette.jsonl") > 0)
      end
      local tbl = out:match("\n(arm +held%%.-)\n%(held")
      assert.is_string(tbl, out)
      for _, row in ipairs { "sites4", "sites64", "SFT", "demonstrator", "perfect" } do
        local cells = tbl:match("\n" .. row .. " +([%d. %-]+)")
        assert.is_string(cells, row)
        local v = {}
        for x in cells:gmatch("%S+") do v[#v + 1] = tonumber(x) or x end
        assert.is_true(v[1] >= 0 and v[1] <= 100 and v[3] >= 0 and v[3] <= 100, row)
        assert.is_true(v[2] >= 1 and v[2] <= 8 and v[4] >= 1 and v[4] <= 8, row)
        if row:match("^sites") then assert.is_true(v[5] > 0 and v[6] >= 0, row) end
      end
      local kept = {}
      for line in tbl:gmatch("[^\n]+") do kept[#kept + 1] = (line:gsub("%s+%S+$", "")) end
      tables[k] = table.concat(kept, "\n")
      H.sh("rm -rf " .. H.shell_quote(dir))
    end
    assert.are.equal(tables[1], tables[2])
  end)

  it("refuses an unknown arm and SFT sites among the held-out ones", function()
    local out, code = run("/tmp/none", "--arms sites4,sites9")
    assert.are_not.equal(0, code)
    assert.matches("unknown arm 'sites9'", out)
    out, code = run("/tmp/none", "--sft-sites 1001")
    assert.are_not.equal(0, code)
    assert.matches("%-%-sft%-sites: an integer in 1..1000", out)
  end)
end)
