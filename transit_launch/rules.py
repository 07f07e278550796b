"""The rules that Python, the shim (shim/) and the SPANK plugin (spank/) share, defined
once: policy names, log levels, the environment contract, and the size grammar.

The C side reads them from shim/transit_rules.h, which this module writes
(`python3 -m transit_launch.rules > shim/transit_rules.h`), and the job-side adapter from
transit_launch/adapter/transit_rules.py (`python3 -m transit_launch.rules --python > ...`: the
adapter runs in the job's own Python, which need not have transit_launch); a test fails when
either committed file differs, and a table test feeds the same inputs to the three size
parsers (this one, the shim's and the plugin's, both in shim/transit_size.h).

Size grammar: DIGITS[.DIGITS][ ]UNIT, e.g. 80GB, 141GiB, 1.5 TB, 4096B. Decimal units
(GB = 1e9) are what GPU and DRAM vendors print and the paper reports; binary units
(GiB = 2**30) are accepted too. The unit is required: a bare number is refused, not read
as bytes (`--gpu-budget 70` meant 70 GB, not 70 bytes); bytes are written 4096B. No
exponents, signs, hex, inf or nan: a value must be an exact, positive byte count of at
most 1 PiB (1PiB itself is accepted).
"""

from __future__ import annotations

import pprint
import re
import sys

POLICIES = ("off", "base", "prefetch", "advise")
# TRANSIT_OVERLAP_STEP: "stream" the step run when the application calls it, in slices
# through the copy engines, the default under advise; "host" (opt-in, issue 50) the update
# of a share of the state the budget cannot hold run on the host by torch's own CPU optimizer,
# the gradients down during backward and the parameters up, the rest streamed; "0" the opt-out. The adapter reads
# them from its generated transit_rules.py (python_module). "1" and "staged" are retired
# (RETIRED_OVERLAP_MODES).
OVERLAP_MODES = ("0", "stream", "host")
# the mode when TRANSIT_OVERLAP_STEP is unset, by policy (the adapter's too); the plan predicts
# advise with it
DEFAULT_OVERLAP = {"advise": "stream"}
# the modes whose step copies the state between pinned host homes and a ring of device memory
# (host: the share its CPU does not step): the plan counts the ring, the adapter has the state
# born in pinned host memory
RING_OVERLAP_MODES = ("stream", "host")
# the ring of plain device memory each GPU stages the state through, out of the GPU budget
# (the adapter's default, transit_staging.py; TRANSIT_OVERLAP_INFLIGHT). The plan counts it.
STAGE_RING_BYTES = 256 << 20
# x86-64's transparent huge page: host memory the shim (shim/hoststate.c) and the adapter
# (transit_staging.pinned) pin comes in whole huge pages from one huge page up, for the copy engines
HUGE_PAGE_BYTES = 2 << 20
# What a hint (transit_hint) says a range of memory holds: the adapter gives the kinds, the
# shim's policies place by them (shim/transit_api.h's enum is made of these)
HINT_KINDS = {"HOT": 0, "MASTER": 1, "OPTIMIZER": 2, "SPARSE": 3}
# Under the shim PyTorch's cache keeps what a real GPU's allocator would have freed: the plan
# adds this share to the reserved bytes (fitted: bench/prediction.py).
SHIM_RESERVED_GAP_PERCENT = 5
# The shim keeps marked optimizer state on the GPU only with this share of the budget spare
# beside the device's peak so far (and the staging ring): the cache grew past the first step's
# peak by about 3% of the budget at 16 microbatches, and state kept in that room pushed hot data
# to the host (bench/LOG.md, "The streamed step by default").
STATE_ROOM_SPARE_PERCENT = 3
LOG_LEVELS = ("error", "warn", "info", "debug")

