"""DeepSpeed's CPU communication op (pipeline/train/shm_op.py): a build killed mid-way leaves
torch's build lock, and the next launch clears it in one line and goes on instead of waiting
for ever. Each test has its own TORCH_EXTENSIONS_DIR: the machine's own op is never touched.

    .venv/bin/python -m pytest tests/test_shm_op.py -q
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from pipeline.train import shm_op

REPO = Path(__file__).resolve().parents[1]
# torch's own lock (torch/utils/file_baton.py), taken as its extension build takes it, then held
TAKE_LOCK = ("import sys, time; from torch.utils.file_baton import FileBaton; "
             "assert FileBaton(sys.argv[1]).try_acquire(); print('held', flush=True); time.sleep(600)")


def holding(lock: Path) -> subprocess.Popen:
    lock.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", TAKE_LOCK, str(lock)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_lock_whose_builder_was_killed_is_cleared_and_a_held_one_is_not(tmp_path, monkeypatch, capsys):
    from torch.utils.file_baton import FileBaton

    lock = tmp_path / shm_op.OP / "lock"
    builder = holding(lock)
    try:
        assert shm_op.holders(lock) == [builder.pid]
        assert not shm_op.clear_stale_lock(tmp_path) and lock.exists()  # its builder is alive: it waits
    finally:
        builder.send_signal(signal.SIGKILL)
        builder.wait()
    assert lock.exists()  # what a kill mid-build leaves: torch's wait() would spin on it for ever
    assert shm_op.clear_stale_lock(tmp_path)
    assert not lock.exists()
    assert capsys.readouterr().out.strip() == (
        f"[deepspeed] removed a stale build lock {lock} (its builder was stopped mid-build; no process holds it): "
        "removed, the launch goes on")
    baton = FileBaton(str(lock))
    baton.wait()  # returns at once
    assert baton.try_acquire()


def test_each_environment_has_its_own_op_folder_unless_one_is_given(monkeypatch):
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    here = shm_op.extensions_dir()
    assert here.parent == Path.home() / ".cache" / "torch_extensions" and here.name.startswith("py3")
    monkeypatch.setattr(sys, "prefix", "/elsewhere/.venv")
    assert shm_op.extensions_dir() != here  # another checkout's environment: another folder
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", "/given")
    assert shm_op.extensions_dir() == Path("/given")


def test_a_build_killed_inside_its_lock_does_not_stop_the_next_launch(tmp_path):
    """The real build (DeepSpeed's build_shm_op, as every rank of a CPU DeepSpeed launch calls it)
    killed with its process group by SIGKILL while it holds torch's lock: the lock stays; the next
    `python -m pipeline.train.shm_op` (what `train` and `grpo` run before a DeepSpeed CPU launch)
    says it removed it and builds the op, and a rank's own call then loads it. The op is copied
    from this environment's (built once, as scripts/test.sh does before the suite) less its final
    link, so that the build inside the lock is the short link step, not a minutes-long compile."""
    source = shm_op.extensions_dir()
    if not shm_op.built(source):  # what scripts/test.sh does before the suite
        subprocess.run([sys.executable, "-m", "pipeline.train.shm_op"], check=True, timeout=900,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    shutil.copytree(source / shm_op.OP, tmp_path / shm_op.OP)
    lock, library = tmp_path / shm_op.OP / "lock", tmp_path / shm_op.OP / f"{shm_op.OP}.so"
    for _ in range(5):  # the link takes a second or two: caught inside it nearly always at once
        library.unlink(missing_ok=True)
        first = subprocess.Popen([sys.executable, "-c", shm_op.BUILD], env=env, start_new_session=True,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while not lock.exists() and first.poll() is None:
            time.sleep(0.01)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(first.pid, signal.SIGKILL)
        first.wait()
        if lock.exists() and not library.exists():
            break
    assert lock.exists() and not shm_op.built(tmp_path), "never killed inside the build's lock"
    second = subprocess.run([sys.executable, "-m", "pipeline.train.shm_op"], env=env, capture_output=True, text=True,
                            timeout=600)
    assert second.returncode == 0, second.stderr[-2000:]
    assert f"[deepspeed] removed a stale build lock {lock}" in second.stdout
    assert shm_op.built(tmp_path) and not lock.exists(), second.stdout[-2000:] + second.stderr[-2000:]
    rank = subprocess.run([sys.executable, "-c", shm_op.BUILD], env=env, capture_output=True, text=True, timeout=120)
    assert "built successfully" in rank.stdout, rank.stderr[-2000:]
