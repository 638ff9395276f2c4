-- make_sse_corpus.lua - writes the SSE fuzzer's seed corpus (tests/fuzz/fuzz_sse.c): small
-- text/event-stream inputs, one per rule of the parser. Each file is NAME-eN.sse, N being the
-- events the stream holds; tests/c/test_fuzz_sse_corpus.c checks that count. The files are
-- committed; rerun after changing this.
-- usage: lua5.4 tests/fuzz/make_sse_corpus.lua tests/fuzz/sse_corpus
local dir = assert(arg[1], "usage: make_sse_corpus.lua DIR")

local function seed(name, events, bytes)
  local f = assert(io.open(string.format("%s/%s-e%d.sse", dir, name, events), "wb"))
  f:write(bytes)
  f:close()
end

local chunk = '{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"a"}]}'
seed("empty", 0, "")
seed("openai_stream", 3, "data: " .. chunk .. "\n\ndata: " .. chunk .. "\n\ndata: [DONE]\n\n")
seed("crlf", 2, "data: a\r\n\r\ndata: [DONE]\r\n\r\n")
seed("cr", 2, "data: a\r\rdata: b\r\r")
seed("mixed_ends", 3, "data: a\r\n\ndata: b\n\r\ndata: c\r\r")
seed("bom", 1, "\xEF\xBB\xBFdata: after the mark\n\n")
seed("bom_partial", 0, "\xEF\xBBdata: x\n\n") -- the line's name is "\xEF\xBBdata": ignored
seed("bom_twice", 0, "\xEF\xBB\xBF\xEF\xBB\xBFdata: x\n\n") -- the second mark is text
seed("comments", 1, ": ping\n:\n: another\ndata: x\n\n: trailing\n")
seed("multiline", 1, "data: one\ndata: two\ndata:\ndata: four\n\n")
seed("no_space", 2, "data:tight\n\ndata:  two spaces\n\n")
seed("event_type", 3, "event: delta\ndata: 1\n\nevent:\ndata: 2\n\ndata: 3\n\n")
seed("event_only", 0, "event: lonely\n\n\n\n")
seed("ids", 3, "id: 7\ndata: a\n\ndata: b\n\nid\ndata: c\n\n")
seed("id_nul", 2, "id: 1\ndata: a\n\nid: x\0y\ndata: b\n\n")
seed("retry", 4, "retry: 1500\ndata: a\n\nretry: 12x\ndata: b\n\nretry:\ndata: c\n\n" ..
  "retry: 99999999999999999999999\ndata: d\n\n")
seed("unknown_fields", 1, "foo: bar\ndata\nbaz\nDATA: upper\ndata: real\n\n")
seed("field_no_colon", 1, "data\n\n") -- an empty data line: the event's data is ""
seed("unterminated", 1, "data: kept\n\ndata: dropped at the end\n")
seed("unterminated_line", 0, "data: no line end")
seed("done_variants", 3, "data: [DONE]\n\ndata: [DONE] \n\ndata:[DONE]\n\n")
seed("nul_in_data", 1, "data: a\0b\n\n")
seed("error_event", 2, 'data: {"error":{"message":"engine failed","type":"server_error"}}\n\n' ..
  "data: [DONE]\n\n")
seed("long_line", 1, "data: " .. string.rep("x", 300) .. "\n\n")
seed("many_blank", 1, string.rep("\n", 40) .. "data: x\n\n" .. string.rep("\r\n", 20))
seed("utf8", 2, "data: caf\u{e9} \u{1F600}\n\nevent: \u{e9}v\ndata: \xFF\xFE\n\n")
