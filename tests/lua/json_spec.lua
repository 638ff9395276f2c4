-- json_spec.lua: busted spec of rl.json (lua_json.c over the engine's strict JSON reader):
-- decoding every kind of value, exact number round trips, escapes, NUL bytes, bytes that are not
-- UTF-8 (written as U+10FE00 + byte, read back exactly; python3's json reads the files), the null sentinel
-- and the array mark, sorted keys, pretty printing, every error path, a 1 MB document, and
-- moonrl.parse's Hermes format, which decodes tool calls with it.
--
-- Run inside the moonrl command, which has `require "moonrl"` built in:
--   MOONRL_ROOT=$PWD MOONRL_BUILD=$PWD/build ./build/moonrl run /usr/bin/busted -o TAP \
--     tests/lua/json_spec.lua
local rl = require "moonrl"
local json = rl.json
local encode, decode, null = json.encode, json.decode, json.null

-- The message of the error f(...) raises (fails the test when it raises none).
local function raised(f, ...)
  local ok, err = pcall(f, ...)
  assert.is_false(ok, "expected an error")
  return tostring(err)
end

-- Asserts that decode(text) fails with nil and a message matching pattern, and returns it.
local function malformed(text, pattern)
  local v, msg = decode(text)
  assert.is_nil(v, "decoded " .. ("%q"):format(text))
  assert.is_string(msg)
  assert.truthy(msg:match(pattern), ("%q: %s"):format(text, msg))
  assert.truthy(msg:match("at line %d+, column %d+$"), msg)
  return msg
end

-- A double from 64 random bits (any sign, exponent and mantissa), drawn again when not finite.
local function random_double(rng)
  while true do
    local hi, lo = rng:random(0, 0xffffffff), rng:random(0, 0xffffffff)
    local x = string.unpack("<d", string.pack("<I4I4", lo, hi))
    if x == x and x ~= math.huge and x ~= -math.huge then return x end
  end
end

describe("rl.json", function()
  it("is part of the module", function()
    assert.equal(require("moonrl.core").json, json)
    for _, name in ipairs { "encode", "decode", "array" } do assert.is_function(json[name], name) end
    assert.equal("userdata", type(null))
    assert.equal(null, decode("null"))
  end)

  describe("decode", function()
    it("reads scalars with their Lua types", function()
      assert.is_true(decode("true"))
      assert.is_false(decode("false"))
      assert.equal(null, decode(" \t\r\nnull\n"))
      assert.equal("hi", decode('"hi"'))
      local cases = { { "0", 0, "integer" }, { "-12", -12, "integer" }, { "1.0", 1.0, "float" },
        { "1e2", 100.0, "float" }, { "1E-2", 0.01, "float" }, { "-0", 0, "integer" },
        { "2.5", 2.5, "float" }, { "123456789012", 123456789012, "integer" } }
      for _, c in ipairs(cases) do
        local v = decode(c[1])
        assert.equal(c[2], v, c[1])
        assert.equal(c[3], math.type(v), c[1])
      end
      assert.equal(-math.huge, 1 / decode("-0.0")) -- the sign of a float zero survives
    end)

    it("reads large integers exactly and numbers beyond 64 bits as floats", function()
      local v = decode("9007199254740993")
      assert.equal("integer", math.type(v))
      assert.equal((1 << 53) + 1, v)
      assert.equal(math.maxinteger, decode("9223372036854775807"))
      assert.equal(math.mininteger, decode("-9223372036854775808"))
      local big = decode("18446744073709551616")
      assert.equal("float", math.type(big))
      assert.equal(2.0 ^ 64, big)
      assert.equal(1e300, decode("1e300"))
    end)

    it("turns objects into tables and arrays into sequences", function()
      local v = decode('{"a": [1, 2, {"b": null}], "c": {}, "d": [], "e": "x"}')
      assert.same({ a = { 1, 2, { b = null } }, c = {}, d = {}, e = "x" }, v)
      assert.equal(3, #v.a)
      assert.equal(null, v.a[3].b)
      assert.equal(0, #v.d)
    end)

    it("keeps null inside arrays, so they stay sequences", function()
      local v = decode("[1, null, 3, null]")
      assert.equal(4, #v)
      assert.equal(null, v[2])
      assert.equal(null, v[4])
    end)

    it("marks arrays, so that empty ones are written back as []", function()
      assert.equal("array", getmetatable(decode("[]")).__jsontype)
      assert.equal("array", getmetatable(decode("[1]")).__jsontype)
      assert.is_nil(getmetatable(decode("{}")))
      assert.equal('{"a":[],"b":{},"c":[[]]}', encode(decode('{"a":[],"b":{},"c":[[]]}')))
    end)

    it("keeps the last value of a repeated key", function()
      assert.same({ a = 2 }, decode('{"a": 1, "a": 2}'))
    end)

    it("reads every escape, surrogate pairs and raw UTF-8", function()
      assert.equal('"\\/\b\f\n\r\t', decode([["\"\\\/\b\f\n\r\t"]]))
      assert.equal("\u{e9}\u{20ac}", decode([["\u00e9\u20AC"]]))
      assert.equal("\u{1F600}", decode([["\ud83d\ude00"]]))
      assert.equal("h\u{e9}llo \u{4e16}", decode('"h\u{e9}llo \u{4e16}"'))
    end)

    it("keeps NUL bytes in strings and keys", function()
      local s = decode([["a\u0000b"]])
      assert.equal(3, #s)
      assert.equal("a\0b", s)
      local t = decode([[{"k\u0000ey": "v\u0000"}]])
      assert.equal("v\0", t["k\0ey"])
    end)

    it("returns nil and a message with the line and column for malformed text", function()
      local cases = {
        { "", "unexpected end of input" }, { "   ", "unexpected end of input" },
        { "{", "expected a key" }, { "[1,", "unexpected end of input" },
        { "[1,]", "unexpected character" }, { "[1 2]", "expected ',' or ']'" },
        { '{"a" 1}', "expected ':'" }, { '{"a":1,}', "expected a key" },
        { '{"a":1 "b":2}', "expected ',' or '}'" }, { "{1:2}", "expected a key" },
        { "01", "trailing characters" }, { "1.", "bad number" }, { "-", "bad number" },
        { "1e", "bad number" }, { ".5", "unexpected character" }, { "+1", "unexpected character" },
        { "tru", "unexpected character" }, { "nul", "unexpected character" },
        { "NaN", "unexpected character" }, { "Infinity", "unexpected character" },
        { "0x10", "trailing characters" }, { "'a'", "unexpected character" },
        { '"abc', "unterminated string" }, { '"\\x"', "bad escape" },
        { '"\\u12x4"', "bad \\u escape" }, { '"\\u12"', "truncated \\u escape" },
        { '"\\u12', "unterminated string" },
        { '"a\nb"', "control character" }, { '"a\0b"', "control character" },
        { "[1] x", "trailing characters" }, { "{} {}", "trailing characters" },
        { "[" .. ("["):rep(600), "nested too deeply" },
      }
      for _, c in ipairs(cases) do malformed(c[1], c[2]) end
      assert.equal("unexpected character at line 3, column 3", malformed("[\n  1,\n  ]", "."))
      assert.equal("bad number at line 1, column 7", malformed('{"a": -x}', "."))
    end)

    it("reads 512 levels of nesting and refuses 513", function()
      local v = decode(("["):rep(512) .. ("]"):rep(512))
      for _ = 1, 511 do v = v[1] end
      assert.same({}, v)
      malformed(("["):rep(513) .. ("]"):rep(513), "nested too deeply")
    end)

    it("raises an argument error when the text is not a string", function()
      for _, bad in ipairs { 42, true, {} } do
        local msg = raised(function() return json.decode(bad) end)
        assert.truthy(msg:find("bad argument #1", 1, true), msg)
        assert.truthy(msg:find("string expected, got " .. type(bad), 1, true), msg)
      end
      assert.truthy(raised(function() return json.decode() end):find("string expected, got no value",
        1, true))
    end)
  end)

  describe("encode", function()
    it("writes scalars", function()
      assert.equal("null", encode(nil))
      assert.equal("null", encode(null))
      assert.equal("true", encode(true))
      assert.equal("false", encode(false))
      assert.equal("42", encode(42))
      assert.equal("-7", encode(-7))
      assert.equal('"hi"', encode("hi"))
      assert.equal("9223372036854775807", encode(math.maxinteger))
      assert.equal("-9223372036854775808", encode(math.mininteger))
      assert.equal("9007199254740993", encode((1 << 53) + 1))
    end)

    it("writes floats that read back exactly, as floats", function()
      local cases = { { 0.1, "0.1" }, { 2.0, "2.0" }, { -0.0, "-0.0" }, { 0.0, "0.0" },
        { 1e300, "1e+300" }, { 1 / 3, "0.3333333333333333" }, { 0.1 + 0.2, "0.30000000000000004" },
        { 1e15, "1e+15" }, { 123456789012345.0, "123456789012345.0" }, { -2.5, "-2.5" },
        { 5e-324, "4.9406564584125e-324" }, { 1.7976931348623157e308, "1.7976931348623157e+308" } }
      for _, c in ipairs(cases) do
        local text = encode(c[1])
        assert.equal(c[2], text)
        local back = decode(text)
        assert.equal(c[1], back, text)
        assert.equal("float", math.type(back), text)
      end
      assert.equal(-math.huge, 1 / decode(encode(-0.0)))
      assert.equal(math.huge, 1 / decode(encode(0.0)))
    end)

    it("round-trips 20000 random doubles bit for bit", function()
      local rng = rl.rng(7)
      for _ = 1, 20000 do
        local x = random_double(rng)
        local back = decode(encode(x))
        if string.pack("<d", back) ~= string.pack("<d", x) then
          error(("%.17g came back as %.17g"):format(x, back))
        end
      end
    end)

    it("escapes quotes, backslashes and control characters, and nothing else", function()
      assert.equal([["a\"b\\c\n\r\t\b\f\u0001\u001f/"]], encode('a"b\\c\n\r\t\b\f\1\31/'))
      assert.equal('"\127 \u{e9}\u{1F600}"', encode("\127 \u{e9}\u{1F600}"))
      assert.equal([["a\u0000b"]], encode("a\0b"))
    end)

    it("writes bytes that are not UTF-8 as U+10FE00 + byte, so the text is UTF-8, and reads them back", function()
      assert.equal('"\u{10FEFF}\u{10FEFE}\u{10FE80}"', encode("\xff\xfe\x80"))
      assert.equal('"a\u{10FEC3}b"', encode("a\xc3b"))                 -- a truncated sequence
      assert.equal('"\u{10FEED}\u{10FEA0}\u{10FE80}"', encode("\xed\xa0\x80")) -- an encoded surrogate
      assert.equal('"\u{10FEC0}\u{10FE80}"', encode("\xc0\x80"))          -- an overlong NUL
      -- valid UTF-8 stays as it is, up to U+10FFFF
      local text = "h\u{e9}llo \u{4e16}\u{754c} \u{1F600} \u{10FFFF} \u{10FE7F} \u{10FF00}"
      assert.equal('"' .. text .. '"', encode(text))
      -- a genuine U+10FE80..U+10FEFF is written byte by byte, so it reads back as itself
      assert.equal('"\u{10FEF4}\u{10FE8F}\u{10FEBA}\u{10FE80}"', encode("\u{10FE80}"))
      for cp = 0x10FE80, 0x10FEFF do
        assert.equal(utf8.char(cp), decode(encode(utf8.char(cp))))
      end
      -- what other writers produce for those code points reads as the bytes too
      assert.equal("\x80\xff", decode('"\\udbff\\ude80\\udbff\\udeff"'))
      assert.equal("\xc3", decode('"\u{10FEC3}"'))
      -- raw bytes that are not UTF-8 in a text still read as they are
      assert.equal("\xff\xfe", decode('"\xff\xfe"'))
    end)

    it("round-trips every byte value, alone, in pairs and in random strings, values and keys", function()
      local function both(s)
        local out = encode(s)
        assert.truthy(utf8.len(out), ("%q is not UTF-8"):format(out))
        assert.equal(s, decode(out))
        local obj = encode { [s] = s }
        assert.truthy(utf8.len(obj), ("%q is not UTF-8"):format(obj))
        local back = decode(obj)
        assert.equal(s, back[s])
      end
      local all = {}
      for b = 0, 255 do
        all[#all + 1] = string.char(b)
        both(string.char(b))
      end
      both(table.concat(all))
      for a = 0x80, 0xFF do
        for b = 0, 255, 3 do both(string.char(a, b)) end
      end
      local rng = rl.rng(7)
      for _ = 1, 2000 do
        local bytes = {}
        for k = 1, rng:random(12) do
          -- mostly the bytes UTF-8 is made of, so valid and broken sequences mix
          bytes[k] = rng:random() < 0.7 and rng:random(0x80, 0xF7) or rng:random(0, 255)
        end
        both(string.char(table.unpack(bytes)))
      end
    end)

    it("writes files strict JSON readers accept (python3's json), holding the exact bytes", function()
      local python = io.open("/usr/bin/python3", "r")
      if not python then
        pending("needs /usr/bin/python3")
        return
      end
      python:close()
      local rng, cases = rl.rng(11), { "\xff\xfe\x80", "ok \u{e9}", "\xc3(", "\u{10FE80}", "\xed\xa0\x80" }
      for _ = 1, 200 do
        local bytes = {}
        for k = 1, rng:random(10) do bytes[k] = rng:random(0, 255) end
        cases[#cases + 1] = string.char(table.unpack(bytes))
      end
      local path = os.tmpname()
      local f = assert(io.open(path, "wb"))
      for _, c in ipairs(cases) do f:write(encode { text = c, [c] = 1 }, "\n") end
      f:close()
      -- python reads the file as strict UTF-8 and JSON, and recovers each string's bytes with the
      -- documented mapping: U+10FE80..U+10FEFF -> the byte (code point - 0x10FE00)
      local script = os.tmpname()
      f = assert(io.open(script, "w"))
      f:write([[
import json, sys
def raw(s):
    out = bytearray()
    for ch in s:
        c = ord(ch)
        out += bytes([c - 0x10FE00]) if 0x10FE80 <= c <= 0x10FEFF else ch.encode("utf-8")
    return bytes(out)
with open(sys.argv[1], encoding="utf-8", errors="strict") as f:
    for line in f:
        rec = json.loads(line)
        keys = [k for k in rec if k != "text"] or ["text"]
        print(raw(rec["text"]).hex(), raw(keys[0]).hex())
]])
      f:close()
      local p = assert(io.popen("/usr/bin/python3 " .. script .. " " .. path .. " 2>&1"))
      local out = p:read("a")
      local ok = p:close()
      os.remove(script)
      os.remove(path)
      assert.is_true(ok, out)
      local i = 0
      for value, key in out:gmatch("(%x*) (%x*)\n") do
        i = i + 1
        local want = cases[i]:gsub(".", function(ch) return ("%02x"):format(ch:byte()) end)
        assert.equal(want, value, "case " .. i)
        if cases[i] ~= "text" then assert.equal(want, key, "case " .. i) end
      end
      assert.equal(#cases, i)
    end)

    it("writes sequences as arrays and other tables as objects with sorted keys", function()
      assert.equal("[1,2,3]", encode { 1, 2, 3 })
      assert.equal("{}", encode {})
      assert.equal('{"a":2,"b":1,"c":{"y":2,"z":1}}', encode { b = 1, c = { z = 1, y = 2 }, a = 2 })
      assert.equal('{"B":1,"a":2,"aa":3,"b":4}', encode { b = 4, aa = 3, a = 2, B = 1 })
      assert.equal('{"1":1,"3":3}', encode { [1] = 1, [3] = 3 })
      assert.equal('{"1":1,"2":2,"x":3}', encode { 1, 2, x = 3 })
      assert.equal('{"0":"z","1":"o"}', encode { [0] = "z", [1] = "o" })
      assert.equal('{"1.5":"x","10":"t","2":"w"}', encode { [1.5] = "x", [2] = "w", [10] = "t" })
      assert.equal('[1,null,3]', encode { 1, null, 3 })
    end)

    it("writes the same text whatever order the keys were inserted in", function()
      local a, b = {}, {}
      for i = 1, 200 do a["k" .. i] = i end
      for i = 200, 1, -1 do b["k" .. i] = i end
      assert.equal(encode(a), encode(b))
    end)

    it("writes tables marked with rl.json.array as arrays, empty ones included", function()
      local t = {}
      assert.equal(t, json.array(t))
      assert.equal("[]", encode(t))
      assert.equal("[]", encode(json.array()))
      assert.equal("[1,2]", encode(json.array { 1, 2 }))
      assert.equal('{"a":[],"b":{}}', encode { a = json.array(), b = {} })
      assert.equal(t, json.array(t)) -- marking twice is fine
      -- any metatable with __jsontype = "array" marks its tables
      assert.equal("[]", encode(setmetatable({}, { __jsontype = "array" })))
      assert.equal("{}", encode(setmetatable({}, { __jsontype = "object" })))
      local msg = raised(json.array, setmetatable({}, {}))
      assert.truthy(msg:find("has a metatable already", 1, true), msg)
      assert.truthy(raised(json.array, 5):find("table expected, got number", 1, true))
    end)

    it("writes a table that appears twice (not a cycle) twice", function()
      local s = { 1 }
      assert.equal("[[1],[1]]", encode { s, s })
    end)

    it("round-trips nested values", function()
      local v = { name = "x", list = { 1, 2.5, "three", { four = 4 }, true, false, null },
        nested = { a = { b = { c = { d = { "deep" } } } } }, empty = json.array(), obj = {},
        ["with space"] = "\0\1\n", big = (1 << 53) + 1, neg = -0.0 }
      local text = encode(v)
      local back = decode(text)
      assert.same(v, back)
      assert.equal("integer", math.type(back.big))
      assert.equal("float", math.type(back.list[2]))
      assert.equal(-math.huge, 1 / back.neg)
      assert.equal(text, encode(back))
    end)

    it("pretty-prints with opts.indent", function()
      assert.equal('{\n  "a": [\n    1,\n    2\n  ],\n  "b": {},\n  "c": []\n}',
        encode({ a = { 1, 2 }, b = {}, c = json.array() }, { indent = 2 }))
      assert.equal("[\n    1\n]", encode({ 1 }, { indent = 4 }))
      assert.equal('{"a":1}', encode({ a = 1 }, { indent = 0 }))
      assert.equal('"s"', encode("s", { indent = 2 }))
      assert.same({ a = { 1, { b = 2 } } }, decode(encode({ a = { 1, { b = 2 } } }, { indent = 3 })))
    end)

    it("refuses bad options", function()
      assert.truthy(raised(encode, 1, { indnet = 2 }):find("unknown field 'indnet'", 1, true))
      assert.truthy(raised(encode, 1, { indent = -1 }):find("options.indent", 1, true))
      assert.truthy(raised(encode, 1, { indent = 1.5 }):find("options.indent", 1, true))
      assert.truthy(raised(encode, 1, { indent = "2" }):find("options.indent", 1, true))
      assert.truthy(raised(encode, 1, 5):find("table expected", 1, true))
      assert.truthy(raised(encode):find("value expected", 1, true))
    end)

    it("names the path of what it cannot encode", function()
      local co = coroutine.create(function() end)
      local cases = {
        { print, "json.encode: value: cannot encode a function" },
        { { a = { 1, 2, print } }, "json.encode: value.a[3]: cannot encode a function" },
        { { co }, "json.encode: value[1]: cannot encode a thread" },
        { { f = io.stdout }, "json.encode: value.f: cannot encode a FILE*" },
        { { t = rl.tensor.zeros(1) }, "json.encode: value.t: cannot encode a moonrl.tensor" },
        { { ["a b"] = { f = print } }, 'json.encode: value["a b"].f: cannot encode a function' },
        { { ['q"'] = print }, 'json.encode: value["q\\""]: cannot encode a function' },
        { { [2.5] = { print } }, "json.encode: value[2.5][1]: cannot encode a function" },
        { { x = 0 / 0 }, "json.encode: value.x: cannot encode NaN" },
        { { 1, math.huge }, "json.encode: value[2]: cannot encode inf" },
        { -math.huge, "json.encode: value: cannot encode -inf" },
        { { a = { [true] = 1 } }, "json.encode: value.a: cannot encode a key of type boolean" },
        { { [{}] = 1 }, "json.encode: value: cannot encode a key of type table" },
        { { [math.huge] = 1 }, "json.encode: value: cannot encode the key inf" },
        { { [1] = 1, ["1"] = 2 },
          'json.encode: value: two keys (a number and a string) are both written "1"' },
        { json.array { 1, nil, 3 },
          "json.encode: value: cannot encode a table marked as an array whose keys are not 1..n" },
        { { a = setmetatable({ x = 1 }, { __jsontype = "array" }) },
          "json.encode: value.a: cannot encode a table marked as an array whose keys are not 1..n" },
      }
      for _, c in ipairs(cases) do assert.equal(c[2], raised(encode, c[1])) end
      local long = ("k"):rep(50) .. " "
      assert.equal('json.encode: value["' .. ("k"):rep(40) .. '..."]: cannot encode a function',
        raised(encode, { [long] = print }))
    end)

    it("refuses cycles", function()
      local t = { a = { 1 } }
      t.a[2] = t
      assert.equal("json.encode: value.a[2]: cannot encode a cycle (the table contains itself)",
        raised(encode, t))
      local s = {}
      s.self = s
      assert.equal("json.encode: value.self: cannot encode a cycle (the table contains itself)",
        raised(encode, s))
    end)

    it("writes 200 levels of nesting and refuses 201", function()
      local function nest(n)
        local v = {}
        for _ = 2, n do v = { v } end
        return v
      end
      assert.equal(("["):rep(199) .. "{}" .. ("]"):rep(199), encode(nest(200)))
      local msg = raised(encode, nest(201))
      assert.equal("json.encode: value" .. ("[1]"):rep(200) .. ": nested deeper than 200 levels", msg)
    end)

    it("can encode again after an error", function()
      raised(encode, { print })
      assert.equal("[1]", encode { 1 })
    end)
  end)

  it("decodes a 1 MB document and writes it back the same", function()
    local items = {}
    for i = 1, 12000 do
      items[i] = { id = i, name = "item " .. i, score = i / 7, tags = { "a", "b\n", null },
        ok = i % 2 == 0, nested = { depth = { i } } }
    end
    local text = encode { items = items, count = #items }
    assert.truthy(#text > 1024 * 1024, #text)
    local back = decode(text)
    assert.equal(12000, back.count)
    assert.equal(12000, #back.items)
    assert.same(items[777], back.items[777])
    assert.equal(777 / 7, back.items[777].score)
    assert.same(items, back.items)
    assert.equal(text, encode(back))
    -- pretty-printed, the same document reads back the same
    assert.same(back, decode(encode(back, { indent = 2 })))
  end)
end)

describe("moonrl.parse.hermes over rl.json", function()
  local hermes = rl.parse.hermes

  it("decodes a tool call and its arguments", function()
    local r = hermes('ok <tool_call>{"name": "add", "arguments": {"a": 1, "b": [2, 3]}}</tool_call>')
    assert.equal("call", r.kind)
    assert.equal("add", r.name)
    assert.same({ a = 1, b = { 2, 3 } }, r.args)
  end)

  it("treats missing or null arguments as none, and reads arguments given as a string", function()
    assert.same({}, hermes('<tool_call>{"name": "f"}</tool_call>').args)
    assert.same({}, hermes('<tool_call>{"name": "f", "arguments": null}</tool_call>').args)
    local r = hermes([[<tool_call>{"name": "f", "arguments": "{\"x\": \"y\"}"}</tool_call>]])
    assert.same({ x = "y" }, r.args)
  end)

  it("reports broken calls as errors", function()
    local r = hermes('<tool_call>{"name": "f", </tool_call>')
    assert.equal("error", r.kind)
    assert.truthy(r.message:match("^tool call is not valid JSON: .* at line 1, column %d+$"),
      r.message)
    assert.equal("error", hermes('<tool_call>[1, 2]</tool_call>').kind)
    assert.equal("error", hermes('<tool_call>"f"</tool_call>').kind)
    assert.equal("error", hermes('<tool_call>{"name": null}</tool_call>').kind)
    assert.equal("error", hermes('<tool_call>{"name": ""}</tool_call>').kind)
    r = hermes('<tool_call>{"name": "f", "arguments": "not json"}</tool_call>')
    assert.equal('tool call "arguments" must be an object', r.message)
    r = hermes('<tool_call>{"name": "f", "arguments": 3}</tool_call>')
    assert.equal('tool call "arguments" must be an object', r.message)
  end)

  it("reads text without a call as the answer", function()
    assert.same({ kind = "answer", text = "42" }, hermes("  42 \n"))
  end)
end)
