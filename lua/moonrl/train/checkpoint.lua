-- moonrl.train.checkpoint: the checkpoint stage: state.json (the step, the metrics history, the
-- value head, ...) with one checkpoint-<step>.bin of the model (weights and AdamW state),
-- written atomically, and resume from them bit-exactly.
--
-- The `checkpoint` option replaces the stage: a table {save = function(ctx, step), load =
-- function(ctx) -> state or nil}. save persists ctx.state (a JSON-ready table), the model and
-- the value head (ctx.value) at the end of `step`; load, on resume, restores the model and
-- returns the state saved last (nil when there is none: the run starts fresh).
local core = require "moonrl.core"
local critic = require "moonrl.train.critic"

local json = core.json
local M = {}

-- The default save.
function M.save(ctx, step)
  local ckpt = string.format("%s/checkpoint-%06d.bin", ctx.dir, step)
  local ok, err = ctx.model:save_checkpoint(ckpt, step)
  if not ok then error("train: checkpoint: " .. err, 0) end
  local prev = ctx.state.checkpoint
  ctx.state.checkpoint = ckpt:match("[^/]+$")
  ctx.state.step = step
  if ctx.value then ctx.state.value_head = critic.state(ctx.value) end
  ok, err = core.fs.write(ctx.dir .. "/state.json", json.encode(ctx.state))
  if not ok then error("train: state: " .. err, 0) end
  if prev and prev ~= ctx.state.checkpoint then os.remove(ctx.dir .. "/" .. prev) end
end

-- Rewrites metrics.jsonl with the history up to the checkpoint (a crash may have left later
-- lines).
local function rewrite_metrics(ctx)
  local lines = {}
  for _, h in ipairs(ctx.state.history) do lines[#lines + 1] = json.encode(h) .. "\n" end
  assert(core.fs.write(ctx.dir .. "/metrics.jsonl", table.concat(lines)))
end

-- The default load: the model from the checkpoint state.json names, the value head from
-- state.json; returns the state, or nil when the run has no state.json.
function M.load(ctx)
  local f = io.open(ctx.dir .. "/state.json", "r")
  if not f then return nil end
  local state = json.decode(f:read("a"))
  f:close()
  if type(state) ~= "table" or type(state.checkpoint) ~= "string" then
    error("train: " .. ctx.dir .. "/state.json is not a trainer state", 0)
  end
  local step, err = ctx.model:load_checkpoint(ctx.dir .. "/" .. state.checkpoint)
  if not step then error("train: resume: " .. err, 0) end
  if step ~= state.step then error("train: resume: checkpoint and state.json disagree", 0) end
  if ctx.value then
    if type(state.value_head) ~= "table" then
      error("train: resume: state.json has no value head (the run did not use gae)", 0)
    end
    ctx.value = critic.from(state.value_head)
  end
  ctx.state = state
  rewrite_metrics(ctx)
  return state
end

-- A fresh run replaces what an earlier run of the same name left.
function M.clear(ctx)
  local f = io.open(ctx.dir .. "/state.json", "r")
  if f then
    local old = json.decode(f:read("a"))
    f:close()
    if type(old) == "table" and type(old.checkpoint) == "string" then
      os.remove(ctx.dir .. "/" .. old.checkpoint)
    end
    os.remove(ctx.dir .. "/state.json")
  end
  for _, name in ipairs { "metrics.jsonl", "episodes.jsonl", "curve.svg" } do
    os.remove(ctx.dir .. "/" .. name)
  end
end

return M
