"""A TorchTitan job config as the planner's request, and the plan's layout as TorchTitan's
own command-line overrides (`plan/render/submit --torchtitan job.toml`).

The config is read by TorchTitan itself (0.2.2: ConfigManager().parse_args, the TOML under
its JobConfig dataclasses), and the model card comes from TorchTitan's model: the flavor's
args from its train_spec registry, the model built on the meta device, every dimension read
off its parameters. The card's parameter count must equal the model's, so an architecture
the card cannot describe is refused instead of planned wrongly.

Imports TorchTitan (and so torch) only when a config is loaded.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import io
import logging
import os
import sys
import warnings
from dataclasses import dataclass

from transit_launch.checks import integer
from transit_launch.errors import UsageError

VERSION = "0.2.2"  # the release whose config names this module reads (and bench/ measured)
MISSING = f"--torchtitan needs TorchTitan installed: pip install torchtitan=={VERSION}"
DEFAULT_COMMAND = ("python", "-m", "torchtitan.train")
# TorchTitan model name -> the card's family (what planning/titan_model.py builds)
FAMILIES = {"llama3": "llama", "qwen3": "qwen3", "llama4": "llama4"}
# TorchTitan's spellings of the precisions the planner knows (training.dtype, mixed_precision_param)
PRECISION_ARGS = {"mixed": {"training.dtype": "float32", "training.mixed_precision_param": "bfloat16"},
                  "bf16": {"training.dtype": "bfloat16"},
                  "fp32": {"training.dtype": "float32", "training.mixed_precision_param": "float32"}}
# TorchTitan's activation_checkpoint.mode values (its ActivationCheckpoint dataclass)
AC_MODES = ("selective", "full", "memory_budget", "none")
# What a rendered command may not set itself: the plan read these from the config (or
# refused them), and the overrides it appends say what it planned.
PLANNED = ("job.config_file", "model.name", "model.flavor", "training.seq_len", "training.local_batch_size",
           "training.global_batch_size", "training.dtype", "training.mixed_precision_param",
           "training.enable_cpu_offload", "activation_checkpoint.mode", "parallelism.data_parallel_shard_degree",
           "parallelism.data_parallel_replicate_degree", "parallelism.tensor_parallel_degree",
           "parallelism.pipeline_parallel_degree", "parallelism.pipeline_parallel_microbatch_size",
           "parallelism.context_parallel_degree", "parallelism.expert_parallel_degree",
           "parallelism.expert_tensor_parallel_degree")


@dataclass(frozen=True)
class TitanJob:
    """What a TorchTitan config asks for, in the planner's terms. Degrees of 1 are None:
    TorchTitan's default, which a --parallel preset may still choose."""
    path: str                # absolute: the job reads it on the compute nodes
    model: str
    flavor: str
    card: object             # planning.models.ModelCard (imported when a config is loaded)
    seq_len: int
    local_batch: int
    global_batch: int | None  # None: TorchTitan's -1 (local batch x data-parallel degree)
    tp: int | None
    pp: int | None
    ep: int | None
    precision: str
    recompute: str
    notes: tuple[str, ...] = ()  # what the plan assumes differently from the config, one line each
    ac_mode: str = "full"        # the config's activation_checkpoint.mode
    keep_ac: bool = False        # the job keeps the config's mode (selective: the plan assumes none)


def load(path: str) -> TitanJob:
    """The TitanJob of a TorchTitan TOML file, parsed by TorchTitan's own ConfigManager."""
    if not path:
        raise UsageError("--torchtitan needs a TorchTitan job config (a .toml file)")
    if os.path.isdir(path):
        raise UsageError(f"--torchtitan {path} is a directory; give the job's .toml file")
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))  # a FIFO must not block
    except OSError as e:
        raise UsageError(f"--torchtitan {path}: no such file" if e.errno == errno.ENOENT else
                         f"--torchtitan {path}: cannot read it ({e.strerror})") from None
    if not os.path.isfile(path):
        raise UsageError(f"--torchtitan {path} is not a regular file; give the job's .toml file")
    config_manager, get_train_spec, version = _import()
    with _quiet():
        try:
            cfg = config_manager().parse_args(["--job.config_file", path])
        except SystemExit:  # tyro's own error box, already swallowed by _quiet
            raise UsageError(f"--torchtitan {path}: TorchTitan's parser refused it") from None
        except Exception as e:  # noqa: BLE001 - TorchTitan raises plain ValueError/Exception/TOMLDecodeError
            raise UsageError(f"--torchtitan {path}: TorchTitan refused it: {_first_line(e)}") from None
    notes = [] if version == VERSION else [
        f"TorchTitan {version} is installed; --torchtitan reads {VERSION}'s config names"]
    layout = _layout(cfg, notes)  # checked first: the model's args read the sequence length too
    card = titan_card(cfg.model.name, cfg.model.flavor, cfg, get_train_spec, source=path)
    return TitanJob(path=os.path.abspath(path), model=cfg.model.name, flavor=cfg.model.flavor, card=card,
                    **layout, notes=tuple(notes))


