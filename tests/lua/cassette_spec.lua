-- cassette_spec.lua: rl.http.cassette records an rl.http client's traffic against the loopback
-- mock server (build/tests/mock_server, started here and stopped before replaying) and replays
-- it offline: byte-identical answers, no secret in the file, cache-buster query parameters
-- ignored, per-episode ordering, misses (error, passthrough, record), refusing to overwrite a
-- cassette, and options errors that name the key.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"

local json = rl.json

local function start_server()
  local server = assert(io.popen(H.shell_quote(H.build .. "/tests/mock_server") .. " 120", "r"))
  local port = assert(server:read("l"), "the mock server printed no port")
  return server, "http://127.0.0.1:" .. port
end

local function stop_server(server, base)
  local c = rl.http.client{ base_url = base, retries = 0 }
  c:get("/quit")
  c:close()
  server:close()
end

local function read_all(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

describe("rl.http.cassette", function()
  local dir
  setup(function() dir = H.tmpdir() end)
  teardown(function() H.sh("rm -rf " .. H.shell_quote(dir)) end)

  it("records against the server, then replays byte-identically with the server stopped", function()
    local server, base = start_server()
    local path = dir .. "/basic.jsonl"
    local c = rl.http.client{ base_url = base, retries = 0, headers = { ["X-Test"] = "t1" } }
    local cas = rl.http.cassette{ client = c, path = path, mode = "record" }
    local live = {}
    live[1] = table.pack(cas:request{ path = "/echo?q=1" })
    live[2] = table.pack(cas:post("/echo", { a = { 1, 2.5 } }))
    live[3] = table.pack(cas:request{ method = "PUT", url = base .. "/echo", body = "raw\0\255bytes" })
    live[4] = table.pack(cas:get("/nowhere"))
    live[5] = table.pack(cas:get("/status?code=503&key=cas-basic"))
    assert.same({ hits = 0, misses = 0, recorded = 5, passthrough = 0, mode = "record" }, cas:stats())
    cas:close()
    c:close()
    stop_server(server, base)
    assert.equal(200, live[1][1])
    assert.equal(404, live[4][1])
    assert.equal(503, live[5][1])
    -- offline: no client at all
    local rep = rl.http.cassette{ path = path, mode = "replay", base_url = base }
    local again = {
      table.pack(rep:request{ path = "/echo?q=1" }),
      table.pack(rep:post("/echo", { a = { 1, 2.5 } })),
      table.pack(rep:request{ method = "PUT", url = base .. "/echo", body = "raw\0\255bytes" }),
      table.pack(rep:get("/nowhere")),
      table.pack(rep:get("/status?code=503&key=cas-basic")),
    }
    for i = 1, 5 do
      assert.equal(live[i][1], again[i][1])
      assert.same(live[i][2], again[i][2])
      assert.equal(live[i][3], again[i][3])
    end
    assert.equal("raw\0\255bytes", json.decode(again[3][3]).body)
    assert.equal("application/json", again[1][2]["content-type"])
    assert.same({ hits = 5, misses = 0, recorded = 0, passthrough = 0, mode = "replay" }, rep:stats())
    -- auto mode replays an existing cassette
    local auto = rl.http.cassette{ path = path, base_url = base }
    assert.equal("replay", auto:stats().mode)
    assert.equal(live[1][3], select(3, auto:request{ path = "/echo?q=1" }))
    -- each line is one interaction
    local lines = H.read_json_lines(path)
    assert.equal(5, #lines)
    assert.same({ "", 1, "GET" }, { lines[1].episode, lines[1].seq, lines[1].request.method })
    assert.equal(base .. "/echo?q=1", lines[1].request.url)
    assert.equal("t1", lines[1].request.headers["x-test"])
    assert.equal(200, lines[1].response.status)
    assert.is_string(lines[3].request.body_base64)
  end)

  it("keeps secrets out of the cassette: scrubbed headers, the API key and body patterns", function()
    local server, base = start_server()
    local path = dir .. "/secret.jsonl"
    local token, key = "sk-live-0123456789abcdef", "AKIA1234567890ABCDEF"
    local c = rl.http.client{ base_url = base, retries = 0, api_key = token }
    local cas = rl.http.cassette{ client = c, path = path, mode = "record",
      scrub = { headers = { "authorization", "cookie", "x-api-key" }, patterns = { "AKIA%w+" } } }
    local status, _, body = cas:post("/echo", '{"aws_key":"' .. key .. '"}', { Cookie = "session=s3cr3t-cookie" })
    assert.equal(200, status)
    assert.equal("Bearer " .. token, json.decode(body).authorization) -- the live answer is intact
    cas:close()
    c:close()
    stop_server(server, base)
    local bytes = read_all(path)
    assert.is_nil(bytes:find(token, 1, true))
    assert.is_nil(bytes:find(key, 1, true))
    assert.is_nil(bytes:find("s3cr3t-cookie", 1, true))
    assert.truthy(bytes:find("<scrubbed>", 1, true))
    local e = H.read_json_lines(path)[1]
    assert.equal("<scrubbed>", e.request.headers.authorization)
    assert.equal("<scrubbed>", e.request.headers.cookie)
    -- the request carrying the secret still finds its (scrubbed) recording
    local rep = rl.http.cassette{ path = path, mode = "replay", base_url = base,
      scrub = { patterns = { "AKIA%w+" } } }
    local s2, _, b2 = rep:post("/echo", '{"aws_key":"' .. key .. '"}')
    assert.equal(200, s2)
    assert.equal("<scrubbed>", json.decode(b2).authorization)
  end)

  it("ignores cache-buster query parameters when matching", function()
    local server, base = start_server()
    local path = dir .. "/buster.jsonl"
    local c = rl.http.client{ base_url = base, retries = 0 }
    local match = { ignore_query = { "_", "cb" } }
    local cas = rl.http.cassette{ client = c, path = path, mode = "record", match = match }
    local _, _, body = cas:get("/echo?q=1&_=1700000000&cb=77")
    cas:close()
    c:close()
    stop_server(server, base)
    local rep = rl.http.cassette{ path = path, mode = "replay", base_url = base, match = match }
    local s, _, b = rep:get("/echo?q=1&_=1800000000&cb=12")
    assert.equal(200, s)
    assert.equal(body, b)
    assert.equal(200, (rep:get("/echo?q=1")))
    local s3, msg = rep:get("/echo?q=2&_=1")
    assert.is_nil(s3)
    assert.matches("cassette miss: GET " .. base:gsub("%p", "%%%0") .. "/echo%?q=2", msg)
    -- without ignore_query the buster is part of the URL
    local strict = rl.http.cassette{ path = path, mode = "replay", base_url = base }
    assert.is_nil((strict:get("/echo?q=1&_=1800000000&cb=12")))
    assert.same({ 0, 1 }, { strict:stats().hits, strict:stats().misses })
  end)

  it("answers the n-th identical request of an episode with the episode's n-th recording", function()
    local server, base = start_server()
    local path = dir .. "/episodes.jsonl"
    local c = rl.http.client{ base_url = base, retries = 0 }
    local cas = rl.http.cassette{ client = c, path = path, mode = "record" }
    local url = "/status?code=503&key=cas-ep&fail=1"   -- 503 once, then 200 "ok"
    cas:episode("a")
    assert.equal(503, (cas:get(url)))
    assert.equal(200, (cas:get(url)))
    assert.equal("a", cas:episode("b"))
    assert.equal(200, (cas:get(url)))
    cas:close()
    c:close()
    stop_server(server, base)
    local lines = H.read_json_lines(path)
    assert.same({ { "a", 1 }, { "a", 2 }, { "b", 1 } },
      { { lines[1].episode, lines[1].seq }, { lines[2].episode, lines[2].seq }, { lines[3].episode, lines[3].seq } })
    local rep = rl.http.cassette{ path = path, mode = "replay", base_url = base }
    rep:episode("b")
    assert.equal(200, (rep:get(url)))
    rep:episode("a")
    assert.equal(503, (rep:get(url)))
    assert.equal(200, (rep:get(url)))
    assert.equal(200, (rep:get(url)))                   -- the last one again once they run out
    local once = rl.http.cassette{ path = path, mode = "replay", base_url = base, repeat_last = false,
      episode = "a" }
    assert.equal(503, (once:get(url)))
    assert.equal(200, (once:get(url)))
    local s, msg, info = once:get(url)
    assert.is_nil(s)
    assert.matches('episode "a", request 3', msg)
    assert.equal("miss", info.outcome)
    rep:episode("c")                                    -- an episode never recorded
    assert.is_nil((rep:get(url)))
  end)

  it("keeps each task's episode when tasks record and replay at once", function()
    local server, base = start_server()
    local path = dir .. "/tasks.jsonl"
    local c = rl.http.client{ base_url = base, retries = 0 }
    local cas = rl.http.cassette{ client = c, path = path, mode = "record" }
    local function worker(name, n)
      return function()
        cas:episode(name)
        local out = {}
        for i = 1, n do out[i] = select(3, cas:get("/echo?task=" .. name .. "&i=" .. i)) end
        return out
      end
    end
    local res = cas:run{ worker("x", 3), worker("y", 2) }
    assert.equal(3, #res[1][1])
    cas:close()
    c:close()
    stop_server(server, base)
    local eps = {}
    for _, e in ipairs(H.read_json_lines(path)) do
      eps[e.episode] = (eps[e.episode] or 0) + 1
      assert.matches("task=" .. e.episode, e.request.url, 1, true)
    end
    assert.same({ x = 3, y = 2 }, eps)
    local rep = rl.http.cassette{ path = path, base_url = base }
    cas = rep                                           -- the workers now ask the replay
    local again = rep:run{ worker("x", 3), worker("y", 2) }
    assert.same(res[1][1], again[1][1])
    assert.same(res[2][1], again[2][1])
    assert.same({ 5, 0 }, { rep:stats().hits, rep:stats().misses })
  end)

  it("on a miss: errors naming the request, passes through, or records onto the cassette", function()
    local server, base = start_server()
    local path = dir .. "/miss.jsonl"
    local c = rl.http.client{ base_url = base, retries = 0 }
    local cas = rl.http.cassette{ client = c, path = path, mode = "record" }
    cas:get("/echo?q=known")
    cas:close()
    local err = rl.http.cassette{ path = path, mode = "replay", base_url = base }
    local s, msg, info = err:request{ method = "POST", path = "/echo?q=new", body = "x" }
    assert.is_nil(s)
    assert.matches("cassette miss: POST " .. base:gsub("%p", "%%%0") .. "/echo%?q=new", msg)
    assert.matches("miss.jsonl", msg)
    assert.equal("miss", info.outcome)
    local pass = rl.http.cassette{ client = c, path = path, mode = "replay", on_miss = "passthrough" }
    local s2, _, b2 = pass:get("/echo?q=new")
    assert.equal(200, s2)
    assert.equal("q=new", json.decode(b2).query)
    assert.equal(200, (pass:get("/echo?q=known")))
    assert.same({ hits = 1, misses = 1, recorded = 0, passthrough = 1, mode = "replay" }, pass:stats())
    assert.equal(1, #H.read_json_lines(path))
    local rec = rl.http.cassette{ client = c, path = path, mode = "replay", on_miss = "record" }
    assert.equal(200, (rec:get("/echo?q=added")))
    assert.equal(200, (rec:get("/echo?q=added")))       -- now a hit
    assert.same({ 1, 1, 1 }, { rec:stats().hits, rec:stats().misses, rec:stats().recorded })
    rec:close()
    c:close()
    stop_server(server, base)
    local lines = H.read_json_lines(path)
    assert.equal(2, #lines)
    assert.equal(base .. "/echo?q=added", lines[2].request.url)
    local offline = rl.http.cassette{ path = path, mode = "replay", base_url = base }
    assert.equal(200, (offline:get("/echo?q=added")))
    assert.equal(200, (offline:get("/echo?q=known")))
  end)

  it("refuses to record onto an existing cassette unless overwrite = true", function()
    local server, base = start_server()
    local path = dir .. "/keep.jsonl"
    local f = assert(io.open(path, "w"))
    f:write('{"precious":true}\n')
    f:close()
    local c = rl.http.client{ base_url = base, retries = 0 }
    H.assert_error(function() rl.http.cassette{ client = c, path = path, mode = "record" } end,
      { "rl.http.cassette: ", path .. " exists", "overwrite = true" })
    assert.equal('{"precious":true}\n', read_all(path))
    local cas = rl.http.cassette{ client = c, path = path, mode = "record", overwrite = true }
    assert.equal('{"precious":true}\n', read_all(path))  -- nothing touched before the first write
    cas:get("/echo")
    cas:close()
    c:close()
    stop_server(server, base)
    local lines = H.read_json_lines(path)
    assert.equal(1, #lines)
    assert.is_nil(lines[1].precious)
    H.assert_error(function() rl.http.cassette{ path = dir .. "/none.jsonl", mode = "replay" } end,
      "no cassette at " .. dir .. "/none.jsonl")
  end)

  it("names unknown and wrong options", function()
    local path = dir .. "/opts.jsonl"
    local c = rl.http.client{ base_url = "http://127.0.0.1:1", retries = 0 }
    H.assert_error(function() rl.http.cassette{ client = c, path = path, mdoe = "record" } end,
      "rl.http.cassette: unknown field 'mdoe' (did you mean 'mode'?)")
    H.assert_error(function() rl.http.cassette{ client = c, path = path, mode = "rec" } end,
      'rl.http.cassette: mode: one of "record", "replay", "auto"')
    H.assert_error(function() rl.http.cassette{ client = c, path = path, match = { boddy = true } } end,
      "rl.http.cassette: match: unknown field 'boddy' (did you mean 'body'?)")
    H.assert_error(function() rl.http.cassette{ client = c, path = path, scrub = { header = { "x" } } } end,
      "rl.http.cassette: scrub: unknown field 'header' (did you mean 'headers'?)")
    H.assert_error(function() rl.http.cassette{ client = c, path = path, scrub = { patterns = { "[a" } } } end,
      "scrub: patterns: bad Lua pattern")
    H.assert_error(function() rl.http.cassette{ client = c, path = path, on_miss = "404" } end,
      'on_miss: one of "error", "passthrough", "record"')
    H.assert_error(function() rl.http.cassette{ client = c } end, "path: a string expected (it is required)")
    H.assert_error(function() rl.http.cassette{ client = 3, path = path } end, "client: an rl.http.client expected")
    H.assert_error(function() rl.http.cassette{ path = path, mode = "record" } end, "client: an rl.http.client expected")
    local cas = rl.http.cassette{ client = c, path = path, mode = "record" }
    H.assert_error(function() cas:request{ path = "/x", bodyy = "x" } end, "request: unknown field 'bodyy'")
    H.assert_error(function() cas:request{ path = "/x", stream = function() end } end, "stream")
    cas:close()
    c:close()
  end)
end)

describe("envs/shop.lua through a cassette", function()
  local shop = dofile(H.root .. "/envs/shop.lua")

  local function play(ep, task, actions)
    local trace = { ep:reset(task) }
    local total = 0
    for _, a in ipairs(actions) do
      local obs, reward, done = ep:step(a)
      trace[#trace + 1] = obs or "<done>"
      total = total + reward
      if done then break end
    end
    return trace, total
  end

  it("records an episode against the site once and replays it with the site stopped", function()
    local dir = H.tmpdir()
    local path = dir .. "/shop.jsonl"
    local server, base = start_server()
    local c = rl.http.client{ base_url = base, retries = 0 }
    local cas = rl.http.cassette{ client = c, path = path }       -- auto: no file yet, records
    assert.equal("record", cas:stats().mode)
    local task = { target = "sale" }
    local actions = { "hats", "nowhere", "home", "shoes", "sale" }
    cas:episode("sale/0")
    local live, live_reward = play(shop.new{ http = cas }, task, actions)
    assert.equal(1, live_reward)
    assert.same({ "shoes", "sale" }, shop.oracle(task))
    assert.equal("page hats\nlinks home cart\nvisit 2\ngoal sale", live[2])  -- home was visit 1
    -- a second live run sees the site's state move on (visit numbers grow)
    local again = play(shop.new{ http = c }, task, actions)
    assert.are_not.same(live, again)
    cas:close()
    c:close()
    stop_server(server, base)
    local rep = rl.http.cassette{ path = path, base_url = base, episode = "sale/0" }
    assert.equal("replay", rep:stats().mode)
    local replayed, reward = play(shop.new{ http = rep }, task, actions)
    assert.same(live, replayed)
    assert.equal(1, reward)
    assert.same({ 5, 0 }, { rep:stats().hits, rep:stats().misses })
    -- a path never recorded is a miss, and the episode ends without reward
    rep:episode("cart/0")
    assert.has_error(function() shop.new{ http = rep }:reset{ target = "cart" } end)
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)
end)
