"""examples/train_llama.py's --clip and --tie-embeddings on CPU (what bench's "shapes" suite
runs on a GPU): the total norm is printed per step and the clip acts on the update, a tied
matrix is one parameter (counted once, still the output projection's FLOPs), FSDP2 keeps the
pair in its root unit, and the engine clipping cannot reach is refused in one argparse error."""

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import NEEDS_TORCH, NO_TORCH, ROOT, build_once

TRAINER = ROOT / "examples" / "train_llama.py"
DIM, VOCAB = 64, 256
MODEL = ["--device", "cpu", "--dim", str(DIM), "--layers", "2", "--heads", "4", "--kv-heads", "2", "--ffn", "128",
         "--vocab", str(VOCAB), "--seq-len", "32", "--batch", "2", "--steps", "3"]
pytestmark = pytest.mark.skipif(NO_TORCH, reason=NEEDS_TORCH)
# MODEL's parameters by hand: per block two norms, wq and wo (64 x 64), wk and wv (64 x 2 heads
# of 16), w1, w3, w2 (64 x 128); the final norm; one 256 x 64 matrix tied, two untied
BLOCK = 2 * 64 + 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128
TIED = 2 * BLOCK + 64 + VOCAB * DIM


def _stdout(*flags, ranks=1) -> str:
    run = [sys.executable, "-m", "torch.distributed.run"]  # torchrun, whether or not its script is on PATH
    cmd = [*run, "--standalone", "--nproc-per-node", str(ranks), str(TRAINER)] if ranks > 1 else \
        [sys.executable, str(TRAINER)]
    # one intra-op thread, as torchrun gives each of several ranks: a tiny model's steps on two
    # threads of a busy 2-core machine took 100x longer (threads waiting on each other)
    res = subprocess.run([*cmd, *MODEL, *flags], capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


def _parsed(stdout: str):
    recs = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return [r for r in recs if "step" in r], next(r["summary"] for r in recs if "summary" in r)


def train(*flags, ranks=1):
    """(per-step records, summary) of a CPU run."""
    return _parsed(_stdout(*flags, ranks=ranks))


@pytest.fixture
def plain(tmp_path_factory):
    """train() without flags, run once a run for the two tests that read it, whichever xdist
    workers take them (conftest's build_once; the runs are seeded and deterministic)."""
    d = build_once(tmp_path_factory, "trainer-plain", [TRAINER], MODEL,
                   lambda out: (out / "stdout").write_text(_stdout()))
    return _parsed((d / "stdout").read_text())


def test_clip_prints_the_norm_and_acts_on_the_update(plain):
    plain, _ = plain
    assert all("grad_norm" not in r for r in plain)  # without --clip the records are as before
    clipped, summ = train("--clip", "0.5")
    assert summ["clip"] == 0.5
    norms = [r["grad_norm"] for r in clipped]
    assert len(norms) == 3 and all(isinstance(n, float) and n > 0 for n in norms)
    assert min(norms) > 0.5  # this model's norms: the clip at 0.5 rescales every step
    tiny, _ = train("--clip", "1e-4")
    losses = [[r["loss"] for r in run] for run in (plain, clipped, tiny)]
    # the first loss is before any update; then a tiny max norm gives a tiny update
    assert losses[0][0] == losses[1][0] == losses[2][0]
    assert losses[2][1:] != losses[0][1:] and losses[2][1:] != losses[1][1:]
    assert [r["grad_norm"] for r in tiny][0] == pytest.approx(norms[0], rel=1e-6)  # the norm before clipping


def test_tied_embeddings_are_one_parameter(plain):
    _, untied = plain
    _, tied = train("--tie-embeddings")
    assert (untied["tied_embeddings"], tied["tied_embeddings"]) == (False, True)
    assert untied["params"] - tied["params"] == VOCAB * DIM and tied["params"] == TIED
    # the embedding's lookup is no matmul: untied its matrix is left out of the FLOPs, tied the
    # shared matrix is the output projection's, so the model FLOPs are the same
    assert tied["flop_params"] == untied["flop_params"] == tied["params"]
    assert tied["grad_bytes"] == 4 * tied["params"]


def test_fsdp2_keeps_the_tied_pair_in_its_root_unit_and_clips_dtensors():
    """The trainer's FSDP2 setup (a unit per block, the root holding the embedding and the
    output) on one gloo rank: one sharded parameter under both names, clipped as a DTensor."""
    driver = f"""
import sys, importlib.util, torch
spec = importlib.util.spec_from_file_location("train_llama", {str(TRAINER)!r})
t = importlib.util.module_from_spec(spec); spec.loader.exec_module(t)
sys.argv = ["train_llama.py", *{MODEL!r}, "--tie-embeddings", "--dp", "fsdp"]
a = t.parse()
t.init_dist("cpu")
m, opt = t.build_fsdp(a, t.Llama(a), "cpu", 1)
assert m.tok.weight is m.out.weight and type(m.tok.weight).__name__ == "DTensor"
assert sum(1 for _ in m.parameters()) == 1 + 2 * 9 + 1  # the pair, 9 per block, the final norm
x = torch.randint(0, {VOCAB}, (2, 33))
torch.nn.functional.cross_entropy(m(x[:, :-1]).float().view(-1, {VOCAB}), x[:, 1:].reshape(-1)).backward()
n = torch.nn.utils.clip_grad_norm_(m.parameters(), 1e-3)
assert float(n.full_tensor()) > 1e-3
after = torch.cat([p.grad.full_tensor().flatten() for p in m.parameters()]).norm()
assert abs(float(after) - 1e-3) < 1e-5, float(after)
opt.step()
assert m.tok.weight is m.out.weight
print("ok")
"""
    res = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-2000:]


