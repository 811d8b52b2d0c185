# Configuration of an attnres model exported by `attnres export hf`.
#
# The fields are Hugging Face LlamaConfig's names for the transformer, plus
# `attn_res`, the residual connections: {"mode": "baseline" | "full" |
# "block" | "denseformer", "block_size": S (sublayers per block; 1 for full), "n_blocks": N
# (when the training config gave N instead of S), and a residual variant's
# "query" ("static" | "input"), "weights" ("attention" | "scalars"), "score"
# ("softmax" | "sigmoid"), "key_norm", "heads" and "window" (absent: the
# defaults, static / attention / softmax / true / 1 / 0)}. A mixture-of-experts model
# adds DeepSeek-V3's fields: n_routed_experts (E), num_experts_per_tok (K),
# n_shared_experts, moe_intermediate_size (an expert's width),
# first_k_dense_replace (the leading dense layers), scoring_func ("sigmoid" |
# "softmax"), routed_scaling_factor, topk_method ("noaux_tc": the choice adds
# the router's e_score_correction_bias; "greedy": no bias), and attnres's
# moe_capacity_factor (0: dropless). A Kimi Linear hybrid (model_type
# "kimi_linear") adds Kimi Linear's fields: linear_attn_config {kda_layers,
# full_attn_layers (1-based), num_heads, head_dim, short_conv_kernel_size}
# for its KDA layers, kv_lora_rank / qk_nope_head_dim / qk_rope_head_dim /
# v_head_dim / mla_use_nope (q_lora_rank null) when its softmax layers are
# MLA, and Kimi's MoE names (num_experts, num_experts_per_token,
# num_shared_experts, moe_router_activation_func), read here as DeepSeek's.
# The exact function is in
# modeling_attnres.py and in the attnres repository's docs/model.md.
#
# Works with torch alone; when transformers is importable the class is a
# transformers PretrainedConfig, so AutoConfig / AutoModelForCausalLM load it
# with trust_remote_code=True. (transformers is imported through importlib so
# that its loader, which checks the packages a remote-code file imports,
# does not ask for it; this file imports nothing else.)
import importlib
import json
import math
import os

try:
    _PretrainedConfig = importlib.import_module("transformers").PretrainedConfig
except ImportError:
    _PretrainedConfig = None

RESIDUAL_MODES = ("baseline", "full", "block", "denseformer")
# DeepSeek-V3's mixture-of-experts fields and attnres's capacity, with the
# values of a dense model (no experts).
MOE_DEFAULTS = {"n_routed_experts": 0, "num_experts_per_tok": 0, "n_shared_experts": 0,
                "moe_intermediate_size": 0, "first_k_dense_replace": 0, "scoring_func": "sigmoid",
                "routed_scaling_factor": 1.0, "topk_method": "greedy", "moe_capacity_factor": 0.0}
# Kimi Linear's names for them (its config.json).
KIMI_MOE_NAMES = {"num_experts": "n_routed_experts", "num_experts_per_token": "num_experts_per_tok",
                  "num_shared_experts": "n_shared_experts",
                  "moe_router_activation_func": "scoring_func"}
# MLA's dims (Kimi Linear's and DeepSeek-V3's names), with the values of a
# model without MLA layers.
MLA_DEFAULTS = {"kv_lora_rank": 0, "qk_nope_head_dim": 0, "qk_rope_head_dim": 0, "v_head_dim": 0,
                "mla_use_nope": True, "q_lora_rank": None}


class _PlainConfig:
    """The part of transformers' PretrainedConfig this model uses, for torch alone."""

    def __init__(self, **kwargs):
        for key, value in kwargs.items():
            setattr(self, key, value)

    @classmethod
    def from_pretrained(cls, path, **overrides):
        with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
            fields = json.load(f)
        fields.update(overrides)
        return cls(**fields)

    @classmethod
    def from_dict(cls, fields, **overrides):
        return cls(**{**fields, **overrides})

    def to_dict(self):
        return dict(self.__dict__)

    def __repr__(self):
        return f"{type(self).__name__} {json.dumps(self.to_dict(), indent=2, sort_keys=True, default=str)}"


_Base = _PretrainedConfig if _PretrainedConfig is not None else _PlainConfig


