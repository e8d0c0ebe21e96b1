"""The layout's rule, checked on the source: stages are siblings (only `run` orchestrates them),
and nothing below the stages reaches up into one."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "pipeline"


def imported_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_no_stage_imports_a_sibling_stage_and_only_run_orchestrates():
    stages = sorted(p for p in (PACKAGE / "stages").glob("*.py") if p.name != "__init__.py")
    assert {p.stem for p in stages} == {"data", "wiki", "generate", "filter", "train", "grpo", "eval", "plot", "run",
                                        "publish"}
    for path in stages:
        siblings = {m for m in imported_modules(path) if m.startswith("pipeline.stages")}
        if path.stem == "run":
            assert siblings <= {f"pipeline.stages.{s}" for s in ("generate", "filter", "train", "eval", "plot")}
        else:
            assert not siblings, f"{path.name} imports {siblings}"
    below = [p for p in PACKAGE.rglob("*.py") if "stages" not in p.parts]
    for path in below:  # nothing one floor down reaches up into a stage
        assert not {m for m in imported_modules(path) if m.startswith("pipeline.stages")}, path
