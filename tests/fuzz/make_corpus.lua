-- make_corpus.lua - writes the fuzzer's seed corpus: small safetensors files, valid ones
-- (valid_*) and ones the reader must refuse (bad_*), one per rule. tests/c/test_fuzz_corpus.c
-- checks each file's fate by its prefix. The files are committed; rerun after changing this.
-- usage: lua5.4 tests/fuzz/make_corpus.lua tests/fuzz/corpus
local dir = assert(arg[1], "usage: make_corpus.lua DIR")

local function file(name, header, data, declared)
  local f = assert(io.open(dir .. "/" .. name .. ".safetensors", "wb"))
  f:write(string.pack("<I8", declared or #header), header, data or "")
  f:close()
end

-- a header padded with spaces to a multiple of 8, as the reference writes it
local function padded(h) return h .. string.rep(" ", (8 - #h % 8) % 8) end

local function f32s(...) return string.pack("<" .. string.rep("f", select("#", ...)), ...) end
local function u16s(...) return string.pack("<" .. string.rep("I2", select("#", ...)), ...) end

local function entry(name, dtype, shape, b, e)
  return string.format('"%s":{"dtype":"%s","shape":[%s],"data_offsets":[%d,%d]}', name, dtype,
    table.concat(shape, ","), b, e)
end

-- valid
file("valid_empty", padded("{}"))
file("valid_metadata_only", padded('{"__metadata__":{"format":"pt","note":"caf\u{e9}"}}'))
file("valid_f32", padded("{" .. entry("a", "F32", {2, 3}, 0, 24) .. "," ..
  entry("b", "F32", {2}, 24, 32) .. "}"), f32s(0, 1, 2, 3, 4, 5, -1.5, 1e30))
file("valid_f16_special", padded("{" .. entry("h", "F16", {10}, 0, 20) .. "}"),
  u16s(0x0000, 0x8000, 0x0001, 0x03FF, 0x0400, 0x3C00, 0x7BFF, 0x7C00, 0xFC00, 0x7E00))
file("valid_bf16", padded("{" .. entry("w", "BF16", {2, 2}, 0, 8) .. "}"),
  u16s(0x3F80, 0xBF80, 0x7F80, 0x7FC0))
file("valid_other_dtypes", padded("{" .. entry("i", "I64", {2}, 0, 16) .. "," ..
  entry("u", "U8", {3}, 16, 19) .. "," .. entry("b", "BOOL", {1}, 19, 20) .. "," ..
  entry("d", "F64", {1}, 20, 28) .. "," .. entry("e", "F8_E4M3", {4}, 28, 32) .. "}"),
  string.rep("\1", 32))
file("valid_scalar_and_empty", padded("{" .. entry("s", "F32", {}, 0, 4) .. "," ..
  entry("z", "F32", {0, 7}, 4, 4) .. "," .. entry("y", "BF16", {3, 0}, 4, 4) .. "}"), f32s(2.5))
file("valid_rank8", padded("{" .. entry("r", "F32", {1, 2, 1, 2, 1, 2, 1, 1}, 0, 32) .. "}"),
  f32s(1, 2, 3, 4, 5, 6, 7, 8))
file("valid_unordered", padded("{" .. entry("late", "F32", {1}, 4, 8) .. "," ..
  entry("early", "F32", {1}, 0, 4) .. "}"), f32s(1, 2))
file("valid_escaped_names", padded('{"a\\"b\\\\c\\n":{"dtype":"F32","shape":[1],' ..
  '"data_offsets":[0,4]},"\\u00e9\\ud83d\\ude00":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}'),
  f32s(1, 2))
file("valid_model_like", padded('{"__metadata__":{"format":"pt"},' ..
  entry("model.embed_tokens.weight", "BF16", {4, 2}, 0, 16) .. "," ..
  entry("model.layers.0.input_layernorm.weight", "BF16", {2}, 16, 20) .. "," ..
  entry("model.layers.0.self_attn.rotary_emb.inv_freq", "F32", {1}, 20, 24) .. "," ..
  entry("model.norm.weight", "F16", {2}, 24, 28) .. "}"), string.rep("\0\63", 14))
file("valid_unpadded", "{" .. entry("x", "F32", {1}, 0, 4) .. "}", f32s(7))

-- refused
do -- five bytes: not even the length field
  local f = assert(io.open(dir .. "/bad_short.safetensors", "wb"))
  f:write("\5\0\0\0\0")
  f:close()
end
file("bad_header_absurd", "{}", "", 100000001)
file("bad_header_huge", "{}", "", 0xFFFFFFFFFFFF)
file("bad_header_beyond", "{}", "", 64)
file("bad_json_truncated", '{"a":{"dtype":"F32","shape":[1],"data_off')
file("bad_json_trailing", "{} {}")
file("bad_not_object", padded("[1,2,3]"))
file("bad_utf8", padded('{"\255":{}}'))
file("bad_entry_not_object", padded('{"a":[1]}'))
file("bad_missing_field", padded('{"a":{"dtype":"F32","shape":[1]}}'), f32s(1))
file("bad_extra_field", padded('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":0}}'),
  f32s(1))
file("bad_repeated_field", padded('{"a":{"dtype":"F32","shape":[1],"shape":[1],' ..
  '"data_offsets":[0,4]}}'), f32s(1))
file("bad_unknown_dtype", padded("{" .. entry("a", "F4", {2}, 0, 1) .. "}"), "\0")
file("bad_shape_negative", padded('{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}'),
  f32s(1))
file("bad_shape_fraction", padded('{"a":{"dtype":"F32","shape":[0.5],"data_offsets":[0,4]}}'),
  f32s(1))
file("bad_rank9", padded("{" .. entry("a", "F32", {1, 1, 1, 1, 1, 1, 1, 1, 1}, 0, 4) .. "}"),
  f32s(1))
file("bad_numel_overflow", padded("{" .. entry("a", "F32", {4294967296, 4294967296}, 0, 0) .. "}"))
file("bad_offsets_reversed", padded("{" .. entry("a", "F32", {1}, 4, 0) .. "}"), f32s(1))
file("bad_offsets_beyond", padded("{" .. entry("a", "F32", {4}, 0, 16) .. "}"), f32s(1))
file("bad_offsets_three", padded('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,4]}}'),
  f32s(1))
file("bad_length_mismatch", padded("{" .. entry("a", "F32", {2}, 0, 4) .. "}"), f32s(1))
file("bad_duplicate_name", padded("{" .. entry("a", "F32", {1}, 0, 4) .. "," ..
  entry("a", "F32", {1}, 4, 8) .. "}"), f32s(1, 2))
file("bad_overlap", padded("{" .. entry("a", "F32", {2}, 0, 8) .. "," ..
  entry("b", "F32", {1}, 4, 8) .. "}"), f32s(1, 2))
file("bad_hole", padded("{" .. entry("a", "F32", {1}, 4, 8) .. "}"), f32s(1, 2))
file("bad_trailing_data", padded("{" .. entry("a", "F32", {1}, 0, 4) .. "}"), f32s(1, 2))
file("bad_metadata_value", padded('{"__metadata__":{"format":1}}'))
file("bad_metadata_twice", padded('{"__metadata__":{},"__metadata__":{}}'))
file("bad_nul_in_name", padded('{"a\\u0000":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'),
  f32s(1))
file("bad_deep_nesting", string.rep("[", 600) .. string.rep("]", 600))
