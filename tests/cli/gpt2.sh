#!/usr/bin/env bash
# GPT-2's vocabulary end to end: Brown encoded with GPT-2's encoder.json +
# vocab.bpe into llm.c shards, a small model trained a few hundred steps on
# them with data.tokenizer pointing at GPT-2's files, and `generate` from the
# checkpoint alone (which must carry the vocabulary as one tokenizer.json)
# sampling readable English. Needs data/gpt2/ and data/brown/raw/
# (scripts/test.sh fetches both); says "skipped: ..." without them.
source "$(dirname "$0")/lib.sh"
GPT2="$SRC/data/gpt2"
BROWN="$SRC/data/brown/raw"
[[ -f $GPT2/encoder.json && -f $GPT2/vocab.bpe ]] || { echo "skipped: no $GPT2/encoder.json + vocab.bpe (scripts/fetch_gpt2.sh)"; exit 0; }
[[ -f $BROWN/ca01 ]] || { echo "skipped: no Brown corpus in $BROWN (scripts/fetch_brown.sh)"; exit 0; }

# u16 tokens of an llm.c shard (after its 1024-byte header), space-separated.
shard_tokens() { od -An -v -t u2 -j 1024 "$1" | tr -s ' \n' ' ' | sed 's/^ //; s/ $//'; }

# ---- encode: GPT-2's ids, EOT 50256 from the vocabulary, uint16 shards ----
mkdir -p hello
printf 'Hello world' > hello/a.txt
"$BIN" tokenize encode --tokenizer "$GPT2/encoder.json" --input hello --output-dir hs --val-fraction 0 \
  --name h >enc.txt || fail "encoding a text with GPT-2's vocabulary"
[[ $(shard_tokens hs/h_train_000000.bin) == "50256 15496 995" ]] \
  || fail "'Hello world' gave $(shard_tokens hs/h_train_000000.bin), expected 50256 15496 995"
grep -q "uint16, vocab 50257" enc.txt || { cat enc.txt; fail "expected uint16 shards of a 50257-token vocabulary"; }
pass "'Hello world' -> <|endoftext|> 15496 995 (uint16 shard)"
for form in "$GPT2" "$GPT2/vocab.bpe"; do
  "$BIN" tokenize encode --tokenizer "$form" --input hello --output-dir hs2 --val-fraction 0 --name h >/dev/null \
    || fail "encoding with --tokenizer $form"
  cmp -s hs/h_train_000000.bin hs2/h_train_000000.bin || fail "--tokenizer $form gave other ids"
done
pass "the directory and vocab.bpe forms give the same ids"

"$BIN" tokenize encode --tokenizer "$GPT2/encoder.json" --input "$BROWN" --format brown --output-dir shards \
  --name brown --val-fraction 0.02 >enc.txt || { cat enc.txt; fail "encoding Brown"; }
grep -qE "^encoding: .* MB/s on [0-9]+ threads?" enc.txt || { cat enc.txt; fail "no encoding speed printed"; }
pass "Brown encoded with GPT-2's vocabulary: $(grep -E '^(tokens|encoding):' enc.txt | tr '\n' ' ')"

# ---- bad files: exit 2 and the file and the reason ----
mkdir -p lonely
cp "$GPT2/encoder.json" lonely/
expect_error "encoder.json without vocab.bpe" "lonely/vocab.bpe' does not exist" \
  "$BIN" tokenize encode --tokenizer lonely/encoder.json --input hello --output-dir x
printf '#version: 0.2\nĠ t\nnot-a-merge\n' > lonely/vocab.bpe
expect_error "a vocab.bpe with a bad line" "lonely/vocab.bpe': line 3" \
  "$BIN" tokenize encode --tokenizer lonely/vocab.bpe --input hello --output-dir x
: > lonely/vocab.bpe
expect_error "an empty vocab.bpe" "lonely/vocab.bpe' has 0 merges and" \
  "$BIN" tokenize encode --tokenizer lonely/vocab.bpe --input hello --output-dir x
head -n 1001 "$GPT2/vocab.bpe" > lonely/vocab.bpe  # the version line and 1,000 of the 50,000 merges
expect_error "a vocab.bpe cut to 1,000 merges" "has 1000 merges and" \
  "$BIN" tokenize encode --tokenizer lonely/vocab.bpe --input hello --output-dir x

