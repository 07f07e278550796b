"""Model cards: architecture numbers for decoder-only transformers (dense and MoE).

Cards live as TOML files in transit_launch/planning/cards/; `load_model` also imports a Hugging
Face config.json (Llama, Mistral, Qwen2, Qwen3, Qwen3-MoE, Llama4). Parameter counts are derived from
the architecture, never typed in, and tests compare them with the published totals.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field, fields
from functools import cached_property
from importlib import resources
from pathlib import Path

from transit_launch.checks import integer, real
from transit_launch.errors import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib


# Upper bounds far beyond any published model (Llama3-405B: hidden 16384, 126 layers, 128
# heads; DeepSeek-V3: 256 experts; Gemma: vocabulary 256000). A value past them is a typo,
# and the planner's per-layer sums would run for minutes on it (1024 layers: about 2 s for
# a plan that tries every node count).
LIMITS = {"hidden": 2**20, "layers": 2**10, "heads": 2**14, "kv_heads": 2**14, "head_dim": 2**16,
          "ffn": 2**22, "vocab": 2**24, "experts": 2**16, "top_k": 2**16, "expert_ffn": 2**22,
          "shared_experts": 2**10, "shared_ffn": 2**22, "step": 2**14}


# Families the planner's parameter and memory formulas describe (Llama-shaped: SwiGLU MLPs,
# grouped-query attention, RMSNorm); mistral and qwen2 are Llama's shape under other names.
FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "llama4")
# How far a card's published_params may be from the count its [arch] gives (the catalog's
# are within 0.2%; a typed dimension or a count in billions is off by far more).
PUBLISHED_SLACK = 1.1


def check_count(value, what: str, limit_of: str | None = None, minimum: int = 1) -> int:
    """An architecture number: an integer (not a bool, float or string) in
    [minimum, LIMITS[limit_of or what]]. `what` names it as the user wrote it."""
    top = LIMITS[limit_of or what]
    if not integer(value) or not minimum <= value <= top:
        raise UsageError(f"{what} must be an integer from {minimum} to {top}, got {value!r}")
    return value


@dataclass(frozen=True)
class MoE:
    experts: int
    top_k: int
    expert_ffn: int
    shared_experts: int = 0
    shared_ffn: int = 0
    # Layer i is an MoE layer when (i + 1) % step == 0 and i is not in dense_layers.
    step: int = 1
    dense_layers: tuple[int, ...] = ()

    def __post_init__(self):
        for name in ("experts", "top_k", "expert_ffn", "step"):
            check_count(getattr(self, name), name)
        check_count(self.shared_experts, "shared_experts", minimum=0)
        check_count(self.shared_ffn, "shared_ffn", minimum=1 if self.shared_experts else 0)
        if self.top_k > self.experts:
            raise UsageError(f"top_k={self.top_k} exceeds the {self.experts} experts")
        if not isinstance(self.dense_layers, tuple) or not all(
                integer(i) and i >= 0 for i in self.dense_layers):
            raise UsageError(f"dense_layers must be a list of layer indices, got {self.dense_layers!r}")


@dataclass(frozen=True)
class ModelCard:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int  # intermediate size of dense (non-MoE) MLP layers
    vocab: int
    tied_embeddings: bool = False
    qk_norm: bool = False  # learned per-head-dim q/k RMSNorm weights (Qwen3)
    qkv_bias: bool = False  # biases on the q, k and v projections (Qwen2)
    moe: MoE | None = None
    family: str = "llama"
    published_params: float | None = None
    source: str = ""
    notes: str = field(default="", compare=False)

    def __post_init__(self):  # the same checks for cards, config.json imports and Python callers
        if not isinstance(self.name, str) or not self.name.strip():
            raise UsageError(f"name must be a non-empty string, got {self.name!r}")
        for name in ("family", "source", "notes"):
            if not isinstance(getattr(self, name), str):
                raise UsageError(f"{name} must be a string, got {getattr(self, name)!r}")
        for name in ("hidden", "layers", "heads", "kv_heads", "head_dim", "ffn", "vocab"):
            check_count(getattr(self, name), name)
        for name in ("tied_embeddings", "qk_norm", "qkv_bias"):
            if not isinstance(getattr(self, name), bool):
                raise UsageError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.heads % self.kv_heads:  # grouped-query attention shares each k/v head by a group
            raise UsageError(f"kv_heads={self.kv_heads} does not divide heads={self.heads}")
        if self.moe is not None:
            if not isinstance(self.moe, MoE):
                raise UsageError(f"moe must be an MoE, got {self.moe!r}")
            if any(i >= self.layers for i in self.moe.dense_layers):
                raise UsageError(f"dense_layers {list(self.moe.dense_layers)} name layers beyond the {self.layers}")
            if not self.moe_layer_count:
                raise UsageError(f"the moe table makes no layer an MoE layer (step={self.moe.step}, "
                                 f"{self.layers} layers)")
        if self.family not in FAMILIES:
            raise UsageError(f"family {self.family!r} is not one the planner can cost; it models decoder-only "
                             f"transformers shaped like Llama: {', '.join(FAMILIES)}")
        p = self.published_params
        if p is not None and (not real(p) or p <= 0):
            raise UsageError(f"published_params must be a positive number, got {p!r}")

    # --- structure -----------------------------------------------------------
    def is_moe_layer(self, i: int) -> bool:
        m = self.moe
        return m is not None and (i + 1) % m.step == 0 and i not in m.dense_layers

    @cached_property
    def moe_layer_count(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.layers))

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    # --- parameter counts (elements) -------------------------------------------
    @property
    def attn_params(self) -> int:
        h = self.hidden
        p = 2 * h * self.q_dim + 2 * h * self.kv_dim  # wq, wo, wk, wv
        if self.qk_norm:
            p += 2 * self.head_dim
        if self.qkv_bias:
            p += self.q_dim + 2 * self.kv_dim
        return p

    @property
    def dense_mlp_params(self) -> int:
        return 3 * self.hidden * self.ffn  # SwiGLU: w1 (gate), w3 (up), w2 (down)

    @property
    def expert_params(self) -> int:
        """One routed expert (SwiGLU)."""
        return 3 * self.hidden * self.moe.expert_ffn if self.moe else 0

    @property
    def moe_mlp_params(self) -> int:
        m = self.moe
        return (m.experts * self.expert_params + self.hidden * m.experts
                + m.shared_experts * 3 * self.hidden * m.shared_ffn)

    def layer_params(self, i: int) -> int:
        return self._layer_params[i]

    @cached_property
    def _layer_params(self) -> tuple[int, ...]:
        """Per layer, computed once: the planner sums them for every node count it tries."""
        attn, dense = self.attn_params, self.dense_mlp_params
        moe = self.moe_mlp_params if self.moe else 0
        return tuple(attn + (moe if self.is_moe_layer(i) else dense) + 2 * self.hidden  # + attention and MLP norms
                     for i in range(self.layers))

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def output_params(self) -> int:
        """Final norm plus the output projection (absent when tied)."""
        return self.hidden + (0 if self.tied_embeddings else self.vocab * self.hidden)

    @cached_property
    def params(self) -> int:
        return (self.embedding_params + self.output_params
                + sum(self.layer_params(i) for i in range(self.layers)))

    @cached_property
    def routed_expert_params(self) -> int:
        """All routed-expert weights (the part expert parallelism shards)."""
        return self.moe_layer_count * self.moe.experts * self.expert_params if self.moe else 0

    @cached_property
    def active_params(self) -> int:
        """Parameters one token touches: routed experts count top_k times, not experts times."""
        if not self.moe:
            return self.params
        idle = self.moe.experts - self.moe.top_k
        return self.params - self.moe_layer_count * idle * self.expert_params

    def flops_per_token(self) -> int:
        """Model FLOPs per trained token, 6 x active non-embedding parameters (the
        per-GPU TFLOPS convention of the paper and TorchTitan, without attention)."""
        return 6 * (self.active_params - self.embedding_params)

    def titan_flops_per_token(self, seq_len: int) -> int:
        """TorchTitan's own count (get_nparams_and_flops, the per-GPU TFLOPS it logs):
        flops_per_token plus attention's 12 x layers x heads x head_dim x sequence length."""
        return self.flops_per_token() + 12 * self.layers * self.heads * self.head_dim * seq_len

    def summary(self) -> dict:
        d = {"name": self.name, "params": self.params, "active_params": self.active_params,
             "hidden": self.hidden, "layers": self.layers, "heads": self.heads,
             "kv_heads": self.kv_heads, "head_dim": self.head_dim, "ffn": self.ffn,
             "vocab": self.vocab, "tied_embeddings": self.tied_embeddings}
        if self.moe:
            d["moe"] = {"experts": self.moe.experts, "top_k": self.moe.top_k,
                        "expert_ffn": self.moe.expert_ffn, "shared_experts": self.moe.shared_experts,
                        "moe_layers": self.moe_layer_count}
        return d


