#!/usr/bin/env bash
# `attnres tokenize decode` gives back the exact bytes of ids (from --ids, from
# stdin, from a shard), invalid UTF-8 included; bad ids and option mixes exit 2.
# `attnres score` marks the pieces that hold part of a UTF-8 character.
source "$(dirname "$0")/lib.sh"
make_corpus

# A document of text, characters the tokenizer never saw and invalid UTF-8.
mkdir doc
printf 'the jury said \xe2\x82\xac 5 \xf0\x9f\x98\x80 caf\xc3\xa9 \xff\xfe\x80 end\n' > doc/a.txt
"$BIN" tokenize encode --tokenizer tok.json --input doc --output-dir enc --val-fraction 0 --name d > /dev/null
shard=enc/d_train_000000.bin
"$BIN" tokenize decode --tokenizer tok.json --shard "$shard" --offset 1 > out.bin  # after the leading EOT
cmp out.bin doc/a.txt || fail "decode --shard did not give back the document's bytes"
pass "decode --shard --offset 1: the document's $(wc -c < doc/a.txt) bytes exactly"

ids=$(od -An -v -t u2 -j 1026 "$shard" | tr -s ' \n' ' ')  # the ids after the EOT
"$BIN" tokenize decode --tokenizer tok.json --ids $ids > out2.bin
cmp out2.bin doc/a.txt || fail "decode --ids (separate arguments) differs"
echo "[$(echo $ids | tr ' ' ',')]" | "$BIN" tokenize decode --tokenizer tok.json --ids - --output out3.bin
cmp out3.bin doc/a.txt || fail "decode --ids - (a JSON array on stdin) with --output differs"
"$BIN" tokenize decode --tokenizer tok.json --shard "$shard" --count 1 > eot.txt
[[ $(cat eot.txt) == "<|endoftext|>" ]] || fail "the shard's first token is not <|endoftext|>: $(cat eot.txt)"
pass "decode --ids (arguments; a JSON array on stdin, --output) and --shard --count 1"

expect_error "an id outside the vocabulary" "id 300 is not a token of the vocabulary [0, 300)" \
  "$BIN" tokenize decode --tokenizer tok.json --ids 5 300
expect_error "a word that is not an id" "'x7' is not an integer id" \
  "$BIN" tokenize decode --tokenizer tok.json --ids 5 x7
expect_error "both --ids and --shard" "decode takes --ids or --shard" \
  "$BIN" tokenize decode --tokenizer tok.json --ids 5 --shard "$shard"
expect_error "--count past the shard" "--count = 100000 is out of range" \
  "$BIN" tokenize decode --tokenizer tok.json --shard "$shard" --count 100000

# encode --special: the text <|endoftext|> inside a document.
mkdir eotdoc
printf 'the jury<|endoftext|>said' > eotdoc/e.txt
eot_count() { od -An -v -t u2 -j 1024 "$1" | tr -s ' \n' '\n' | grep -cx 299 || true; }  # tok.json's EOT is 299
"$BIN" tokenize encode --tokenizer tok.json --input eotdoc --output-dir e1 --val-fraction 0 --name e > /dev/null
"$BIN" tokenize encode --tokenizer tok.json --input eotdoc --output-dir e2 --val-fraction 0 --name e --special allow > /dev/null
[[ $(eot_count e1/e_train_000000.bin) -eq 1 && $(eot_count e2/e_train_000000.bin) -eq 2 ]] \
  || fail "--special: expected 1 EOT as text (default) and 2 with allow"
expect_error "encode --special refuse" "eotdoc/e.txt: the text holds the special token <|endoftext|> at byte 8" \
  "$BIN" tokenize encode --tokenizer tok.json --input eotdoc --output-dir e3 --val-fraction 0 --name e --special refuse
pass "encode --special: text (one EOT, the document's own), allow (two), refuse (exit 2)"

# score: a token inside the euro sign is written <0xE2>..., and listed in "partial".
write_config
"$BIN" train base.json --training.steps=1 --checkpoint.every=1 --eval.every=0 2> train.txt \
  || { cat train.txt; fail "training the model to score with"; }
"$BIN" score --checkpoint ckpt/step_00000001 --text $'price \xe2\x82\xac5 caf\xc3\xa9' > score.json
"$PY" - score.json <<'PYEOF' || fail "score's pieces"
import json, sys
s = json.load(open(sys.argv[1]))
pieces, partial = s["pieces"], s["partial"]
marked = [i for i, p in enumerate(pieces) if "<0x" in p]
assert marked and marked == partial, (pieces, partial)
assert "".join(pieces).startswith("price <0xE2><0x82><0xAC>5"), pieces
assert "\ufffd" not in "".join(pieces), pieces
PYEOF
pass "score: pieces inside a character are marked <0xHH> and listed in partial ($(tr -d ' ' < score.json | grep -o '"partial":\[[0-9,]*\]'))"
