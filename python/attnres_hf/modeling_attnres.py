# An attnres language model in plain PyTorch, as exported by
# `attnres export hf`: the same function the attnres trainer computes
# (its docs/model.md), with a key/value cache for generation.
#
#   e = Embed[tokens]; sublayer s = 0 .. 2L-1 is layer s//2's attention (even
#   s) or SwiGLU MLP (odd s): y_s = f_s(RMSNorm(x_s; g_s)). Its input x_s is
#   - baseline (PreNorm): e + sum of the earlier outputs;
#   - block AttnRes with S sublayers per block (full AttnRes: S = 1):
#     Mix(w_s, sources), the sources being e, each completed block's sum of
#     outputs, and (inside a block) the partial sum of the block's earlier
#     outputs; Mix(w, [v_j]) = sum_j softmax_j(w . RMSNorm(v_j)) v_j, the key
#     norm without gain, w_s a learned pseudo-query per sublayer; or one of
#     the residual variants of attn_res (an input query q = W v, scalar
#     weights, sigmoid scores, raw keys, H heads, a depth window:
#     AttnResDepthQuery).
#   The head reads z = the stream (baseline) or Mix(w_final, all sources):
#   logits = RMSNorm(z; g_final) W_out^T, W_out = Embed when tied.
#   Attention is causal with RoPE (rotate-half, angles computed in float64)
#   and grouped KV heads (query head h reads KV head h // (H / Hkv)). In a
#   mixture-of-experts model, layers >= first_k_dense_replace replace the MLP
#   by AttnResMoE (DeepSeek-V3's tensor names: mlp.gate, mlp.experts.E,
#   mlp.shared_experts).
#   A Kimi Linear hybrid (config linear_attn_config; model_type kimi_linear)
#   has KDA layers (AttnResKDA: gated delta-rule linear attention, computed
#   token by token in float32) in linear_attn_config.kda_layers and softmax
#   layers elsewhere: MLA (AttnResMLA, with kv_lora_rank) or the GQA above;
#   its MoE layers carry Kimi's names (block_sparse_moe.gate, .experts.E.w1 /
#   w2 / w3, .shared_experts).
#
# Torch alone is enough: `AttnResForCausalLM.from_pretrained(dir)` reads the
# safetensors files itself. When transformers is importable the classes are
# transformers PreTrainedModels (AutoModelForCausalLM.from_pretrained(dir,
# trust_remote_code=True), generate()). Norms, depth mixing and softmaxes are
# computed in float32 whatever the weights' dtype. transformers and the sibling
# configuration module are imported through importlib: transformers' loader
# checks the packages that a remote-code file's import statements name.
import importlib
import importlib.util
import json
import math
import mmap
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

try:
    from .configuration_attnres import AttnResConfig
except ImportError:  # loaded as a plain module, not from a package

    def _sibling(name):
        try:
            return importlib.import_module(name)
        except ImportError:
            path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name + ".py")
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
            return module

    AttnResConfig = _sibling("configuration_attnres").AttnResConfig


def _optional(module, name):
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


_PreTrainedModel = _optional("transformers", "PreTrainedModel")
_GenerationMixin = _optional("transformers", "GenerationMixin") or _optional(
    "transformers.generation", "GenerationMixin")
_DynamicCache = _optional("transformers.cache_utils", "DynamicCache")
_CausalLMOutputWithPast = _optional("transformers.modeling_outputs", "CausalLMOutputWithPast")
_BaseModelOutputWithPast = _optional("transformers.modeling_outputs", "BaseModelOutputWithPast")
HAVE_TRANSFORMERS = _PreTrainedModel is not None


# ---------------------------------------------------------------------------
# safetensors, read with torch alone
# ---------------------------------------------------------------------------

_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
           "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32,
           "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}


def read_safetensors(path):
    """{name: tensor} of a safetensors file: an 8-byte little-endian header
    length N, N bytes of JSON {name: {dtype, shape, data_offsets}}, then the
    little-endian row-major data (offsets relative to its start)."""
    if sys.byteorder != "little":
        raise RuntimeError("reading safetensors needs a little-endian machine")
    out = {}
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 8:
            raise ValueError(f"{path}: not a safetensors file (shorter than 8 bytes)")
        n = int.from_bytes(f.read(8), "little")
        if n > size - 8:
            raise ValueError(f"{path}: header length {n} exceeds the file")
        header = json.loads(f.read(n).decode("utf-8"))
        base = 8 + n
        # Copy-on-write map: tensors are cloned out of it, the file is never written.
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) as data:
            for name, info in header.items():
                if name == "__metadata__":
                    continue
                dtype = _DTYPES.get(info["dtype"])
                if dtype is None:
                    raise ValueError(f"{path}: tensor {name}: unsupported dtype {info['dtype']}")
                begin, end = info["data_offsets"]
                shape = info["shape"]
                count = math.prod(shape)
                itemsize = torch.empty((), dtype=dtype).element_size()
                if end - begin != count * itemsize or base + end > size:
                    raise ValueError(f"{path}: tensor {name}: data_offsets {begin}..{end} do not "
                                     f"hold {shape} of {info['dtype']}")
                if count == 0:
                    out[name] = torch.empty(shape, dtype=dtype)
                else:
                    out[name] = torch.frombuffer(data, dtype=dtype, count=count,
                                                 offset=base + begin).reshape(shape).clone()
    return out


