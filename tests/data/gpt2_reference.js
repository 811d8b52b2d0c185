// The reference GPT-2 encoder for tests/data/test_gpt2_reference.cpp: the
// JavaScript encoder of the npm package gpt-3-encoder (1.1.4), run as it ships.
//   node gpt2_reference.js PACKAGE_DIR < texts.json > ids.json
// texts.json: a JSON array of strings; ids.json: one array of ids per string.
'use strict';
const fs = require('fs');
const path = require('path');

const { encode } = require(path.resolve(process.argv[2], 'Encoder.js'));
const texts = JSON.parse(fs.readFileSync(0, 'utf-8'));
// One line per text, so that a long corpus is not one huge string in memory.
const out = fs.openSync('/dev/stdout', 'w');
fs.writeSync(out, '[\n');
texts.forEach((t, i) => {
  fs.writeSync(out, (i ? ',\n' : '') + JSON.stringify(encode(t)));
});
fs.writeSync(out, '\n]\n');
