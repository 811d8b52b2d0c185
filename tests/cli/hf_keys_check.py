"""The model keys through the Hugging Face export (tests/cli/export_hf_keys.sh, issue 43).

  hf_keys_check.py init MODEL.json OUT.safetensors
      random weights for the model section MODEL.json (the training config's
      "model" object), under docs/model.md section 3's names and shapes, written
      as safetensors for model.init_from: large enough that every key moves
      the log-probabilities (norm_eps against the activations' mean square,
      rope_theta against attention that is far from uniform).
  hf_keys_check.py check CASES.json
      each case {"name", "model": the model section as given, "seq_len",
      "step", "init": the init file, "export": the export directory, "score":
      [`attnres score` JSON files]}: config.json and generation_config.json
      field by field against the model section (every field they hold), the
      exported weights against the init file, the exported model's
      log-probabilities against `attnres score`, and each of rms_norm_eps,
      rope_theta and attn_res set to another value moving them.

Runs under Debian's python3-torch with transformers hidden (torch alone).
Every check prints what it measured; any failure exits 1.
"""
import json
import math
import os
import sys

sys.modules["transformers"] = None  # the modeling code with torch alone

import torch  # noqa: E402

sys.dont_write_bytecode = True  # no __pycache__ for hf_check_common in the source tree
from hf_check_common import RTOL, check, finish, load_module  # noqa: E402

DIFFERS = 1e-3    # another value of a field must move the log-probabilities this far


def residual(model):
    """(mode, S or None, N or None) of a model section, S from docs/model.md section 1."""
    res = model.get("residual", {})
    mode = res.get("mode", "baseline")
    n = res.get("n_blocks")
    if mode == "full":
        return mode, 1, None
    if mode == "block":
        return mode, res["block_size"] if "block_size" in res else math.ceil(2 * model["n_layers"] / n), n
    return mode, None, None


def param_shapes(model):
    """docs/model.md section 3: {name: shape}."""
    V, d, F, L = model["vocab_size"], model["d_model"], model["d_ff"], model["n_layers"]
    H = model["n_heads"]
    Hkv = model.get("n_kv_heads", H)
    hd = d // H
    attnres = residual(model)[0] != "baseline"
    out = {"model.embed_tokens.weight": [V, d], "model.norm.weight": [d]}
    if not model.get("tie_embeddings", False):
        out["lm_head.weight"] = [V, d]
    if attnres:
        out["model.final_res.query"] = [d]
    for l in range(L):
        p = f"model.layers.{l}."
        out.update({p + "input_layernorm.weight": [d], p + "post_attention_layernorm.weight": [d],
                    p + "self_attn.q_proj.weight": [H * hd, d],
                    p + "self_attn.k_proj.weight": [Hkv * hd, d],
                    p + "self_attn.v_proj.weight": [Hkv * hd, d],
                    p + "self_attn.o_proj.weight": [d, H * hd],
                    p + "mlp.gate_proj.weight": [F, d], p + "mlp.up_proj.weight": [F, d],
                    p + "mlp.down_proj.weight": [d, F]})
        if attnres:
            out.update({p + "attn_res.query": [d], p + "mlp_res.query": [d]})
    return out


def init(model_path, out_path):
    with open(model_path) as f:
        model = json.load(f)
    g = torch.Generator().manual_seed(1234)
    tensors = {}
    for name, shape in param_shapes(model).items():
        x = torch.randn(shape, generator=g, dtype=torch.float32)
        if name.endswith("norm.weight"):
            t = 1.0 + 0.2 * x
        elif name.endswith(".query"):
            t = 0.5 * x
        elif name == "model.embed_tokens.weight":
            t = 0.5 * x
        elif "q_proj" in name or "k_proj" in name:
            t = 0.3 * x
        elif "down_proj" in name:
            t = 0.1 * x
        else:
            t = 0.15 * x
        tensors[name] = t.contiguous()
    header, offset, blobs = {}, 0, []
    for name, t in tensors.items():
        data = t.numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    with open(out_path, "wb") as f:
        f.write(len(head).to_bytes(8, "little"))
        f.write(head)
        for b in blobs:
            f.write(b)


def expected_config(case, tokenizer):
    """config.json as docs/ecosystem.md describes it, from the model section as given."""
    m = case["model"]
    H = m["n_heads"]
    mode, S, N = residual(m)
    attn_res = {"mode": mode}
    if S is not None:
        attn_res["block_size"] = S
    if N is not None:
        attn_res["n_blocks"] = N
    vocab = 256 + len(tokenizer["merges"]) + 1  # attnres-bpe: bytes, merges, <|endoftext|> last
    eot = vocab - 1
    return {
        "architectures": ["AttnResForCausalLM"],
        "model_type": "attnres",
        "auto_map": {"AutoConfig": "configuration_attnres.AttnResConfig",
                     "AutoModelForCausalLM": "modeling_attnres.AttnResForCausalLM"},
        "vocab_size": m["vocab_size"],
        "hidden_size": m["d_model"],
        "intermediate_size": m["d_ff"],
        "num_hidden_layers": m["n_layers"],
        "num_attention_heads": H,
        "num_key_value_heads": m.get("n_kv_heads", H),
        "head_dim": m["d_model"] // H,
        "hidden_act": "silu",
        "rms_norm_eps": m.get("norm_eps", 1e-5),
        "rope_theta": m.get("rope_theta", 10000.0),
        "tie_word_embeddings": m.get("tie_embeddings", False),
        "attention_bias": False,
        "mlp_bias": False,
        "initializer_range": 0.02,
        "torch_dtype": "float32",
        "attn_res": attn_res,
        "max_position_embeddings": case["seq_len"],
        "use_cache": True,
        "bos_token_id": eot,
        "eos_token_id": eot,
        "attnres": {"checkpoint_step": case["step"],
                    "tokenizer": {"files": ["attnres_tokenizer.json"], "format": "attnres-bpe",
                                  "vocab_size": vocab, "special": "text"}},
    }, vocab, eot


