"""The command examples of docs/economics.md run (so the docs never rot)."""

import re
import shlex
from pathlib import Path

import pytest

from planner.cli import main

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "economics.md"


def examples():
    text = DOC.read_text(encoding="utf-8")
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        lines += [ln.strip() for ln in block.splitlines() if ln.strip().startswith("planner ")]
    return lines


def test_the_doc_has_examples_for_every_command():
    cmds = {shlex.split(line)[1] for line in examples()}
    assert cmds == {"tco", "goodput", "schedule", "input-pipeline", "comm-reduce", "sweep"}


@pytest.mark.parametrize("line", examples())
def test_doc_example_runs(line, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    code = main(shlex.split(line)[1:])
    cap = capsys.readouterr()
    assert code == 0, cap.err
    assert cap.out.strip()
