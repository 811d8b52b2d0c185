#!/usr/bin/env bash
# A checkpoint's config.json names what may load it: model_type "llama" and
# LlamaForCausalLM only for the baseline (a Llama model); Full and Block
# AttnRes say "attnres" and AttnResForCausalLM, which a Llama loader refuses.
# A checkpoint written before that label (tests/fixtures/
# checkpoint_before_attnres_label: Block AttnRes labelled "llama") is still read
# by every reader: eval (its recorded val loss), generate, inspect checkpoint,
# export hf, resume and model.init_from.
source "$(dirname "$0")/lib.sh"
make_corpus
write_config
# "model_type architectures[0] attn_res.mode" of a config.json
label() {
  "$PY" -c 'import json, sys; c = json.load(open(sys.argv[1]))
print(c["model_type"], c["architectures"][0], c["attn_res"]["mode"])' "$1"
}

# ---- what a checkpoint says now ----
for mode in baseline full block; do
  args=(--model.residual.mode=$mode --training.steps=2 --checkpoint.every=2 --eval.every=0
        --checkpoint.dir=ck_$mode --run.dir=run_$mode)
  [[ $mode == block ]] || args+=(--model.residual.block_size=0)
  "$BIN" train base.json "${args[@]}" 2> log_$mode.txt || { cat log_$mode.txt; fail "$mode: training"; }
  got=$(label ck_$mode/step_00000002/config.json)
  case $mode in
    baseline) want="llama LlamaForCausalLM baseline" ;;
    *) want="attnres AttnResForCausalLM $mode" ;;
  esac
  [[ "$got" == "$want" ]] || fail "$mode checkpoint's config.json says '$got', expected '$want'"
  pass "$mode checkpoint: $got"
done

# ---- a checkpoint labelled "llama" in Block mode, as written before ----
fixture="$SRC/tests/fixtures/checkpoint_before_attnres_label"
mkdir old && cp -r "$fixture/step_00000004" old/
[[ $(label old/step_00000004/config.json) == "llama LlamaForCausalLM block" ]] \
  || fail "the fixture is not an old-label Block checkpoint: $(label old/step_00000004/config.json)"

# eval: the val loss its run recorded (2 batches; another CPU rounds differently).
want=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["val_loss"])' "$fixture/expected.json")
got=$("$BIN" eval --checkpoint old/step_00000004 --data 'shards/tiny_val_*.bin' --batches 2 \
      | sed -E 's/.*"loss":([^,}]*).*/\1/')
"$PY" -c 'import math, sys; a, b = map(float, sys.argv[1:]); sys.exit(not abs(a - b) <= 1e-5 * max(1.0, abs(b)))' \
  "$got" "$want" || fail "eval of the old checkpoint: loss $got, its run recorded $want"
pass "eval reads the old checkpoint: loss $got (recorded $want)"

"$BIN" generate --checkpoint old/step_00000004 --prompt "the quick" --tokens 5 > gen.txt 2> err.txt \
  || { cat err.txt; fail "generate from the old checkpoint"; }
[[ -s gen.txt ]] || fail "generate from the old checkpoint printed nothing"
"$BIN" inspect checkpoint old/step_00000004 > inspect.txt 2> err.txt \
  || { cat err.txt; fail "inspect checkpoint of the old checkpoint"; }
grep -q "block" inspect.txt || { cat inspect.txt; fail "inspect checkpoint does not name the block mode"; }
"$BIN" export hf --checkpoint old/step_00000004 --out hf_old > /dev/null 2> err.txt \
  || { cat err.txt; fail "export hf of the old checkpoint"; }
[[ $(label hf_old/config.json) == "attnres AttnResForCausalLM block" ]] \
  || fail "export of the old checkpoint says $(label hf_old/config.json)"
pass "generate, inspect checkpoint and export hf read the old checkpoint"

# resume from it (the run's own config: tiny shapes, the same relative data paths) ...
"$BIN" train "$fixture/train.json" --checkpoint.dir=old --checkpoint.resume=auto --training.steps=6 \
  --checkpoint.every=6 --run.dir=run_old 2> log_old.txt || { cat log_old.txt; fail "resume from the old checkpoint"; }
grep -q "resum" log_old.txt || { cat log_old.txt; fail "the run did not say it resumed"; }
[[ $(grep -c '"loss"' run_old/metrics.jsonl) -eq 2 ]] || fail "resume: expected steps 5 and 6 only"
[[ $(label old/step_00000006/config.json) == "attnres AttnResForCausalLM block" ]] \
  || fail "the resumed run's checkpoint says $(label old/step_00000006/config.json)"
# ... and start a new run from its weights.
"$BIN" train "$fixture/train.json" --model.init_from=old/step_00000004 --training.steps=1 \
  --checkpoint.dir=ck_init --run.dir=run_init 2> log_init.txt || { cat log_init.txt; fail "model.init_from the old checkpoint"; }
pass "resume and model.init_from read the old checkpoint; their checkpoints say attnres"
