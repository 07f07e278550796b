"""The shim on a real GPU (run on the H200 through the device tool; skipped elsewhere).

The example trainer (FSDP2, mixed precision, activation checkpointing, AdamW) runs 20
steps under every policy, with and without a GPU budget of half its peak; a second program
trains wide Linear layers with gradient accumulation 2 and 4 and gradient clipping under
advise at half its own peak. In deterministic mode (the trainer's
--deterministic: torch.use_deterministic_algorithms and CUBLAS_WORKSPACE_CONFIG) the
losses must equal the run without the shim bit for bit (README: "bit-identical"), the
stats must show the budget held by the shim's placement (what another process can
allocate beside such a job is bench/probes/second_process.py's measurement), and advise must
have placed the optimizer states on the host."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from transit_launch.preload import inject
from transit_launch.preload import run as runmod

from tests.example_trainer import ROOT, env, trainer_records, transit

# No NVIDIA driver, no GPU: told without importing PyTorch, which costs every collection (each
# xdist worker's, the quick tier's) seconds of CPU for a module that then skips; with a driver,
# PyTorch's own answer as before.
DRIVER = (Path("/proc/driver/nvidia/version").exists() or Path("/dev/nvidiactl").exists()
          or shutil.which("nvidia-smi") is not None)
torch = pytest.importorskip("torch", reason="needs PyTorch with CUDA (a GPU machine)") if DRIVER else None
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not DRIVER or not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
              pytest.mark.skipif(inject.shim_path() is None, reason="libtransit.so is not built here")]

# 200 M parameters, 1K tokens a step: model states (3.2 GB) dominate, as in LLM training.
TRAINER = [sys.executable, str(ROOT / "examples" / "train_llama.py"), "--steps", "20", "--deterministic",
           "--dim", "1024", "--layers", "16", "--ffn", "2816", "--vocab", "8192", "--seq-len", "512", "--batch", "2"]


def run_trainer(tmp_path, policy=None, budget=None, trainer=TRAINER, **extra_env):
    cmd = trainer if policy is None else transit(policy, trainer, str(tmp_path), budget)
    res = subprocess.run(cmd, capture_output=True, text=True, env=env(**extra_env), timeout=900, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    steps, summary = trainer_records(res.stdout)
    assert summary is not None, res.stdout[-2000:]
    stats = runmod.read_stats(str(tmp_path)) if policy else []
    return steps, summary, stats, res.stderr


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    steps, summary, _, _ = run_trainer(tmp_path_factory.mktemp("ref"))
    again, _, _, _ = run_trainer(tmp_path_factory.mktemp("ref2"))
    assert [s["loss"] for s in steps] == [s["loss"] for s in again], "the trainer itself is not deterministic"
    return summary


# off under a budget is not a case: off ignores the budget by design
@pytest.mark.parametrize("policy,budgeted", [(p, b) for p in ("off", "base", "prefetch", "advise")
                                             for b in (False, True) if not (p == "off" and b)],
                         ids=lambda v: v if isinstance(v, str) else ("half-peak" if v else "no-budget"))
def test_losses_match_and_budget_holds(reference, tmp_path, policy, budgeted):
    peak = int(reference["max_reserved_gb"] * 1e9)
    budget = peak // 2 if budgeted else None
    steps, summary, stats, err = run_trainer(tmp_path, policy, budget)
    ref = reference["losses"]
    got = [s["loss"] for s in steps]
    assert len(got) == len(ref) == 20
    assert got == ref, (policy, got, ref)  # bit for bit: the shim moves memory, never values
    assert len(stats) == 1, err[-2000:]
    s = stats[0]
    assert s["policy"] == policy and not s["passthrough"]
    if policy == "off":
        assert s["managed_allocs"] == 0
        return
    assert s["managed_allocs"] > 0 and s["iterations"] >= 15
    if budgeted:
        assert s["budget_bytes"] == budget and runmod.budget_held(s), s
        assert s["host_placed_peak_bytes"] > 0
    if policy == "advise" and budgeted:
        params = summary["params"]
        adam = 8 * params  # exp_avg and exp_avg_sq in fp32
        # hinted cold where it is managed memory; the state made in pinned host memory under
        # the default's streamed step (hoststate.c) is in no table, so it has no hint to count
        assert s["cold_hint_bytes"]["optimizer"] + s["host_state_peak_bytes"] >= 0.95 * adam, s
        # on the host: as managed memory placed there, or made in pinned host memory (hoststate.c)
        on_host = s["host_placed_peak_bytes"] + s["host_state_peak_bytes"]
        assert on_host >= 0.95 * adam and s["zero_copy_mapped_peak_bytes"] + s["host_state_peak_bytes"] >= 0.95 * adam


def test_state_pool_gets_the_state_and_nothing_else():
    """The optimizer state's private pool with PyTorch's real pools: after the first step
    every AdamW state tensor lies in a segment of the adapter's pool (the allocator's own
    snapshot says which pool each segment belongs to), the step's temporaries do not, and
    the results equal the plain optimizer's bit for bit."""
    import transit_state_pool as mod
    from torch.optim import optimizer as o

    def make():
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
        return m, torch.optim.AdamW(m.parameters(), lr=1e-3, foreach=True)  # temporaries the size of the params

    def train(m, opt):
        for i in range(3):
            torch.manual_seed(i)
            m(torch.randn(64, 1024, device="cuda")).square().mean().backward()
            opt.step()
            opt.zero_grad()

    ref_model, ref_opt = make()
    train(ref_model, ref_opt)
    sp = mod.StatePool()
    handles = [o.register_optimizer_step_pre_hook(sp.pre_step), o.register_optimizer_step_post_hook(sp.post_step)]
    try:
        model, opt = make()
        train(model, opt)
    finally:
        for h in handles:
            h.remove()
    assert sp.routed == 1
    for p, q in zip(model.parameters(), ref_model.parameters()):
        assert torch.equal(p, q)
    pool_id = tuple(sp.pools[next(model.parameters()).device].id)
    segs = [s for s in torch.cuda.memory._snapshot()["segments"] if tuple(s["segment_pool_id"]) == pool_id]
    state = [t for st in opt.state.values() for t in st.values() if torch.is_tensor(t) and t.is_cuda and t.numel() > 1]
    assert len(state) == 8
    for t in state:
        assert any(s["address"] <= t.data_ptr() < s["address"] + s["total_size"] for s in segs), "state outside the pool"
    # foreach AdamW's temporaries are as large as the parameters: had they gone to the pool,
    # it would hold that much more than the state (allowing each segment its 2 MiB rounding)
    state_bytes = sum(t.numel() * t.element_size() for t in state)
    assert sum(s["total_size"] for s in segs) <= state_bytes + (2 << 20) * len(segs)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "foreach"])
