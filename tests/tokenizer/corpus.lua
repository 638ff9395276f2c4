-- corpus.lua - texts the tokenizer spec encodes with moonrl and with the JavaScript reference
-- (tests/tokenizer/reference.js): a list of {name, text}. Written with Lua escapes so that any
-- byte, invalid UTF-8 included, is stored exactly; `invalid = true` marks entries that are not
-- valid UTF-8 (the reference sees them with U+FFFD replacements; see tokenizer_spec.lua).
--
-- Left out on purpose: U+0085 and U+FEFF, which the JavaScript library's \s classifies
-- differently from Hugging Face's Rust tokenizers (moonrl follows Rust: U+0085 is white space,
-- U+FEFF is not), and characters assigned after Unicode 14 (moonrl's tables come from Python's
-- unicodedata 14.0; Node's ICU is newer).
local corpus = {}

local function add(name, text, invalid)
  corpus[#corpus + 1] = { name = name, text = text, invalid = invalid or nil }
end

add("empty", "")
add("one letter", "a")
add("one space", " ")
add("prose", "The quick brown fox jumps over the lazy dog. It wasn't the fox's fault; the dog " ..
  "had simply refused to move, and frankly, who could blame it?\nA second paragraph follows " ..
  "here -- with dashes, \"quotes\", (parentheses) and [brackets].")
add("prose without final newline", "Reinforcement learning from verifiable rewards works " ..
  "well when the reward is cheap to check and hard to fake.")
add("python", "def fib(n: int) -> int:\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n" ..
  "    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n\n" ..
  "if __name__ == \"__main__\":\n\tprint(fib(30))  # 832040\n")
add("c", "static int add(int a, int b) {\n  return a + b; /* sum */\n}\n\nint main(void) " ..
  "{\n  printf(\"%d\\n\", add(2, 3));\n  return 0;\n}\n")
add("json", '{"role": "tool", "content": {"ok": true, "values": [1, 2.5, -3e10], ' ..
  '"path": "C:\\\\tmp\\\\x"}, "null": null}')
add("shell and regex", "grep -E '^[a-z]+$' file.txt | sort -u > out && echo \"done: $?\" " ..
  "# ~/bin/*.sh 2>&1")
add("lua", "local t = {1, 2, 3}\nfor i, v in ipairs(t) do print(i, v) end -- comment\n" ..
  "return setmetatable({}, {__index = function(_, k) return k:upper() end})")
add("markdown and math", "# Title\n\n* item **bold** _it_\n1. `code` and $E = mc^2$, " ..
  "\\frac{a}{b} \\leq \\sqrt{x}\n> quote\n\n| a | b |\n|---|---|\n| 1 | 2 |\n")
add("url and email", "See https://example.com/path/to/page?query=a%20b&x=1#frag or mail " ..
  "someone@example.org.")
add("chinese", "强化学习是一种机器学习方法，智能体通过与环境交互来学习策略。奖励信号告诉它哪些行为是好的。")
add("japanese", "東京は日本の首都です。カタカナとひらがなと漢字が混ざっています！")
add("korean", "강화 학습은 보상을 최대화하는 방법을 배웁니다. 한국어 문장입니다.")
add("cjk mixed with ascii", "模型v2.5在GSM8K上得分92.3%，比baseline高3分。")
add("arabic and hebrew", "مرحبا بالعالم ١٢٣ — שלום עולם 456")
add("devanagari and thai", "नमस्ते दुनिया। สวัสดีชาวโลก ภาษาไทย")
add("cyrillic and greek", "Привет, мир! Γειά σου Κόσμε; αβγ ΑΒΓ")
add("emoji", "Great job! 😀👍🎉 Rocket 🚀 to the moon 🌕 ❤️ ✨")
add("emoji zwj and modifiers", "Family 👨\u{200D}👩\u{200D}👧\u{200D}👦, " ..
  "technologist 👩🏽\u{200D}💻, flag 🇯🇵🇺🇸, rainbow flag 🏳️\u{200D}🌈, keycap 1️⃣ #️⃣")
add("whitespace runs", "a" .. (" "):rep(17) .. "b" .. ("\t"):rep(5) .. "c   \n    d" ..
  (" "):rep(40))
add("mixed newlines", "line one\r\nline two\rline three\n\n\nline four\r\n\r\n  \n\t\nend\n")
add("only whitespace", " \t \n \r\n   \n\n  ")
add("unicode spaces", "a\u{00A0}b\u{2003}c\u{3000}d\u{2028}e\u{2029}f\u{1680}g\u{202F}h" ..
  "\u{205F}i \u{00A0} j")
add("zero width characters", "zero\u{200B}width\u{200C}non\u{200D}joiner\u{2060}word")
add("control characters", "nul\0byte\1\2\3 bell\7 vt\11 ff\12 esc\27[0m del\127")
add("digits", "0 1 12 123 1234 12345 123456 1234567 9876543210123456789")
add("numbers in text", "Pi is 3.14159265358979, e is 2.718; 1,000,000 people; 1e-9; -42; " ..
  "0xFF; 007; v1.2.3; 50% of 2024-01-31T12:34:56Z")
add("other numerals", "Arabic-Indic ٠١٢٣٤٥٦٧٨٩, Devanagari ०१२३, fullwidth １２３, " ..
  "superscripts x² y³, fractions ½ ¾, roman Ⅻ ⅷ, circled ①②")
add("contractions", "I'm sure you're right: they'll say it's fine, we've done it, I'd go, " ..
  "don't worry, she's here.")
add("contractions upper and mixed case", "I'M SURE YOU'RE RIGHT, THEY'LL SAY IT'S FINE, " ..
  "We'Ve DoNe It, i'D gO 'S 'T 'rE 'LL")
add("apostrophes elsewhere", "O'Neil's rock'n'roll; 'quoted' words; '90s; can't; y'all; " ..
  "ain't; 'sup; l'été; ’curly’")
add("special tokens in text", "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>" ..
  "assistant\n<think>\nSimple.\n</think>\n\n4<|im_end|><|endoftext|>")
add("partial special tokens", "<|im_start <|im_end| |im_end|> <|endoftext|x <think <tool_call>" ..
  "{\"name\": \"f\"}</tool_call> <|<|im_start|>|>")
add("special tokens glued to text", "abc<|endoftext|>def<|im_end|>123<think>x</think>y")
add("combining: decomposed accents", "Cafe\u{301} re\u{301}sume\u{301} nai\u{308}ve " ..
  "A\u{30A}ngstro\u{308}m")
add("combining: canonical reordering", "e\u{301}\u{327} e\u{327}\u{301} \u{E9}\u{327} " ..
  "a\u{301}\u{328} o\u{31B}\u{323}\u{302}")
add("combining: compatibility-looking singletons", "\u{212B} \u{2126} \u{212A} \u{F900} " ..
  "\u{340}\u{341}")
add("combining: hangul jamo", "\u{1100}\u{1161}\u{11A8} \u{AC00}\u{11A8} \u{1112}\u{1161}" ..
  "\u{11AB}\u{1100}\u{1173}\u{11AF}")
add("combining: vietnamese and greek", "Tie\u{302}\u{301}ng Vie\u{323}\u{302}t; " ..
  "\u{3B1}\u{313}\u{301}\u{345} \u{3C9}\u{314}\u{342}")
add("combining: marks on symbols", "<\u{338} =\u{338} >\u{338} x\u{20D7} 1\u{20E3}")
add("combining: long run of marks", "a" .. ("\u{301}\u{316}"):rep(20) .. " z")
add("repetition", ("a"):rep(64) .. " " .. ("ab"):rep(30) .. " " .. ("="):rep(50) .. " " ..
  ("-_"):rep(20) .. " " .. ("🙂"):rep(10))
add("base64 blob", "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==")
add("rl observation", "Observation: the room has 3 doors (north, east, west). You hold: " ..
  "[key, torch]. HP=17/20. Last action `open east` -> \"The door is locked.\"\n> ")
add("european languages", "Über den Wolken muss die Freiheit wohl grenzenlos sein. Ça va très " ..
  "bien, merci ! ¿Dónde está la biblioteca? Ærø, Øresund, Łódź, İstanbul, ß and ẞ.")
add("typography", "“Smart quotes” and ‘single’ — em dash – en dash … ellipsis • bullet " ..
  "© ® ™ § ¶ † ‡ ° ± × ÷ € £ ¥ ¢ ₹ ₿")
add("html", "<div class=\"box\" id='main'>\n  <p>Hello &amp; welcome!</p>\n  " ..
  "<img src=\"a.png\" alt=\"\"/>\n</div>")
add("sql", "SELECT u.id, COUNT(*) AS n FROM users u JOIN orders o ON o.user_id = u.id " ..
  "WHERE o.total > 100.50 GROUP BY u.id HAVING n >= 3 ORDER BY n DESC;")
add("tool call", "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": " ..
  "\"weather in Paris\", \"limit\": 5}}\n</tool_call>")
add("indented yaml", "env:\n  name: gridworld\n  size: [8, 8]\n  rewards:\n    goal: 1.0\n" ..
  "    step: -0.01\n    # comment\n")
add("punctuation runs", "!!! ??? ... --- *** ### $$$ %%% ^^^ &&& ((( ))) {{{ }}} ;;; ::: ,,, " ..
  "'' \"\" `` ~~ ||| \\ // <<>> ?!")
add("math symbols", "∀x ∈ ℝ: x² ≥ 0, ∑ᵢ aᵢ ≤ ∏ⱼ bⱼ, ∫₀^∞ e^{-x} dx = 1, ∇·F, ∂f/∂x, √2 ≈ 1.414")
add("invalid: lone bytes", "ab\255cd\254 \128x \191", true)
add("invalid: truncated sequences", "x\228\184 y\240\159\152 z\226", true)
add("invalid: overlong and surrogates", "\192\175 \224\128\175 \237\160\128\237\176\128 ok", true)
add("invalid: out of range", "\244\144\128\128 \245\128 \248\136\128\128\128 \255\255", true)
add("invalid: before letters and digits", "\255abc \226\130def \200123 \195", true)
add("invalid: inside special tokens", "<|im_\255end|> <|im_end|>\255", true)
add("invalid: with combining mark", "e\255\u{301} \255\u{301}", true)

return corpus
