-- search_fatal_spec.lua - a smoke run of recipes/search_fatal.lua (the fatal-aware GRPO study on
-- kbqa's faulty search tool): it runs, prints its measured seconds per step first and then its
-- table with every arm and the SFT row, numbers in range, the same table for the same seed; and it
-- refuses an unknown arm and a fault probability out of range. Not that it learns.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")

local function run(dir, extra)
  return H.run(table.concat({ H.shell_quote(H.moonrl), "run", H.shell_quote(H.root .. "/recipes/search_fatal.lua"),
    "--smoke --dir", H.shell_quote(dir), extra or "" }, " "))
end

-- The table's rows: {arm = {cells...}} without the seconds-per-step column, and the table's text.
local function table_of(out)
  local at = out:find("\nsearch_fatal, seed 1;")
  assert.is_truthy(at, out)
  local rows, text = {}, {}
  for line in out:sub(at + 1):gmatch("[^\n]+") do
    local arm = line:match("^(%S+)%s")
    if arm == "none" or arm == "drop" or arm == "fatal" or arm == "SFT" then
      local cells = {}
      for c in line:gmatch("%S+") do cells[#cells + 1] = c end
      table.remove(cells) -- s/step
      table.remove(cells, 1)
      rows[arm] = cells
      text[#text + 1] = table.concat(cells, " ")
    end
  end
  return rows, table.concat(text, "\n")
end

describe("recipes/search_fatal.lua", function()
  it("prints the measured seconds per step, then a table of the three arms and SFT, the same twice", function()
    local dir = H.tmpdir()
    local out, code = run(dir)
    assert.are.equal(0, code, out)
    local rate = out:find("measured: [%d.]+ s per RL step")
    local head = out:find("\narm%s+all@1%s+all@2%s+1%-hop%%%s+2%-hop%%%s+3%-hop%%%s+4%-hop%%%s+all%%"
      .. "%s+call1%-1%s+call2%-2%s+call%-%s+fatal%%%s+s/step\n")
    assert.is_truthy(rate, out)
    assert.is_truthy(head, out)
    assert.is_true(rate < head)
    local rows, text = table_of(out)
    for _, arm in ipairs { "none", "drop", "fatal" } do
      local r = rows[arm]
      assert.is_truthy(r, arm .. "\n" .. out)
      assert.are.equal(11, #r, arm)
      for k = 1, 7 do -- held-out success, percent
        local v = tonumber(r[k])
        assert.is_true(v and v >= 0 and v <= 100, arm .. " column " .. k .. ": " .. r[k])
      end
      for k = 8, 9 do -- tool-call rates of the two smoke steps
        local v = tonumber(r[k])
        assert.is_true(v and v >= 0 and v <= 1, arm .. " column " .. k .. ": " .. r[k])
      end
      assert.are.equal("-", r[10]) -- no third window in two steps
      local f = tonumber(r[11])
      assert.is_true(f and f >= 0 and f <= 100, arm .. " fatal " .. r[11])
    end
    assert.are.same({ "-", "-" }, { rows.SFT[1], rows.SFT[2] })
    for k = 3, 7 do assert.is_truthy(tonumber(rows.SFT[k])) end
    -- the same seed from scratch in another folder: the same table, digit for digit
    local dir2 = H.tmpdir()
    local again, code2 = run(dir2)
    assert.are.equal(0, code2, again)
    local _, text2 = table_of(again)
    assert.are.equal(text, text2)
    H.sh("rm -rf " .. H.shell_quote(dir) .. " " .. H.shell_quote(dir2))
  end)

  it("refuses an unknown arm and a fault probability out of range", function()
    local dir = H.tmpdir()
    local out, code = run(dir, "--arms none,mask")
    assert.are_not.equal(0, code)
    assert.matches("unknown arm 'mask' %(none, drop, fatal%)", out)
    out, code = run(dir, "--faults 1.5")
    assert.are_not.equal(0, code)
    assert.matches("%-%-faults: a probability in %[0, 1%] expected", out)
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)
end)
