"""The tasks an experiment can run on, by name (`task: fever` in generate, eval and run configs).

    from pipeline.tasks import get_task
    task = get_task("hotpotqa")          # pipeline/tasks/hotpotqa/: questions, EM / F1, exemplars, oracle
    task = get_task("fever")             # pipeline/tasks/fever/: claims, three labels, accuracy

A task's module is imported only when it is asked for. `filter` and `train` read the task from
their inputs' manifests; a manifest written before configs had the key reads as HotpotQA
(`task_of`). What a task owns: pipeline/tasks/base.py.
"""

from __future__ import annotations

import importlib
from typing import Any

from pipeline.core.errors import PipelineError
from pipeline.tasks.base import Task

DEFAULT_TASK = "hotpotqa"
# name -> the module whose TASK is that task
TASK_MODULES = {"hotpotqa": "pipeline.tasks.hotpotqa", "fever": "pipeline.tasks.fever"}
TASK_NAMES = tuple(TASK_MODULES)

__all__ = ["DEFAULT_TASK", "TASK_NAMES", "Task", "get_task", "task_of"]


def get_task(name: str | Task | None = None) -> Task:
    """The task called `name` (None: the default, HotpotQA); a Task is returned as it is."""
    if isinstance(name, Task):
        return name
    name = name or DEFAULT_TASK
    if name not in TASK_MODULES:
        raise PipelineError(f"unknown task '{name}'; expected one of {', '.join(TASK_NAMES)}")
    return importlib.import_module(TASK_MODULES[name]).TASK


def task_of(data: dict[str, Any] | None) -> str:
    """The task a stage config (or a manifest, or a summary row) names; older ones name none and
    were HotpotQA runs."""
    data = data or {}
    config = data.get("config") if isinstance(data.get("config"), dict) else {}
    return data.get("task") or config.get("task") or DEFAULT_TASK