# --- catalog ---------------------------------------------------------------------

_CARD_KEYS = ("name", "family", "published_params", "source", "notes", "arch", "moe")
_ARCH_KEYS = tuple(f.name for f in fields(ModelCard) if f.name not in _CARD_KEYS)
_MOE_KEYS = tuple(f.name for f in fields(MoE))


def _table(d: dict, key: str, known: tuple[str, ...], where: str) -> dict | None:
    """d[key] as a table whose keys are all known, or None when absent."""
    t = d.get(key)
    if t is None:
        return None
    if not isinstance(t, dict):
        raise UsageError(f"{where} must be a table, got {t!r}")
    unknown = sorted(set(t) - set(known))
    if unknown:
        raise UsageError(f"unknown key {unknown[0]!r} in {where} (known: {', '.join(known)})")
    return dict(t)


def _card_from_dict(d: dict, origin: str) -> ModelCard:
    try:
        _table({"card": d}, "card", _CARD_KEYS, "the card")
        arch = _table(d, "arch", _ARCH_KEYS, "[arch]")
        if "name" not in d:
            raise UsageError("lacks 'name'")
        if arch is None:
            raise UsageError("lacks the [arch] table")
        missing = [k for k in ("hidden", "layers", "heads", "kv_heads", "head_dim", "ffn", "vocab") if k not in arch]
        if missing:
            raise UsageError(f"[arch] lacks {', '.join(map(repr, missing))}")
        moe = _table(d, "moe", _MOE_KEYS, "[moe]")
        if moe is not None:
            if isinstance(moe.get("dense_layers"), list):
                moe["dense_layers"] = tuple(moe["dense_layers"])
            moe = MoE(**moe)
        card = ModelCard(name=d["name"], family=d.get("family", "llama"), published_params=d.get("published_params"),
                         source=d.get("source", ""), notes=d.get("notes", ""), moe=moe, **arch)
        # checked on the file only: a card derived with replace(card, layers=...) keeps the count
        p = card.published_params
        if p is not None and not 1 / PUBLISHED_SLACK <= card.params / p <= PUBLISHED_SLACK:
            raise UsageError(f"published_params {p:.4g} and the [arch] numbers ({card.params:,} parameters, "
                             f"{card.params / p:.2g}x) disagree: a dimension or the count is wrong")
        return card
    except UsageError as e:
        raise UsageError(f"{origin}: not a valid model card: {e}") from None


