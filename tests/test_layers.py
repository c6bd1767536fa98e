"""One-way dependencies: catalogs -> sim -> planner -> app; validate is never imported by the core.
Inside ``sim`` and ``planner`` the sub-packages are floors too (``SUB_PACKAGES``, lowest first):
a module imports its own floor and the floors below it, never one above.

Walks every module's imports with `ast` (torchtitan freezes its structure with a test the same
way) and fails on a backward edge, on an import done by string (``importlib.import_module``,
``__import__``: an edge this walk could not see, and the "this piece may be missing" pattern),
and on an ``ImportError`` caught around an import of the project's own code.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sim", "planner", "validate", "appkit")
OWN = set(PACKAGES) | {"app"}

# package -> packages it must never import (at module level or inside functions)
FORBIDDEN = {
    "sim": {"planner", "validate", "app", "appkit"},
    "planner": {"app", "appkit", "validate"},
    "validate": {"planner", "app", "appkit"},  # validate uses sim's specs; the CLI front imports it
    "appkit": {"validate", "app"},  # the app drives the planner; it never runs torch workloads
}
# planner.commands.cmd_validate is the CLI front of validate and may import it lazily (torch stays optional).
ALLOWED = {("planner/commands/cmd_validate.py", "validate")}


def _files(pkg: str) -> list[Path]:
    return sorted((ROOT / pkg).rglob("*.py")) if (ROOT / pkg).is_dir() else [ROOT / f"{pkg}.py"]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module.split(".")[0])
    return out


def _string_imports(path: Path) -> list[str]:
    """Calls that import a module named by a string: ``importlib.import_module(...)``,
    ``__import__(...)``, ``importlib.util.find_spec(...)``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if name in ("import_module", "__import__", "find_spec"):
                out.append(f"line {node.lineno}: {name}(...)")
    return out


def _guarded_own_imports(path: Path) -> list[str]:
    """``try: import <own module> except ImportError/ModuleNotFoundError``: an optional piece."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Try):
            continue
        caught = set()
        for h in node.handlers:
            for t in ([h.type] if not isinstance(h.type, ast.Tuple) else h.type.elts) if h.type else []:
                if isinstance(t, ast.Name):
                    caught.add(t.id)
        if not caught & {"ImportError", "ModuleNotFoundError"}:
            continue
        for stmt in node.body:
            for sub in ast.walk(stmt):
                mods = []
                if isinstance(sub, ast.Import):
                    mods = [a.name for a in sub.names]
                elif isinstance(sub, ast.ImportFrom) and sub.module and sub.level == 0:
                    mods = [sub.module]
                out += [f"line {sub.lineno}: {m}" for m in mods if m.split(".")[0] in OWN]
    return out


def test_no_backward_imports():
    bad = []
    for pkg, forbidden in FORBIDDEN.items():
        for path in _files(pkg):
            rel = path.relative_to(ROOT).as_posix()
            for mod in _imports(path) & forbidden:
                if (rel, mod) not in ALLOWED:
                    bad.append(f"{rel} imports {mod}")
    assert not bad, "\n".join(bad)


def test_no_imports_by_string_or_optional_own_modules():
    bad = []
    for pkg in PACKAGES + ("app",):
        for path in _files(pkg):
            rel = path.relative_to(ROOT).as_posix()
            bad += [f"{rel} {x}" for x in _string_imports(path)]
            bad += [f"{rel} guards an import of its own code: {x}" for x in _guarded_own_imports(path)]
    assert not bad, "\n".join(bad)


def test_the_walk_sees_an_import_by_string(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import importlib\ntry:\n    import sim.engines.event\nexcept ImportError:\n    pass\n"
                     "mod = importlib.import_module('planner.plans.recommend')\n", encoding="utf-8")
    assert _string_imports(probe) == ["line 6: import_module(...)"]
    assert _guarded_own_imports(probe) == ["line 3: sim.engines.event"]


def test_planner_imports_validate_only_from_its_cli_front():
    for path in sorted((ROOT / "planner").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if "validate" in _imports(path):
            assert rel == "planner/commands/cmd_validate.py", rel


def test_core_imports_without_torch_or_streamlit():
    import subprocess
    import sys

    code = ("import sys, sim.engines.analytic, sim.engines.simulate, planner.cli; "
            "bad = [m for m in ('torch', 'streamlit', 'plotly', 'ray') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


def test_no_import_circles_in_sim():
    """The modules of ``sim`` import each other without a circle (function-level imports
    count): the catalog loader reads files with ``sim.data.modelio`` and builds no cluster or server,
    ``sim.data.models`` and ``sim.net.clusters`` build on it."""
    graph = {}
    for path in _files("sim"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        graph[name] = {m for m in _sim_modules(path) if m != name}

    def visit(node: str, trail: tuple[str, ...], done: set[str]) -> None:
        if node in trail:
            raise AssertionError("import circle: " + " -> ".join(trail[trail.index(node):] + (node,)))
        if node in done or node not in graph:
            return
        for nxt in sorted(graph[node]):
            visit(nxt, trail + (node,), done)
        done.add(node)

    done: set[str] = set()
    for node in sorted(graph):
        visit(node, (), done)


def _sim_modules(path: Path) -> set[str]:
    """The ``sim`` modules ``path`` imports (at any depth, except under ``if TYPE_CHECKING``)."""
    return _own_modules(path, "sim")


def _own_modules(path: Path, top: str) -> set[str]:
    """The modules of package ``top`` that ``path`` imports, by their full dotted names (``from
    sim.base import limits`` is ``sim.base.limits``), at any depth, except under ``if
    TYPE_CHECKING``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and getattr(node.test, "id", None) == "TYPE_CHECKING" for n in ast.walk(node)}
    out = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith(f"{top}.")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module != top and not node.module.startswith(f"{top}."):
                continue
            base = ROOT.joinpath(*node.module.split("."))
            names = [f"{node.module}.{a.name}" for a in node.names
                     if (base / f"{a.name}.py").is_file() or (base / a.name).is_dir()]
            out |= set(names) if names else {node.module}
    return out


# sub-package floors, lowest first (docs/architecture.md)
SUB_PACKAGES = {
    "sim": ("base", "data", "layers", "net", "cost", "engines"),
    "planner": ("recipes", "exports", "fitting", "plans", "economics", "commands"),
}


def test_sub_packages_import_their_floor_and_below():
    bad = []
    for top, floors in SUB_PACKAGES.items():
        rank = {f: i for i, f in enumerate(floors)}
        for path in _files(top):
            parts = path.relative_to(ROOT).parts
            if len(parts) < 3 or parts[1] not in rank:
                continue
            for mod in _own_modules(path, top):
                seg = mod.split(".")
                if len(seg) > 1 and seg[1] in rank and rank[seg[1]] > rank[parts[1]]:
                    bad.append(f"{path.relative_to(ROOT).as_posix()} ({parts[1]}) imports {mod} ({seg[1]})")
    assert not bad, "\n".join(bad)


def test_sim_and_planner_roots_hold_only_entry_modules():
    """The floors hold the modules; at the roots only the entry points stay."""
    assert sorted(p.name for p in (ROOT / "sim").glob("*.py")) == ["__init__.py"]
    assert sorted(p.name for p in (ROOT / "planner").glob("*.py")) == ["__init__.py", "cli.py", "progress.py",
                                                                       "report.py"]
