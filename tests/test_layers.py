"""One-way dependencies: catalogs -> sim -> planner -> app; validate is never imported by the core.

Walks every module's imports with `ast` (torchtitan freezes its structure with a test the same
way) and fails on a backward edge.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# package -> packages it must never import (at module level or inside functions)
FORBIDDEN = {
    "sim": {"planner", "validate", "app", "appkit"},
    "planner": {"app", "appkit"},
    "validate": {"app", "appkit"},
}
# planner.cmd_validate is the CLI front of validate and may import it lazily.
ALLOWED = {("planner/cmd_validate.py", "validate")}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module.split(".")[0])
    return out


def test_no_backward_imports():
    bad = []
    for pkg, forbidden in FORBIDDEN.items():
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for mod in _imports(path) & forbidden:
                if (rel, mod) not in ALLOWED:
                    bad.append(f"{rel} imports {mod}")
    assert not bad, "\n".join(bad)


def test_planner_imports_validate_only_from_its_cli_front():
    for path in sorted((ROOT / "planner").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if "validate" in _imports(path):
            assert rel == "planner/cmd_validate.py", rel


def test_core_imports_without_torch_or_streamlit():
    import subprocess
    import sys

    code = ("import sys, sim.analytic, sim.simulate, planner.cli; "
            "bad = [m for m in ('torch', 'streamlit', 'plotly', 'ray') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
