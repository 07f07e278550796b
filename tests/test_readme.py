"""README.md cannot drift: every output it shows is what the CLI prints now
(tests/readme_outputs.py regenerates them), and every other CLI example block is marked
as recorded, with where."""

import re

import pytest

from tests.readme_outputs import README, blocks, command, run

TEXT = README.read_text()
SHOWN = list(blocks(TEXT))


def test_readme_has_output_blocks():
    assert len(SHOWN) >= 3


@pytest.mark.parametrize("prompt,shown", [(p, s) for p, s, _, _ in SHOWN], ids=[p.split("\n")[0][:60] for p, *_ in SHOWN])
def test_output_is_current(prompt, shown):
    assert run(command(prompt)) == shown, "run: python3 -m tests.readme_outputs --write"


def test_every_cli_example_is_checked_or_marked_recorded():
    for m in re.finditer(r"(<!--[^\n]*-->\n)?```\n\$ transit-launch", TEXT):
        assert m.group(1) and re.match(r"<!-- (output|recorded: [^>]+) -->", m.group(1)), TEXT[m.start():m.end() + 80]
