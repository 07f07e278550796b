"""The outputs README.md and docs/*.md show, regenerated from the real CLI.

A fenced block right after `<!-- output -->` starts with `$ transit-launch ARGS` (a line
may end in a backslash and continue); everything after that line is what the CLI prints
today for ARGS. `python3 -m tests.readme_outputs --write` rewrites those blocks;
tests/test_readme.py fails when one differs. Blocks whose output depends on the machine
or on timing (doctor, run on a GPU, a bandwidth sweep) are marked `<!-- recorded: WHERE -->`
instead, and are not compared."""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
DOCS = [README, *sorted((README.parent / "docs").glob("*.md"))]  # every page with CLI examples
BLOCK = re.compile(r"(<!-- output -->\n```\n)(\$ transit-launch (?:[^\n]*\\\n)*[^\n]*\n)(.*?)(```)", re.S)


def command(prompt: str) -> list[str]:
    """The CLI arguments of a `$ transit-launch ...` prompt (continuation lines joined)."""
    return shlex.split(prompt[len("$ transit-launch "):].replace("\\\n", " "))


def run(args: list[str]) -> str:
    """The CLI as this Python imports it (the installed wheel under .ci/test), run from /."""
    import transit_launch
    home = str(Path(transit_launch.__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [home, os.environ.get("PYTHONPATH")])))
    res = subprocess.run([sys.executable, "-m", "transit_launch", *args], capture_output=True, text=True,
                         timeout=300, cwd="/", env=env)
    if res.returncode != 0:
        raise RuntimeError(f"transit-launch {shlex.join(args)} failed: {res.stderr.strip()}")
    return res.stdout


# README's simulate run (its block's command; docs/simulate.md compares its figures with the
# paper's): tests/test_readme.py compares its text with the block, tests/test_doc_figures.py reads
# the figures the prose quotes from its JSON. Both come from one replay (text_and_json), made
# once by one xdist worker: the tests that read it carry the xdist group SIM_GROUP.
SIM = ["simulate", "--synthetic", "20000", "--preset", "kalos", "--racks", "76", "--reduced-racks", "32",
       "--gpus-per-node", "8", "--load", "0.3", "--seeds", "3", "--quiet"]
SIM_GROUP = "doc-figures"


@functools.cache
def text_and_json(args: tuple[str, ...]) -> tuple[str, dict]:
    """What `transit-launch simulate ARGS` prints and the JSON (what --json prints) that its
    --json-out wrote, from one run; made once a process."""
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "report.json"
        text = run([*args, "--json-out", str(f)])
        return text, json.loads(f.read_text())


def blocks(text: str):
    """(prompt, shown output, start, end) of every output block."""
    for m in BLOCK.finditer(text):
        yield m.group(2), m.group(3), m.start(3), m.end(3)


def regenerate(text: str) -> str:
    out, last = [], 0
    for prompt, _shown, start, end in blocks(text):
        out += [text[last:start], run(command(prompt))]
        last = end
    return "".join(out + [text[last:]])


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python3 -m tests.readme_outputs --write")
    for page in DOCS:
        page.write_text(regenerate(page.read_text()))
        print(f"rewrote the output blocks of {page}")