def max_diff(a, b):
    """max |a - b| / max(1, |b|), a NaN counting as infinitely far."""
    if len(a) != len(b):
        return math.inf
    worst = 0.0
    for x, y in zip(a, b):
        d = abs(x - y) / max(1.0, abs(y))
        if math.isnan(d):
            return math.inf
        worst = max(worst, d)
    return worst


def check_case(case):
    name, export, m = case["name"], case["export"], case["model"]
    with open(os.path.join(export, "attnres_tokenizer.json"), encoding="utf-8") as f:
        tokenizer = json.load(f)
    with open(os.path.join(export, "config.json")) as f:
        config = json.load(f)
    want, vocab, eot = expected_config(case, tokenizer)
    for key in sorted(set(want) | set(config)):
        got = config.get(key, "(absent)")
        check(key in want and got == want[key],
              f"{name}: config.json {key} = {json.dumps(got)}"
              + ("" if got == want.get(key) else f", want {json.dumps(want.get(key, '(not written)'))}"))
    with open(os.path.join(export, "generation_config.json")) as f:
        generation = json.load(f)
    want_gen = {"bos_token_id": eot, "eos_token_id": eot}
    if vocab < m["vocab_size"]:
        want_gen["suppress_tokens"] = list(range(vocab, m["vocab_size"]))
    check(generation == want_gen, f"{name}: generation_config.json = {json.dumps(want_gen)[:80]}...")

    mod = load_module(export, name)
    # The weights: the init file's (model.init_from), under section 3's names and shapes.
    exported = mod.read_weights(export)
    init = mod.read_safetensors(case["init"])
    shapes = {k: list(v.shape) for k, v in exported.items()}
    check(shapes == param_shapes(m), f"{name}: {len(shapes)} exported tensors, docs/model.md's names and shapes")
    same = set(exported) == set(init) and all(torch.equal(exported[k], init[k]) for k in init)
    check(same, f"{name}: the exported weights are model.init_from's file, tensor for tensor")

    model = mod.AttnResForCausalLM.from_pretrained(export)
    cfg = model.config
    check((cfg.rms_norm_eps, cfg.rope_theta, cfg.num_key_value_heads, bool(cfg.tie_word_embeddings),
           cfg.residual_mode(), cfg.residual_block_size())
          == (want["rms_norm_eps"], want["rope_theta"], want["num_key_value_heads"],
              want["tie_word_embeddings"], want["attn_res"]["mode"], want["attn_res"].get("block_size", 0)),
          f"{name}: the loaded config's eps {cfg.rms_norm_eps}, theta {cfg.rope_theta}, "
          f"KV heads {cfg.num_key_value_heads}, tied {cfg.tie_word_embeddings}, "
          f"mode {cfg.residual_mode()}, S {cfg.residual_block_size()}")
    tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    check(tied == want["tie_word_embeddings"], f"{name}: lm_head is the embedding: {tied}")

    scores = []
    for path in case["score"]:
        with open(path) as f:
            scores.append(json.load(f))

    def logprobs(mdl):
        return [v for s in scores for v in mdl.token_logprobs(s["tokens"])[0].double().tolist()]

    ours = [v for s in scores for v in s["logprobs"]]
    d = max_diff(logprobs(model), ours)
    check(d <= RTOL, f"{name}: {len(ours)} log-probs of the exported model vs attnres score: "
                     f"max diff / max(1, |logp|) {d:.3g} (bound {RTOL})")

    # Each field the function reads, at another value (its default where the
    # case is away from it), moves the log-probabilities: the comparison above
    # sees a field the exporter wrote wrong or the modeling code ignored.
    mode, S, _ = residual(m)
    L2 = 2 * m["n_layers"]
    others = [("rms_norm_eps", 1e-5 if want["rms_norm_eps"] != 1e-5 else 0.5),
              ("rope_theta", 10000.0 if want["rope_theta"] != 10000.0 else 7.0)]
    if mode == "block":
        others += [("attn_res", {"mode": "full"}),
                   ("attn_res", {"mode": "block", "block_size": S + 1 if S < L2 else S - 1})]
        if want["attn_res"].get("n_blocks", S) != S:  # S, not N, sublayers per block
            others.append(("attn_res", {"mode": "block", "block_size": want["attn_res"]["n_blocks"]}))
    elif mode == "full":
        others.append(("attn_res", {"mode": "block", "block_size": 2}))
    for key, value in others:
        other = mod.AttnResForCausalLM.from_pretrained(export, **{key: value})
        d = max_diff(logprobs(other), ours)
        check(d > DIFFERS, f"{name}: {key} = {json.dumps(value)} instead of {json.dumps(want[key])} "
                           f"moves the log-probs by {d:.3g} (> {DIFFERS})")


def main():
    if sys.argv[1:2] == ["init"] and len(sys.argv) == 4:
        init(sys.argv[2], sys.argv[3])
        return
    if sys.argv[1:2] != ["check"] or len(sys.argv) != 3:
        sys.exit("usage: hf_keys_check.py init MODEL.json OUT.safetensors | check CASES.json")
    with open(sys.argv[2]) as f:
        cases = json.load(f)
    for case in cases:
        check_case(case)
    finish("all export key checks passed")


if __name__ == "__main__":
    main()
