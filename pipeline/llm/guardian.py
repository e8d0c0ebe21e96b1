"""The guardian of a managed server: a small process between an eval and its `vllm serve`, so that
no server outlives the eval that started it, however the eval ends (SIGKILL included).

    python -m pipeline.llm.guardian --status-fd FD --log serve.log --grace 60 -- CMD [ARGS...]

Why a process of its own: vLLM's server is a process tree (the API server, its engine core, the
engine's workers, a resource tracker). With only PR_SET_PDEATHSIG on the direct child, an eval
killed during start-up (SIGTERM) or mid-run (SIGKILL) left the API server and its engine core
running, re-parented to init; and while starting, vLLM may not exit for long after a SIGTERM.
The guardian

  - is a child subreaper (Linux): every process of the server's tree that loses its parent is
    re-parented to the guardian, not to init, so the guardian can always find and end it;
  - starts CMD in a session of its own (its output appended to --log) and reports on the status
    pipe `pid N` at once and `exit N` (the server's exit code; 128+signal if signalled) as soon
    as the server has exited;
  - ends the whole tree (SIGTERM to the server's process group and to every descendant, SIGKILL
    to what is left after --grace seconds, then waits until all have exited) when its standard
    input closes: the eval closes it to stop the server, and the kernel closes it when the eval
    dies, whatever killed it; also on SIGTERM, and after the server exits by itself (its workers
    may not);
  - ignores SIGINT (a Ctrl-C reaches the eval, which stops the server in order) and exits last,
    with the server's exit code.
Its own messages go to its standard output (the eval's), prefixed `[serve]`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

import psutil

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def prctl(option: int, value: int) -> None:
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(option, value)


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


def server_session() -> None:
    """In the server's child before exec: its own session (one group to signal), and SIGKILL from
    the kernel should the guardian itself be killed (its last line of defence)."""
    os.setsid()
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def descendants() -> list[psutil.Process]:
    """Every process below the guardian: the server and, the guardian being a subreaper, any
    process of the server's tree that lost its own parent."""
    try:
        return psutil.Process().children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def end_tree(server: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM to the server's group and every descendant; SIGKILL after `grace_s`; wait until all
    have exited (each is reaped: the guardian is their parent or their subreaper)."""
    if not descendants():
        return
    signal_all(server, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        reap(server)
        if not alive():
            return
        time.sleep(0.1)
    say(f"still running {grace_s:g} s after SIGTERM: SIGKILL")
    for _ in range(300):  # each pass kills what is left, and what a dying process forked meanwhile
        signal_all(server, signal.SIGKILL)
        reap(server)
        if not alive():
            return
        time.sleep(0.1)
    say(f"processes {[p.pid for p in descendants()]} survived SIGKILL; stop them by hand")


def signal_all(server: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(server.pid, sig)
    for process in descendants():  # a worker that left the group would keep its memory
        with contextlib.suppress(psutil.NoSuchProcess):
            process.send_signal(sig)


def alive() -> bool:
    return any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE
               for p in descendants() if _exists(p))


def _exists(process: psutil.Process) -> bool:
    try:
        process.status()
    except psutil.NoSuchProcess:
        return False
    return True


def reap(server: subprocess.Popen) -> None:
    """Collect every exited child: orphans re-parented here become our zombies (the server's
    own status is left to Popen, which reports it)."""
    server.poll()
    with contextlib.suppress(psutil.NoSuchProcess):
        for child in psutil.Process().children():
            if child.pid != server.pid:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(child.pid, os.WNOHANG)


def watch_stdin(stop: threading.Event) -> None:
    """Read until EOF: the eval closed its end, or the eval is gone."""
    with contextlib.suppress(OSError):
        while os.read(0, 4096):
            pass
    stop.set()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.llm.guardian", description=__doc__.split("\n\n")[0])
    parser.add_argument("--status-fd", type=int, required=True, help="pipe to report `pid N` and `exit N` on")
    parser.add_argument("--log", required=True, help="file the server's output is appended to")
    parser.add_argument("--grace", type=float, default=60.0, help="seconds from SIGTERM to SIGKILL")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the server's command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    status = Status(args.status_fd)
    stop = threading.Event()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    with open(args.log, "ab") as log:
        try:
            server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      preexec_fn=server_session)
        except OSError as exc:
            status.send(f"error {exc.strerror}")
            return 127
    status.send(f"pid {server.pid}")
    threading.Thread(target=watch_stdin, args=(stop,), daemon=True).start()
    while server.poll() is None and not stop.wait(0.2):
        pass
    exited_itself = server.returncode is not None
    if exited_itself:  # say so now: the eval must not hand on answers from a dead server
        status.send(f"exit {exit_code(server.returncode)}")
    end_tree(server, args.grace)
    code = exit_code(server.wait())
    if not exited_itself:
        status.send(f"exit {code}")
    return code


if __name__ == "__main__":
    sys.exit(main())