# The shim's environment contract (shim/config.c reads these names from the header).
ENV = {
    "POLICY": "TRANSIT_POLICY",
    "GPU_BUDGET": "TRANSIT_GPU_BUDGET",
    "ALLOW_OVERSUBSCRIBE": "TRANSIT_ALLOW_OVERSUBSCRIBE",
    "RESERVE": "TRANSIT_RESERVE",
    "WARMUP_ITERS": "TRANSIT_WARMUP_ITERS",
    "MERGE_GAP": "TRANSIT_MERGE_GAP",
    "STATS": "TRANSIT_STATS",
    "LOG": "TRANSIT_LOG",
    "COLD_TAIL": "TRANSIT_COLD_TAIL",
    # the plan's prediction for the job (a JSON object, set by render/submit): the shim copies it
    # into its stats report as "plan", so `report` sets it beside what the ranks measured
    "PLAN": "TRANSIT_PLAN",
    "HOST_STATE": "TRANSIT_HOST_STATE",  # 0: optimizer state over the budget stays managed memory (hoststate.c)
    # read by the framework adapter only (transit_step.py), not by the shim
    "OVERLAP_STEP": "TRANSIT_OVERLAP_STEP",  # one of OVERLAP_MODES (adapter/transit_step.py)
    "OVERLAP_INFLIGHT": "TRANSIT_OVERLAP_INFLIGHT",  # bytes of the staging ring on each GPU (transit_staging.py)
    # 0, a diagnostic: the host step's copies up issued by its worker between CPU steps (transit_host.py)
    "HOST_SEND_BESIDE": "TRANSIT_HOST_SEND_BESIDE",
    # a fraction, a diagnostic: the share of the offloaded state the host step takes, clipped or not (transit_host.py)
    "HOST_SHARE": "TRANSIT_HOST_SHARE",
    "STATE_POOL": "TRANSIT_STATE_POOL",  # 0: no private pool for the optimizer state (transit_state_pool.py)
    "ADAPTER": "TRANSIT_ADAPTER",  # 0: the hint adapter installs nothing (sitecustomize.py)
    # read by the launcher only (preload/inject.py): where libtransit.so and the adapter are
    "SHIM": "TRANSIT_SHIM",
    "ADAPTER_DIR": "TRANSIT_ADAPTER_DIR",
}
# Retired experiments (docs/retired-experiments.md): nothing reads them any more. A job that
# still sets one is told once on stderr that it is ignored, and runs on: TRANSIT_STAGE by the
# shim (shim/config.c), the others by the adapter (transit_step.py).
# The CLI refuses a retired --overlap mode in one line.
RETIRED_ENV = {
    "STAGE": "TRANSIT_STAGE",              # the shim lent optimizer state to the GPU for a step's end
    "OVERLAP_SMS": "TRANSIT_OVERLAP_SMS",  # the early updates' stream on a CUDA green context of N SMs
    "OVERLAP_EARLY": "TRANSIT_OVERLAP_EARLY",  # 1: the streamed state copied in during backward
}
# "serial": the early updates on the compute stream (a diagnostic); "1": the step overlapped with
# backward, each parameter updated as its gradient became final, reading the state in place;
# "staged": the same with its state staged through the copy engines (a second host copy of it)
RETIRED_OVERLAP_MODES = ("serial", "1", "staged")


def overlap_refusal(mode):
    """Why `mode` is no TRANSIT_OVERLAP_STEP mode (a retired one said as retired), or None: the
    one wording of the CLI's --overlap, ShimOptions and the plan's Request."""
    if mode in RETIRED_OVERLAP_MODES:
        return f"{mode!r} is retired (docs/retired-experiments.md): the modes are {', '.join(OVERLAP_MODES)}"
    if mode not in OVERLAP_MODES:
        return f"{mode!r} is not one of {', '.join(OVERLAP_MODES)}"
    return None

# PyTorch's expandable segments and its cudaMallocAsync backend allocate through
# cuMemCreate/cuMemMap or stream-ordered pools and never call cudaMalloc, so the shim
# would see nothing: every job with the shim gets the native caching allocator without
# expandable segments (PYTORCH_ALLOC_CONF, and PYTORCH_CUDA_ALLOC_CONF for PyTorch < 2.9),
# from the launcher and from the SPANK plugin alike.
ALLOC_CONF = "backend:native,expandable_segments:False"

# The job's environment besides the TRANSIT_* names: the path lists libtransit.so and the
# adapter's directory go first in (what the job had stays after them), and the allocator's
# settings (ALLOC_CONF in both). preload/inject.py:job_env builds it for `run` and `render`; the
# SPANK plugin sets the same names on the node (TR_JOB_* in the header), so none is spelled twice.
JOB_ENV = {
    "PRELOAD": "LD_PRELOAD",                        # libtransit.so first
    "ADAPTER_PATH": "PYTHONPATH",                   # the adapter's directory first
    "ALLOC_CONF": "PYTORCH_ALLOC_CONF",             # = ALLOC_CONF
    "CUDA_ALLOC_CONF": "PYTORCH_CUDA_ALLOC_CONF",   # = ALLOC_CONF, for PyTorch < 2.9
}
# The SPANK plugin's options (spank/plugin.c registers them; `render` writes #SBATCH lines of
# them where the plugin is installed): what each sets on the node is TR_ENV_<same key>.
PLUGIN_OPTIONS = {"POLICY": "transit", "GPU_BUDGET": "transit-budget", "STATS": "transit-stats"}

