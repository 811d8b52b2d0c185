"""Checks Hugging Face exports (`attnres export hf`) against the attnres binary.

Run by tests/cli/export_hf.sh under Debian's python3-torch, with one argument:
a JSON file listing the cases the shell test prepared (and, first,
--transformers for the AutoModelForCausalLM checks alone: their own CTest test,
which exits 77, skipped, where transformers is not installed), each
  {"name", "fp32": export dir, "bf16": export dir, "sharded": export dir,
   "checkpoint_tokenizer": path, "score": [score JSON files],
   "generate": [generate --json files], "tokens": N,
   "eval": eval --task --per-example JSON, "tasks": the jsonl it read, "seq_len": T}.
Every check prints its measured difference; any failure exits 1.
"""
import json
import re
import math
import os
import sys

# "Loads with torch alone": the modeling code must not need transformers. It
# is hidden for this whole check (None in sys.modules makes `import` fail);
# the transformers path is checked in a child process when it is installed.
REAL_TRANSFORMERS = None
try:
    import importlib.util
    REAL_TRANSFORMERS = importlib.util.find_spec("transformers")
except (ImportError, ValueError):
    REAL_TRANSFORMERS = None
sys.modules["transformers"] = None

import torch  # noqa: E402

sys.dont_write_bytecode = True  # no __pycache__ for hf_check_common in the source tree
from hf_check_common import RTOL, check, finish, load_module  # noqa: E402


def close(a, b):
    """|a - b| <= 1e-5 max(1, |b|): relative for log-probabilities of magnitude
    >= 1, and 1e-5 absolute near 0, where a log-probability's rounding error is
    set by the logits' magnitude, not its own."""
    return abs(a - b) <= RTOL * max(1.0, abs(b))


def nan_max(values):
    """The largest of values (0 when none), NaN above every number: Python's
    max() keeps a NaN only when it comes first (NaN > x and x > NaN are both
    false), so a reported worst difference could hide one. (The same rule as
    nan_max in src/core/worst.h.)"""
    worst = 0.0
    for v in values:
        if math.isnan(v):
            return v
        worst = max(worst, v)
    return worst


def compare(mine, theirs):
    worst_abs = nan_max(abs(a - b) for a, b in zip(mine, theirs))
    worst_rel = nan_max(abs(a - b) / max(1.0, abs(b)) for a, b in zip(mine, theirs))
    ok = len(mine) == len(theirs) and all(close(a, b) for a, b in zip(mine, theirs))
    return ok, worst_abs, worst_rel


def decode(tokenizer_path, ids):
    """Bytes of attnres-bpe ids: 0-255 the bytes, 256+i merge i, the last id EOT."""
    with open(tokenizer_path, encoding="utf-8") as f:
        tok = json.load(f)
    pieces = [bytes([i]) for i in range(256)]
    for a, b in tok["merges"]:
        pieces.append(pieces[a] + pieces[b])
    pieces.append(b"<|endoftext|>")
    return b"".join(pieces[i] for i in ids).decode("utf-8", errors="replace")


