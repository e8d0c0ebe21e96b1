"""Who answers the episodes of a `generate` or `eval` run: a prompted language model, or a task's
stand-in teacher (the oracle, which asks no model). `answerer(cfg, task)` is the one place where
`backend: oracle` is told apart from a language model.
"""

from __future__ import annotations

from pipeline.core.errors import PipelineError
from pipeline.core.trajectory import FORMATS
from pipeline.llm.base import LLM
from pipeline.llm.config import LLMConfig
from pipeline.llm.factory import load_llm
from pipeline.methods import Method, MethodSettings, build_method, prompt_prefixes
from pipeline.tasks import Task, get_task
from pipeline.tasks.hotpotqa.oracle import DEFAULT_STYLE, check_style

ORACLE = "oracle"  # the `backend` that names the stand-in teacher (pipeline.tasks.hotpotqa.oracle)


class PromptedModel:
    """A language model answering `task`'s questions through the prompting methods (pipeline.methods)."""

    def __init__(self, cfg: LLMConfig, task: Task | None = None):
        self.cfg, self.label, self.task = cfg, cfg.label, get_task(task)

    def check(self, methods: list[str], settings: MethodSettings) -> dict[str, dict]:
        """Fail fast on an unknown method or a missing exemplar file; return exemplar sources."""
        require_methods(methods)
        return {m: {fmt: p.source for fmt, p in prompt_prefixes(m, settings, self.task).items()} for m in methods}

    def open(self) -> LLM:
        llm = load_llm(self.cfg)
        check = getattr(llm, "check_available", None)
        if check is not None:
            check()
        return llm

    def method(self, name: str, settings: MethodSettings) -> Method:
        return build_method(name, settings, self.task)


class OracleTeacher:
    """The task's stand-in teacher (HotpotQA's writes correct trajectories from gold facts); asks no model."""

    label = ORACLE

    def __init__(self, style: str = DEFAULT_STYLE, task: Task | None = None):
        check_style(style)
        self.style = style  # exact | agent (pipeline.tasks.hotpotqa.oracle)
        self.task = get_task(task)

    def check(self, methods: list[str], settings: MethodSettings) -> dict[str, dict]:
        require_methods(methods)
        bad = [m for m in methods if m not in FORMATS]
        if bad:
            raise PipelineError(f"the oracle teacher writes {', '.join(FORMATS)} trajectories, not {', '.join(bad)}")
        return {m: {"source": self.task.oracle_source} for m in methods}

    def open(self) -> None:
        return None

    def method(self, name: str, settings: MethodSettings) -> Method:
        return self.task.oracle(name, settings, self.style)


Answerer = PromptedModel | OracleTeacher


def is_oracle(cfg: LLMConfig) -> bool:
    """Whether a config's `backend` names the stand-in teacher rather than a language model."""
    return cfg.backend == ORACLE


def answerer(cfg: LLMConfig, task: Task | str | None = None) -> Answerer:
    """The one place where `backend: oracle` is told apart from a language model; either answers
    `task`'s questions (default HotpotQA)."""
    task = get_task(task)
    if is_oracle(cfg):
        return OracleTeacher(cfg.oracle_style, task)
    if cfg.oracle_style != DEFAULT_STYLE:  # it means something only to the oracle: fail, not ignore
        raise PipelineError(f"oracle_style={cfg.oracle_style} applies only to backend=oracle "
                            f"(this model's backend is {cfg.backend})")
    return PromptedModel(cfg, task)


def require_methods(methods: list[str]) -> None:
    if not methods:
        raise PipelineError("methods is empty; name at least one, e.g. methods=[react]")
