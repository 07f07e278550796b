"""bench/scale_in_emulated.py: N -> N/2 emulated on one GPU from titan_steps records. Pairs come
only from one call (records whose names differ only in their accum number), no offloading at
B/2 against the default at B, failed runs left out; RESULTS.md shows its output on today's records."""

import contextlib
import io
import json
import re
import runpy
import sys
from unittest import mock

import pytest

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import scale_in_emulated as emulated  # noqa: E402


def record(path, accum, runs, model="llama3-8b", layers=16):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"model": model, "layers": layers, "accum": accum, "runs": [
        {"name": name, "rc": rc, "step_s": [9.0, 5.0, *steps], "optimizer_s": [3.0, 1.0, *opt]}
        for name, rc, steps, opt in runs]}))


def harness_call(folder, gpus):
    """A harness run's folder: its manifest, and the GPU each accum step ran on."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "run.json").write_text("{}")
    (folder / "steps.json").write_text(json.dumps([{"step": f"accum{a}", "gpu": g} for a, g in gpus.items()]))


def test_pairs_only_within_one_call_one_after_the_other(tmp_path, monkeypatch):
    harness_call(tmp_path / "d", {4: 0, 8: 0, 2: 0})
    record(tmp_path / "d/t_accum4.json", 4, [("ref", 0, [1.0, 1.1, 0.9, 1.0], [0.2, 0.2, 0.2, 0.2])])
    record(tmp_path / "d/t_accum8.json", 8, [("advise", 0, [2.5, 2.6, 2.4], [0.5] * 3),
                                             ("advise", 1, [1.0, 1.0, 1.0], [0.5] * 3),          # failed
                                             ("advise:STATE_OFF=0.5", 0, [2.0] * 3, [0.5] * 3),  # a variant
                                             ("ref", 0, [1.9] * 3, [0.1] * 3)])
    record(tmp_path / "d/t_accum2.json", 2, [("ref", 0, [0.6] * 3, [0.1] * 3)], layers=8)  # another depth
    harness_call(tmp_path / "lanes", {4: 1, 8: 0})  # side by side on two GPUs
    record(tmp_path / "lanes/t_accum4.json", 4, [("ref", 0, [1.0] * 3, [0.2] * 3)])
    record(tmp_path / "lanes/t_accum8.json", 8, [("advise", 0, [2.5] * 3, [0.5] * 3)])
    record(tmp_path / "dated/t_accum4.json", 4, [("ref", 0, [1.0] * 3, [0.2] * 3)])  # no manifest: calls unknown
    record(tmp_path / "dated/t_accum8.json", 8, [("advise", 0, [2.5] * 3, [0.5] * 3)])
    monkeypatch.setattr(emulated, "BY_HAND", {"hand": ("x_", "y_")})
    record(tmp_path / "hand/x_accum1.json", 1, [("ref", 0, [0.5] * 3, [0.04] * 3)])
    record(tmp_path / "hand/x_accum2.json", 2, [("advise", 0, [1.6] * 3, [0.3] * 3)])
    record(tmp_path / "hand/y_accum2.json", 2, [("advise", 0, [1.0] * 3, [0.3] * 3)])  # y_ ran no ref at 1
    record(tmp_path / "hand/z_accum1.json", 1, [("ref", 0, [0.5] * 3, [0.04] * 3)])    # z_ is no call named
    rows = emulated.rows(tmp_path)
    assert [(r["call"], r["global_microbatches"], r["ref_half_s"], r["advise_s"]) for r in rows] == \
        [("d", 8, 1.0, 2.5), ("hand/x_", 2, 0.5, 1.6)]
    # a rank of the 2-GPU layout steps half the state: half the reference's optimizer step off
    assert rows[0]["ratio"] == pytest.approx(2 * (1.0 - 0.2 / 2) / 2.5)
    assert rows[1]["ratio"] == pytest.approx(2 * (0.5 - 0.04 / 2) / 1.6)


def test_results_md_shows_the_table_as_it_is_now():
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), mock.patch.object(sys, "argv", ["scale_in_emulated.py"]):
        runpy.run_path(str(ROOT / "bench" / "scale_in_emulated.py"), run_name="__main__")
    text = (ROOT / "bench" / "RESULTS.md").read_text()
    section = text.split("\n### N -> N/2 emulated on one GPU", 1)[1].split("\n## ", 1)[0]
    assert buf.getvalue() in re.findall(r"^```\n(.*?)^```", section, re.S | re.M), \
        "RESULTS.md, \"N -> N/2 emulated on one GPU\", is not `python3 bench/scale_in_emulated.py` now: rerun it there"
