"""Every field of an exported config.json against the checkpoint's own config
(its state.json "config"), as docs/files.md and docs/ecosystem.md define the
mapping, written out here without the exporter's code: Llama's fields, the
attn_res section, DeepSeek-V3's mixture-of-experts fields (or Kimi Linear's
names for a hybrid), Kimi Linear's linear_attn_config and MLA dimensions.
A field the exporter writes that this script does not know is an error too,
so a new field cannot go unchecked.

An export (attnres export hf, fp32) differs from the checkpoint's own
config.json where docs/ecosystem.md says: our modeling code for every model
(architectures AttnResForCausalLM, auto_map; model_type "attnres" but for a
Kimi Linear hybrid), the trained length as max_position_embeddings,
use_cache, and the end-of-text token as bos and eos.

usage: hf_config_check.py CHECKPOINT_DIR DIR (the checkpoint itself, or its export)
"""
import json
import math
import sys

# The model.moe defaults (docs/model.md, docs/config.md).
MOE_DEFAULTS = {"shared_experts": 0, "dense_layers": 1, "router": "sigmoid", "routed_scale": 1.0,
                "balance": "aux_free", "aux_loss_coef": 1e-2, "capacity_factor": 0.0}
# Fields whose value is fixed whatever the config.
FIXED = {"hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
         "initializer_range": 0.02, "torch_dtype": "float32"}
# The exporter's own bookkeeping, checked by export_hf.sh itself.
OWN = {"attnres"}


def expected(m):
    """The config.json a model config maps to."""
    moe, kda, mla = m.get("moe"), m.get("kda"), m.get("mla")
    residual = m.get("residual", {"mode": "baseline"})
    mode = residual.get("mode", "baseline")
    L = m["n_layers"]
    n_kv = m.get("n_kv_heads", m["n_heads"])
    hybrid = kda is not None or mla is not None
    llama = mode == "baseline" and moe is None and not hybrid
    out = dict(FIXED)
    out.update({
        "architectures": ["LlamaForCausalLM" if llama else "AttnResForCausalLM"],
        "model_type": "kimi_linear" if hybrid else "llama" if llama else "attnres",
        "vocab_size": m["vocab_size"], "hidden_size": m["d_model"],
        "intermediate_size": m["d_ff"], "num_hidden_layers": L,
        "num_attention_heads": m["n_heads"], "num_key_value_heads": n_kv,
        "head_dim": m["d_model"] // m["n_heads"], "rms_norm_eps": m["norm_eps"],
        "rope_theta": m["rope_theta"], "tie_word_embeddings": m["tie_embeddings"],
    })
    attn_res = {"mode": mode}
    if mode in ("full", "block"):  # the AttnRes modes (DenseFormer has no blocks)
        S = residual.get("block_size", 0)
        if mode == "full":
            S = 1
        elif residual.get("n_blocks", 0) > 0 and not S:
            S = math.ceil(2 * L / residual["n_blocks"])
        attn_res["block_size"] = S
    if residual.get("n_blocks", 0) > 0:
        attn_res["n_blocks"] = residual["n_blocks"]
    # A residual variant (the resolved config has its keys only when one is
    # set): all six, under the config keys' names.
    variant = ("query", "weights", "score", "key_norm", "heads", "window")
    if any(k in residual for k in variant):
        for k in variant:
            attn_res[k] = residual[k]
    out["attn_res"] = attn_res
    if moe is not None:
        o = dict(MOE_DEFAULTS, **moe)
        names = ({"experts": "num_experts", "top_k": "num_experts_per_token",
                  "shared": "num_shared_experts", "router": "moe_router_activation_func"}
                 if hybrid else
                 {"experts": "n_routed_experts", "top_k": "num_experts_per_tok",
                  "shared": "n_shared_experts", "router": "scoring_func"})
        out.update({names["experts"]: o["experts"], names["top_k"]: o["top_k"],
                    names["shared"]: o["shared_experts"], names["router"]: o["router"],
                    "moe_intermediate_size": o["expert_d_ff"],
                    "first_k_dense_replace": o["dense_layers"],
                    "routed_scaling_factor": o["routed_scale"],
                    "topk_method": "noaux_tc" if o["balance"] == "aux_free" else "greedy",
                    "moe_capacity_factor": o["capacity_factor"]})
        if o["balance"] == "aux_loss":
            out["aux_loss_alpha"] = o["aux_loss_coef"]
        if hybrid:
            out["moe_renormalize"] = True
        else:
            out.update({"moe_layer_freq": 1, "n_group": 1, "topk_group": 1, "norm_topk_prob": True})
    if kda is not None:
        # Softmax layers: full_attention_layers (1-based), else every
        # full_attention_every-th (default 4); the last always.
        every = kda.get("full_attention_every", 4)
        full = set(kda.get("full_attention_layers", [l for l in range(1, L + 1) if l % every == 0]))
        full.add(L)
        out["linear_attn_config"] = {
            "kda_layers": [l for l in range(1, L + 1) if l not in full],
            "full_attn_layers": sorted(full), "num_heads": kda["heads"],
            "head_dim": kda["head_dim"], "short_conv_kernel_size": kda.get("conv_size", 4)}
    if mla is not None:
        out.update({"q_lora_rank": None, "kv_lora_rank": mla["kv_lora_rank"],
                    "qk_nope_head_dim": mla["qk_nope_head_dim"],
                    "qk_rope_head_dim": mla["qk_rope_head_dim"],
                    "v_head_dim": mla["v_head_dim"], "mla_use_nope": not mla.get("rope", False)})
    return out


def main(ckpt, export):
    cfg = json.load(open(f"{ckpt}/state.json"))["config"]
    got = json.load(open(f"{export}/config.json"))
    want = expected(cfg["model"])
    if export.rstrip("/") != ckpt.rstrip("/"):  # an export
        want["architectures"] = ["AttnResForCausalLM"]
        if want["model_type"] != "kimi_linear":
            want["model_type"] = "attnres"
        want["auto_map"] = {"AutoConfig": "configuration_attnres.AttnResConfig",
                            "AutoModelForCausalLM": "modeling_attnres.AttnResForCausalLM"}
        want["max_position_embeddings"] = cfg["training"]["seq_len"]
        want["use_cache"] = True
        eot = got.get("eos_token_id")
        if not (isinstance(eot, int) and 0 <= eot < cfg["model"]["vocab_size"]):
            sys.exit(f"FAIL: {export}/config.json: eos_token_id {eot!r} is not a token id")
        want["bos_token_id"] = want["eos_token_id"] = eot
    bad = []
    for key in sorted(set(got) | set(want)):
        if key in OWN:
            continue
        if key not in got:
            bad.append(f"{key}: missing (expected {want[key]!r})")
        elif key not in want:
            bad.append(f"{key}: {got[key]!r} is not a field this check knows")
        elif got[key] != want[key]:
            bad.append(f"{key}: {got[key]!r}, expected {want[key]!r}")
    if bad:
        sys.exit(f"FAIL: {export}/config.json against {ckpt}'s config: " + "; ".join(bad))
    print(f"  {export}/config.json: {len(want)} fields equal the checkpoint's config")


if __name__ == "__main__":
    main(*sys.argv[1:3])
