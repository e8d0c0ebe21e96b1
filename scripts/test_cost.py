"""What each test costs in CPU seconds (its own process and every process it started, orphans
included) as well as wall seconds: on a machine shared with other work, wall time says more
about the load than about the test; CPU seconds are what an idle CI machine will spend.

    .venv/bin/python scripts/test_cost.py tests/test_vllm_server.py -k busy      # any pytest arguments

It runs `.venv/bin/python -m pytest` as a child subreaper (Linux): a process that loses its
parent (a server's tree after its eval was killed by SIGKILL) is re-parented here, not to init,
and reaped here, so its CPU time is counted too; `RUSAGE_CHILDREN` alone would lose it. Each
test's setup, call and teardown are timed inside pytest (this file is also its plugin), live
processes included: a server that a module-scoped fixture keeps running is charged to each test
for what it spent during that test; its start-up shows in the setup of the first test that uses
it, its stop in the last one's teardown.
Prints one row per test (costliest first) with the load average at its start and end, the
totals, one row per test file, and the whole run's wall time with the load average around it.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LOG_VAR = "TEST_COST_LOG"
PR_SET_CHILD_SUBREAPER = 36


def cpu_seconds(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


# -- the plugin, inside pytest ----------------------------------------------------------------------


def tree_cpu_seconds() -> float:
    """CPU seconds spent so far by pytest, its reaped children, and every live process below the
    runner (a server a module fixture keeps running, an orphan not yet reaped): each process is
    counted once, by itself while alive, then in the rusage of whoever reaped it (pytest, a live
    process below it, or the runner, which logs what it reaps)."""
    import psutil

    total = cpu_seconds(resource.RUSAGE_SELF) + cpu_seconds(resource.RUSAGE_CHILDREN)
    for process in psutil.Process(os.getppid()).children(recursive=True):  # the runner's tree
        if process.pid == os.getpid():
            continue
        try:
            if process.status() != psutil.STATUS_ZOMBIE:
                t = process.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
        except psutil.NoSuchProcess:
            continue  # exited meanwhile: counted once reaped
    return total


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    yield from _timed(item, "setup")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    yield from _timed(item, "call")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    yield from _timed(item, "teardown")


def _timed(item, phase: str):
    started, load, before = time.time(), os.getloadavg()[0], tree_cpu_seconds()
    yield
    row = {"test": item.nodeid, "phase": phase, "start": started, "end": time.time(),
           "cpu": tree_cpu_seconds() - before, "load": [load, os.getloadavg()[0]]}
    with open(os.environ[LOG_VAR], "a") as log:
        log.write(json.dumps(row) + "\n")


# -- the runner, around pytest ----------------------------------------------------------------------


def run(pytest_args: list[str], log: Path) -> tuple[int, list[tuple[float, float]]]:
    """pytest's exit code, and (time, CPU seconds) of each orphan reaped here."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1)
    env = {**os.environ, LOG_VAR: str(log),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "scripts"), os.environ.get("PYTHONPATH")]))}
    pytest_proc = subprocess.Popen([str(ROOT / ".venv" / "bin" / "python"), "-m", "pytest", "-p", "test_cost",
                                    *pytest_args], cwd=ROOT, env=env)
    code, orphans = 1, []
    while True:
        try:
            pid, status, usage = os.wait4(-1, 0)
        except ChildProcessError:  # nothing left: pytest and every orphan reaped
            return code, orphans
        if pid == pytest_proc.pid:
            code = os.waitstatus_to_exitcode(status)
            print(f"pytest and what it reaped: {usage.ru_utime + usage.ru_stime:.1f} CPU s (collection included)")
        else:
            orphans.append((time.time(), usage.ru_utime + usage.ru_stime))


def report(rows: list[dict], orphans: list[tuple[float, float]]) -> None:
    tests: dict[str, dict] = {}
    for row in rows:
        reaped = sum(cpu for t, cpu in orphans if row["start"] <= t <= row["end"])
        test = tests.setdefault(row["test"], {"wall": 0.0, "cpu": 0.0, "setup": 0.0, "load": []})
        test["wall"] += row["end"] - row["start"]
        test["cpu"] += row["cpu"] + reaped
        test["load"] += row["load"]
        if row["phase"] != "call":
            test["setup"] += row["cpu"] + reaped
    print(f"\n{'CPU s':>8} {'wall s':>8} {'fixt. CPU':>9}  {'load':>9}  test")
    for name, t in sorted(tests.items(), key=lambda kv: -kv[1]["cpu"]):
        print(f"{t['cpu']:8.1f} {t['wall']:8.1f} {t['setup']:9.1f}  {t['load'][0]:4.1f}-{t['load'][-1]:<4.1f}  {name}")
    print(f"{sum(t['cpu'] for t in tests.values()):8.1f} {sum(t['wall'] for t in tests.values()):8.1f}"
          f"{'':21}total ({len(tests)} tests; 'fixt. CPU': setup and teardown, shared fixtures included)")
    files: dict[str, dict] = {}
    for name, t in tests.items():
        f = files.setdefault(name.split("::")[0], {"wall": 0.0, "cpu": 0.0, "n": 0, "load": []})
        f["wall"] += t["wall"]
        f["cpu"] += t["cpu"]
        f["n"] += 1
        f["load"] += t["load"]
    print(f"\n{'CPU s':>8} {'wall s':>8} {'tests':>5}  {'load':>9}  file")
    for name, f in sorted(files.items(), key=lambda kv: -kv[1]["cpu"]):
        print(f"{f['cpu']:8.1f} {f['wall']:8.1f} {f['n']:5d}  {min(f['load']):4.1f}-{max(f['load']):<4.1f}  {name}")


def main() -> int:
    log = Path(f"/tmp/test-cost-{os.getpid()}.jsonl")
    started, load = time.time(), os.getloadavg()
    try:
        code, orphans = run(sys.argv[1:], log)
        rows = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    finally:
        log.unlink(missing_ok=True)
    report(rows, orphans)
    print(f"orphans reaped here: {len(orphans)}, {sum(cpu for _, cpu in orphans):.1f} CPU s")
    print("whole run: {:.0f} s wall; load average {:.2f} / {:.2f} / {:.2f} at the start, "
          "{:.2f} / {:.2f} / {:.2f} at the end".format(time.time() - started, *load, *os.getloadavg()))
    return code


if __name__ == "__main__":
    sys.exit(main())
