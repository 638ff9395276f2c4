-- repl_spec.lua - `moonrl repl`: through a pipe (expressions, multi-line statements, errors) and in
-- a real terminal under tmux (readline editing, tab completion, Ctrl-C, history file).
local BUILD = assert(os.getenv("MOONRL_BUILD"), "MOONRL_BUILD must name the build directory")
local MOONRL = BUILD .. "/moonrl"

local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local q, sh = H.shell_quote, H.sh


describe("moonrl repl through a pipe", function()
  local function repl(input)
    return sh("printf '%s' " .. q(input) .. " | " .. MOONRL .. " repl")
  end

  it("prints the values of bare expressions", function()
    local out, status = repl("1 + 1\n'a' .. 'b'\n1, nil, true\n")
    assert.are.equal(0, status)
    assert.truthy(out:find("> 2\n", 1, true), out)
    assert.truthy(out:find('> "ab"\n', 1, true), out)
    assert.truthy(out:find("> 1\tnil\ttrue\n", 1, true), out)
  end)

  it("continues statements over several lines", function()
    local out = repl("function double(x)\n  return 2 * x\nend\ndouble(21)\nx = 1 +\n 2\nx\n")
    assert.truthy(out:find(">> >> > 42\n", 1, true), out)
    assert.truthy(out:find(">> > 3\n", 1, true), out)
  end)

  it("has rl loaded and shows tables and tensors readably", function()
    local out = repl("rl.tensor.zeros{2, 3}:shape()\nrl.tensor.ones{2}\n{a = 1, 'x'}\n")
    assert.truthy(out:find("> {2, 3}\n", 1, true), out)
    assert.truthy(out:find("tensor(2)\n[1, 1]\n", 1, true), out)
    assert.truthy(out:find('{"x", a = 1}', 1, true), out)
  end)

  it("reports an error and keeps going", function()
    local out, status = repl("error('boom')\nlocal = 1\n40 + 2\n")
    assert.are.equal(0, status)
    assert.truthy(out:find("boom", 1, true), out)
    assert.truthy(out:find("stack traceback", 1, true), out)
    assert.truthy(out:find("<name> expected near '='", 1, true), out)
    assert.truthy(out:find("> 42\n", 1, true), out)
  end)
end)

-- A REPL in a detached tmux session: keys go in with send-keys, the screen comes back with
-- capture-pane.
local Term = {}
Term.__index = Term

-- Starts `moonrl repl` (or `moonrl` followed by `args` when given) in a new tmux server.
function Term.start(history, args)
  local self = setmetatable({}, Term)
  self.socket = "moonrl-test-" .. tostring(os.time()) .. "-" .. tostring(math.random(1e9))
  local cmd = "MOONRL_HISTORY=" .. q(history) .. " " .. MOONRL .. " " .. (args or "repl")
  local out, status = sh("tmux -L " .. self.socket .. " new-session -d -x 120 -y 40 " .. q(cmd))
  assert(status == 0, "tmux could not start: " .. out)
  assert(self:wait_for("\n> "), "no prompt:\n" .. self:screen())
  return self
end

function Term:screen()
  return (sh("tmux -L " .. self.socket .. " capture-pane -p -N"))
end

function Term:keys(...)
  local args = {}
  for _, k in ipairs { ... } do args[#args + 1] = q(k) end
  sh("tmux -L " .. self.socket .. " send-keys " .. table.concat(args, " "))
end

-- Polls the screen (trailing spaces kept) until it matches the Lua pattern, for up to about 5
-- seconds.
function Term:wait_for(pattern)
  for _ = 1, 100 do
    if self:screen():find(pattern) then return true end
    sh("sleep 0.05")
  end
  return false
end

function Term:stop()
  sh("tmux -L " .. self.socket .. " kill-server")
end

describe("moonrl repl in a terminal #tmux", function()
  local history, term

  before_each(function()
    history = os.tmpname()
    term = Term.start(history)
  end)

  after_each(function()
    term:stop()
    os.remove(history)
  end)

  it("is what moonrl starts without arguments on a terminal", function()
    local plain = Term.start(history, "")
    plain:keys("rl.version", "Enter")
    local ok = plain:wait_for('\n"0%.1%.0" *\n')
    local screen = plain:screen()
    plain:stop()
    assert.truthy(ok, screen)
  end)

  it("completes globals and fields with Tab", function()
    term:keys("t = rl.tensor.ze", "Tab")
    assert.truthy(term:wait_for("t = rl%.tensor%.zeros"), term:screen())
    term:keys("{3}", "Enter", "t:num", "Tab")
    assert.truthy(term:wait_for("> t:numel"), term:screen())
    term:keys("()", "Enter")
    assert.truthy(term:wait_for("\n3 *\n"), term:screen())
  end)

  it("interrupts running code with Ctrl-C and returns to the prompt", function()
    term:keys("while true do end", "Enter")
    sh("sleep 0.3")
    term:keys("C-c")
    assert.truthy(term:wait_for("interrupted!"), term:screen())
    term:keys("6 * 7", "Enter")
    assert.truthy(term:wait_for("\n42 *\n"), term:screen())
  end)

  it("clears the line being typed on Ctrl-C, including an unfinished statement", function()
    term:keys("function f()", "Enter")
    assert.truthy(term:wait_for("\n>> "), term:screen())
    term:keys("C-c")
    assert.truthy(term:wait_for("%^C"), term:screen())
    term:keys("1 + 2", "Enter")
    assert.truthy(term:wait_for("\n3 *\n"), term:screen())
  end)

  it("keeps a history file and recalls lines with the Up arrow", function()
    term:keys("answer = 40 + 2", "Enter")
    term:keys("Up", "C-a", "print(", "C-e", ")", "Enter")
    assert.truthy(term:wait_for("print%(answer = 40 %+ 2%)"), term:screen())
    term:keys("answer", "Enter")
    assert.truthy(term:wait_for("\n42 *\n"), term:screen())
    term:keys("C-d")
    sh("sleep 0.3")
    local f = assert(io.open(history))
    local saved = f:read("a")
    f:close()
    assert.truthy(saved:find("answer = 40 + 2", 1, true), saved)
  end)
end)