# ---- train a small model on GPT-2 ids, data.tokenizer = GPT-2's files ----
cat > gpt2.json <<JSON
{"model": {"vocab_size": 50304, "d_model": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
           "d_ff": 96, "residual": {"mode": "block", "block_size": 2}},
 "optimizer": {"lr": 3e-2},
 "schedule": {"type": "cosine", "warmup_steps": 10},
 "training": {"steps": 300, "micro_batch_size": 4, "seq_len": 32, "grad_accum": 1, "seed": 1},
 "data": {"train": "shards/brown_train_*.bin", "val": "shards/brown_val_*.bin",
          "tokenizer": "$GPT2/encoder.json"},
 "checkpoint": {"dir": "ckpt", "every": 0},
 "eval": {"every": 0},
 "run": {"dir": "run", "log_every": 50}}
JSON
"$BIN" train gpt2.json 2>train.txt || { cat train.txt; fail "training on GPT-2 ids"; }
ck=ckpt/step_00000300
grep -q '"model"' $ck/tokenizer.json && grep -q '"type": "BPE"' $ck/tokenizer.json \
  || fail "the checkpoint's tokenizer.json is not a Hugging Face byte-level BPE file"
first=$(grep -m1 -o '"loss":[0-9.]*' run/metrics.jsonl | cut -d: -f2)
last=$(grep -o '"loss":[0-9.]*' run/metrics.jsonl | tail -1 | cut -d: -f2)
pass "trained 300 steps: loss $first -> $last; the checkpoint carries tokenizer.json ($(wc -c <$ck/tokenizer.json) bytes)"
"$BIN" export hf --checkpoint $ck --out hf_gpt2 2>/dev/null || fail "export of the GPT-2-vocabulary checkpoint"
cmp -s $ck/tokenizer.json hf_gpt2/tokenizer.json && [[ ! -e hf_gpt2/attnres_tokenizer.json ]] \
  || fail "the export of a GPT-2-vocabulary checkpoint should carry its Hugging Face tokenizer.json"
pass "the export carries the Hugging Face tokenizer.json as it is"
expect_error "a model too small for GPT-2's vocabulary" "has 50257 tokens, more than model.vocab_size = 4096" \
  "$BIN" train gpt2.json --model.vocab_size=4096 --checkpoint.dir=ck_small --run.dir=run_small

# ---- generate from the checkpoint alone: readable English ----
prompt="The jury said"
"$BIN" generate --checkpoint $ck --prompt "$prompt" --tokens 200 --seed 1 >gen.txt || fail "generate"
for form in "$GPT2" "$GPT2/vocab.bpe"; do
  "$BIN" generate --checkpoint $ck --tokenizer "$form" --prompt "$prompt" --tokens 200 --seed 1 >gen2.txt \
    || fail "generate --tokenizer $form"
  cmp -s gen.txt gen2.txt || fail "generate --tokenizer $form differs from the checkpoint's tokenizer.json"
done
# Readable: valid UTF-8, the prompt echoed, mostly ASCII, real words, and the
# common words of English (a model that learned nothing, or ids decoded with
# another vocabulary, gives rare word pieces or broken bytes). 200 tokens: a
# model this small also emits runs of newlines (Brown's paragraph breaks),
# and 60 tokens could hold fewer than 8 words for a valid checkpoint.
"$PY" - gen.txt "$BROWN" "$prompt" <<'PYEOF' || fail "the sample is not readable text"
import collections, os, re, sys
raw = open(sys.argv[1], "rb").read()
text = raw.decode("utf-8")  # strict: invalid UTF-8 fails
prompt = sys.argv[3]
assert text.startswith(prompt), f"prompt not echoed: {text[:80]!r}"
sample = text[len(prompt):]
assert "\ufffd" not in sample, "replacement characters"
ascii_share = sum(c < "\x80" for c in sample) / max(1, len(sample))
counts = collections.Counter()
for name in os.listdir(sys.argv[2]):
    if re.fullmatch(r"c[a-r]\d\d", name):
        for tok in open(os.path.join(sys.argv[2], name), encoding="latin-1").read().split():
            counts[tok.rsplit("/", 1)[0].lower()] += 1
common = {w for w, _ in counts.most_common(100)}
words = [w.lower() for w in re.findall(r"[A-Za-z]+", sample)]
known = sum(w in counts for w in words) / max(1, len(words))
frequent = sum(w in common for w in words) / max(1, len(words))
print(f"sample: {sample!r}")
print(f"{len(words)} words, {known:.0%} Brown words, {frequent:.0%} among its 100 commonest, {ascii_share:.0%} ASCII")
assert len(words) >= 8 and known >= 0.8 and frequent >= 0.3 and ascii_share >= 0.95
PYEOF
pass "generate samples readable text from the checkpoint's GPT-2 tokenizer"
echo "all gpt2 checks passed"
