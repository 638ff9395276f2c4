-- moonrl.plot: learning curves as a standalone SVG file (no plotting library needed).
--
--   plot.svg(path, {
--     title = "quickstart", xlabel = "step", ylabel = "success",
--     series = { {name = "train", points = {{x, y}, ...}, color = "#1f77b4"}, ...},
--     ymin = 0, ymax = 1,                -- optional fixed y range
--     marks = { {x = 0, label = "after SFT"} },  -- optional vertical markers
--   }) -> true | nil, message
-- A series draws a line through its points; dots = true adds a dot at each, line = false leaves
-- the line out (markers only).
--
--   plot.panels_svg(path, {title = "run", columns = 2, panels = {figure, figure, ...}})
-- lays several such figures out in a grid in one SVG file (each panel as plot.svg draws it).
local M = {}

local W, H, LEFT, RIGHT, TOP, BOTTOM = 640, 400, 60, 150, 40, 50
local PALETTE = { "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b" }

local function esc(s)
  return (tostring(s):gsub("[&<>\"]", { ["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;",
    ['"'] = "&quot;" }))
end

-- A "nice" tick step for a range (1, 2, 2.5 or 5 times a power of ten, about span / ticks);
-- moonrl.report's plots use it too.
local function tick_step(span, ticks)
  local raw = span / ticks
  local mag = 10 ^ math.floor(math.log(raw, 10))
  for _, m in ipairs { 1, 2, 2.5, 5, 10 } do
    if raw <= m * mag then return m * mag end
  end
  return 10 * mag
end

local function fmt(v)
  if v == math.floor(v) and math.abs(v) < 1e9 then return string.format("%d", v) end
  return string.format("%.3g", v)
end

-- Draws the figure's elements into a W x H box at the origin, through add (string.format's
-- arguments).
local function draw(fig, add)
  local xmin, xmax, ymin, ymax = math.huge, -math.huge, math.huge, -math.huge
  for _, s in ipairs(fig.series) do
    for _, p in ipairs(s.points) do
      xmin, xmax = math.min(xmin, p[1]), math.max(xmax, p[1])
      ymin, ymax = math.min(ymin, p[2]), math.max(ymax, p[2])
    end
  end
  if xmin == math.huge then xmin, xmax, ymin, ymax = 0, 1, 0, 1 end
  ymin, ymax = fig.ymin or ymin, fig.ymax or ymax
  if xmax == xmin then xmax = xmin + 1 end
  if ymax == ymin then ymax = ymin + 1 end
  local pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM
  local function X(x) return LEFT + (x - xmin) / (xmax - xmin) * pw end
  local function Y(y) return TOP + ph - (y - ymin) / (ymax - ymin) * ph end
  add('<text x="%d" y="22" font-size="15" text-anchor="middle">%s</text>', LEFT + pw // 2,
    esc(fig.title or ""))
  -- grid and ticks
  local ys = tick_step(ymax - ymin, 5)
  for v = math.ceil(ymin / ys) * ys, ymax + 1e-9, ys do
    add('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>', LEFT, Y(v), LEFT + pw, Y(v))
    add('<text x="%d" y="%.1f" text-anchor="end">%s</text>', LEFT - 6, Y(v) + 4, fmt(v))
  end
  local xs = tick_step(xmax - xmin, 8)
  for v = math.ceil(xmin / xs) * xs, xmax + 1e-9, xs do
    add('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#eee"/>', X(v), TOP, X(v), TOP + ph)
    add('<text x="%.1f" y="%d" text-anchor="middle">%s</text>', X(v), TOP + ph + 16, fmt(v))
  end
  add('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#333"/>', LEFT, TOP, pw, ph)
  add('<text x="%d" y="%d" text-anchor="middle">%s</text>', LEFT + pw // 2, H - 12,
    esc(fig.xlabel or ""))
  add('<text x="16" y="%d" text-anchor="middle" transform="rotate(-90 16 %d)">%s</text>',
    TOP + ph // 2, TOP + ph // 2, esc(fig.ylabel or ""))
  for _, mark in ipairs(fig.marks or {}) do
    if mark.x >= xmin and mark.x <= xmax then
      add('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#999" stroke-dasharray="4 3"/>',
        X(mark.x), TOP, X(mark.x), TOP + ph)
      add('<text x="%.1f" y="%d" fill="#666">%s</text>', X(mark.x) + 3, TOP + 12, esc(mark.label))
    end
  end
  -- series and legend
  for i, s in ipairs(fig.series) do
    local color = s.color or PALETTE[(i - 1) % #PALETTE + 1]
    local pts = {}
    for _, p in ipairs(s.points) do pts[#pts + 1] = string.format("%.1f,%.1f", X(p[1]), Y(p[2])) end
    if #pts > 1 and s.line ~= false then
      add('<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>', color,
        table.concat(pts, " "))
    end
    if s.dots or #pts == 1 or s.line == false then
      for _, p in ipairs(s.points) do
        add('<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s"/>', X(p[1]), Y(p[2]), color)
      end
    end
    local ly = TOP + 10 + (i - 1) * 20
    add('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="3"/>', LEFT + pw + 12, ly,
      LEFT + pw + 32, ly, color)
    add('<text x="%d" y="%d">%s</text>', LEFT + pw + 38, ly + 4, esc(s.name))
  end
end

local function header(add, w, h)
  add('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" '
    .. 'font-family="sans-serif" font-size="12">', w, h, w, h)
  add('<rect width="%d" height="%d" fill="white"/>', w, h)
end

local function check_figure(fig, where)
  if type(fig) ~= "table" then error(where .. ": a figure table expected, got " .. type(fig), 3) end
  if type(fig.series) ~= "table" then error(where .. ".series: a list of series expected", 3) end
end

-- The SVG text for the figure described above.
function M.render(fig)
  check_figure(fig, "plot.render: fig")
  local out = {}
  local function add(...) out[#out + 1] = string.format(...) end
  header(add, W, H)
  draw(fig, add)
  add("</svg>")
  return table.concat(out, "\n") .. "\n"
end

-- The SVG text of several figures in a grid: {title =, columns = 2, panels = {fig, ...}}, the
-- panels row by row.
function M.render_panels(opts)
  if type(opts) ~= "table" or type(opts.panels) ~= "table" or #opts.panels == 0 then
    error("plot.render_panels: panels: a non-empty list of figures expected", 2)
  end
  local columns = opts.columns or 2
  if math.type(columns) ~= "integer" or columns < 1 then
    error("plot.render_panels: columns: a positive integer expected, got " .. tostring(columns), 2)
  end
  for i, fig in ipairs(opts.panels) do check_figure(fig, "plot.render_panels: panels[" .. i .. "]") end
  columns = math.min(columns, #opts.panels)
  local rows = (#opts.panels + columns - 1) // columns
  local top = opts.title and 34 or 0
  local out = {}
  local function add(...) out[#out + 1] = string.format(...) end
  header(add, columns * W, rows * H + top)
  if opts.title then
    add('<text x="%d" y="24" font-size="17" text-anchor="middle">%s</text>', columns * W // 2,
      esc(opts.title))
  end
  for i, fig in ipairs(opts.panels) do
    local col, row = (i - 1) % columns, (i - 1) // columns
    add('<g transform="translate(%d,%d)">', col * W, top + row * H)
    draw(fig, add)
    add("</g>")
  end
  add("</svg>")
  return table.concat(out, "\n") .. "\n"
end

function M.svg(path, fig)
  return require("moonrl.core").fs.write(path, M.render(fig))
end

function M.panels_svg(path, opts)
  return require("moonrl.core").fs.write(path, M.render_panels(opts))
end

M.tick_step = tick_step
return M
