#!/usr/bin/env bash
# What an exported model's Hugging Face tokenizer does with the text
# <|endoftext|> inside a text: `attnres export hf --special text|allow` writes
# tokenizer_config.json (split_special_tokens true / false) and records the
# choice in config.json; `--special refuse` has no Hugging Face equivalent and
# is refused. A small model trained one step with GPT-2's vocabulary gives the
# checkpoint a Hugging Face tokenizer.json.
# ATTNRES_TEST_PART=transformers (its own CTest test): transformers'
# AutoTokenizer loads each export and must give `attnres tokenize encode
# --special` the same ids on texts holding <|endoftext|>; skipped (exit 77)
# where transformers is not installed.
# ATTNRES_TEST_PART=tokenizers (its own CTest test): Hugging Face's tokenizers
# library itself (npm tokenizers 0.23.2, its prebuilt x86-64 Linux binary;
# scripts/fetch_hf_tokenizers.sh) loads each export's tokenizer.json and must
# give `attnres tokenize encode --special` the same ids on the ~16,300 hard
# texts of tests/data/test_gpt2_reference.cpp and on texts holding
# <|endoftext|>, as far as the library carries the choice (what it does with
# the token per choice, and what is left to transformers' split_special_tokens:
# tests/cli/hf_tokenizer_lib.js); skipped (exit 77) where the package was not
# fetched or the platform has no binary of it.
source "$(dirname "$0")/lib.sh"
GPT2="$SRC/data/gpt2"
part="${ATTNRES_TEST_PART:-}"
case "$part" in
  ""|transformers|tokenizers) ;;
  *) fail "unknown ATTNRES_TEST_PART '$part' (transformers, tokenizers, or unset)" ;;
esac
[[ -f $GPT2/encoder.json && -f $GPT2/vocab.bpe ]] \
  || { echo "skipped: no $GPT2/encoder.json + vocab.bpe (scripts/fetch_gpt2.sh)"; exit 77; }
if [[ $part == transformers ]] && ! "$PY" -c "import transformers" 2>/dev/null; then
  echo "skipped: $PY cannot import transformers: AutoTokenizer.from_pretrained(export) not checked"
  exit 77
fi
HF_LIB="$SRC/data/hf_tokenizers"
if [[ $part == tokenizers ]]; then
  # The package ships a binary per platform; scripts/fetch_hf_tokenizers.sh
  # keeps x86-64 Linux's (glibc) alone.
  if [[ $(uname -s) != Linux || $(uname -m) != x86_64 ]] || ! getconf GNU_LIBC_VERSION >/dev/null 2>&1; then
    echo "skipped: the tokenizers library is run from its x86-64 Linux (glibc) binary; this is $(uname -s) $(uname -m)$(getconf GNU_LIBC_VERSION >/dev/null 2>&1 || echo ' without glibc')"
    exit 77
  fi
  for f in index.js package.json tokenizers.linux-x64-gnu.node; do
    [[ -f $HF_LIB/$f ]] || { echo "skipped: no $HF_LIB/$f (scripts/fetch_hf_tokenizers.sh fetches Hugging Face's tokenizers library)"; exit 77; }
  done
  command -v node >/dev/null || { echo "skipped: node is not installed (scripts/install_deps.sh corpus)"; exit 77; }
fi

# ---- a checkpoint carrying GPT-2's vocabulary as tokenizer.json ----
mkdir -p text
printf 'The jury said it did find that the city had been ably run.\n' > text/a.txt
"$BIN" tokenize encode --tokenizer "$GPT2" --input text --output-dir shards --val-fraction 0 \
  --name t >/dev/null || fail "encoding a text with GPT-2's vocabulary"
cat > tiny.json <<JSON
{"model": {"vocab_size": 50304, "d_model": 16, "n_layers": 2, "n_heads": 2, "n_kv_heads": 2,
           "d_ff": 32, "residual": {"mode": "block", "block_size": 2}},
 "training": {"steps": 1, "micro_batch_size": 1, "seq_len": 8, "grad_accum": 1, "seed": 1},
 "data": {"train": "shards/t_train_*.bin", "tokenizer": "$GPT2"},
 "checkpoint": {"dir": "ckpt", "every": 0}, "eval": {"every": 0},
 "run": {"dir": "run", "log_every": 1}}
JSON
"$BIN" train tiny.json 2>train.txt || { cat train.txt; fail "training one step"; }
ck=ckpt/step_00000001

# ---- the export says what the tokenizer does with the text <|endoftext|> ----
for mode in text allow; do
  "$BIN" export hf --checkpoint $ck --out "hf_$mode" --special $mode 2>/dev/null || fail "export --special $mode"
done
"$BIN" export hf --checkpoint $ck --out hf_default 2>/dev/null || fail "export without --special"
"$PY" - <<'PYEOF' || fail "tokenizer_config.json / config.json"
import json
for d, split in (("hf_text", True), ("hf_allow", False), ("hf_default", True)):
    tc = json.load(open(f"{d}/tokenizer_config.json"))
    assert tc["split_special_tokens"] is split, (d, tc)
    assert tc["tokenizer_class"] == "PreTrainedTokenizerFast", (d, tc)
    assert tc["eos_token"] == tc["bos_token"] == "<|endoftext|>", (d, tc)
    assert tc["clean_up_tokenization_spaces"] is False, (d, tc)
    want = "text" if split else "allow"
    got = json.load(open(f"{d}/config.json"))["attnres"]["tokenizer"]["special"]
    assert got == want, (d, got)
    readme = open(f"{d}/README.md").read()
    assert ("split_special_tokens true" in readme) == split, (d, "README")
