"""Model cards: architecture numbers for decoder-only transformers (dense and MoE).

Cards live as TOML files in transit_launch/planning/cards/; `load_model` also imports a Hugging
Face config.json (Llama, Qwen3, Qwen3-MoE, Llama4). Parameter counts are derived from
the architecture, never typed in, and tests compare them with the published totals.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources
from pathlib import Path

from transit_launch.errors import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib


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
    moe: MoE | None = None
    family: str = "llama"
    published_params: float | None = None
    source: str = ""
    notes: str = field(default="", compare=False)

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
        mlp = self.moe_mlp_params if self.is_moe_layer(i) else self.dense_mlp_params
        return self.attn_params + mlp + 2 * self.hidden  # + attention and MLP norms

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

def _card_from_dict(d: dict, origin: str) -> ModelCard:
    try:
        arch = dict(d["arch"])
        moe = d.get("moe")
        if moe is not None:
            moe = dict(moe)
            moe["dense_layers"] = tuple(moe.get("dense_layers", ()))
            moe = MoE(**moe)
        return ModelCard(name=d["name"], family=d.get("family", "llama"),
                         published_params=d.get("published_params"),
                         source=d.get("source", ""), notes=d.get("notes", ""),
                         moe=moe, **arch)
    except (KeyError, TypeError) as e:
        raise UsageError(f"{origin}: not a valid model card ({e})") from None


def catalog() -> dict[str, ModelCard]:
    cards = {}
    for entry in resources.files("transit_launch.planning.cards").iterdir():
        if entry.name.endswith(".toml"):
            card = _card_from_dict(tomllib.loads(entry.read_text()), entry.name)
            cards[card.name] = card
    return dict(sorted(cards.items()))


def load_model(spec: str) -> ModelCard:
    """A catalog name, a model-card .toml path or a Hugging Face config.json path."""
    path = Path(spec)
    if spec.endswith(".toml") or (path.suffix == "" and path.is_file()):
        return _card_from_dict(_read_toml(path), spec)
    if spec.endswith(".json") or path.is_dir():
        return from_hf_config(path / "config.json" if path.is_dir() else path)
    cards = catalog()
    if spec in cards:
        return cards[spec]
    raise UsageError(f"unknown model {spec!r}; known: {', '.join(cards)} "
                     "(or give a model card .toml or a Hugging Face config.json)")


def _read_toml(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text())
    except OSError as e:
        raise UsageError(f"cannot read model card {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"model card {path} is not valid TOML: {e}") from None


# --- Hugging Face config.json import ----------------------------------------------

_HF_ARCHS = {
    "LlamaForCausalLM": "llama", "Qwen3ForCausalLM": "qwen3", "Qwen3MoeForCausalLM": "qwen3_moe",
    "Llama4ForConditionalGeneration": "llama4", "Llama4ForCausalLM": "llama4",
}
_HF_TYPES = {"llama": "llama", "qwen3": "qwen3", "qwen3_moe": "qwen3_moe",
             "llama4": "llama4", "llama4_text": "llama4"}


def from_hf_config(path: Path) -> ModelCard:
    try:
        cfg = json.loads(Path(path).read_text())
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(cfg, dict):
        raise UsageError(f"{path}: expected a JSON object")
    kind = next((_HF_ARCHS[a] for a in cfg.get("architectures") or [] if a in _HF_ARCHS), None)
    kind = kind or _HF_TYPES.get(cfg.get("model_type", ""))
    if kind is None:
        raise UsageError(f"{path}: unsupported architecture {cfg.get('architectures') or cfg.get('model_type')!r}; "
                         "supported: Llama, Qwen3, Qwen3-MoE, Llama4")
    text = cfg.get("text_config", cfg) if kind == "llama4" else cfg
    name = Path(path).parent.name if Path(path).name == "config.json" else Path(path).stem
    try:
        h, heads = int(text["hidden_size"]), int(text["num_attention_heads"])
        common = dict(
            name=name or kind, family=kind, source=str(path),
            hidden=h, layers=int(text["num_hidden_layers"]), heads=heads,
            kv_heads=int(text.get("num_key_value_heads") or heads),
            head_dim=int(text.get("head_dim") or h // heads),
            vocab=int(text["vocab_size"]),
            tied_embeddings=bool(text.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False))),
        )
        if kind == "llama":
            return ModelCard(ffn=int(text["intermediate_size"]), **common)
        if kind == "qwen3":
            return ModelCard(ffn=int(text["intermediate_size"]), qk_norm=True, **common)
        if kind == "qwen3_moe":
            moe = MoE(experts=int(text["num_experts"]), top_k=int(text["num_experts_per_tok"]),
                      expert_ffn=int(text["moe_intermediate_size"]),
                      step=int(text.get("decoder_sparse_step") or 1),
                      dense_layers=tuple(text.get("mlp_only_layers") or ()))
            return ModelCard(ffn=int(text["intermediate_size"]), qk_norm=True, moe=moe, **common)
        # llama4: routed experts use intermediate_size, dense layers intermediate_size_mlp,
        # every MoE layer also has one shared expert of intermediate_size.
        step = int(text.get("interleave_moe_layer_step") or 1)
        layers = common["layers"]
        moe_layers = text.get("moe_layers")
        dense = (tuple(i for i in range(layers) if i not in set(moe_layers)) if moe_layers is not None
                 else ())
        moe = MoE(experts=int(text["num_local_experts"]), top_k=int(text.get("num_experts_per_tok", 1)),
                  expert_ffn=int(text["intermediate_size"]), shared_experts=1,
                  shared_ffn=int(text["intermediate_size"]), step=1 if moe_layers is not None else step,
                  dense_layers=dense)
        return ModelCard(ffn=int(text.get("intermediate_size_mlp") or text["intermediate_size"]),
                         moe=moe, **common)
    except KeyError as e:
        raise UsageError(f"{path}: {kind} config lacks {e.args[0]!r}") from None
    except (TypeError, ValueError) as e:
        raise UsageError(f"{path}: a {kind} config field is not a number ({e})") from None
