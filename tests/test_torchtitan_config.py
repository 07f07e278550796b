"""`plan/render/submit --torchtitan job.toml` (issue 28): the plan reads TorchTitan's own
config and model, and the job runs what the plan assumed.

TorchTitan 0.2.2 with its dependencies (datasets, triton, tensorboard, ...: about 400 MB)
is too large for the [test] extra, so a session fixture installs it into a virtual
environment of its own that sees this interpreter's packages (the transit_launch under
test, and PyTorch); the tests skip, saying so, when there is no PyTorch or pip cannot get
TorchTitan. Its example configs and debug tokenizer are not in the wheel: tests/torchtitan/
holds copies (see its README). Expected values come from TorchTitan (its parameter counts,
its parser, its logs), from the catalog's Hugging Face cards, or from a hand derivation
written in the test.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import NEEDS_TORCH, build_once, run_cli, torch_importable
from tests.forkcli import SERVER
from tests.readme_outputs import README, command
from tests.slurm_lab import failure_excerpt

HERE = Path(__file__).resolve().parent / "torchtitan"
DEBUG = HERE / "debug_model.toml"
LLAMA3_8B = HERE / "llama3_8b.toml"
MISSING = "transit-launch: error: --torchtitan needs TorchTitan installed: pip install torchtitan==0.2.2\n"


# --- without TorchTitan ------------------------------------------------------------------

def test_without_torchtitan_one_line(tmp_path):
    env = {}
    if subprocess.run([sys.executable, "-c", "import torchtitan"], capture_output=True).returncode == 0:
        # this interpreter has TorchTitan: hide it behind a package that is absent the way a
        # missing one is (the message must not depend on how the tests were set up)
        blocker = tmp_path / "blocker" / "torchtitan"
        blocker.mkdir(parents=True)
        (blocker / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'torchtitan'\", "
                                             "name='torchtitan')\n")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(blocker.parent), os.environ.get("PYTHONPATH")]))
    for args in (["plan", "--torchtitan", str(DEBUG)], ["render", "--torchtitan", str(DEBUG)],
                 ["submit", "--torchtitan", str(DEBUG), "--dry-run"]):
        rc, out, err = run_cli(*args, env=env)
        assert (rc, out, err) == (2, "", MISSING), (args, err)


def test_model_or_torchtitan_required(cli):
    rc, out, err = cli("plan")
    assert rc == 2 and err == "transit-launch: error: the following arguments are required: --model (or --torchtitan " \
                              "JOB.toml)\n"


# --- TorchTitan in a venv of its own ----------------------------------------------------------

class Titan:
    """The TorchTitan venv: its python, and a fork server (tests/forkcli.py) that imported
    TorchTitan once, so each CLI run costs milliseconds instead of TorchTitan's import."""

    def __init__(self, venv: Path):
        self.venv, self.python = venv, venv / "bin" / "python"
        prelude = "import torchtitan.config, torchtitan.protocols.train_spec\n"
        self.proc = subprocess.Popen([str(self.python), "-c", prelude + SERVER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=dict(os.environ))

    def cli(self, *argv, cwd=None, env=None, timeout=120, code=None):
        full_env = dict(os.environ, **(env or {}))
        req = {"argv": [str(a) for a in argv], "env": full_env, "cwd": str(cwd or os.getcwd()), "timeout": timeout}
        self.proc.stdin.write(json.dumps(req if code is None else dict(req, code=code)) + "\n")
        self.proc.stdin.flush()
        res = json.loads(self.proc.stdout.readline())
        return res["rc"], res["out"], res["err"]

    def py(self, code: str, *args) -> str:
        """`python -c code args` in the venv: forked from the server, whose TorchTitan and
        PyTorch are imported already (a fresh interpreter took 5-6 s of CPU for them)."""
        rc, out, err = self.cli(*args, timeout=300, code=code)
        assert rc == 0, err[-3000:]
        return out


# triton: torchtitan imports it (its MoE kernels) and declares it not (CUDA builds of torch bring it)
TITAN_PACKAGES = ("torchtitan==0.2.2", "triton")
CACHE_ENV = "TRANSIT_TEST_CACHE"  # where TITAN_PACKAGES stay installed between runs; "off": each run installs them


def _venv(path: Path) -> Path:
    """A venv without pip (ensurepip costs seconds: this interpreter's pip installs into it)
    that sees the system's site-packages (PyTorch); its site-packages directory."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(path)], check=True)
    return Path(subprocess.run([str(path / "bin" / "python"), "-c", "import sysconfig; print(sysconfig."
                                "get_paths()['purelib'])"], capture_output=True, text=True, check=True).stdout.strip())


def _pip_install(venv: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                          "--disable-pip-version-check", *TITAN_PACKAGES], capture_output=True, text=True, timeout=900)
    if res.returncode != 0:
        pytest.skip(f"pip could not install torchtitan==0.2.2: {(res.stderr.strip().splitlines() or ['?'])[-1]}")


def _titan_site() -> Path | None:
    """The site-packages of a venv holding TITAN_PACKAGES, installed once a machine, not once
    a run (issue 52: pip took 25 s of CPU and wrote 1.4 GB every run): under CACHE_ENV
    (default ~/.cache/transit-launch-tests: root's own, never a directory others can write),
    keyed by the base interpreter and the packages, made under a lock (as build_once makes
    a run's builds: a made directory is never changed, one left unfinished is made again);
    None with CACHE_ENV=off. Delete the directory to have it made again."""
    where = os.environ.get(CACHE_ENV, str(Path.home() / ".cache" / "transit-launch-tests"))
    if where == "off":
        return None
    import fcntl
    import hashlib
    key = hashlib.sha256("\0".join([os.path.realpath(getattr(sys, "_base_executable", sys.executable)), sys.version,
                                    *TITAN_PACKAGES]).encode()).hexdigest()[:16]
    root = Path(where)
    root.mkdir(parents=True, exist_ok=True)
    done = root / f"torchtitan-{key}"
    with open(root / f"{done.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (done / ".made").exists():
            shutil.rmtree(done, ignore_errors=True)
            _venv(done)
            _pip_install(done)
            (done / ".made").touch()
    return Path(subprocess.run([str(done / "bin" / "python"), "-c", "import sysconfig; print(sysconfig."
                                "get_paths()['purelib'])"], capture_output=True, text=True, check=True).stdout.strip())


@pytest.fixture(scope="session")
def titan(tmp_path_factory):
    if not torch_importable():
        pytest.skip(NEEDS_TORCH)

    def make(d):  # once a run, whatever the workers (tests/conftest.py: build_once); its mode lets
        venv = d / "venv"  # the lab's job steps run its python
        site = _venv(venv)
        packages = _titan_site()
        # TITAN_PACKAGES (from the machine's cache, or installed here), then this interpreter's
        # packages (the transit_launch under test, jinja2, psutil), then the system's
        first = [f"import site; site.addsitedir({str(packages)!r})"] if packages else []
        (site / "transit_under_test.pth").write_text("\n".join([*first, sysconfig.get_paths()["purelib"]]) + "\n")
        if packages is None:
            _pip_install(venv)
        # torch's torchrun is a console script of the system's Python: one for this venv
        (venv / "bin" / "torchrun").write_text(f"#!{venv / 'bin' / 'python'}\nimport sys\n"
                                               "from torch.distributed.run import main\nsys.exit(main())\n")
        (venv / "bin" / "torchrun").chmod(0o755)

    venv = build_once(tmp_path_factory, "torchtitan", [], [sys.executable, sysconfig.get_paths()["purelib"]],
                      make) / "venv"
    t = Titan(venv)
    yield t
    t.proc.stdin.close()
    t.proc.wait(timeout=60)


# --- the card: TorchTitan's model against its own count and the catalog ------------------------

CARD = r'''
import json, sys
from transit_launch.planning import titan_config
from transit_launch.planning.models import catalog
import copy, torch
from torchtitan.protocols.train_spec import get_train_spec
out = {}
for name, flavor, ref in json.loads(sys.argv[1]):
    card = titan_config.titan_card(name, flavor, None, get_train_spec)
    spec = get_train_spec(name)
    args = copy.deepcopy(spec.model_args[flavor])
    with torch.device("meta"):
        model = spec.model_cls(args)
    titan_count = args.get_nparams_and_flops(model, 8192)[0]  # TorchTitan's own count (what its log prints)
    out[ref] = {"card": card.summary(), "moe": card.moe and vars(card.moe), "titan_count": titan_count,
                "catalog": catalog()[ref].summary(), "catalog_moe": catalog()[ref].moe and vars(catalog()[ref].moe),
                "published": catalog()[ref].published_params}
print(json.dumps(out, default=list))
'''
FLAVORS = [("llama3", "8B", "llama3-8b"), ("llama3", "70B", "llama3-70b"), ("llama3", "405B", "llama3-405b"),
           ("qwen3", "32B", "qwen3-32b"), ("qwen3", "30B-A3B", "qwen3-30b-a3b"), ("llama4", "17bx16e", "llama4-scout")]


def test_card_from_torchtitan_matches_its_count_and_the_hf_catalog(titan):
    got = json.loads(titan.py(CARD, json.dumps(FLAVORS)))
    for ref, g in got.items():
        card, cat = g["card"], g["catalog"]
        assert card["params"] == g["titan_count"], ref        # TorchTitan's get_nparams_and_flops
        assert card["params"] == cat["params"], ref           # the card made from Hugging Face's config.json
        assert abs(card["params"] - g["published"]) / g["published"] < 0.005, ref  # the model's published size
        same = ["hidden", "layers", "heads", "kv_heads", "head_dim", "vocab", "tied_embeddings", "active_params"]
        if "moe" not in card or card["moe"]["moe_layers"] < card["layers"]:
            same.append("ffn")  # (the dense FFN width means nothing when every layer is MoE)
        assert {k: card[k] for k in same} == {k: cat[k] for k in same}, ref
        if g["catalog_moe"]:
            keys = ("experts", "top_k", "expert_ffn", "shared_experts", "shared_ffn")
            assert {k: g["moe"][k] for k in keys} == {k: g["catalog_moe"][k] for k in keys}, ref
            assert card["moe"]["moe_layers"] == cat["moe"]["moe_layers"], ref


# --- the plan reads the config ------------------------------------------------------------

def _toml(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_plan_reads_torchtitans_config(titan, tmp_path):
    # debug_model.toml (tests/torchtitan): llama3 debugmodel, seq_len 2048, local_batch_size 8,
    # global_batch_size unset (-1), selective activation checkpointing; TorchTitan's log of that
    # model says "size: 6,163,712 total parameters"
    rc, out, err = titan.cli("plan", "--torchtitan", DEBUG, "--json")
    assert rc == 0 and err == "", err
    j = json.loads(out)
    assert (j["model"], j["params"], j["global_batch"], j["precision"]) == ("llama3-debugmodel", 6163712, None, "mixed")
    assert {k: j["layout"][k] for k in ("seq_len", "local_batch", "tp", "pp", "ep", "recompute")} == \
        {"seq_len": 2048, "local_batch": 8, "tp": 1, "pp": 1, "ep": 1, "recompute": "none"}
    assert (j["torchtitan"]["model"], j["torchtitan"]["flavor"]) == ("llama3", "debugmodel")
    assert any("selective (2) is planned as none" in n for n in j["torchtitan"]["notes"])
    # every value from a config of our own, and the options override it
    cfg = _toml(tmp_path, "job.toml", '[model]\nname = "llama3"\nflavor = "70B"\n'
                '[training]\nseq_len = 4096\nlocal_batch_size = 2\nglobal_batch_size = 64\ndtype = "bfloat16"\n'
                '[parallelism]\ntensor_parallel_degree = 4\n[activation_checkpoint]\nmode = "full"\n')
    rc, out, err = titan.cli("plan", "--torchtitan", cfg, "--json")
    assert rc == 0, err
    j = json.loads(out)
    assert (j["model"], j["parallel"], j["global_batch"], j["precision"]) == ("llama3-70B", "fsdp+tp", 64, "bf16")
    assert {k: j["layout"][k] for k in ("seq_len", "local_batch", "tp", "recompute")} == \
        {"seq_len": 4096, "local_batch": 2, "tp": 4, "recompute": "full"}
    assert j["torchtitan"]["notes"] == []
    rc, out, err = titan.cli("plan", "--torchtitan", cfg, "--json", "--seq-len", "1024", "--tp", "2",
                             "--recompute", "none", "--precision", "mixed", "--global-batch", "128")
    j = json.loads(out)
    assert (j["global_batch"], j["precision"], j["layout"]["seq_len"], j["layout"]["tp"], j["layout"]["recompute"]) == \
        (128, "mixed", 1024, 2, "none")


PARSE = r'''
import json, sys, logging
logging.disable(logging.CRITICAL)
from torchtitan.config import ConfigManager
out = []
for tail in json.loads(sys.argv[1]):
    c = ConfigManager().parse_args(tail)
    p, t = c.parallelism, c.training
    out.append({"model": [c.model.name, c.model.flavor], "dp_shard": p.data_parallel_shard_degree,
                "tp": p.tensor_parallel_degree, "pp": p.pipeline_parallel_degree, "ep": p.expert_parallel_degree,
                "local_batch": t.local_batch_size, "global_batch": t.global_batch_size, "seq_len": t.seq_len,
                "ac": c.activation_checkpoint.mode, "dtype": t.dtype, "mp": t.mixed_precision_param,
                "steps": t.steps})
print(json.dumps(out))
'''


def _rendered_command(script: str) -> list[str]:
    """The trainer's arguments of a rendered script (after torchrun's `-m torchtitan.train`)."""
    import shlex
    line = next(ln for ln in script.splitlines() if "-m torchtitan.train" in ln)
    words = shlex.split(line)
    return words[words.index("torchtitan.train") + 1:]


# (config, extra options, expected layout): derived by hand from the config, the options and
# the lab-free default of 4 GPUs per node; each planned value differs from its config's in one
# case at least, so an override that is not passed shows
RENDERS = [
    # llama3_8b.toml (seq 8192, local batch 1, selective AC) with options over it: 2 nodes x 4
    # GPUs = dp 4 x tp 2, local batch 2, global batch 16 (2 microsteps)
    ("llama3_8b.toml", ["--nodes", "2", "--tp", "2", "--recompute", "full", "--global-batch", "16", "--seq-len",
                        "4096", "--local-batch", "2"],
     {"model": ["llama3", "8B"], "dp_shard": 4, "tp": 2, "pp": 1, "ep": 1, "local_batch": 2, "global_batch": 16,
      "seq_len": 4096, "ac": "full", "dtype": "float32", "mp": "bfloat16"}),
    # tensor_parallel_degree 4, local batch 2 and bf16 from the config, --pp 2: 4 nodes = 16 GPUs
    # = dp 2 x tp 4 x pp 2; global batch -1 becomes dp x local batch = 4
    ("tp4.toml", ["--nodes", "4", "--pp", "2"],
     {"model": ["llama3", "70B"], "dp_shard": 2, "tp": 4, "pp": 2, "ep": 1, "local_batch": 2, "global_batch": 4,
      "seq_len": 4096, "ac": "full", "dtype": "bfloat16", "mp": "bfloat16"}),
    # qwen3's MoE debug model with pipeline_parallel_degree 2 (and ep 2, which --ep 4 overrides):
    # 2 nodes x 4 GPUs = pp 2 x dp 4, local batch 4 = 4 microbatches, ep 4 over dp x tp = 4
    ("moe.toml", ["--nodes", "2", "--ep", "4", "--precision", "fp32"],
     {"model": ["qwen3", "debugmodel_moe"], "dp_shard": 4, "tp": 1, "pp": 2, "ep": 4, "local_batch": 4,
      "global_batch": 16, "seq_len": 256, "ac": "none", "dtype": "float32", "mp": "float32"}),
]


def test_rendered_overrides_parse_into_the_plans_layout(titan, tmp_path):
    """What TorchTitan's own ConfigManager makes of each rendered command is the layout."""
    _toml(tmp_path, "tp4.toml", '[model]\nname = "llama3"\nflavor = "70B"\n[training]\nseq_len = 4096\n'
          'local_batch_size = 2\ndtype = "bfloat16"\n[parallelism]\ntensor_parallel_degree = 4\n'
          '[activation_checkpoint]\nmode = "full"\n')
    _toml(tmp_path, "moe.toml", '[model]\nname = "qwen3"\nflavor = "debugmodel_moe"\n[training]\nseq_len = 256\n'
          'local_batch_size = 4\n[parallelism]\npipeline_parallel_degree = 2\nexpert_parallel_degree = 2\n'
          '[activation_checkpoint]\nmode = "none"\n')
    tails = []
    for config, extra, want in RENDERS:
        path = LLAMA3_8B if config == "llama3_8b.toml" else tmp_path / config
        rc, script, err = titan.cli("render", "--torchtitan", path, *extra, "--", "python", "-m", "torchtitan.train",
                                    "--training.steps=3")
        assert rc == 0, (config, err)
        tail = _rendered_command(script)
        assert tail[:2] == ["--training.steps=3", f"--job.config_file={path}"]  # the user's own, then the config
        tails.append(tail)
        nodes = int(extra[extra.index("--nodes") + 1])
        assert f"#SBATCH --nodes={nodes}" in script and "--nproc-per-node 4" in script
        assert want["dp_shard"] * want["tp"] * want["pp"] == nodes * 4  # the world torchrun starts
    got = json.loads(titan.py(PARSE, json.dumps(tails)))
    assert got == [dict(want, steps=3) for _, _, want in RENDERS]


def test_plan_text_names_the_overrides(titan):
    rc, out, err = titan.cli("plan", "--torchtitan", DEBUG, "--gpus-per-node", "2", "--seq-len", "64",
                             "--local-batch", "1", "--global-batch", "8")
    assert rc == 0 and err == "", err
    tail = out[out.index("TorchTitan llama3 debugmodel from"):].splitlines()
    assert tail[0] == f"TorchTitan llama3 debugmodel from {DEBUG}; render and submit pass it the layout of the " \
                      "recommended 1 node:"
    # one node of 2 GPUs: dp 2, and the request's values
    # (the config's selective checkpointing is the job's own: no override for it, and a note)
    assert tail[1:10] == ["  --parallelism.data_parallel_shard_degree=2", "  --parallelism.tensor_parallel_degree=1",
                          "  --parallelism.pipeline_parallel_degree=1", "  --parallelism.expert_parallel_degree=1",
                          "  --training.local_batch_size=1", "  --training.global_batch_size=8",
                          "  --training.seq_len=64",
                          "  --training.dtype=float32", "  --training.mixed_precision_param=bfloat16"]
    assert tail[10].startswith("Note: activation_checkpoint.mode selective (2) is planned as none")
    assert "and the job keeps selective" in tail[10]


BAD = [
    (["plan", "--torchtitan", "{d}/nope.toml"], "--torchtitan {d}/nope.toml: no such file"),
    (["plan", "--torchtitan", "{debug}", "--model", "llama3-8b"], "leave out --model"),
    (["plan", "--torchtitan", "{d}/syntax.toml"], "TorchTitan refused it: "),
    (["plan", "--torchtitan", "{d}/unknown.toml"], "TorchTitan refused it: Invalid field names"),
    (["plan", "--torchtitan", "{d}/deepseek.toml"], "the planner models TorchTitan's llama3, qwen3, llama4"),
    (["plan", "--torchtitan", "{d}/flavor.toml"], "model.flavor '9B' is not one of TorchTitan's llama3 flavors: "
                                                  "debugmodel,"),
    (["plan", "--torchtitan", "{d}/hsdp.toml"], "parallelism.data_parallel_replicate_degree = 2: the planner models"),
    (["plan", "--torchtitan", "{d}/cpuoffload.toml"], "training.enable_cpu_offload = true is FSDP's own CPU offload"),
    (["plan", "--torchtitan", "{d}/seqstr.toml"], "training.seq_len must be an integer of at least 1, got 'long'"),
    (["plan", "--torchtitan", "{d}/flex.toml"], "uses attn_type 'flex'"),
    # TorchTitan's parser takes any activation_checkpoint.mode; its apply_ac refuses on the nodes
    (["plan", "--torchtitan", "{d}/acmode.toml"],
     "activation_checkpoint.mode 'partial' is not one of TorchTitan's: selective, full, memory_budget, none"),
    (["plan", "--torchtitan", "{d}/acopt.toml"], "selective_ac_option 'every': TorchTitan takes 'op' or a positive"),
    (["plan", "--torchtitan", "{d}/acbudget.toml"], "memory_budget needs the model compiled"),
    (["render", "--torchtitan", "{debug}", "--", "python", "-m", "torchtitan.train", "--training.seq-len=64"],
     "the command sets --training.seq_len, which the plan reads from"),
    (["render", "--torchtitan", "{debug}", "--", "python", "-m", "torchtitan.train", "--job.config_file", "x.toml"],
     "the command sets --job.config_file"),
    (["render", "--torchtitan", "{debug}", "--nodes", "1", "--on-node-loss", "scale-in"],
     "--on-node-loss scale-in does not work with --torchtitan yet"),
    (["render", "--torchtitan", "{debug}", "--nodes", "3", "--global-batch", "64"],
     "--torchtitan: 3 nodes cannot run this job: dp x local batch does not divide the global batch"),
]
CONFIGS = {"syntax.toml": "[training\n", "unknown.toml": "[training]\nseq_lenx = 4\n",
           "deepseek.toml": '[model]\nname = "deepseek_v3"\nflavor = "16B"\n',
           "flavor.toml": '[model]\nname = "llama3"\nflavor = "9B"\n',
           "hsdp.toml": "[parallelism]\ndata_parallel_replicate_degree = 2\n",
           "cpuoffload.toml": "[training]\nenable_cpu_offload = true\n",
           "seqstr.toml": '[training]\nseq_len = "long"\n',
           "flex.toml": '[model]\nname = "llama3"\nflavor = "debugmodel_flex_attn"\n',
           "acmode.toml": '[activation_checkpoint]\nmode = "partial"\n',
           "acopt.toml": '[activation_checkpoint]\nmode = "selective"\nselective_ac_option = "every"\n',
           "acbudget.toml": '[activation_checkpoint]\nmode = "memory_budget"\n'}


@pytest.mark.parametrize("args,needle", BAD, ids=[" ".join(a)[:50] for a, _ in BAD])
def test_bad_torchtitan_input_one_line(titan, tmp_path, args, needle):
    for name, text in CONFIGS.items():
        _toml(tmp_path, name, text)
    fill = {"{d}": str(tmp_path), "{debug}": str(DEBUG)}
    for k, v in fill.items():
        args, needle = [a.replace(k, v) for a in args], needle.replace(k, v)
    rc, out, err = titan.cli(*args, cwd=tmp_path)
    assert rc == 2 and out == "" and err.count("\n") == 1 and err.startswith("transit-launch: error: "), err
    assert needle in err, err


# --- docs/plan.md's example ---------------------------------------------------------------------

PLAN_DOC = README.parent / "docs" / "plan.md"


def test_docs_show_plan_of_torchtitans_llama3_8b(titan, tmp_path):
    """docs/plan.md's `plan --torchtitan` block (marked recorded for tests/test_readme.py, which
    runs without TorchTitan) is what the CLI prints for TorchTitan's own llama3_8b.toml, at the
    path it has in a TorchTitan checkout."""
    text = PLAN_DOC.read_text()
    m = re.search(r"<!-- recorded: [^>]*test_torchtitan_config[^>]* -->\n```\n(\$ transit-launch [^\n]*\n)(.*?)```",
                  text, re.S)
    assert m, "docs/plan.md lacks the plan --torchtitan block"
    args = command(m.group(1))
    assert args[:2] == ["plan", "--torchtitan"] and args[2].endswith("llama3/train_configs/llama3_8b.toml")
    (tmp_path / args[2]).parent.mkdir(parents=True)
    shutil.copy(LLAMA3_8B, tmp_path / args[2])
    rc, out, err = titan.cli(*args, cwd=tmp_path)
    assert rc == 0 and err == "", err
    if out != m.group(2) and os.environ.get("TRANSIT_UPDATE_GOLDEN") == "1":  # as conftest.check_golden does
        PLAN_DOC.write_text(text[:m.start(2)] + out + text[m.end(2):])
        pytest.fail("rewrote docs/plan.md's plan --torchtitan block: review the diff, then run again without "
                    "TRANSIT_UPDATE_GOLDEN")
    assert out == m.group(2), "docs/plan.md's plan --torchtitan block is stale: TRANSIT_UPDATE_GOLDEN=1 rewrites it"


# --- the rendered job on the lab cluster -------------------------------------------------------

def _mesh(log: str, ranks: int) -> str:
    """The layout TorchTitan logs, the same on each of `ranks` ranks (the world it ran)."""
    m = re.findall(r"Building device mesh with parallelism: (.*)", log)
    assert len(m) == ranks and len(set(m)) == 1, log[-3000:]
    return m[0]


def _assets(tmp_path) -> Path:
    """A working directory with the debug config's assets: its tokenizer and the c4_test
    dataset's path (64 rows of words in the tokenizer)."""
    work = tmp_path / "work"
    (work / "tests" / "assets").mkdir(parents=True)
    os.chmod(tmp_path, 0o755)
    shutil.copytree(HERE / "tokenizer", work / "tests" / "assets" / "tokenizer")  # the config's hf_assets_path
    c4 = work / "tests" / "assets" / "c4_test"
    c4.mkdir()
    words = "the of and to in a is that for it as was with be by on not he this are or his from at".split()
    c4.joinpath("data.json").write_text("".join(json.dumps({"text": " ".join(words[(i + j) % len(words)]
                                                                             for j in range(150))}) + "\n"
                                                for i in range(64)))
    return work


# One rank of TorchTitan's own trainer (torchtitan.train.main, unchanged), with the adapter's
# hooks installed as sitecustomize installs them under the shim ("default": advise's streamed
# step, on a stand-in for the shim's API that calls every state pinned; the CPU stands in for
# the GPU, a state's own memory its home) or without them ("plain"). It records every
# microbatch's loss and every step's gradient norm before clipping, exactly (floats as JSON).
TITAN_RANK = r"""
import json, os, sys
mode, standin, out = sys.argv[1:4]
sys.argv = ["torchtitan.train", *sys.argv[4:]]
hooks = None
if mode != "plain":
    sys.path.insert(0, os.path.dirname(standin))
    from transit_launch.preload import inject
    hooks = __import__("adapter_standin").install(str(inject.adapter_dir()), mode)
import torchtitan.train as tt
from torchtitan.distributed import utils as du
losses, norms = [], []
fb, clip = tt.Trainer.forward_backward_step, du.clip_grad_norm_
def forward_backward_step(self, *a, **k):
    loss = fb(self, *a, **k)
    losses.append(float(loss.detach()))
    return loss
def clip_grad_norm_(*a, **k):
    norm = clip(*a, **k)
    norms.append(float(norm))
    return norm
tt.Trainer.forward_backward_step, du.clip_grad_norm_ = forward_backward_step, clip_grad_norm_
tt.main(tt.Trainer)
ov = hooks.overlap if hooks else None
ov = getattr(ov, "host", ov)  # the split (host): its host step's stats
with open(os.path.join(out, f"{mode}-{os.environ['RANK']}.json"), "w") as f:
    json.dump({"losses": losses, "norms": norms, "streamed": getattr(ov, "streamed", 0),
               "stats": getattr(ov, "stats", {}), "said": [str(v) for v in getattr(ov, "said", {}).values()]}, f)
"""


_RUNS: dict = {}  # (mode, steps): its records; the plain run once a worker, for both tests below


def _titan_runs(titan, tmp_path, modes, steps=4):
    """TorchTitan's debug model, FSDP2 on two gloo ranks, 2 microbatches a step, clipping at
    0.05 (it binds), seeded and deterministic, in each mode: each rank's record (TITAN_RANK).
    The plain run (no adapter, the reference) is made once and kept (about 30 s of CPU)."""
    work = _assets(tmp_path)
    driver = tmp_path / "titan_rank.py"
    driver.write_text(TITAN_RANK)
    args = ["--job.config_file", str(DEBUG), f"--training.steps={steps}", "--training.max_norm=0.05",
            "--training.local_batch_size=1", "--training.global_batch_size=4", "--training.seq_len=64",
            "--comm.init_timeout_seconds=120", "--metrics.log_freq=1", "--debug.seed=7", "--debug.deterministic"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(HERE / "cpu_standin"), os.environ.get("PYTHONPATH")])))
    got = {}
    for mode in modes:
        if mode == "plain" and (mode, steps) in _RUNS:
            got[mode] = _RUNS[mode, steps]
            continue
        res = subprocess.run([str(titan.venv / "bin" / "torchrun"), "--standalone", "--nproc-per-node", "2",
                              str(driver), mode, str(Path(__file__).with_name("adapter_standin.py")),
                              str(tmp_path), *args],
                             capture_output=True, text=True, timeout=600, cwd=work, env=env)
        assert res.returncode == 0, res.stderr[-4000:]
        got[mode] = [json.loads((tmp_path / f"{mode}-{r}.json").read_text()) for r in (0, 1)]
        _RUNS[mode, steps] = got[mode]
    plain = got["plain"]
    assert [len(r["losses"]) for r in plain] == [2 * steps] * 2 and len(plain[0]["norms"]) == steps
    assert all(n > 0.05 for n in plain[0]["norms"])  # the clipping binds at every step
    return got