def test_predicted_state_segments_are_pytorchs_own(fused):
    """The segments the adapter predicts for the first step's state (transit_state_pool's
    allocator_segments over state_requests: what the shim makes ready beforehand) are the
    ones PyTorch's caching allocator makes in the state's private pool, by the allocator's own
    snapshot: Llama-like projections (whole MiB), odd sizes whose moments share a 20 MiB
    segment or another's remainder, biases and norms in the small pool, step counts on the
    device where fused."""
    import transit_state_pool as mod
    from torch.optim import optimizer as o

    torch.manual_seed(0)
    shapes = [(4096, 1024), (1024, 1024), (14336 // 4, 1024), (768, 1024), (1024, 3072), (3001, 517), (4096,),
              (1024,), (333,)]
    params = [torch.nn.Parameter(torch.randn(*s, device="cuda")) for s in shapes]
    opt = torch.optim.AdamW(params, lr=1e-3, fused=fused, foreach=None if fused else True)
    predicted = mod.allocator_segments(mod.state_requests(opt))
    for p in params:
        p.grad = torch.randn_like(p)
    sp = mod.StatePool()
    handles = [o.register_optimizer_step_pre_hook(sp.pre_step), o.register_optimizer_step_post_hook(sp.post_step)]
    try:
        opt.step()
    finally:
        for h in handles:
            h.remove()
    pool_id = tuple(sp.pools[params[0].device].id)
    made = [s["total_size"] for s in torch.cuda.memory._snapshot()["segments"] if tuple(s["segment_pool_id"]) == pool_id]
    assert sorted(made) == sorted(predicted), (made, predicted)
    assert len(predicted) > 5


# Wide Linear layers: a few large segments, accumulation over microbatches, clipping of the
# total gradient norm (which reads every gradient: on the host ones through the mapping).
WIDE = r"""
import json, os, sys
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
import torch
width, ffn, blocks, accum, clip, steps = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]),
                                          float(sys.argv[5]), int(sys.argv[6]))
torch.use_deterministic_algorithms(True)
torch.manual_seed(0)
layers = []
for _ in range(blocks):  # made on the GPU: a CPU initialisation of 1 G parameters takes seconds
    layers += [torch.nn.Linear(width, ffn, device="cuda"), torch.nn.GELU(), torch.nn.Linear(ffn, width, device="cuda")]
model = torch.nn.Sequential(*layers)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
gen = torch.Generator(device="cuda").manual_seed(1)
losses, clipped, max_norm = [], 0, None
for step in range(steps):
    for _ in range(accum):
        x = torch.randn(256, width, device="cuda", generator=gen)
        loss = model(x).float().square().mean() / accum
        loss.backward()
        losses.append(loss.item())
    if clip > 0:  # max norm: `clip` x the first step's norm (measured unclipped), so it binds there
        if max_norm is None:
            max_norm = clip * torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf")).item()
        clipped += int(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm).item() > max_norm)
    opt.step()
    opt.zero_grad(set_to_none=True)
def memory_type(t):  # the runtime's own answer: cudaPointerGetAttributes' type
    import ctypes
    rt = ctypes.CDLL("libcudart.so.13")
    attr = (ctypes.c_int * 64)()  # cudaPointerAttributes: its first field is the type
    assert rt.cudaPointerGetAttributes(attr, ctypes.c_void_p(t.data_ptr())) == 0
    return {0: "unregistered", 1: "host", 2: "device", 3: "managed"}[attr[0]]
state_memory = {}
for st in opt.state.values():
    for k in ("exp_avg", "exp_avg_sq"):
        kind = memory_type(st[k])
        state_memory[kind] = state_memory.get(kind, 0) + st[k].numel() * st[k].element_size()
print(json.dumps({"losses": losses, "clipped": clipped, "max_reserved": torch.cuda.max_memory_reserved(),
                  "params": sum(p.numel() for p in model.parameters()), "state_memory": state_memory}))
"""


@pytest.mark.parametrize("width,ffn,blocks,accum,clip", [
    (8192, 32768, 2, 2, 0.5),   # 1.07 G parameters in 1 GiB layers; accumulation 2; clipping at half the first norm
    (4096, 16384, 4, 4, 0.9),   # accumulation 4; clipping at 0.9 of it (a fixed 1.0 or 0.01 never bound here)
], ids=["wide-8192-accum2-clip", "accum4-clip"])
def test_wide_layers_accumulation_and_clipping_are_bit_identical(tmp_path, width, ffn, blocks, accum, clip):
    args = [str(width), str(ffn), str(blocks), str(accum), str(clip), "4"]
    cmd = [sys.executable, "-c", WIDE, *args]
    ref = subprocess.run(cmd, capture_output=True, text=True, env=env(), timeout=600, cwd=ROOT)
    assert ref.returncode == 0, ref.stderr[-3000:]
    want = json.loads(ref.stdout.splitlines()[-1])
    budget = want["max_reserved"] // 2
    # plain advise (the default's opt-out): its step reads the state where advise placed it
    res = subprocess.run(transit("advise", cmd, str(tmp_path), budget), capture_output=True, text=True,
                         env=env(TRANSIT_OVERLAP_STEP="0"), timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(next(line for line in res.stdout.splitlines() if line.startswith('{"losses"')))
    assert got["losses"] == want["losses"] and len(got["losses"]) == 4 * accum
    assert want["clipped"] >= 1  # the clipping changed at least one step's gradients
    [s] = runmod.read_stats(str(tmp_path))
    assert runmod.budget_held(s) and s["host_placed_peak_bytes"] > 0, s
    # what the runtime itself says the state tensors are (cudaPointerGetAttributes): managed
    # memory under plain advise (the state is made pinned only where the step streams it)
    assert set(got["state_memory"]) == {"managed"} and s["host_state_bytes"] == 0, got["state_memory"]
    # AdamW's two fp32 states are what advise sends to the host first
    assert s["cold_hint_bytes"]["optimizer"] >= 0.95 * 8 * want["params"], s["cold_hint_bytes"]


def test_streamed_step_with_clipping_and_accumulation_is_bit_identical(tmp_path):
    """The default under advise (TRANSIT_OVERLAP_STEP unset: the streamed step,
    transit_streamed.py) on the wide layers with accumulation 4 and clipping that binds: losses
    equal the run without the shim bit for bit, every step streamed (the first from zeros in
    the ring, its state made unfilled), the
    state the budget could not hold made in pinned host memory and the rest kept managed on
    the GPU (the runtime's own answer for each tensor, against the shim's two counts), the
    budget held."""
    args = ["4096", "16384", "4", "4", "0.9", "4"]
    cmd = [sys.executable, "-c", WIDE, *args]
    ref = subprocess.run(cmd, capture_output=True, text=True, env=env(), timeout=600, cwd=ROOT)
    assert ref.returncode == 0, ref.stderr[-3000:]
    want = json.loads(ref.stdout.splitlines()[-1])
    budget = want["max_reserved"] - 8 * want["params"]  # the offload gate's: the state does not fit
    res = subprocess.run(transit("advise", cmd, str(tmp_path), budget), capture_output=True, text=True,
                         env=env(), timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(next(line for line in res.stdout.splitlines() if line.startswith('{"losses"')))
    assert got["losses"] == want["losses"] and want["clipped"] >= 1
    assert "step streaming off" not in res.stderr, res.stderr[-2000:]
    mem = got["state_memory"]
    assert set(mem) <= {"host", "managed"} and mem.get("host", 0) > 0, mem
    assert sum(mem.values()) == 8 * want["params"]  # every exp_avg and exp_avg_sq, counted once
    [s] = runmod.read_stats(str(tmp_path))
    # the adapter's counters in the stats report: every step streamed, the first step's pinned
    # state made unfilled (its zeros written in the ring)
    assert s["adapter"]["mode"] == "stream" and s["adapter"]["steps"] == 4, s["adapter"]
    assert s["adapter"]["unfilled_bytes"] > 0, s["adapter"]
    # the tensors the runtime calls host memory lie in the shim's pinned allocations, the
    # managed ones in the allocations it kept (each count is of whole allocations)
    assert runmod.budget_held(s) and s["host_state_bytes"] >= mem["host"], s
    assert s["host_state_kept_bytes"] >= mem.get("managed", 0), s

