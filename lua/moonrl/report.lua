-- moonrl.report: report.html of a run folder: one self-contained page (inline SVG, a little
-- JavaScript, no network) with every metric of metrics.jsonl plotted against the step in groups,
-- the run's options (state.json) and an episode browser over episodes.jsonl.
--
--   report.read(dir [, opts]) -> run | nil, message   what the page shows, read from the folder
--   report.html(run) -> string                         the page
--   report.write(dir [, opts]) -> path | nil, message  reads dir, writes dir/report.html
--   report.groups(keys) -> {{id =, title =, keys = {...}}, ...}   the plot groups of metric names
--
-- opts: episode_steps (how many logged steps' episodes the page embeds, evenly spaced over the
-- run with the first and the last included; default 60), text_limit (the longest action or
-- observation text kept, in bytes; default 2000), history, options and sft (the trainer's
-- in-memory copies, so that a report during a run need not re-read metrics.jsonl and state.json),
-- name (the run's name on the page; default the folder's), episodes = false (leaves
-- episodes.jsonl unread: `moonrl runs` needs only the metrics).
-- A line that is not JSON, invalid UTF-8 and a missing file are reported on the page and
-- skipped; only a folder that is not there or holds no run file is an error.
local core = require "moonrl.core"
local argcheck = require "moonrl.argcheck"
local tick_step = require("moonrl.plot").tick_step

local json = core.json
local M = {}

M.EPISODE_STEPS = 60
M.TEXT_LIMIT = 2000

-- ---------------------------------------------------------------- text

