-- make_request_corpus.lua - writes the request-body fuzzer's seed corpus (tests/fuzz/fuzz_request.c):
-- one `moonrl serve` request body per rule of the validator. Each file is NAME-sSTATUS.req: the
-- first byte picks the endpoint (0 completions, 1 chat, 2 chat with prompt ids, 3 generate,
-- 4 tokenize, 5 detokenize; +8: the line tool format), the rest is the body, and STATUS is the
-- status the server must answer; tests/c/test_fuzz_request_corpus.c checks it. The files are
-- committed; rerun after changing this.
-- usage: lua5.4 tests/fuzz/make_request_corpus.lua tests/fuzz/request_corpus
local dir = assert(arg[1], "usage: make_request_corpus.lua DIR")

local COMPLETION, CHAT, CHAT_TOKENS, GENERATE, TOKENIZE, DETOKENIZE, LINE = 0, 1, 2, 3, 4, 5, 8

local function seed(name, status, kind, body)
  local f = assert(io.open(string.format("%s/%s-s%d.req", dir, name, status), "wb"))
  f:write(string.char(kind), body)
  f:close()
end

local tools = '[{"type": "function", "function": {"name": "get_weather", "description": "now", ' ..
  '"parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": ' ..
  '{"type": "integer"}}}}}, {"type": "function", "function": {"name": "now"}}]'
local user = '[{"role": "user", "content": "hi"}]'

-- completions
seed("completion_ids", 200, COMPLETION, '{"prompt": [1, 2, 3], "max_tokens": 4, "logprobs": 2}')
seed("completion_text", 200, COMPLETION, '{"prompt": "hello", "stop": ["\\n", "x"], "seed": 7}')
seed("completion_one_list", 200, COMPLETION, '{"prompt": ["hello"], "temperature": 0}')
seed("completion_bad_json", 400, COMPLETION, '{"prompt": [1, 2')
seed("completion_not_object", 400, COMPLETION, '[1, 2, 3]')
seed("completion_unknown_field", 400, COMPLETION, '{"prompt": [1], "bogus": true}')
seed("completion_bad_id", 400, COMPLETION, '{"prompt": [1, 99999]}')
seed("completion_empty", 400, COMPLETION, '{"prompt": []}')
seed("completion_too_long", 400, COMPLETION, '{"prompt": "' .. string.rep("x", 1100) .. '"}')
seed("completion_model", 404, COMPLETION, '{"prompt": [1], "model": "gpt-9"}')
seed("completion_n", 400, COMPLETION, '{"prompt": [1], "n": 2}')
seed("completion_temperature", 400, COMPLETION, '{"prompt": [1], "temperature": 9}')
seed("completion_stops", 400, COMPLETION, '{"prompt": [1], "stop": [""]}')
-- chat
seed("chat", 200, CHAT, '{"messages": ' .. user .. ', "logprobs": true, "top_logprobs": 3}')
seed("chat_parts", 200, CHAT, '{"messages": [{"role": "user", "content": [{"type": "text", ' ..
  '"text": "a"}, {"type": "text", "text": "b"}]}], "stream": true, "stream_options": ' ..
  '{"include_usage": true}}')
seed("chat_no_messages", 400, CHAT, '{"messages": []}')
seed("chat_image", 400, CHAT, '{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}')
seed("chat_no_role", 400, CHAT, '{"messages": [{"content": "x"}]}')
seed("chat_tokens_field", 400, CHAT, '{"messages": ' .. user .. ', "tokens": [1]}')
seed("chat_prompt_ids", 200, CHAT_TOKENS, '{"messages": ' .. user .. ', "tokens": [1, 2]}')
seed("chat_prompt_ids_missing", 400, CHAT_TOKENS, '{"messages": ' .. user .. '}')
-- tools
seed("tools_auto", 200, CHAT, '{"messages": ' .. user .. ', "tools": ' .. tools .. '}')
seed("tools_required", 200, CHAT, '{"messages": ' .. user .. ', "tools": ' .. tools ..
  ', "tool_choice": "required", "parallel_tool_calls": false}')
seed("tools_forced", 200, CHAT, '{"messages": ' .. user .. ', "tools": ' .. tools ..
  ', "tool_choice": {"type": "function", "function": {"name": "now"}}}')
seed("tools_forced_line", 200, CHAT + LINE, '{"messages": ' .. user .. ', "tools": ' .. tools ..
  ', "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}')
seed("tools_history", 200, CHAT, '{"messages": [{"role": "system", "content": "s"}, {"role": ' ..
  '"user", "content": "w?"}, {"role": "assistant", "content": null, "tool_calls": [{"id": "c", ' ..
  '"type": "function", "function": {"name": "get_weather", "arguments": "{\\"city\\": ' ..
  '\\"Oslo\\", \\"days\\": [1, 2.5e3, true, null]}"}}]}, {"role": "tool", "tool_call_id": "c", ' ..
  '"content": "rain"}], "tools": ' .. tools .. '}')
seed("tools_history_line", 200, CHAT + LINE, '{"messages": [{"role": "assistant", "tool_calls": ' ..
  '[{"function": {"name": "x", "arguments": "{\\"a\\": \\"two words\\", \\"b\\": \\"q\\\\\\"\\"}"}}]}]}')
seed("tools_bad_name", 400, CHAT, '{"messages": ' .. user .. ', "tools": [{"type": "function", ' ..
  '"function": {"name": "no spaces"}}]}')
seed("tools_duplicate", 400, CHAT, '{"messages": ' .. user .. ', "tools": [{"type": "function", ' ..
  '"function": {"name": "a"}}, {"type": "function", "function": {"name": "a"}}]}')
seed("tools_choice_unknown", 400, CHAT, '{"messages": ' .. user .. ', "tools": ' .. tools ..
  ', "tool_choice": {"type": "function", "function": {"name": "rain"}}}')
seed("tools_choice_without", 400, CHAT, '{"messages": ' .. user .. ', "tool_choice": "required"}')
seed("tools_bad_arguments", 400, CHAT, '{"messages": [{"role": "assistant", "tool_calls": ' ..
  '[{"function": {"name": "x", "arguments": "{nope"}}]}]}')
seed("tools_calls_on_user", 400, CHAT, '{"messages": [{"role": "user", "tool_calls": []}]}')
-- generate, tokenize, detokenize
seed("generate", 200, GENERATE, '{"token_ids": [5, 6], "sampling_params": {"max_tokens": 3, ' ..
  '"logprobs": 1, "stop_token_ids": [7]}}')
seed("generate_stream", 400, GENERATE, '{"token_ids": [5], "stream": true}')
seed("generate_params", 400, GENERATE, '{"token_ids": [5], "sampling_params": {"best": 1}}')
seed("tokenize_prompt", 200, TOKENIZE, '{"prompt": "h\\u00e9llo \\ud83d\\ude00"}')
seed("tokenize_messages", 200, TOKENIZE, '{"messages": ' .. user .. ', "add_generation_prompt": false}')
seed("detokenize", 200, DETOKENIZE, '{"tokens": [104, 105]}')
seed("detokenize_bad", 400, DETOKENIZE, '{"tokens": [-1]}')
seed("deep_nesting", 400, CHAT, string.rep("[", 600) .. string.rep("]", 600))
