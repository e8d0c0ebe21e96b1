"""How the launched script fails: one line for a bad input or a failed write (a full disk while
checkpointing, whichever library raised it), written to the file the `train` stage names so that
the stage prints it once, not once per rank; a bug keeps its traceback.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pipeline.core.errors import os_error_message
from pipeline.core.storage import atomic_write_json

# What torch.save's C++ writer says when a write fails (it gives no errno): seen on a full disk.
TORCH_WRITE_FAILURES = ("PytorchStreamWriter failed writing", "inline_container.cc", "iostream error")


def storage_error_message(exc: Exception, output_dir: Path | None) -> str | None:
    """One line for a failed write, whichever library raised it: an OSError, safetensors'
    SafetensorError ("I/O error: ... (os error 28)"), torch.save's RuntimeError ("unexpected
    pos ...", "iostream error"); None for anything else (a bug keeps its traceback)."""
    import re
    import shutil

    if isinstance(exc, OSError):
        return os_error_message(exc, output_dir)
    text = str(exc)
    code = re.search(r"\(os error (\d+)\)", text)
    if type(exc).__name__ == "SafetensorError" and code:
        number = int(code.group(1))
        return os_error_message(OSError(number, os.strerror(number)), output_dir)
    chain = [exc, exc.__context__]
    if output_dir is not None and any(isinstance(e, RuntimeError) and any(m in str(e) for m in TORCH_WRITE_FAILURES)
                                      for e in chain):
        free = shutil.disk_usage(output_dir).free / 1e6 if output_dir.exists() else float("nan")
        return (f"{output_dir}: writing a checkpoint failed ({text.splitlines()[0] if text else type(exc).__name__}; "
                f"{free:.1f} MB free there); free space (or check permissions) and re-run the same command: "
                "training resumes from the latest complete checkpoint")
    return None


# Set by the `train` stage: the child writes its one error line here instead of stderr, and
# the stage prints it once (not once per rank) without the launcher's traceback after it.
ERROR_FILE_ENV = "PIPELINE_ERROR_FILE"


def report_error(message: str, exit_code: int) -> int:
    error_file = os.environ.get(ERROR_FILE_ENV)
    if error_file:
        try:
            atomic_write_json(error_file, {"message": message, "exit_code": exit_code})
            return exit_code
        except OSError:
            pass  # the stage cannot hear us: say it on stderr
    print(f"error: {message}", file=sys.stderr)
    return exit_code