def catalog() -> dict[str, ModelCard]:
    cards = {}
    for entry in resources.files("transit_launch.planning.cards").iterdir():
        if entry.name.endswith(".toml"):
            card = _card_from_dict(tomllib.loads(entry.read_text()), entry.name)
            cards[card.name] = card
    return dict(sorted(cards.items()))


def load_model(spec: str) -> ModelCard:
    """A catalog name, a model-card .toml path or a Hugging Face config.json path. A catalog
    name is the catalog's card, whatever the working directory holds under that name (a
    shared directory's planted `llama3-8b` file must not stand in for it)."""
    if not isinstance(spec, str) or not spec.strip():  # Path('') is '.', which would read ./config.json
        raise UsageError(f"--model needs a catalog name or a file, got {spec!r}")
    cards = catalog()
    if spec in cards:
        return cards[spec]
    path = Path(spec)
    # os.path's tests, not Path's: these raise on a directory the user cannot search
    if spec.endswith(".toml") or (path.suffix == "" and os.path.isfile(path)):
        return _card_from_dict(_read_toml(path), spec)
    if spec.endswith(".json") or os.path.isdir(path):
        return from_hf_config(path / "config.json" if os.path.isdir(path) else path)
    if os.sep in spec:  # a path, not a catalog name: why it cannot be read
        try:
            os.stat(path)
        except OSError as e:
            raise UsageError(f"cannot read {spec}: {e.strerror}") from None
    import difflib
    near = difflib.get_close_matches(spec.lower().replace("_", "-"), cards, n=1, cutoff=0.8)
    hint = f"did you mean {near[0]!r}? " if near else ""
    raise UsageError(f"unknown model {spec!r}; {hint}known: {', '.join(cards)} "
                     "(or give a model card .toml or a Hugging Face config.json)")


