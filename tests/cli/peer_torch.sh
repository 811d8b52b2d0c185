#!/usr/bin/env bash
# The PyTorch peer (scripts/peer_torch.py) trains what `attnres train` trains:
# for a tiny model in each residual mode (baseline with tied embeddings, Block
# AttnRes with uneven blocks under a wsd schedule, Full AttnRes with GQA), 5
# steps of 2 microbatches of 2 x 32 tokens from shuffled shards, with warmup,
# decay, weight decay and clipping all acting (the gradient norms are above
# the clip), each step's loss and gradient norm from the peer (Debian's
# python3-torch, CPU, fp32, eager) must equal those of the binary's
# metrics.jsonl within |a - b| <= 1e-4 max(|a|, |b|) + 1e-6 (a NaN fails), and
# the learning rates within 1e-9. Then --steps 3 gives the first 3 steps of
# the same run, and bad arguments are refused (exit code 2). Kimi Linear
# hybrids (KDA with GQA or MLA softmax layers, dense and MoE) in the three
# modes, over sequences that cross a KDA chunk. Last, the race
# (scripts/race_torch.py) prints its table for the three modes. Skipped (exit
# code 77) where python3 cannot import torch.
source "$(dirname "$0")/lib.sh"
if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "skipped: $PY cannot import torch (apt-get install python3-torch; scripts/install_deps.sh)"
  exit 77
fi
PEER=("$PY" "$SRC/scripts/peer_torch.py")
make_corpus

# Not lib.sh's base config: a larger learning rate, so that a peer that
# differs in a detail of the optimizer (e.g. decays the norm gains) moves the
# loss by more than the tolerance within 5 steps.
cat > cfg.json <<'JSON'
{"model": {"vocab_size": 320, "d_model": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
           "d_ff": 64},
 "optimizer": {"lr": 1e-2, "weight_decay": 0.1, "grad_clip": 1.0},
 "schedule": {"type": "cosine", "warmup_steps": 2},
 "training": {"steps": 5, "micro_batch_size": 2, "seq_len": 32, "grad_accum": 2, "seed": 11},
 "data": {"train": "shards/tiny_train_*.bin", "shuffle": true},
 "run": {"dir": "run"}}
JSON

# compare NAME METRICS PEER_OUT: the step records of both, step by step.
compare() {
  "$PY" - "$@" <<'PYEOF'
import json, math, sys
name, metrics, peer = sys.argv[1:4]
ref = [json.loads(l) for l in open(metrics) if l.strip()]
ref = [r for r in ref if "loss" in r and "event" not in r]
got = [json.loads(l) for l in open(peer) if l.strip()]
if not got or len(got) > len(ref):
    sys.exit(f"FAIL: {name}: the peer printed {len(got)} steps, attnres {len(ref)}")
def close(a, b, rtol=1e-4, atol=1e-6):  # False for a NaN
    return abs(a - b) <= rtol * max(abs(a), abs(b)) + atol
def rel(a, b):
    d = abs(a - b) / max(abs(a), abs(b), 1e-30)
    return d if not math.isnan(d) else math.inf
worst = {"loss": 0.0, "grad_norm": 0.0}
bad = []
moe_checked = set()
for r, g in zip(ref, got):
    if g["step"] != r["step"]:
        sys.exit(f"FAIL: {name}: peer step {g['step']} against attnres step {r['step']}")
    for key in worst:
        worst[key] = max(worst[key], rel(r[key], g[key]))
        if not close(r[key], g[key]):
            bad.append(f"step {r['step']} {key}: attnres {r[key]!r}, peer {g[key]!r}")
    if not abs(r["lr"] - g["lr"]) <= 1e-9 * r["lr"]:
        bad.append(f"step {r['step']} lr: attnres {r['lr']!r}, peer {g['lr']!r}")
    if not g["tokens_per_sec"] > 0:
        bad.append(f"step {r['step']}: tokens_per_sec {g['tokens_per_sec']!r}")
    # metrics.jsonl's MoE figures, recomputed by the peer from its own
    # routing (docs/files.md): the same keys, the same values.
    for key in ("moe_load", "moe_dropped", "aux_loss", "moe_bias"):
        if (key in r) != (key in g):
            bad.append(f"step {r['step']} {key}: attnres {'has' if key in r else 'lacks'} it, the peer not")
            continue
        if key not in r:
            continue
        a, b = r[key], g[key]
        flat = lambda x: [z for y in x for z in (y if isinstance(y, list) else [y])] if isinstance(x, list) else [x]
        fa, fb = flat(a), flat(b)
        if len(fa) != len(fb) or not all(close(x, y, 1e-5, 1e-7) for x, y in zip(fa, fb)):
            bad.append(f"step {r['step']} {key}: attnres {a!r}, peer {b!r}")
        moe_checked.add(key)
    print(f"  {name} step {r['step']}: loss attnres {r['loss']:.9f} peer {g['loss']:.9f} "
          f"(rel {rel(r['loss'], g['loss']):.2e}), grad norm {r['grad_norm']:.6f} / "
          f"{g['grad_norm']:.6f}, lr {r['lr']:.3e}")
print(f"  {name}: max relative difference: loss {worst['loss']:.2e}, grad norm "
      f"{worst['grad_norm']:.2e} over {len(got)} steps"
      + (f"; MoE figures equal: {', '.join(sorted(moe_checked))}" if moe_checked else ""))
if bad:
    sys.exit("FAIL: " + name + ": " + "; ".join(bad))
PYEOF
}

