// Hugging Face's tokenizers library (npm tokenizers 0.23.2: the Rust library
// transformers' fast tokenizers run, its prebuilt napi binary) on an export's
// tokenizer.json, against `attnres tokenize encode`. Driven by
// tests/cli/hf_tokenizer.sh (ATTNRES_TEST_PART=tokenizers).
//
//   node hf_tokenizer_lib.js docs HARD.json ALL.json DOCS_DIR
//     ALL.json = the hard texts of tests/data/test_gpt2_reference.cpp (HARD.json,
//     written by `test_data "[.gpt2_texts]"`) and the texts with <|endoftext|>
//     below; each also written as a document DOCS_DIR/tNNNNN for `tokenize encode`.
//   node hf_tokenizer_lib.js check LIB_DIR ALL.json TOKENIZER_TEXT SHARD_TEXT TOKENIZER_ALLOW SHARD_ALLOW
//     TOKENIZER_*: the tokenizer.json of `export hf --special text` / `allow`;
//     SHARD_*: `tokenize encode --special text` / `allow` of DOCS_DIR (one shard).
//
// What the library does with the text <|endoftext|> inside a text. The export
// writes the same tokenizer.json for both choices; it declares <|endoftext|>
// an added token with "special": true (and lstrip, rstrip, single_word false).
// The library splits every added token out of a text before its pre-tokenizer
// runs, whatever encode()'s addSpecialTokens says (that option only adds what
// the post-processor adds, and GPT-2's ByteLevel post-processor adds nothing):
//   --special allow: the library as exported gives the token, as attnres does:
//     checked on every text, with addSpecialTokens true and false.
//   --special text: the library as exported gives the token too, not its
//     bytes: it reads no tokenizer_config.json, and this node binding has no
//     switch for it (Tokenizer has no encodeSpecialTokens). Its ids are
//     checked to equal attnres' --special text ids on the texts without
//     <|endoftext|> and --special allow's on those with it. The text choice
//     is transformers' split_special_tokens (tokenizer_config.json: true),
//     which PreTrainedTokenizerFast passes to the Rust tokenizer as
//     encode_special_tokens = true: special added tokens are then not split
//     out and their text goes through the pre-tokenizer and BPE like any
//     other. For this file, whose one added token is special, that is the
//     library on the same tokenizer.json with "added_tokens" emptied, checked
//     here to give --special text's ids on every text. That the flag reaches
//     the library is transformers' part (ATTNRES_TEST_PART=transformers).
// Every text also decodes back from attnres' ids through the library's
// ByteLevel decoder (special tokens kept).
'use strict';
const fs = require('fs');
const path = require('path');

const EOT = 50256;
const EOT_TEXT = '<|endoftext|>';
const SHARD_MAGIC_U16 = 20240520;

// Texts with <|endoftext|> (or pieces of it): those of tests/cli/hf_tokenizer.sh's
// transformers part and of test_gpt2_reference.cpp's "<|endoftext|> in text" case.
const SPECIAL_TEXTS = [
  'a<|endoftext|>b', '<|endoftext|>', 'Hello <|endoftext|> world', '<|endoftext|><|endoftext|>x',
  'é<|endoftext|>日本', 'cut <|endoftext short', ' <|endoftext|>', '<|endoftext|> ',
  'a<|endoftext|>', '<|endoftext|>b', 'Hello<|endoftext|> world', ' <|endoftext|> ',
  'x<|endoftext|>\n<|endoftext|>y', '<|endoftext|', '<|endoftext', '|><|endoftext|><|',
  'no special here', 'café<|endoftext|>日本', '\t<|endoftext|>\n', '<|endoftext|>\u00a0x',
];

const show = (s) => JSON.stringify(s.length > 80 ? s.slice(0, 80) + '...' : s);
const fail = (msg) => {
  console.error(`FAIL: ${msg}`);
  process.exit(1);
};
const count = (text, piece) => text.split(piece).length - 1;
const same = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);

