-- moonrl.train.dist: data-parallel rl.train over rl.comm (MPI ranks), made to equal one process
-- on the same global batch.
--
-- The design, and why it equals one process:
--   - Rollouts: each rank rolls out its contiguous share of a request's groups (whole groups, so
--     a group's episodes are together) with the per-episode seeds one process would use
--     (mix(seed, episode index)), then every rank gathers every rank's episodes in rank order:
--     each rank then holds the global batch, in one process's order, and the steps after it
--     (rewards, curriculum, synthesis, advantages with their group and batch statistics, dynamic
--     sampling, metrics) run on it unchanged, so every global denominator and statistic is the
--     global one by construction. Tokens do not depend on the number of ranks.
--   - Updates: each minibatch's episodes are split over the ranks; each rank scores its share
--     (m:forward_batch), the per-token log-probs, entropies and values are summed over the ranks
--     (each rank's are zero elsewhere) so every rank computes the loss of the whole minibatch
--     with its global token and sequence counts; each rank backpropagates its share, and the
--     gradients are summed (m:allreduce_grads) before the clipped AdamW step. The sums' order
--     differs from one process's, so parameters agree to float rounding, not bits.
--   - Scoring passes (old log-probs, the reference's) are split the same way.
--   - Rank 0 alone writes files (logs, metrics, report, checkpoints, the reference, pushed
--     weights); every rank reads them on resume (a shared file system); weights are broadcast
--     from rank 0 at the start and checked (m:digest) after a resume.
-- With one rank every function here is the identity or does nothing.
local core = require "moonrl.core"
local batchlib = require "moonrl.batch"

local comm = core.comm
local json_null = core.json.null
local clock = core.clock
local M = {}

-- Seconds spent in collectives since the last M.take_seconds() (waiting for slower ranks
-- included): a step's time/comm.
local spent = 0
local function timed(t0) spent = spent + clock() - t0 end
function M.take_seconds()
  local s = spent
  spent = 0
  return s
end

function M.size() return comm.size() end
function M.rank() return comm.rank() end
-- Whether this rank writes the run's files (rank 0).
function M.lead() return comm.rank() == 0 end

-- The contiguous part first..last of 1..n that rank (default: this one) of size owns: ranks
-- take equal shares in rank order (last < first when n < size leaves it none).
function M.share(n, rank, size)
  rank, size = rank or comm.rank(), size or comm.size()
  return (n * rank) // size + 1, (n * (rank + 1)) // size
end

-- This rank's part of a list (its share, in order).
function M.part(list)
  local a, b = M.share(#list)
  local out = {}
  for i = a, b do out[#out + 1] = list[i] end
  return out
end

-- ---- values across ranks: Lua source that rebuilds a value exactly ----

local function is_json_array(t)
  local mt = getmetatable(t)
  return mt ~= nil and type(mt) == "table" and mt.__jsontype == "array"
end

-- v is at path.key (key nil: at path); q: the quoted strings of this encoding (record keys
-- repeat in every episode)
local function encode_value(v, out, path, key, depth, q)
  local tv = type(v)
  if tv == "string" then
    local s = q[v]
    if not s then
      s = string.format("%q", v)
      if #v <= 64 then q[v] = s end
    end
    out[#out + 1] = s
  elseif tv == "number" then
    -- integers as written (but mininteger, which reads back as a float), floats in hex: exact
    out[#out + 1] = (math.type(v) == "integer" and v ~= math.mininteger) and tostring(v) or string.format("%q", v)
  elseif tv == "boolean" then
    out[#out + 1] = v and "true" or "false"
  elseif v == json_null then
    out[#out + 1] = "N"
  elseif tv == "table" then
    if key ~= nil then path = path .. "." .. tostring(key) end
    if depth > 100 then error("train: ranks: " .. path .. " is nested too deep (a cycle?)", 0) end
    local mt = getmetatable(v)
    if mt ~= nil and not is_json_array(v) then
      error("train: ranks: " .. path .. " is a table with a metatable, which cannot be sent to "
        .. "other ranks (keep episodes' records, states and infos plain data)", 0)
    end
    out[#out + 1] = mt and "A{" or "{"
    local n = #v -- the sequence part without keys, then the rest
    for i = 1, n do
      encode_value(v[i], out, path, i, depth + 1, q)
      out[#out + 1] = ","
    end
    for k, x in next, v do
      if not (math.type(k) == "integer" and k >= 1 and k <= n) then
        out[#out + 1] = "["
        encode_value(k, out, path, nil, depth + 1, q)
        out[#out + 1] = "]="
        encode_value(x, out, path, k, depth + 1, q)
        out[#out + 1] = ","
      end
    end
    out[#out + 1] = "}"
  else
    if key ~= nil then path = path .. "." .. tostring(key) end
    error(string.format("train: ranks: %s is a %s, which cannot be sent to other ranks (keep "
      .. "episodes' records, states and infos plain data)", path, tv), 0)
  end
end

-- encode(v, what) -> text; decode(text) -> v: numbers (integer or float, bit for bit), strings,
-- booleans, rl.json.null, plain tables and rl.json arrays. Anything else raises, naming where
-- in `what` it was.
function M.encode(v, what)
  local out = { "return " }
  encode_value(v, out, what or "value", nil, 0, {})
  return table.concat(out)
end

function M.decode(text)
  local f = assert(load(text, "=(rank data)", "t", { N = json_null, A = core.json.array }))
  return f()
end

-- ---- batches ----

local TENSORS = { "tokens", "logprobs", "mask", "turns" }

-- An empty batch (a rank with no share of a request).
function M.empty_batch()
  return batchlib.concat {}
end

-- The batches of every rank (each rank passes its own), concatenated in rank order, on every
-- rank; batch.gate counts (rollout gates) summed with add_gate(a, b) -> sum (both may be nil).
function M.gather_batch(b, add_gate)
  if comm.size() == 1 then return b end
  local t0 = clock()
  local metas = comm.allgather(M.encode({ offsets = b.offsets, episodes = b.episodes, gate = b.gate },
    "the batch"))
  local tensors = {}
  for _, k in ipairs(TENSORS) do tensors[k] = comm.allgather(b[k]:contiguous()) end
  local parts, gate = {}, nil
  for r, text in ipairs(metas) do
    local m = M.decode(text)
    if #m.episodes > 0 then
      local t = { offsets = m.offsets, episodes = m.episodes }
      for _, k in ipairs(TENSORS) do t[k] = tensors[k][r] end
      parts[#parts + 1] = batchlib.new(t)
    end
    if m.gate then gate = add_gate(gate, m.gate) end
  end
  local out = batchlib.concat(parts)
  out.gate = gate
  timed(t0)
  return out
end

-- ---- sums ----

-- t (a contiguous tensor) summed over the ranks in place; returns t.
function M.sum(t)
  if comm.size() > 1 then
    local t0 = clock()
    comm.allreduce(t)
    timed(t0)
  end
  return t
end

-- A number summed over the ranks.
function M.sum_number(x)
  if comm.size() == 1 then return x end
  local t0 = clock()
  local s = comm.allreduce { x }[1]
  timed(t0)
  return s
end

-- model's gradients summed over the ranks (before its optimizer step).
function M.sum_gradients(model)
  if comm.size() == 1 then return end
  local t0 = clock()
  model:allreduce_grads()
  timed(t0)
end

function M.barrier()
  if comm.size() > 1 then
    local t0 = clock()
    comm.barrier()
    timed(t0)
  end
end

-- Raises unless every rank passes the same text (what: what it is, for the message).
function M.check_same(text, what)
  if comm.size() == 1 then return end
  local t0 = clock()
  local all = comm.allgather(text)
  timed(t0)
  for r = 2, #all do
    if all[r] ~= all[1] then
      error(string.format("train: ranks: %s differs between rank 0 and rank %d", what, r - 1), 0)
    end
  end
end

-- Raises unless every rank's model is bit-identical to rank 0's (weights and AdamW state).
function M.check_replicas(model, when)
  M.check_same(model:digest(), "the model (weights and optimizer state) " .. when)
end

return M