class AttnResConfig(_Base):
    model_type = "attnres"

    def __init__(
        self,
        vocab_size=32000,
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=None,
        head_dim=None,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        attn_res=None,
        max_position_embeddings=1024,
        initializer_range=0.02,
        use_cache=True,
        tie_word_embeddings=False,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_attention_heads if num_key_value_heads is None else num_key_value_heads
        self.head_dim = hidden_size // num_attention_heads if head_dim is None else head_dim
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        self.attn_res = dict(attn_res) if attn_res is not None else {"mode": "baseline"}
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.use_cache = use_cache
        for kimi, ours in KIMI_MOE_NAMES.items():
            if kimi in kwargs:
                kwargs[ours] = kwargs.pop(kimi)
        for key, default in MOE_DEFAULTS.items():
            setattr(self, key, kwargs.pop(key, default))
        self.linear_attn_config = kwargs.pop("linear_attn_config", None)
        for key, default in MLA_DEFAULTS.items():
            setattr(self, key, kwargs.pop(key, default))
        self._check()
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)

    def _check(self):
        if self.q_lora_rank is not None:
            raise ValueError(f"q_lora_rank {self.q_lora_rank}: attnres's MLA has a full-rank q_proj "
                             "(q_lora_rank null)")
        lac = self.linear_attn_config
        if lac is not None:
            for key in ("kda_layers", "num_heads", "head_dim", "short_conv_kernel_size"):
                if key not in lac:
                    raise ValueError(f"linear_attn_config lacks {key!r}")
            if any(not 1 <= l <= self.num_hidden_layers for l in lac["kda_layers"]):
                raise ValueError(f"linear_attn_config.kda_layers {lac['kda_layers']}: 1-based "
                                 f"layers of {self.num_hidden_layers}")
        if not any(self.attention_kind(l) == "gqa" for l in range(self.num_hidden_layers)):
            return self._check_moe_and_residual()  # no GQA layer: its head shape is unused
        if self.hidden_size != self.head_dim * self.num_attention_heads:
            raise ValueError(f"hidden_size {self.hidden_size} != head_dim {self.head_dim} x "
                             f"num_attention_heads {self.num_attention_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even (RoPE)")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_key_value_heads {self.num_key_value_heads} must divide "
                             f"num_attention_heads {self.num_attention_heads}")
        self._check_moe_and_residual()

    def _check_moe_and_residual(self):
        mode = self.attn_res.get("mode")
        if mode not in RESIDUAL_MODES:
            raise ValueError(f"attn_res.mode must be one of {RESIDUAL_MODES}, got {mode!r}")
        if mode == "block" and self.residual_block_size() < 1:
            raise ValueError("attn_res.mode 'block' needs attn_res.block_size or n_blocks >= 1")
        if self.n_routed_experts:
            if not 1 <= self.num_experts_per_tok <= self.n_routed_experts:
                raise ValueError(f"num_experts_per_tok {self.num_experts_per_tok} must be in "
                                 f"[1, n_routed_experts = {self.n_routed_experts}]")
            for key, known in (("scoring_func", ("sigmoid", "softmax")),
                               ("topk_method", ("noaux_tc", "greedy"))):
                if getattr(self, key) not in known:
                    raise ValueError(f"{key} must be one of {known}, got {getattr(self, key)!r}")

    def attention_kind(self, layer_idx):
        """Layer layer_idx's token mixer: "kda" (linear_attn_config.kda_layers,
        1-based), "mla" (the other layers when kv_lora_rank > 0) or "gqa"."""
        lac = self.linear_attn_config
        if lac is not None and layer_idx + 1 in lac["kda_layers"]:
            return "kda"
        return "mla" if self.kv_lora_rank else "gqa"

    def kimi_names(self):
        """Whether MoE tensors carry Kimi Linear's names (block_sparse_moe.*, w1 / w2 / w3)."""
        return self.linear_attn_config is not None or bool(self.kv_lora_rank)

    def moe_layer(self, layer_idx):
        """Whether layer layer_idx's MLP is a mixture of experts."""
        return self.n_routed_experts > 0 and layer_idx >= self.first_k_dense_replace

    def residual_mode(self):
        return self.attn_res["mode"]

    def residual_variant(self):
        """The depth Mix's variant: attn_res's query, weights, score, key_norm,
        heads and window, the absent ones at their defaults."""
        v = {"query": "static", "weights": "attention", "score": "softmax", "key_norm": True,
             "heads": 1, "window": 0}
        v.update({k: self.attn_res[k] for k in v if k in self.attn_res})
        return v

    def mix_sources(self, s):
        """The sources the depth Mix before sublayer s reads (s = 2L: the final
        Mix): the embedding, the completed blocks, the partial sum; with a
        window W the embedding and the W most recent outputs."""
        window = self.residual_variant()["window"]
        if window > 0:
            return 1 + min(s, window)
        S = self.residual_block_size()
        return 1 + s // S + (1 if s % S else 0)

    def residual_block_size(self):
        """S, the sublayers per block: 1 for full, block_size or ceil(2L / n_blocks) for block."""
        mode = self.attn_res["mode"]
        if mode == "full":
            return 1
        if mode != "block":
            return 0
        if self.attn_res.get("block_size"):
            return int(self.attn_res["block_size"])
        n = int(self.attn_res.get("n_blocks") or 0)
        return math.ceil(2 * self.num_hidden_layers / n) if n > 0 else 0
