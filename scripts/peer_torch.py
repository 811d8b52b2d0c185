#!/usr/bin/python3
"""The PyTorch peer: the training run of `attnres train CONFIG.json`, written the
way a PyTorch user would write it, to race a whole training step of ours against
it on the same card, at the same work.

    scripts/peer_torch.py CONFIG.json [--steps N] [--device cpu|cuda] [--compile]
                          [--attnres BIN] [--section.key=value ...]

Same model, same initial weights, same token units in the same order, same
optimizer, schedule and clipping, so that its per-step losses equal the ones
attnres writes to metrics.jsonl (within rounding: the test
tests/cli/peer_torch.sh requires 1e-4 relative in fp32 on the CPU). What a
PyTorch user would use, and this uses: nn.Linear / nn.Embedding modules,
torch.optim.AdamW (fused=True on CUDA), Muon with optimizer.type = "muon"
(torch.optim.Muon where this torch has it), torch.nn.utils.clip_grad_norm_, a
mixture-of-experts layer as a loop over experts with index_select / index_add, bf16
autocast on CUDA when the config trains in bf16 (fp32 parameters, as autocast
wants them), scaled_dot_product_attention, and torch.compile with --compile.

How it gets there:
- The config is resolved by `attnres inspect config CONFIG.json [overrides]`
  (defaults filled in, the same validation as `attnres train`).
- The initial weights are attnres's own: `attnres train` on the CPU with
  checkpoint.save_initial (which writes step_00000000 before the first
  update) and a one-step run of one token (training.steps must be > 0; the
  initial values depend on the seed and the model only, docs/model.md section
  3, or come from model.init_from), then `attnres export hf` of that
  checkpoint, whose model.safetensors the export's own modeling_attnres.py
  reads (read_weights).
- The units are read from the shards as src/data/loader.cpp reads them
  (docs/model.md section 5), shuffled by the same counter-based permutation.
- The step is the trainer's (src/train/trainer.cpp): the mean cross-entropy of
  the A x D microbatches (A = training.grad_accum, D = parallel.data: a
  data-parallel run's global batch, which a single process runs as A x D
  microbatches of the same units), the global gradient norm, clipping, AdamW
  at the schedule's learning rate (src/train/lr_schedule.cpp).

Output: one JSON line per optimizer step on stdout,
  {"step": s, "loss": L, "tokens_per_sec": x, "lr": lr, "grad_norm": g}
(step counted from 1, loss and grad_norm as metrics.jsonl has them: before
that step's update, the norm before clipping); what it ran and what it could
not use (no SDPA or torch.compile in this torch, a compile that failed) on
stderr. --steps N stops after the first N steps of the configured run (the
schedule still spans training.steps, as attnres's run.stop_after);
--training.steps=N changes the run itself. The peer neither evaluates nor
writes checkpoints, and always starts from the initial weights
(checkpoint.resume is not followed).
Exit codes as attnres's: 0 done, 1 runtime error, 2 bad input, 3 non-finite
loss or gradient norm (the step is printed, no update is made).

Needs Python 3 and torch only.
"""
import argparse
import bisect
import contextlib
import glob
import importlib.util
import inspect
import json
import math
import mmap
import os
import struct
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F
from torch import nn

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class InputError(Exception):
    """Bad input (exit code 2, as attnres)."""


