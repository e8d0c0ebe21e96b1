"""The guardian of a managed server: a small process between an eval and its `vllm serve`, so that
no server outlives the eval that started it, however the eval ends (SIGKILL included).

    python -m pipeline.llm.guardian --status-fd FD --log serve.log --grace 60 \
        [--records DIR --address HOST --port PORT] -- CMD [ARGS...]

What vLLM's CPU build does with its processes (vllm 0.32 as installed in .venv-vllm, read in its
source): the API server spawns (multiprocessing `spawn`, forced on CPU by platforms/cpu.py) a
resource tracker and the engine core (v1/engine/utils.py CoreEngineProcManager, not a daemon);
the engine core spawns its worker (v1/executor/multiproc_executor.py, a daemon, the `mp` executor
being forced on CPU). None of them calls setsid or setpgid, none sets a parent-death signal. The
worker watches a pipe from the engine core and stops when it closes; the engine core watches
nothing: orphaned (its API server SIGKILLed), it stays up for good. The engine core turns SIGTERM
and SIGINT into a shutdown request, applied only once it is built: while it loads the model and
profiles memory it keeps going (v1/engine/core.py run_engine_core). The API server turns SIGTERM
into KeyboardInterrupt during its start-up (launchers/api_server/entry.py), and into an orderly
shutdown once uvicorn runs (launchers/launcher.py), which SIGTERMs the engine core and, when it
is still there a few seconds later, SIGKILLs its tree (v1/utils.py, kill_process_tree). The
resource tracker ignores SIGTERM and SIGINT, exits when the last process holding its pipe exits,
and removes the shared memory they leaked. So a server is four processes, and an orderly end
of them all needs someone alive to send the signals. The GPU build is the same in these respects
(the API server sets `spawn` itself, entrypoints/serve/utils/api_utils.py cli_env_setup; with
tensor parallelism one daemon worker per GPU, each watching the engine core's pipe), but for its
data-parallel supervisor (launchers/dp_supervisor.py), which puts each DP server in a process
group of its own (setpgrp): a signal to the server's group alone would miss those, its session
does not.

The guardian

  - is a child subreaper (Linux): every process of the server's tree that loses its parent is
    re-parented to the guardian, not to init, so the guardian can always find and end it;
  - starts CMD in a session of its own (its output appended to --log), with SIGKILL as its
    parent-death signal (should the guardian itself be SIGKILLed, the API server dies with it);
    reports on the status pipe `pid N` at once and `exit N` (the server's exit code; 128+signal
    if signalled) as soon as the server has exited; keeps a record of the server while any of its
    processes lives (pipeline/llm/leftovers.py), so that a server it could not end is named at the
    next start;
  - ends the whole tree (SIGTERM to the server's process group and to every process of its
    session or below the guardian, SIGKILL to what is left after the grace period, the resource
    tracker last so that it can remove the shared memory, then waits until all have exited):
    after `stop` on its standard input (the eval's orderly stop: grace --grace seconds); after
    `kill` on it, its end (the eval is gone, whatever killed it: the kernel closes the pipe), or
    a SIGTERM or SIGHUP to the guardian (grace HURRY_GRACE_S: nobody waits for an answer then,
    and vLLM's engine core ignores SIGTERM while it starts); and after the server exits by itself
    (its workers may not);
  - ignores SIGINT (a Ctrl-C reaches the eval, which stops the server in order) and exits last,
    with the server's exit code.
Its own messages go to its standard output (the eval's), prefixed `[serve]`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import subprocess
import sys
import time

import psutil

from pipeline.core.parent_death import PR_SET_CHILD_SUBREAPER, PR_SET_PDEATHSIG, prctl
from pipeline.llm.leftovers import ServerRecord, live, record_path, session_members, write_record

# SIGTERM to SIGKILL when the eval is gone or killed: seconds, not the orderly stop's grace.
HURRY_GRACE_S = 2.0
TRACKER_GRACE_S = 2.0  # for the resource tracker to clean up once the others are gone


def say(message: str) -> None:
    """A line for the eval's output; once the eval is gone, nobody reads it (no error)."""
    with contextlib.suppress(OSError, ValueError):
        print(f"[serve] {message}", flush=True)


