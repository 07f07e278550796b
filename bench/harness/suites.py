"""The suites of `python3 -m bench`, as data: what each measures, its steps (the bench
scripts with their arguments), the GPUs it needs, roughly how long it takes and what must
be carried to a GPU machine that lacks it.

A step's arguments may name {out} (the run's results folder), {gpus} (N), {half} (N/2),
{twice} (2N), {gpu} (the physical index of the step's GPU) and the values a suite derives
before its steps (`derive`: a command whose stdout is the value). No budget is a literal:
each comes from the planner or from the reference run the script measures first, as
`budget` says.

Steps with a lane (0 or 1) run one after another on that lane's GPU, pinned to half the
host's cores, the two lanes side by side; with one GPU the lanes run one after the other.
A step without a lane runs alone, with every GPU, after the lanes before it.
"""

from dataclasses import dataclass, field

# TorchTitan's memory on the catalog models at truncated depth (bench/titan_memory.py --matrix)
TITAN_MATRIX = ("llama3-8b:2,4:4:1gpu;llama3-8b:4:1:1gpu;qwen3-30b-a3b:2,4:4:1gpu;qwen3-30b-a3b:4:1:1gpu;"
                "llama3-70b:2:1,4:1gpu;llama3-70b:4:1:1gpu;qwen3-32b:2,4:1,4:1gpu;llama3-405b:1,2:1:fsdp2;"
                "llama4-scout:2,4:1:fsdp2;llama3-8b:4:1:fsdp2;llama3-8b:2,4:1:tp2;llama3-8b:2,4:2:pp2")
TITAN_STEPS = ("python3", "bench/titan_steps.py", "--model", "llama3-8b", "--layers", "16", "--steps", "6",
               "--timeout", "140", "--budget", "0")
# advise as users get it (the streamed step by default) against plain advise (its opt-out)
TITAN_RUNS = "ref,advise,advise:TRANSIT_OVERLAP_STEP=0"
# ... where the budget holds all of the state (nothing needs to move: within 1% of ref is the
# goal) and half of it (only the overflow may move)
TITAN_RUNS_ROOM = "ref,advise:STATE_OFF=0,advise:STATE_OFF=0.5,advise:TRANSIT_OVERLAP_STEP=0+STATE_OFF=0.5"
# the example trainer in shapes unlike its 1.0 B default (bench/offload.py --model), gradients
# clipped: "wide" has Linear weights of 67 M elements (AdamW state 0.54 GB each) and a tied
# 32000 x 8192 embedding/output matrix (2.1 GB of state); "wide-ffn" FFN weights of 268 M
# elements (2.1 GB of state each), untied. Sequence 4096 (offload.py's batch 2: 8192 tokens a
# microbatch) keeps the suite's twelve runs near 6 minutes, most of it start-up
SHAPES = {"wide": "--dim 8192 --ffn 8192 --heads 64 --kv-heads 8 --layers 2 --tie-embeddings",
          "wide-ffn": "--dim 4096 --ffn 65536 --heads 32 --kv-heads 8 --layers 2"}
SHAPES_SET = "reference,advise,advise-plain"  # the streamed step (advise's default) and its opt-out


@dataclass(frozen=True)
class Step:
    name: str              # its log is {out}/NAME.log; --only picks steps by name
    argv: tuple
    timeout: int           # seconds
    lane: int | None = 0   # 0 or 1: a GPU lane; None: alone, every GPU
    gpus: int = 1          # the fewest GPUs it needs (0: runs on a CPU-only machine)
    env: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Suite:
    name: str
    measures: str
    steps: tuple
    minutes: int                 # roughly, on the GPUs it asks for
    carry: tuple = ()            # what a GPU machine without it needs carried (bench/fetch_wheels.sh: .whl)
    modules: tuple = ()          # Python modules that must import (else: carry .whl)
    derive: dict = field(default_factory=dict)
    budget: str = ""             # where its budgets come from

    @property
    def gpus(self) -> int:
        return max(s.gpus for s in self.steps)

    @property
    def lanes(self) -> int:
        return len({s.lane for s in self.steps if s.lane is not None})


def _offload(name, out, *args, timeout, lane=0):
    return Step(name, ("python3", "bench/offload.py", *args, "--gpu", "{gpu}", "--out", f"{{out}}/{out}"),
                timeout, lane)


def _shape_out(name):
    return f"shapes_{name.replace('-', '_')}.json"


