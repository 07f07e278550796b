"""bench/RESULTS.md's generated tables are what bench/report.py makes from today's result files,
and a changed number in a result file changes them."""

import json
import re
import shutil

import pytest

from bench import report


def test_the_checked_in_tables_are_current(capsys):
    assert report.main(["--check"]) == 0, capsys.readouterr().out


def test_every_block_is_marked_once_in_results_md():
    names = [m.group("name") for m in report.MARK.finditer(report.DOC.read_text())]
    assert sorted(names) == sorted(report.BLOCKS)


# the section of bench/RESULTS.md each block is the table of (the start of its heading)
SECTIONS = {"prediction": "What the plan predicts", "scale-in-emulated": "N -> N/2 emulated on one GPU",
            "host-step": "The host update path", "second-process": "What a second process can allocate beside",
            "policies": "Policies under a budget", "gate": "The gate: transit against the peers",
            "rho": "rho of layouts", "sim-speed": "Planner latency and simulator speed"}


def test_every_block_sits_in_its_section():
    """A block moved under another heading would still be current: its section is checked too."""
    text = report.DOC.read_text()
    under = {m.group("name"): re.findall(r"^#+ (.*)$", text[:m.start()], re.M)[-1] for m in report.MARK.finditer(text)}
    assert sorted(SECTIONS) == sorted(report.BLOCKS)
    assert {n: h for n, h in under.items() if not h.startswith(SECTIONS[n])} == {}


def _copy(tmp_path, rel):
    dst = tmp_path / rel
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(report.RESULTS / rel, dst)
    return dst


def test_a_changed_number_in_a_result_file_changes_the_table(tmp_path):
    path = _copy(tmp_path, report.SECOND_PROCESS)
    assert report.second_process(tmp_path) == report.second_process()
    d = json.loads(path.read_text())
    d["second_process"]["allocated_bytes"] -= 10**9  # a gigabyte less taken: the job held one more
    path.write_text(json.dumps(d))
    out = report.second_process(tmp_path)
    assert "132.68 GB" in out and "**13.69 GB**" in out and "133.68 GB" not in out


@pytest.mark.parametrize("rel,block", [(report.POLICIES, report.policies), (report.HOST_STEP[0], report.host_step)])
def test_a_changed_step_time_changes_the_table(tmp_path, rel, block):
    for other in report.HOST_STEP[1:] if block is report.host_step else ():
        _copy(tmp_path, other)
    path = _copy(tmp_path, rel)
    before = block(tmp_path)
    assert before == block()
    text = path.read_text()
    if rel.endswith(".jsonl"):
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        rows[1]["tflops"] = 130.5  # "off" at half the reference's
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        assert "| off | off | - | 130.50 | 49.98 |" in block(tmp_path)
    else:
        rows = json.loads(text)
        assert rows[0]["run"] == "reference" and rows[1]["run"] != "reference"
        half = rows[0]["summary"]["tflops"] / 2
        rows[1]["summary"]["tflops"] = half  # the next run at half its reference's
        path.write_text(json.dumps(rows))
        assert f" {half:5.1f}    50.0% " in block(tmp_path)
    assert block(tmp_path) != before


def _runs(path, change):
    """Rewrite the result file at `path` with `change(run)` applied to each of its runs."""
    d = json.loads(path.read_text())
    for r in d["runs"]:
        change(r)
    path.write_text(json.dumps(d))


def test_a_changed_run_of_the_gate_changes_its_cell(tmp_path):
    """The cell is the record's % of its own file's reference, its budget check and its cut."""
    for rel in report.GATE:
        _copy(tmp_path, rel)
    before = report.gate(tmp_path)
    assert before == report.gate()
    assert "| transit staged (retired) | 88.4 | 94.3 | 97.1 |" in before
    assert "| torchao CPUOffloadOptimizer | 70.3 | 84.6 (over) | 91.1 (over) |" in before
    staged = tmp_path / "2026-11-30/offload_ring3_ac12_2026-11-30.json"  # the staged step's last run at 12
    ref = next(r["tflops"] for r in json.loads(staged.read_text())["runs"] if r["name"] == "reference")
    # the staged step at 12 microbatches at half its file's reference; torchao there within the budget
    _runs(staged, lambda r: r.update(tflops=ref / 2) if r["name"] == "advise-staged256" else None)
    _runs(tmp_path / "2026-11-30/offload_overlap_ac_accum12_2026-11-30.json",
          lambda r: r.update(max_reserved_gb=19.0) if r["name"] == "torchao-offload" else None)
    after = report.gate(tmp_path)
    assert "| transit staged (retired) | 88.4 | 94.3 | 50.0 |" in after
    assert "| torchao CPUOffloadOptimizer | 70.3 | 84.6 (over) | 91.1 |" in after


def test_a_changed_throughput_changes_the_rho_table(tmp_path):
    path = _copy(tmp_path, report.RHO)
    assert report.rho(tmp_path) == report.rho()
    d = json.loads(path.read_text())
    one = d["layouts"][1]["sweep"]
    one["bandwidths"][1]["throughput_median"] = one["runs"][1]["throughput"] = 17755.8  # half at 10gbit
    d["layouts"][1]["rho"] = 2.0
    path.write_text(json.dumps(d))
    assert "| 1 GPU, advise | 1 | 35,512 | 17,756 | **2.00** | 0 |" in report.rho(tmp_path)


def test_a_stale_table_fails_the_check_and_write_mends_it(tmp_path, monkeypatch, capsys):
    doc = tmp_path / "RESULTS.md"
    text = report.DOC.read_text()
    doc.write_text(text.replace("| 0.7064 |", "| 0.7065 |", 1))
    monkeypatch.setattr(report, "DOC", doc)
    assert report.main(["--check"]) == 1 and "stale blocks policies" in capsys.readouterr().out
    assert report.main(["--write"]) == 0 and doc.read_text() == text