def _import():
    """TorchTitan's ConfigManager and train-spec registry, and its version; one line when absent."""
    try:
        with _quiet():
            from torchtitan.config import ConfigManager
            from torchtitan.protocols.train_spec import get_train_spec
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] == "torchtitan":
            raise UsageError(MISSING) from None
        raise UsageError(f"--torchtitan: TorchTitan is installed but does not import: {e} "
                         f"(pip install torchtitan=={VERSION} installs its dependencies)") from None
    except ImportError as e:
        raise UsageError(f"--torchtitan: TorchTitan does not import: {_first_line(e)}") from None
    from importlib.metadata import PackageNotFoundError, version
    try:
        v = version("torchtitan")
    except PackageNotFoundError:  # a source checkout on PYTHONPATH
        v = "(source)"
    return ConfigManager, get_train_spec, v


@contextlib.contextmanager
def _quiet():
    """TorchTitan logs to the root logger (its warnings about a tokenizer path that exists
    only on the compute nodes would land on stderr through logging's last resort), tyro
    warns and prints its own errors: none of it is the plan's output."""
    logging.disable(logging.CRITICAL)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(logging.NOTSET)


def _first_line(e: BaseException) -> str:
    text = " ".join(str(a) for a in e.args) if e.args else type(e).__name__
    return text.strip().splitlines()[0] if text.strip() else type(e).__name__


def _count(value, key: str, minimum: int = 1) -> int:
    if not integer(value) or value < minimum:
        raise UsageError(f"--torchtitan: {key} must be an integer of at least {minimum}, got {value!r}")
    return value


def _layout(cfg, notes: list[str]) -> dict:
    """The request's fields from the parsed JobConfig; what the planner does not model is
    refused (one line naming the key) or, where an upper bound exists, planned as it and noted."""
    t, par, ac = cfg.training, cfg.parallelism, cfg.activation_checkpoint
    for key, value in (("parallelism.data_parallel_replicate_degree", par.data_parallel_replicate_degree),
                       ("parallelism.context_parallel_degree", par.context_parallel_degree),
                       ("parallelism.expert_tensor_parallel_degree", par.expert_tensor_parallel_degree),
                       ("parallelism.pipeline_parallel_microbatch_size", par.pipeline_parallel_microbatch_size)):
        if _count(value, key) != 1:
            raise UsageError(f"--torchtitan: {key} = {value}: the planner models FSDP, TP, PP (one sequence per "
                             "microbatch) and EP only; set it to 1")
    if t.enable_cpu_offload:
        raise UsageError("--torchtitan: training.enable_cpu_offload = true is FSDP's own CPU offload; transit-launch "
                         "plans the offloading itself: set it to false")
    shard = par.data_parallel_shard_degree
    if not integer(shard) or (shard != -1 and shard < 1):
        raise UsageError(f"--torchtitan: parallelism.data_parallel_shard_degree must be -1 or positive, got {shard!r}")
    if shard != -1:
        notes.append(f"parallelism.data_parallel_shard_degree = {shard} in the config: the plan chooses the "
                     "data-parallel degree with the node count, and the rendered job passes it")
    gbatch = t.global_batch_size
    if not integer(gbatch) or (gbatch != -1 and gbatch < 1):
        raise UsageError(f"--torchtitan: training.global_batch_size must be -1 or positive, got {gbatch!r}")
    if t.dtype == "bfloat16":
        precision = "bf16"
    else:
        precision = "fp32" if t.mixed_precision_param == "float32" else "mixed"
    _check_ac(cfg)
    if ac.mode in ("full", "none"):
        recompute = ac.mode
    else:  # selective (per layer or per op) and memory_budget keep part of what none keeps
        what = f"{ac.mode} ({ac.selective_ac_option})" if ac.mode == "selective" else ac.mode
        recompute = "none"
        notes.append(f"activation_checkpoint.mode {what} is planned as none (every saved tensor kept: at least "
                     f"what it keeps) and the job keeps {ac.mode}; --recompute full or none plans and runs that")
    degrees = {k: _count(v, f"parallelism.{n}") for k, n, v in (
        ("tp", "tensor_parallel_degree", par.tensor_parallel_degree),
        ("pp", "pipeline_parallel_degree", par.pipeline_parallel_degree),
        ("ep", "expert_parallel_degree", par.expert_parallel_degree))}
    return dict(seq_len=_count(t.seq_len, "training.seq_len"),
                local_batch=_count(t.local_batch_size, "training.local_batch_size"),
                global_batch=None if gbatch == -1 else gbatch, precision=precision, recompute=recompute,
                ac_mode=ac.mode,
                **{k: (v if v > 1 else None) for k, v in degrees.items()})