def test_the_default_streamed_step_under_torchtitans_trainer_is_bit_identical(titan, tmp_path):
    """Issue 27's CPU check: TorchTitan 0.2.2's trainer unchanged (its debug model, FSDP2 on two
    gloo ranks, its OptimizersContainer, 2 microbatches a step, its clipping, here at 0.05 so
    that it binds) under advise's default step: every sharded parameter of the container's
    AdamW streamed from the first step on (its state made unfilled, started from zeros in the ring),
    nothing refused, and every microbatch's loss and
    every gradient norm equal to the run without the adapter (both seeded, deterministic), bit
    for bit."""
    steps = 5
    got = _titan_runs(titan, tmp_path, ("plain", "default"), steps)
    plain, default = got["plain"], got["default"]
    for p, d in zip(plain, default):
        assert d["losses"] == p["losses"] and d["norms"] == p["norms"]
    streamed = [r["streamed"] for r in default]
    assert streamed[0] == streamed[1] > 0 and streamed[0] % steps == 0, default
    assert all(r["said"] == [] for r in default), default  # nothing refused


def test_the_host_step_under_torchtitans_trainer_is_bit_identical(titan, tmp_path):
    """Issue 50's CPU check: the same trainer with TRANSIT_OVERLAP_STEP=host and a budget that
    holds no state: every sharded parameter's update runs on the host path's worker (torch's
    fused CPU AdamW on host copies, the clip's coefficient applied to the copied gradients),
    and every loss and gradient norm equals the run without the adapter, bit for bit (a step
    with the unclipped gradients, or a forward that read a parameter before its update, would
    change the next losses)."""
    steps = 5
    got = _titan_runs(titan, tmp_path, ("plain", "host"), steps)
    for p, h in zip(got["plain"], got["host"]):
        assert h["losses"] == p["losses"] and h["norms"] == p["norms"]
    for r in got["host"]:
        st = r["stats"]
        assert st["steps"] == steps and st["host_params"] > 0 and st["resident_params"] == 0, st
        assert st["share"] == 1.0 and st["stream_params"] == 0, st  # the split without a GPU: all on the host
        # from the second step each gradient copied at its final hook is used, scaled by the clip
        assert st["clipped"] == (steps - 1) * st["host_params"], st
        assert r["said"] == [], r