function writeDocs(hardPath, allPath, dir) {
  const hard = JSON.parse(fs.readFileSync(hardPath, 'utf8'));
  if (!Array.isArray(hard) || hard.length < 16000) fail(`${hardPath}: expected the ~16,300 hard texts, got ${hard.length}`);
  const texts = hard.concat(SPECIAL_TEXTS);
  if (texts.length > 99999) fail('more texts than tNNNNN names');
  fs.mkdirSync(dir, { recursive: true });
  texts.forEach((t, i) => fs.writeFileSync(path.join(dir, 't' + String(i).padStart(5, '0')), t, 'utf8'));
  fs.writeFileSync(allPath, JSON.stringify({ hard: hard.length, texts }));
  console.log(`${texts.length} documents written (${hard.length} hard texts, ${SPECIAL_TEXTS.length} written around <|endoftext|>)`);
}

// attnres' ids of each text from its shard: every document starts with
// <|endoftext|>, and under --special allow each <|endoftext|> in a text is one
// more, so text i takes 1 + (its count of them) such pieces.
function attnresIds(shardPath, texts, allow) {
  const b = fs.readFileSync(shardPath);
  if (b.length < 1024 || b.readInt32LE(0) !== SHARD_MAGIC_U16 || b.readInt32LE(4) !== 1)
    fail(`${shardPath}: not a uint16 llm.c shard`);
  const n = b.readInt32LE(8);
  if (b.length !== 1024 + 2 * n) fail(`${shardPath}: ${n} tokens in the header, ${(b.length - 1024) / 2} in the file`);
  const tok = new Uint16Array(n);
  for (let i = 0; i < n; ++i) tok[i] = b.readUInt16LE(1024 + 2 * i);
  const out = [];
  let p = 0;
  texts.forEach((t, i) => {
    if (tok[p] !== EOT) fail(`${shardPath}: document ${i} does not start with <|endoftext|> (token ${p})`);
    let q = p + 1;
    for (let k = allow ? count(t, EOT_TEXT) : 0; q < n; ++q) {
      if (tok[q] === EOT && k-- === 0) break;
    }
    out.push(Array.from(tok.subarray(p + 1, q)));
    p = q;
  });
  if (p !== n) fail(`${shardPath}: ${n - p} tokens left after the ${texts.length} documents`);
  return out;
}

async function encodeAll(tokenizer, texts, options) {
  const ids = [];
  for (let i = 0; i < texts.length; i += 1024) {
    const enc = await tokenizer.encodeBatch(texts.slice(i, i + 1024), options);
    for (const e of enc) ids.push(e.getIds());
  }
  return ids;
}

async function decodeAll(tokenizer, idss) {
  const texts = [];
  for (let i = 0; i < idss.length; i += 1024) texts.push(...(await tokenizer.decodeBatch(idss.slice(i, i + 1024), false)));
  return texts;
}

// Reports the first few texts where `got` differs from `want`; returns how many.
function differences(what, texts, got, want, pick = () => true) {
  let bad = 0;
  texts.forEach((t, i) => {
    if (!pick(i) || same(got[i], want[i])) return;
    if (++bad > 5) return;
    let k = 0;
    while (k < got[i].length && got[i][k] === want[i][k]) ++k;
    const around = (ids) => (k > 3 ? '... ' : '') + ids.slice(Math.max(0, k - 3), k + 4).join(',') + (k + 4 < ids.length ? ' ...' : '');
    console.error(`${what}: text ${i} ${show(t)}: first difference at token ${k}\n  library: ${around(got[i])}\n  attnres: ${around(want[i])}`);
  });
  return bad;
}