SIZE_UNITS = {
    "b": 1,
    "k": 10**3, "kb": 10**3, "kib": 2**10,
    "m": 10**6, "mb": 10**6, "mib": 2**20,
    "g": 10**9, "gb": 10**9, "gib": 2**30,
    "t": 10**12, "tb": 10**12, "tib": 2**40,
    "p": 10**15, "pb": 10**15, "pib": 2**50,  # so that the largest size, 1PiB, can be written
}
SIZE_MAX = 2**50          # 1 PiB: larger than any GPU or node's DRAM, small enough to be exact
# The least GPU budget (run/render/submit --gpu-budget, the SPANK plugin's --transit-budget):
# about what the CUDA context of a training process takes (0.3-0.6 GB with its cuBLAS
# handles), so a smaller GPU emulates none that exists: a typo (70MB for 70GB). Not 1 GiB:
# tiny models are checked at budgets below that (the TorchTitan debug model at 0.82 GB,
# bench/RESULTS.md). The shim itself takes any size (its tests emulate small GPUs).
GPU_BUDGET_MIN = 512 * 2**20
# The most a GPU budget may be where the GPU is not known (the SPANK plugin at submit time;
# the CLI checks against the planned GPU): no GPU has 1 TiB, so more is a typo (999TB for
# 99GB) that the job would learn of only from the shim's warning on its node.
GPU_BUDGET_MAX = 2**40
SIZE_INT_DIGITS = 16      # digits before the point (more is a typo, not a size)
SIZE_FRAC_DIGITS = 6      # digits after it (keeps digits x unit inside 64 bits in C)
SIZE_EXAMPLES = "80GB, 141GiB, 512MiB, 1.5TB, 4096B"

_SIZE_RE = re.compile(r"([0-9]{1,%d})(?:\.([0-9]{1,%d}))?(?: ?([A-Za-z]{1,3}))?" % (SIZE_INT_DIGITS, SIZE_FRAC_DIGITS),
                      re.ASCII)


class SizeError(ValueError):
    """A size that breaks the grammar; the message names the value and the reason."""


