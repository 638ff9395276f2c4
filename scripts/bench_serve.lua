-- bench_serve.lua - serving and HTTP-client figures for `make bench`, one round:
--   serve   `moonrl serve` (a separate process, started here on a free loopback port) on the
--           quickstart-sized model (bytes vocab, d=64, L=2, h=4, ffn 192, ctx 128, saved to a
--           temporary directory), driven by C concurrent clients (C = 1, 8, 32) that are rl.http
--           coroutine tasks of one client in this process, each sending streamed
--           /v1/completions requests back to back: a 16-token id prompt, max_tokens = 32,
--           ignore_eos. Requests/s over the run; time to first token (request submitted to the
--           first streamed chunk handed to the task) median and p90; the cores the clients
--           themselves used (this process's CPU time over the wall time), as they share the
--           machine with the server.
--   client  the client's cost per request against the mock server (build/tests/mock_server, a
--           separate process) answering GET /hold?ms=0 with "ok" at once: wall µs and this
--           process's CPU µs per request at 1 and 16 in flight, and the TCP connections the
--           server accepted during the 16-way run.
-- Prints tab-separated lines "serve <key> <value>" and "client <key> <value>".
--   moonrl run scripts/bench_serve.lua BUILD
local rl = require "moonrl"

local BUILD = arg and arg[1] or "build"
local MAX_TOKENS, PROMPT_LEN = 32, 16

local function out(kind, key, value) io.write(string.format("%s\t%s\t%.6g\n", kind, key, value)) end

local function quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local function percentile(xs, p)
  table.sort(xs)
  return xs[math.max(1, math.ceil(p * #xs))]
end

-- ---- moonrl serve on the quickstart-sized model ----
local dir = os.tmpname()
os.remove(dir)
assert(os.execute("mkdir -p " .. quote(dir)))
local tok = rl.tokenizer.bytes()
local m = rl.model.new { vocab = tok:vocab_size(), dim = 64, layers = 2, heads = 4, ffn = 192,
  ctx = 128, seed = 1 }
assert(m:save(dir .. "/model"))

-- --max-batch 32 so that 32 clients decode in one batch (the default, 8, would queue 24 of them)
local cmd = string.format("echo $$; exec %s serve --model %s --port 0 --max-batch 32 --max-queue 64",
                          quote(BUILD .. "/moonrl"), quote(dir .. "/model"))
local proc = assert(io.popen("sh -c " .. quote(cmd), "r"))
local pid = assert(tonumber(proc:read("l")), "no pid")
local line = assert(proc:read("l"), "moonrl serve printed nothing")
local base = assert(line:match("listening on (http://127%.0%.0%.1:%d+)"), line)

local prompt = {}
for i = 1, PROMPT_LEN do prompt[i] = 40 + i end

local function serve_run(clients, per_client)
  local c = rl.http.client { base_url = base, retries = 0, max_connections = clients, timeout = 120 }
  local ttft, seed = {}, 0
  local function one()
    seed = seed + 1
    local t0, first, chunks = rl.clock(), nil, 0
    local status = c:request { method = "POST", path = "/v1/completions",
      body = { prompt = prompt, max_tokens = MAX_TOKENS, ignore_eos = true, stream = true,
               temperature = 1, seed = seed },
      stream = function(ev)
        if ev.json and ev.json.choices then
          first = first or rl.clock()
          chunks = chunks + 1
        end
        return true
      end }
    assert(status == 200 and chunks >= MAX_TOKENS, "streamed completion failed: " .. tostring(status))
    ttft[#ttft + 1] = first - t0
  end
  -- one warm-up request per client (connections opened, the server's slots touched)
  local fns = {}
  for i = 1, clients do fns[i] = one end
  c:run(fns)
  ttft = {}
  for i = 1, clients do fns[i] = function() for _ = 1, per_client do one() end end end
  local t0, cpu0 = rl.clock(), os.clock()
  c:run(fns)
  local wall, cpu = rl.clock() - t0, os.clock() - cpu0
  local _, _, health = c:get("/health")
  c:close()
  local n = clients * per_client
  out("serve", "max_batch_seen_" .. clients, rl.json.decode(health).max_batch_seen)
  out("serve", "rps_" .. clients, n / wall)
  out("serve", "tokens_per_s_" .. clients, n * MAX_TOKENS / wall)
  out("serve", "ttft_p50_ms_" .. clients, 1000 * percentile(ttft, 0.5))
  out("serve", "ttft_p90_ms_" .. clients, 1000 * percentile(ttft, 0.9))
  out("serve", "client_cores_" .. clients, cpu / wall) -- the clients' own share of the cores
end

local ok, err = pcall(function()
  serve_run(1, 600)
  serve_run(8, 100)
  serve_run(32, 30)
end)
os.execute("kill " .. pid)
proc:close()
os.execute("rm -rf " .. quote(dir))
if not ok then error(err, 0) end

-- ---- the client against the mock server ----
local mock = assert(io.popen(quote(BUILD .. "/tests/mock_server") .. " 120", "r"))
local mbase = "http://127.0.0.1:" .. assert(tonumber(mock:read("l")), "mock_server printed no port")
local control = rl.http.client { base_url = mbase, retries = 0 }

local function client_run(inflight, total)
  local c = rl.http.client { base_url = mbase, retries = 0, max_connections = 16 }
  -- the control client's connection is already open, so the server's count from here on is
  -- the bench client's connections only
  assert(control:get("/reset_stats") == 200)
  local fns = {}
  local per = total // inflight
  for i = 1, inflight do
    fns[i] = function()
      for _ = 1, per do
        local status, _, body = c:get("/hold?ms=0")
        assert(status == 200 and body == "ok", "mock request failed")
      end
    end
  end
  local w0, c0 = rl.clock(), os.clock()
  c:run(fns)
  local wall, cpu = rl.clock() - w0, os.clock() - c0
  local _, _, stats = control:get("/stats")
  stats = rl.json.decode(stats)
  c:close()
  local n = per * inflight
  out("client", "wall_us_" .. inflight, 1e6 * wall / n)
  out("client", "cpu_us_" .. inflight, 1e6 * cpu / n)
  out("client", "connections_" .. inflight, stats.connections)
  out("client", "max_open_" .. inflight, stats.max_open - 1) -- less the control connection
end

ok, err = pcall(function()
  client_run(1, 4000)
  client_run(16, 8000)
end)
control:get("/quit")
control:close()
mock:close()
if not ok then error(err, 0) end
