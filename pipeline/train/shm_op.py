"""DeepSpeed's CPU communication op (deepspeed_shm_comm), built once per environment, never left locked.

A DeepSpeed launch on CPU processes compiles the op on first use (deepspeed/comm/torch.py
build_shm_op, through torch.utils.cpp_extension.load): 24 s on 2 idle cores, over a minute under
load. torch guards the build with a lock file (torch/utils/file_baton.py: created with O_EXCL, its
descriptor held open by the builder until it is done, then removed) and every later process
waits for the file to go, with no timeout. A builder killed mid-build (a rehearsal stopped with
SIGKILL) leaves the file, and every DeepSpeed launch on the machine then waits for ever.

Here, before each DeepSpeed launch on CPU processes (`train`, `grpo`, `run`'s units):
- the op's folder is one per Python environment (~/.cache/torch_extensions/<python>-<environment
  hash>, unless TORCH_EXTENSIONS_DIR is set): checkouts with other environments (a fresh clone
  beside a worktree) no longer rebuild it for each other at every launch;
- a lock no process holds open (its builder gone) is removed, said in one line;
- the op is built once, in one process, where it is not built yet, so that the ranks find it.

    python -m pipeline.train.shm_op     # build it now (scripts/test.sh does, before the suite)
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

OP = "deepspeed_shm_comm"
BUILD = "from deepspeed.comm.torch import build_shm_op; build_shm_op()"
STALE_AFTER_S = 2.0  # a lock this old that nobody holds open: its builder is gone (torch removes it on release)


def extensions_dir() -> Path:
    """TORCH_EXTENSIONS_DIR where set, else this environment's own folder under ~/.cache/torch_extensions."""
    given = os.environ.get("TORCH_EXTENSIONS_DIR")
    if given:
        return Path(given)
    key = hashlib.sha1(os.path.realpath(sys.prefix).encode()).hexdigest()[:10]
    return Path.home() / ".cache" / "torch_extensions" / f"py{sys.version_info[0]}{sys.version_info[1]}_cpu-{key}"


def holders(path: Path) -> list[int]:
    """The processes that hold `path` open (those whose /proc/<pid>/fd this user may read)."""
    target = str(path.resolve())
    pids = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                    pids.append(int(pid))
                    break
            except OSError:
                continue
    return pids


def clear_stale_lock(folder: Path) -> bool:
    """Remove the op's build lock when its builder is gone: no process holds it open, then or
    STALE_AFTER_S after it was made (torch closes its descriptor just before removing the file);
    True when one was removed."""
    lock = folder / OP / "lock"
    try:
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return False
    if holders(lock):
        return False
    if age < STALE_AFTER_S:
        time.sleep(STALE_AFTER_S - age)
        if not lock.exists() or holders(lock):
            return False
    lock.unlink(missing_ok=True)
    print(f"[deepspeed] removed a stale build lock {lock} (its builder was stopped mid-build; no process holds it): "
          "removed, the launch goes on", flush=True)
    return True


def built(folder: Path) -> bool:
    return (folder / OP / f"{OP}.so").is_file()


def ready() -> int:
    """Before a DeepSpeed launch on CPU processes: this environment's op folder in
    TORCH_EXTENSIONS_DIR (inherited by the ranks), a stale lock cleared, the op built once; the
    build's exit code (0 where there was nothing to build). A failed build is left to the ranks,
    which fail with DeepSpeed's own message."""
    folder = extensions_dir()
    os.environ["TORCH_EXTENSIONS_DIR"] = str(folder)
    clear_stale_lock(folder)
    if not built(folder):
        print(f"[deepspeed] building its CPU communication op once, in {folder} (about a minute)", flush=True)
        return subprocess.run([sys.executable, "-c", BUILD], check=False, env={**os.environ}).returncode
    return 0


def before_launch(config_path: Path, gpus: int) -> None:
    """ready() for a DeepSpeed launch on CPU processes (on GPUs DeepSpeed builds no such op)."""
    from pipeline.core.config import read_yaml

    if gpus == 0 and read_yaml(config_path).get("distributed_type") == "DEEPSPEED":
        ready()


if __name__ == "__main__":
    sys.exit(ready())