PYEOF
pass "tokenizer_config.json: split_special_tokens true for --special text (the default), false for allow; config.json and README.md say the same"
expect_error "export --special refuse" "no Hugging Face equivalent" \
  "$BIN" export hf --checkpoint $ck --out hf_refuse --special refuse
expect_error "export --special nonsense" "--special" \
  "$BIN" export hf --checkpoint $ck --out hf_bad --special nonsense
# --force over an export of the other choice leaves no stale file behind.
"$BIN" export hf --checkpoint $ck --out hf_text --special allow --force 2>/dev/null || fail "export --force"
grep -q '"split_special_tokens": false' hf_text/tokenizer_config.json || fail "--force kept the old tokenizer_config.json"
"$BIN" export hf --checkpoint $ck --out hf_text --special text --force 2>/dev/null || fail "export --force back"
pass "--special refuse and unknown values exit 2; --force rewrites tokenizer_config.json"

[[ -n $part ]] || { echo "all hf_tokenizer checks passed (transformers' ids: the test with ATTNRES_TEST_PART=transformers; the tokenizers library's: ATTNRES_TEST_PART=tokenizers)"; exit 0; }

if [[ $part == tokenizers ]]; then
  # ---- the tokenizers library's ids = ours, per choice ----
  # Both choices export the same tokenizer.json: the choice is tokenizer_config.json's.
  cmp -s hf_text/tokenizer.json hf_allow/tokenizer.json || fail "--special text and allow exported different tokenizer.json files"
  TEST_DATA="$(dirname "$BIN")/tests/test_data"
  [[ -x $TEST_DATA ]] || fail "no $TEST_DATA (it writes the hard texts of tests/data/test_gpt2_reference.cpp)"
  ATTNRES_GPT2_TEXTS_OUT="$PWD/hard.json" "$TEST_DATA" "[.gpt2_texts]" >texts.log 2>&1 \
    || { cat texts.log; fail "writing the hard texts"; }
  node "$SRC/tests/cli/hf_tokenizer_lib.js" docs hard.json all.json docs || fail "writing the texts as documents"
  for mode in text allow; do
    "$BIN" tokenize encode --tokenizer "$GPT2" --input docs --output-dir "enc_$mode" --val-fraction 0 --name x \
      --special $mode >/dev/null || fail "tokenize encode --special $mode of the texts"
    [[ $(ls "enc_$mode") == x_train_000000.bin ]] || fail "expected one shard from --special $mode, got: $(ls "enc_$mode")"
  done
  node "$SRC/tests/cli/hf_tokenizer_lib.js" check "$HF_LIB" all.json hf_text/tokenizer.json enc_text/x_train_000000.bin \
    hf_allow/tokenizer.json enc_allow/x_train_000000.bin || fail "the tokenizers library gave other ids"
  pass "Hugging Face's tokenizers library on the exports' tokenizer.json = attnres tokenize encode --special text / allow"
  exit 0
fi

# ---- transformers' ids = ours, per choice ----
texts=('a<|endoftext|>b' '<|endoftext|>' 'Hello <|endoftext|> world' '<|endoftext|><|endoftext|>x'
       'é<|endoftext|>日本' 'cut <|endoftext short' ' <|endoftext|>')
: > cases.txt
i=0
for t in "${texts[@]}"; do
  for mode in text allow; do
    rm -rf in out; mkdir -p in
    printf '%s' "$t" > in/a.txt
    "$BIN" tokenize encode --tokenizer "$GPT2" --input in --output-dir out --val-fraction 0 --name x \
      --special $mode >/dev/null || fail "tokenize encode --special $mode of '$t'"
    # The shard's ids after the document's leading <|endoftext|>.
    ids=$(od -An -v -t u2 -j 1024 out/x_train_000000.bin | tr -s ' \n' ' ' | sed 's/^ //; s/ $//' | cut -d' ' -f2-)
    printf '%s\t%s\t%s\n' "$mode" "$(printf '%s' "$t" | base64 -w0)" "$ids" >> cases.txt
  done
  i=$((i + 1))
done
"$PY" - <<'PYEOF' || fail "transformers' AutoTokenizer gave other ids"
import base64
from transformers import AutoTokenizer
toks = {m: AutoTokenizer.from_pretrained(f"hf_{m}") for m in ("text", "allow")}
bad = 0
for line in open("cases.txt", encoding="utf-8"):
    mode, b64, ids = line.rstrip("\n").split("\t")
    text = base64.b64decode(b64).decode("utf-8")
    want = [int(x) for x in ids.split()] if ids.strip() else []
    got = toks[mode](text, add_special_tokens=False)["input_ids"]
    if got != want:
        bad += 1
        print(f"{mode}: {text!r}: transformers {got}, attnres {want}")
assert bad == 0
print(f"ok: {sum(1 for _ in open('cases.txt'))} texts, transformers = attnres in both choices")
PYEOF
pass "transformers' AutoTokenizer on the exports = attnres tokenize encode --special text / allow"
