// The reference GPT-2 encoder for tests/data/test_gpt2_reference.cpp:
// tiktoken's "gpt2" encoding (npm tiktoken 1.0.22, its WebAssembly build of
// the Rust core that Python's tiktoken wraps too), run as it ships.
//   node tiktoken_reference.js TIKTOKEN_DIR [MODE] < texts.json > ids.json
// texts.json: a JSON array of strings; ids.json: one array of ids per string.
// MODE says what "<|endoftext|>" in a text becomes: "ordinary" (default):
// text, as encode_ordinary (allowed_special and disallowed_special empty);
// "all": the token (allowed_special "all"); "default": encode()'s defaults,
// which refuse it: such a text gives null instead of ids.
'use strict';
const fs = require('fs');
const path = require('path');

const { get_encoding } = require(path.resolve(process.argv[2], 'tiktoken.cjs'));
const enc = get_encoding('gpt2');
const texts = JSON.parse(fs.readFileSync(0, 'utf-8'));
// One line per text, so that a long corpus is not one huge string in memory.
const out = fs.openSync('/dev/stdout', 'w');
fs.writeSync(out, '[\n');
const mode = process.argv[3] || 'ordinary';
const encode = {
  ordinary: (t) => enc.encode(t, [], []),
  all: (t) => enc.encode(t, 'all'),
  default: (t) => enc.encode(t),
}[mode];
if (!encode) throw new Error(`unknown mode ${mode}`);
texts.forEach((t, i) => {
  let ids = null;
  try {
    ids = Array.from(encode(t));
  } catch (e) {
    if (mode !== 'default') throw e;
  }
  fs.writeSync(out, (i ? ',\n' : '') + JSON.stringify(ids));
});
fs.writeSync(out, '\n]\n');
enc.free();
