"""One definition of the shared rules: the generated C header matches rules.py, and the
Python parser, the shim's parser and the SPANK plugin's parser give the same verdict and
value for every input of one table."""

import subprocess
from pathlib import Path

import pytest

from tests.conftest import C_SOURCES, CUDA_INC, have_cc, spank_include
from transit_launch import rules

# Sizes of 2^64 bytes and more that the grammar takes (at most 16 digits): each product wraps
# in 64 bits (2^64 -> 0, 2^64 + 2^30 -> 1 GiB, 2^64 + 2^50 -> 1 PiB, 2^64 + 2^20 -> 1 MiB,
# 18446745 x 10^12 - 2^64 = 926290448384 -> 0.93 TB); the parser must refuse each as too large.
OVER_2_64 = ["17179869184GiB", "17179869185GiB", "16385PiB", "16384PiB", "18446745TB", "17179869185.5GiB",
             "17592186044417MiB"]

CASES = [
    # (text, bytes or None for a refusal)
    ("80GB", 80 * 10**9), ("141GiB", 141 * 2**30), ("512MiB", 512 * 2**20), ("4096B", 4096),
    ("1.5TB", 1_500_000_000_000), ("1.5 TB", 1_500_000_000_000), ("40 GB", 40 * 10**9), ("40gb", 40 * 10**9),
    ("1b", 1), ("0.5KiB", 512), ("1.000001k", 1000), ("1024PiB", None), ("1k", 1000),
    ("1125899906842624B", 2**50), ("1125899906842625b", None), ("1024TiB", 2**50), ("1025TiB", None),
    # a bare number is no size (it used to be bytes: `--gpu-budget 70` gave the job 70 bytes)
    ("4096", None), ("1", None), ("70", None), ("1125899906842624", None),
    # the largest size can be written in its own unit; fractions of PiB stay exact in C
    ("1PiB", 2**50), ("1 pib", 2**50), ("1PB", 10**15), ("1P", 10**15), ("0.5PiB", 2**49), ("1.1PiB", None),
    ("0.999999PiB", 999999 * 2**50 // 10**6), ("1.125899PB", 1_125_899 * 10**9), ("1.1259PB", None),
    ("1e9", None), ("1E9GB", None), ("inf", None), ("nan", None), ("-5GB", None), ("+5GB", None),
    ("0", None), ("0GB", None), ("0.5", None), ("0.0000001TB", None), ("0x10GB", None), ("1e99", None),
    ("1e-300", None), ("", None), (" ", None), (" 40GB", None), ("40GB ", None), ("40  GB", None),
    ("40 ", None), ("1.", None), (".5GB", None), ("1.1234567GB", None), ("12345678901234567", None),
    ("9999999999999999", None), ("9999999999999999TiB", None), ("40GBB", None), ("40 G B", None),
    ("4\u0660GB", None), ("40\tGB", None), ("40GB\n", None), ("abc", None), ("1,5GB", None),
    # at and past 2^64 bytes (OVER_2_64), an exbibyte, 20 digits (past the grammar's 16)
    *((t, None) for t in OVER_2_64), ("16EiB", None), ("18446744073709551616", None), ("99999999999999999999B", None),
]

DRIVER = r"""
#include <stdio.h>
#include <stdint.h>
%(decl)s
int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *line = argv[i];
        %(body)s
    }
    return 0;
}
"""
# The shim's real path: tr_config_load() reads TRANSIT_GPU_BUDGET (sizes go through
# env_size -> tr_size_parse); a refused value leaves the default, 0 (no budget).
SHIM = dict(decl="#include <stdlib.h>\n#include \"transit.h\"\n"
                 "void tr_log(int level, const char *fmt, ...) { (void)level; (void)fmt; }",
            body='setenv("TRANSIT_GPU_BUDGET", line, 1); tr_config_load(); '
                 'if (tr_cfg.budget) printf("%llu\\n", (unsigned long long)tr_cfg.budget); else puts("-");')
SPANK = dict(decl="int tr_size_valid(const char *s);\n#include <stdarg.h>\n"
                  "void slurm_error(const char *fmt, ...) { (void)fmt; }",
             body='puts(tr_size_valid(line) ? "ok" : "-");')


# The plugin's --transit-budget check itself (spank/args.c: tr_opt_budget), with its message.
SPANK_BUDGET = dict(decl="int tr_opt_budget(const char *arg);\n#include <stdarg.h>\n"
                         "void slurm_error(const char *fmt, ...) { va_list ap; va_start(ap, fmt); "
                         "vprintf(fmt, ap); va_end(ap); putchar('\\n'); }",
                    body='printf("rc %d\\n", tr_opt_budget(line));')


def python_verdict(text):
    try:
        return rules.parse_size(text)
    except rules.SizeError:
        return None


def test_header_is_generated_from_rules():
    header = (C_SOURCES / "shim" / "transit_rules.h").read_text()
    assert header == rules.c_header(), "run: python3 -m transit_launch.rules > shim/transit_rules.h"


@pytest.mark.parametrize("text,want", CASES)
def test_python_parser(text, want):
    assert python_verdict(text) == want


def _compile(tmp_path, name, driver, sources, flags=()):
    src = tmp_path / f"{name}.c"
    src.write_text(DRIVER % driver)
    exe = tmp_path / name
    subprocess.run(["cc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-fsanitize=address,undefined",
                    "-fno-sanitize-recover=all", *flags, "-o", str(exe), str(src), *map(str, sources)],
                   check=True, capture_output=True, text=True)
    return exe


def _feed(exe, inputs=None):
    out = subprocess.run([str(exe), *(inputs or [t for t, _ in CASES])], capture_output=True, text=True, check=True,
                         timeout=30)
    assert out.stderr == ""
    return out.stdout.splitlines()


@pytest.mark.skipif(not have_cc() or CUDA_INC is None, reason="needs a C compiler and cuda_runtime_api.h")
def test_shim_parser_agrees(tmp_path):
    exe = _compile(tmp_path, "shim_size", SHIM, [C_SOURCES / "shim" / "config.c"],
                   [f"-I{CUDA_INC}", f"-I{C_SOURCES / 'shim'}", "-D_DEFAULT_SOURCE"])
    got = _feed(exe)
    # a budget above GPU_BUDGET_MAX is no budget in the shim, as in the CLI and the plugin
    assert got == [str(w) if w is not None and w <= rules.GPU_BUDGET_MAX else "-" for _, w in CASES]
    assert any(w is not None and w > rules.GPU_BUDGET_MAX for _, w in CASES)  # the bound is exercised


# tr_size_parse itself: its return code and the reason the shim and the plugin print.
PARSE = {"decl": '#include "transit_size.h"',
         "body": 'uint64_t v = 0; int rc = tr_size_parse(line, &v); '
                 'printf("%d %llu %s\\n", rc, (unsigned long long)v, rc ? tr_size_reason(rc) : "");'}


@pytest.mark.skipif(not have_cc(), reason="needs a C compiler")
def test_sizes_past_2_64_are_too_large_in_c_and_python(tmp_path, cli):
    """17179869185GiB is 2^64 + 2^30 bytes: a product that wraps read it as 1 GiB. Each of
    OVER_2_64 is refused as too large in C (under UBSan) and in Python, and --gpu-budget says
    so in one line; what the grammar does not take at all (20 digits, EiB) is no size."""
    exe = _compile(tmp_path, "size_rc", PARSE, [], [f"-I{C_SOURCES / 'shim'}"])
    assert _feed(exe, OVER_2_64) == ["-3 0 is larger than 1 PiB"] * len(OVER_2_64)  # TR_SIZE_TOO_LARGE
    for text in OVER_2_64:
        with pytest.raises(rules.SizeError, match="is larger than 1 PiB"):
            rules.parse_size(text)
    bad = ["16EiB", "18446744073709551616", "99999999999999999999B"]
    assert [line.split()[:2] for line in _feed(exe, bad)] == [["-1", "0"]] * 3  # TR_SIZE_BAD
    for text, why in (("17179869185GiB", "is larger than 1 PiB"), *((t, "as a size") for t in bad)):
        rc, out, err = cli("run", "--gpu-budget", text, "--", "true")
        assert rc == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err, err
        assert err.startswith("transit-launch: error: argument --gpu-budget: ") and f"'{text}' " in err, err
        assert why in err, err


@pytest.mark.skipif(not have_cc(), reason="needs a C compiler")
def test_spank_parser_agrees(tmp_path):
    inc = spank_include()
    if inc is None:
        pytest.skip("needs Slurm's spank.h (apt install libslurm-dev)")
    exe = _compile(tmp_path, "spank_size", SPANK, [C_SOURCES / "spank" / "args.c"], [f"-I{inc.parent}"])
    got = _feed(exe)
    assert got == ["ok" if w is not None else "-" for _, w in CASES]



@pytest.mark.skipif(not have_cc(), reason="needs a C compiler")
def test_spank_budget_has_the_cli_rules(tmp_path):
    """--transit-budget=70 gave the job TRANSIT_GPU_BUDGET=70 (issue 28): a bare number is
    refused and says why, and so is a budget below rules.GPU_BUDGET_MIN, like --gpu-budget."""
    inc = spank_include()
    if inc is None:
        pytest.skip("needs Slurm's spank.h (apt install libslurm-dev)")
    exe = _compile(tmp_path, "spank_budget", SPANK_BUDGET, [C_SOURCES / "spank" / "args.c"], [f"-I{inc.parent}"])
    low = rules.GPU_BUDGET_MIN
    got = _feed(exe, ["70", "100MB", f"{low - 1}B", f"{low}B", "40GB"])
    assert got == [
        "transit: --transit-budget=70: expected a size such as 40GB or 64GiB (a number needs its unit; B for bytes)",
        "rc -1",
        f"transit: --transit-budget=100MB is below {rules.format_size(low)}, the least GPU budget (about what a "
        "CUDA context alone takes)", "rc -1",
        f"transit: --transit-budget={low - 1}B is below {rules.format_size(low)}, the least GPU budget (about "
        "what a CUDA context alone takes)", "rc -1",
        "rc 0", "rc 0"]


@pytest.mark.parametrize("nbytes,text", [(40 * 10**9, "40GB"), (141 * 2**30, "141GiB"), (9766436864, "9314MiB"),
                                         (817889280, "780MiB"), (12345, "12345B"), (2**50, "1PiB"), (10**15, "1PB"),
                                         (rules.GPU_BUDGET_MIN, "512MiB")])
def test_format_size_is_exact_in_the_grammar(nbytes, text):
    """What TRANSIT_GPU_BUDGET is exported as: the shim parses it back to the same bytes."""
    assert rules.format_size(nbytes) == text and rules.parse_size(text) == nbytes


def test_the_plugin_and_the_launcher_spell_no_variable_themselves():
    """Every TRANSIT_* name the plugin and the launcher's injection use comes from rules.ENV
    (the C side through TR_ENV_* in the generated header), and the allocator setting both
    give jobs is one string (TR_ALLOC_CONF): a literal of its own could drift."""
    import re
    from transit_launch.preload import inject
    sources = {p: p.read_text() for p in sorted((C_SOURCES / "spank").glob("*.c"))}
    sources[Path(inject.__file__)] = Path(inject.__file__).read_text()
    for path, text in sources.items():
        code = re.sub(r"/\*.*?\*/|#[^\n]*|\"\"\".*?\"\"\"", "", text, flags=re.S)  # not comments or docstrings
        assert not re.findall(r"[\"']TRANSIT_[A-Z_]+[\"']", code), path
        assert "expandable_segments" not in code, path
    assert f'#define TR_ALLOC_CONF "{rules.ALLOC_CONF}"' in rules.c_header()
    assert inject.ALLOC_CONF is rules.ALLOC_CONF


def test_the_adapter_imports_nothing_of_transit_launch():
    """The adapter runs inside the job's own Python (PYTHONPATH), where transit_launch may not
    be installed at all: none of its modules may import it, at any depth of the module."""
    import ast
    from transit_launch.preload import inject
    mods = sorted(inject.adapter_dir().glob("*.py"))
    assert {m.name for m in mods} >= {"sitecustomize.py", "transit_api.py", "transit_step.py"}
    for m in mods:
        for node in ast.walk(ast.parse(m.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not [n for n in names if n.split(".")[0] == "transit_launch"], (m.name, names)


def test_the_environment_table_lists_every_variable_and_only_those():
    """docs/environment.md, the contract users read, has a row for every name in rules.ENV
    and names no TRANSIT_* variable that rules.ENV lacks; its section "Retired" has a row for
    every name in rules.RETIRED_ENV (what a job that still sets one is told) and names no
    other."""
    import re
    doc = (Path(__file__).resolve().parent.parent / "docs" / "environment.md").read_text()  # the sdist's docs
    current, found, retired = doc.partition("\n## Retired\n")
    assert found, "docs/environment.md has no section '## Retired'"
    row = re.compile(r"^\| `(TRANSIT_[A-Z_]+)[=`]", flags=re.M)
    rows = set(row.findall(current))
    assert rows == set(rules.ENV.values()), (rows ^ set(rules.ENV.values()))
    assert set(re.findall(r"TRANSIT_[A-Z_]+", current)) <= set(rules.ENV.values())
    assert set(row.findall(retired)) == set(rules.RETIRED_ENV.values()) | {rules.ENV["OVERLAP_STEP"]}
    assert set(re.findall(r"TRANSIT_[A-Z_]+", retired)) <= set(rules.RETIRED_ENV.values()) | set(rules.ENV.values())
    for mode in rules.RETIRED_OVERLAP_MODES:
        assert f"| `{rules.ENV['OVERLAP_STEP']}={mode}` |" in retired
    assert not set(rules.RETIRED_ENV.values()) & set(rules.ENV.values())
    assert not set(rules.RETIRED_OVERLAP_MODES) & set(rules.OVERLAP_MODES)


def test_the_adapters_rules_are_generated_from_rules():
    """The adapter reads the rules from its generated transit_rules.py, as the shim reads
    shim/transit_rules.h: the committed file is what rules.py writes, and it gives back every
    value rules.py holds."""
    from transit_launch.preload import inject
    text = (inject.adapter_dir() / "transit_rules.py").read_text()
    assert text == rules.python_module(), \
        "run: python3 -m transit_launch.rules --python > transit_launch/adapter/transit_rules.py"
    generated = {}
    exec(compile(text, "transit_rules.py", "exec"), generated)
    assert {k: generated[k] for k in rules.ADAPTER_RULES} == {k: getattr(rules, k) for k in rules.ADAPTER_RULES}


def _constant(node):
    """The value of a literal expression (numbers, strings, tuples, dicts, `256 << 20`), or
    _constant itself (no literal) when it is not one."""
    import ast
    import operator
    if isinstance(node, ast.BinOp):
        ops = {ast.LShift: operator.lshift, ast.Mult: operator.mul, ast.Add: operator.add, ast.Pow: operator.pow}
        left, right = _constant(node.left), _constant(node.right)
        if type(node.op) in ops and isinstance(left, int) and isinstance(right, int):
            return ops[type(node.op)](left, right)
        if isinstance(node.op, ast.Add) and isinstance(left, str) and isinstance(right, str):
            return left + right  # "TRANSIT_" + "OVERLAP_STEP" spells the name too
        return _constant
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _constant


def _hand_copies(source):
    """The rules that `source` spells itself instead of reading them from transit_rules: a
    string equal to one of the environment's names, a tuple, list or set of two or more
    overlap modes (or of retired ones), a dict of policies to modes, the staging ring's default bytes given to a
    name of a stage, ring, limit or in-flight bytes; a string made by adding literals counts as its value."""
    import ast
    names = {*rules.ENV.values(), *rules.RETIRED_ENV.values()}
    modes = {*rules.OVERLAP_MODES, *rules.RETIRED_OVERLAP_MODES}
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr):  # a docstring says the names: it defines nothing
            continue
        if not isinstance(node, ast.expr):
            continue
        value = _constant(node)
        if isinstance(value, str) and value in names:
            found.append((node.lineno, value))
        elif isinstance(value, (tuple, list, set, frozenset)) and all(isinstance(v, str) for v in value) and \
                value and set(value) <= modes and (len(value) >= 2 or set(value) <= set(rules.RETIRED_OVERLAP_MODES)):
            found.append((node.lineno, value))
        elif isinstance(value, dict) and value and set(value) <= set(rules.POLICIES) and \
                all(v in modes for v in value.values()):
            found.append((node.lineno, value))
    for node in ast.walk(ast.parse(source)):  # 256 << 20 is also other sizes: the ring's by its name
        if isinstance(node, ast.Assign) and _constant(node.value) == rules.STAGE_RING_BYTES and \
                any(w in ast.unparse(t).upper() for t in node.targets for w in ("STAGE", "RING", "LIMIT", "INFLIGHT")):
            found.append((node.lineno, rules.STAGE_RING_BYTES))
    return found


@pytest.mark.parametrize("copy", ['POOL_ENV = "TRANSIT_STATE_POOL"', 'os.environ.get("TRANSIT_ADAPTER", "1")',
                                  'RETIRED = ("TRANSIT_OVERLAP_SMS",)', 'RETIRED = ("serial",)', 'MODES = ("1", "staged", "stream")',
                                  'PINNED = ["staged", "stream"]', 'DEFAULT = {"advise": "stream"}',
                                  "LIMIT = 256 << 20", "LIMIT = 268435456", 'NAME = "TRANSIT_" + "OVERLAP_STEP"',
                                  "INFLIGHT_DEFAULT = 268435456"])
def test_a_hand_copy_of_a_rule_is_found(copy):
    """What the next test looks for, shown on the copies the adapter used to keep."""
    assert _hand_copies(copy)


def test_the_adapter_spells_no_rule_itself():
    """Every environment name, mode list and default the adapter uses comes from its generated
    transit_rules.py: a copy in its own source could drift from what the CLI, the plan and the
    shim were told (the adapter kept such copies, checked equal by tests, until issue 53)."""
    from transit_launch.preload import inject
    sources = sorted(p for p in inject.adapter_dir().glob("*.py") if p.name != "transit_rules.py")
    assert {p.name for p in sources} >= {"sitecustomize.py", "transit_step.py", "transit_staging.py"}
    found = {p.name: _hand_copies(p.read_text()) for p in sources}
    assert not {k: v for k, v in found.items() if v}, found


def _c_copies(text):
    """The contract names a C source spells as string literals (comments left out) instead of
    taking them from the generated transit_rules.h."""
    import re
    names = {*rules.ENV.values(), *rules.RETIRED_ENV.values(), *rules.JOB_ENV.values(), *rules.PLUGIN_OPTIONS.values()}
    code = re.sub(r"/\*.*?\*/|//[^\n]*", "", text, flags=re.S)
    return [lit for lit in re.findall(r'"((?:[^"\\\n]|\\.)*)"', code) if lit in names]


def test_no_product_source_spells_a_contract_name():
    """Beyond the adapter: every Python module of the product (the CLI's doctor, spank, run,
    ...) and every C source of the shim and the plugin takes the contract's names from rules.py
    or the header generated from it; only rules.py and the generated files spell them."""
    from transit_launch.preload import inject
    pkg = Path(rules.__file__).resolve().parent
    generated = {pkg / "rules.py", inject.adapter_dir() / "transit_rules.py"}
    py = {str(p.relative_to(pkg)): _hand_copies(p.read_text()) for p in sorted(pkg.rglob("*.py")) if p not in generated}
    c = {p.name: _c_copies(p.read_text()) for d in ("shim", "spank") for p in sorted((C_SOURCES / d).rglob("*.[ch]"))
         if p.name != "transit_rules.h"}
    assert len(py) > 50 and len(c) > 20
    assert not {k: v for k, v in {**py, **c}.items() if v}


@pytest.mark.parametrize("copy", ['const char *v = getenv("TRANSIT_LOG");', 'spank_setenv(sp, "LD_PRELOAD", s, 1);',
                                  '{ "transit-budget", "SIZE", "the budget", 1, 0, budget },'])
def test_a_hand_copy_in_c_is_found(copy):
    assert _c_copies(copy) and not _c_copies(f"/* {copy} */")