def test_fsdp2_tied_and_clipped_runs_like_ddp():
    """Same data, same clip: FSDP2 (bf16 compute) within bf16's reach of DDP (fp32)."""
    ddp, _ = train("--clip", "0.5", "--tie-embeddings", "--dp", "ddp")
    fsdp, summ = train("--clip", "0.5", "--tie-embeddings", "--dp", "fsdp", "--accum", "2")
    assert summ["dp"] == "fsdp" and all(r["grad_norm"] > 0 for r in fsdp)
    fsdp1, _ = train("--clip", "0.5", "--tie-embeddings", "--dp", "fsdp")
    assert fsdp1[0]["grad_norm"] == pytest.approx(ddp[0]["grad_norm"], rel=2e-2)
    assert fsdp1[0]["loss"] == pytest.approx(ddp[0]["loss"], rel=1e-2)


@pytest.mark.parametrize("dp", ["fsdp", "ddp"])
def test_two_ranks_tied_and_clipped(dp):
    recs, summ = train("--clip", "0.5", "--tie-embeddings", "--dp", dp, ranks=2)
    assert (summ["world"], summ["dp"]) == (2, dp) and summ["params"] == TIED
    assert len(recs) == 3 and all(r["grad_norm"] > 0 for r in recs)


@pytest.mark.parametrize("flags, says", [
    (["--clip", "1", "--engine", "torchao-offload"], "--clip does not apply to --engine torchao-offload"),
    (["--clip", "-1"], "--clip takes a norm > 0 (0: off), got -1.0"),
])
def test_clip_refusals_are_one_argparse_error(flags, says):
    res = subprocess.run([sys.executable, str(TRAINER), *MODEL, *flags], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert res.returncode == 2 and res.stdout == ""
    errors = [line for line in res.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and says in errors[0], res.stderr


def test_deepspeed_clips_through_its_config(monkeypatch):
    import importlib.util
    spec = importlib.util.spec_from_file_location("train_llama", TRAINER)
    trainer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(trainer)
    for flags, clip in [([], 0.0), (["--clip", "1.0"], 1.0)]:
        monkeypatch.setattr(sys, "argv", ["train_llama.py", "--engine", "deepspeed", *flags])
        assert trainer.deepspeed_config(trainer.parse())["gradient_clipping"] == clip
