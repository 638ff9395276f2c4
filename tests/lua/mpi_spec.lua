-- mpi_spec.lua - data-parallel training on Open MPI (moonrl.train.dist, rl.comm): collectives on
-- 1, 2 and 4 ranks; rl.train on 2 and 4 ranks (shared memory and TCP on loopback) equal to one
-- process on the same global batch; bit-identical replicas after every step and across reruns;
-- resume on 2 ranks equal to an uninterrupted run; a failure on one rank ends the job; the MPI
-- build as a singleton; the default build without MPI.
--
-- The MPI cases need the MPI build's moonrl (MOONRL_MPI_BUILD, which `make test` builds when Open
-- MPI is installed, and installs it when it can) and mpirun: without them they are skipped with a
-- message.
local rl = require "moonrl"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")

local mpi_build = os.getenv("MOONRL_MPI_BUILD")
if mpi_build == "" then mpi_build = nil end
local mpi_moonrl = mpi_build and mpi_build .. "/moonrl"
local have_mpirun = H.run("command -v mpirun") ~= ""
local why_not = not mpi_build and "MOONRL_MPI_BUILD is not set (make test sets it when Open MPI is installed)"
  or not H.run("test -x " .. H.shell_quote(mpi_moonrl) .. " && echo y"):find("y") and (mpi_moonrl .. " is not built")
  or not have_mpirun and "mpirun is not installed" or nil
local function need_mpi()
  if why_not then pending("skipped: " .. why_not) return false end
  return true
end

local TRAIN = H.root .. "/tests/mpi/dp_train.lua"
local COLL = H.root .. "/tests/mpi/collectives.lua"
local TCP = "--mca btl self,tcp --mca btl_tcp_if_include lo"

-- Runs moonrl run SCRIPT ARGS under mpirun -np np (np = nil: alone, as a singleton); output, code.
local function mpi(np, script, args, mca, envs)
  local cmd = (envs or "") .. " MOONRL_ROOT=" .. H.shell_quote(H.root) .. " timeout 300 "
  if np then cmd = cmd .. "mpirun --allow-run-as-root --oversubscribe " .. (mca or "") .. " -np " .. np .. " " end
  return H.run(cmd .. H.shell_quote(mpi_moonrl) .. " run " .. H.shell_quote(script) .. " " .. (args or ""))
end

-- dp_train.lua's result in dir for variant, run on np ranks (nil: alone); {steps =, dir =}.
local function train(dir, variant, np, mca, extra)
  local out, code = mpi(np, TRAIN, H.shell_quote(dir) .. " " .. variant .. " " .. (extra or ""), mca)
  assert.equal(0, code, out)
  local f = assert(io.open(dir .. "/" .. variant .. "/result.json"))
  local r = rl.json.decode(f:read("a"))
  f:close()
  r.dir = dir .. "/" .. variant
  return r
end

-- Norm-wise relative difference of two saved models' parameters: |a - b| / |a| over all of them.
local function param_diff(da, db)
  local a, b = assert(rl.model.load(da)), assert(rl.model.load(db))
  local pb, dd, nn = b:parameters(), 0, 0
  for k, w in pairs(a:parameters()) do
    local d = w - pb[k]
    dd, nn = dd + (d * d):sum(), nn + (w * w):sum()
  end
  return math.sqrt(dd / nn)
end

