"""How the adapter's modules reach each other (issue 53): flat imports at module level only,
and no module calls or reads another's private names. Read with ast from the adapter's
sources; nothing is imported.

Flat imports at module level are what keeps a job's planted module out (sitecustomize imports
every module while site runs, before the job's script directory is on sys.path: see
tests/test_user_isolation.py); a private name used from another module is a contract no one
owns: it changes with its module's insides."""

import ast

import pytest

from tests.conftest import ADAPTER

MODULES = {p.stem: p for p in sorted(ADAPTER.glob("*.py")) if p.stem != "__init__"}


def _scopes(tree):
    """(node, whether it is inside a function, a lambda or a class) for every node of tree."""
    todo = [(tree, False)]
    while todo:
        node, inside = todo.pop()
        yield node, inside
        nested = inside or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef))
        todo.extend((child, nested) for child in ast.iter_child_nodes(node))


def _imported(node):
    """The adapter modules an import statement names, with the names they are bound to."""
    if isinstance(node, ast.Import):
        return [(a.name, a.asname or a.name) for a in node.names if a.name in MODULES]
    if isinstance(node, ast.ImportFrom) and node.module in MODULES and not node.level:
        return [(node.module, None)]
    return []


def _private(name):
    return name.startswith("_") and not name.startswith("__")


def _privates(tree):
    """The private names a module defines: at module level, and its classes' methods and
    self attributes."""
    out = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and _private(n.name)}
    out |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets
            if isinstance(t, ast.Name) and _private(t.id)}
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for n in ast.walk(cls):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(n.name):
                out.add(n.name)
            elif (isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and isinstance(n.value, ast.Name)
                  and n.value.id == "self" and _private(n.attr)):
                out.add(n.attr)
    return out


def lazy_imports(source):
    """Imports of adapter modules inside a function or a class: they run after site, when
    the job's script directory may hold a module of that name."""
    return [(n.lineno, name) for n, inside in _scopes(ast.parse(source)) if inside for name, _ in _imported(n)]


def private_reaches(source, theirs):
    """Where `source` uses another adapter module's private names: module._name (also by
    getattr or `from module import _name`), sys.modules[...]._name (also through a name it
    was given), and obj._name where _name is in `theirs`, the private names only other adapter
    modules define (a module passed as a parameter, an object of another module's class)."""
    tree = ast.parse(source)
    aliases = {bound for n in ast.walk(tree) for _, bound in _imported(n) if bound}
    aliases |= {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Subscript)
                and ast.unparse(n.value.value) == "sys.modules" for t in n.targets if isinstance(t, ast.Name)}
    found = []
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.module in MODULES:
            found += [(n.lineno, f"{n.module}.{a.name}") for a in n.names if _private(a.name)]
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("getattr", "hasattr", "setattr") \
                and len(n.args) > 1 and isinstance(n.args[1], ast.Constant) and _private(str(n.args[1].value)):
            obj, attr = n.args[0], str(n.args[1].value)
            if isinstance(obj, ast.Name) and obj.id in aliases:  # a module's, by name
                found.append((n.lineno, ast.unparse(n)))
            elif not (isinstance(obj, ast.Name) and obj.id in ("self", "cls")) and attr in theirs:  # an object's
                found.append((n.lineno, ast.unparse(n)))
        if not (isinstance(n, ast.Attribute) and _private(n.attr)):
            continue
        base = n.value
        if isinstance(base, ast.Name) and base.id in aliases:
            found.append((n.lineno, ast.unparse(n)))
        elif isinstance(base, ast.Subscript) and ast.unparse(base.value) == "sys.modules":
            found.append((n.lineno, ast.unparse(n)))
        elif not (isinstance(base, ast.Name) and base.id in ("self", "cls")) and n.attr in theirs:
            found.append((n.lineno, ast.unparse(n)))
    return found


def test_adapter_modules_import_each_other_at_module_level_only():
    found = {name: lazy_imports(path.read_text()) for name, path in MODULES.items()}
    assert not {k: v for k, v in found.items() if v}, found
    # and flat: each module imports its siblings by their own names (none through transit_launch)
    flat = {name for path in MODULES.values() for n in ast.walk(ast.parse(path.read_text())) for name, _ in _imported(n)}
    assert {"transit_rules", "transit_step", "transit_staging"} <= flat


def shared_privates(defined):
    """The private names two adapter modules both define: obj._name, where obj is the other
    module's object, would pass for the module's own (the scan cannot tell the objects apart)."""
    seen, shared = {}, {}
    for module, names in defined.items():
        for name in names:
            if name in seen:
                shared[name] = (seen[name], module)
            seen.setdefault(name, module)
    return shared


def test_no_two_adapter_modules_define_the_same_private_name():
    defined = {name: _privates(ast.parse(path.read_text())) for name, path in MODULES.items()}
    assert not shared_privates(defined)


def test_a_shared_private_name_is_found():
    """The blind spot it closes: transit_host and transit_streamed both had `_once`, so
    `self.streamed._once(...)` in one read as its own."""
    defined = {"a": _privates(ast.parse("class A:\n    def _once(self):\n        pass\n")),
               "b": _privates(ast.parse("def _say():\n    pass\nclass B:\n    def _once(self):\n        pass\n"))}
    assert shared_privates(defined) == {"_once": ("a", "b")}


def test_no_adapter_module_uses_another_ones_private_names():
    defined = {name: _privates(ast.parse(path.read_text())) for name, path in MODULES.items()}
    found = {}
    for name, path in MODULES.items():
        theirs = set().union(*(d for other, d in defined.items() if other != name)) - defined[name]
        found[name] = private_reaches(path.read_text(), theirs)
    found = {k: v for k, v in found.items() if v}
    assert not found, found


@pytest.mark.parametrize("bad", [
    "def f():\n    import transit_staging\n",  # after site: a planted transit_staging.py would be imported
    "class C:\n    import transit_step\n",
    "def g():\n    from transit_step import mode\n",
])
def test_a_lazy_import_is_found(bad):
    assert lazy_imports(bad)


@pytest.mark.parametrize("bad", [
    # what transit_streamed.py and sitecustomize.py did before issue 53 (with the modules named as today)
    "import transit_step\ntransit_step._raw_step(opt)\n",
    "import transit_step as ov\nov._say('x')\n",
    "import transit_api\ngetattr(transit_api, '_since', None)\n",
    "from transit_host import _local\n",
    "import sys\nsys.modules[type(s).__module__]._storage_tensor\n",
    "import sys\nmod = sys.modules[type(s).__module__]\nlocal = mod._storage_tensor\n",
    "class S:\n    def __init__(self, ov):\n        self.ov = ov\n    def f(self, opt):\n        self.ov._raw_step(opt)\n",
    "def f(staging):\n    return staging._ring(dev)\n",
    "def f(st):\n    return st._streams(dev)\n",
    "def f(self):\n    return getattr(self.staging, '_ring')(dev)\n",  # another module's object, by getattr
])
def test_a_private_reach_is_found(bad):
    assert private_reaches(bad, {"_ring", "_streams", "_raw_step"})  # transit_staging's, transit_step's