def check_padded_batch(name, model, case):
    """A left-padded batch (attention_mask 0 on the pads, positions counted over
    the mask, as transformers' generate() feeds it) scores each sequence as alone."""
    with open(case["score"][0]) as f:
        a = json.load(f)["tokens"]
    b = a[: len(a) // 2]
    pad = len(a) - len(b)
    ids = torch.tensor([a, [0] * pad + b])
    mask = torch.tensor([[1] * len(a), [0] * pad + [1] * len(b)])
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(ids, attention_mask=mask, position_ids=pos, use_cache=False).logits
    alone = [model(torch.tensor([x]), use_cache=False).logits[0] for x in (a, b)]
    diff = max((logits[0] - alone[0]).abs().max().item(), (logits[1, pad:] - alone[1]).abs().max().item())
    check(diff <= RTOL * max(1.0, alone[0].abs().max().item()),
          f"{name}: a left-padded batch gives each sequence's logits, max diff {diff:.3g}")


def check_case(case):
    name = case["name"]
    mod = load_module(case["fp32"], name)
    check(not mod.HAVE_TRANSFORMERS, f"{name}: modeling_attnres loaded with torch alone")
    model = mod.AttnResForCausalLM.from_pretrained(case["fp32"])
    cfg = model.config
    check(next(model.parameters()).dtype == torch.float32, f"{name}: fp32 weights")
    tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    check(tied == bool(cfg.tie_word_embeddings), f"{name}: lm_head tied = {tied}, as the config says")

    # A capacity factor makes the function depend on the call's token count
    # (an expert takes ceil(c N K / E) of a forward's N tokens, docs/model.md):
    # `attnres score` runs one forward over the n inputs [EOT, t1 .. t(n-1)],
    # so the comparison does the same; a token-by-token pass, a padded batch
    # or lm-eval's context + ending calls count other N and compute other
    # functions, by definition, in both implementations.
    capacity = getattr(cfg, "moe_capacity_factor", 0) > 0
    if capacity:
        print(f"  {name}: not applicable with moe_capacity_factor {cfg.moe_capacity_factor}: "
              "KV-cache decoding = full forward, a left-padded batch, the hellaswag sums "
              "(each counts other tokens per forward call)")

    def score_logprobs(tokens):
        if not capacity:
            return model.token_logprobs(tokens)[0].double().tolist()
        logits = model(torch.tensor([tokens[:-1]]), use_cache=False).logits[0].double()
        return logits.log_softmax(-1).gather(-1, torch.tensor(tokens[1:])[:, None])[:, 0].tolist()

    # Per-token log-probabilities against `attnres score`, fp32.
    for path in case["score"]:
        with open(path) as f:
            score = json.load(f)
        mine = score_logprobs(score["tokens"])
        ok, worst_abs, worst_rel = compare(mine, score["logprobs"])
        check(ok, f"{name}: {len(mine)} log-probs of {os.path.basename(path)} vs attnres score: "
                  f"max abs diff {worst_abs:.3g}, max diff / max(1, |logp|) {worst_rel:.3g} "
                  f"(bound {RTOL})")

        if capacity:
            continue
        # The KV cache: feeding the tokens one by one gives the full pass's logits.
        ids = torch.tensor([score["tokens"]])
        full = model(ids, use_cache=False).logits[0]
        cache = mod.AttnResKVCache()
        step = torch.cat([model(ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits[0]
                          for t in range(ids.shape[1])])
        diff = (step - full).abs().max().item()
        check(diff <= RTOL * max(1.0, full.abs().max().item()),
              f"{name}: KV-cache decoding = full forward, max logit diff {diff:.3g}")

    if not capacity:
        check_padded_batch(name, model, case)

    # Greedy generation (KV cache) against `attnres generate --temperature 0 --json`.
    for path in case["generate"]:
        with open(path) as f:
            gen = json.load(f)
        prompt = gen["prompt_tokens"]
        out = model.generate_tokens(prompt, max_new_tokens=case["tokens"])[0, len(prompt):].tolist()
        check(out == gen["tokens"], f"{name}: greedy {len(out)} tokens == attnres generate's "
                                    f"{len(gen['tokens'])} ({out[:6]}...)")
        text = decode(os.path.join(case["fp32"], "attnres_tokenizer.json"), prompt[1:] + out)
        check(text == gen["text"], f"{name}: decoded text == attnres generate's: {text[:40]!r}...")

    # bf16: exactly the fp32 weights rounded to nearest even (a MoE router's
    # bias, which decides the choice, stays fp32); loads upcast (default) or
    # as stored (torch_dtype="auto") and stays close.
    t32 = mod.read_weights(case["fp32"])
    t16 = mod.read_weights(case["bf16"])
    kept = lambda k: k.endswith("e_score_correction_bias")  # noqa: E731
    exact = set(t32) == set(t16) and all(
        torch.equal(t32[k], t16[k]) if kept(k) else
        t16[k].dtype == torch.bfloat16 and torch.equal(t32[k].to(torch.bfloat16), t16[k]) for k in t32)
    check(exact, f"{name}: bf16 export = fp32 weights rounded to bf16 ({len(t16)} tensors)")
    m16 = mod.AttnResForCausalLM.from_pretrained(case["bf16"], torch_dtype="auto")
    check(next(m16.parameters()).dtype == torch.bfloat16, f"{name}: bf16 export loads as bf16")
    m16up = mod.AttnResForCausalLM.from_pretrained(case["bf16"])
    with open(case["score"][0]) as f:
        tokens = json.load(f)["tokens"]
    ref = model.token_logprobs(tokens)[0]
    d_up = (m16up.token_logprobs(tokens)[0] - ref).abs().max().item()
    d_bf = (m16.token_logprobs(tokens)[0] - ref).abs().max().item()
    check(d_up < 0.05 and d_bf < 0.25 and math.isfinite(d_bf),
          f"{name}: bf16 log-probs near fp32's: max diff {d_up:.3g} (upcast), {d_bf:.3g} (bf16)")

    # The sharded form holds the same tensors and loads to the same function.
    ts = mod.read_weights(case["sharded"])
    check(set(ts) == set(t32) and all(torch.equal(ts[k], t32[k]) for k in t32),
          f"{name}: sharded export holds the same {len(ts)} tensors")
    ms = mod.AttnResForCausalLM.from_pretrained(case["sharded"])
    check(torch.equal(ms.token_logprobs(tokens), model.token_logprobs(tokens)),
          f"{name}: sharded export computes the same log-probs")

    # The tokenizer file is the checkpoint's, byte for byte.
    with open(case["checkpoint_tokenizer"], "rb") as a, \
            open(os.path.join(case["fp32"], "attnres_tokenizer.json"), "rb") as b:
        check(a.read() == b.read(), f"{name}: the tokenizer copied as it is (attnres_tokenizer.json)")

    if case.get("eval") and not capacity:
        check_hellaswag(name, model, case, "eval")
        check_hellaswag(name, model, case, "eval_llmc")


# lm-evaluation-harness's hellaswag rendering (lm_eval/tasks/hellaswag/utils.py),
# transcribed: the reference for `attnres eval --scoring lm-eval`.
def lm_eval_preprocess(text):
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    text = text.replace("  ", " ")
    return text


def lm_eval_doc(doc):
    ctx = doc["ctx_a"] + " " + doc["ctx_b"].capitalize()
    return (lm_eval_preprocess(doc["activity_label"] + ": " + ctx),
            [lm_eval_preprocess(e) for e in doc["endings"]])


def check_hellaswag(name, model, case, key):
    """The texts each scoring renders (lm-eval's, transcribed above; llm.c's:
    ctx as it is), its normalisers (characters; tokens), and acc / acc_norm
    computed here from this model's log-probabilities, against `attnres eval
    --task` (the file at case[key])."""
    with open(case[key]) as f:
        ev = json.load(f)
    with open(case["tasks"], encoding="utf-8") as f:
        items = [json.loads(line) for line in f if line.strip()]
    T = case["seq_len"]
    scoring = ev["scoring"]
    right = right_norm = 0
    worst = 0.0
    all_close = texts_ok = True
    for item, ex in zip(items, ev["per_example"]):
        if scoring == "lm-eval":
            query, choices = lm_eval_doc(item)
            # lm-eval's _encode_pair: the context's trailing spaces join the continuation.
            n_spaces = len(query) - len(query.rstrip())
            moved = query[len(query) - n_spaces:] if n_spaces else ""
            query = query[:len(query) - n_spaces] if n_spaces else query
            want_texts = (query, [moved + " " + c for c in choices])
            norm = [float(len(c)) for c in choices]  # lm-eval: characters of the choice
        else:
            want_texts = (item["ctx"], [" " + e for e in item["endings"]])
            norm = [float(len(e)) for e in ex["ending_tokens"]]  # llm.c: tokens
        if (ex["context"], ex["endings"]) != want_texts or ex["norm"] != norm:
            texts_ok = False
            print(f"{name} {scoring}: question {item['ind']}: got {ex['context']!r} {ex['endings']!r} "
                  f"{ex['norm']}, want {want_texts!r} {norm}", file=sys.stderr)
        sums = []
        for ending in ex["ending_tokens"]:
            seq = (ex["context_tokens"] + ending)[-(T + 1):]  # the last T + 1 tokens
            lp = model.token_logprobs(seq)[0].double()
            sums.append(lp[-len(ending):].sum().item())
        best = max(range(len(sums)), key=lambda j: (sums[j], -j))
        best_norm = max(range(len(sums)), key=lambda j: (sums[j] / norm[j], -j))
        right += best == int(item["label"])
        right_norm += best_norm == int(item["label"])
        ok, worst_abs, _ = compare(sums, ex["logprobs"])
        all_close &= ok
        worst = nan_max([worst, worst_abs])
    n = len(items)
    check(ev["examples"] == n, f"{name}: hellaswag ({scoring}) examples {ev['examples']} == {n}")
    check(texts_ok, f"{name}: hellaswag ({scoring}) contexts, endings and normalisers as the tool renders them")
    check(all_close, f"{name}: hellaswag ({scoring}) ending sums match, max abs diff {worst:.3g}")
    check(ev["acc"] == right / n and ev["acc_norm"] == right_norm / n,
          f"{name}: hellaswag ({scoring}) acc {ev['acc']:.4f} acc_norm {ev['acc_norm']:.4f} == "
          f"{right / n:.4f} {right_norm / n:.4f} computed here")


def check_transformers(cases):
    """AutoModelForCausalLM with trust_remote_code, in a child process that
    sees the real transformers: its log-probabilities and greedy generate()
    against the binary's."""
    import subprocess
    code = r"""
import json, sys, torch
from transformers import AutoModelForCausalLM
case = json.loads(sys.argv[1])
m = AutoModelForCausalLM.from_pretrained(case["fp32"], trust_remote_code=True)
score = json.load(open(case["score"][0]))
lp = m.token_logprobs(score["tokens"])[0].double().tolist()
gen = json.load(open(case["generate"][0]))
ids = torch.tensor([gen["prompt_tokens"]])
out = m.generate(ids, max_new_tokens=len(gen["tokens"]), do_sample=False)[0, ids.shape[1]:].tolist()
print(json.dumps({"logprobs": lp, "tokens": out}))
"""
    for case in cases:
        res = subprocess.run([sys.executable, "-c", code, json.dumps(case)], capture_output=True,
                             text=True)
        if res.returncode != 0:
            check(False, f"{case['name']}: transformers load failed:\n{res.stderr[-2000:]}")
            continue
        r = json.loads(res.stdout.strip().splitlines()[-1])
        with open(case["score"][0]) as f:
            score = json.load(f)
        with open(case["generate"][0]) as f:
            gen = json.load(f)
        ok, _, worst_rel = compare(r["logprobs"], score["logprobs"])
        check(ok, f"{case['name']}: AutoModelForCausalLM log-probs, max diff / max(1, |logp|) "
                  f"{worst_rel:.3g} (bound {RTOL})")
        same = r["tokens"][:len(gen["tokens"])] == gen["tokens"]
        check(same, f"{case['name']}: transformers generate() greedy == attnres generate")


def main():
    args = sys.argv[1:]
    transformers_part = args[:1] == ["--transformers"]
    if transformers_part:
        args = args[1:]
    with open(args[0]) as f:
        cases = json.load(f)
    torch.manual_seed(0)
    if transformers_part:
        if REAL_TRANSFORMERS is None:
            print("skipped: transformers is not installed: AutoModelForCausalLM.from_pretrained("
                  "dir, trust_remote_code=True) was not checked")
            sys.exit(77)
        check_transformers(cases)
    else:
        for case in cases:
            check_case(case)
    finish("all export checks passed")


if __name__ == "__main__":
    main()