def read_weights(directory):
    """Every tensor of an export: model.safetensors, or the shards that
    model.safetensors.index.json lists."""
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index, encoding="utf-8") as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    tensors = {}
    for name in files:
        tensors.update(read_safetensors(os.path.join(directory, name)))
    return tensors


# ---------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------

class AttnResRMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * self.weight.float()).to(x.dtype)


class AttnResDepthQuery(nn.Module):
    """The parameter of one depth Mix (`*.attn_res.*`, `*.mlp_res.*`,
    `model.final_res.*`): the pseudo-query w (`query`), an input query's W
    (`query_proj.weight`, q = W v with v the most recent source) or the scalar
    logits (`logits`, one per source), as the config's attn_res variant says."""

    def __init__(self, config, sources):
        super().__init__()
        self.variant = config.residual_variant()
        self.eps = config.rms_norm_eps
        d = config.hidden_size
        if self.variant["weights"] == "scalars":
            self.logits = nn.Parameter(torch.zeros(sources))
        elif self.variant["query"] == "input":
            self.query_proj = nn.Linear(d, d, bias=False)
        else:
            self.query = nn.Parameter(torch.zeros(d))

    def forward(self, sources):
        """Mix([v_1..v_k]): per head h of H (the channels in H groups), a_jh =
        softmax_j(q_h . RMSNorm(v_jh)) (sigmoid: each on its own; without the
        key norm the raw v_jh; scalars: softmax_j(s_j)), x_h = sum_j a_jh v_jh;
        in float32 (docs/model.md, "Residual variants")."""
        var = self.variant
        v = torch.stack(sources, dim=0).float()  # [k, B, T, d]
        k, d, H = v.shape[0], v.shape[-1], var["heads"]
        if var["weights"] == "scalars":
            a = torch.softmax(self.logits.float(), dim=0).view(k, 1, 1, 1, 1)
        else:
            vh = v.unflatten(-1, (H, d // H))  # [k, B, T, H, d / H]
            keys = vh * torch.rsqrt(vh.pow(2).mean(-1, keepdim=True) + self.eps) if var["key_norm"] else vh
            if var["query"] == "input":
                q = (sources[-1].float() @ self.query_proj.weight.float().t())
            else:
                q = self.query.float()
            logits = (keys * q.unflatten(-1, (H, d // H))).sum(-1, keepdim=True)  # [k, B, T, H, 1]
            a = torch.sigmoid(logits) if var["score"] == "sigmoid" else torch.softmax(logits, dim=0)
        x = (a * v.unflatten(-1, (H if var["weights"] != "scalars" else 1, -1))).sum(0)
        return x.flatten(-2).to(sources[0].dtype)

    def read(self, blocks, partial):
        """The sources this Mix reads: the completed blocks, then the partial
        sum when there is one; with a window the embedding and the W most recent."""
        sources = blocks + ([partial] if partial is not None else [])
        W = self.variant["window"]
        return sources if W == 0 or len(sources) <= W + 1 else [sources[0]] + sources[-W:]


class AttnResDWA(nn.Module):
    """DenseFormer's depth-weighted average (attn_res.mode "denseformer";
    `*.attn_res.dwa`, `model.final_res.dwa`): sum_j a_j X_j over the embedding
    and the earlier layers' outputs, a learnt weight each (1 for the most
    recent and 0 for the rest at the start); in float32."""

    def __init__(self, sources):
        super().__init__()
        self.dwa = nn.Parameter(torch.zeros(sources))

    def forward(self, sources):
        v = torch.stack(sources, dim=0).float()  # [k, B, T, d]
        return (self.dwa.float().view(-1, 1, 1, 1) * v).sum(0).to(sources[0].dtype)


def rope_cos_sin(position_ids, head_dim, theta, dtype):
    """cos/sin [B, 1, T, head_dim] of Hugging Face's rotate-half RoPE: angle
    t * theta^(-2i/hd) for i < hd/2, in float64 and rounded once."""
    half = head_dim // 2
    inv_freq = theta ** (-2.0 * torch.arange(half, dtype=torch.float64) / head_dim)
    angles = position_ids.to(torch.float64)[..., None] * inv_freq  # [B, T, half]
    angles = torch.cat([angles, angles], dim=-1)[:, None]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class AttnResKVCache:
    """What decoding keeps per layer, grown as tokens are fed: a softmax
    layer's keys and values [B, H, T, hd] (transformers' Cache interface:
    update, get_seq_length), a KDA layer's recurrent state and convolution
    windows (kda_state, set_kda_state). The fed token count is `seen`."""

    def __init__(self):
        self.key_cache, self.value_cache = [], []
        self.kda = {}  # layer_idx -> (state [B, H, K, K] float32, (q, k, v) windows [B, W-1, H K])
        self.seen = 0

    def update(self, key, value, layer_idx, cache_kwargs=None):
        while len(self.key_cache) <= layer_idx:  # a hybrid's KDA layers hold no keys
            self.key_cache.append(None)
            self.value_cache.append(None)
        if self.key_cache[layer_idx] is None:
            self.key_cache[layer_idx], self.value_cache[layer_idx] = key, value
        else:
            self.key_cache[layer_idx] = torch.cat([self.key_cache[layer_idx], key], dim=2)
            self.value_cache[layer_idx] = torch.cat([self.value_cache[layer_idx], value], dim=2)
        return self.key_cache[layer_idx], self.value_cache[layer_idx]

    def kda_state(self, layer_idx):
        return self.kda.get(layer_idx)

    def set_kda_state(self, layer_idx, state):
        self.kda[layer_idx] = state

    def get_seq_length(self, layer_idx=0):
        return self.seen

    def __len__(self):
        return len(self.key_cache)


def _as_cache(past_key_values, use_cache):
    """A cache object to update: the one given, a legacy tuple of (k, v) per
    layer converted, or a new one when use_cache."""
    if past_key_values is None:
        if not use_cache:
            return None
        return _DynamicCache() if _DynamicCache is not None else AttnResKVCache()
    if hasattr(past_key_values, "update"):
        return past_key_values
    cache = AttnResKVCache()
    for i, (k, v) in enumerate(past_key_values):
        cache.update(k, v, i)
    cache.seen = past_key_values[0][0].shape[2] if len(past_key_values) else 0
    return cache


def _cache_length(cache):
    return 0 if cache is None else int(cache.get_seq_length())


class AttnResAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        d, hd = config.hidden_size, config.head_dim
        self.n_heads, self.n_kv_heads, self.head_dim = (config.num_attention_heads,
                                                        config.num_key_value_heads, hd)
        self.layer_idx = layer_idx
        self.q_proj = nn.Linear(d, self.n_heads * hd, bias=False)
        self.k_proj = nn.Linear(d, self.n_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(d, self.n_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(self.n_heads * hd, d, bias=False)

    def forward(self, x, cos, sin, mask, cache):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        group = self.n_heads // self.n_kv_heads
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) / math.sqrt(self.head_dim)
        probs = torch.softmax(scores + mask, dim=-1).to(v.dtype)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim)
        return self.o_proj(out)


class AttnResKDA(nn.Module):
    """Kimi Delta Attention (the attnres repository's docs/model.md "KDA
    layer"; Kimi Linear's names and shapes), on the normed input u:
      q, k, v = SiLU(causal depthwise conv(u W^T)), width W, no bias;
      q, k L2-normalised per head (x / sqrt(|x|^2 + 1e-6));
      g = -exp(A_log_h) softplus(u W_fa^T W_fb^T + dt_bias), beta = sigmoid(u W_b^T);
      per head, S a K x K state from zero: S <- Diag(exp(g_t)) S,
      S <- S + beta_t k_t (v_t - S^T k_t)^T, o_t = S^T q_t / sqrt(K);
      o <- RMSNorm_K(o) o_norm sigmoid(u W_ga^T W_gb^T), then o_proj.
    The recurrence runs token by token in float32 (attnres trains the same
    function chunkwise). With a cache it carries S and the last W - 1 inputs
    of each convolution; with an attention mask, masked (left-padding)
    tokens neither enter the convolutions nor write the state."""

    def __init__(self, config, layer_idx):
        super().__init__()
        lac = config.linear_attn_config
        d, H, K, W = config.hidden_size, lac["num_heads"], lac["head_dim"], lac["short_conv_kernel_size"]
        self.H, self.K, self.W, self.layer_idx = H, K, W, layer_idx
        HK = H * K
        self.q_proj = nn.Linear(d, HK, bias=False)
        self.k_proj = nn.Linear(d, HK, bias=False)
        self.v_proj = nn.Linear(d, HK, bias=False)
        self.q_conv1d = nn.Conv1d(HK, HK, W, groups=HK, bias=False)
        self.k_conv1d = nn.Conv1d(HK, HK, W, groups=HK, bias=False)
        self.v_conv1d = nn.Conv1d(HK, HK, W, groups=HK, bias=False)
        self.A_log = nn.Parameter(torch.zeros(1, 1, H, 1))
        self.dt_bias = nn.Parameter(torch.zeros(HK))
        self.f_a_proj = nn.Linear(d, K, bias=False)
        self.f_b_proj = nn.Linear(K, HK, bias=False)
        self.b_proj = nn.Linear(d, H, bias=False)
        self.g_a_proj = nn.Linear(d, K, bias=False)
        self.g_b_proj = nn.Linear(K, HK, bias=False)
        self.o_norm = AttnResRMSNorm(K, config.rms_norm_eps)
        self.o_proj = nn.Linear(HK, d, bias=False)

    def _conv(self, conv, x, window):
        """SiLU(causal depthwise conv) of x [B, T, C] after the W - 1 earlier
        inputs `window` [B, W-1, C]; returns it and the new window."""
        xp = torch.cat([window, x], dim=1)
        y = F.conv1d(xp.transpose(1, 2).float(), conv.weight.float(), groups=x.shape[-1])
        return F.silu(y).transpose(1, 2), xp[:, xp.shape[1] - (self.W - 1):]

    def forward(self, u, keep, cache):
        B, T, _ = u.shape
        H, K, HK = self.H, self.K, self.H * self.K
        past = cache.kda_state(self.layer_idx) if cache is not None else None
        if past is None:
            zeros = u.new_zeros(B, self.W - 1, HK)
            past = (u.new_zeros(B, H, K, K, dtype=torch.float32), (zeros, zeros, zeros))
        S, windows = past
        keep_f = keep.to(torch.float32)[..., None]  # [B, T, 1]: 0 on masked tokens
        convs = [self._conv(conv, proj(u) * keep_f.to(u.dtype), w) for proj, conv, w in
                 ((self.q_proj, self.q_conv1d, windows[0]), (self.k_proj, self.k_conv1d, windows[1]),
                  (self.v_proj, self.v_conv1d, windows[2]))]
        (q, wq), (k, wk), (v, wv) = convs
        q, k, v = (x.view(B, T, H, K) for x in (q, k, v))
        q = q * torch.rsqrt(q.pow(2).sum(-1, keepdim=True) + 1e-6)
        k = k * torch.rsqrt(k.pow(2).sum(-1, keepdim=True) + 1e-6)
        f = self.f_b_proj(self.f_a_proj(u)).float().view(B, T, H, K)
        g = -torch.exp(self.A_log.float().view(1, 1, H, 1)) * F.softplus(
            f + self.dt_bias.float().view(H, K))
        beta = torch.sigmoid(self.b_proj(u).float())  # [B, T, H]
        g = g * keep_f[..., None]         # a masked token: no decay (exp 0 = 1) ...
        beta = beta * keep_f              # ... and no write
        outs = []
        for t in range(T):
            S = S * torch.exp(g[:, t])[..., None]  # Diag(exp(g)) S: row i of S decays by g_i
            kt = k[:, t]
            err = v[:, t] - torch.einsum("bhk,bhkv->bhv", kt, S)
            S = S + beta[:, t, :, None, None] * kt[..., None] * err[:, :, None, :]
            outs.append(torch.einsum("bhk,bhkv->bhv", q[:, t], S) / math.sqrt(K))
        o = torch.stack(outs, dim=1)  # [B, T, H, K]
        o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + self.o_norm.eps) * self.o_norm.weight.float()
        o = o * torch.sigmoid(self.g_b_proj(self.g_a_proj(u)).float().view(B, T, H, K))
        if cache is not None:
            cache.set_kda_state(self.layer_idx, (S, (wq, wk, wv)))
        return self.o_proj(o.reshape(B, T, HK).to(u.dtype))


class AttnResMLA(nn.Module):
    """Multi-head latent attention (docs/model.md "MLA layer"; Kimi Linear's
    and DeepSeek-V3's names), on the normed input u: q = u W_q^T, per head
    [q_n (dn) | q_r (dr)]; [c_kv (r) | k_r (dr)] = u W_kva^T; per head [k_n |
    v] = RMSNorm(c_kv; kv_a_layernorm, eps rms_norm_eps) W_kvb^T; head h's key
    [k_n,h | k_r] (k_r shared); with RoPE (mla_use_nope false) q_r and k_r
    rotated (rotate-half over dr); causal softmax attention, scale
    1 / sqrt(dn + dr); o_proj. The cache keeps the expanded keys and values."""

    def __init__(self, config, layer_idx):
        super().__init__()
        d, H, r = config.hidden_size, config.num_attention_heads, config.kv_lora_rank
        self.H, self.r, self.layer_idx = H, r, layer_idx
        self.dn, self.dr, self.dv = config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim
        self.rope = not config.mla_use_nope
        self.q_proj = nn.Linear(d, H * (self.dn + self.dr), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(d, r + self.dr, bias=False)
        self.kv_a_layernorm = AttnResRMSNorm(r, config.rms_norm_eps)
        self.kv_b_proj = nn.Linear(r, H * (self.dn + self.dv), bias=False)
        self.o_proj = nn.Linear(H * self.dv, d, bias=False)

    def forward(self, u, rope, mask, cache):
        B, T, _ = u.shape
        H, dn, dr, dv = self.H, self.dn, self.dr, self.dv
        q = self.q_proj(u).view(B, T, H, dn + dr).transpose(1, 2)
        c_kv, k_r = self.kv_a_proj_with_mqa(u).split([self.r, dr], dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(c_kv)).view(B, T, H, dn + dv).transpose(1, 2)
        k_n, v = kv.split([dn, dv], dim=-1)
        q_n, q_r = q.split([dn, dr], dim=-1)
        k_r = k_r.view(B, 1, T, dr)
        if self.rope and dr > 0:
            cos, sin = rope(dr)
            q_r, k_r = apply_rope(q_r, cos, sin), apply_rope(k_r, cos, sin)
        q = torch.cat([q_n, q_r], dim=-1)
        k = torch.cat([k_n, k_r.expand(B, H, T, dr)], dim=-1)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) / math.sqrt(dn + dr)
        probs = torch.softmax(scores + mask, dim=-1).to(v.dtype)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(B, T, H * dv)
        return self.o_proj(out)


class AttnResMLP(nn.Module):
    """SwiGLU of width f (default: the dense MLP's intermediate_size)."""

    def __init__(self, config, width=None):
        super().__init__()
        d, f = config.hidden_size, width or config.intermediate_size
        self.gate_proj = nn.Linear(d, f, bias=False)
        self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class AttnResKimiExpert(nn.Module):
    """A routed expert under Kimi Linear's names: w2(SiLU(w1 x) * w3 x)."""

    def __init__(self, config, width):
        super().__init__()
        d = config.hidden_size
        self.w1 = nn.Linear(d, width, bias=False)
        self.w2 = nn.Linear(width, d, bias=False)
        self.w3 = nn.Linear(d, width, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class AttnResMoEGate(nn.Module):
    """The router (DeepSeek-V3's MoEGate): logits r = u W^T [N, E] in float32;
    scores s = sigmoid(r) or softmax(r); the K experts with the largest
    s + e_score_correction_bias (topk_method noaux_tc; no bias for greedy),
    ties to the lower index, in ascending index; weights routed_scaling_factor
    s / (sum of the chosen s). With moe_capacity_factor c > 0 an expert takes
    at most ceil(c N K / E) of the call's N tokens, slots taken in token order:
    a slot past its expert's capacity is dropped (weight 0, not given to the
    token's other experts). Returns (experts [N, K], weights [N, K] float32)."""

    def __init__(self, config):
        super().__init__()
        self.E, self.K = config.n_routed_experts, config.num_experts_per_tok
        self.scoring, self.scale = config.scoring_func, config.routed_scaling_factor
        self.capacity_factor = config.moe_capacity_factor
        self.weight = nn.Parameter(torch.empty(self.E, config.hidden_size))
        if config.topk_method == "noaux_tc":
            # Model state, not a parameter (attnres updates it from the loads).
            self.register_buffer("e_score_correction_bias", torch.zeros(self.E))
        else:
            self.e_score_correction_bias = None

    def _apply(self, fn, *args, **kwargs):
        # model.to(dtype) casts buffers too: the bias decides the choice and
        # stays float32 (on the weight's device), as transformers'
        # _keep_in_fp32_modules keeps it.
        bias = self.e_score_correction_bias
        super()._apply(fn, *args, **kwargs)
        if bias is not None:
            self.e_score_correction_bias = bias.to(device=self.weight.device, dtype=torch.float32)
        return self

    def forward(self, u):
        logits = F.linear(u.float(), self.weight.float())
        s = torch.sigmoid(logits) if self.scoring == "sigmoid" else torch.softmax(logits, dim=-1)
        choice = s if self.e_score_correction_bias is None else \
            s + self.e_score_correction_bias.float()
        # A stable descending sort: of equal values, the lower index first.
        experts = torch.sort(choice, dim=-1, descending=True, stable=True).indices[:, :self.K]
        experts = experts.sort(dim=-1).values
        chosen = s.gather(-1, experts)
        weights = self.scale * chosen / chosen.sum(-1, keepdim=True)
        if self.capacity_factor > 0:
            N = u.shape[0]
            capacity = math.ceil(self.capacity_factor * N * self.K / self.E)
            flat = experts.reshape(-1)  # slots in token order, a token's in ascending index
            seen = F.one_hot(flat, self.E).cumsum(0).gather(-1, flat[:, None])[:, 0]
            weights = weights * (seen <= capacity).view(N, self.K)
        return experts, weights


class AttnResMoE(nn.Module):
    """A mixture-of-experts MLP (DeepSeek-V3's layout): the shared experts (one
    SwiGLU of width n_shared_experts x moe_intermediate_size) plus, per token,
    its chosen routed experts' outputs times their weights, added in ascending
    expert index, in float32."""

    def __init__(self, config):
        super().__init__()
        width = config.moe_intermediate_size
        self.gate = AttnResMoEGate(config)
        expert = AttnResKimiExpert if config.kimi_names() else AttnResMLP
        self.experts = nn.ModuleList(expert(config, width) for _ in range(config.n_routed_experts))
        self.shared_experts = (AttnResMLP(config, config.n_shared_experts * width)
                               if config.n_shared_experts else None)

    def forward(self, x):
        shape = x.shape
        u = x.reshape(-1, shape[-1])
        experts, weights = self.gate(u)
        out = (self.shared_experts(u).float() if self.shared_experts is not None
               else torch.zeros(u.shape, dtype=torch.float32, device=u.device))
        for e, expert in enumerate(self.experts):
            token, slot = (experts == e).nonzero(as_tuple=True)
            keep = weights[token, slot] != 0
            token, slot = token[keep], slot[keep]
            if token.numel():
                y = expert(u.index_select(0, token)).float()
                out.index_add_(0, token, y * weights[token, slot, None])
        return out.to(x.dtype).view(shape)


class AttnResDecoderLayer(nn.Module):
    """Layer l: sublayers 2l (attention) and 2l+1 (MLP), each with its input
    norm and, in AttnRes modes, its depth Mix query."""

    def __init__(self, config, layer_idx):
        super().__init__()
        eps = config.rms_norm_eps
        self.input_layernorm = AttnResRMSNorm(config.hidden_size, eps)
        self.kind = config.attention_kind(layer_idx)
        self.self_attn = {"kda": AttnResKDA, "mla": AttnResMLA,
                          "gqa": AttnResAttention}[self.kind](config, layer_idx)
        self.post_attention_layernorm = AttnResRMSNorm(config.hidden_size, eps)
        if not config.moe_layer(layer_idx):
            self.mlp = AttnResMLP(config)
        elif config.kimi_names():  # Kimi Linear's name for a MoE layer
            self.block_sparse_moe = AttnResMoE(config)
        else:
            self.mlp = AttnResMoE(config)
        if config.residual_mode() == "denseformer":
            if layer_idx > 0:  # the average of X_0 .. X_l before the layer
                self.attn_res = AttnResDWA(layer_idx + 1)
        elif config.residual_mode() != "baseline":
            self.attn_res = AttnResDepthQuery(config, config.mix_sources(2 * layer_idx))
            self.mlp_res = AttnResDepthQuery(config, config.mix_sources(2 * layer_idx + 1))

    def feed_forward(self):
        return self.block_sparse_moe if hasattr(self, "block_sparse_moe") else self.mlp

    def token_mixer(self, cos, sin, rope, mask, keep, cache):
        """The attention sublayer's function of its normed input."""
        if self.kind == "kda":
            return lambda u: self.self_attn(u, keep, cache)
        if self.kind == "mla":
            return lambda u: self.self_attn(u, rope, mask, cache)
        return lambda u: self.self_attn(u, cos, sin, mask, cache)


class _Output(dict):
    """A minimal stand-in for transformers' ModelOutput: keys as attributes."""

    __getattr__ = dict.get


def _output(kind, **fields):
    cls = _CausalLMOutputWithPast if kind == "lm" else _BaseModelOutputWithPast
    return cls(**fields) if cls is not None else _Output(**fields)


# ---------------------------------------------------------------------------
# Base class: transformers' PreTrainedModel when importable, else torch alone
# ---------------------------------------------------------------------------

class _TorchPreTrainedModel(nn.Module):
    """What this model needs of transformers' PreTrainedModel, with torch alone."""

    def __init__(self, config, *args, **kwargs):
        super().__init__()
        self.config = config
        self.generation_config = _Output(eos_token_id=getattr(config, "eos_token_id", None),
                                         bos_token_id=getattr(config, "bos_token_id", None),
                                         suppress_tokens=None)

    def post_init(self):
        self.apply(self._init_weights)
        self.tie_weights()

    def tie_weights(self):
        out = self.get_output_embeddings() if hasattr(self, "get_output_embeddings") else None
        if out is not None and getattr(self.config, "tie_word_embeddings", False):
            out.weight = self.get_input_embeddings().weight

    @property
    def device(self):
        return next(self.parameters()).device

    @property
    def dtype(self):
        return next(self.parameters()).dtype

    @classmethod
    def from_pretrained(cls, directory, torch_dtype=None, device=None, **config_overrides):
        """Load an export directory with torch alone. torch_dtype: None (float32,
        as transformers), "auto" (the stored dtype, config.torch_dtype) or a
        torch.dtype."""
        directory = str(directory)
        config = AttnResConfig.from_pretrained(directory, **config_overrides)
        model = cls(config)
        tensors = read_weights(directory)
        expected = model.state_dict()
        tied = getattr(config, "tie_word_embeddings", False)
        unexpected = sorted(set(tensors) - set(expected))
        missing = sorted(set(expected) - set(tensors) - ({"lm_head.weight"} if tied else set()))
        if unexpected or missing:
            raise ValueError(f"{directory}: weights do not match the config: missing {missing}, "
                             f"unexpected {unexpected}")
        with torch.no_grad():
            for name, t in tensors.items():
                if tuple(t.shape) != tuple(expected[name].shape):
                    raise ValueError(f"{directory}: {name} has shape {tuple(t.shape)}, the config "
                                     f"needs {tuple(expected[name].shape)}")
                expected[name].copy_(t)  # state_dict tensors share the parameters' storage
        if torch_dtype == "auto":
            torch_dtype = getattr(torch, getattr(config, "torch_dtype", None) or "float32")
        model.to(dtype=torch_dtype or torch.float32)
        model.tie_weights()
        path = os.path.join(directory, "generation_config.json")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                model.generation_config.update(json.load(f))
        if device is not None:
            model.to(device)
        return model.eval()


_Base = _PreTrainedModel if HAVE_TRANSFORMERS else _TorchPreTrainedModel


class AttnResPreTrainedModel(_Base):
    config_class = AttnResConfig
    base_model_prefix = "model"
    _no_split_modules = ["AttnResDecoderLayer"]
    _keep_in_fp32_modules = ["e_score_correction_bias"]

    def _init_weights(self, module):
        # The attnres trainer's initialisation (docs/model.md section 3), up
        # to the output projections' smaller std; only for weights a
        # checkpoint does not provide.
        std = getattr(self.config, "initializer_range", 0.02)
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.data.normal_(0.0, std)
        elif isinstance(module, AttnResRMSNorm):
            module.weight.data.fill_(1.0)
        elif isinstance(module, AttnResDepthQuery):  # every Mix starts uniform
            for p in module.parameters():
                p.data.zero_()
        elif isinstance(module, AttnResDWA):  # DenseFormer starts as the PreNorm stream
            module.dwa.data.zero_()
            module.dwa.data[-1] = 1.0
        elif isinstance(module, AttnResMoEGate):
            module.weight.data.normal_(0.0, std)


class AttnResModel(AttnResPreTrainedModel):
    """Embedding, the 2L sublayers with their residual connections, the final
    depth Mix (AttnRes modes) and norm; returns the normalised hidden states."""

    def __init__(self, config):
        super().__init__(config)
        self.mode = config.residual_mode()
        self.block_size = config.residual_block_size()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(AttnResDecoderLayer(config, l)
                                    for l in range(config.num_hidden_layers))
        if self.mode == "denseformer":
            self.final_res = AttnResDWA(config.num_hidden_layers + 1)
        elif self.mode != "baseline":
            self.final_res = AttnResDepthQuery(config, config.mix_sources(2 * config.num_hidden_layers))
        self.norm = AttnResRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    def forward(self, input_ids=None, attention_mask=None, position_ids=None,
                past_key_values=None, use_cache=None, inputs_embeds=None, **kwargs):
        cfg = self.config
        use_cache = cfg.use_cache if use_cache is None else use_cache
        cache = _as_cache(past_key_values, use_cache)
        past = _cache_length(cache)
        e = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        B, T, _ = e.shape
        if position_ids is None:
            position_ids = torch.arange(past, past + T, device=e.device).expand(B, T)
        if cfg.kimi_names() and cache is not None and not isinstance(cache, AttnResKVCache):
            raise ValueError(f"a Kimi Linear hybrid decodes with AttnResKVCache (its KDA layers' "
                             f"states), not {type(cache).__name__}: use generate_tokens()")
        cos, sin = rope_cos_sin(position_ids, cfg.head_dim, cfg.rope_theta, e.dtype)
        ropes = {}

        def rope(dim):  # cos/sin of another head width (MLA's dr dims)
            if dim not in ropes:
                ropes[dim] = rope_cos_sin(position_ids, dim, cfg.rope_theta, e.dtype)
            return ropes[dim]
        # Which tokens are real (KDA layers skip masked ones): [B, T].
        keep = (attention_mask[:, -T:].to(torch.bool) if attention_mask is not None
                else torch.ones(B, T, dtype=torch.bool, device=e.device))
        # Causal over absolute positions (query past + i sees keys <= past + i);
        # padded keys (attention_mask 0) get the most negative float instead of
        # -inf, so that a padding query's row stays finite.
        keys = past + T
        mask = torch.full((T, keys), float("-inf"), device=e.device)
        mask = torch.triu(mask, diagonal=past + 1)[None, None]
        if attention_mask is not None:
            pad = attention_mask[:, None, None, -keys:].to(torch.bool).logical_not()
            mask = mask.expand(B, 1, T, keys).masked_fill(pad, torch.finfo(torch.float32).min)

        S = self.block_size
        x = e                         # baseline: the stream
        blocks, partial = [e], None   # AttnRes: completed sources, the block's partial sum
        s = 0                         # the sublayer
        for layer in self.layers:
            if self.mode == "denseformer":
                # X_0 = e, or the average of X_0 .. X_l; the PreNorm stream
                # inside the layer; its output X_{l+1} a source of the next.
                attn = layer.token_mixer(cos, sin, rope, mask, keep, cache)
                h = layer.attn_res(blocks) if hasattr(layer, "attn_res") else e
                h = h + attn(layer.input_layernorm(h))
                h = h + layer.feed_forward()(layer.post_attention_layernorm(h))
                blocks.append(h)
                continue
            attn = layer.token_mixer(cos, sin, rope, mask, keep, cache)
            for norm, f, q in ((layer.input_layernorm, attn, getattr(layer, "attn_res", None)),
                               (layer.post_attention_layernorm, layer.feed_forward(),
                                getattr(layer, "mlp_res", None))):
                if self.mode == "baseline":
                    x = x + f(norm(x))
                else:
                    i = s % S  # position in its block; i > 0 reads the partial sum too
                    y = f(norm(q(q.read(blocks, partial if i > 0 else None))))
                    partial = y if i == 0 else partial + y
                    if i == S - 1:  # the block is complete: a source of its own
                        blocks.append(partial)
                        partial = None
                s += 1
        if self.mode == "baseline":
            z = x
        elif self.mode == "denseformer":
            z = self.final_res(blocks)
        else:
            z = self.final_res(self.final_res.read(blocks, partial))
        hidden = self.norm(z)
        if isinstance(cache, AttnResKVCache):
            cache.seen += T
        return _output("base", last_hidden_state=hidden,
                       past_key_values=cache if use_cache else None)


class AttnResForCausalLM(AttnResPreTrainedModel, *([_GenerationMixin] if _GenerationMixin else [])):
    _tied_weights_keys = ["lm_head.weight"]

    def __init__(self, config):
        super().__init__(config)
        self.model = AttnResModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def set_input_embeddings(self, value):
        self.model.embed_tokens = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    def forward(self, input_ids=None, attention_mask=None, position_ids=None,
                past_key_values=None, use_cache=None, labels=None, inputs_embeds=None, **kwargs):
        """logits [B, T, V] (float32 or the weights' dtype); with labels, the
        mean token cross-entropy of predicting labels[:, t + 1] at t (-100 ignored)."""
        out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                         position_ids=position_ids, past_key_values=past_key_values,
                         use_cache=use_cache, inputs_embeds=inputs_embeds)
        logits = self.lm_head(out.last_hidden_state)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]),
                                   labels[:, 1:].reshape(-1), ignore_index=-100)
        return _output("lm", loss=loss, logits=logits, past_key_values=out.past_key_values)

    def prepare_inputs_for_generation(self, input_ids, past_key_values=None, attention_mask=None,
                                      inputs_embeds=None, use_cache=True, **kwargs):
        # transformers' generate(): feed only the tokens the cache lacks, at
        # their positions (counted over the attention mask when one is given).
        past = 0
        if past_key_values is not None:
            past = (int(past_key_values.get_seq_length()) if hasattr(past_key_values, "get_seq_length")
                    else past_key_values[0][0].shape[2])
        if past > 0:
            input_ids = input_ids[:, past:]
        position_ids = None
        if attention_mask is not None:
            position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
            position_ids = position_ids[:, -input_ids.shape[1]:]
        return {"input_ids": input_ids, "past_key_values": past_key_values,
                "attention_mask": attention_mask, "position_ids": position_ids,
                "use_cache": use_cache}

    @torch.no_grad()
    def generate_tokens(self, input_ids, max_new_tokens=32, temperature=0.0, top_k=0,
                        eos_token_id="config", suppress_tokens="config", generator=None):
        """Continue input_ids ([B, n] or a list of ids) by up to max_new_tokens
        tokens with the KV cache, as `attnres generate` does: temperature 0 is
        greedy (the first maximum), else sampling from softmax(logits / T)
        over the top_k largest (0: all). Generation stops at eos_token_id
        (not included; a finished row is padded with it). Ids in
        suppress_tokens (by default generation_config.suppress_tokens: a
        vocabulary padded past the tokenizer's) are never produced. Returns
        [B, n + new] ids."""
        gc = self.generation_config
        if eos_token_id == "config":
            eos_token_id = getattr(gc, "eos_token_id", None)
        if suppress_tokens == "config":
            suppress_tokens = getattr(gc, "suppress_tokens", None)
        ids = torch.as_tensor(input_ids, dtype=torch.long, device=self.device)
        if ids.dim() == 1:
            ids = ids[None]
        cache = AttnResKVCache()
        logits = self(ids, past_key_values=cache, use_cache=True).logits[:, -1].float()
        done = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
        new = []
        for _ in range(max_new_tokens):
            if suppress_tokens:
                logits[:, list(suppress_tokens)] = float("-inf")
            if temperature <= 0:
                nxt = logits.argmax(dim=-1)
            else:
                z = logits / temperature
                if top_k and top_k < z.shape[-1]:
                    kth = torch.topk(z, top_k, dim=-1).values[:, -1:]
                    z = z.masked_fill(z < kth, float("-inf"))
                nxt = torch.multinomial(torch.softmax(z, dim=-1), 1, generator=generator)[:, 0]
            if eos_token_id is not None:
                done = done | (nxt == eos_token_id)
                if bool(done.all()):
                    break
                nxt = nxt.masked_fill(done, eos_token_id)
            new.append(nxt)
            logits = self(nxt[:, None], past_key_values=cache, use_cache=True).logits[:, -1].float()
        return torch.cat([ids] + [t[:, None] for t in new], dim=1)

    @torch.no_grad()
    def token_logprobs(self, input_ids):
        """log p(input_ids[:, t + 1] | input_ids[:, :t + 1]) for every t: [B, n - 1], float32."""
        ids = torch.as_tensor(input_ids, dtype=torch.long, device=self.device)
        if ids.dim() == 1:
            ids = ids[None]
        logits = self(ids, use_cache=False).logits.float()
        lp = torch.log_softmax(logits[:, :-1], dim=-1)
        return lp.gather(-1, ids[:, 1:, None])[..., 0]
