"""Shared by `generate` and `eval`: who answers (a prompted model or the oracle stand-in, each for
one task), the resume check of a run folder, and resumable per-method episode files with a live
progress bar.

One JSONL file per method holds one record per finished episode (`pipeline.agent.episode_record`).
A re-run reads the ids already there and runs only the rest; a torn last line from a kill is
dropped. The bar shows episodes done, EM so far and episodes per minute.

Backend errors (an episode ended `llm_error: ...` or `backend_error: ...`: the model or the page
source failed, not the model's answer) are the run's problem, not the model's score: once more
than `max_error_share` of a method's episodes end so, the run stops with one line naming the
first error, and no summary or complete manifest is written. A re-run moves the errored records
to `errored/<method>.jsonl` (kept for reading) and runs those episodes again.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tqdm import tqdm

from pipeline.agent import run_episodes
from pipeline.core.config import to_dict, upgrade_keys
from pipeline.core.errors import PipelineError
from pipeline.core.shards import parse_shard, shard_questions
from pipeline.core.storage import (
    JsonlAppender,
    atomic_write_text,
    jsonl_line,
    read_jsonl,
    read_manifest,
    remove_stale_temps,
    write_manifest,
)
from pipeline.core.trajectory import FORMATS
from pipeline.llm.base import LLM
from pipeline.llm.config import LLMConfig
from pipeline.llm.factory import load_llm
from pipeline.methods import Method, MethodSettings, build_method, prompt_prefixes
from pipeline.methods.base import ended_in_error
from pipeline.tasks import Task, get_task, task_of
from pipeline.tasks.hotpotqa.oracle import DEFAULT_STYLE, check_style
from pipeline.wiki.backend import WikiBackend
from pipeline.wiki.config import open_backend

LOCK_NAME = ".lock"
ERRORED_DIR = "errored"  # <out_dir>/errored/<method>.jsonl: errored records a re-run set aside
# Default of the stage key `max_error_share`: above this share of a method's episodes ending in a
# backend error, the run stops instead of summarising (module docstring).
MAX_ERROR_SHARE = 0.1


@contextlib.contextmanager
def run_lock(out_dir: Path) -> Iterator[None]:
    """Hold `<out_dir>/.lock` while writing: a second generate/eval on the same folder would
    append the same episodes twice. The OS drops the lock when the holder dies (even kill -9)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / LOCK_NAME, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            raise PipelineError(f"{out_dir} is being written by another process (pid {fh.read().strip() or '?'}); "
                                "wait for it to finish or use another out_dir") from None
        fh.truncate(0)
        fh.write(str(os.getpid()))
        fh.flush()
        remove_stale_temps(out_dir)  # a killed run's half-written manifest or summary
        yield


def finished_ids(path: Path) -> set[str]:
    """Ids already written; a torn last line (no newline) is not counted, and the appender
    cuts it off when the run resumes."""
    if not path.exists():
        return set()
    return {str(r["id"]) for r in read_jsonl(path)}


class ErrorShareExceeded(PipelineError):
    """More of a method's episodes ended in a backend error than `max_error_share` allows."""


