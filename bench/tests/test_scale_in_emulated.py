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
        {"name": name, "rc": rc, "step_s": [9.0, 5.0, *steps]} for name, rc, steps in runs]}))


def test_pairs_only_within_one_call_at_half_the_microbatches(tmp_path):
    record(tmp_path / "d/x_accum4.json", 4, [("ref", 0, [1.0, 1.1, 0.9, 1.0])])
    record(tmp_path / "d/x_accum8.json", 8, [("advise", 0, [2.5, 2.6, 2.4]), ("advise", 1, [1.0, 1.0, 1.0]),
                                             ("advise:STATE_OFF=0.5", 0, [2.0, 2.0, 2.0]), ("ref", 0, [1.9] * 3)])
    record(tmp_path / "d/y_accum4.json", 4, [("ref", 0, [0.5, 0.5, 0.5])])       # another call: no pair
    record(tmp_path / "d/y_accum7.json", 7, [("advise", 0, [3.0, 3.0, 3.0])])    # odd: no half
    record(tmp_path / "e/x_accum8.json", 8, [("advise", 0, [3.0, 3.0, 3.0])])    # its half is in another folder
    record(tmp_path / "d/z_accum2.json", 2, [("ref", 0, [0.6, 0.6, 0.6])], layers=8)
    record(tmp_path / "d/z_accum4.json", 4, [("advise", 0, [1.5, 1.5, 1.5])])   # 16 layers: not the 8-layer ref
    rows = emulated.rows(tmp_path)
    assert [(r["call"], r["global_microbatches"], r["ref_half_s"], r["advise_s"]) for r in rows] == \
        [("d/x_accum.json", 8, 1.0, 2.5)]
    assert rows[0]["ratio"] == pytest.approx(2 * 1.0 / 2.5)


def test_results_md_shows_the_table_as_it_is_now():
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), mock.patch.object(sys, "argv", ["scale_in_emulated.py"]):
        runpy.run_path(str(ROOT / "bench" / "scale_in_emulated.py"), run_name="__main__")
    text = (ROOT / "bench" / "RESULTS.md").read_text()
    section = text.split("\n### N -> N/2 emulated on one GPU", 1)[1].split("\n## ", 1)[0]
    assert buf.getvalue() in re.findall(r"^```\n(.*?)^```", section, re.S | re.M), \
        "RESULTS.md, \"N -> N/2 emulated on one GPU\", is not `python3 bench/scale_in_emulated.py` now: rerun it there"
