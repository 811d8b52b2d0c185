#!/usr/bin/env bash
# Every rejection path: non-zero exit, a message naming the key or file, and
# nothing written or overwritten.
source "$(dirname "$0")/lib.sh"
make_corpus
write_config

expect_error "unknown key" "model.foo" "$BIN" train base.json --model.foo=1
expect_error "wrong type" "model.d_model" "$BIN" train base.json --model.d_model='"wide"'
expect_error "heads not dividing d_model" "model.n_heads" "$BIN" train base.json --model.n_heads=5
expect_error "bad n_kv_heads" "model.n_kv_heads" "$BIN" train base.json --model.n_kv_heads=3
expect_error "unknown residual mode" "model.residual.mode" "$BIN" train base.json --model.residual.mode='"dense"'
expect_error "block mode without a size" "model.residual" "$BIN" train base.json --model.residual='{"mode":"block"}'
expect_error "unknown schedule" "schedule.type" "$BIN" train base.json --schedule.type='"linear"'
# The MoE section (base.json has 2 layers): what is wrong | the key named |
# the section's other keys, after 4 experts of width 16.
while IFS='|' read -r what key keys; do
  expect_error "$what" "$key" "$BIN" train base.json --model.moe="{\"experts\": 4, \"expert_d_ff\": 16$keys}"
done <<'CASES'
MoE top_k above the experts|model.moe.top_k|, "top_k": 5
MoE experts without top_k|model.moe.top_k|
MoE dense_layers leaving no MoE layer|model.moe.dense_layers|, "top_k": 2, "dense_layers": 2
unknown MoE router|model.moe.router|, "top_k": 2, "router": "relu"
unknown MoE balance|model.moe.balance|, "top_k": 2, "balance": "loss"
negative capacity factor|model.moe.capacity_factor|, "top_k": 2, "capacity_factor": -1
CASES
# Expert parallelism: EP must divide the replicas and the experts, and needs experts.
moe4='{"experts": 4, "top_k": 2, "expert_d_ff": 16}'
expect_error "expert parallelism not dividing the experts" \
  "parallel.expert: 3 does not divide model.moe.experts = 4" \
  "$BIN" train base.json --model.moe="$moe4" --parallel.data=3 --parallel.expert=3
expect_error "expert parallelism not dividing the replicas" \
  "parallel.expert: 2 does not divide parallel.data = 1" \
  "$BIN" train base.json --model.moe="$moe4" --parallel.expert=2
expect_error "expert parallelism of a dense model" "parallel.expert: 2 needs a MoE model" \
  "$BIN" train base.json --parallel.data=2 --parallel.expert=2
expect_error "zero expert parallelism" "parallel.expert" "$BIN" train base.json --parallel.expert=0
expect_error "CUDA graphs over MoE layers" "training.cuda_graphs: true with model.moe" "$BIN" train \
  base.json --training.device=cuda --training.cuda_graphs=true \
  --model.moe='{"experts": 4, "top_k": 2, "expert_d_ff": 16}'
expect_error "missing config file" "nope.json" "$BIN" train nope.json
echo '{"model": {' > broken.json
expect_error "config not JSON" "broken.json" "$BIN" train broken.json
expect_error "missing shard" "data.train" "$BIN" train base.json --data.train=missing/*.bin
[[ ! -e run && ! -e ckpt ]] || fail "a rejected config wrote files"

cp shards/tiny_train_000000.bin short.bin
truncate -s -7 short.bin
expect_error "truncated shard" "short.bin" "$BIN" train base.json --data.train=short.bin
head -c 5000 /dev/urandom > garbage.bin
expect_error "garbage shard" "garbage.bin" "$BIN" train base.json --data.train=garbage.bin
head -c 100 shards/tiny_train_000000.bin > header_only.bin
expect_error "shard shorter than its header" "header_only.bin" "$BIN" train base.json --data.train=header_only.bin
[[ ! -e run && ! -e ckpt ]] || fail "a rejected shard wrote files"

# A damaged checkpoint is detected and never loaded silently.
"$BIN" train base.json --training.steps=8 >/dev/null 2>&1 || fail "training run failed"
[[ -d ckpt/step_00000004 && -d ckpt/step_00000008 ]] || fail "checkpoints missing"
truncate -s -100 ckpt/step_00000008/model.safetensors
before=$(cd ckpt && find . -type f -exec md5sum {} + | sort)
expect_error "truncated checkpoint (explicit resume)" "model.safetensors" \
  "$BIN" train base.json --training.steps=12 --checkpoint.resume=ckpt/step_00000008
expect_error "truncated checkpoint (eval)" "model.safetensors" \
  "$BIN" eval --checkpoint ckpt/step_00000008 --data 'shards/tiny_val_*.bin'
after=$(cd ckpt && find . -type f -exec md5sum {} + | sort)
[[ "$before" == "$after" ]] || fail "checkpoint files changed after a rejected resume"
expect_error "fresh run into a used checkpoint dir" "checkpoint.dir" "$BIN" train base.json
# resume=auto skips the damaged newest and resumes from the older good one.
"$BIN" train base.json --training.steps=12 --checkpoint.resume=auto >out.txt 2>err.txt \
  || { cat err.txt; fail "auto resume failed"; }
grep -q "step_00000008" err.txt || fail "auto resume did not warn about the damaged checkpoint"
grep -q "resumed from ckpt/step_00000004" err.txt || { cat err.txt; fail "auto resume did not pick step 4"; }
pass "resume=auto skipped the damaged checkpoint"

# A checkpoint of another expert count is refused by name, and left as it was.
"$BIN" train base.json --training.steps=4 --model.moe="$moe4" --checkpoint.dir=ckpt_moe \
  --run.dir=run_moe >/dev/null 2>err.txt || { cat err.txt; fail "MoE training run failed"; }
before=$(cd ckpt_moe && find . -type f -exec md5sum {} + | sort)
expect_error "a checkpoint of another expert count" "model.moe.experts: the checkpoint has 4, the config 8" \
  "$BIN" train base.json --training.steps=8 --model.moe='{"experts": 8, "top_k": 2, "expert_d_ff": 16}' \
  --checkpoint.dir=ckpt_moe --run.dir=run_moe --checkpoint.resume=auto
expect_error "a dense config on a MoE checkpoint" "model.moe: the checkpoint has {" \
  "$BIN" train base.json --training.steps=8 --checkpoint.dir=ckpt_moe --run.dir=run_moe --checkpoint.resume=auto
[[ "$before" == "$(cd ckpt_moe && find . -type f -exec md5sum {} + | sort)" ]] \
  || fail "the MoE checkpoint changed after a refused resume"

# A NaN/inf stops the run with exit 3 and keeps the last good checkpoint.
rc=0
"$BIN" train base.json --optimizer.lr=1e38 --optimizer.grad_clip=0 --checkpoint.dir=ckpt_nan \
  --training.steps=6 --checkpoint.every=1 --run.dir=run_nan >/dev/null 2>err.txt || rc=$?
[[ $rc -eq 3 ]] || { cat err.txt; fail "non-finite run exited $rc, expected 3"; }
grep -q "non-finite" err.txt || fail "no non-finite message"
for d in ckpt_nan/step_*; do "$BIN" inspect checkpoint "$d" >/dev/null || fail "$d damaged"; done
pass "non-finite loss stops with exit 3; $(ls ckpt_nan | wc -l) good checkpoint(s) kept"
echo "all bad-input checks passed"