class EpisodeSink:
    """Append each finished episode durably and update the progress bar; stop the run (raise
    ErrorShareExceeded) once its errored episodes pass `max_error_share` of `total`, as soon as
    that is certain rather than after the last episode."""

    def __init__(self, path: Path, total: int, already_done: int, label: str,
                 max_error_share: float = MAX_ERROR_SHARE):
        self.path = path
        self.out = JsonlAppender(path)
        self.em_sum = 0.0
        self.new = 0
        self.total, self.max_error_share = total, max_error_share
        self.allowed_errors = math.floor(max_error_share * total + 1e-9)
        self.errors, self.first_error = 0, None
        self.started = time.monotonic()
        self.bar = tqdm(total=total, initial=already_done, desc=label, unit="ep", dynamic_ncols=True)

    def __call__(self, record: dict) -> None:
        self.out.append(record)
        self.count_error(record)
        self.new += 1
        self.em_sum += float(record.get("em") or 0.0)
        minutes = max(time.monotonic() - self.started, 1e-9) / 60
        # refresh=False: update() redraws at tqdm's own rate; a forced redraw per episode wrote
        # one line per episode into a log file (2,174 of them for a fast oracle run)
        self.bar.set_postfix(em=f"{self.em_sum / self.new:.2f}", ep_per_min=f"{self.new / minutes:.1f}",
                             refresh=False)
        self.bar.update(1)

    def count_error(self, record: dict) -> None:
        if not ended_in_error(record.get("end_reason")):
            return
        self.errors += 1
        self.first_error = self.first_error or " ".join(str(record["end_reason"]).split())[:300]
        if self.errors > self.allowed_errors:
            raise ErrorShareExceeded(
                f"{self.path}: {self.errors} of {self.total} episodes ended in a model or page-source "
                f"error, more than max_error_share={self.max_error_share:g} allows (the first: "
                f"{self.first_error}); the run is left incomplete, with no summary. Fix the cause and "
                "re-run the same command: the errored episodes are run again")

    def close(self) -> None:
        self.bar.close()
        self.out.close()

    def __enter__(self) -> EpisodeSink:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def run_methods(who: PromptedModel | OracleTeacher, llm: LLM | None, methods: list[str], questions: list,
                settings: MethodSettings, backend, out_dir: Path, *, max_in_flight: int, source: str,
                max_error_share: float = MAX_ERROR_SHARE, retry_errors: bool = True) -> dict[str, dict]:
    """Run each method over the questions not yet in `<out_dir>/<method>.jsonl` (with
    `retry_errors`, episodes that ended in a backend error earlier run again); return per-method
    counts over the whole file (old and new records). Raises ErrorShareExceeded (module docstring)."""
    label = who.label
    stats = {}
    ids = {str(q.id) for q in questions}
    for name in methods:
        method = who.method(name, settings)
        path = method_file(out_dir, name)
        if retry_errors:
            set_aside_errors(path)
        done = finished_ids(path)
        todo = [q for q in questions if str(q.id) not in done]
        if todo:
            with EpisodeSink(path, total=len(questions), already_done=len(questions) - len(todo),
                             label=f"{label} {name}", max_error_share=max_error_share) as sink:
                run_episodes(llm, lambda: backend, todo, method, sink, teacher=label,
                             max_in_flight=max_in_flight, source=source)
        stats[name] = method_stats(path, ids)
    return stats


def set_aside_errors(path: Path) -> int:
    """Move the records of episodes a backend error ended out of `path` into
    `errored/<method>.jsonl` beside it, so that their ids are run again; return how many.
    Appended there first, then `path` rewritten atomically: a kill in between leaves them in
    both, and the next run moves them again (the errored file is a log, never read back)."""
    if not path.exists():
        return 0
    records = read_jsonl(path)
    errored = [r for r in records if ended_in_error(r.get("end_reason"))]
    if not errored:
        return 0
    with JsonlAppender(path.parent / ERRORED_DIR / path.name) as log:
        for record in errored:
            log.append(record)
    atomic_write_text(path, "".join(jsonl_line(r) for r in records if not ended_in_error(r.get("end_reason"))))
    print(f"{path}: {len(errored)} episode(s) ended in a backend error last time; running them again "
          f"(their records: {path.parent / ERRORED_DIR / path.name})")
    return len(errored)


