-- bench_bf16.lua - the large model (the bench's d512 L8, random weights) decoding with float32 and
-- with bfloat16 decode weights (m:decode_bf16), batch 1 (200 new tokens) and 16 (100), new tokens/s
-- of the decode steps alone (a generate of N minus one of 1), 5 rounds alternating the two; prints
-- "<batch> <weights> <median> <the 5 rounds, sorted>". A build without decode_bf16 prints 0 for bf16.
--   moonrl run scripts/bench_bf16.lua
local rl = require "moonrl"
local m = rl.model.new { vocab = 256, dim = 512, layers = 8, heads = 8, ffn = 1536, ctx = 384, seed = 1 }
local function prompts(B)
  local t = {}
  for b = 1, B do local r = {} for i = 1, 16 do r[i] = (b * 31 + i * 7) % 256 end t[b] = r end
  return t
end
local function rate(B, N, bf)
  if m.decode_bf16 then m:decode_bf16(bf) elseif bf then return 0 end
  local p = prompts(B)
  local t0 = rl.clock(); m:generate { prompts = p, max_new_tokens = 1, temperature = 1, seed = 1 }
  local t1 = rl.clock(); m:generate { prompts = p, max_new_tokens = N, temperature = 1, seed = 1 }
  local t2 = rl.clock()
  return B * (N - 1) / ((t2 - t1) - (t1 - t0))
end
local res = {}
for round = 1, 5 do
  for _, B in ipairs { 1, 16 } do
    for _, bf in ipairs(round % 2 == 1 and { false, true } or { true, false }) do
      local k = B .. (bf and " bf16" or " f32")
      res[k] = res[k] or {}
      table.insert(res[k], rate(B, B == 1 and 200 or 100, bf))
    end
  end
end
for _, k in ipairs { "1 f32", "1 bf16", "16 f32", "16 bf16" } do
  table.sort(res[k]); print(k, string.format("%.1f", res[k][3]), table.concat(res[k], " ", 1, 5):gsub("(%d+%.%d)%d+", "%1"))
end