-- One process's run against an np-rank run of the same global batch: the same rewards (the same
-- tokens), every rank holding one digest after every step, the loss equal to 1e-6 relative at the
-- first step (the same weights) and 1e-4 after (measured here up to 4.6e-6: the weights then
-- differ by float rounding, sums in another order, and a later loss is a small difference of
-- larger terms; other CPUs round otherwise), the final parameters equal to 1e-6 relative
-- (norm-wise). Returns the parameter difference.
local function assert_equal_runs(one, many, np)
  assert.equal(#one.steps, #many.steps)
  assert.equal(np, many.ranks)
  for i, s in ipairs(many.steps) do
    local o = one.steps[i]
    assert.is_true(s.same, "ranks held different parameters after step " .. s.step)
    assert.equal(np, s.ranks)
    assert.equal(o.reward, s.reward, "step " .. s.step .. ": rewards differ")
    -- reward terms, curriculum and sampling metrics come from the global batch: equal
    assert.same(o.global, s.global, "step " .. s.step .. ": reward, curriculum or sampling metrics differ")
    assert.equal(o.eval, s.eval, "step " .. s.step .. ": held-out success differs")
    assert.equal(o.loss == nil, s.loss == nil)
    if o.loss then
      local rel = math.abs(o.loss - s.loss) / math.max(math.abs(o.loss), 1e-2)
      assert.is_true(rel <= (i == 1 and 1e-6 or 1e-4),
        string.format("step %d: loss %.10g alone, %.10g on %d ranks (%.2g relative)", s.step, o.loss, s.loss, np, rel))
    end
  end
  local d = param_diff(one.dir .. "/final", many.dir .. "/final")
  assert.is_true(d <= 1e-6, string.format("parameters differ by %.3g (norm-wise relative)", d))
  return d
end

describe("the default build", function()
  it("has only the self backend and links no MPI", function()
    assert.equal("self", rl.comm.backends())
    assert.equal(0, rl.comm.rank())
    assert.equal(1, rl.comm.size())
    for _, f in ipairs { H.moonrl, H.build .. "/libmoonrl.so.0", H.build .. "/libmoonrl-core.so.0" } do
      local out, code = H.run("ldd " .. H.shell_quote(f))
      assert.equal(0, code, out)
      assert.is_nil(out:find("libmpi", 1, true), f .. " links MPI:\n" .. out)
    end
  end)

  it("runs rl.comm's collectives as a group of one", function()
    local t = rl.tensor.full({ 3 }, 2)
    assert.equal(t, rl.comm.allreduce(t))
    assert.equal(2, t:get(3))
    assert.same({ 1.5, 2 }, rl.comm.allreduce { 1.5, 2 })
    assert.equal("abc", rl.comm.bcast("abc"))
    assert.same({ "xy" }, rl.comm.allgather("xy"))
    local g = rl.comm.allgather(rl.tensor.arange(4))
    assert.equal(1, #g)
    assert.equal(3, g[1]:get(4))
    rl.comm.barrier()
    local m = rl.model.new { vocab = 16, dim = 8, layers = 1, heads = 2, ffn = 16, ctx = 8, seed = 1 }
    local before = m:digest()
    m:broadcast()
    m:allreduce_grads()
    assert.equal(before, m:digest())
  end)

  it("refuses misuse with an error naming the argument", function()
    local ok, err = pcall(rl.comm.bcast, rl.tensor.zeros(2), 1)
    assert.is_false(ok)
    assert.truthy(err:find("root: a rank in 0..0", 1, true), err)
    ok, err = pcall(rl.comm.allreduce, { 1, "x" })
    assert.is_false(ok)
    assert.truthy(err:find("[2]: a number expected", 1, true), err)
    ok, err = pcall(rl.comm.allgather, 5)
    assert.is_false(ok)
    assert.truthy(err:find("a string or a 1-D tensor", 1, true), err)
    ok, err = pcall(rl.comm.allreduce, rl.tensor.zeros(4, 4):t())
    assert.is_false(ok)
    assert.truthy(err:find("contiguous", 1, true), err)
    ok, err = pcall(rl.comm.bcast, 42)
    assert.is_false(ok)
    assert.truthy(err:find("a tensor or a string", 1, true), err)
  end)

  it("gives a model digest that changes with the weights and the optimizer state", function()
    local cfg = { vocab = 16, dim = 8, layers = 1, heads = 2, ffn = 16, ctx = 8, seed = 1 }
    local a, b = rl.model.new(cfg), rl.model.new(cfg)
    assert.equal(a:digest(), b:digest())
    assert.truthy(a:digest():match("^%x+$"))
    assert.equal(16, #a:digest())
    cfg.seed = 2
    assert.are_not.equal(a:digest(), rl.model.new(cfg):digest())
    a:accumulate { tokens = { { 1, 2, 3 } } }
    a:step { lr = 0 } -- no change to the weights, but AdamW's moments now exist
    assert.are_not.equal(a:digest(), b:digest())
  end)
end)

describe("rl.comm under mpirun", function()
  it("runs as a singleton without mpirun", function()
    if not need_mpi() then return end
    local out, code = H.run("MOONRL_ROOT=" .. H.shell_quote(H.root) .. " " .. H.shell_quote(mpi_moonrl)
      .. " -e 'local rl = require \"moonrl\" print(rl.comm.backend(), rl.comm.rank(), rl.comm.size())'")
    assert.equal(0, code, out)
    assert.equal("mpi\t0\t1\n", out)
    out = H.run(H.shell_quote(mpi_moonrl) .. " version")
    assert.truthy(out:find("comm: self mpi", 1, true), out)
  end)

  it("passes the C API's tests as a singleton (MPI finalised with the last handle)", function()
    if not need_mpi() then return end
    local out, code = H.run(H.shell_quote(mpi_build .. "/tests/test_comm"))
    assert.equal(0, code, out)
    assert.truthy(out:find("ok 3 - finalised", 1, true), out)
    assert.is_nil(out:find("not ok", 1, true), out)
  end)

  for _, np in ipairs { 1, 2, 4 } do
    it("sums, broadcasts and gathers on " .. np .. " rank(s)", function()
      if not need_mpi() then return end
      local out, code = mpi(np, COLL, "", nil, "MOONRL_RANK_STDOUT=all")
      assert.equal(0, code, out)
      for r = 0, np - 1 do
        assert.truthy(out:find(string.format("rank %d of %d ok", r, np), 1, true), out)
      end
    end)
  end

  it("prints standard output on rank 0 only, unless MOONRL_RANK_STDOUT=all", function()
    if not need_mpi() then return end
    local dir = H.tmpdir()
    local script = dir .. "/hello.lua"
    local f = assert(io.open(script, "w"))
    f:write('local rl = require "moonrl" print("hello from " .. rl.comm.rank())\n')
    f:close()
    local out, code = mpi(2, script)
    assert.equal(0, code, out)
    assert.truthy(out:find("hello from 0", 1, true), out)
    assert.is_nil(out:find("hello from 1", 1, true), out)
    out = mpi(2, script, "", nil, "MOONRL_RANK_STDOUT=all")
    assert.truthy(out:find("hello from 1", 1, true), out)
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)

  it("raises on every rank when broadcast lengths differ", function()
    if not need_mpi() then return end
    local out, code = mpi(2, COLL, "mismatch")
    assert.are_not.equal(0, code)
    assert.truthy(out:find("4 floats here, 3 at the root", 1, true), out)
  end)

  it("ends the whole job when one rank fails, instead of leaving the others waiting", function()
    if not need_mpi() then return end
    local out, code = mpi(2, COLL, "fail1")
    assert.are_not.equal(0, code)
    assert.are_not.equal(124, code, "the job hung until timeout") -- (timeout's status)
    assert.truthy(out:find("rank 1 gives up", 1, true), out)
  end)
end)

describe("rl.train on several ranks", function()
  local dir, alone
  setup(function()
    dir = H.tmpdir()
  end)
  teardown(function()
    if dir then H.sh("rm -rf " .. H.shell_quote(dir)) end
  end)
  local function single()
    alone = alone or train(dir .. "/alone", "ppo", nil)
    return alone
  end

  it("equals one process on 2 ranks over shared memory, replicas bit-identical, reruns too", function()
    if not need_mpi() then return end
    local one = single()
    assert.equal(1, one.ranks)
    local two = train(dir .. "/np2", "ppo", 2)
    assert_equal_runs(one, two, 2)
    local again = train(dir .. "/np2b", "ppo", 2)
    for i, s in ipairs(two.steps) do assert.equal(s.digest, again.steps[i].digest) end
    -- only rank 0 wrote the run's files, once each
    local n = 0
    for _ in io.lines(two.dir .. "/metrics.jsonl") do n = n + 1 end
    assert.equal(#two.steps + 1, n) -- (step 0's line too)
  end)

  it("equals one process on 2 ranks over TCP on loopback, bit-identical to shared memory", function()
    if not need_mpi() then return end
    local tcp = train(dir .. "/tcp", "ppo", 2, TCP)
    assert_equal_runs(single(), tcp, 2)
    local shm = train(dir .. "/shm", "ppo", 2)
    for i, s in ipairs(tcp.steps) do assert.equal(shm.steps[i].digest, s.digest) end
  end)

  it("equals one process on 4 ranks", function()
    if not need_mpi() then return end
    assert_equal_runs(single(), train(dir .. "/np4", "ppo", 4), 4)
    assert_equal_runs(single(), train(dir .. "/np4tcp", "ppo", 4, TCP), 4)
  end)

  it("equals one process with a critic (value head gradients summed too)", function()
    if not need_mpi() then return end
    assert_equal_runs(train(dir .. "/critic1", "critic", nil), train(dir .. "/critic2", "critic", 2), 2)
  end)

  it("equals one process with a reward graph and a curriculum with a resampling gate", function()
    if not need_mpi() then return end
    local one, two = train(dir .. "/ag1", "agentlib", nil), train(dir .. "/ag2", "agentlib", 2)
    assert_equal_runs(one, two, 2)
    local n = 0
    for k in pairs(two.steps[1].global) do
      if k:find("^reward/correct") or k:find("^curriculum/") then n = n + 1 end
    end
    assert.is_true(n >= 3, "the run logged no reward-term or curriculum metrics")
  end)

  it("equals one process with tree rollouts (episodes in root-major order on any rank count)", function()
    if not need_mpi() then return end
    assert_equal_runs(train(dir .. "/tree1", "tree", nil), train(dir .. "/tree2", "tree", 2), 2)
  end)

  it("resumes on 2 ranks exactly where an uninterrupted run goes", function()
    if not need_mpi() then return end
    local full = train(dir .. "/full", "ppo", 2)
    local first = train(dir .. "/cut", "ppo", 2, nil, "2")
    assert.equal(2, #first.steps)
    local rest = train(dir .. "/cut", "ppo", 2, nil, "'' resume")
    assert.equal(3, rest.steps[1].step)
    for i, s in ipairs(first.steps) do assert.equal(full.steps[i].digest, s.digest) end
    for i, s in ipairs(rest.steps) do assert.equal(full.steps[i + 2].digest, s.digest) end
  end)
end)
