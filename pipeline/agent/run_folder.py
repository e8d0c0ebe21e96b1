"""The run folder of a `generate` or `eval` run: held by one writer at a time, resumed only by the
same run (what counts as the same is declared on the config's fields: pipeline.core.identity),
marked incomplete until its complete manifest is written.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pipeline.agent.answerers import Answerer, unread_model_dropped
from pipeline.agent.episodes import check_error_share
from pipeline.core.config import to_dict, upgrade_keys
from pipeline.core.errors import PipelineError
from pipeline.core.folder_lock import LOCK_NAME, run_lock
from pipeline.core.same_run import run_keys
from pipeline.core.shards import parse_shard, shard_questions
from pipeline.core.storage import (
    atomic_write_bytes,
    read_manifest,
    write_manifest,
)
from pipeline.llm.base import LLM, sampling_fields
from pipeline.llm.config import LLMConfig
from pipeline.methods import MethodSettings
from pipeline.tasks import Task, task_of
from pipeline.wiki.backend import WikiBackend
from pipeline.wiki.config import check_search, open_backend

# Operational knobs of an LLM section that do not change what it writes (`base_url`: where the
# same model is served, e.g. other replicas when a sharded job resumes on another node): the
# LLMConfig fields declared free (pipeline.core.same_run).
OPERATIONAL_KEYS = run_keys(LLMConfig, "free")


# Identity keys added after runs were written, with the value every older run had.
LATER_KEYS = {"samples": 1}


def identity(config: dict, keys: tuple[str, ...]) -> dict:
    """The part of a stage config (`keys`) that decides what its records hold (a config older than
    the `task` key was a HotpotQA run's; one older than `samples` ran one episode per question;
    where the stand-in teacher answers, its LLM section, which it does not read, is left out)."""
    config = unread_model_dropped({k: task_of(config) if k == "task" else config.get(k, LATER_KEYS.get(k))
                                   for k in keys})
    for k in ("teacher", "model"):  # the LLM sections: how it is served does not matter
        if isinstance(config.get(k), dict):
            config[k] = {key: v for key, v in config[k].items() if key not in OPERATIONAL_KEYS}
    return config


def check_resumable(out_dir: Path, stage: str, cfg: Any, keys: tuple[str, ...]) -> None:
    """Refuse to append to a folder written by another stage or with a different model,
    question set or prompting settings (`keys` of the stage config `cfg`): records would get
    mixed. An older manifest's config is read in today's key names (pipeline.core.config
    upgrade_keys: also the oracle's `backend: oracle` of older runs as today's `oracle` key)."""
    old = read_manifest(out_dir / "manifest.json")
    if old is None:
        return
    was = identity(upgrade_keys(type(cfg), old.get("config", {})), keys)
    new = identity(to_dict(cfg), keys)
    changed = [k for k in keys if was.get(k) != new.get(k)]
    if old.get("stage") != stage or changed:
        raise PipelineError(
            f"{out_dir} holds a {old.get('stage')} run with a different {', '.join(changed) or 'stage'}; "
            "use another out_dir (or delete that folder) to start afresh"
        )


def start_run(cfg: Any, stage: str, who: Answerer, settings: MethodSettings,
              keys: tuple[str, ...], *, methods: list[str] | None = None,
              check: Callable[[], None] | None = None) -> tuple[list, WikiBackend, LLM | None, dict[str, dict]]:
    """Check what a run of `cfg` (methods, questions, limit, out_dir, wiki) needs before anything
    is written, then open the page source and the model: (questions, backend, llm, exemplar sources).
    `methods` replaces cfg.methods (eval's default for a checkpoint); `check` is the stage's own
    extra refusal (e.g. eval's precision), run with the resume check."""
    sources = check_settings(cfg, who, settings, methods)
    questions = who.task.load_questions(cfg.questions, limit=cfg.limit)
    if not questions:
        raise PipelineError(f"question set '{cfg.questions}' is empty: nothing to "
                            + ("evaluate" if stage == "eval" else stage))
    who.check_questions(cfg.questions, questions)  # the whole set, not this shard's: every shard refuses alike
    questions = shard_questions(questions, parse_shard(cfg.shard))
    check_resumable(cfg.out_dir, stage, cfg, keys)
    if check is not None:
        check()
    backend = open_backend(cfg.wiki)
    check_index_covers(who.task, cfg.questions, questions, backend)
    return questions, backend, who.open(cfg.max_in_flight), sources


INDEX_SAMPLE = 100  # questions looked up: a mismatch shows in the first few, and 100 lookups take milliseconds


def check_index_covers(task: Task, name: str, questions: list, backend: WikiBackend) -> None:
    """Refuse a local index that lacks the pages most of the first questions are answered from
    (another task's Wikipedia: FEVER claims on the HotpotQA index, 86 of 98 without a page there),
    and say how many lack theirs when a few do (4 of the first 100 of HotpotQA's dev on the
    offline 26k-page corpus).
    A live backend, and questions whose pages the task does not know, are not checked."""
    from pipeline.wiki.index import LocalIndex

    if not isinstance(backend, LocalIndex):
        return
    known = [lacks for q in questions[:INDEX_SAMPLE]
             if (lacks := task.lacks_pages(q, lambda title: backend.get_page(title) is not None)) is not None]
    missing = sum(known)
    if known and missing > len(known) / 2:
        raise PipelineError(f"wiki.index {backend.path} lacks the pages of {missing} of the first {len(known)} "
                            f"{task.title} questions of {name}: is it another task's Wikipedia? Set wiki.index to "
                            f"one built for them (from the {task.title} wiki.corpus), or wiki.backend=live")
    if missing:
        print(f"warning: wiki.index {backend.path} lacks the pages of {missing} of the first {len(known)} questions "
              f"of {name}: their episodes cannot find their evidence (a fuller index, or wiki.backend=live)",
              file=sys.stderr)


def sampling_record(settings: MethodSettings, llm: LLM | None) -> dict | None:
    """How a run's model sampled, for its manifest: the temperatures (each step's, CoT-SC's samples')
    and every other knob (pipeline.llm.base.sampling_fields); None without a model (a stand-in teacher)."""
    if llm is None:
        return None
    return {"temperature": settings.temperature, "cot_sc_temperature": settings.cot_sc_temperature,
            **sampling_fields(llm)}


def check_settings(cfg: Any, who: Answerer, settings: MethodSettings,
                   methods: list[str] | None = None) -> dict[str, dict]:
    """What a generate or eval run refuses about its own settings, reading no earlier output,
    loading no model and no question: the error share, the search mode (for the task), the methods
    and their exemplars, the question set's name, the shard. `start_run` calls it, and `run` for every unit of its plan,
    so a typo fails when the plan is made, not when its phase starts. Returns exemplar sources."""
    check_error_share(cfg.max_error_share)
    check_search(cfg.wiki)
    who.task.check_search(cfg.wiki.search)
    if getattr(who, "style", None) == "exact" and cfg.wiki.search != "title":
        raise PipelineError(f"oracle=exact searches the gold titles, which a student in wiki.search={cfg.wiki.search} "
                            "could not know; use oracle=agent (it searches the question's names)")
    check_interface(cfg, who, settings)
    sources = who.check(cfg.methods if methods is None else methods, settings)
    who.task.check_question_set(cfg.questions)
    who.check_questions(cfg.questions)  # by name: before a question is loaded
    parse_shard(cfg.shard)
    return sources


def check_interface(cfg: Any, who: Answerer, settings: MethodSettings) -> None:
    """`prompting.interface: tools` needs an OpenAI-compatible chat endpoint: `backend: openai`, or
    a model the stage serves itself (`serve:`, started with a tool-call parser: pipeline/llm/serving.py)."""
    llm = getattr(who, "cfg", None)  # a prompted model's LLM section; the stand-in teacher has none
    if settings.interface == "tools" and llm is not None and llm.backend != "openai" and getattr(cfg, "serve", None) is None:
        raise PipelineError(f"prompting.interface=tools sends tool calls to an OpenAI-compatible chat endpoint; the "
                            f"'{llm.backend}' backend has none: set backend: openai, or add a `serve:` section "
                            "(a managed vllm serve, started with a tool-call parser)")


@contextlib.contextmanager
def writing_run(cfg: Any, keys: tuple[str, ...], manifest: dict,
                check: Callable[[], None] | None = None) -> Iterator[Path]:
    """Hold the run folder, check again that it may be resumed (now that no one else can write
    it), and mark it incomplete until the caller writes the complete manifest; yields its path."""
    with run_lock(cfg.out_dir):
        check_resumable(cfg.out_dir, manifest["stage"], cfg, keys)
        if check is not None:
            check()
        path = cfg.out_dir / "manifest.json"
        before, old = records_state(cfg.out_dir), path.read_bytes() if path.is_file() else None
        write_manifest(path, complete=False, **manifest)
        try:
            yield path
        except PipelineError:
            if records_state(cfg.out_dir) == before:  # refused before a record was written
                put_back(path, old)
            raise


def records_state(out_dir: Path) -> dict[str, tuple[int, int]]:
    """(size, mtime) of every file in the folder but its manifest and lock: whether a run wrote
    anything between two looks."""
    return {str(f.relative_to(out_dir)): (f.stat().st_size, f.stat().st_mtime_ns) for f in out_dir.rglob("*")
            if f.is_file() and f.name not in ("manifest.json", LOCK_NAME)}


def put_back(path: Path, old: bytes | None) -> None:
    """A refusal writes nothing: the manifest as it was (a finished run's stats kept), or none."""
    if old is None:
        path.unlink(missing_ok=True)
    else:
        atomic_write_bytes(path, old)
