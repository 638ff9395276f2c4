-- moonrl.train.checkpoint: the checkpoint stage: state.json (the step, the metrics history, the
-- value head, ...) with one checkpoint-<step>.bin of the model (weights and AdamW state),
-- written atomically, and resume from them bit-exactly.
--
-- The `checkpoint` option replaces the stage: a table {save = function(ctx, step), load =
-- function(ctx) -> state or nil}. save persists ctx.state (a JSON-ready table), the model, the
-- value head (ctx.value) and TT-OPD's teacher (ctx.teacher) at the end of `step`; load, on
-- resume, restores the model and returns the state saved last (nil when there is none: the run
-- starts fresh).
local core = require "moonrl.core"
local critic = require "moonrl.train.critic"
local teacher = require "moonrl.train.teacher"

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
  if ctx.teacher then teacher.save(ctx, step) end -- TT-OPD's teacher, teacher-<step>.bin
  ok, err = core.fs.write(ctx.dir .. "/state.json", json.encode(ctx.state))
  if not ok then error("train: " .. err, 0) end -- err names the file
  if prev and prev ~= ctx.state.checkpoint then os.remove(ctx.dir .. "/" .. prev) end
end

-- Rewrites metrics.jsonl with the history up to the checkpoint (a crash may have left later
-- lines).
local function rewrite_metrics(ctx)
  local lines = {}
  for _, h in ipairs(ctx.state.history) do lines[#lines + 1] = json.encode(h) .. "\n" end
  local ok, err = core.fs.write(ctx.dir .. "/metrics.jsonl", table.concat(lines))
  if not ok then error("train: " .. err, 0) end
end

-- state.json of the run in dir: the state, or nil when there is none, or nil and a message when
-- it is not a trainer state.
function M.read_state(dir)
  local path = dir .. "/state.json"
  local f = io.open(path, "r")
  if not f then return nil end
  local text = f:read("a")
  f:close()
  local state = text and json.decode(text)
  if type(state) ~= "table" or type(state.checkpoint) ~= "string" or math.type(state.step) ~= "integer" then
    return nil, path .. " is not a trainer state"
  end
  return state
end

-- The default load: the model from the checkpoint state.json names, the value head from
-- state.json; returns the state, or nil when the run has no state.json.
function M.load(ctx)
  local state, err = M.read_state(ctx.dir)
  if err then error("train: resume: " .. err, 0) end
  if not state then return nil end
  local step
  step, err = ctx.model:load_checkpoint(ctx.dir .. "/" .. state.checkpoint)
  if not step then error("train: resume: " .. err, 0) end
  if step ~= state.step then error("train: resume: checkpoint and state.json disagree", 0) end
  if ctx.value then
    if type(state.value_head) ~= "table" then
      error("train: resume: state.json has no value head (the run did not use gae)", 0)
    end
    ctx.value = critic.from(state.value_head)
  end
  if ctx.cfg.teacher then teacher.load(ctx, state) end
  ctx.state = state
  rewrite_metrics(ctx)
  return state
end

-- ---------------------------------------------------------------- the run folder

-- The files a run writes in its folder, besides the checkpoint state.json names.
local RUN_FILES = { "state.json", "metrics.jsonl", "episodes.jsonl", "curve.svg",
  "diagnostics.svg", "reward.svg", "report.html", "reward.log", "judge_cache.jsonl",
  "reference/config.json", "reference/model.safetensors" }

local function exists(path)
  local f = io.open(path, "r")
  if f then f:close() end
  return f ~= nil
end

-- The run files an earlier run left in dir (names relative to it); nothing else there is the
-- trainer's.
function M.leftovers(dir)
  local found = {}
  local state = M.read_state(dir)
  if state and exists(dir .. "/" .. state.checkpoint) then found[#found + 1] = state.checkpoint end
  if state and type(state.teacher) == "string" and exists(dir .. "/" .. state.teacher) then
    found[#found + 1] = state.teacher
  end
  for _, name in ipairs(RUN_FILES) do
    if exists(dir .. "/" .. name) then found[#found + 1] = name end
  end
  return found
end

-- Removes what M.leftovers finds (overwrite = true); other files in dir stay.
function M.clear(dir)
  for _, name in ipairs(M.leftovers(dir)) do
    local ok, err = os.remove(dir .. "/" .. name)
    if not ok then error("train: overwrite: " .. err, 0) end
  end
  os.remove(dir .. "/reference") -- the folder, when it is empty now
end

return M
