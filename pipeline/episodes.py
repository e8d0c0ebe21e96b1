"""Shared by `generate` and `eval`: resumable per-method episode files with a live progress bar.

One JSONL file per method holds one record per finished episode (see FORMATS in the README).
A re-run reads the ids already there and runs only the rest; a torn last line from a kill is
dropped. The bar shows episodes done, EM so far and episodes per minute.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

from tqdm import tqdm

from pipeline.errors import PipelineError
from pipeline.storage import JsonlAppender, read_jsonl, remove_stale_temps

LOCK_NAME = ".lock"


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


class EpisodeSink:
    """Append each finished episode durably and update the progress bar."""

    def __init__(self, path: Path, total: int, already_done: int, label: str):
        self.path = path
        self.out = JsonlAppender(path)
        self.em_sum = 0.0
        self.new = 0
        self.started = time.monotonic()
        self.bar = tqdm(total=total, initial=already_done, desc=label, unit="ep", dynamic_ncols=True)

    def __call__(self, record: dict) -> None:
        self.out.append(record)
        self.new += 1
        self.em_sum += float(record.get("em") or 0.0)
        minutes = max(time.monotonic() - self.started, 1e-9) / 60
        self.bar.set_postfix(em=f"{self.em_sum / self.new:.2f}", ep_per_min=f"{self.new / minutes:.1f}")
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()
        self.out.close()

    def __enter__(self) -> EpisodeSink:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def run_methods(llm, label: str, methods: list[str], questions: list, settings, backend,
                out_dir: Path, *, max_in_flight: int, source: str, oracle_style: str = "exact") -> dict[str, dict]:
    """Run each method over the questions not yet in `<out_dir>/<method>.jsonl`; return
    per-method counts over the whole file (old and new records)."""
    from pipeline.agent import run_episodes

    stats = {}
    ids = {str(q.id) for q in questions}
    for name in methods:
        method = build_method_for(label, name, settings, oracle_style)
        path = method_file(out_dir, name)
        done = finished_ids(path)
        todo = [q for q in questions if str(q.id) not in done]
        if todo:
            with EpisodeSink(path, total=len(questions), already_done=len(questions) - len(todo),
                             label=f"{label} {name}") as sink:
                run_episodes(llm, lambda: backend, todo, method, sink, teacher=label,
                             max_in_flight=max_in_flight, source=source)
        stats[name] = method_stats(path, ids)
    return stats


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


def build_method_for(label: str, name: str, settings, oracle_style: str = "exact"):
    if label == "oracle":
        from pipeline.methods.oracle import oracle_method

        return oracle_method(name, settings, oracle_style)
    from pipeline.methods import build_method

    return build_method(name, settings)


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
        "mean_steps": mean("n_steps"),
        "prompt_tokens": int(sum(r.get("prompt_tokens") or 0 for r in records)),
        "completion_tokens": int(sum(r.get("completion_tokens") or 0 for r in records)),
        "seconds": round(sum(float(r.get("seconds") or 0) for r in records), 2),
    }
