"""A rehearsal run's environment: the simulated node, the label on every output, the teacher's server.

`session(rehearsal)` sets, for `run` and every process it starts: the stand-in nvidia-smi of the
simulated node first on PATH (node.py), and REHEARSAL_ENV (pipeline.core.storage writes
`rehearsal: true` into every manifest, and the cards say it). It yields `prepare(units, done)`,
which wraps the units' actions:
- the teacher phase: each server the grid expects to be running (an `openai` teacher's base_url)
  starts before its first unit that is not `done` and stops after its last, as the user does on
  the node (`vllm serve ... &`, `run --only teacher`, `kill %1`); a rehearsal resumed after that
  phase starts no teacher;
- the filter unit, and each self-training round's filter: the labelled fill-in of the questions
  its teacher answered (fill_in.py), since a random teacher solves none;
- each training unit: the simulated node is checked for its launch on the target node, the
  check `run` makes there.
Every server is stopped on the way out, whatever happened.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from pipeline.core.storage import REHEARSAL_ENV
from pipeline.rehearsal import node
from pipeline.rehearsal.fill_in import filling
from pipeline.rehearsal.rewrite import Endpoint, Rehearsal, serve_section

TEACHER_PHASE, FILTER_PHASE, ROUNDS_PHASE = "teacher", "filter", "rounds"


@contextlib.contextmanager
def session(rehearsal: Rehearsal) -> Iterator[Callable[[list], None]]:
    folder = rehearsal.config.out_dir / "node"
    target = rehearsal.config.node
    node.install(folder, target.gpus, target.gpu_mib)
    os.environ[REHEARSAL_ENV] = "1"
    print(f"[rehearsal] simulated node: {target.gpus} x {target.gpu_mib} MiB GPUs, reported by the stand-in "
          f"{folder / 'bin' / 'nvidia-smi'}; every GPU check of the run asks it", flush=True)
    servers: list = []

    def prepare(units: list, done: Callable[[object], bool]) -> None:
        for unit in units:  # the plan's launch line: the stand-in's here beside the target node's
            if unit.title in rehearsal.target_needs:
                unit.needs = f"{unit.needs}\n[run]        on the target node: {rehearsal.target_needs[unit.title]}"
        chosen = [u for u in units if u.selected and u.phase == TEACHER_PHASE]
        if rehearsal.endpoints and chosen:
            for unit in chosen:
                unit.action = starting(unit, done, rehearsal, servers)
            chosen[-1].action = stopping(chosen[-1].action, servers)
        generating = [u for u in units if u.phase == TEACHER_PHASE and kind(u) == "GenerateConfig"
                      and u.config.oracle is None]  # the stand-in teacher's own trajectories need no fill-in
        round_generate = None  # a self-training round's generate unit: its filter comes next
        for unit in units:
            # the filter of the model teacher's episodes (not the stand-in's own: compare_oracle)
            if (unit.selected and unit.phase == FILTER_PHASE and generating
                    and str(generating[0].config.out_dir) in unit.config.inputs):
                unit.action = filling(unit.action, generating[0].config)
            if unit.phase == ROUNDS_PHASE and kind(unit) == "GenerateConfig":
                round_generate = unit.config
            if unit.selected and unit.phase == ROUNDS_PHASE and kind(unit) == "FilterConfig" and round_generate:
                unit.action = filling(unit.action, round_generate)  # the round's student is random too
            if unit.selected and kind(unit) == "FinetuneConfig":
                unit.action = checking_gpus(unit.action, rehearsal.target_launches[unit.config.student_name])
            if unit.selected:
                unit.action = timed(unit.action, unit.phase, seconds)
    seconds: dict[str, float] = {}
    try:
        yield prepare
    finally:
        for server in servers:
            server.stop(hurry=True)
        if seconds:
            print("[rehearsal] time per phase on this machine: " + ", ".join(
                f"{phase} {s:.0f} s" for phase, s in seconds.items()) + f"; {sum(seconds.values()):.0f} s in all",
                flush=True)


def kind(unit) -> str:
    """The unit's stage config class by name (the stages are not imported here)."""
    return type(unit.config).__name__


def timed(action, phase: str, seconds: dict[str, float]):
    """The unit's action, its wall time added to its phase's (servers' start-ups included)."""
    def run_unit(config):
        started = time.monotonic()
        try:
            return action(config)
        finally:
            seconds[phase] = seconds.get(phase, 0.0) + time.monotonic() - started
    return run_unit


def checking_gpus(action, launch):
    """A training unit's action, first checking the simulated node for its launch on the target
    node (its GPUs to itself), as `run` checks there: on this CPU it launches on no GPU, so its own
    check has nothing to ask. A unit whose final model is on disk will skip, and is not checked."""
    from pipeline.core import gpu_memory
    from pipeline.core.storage import is_done

    def run_unit(config):
        if not is_done(Path(config.output_dir) / "final" / "manifest.json"):
            gpu_memory.check(gpu_memory.training_need(
                f"training {config.student_name} on {config.format} ({launch.processes} processes of "
                f"{launch.config.stem} on the target node)", launch.processes))
        return action(config)
    return run_unit


def starting(unit, done: Callable[[object], bool], rehearsal: Rehearsal, servers: list):
    """The unit's action, the teacher's servers started first unless they are up or the unit
    will skip (a vLLM-CPU start-up is ~25 s; a teacher phase resumed or done needs none)."""
    action = unit.action

    def run_unit(config):
        if not servers and not done(unit):
            for i, endpoint in enumerate(rehearsal.endpoints):
                server = endpoint_server(endpoint, rehearsal.config.out_dir, rehearsal.config.node.gpus, i,
                                         len(rehearsal.endpoints))
                servers.append(server)
                server.start()
        return action(config)
    return run_unit


def stopping(action, servers: list):
    def run_unit(config):
        result = action(config)
        while servers:
            servers.pop().stop()
        return result
    return run_unit


def endpoint_server(endpoint: Endpoint, out_dir, gpus: int, index: int = 0, count: int = 1):
    """The vLLM-CPU server of a teacher the grid expects at 127.0.0.1:<port>: the tiny model answering
    under the grid's model name, on its share of the node's GPUs at vLLM's default share (one
    server: all of them, as the grid's own `vllm serve --tensor-parallel-size 8` would hold them;
    `count` servers: gpus // count each, side by side, as they must be on the node)."""
    from pipeline.core.config import build
    from pipeline.llm.config import LLMConfig
    from pipeline.llm.serving import ManagedServer, ServeConfig, serve_command

    share = gpus // count
    devices = ",".join(str(g) for g in range(index * share, (index + 1) * share))
    env = {"CUDA_VISIBLE_DEVICES": devices} if count > 1 else {}  # one server sees the whole node
    serve = build(ServeConfig, serve_section({"port": endpoint.port, "env": env}), where="rehearsal teacher server")
    llm = LLMConfig(backend="vllm", model=str(endpoint.model), name=endpoint.name,
                    tensor_parallel_size=share, dtype="bfloat16")
    cmd = serve_command(llm, serve, endpoint.port)
    print(f"[rehearsal] the teacher's server at 127.0.0.1:{endpoint.port}: the tiny model as {endpoint.name} "
          f"(GPUs {devices} of the node)", flush=True)
    return ManagedServer(cmd, serve.host, endpoint.port, [endpoint.name],
                         out_dir / "serve" / f"teacher-{endpoint.port}.log", serve)
