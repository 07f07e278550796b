"""`plan --measure`: one training step of the model, measured on the CPU without memory.

What TorchTitan's scripts/estimate/estimation.py does (0.2.2): a fake process group
(torch.testing._internal.distributed.fake_pg.FakeStore) of the layout's world size, the
model built on the meta device under FakeTensorMode, parallelised the way TorchTitan does it
(full activation checkpointing per block, FSDP2 per block, [norm, output] unsharded after
forward, the root last, MixedPrecisionPolicy(bf16 params, fp32 reduce)), AdamW, and
torch's FSDPMemTracker counting every tensor the step allocates, by kind, at the peak.
No FLOPs run and no memory is allocated: llama3-405b at full depth takes 75-185 s (dp392: FSDP2
chunks every weight into dp pieces), the 8B-70B and MoE catalog models 8-60 s.

Differences from TorchTitan, each measured or argued:
- the model is titan_model.Decoder (TorchTitan's structure tensor for tensor), not
  TorchTitan's own classes;
- one tracked step after the optimizer states exist (estimation.py runs two and resets the
  statistics after the first, which has no optimizer states: the same steady state);
- the optimizer step is the for-loop AdamW: TorchTitan's default fused step allocates
  nothing beyond the states, but under FakeTensorMode the tracker counts the outputs of
  fused/foreach optimizer ops on DTensors as new allocations (27x the states on
  llama3-8b, 4 layers, dp 8); the for-loop step's only extra is one parameter's update.
- the device is the CPU; fake CUDA tensors need a CUDA build of torch. The kernels whose
  saved tensors differ on the CPU are replaced by what CUDA keeps (titan_model.RMSNorm);
  SDPA's CPU flash kernel saves what cuDNN/flash attention save on the GPU.
Only FSDP layouts are measured (dp >= 2, tp = pp = ep = 1): TorchTitan's estimator
supports no more, and EP's all-to-all has data-dependent shapes.
"""

from __future__ import annotations

import gc
import importlib.util
import time
from dataclasses import dataclass, field

from transit_launch.errors import UsageError
from transit_launch.planning.memory import Layout, validate
from transit_launch.planning.models import ModelCard

INSTALL_HINT = "plan --measure needs PyTorch: pip install torch (the CPU build is enough)"

# The tracker's kinds, grouped into the formula's terms (memory.Estimate).
TERMS = {
    "parameters": ("Sharded Param",),
    "gradients": ("Sharded Grad",),
    "optimizer": ("OptState",),
    "fsdp": ("Unsharded Param", "Unsharded Grad", "All Gather", "Reduce Scatter"),
    "activations+logits": ("Activation", "Temp", "Inputs", "Buffer"),
}


def torch_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    try:
        import torch  # noqa: F401  (a broken install counts as absent)
    except ImportError:
        return False
    return True


@dataclass
class Measured:
    total: float                    # bytes at the peak (the tracker's Total)
    kinds: dict                     # tracker kind -> bytes at the peak
    phase: str                      # "loss", "layer backward", "embedding backward", "forward", "optimizer"
    where: str                      # the innermost module at the peak
    layers: int
    seconds: float
    model: str = "transit_launch.planning.titan_model"
    terms: dict = field(default_factory=dict)

    def __post_init__(self):
        self.terms = {t: sum(self.kinds.get(k, 0) for k in ks) for t, ks in TERMS.items()}


def check_layout(card: ModelCard, lay: Layout) -> None:
    validate(card, lay)
    if lay.tp > 1 or lay.pp > 1 or lay.ep > 1 or lay.dp < 2:
        raise UsageError(f"plan --measure measures FSDP layouts only (dp >= 2, no TP/PP/EP); "
                         f"this layout is dp={lay.dp} tp={lay.tp} pp={lay.pp} ep={lay.ep}")
    if lay.recompute != "full" or lay.precision != "mixed":
        raise UsageError("plan --measure measures TorchTitan's defaults: --recompute full, --precision mixed")


def _fake_world(world: int):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore
    if dist.is_initialized() and dist.get_world_size() != world:
        dist.destroy_process_group()
    if not dist.is_initialized():
        dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    return init_device_mesh("cpu", (world,), mesh_dim_names=("dp_shard",))