# run_case NAME OVERRIDES...: both trainers on the same config, compared.
run_case() {
  local name="$1"; shift
  "$BIN" train cfg.json --run.dir="run_$name" "$@" 2> "train_$name.log" \
    || { cat "train_$name.log"; fail "$name: attnres train"; }
  "${PEER[@]}" cfg.json --attnres "$BIN" "$@" > "peer_$name.jsonl" 2> "peer_$name.log" \
    || { cat "peer_$name.log"; fail "$name: the peer exited non-zero"; }
  compare "$name" "run_$name/metrics.jsonl" "peer_$name.jsonl" || fail "$name: the peer's steps differ"
  pass "$name: the peer's 5 steps equal attnres's"
}

run_case baseline --model.tie_embeddings=true
# L = 3, S = 4: blocks of 4 and 2 sublayers, the final Mix reads a partial sum;
# wsd: the last ceil(0.4 x 5) = 2 steps decay linearly to lr_min.
run_case block --model.n_layers=3 --model.residual='{"mode": "block", "block_size": 4}' \
  --schedule.type=wsd --schedule.decay_ratio=0.4 --schedule.warmup_steps=1
# Full AttnRes, 4 query heads on 1 KV head, cosine down to 0.
run_case full --model.n_kv_heads=1 --model.residual='{"mode": "full"}' --schedule.min_lr_ratio=0
# The residual variants (docs/model.md "Residual variants"), one each, and
# an input query under Muon (its W is AdamW's in both, never decayed).
run_case variant_input_query --model.residual='{"mode": "full", "query": "input"}'
run_case variant_scalars --model.n_layers=3 --model.residual='{"mode": "block", "block_size": 4, "weights": "scalars"}'
run_case variant_sigmoid --model.residual='{"mode": "full", "score": "sigmoid"}'
run_case variant_raw_keys --model.n_layers=3 --model.residual='{"mode": "block", "block_size": 2, "key_norm": false}'
run_case variant_heads --model.n_layers=3 --model.residual='{"mode": "block", "block_size": 4, "heads": 4}'
run_case variant_window --model.n_layers=3 --model.residual='{"mode": "full", "window": 2}'
run_case denseformer --model.n_layers=3 --model.residual='{"mode": "denseformer"}'
run_case variant_input_query_muon --optimizer.type=muon --optimizer.momentum=0.9 \
  --model.residual='{"mode": "block", "block_size": 2, "query": "input", "heads": 2}'
# Mixture-of-experts layers, a PyTorch user's loop over experts, in the three
# modes: sigmoid routing with a shared expert, a capacity that drops slots and
# an aux-free bias fast enough to change the choice within the 5 steps;
# softmax routing with a routed scale and an auxiliary loss large enough to
# move the gradient norm; sigmoid top-1 without balancing on every layer.
run_case moe_baseline --model.n_layers=3 --model.moe='{"experts": 4, "top_k": 2, "expert_d_ff": 16,
  "shared_experts": 1, "capacity_factor": 1.0, "bias_rate": 0.05}'
run_case moe_block --model.n_layers=3 --model.residual='{"mode": "block", "block_size": 4}' \
  --model.moe='{"experts": 4, "top_k": 2, "expert_d_ff": 16, "router": "softmax", "routed_scale": 1.5,
  "balance": "aux_loss", "aux_loss_coef": 0.1}'
run_case moe_full --model.n_kv_heads=1 --model.residual='{"mode": "full"}' \
  --model.moe='{"experts": 3, "top_k": 1, "expert_d_ff": 24, "balance": "none", "dense_layers": 0,
  "capacity_factor": 1.25}'
