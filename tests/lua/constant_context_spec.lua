-- constant_context_spec.lua - smoke runs of recipes/constant_context.lua (constant-context skill
-- learning on the keychain): it prints its three arms with success per K (no K = 12 for the full
-- history), the windowed arms' prompts are several times shorter than the full history's, the
-- same table comes twice for the same seed, its windowed training rows are one turn each, and it
-- refuses bad options. Not that the constant-context policy learns (the README's table is the
-- measurement).
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")

local SMALL = "--steps 2 --tasks 2 --group 4 --demos 8 --epochs 1 --eval-tasks 4"

local function run(dir, extra)
  return H.run(table.concat({ H.shell_quote(H.moonrl), "run", H.shell_quote(H.root .. "/recipes/constant_context.lua"),
    SMALL, extra or "", "--dir", H.shell_quote(dir) }, " "))
end

local function table_of(out)
  local at = out:find("\nconstant context on keychain, seed 1", 1, true)
  return at and out:sub(at) or nil
end

local function row(tbl, arm)
  local cells = {}
  local line = tbl:match("\n" .. arm .. " [^\n]*")
  for c in line:gmatch("%S+") do cells[#cells + 1] = c end
  table.remove(cells, 1) -- "full RL" is two words: the arm and the stage
  return cells
end

describe("recipes/constant_context.lua", function()
  local dir = H.tmpdir()
  local out, code = run(dir)

  it("prints the three arms after SFT and after RL; the full history has no K = 12 and the longest prompts", function()
    assert.are.equal(0, code, out)
    local tbl = table_of(out)
    assert.is_truthy(tbl, out)
    assert.matches("arm%s+K=2 %%%s+K=4 %%%s+K=6 %%%s+K=12 %%%s+prompt tok/turn%s+s\n", tbl)
    for _, arm in ipairs { "full", "cc", "window2" } do assert.is_truthy(row(tbl, arm .. " SFT")[2], arm) end
    local full, cc, w2 = row(tbl, "full RL"), row(tbl, "cc RL"), row(tbl, "window2 RL")
    assert.are.equal("-", full[5])
    for _, r in ipairs { full, cc, w2 } do
      for k = 2, 4 do
        local v = tonumber(r[k])
        assert.is_true(v >= 0 and v <= 100, r[k])
      end
    end
    assert.is_truthy(tonumber(cc[5]))
    local pf, pc, pw = tonumber(full[6]), tonumber(cc[6]), tonumber(w2[6])
    assert.is_true(pc > 0 and pc * 3 < pf, tbl)
    assert.is_true(pc < pw and pw < pf, tbl)
  end)

  it("prints the same table for the same seed", function()
    local dir2 = H.tmpdir()
    local out2, code2 = run(dir2)
    assert.are.equal(0, code2, out2)
    local function strip(t) return (t:gsub("%s+%d+\n", "\n")) end -- (the seconds column)
    assert.are.equal(strip(table_of(out)), strip(table_of(out2)))
    H.sh("rm -rf " .. H.shell_quote(dir2))
  end)

  it("trains the windowed arms on rows of one turn, the full arm on whole episodes", function()
    local eps = H.read_json_lines(dir .. "/cc-cc-s1/episodes.jsonl")
    assert.is_true(#eps > 0)
    for _, ep in ipairs(eps) do
      assert.are.equal(1, #ep.record)
    end
    local full = H.read_json_lines(dir .. "/cc-full-s1/episodes.jsonl")
    local longest = 0
    for _, ep in ipairs(full) do longest = math.max(longest, #ep.record) end
    assert.is_true(longest > 1)
  end)

  it("refuses an unknown arm and a bad option", function()
    local o1, c1 = run(H.tmpdir(), "--arms full,wide")
    assert.are_not.equal(0, c1)
    assert.matches("unknown arm wide", o1)
    local o2, c2 = run(H.tmpdir(), "--steps 0")
    assert.are_not.equal(0, c2)
    assert.matches("%-%-steps: a positive integer expected", o2)
  end)

  teardown(function() H.sh("rm -rf " .. H.shell_quote(dir)) end)
end)