def _parallelize(model, mesh, tied: bool) -> None:
    """TorchTitan 0.2.2's apply_ac (mode full) and apply_fsdp (llama3/infra/parallelize.py)."""
    import torch
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    for k, block in list(model.layers.items()):
        model.layers[k] = checkpoint_wrapper(block, preserve_rng_state=False)
    cfg = {"mesh": mesh, "mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)}
    if not tied:  # tied weights stay with the root, which gathers them for embedding and output
        fully_shard(model.tok_embeddings, **cfg, reshard_after_forward=True)
    for block in model.layers.values():
        fully_shard(block, **cfg, reshard_after_forward=True)
    if not tied:
        fully_shard([model.norm, model.output], **cfg, reshard_after_forward=False)
    fully_shard(model, **cfg)


def _tracker_class():
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    class PeakTracker(FSDPMemTracker):
        """FSDPMemTracker that keeps only the global peak, and where it happened. The stock
        _update_peak_stats also walks every module's statistics after every op, which makes
        a 126-layer model quadratic; per-module peaks are not used here."""
        where = ((), False, False, False)
        layers_done = False  # a layer's backward has run: backward outside layers is then its end

        def _update_peak_stats(self, peak_state) -> None:
            parents, is_bw = tuple(self._mod_tracker.parents), self._mod_tracker.is_bw
            if is_bw and not self.layers_done:
                self.layers_done = any(".layers." in f".{p}." for p in parents)
            for dev, snap in self._curr_mem_snap.items():
                if self._peak_mem.get(dev, 0) < snap["Total"]:
                    self._peak_mem[dev] = snap["Total"]
                    self._peak_mem_snap[dev] = dict(snap)
                    self.where = (parents, is_bw, self._in_opt, self.layers_done)

    return PeakTracker


def _phase(where) -> tuple[str, str]:
    parents, is_bw, in_opt, layers_done = where
    mods = [p for p in parents if p != "Global"]
    inner = max(mods, key=len) if mods else "Global"
    if in_opt:
        return "optimizer", inner
    if not is_bw:
        return "forward", inner
    if any(".layers." in f".{p}." for p in mods):
        return "layer backward", inner
    return ("embedding backward" if layers_done else "loss"), inner


class Progress:
    """Where a measurement is, said on stderr every EVERY seconds once it has run AFTER seconds
    (the large models take minutes): the phase, and in forward and backward the layers done."""

    AFTER, EVERY = 3.0, 5.0

    def __init__(self, layers: int, out=None):
        import sys
        import threading

        self.layers, self.out = layers, out or sys.stderr
        self.phase, self.done = "building the model", 0
        self.counted = {}  # phase -> layers done there (forward, backward)
        self.t0 = time.perf_counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="measure-progress", daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def at(self, phase: str) -> None:
        if self.done:
            self.counted[self.phase] = self.done
        self.phase, self.done = phase, 0

    def forward_done(self, module, inputs, output) -> None:
        """A block's forward hook: counted in forward (not in backward's recomputation), and a
        hook on its output counts the block's backward (a tensor hook changes no graph)."""
        if self.phase != "forward":
            return
        self.done += 1
        if getattr(output, "requires_grad", False):
            output.register_hook(self._backward_done)

    def _backward_done(self, grad):
        self.done += 1

    def line(self) -> str:
        layers = f", {self.done} of {self.layers} layers" if self.phase in ("forward", "backward") else ""
        return f"transit-launch: plan --measure: {time.perf_counter() - self.t0:.0f} s, {self.phase}{layers}"

    def _run(self) -> None:
        wait = self.AFTER
        while not self._stop.wait(wait):
            print(self.line(), file=self.out, flush=True)
            wait = self.EVERY


def measure(card: ModelCard, lay: Layout, layers: int | None = None, progress: Progress | None = None) -> Measured:
    """Peak bytes of one training step of rank 0, by kind. `layers` truncates the depth;
    progress: what says how far it is (default: a Progress on stderr)."""
    if not torch_available():
        raise UsageError(INSTALL_HINT)
    check_layout(card, lay)
    depth = card.layers if layers is None else layers
    if not 1 <= depth <= card.layers:
        raise UsageError(f"--measure-layers must lie in 1..{card.layers}, got {depth}")
    t0 = time.perf_counter()
    gc_was = gc.isenabled()
    gc.disable()
    try:
        with progress or Progress(depth) as said:
            snap, phase, where = _step(card, lay, depth, said)
    finally:
        if gc_was:
            gc.enable()
        gc.collect()
    kinds = {getattr(k, "value", str(k)): float(v) for k, v in snap.items() if str(k) != "Total"}
    return Measured(float(snap["Total"]), kinds, phase, where, depth, time.perf_counter() - t0)


def _step(card: ModelCard, lay: Layout, depth: int, progress: Progress):
    """The tracked step: (the peak snapshot, its phase, where in the model)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transit_launch.planning import titan_model
    mesh = _fake_world(lay.dp)
    with FakeTensorMode():
        with torch.device("meta"):
            model = titan_model.Decoder(card, depth, lay.seq_len)
        progress.at("sharding the model (FSDP2)")
        _parallelize(model, mesh, card.tied_embeddings)
        model.to_empty(device="cpu")
        params = list(model.parameters())
        progress.at("making the optimizer state")
        opt = torch.optim.AdamW(params, lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, foreach=False)
        for p in params:  # the states exist before the tracked step, as in its second iteration
            p.grad = torch.zeros_like(p)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if lay.microsteps > 1:  # a later microbatch: the earlier ones' gradients are there
            for p in params:
                p.grad = torch.zeros_like(p)
        tokens = torch.randint(0, card.vocab, (lay.local_batch, lay.seq_len))
        labels = torch.randint(0, card.vocab, (lay.local_batch, lay.seq_len))
        tracker = _tracker_class()(model, opt)
        tracker.track_inputs((tokens, labels))
        hooks = [b.register_forward_hook(progress.forward_done) for b in model.layers.values()]
        try:
            with tracker:
                progress.at("forward")
                pred = model(tokens)
                loss = titan_model.cross_entropy_loss(pred, labels)
                del pred
                progress.at("backward")
                loss.backward()
                progress.at("clipping and the optimizer step")
                torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=False)
                opt.step()
                opt.zero_grad(set_to_none=True)
        finally:
            for h in hooks:
                h.remove()
        snap = next(iter(tracker.get_tracker_snapshot("peak").values()))
        phase, where = _phase(tracker.where)
    return snap, phase, where