def _check_ac(cfg) -> None:
    """What TorchTitan's apply_ac would refuse on the nodes, after the queue: refused here."""
    ac = cfg.activation_checkpoint
    if ac.mode not in AC_MODES:
        raise UsageError(f"--torchtitan: activation_checkpoint.mode {ac.mode!r} is not one of TorchTitan's: "
                         f"{', '.join(AC_MODES)}")
    opt = str(ac.selective_ac_option)
    if ac.mode == "selective" and not (opt == "op" or (opt.isdigit() and int(opt) > 0)):
        raise UsageError(f"--torchtitan: activation_checkpoint.selective_ac_option {opt!r}: TorchTitan takes 'op' "
                         "or a positive whole number (every Nth layer)")
    if ac.mode == "memory_budget" and not (cfg.compile.enable and "model" in cfg.compile.components):
        raise UsageError("--torchtitan: activation_checkpoint.mode memory_budget needs the model compiled "
                         "(compile.enable = true, \"model\" in compile.components), as TorchTitan requires")


def titan_card(name: str, flavor: str, cfg, get_train_spec, source: str = ""):
    """The ModelCard of TorchTitan's model `name` at `flavor`: its registry's args, updated
    from the config as the Trainer does, the model built on the meta device (no memory), and
    every dimension read off its parameters."""
    import torch
    if name not in FAMILIES:
        raise UsageError(f"--torchtitan: model.name {name!r}: the planner models TorchTitan's "
                         f"{', '.join(FAMILIES)} (decoder-only, grouped-query attention)")
    with _quiet():
        spec = get_train_spec(name)
        if flavor not in spec.model_args:
            raise UsageError(f"--torchtitan: model.flavor {flavor!r} is not one of TorchTitan's {name} flavors: "
                             f"{', '.join(spec.model_args)}")
        args = copy.deepcopy(spec.model_args[flavor])  # the registry's object is shared
        try:
            if cfg is not None:
                args.update_from_config(cfg)
            with torch.device("meta"):
                model = spec.model_cls(args)
        except Exception as e:  # noqa: BLE001 - whatever TorchTitan's model code raises for this config
            raise UsageError(f"--torchtitan: TorchTitan cannot build {name} {flavor} for this config: "
                             f"{_first_line(e)}") from None
    attn = getattr(args, "attn_type", "sdpa")
    if attn != "sdpa":
        raise UsageError(f"--torchtitan: {name} {flavor} uses attn_type {attn!r}; the planner models SDPA "
                         f"attention (flavor {flavor.split('_')[0]!r})")
    card = card_from_parameters(f"{name}-{flavor}", FAMILIES[name], args, dict(model.named_parameters()),
                                source=f"TorchTitan {name} {flavor}" + (f" ({source})" if source else ""))
    total = sum(p.numel() for p in model.parameters())
    if card.params != total:
        raise UsageError(f"--torchtitan: TorchTitan's {name} {flavor} has {total:,} parameters, the card made from "
                         f"it {card.params:,}: an architecture the planner does not describe")
    return card


