-- collectives.lua - rl.comm's collectives checked on every rank (tests/lua/mpi_spec.lua runs it
-- under mpirun -np N); each rank raises on the first wrong result and prints "rank R of N ok".
--   moonrl run tests/mpi/collectives.lua [MODE]
-- MODE "mismatch": ranks broadcast tensors of different lengths (must raise on every rank);
-- "fail1": rank 1 raises (the job must end, not hang).
local rl = require "moonrl"
local comm, T = rl.comm, rl.tensor
local r, n = comm.rank(), comm.size()
local mode = arg[1]
local function check(cond, what) if not cond then error(string.format("rank %d: %s", r, what), 0) end end

if mode == "mismatch" then
  comm.bcast(T.zeros(3 + r))
  return
elseif mode == "fail1" then
  if r == 1 then error("rank 1 gives up", 0) end
  comm.barrier() -- rank 0 waits here for a rank that is gone
  return
end

check(comm.backend() == "mpi", "backend " .. comm.backend())
-- a float32 sum, in place, over more than one 4 MB piece
local big = T.full({ (1 << 20) + 17 }, r + 1)
check(comm.allreduce(big) == big, "allreduce returns its tensor")
local want = n * (n + 1) / 2
check(big:get(1) == want and big:get((1 << 20) + 17) == want, "float32 sum " .. big:get(1))
-- float64 sums of numbers
local s = comm.allreduce { r, 0.5, 2 ^ 40 + r }
check(s[1] == n * (n - 1) / 2 and s[2] == 0.5 * n and s[3] == n * 2 ^ 40 + n * (n - 1) / 2, "float64 sums")
-- broadcast: a tensor from the last rank, a string from rank 0
local t = T.full({ 5 }, r)
comm.bcast(t, n - 1)
check(t:get(5) == n - 1, "bcast tensor")
local text = comm.bcast(r == 0 and ("x\0y" .. string.rep("z", 100000)) or nil)
check(#text == 100003 and text:sub(1, 3) == "x\0y", "bcast string")
-- gathers of different lengths, an empty one among them
local g = comm.allgather(string.rep(string.char(65 + r), r))
check(#g == n, "allgather count")
for k = 1, n do check(g[k] == string.rep(string.char(64 + k), k - 1), "allgather string " .. k) end
local gt = comm.allgather(T.arange(r + 1):narrow(1, 1, r))
for k = 1, n do
  check(gt[k]:numel() == k - 1, "allgather tensor length " .. k)
  if k > 1 then check(gt[k]:get(k - 1) == k - 2, "allgather tensor values " .. k) end
end
comm.barrier()
-- models: rank 0's weights and AdamW state broadcast into differently seeded replicas; gradients
-- summed
local cfg = { vocab = 16, dim = 8, layers = 1, heads = 2, ffn = 16, ctx = 8, seed = 1 + r }
local m = rl.model.new(cfg)
if r == 0 then
  m:accumulate { tokens = { { 1, 2, 3 } } }
  m:step { lr = 1e-2 }
end
m:broadcast()
local digests = comm.allgather(m:digest())
for k = 2, n do check(digests[k] == digests[1], "digest after broadcast, rank " .. (k - 1)) end
m:accumulate { tokens = { { 1, 2, 3 } } }
local mine = m:gradients()["model.norm.weight"]:clone()
m:allreduce_grads()
local summed = m:gradients()["model.norm.weight"]
check(summed:max_abs_diff(mine * n) <= 1e-6 * (mine * mine):sum() ^ 0.5 * n, "summed gradients")
-- misuse is an error naming the argument, on the rank that made it
local ok, err = pcall(comm.bcast, T.zeros(2), n)
check(not ok and err:find("root"), "bcast root out of range: " .. tostring(err))
ok, err = pcall(comm.allreduce, { 1, "x" })
check(not ok and err:find("%[2%]"), "allreduce of a non-number: " .. tostring(err))
io.stdout:write(string.format("rank %d of %d ok\n", r, n))
