-- moonrl.train.log: the logging stage: metrics.jsonl (one line per step), episodes.jsonl (a few
-- episodes per step, turn by turn), curve.svg (train and held-out success), diagnostics.svg (the
-- run's health, four panels: batch use, turns, gradient norm, seconds per phase), reward.svg
-- (each reward graph term's mean, with reward = g), report.html (moonrl.report: every metric,
-- the options, an episode browser) and the progress line.
--
-- The `log` option replaces the stage: a function(ctx, step, metrics, batch) called once per step
-- (step 0 too, after SFT and the first evaluation, with batch nil) once the step's metrics are
-- complete; ctx.state.history holds every step's metrics so far.
local core = require "moonrl.core"
local plot = require "moonrl.plot"
local report = require "moonrl.report"

local json = core.json
local M = {}

-- Appends text to the file at path; a failure to open, write or close it (a full disk) raises
-- "train: <path>: <why>".
local function append(path, text)
  local f, err = io.open(path, "a")
  if not f then error("train: " .. err, 0) end
  local ok, werr = f:write(text)
  local closed, cerr = f:close()
  if not ok or not closed then error("train: " .. path .. ": " .. tostring(werr or cerr), 0) end
end
M.append = append

-- One line of metrics.jsonl.
function M.metrics(ctx, mt)
  append(ctx.dir .. "/metrics.jsonl", json.encode(mt) .. "\n")
end

-- The step's episodes in episodes.jsonl: the first episode of each group, then the second of
-- each, ... up to log_episodes.
function M.episodes(ctx, step, batch)
  local c = ctx.cfg
  local lines = {}
  local groups, logged, round = batch:groups(), 0, 1
  while logged < math.min(c.log_episodes, batch:size()) do
    for _, g in ipairs(groups) do
      local i = g.members[round]
      if i and logged < c.log_episodes then
        local rec = batch:episode_record(i, { tokens = false })
        rec.step = step
        lines[#lines + 1] = json.encode(rec) .. "\n"
        logged = logged + 1
      end
    end
    round = round + 1
  end
  if #lines > 0 then append(ctx.dir .. "/episodes.jsonl", table.concat(lines)) end
end

-- curve.svg from the history: sampled training success and held-out greedy success (raises
-- "train: <path>: <why>" when it cannot be written).
function M.plot(ctx)
  local train, held = {}, {}
  for _, h in ipairs(ctx.state.history) do
    if h.success then train[#train + 1] = { h.step, h.success } end
    if h["eval/greedy_success"] then held[#held + 1] = { h.step, h["eval/greedy_success"] } end
  end
  local c = ctx.cfg
  local ok, err = plot.svg(ctx.dir .. "/curve.svg", {
    title = c.name .. ": success (step 0 = after SFT, before RL)", xlabel = "RL step",
    ylabel = "success rate", ymin = 0, ymax = 1,
    series = { { name = "train (sampled)", points = train },
      { name = "held-out (greedy)", points = held, dots = true } },
    marks = { { x = 0, label = "RL starts" } } })
  if not ok then error("train: " .. err, 0) end
end

-- The points {step, value} of one metric over the history (the steps that have it).
local function points(history, key)
  local pts = {}
  for _, h in ipairs(history) do
    if type(h[key]) == "number" then pts[#pts + 1] = { h.step, h[key] } end
  end
  return pts
end

-- The series of `list` ({name, key, dots =}) that have points.
local function present(history, list)
  local out = {}
  for _, e in ipairs(list) do
    local pts = points(history, e[2])
    if #pts > 0 then out[#out + 1] = { name = e[1], points = pts, dots = e.dots } end
  end
  return out
end

-- The diagnostics' panels from the history (see M.plot_diagnostics).
function M.diagnostics_panels(history)
  local spikes = {}
  for _, h in ipairs(history) do
    if h["grad/spike"] == 1 then
      spikes[#spikes + 1] = { h.step, h["loss/grad_norm_max"] or h["loss/grad_norm"] }
    end
  end
  local grad = present(history, { { "mean per step", "loss/grad_norm" },
    { "max per step", "loss/grad_norm_max" }, { "running median", "grad/norm_median" } })
  if #spikes > 0 then
    grad[#grad + 1] = { name = "spike", points = spikes, dots = true, line = false, color = "#d62728" }
  end
  return {
    { title = "batch use", xlabel = "RL step", ylabel = "fraction", ymin = 0, ymax = 1,
      series = present(history, { { "utilisation", "adv/utilisation" },
        { "zero-var. groups", "zero_variance_groups" }, { "tool calls / turn", "tool_calls_per_turn" },
        { "gate cut rate", "gate/cut_rate" }, { "gate precision", "gate/precision" } }) },
    { title = "turns per episode", xlabel = "RL step", ylabel = "turns", ymin = 0,
      series = present(history, { { "mean", "turns_mean" }, { "max", "turns_max" } }) },
    { title = "gradient norm (before clipping)", xlabel = "RL step", ylabel = "norm", ymin = 0,
      series = grad },
    { title = "seconds per step", xlabel = "RL step", ylabel = "seconds", ymin = 0,
      series = present(history, { { "step", "time/step" }, { "rollout", "time/rollout" },
        { "reward", "time/reward" }, { "update", "time/update" },
        { "eval", "time/eval", dots = true } }) },
  }
end

-- diagnostics.svg from the history: four panels (raises "train: <path>: <why>" when it cannot
-- be written): batch use (adv/utilisation, zero_variance_groups, tool_calls_per_turn, and
-- gate/cut_rate, gate/precision with a gate), turns per episode (turns_mean, turns_max),
-- gradient norm (loss/grad_norm, loss/grad_norm_max, grad/norm_median, the grad/spike steps
-- marked) and seconds per step (time/step, time/rollout, time/reward, time/update, time/eval).
function M.plot_diagnostics(ctx)
  local ok, err = plot.panels_svg(ctx.dir .. "/diagnostics.svg", {
    title = ctx.cfg.name .. ": diagnostics", columns = 2,
    panels = M.diagnostics_panels(ctx.state.history) })
  if not ok then error("train: " .. err, 0) end
end

-- reward.svg from the history: each term of the reward graph, its mean per step (raises
-- "train: <path>: <why>" when it cannot be written).
function M.plot_reward(ctx)
  local g = ctx.graph
  local series = {}
  for _, t in ipairs(g.terms) do
    local pts = {}
    for _, h in ipairs(ctx.state.history) do
      local v = h["reward/" .. t.name .. "/mean"]
      if v then pts[#pts + 1] = { h.step, v } end
    end
    series[#series + 1] = { name = string.format("%s (w %g)", t.name, t.weight), points = pts }
  end
  local ok, err = plot.svg(ctx.dir .. "/reward.svg", {
    title = ctx.cfg.name .. ": reward terms (" .. g.name .. ")", xlabel = "RL step",
    ylabel = "term mean over the batch", series = series })
  if not ok then error("train: " .. err, 0) end
end

-- report.html (moonrl.report) from the history in memory and episodes.jsonl (raises
-- "train: <path>: <why>" when it cannot be written).
function M.report(ctx)
  local ok, err = report.write(ctx.dir, { history = ctx.state.history,
    options = ctx.state.options or {}, sft = ctx.state.sft, name = ctx.cfg.name })
  if not ok then error("train: " .. err, 0) end
end

-- Whether report.html is rewritten at the end of this step: at step 0, at each checkpoint step
-- (every checkpoint_every, else eval.every, else 10 steps) and at the last step.
local function report_due(c, step)
  local every = c.checkpoint_every or (c.eval and c.eval.every) or 10
  return step == 0 or step % every == 0 or step == c.steps or step == c.stop_after
end

-- The progress line (a bar on a terminal, plain lines otherwise).
function M.progress(ctx, step, mt)
  local c = ctx.cfg
  local elapsed = core.clock() - ctx.t_start
  local done = step / c.steps
  local eta = done > 0 and elapsed / done * (1 - done) or 0
  local text = string.format("step %d/%d  reward %.3f  success %.2f  tok/s %.0f  ETA %d:%02d",
    step, c.steps, mt["reward/mean"] or 0, mt.success or 0, mt.tokens_per_s or 0, math.floor(eta / 60),
    math.floor(eta % 60))
  if mt["eval/greedy_success"] then
    text = text .. string.format("  held-out %.2f", mt["eval/greedy_success"])
  end
  if ctx.tty then
    local width = 20
    local fill = math.floor(done * width + 0.5)
    io.stdout:write("\r\27[K[", string.rep("#", fill), string.rep(".", width - fill), "] ", text)
    if step == c.steps then io.stdout:write("\n") end
  else
    io.stdout:write(text, "\n")
  end
  io.stdout:flush()
end

-- The default stage: the metrics line; for an RL step also its episodes, the progress line
-- (with progress) and the curve (unless plot = false); report.html at step 0, each checkpoint
-- step and the last (unless plot = false).
function M.step(ctx, step, mt, batch)
  local c = ctx.cfg
  if batch then M.episodes(ctx, step, batch) end
  M.metrics(ctx, mt)
  if c.plot ~= false and report_due(c, step) then M.report(ctx) end
  if step == 0 then return end
  if c.progress then M.progress(ctx, step, mt) end
  if c.plot ~= false then
    M.plot(ctx)
    M.plot_diagnostics(ctx)
    if ctx.graph then M.plot_reward(ctx) end
  end
end

return M
