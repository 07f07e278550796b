"""The package's layering (issue 29): no import circle among transit_launch's modules,
lazy imports inside functions included (a lazy import hides a circle from Python, not from
a reader), and the rooms import each other in one direction only, as docs/structure.md
draws them. Read from the installed package's sources with ast; nothing is imported."""

import ast
import collections
from pathlib import Path

import transit_launch

PKG = Path(transit_launch.__file__).resolve().parent
# room -> the rooms it may import (the top-level modules, cli.py, rules.py, errors.py, ...,
# are shared by all). The adapter runs inside the job's Python: it imports none of them
# (tests/test_rules.py checks that).
ALLOWED = {"planning": set(), "netcap": set(), "preload": set(), "sim": {"planning"}, "slurm": {"planning", "preload"},
           "adapter": set()}


def _modules():
    mods = {}
    for f in PKG.rglob("*.py"):
        rel = f.relative_to(PKG.parent).with_suffix("")
        if "adapter" in rel.parts:
            continue
        name = ".".join(rel.parts)
        mods[name.removesuffix(".__init__")] = f
    return mods


def _imports(mods):
    """module -> the transit_launch modules it imports, anywhere in it, with line numbers."""
    out = collections.defaultdict(dict)
    for mod, f in mods.items():
        for n in ast.walk(ast.parse(f.read_text())):
            if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("transit_launch"):
                for a in n.names:
                    full = f"{n.module}.{a.name}"
                    out[mod][full if full in mods else n.module] = n.lineno
            elif isinstance(n, ast.Import):
                for a in n.names:
                    if a.name.startswith("transit_launch"):
                        out[mod][a.name] = n.lineno
    return out


def _room(mod):
    parts = mod.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (PKG / parts[1]).is_dir()) else None


def test_no_module_imports_itself_through_others():
    mods = _modules()
    edges = _imports(mods)
    state, path, circles = {}, [], []

    def visit(m):
        state[m] = "open"
        path.append(m)
        for n in edges.get(m, {}):
            if n not in mods:
                continue
            if state.get(n) == "open":
                circles.append(path[path.index(n):] + [n])
            elif n not in state:
                visit(n)
        path.pop()
        state[m] = "done"

    for m in sorted(mods):
        if m not in state:
            visit(m)
    assert not circles, circles


def test_rooms_import_in_one_direction():
    mods = _modules()
    wrong = []
    for mod, targets in _imports(mods).items():
        src = _room(mod)
        for t, line in targets.items():
            dst = _room(t)
            if src and dst and dst != src and dst not in ALLOWED[src]:
                wrong.append(f"{mods[mod].relative_to(PKG.parent)}:{line} imports {t}")
    assert not wrong, wrong
    assert set(ALLOWED) == {p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists()}


def test_the_structure_pictures_folders_and_modules():
    """docs/structure.md's picture (its first code block) has a line for every folder the sdist
    carries (MANIFEST.in's grafts) and names every module and room of the package."""
    import re

    from tests.conftest import ROOT
    picture = (ROOT / "docs" / "structure.md").read_text().split("```")[1]
    tops = {line.split()[0] for line in picture.splitlines() if line and not line[0].isspace()}
    manifest = ROOT / "MANIFEST.in"
    grafts = {line.split()[1] + "/" for line in manifest.read_text().splitlines() if line.startswith("graft ")} \
        if manifest.is_file() else set()
    assert grafts | {"transit_launch/"} <= tops, sorted(grafts - tops)
    parts = {p.name + ("/" if p.is_dir() else "") for p in PKG.iterdir()
             if (p.suffix == ".py" and p.name not in ("__init__.py", "__main__.py")) or (p / "__init__.py").exists()}
    assert parts and not [n for n in parts if not re.search(rf"(?<![\w/]){re.escape(n)}", picture)], parts
