-- remote.lua - the quickstart's policy trained on episodes that a `moonrl serve` generates.
--
-- The recipe starts `moonrl serve` on loopback (a free port) serving the policy's initial
-- weights, then runs the quickstart's training (envs/guess_letter.lua, SFT on the oracle, then
-- GiGPO + PPO clip-higher) with remote = {client =, push_weights = true}: every episode's turns,
-- the evaluations' included, are sampled by the server from the exact token context the engine
-- holds (rl.remote.rollout), with the behaviour log-probs it reports, and after SFT and after
-- every update the trainer posts its weights to /v1/load_weights. Fewer steps than the
-- quickstart (STEPS below, 120 of 240), to stay within a few minutes on two cores: each turn of
-- each episode is one HTTP request, and the server prefills every prompt again.
--
--   moonrl run recipes/remote.lua [seed] [local]  (files go to runs/remote/; MOONRL = the moonrl
--                                                  command, else build/moonrl; "local": the
--                                                  same run with local rollouts, no server)
local rl = require "moonrl"

local root = os.getenv("MOONRL_ROOT") or "."
package.path = root .. "/?.lua;" .. package.path
local env = require "envs.guess_letter"

local STEPS = 120
local seed = math.tointeger(tonumber(arg and arg[1] or "")) or 1
local is_local = arg and arg[2] == "local"
local moonrl = os.getenv("MOONRL") or (root .. "/build/moonrl")
local dir = root .. "/runs/remote"
local tok = rl.tokenizer.bytes()
local model = rl.model.new { vocab = tok:vocab_size(), dim = 64, layers = 2, heads = 4, ffn = 192,
  ctx = 128, seed = seed }

local function quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- the server, on the initial weights (the trainer pushes the SFT ones before its first episode)
local server, pid, client, remote
if not is_local then
  assert(os.execute("mkdir -p " .. quote(dir)))
  assert(model:save(dir .. "/initial"))
  server = assert(io.popen("sh -c " .. quote(string.format(
    "echo $$; exec %s serve --model %s --port 0 --max-batch 64 --max-queue 1024 --batch-invariant",
    quote(moonrl), quote(dir .. "/initial"))), "r"))
  pid = assert(tonumber(server:read("l")), "moonrl serve did not start")
  local line = server:read("l") or ""
  local base = line:match("listening on (http://127%.0%.0%.1:%d+)")
  if not base then
    os.execute("kill " .. pid)
    error("moonrl serve: " .. line)
  end
  client = rl.http.openai { base_url = base, profile = "moonrl", model = "moonrl",
    max_connections = 64, retries = 2, timeout = 120 }
  remote = { client = client, push_weights = true }
end

print(string.format("remote: %s, policy of %d parameters, %s", env.name, model:config().params,
  is_local and "local rollouts" or "served by " .. client.http.base_url))

local t0 = rl.clock()
local ok, result = pcall(rl.train, {
  model = model, tokenizer = tok, env = env, name = is_local and "remote_local" or "remote",
  dir = root .. "/runs", seed = seed, overwrite = true, remote = remote,
  -- the quickstart's options, with STEPS steps
  sft = { examples = 2000, epochs = 6, lr = 3e-3, batch_size = 16, warmup = 10 },
  steps = STEPS, tasks_per_step = 16, group_size = 16, minibatch = 64, epochs = 1,
  max_turn_tokens = 3, temperature = 1.0,
  advantage = "gigpo", gamma = 0.8,
  loss = "ppo", clip_low = 0.2, clip_high = 0.28,
  lr = 2e-3, schedule = "cosine", min_lr = 2e-4,
  eval = { every = 30, tasks = 256, k = 4 },
})
if client then
  client:close()
  os.execute("kill " .. pid)
  server:close()
end
if not ok then error(result, 0) end

local b, a = result.before, result.after
local infra, episodes = 0, 0
for _, mt in ipairs(result.history) do
  infra, episodes = infra + (mt["end/infra"] or 0), episodes + (mt.episodes or 0)
end
print(string.format("%d steps in %.0f s (SFT %.0f s), %d training episodes %s, %d infra failures",
  STEPS, rl.clock() - t0, result.sft.seconds, episodes, is_local and "rolled out locally" or
  "from the server", infra))
print("| held-out (256 tasks) | after SFT | after RL |")
print("|---|---|---|")
print(string.format("| greedy success | %.1f%% | %.1f%% |", 100 * b["eval/greedy_success"],
  100 * a["eval/greedy_success"]))
print(string.format("| sampled success | %.1f%% | %.1f%% |", 100 * b["eval/sample_success"],
  100 * a["eval/sample_success"]))
print(string.format("| pass@4 | %.1f%% | %.1f%% |", 100 * b["eval/pass_at_k"], 100 * a["eval/pass_at_k"]))
print("files: " .. result.dir .. "/metrics.jsonl, episodes.jsonl, curve.svg")
