-- moonrl.runs: the runs of a folder as a terminal table, and two runs side by side (`moonrl runs`).
--
--   runs.list(dir) -> rows | nil, message   one row per run folder under dir (sorted by name):
--       {name =, dir =, steps =, before =, after =, seconds =, reward =, problems = {...}}
--   runs.table(rows) -> text                 the table, then each run's problems
--   runs.compare(a, b) -> text | nil, message   the key metrics of two run folders and the
--       options that differ
--   runs.main(args)                          the command: runs [DIR] | runs --compare A B
-- A folder is a run when it holds metrics.jsonl, state.json or episodes.jsonl; one whose files
-- cannot be read (a broken line, no metrics) is listed with its problems, and the others go on.
local core = require "moonrl.core"
local report = require "moonrl.report"

local M = {}

local pct = report.percent

-- The row of one run folder (report.read's figures), or nil when dir is not a run.
local function row(dir, name)
  local run, err = report.read(dir, { episodes = false })
  if not run then
    if err:find("not a run folder", 1, true) then return nil end
    return { name = name, dir = dir, problems = { err } }
  end
  if #run.history == 0 and #run.problems == 0 then run.problems[1] = "metrics.jsonl has no rows" end
  local s = report.summary(run)
  return { name = name, dir = dir, steps = #run.history > 0 and s.steps or nil, before = s.before,
    after = s.after, seconds = s.seconds, reward = s.reward, problems = run.problems, run = run }
end

function M.list(dir)
  if type(dir) ~= "string" then error("runs.list: dir: a string expected, got " .. type(dir), 2) end
  local names, err = core.fs.list(dir)
  if not names then return nil, err end
  local rows = {}
  for _, name in ipairs(names) do
    local path = dir .. "/" .. name
    if core.fs.list(path) then
      local r = row(path, name)
      if r then rows[#rows + 1] = r end
    end
  end
  return rows
end

-- Text padded to width w (by characters, so that UTF-8 names line up).
local function pad(s, w, right)
  local n = utf8.len(s) or #s
  local fill = string.rep(" ", math.max(0, w - n))
  return right and fill .. s or s .. fill
end

-- Lines of a table: header and rows of cells, the first column left-aligned.
local function columns(header, cells)
  local widths = {}
  for _, r in ipairs({ header, table.unpack(cells) }) do
    for i, c in ipairs(r) do widths[i] = math.max(widths[i] or 0, utf8.len(c) or #c) end
  end
  local out = {}
  for _, r in ipairs({ header, table.unpack(cells) }) do
    local line = {}
    for i, c in ipairs(r) do line[i] = pad(c, widths[i], i > 1) end
    out[#out + 1] = (table.concat(line, "  "):gsub("%s+$", ""))
  end
  return out
end

function M.table(rows)
  if type(rows) ~= "table" then error("runs.table: rows: a table expected, got " .. type(rows), 2) end
  if #rows == 0 then return "no runs\n" end
  local cells = {}
  for _, r in ipairs(rows) do
    cells[#cells + 1] = { report.utf8_clean(r.name), r.steps and tostring(r.steps) or "-", pct(r.before),
      pct(r.after), report.duration(r.seconds), r.reward and string.format("%.3f", r.reward) or "-",
      #r.problems > 0 and "broken" or "" }
  end
  local out = columns({ "run", "steps", "held-out before", "after", "time", "reward", "" }, cells)
  for _, r in ipairs(rows) do
    for i, p in ipairs(r.problems) do
      if i > 3 then
        out[#out + 1] = string.format("%s: ... and %d more problems", report.utf8_clean(r.name),
          #r.problems - 3)
        break
      end
      out[#out + 1] = report.utf8_clean(r.name .. ": " .. p)
    end
  end
  return table.concat(out, "\n") .. "\n"
end

-- The value of a metric at the run's last step that has it.
local function last_of(run, key)
  for i = #run.history, 1, -1 do
    local v = run.history[i][key]
    if type(v) == "number" then return v, run.history[i].step end
  end
end

-- The mean of a metric over the last n steps that have it.
local function tail_mean(run, key, n)
  local sum, k = 0, 0
  for i = #run.history, 1, -1 do
    local v = run.history[i][key]
    if type(v) == "number" and run.history[i].step > 0 then
      sum, k = sum + v, k + 1
      if k == n then break end
    end
  end
  return k > 0 and sum / k or nil
end

local KEY_METRICS = { "success", "reward/mean", "eval/greedy_success", "eval/sample_success",
  "eval/pass_at_k", "loss/entropy", "loss/kl", "loss/grad_norm", "loss/clipfrac", "turns_mean",
  "length_mean", "tokens_per_s", "time/step" }

local function read_run(path)
  local run, err = report.read(path, { episodes = false })
  if not run then return nil, err end
  if #run.history == 0 then
    local why = #run.problems > 0 and " (" .. table.concat(run.problems, "; ") .. ")" or ""
    return nil, path .. ": no metrics" .. why
  end
  return run
end

local function fmt(v)
  if v == nil then return "-" end
  if type(v) ~= "number" then return tostring(v) end
  if v == math.floor(v) and math.abs(v) < 1e9 then return string.format("%d", v) end
  return string.format("%.4g", v)
end

function M.compare(a, b)
  if type(a) ~= "string" then error("runs.compare: a: a string expected, got " .. type(a), 2) end
  if type(b) ~= "string" then error("runs.compare: b: a string expected, got " .. type(b), 2) end
  local ra, err = read_run(a)
  if not ra then return nil, err end
  local rb, berr = read_run(b)
  if not rb then return nil, berr end
  local sa, sb = report.summary(ra), report.summary(rb)
  local cells = {
    { "steps", fmt(sa.steps), fmt(sb.steps) },
    { "held-out greedy success before", pct(sa.before), pct(sb.before) },
    { "held-out greedy success after", pct(sa.after), pct(sb.after) },
    { "time", report.duration(sa.seconds), report.duration(sb.seconds) },
  }
  for _, k in ipairs(KEY_METRICS) do
    local va, vb = last_of(ra, k), last_of(rb, k)
    if va or vb then cells[#cells + 1] = { k .. " (last)", fmt(va), fmt(vb) } end
    if k == "success" or k == "reward/mean" then
      cells[#cells + 1] = { k .. " (mean of last 10 steps)", fmt(tail_mean(ra, k, 10)),
        fmt(tail_mean(rb, k, 10)) }
    end
  end
  local out = columns({ "", report.utf8_clean(ra.name), report.utf8_clean(rb.name) }, cells)
  if ra.options and rb.options then
    local diff = require("moonrl.train.options").differences(ra.options, rb.options)
    out[#out + 1] = #diff == 0 and "options: the same" or "options that differ: " .. table.concat(diff, ", ")
  end
  for _, r in ipairs({ ra, rb }) do
    for _, p in ipairs(r.problems) do out[#out + 1] = report.utf8_clean(r.name .. ": " .. p) end
  end
  return table.concat(out, "\n") .. "\n"
end

local USAGE = "usage: moonrl runs [DIR]            the runs in DIR (default runs)\n"
  .. "       moonrl runs --compare A B    two run folders' key metrics side by side\n"

-- `moonrl runs ...`: prints the table or the comparison; returns true, or false after naming
-- on stderr what went wrong (a folder that is not there, bad arguments).
function M.main(args)
  local function fail(msg)
    io.stderr:write("moonrl runs: ", msg, "\n")
    return false
  end
  if args[1] == "-h" or args[1] == "--help" then
    io.stdout:write(USAGE)
    return true
  end
  if args[1] == "--compare" then
    if #args ~= 3 then return fail("--compare needs two run folders\n" .. USAGE) end
    local text, err = M.compare(args[2], args[3])
    if not text then return fail(err) end
    io.stdout:write(text)
    return true
  end
  if #args > 1 or (args[1] and args[1]:sub(1, 1) == "-") then
    return fail("unknown arguments: " .. table.concat(args, " ") .. "\n" .. USAGE)
  end
  local rows, err = M.list(args[1] or "runs")
  if not rows then return fail(err) end
  io.stdout:write(M.table(rows))
  return true
end

return M
