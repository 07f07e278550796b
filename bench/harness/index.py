"""bench/results/INDEX.md: one entry a run of `python3 -m bench` (date, suite, the exact
command, the commit, the files it wrote), appended, newest last, and the manifest each
run leaves in its folder (run.json) so that a run made elsewhere can be filed later."""

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
INDEX = RESULTS / "INDEX.md"
HEAD = """# bench/results: what each run wrote

One entry a run of `python3 -m bench SUITE`, appended by the runner (newest last); files
are relative to bench/results/. The entries "(before the harness)" list the files of the
sittings before it, filed by the date in their names (bench/harness/date_results.py);
bench/RESULTS.md gives their commands. The history of each file is in git.
"""


@dataclass
class Entry:
    date: str
    suite: str
    command: str
    commit: str
    files: list = field(default_factory=list)
    status: str = ""

    def markdown(self) -> str:
        lines = [f"## {self.date} {self.suite}", "", f"- command: `{self.command}`"]
        if self.commit:
            lines.append(f"- commit: {self.commit}")
        if self.status:
            lines.append(f"- status: {self.status}")
        lines.append("- files: " + (", ".join(f"`{f}`" for f in self.files) or "none"))
        return "\n".join(lines) + "\n"


def append(entry: Entry, index: Path | None = None) -> None:
    index = index or INDEX
    text = index.read_text() if index.exists() else HEAD
    index.write_text(text.rstrip("\n") + "\n\n" + entry.markdown())


def write_manifest(folder: Path, entry: Entry) -> None:
    (folder / "run.json").write_text(json.dumps(asdict(entry), indent=1) + "\n")


def read_manifest(folder: Path) -> Entry:
    return Entry(**json.loads((folder / "run.json").read_text()))


def commit(root: Path = ROOT) -> str:
    """BENCH_COMMIT when set (the device's copy of .git can be older than the tree sent: give the
    commit in the command), else HEAD's commit read from .git (no git process: the device's copy
    may have none)."""
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"][:12]
    git = root / ".git"
    try:
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head[:12]
        ref = head[5:]
        if (git / ref).exists():
            return (git / ref).read_text().strip()[:12]
        for line in (git / "packed-refs").read_text().splitlines():
            if line.endswith(" " + ref):
                return line.split()[0][:12]
    except OSError:
        pass
    return "unknown"