def parse_size(text: str) -> int:
    """'80GB' -> 80_000_000_000, exactly as shim/transit_size.h's tr_size_parse."""
    m = _SIZE_RE.fullmatch(text) if isinstance(text, str) else None
    if m is None and isinstance(text, str) and _SIZE_RE.fullmatch(text.removeprefix("-")):
        raise SizeError(f"{text!r} is negative: a size is at least one byte")
    unit = (m.group(3) or "").lower() if m else None
    if unit == "":
        raise SizeError(f"{text!r} has no unit: a size needs one (e.g. {text}GB, {text}GiB, or {text}B for bytes)")
    if unit not in SIZE_UNITS:
        raise SizeError(f"cannot parse {text!r} as a size (examples: {SIZE_EXAMPLES})")
    mult = SIZE_UNITS[unit]
    whole, frac = int(m.group(1)), m.group(2) or ""
    if whole > SIZE_MAX:
        raise SizeError(f"{text!r} is larger than 1 PiB")
    value = whole * mult + (int(frac) * mult // 10 ** len(frac) if frac else 0)
    if value < 1:
        raise SizeError(f"{text!r} must be at least one byte")
    if value > SIZE_MAX:
        raise SizeError(f"{text!r} is larger than 1 PiB")
    return value


# format_size's spellings, largest first; at each magnitude the decimal unit first (what
# users type), so 40 GB comes back as 40GB and 141 GiB as 141GiB.
_FORMAT_UNITS = (("PB", 10**15), ("PiB", 2**50), ("TB", 10**12), ("TiB", 2**40), ("GB", 10**9), ("GiB", 2**30),
                 ("MB", 10**6), ("MiB", 2**20), ("KB", 10**3), ("KiB", 2**10))


def format_size(nbytes: int) -> str:
    """A byte count in the grammar, exactly (parse_size gives nbytes back): the largest
    unit that divides it, else bytes with B. What TRANSIT_GPU_BUDGET is exported as."""
    for unit, mult in _FORMAT_UNITS:
        if nbytes % mult == 0:
            return f"{nbytes // mult}{unit}"
    return f"{nbytes}B"


def c_header() -> str:
    """shim/transit_rules.h, generated from the definitions above."""
    units = ", ".join(f'{{"{u}", {m}ull}}' for u, m in SIZE_UNITS.items())
    lines = [
        "/* Generated by `python3 -m transit_launch.rules > shim/transit_rules.h`: do not edit.",
        " * The one definition lives in transit_launch/rules.py; tests/test_rules.py checks",
        " * that this file matches it. Used by the shim and the SPANK plugin. */",
        "#ifndef TRANSIT_RULES_H",
        "#define TRANSIT_RULES_H",
        "",
        f'#define TR_POLICY_NAMES {{{", ".join(f"{chr(34)}{p}{chr(34)}" for p in POLICIES)}}}',
        f'#define TR_POLICY_LIST "{",".join(POLICIES)}"',
        f"#define TR_N_POLICIES {len(POLICIES)}",
        f'#define TR_LOG_LEVEL_NAMES {{{", ".join(f"{chr(34)}{lv}{chr(34)}" for lv in LOG_LEVELS)}}}',
        f"#define TR_N_LOG_LEVELS {len(LOG_LEVELS)}",
        *(f'#define TR_ENV_{k} "{v}"' for k, v in ENV.items()),
        *(f'#define TR_RETIRED_ENV_{k} "{v}"' for k, v in RETIRED_ENV.items()),
        f'#define TR_ALLOC_CONF "{ALLOC_CONF}"',
        *(f"#define TR_HINT_{k} {v}" for k, v in HINT_KINDS.items()),
        *(f'#define TR_JOB_{k} "{v}"' for k, v in JOB_ENV.items()),
        *(f'#define TR_OPT_{k} "{v}"' for k, v in PLUGIN_OPTIONS.items()),
        "",
        f"#define TR_SIZE_MAX {SIZE_MAX}ull",
        f"#define TR_SIZE_INT_DIGITS {SIZE_INT_DIGITS}",
        f"#define TR_SIZE_FRAC_DIGITS {SIZE_FRAC_DIGITS}",
        f'#define TR_SIZE_EXAMPLES "{SIZE_EXAMPLES}"',
        f"#define TR_GPU_BUDGET_MIN {GPU_BUDGET_MIN}ull",
        f"#define TR_STATE_ROOM_SPARE_PERCENT {STATE_ROOM_SPARE_PERCENT}",
        f"#define TR_STAGE_RING_BYTES {STAGE_RING_BYTES}ull",
        f"#define TR_HUGE_PAGE {HUGE_PAGE_BYTES}ull",
        f'#define TR_GPU_BUDGET_MIN_TEXT "{format_size(GPU_BUDGET_MIN)}"',
        f"#define TR_GPU_BUDGET_MAX {GPU_BUDGET_MAX}ull",
        f'#define TR_GPU_BUDGET_MAX_TEXT "{format_size(GPU_BUDGET_MAX)}"',
        f"#define TR_SIZE_UNITS {{{units}}}",
        "",
        "#endif",
        "",
    ]
    return "\n".join(lines)


# What the adapter reads of the rules (python_module): the names it is written with there.
ADAPTER_RULES = ("ENV", "RETIRED_ENV", "OVERLAP_MODES", "RETIRED_OVERLAP_MODES", "DEFAULT_OVERLAP", "RING_OVERLAP_MODES",
                 "STAGE_RING_BYTES", "HUGE_PAGE_BYTES", "HINT_KINDS")


def api_declarations() -> str:
    """The C API's function declarations as cffi's cdef reads them (no comments, no
    preprocessor lines), from shim/transit_api.h, the C API's one definition."""
    from transit_launch import csrc

    text = re.sub(r"/\*.*?\*/", "", (csrc.shim() / "transit_api.h").read_text(), flags=re.S)
    protos = [" ".join(line.split()) for line in text.splitlines() if re.match(r"^\s*[a-z].*\);\s*$", line)]
    return "\n".join(protos) + "\n"


def python_module() -> str:
    """transit_launch/adapter/transit_rules.py, generated from the definitions above: the
    adapter imports it flat (`import transit_rules`) inside the job, without transit_launch."""
    lines = [
        '"""Generated by `python3 -m transit_launch.rules --python > transit_launch/adapter/transit_rules.py`:',
        "do not edit. The one definition lives in transit_launch/rules.py; tests/test_rules.py checks",
        'that this file matches it. The adapter\'s copy of the rules, as the shim\'s is shim/transit_rules.h."""',
        "",
        *(f"{name} = {pprint.pformat(globals()[name], width=100, sort_dicts=False)}" for name in ADAPTER_RULES),
        "# libtransit.so's C API (shim/transit_api.h), as the adapter's cffi bindings declare it",
        f'API_CDEF = """\n{api_declarations()}"""',
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(python_module() if sys.argv[1:] == ["--python"] else c_header())
