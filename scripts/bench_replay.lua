-- bench_replay.lua - what rl.replay costs, and what its C arithmetic saves: the sampling weights
-- and draws (moonrl.core.replay.weights + draw) beside the same rule written in plain Lua, the
-- importance ratios (moonrl.core.replay.ratios) beside a Lua loop over the tensors, and the
-- buffer's add, sample and state at sizes a trainer sees.
-- usage: moonrl run scripts/bench_replay.lua [entries = 4096] [draws = 64]
local rl = require "moonrl"
local core = require "moonrl.core"

local N = tonumber(arg and arg[1]) or 4096
local K = tonumber(arg and arg[2]) or 64

-- the median seconds of `reps` calls of f, over 5 rounds
local function time(f, reps)
  local rounds = {}
  for r = 1, 5 do
    local t0 = rl.clock()
    for _ = 1, reps do f() end
    rounds[r] = (rl.clock() - t0) / reps
  end
  table.sort(rounds)
  return rounds[3]
end

-- the rule of mrl_replay_weights and mrl_replay_draw in Lua (the naive reference)
local function lua_weights(p, age, alpha, decay)
  local w = {}
  for i = 1, #p do w[i] = math.max(p[i], 1e-6) ^ alpha * math.exp(-math.max(age[i], 0) / decay) end
  return w
end
local function lua_draw(w, last, staleness, u, k)
  local taken, out = {}, {}
  for j = 1, k do
    local left = 0
    for i = 1, #w do if not taken[i] then left = left + w[i] end end
    local pick
    if u[2 * j - 1] < staleness or left <= 0 then
      for i = 1, #w do if not taken[i] and (not pick or last[i] < last[pick]) then pick = i end end
    else
      local acc = 0
      for i = 1, #w do
        if not taken[i] and w[i] > 0 then
          acc = acc + w[i]
          if acc > u[2 * j] * left then pick = i break end
        end
      end
    end
    taken[pick] = true
    out[j] = pick
  end
  return out
end

local rng = rl.rng(1)
local p, age, last, u = {}, {}, {}, {}
for i = 1, N do p[i], age[i], last[i] = rng:random() * 2, rng:random(0, 1000), rng:random(0, 1000) end
for j = 1, 2 * K do u[j] = rng:random() end

local c_w = core.replay.weights { priority = p, age = age, alpha = 0.6, decay = 500 }
local l_w = lua_weights(p, age, 0.6, 500)
local c_pick = core.replay.draw { w = c_w, last = last, uniforms = u, k = K, staleness = 0.1 }
local l_pick = lua_draw(l_w, last, 0.1, u, K)
for j = 1, K do assert(c_pick[j] == l_pick[j], "the C and Lua draws differ") end

local tc = time(function()
  local w = core.replay.weights { priority = p, age = age, alpha = 0.6, decay = 500 }
  core.replay.draw { w = w, last = last, uniforms = u, k = K, staleness = 0.1, beta = 0.4 }
end, 20)
local tl = time(function() lua_draw(lua_weights(p, age, 0.6, 500), last, 0.1, u, K) end, 5)
print(string.format("weights + %d draws over %d entries: C %.3f ms, Lua %.3f ms (%.1fx)", K, N,
  tc * 1e3, tl * 1e3, tl / tc))

-- importance ratios over a batch of 256 episodes x 64 tokens
local E, T = 256, 64
local total = E * T
local logp, beh, mask = rl.tensor.randn({ total }, 1), rl.tensor.randn({ total }, 2), rl.tensor.zeros(total)
local offsets = { 0 }
for e = 1, E do
  for t = 1, T do if t > 16 then mask:set((e - 1) * T + t, 1) end end
  offsets[e + 1] = e * T
end
local function lua_ratios()
  local out = {}
  for e = 1, E do
    local s, n = 0, 0
    for q = offsets[e] + 1, offsets[e + 1] do
      if mask:get(q) ~= 0 then s, n = s + logp:get(q) - beh:get(q), n + 1 end
    end
    out[e] = n > 0 and math.exp(s / n) or 1
  end
  return out
end
local tcr = time(function()
  core.replay.ratios { logp = logp, behaviour = beh, mask = mask, offsets = offsets, cap = 5 }
end, 20)
local tlr = time(lua_ratios, 3)
print(string.format("importance ratios, %d episodes x %d tokens: C %.3f ms, Lua %.3f ms (%.1fx)",
  E, T, tcr * 1e3, tlr * 1e3, tlr / tcr))

-- the buffer: groups of 8 episodes of 64 tokens, as a trainer adds them
local function batch_of(groups, base)
  local n = groups * 8
  local tot = n * T
  local off = { 0 }
  local eps = {}
  for i = 1, n do
    off[i + 1] = i * T
    eps[i] = { group = base + (i - 1) // 8, reward = (i % 3) / 2, task = { i = i }, seed = i }
  end
  local b = rl.batch.new { tokens = rl.tensor.zeros(tot), logprobs = rl.tensor.randn({ tot }, 3),
    mask = mask:narrow(1, 1, tot):clone(), turns = rl.tensor.zeros(tot), offsets = off,
    episodes = eps }
  b.advantages = rl.tensor.randn({ tot }, 4)
  return b
end
local buf = rl.replay.new { capacity = N, seed = 1 }
local step = 0
while buf:stats().size < N do
  step = step + 1
  buf:add(batch_of(16, step * 100), step)
end
local fresh = batch_of(16, 0)
local ta = time(function() step = step + 1; buf:add(fresh, step) end, 3)
local groups = math.max(1, K // 8)
local ts = time(function() buf:sample(groups, step) end, 5)
local tst = time(function() buf:state() end, 1)
print(string.format("buffer of %d episodes (%d groups): add 128 episodes %.1f ms, sample %d "
  .. "groups %.1f ms, state() %.0f ms", N, buf:stats().entries, ta * 1e3, groups, ts * 1e3, tst * 1e3))
print(string.format("state() as JSON: %.1f MB", #rl.json.encode(buf:state()) / 1e6))