def check_error_share(value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise PipelineError(f"max_error_share must be between 0 and 1 (a share of a method's episodes), "
                            f"got {value}")


# A method name becomes a file name: letters, digits, "_" and "-" only, so no separator, "..",
# leading dot or NUL can take the file out of out_dir.
_FILE_STEM = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")


def method_file(out_dir: Path, method: str) -> Path:
    """`<out_dir>/<method>.jsonl`. Method names pass an allow-list before they get here; this
    check keeps the file inside out_dir even if that list ever admits a name made of a path."""
    if not isinstance(method, str) or not _FILE_STEM.fullmatch(method):
        raise PipelineError(f"method name {method!r} cannot name a file in {out_dir}: "
                            "use letters, digits, '_' and '-' only")
    return out_dir / f"{method}.jsonl"


# ------------------------------------------------------------------ who answers the episodes

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


def answerer(cfg: LLMConfig, task: Task | str | None = None) -> PromptedModel | OracleTeacher:
    """The one place where `backend: oracle` is told apart from a language model; either answers
    `task`'s questions (default HotpotQA)."""
    task = get_task(task)
    if cfg.backend == ORACLE:
        return OracleTeacher(cfg.oracle_style, task)
    if cfg.oracle_style != DEFAULT_STYLE:  # it means something only to the oracle: fail, not ignore
        raise PipelineError(f"oracle_style={cfg.oracle_style} applies only to backend=oracle "
                            f"(this model's backend is {cfg.backend})")
    return PromptedModel(cfg, task)


def require_methods(methods: list[str]) -> None:
    if not methods:
        raise PipelineError("methods is empty; name at least one, e.g. methods=[react]")


# ------------------------------------------------------------------ resuming a run folder

# Operational knobs of an LLM section that do not change what it writes (`base_url`: where the
# same model is served, e.g. other replicas when a sharded job resumes on another node).
OPERATIONAL_KEYS = ("max_batch_size", "max_concurrency", "timeout_s", "max_retries", "device", "base_url")


def identity(config: dict, keys: tuple[str, ...]) -> dict:
    """The part of a stage config (`keys`) that decides what its records hold (a config older than
    the `task` key was a HotpotQA run's)."""
    config = {k: task_of(config) if k == "task" else config.get(k) for k in keys}
    for k in ("teacher", "model"):  # the LLM sections: how it is served does not matter
        if isinstance(config.get(k), dict):
            config[k] = {key: v for key, v in config[k].items() if key not in OPERATIONAL_KEYS}
    return config


def check_resumable(out_dir: Path, stage: str, cfg: Any, keys: tuple[str, ...]) -> None:
    """Refuse to append to a folder written by another stage or with a different model,
    question set or prompting settings (`keys` of the stage config `cfg`): records would get
    mixed. An older manifest's config is read in today's key names."""
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


def method_stats(path: Path, ids: set[str]) -> dict:
    """EM, F1, finish rate, steps and tokens over the records of this question set."""
    records = [r for r in read_jsonl(path) if str(r["id"]) in ids] if path.exists() else []
    n = len(records)

    def mean(key: str) -> float:
        return sum(float(r.get(key) or 0) for r in records) / n if n else 0.0

    return {
        "n": n,
        "em": mean("em"),
        "f1": mean("f1"),
        "finish_rate": sum(bool(r.get("finished")) for r in records) / n if n else 0.0,
        "errors": sum(ended_in_error(r.get("end_reason")) for r in records),  # backend errors, counted as wrong
        "mean_steps": mean("n_steps"),
        "prompt_tokens": int(sum(r.get("prompt_tokens") or 0 for r in records)),
        "completion_tokens": int(sum(r.get("completion_tokens") or 0 for r in records)),
        "seconds": round(sum(float(r.get("seconds") or 0) for r in records), 2),
    }


# ------------------------------------------------------------------ a generate / eval run

def start_run(cfg: Any, stage: str, who: PromptedModel | OracleTeacher, settings: MethodSettings,
              keys: tuple[str, ...], *, methods: list[str] | None = None,
              check: Callable[[], None] | None = None) -> tuple[list, WikiBackend, LLM | None, dict[str, dict]]:
    """Check what a run of `cfg` (methods, questions, limit, out_dir, wiki) needs before anything
    is written, then open the page source and the model: (questions, backend, llm, exemplar sources).
    `methods` replaces cfg.methods (eval's default for a checkpoint); `check` is the stage's own
    extra refusal (e.g. eval's precision), run with the resume check."""
    check_error_share(cfg.max_error_share)
    sources = who.check(cfg.methods if methods is None else methods, settings)
    questions = who.task.load_questions(cfg.questions, limit=cfg.limit)
    if not questions:
        raise PipelineError(f"question set '{cfg.questions}' is empty: nothing to "
                            + ("evaluate" if stage == "eval" else stage))
    questions = shard_questions(questions, parse_shard(cfg.shard))
    check_resumable(cfg.out_dir, stage, cfg, keys)
    if check is not None:
        check()
    return questions, open_backend(cfg.wiki), who.open(), sources


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
        write_manifest(path, complete=False, **manifest)
        yield path