# the points of each shape: (step suffix, microbatches in run order, --deadline s, --timeout per run s).
# "" is the suite's first pair (4 and 1); "-16-8-2" completes issue 27's 1, 2, 8 and 16 (each step
# fits one 10-minute device call; the two together do not)
SHAPE_POINTS = {"wide": (("", "4,1", 150, 90), ("-16-8-2", "16,8,2", 300, 110)),
                "wide-ffn": (("", "4,1", 200, 90), ("-16-8-2", "16,8,2", 400, 120))}


def _shape(name, suffix, accum, deadline, per_run):
    """One shape of SHAPES on lane 0: reference, advise and plain advise at the given microbatches,
    clipped at 1.0, each point's budget its reference's peak less the AdamW state (offload.py's
    default); no run starts after `deadline` s, and the last one started may take its `per_run` s."""
    return _offload(name + suffix, _shape_out(name + suffix), "--set", SHAPES_SET,
                    f"--model=--clip 1.0 {SHAPES[name]}", "--seq-len", "4096", "--accum", accum, "--steps", "8",
                    "--warmup", "3", "--timeout", str(per_run), "--deadline", str(deadline),
                    timeout=deadline + per_run + 20)


def _shape_report(name):
    return Step(f"report-{name}", ("python3", "bench/offload.py", "--report", f"{{out}}/{_shape_out(name)}",
                                   "--markdown"), 60, None, 0)


def _shapes():
    runs = [_shape(n, *point) for n in SHAPES for point in SHAPE_POINTS[n]]
    return (*runs, *(_shape_report(r.name) for r in runs))


# the host update path (TRANSIT_OVERLAP_STEP=host) on issue 50's held-out FSDP2 shape, against the default
# streamed step, the host path without the shim, and the peers at the clipped point (torchao's
# CPUOffloadOptimizer against its own reference, FSDP2's CPUOffloadPolicy)
HOST_STEP = ("python3", "bench/host_step.py", "--points", "base,clip,wide-clip", "--runs",
             "stream,host,host-bare,torchao-reference,torchao,fsdp2-offload", "--peer-points", "clip",
             "--steps", "30", "--warmup", "22", "--timeout", "100", "--out", "{out}/host_step.json")
TITAN_RUNS_HOST = "ref,advise,advise:TRANSIT_OVERLAP_STEP=host"
# the split's search settles by its 22nd step at the latest (2 streamed whole, then at most six plans
# of four steps: the model's, its revision's, four trials); titan_steps reads the last four steps
TITAN_STEPS_HOST = tuple({"--steps": "26", "--timeout": "200"}.get(prev, x) for prev, x in zip(("",) + TITAN_STEPS, TITAN_STEPS))

