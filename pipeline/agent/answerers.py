"""Who answers the episodes of a `generate` or `eval` run: a prompted language model, or a task's
stand-in teacher (the oracle, which asks no model). The stage config's own `oracle` key chooses it
(null: the configured model answers; `exact` or `agent`: the stand-in teacher with that search
style); `answerer(cfg, task, oracle)` is the one place where the two are told apart, and
`upgrade_oracle` reads the configs of older manifests, where the oracle was `backend: oracle`.
"""

from __future__ import annotations

from pipeline.core.errors import PipelineError
from pipeline.core.same_run import run_keys
from pipeline.core.trajectory import FORMATS
from pipeline.llm.base import LLM
from pipeline.llm.config import LLMConfig, with_episodes_in_flight
from pipeline.llm.factory import load_llm
from pipeline.methods import Method, MethodSettings, build_method, prompt_prefixes
from pipeline.tasks import Task, get_task
from pipeline.tasks.base import DEFAULT_ORACLE_STYLE, check_oracle_style

ORACLE = "oracle"  # the stand-in teacher's label in records and manifests (each task's Task.oracle)
# The LLM section of each stage config that has one answering (its teacher, or its model under test)
MODEL_SECTIONS = ("teacher", "model")
DEFAULT_LLM = LLMConfig()


class PromptedModel:
    """A language model answering `task`'s questions through the prompting methods (pipeline.methods)."""

    def __init__(self, cfg: LLMConfig, task: Task | None = None, search: str = "title"):
        self.cfg, self.label, self.task = cfg, cfg.label, get_task(task)
        self.search = search  # the wiki.search mode: whose exemplar sets the prompts carry

    def check(self, methods: list[str], settings: MethodSettings) -> dict[str, dict]:
        """Fail fast on an unknown method or a missing exemplar file; return exemplar sources."""
        require_methods(methods)
        if "rag" in methods and self.search != "bm25":
            raise PipelineError(f"method rag retrieves with the question, which wiki.search={self.search} cannot "
                                "(it looks one page up by its exact title): set wiki.search=bm25, or drop rag")
        return {m: {fmt: p.source for fmt, p in prompt_prefixes(m, settings, self.task, self.search).items()}
                for m in methods}

    def check_questions(self, name: str, questions: list | None = None) -> None:
        """A model answers any question of the task."""

    def open(self, max_in_flight: int) -> LLM:
        """The model, its requests in flight following the run's episodes in flight."""
        llm = load_llm(with_episodes_in_flight(self.cfg, max_in_flight))
        check = getattr(llm, "check_available", None)
        if check is not None:
            check()
        return llm

    def method(self, name: str, settings: MethodSettings) -> Method:
        return build_method(name, settings, self.task, self.search)


class OracleTeacher:
    """The task's stand-in teacher (HotpotQA's writes correct trajectories from gold facts); asks no model."""

    label = ORACLE

    def __init__(self, style: str = DEFAULT_ORACLE_STYLE, task: Task | None = None):
        check_oracle_style(style)
        self.style = style  # exact | agent (pipeline.tasks.base.ORACLE_STYLES)
        self.task = get_task(task)

    def check(self, methods: list[str], settings: MethodSettings) -> dict[str, dict]:
        require_methods(methods)
        bad = [m for m in methods if m not in FORMATS]
        if bad:
            raise PipelineError(f"the oracle teacher writes {', '.join(FORMATS)} trajectories, not {', '.join(bad)}")
        return {m: {"source": self.task.oracle_source} for m in methods}

    def check_questions(self, name: str, questions: list | None = None) -> None:
        """Refuse a set the stand-in teacher cannot answer (pipeline.tasks.base.check_oracle_questions)."""
        self.task.check_oracle_questions(name, questions)

    def open(self, max_in_flight: int) -> None:
        return None

    def method(self, name: str, settings: MethodSettings) -> Method:
        return self.task.oracle(name, settings, self.style)


Answerer = PromptedModel | OracleTeacher


def answerer(cfg: LLMConfig, task: Task | str | None = None, oracle: str | None = None,
             search: str = "title") -> Answerer:
    """The one place where the stand-in teacher is told apart from a language model: `oracle` (the
    stage config's key: exact | agent) answers with the task's stand-in teacher in that search
    style and loads no model; None, the model `cfg` names, prompted with the exemplars of the
    wiki.search mode `search`. Either answers `task`'s questions (default HotpotQA)."""
    task = get_task(task)
    if oracle is not None:
        return OracleTeacher(oracle, task)
    return PromptedModel(cfg, task, search)


def check_oracle(oracle: str | None, serve, llm: LLMConfig, section: str) -> None:
    """Where the stand-in teacher answers (`oracle` set) it asks no model: a `serve:` section, or
    an LLM section (`section`: teacher | model) naming a model, means nothing to it and is refused
    (fail, not ignore); how a model would be run (its free keys: device, timeouts) is let be."""
    if oracle is None:
        return
    check_oracle_style(oracle)
    unread = [f"{section}.{k}" for k in run_keys(LLMConfig) if getattr(llm, k) != getattr(DEFAULT_LLM, k)]
    if serve is not None or unread:
        what = "`serve:`" if serve is not None else ", ".join(unread)
        raise PipelineError(f"oracle={oracle} answers with the stand-in teacher, which asks no model: {what} "
                            f"would not be read; drop it (or set oracle: null for the configured model to answer)")


def upgrade_oracle(config: dict) -> dict:
    """A stage config written before the `oracle` key (a manifest's), in today's form: the LLM
    section's `backend: oracle` and `oracle_style` become `oracle: <style>` (the backend back to
    the default); a model's `oracle_style` (which meant nothing to it) is dropped, and its run had
    `oracle: null`."""
    sections = [k for k in MODEL_SECTIONS if isinstance(config, dict) and isinstance(config.get(k), dict)]
    if not sections:
        return config
    config, oracle = dict(config), None
    for key in sections:
        section = dict(config[key])
        style = section.pop("oracle_style", DEFAULT_ORACLE_STYLE)
        if section.get("backend") == ORACLE:
            section["backend"], oracle = DEFAULT_LLM.backend, style
        config[key] = section
    config.setdefault("oracle", oracle)
    return config


def unread_model_dropped(config: dict) -> dict:
    """A stage config's identity without its LLM section where the oracle answers (it loads no
    model, so what that section names does not change what the run writes)."""
    if not isinstance(config, dict) or config.get("oracle") is None:
        return config
    return {k: v for k, v in config.items() if k not in MODEL_SECTIONS}


def require_methods(methods: list[str]) -> None:
    if not methods:
        raise PipelineError("methods is empty; name at least one, e.g. methods=[react]")
