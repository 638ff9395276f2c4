-- bench_tensor.lua - sgemm GFLOPS and elementwise GB/s through the Lua binding, run by bench.sh
-- inside the moonrl command. Prints tab-separated lines like bench_tensor.c (medians of 9). With
-- the argument "matmul" it skips the elementwise part.
local rl = require "moonrl"
local T = rl.tensor
local SAMPLES = 9

local function median(v)
  table.sort(v)
  return v[(#v + 1) // 2]
end

-- Median rate (units per second) of fn() repeated `reps` times per sample.
local function rate(units, reps, fn)
  local r = {}
  for s = 1, SAMPLES do
    local t0 = rl.clock()
    for _ = 1, reps do fn() end
    r[s] = units * reps / (rl.clock() - t0)
  end
  return median(r)
end

for _, n in ipairs { 256, 512, 1024, 2048 } do
  local a, b = T.randn({ n, n }, 1), T.randn({ n, n }, 2)
  local c = a:matmul(b)
  local flops = 2 * n * n * n
  local reps = math.max(1, math.floor(0.05 * 100e9 / flops))
  -- with `out`, the loop measures the product itself, not allocation
  local gflops = rate(flops, reps, function() a:matmul(b, { out = c }) end) / 1e9
  print(string.format("lua_matmul\t%d\t%.1f", n, gflops))
end

if arg[1] == "matmul" then return end

local n = 1 << 24
local x, y = T.rand({ n }, 3), T.rand({ n }, 4) + 0.5
local out = T.zeros { n }
local bytes = 4 * n
print(string.format("lua_elementwise\tadd\t%.1f", rate(3 * bytes, 1, function() x:add(y, out) end) / 1e9))
print(string.format("lua_elementwise\texp\t%.1f", rate(2 * bytes, 1, function() x:exp(out) end) / 1e9))