-- s with every byte sequence that is not UTF-8 replaced by U+FFFD.
local function utf8_clean(s)
  if utf8.len(s) then return s end
  local out, i = {}, 1
  while i <= #s do
    local n, bad = utf8.len(s, i)
    if n then
      out[#out + 1] = s:sub(i)
      break
    end
    out[#out + 1] = s:sub(i, bad - 1)
    out[#out + 1] = "\u{FFFD}"
    i = bad + 1
  end
  return table.concat(out)
end
M.utf8_clean = utf8_clean

local ESC = { ["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;", ['"'] = "&quot;", ["'"] = "&#39;" }

-- Text for HTML: UTF-8 (U+FFFD for what is not) and escaped.
local function esc(s)
  return (utf8_clean(tostring(s)):gsub("[&<>\"']", ESC))
end
M.escape = esc

-- s cut to limit bytes (at a character boundary) with how much was left out.
local function cap(s, limit)
  if #s <= limit then return s end
  local cut = limit
  while cut > 0 and (s:byte(cut + 1) or 0) & 0xC0 == 0x80 do cut = cut - 1 end
  return s:sub(1, cut) .. string.format(" ... (%d more bytes)", #s - cut)
end

-- A JSON-ready copy of v for the page: strings made UTF-8 and capped, non-finite numbers as
-- strings, nesting below 6 levels left out.
local function clean(v, limit, depth)
  local t = type(v)
  if t == "string" then return cap(utf8_clean(v), limit) end
  if t == "number" then
    if v ~= v or v == math.huge or v == -math.huge then return tostring(v) end
    return v
  end
  if t == "boolean" or v == json.null then return v end
  if t ~= "table" or depth > 6 then return nil end
  local out, n = {}, #v
  if n > 0 then
    for i = 1, n do out[i] = clean(v[i], limit, depth + 1) end
    return json.array(out)
  end
  for k, x in pairs(v) do
    if type(k) == "string" then out[utf8_clean(k)] = clean(x, limit, depth + 1) end
  end
  return out
end

-- ---------------------------------------------------------------- reading a run folder

local function is_dir(path) return core.fs.list(path) ~= nil end

local function read_file(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local text = f:read("a")
  f:close()
  return text
end

-- The objects of a JSONL file, and the problems of its lines ("<file> line <n>: <why>"); nil
-- when the file is not there.
local function read_jsonl(path, name, problems)
  local f = io.open(path, "rb")
  if not f then return nil end
  local rows, n = {}, 0
  for line in f:lines() do
    n = n + 1
    if line:match("%S") then
      local v, err = json.decode(line)
      if type(v) ~= "table" then
        problems[#problems + 1] = string.format("%s line %d: %s", name, n,
          err and ("not JSON (" .. err .. ")") or "not a JSON object")
      else
        rows[#rows + 1] = v
      end
    end
  end
  f:close()
  return rows
end

local function is_step(v) return math.type(v) == "integer" or (type(v) == "number" and v == math.floor(v)) end

-- The steps (sorted) whose episodes the page embeds: all when there are at most `limit`,
-- else `limit` of them evenly spaced, the first and the last included.
local function chosen_steps(steps, limit)
  if #steps <= limit then return steps end
  local out = {}
  for i = 1, limit do
    local k = limit == 1 and #steps or 1 + math.floor((i - 1) * (#steps - 1) / (limit - 1) + 0.5)
    out[#out + 1] = steps[k]
  end
  return out
end

local READ_OPTS = { { "episode_steps", M.EPISODE_STEPS, argcheck.integer(1) },
  { "text_limit", M.TEXT_LIMIT, argcheck.integer(16) }, { "history", nil, argcheck.table },
  { "options", nil, argcheck.table }, { "sft", nil, argcheck.table }, { "name", nil, argcheck.string },
  { "episodes", true, argcheck.boolean } }

-- report.read(dir [, opts]) -> run | nil, message. run = {dir =, name =, history = {metrics rows
-- sorted by step}, options =, sft =, episodes = {...}, episodes_total =, steps_logged =,
-- steps_shown =, problems = {"<file> line <n>: <why>", ...}}.
function M.read(dir, opts)
  if type(dir) ~= "string" then error("report.read: dir: a string expected, got " .. type(dir), 2) end
  opts = argcheck.fields("report.read", opts or {}, READ_OPTS, 2)
  dir = dir:gsub("(.)/+$", "%1")
  if not is_dir(dir) then return nil, dir .. ": no such folder" end
  local problems = {}
  local run = { dir = dir, name = opts.name or dir:match("[^/]+$") or dir, problems = problems }
  local have = false

  -- (the trainer passes what state.json holds: it need not be read again)
  local stext = not opts.options and read_file(dir .. "/state.json")
  if stext then
    have = true
    local state, err = json.decode(stext)
    if type(state) ~= "table" then
      problems[#problems + 1] = "state.json: "
        .. (err and ("not JSON (" .. err .. ")") or "not a JSON object")
    else
      run.options = type(state.options) == "table" and state.options or nil
      run.sft = type(state.sft) == "table" and state.sft or nil
    end
  end
  if opts.options then run.options, run.sft = opts.options, opts.sft end

  local history = opts.history
  if not history then
    history = read_jsonl(dir .. "/metrics.jsonl", "metrics.jsonl", problems)
    if history then have = true else problems[#problems + 1] = "no metrics.jsonl" end
  end
  local rows = {}
  for i, h in ipairs(history or {}) do
    if is_step(h.step) then
      rows[#rows + 1] = h
    else
      problems[#problems + 1] = string.format("metrics.jsonl row %d: no integer \"step\"", i)
    end
  end
  table.sort(rows, function(a, b) return a.step < b.step end)
  run.history = rows

  local limit = opts.text_limit
  local eps
  if opts.episodes then
    eps = read_jsonl(dir .. "/episodes.jsonl", "episodes.jsonl", problems)
  else
    local f = io.open(dir .. "/episodes.jsonl", "rb")
    if f then
      f:close()
      have = true
    end
  end
  run.episodes, run.episodes_total, run.steps_logged, run.steps_shown = {}, 0, 0, 0
  if eps then
    have = true
    local by_step, steps = {}, {}
    for _, e in ipairs(eps) do
      local s = is_step(e.step) and e.step or -1
      if not by_step[s] then
        by_step[s] = {}
        steps[#steps + 1] = s
      end
      local list = by_step[s]
      list[#list + 1] = e
    end
    table.sort(steps)
    local shown = chosen_steps(steps, opts.episode_steps)
    for _, s in ipairs(shown) do
      for _, e in ipairs(by_step[s]) do run.episodes[#run.episodes + 1] = clean(e, limit, 0) end
    end
    run.episodes_total, run.steps_logged, run.steps_shown = #eps, #steps, #shown
    run.episode_steps = opts.episode_steps
  end
  if not have and not opts.history then
    return nil, dir .. ": not a run folder (no metrics.jsonl, state.json or episodes.jsonl)"
  end
  return run
end

-- ---------------------------------------------------------------- the run's figures

-- The run's figures: {steps = the last step, before = held-out greedy success at step 0 (or the
-- first evaluation), after = at the last evaluation after it, reward = the last RL step's
-- reward/mean, seconds = SFT + the steps' time/step} (nil where the history lacks them).
function M.summary(run)
  local s = { steps = 0 }
  local seconds, timed = 0, false
  for _, h in ipairs(run.history) do
    s.steps = math.max(s.steps, h.step)
    local held = h["eval/greedy_success"]
    if type(held) == "number" then
      if h.step == 0 or s.before == nil then s.before = s.before or held end
      s.after, s.after_step = held, h.step
    end
    if type(h["time/step"]) == "number" then seconds, timed = seconds + h["time/step"], true end
  end
  if s.after_step == 0 or s.after_step == nil then s.after, s.after_step = nil, nil end
  if run.sft and type(run.sft.seconds) == "number" then seconds, timed = seconds + run.sft.seconds, true end
  s.seconds = timed and seconds or nil
  for i = #run.history, 1, -1 do
    local h = run.history[i]
    if h.step > 0 and type(h["reward/mean"]) == "number" then
      s.reward = h["reward/mean"]
      break
    end
  end
  return s
end

-- ---------------------------------------------------------------- metric groups

local REWARD_STATS = { mean = true, std = true, min = true, max = true }

-- The group of one metric: its id and title.
local function group_of(k)
  local head, rest = k:match("^([^/]+)/(.+)$")
  if head == "reward" then
    if REWARD_STATS[rest] then return "rewards", "rewards" end
    local term, stat = rest:match("^([^/]+)/(.+)$")
    if not term or stat == "mean" then return "reward_terms", "reward terms" end
    return "reward/" .. term, "reward term: " .. term
  end
  if k == "success" or k:find("success", 1, true) or k:find("pass", 1, true) then
    return "success", "success and held-out evaluation"
  end
  if head == "eval" then return "eval", "held-out evaluation: counts and turns" end
  if k:find("clip", 1, true) then return "clip", "clip fractions" end
  if k:find("kl", 1, true) then return "kl", "KL" end
  if k:find("entropy", 1, true) then return "entropy", "entropy" end
  if head == "grad" or k:find("grad_norm", 1, true) then return "grad", "gradient norm" end
  if k == "loss/lr" then return "lr", "learning rate" end
  if k == "loss/updates" or k == "episodes" or k == "sampled_tokens" or k == "errors" then
    return "batch", "batch: episodes, sampled tokens, updates, errors"
  end
  if head == "loss" then return "loss", "losses" end
  if k:match("^length") or k:match("^turns") or head == "tokens" then return "lengths", "lengths" end
  if head == "end" then return "end", "terminations (episodes per end reason)" end
  if head == "time" then return "time", "timings (seconds)" end
  if k == "tokens_per_s" then return "throughput", "throughput (tokens per second)" end
  if head == "curriculum" or head == "tasks" or head == "sampling" then
    return "curriculum", "curriculum and task sampling"
  end
  if head == "synth" then return "synth", "task synthesis" end
  if head == "adv" then return "adv", "advantages" end
  if head then return "diag/" .. head, "diagnostics: " .. head end
  return "other", "other"
end

-- The order of the groups on the page (diagnostics after these, alphabetically).
local ORDER = { "rewards", "reward_terms", "success", "eval", "lengths", "end", "loss", "kl",
  "entropy", "grad", "clip", "lr", "batch", "adv", "time", "throughput", "curriculum", "synth" }
local RANK = {}
for i, id in ipairs(ORDER) do RANK[id] = i end

-- report.groups(keys) -> the plot groups of these metric names, in page order, each with its
-- keys sorted.
function M.groups(keys)
  local by, list = {}, {}
  for _, k in ipairs(keys) do
    if k ~= "step" then
      local id, title = group_of(k)
      local g = by[id]
      if not g then
        g = { id = id, title = title, keys = {} }
        by[id] = g
        list[#list + 1] = g
      end
      g.keys[#g.keys + 1] = k
    end
  end
  local function rank(g)
    return RANK[g.id] or (g.id:sub(1, 7) == "reward/" and 2.5) or (g.id == "other" and 1e9) or 1e6
  end
  table.sort(list, function(a, b)
    local ra, rb = rank(a), rank(b)
    if ra ~= rb then return ra < rb end
    return a.id < b.id
  end)
  for _, g in ipairs(list) do table.sort(g.keys) end
  return list
end

-- ---------------------------------------------------------------- plots (inline SVG)

local PALETTE = { "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
  "#7f7f7f", "#bcbd22", "#17becf" }
local W, H, L, R, T, B = 560, 240, 58, 12, 12, 30
local MAX_POINTS = 600

local function num(v)
  if v == math.floor(v) and math.abs(v) < 1e9 then return string.format("%d", v) end
  return string.format("%.4g", v)
end

-- The {step, value} points of a metric, at most MAX_POINTS (every k-th, the last kept).
local function series_points(history, key)
  local pts = {}
  for _, h in ipairs(history) do
    local v = h[key]
    if type(v) == "number" and v == v and v ~= math.huge and v ~= -math.huge then
      pts[#pts + 1] = { h.step, v }
    end
  end
  if #pts <= MAX_POINTS then return pts end
  local every, out = math.ceil(#pts / MAX_POINTS), {}
  for i = 1, #pts, every do out[#out + 1] = pts[i] end
  if out[#out] ~= pts[#pts] then out[#out + 1] = pts[#pts] end
  return out
end

-- One group's plot block: the SVG and an HTML legend.
local function plot_block(history, g)
  local series, xmin, xmax, ymin, ymax = {}, math.huge, -math.huge, math.huge, -math.huge
  for i, k in ipairs(g.keys) do
    local pts = series_points(history, k)
    if #pts > 0 then
      series[#series + 1] = { key = k, points = pts, color = PALETTE[(i - 1) % #PALETTE + 1],
        dash = i > #PALETTE and ' stroke-dasharray="5 3"' or "" }
      for _, p in ipairs(pts) do
        xmin, xmax = math.min(xmin, p[1]), math.max(xmax, p[1])
        ymin, ymax = math.min(ymin, p[2]), math.max(ymax, p[2])
      end
    end
  end
  if #series == 0 then return nil end
  if xmax == xmin then xmin, xmax = xmin - 0.5, xmax + 0.5 end
  if ymax == ymin then ymin, ymax = ymin - 0.5, ymax + 0.5 end
  local pad = (ymax - ymin) * 0.05
  ymin, ymax = ymin - pad, ymax + pad
  local pw, ph = W - L - R, H - T - B
  local function X(x) return L + (x - xmin) / (xmax - xmin) * pw end
  local function Y(y) return T + ph - (y - ymin) / (ymax - ymin) * ph end
  local o = {}
  local function add(fmt, ...) o[#o + 1] = string.format(fmt, ...) end
  add('<div class="plot" data-group="%s"><h3>%s</h3>', esc(g.id), esc(g.title))
  add('<svg viewBox="0 0 %d %d" width="%d" height="%d" role="img" aria-label="%s">', W, H, W, H, esc(g.title))
  local ys = tick_step(ymax - ymin, 5)
  for v = math.ceil(ymin / ys) * ys, ymax, ys do
    add('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" class="grid"/><text x="%d" y="%.1f" class="ty">%s</text>',
      L, W - R, Y(v), Y(v), L - 4, Y(v) + 4, num(math.abs(v) < ys * 1e-9 and 0 or v))
  end
  local xs = math.max(1, tick_step(xmax - xmin, 5))
  for v = math.ceil(xmin / xs) * xs, xmax, xs do
    add('<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" class="grid"/><text x="%.1f" y="%d" class="tx">%s</text>',
      X(v), X(v), T, T + ph, X(v), H - 12, num(v))
  end
  add('<rect x="%d" y="%d" width="%d" height="%d" class="frame"/>', L, T, pw, ph)
  add('<text x="%d" y="%d" class="tx">step</text>', W - R - 14, H - 1)
  for _, s in ipairs(series) do
    local coords = {}
    for i, p in ipairs(s.points) do coords[i] = string.format("%.1f,%.1f", X(p[1]), Y(p[2])) end
    add('<g class="series" stroke="%s" fill="%s"><title>%s</title>', s.color, s.color, esc(s.key))
    if #coords > 1 then
      add('<polyline fill="none" stroke-width="1.5"%s points="%s"/>', s.dash, table.concat(coords, " "))
    end
    if #coords <= 40 then
      for _, p in ipairs(s.points) do add('<circle cx="%.1f" cy="%.1f" r="2.5"/>', X(p[1]), Y(p[2])) end
    end
    add("</g>")
  end
  add("</svg><ul class=\"legend\">")
  for _, s in ipairs(series) do
    local last = s.points[#s.points]
    add('<li><span class="sw" style="background:%s"></span>%s <span class="last">%s at step %s</span></li>',
      s.color, esc(s.key), num(last[2]), num(last[1]))
  end
  add("</ul></div>")
  return table.concat(o)
end

-- ---------------------------------------------------------------- the page

local CSS = [[
body{font:14px/1.4 system-ui,sans-serif;margin:0 1.5em 2em;color:#222;background:#fff}
h1{margin:.6em 0 .2em}h2{margin:1.2em 0 .4em;border-bottom:1px solid #ccc}
h3{margin:.2em 0;font-size:14px}
.summary span{margin-right:1.5em}.note{color:#666}.problems{color:#a40000}
.plots{display:flex;flex-wrap:wrap;gap:14px}
.plot{border:1px solid #ddd;border-radius:4px;padding:6px;width:570px}
.plot svg{display:block}.grid{stroke:#eee}.frame{fill:none;stroke:#999}
.ty{font-size:10px;text-anchor:end;fill:#555}.tx{font-size:10px;text-anchor:middle;fill:#555}
.legend{list-style:none;margin:4px 0 0;padding:0;font-size:12px;columns:2}
.sw{display:inline-block;width:10px;height:10px;margin-right:4px}.last{color:#888}
table.options{border-collapse:collapse}
table.options td{border-top:1px solid #eee;padding:2px 8px;vertical-align:top}
.filters label{margin-right:1em}
.episode{border:1px solid #ddd;border-radius:4px;margin:4px 0;padding:2px 6px}
.episode.ok summary b{color:#1a7f37}.episode.fail summary b{color:#b42318}
.turns{border-collapse:collapse;width:100%;margin:4px 0}
.turns td,.turns th{border-top:1px solid #eee;padding:2px 6px;text-align:left;vertical-align:top}
.turns pre,.episode pre{margin:0;white-space:pre-wrap;word-break:break-word;font:12px/1.3 monospace}
]]

local SCRIPT = [[
(function(){
var eps=JSON.parse(document.getElementById('episode-data').textContent);
var $=function(id){return document.getElementById(id)};
function txt(v){return v===undefined||v===null?'':(typeof v==='string'?v:JSON.stringify(v))}
function el(tag,cls,text){var e=document.createElement(tag);if(cls)e.className=cls;if(text!==undefined)e.textContent=text;return e}
function pre(v){var p=el('pre');p.textContent=txt(v);return p}
var steps={},ends={};
eps.forEach(function(e){e.taskText=txt(e.task);steps[e.step]=1;ends[txt(e['end'])]=1});
function fill(sel,vals){vals.forEach(function(v){var o=el('option',null,v);o.value=v;sel.appendChild(o)})}
fill($('f-step'),Object.keys(steps).sort(function(a,b){return a-b}));
fill($('f-end'),Object.keys(ends).sort());
function turns(e){
  var t=el('table','turns'),h=el('tr');
  ['turn','action','tool call / parse','observation','reward','info'].forEach(function(c){h.appendChild(el('th',null,c))});
  t.appendChild(h);
  (Array.isArray(e.record)?e.record:[]).forEach(function(r,i){
    var tr=el('tr','turn');tr.appendChild(el('td',null,String(i+1)));
    var a=el('td');a.appendChild(pre(r.action));tr.appendChild(a);
    var p=r.parsed||{},call=txt(p.kind)+(p.name?' '+txt(p.name):'');
    if(r.tool_error)call+=' (error: '+txt(r.tool_error)+')';
    tr.appendChild(el('td',null,call));
    var o=el('td');o.appendChild(pre(r.observation));tr.appendChild(o);
    tr.appendChild(el('td',null,txt(r.reward)+(r.done?' (done)':'')));
    var inf=el('td');if(r.info)inf.appendChild(pre(r.info));tr.appendChild(inf);
    t.appendChild(tr)});
  return t}
function render(){
  var fs=$('f-step').value,fo=$('f-success').value,fe=$('f-end').value,ft=$('f-task').value.toLowerCase();
  var list=$('episodes');list.textContent='';var n=0;
  eps.forEach(function(e){
    if(fs&&String(e.step)!==fs)return;
    if(fo==='yes'&&e.success!==true)return;
    if(fo==='no'&&e.success===true)return;
    if(fe&&txt(e['end'])!==fe)return;
    if(ft&&e.taskText.toLowerCase().indexOf(ft)<0)return;
    n++;
    var d=el('details','episode '+(e.success===true?'ok':'fail'));
    var s=el('summary');
    s.appendChild(el('b',null,e.success===true?'success':'failure'));
    s.appendChild(document.createTextNode(' step '+txt(e.step)+' \u00b7 reward '+txt(e.reward)+' \u00b7 end '+txt(e['end'])+' \u00b7 '+txt(e.turns)+' turns \u00b7 task '+e.taskText));
    d.appendChild(s);
    d.addEventListener('toggle',function(){
      if(!d.open||d.dataset.built)return;d.dataset.built='1';
      if(e.reward_terms)d.appendChild(pre('reward terms: '+txt(e.reward_terms)));
      if(e.error)d.appendChild(pre('error: '+txt(e.error)));
      d.appendChild(turns(e))});
    list.appendChild(d)});
  $('ep-count').textContent=n+' of '+eps.length+' episodes';
}
['f-step','f-success','f-end'].forEach(function(id){$(id).addEventListener('change',render)});
$('f-task').addEventListener('input',render);
render();
})();
]]

-- A share as "12.3%", or "-" for none (moonrl.runs uses it too).
local function fmt_pct(v) return v and string.format("%.1f%%", 100 * v) or "-" end
M.percent = fmt_pct

-- report.seconds(s) -> "1 h 02 min", "2 min 19 s", "35 s", or "-".
function M.duration(s)
  if not s then return "-" end
  s = math.floor(s + 0.5)
  if s >= 3600 then return string.format("%d h %02d min", s // 3600, s % 3600 // 60) end
  if s >= 60 then return string.format("%d min %02d s", s // 60, s % 60) end
  return string.format("%d s", s)
end

-- report.html(run) -> the page for a run as report.read returns it.
function M.html(run)
  if type(run) ~= "table" or type(run.history) ~= "table" then
    error("report.html: run: a table from report.read expected", 2)
  end
  local o = {}
  local function add(s) o[#o + 1] = s end
  local s = M.summary(run)
  add('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">')
  add('<meta name="viewport" content="width=device-width, initial-scale=1">')
  add("<title>" .. esc(run.name) .. " - moonrl report</title><style>" .. CSS .. "</style></head><body>\n")
  add("<h1>" .. esc(run.name) .. "</h1>\n")
  add(string.format('<p class="summary"><span>steps: <b id="steps">%d</b></span><span>held-out '
    .. 'greedy success: %s &rarr; %s</span><span>last step\'s reward: %s</span><span>time: %s</span></p>\n',
    s.steps, fmt_pct(s.before), fmt_pct(s.after), s.reward and string.format("%.3f", s.reward) or "-",
    M.duration(s.seconds)))
  add('<p class="note">moonrl report of ' .. esc(run.dir) .. ', written at step ' .. s.steps
    .. ' (rebuild with <code>moonrl report ' .. esc(run.dir) .. '</code>). '
    .. '<a href="#metrics">metrics</a> &middot; <a href="#options">options</a> &middot; '
    .. '<a href="#episodes-section">episodes</a></p>\n')
  if #run.problems > 0 then
    add('<div class="problems"><h2>Problems reading the run</h2><ul>')
    for i, p in ipairs(run.problems) do
      if i > 50 then
        add(string.format("<li>... and %d more</li>", #run.problems - 50))
        break
      end
      add("<li>" .. esc(p) .. "</li>")
    end
    add("</ul></div>\n")
  end

  -- metrics
  local seen, keys = {}, {}
  for _, h in ipairs(run.history) do
    for k, v in pairs(h) do
      if type(k) == "string" and type(v) == "number" and not seen[k] then
        seen[k] = true
        keys[#keys + 1] = k
      end
    end
  end
  table.sort(keys)
  local groups = M.groups(keys)
  add(string.format('<h2 id="metrics">Metrics</h2><p class="note">%d metrics of %d rows of '
    .. 'metrics.jsonl in %d groups; step 0 is the evaluation before RL.</p><div class="plots">\n',
    #keys - (seen.step and 1 or 0), #run.history, #groups))
  for _, g in ipairs(groups) do
    local block = plot_block(run.history, g)
    if block then add(block .. "\n") end
  end
  add("</div>\n")

  -- options
  add('<h2 id="options">Options</h2>')
  if run.options then
    local names = {}
    for k in pairs(run.options) do names[#names + 1] = k end
    table.sort(names)
    add('<table class="options">')
    for _, k in ipairs(names) do
      local v = run.options[k]
      local text = type(v) == "table" and json.encode(clean(v, 4000, 0)) or tostring(v)
      add("<tr><td>" .. esc(k) .. "</td><td><code>" .. esc(text) .. "</code></td></tr>")
    end
    add("</table>\n")
  else
    add('<p class="note">The run\'s state.json records no options.</p>\n')
  end

  -- episodes
  add('<h2 id="episodes-section">Episodes</h2>')
  add(string.format('<p class="note" id="ep-cap">episodes.jsonl holds %d episodes of %d steps; '
    .. 'this page embeds the %d episodes of %d of those steps%s.</p>\n', run.episodes_total,
    run.steps_logged, #run.episodes, run.steps_shown,
    run.steps_shown < run.steps_logged and string.format(" (at most %d steps, evenly spaced, the "
      .. "first and the last included)", run.episode_steps) or ""))
  add('<div class="filters"><label>step <select id="f-step"><option value="">all</option></select></label>'
    .. '<label>outcome <select id="f-success"><option value="">all</option>'
    .. '<option value="yes">success</option>'
    .. '<option value="no">failure</option></select></label>'
    .. '<label>end <select id="f-end"><option value="">all</option></select></label>'
    .. '<label>task <input id="f-task" type="search" placeholder="text in the task"></label>'
    .. ' <span id="ep-count"></span></div><div id="episodes"></div>\n')
  local data = json.encode(json.array(run.episodes)):gsub("</", "<\\/")
  add('<script type="application/json" id="episode-data">' .. data .. "</script>\n")
  add("<script>" .. SCRIPT .. "</script>\n</body></html>\n")
  return table.concat(o)
end

-- report.write(dir [, opts]) -> the path of dir/report.html, or nil and a message. The file is
-- replaced atomically.
function M.write(dir, opts)
  if type(dir) ~= "string" then error("report.write: dir: a string expected, got " .. type(dir), 2) end
  argcheck.fields("report.write", opts or {}, READ_OPTS, 2)
  local run, err = M.read(dir, opts)
  if not run then return nil, err end
  local path = run.dir .. "/report.html"
  local ok, werr = core.fs.write(path, M.html(run))
  if not ok then return nil, werr end
  return path
end

-- `moonrl report DIR...`: rebuilds each folder's report.html and prints its path; a folder that
-- fails is named on stderr and the others go on. Returns true when every one was written.
function M.main(args)
  if #args == 0 or args[1] == "-h" or args[1] == "--help" then
    local out = #args == 0 and io.stderr or io.stdout
    out:write("usage: moonrl report RUN_DIR...  (writes RUN_DIR/report.html)\n")
    return #args > 0
  end
  local all = true
  for _, dir in ipairs(args) do
    local path, err = M.write(dir)
    if path then
      io.stdout:write(path, "\n")
    else
      io.stderr:write("moonrl report: ", err, "\n")
      all = false
    end
  end
  return all
end

return M