def note(msg):
    print(f"peer_torch: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# The config and the initial weights, from the attnres binary
# ---------------------------------------------------------------------------

def run_attnres(binary, args, what):
    proc = subprocess.run([binary] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise InputError(f"{what}: `{binary} {' '.join(args[:2])} ...` exited {proc.returncode}")
    return proc.stdout


def resolve_config(binary, path, overrides):
    """The config as `attnres train` would run it: every key, defaults filled in."""
    return json.loads(run_attnres(binary, ["inspect", "config", path] + overrides,
                                  "resolving the config"))


def initial_export(binary, cfg, workdir):
    """Runs attnres for the initial weights and exports them; returns the export
    directory. The run keeps the model, the seed, model.init_from and the data
    (relative paths resolve against this working directory, as the user's run's
    would) and changes only what does not touch the initial values: one step of
    one token on the CPU, no evaluation, checkpoints into workdir."""
    init = json.loads(json.dumps(cfg))  # a deep copy
    init["training"].update(steps=1, micro_batch_size=1, seq_len=1, grad_accum=1, device="cpu",
                            precision="fp32", logits="auto", recompute="none")
    init["parallel"] = {"pipeline": 1, "virtual_stages": 1, "data": 1, "zero": 0}
    ckpt = os.path.join(workdir, "ckpt")
    init["checkpoint"] = {"dir": ckpt, "save_initial": True, "async": False, "every": 0,
                          "keep_last": 0, "resume": "never"}
    init["eval"] = {"every": 0}
    init["data"].pop("val", None)
    init["run"] = {"dir": os.path.join(workdir, "run")}
    path = os.path.join(workdir, "init.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(init, f)
    run_attnres(binary, ["train", path], "writing the initial weights")
    out = os.path.join(workdir, "hf")
    run_attnres(binary, ["export", "hf", "--checkpoint", os.path.join(ckpt, "step_00000000"),
                         "--out", out], "exporting the initial weights")
    return out


def read_export(directory):
    """(config.json, {name: tensor}) of an `attnres export hf` directory, one
    file or shards, read by the export's own modeling_attnres.py (torch alone)."""
    with open(os.path.join(directory, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    spec = importlib.util.spec_from_file_location(
        "attnres_export_modeling", os.path.join(directory, "modeling_attnres.py"))
    modeling = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(modeling)
    return config, modeling.read_weights(directory)


# ---------------------------------------------------------------------------
# The token units (src/data/loader.cpp, src/data/shard.cpp, src/core/rng.h)
# ---------------------------------------------------------------------------

MASK64 = (1 << 64) - 1


def mix64(x):
    """SplitMix64's finaliser, on Python ints kept to 64 bits."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def fnv1a64(text):
    h = 0xCBF29CE484222325
    for byte in text.encode("utf-8"):
        h = ((h ^ byte) * 0x100000001B3) & MASK64
    return h


def shuffled_units(n, seed, epoch):
    """Epoch `epoch`'s permutation of the n units: Fisher-Yates with j drawn
    from the counter-based generator by a 64 x 64 -> 128-bit multiply-high."""
    perm = list(range(n))
    stream = mix64(fnv1a64("attnres.data.shuffle") ^ (epoch & MASK64))
    key = mix64(mix64(seed & MASK64) ^ stream)  # random_u64(seed, stream, i) = mix64(key ^ i)
    for i in range(n - 1, 0, -1):
        j = (mix64(key ^ i) * (i + 1)) >> 64
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def resolve_data_spec(spec):
    """A file, a directory's *.bin files (not hidden) or a glob; byte-sorted."""
    if os.path.isfile(spec):
        paths = [spec]
    elif os.path.isdir(spec):
        prefix = spec if spec.endswith("/") else spec + "/"
        paths = [prefix + n for n in os.listdir(spec)
                 if not n.startswith(".") and len(n) > 4 and n.endswith(".bin")
                 and os.path.isfile(prefix + n)]
    else:
        paths = [p for p in glob.glob(spec) if os.path.isfile(p)]
    if not paths:
        raise InputError(f"data.train = '{spec}': no token shards")
    return sorted(paths, key=os.fsencode)


class TokenUnits:
    """Unit u of the run: B x T + 1 consecutive tokens of one shard (units
    advance by B T and never straddle shards), inputs the first B T, targets the
    last B T; with shuffling, each epoch visits the units in its permutation."""

    FORMATS = {(20240520, 1): (2, torch.int16), (20240801, 7): (4, torch.int32)}

    def __init__(self, spec, B, T, shuffle, seed):
        self.span, self.B, self.T, self.shuffle, self.seed = B * T, B, T, shuffle, seed
        self.shards, self.starts = [], [0]  # starts[i]: the first stream unit of shard i
        for path in resolve_data_spec(spec):
            with open(path, "rb") as f:
                header = f.read(1024)
                magic, version, count = struct.unpack("<3i", header[:12].ljust(12, b"\0"))
                if len(header) != 1024 or (magic, version) not in self.FORMATS or count < 0:
                    raise InputError(f"{path}: not a token shard in llm.c's format")
                size, dtype = self.FORMATS[(magic, version)]
                if os.fstat(f.fileno()).st_size != 1024 + count * size:
                    raise InputError(f"{path}: size does not match its header's {count} tokens")
                data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if count else None
            self.shards.append((data, size, dtype))
            units = (count - 1) // self.span if count >= self.span + 1 else 0
            self.starts.append(self.starts[-1] + units)
        self.units_per_epoch = self.starts[-1]
        if self.units_per_epoch == 0:
            raise InputError(f"data.train = '{spec}': no shard holds B*T+1 = {self.span + 1} "
                             "tokens")
        self.perm, self.perm_epoch = None, -1

    def unit(self, u):
        epoch, pos = divmod(u, self.units_per_epoch)
        if self.shuffle:
            if epoch != self.perm_epoch:
                self.perm, self.perm_epoch = shuffled_units(self.units_per_epoch, self.seed,
                                                            epoch), epoch
            pos = self.perm[pos]
        shard = bisect.bisect_right(self.starts, pos) - 1
        data, size, dtype = self.shards[shard]
        begin = 1024 + (pos - self.starts[shard]) * self.span * size
        raw = bytearray(data[begin:begin + (self.span + 1) * size])
        tokens = torch.frombuffer(raw, dtype=dtype).long()
        if size == 2:
            tokens &= 0xFFFF  # uint16 ids read as int16
        return (tokens[:-1].view(self.B, self.T), tokens[1:].view(self.B, self.T))


# ---------------------------------------------------------------------------
# The learning rate (src/train/lr_schedule.cpp)
# ---------------------------------------------------------------------------

def learning_rate(sched, lr, k, K):
    """At step k (from 0) of K: linear warmup lr (k+1)/W, then constant, cosine
    down towards lr_min, or wsd (lr, then linear to lr_min over the last
    ceil(decay_ratio K) steps, reaching it at the last step)."""
    W = sched["warmup_steps"]
    if k < W:
        return lr * (k + 1) / W
    lr_min = lr * sched["min_lr_ratio"]
    if sched["type"] == "cosine":
        q = (k - W) / max(1, K - W)
        return lr_min + (lr - lr_min) * (1.0 + math.cos(math.pi * q)) / 2.0
    if sched["type"] == "wsd":
        D = int(math.ceil(sched["decay_ratio"] * K))
        if D <= 0 or k < K - D:
            return lr
        return lr + (lr_min - lr) * min(1.0, (k - (K - D) + 1) / D)
    return lr


# ---------------------------------------------------------------------------
# The model (docs/model.md section 2), under the export's parameter names
# ---------------------------------------------------------------------------

HAVE_SDPA = hasattr(F, "scaled_dot_product_attention")  # torch >= 2.0


class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        # In float32 whatever autocast does around it: the statistics of
        # attnres are fp32 in a bf16 run too.
        x = x.float()
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def mix_variant(m):
    """model.residual's variant keys (the resolved config writes them only
    when one is set), the absent ones at their defaults."""
    v = {"query": "static", "weights": "attention", "score": "softmax", "key_norm": True,
         "heads": 1, "window": 0}
    v.update({k: m["residual"][k] for k in v if k in m["residual"]})
    return v


def mix_sources(m, s):
    """The sources of the Mix before sublayer s (docs/model.md section 2; with
    a window W: the embedding and the W most recent outputs)."""
    r, L = m["residual"], m["n_layers"]
    if mix_variant(m)["window"] > 0:
        return 1 + min(s, mix_variant(m)["window"])
    S = 1 if r["mode"] == "full" else r.get("block_size") or -(-2 * L // r["n_blocks"])
    return 1 + s // S + (1 if s % S else 0)


class DepthQuery(nn.Module):
    """The parameter of one depth Mix (`*.attn_res.query` and the like): the
    pseudo-query w, an input query's W (`query_proj`, q = W v) or the scalar
    logits, as model.residual says."""

    def __init__(self, m, s):
        super().__init__()
        variant, d = mix_variant(m), m["d_model"]
        if variant["weights"] == "scalars":
            self.logits = nn.Parameter(torch.zeros(mix_sources(m, s)))
        elif variant["query"] == "input":
            self.query_proj = nn.Linear(d, d, bias=False)
        else:
            self.query = nn.Parameter(torch.zeros(d))


class DWA(nn.Module):
    """DenseFormer's depth-weighted average (`*.attn_res.dwa`,
    `model.final_res.dwa`): sum_j a_j X_j, a learnt weight per source."""

    def __init__(self, k):
        super().__init__()
        self.dwa = nn.Parameter(torch.zeros(k))

    def forward(self, X):
        out = self.dwa[0] * X[0]
        for j in range(1, len(X)):
            out = out + self.dwa[j] * X[j]
        return out


def rotate(x, cos, sin):
    """Hugging Face's rotate-half RoPE: the pair (x[i], x[i + hd/2]) turned by
    the angle of its position and frequency."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos.to(x.dtype) + torch.cat([-x2, x1], dim=-1) * sin.to(x.dtype)


def causal_attention(q, k, v):
    """Causal softmax attention over [B, H, T, width] heads, scale 1/sqrt(q's
    width): scaled_dot_product_attention, or (torch < 2.0 has none) the same
    written out."""
    if HAVE_SDPA:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T = q.shape[2]
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    probs = torch.softmax(scores.float().masked_fill(causal, float("-inf")), dim=-1)
    return probs.to(v.dtype) @ v


class Attention(nn.Module):
    def __init__(self, d, H, Hkv):
        super().__init__()
        self.H, self.Hkv, self.hd = H, Hkv, d // H
        self.q_proj = nn.Linear(d, H * self.hd, bias=False)
        self.k_proj = nn.Linear(d, Hkv * self.hd, bias=False)
        self.v_proj = nn.Linear(d, Hkv * self.hd, bias=False)
        self.o_proj = nn.Linear(H * self.hd, d, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.H, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.Hkv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.Hkv, self.hd).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        if self.Hkv != self.H:
            # GQA: query head h reads KV head h // (H / Hkv). Expanded to H
            # heads (as Hugging Face's Llama does before SDPA): every SDPA
            # backend takes that, while enable_gqa (torch >= 2.5) is not taken
            # by all of them.
            g = self.H // self.Hkv
            k = k[:, :, None].expand(B, self.Hkv, g, T, self.hd).reshape(B, self.H, T, self.hd)
            v = v[:, :, None].expand(B, self.Hkv, g, T, self.hd).reshape(B, self.H, T, self.hd)
        out = causal_attention(q, k, v)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, self.H * self.hd))


class MLP(nn.Module):
    def __init__(self, d, f):
        super().__init__()
        self.gate_proj = nn.Linear(d, f, bias=False)
        self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Router(nn.Module):
    """`mlp.gate`: the router's weight, and the bias of auxiliary-loss-free
    balancing (a buffer: state the step updates, not a parameter)."""

    def __init__(self, d, E, aux_free):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(E, d))
        if aux_free:
            self.register_buffer("e_score_correction_bias", torch.zeros(E))


class MoE(nn.Module):
    """A mixture-of-experts MLP (docs/model.md, "Mixture of experts"), the way
    a PyTorch user writes one: route, then a loop over the experts with
    index_select / index_add_. Keeps the step's loads per expert (for the bias
    update) and the microbatch's auxiliary loss term."""

    def __init__(self, d, moe, kimi=False):
        super().__init__()
        self.E, self.K, self.cfg = moe["experts"], moe["top_k"], moe
        self.gate = Router(d, self.E, moe["balance"] == "aux_free")
        expert = KimiExpert if kimi else MLP  # Kimi Linear's w1 / w2 / w3, else gate / up / down
        self.experts = nn.ModuleList(expert(d, moe["expert_d_ff"]) for _ in range(self.E))
        shared = moe["shared_experts"] * moe["expert_d_ff"]
        self.shared_experts = MLP(d, shared) if shared else None
        self.loads = torch.zeros(self.E, dtype=torch.long)
        self.aux = None
        # The step's figures that attnres logs (docs/files.md, metrics.jsonl),
        # from this code's own routing: dropped slots, the auxiliary terms.
        self.dropped = torch.zeros((), dtype=torch.long)
        self.aux_terms = []

    def forward(self, x):
        B, T, d = x.shape
        u = x.reshape(B * T, d)
        N, E, K, cfg = B * T, self.E, self.K, self.cfg
        with torch.autocast(device_type=u.device.type, enabled=False):
            logits = F.linear(u.float(), self.gate.weight.float())
        s = torch.sigmoid(logits) if cfg["router"] == "sigmoid" else torch.softmax(logits, -1)
        choice = s.detach()
        if hasattr(self.gate, "e_score_correction_bias"):
            choice = choice + self.gate.e_score_correction_bias
        # The K largest, ties to the lower index (a stable sort), in ascending index.
        chosen = torch.sort(choice, dim=-1, descending=True, stable=True).indices[:, :K].sort(-1).values
        picked = s.gather(-1, chosen)
        weight = cfg["routed_scale"] * picked / picked.sum(-1, keepdim=True)
        if cfg["capacity_factor"] > 0:  # GShard: slots past an expert's capacity are dropped
            capacity = math.ceil(cfg["capacity_factor"] * N * K / E)
            flat = chosen.reshape(-1)
            seen = F.one_hot(flat, E).cumsum(0).gather(-1, flat[:, None]).view(N, K)
            weight = weight * (seen <= capacity)
            self.dropped = self.dropped.to(seen.device) + (seen > capacity).sum()
        counts = torch.bincount(chosen.reshape(-1), minlength=E)
        self.loads = self.loads.to(counts.device) + counts
        if cfg["balance"] == "aux_loss":  # coef E sum_e f_e P_e, f not differentiated
            P = (s / s.sum(-1, keepdim=True) if cfg["router"] == "sigmoid" else s).mean(0)
            self.aux = cfg["aux_loss_coef"] * E * (counts.float() / (N * K) * P).sum()
            self.aux_terms.append(self.aux.detach())
        out = self.shared_experts(u).float() if self.shared_experts is not None \
            else torch.zeros(N, d, device=u.device)
        for e, expert in enumerate(self.experts):
            token, slot = (chosen == e).nonzero(as_tuple=True)
            if token.numel():
                y = expert(u.index_select(0, token)).float()
                out = out.index_add(0, token, y * weight[token, slot, None])
        return out.to(x.dtype).view(B, T, d)

    @torch.no_grad()
    def update_bias(self):
        """After the optimizer step: b_e += bias_rate sign(mean load - load_e).
        Returns the step's figures as metrics.jsonl defines them (docs/files.md):
        the load max/mean, the dropped slots, the mean auxiliary term over the
        microbatches, the bias range after the update."""
        loads = self.loads.double()
        report = {"load": (loads.max() / loads.mean()).item() if loads.sum() > 0 else 0.0,
                  "dropped": int(self.dropped.item())}
        if self.aux_terms:
            report["aux"] = torch.stack(self.aux_terms).double().mean().item()
        if hasattr(self.gate, "e_score_correction_bias"):
            step = torch.sign(loads.mean() - loads).float() * self.cfg["bias_rate"]
            self.gate.e_score_correction_bias += step.to(self.gate.e_score_correction_bias.device)
            b = self.gate.e_score_correction_bias
            report["bias"] = [b.min().item(), b.max().item()]
        self.loads = torch.zeros_like(self.loads)
        self.dropped = torch.zeros_like(self.dropped)
        self.aux_terms = []
        return report


def kda_chunked(q, k, v, g, beta, chunk=64):
    """The KDA core over [B, T, H, K] inputs (q, k L2-normalised; g the log
    decays, beta [B, T, H]), chunk by chunk as a PyTorch user writes the WY
    form after FLA's naive_chunk_kda, in float32, from a zero state:
    inside a chunk with cumulative log-decays G (per channel), the writes r_t
    = beta_t (v_t - (D_t S_{t-1})^T k_t) solve the unit lower-triangular
    system (I + A) r = beta (v - (k exp(G)) S_0), A_ts = beta_t sum_c k_tc
    k_sc exp(G_tc - G_sc) for s < t; outputs o_t = (S_0^T (q_t exp(G_t)) +
    sum_{s<=t} r_s (q_t . k_s exp(G_t - G_s))) / sqrt(K); the state carried
    to the next chunk S = exp(G_C) S_0 + sum_s exp(G_C - G_s) k_s r_s^T.
    Decays enter only as exp of differences G_t - G_s <= 0 (s <= t), so
    strong gates stay finite. Returns o [B, T, H, K]."""
    B, T, H, K = q.shape
    S = q.new_zeros(B, H, K, K)
    outs = []
    for c0 in range(0, T, chunk):
        qc, kc, vc, gc = (x[:, c0:c0 + chunk].transpose(1, 2) for x in (q, k, v, g))  # [B, H, C, K]
        bc = beta[:, c0:c0 + chunk].transpose(1, 2)  # [B, H, C]
        C = qc.shape[2]
        G = gc.cumsum(2)
        diff = G[:, :, :, None, :] - G[:, :, None, :, :]  # [B, H, t, s, K]: G_t - G_s
        lower = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
        decay = torch.exp(diff.masked_fill(~lower[..., None], float("-inf")))  # 0 above the diagonal
        A = bc[..., None] * torch.einsum("bhtc,bhsc,bhtsc->bhts", kc, kc, decay)
        A = A.tril(-1)  # strictly lower
        eye = torch.eye(C, device=q.device)
        rhs = bc[..., None] * (vc - (kc * torch.exp(G)) @ S)
        r = torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True)
        inner = torch.einsum("bhtc,bhsc,bhtsc->bhts", qc, kc, decay)  # s <= t
        o = ((qc * torch.exp(G)) @ S + inner @ r) / math.sqrt(K)
        outs.append(o.transpose(1, 2))
        end = torch.exp(G[:, :, -1:, :] - G)  # [B, H, C, K]: exp(G_C - G_s)
        S = torch.exp(G[:, :, -1, :])[..., None] * S + (kc * end).transpose(-1, -2) @ r
    return torch.cat(outs, dim=1)


class KDA(nn.Module):
    """Kimi Delta Attention (docs/model.md "KDA layer"), under Kimi Linear's
    names: short causal depthwise convolutions with SiLU on q, k, v, per-head
    L2 norms, the decay -exp(A_log) softplus(f_b(f_a(x)) + dt_bias), beta =
    sigmoid(b(x)), the chunked delta rule, the gated output norm, o_proj."""

    def __init__(self, d, H, K, W, eps):
        super().__init__()
        HK = H * K
        self.H, self.K, self.W, self.eps = H, K, W, eps
        self.q_proj = nn.Linear(d, HK, bias=False)
        self.k_proj = nn.Linear(d, HK, bias=False)
        self.v_proj = nn.Linear(d, HK, bias=False)
        self.q_conv1d = nn.Conv1d(HK, HK, W, groups=HK, bias=False, padding=W - 1)
        self.k_conv1d = nn.Conv1d(HK, HK, W, groups=HK, bias=False, padding=W - 1)
        self.v_conv1d = nn.Conv1d(HK, HK, W, groups=HK, bias=False, padding=W - 1)
        self.A_log = nn.Parameter(torch.zeros(1, 1, H, 1))
        self.dt_bias = nn.Parameter(torch.zeros(HK))
        self.f_a_proj = nn.Linear(d, K, bias=False)
        self.f_b_proj = nn.Linear(K, HK, bias=False)
        self.b_proj = nn.Linear(d, H, bias=False)
        self.g_a_proj = nn.Linear(d, K, bias=False)
        self.g_b_proj = nn.Linear(K, HK, bias=False)
        self.o_norm = RMSNorm(K, eps)
        self.o_proj = nn.Linear(HK, d, bias=False)

    def forward(self, x, cos=None, sin=None):
        B, T, _ = x.shape
        H, K = self.H, self.K

        def conv(proj, c):  # causal: padding W-1 on both sides, the first T outputs kept
            return F.silu(c(proj(x).transpose(1, 2))[..., :T]).transpose(1, 2).view(B, T, H, K)

        q, k, v = conv(self.q_proj, self.q_conv1d), conv(self.k_proj, self.k_conv1d), \
            conv(self.v_proj, self.v_conv1d)
        q = q.float() * torch.rsqrt(q.float().pow(2).sum(-1, keepdim=True) + 1e-6)
        k = k.float() * torch.rsqrt(k.float().pow(2).sum(-1, keepdim=True) + 1e-6)
        g = -self.A_log.exp() * F.softplus(self.f_b_proj(self.f_a_proj(x)).float().view(B, T, H, K)
                                           + self.dt_bias.view(H, K))
        beta = torch.sigmoid(self.b_proj(x).float())
        o = kda_chunked(q, k, v.float(), g, beta)
        gate = torch.sigmoid(self.g_b_proj(self.g_a_proj(x)).float().view(B, T, H, K))
        return self.o_proj((self.o_norm(o) * gate).reshape(B, T, H * K).to(x.dtype))


class MLA(nn.Module):
    """Multi-head latent attention (docs/model.md "MLA layer"): q per head
    [q_n | q_r]; [c_kv | k_r] = kv_a(x); per head [k_n | v] =
    kv_b(RMSNorm(c_kv)); keys [k_n | k_r] with k_r shared by the heads; RoPE on
    q_r and k_r when the config asks; causal softmax attention, scale
    1/sqrt(dn + dr); o_proj."""

    def __init__(self, d, H, mla, eps, theta, seq_len):
        super().__init__()
        self.H, self.r = H, mla["kv_lora_rank"]
        self.dn, self.dr, self.dv = mla["qk_nope_head_dim"], mla["qk_rope_head_dim"], mla["v_head_dim"]
        self.q_proj = nn.Linear(d, H * (self.dn + self.dr), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(d, self.r + self.dr, bias=False)
        self.kv_a_layernorm = RMSNorm(self.r, eps)
        self.kv_b_proj = nn.Linear(self.r, H * (self.dn + self.dv), bias=False)
        self.o_proj = nn.Linear(H * self.dv, d, bias=False)
        self.rope = mla["rope"] and self.dr > 0
        if self.rope:
            inv = theta ** (-2.0 * torch.arange(self.dr // 2, dtype=torch.float64) / self.dr)
            ang = torch.arange(seq_len, dtype=torch.float64)[:, None] * inv
            ang = torch.cat([ang, ang], dim=-1)
            self.register_buffer("cos", ang.cos().float(), persistent=False)
            self.register_buffer("sin", ang.sin().float(), persistent=False)

    def forward(self, x, cos=None, sin=None):
        B, T, _ = x.shape
        H, dn, dr, dv = self.H, self.dn, self.dr, self.dv
        q = self.q_proj(x).view(B, T, H, dn + dr).transpose(1, 2)
        c_kv, k_r = self.kv_a_proj_with_mqa(x).split([self.r, dr], dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(c_kv).to(x.dtype)).view(B, T, H, dn + dv).transpose(1, 2)
        k_n, v = kv.split([dn, dv], dim=-1)
        q_n, q_r = q.split([dn, dr], dim=-1)
        k_r = k_r.view(B, 1, T, dr)
        if self.rope:
            q_r, k_r = rotate(q_r, self.cos[:T], self.sin[:T]), rotate(k_r, self.cos[:T], self.sin[:T])
        q = torch.cat([q_n, q_r], dim=-1)
        k = torch.cat([k_n, k_r.expand(B, H, T, dr)], dim=-1)
        out = causal_attention(q, k, v)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, H * dv))


class KimiExpert(nn.Module):
    """A routed expert under Kimi Linear's names: w2(SiLU(w1 x) * w3 x)."""

    def __init__(self, d, f):
        super().__init__()
        self.w1 = nn.Linear(d, f, bias=False)
        self.w2 = nn.Linear(f, d, bias=False)
        self.w3 = nn.Linear(d, f, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Layer(nn.Module):
    """Layer l: its attention (GQA, or in a Kimi Linear hybrid KDA or MLA, as
    `kinds` says) and its MLP (dense, or MoE: under `block_sparse_moe` in a
    hybrid, Kimi's name, else `mlp`)."""

    def __init__(self, m, attnres, l, kind, seq_len):
        super().__init__()
        d, eps = m["d_model"], m["norm_eps"]
        self.input_layernorm = RMSNorm(d, eps)
        if kind == "kda":
            kda = m["kda"]
            self.self_attn = KDA(d, kda["heads"], kda["head_dim"], kda["conv_size"], eps)
        elif kind == "mla":
            self.self_attn = MLA(d, m["n_heads"], m["mla"], eps, m["rope_theta"], seq_len)
        else:
            self.self_attn = Attention(d, m["n_heads"], m["n_kv_heads"])
        self.post_attention_layernorm = RMSNorm(d, eps)
        moe = m.get("moe")
        kimi = "kda" in m or "mla" in m
        if moe and l >= moe["dense_layers"] and kimi:
            self.block_sparse_moe = MoE(d, moe, kimi=True)
        else:
            self.mlp = MoE(d, moe) if moe and l >= moe["dense_layers"] else MLP(d, m["d_ff"])
        if m["residual"]["mode"] == "denseformer":
            if l > 0:
                self.attn_res = DWA(l + 1)
        elif attnres:
            self.attn_res = DepthQuery(m, 2 * l)
            self.mlp_res = DepthQuery(m, 2 * l + 1)

    def ffn(self):
        return self.block_sparse_moe if hasattr(self, "block_sparse_moe") else self.mlp


class Body(nn.Module):
    """`model.*`: the embedding, the layers, the final query and norm."""

    def __init__(self, m, attnres, kinds, seq_len):
        super().__init__()
        self.embed_tokens = nn.Embedding(m["vocab_size"], m["d_model"])
        self.layers = nn.ModuleList(Layer(m, attnres, l, kinds[l], seq_len)
                                    for l in range(m["n_layers"]))
        if attnres:
            self.final_res = (DWA(m["n_layers"] + 1) if m["residual"]["mode"] == "denseformer"
                              else DepthQuery(m, 2 * m["n_layers"]))
        self.norm = RMSNorm(m["d_model"], m["norm_eps"])


def source(v, eps, variant):
    """A depth source: (v, its key), in float32: per head group of channels
    RMSNorm(v) without gain (the raw v without the key norm), [B, T, H, d/H].
    The key is computed once, when the source is made, and read by every later Mix."""
    v = v.float()
    vh = v.unflatten(-1, (variant["heads"], -1))
    if not variant["key_norm"]:
        return v, vh
    return v, vh * torch.rsqrt(vh.pow(2).mean(-1, keepdim=True) + eps)


def depth_mix(q, sources, variant):
    """Mix(q, [v_j]) = sum_j a_j v_j, a_j = softmax_j(q . key_j) per head (or
    sigmoid, each on its own; or softmax_j of the scalar logits), in float32
    (elementwise products and sums, which autocast leaves in float32: attnres
    keeps the Mix's statistics in fp32 in a bf16 run too)."""
    window = variant["window"]
    if window and len(sources) > window + 1:  # the embedding and the W most recent
        sources = [sources[0]] + sources[-window:]
    if hasattr(q, "logits"):
        a = torch.softmax(q.logits, dim=0).view(-1, 1, 1, 1, 1)
    else:
        w = q.query_proj(sources[-1][0]) if hasattr(q, "query_proj") else q.query
        w = w.unflatten(-1, (variant["heads"], -1))
        logits = torch.stack([(key * w).sum(-1, keepdim=True) for _, key in sources])  # [n, B, T, H, 1]
        a = torch.sigmoid(logits) if variant["score"] == "sigmoid" else torch.softmax(logits, dim=0)
    heads = a.shape[-2]
    out = a[0] * sources[0][0].unflatten(-1, (heads, -1))
    for j in range(1, len(sources)):
        out = out + a[j] * sources[j][0].unflatten(-1, (heads, -1))
    return out.flatten(-2)


class CausalLM(nn.Module):
    """forward(inputs [B, T], targets [B, T]) -> (the mean token cross-entropy,
    the MoE layers' auxiliary loss terms summed, or None)."""

    def __init__(self, m, seq_len, fp32_logits, kinds):
        super().__init__()
        self.mode = m["residual"]["mode"]
        self.eps = m["norm_eps"]
        self.variant = mix_variant(m)
        L = m["n_layers"]
        if self.mode == "full":
            self.S = 1
        elif self.mode == "block":
            r = m["residual"]
            self.S = r["block_size"] if "block_size" in r else -(-2 * L // r["n_blocks"])
        self.model = Body(m, self.mode != "baseline", kinds, seq_len)
        self.tied = m["tie_embeddings"]
        if not self.tied:
            self.lm_head = nn.Linear(m["d_model"], m["vocab_size"], bias=False)
        self.fp32_logits = fp32_logits
        # RoPE's angles t theta^(-2i/hd), in float64 and rounded once.
        hd = max(2, m["d_model"] // m["n_heads"])  # (a model of MLA layers alone has no GQA hd)
        inv_freq = m["rope_theta"] ** (-2.0 * torch.arange(hd // 2, dtype=torch.float64) / hd)
        angles = torch.arange(seq_len, dtype=torch.float64)[:, None] * inv_freq
        angles = torch.cat([angles, angles], dim=-1)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def head_weight(self):
        return self.model.embed_tokens.weight if self.tied else self.lm_head.weight

    def forward(self, inputs, targets):
        body = self.model
        e = body.embed_tokens(inputs)
        T = inputs.shape[1]
        cos, sin = self.cos[:T], self.sin[:T]
        x = e                            # baseline: the residual stream
        src = lambda v: source(v, self.eps, self.variant)
        sources = [src(e)]               # AttnRes: e and the completed blocks
        partial = None                   # the current block's sum of outputs
        s = 0                            # the sublayer: 2l attention, 2l+1 MLP
        X = [e]                          # DenseFormer: e and the layers' outputs
        for layer in body.layers:
            if self.mode == "denseformer":
                # The average of X_0 .. X_l (X_0 = e before layer 0), then the
                # layer's PreNorm stream; its output a source of the next.
                h = layer.attn_res(X) if hasattr(layer, "attn_res") else e
                h = h + layer.self_attn(layer.input_layernorm(h), cos, sin)
                h = h + layer.ffn()(layer.post_attention_layernorm(h))
                X.append(h)
                continue
            for is_attn in (True, False):
                norm = layer.input_layernorm if is_attn else layer.post_attention_layernorm
                if self.mode == "baseline":
                    u = norm(x)
                else:
                    i = s % self.S  # position in its block; i > 0 also reads the partial sum
                    here = sources + ([src(partial)] if i > 0 else [])
                    q = layer.attn_res if is_attn else layer.mlp_res
                    u = norm(depth_mix(q, here, self.variant))
                y = layer.self_attn(u, cos, sin) if is_attn else layer.ffn()(u)
                if self.mode == "baseline":
                    x = x + y
                else:
                    # Block sums in float32, as the baseline's stream (e + bf16
                    # outputs) is under autocast.
                    partial = y.float() if i == 0 else partial + y
                    if i == self.S - 1:  # the block is complete: a source of its own
                        sources.append(src(partial))
                        partial = None
                s += 1
        if self.mode == "baseline":
            z = x
        elif self.mode == "denseformer":
            z = body.final_res(X)
        else:
            last = [src(partial)] if partial is not None else []
            z = depth_mix(body.final_res, sources + last, self.variant)
        h = body.norm(z)
        if self.fp32_logits and torch.is_autocast_enabled():
            # training.logits = "fp32" in a bf16 run: the head in float32.
            with torch.autocast(device_type=h.device.type, enabled=False):
                logits = F.linear(h, self.head_weight().float())
        else:
            logits = F.linear(h, self.head_weight())
        V = logits.shape[-1]
        aux = [layer.ffn().aux for layer in body.layers if getattr(layer.ffn(), "aux", None) is not None]
        return (F.cross_entropy(logits.float().reshape(-1, V), targets.reshape(-1)),
                sum(aux) if aux else None)

    def moe_layers(self):
        return [layer.ffn() for layer in self.model.layers if isinstance(layer.ffn(), MoE)]


# ---------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------

def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="scripts/peer_torch.py", allow_abbrev=False,
        description="Train the model of an attnres config as a PyTorch user would, printing "
                    "one JSON line per step (step, loss, tokens_per_sec, lr, grad_norm).",
        epilog="Other arguments are attnres config overrides, --section.key=value, resolved by "
               "`attnres inspect config` as `attnres train` takes them.")
    p.add_argument("config", help="the attnres config (JSON)")
    p.add_argument("--steps", type=int, default=None,
                   help="stop after the first N steps of the run (default: training.steps)")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None,
                   help="default: the config's training.device")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--attnres", default=os.path.join(REPO, "build", "attnres"),
                   help="the attnres binary (default: build/attnres of this repository)")
    args, rest = p.parse_known_args(argv)
    for r in rest:
        if not (r.startswith("--") and "=" in r and "." in r.split("=", 1)[0]):
            p.error(f"unrecognised argument '{r}' (config overrides are --section.key=value)")
    args.overrides = rest
    return args


def adamw(model, opt_cfg, device):
    """torch.optim.AdamW with decay on the tensors of two or more dims only
    (norm gains and depth queries undecayed, docs/model.md section 4); fused
    on CUDA where this torch has it."""
    named = list(model.named_parameters())  # a tied embedding is listed once
    groups = [{"params": [p for n, p in named if decayed(n, p)], "weight_decay": opt_cfg["weight_decay"]},
              {"params": [p for n, p in named if not decayed(n, p)], "weight_decay": 0.0}]
    extra = {}
    if device.type == "cuda" and "fused" in inspect.signature(torch.optim.AdamW).parameters:
        extra["fused"] = True
    opt = torch.optim.AdamW(groups, lr=opt_cfg["lr"], betas=(opt_cfg["beta1"], opt_cfg["beta2"]),
                            eps=opt_cfg["eps"], **extra)
    return opt, ("AdamW fused" if extra else "AdamW default")


def decayed(name, p):
    """Weight decay: every tensor of two or more dims but KDA's A_log (4-D,
    never decayed, as FLA's KDA layer) and an input query's W (a depth
    parameter, as the queries)."""
    return p.dim() >= 2 and not name.endswith((".A_log", "_res.query_proj.weight"))


def takes_muon(name, p):
    """optimizer.type = muon: the 2-D weights inside the layers but the
    routers and the depth Mix's (an input query's W)."""
    return (p.dim() == 2 and name.startswith("model.layers.") and "_res." not in name
            and not name.endswith(("mlp.gate.weight", "block_sparse_moe.gate.weight")))


class MuonFormula(torch.optim.Optimizer):
    """Muon as docs/model.md section 4 writes it, for a torch without
    torch.optim.Muon: Nesterov momentum, the Newton-Schulz quintic (transposed
    when m > n), W = W (1 - lr wd) - lr 0.2 sqrt(max(m, n)) X."""

    def __init__(self, params, lr, momentum, weight_decay):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay))

    @staticmethod
    def orthogonalise(u):
        a, b, c = 3.4445, -4.7750, 2.0315
        x = u / (u.norm() + 1e-7)
        tall = x.shape[0] > x.shape[1]
        if tall:
            x = x.T
        for _ in range(5):
            A = x @ x.T
            x = a * x + (b * A + c * A @ A) @ x
        return x.T if tall else x

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            mu, lr, wd = group["momentum"], group["lr"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                buf = state.setdefault("momentum_buffer", torch.zeros_like(p))
                buf.mul_(mu).add_(p.grad)
                x = self.orthogonalise(p.grad + mu * buf)
                p.mul_(1 - lr * wd).add_(x, alpha=-lr * 0.2 * math.sqrt(max(p.shape)))


class Optimizers:
    """Muon for the layers' matrices and AdamW for the rest, or AdamW alone:
    step() and zero_grad() over both, param_groups for the learning rate."""

    def __init__(self, opts):
        self.opts = opts

    @property
    def param_groups(self):
        return [g for o in self.opts for g in o.param_groups]

    def step(self):
        for o in self.opts:
            o.step()

    def zero_grad(self, set_to_none=True):
        for o in self.opts:
            o.zero_grad(set_to_none=set_to_none)


def muon(model, opt_cfg, device):
    """torch.optim.Muon (adjust_lr_fn="match_rms_adamw") where this torch has it,
    else the formula; AdamW for the rest, as adamw() sets it up."""
    named = list(model.named_parameters())  # a tied embedding is listed once
    matrices = [p for n, p in named if takes_muon(n, p)]
    kw = dict(lr=opt_cfg["lr"], momentum=opt_cfg["momentum"], weight_decay=opt_cfg["weight_decay"])
    if hasattr(torch.optim, "Muon"):
        m = torch.optim.Muon(matrices, nesterov=True, adjust_lr_fn="match_rms_adamw", **kw)
        kind = "torch.optim.Muon + AdamW"
    else:
        m = MuonFormula(matrices, **kw)
        kind = "Muon written out (this torch has no torch.optim.Muon) + AdamW"
    rest = [(n, p) for n, p in named if not takes_muon(n, p)]
    groups = [{"params": [p for n, p in rest if decayed(n, p)], "weight_decay": opt_cfg["weight_decay"]},
              {"params": [p for n, p in rest if not decayed(n, p)], "weight_decay": 0.0}]
    a = torch.optim.AdamW(groups, lr=opt_cfg["lr"], betas=(opt_cfg["beta1"], opt_cfg["beta2"]),
                          eps=opt_cfg["eps"])
    return Optimizers([m, a]), kind


def train(args):
    if not (os.path.isfile(args.attnres) and os.access(args.attnres, os.X_OK)):
        raise InputError(f"no attnres binary at '{args.attnres}' (build it, or give --attnres BIN)")
    cfg = resolve_config(args.attnres, args.config, args.overrides)
    m, tc, opt_cfg = cfg["model"], cfg["training"], cfg["optimizer"]
    K = tc["steps"]
    steps = K if args.steps is None else args.steps
    if not 0 < steps <= K:
        raise InputError(f"--steps {steps}: must be in [1, training.steps = {K}]")
    device = torch.device(args.device or tc["device"])
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda: torch sees no CUDA device")
    bf16 = tc["precision"] == "bf16" and device.type == "cuda"
    if tc["precision"] == "bf16" and not bf16:
        note("training.precision bf16 is for CUDA: on the CPU the peer runs fp32")
    fp32_logits = tc["logits"] == "fp32"
    B, T, A, D = tc["micro_batch_size"], tc["seq_len"], tc["grad_accum"], cfg["parallel"]["data"]
    M = A * D  # microbatches per step: the D replicas' A each, units k M .. k M + M - 1

    with tempfile.TemporaryDirectory(prefix="peer_torch.") as work:
        export_cfg, weights = read_export(initial_export(args.attnres, cfg, work))
    # Which layers are KDA (a hybrid's config.json lists them, 1-based, as
    # Kimi Linear's linear_attn_config.kda_layers); the others softmax: MLA
    # with model.mla, else GQA.
    kda_layers = set((export_cfg.get("linear_attn_config") or {}).get("kda_layers", []))
    kinds = ["kda" if l + 1 in kda_layers else "mla" if "mla" in m else "gqa"
             for l in range(m["n_layers"])]
    model = CausalLM(m, T, fp32_logits, kinds)
    if model.mode in ("full", "block") and export_cfg["attn_res"]["block_size"] != model.S:
        raise InputError(f"block size {model.S} here, {export_cfg['attn_res']['block_size']} in "
                         "the export")
    model.load_state_dict(weights, strict=True)
    model.to(device)
    opt, kind = (muon(model, opt_cfg, device) if opt_cfg.get("type") == "muon"
                 else adamw(model, opt_cfg, device))
    data = TokenUnits(cfg["data"]["train"], B, T, cfg["data"]["shuffle"], tc["seed"])

    forward = model
    compiled = False
    if args.compile:
        if hasattr(torch, "compile"):
            forward, compiled = torch.compile(model), True
        else:
            note(f"torch {torch.__version__} has no torch.compile: running eager")
    autocast = (lambda: torch.autocast(device_type="cuda", dtype=torch.bfloat16)) if bf16 \
        else contextlib.nullcontext
    n_params = sum(p.numel() for p in model.parameters())
    moe = f", MoE {len(model.moe_layers())} layers" if model.moe_layers() else ""
    on = f"{device} ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else device
    attention = ("scaled_dot_product_attention" if HAVE_SDPA
                 else "written out (this torch has no scaled_dot_product_attention)")
    note(f"torch {torch.__version__} on {on}, {'bf16 autocast' if bf16 else 'fp32'}, attention "
         f"{attention}, {'torch.compile' if compiled else 'eager'}, {kind}; {n_params} "
         f"parameters{moe}, {m['residual']['mode']} residual; {M} x {B} x {T} tokens per step; "
         f"{steps} of {K} steps")

    def microbatches(k):
        """The step's forward and backward passes; the mean loss (a tensor)."""
        total = torch.zeros((), device=device)
        for j in range(M):
            inputs, targets = data.unit(k * M + j)
            if device.type == "cuda":
                inputs = inputs.pin_memory().to(device, non_blocking=True)
                targets = targets.pin_memory().to(device, non_blocking=True)
            with autocast():
                loss, aux = forward(inputs, targets)
            # The objective adds the auxiliary loss; the reported loss is the tokens'.
            ((loss if aux is None else loss + aux) / M).backward()
            total += loss.detach() / M
        return total

    params = [p for g in opt.param_groups for p in g["params"]]
    clip = opt_cfg["grad_clip"]
    tokens = M * B * T
    times = []
    for k in range(steps):
        t0 = time.perf_counter()
        try:
            total = microbatches(k)
        except Exception as e:  # noqa: BLE001: any compiler failure
            if not (compiled and k == 0):
                raise
            first_line = (str(e).splitlines() or [""])[0]
            note(f"torch.compile failed ({type(e).__name__}: {first_line}); running eager")
            forward, compiled = model, False
            opt.zero_grad(set_to_none=True)
            for moe in model.moe_layers():
                moe.loads.zero_()
                moe.dropped.zero_()
                moe.aux_terms = []
            total = microbatches(k)
        # An expert that no token reached this step has no gradient; attnres
        # steps every parameter (g = 0: AdamW's moments and Muon's momentum
        # still decay, and weight decay acts), so give it a zero one.
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        # The global norm before clipping (clip_grad_norm_ returns it; with
        # clipping off, an infinite bound leaves the gradients as they are).
        # torch clips by clip / (norm + 1e-6) capped at 1, attnres only when
        # norm > clip: the two differ only for norms within 1e-6 below clip.
        norm = torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else float("inf"))
        loss, gnorm = torch.stack([total.float(), norm.float()]).tolist()
        lr = learning_rate(cfg["schedule"], opt_cfg["lr"], k, K)
        if not (math.isfinite(loss) and math.isfinite(gnorm)):
            print(json.dumps({"step": k + 1, "loss": loss, "tokens_per_sec": 0.0, "lr": lr,
                              "grad_norm": gnorm}), flush=True)
            note(f"step {k + 1}: non-finite loss {loss} or gradient norm {gnorm}; stopping "
                 "without an update")
            return 3
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        opt.zero_grad(set_to_none=True)
        reports = [moe.update_bias() for moe in model.moe_layers()]
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
        rate = tokens / times[-1]
        row = {"step": k + 1, "loss": loss, "tokens_per_sec": rate, "lr": lr, "grad_norm": gnorm}
        if reports:  # metrics.jsonl's MoE fields, recomputed by this code
            row["moe_load"] = [r["load"] for r in reports]
            row["moe_dropped"] = [r["dropped"] for r in reports]
            if "aux" in reports[0]:
                row["aux_loss"] = sum(r["aux"] for r in reports)
            if "bias" in reports[0]:
                row["moe_bias"] = [r["bias"] for r in reports]
        print(json.dumps(row), flush=True)
    if len(times) > 1:
        note(f"steps 2-{len(times)}: {tokens * (len(times) - 1) / sum(times[1:]):.0f} tokens/s "
             "(the first step, with its warm-up and any compilation, left out)")
    return 0


def main(argv):
    args = parse_args(argv)
    try:
        return train(args)
    except InputError as e:
        print(f"peer_torch: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