class Status:
    """The status pipe to the eval: `pid N`, then `exit N`. Writes after the eval died are lost."""

    def __init__(self, fd: int):
        self.fd = fd

    def send(self, line: str) -> None:
        with contextlib.suppress(OSError):
            os.write(self.fd, f"{line}\n".encode())


class Orders:
    """What the guardian was told: `stop` (end the server, grace --grace) and `hurry` (end it
    now, grace HURRY_GRACE_S). Read from standard input in the main thread, without a thread of
    its own; set from signal handlers as plain attributes: a handler that took a lock could
    deadlock the main thread it interrupted, if that thread held the lock."""

    def __init__(self) -> None:
        self.stop = self.hurry = False
        self._stdin_open = True

    def hurry_now(self, *_) -> None:
        self.stop = self.hurry = True

    def wait(self, timeout_s: float) -> None:
        """Up to `timeout_s` for a word on standard input (or its end)."""
        if not self._stdin_open:
            time.sleep(timeout_s)
            return
        if not select.select([0], [], [], timeout_s)[0]:
            return
        try:
            data = os.read(0, 4096)
        except OSError:
            data = b""
        if not data:  # the eval closed its end, or is gone
            self._stdin_open = False
            self.hurry_now()
        elif b"kill" in data:
            self.hurry_now()
        elif b"stop" in data:
            self.stop = True


def server_session(guardian_pid: int) -> None:
    """In the server's child before exec: its own session (one group to signal, one session that
    finds its processes wherever they go), SIGINT back to its default (the guardian ignores it),
    and SIGKILL from the kernel should the guardian itself be killed. The kernel sends that
    signal only for a death after the prctl: a guardian killed during the fork is seen here, as
    a parent that is no longer the guardian."""
    os.setsid()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != guardian_pid:
        os._exit(137)


def exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def tree(server: subprocess.Popen) -> list[psutil.Process]:
    """Every live process of the server: below the guardian (the guardian being a subreaper,
    any process of the tree that lost its parent is re-parented here), and of the server's
    session (one that was re-parented elsewhere, or to init, all the same)."""
    found: dict[int, psutil.Process] = {}
    with contextlib.suppress(psutil.Error):
        for process in psutil.Process().children(recursive=True):
            found[process.pid] = process
    for process in session_members(server.pid, exclude=os.getpid()):
        found.setdefault(process.pid, process)
    return [p for p in found.values() if live(p)]


def is_tracker(process: psutil.Process) -> bool:
    """multiprocessing's resource tracker, which removes the shared memory of the processes it
    served once they are gone (it ignores SIGTERM and exits by itself at their end)."""
    try:
        return "resource_tracker" in " ".join(process.cmdline())
    except psutil.Error:
        return False


def end_tree(server: subprocess.Popen, orders: Orders, grace_s: float) -> list[psutil.Process]:
    """SIGTERM to the server's group and to every process of its tree; SIGKILL after the grace
    period (`grace_s`, or HURRY_GRACE_S once hurried, even meanwhile); wait until all have
    exited (each is reaped: the guardian is their parent or their subreaper). Returns what
    survived SIGKILL (nothing, unless a process is stuck in the kernel)."""
    if not tree(server):
        return []
    signal_all(server, signal.SIGTERM)
    started = time.monotonic()
    while True:
        reap(server)
        if not tree(server):
            return []
        limit = HURRY_GRACE_S if orders.hurry else grace_s
        if time.monotonic() - started >= limit:
            break
        orders.wait(0.1)
    say(f"still running {limit:g} s after SIGTERM: SIGKILL")
    return kill_all(server)


