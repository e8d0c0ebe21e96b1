"""Durable files: atomic writes, append-only JSONL that survives a kill, and run manifests.

Every stage writes through these helpers, so a consumer never sees half a file and a killed
run loses at most the record it was writing (which is detected and dropped on resume).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

from pipeline.errors import PipelineError

_UMASK = os.umask(0)
os.umask(_UMASK)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it over `path` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    os.chmod(tmp_path, 0o666 & ~_UMASK)  # mkstemp makes 0600; outputs get the usual mode
    try:
        yield tmp_path
        with open(tmp_path, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False, default=str) + "\n")


def read_jsonl(path: str | os.PathLike, *, tolerate_torn_tail: bool = True) -> list[dict]:
    """Read a JSONL file. A torn *last* line (a killed writer) is dropped when tolerated;
    a bad line anywhere else is corruption and raises with the file and line number."""
    path = Path(path)
    if not path.exists():
        raise PipelineError(f"{path}: file not found")
    records = []
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    if tolerate_torn_tail and text and not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]  # a last line without its newline is torn, even if it parses
    lines = text.split("\n")
    last = len(lines) - 1
    while last >= 0 and not lines[last].strip():
        last -= 1
    for i, line in enumerate(lines[: last + 1]):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            if i == last and tolerate_torn_tail:
                break
            raise PipelineError(f"{path}:{i + 1}: not valid JSON ({exc.msg}); fix or delete that line") from None
        if not isinstance(record, dict):
            raise PipelineError(f"{path}:{i + 1}: expected a JSON object per line")
        records.append(record)
    return records


class JsonlAppender:
    """Append records one per line, flushed and fsynced, after cutting off a torn tail.

    Usage: `with JsonlAppender(path) as out: out.append(record)`.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._truncate_torn_tail()
        self._fh = open(self.path, "a", encoding="utf-8")

    def _truncate_torn_tail(self) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        if not data or data.endswith(b"\n"):
            return
        keep = data.rfind(b"\n") + 1  # drop the partial last line a kill left behind
        with open(self.path, "r+b") as fh:
            fh.truncate(keep)

    def append(self, record: dict) -> None:
        self._fh.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> JsonlAppender:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
            cwd=Path(__file__).resolve().parent,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


PACKAGES = ("torch", "transformers", "peft", "accelerate", "datasets", "trl", "deepspeed", "vllm")


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[name] = metadata.version(name)
    return versions


def file_fingerprint(path: str | os.PathLike) -> dict:
    """Cheap identity of an input (size + mtime + path); stages compare it to decide 'done'."""
    st = Path(path).stat()
    return {"path": str(path), "size": st.st_size, "mtime": int(st.st_mtime)}


def write_manifest(path: str | os.PathLike, *, stage: str, config: Any, complete: bool, **extra) -> dict:
    """Write a run manifest atomically. `complete=False` marks outputs a consumer must refuse."""
    manifest = {
        "stage": stage,
        "complete": complete,
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "git_commit": git_commit(),
        "packages": package_versions(),
        "argv": sys.argv,
        "config": config,
        **extra,
    }
    atomic_write_json(path, manifest)
    return manifest


def read_json(path: str | os.PathLike) -> Any:
    """A JSON file's content; a missing or broken file is one clear error naming file and line."""
    path = Path(path)
    if not path.is_file():
        raise PipelineError(f"{path}: file not found")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        where = f"{path}:{exc.lineno}" if isinstance(exc, json.JSONDecodeError) else str(path)
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else "not UTF-8 text"
        raise PipelineError(f"{where}: not valid JSON ({reason})") from None


def read_manifest(path: str | os.PathLike) -> dict | None:
    return read_json(path) if Path(path).exists() else None


def require_complete(manifest_path: str | os.PathLike, what: str) -> dict:
    """Refuse an input whose producing stage did not finish."""
    manifest = read_manifest(manifest_path)
    if manifest is None:
        raise PipelineError(f"{what}: no manifest at {manifest_path}; run the stage that produces it first")
    if not manifest.get("complete"):
        raise PipelineError(
            f"{what}: {manifest_path} says the run that wrote it is incomplete; re-run that stage to finish it"
        )
    return manifest


def is_done(manifest_path: str | os.PathLike, **expected: Any) -> bool:
    """The one "is this unit done?" rule: its manifest exists, says complete, and holds the
    `expected` values (e.g. `config=...` for a stage run, `steps=...` for a training run), so a
    unit finished with other settings is redone, never silently reused."""
    manifest = read_manifest(manifest_path)
    return bool(manifest and manifest.get("complete")
                and all(manifest.get(key) == value for key, value in expected.items()))
