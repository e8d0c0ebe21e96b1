"""Resumable per-method episode files of a `generate` or `eval` run, with a live progress bar.

One JSONL file per method holds one record per finished episode (`pipeline.agent.scheduler.episode_record`).
A re-run reads the ids already there and runs only the rest; a torn last line from a kill is
dropped. The bar shows episodes done, EM so far and episodes per minute.

Backend errors (an episode ended `llm_error: ...` or `backend_error: ...`: the model or the page
source failed, not the model's answer) are the run's problem, not the model's score: once more
than `max_error_share` of a method's episodes end so, the run stops with one line naming the
first error, and no summary or complete manifest is written. A re-run moves the errored records
to `errored/<method>.jsonl` (kept for reading) and runs those episodes again.
"""

from __future__ import annotations

import math
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm import tqdm

from pipeline.agent.scheduler import run_episodes
from pipeline.core.errors import PipelineError
from pipeline.core.storage import JsonlAppender, atomic_write_text, jsonl_line, read_jsonl
from pipeline.llm.base import LLM
from pipeline.methods import MethodSettings
from pipeline.methods.base import ended_in_error

if TYPE_CHECKING:
    from pipeline.agent.answerers import Answerer

ERRORED_DIR = "errored"  # <out_dir>/errored/<method>.jsonl: errored records a re-run set aside
# Default of the stage key `max_error_share`: above this share of a method's episodes ending in a
# backend error, the run stops instead of summarising (module docstring).
MAX_ERROR_SHARE = 0.1


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


def run_methods(who: Answerer, llm: LLM | None, methods: list[str], questions: list,
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
