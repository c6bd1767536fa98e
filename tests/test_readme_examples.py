"""The README's `planner` examples run (docs that cannot rot), except the slow validate loop."""

import re
import shlex
from pathlib import Path

import pytest

from planner.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _examples():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("Examples:", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    cmds = re.sub(r"\\\n\s*", " ", block).strip().splitlines()
    return [c for c in cmds if c.startswith("planner ") and "validate" not in c and "my_config" not in c]


@pytest.mark.parametrize("cmd", _examples())
def test_readme_example_runs(cmd, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = shlex.split(cmd)[1:]
    assert main(argv) == 0