SUITES = {s.name: s for s in [
    Suite("host", "the host update path (TRANSIT_OVERLAP_STEP=host: gradients down in backward, torch's own "
          "optimizer on the host for a share of the state, the rest streamed) against advise's default streamed "
          "step, the host path without the shim and the peers (torchao's CPUOffloadOptimizer, FSDP2's "
          "CPUOffloadPolicy) on issue 50's FSDP2 shape without and with clipping and with wide layers "
          "(bench/host_step.py); TorchTitan "
          "unchanged under it at 1 and 8 microbatches (bench/titan_steps.py)",
          (Step("shape", HOST_STEP, 560, None),
           Step("report", ("python3", "bench/host_step.py", "--report", "{out}/host_step.json"), 60, None, 0),
           Step("titan-accum1", (*TITAN_STEPS_HOST, "--runs", TITAN_RUNS_HOST, "--accum", "1",
                                 "--out", "{out}/titan_steps_accum1_host.json"), 400, None),
           Step("titan-accum8", (*TITAN_STEPS_HOST, "--runs", TITAN_RUNS_HOST, "--accum", "8",
                                 "--out", "{out}/titan_steps_accum8_host.json"), 590, None)),
          minutes=27, carry=(".whl",), modules=("torchao", "torchtitan"),
          budget="each point's reference run: its peak reserved less the AdamW state (bench/host_step.py, "
          "bench/titan_steps.py --budget 0)"),
    Suite("gate", "the performance gate (bench/offload.py): transit's policies against no offloading and the "
          "offloading peers (FSDP2 CPU offload, ZeRO-Offload/Infinity, Twin-Flow, ZenFlow, torchao), per-GPU "
          "TFLOPS along the curve at 12, 1 and 3 microbatches; the losses with deterministic kernels",
          (_offload("transit", "offload_transit.json", "--set", "transit", "--deadline", "400", "--timeout", "200",
                    timeout=560),
           _offload("peers", "offload_peers.json", "--set", "peers", "--deadline", "330", "--timeout", "200",
                    timeout=560, lane=1),
           _offload("losses", "offload_losses.json", "--set", "reference,off,advise,advise-plain,advise-host",
                    "--model=--deterministic", "--seq-len", "2048", "--accum", "4", "--steps", "8", "--warmup", "3",
                    "--timeout", "60", timeout=330),
           Step("report", ("python3", "bench/offload.py", "--report", "{out}/offload_transit.json",
                           "{out}/offload_peers.json", "--markdown"), 60, None, 0),
           Step("report-losses", ("python3", "bench/offload.py", "--report", "{out}/offload_losses.json"), 60,
                None, 0)),
          minutes=15, carry=(".whl",), modules=("deepspeed", "torchao"),
          budget="each point's reference run: its peak reserved less the AdamW state (bench/offload.py)"),
    Suite("policies", "the shim's pass-through overhead (no shim, off, base without a budget) and base, prefetch "
          "and advise under a budget that forces the optimizer state off the GPU (bench/shim_policies.py)",
          (Step("policies", ("python3", "bench/shim_policies.py", "--timeout", "150",
                             "--out", "{out}/shim_policies.json"), 380),),
          minutes=7, budget="the reference run's peak reserved less the AdamW state (bench/shim_policies.py)"),
    Suite("scale-in", "N -> N/2 GPUs on one host at the same global batch (the N/2 layout accumulates twice): "
          "per-GPU TFLOPS, peaks, offloaded bytes and collective bytes against the planner (bench/scale_in.py), "
          "then the matrix with and without recomputation under advise (bench/scale_in_matrix.py)",
          (Step("scale-in", ("python3", "bench/scale_in.py", "--gpus", "{gpus}", "--out", "{out}/scale_in.json"),
                300, None, 2),
           Step("matrix", ("python3", "bench/scale_in_matrix.py", "--gpus", "{gpus}", "--configs", "ac:1,noac:1",
                           "--layouts", "full,half-off,half-advise", "--repeats", "1", "--steps", "10",
                           "--timeout", "150", "--deadline", "300", "--out", "{out}/scale_in_matrix.json"),
                450, None, 2)),
          minutes=12,
          budget="the emulated GPU: the planner's size that fits the N-GPU layout and not the N/2 one "
                 "(bench/scale_in.py --print-budget), raised to the full layout's measured peak where that is more"),
    Suite("rho", "rho(40 Gbit/s, 10 Gbit/s) over NCCL sockets between network namespaces, the N-GPU layout without "
          "offloading against the N/2-GPU advise layout under the scale-in's emulated GPU (bench/rho_layouts.py)",
          (Step("netcheck", ("bash", "bench/netcheck.sh"), 60, None, 0),
           Step("rho", ("python3", "bench/rho_layouts.py", "--device", "cuda", "--layouts",
                        "{gpus},{half}:advise:{emulated_gpu}", "--bandwidths", "40gbit,10gbit",
                        "--global-batch", "{twice}", "--micro-batch", "2", "--model", "--seq-len 8192", "--steps", "5",
                        "--repeat", "2", "--single-rank-repeat", "1", "--timeout", "120",
                        "--out", "{out}/rho_sockets.json"), 420, None, 2,
                # several sockets and threads per NCCL connection: NCCL itself must not cap a veth
                {"NCCL_SOCKET_NTHREADS": "4", "NCCL_NSOCKS_PERTHREAD": "4"})),
          minutes=8, carry=(".net",),
          derive={"emulated_gpu": ("python3", "bench/scale_in.py", "--gpus", "{gpus}", "--print-budget")},
          budget="the scale-in's emulated GPU from the planner (bench/scale_in.py --print-budget)"),
    Suite("fidelity", "the planner's memory formula against its measurements: the measured mode on the CPU "
          "(bench/planner_fidelity.py, the held-out layouts too), the example trainer's peaks on a GPU "
          "(bench/calibrate.py) and TorchTitan's own memory on the catalog models at truncated depth "
          "(bench/titan_memory.py)",
          (Step("planner", ("python3", "bench/planner_fidelity.py", "--out", "{out}/planner_fidelity.json"),
                600, None, 0),
           Step("held-out", ("python3", "bench/planner_fidelity.py", "--held-out",
                             "--out", "{out}/planner_heldout.json"), 600, None, 0),
           Step("calibration", ("python3", "bench/calibrate.py", "--measure", "--compare", "{out}/calibration.json",
                                "--out", "{out}/calibration.json"), 200, None, 1),
           Step("titan-memory", ("python3", "bench/titan_memory.py", "--matrix", TITAN_MATRIX, "--lanes", "{gpus}",
                                 "--timeout", "110", "--deadline", "430", "--out", "{out}/titan_memory.json"),
                560, None, 2)),
          minutes=25, carry=(".whl",), modules=("torchtitan",),
          budget="none: no offloading; the formula is compared with the peaks as measured"),
    Suite("torchtitan", "TorchTitan unchanged (Llama3-8B dimensions at 16 layers, one GPU): every step's time "
          "without offloading, under advise (its streamed step, the default) and plain advise "
          "(TRANSIT_OVERLAP_STEP=0) at 16, 8 and 2 microbatches, and at 1 where the budget holds all or half of the state "
          "(bench/titan_steps.py); its losses with and without the shim "
          "(bench/torchtitan_check.py); the GPU tests of the state pool and the streamed step",
          (Step("accum16", (*TITAN_STEPS, "--runs", TITAN_RUNS, "--accum", "16",
                            "--out", "{out}/titan_steps_accum16_stream.json"), 345),
           Step("accum1", (*TITAN_STEPS, "--runs", TITAN_RUNS_ROOM, "--accum", "1",
                           "--out", "{out}/titan_steps_accum1_stream.json"), 230, lane=1),
           Step("accum8", (*TITAN_STEPS, "--runs", TITAN_RUNS, "--accum", "8",
                           "--out", "{out}/titan_steps_accum8_stream.json"), 240, lane=1),
           Step("accum2", (*TITAN_STEPS, "--runs", TITAN_RUNS, "--accum", "2",
                           "--out", "{out}/titan_steps_accum2_stream.json"), 150, lane=1),
           Step("losses", ("python3", "bench/torchtitan_check.py", "--steps", "10", "--timeout", "110",
                           "--out", "{out}/torchtitan.json"), 240, lane=1),
           Step("gpu-tests", ("python3", "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "tests/test_gpu.py",
                              "-k", "state_pool or stream or wide or predicted"), 200, None, 1)),
          minutes=16, carry=(".whl",), modules=("torchtitan",),
          budget="the reference run's peak reserved less the AdamW state (bench/titan_steps.py --budget 0)"),
    Suite("shapes", "the example trainer in two shapes unlike its default model, gradients clipped (--clip 1.0), "
          "on one GPU: wide (dim 8192, FFN 8192, 2 layers, tied embeddings: 0.54 GB of AdamW state per Linear) and "
          "wide-ffn (dim 4096, FFN 65536, 2 layers: 2.1 GB per FFN weight), each without offloading, under advise "
          "(its streamed step, the default) and plain advise (TRANSIT_OVERLAP_STEP=0) at 4 and 1 microbatches "
          "(steps wide, wide-ffn) and at 16, 8 and 2 (wide-16-8-2, wide-ffn-16-8-2; pick a few steps with --only: "
          "the whole suite outlasts one 10-minute device call) (bench/offload.py --set " + SHAPES_SET + ")",
          _shapes(), minutes=20,
          budget="each point's reference run: its peak reserved less the AdamW state (bench/offload.py)"),
    Suite("gpu-tests", "the shim on a real GPU: doctor, tests/test_gpu.py (bit-identical losses under every "
          "policy, the budget held, the overlap modes), and the acceptance command (advise at half the trainer's "
          "peak, bench/gpu_checks.sh accept)",
          (Step("doctor", ("python3", "-m", "transit_launch", "doctor"), 60, None, 1),
           Step("tests", ("python3", "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "tests/test_gpu.py"),
                420, None, 1),
           Step("acceptance", ("bash", "bench/gpu_checks.sh", "accept"), 300, None, 1,
                {"OUT": "{out}", "TRANSIT_SKIP_BUILD": "1"})),
          minutes=10, budget="half the trainer's measured peak reserved (bench/gpu_checks.sh)"),
    Suite("plan", "the planner and the simulator without a GPU: `plan`'s latency and the simulator's speed as a "
          "user runs them (bench/sim_speed.py) and the plan's predicted efficiency against the recorded TorchTitan "
          "runs (bench/prediction.py)",
          (Step("speed", ("python3", "bench/sim_speed.py", "--out", "{out}/sim_speed.json"), 900, None, 0),
           Step("prediction", ("python3", "bench/prediction.py"), 120, None, 0)),
          minutes=8),
]}