def _read_text(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as e:
        raise UsageError(f"cannot read {what}{path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{what}{path} is not UTF-8 text") from None


def _read_toml(path: Path) -> dict:
    try:
        return tomllib.loads(_read_text(path, "model card "))
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"model card {path} is not valid TOML: {e}") from None


# --- Hugging Face config.json import ----------------------------------------------

_HF_ARCHS = {
    "LlamaForCausalLM": "llama", "Qwen3ForCausalLM": "qwen3", "Qwen3MoeForCausalLM": "qwen3_moe",
    "Llama4ForConditionalGeneration": "llama4", "Llama4ForCausalLM": "llama4",
    "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2",
}
_HF_TYPES = {"llama": "llama", "qwen3": "qwen3", "qwen3_moe": "qwen3_moe",
             "llama4": "llama4", "llama4_text": "llama4", "mistral": "mistral", "qwen2": "qwen2"}
# Llama's shape under another name: planned as Llama when no key says otherwise (experts)
_LLAMA_SHAPED = ("llama", "mistral", "qwen2")
_NOT_LLAMA_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size")


def _hf_count(d: dict, key: str, card_field: str, default=None) -> int:
    """An architecture number of a config.json, checked by the card's rule under its HF name."""
    v = d.get(key)
    if v is None:
        if default is None:
            raise UsageError(f"lacks {key!r}")
        return default
    return check_count(v, key, card_field)


def _hf_bool(d: dict, key: str, default: bool) -> bool:
    v = d.get(key, default)
    if not isinstance(v, bool):
        raise UsageError(f"{key} must be true or false, got {v!r}")
    return v


def _hf_layers(d: dict, key: str) -> tuple[int, ...] | None:
    v = d.get(key)
    if v is None:
        return None
    if not isinstance(v, list) or not all(integer(i) for i in v):
        raise UsageError(f"{key} must be a list of layer indices, got {v!r}")
    return tuple(v)


def _hf_kind(cfg: dict) -> str | None:
    archs = cfg.get("architectures") or []
    archs = [archs] if isinstance(archs, str) else archs
    if not isinstance(archs, list):
        raise UsageError(f"architectures must be a list of names, got {archs!r}")
    kind = next((_HF_ARCHS[a] for a in archs if isinstance(a, str) and a in _HF_ARCHS), None)
    mtype = cfg.get("model_type")
    return kind or (_HF_TYPES.get(mtype) if isinstance(mtype, str) else None)


