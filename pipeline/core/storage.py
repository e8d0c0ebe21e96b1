"""Durable files: atomic writes, append-only JSONL that survives a kill, and run manifests.

Every stage writes through these helpers, so a consumer never sees half a file and a killed
run loses at most the record it was writing (which is detected and dropped on resume).
"""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

from pipeline.core.errors import PipelineError, os_error_message

_UMASK = os.umask(0)
os.umask(_UMASK)


TMP_SUFFIX = ".tmp"


def temp_prefix(name: str) -> str:
    """`.<name>.<pid>.`: temporaries are hidden, end in `.tmp`, and carry their writer's pid so
    the next run can tell a kill's leftover (writer gone) from a live writer's file."""
    return f".{name}.{os.getpid()}."


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it over `path` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path.name), suffix=TMP_SUFFIX, dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    os.chmod(tmp_path, 0o666 & ~_UMASK)  # mkstemp makes 0600; outputs get the usual mode
    try:
        yield tmp_path
        with open(tmp_path, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp_path, path)
    except OSError as exc:
        if exc.filename is None:  # a failed write names no file: name the one being written
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


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
    text = read_utf8(path)
    if tolerate_torn_tail and text and not text.endswith("\n"):
        torn = text[text.rfind("\n") + 1:]
        text = text[: text.rfind("\n") + 1]  # a last line without its newline is torn, even if it parses
        say_torn(path, torn)
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


_TORN_SAID: set[Path] = set()


def say_torn(path: Path, torn: str) -> None:
    """Say once per file and process that its torn last line is skipped (it used to go unsaid)."""
    if path.resolve() in _TORN_SAID:
        return
    _TORN_SAID.add(path.resolve())
    print(f"note: {path}: skipped 1 torn last line ({len(torn.encode('utf-8'))} bytes without a newline: "
          "a writer was stopped mid-line); a resumed run writes that record again", file=sys.stderr)


def read_utf8(path: str | os.PathLike) -> str:
    """A text file of ours, refused in one line (file, line, byte) when it is not UTF-8."""
    raw = Path(path).read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise not_utf8(path, raw[: exc.start].count(b"\n") + 1, raw[exc.start]) from None


def utf8_lines(path: str | os.PathLike) -> Iterator[tuple[int, str]]:
    """(line number, line) of a text file read as it streams; a line that is not UTF-8 is
    refused in one line naming the file and line."""
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            try:
                yield lineno, raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise not_utf8(path, lineno, raw[exc.start]) from None


def not_utf8(path: str | os.PathLike, lineno: int, byte: int) -> PipelineError:
    return PipelineError(f"{path}:{lineno}: not UTF-8 text (byte {byte:#04x}); give the JSONL file the "
                         "pipeline wrote, or re-save this one as UTF-8")


def jsonl_line(record: dict) -> str:
    """One record as the line a JSONL file of ours holds (newline included)."""
    return json.dumps(record, ensure_ascii=False, default=str) + "\n"


class JsonlAppender:
    """Append records one per line, flushed and fsynced, after cutting off a torn tail.

    Usage: `with JsonlAppender(path) as out: out.append(record)`.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._truncate_torn_tail()
        self._fh = open(self.path, "ab", buffering=0)  # unbuffered: nothing is left to flush after an error

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
        """Write one whole line or nothing: on a failed write (a full disk) the part that got out
        is cut off again, so the file still ends with the last complete record."""
        data = jsonl_line(record).encode("utf-8")
        fd = self._fh.fileno()
        start = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)  # shrinking needs no free space
            raise OSError(exc.errno, exc.strerror, str(self.path)) from exc

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> JsonlAppender:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def check_writable_dir(path: str | os.PathLike, what: str = "out_dir") -> None:
    """Refuse, before any work starts, an output folder that cannot be created or written: a
    path under a file, a read-only or system location, no permission. Creates nothing: a probe
    file is made in the nearest existing folder and vanishes at once (O_TMPFILE or unlink)."""
    path = Path(path)
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        where = "" if existing == path else f"{path}: "
        raise PipelineError(f"{what}: {where}{existing} is a file, not a folder; choose another path")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        where = path if existing == path else f"{path} (in {existing})"  # not the probe's random name
        if exc.errno in _KNOWN_WRITE_ERRORS:
            message = os_error_message(OSError(exc.errno, exc.strerror), where)
        else:  # e.g. ENOENT in /proc: a system folder, not a typo
            message = f"{where}: cannot create files there ({exc.strerror}); choose a writable folder"
        raise PipelineError(f"{what}: {message}") from None


_KNOWN_WRITE_ERRORS = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EMFILE,
                       errno.ENFILE)


def remove_stale_temps(folder: str | os.PathLike, name: str | None = None) -> list[Path]:
    """Delete the `.<name>.<pid>.*.tmp` files and folders that a killed writer left in `folder`
    (only those of `name` when given); they are never read, since consumers open final names
    only. A temporary whose writer is still alive is kept."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    removed = []
    for tmp in folder.glob(f".{glob.escape(name) + '.' if name else ''}*{TMP_SUFFIX}"):
        if _writer_alive(tmp.name):
            continue
        if tmp.is_dir() and not tmp.is_symlink():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        removed.append(tmp)
    return removed


def _writer_alive(name: str) -> bool:
    parts = name.split(".")  # ['', <name parts...>, <pid>, <random>, 'tmp']
    pid = parts[-3] if len(parts) >= 5 else ""
    if not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, owned by someone else
    return True


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


# Set by `run --rehearse` (pipeline/rehearsal) for itself and every process it starts: every
# manifest then says `rehearsal: true`, so nothing a rehearsal's tiny random models write can be
# mistaken for a result.
REHEARSAL_ENV = "REACT_PIPELINE_REHEARSAL"


def write_manifest(path: str | os.PathLike, *, stage: str, config: Any, complete: bool, **extra) -> dict:
    """Write a run manifest atomically. `complete=False` marks outputs a consumer must refuse."""
    rehearsal = {"rehearsal": True} if os.environ.get(REHEARSAL_ENV) else {}
    manifest = {
        **rehearsal,
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