def signal_all(server: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(OSError):
        os.killpg(server.pid, sig)
    for process in tree(server):  # a process that left the group would keep its memory
        with contextlib.suppress(psutil.Error):
            process.send_signal(sig)


def kill_all(server: subprocess.Popen) -> list[psutil.Process]:
    """SIGKILL, again and again (a dying process may have forked meanwhile), to all but the
    resource trackers; they get TRACKER_GRACE_S to clean up and exit by themselves."""
    trackers_alone_since = None
    for _ in range(600):
        left = tree(server)
        if not left:
            return []
        targets = [p for p in left if not is_tracker(p)]
        if not targets:
            trackers_alone_since = trackers_alone_since or time.monotonic()
            if time.monotonic() - trackers_alone_since >= TRACKER_GRACE_S:
                targets = left
        for process in targets:
            with contextlib.suppress(psutil.Error):
                process.kill()
        reap(server)
        time.sleep(0.05)
    left = tree(server)
    say(f"processes {[p.pid for p in left]} survived SIGKILL; stop them by hand")
    return left


def reap(server: subprocess.Popen) -> None:
    """Collect every exited child: orphans re-parented here become our zombies (the server's
    own status is left to Popen, which reports it)."""
    server.poll()
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process().children():
            if child.pid != server.pid:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(child.pid, os.WNOHANG)


def record(args: argparse.Namespace, server: subprocess.Popen, command: list[str]):
    """Write the server's record (pipeline/llm/leftovers.py); its path, or None without --records."""
    if not args.records:
        return None
    path = record_path(args.records, os.getpid())
    try:
        write_record(path, ServerRecord(
            guardian_pid=os.getpid(), guardian_started=psutil.Process().create_time(), server_pid=server.pid,
            server_started=psutil.Process(server.pid).create_time(), address=args.address, port=args.port,
            log=args.log, command=" ".join(command)[:500]))
    except (OSError, psutil.Error) as exc:  # the server still runs and is still guarded
        say(f"cannot write the server's record {path} ({exc}); a server left by a killed guardian "
            "would not be named at the next start")
        return None
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.llm.guardian", description=__doc__.split("\n\n")[0])
    parser.add_argument("--status-fd", type=int, required=True, help="pipe to report `pid N` and `exit N` on")
    parser.add_argument("--log", required=True, help="file the server's output is appended to")
    parser.add_argument("--grace", type=float, default=60.0, help="seconds from SIGTERM to SIGKILL on `stop`")
    parser.add_argument("--records", help="folder of the running servers' records (pipeline/llm/leftovers.py)")
    parser.add_argument("--address", default="", help="the server's address, for its record")
    parser.add_argument("--port", type=int, default=0, help="the server's port, for its record")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the server's command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    status, orders = Status(args.status_fd), Orders()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, orders.hurry_now)
    if not prctl(PR_SET_CHILD_SUBREAPER, 1):
        say("not a child subreaper (not Linux?): a process whose parent dies escapes the guardian")
    guardian_pid = os.getpid()
    with open(args.log, "ab") as log:
        try:
            server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      preexec_fn=lambda: server_session(guardian_pid))
        except OSError as exc:
            status.send(f"error {exc.strerror}")
            return 127
    status.send(f"pid {server.pid}")
    record_file = record(args, server, command)
    while server.poll() is None and not orders.stop:
        orders.wait(0.2)
    exited_itself = server.returncode is not None
    if exited_itself:  # say so now: the eval must not hand on answers from a dead server
        status.send(f"exit {exit_code(server.returncode)}")
    survivors = end_tree(server, orders, args.grace)
    code = exit_code(server.wait())
    if not exited_itself:
        status.send(f"exit {code}")
    if record_file is not None and not survivors:
        with contextlib.suppress(OSError):
            record_file.unlink()
    return code


if __name__ == "__main__":
    sys.exit(main())
