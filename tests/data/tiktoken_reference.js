// The reference GPT-2 encoder for tests/data/test_gpt2_reference.cpp:
// tiktoken's "gpt2" encoding (npm tiktoken 1.0.22, its WebAssembly build of
// the Rust core that Python's tiktoken wraps too), run as it ships.
//   node tiktoken_reference.js TIKTOKEN_DIR < texts.json > ids.json
// texts.json: a JSON array of strings; ids.json: one array of ids per string.
// "<|endoftext|>" in a text is encoded as text (allowed_special and
// disallowed_special both empty), as attnres encodes it.
'use strict';
const fs = require('fs');
const path = require('path');

const { get_encoding } = require(path.resolve(process.argv[2], 'tiktoken.cjs'));
const enc = get_encoding('gpt2');
const texts = JSON.parse(fs.readFileSync(0, 'utf-8'));
// One line per text, so that a long corpus is not one huge string in memory.
const out = fs.openSync('/dev/stdout', 'w');
fs.writeSync(out, '[\n');
texts.forEach((t, i) => {
  fs.writeSync(out, (i ? ',\n' : '') + JSON.stringify(Array.from(enc.encode(t, [], []))));
});
fs.writeSync(out, '\n]\n');
enc.free();
