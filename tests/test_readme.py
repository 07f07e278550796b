"""README.md and docs/*.md cannot drift: every output they show is what the CLI prints now
(tests/readme_outputs.py regenerates them), and every other CLI example block is marked
as recorded, with where."""

import json
import re

import pytest

from tests.readme_outputs import DOCS, README, SIM, SIM_GROUP, blocks, command, run, text_and_json

TEXTS = {page: page.read_text() for page in DOCS}
SHOWN = [(page, prompt, shown) for page, text in TEXTS.items() for prompt, shown, _, _ in blocks(text)]


def test_readme_has_output_blocks():
    assert len(list(blocks(TEXTS[README]))) >= 3


@pytest.mark.parametrize("page,prompt,shown", [
    # README's simulate run on the worker of tests/test_doc_figures.py, which reads its JSON (one replay)
    pytest.param(page, prompt, shown, marks=[pytest.mark.xdist_group(SIM_GROUP)] if command(prompt) == SIM else [])
    for page, prompt, shown in SHOWN], ids=[f"{page.name}:{p.split(chr(10))[0][:60]}" for page, p, _ in SHOWN])
def test_output_is_current(page, prompt, shown):
    args = command(prompt)
    assert (text_and_json(tuple(args))[0] if args == SIM else run(args)) == shown, \
        "run: python3 -m tests.readme_outputs --write"


@pytest.mark.parametrize("page", DOCS, ids=[p.name for p in DOCS])
def test_every_cli_example_is_checked_or_marked_recorded(page):
    text = TEXTS[page]
    for m in re.finditer(r"(<!--[^\n]*-->\n)?```\n\$ transit-launch", text):
        assert m.group(1) and re.match(r"<!-- (output|recorded: [^>]+) -->", m.group(1)), text[m.start():m.end() + 80]


def test_every_page_the_readme_links_exists():
    for link in re.findall(r"\]\((docs/[^)#]+)", TEXTS[README]):
        assert (README.parent / link).exists(), link


# --- the layout tree --------------------------------------------------------------------

# build outputs inside the package (MANIFEST.in prunes them), never sources
BUILT = {"__pycache__", "lib", "_csrc"}


def _layout() -> dict[str, str]:
    """README's layout tree: directory -> what its lines say (continuation lines joined),
    with the command annotations, "(plan, models)", left out: a module named like its
    command (plan, run, render, ...) must be in the list itself."""
    from transit_launch.cli import build_parser
    commands = set(next(a for a in build_parser()._actions if a.dest == "cmd").choices)
    block = re.search(r"## Layout\n.*?```\n(.*?)```", TEXTS[README], re.S).group(1)
    sections, top, current = {}, None, None
    for line in block.splitlines():
        head = re.match(r"( {0,2})(\S+/)( |$)", line)
        if head:
            current = head.group(2) if not head.group(1) else top + head.group(2)
            top = current if not head.group(1) else top
            line = line[head.end():]
        if current:
            sections[current] = sections.get(current, "") + " " + line.strip()

    def annotation(m):
        return "" if all(w.strip() in commands for w in m.group(1).split(",")) else m.group(0)
    return {d: re.sub(r"\(([^()]*)\)", annotation, text) for d, text in sections.items()}


def _named(text: str, name: str) -> bool:
    return re.search(rf"(?<![\w.-]){re.escape(name)}(?![\w-])", text) is not None


def _expected() -> dict[str, list[str]]:
    """directory -> the names its line must give: a package's modules and folders, the
    C modules of shim/, spank/'s sources (tools/ included), examples/ and docs/'s pages."""
    root = README.parent
    want = {}
    for pkg in sorted(p for p in (root / "transit_launch").rglob("__init__.py")):
        d = pkg.parent
        if d.parent.name == "planning" and d.name == "cards":
            continue  # data: named as "cards/" in planning's line
        rel = d.relative_to(root).as_posix() + "/"
        want[rel] = [f.stem for f in sorted(d.glob("*.py")) if not f.stem.startswith("__")]
        want[rel] += [s.name for s in sorted(d.iterdir()) if s.is_dir() and s.name not in BUILT]
    want["shim/"] = [f.stem for f in sorted((root / "shim").glob("*.c"))]
    want["spank/"] = [f.name for f in sorted((root / "spank").rglob("*.c"))] + ["tools"]
    want["examples/"] = [f.name for f in sorted((root / "examples").iterdir()) if f.is_file()]
    want["docs/"] = [f.name for f in sorted((root / "docs").glob("*.md"))]
    return want


def test_the_layout_names_every_module():
    tree = _layout()
    sub = {d.split("/")[1] for d in tree if d.startswith("transit_launch/") and d.count("/") == 2}
    missing = []
    for d, names in _expected().items():
        if d not in tree:
            missing.append(f"{d} (no line of its own)")
            continue
        # a subpackage has its own line; the top line need not name it again
        missing += [f"{d}{n}" for n in names if not _named(tree[d], n) and not (d == "transit_launch/" and n in sub)]
    assert not missing, f"README.md's layout does not name: {', '.join(missing)}"


# --- docs/plan.png ----------------------------------------------------------------------

def _drawn_from(png) -> dict:
    """The data a `plan --plot` PNG was drawn from: its text chunk (report.PLOT_KEY)."""
    Image = pytest.importorskip("PIL.Image", reason="reading a PNG's text needs Pillow (matplotlib's dependency)")
    from transit_launch.planning.report import PLOT_KEY
    with Image.open(png) as im:
        text = im.text.get(PLOT_KEY)
    assert text, f"{png} carries no {PLOT_KEY!r} text: it was not drawn by `transit-launch plan --plot`"
    return json.loads(text)


def test_plan_png_is_drawn_from_todays_plan(tmp_path):
    """docs/plan.md shows docs/plan.png as the README's plan: the numbers it was drawn from
    are those today's plan draws (not its pixels: fonts and matplotlib versions differ)."""
    pytest.importorskip("matplotlib", reason="the plot needs matplotlib (the [plot] extra)")
    assert "(plan.png)" in TEXTS[README.parent / "docs" / "plan.md"] and "README's plan" in \
        TEXTS[README.parent / "docs" / "plan.md"]
    args = next(command(prompt) for prompt, _, _, _ in blocks(TEXTS[README]) if command(prompt)[0] == "plan")
    fresh = tmp_path / "plan.png"
    run([*args, "--plot", str(fresh)])
    assert _drawn_from(README.parent / "docs" / "plan.png") == _drawn_from(fresh), (
        f"docs/plan.png is stale: redraw it with `transit-launch {' '.join(args)} --plot docs/plan.png`")