def card_from_parameters(card_name: str, family: str, args, shapes: dict, source: str = ""):
    """The ModelCard of a model's named parameters (each with .shape; a tied output weight is
    absent, named_parameters removes duplicates) and the head counts of its args."""
    from transit_launch.planning.models import MoE, ModelCard
    shape = {k: tuple(v.shape) for k, v in shapes.items()}
    vocab, hidden = shape["tok_embeddings.weight"]
    ids = sorted({int(k.split(".")[1]) for k in shape if k.startswith("layers.")})
    heads = args.n_heads
    kv_heads = args.n_kv_heads or heads
    head_dim = shape["layers.0.attention.wq.weight"][0] // heads
    dense = [i for i in ids if f"layers.{i}.feed_forward.w1.weight" in shape]
    moe_ids = [i for i in ids if f"layers.{i}.moe.experts.w1" in shape]
    moe = None
    if moe_ids:
        m = f"layers.{moe_ids[0]}.moe"
        experts, expert_ffn, _ = shape[f"{m}.experts.w1"]
        shared = args.moe_args.num_shared_experts if f"{m}.shared_experts.w1.weight" in shape else 0
        moe = MoE(experts=experts, top_k=args.moe_args.top_k, expert_ffn=expert_ffn, shared_experts=shared,
                  shared_ffn=shape[f"{m}.shared_experts.w1.weight"][0] // shared if shared else 0,
                  step=1, dense_layers=tuple(i for i in ids if i not in moe_ids))
        family = "qwen3_moe" if family == "qwen3" else family
    # the dense FFN width; with no dense layer it is unused and any positive value will do
    ffn = shape[f"layers.{dense[0]}.feed_forward.w1.weight"][0] if dense else moe.expert_ffn
    return ModelCard(name=card_name, family=family, source=source, hidden=hidden, layers=len(ids), heads=heads,
                     kv_heads=kv_heads, head_dim=head_dim, ffn=ffn, vocab=vocab,
                     tied_embeddings="output.weight" not in shape,
                     qk_norm="layers.0.attention.q_norm.weight" in shape, moe=moe)


# --- the plan's layout as TorchTitan's overrides ---------------------------------------

def overrides(req, lay, keep_ac: bool = False) -> list[str]:
    """TorchTitan's command-line overrides (`--section.key=value`) that make it run layout
    `lay` of request `req`: every value the plan assumed, whether or not the config says so;
    keep_ac: not the checkpointing mode (the config's selective, which the plan bounds by none)."""
    values = {"parallelism.data_parallel_shard_degree": lay.dp, "parallelism.tensor_parallel_degree": lay.tp,
              "parallelism.pipeline_parallel_degree": lay.pp, "parallelism.expert_parallel_degree": lay.ep,
              "training.local_batch_size": lay.local_batch,
              "training.global_batch_size": req.global_batch or lay.dp * lay.local_batch,
              "training.seq_len": lay.seq_len, "activation_checkpoint.mode": lay.recompute,
              **PRECISION_ARGS[req.precision]}
    if keep_ac:
        del values["activation_checkpoint.mode"]
    return [f"--{k}={v}" for k, v in values.items()]


def _option_key(token: str) -> str | None:
    """`--training.seq-len=4` -> training.seq_len (tyro takes both spellings)."""
    if not token.startswith("--") or "." not in token:
        return None
    return token[2:].split("=", 1)[0].replace("-", "_")


def runnable(p, nodes: int):
    """The candidate of `nodes` nodes of plan p; a TorchTitan job of a layout that cannot run is
    refused (without --torchtitan, render renders it with a warning: the command is the user's)."""
    from transit_launch.units import n_nodes
    c = p.at(nodes)
    if c is None:
        raise UsageError(f"--torchtitan: {n_nodes(nodes)} cannot run this job: {p.why_not(nodes)}")
    return c


def job_command(job: TitanJob, command: list[str] | None, p, nodes: int) -> list[str]:
    """The training command of `nodes` nodes of plan p: the user's (default `python -m
    torchtitan.train`), the config, then the layout's overrides. A command that sets what the
    plan read from the config itself is refused: the job would run something else."""
    base = list(command) if command else list(DEFAULT_COMMAND)
    for token in base:
        key = _option_key(token)
        if key in PLANNED:
            raise UsageError(f"the command sets --{key}, which the plan reads from {job.path} (and passes to the "
                             "job itself): change it there or with transit-launch's own options")
    c = runnable(p, nodes)
    for note in job.notes:  # once the job is certain (a refusal stays one line)
        print(f"transit-launch: note: {note}", file=sys.stderr)
    return [*base, f"--job.config_file={job.path}", *overrides(p.req, c.layout, job.keep_ac)]
