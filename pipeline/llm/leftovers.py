"""Records of the managed servers running on this machine, so that a server an earlier run left
behind is found and named at the next start (its port, its PIDs), never collided with on its port
nor silently reused, nor left to hold the GPUs while a new server fails to load beside it.

Each guardian (pipeline/llm/guardian.py) writes `<records dir>/<host>-<guardian pid>.json` as soon
as its server has a PID, and removes it once every process of the server's tree has exited. A
record whose guardian is gone while processes of its server are still alive is a leftover: its
guardian was killed (SIGKILL) before it could end them. The server leads a session of its own
(the guardian starts it with setsid), and every process vLLM starts stays in that session (its
CPU build spawns its engine core, the engine's worker and a resource tracker without setsid or
setpgid) even when re-parented to init, so the session finds them all.

The records dir is $REACT_PIPELINE_SERVERS, else `servers/` in the pipeline's cache
(~/.cache/react-pipeline, or $REACT_PIPELINE_CACHE). Records name their host: a home folder
shared by the nodes of a cluster holds the records of every node, and each node checks its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from pipeline.core.storage import atomic_write_text

RECORDS_ENV = "REACT_PIPELINE_SERVERS"


@dataclass
class ServerRecord:
    guardian_pid: int
    guardian_started: float  # psutil's create_time: a PID reused by another process has another
    server_pid: int  # also its session's id and its process group's (setsid)
    server_started: float
    address: str
    port: int
    log: str
    command: str


def records_dir() -> Path:
    root = os.environ.get(RECORDS_ENV)
    if root:
        return Path(root).expanduser()
    from pipeline.core.paths import cache_root

    return cache_root() / "servers"


def record_path(directory: Path, guardian_pid: int) -> Path:
    return Path(directory) / f"{socket.gethostname()}-{guardian_pid}.json"


def write_record(path: Path, record: ServerRecord) -> None:
    """Write whole or not at all (a reader never sees half a record)."""
    atomic_write_text(path, json.dumps(asdict(record)))


def read_records(directory: Path) -> list[tuple[Path, ServerRecord]]:
    """This host's records (an unreadable or foreign one is skipped: it names no process here)."""
    out = []
    for path in sorted(Path(directory).glob(f"{socket.gethostname()}-*.json")):
        with contextlib.suppress(OSError, ValueError, TypeError):
            out.append((path, ServerRecord(**json.loads(path.read_text(encoding="utf-8")))))
    return out


def live(process: psutil.Process) -> bool:
    """Running and not a zombie (a zombie holds no memory, no port and no GPU)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def same_process(pid: int, started: float) -> psutil.Process | None:
    """The live process `pid` if it is the one started at `started` (not a reused PID)."""
    try:
        process = psutil.Process(pid)
        if abs(process.create_time() - started) < 1.0 and live(process):
            return process
    except psutil.Error:
        pass
    return None


def session_members(sid: int, exclude: int | None = None) -> list[psutil.Process]:
    """Every live process of session `sid`, wherever it was re-parented. Linux does not reuse a
    PID while a session or group still carries it as its id, so these are the server's."""
    found = []
    for pid in psutil.pids():
        if pid == exclude:
            continue
        try:
            if os.getsid(pid) == sid:
                process = psutil.Process(pid)
                if live(process):
                    found.append(process)
        except (OSError, psutil.Error):  # gone meanwhile
            continue
    return found


def kill_session(sid: int, timeout_s: float = 10.0) -> list[psutil.Process]:
    """SIGKILL every process of session `sid`, again until none is left (a dying process may
    have forked meanwhile); what is still there after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while (members := session_members(sid)) and time.monotonic() < deadline:
        for process in members:
            with contextlib.suppress(psutil.Error):
                process.kill()
        time.sleep(0.1)
    return members


def leftover_processes(record: ServerRecord) -> list[psutil.Process]:
    """The processes of a recorded server that outlived its guardian ([] while the guardian runs:
    the server is then a live run's, which its guardian will end)."""
    if same_process(record.guardian_pid, record.guardian_started):
        return []
    members = {p.pid: p for p in session_members(record.server_pid)}
    server = same_process(record.server_pid, record.server_started)
    if server is not None:
        members[server.pid] = server
    return sorted(members.values(), key=lambda p: p.pid)


def describe(process: psutil.Process) -> str:
    try:
        name = process.name()
    except psutil.Error:
        name = "?"
    return f"{process.pid} {name}"


def find_leftovers(directory: Path | None = None) -> list[tuple[ServerRecord, list[psutil.Process]]]:
    """Each recorded server of this host with processes left by a killed guardian. A record
    whose processes are all gone is removed on the way (its server ended after all)."""
    out = []
    for path, record in read_records(directory or records_dir()):
        left = leftover_processes(record)
        if left:
            out.append((record, left))
        elif not same_process(record.guardian_pid, record.guardian_started):
            with contextlib.suppress(OSError):
                path.unlink()
    return out


def leftover_message(leftovers: list[tuple[ServerRecord, list[psutil.Process]]]) -> str:
    """One sentence naming each leftover server (port, PIDs, log) and how to stop it."""
    parts, pids = [], []
    for record, processes in leftovers:
        started = time.strftime("%Y-%m-%d %H:%M", time.localtime(record.server_started))
        parts.append(f"port {record.port} on {record.address}, started {started}, processes "
                     f"{', '.join(describe(p) for p in processes)} (its log: {record.log})")
        pids += [str(p.pid) for p in processes]
    return (f"serve: {len(leftovers)} server(s) left running by an earlier run whose guardian was killed: "
            f"{'; '.join(parts)}; they may hold the GPUs and the port: stop them (kill -9 {' '.join(pids)}) "
            "and re-run")


def port_holder(port: int) -> str | None:
    """The process listening on TCP `port` (PID and command), when this user may see it."""
    with contextlib.suppress(psutil.Error, OSError):
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
                with contextlib.suppress(psutil.Error):
                    return f"pid {conn.pid}: {' '.join(psutil.Process(conn.pid).cmdline())[:200]}"
                return f"pid {conn.pid}"
    return None
