"""The one exception type a user sees as a one-line message (exit code 2), not a traceback,
and the wording of operating-system errors in that same one-line form."""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable


class PipelineError(Exception):
    """Bad input or configuration: the message says what, where, and how to fix it."""

    exit_code = 2


# errno -> what to do about it; the path and the system's own words come first.
_OS_ERROR_HINTS = {
    errno.EACCES: "choose a folder you can write or fix its permissions",
    errno.EPERM: "choose a folder you own",
    errno.ENOTDIR: "a part of this path is a file; choose another path",
    errno.EISDIR: "give a file, not a folder",
    errno.EROFS: "choose a writable location",
    errno.ENOSPC: "free space (or choose another location) and re-run the "
                  "same command: finished work is kept and the stage resumes",
    errno.EDQUOT: "free space and re-run the same command: finished work is kept and "
                  "the stage resumes",
    errno.EFBIG: "raise the file-size limit (ulimit -f) and re-run the "
                 "same command: finished work is kept and the stage resumes",
    errno.EMFILE: "raise the limit (ulimit -n) or lower the parallelism "
                  "(e.g. max_in_flight) and re-run",
    errno.ENFILE: "close other programs and re-run",
    errno.EEXIST: "a file stands where a folder is needed; remove it or choose another path",
    errno.ENOENT: "check the path",
    errno.ENAMETOOLONG: "choose a shorter path",
}


def os_error_message(exc: OSError, path: str | os.PathLike | None = None) -> str:
    """One line for an OSError: the path, what went wrong, what to do. `path` names the
    file when the error itself does not (a failed write on an open file has no name)."""
    where = exc.filename if exc.filename is not None else path
    if exc.filename2 is not None:
        where = f"{where} -> {exc.filename2}"
    reason = exc.strerror or str(exc)
    hint = _OS_ERROR_HINTS.get(exc.errno)
    text = f"{reason}: {hint}" if hint else reason
    return f"{where}: {text}" if where is not None else text


def one_line_errors(run: Callable[[], int]) -> int:
    """A command's entrance: `run()`'s exit code, or for bad input (PipelineError) and what the
    operating system refuses (OSError) one `error:` line on stderr and exit 2, never a traceback."""
    try:
        return run()
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:
        print(f"error: {os_error_message(exc)}", file=sys.stderr)
        return 2


class BackendFailure(PipelineError):
    """A model or page source that failed for good (e.g. an HTTP call out of retries).

    Episode runners catch it and end only the episode it touched (`backend_error: ...`); the
    transport's own error types subclass it, so methods need not know how a backend is reached."""
