"""bench/RESULTS.md's generated tables are what bench/report.py makes from today's result files,
and a changed number in a result file changes them."""

import json
import shutil

import pytest

from bench import report


def test_the_checked_in_tables_are_current(capsys):
    assert report.main(["--check"]) == 0, capsys.readouterr().out


def test_every_block_is_marked_once_in_results_md():
    names = [m.group("name") for m in report.MARK.finditer(report.DOC.read_text())]
    assert sorted(names) == sorted(report.BLOCKS)


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


@pytest.mark.parametrize("rel,block", [(report.POLICIES, report.policies), (report.HOST_STEP, report.host_step)])
def test_a_changed_step_time_changes_the_table(tmp_path, rel, block):
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
        rows[1]["summary"]["tflops"] = 311.7  # the stream at half the reference's 623.4
        path.write_text(json.dumps(rows))
        assert " 311.7    50.0% " in block(tmp_path)
    assert block(tmp_path) != before


def test_a_stale_table_fails_the_check_and_write_mends_it(tmp_path, monkeypatch, capsys):
    doc = tmp_path / "RESULTS.md"
    text = report.DOC.read_text()
    doc.write_text(text.replace("| 0.7064 |", "| 0.7065 |", 1))
    monkeypatch.setattr(report, "DOC", doc)
    assert report.main(["--check"]) == 1 and "stale blocks policies" in capsys.readouterr().out
    assert report.main(["--write"]) == 0 and doc.read_text() == text