def test_lab_job_runs_the_layout_the_plan_chose(titan, lab, tmp_path):
    """submit --torchtitan (the plan's node count, and --nodes 2) runs TorchTitan's debug model
    unchanged on the lab cluster, on CPU with gloo (tests/torchtitan/cpu_standin: TorchTitan
    0.2.2 insists on a CUDA device); the layout TorchTitan logs is the plan's."""
    work = _assets(tmp_path)
    env = dict(lab.env, PATH=f"{titan.venv / 'bin'}{os.pathsep}{os.environ['PATH']}", PYTHONUNBUFFERED="1",
               LOGLEVEL="INFO",  # torchrun's agents log their rendezvous and exit barrier (issue 52)
               PYTHONPATH=os.pathsep.join(filter(None, [str(HERE / "cpu_standin"), os.environ.get("PYTHONPATH")])))
    req = ["--torchtitan", DEBUG, "--gpus-per-node", "2", "--seq-len", "64", "--local-batch", "1",
           "--global-batch", "8"]
    rc, out, err = titan.cli("plan", *req, "--json", cwd=work, env=env)
    assert rc == 0, err
    plan = json.loads(out)
    rec = next(o for o in plan["options"] if o["recommended"])
    train = ["--", "python", "-m", "torchtitan.train", "--training.steps=2", "--comm.init_timeout_seconds=120"]
    jobs = {}
    # rendezvous ports of the lab's own block: a fixed one clashed with another run's lab job
    for name, extra in (("auto", ["--nodes", "auto", "--port", str(lab.job_ports(1))]),
                        ("two", ["--nodes", "2", "--recompute", "full", "--port", str(lab.job_ports(1))])):
        rc, out, err = titan.cli("submit", *req, *extra, "--job-name", f"titan-{name}", "--output",
                                 str(work / f"{name}-%j.out"), *train, cwd=work, env=env)
        assert rc == 0, err
        jobs[name] = out.split()[2]
    logs = {}
    for name, job in jobs.items():
        info = lab.wait_job(job, timeout=400)
        out = work / f"{name}-{job}.out"
        logs[name] = out.read_text(errors="replace")
        assert info["JobState"] == "COMPLETED", failure_excerpt(logs[name], path=out)
        assert "Training completed" in logs[name] and "Building llama3 debugmodel" in logs[name]
    # auto: the plan's recommendation, 1 node of 2 GPUs: dp 2, global batch 8 = 4 microsteps,
    # the config's selective activation checkpointing, planned as none (an upper bound) and kept
    lay = rec["layout"]
    assert (rec["nodes"], lay["dp"], lay["recompute"]) == (1, 2, "none")
    assert _mesh(logs["auto"], 2) == f"pp={lay['pp']}, dp_replicate=1, dp_shard={lay['dp']}, cp=1, tp={lay['tp']}, " \
                                  f"ep={lay['ep']}, etp=1"
    assert f"Trainer is initialized with local batch size {lay['local_batch']}, global batch size 8, gradient " \
           f"accumulation steps 4, sequence length {lay['seq_len']}," in logs["auto"]
    assert "Applied selective activation checkpointing to the model" in logs["auto"]
    # --nodes 2: 4 GPUs, dp 4, 2 microsteps, full recomputation
    assert _mesh(logs["two"], 4) == "pp=1, dp_replicate=1, dp_shard=4, cp=1, tp=1, ep=1, etp=1"
    assert "Trainer is initialized with local batch size 1, global batch size 8, gradient accumulation steps 2, " \
           "sequence length 64," in logs["two"]
    assert "Applied full activation checkpointing to the model" in logs["two"]
    assert "Mixed precision training is handled by fully_shard" in logs["two"]
