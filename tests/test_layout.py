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


ORCHESTRATED = {f"pipeline.stages.{s}" for s in ("generate", "filter", "train", "grpo", "eval", "plot")}
GRID = {"pipeline.stages.grid"} | {f"pipeline.stages.grid.{p.stem}" for p in (PACKAGE / "stages" / "grid").glob("*.py")}


def test_no_stage_imports_a_sibling_stage_and_only_run_orchestrates():
    stages = sorted(p for p in (PACKAGE / "stages").glob("*.py") if p.name != "__init__.py")
    assert {p.stem for p in stages} == {"data", "wiki", "generate", "filter", "train", "grpo", "eval", "plot", "run",
                                        "publish"}
    for path in stages:
        siblings = {m for m in imported_modules(path) if m.startswith("pipeline.stages")}
        if path.stem == "run":  # it and its parts (stages/grid/: the plan, the checks, the units' runs)
            assert siblings <= ORCHESTRATED | GRID, siblings
        else:
            assert not siblings, f"{path.name} imports {siblings}"
    for path in (PACKAGE / "stages" / "grid").glob("*.py"):
        siblings = {m for m in imported_modules(path) if m.startswith("pipeline.stages")}
        assert siblings <= ORCHESTRATED | GRID, f"stages/grid/{path.name} imports {siblings - ORCHESTRATED - GRID}"
    outside = [p for p in (PACKAGE / "stages").glob("*.py") if p.stem != "run"]
    for path in outside:  # run's parts are run's alone
        assert not {m for m in imported_modules(path) if m in GRID or m.startswith("pipeline.stages.grid.")}, path
    below = [p for p in PACKAGE.rglob("*.py") if "stages" not in p.parts]
    for path in below:  # nothing one floor down reaches up into a stage
        assert not {m for m in imported_modules(path) if m.startswith("pipeline.stages")}, path


def string_constants(path: Path) -> list[str]:
    return [node.value for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)]


def test_tasks_import_no_stage():
    """A task (pipeline/tasks/) is data and rules the stages ask for; it never drives one."""
    tasks = sorted((PACKAGE / "tasks").rglob("*.py"))
    assert {p.parent.name for p in tasks} >= {"tasks", "hotpotqa", "fever"}
    for path in tasks:
        imported = imported_modules(path)
        assert not {m for m in imported if m.startswith(("pipeline.stages", "pipeline.agent"))}, path


# What makes a task's answers right or wrong, and its question line: none of it is the environment's.
TASK_METRIC_MODULES = ("pipeline.tasks",)  # HotpotQA's metric, questions and evaluate wrapper, FEVER's: all in tasks/


def test_the_environment_imports_no_task_metric_and_writes_no_question_line():
    """WikiEnv is text in, text out (Search, Lookup, Finish): a task's metric is injected
    (`score=`), and the question line ("Question:" / "Claim:") is the methods' to write."""
    for path in sorted((PACKAGE / "wiki").glob("*.py")):
        reached = {m for m in imported_modules(path) if m.startswith(TASK_METRIC_MODULES)}
        assert not reached, f"{path.name} imports {reached}"
    env = PACKAGE / "wiki" / "env.py"
    assert not [s for s in string_constants(env) if "Question:" in s or "Claim:" in s]


# Training and inference libraries: the report reads summaries and draws, where no model can run.
HEAVY = ("torch", "transformers", "vllm", "trl", "peft", "accelerate", "deepspeed")


def test_report_imports_no_stage_and_no_training_or_inference_library():
    """pipeline/report/ (summaries, orderings, tables, figure, intervals, references) never drives a
    stage, and imports none of HEAVY anywhere in its source (module level or inside a function)."""
    files = sorted((PACKAGE / "report").glob("*.py"))
    assert {p.stem for p in files} >= {"summaries", "orderings", "tables", "figure", "intervals", "references"}
    for path in files:
        imported = imported_modules(path)
        assert not {m for m in imported if m.split(".")[0] in HEAVY}, path
        assert not {m for m in imported if m.startswith("pipeline.stages")}, path


def test_importing_the_report_loads_no_training_or_inference_library():
    """What the source check cannot see: nothing the report imports (methods, tasks, storage)
    pulls one in either."""
    import subprocess
    import sys

    modules = ", ".join(f"pipeline.report.{p.stem}" for p in sorted((PACKAGE / "report").glob("*.py")))
    code = f"import sys, {modules}; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=PACKAGE.parent, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


# Inference backends: the project's (pipeline.llm: transformers decoding, vLLM and llama.cpp
# servers, the OpenAI client) and vLLM itself. Training names its model through pipeline.hub.models.
INFERENCE = ("pipeline.llm", "vllm")


def test_train_imports_no_inference_backend():
    """Everything under `accelerate launch` (pipeline/train/, pipeline/finetune.py) imports no
    inference backend, in its source (module level or inside a function) or through what it
    imports."""
    import subprocess
    import sys

    files = [*sorted((PACKAGE / "train").glob("*.py")), PACKAGE / "finetune.py"]
    assert {p.stem for p in files} >= {"plan", "launch", "run", "trainer", "model", "data", "final", "finetune"}
    for path in files:
        reached = {m for m in imported_modules(path) if m.startswith(INFERENCE)}
        assert not reached, f"{path.name} imports {reached}"
    modules = ", ".join(f"pipeline.train.{p.stem}" for p in files if p.parent.name == "train" and p.stem != "__init__")
    code = (f"import sys, pipeline.finetune, {modules}; "
            f"print(sorted(m for m in sys.modules if m.startswith({INFERENCE!r})))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=PACKAGE.parent, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