# Muon (optimizer.type = "muon": the layers' matrices, experts included; AdamW
# for the rest), written out as docs/model.md section 4 gives it where torch
# has no torch.optim.Muon, in the three modes and on a MoE model whose fast
# aux-free bias starves an expert on some steps (no token, no gradient: both
# still step it, with g = 0).
mu=(--optimizer.type=muon --optimizer.momentum=0.9)
run_case muon_baseline "${mu[@]}" --model.tie_embeddings=true
run_case muon_block "${mu[@]}" --model.n_layers=3 --model.residual='{"mode": "block", "block_size": 4}' \
  --schedule.type=wsd --schedule.decay_ratio=0.4 --schedule.warmup_steps=1
run_case muon_full_moe "${mu[@]}" --model.n_kv_heads=1 --model.residual='{"mode": "full"}' \
  --model.moe='{"experts": 4, "top_k": 2, "expert_d_ff": 16, "shared_experts": 1, "bias_rate": 0.05}'
# Kimi Linear hybrids (model.kda, KDA layers as a chunked delta-rule loop in
# torch), over 80-token sequences (a 64-token chunk and a 16-token one): KDA
# with GQA softmax layers; with MLA (NoPE) and MoE under Kimi's names; with
# MLA's RoPE under Muon (A_log never decayed, the conv filters under AdamW).
kda='{"heads": 2, "head_dim": 8, "conv_size": 3}'
hy=(--model.n_layers=4 --training.seq_len=80 --training.micro_batch_size=1)
mla='{"kv_lora_rank": 12, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 6'
run_case kda_baseline "${hy[@]}" --model.kda="$kda"
run_case kda_block_mla_moe "${hy[@]}" --model.kda="$kda" --model.mla="$mla}" \
  --model.residual='{"mode": "block", "block_size": 3}' \
  --model.moe='{"experts": 4, "top_k": 2, "expert_d_ff": 16, "shared_experts": 1, "bias_rate": 0.05}'
run_case kda_full_mla_rope_muon "${hy[@]}" "${mu[@]}" --model.residual='{"mode": "full"}' \
  --model.kda='{"heads": 2, "head_dim": 8, "conv_size": 4, "full_attention_layers": [2, 4]}' \
  --model.mla="$mla, \"rope\": true}"

# --steps 3: the first 3 steps of the 5-step run (the schedule unchanged).
"${PEER[@]}" cfg.json --attnres "$BIN" --steps 3 --model.n_kv_heads=1 \
  --model.residual='{"mode": "full"}' --schedule.min_lr_ratio=0 > peer_full3.jsonl 2> peer_full3.log \
  || { cat peer_full3.log; fail "full --steps 3: the peer exited non-zero"; }
[[ $(wc -l < peer_full3.jsonl) -eq 3 ]] || fail "--steps 3 printed $(wc -l < peer_full3.jsonl) steps"
compare "full --steps 3" run_full/metrics.jsonl peer_full3.jsonl || fail "--steps 3 differs"
pass "--steps 3: the first 3 steps of the run"

expect_error "peer: --steps past training.steps" "--steps 6" "${PEER[@]}" cfg.json --attnres "$BIN" --steps 6
expect_error "peer: an override attnres refuses" "model.n_layers" "${PEER[@]}" cfg.json --attnres "$BIN" \
  --model.n_layers=0
expect_error "peer: no binary" "no attnres binary" "${PEER[@]}" cfg.json --attnres ./nope
# The race (scripts/race_torch.py): both trainers, each residual mode, a table
# of tokens/s whose rows say the two did the same work (fp32 on the CPU: the
# losses within 1e-4 relative).
"$PY" "$SRC/scripts/race_torch.py" cfg.json --attnres "$BIN" --steps 3 --skip 1 --model.n_layers=3 \
  > race.txt 2> race.log || { cat race.log; fail "race_torch.py"; }
cat race.txt
"$PY" - race.txt <<'PYEOF' || fail "the race table"
import sys
rows = {}
for line in open(sys.argv[1]):
    w = line.split()
    if w and w[0] in ("baseline", "block", "full") and len(w) == 5:
        rows[w[0]] = (float(w[1]), float(w[2]), float(w[3].rstrip("x")), float(w[4]))
if sorted(rows) != ["baseline", "block", "full"]:
    sys.exit(f"FAIL: race rows {sorted(rows)}, expected baseline, block and full")
for mode, (ours, peer, ratio, diff) in rows.items():
    if not (ours > 0 and peer > 0 and abs(ratio - ours / peer) <= 0.006 * ratio + 0.005 and diff <= 1e-4):
        sys.exit(f"FAIL: race {mode}: {ours} / {peer} tok/s, ratio {ratio}, loss difference {diff}")
PYEOF
grep -q "^peer (block): torch .* block residual" race.txt || fail "the race does not say what the peer ran"
pass "race_torch.py: baseline, block and full, the same losses, tokens/s side by side"
echo "all peer checks passed"
