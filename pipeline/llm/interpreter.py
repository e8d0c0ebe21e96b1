"""Which Python runs a unit whose own process needs vLLM: an eval or generate with the in-process
engine (`backend: vllm` without `serve:`), a GRPO launch with vLLM rollouts.

vLLM pins its own torch and transformers, so it lives in its own environment (.venv-vllm, made by
scripts/setup_vllm.sh with this project, TRL, PEFT, accelerate and DeepSpeed in it). `run` and
the stages keep running from .venv and start such a unit's process with the vLLM environment's
python, so one `run` runs a whole grid; the interpreter is this one where vLLM imports here.
Where neither has vLLM the unit is refused when the plan is made, not after the train phase.

    REACT_PIPELINE_VLLM_PYTHON=/opt/vllm/bin/python   # another vLLM environment's python
"""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.llm.serving import VLLM_VENV

PYTHON_ENV = "REACT_PIPELINE_VLLM_PYTHON"
SETUP_HINT = "bash scripts/setup_vllm.sh makes .venv-vllm with it"


def vllm_environment() -> Path:
    """The vLLM environment's python: $REACT_PIPELINE_VLLM_PYTHON, else .venv-vllm's."""
    given = os.environ.get(PYTHON_ENV, "").strip()
    return Path(given) if given else VLLM_VENV / "bin" / "python"


@functools.cache
def missing_in(python: str, modules: tuple[str, ...]) -> tuple[str, ...]:
    """The `modules` that `python` cannot find (importlib's find_spec, as TRL looks for vLLM):
    asked of that interpreter in a process of its own, once per run."""
    if python == sys.executable:
        return tuple(m for m in modules if importlib.util.find_spec(m) is None)
    if not Path(python).is_file():
        return modules
    probe = "import importlib.util as u, sys; print(' '.join(m for m in sys.argv[1:] if u.find_spec(m) is None))"
    try:
        done = subprocess.run([python, "-c", probe, *modules], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return modules
    return tuple(done.stdout.split()) if done.returncode == 0 else modules


def python_for(what: str, needs: tuple[str, ...] = ()) -> str:
    """The interpreter that runs `what` (a unit that needs vLLM in its own process, and `needs`
    beside it): this one where vLLM and `needs` import here, else the vLLM environment's where
    they import there; else a one-line refusal naming what is missing where."""
    modules = ("vllm", *needs)
    if not missing_in(sys.executable, modules):
        return sys.executable
    other = str(vllm_environment())
    missing = missing_in(other, (*modules, "pipeline"))
    if not missing:
        return other
    if not Path(other).is_file():
        where = f"no vLLM environment at {other} ({SETUP_HINT}, or set {PYTHON_ENV})"
    elif "vllm" in missing:
        where = f"{other} has no vLLM either ({SETUP_HINT}, or set {PYTHON_ENV})"
    else:
        where = (f"{other} has vLLM but not {', '.join(missing)}: run bash scripts/setup_vllm.sh again (it installs "
                 "the project with TRL, PEFT, accelerate and DeepSpeed there)")
    raise PipelineError(f"{what} needs vLLM in its own process: vLLM is not installed for {sys.executable}, and {where}")


def in_process_vllm(llm, serve, oracle: str | None = None) -> bool:
    """Whether an answerer runs vLLM's engine in its own process: `backend: vllm` without a
    `serve:` section (a managed server runs in the vLLM environment by its own command)."""
    return oracle is None and serve is None and llm.backend == "vllm"
