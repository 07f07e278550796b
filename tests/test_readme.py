"""README.md and docs/*.md cannot drift: every output they show is what the CLI prints now
(tests/readme_outputs.py regenerates them), and every other CLI example block is marked
as recorded, with where."""

import re

import pytest

from tests.readme_outputs import DOCS, README, blocks, command, run

TEXTS = {page: page.read_text() for page in DOCS}
SHOWN = [(page, prompt, shown) for page, text in TEXTS.items() for prompt, shown, _, _ in blocks(text)]


def test_readme_has_output_blocks():
    assert len(list(blocks(TEXTS[README]))) >= 3


@pytest.mark.parametrize("page,prompt,shown", SHOWN,
                         ids=[f"{page.name}:{p.split(chr(10))[0][:60]}" for page, p, _ in SHOWN])
def test_output_is_current(page, prompt, shown):
    assert run(command(prompt)) == shown, "run: python3 -m tests.readme_outputs --write"


@pytest.mark.parametrize("page", DOCS, ids=[p.name for p in DOCS])
def test_every_cli_example_is_checked_or_marked_recorded(page):
    text = TEXTS[page]
    for m in re.finditer(r"(<!--[^\n]*-->\n)?```\n\$ transit-launch", text):
        assert m.group(1) and re.match(r"<!-- (output|recorded: [^>]+) -->", m.group(1)), text[m.start():m.end() + 80]


def test_every_page_the_readme_links_exists():
    for link in re.findall(r"\]\((docs/[^)#]+)", TEXTS[README]):
        assert (README.parent / link).exists(), link
