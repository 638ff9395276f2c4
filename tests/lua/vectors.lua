-- vectors.lua: reading test-vector files ({method, name, note, params, inputs, outputs} cases in
-- JSON, non-finite numbers as "nan", "inf", "-inf") and comparing rl.advantage's results with
-- their outputs at rtol 1e-5 / atol 1e-6; shared by advantage_spec.lua (the spec's vectors) and
-- verl_spec.lua (verl 1dda039's).
--
--   local V = dofile(dir .. "vectors.lua")(rl)
local RTOL, ATOL = 1e-5, 1e-6

return function(rl)
  local V = { RTOL = RTOL, ATOL = ATOL }

  -- The decoded file at path.
  function V.read(path)
    local f = assert(io.open(path, "rb"))
    local doc = rl.json.decode(f:read("a"))
    f:close()
    return doc
  end

  local NULL = setmetatable({}, { __tostring = function() return "null" end })
  V.NULL = NULL

  local function is_list(t)
    local n = 0
    for _ in pairs(t) do n = n + 1 end
    return n == #t
  end

  -- JSON value -> Lua: the strings "nan", "inf", "-inf" become numbers; null becomes NULL (in
  -- expected outputs), or, in inputs, an absent field or `false` inside a list (a failed
  -- evaluation, which the binding accepts where the spec has one).
  local function from_json(v, as_input, in_list)
    if v == rl.json.null then
      if not as_input then return NULL end
      if in_list then return false end
      return nil
    end
    if v == "nan" then return 0 / 0 end
    if v == "inf" then return math.huge end
    if v == "-inf" then return -math.huge end
    if type(v) == "table" then
      local list, t = is_list(v), {}
      for k, x in pairs(v) do t[k] = from_json(x, as_input, list) end
      return t
    end
    return v
  end
  V.from_json = from_json

  -- nil when actual matches expected, else a message naming the first difference
  local function mismatch(actual, expected, path)
    if expected == NULL then
      if actual ~= nil then return ("%s: expected nil, got %s"):format(path, tostring(actual)) end
      return nil
    end
    if type(expected) == "number" then
      if type(actual) ~= "number" then
        return ("%s: expected a number, got %s"):format(path, type(actual))
      end
      if expected ~= expected then
        if actual == actual then return ("%s: expected nan, got %.17g"):format(path, actual) end
        return nil
      end
      if math.abs(actual - expected) > ATOL + RTOL * math.abs(expected) then
        return ("%s: got %.17g, expected %.17g"):format(path, actual, expected)
      end
      return nil
    end
    if type(expected) ~= "table" then
      if actual ~= expected then
        return ("%s: got %s, expected %s"):format(path, tostring(actual), tostring(expected))
      end
      return nil
    end
    if type(actual) ~= "table" then
      return ("%s: expected a table, got %s"):format(path, type(actual))
    end
    for k, v in pairs(expected) do
      local m = mismatch(actual[k], v, path .. "." .. tostring(k))
      if m then return m end
    end
    local n = #expected
    if is_list(expected) and actual[n + 1] ~= nil then
      return ("%s: %d entries expected, got more"):format(path, n)
    end
    return nil
  end
  V.mismatch = mismatch

  return V
end