async function check(libDir, allPath, tokText, shardText, tokAllow, shardAllow) {
  if (!(process.platform === 'linux' && process.arch === 'x64'))
    fail(`${process.platform}-${process.arch}: this test uses the linux-x64-gnu binary only`);
  const { Tokenizer } = require(path.resolve(libDir, 'index.js'));
  const { version } = JSON.parse(fs.readFileSync(path.join(libDir, 'package.json'), 'utf8'));
  const { hard, texts } = JSON.parse(fs.readFileSync(allPath, 'utf8'));
  const withEot = texts.map((t) => t.includes(EOT_TEXT));
  const nEot = withEot.filter(Boolean).length;
  const want = { text: attnresIds(shardText, texts, false), allow: attnresIds(shardAllow, texts, true) };
  let bad = 0;

  // ---- --special allow: the library as exported ----
  const allow = Tokenizer.fromFile(tokAllow);
  if (allow.getVocabSize(true) !== 50257 || allow.tokenToId(EOT_TEXT) !== EOT)
    fail(`${tokAllow}: vocabulary ${allow.getVocabSize(true)}, <|endoftext|> = ${allow.tokenToId(EOT_TEXT)}`);
  const allowIds = await encodeAll(allow, texts, { addSpecialTokens: false });
  bad += differences('--special allow, addSpecialTokens false', texts, allowIds, want.allow);
  bad += differences('--special allow, addSpecialTokens true', texts, await encodeAll(allow, texts), want.allow);
  if (bad) fail(`the library on ${tokAllow} differs from tokenize encode --special allow on ${bad} texts`);
  console.log(`ok: --special allow: the library's ids = attnres' on all ${texts.length} texts (addSpecialTokens` +
              ` true and false; <|endoftext|> in a text becomes ${EOT} in ${nEot} of them)`);

  // ---- --special text: as exported, then as encode_special_tokens = true ----
  const text = Tokenizer.fromFile(tokText);
  if ('encodeSpecialTokens' in text || 'setEncodeSpecialTokens' in text)
    fail('this binding has an encode_special_tokens switch now: check --special text with it');
  const textIds = await encodeAll(text, texts, { addSpecialTokens: false });
  bad += differences('--special text, as exported, texts without <|endoftext|>', texts, textIds, want.text, (i) => !withEot[i]);
  bad += differences('--special text, as exported, texts with <|endoftext|> (expected: as allow)', texts, textIds, want.allow,
                     (i) => withEot[i]);
  const unlike = texts.filter((t, i) => withEot[i] && !same(textIds[i], want.text[i])).length;
  if (unlike !== nEot) fail(`--special text: ${nEot - unlike} texts with <|endoftext|> got text ids from the library alone`);
  const json = JSON.parse(fs.readFileSync(tokText, 'utf8'));
  const specials = json.added_tokens;
  if (!(specials.length === 1 && specials[0].special === true && specials[0].content === EOT_TEXT && specials[0].id === EOT))
    fail(`${tokText}: added_tokens ${JSON.stringify(specials)}, expected <|endoftext|> alone, special`);
  const split = Tokenizer.fromString(JSON.stringify({ ...json, added_tokens: [] }));
  bad += differences('--special text, special token not split out', texts, await encodeAll(split, texts, { addSpecialTokens: false }),
                     want.text);
  if (bad) fail(`the library on ${tokText} differs from tokenize encode --special text / allow on ${bad} texts`);
  console.log(`ok: --special text: the library as exported = attnres' text ids on the ${texts.length - nEot} texts` +
              ` without <|endoftext|>, and gives the token (allow's ids) on the ${nEot} with it: split_special_tokens` +
              ` is transformers'; with <|endoftext|> not split out (encode_special_tokens = true) = attnres' text ids` +
              ` on all ${texts.length}`);

  // ---- decoding attnres' ids ----
  for (const [mode, tok] of [['text', text], ['allow', allow]]) {
    const back = await decodeAll(tok, want[mode]);
    const wrong = texts.filter((t, i) => back[i] !== t);
    if (wrong.length) fail(`the library decodes --special ${mode}'s ids of ${wrong.length} texts to another text, e.g. ${show(wrong[0])}`);
  }
  console.log(`ok: the library decodes attnres' ids (both choices) back to every text`);
  for (const t of ['a<|endoftext|>b', ' <|endoftext|> ']) {
    const i = texts.indexOf(t);
    console.log(`   ${show(t)}: allow [${want.allow[i]}], text [${want.text[i]}]`);
  }
  console.log(`texts compared: ${texts.length} (${hard} hard texts + ${texts.length - hard} written around <|endoftext|>),` +
              ` tokenizers ${version}`);
}

const [mode, ...args] = process.argv.slice(2);
if (mode === 'docs' && args.length === 3) writeDocs(...args);
else if (mode === 'check' && args.length === 6) check(...args).catch((e) => fail(e.stack || e));
else fail('usage: node hf_tokenizer_lib.js docs HARD.json ALL.json DOCS_DIR | check LIB ALL.json TOK_TEXT SHARD_TEXT TOK_ALLOW SHARD_ALLOW');
