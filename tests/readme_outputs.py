"""The outputs README.md and docs/*.md show, regenerated from the real CLI.

A fenced block right after `<!-- output -->` starts with `$ transit-launch ARGS` (a line
may end in a backslash and continue); everything after that line is what the CLI prints
today for ARGS. `python3 -m tests.readme_outputs --write` rewrites those blocks;
tests/test_readme.py fails when one differs. Blocks whose output depends on the machine
or on timing (doctor, run on a GPU, a bandwidth sweep) are marked `<!-- recorded: WHERE -->`
instead, and are not compared."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
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