def from_hf_config(path: Path) -> ModelCard:
    path = Path(path)
    try:
        cfg = json.loads(_read_text(path, ""))
    except json.JSONDecodeError as e:
        raise UsageError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(cfg, dict):
        raise UsageError(f"{path}: expected a JSON object")
    name = path.parent.name if path.name == "config.json" else path.stem
    try:
        return _hf_card(cfg, name, str(path))
    except UsageError as e:
        raise UsageError(f"{path}: {e}") from None


def _hf_card(cfg: dict, name: str, source: str) -> ModelCard:
    kind = _hf_kind(cfg)
    if kind is None:
        raise UsageError(f"unsupported architecture {cfg.get('architectures') or cfg.get('model_type')!r}; "
                         "supported: Llama, Mistral, Qwen2, Qwen3, Qwen3-MoE, Llama4")
    moe_keys = [k for k in _NOT_LLAMA_KEYS if cfg.get(k)] if kind in _LLAMA_SHAPED else []
    if moe_keys:
        raise UsageError(f"a {kind} config with {moe_keys[0]!r} is not Llama-shaped (experts); supported: "
                         "Llama, Mistral, Qwen2, Qwen3, Qwen3-MoE, Llama4")
    text = cfg.get("text_config", cfg) if kind == "llama4" else cfg
    if not isinstance(text, dict):
        raise UsageError(f"text_config must be an object, got {text!r}")
    h, heads = _hf_count(text, "hidden_size", "hidden"), _hf_count(text, "num_attention_heads", "heads")
    common = dict(
        name=name or kind, family=kind, source=source,
        hidden=h, layers=_hf_count(text, "num_hidden_layers", "layers"), heads=heads,
        kv_heads=_hf_count(text, "num_key_value_heads", "kv_heads", default=heads),
        head_dim=_hf_count(text, "head_dim", "head_dim", default=max(1, h // heads)),
        vocab=_hf_count(text, "vocab_size", "vocab"),
        tied_embeddings=_hf_bool(text, "tie_word_embeddings", _hf_bool(cfg, "tie_word_embeddings", False)),
    )
    ffn = _hf_count(text, "intermediate_size", "ffn")
    if kind in _LLAMA_SHAPED:
        return ModelCard(ffn=ffn, qkv_bias=kind == "qwen2", **common)
    if kind == "qwen3":
        return ModelCard(ffn=ffn, qk_norm=True, **common)
    if kind == "qwen3_moe":
        moe = MoE(experts=_hf_count(text, "num_experts", "experts"),
                  top_k=_hf_count(text, "num_experts_per_tok", "top_k"),
                  expert_ffn=_hf_count(text, "moe_intermediate_size", "expert_ffn"),
                  step=_hf_count(text, "decoder_sparse_step", "step", default=1),
                  dense_layers=_hf_layers(text, "mlp_only_layers") or ())
        return ModelCard(ffn=ffn, qk_norm=True, moe=moe, **common)
    # llama4: routed experts use intermediate_size, dense layers intermediate_size_mlp,
    # every MoE layer also has one shared expert of intermediate_size.
    layers = common["layers"]
    moe_layers = _hf_layers(text, "moe_layers")
    dense = tuple(i for i in range(layers) if i not in set(moe_layers)) if moe_layers is not None else ()
    moe = MoE(experts=_hf_count(text, "num_local_experts", "experts"),
              top_k=_hf_count(text, "num_experts_per_tok", "top_k", default=1),
              expert_ffn=ffn, shared_experts=1, shared_ffn=ffn,
              step=1 if moe_layers is not None else _hf_count(text, "interleave_moe_layer_step", "step", default=1),
              dense_layers=dense)
    return ModelCard(ffn=_hf_count(text, "intermediate_size_mlp", "ffn", default=ffn), moe=moe, **common)
