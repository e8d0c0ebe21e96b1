"""One server per base model in a `run`: the eval units that need the same model served (the
prompted methods of a model, the LoRA students of that base) share ONE managed `vllm serve`,
started before the first of them that has work to do and stopped after the last, with each
LoRA student as one of its `--lora-modules` (addressed by its unit's name). Each unit keeps its
own `python -m pipeline eval` process, folder, records and resume: the child is told of the
server through pipeline.llm.serving.SHARED_SERVER_ENV and uses it instead of starting its own.

Units share a server when they are in the same phase (and scope: a self-training round's eval
and the next round's generate, whose teacher is that student, share one, never across the
training between rounds: pipeline/rounds.py), serve the same base model with the same
model settings (tensor parallel size, memory fraction, dtype, max context, extra flags) and the
same `serve:` section as their stage would start it (under `prompting.interface: tools`, with
vLLM's tool-call parser and SmolLM2's shipped chat template: pipeline.llm.serving.for_tool_calls),
and run one after another: the eval phase's units of one server are put
next to each other (their order is free), and elsewhere a unit between two of them starts a
new group, so no server is up while a unit outside its group runs. A full fine-tune is a model of
its own: its units share only among themselves. A member whose adapter was not there when the
server started stops in one line naming that adapter.
A shared server that dies mid-unit stops that unit (ServerGone in its child: one line) and with
it the run; the next run starts it again and the unit resumes.

GPU memory (pipeline/core/gpu_memory.py) is checked once per group, for its server, before the
server starts: a unit attached to the running server does not check again, since vLLM fills its
gpu_memory_utilization share of each GPU and the check would find the group's own server.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from pipeline.core import gpu_memory
from pipeline.core.config import to_dict
from pipeline.core.errors import PipelineError
from pipeline.llm.serving import (
    SHARED_SERVER_ENV,
    ManagedServer,
    SharedServer,
    for_tool_calls,
    free_port,
    serve_command,
    shared_server,
)


@dataclass
class ServerGroup:
    """The eval units one server serves, in run order, and that server once started."""

    number: int
    members: list[Any]  # run.Unit, each with `serves` = (base model, adapter folder or None)
    done: Callable[[Any], bool]  # whether a unit's eval is already complete (it will skip)
    server: ManagedServer | None = None
    shared: SharedServer | None = None

    @property
    def base(self) -> str:
        return self.members[0].serves[0]

    def base_name(self) -> str:
        """The name the base model answers to: the prompted unit's model label, if one is here."""
        from pipeline.hub.models import model_label

        prompted = [m for m in self.members if m.serves[1] is None]
        return served_model(prompted[0].config).label if prompted else model_label(self.base)

    def describe(self, index: dict[int, int]) -> str:
        units = ", ".join(str(index[id(m)]) for m in self.members)
        lora = sum(m.serves[1] is not None for m in self.members)
        first, serve = self.members[0].config, self.serve
        tools = (f", tool calls: --tool-call-parser {serve.tool_call_parser}"
                 + (f" --chat-template {serve.chat_template}" if serve.chat_template else "")) if serve.tool_call_parser else ""
        return (f"shared server #{self.number} for {self.base} (units {units}; {lora} LoRA adapter(s) by name): "
                f"`{' '.join(serve.command)}`, tensor parallel {served_model(first).tensor_parallel_size}{tools}, "
                "started once before the first of them that runs, stopped after the last")

    @property
    def serve(self):
        """The `serve:` section the server starts with (its members' keys hold the same one)."""
        return unit_serve(self.members[0])

    def wrap(self, unit) -> Callable[[Any], Any]:
        """The unit's action, run with this group's server up and named to its child."""
        action = unit.action

        def run_member(config):
            if self.done(unit):  # the action prints its own skip line
                return action(config)
            self.start()
            if self.shared is None or self.shared.name_for(self.llm_of(unit)) is None:
                # run unattached, its own GPU check would find this group's server and name it
                raise PipelineError(self.not_served(unit))
            with child_environment({SHARED_SERVER_ENV: json.dumps(asdict(self.shared))}):
                return action(config)
        return run_member

    def not_served(self, unit) -> str:
        """Why a member to do is not in the running server: its adapter was not there when the
        server started (it appeared since, or its training has not finished)."""
        adapters = sorted(self.shared.adapters) if self.shared else []
        started = (f"shared server #{self.number} for {self.base} started with {len(adapters)} adapter(s)"
                   f"{' (' + ', '.join(adapters) + ')' if adapters else ''}")
        adapter = unit.serves[1]
        if adapter is None:
            return f"{lora_name(unit)}: {started}, not with this unit's model {self.base}"
        config = Path(adapter) / "adapter_config.json"
        if config.is_file():
            return (f"{lora_name(unit)}: its LoRA adapter {adapter} was not there when {started}; run the same "
                    "command again: the server then starts with it (finished units skip)")
        return (f"{lora_name(unit)}: its LoRA adapter {config} is not there (its training has not finished), so "
                f"{started} without it; train it first (its train unit), then run again")

    def llm_of(self, unit):
        from pipeline.llm.config import LLMConfig

        base, adapter = unit.serves
        return LLMConfig(model=base, adapter=adapter)

    def start(self) -> None:
        """Start the server for every member still to do whose model is on disk (once)."""
        if self.server is not None:
            return
        from pipeline.hub.models import resolve_model_path

        todo = [m for m in self.members if m.selected and not self.done(m)]
        adapters: dict[str, str] = {}
        for m in todo:  # one name per adapter (a round's eval and the next round's generate share it)
            if m.serves[1] is not None and (Path(m.serves[1]) / "adapter_config.json").is_file() \
                    and m.serves[1] not in adapters.values():
                adapters[lora_name(m)] = m.serves[1]
        first = self.members[0].config
        base = replace(served_model(first), model=resolve_model_path(self.base), adapter=None, name=self.base_name())
        serve = self.serve
        gpu_memory.check(gpu_memory.llm_need(f"shared server #{self.number} for {self.base}", base, serve))
        port = serve.port or free_port(serve.host)
        log = Path(first.out_dir).parent / f"shared-server-{self.number}.log"
        print(f"[serve] shared server #{self.number}: {self.base} with {len(adapters)} adapter(s) for "
              f"{len(todo)} unit(s) still to do", flush=True)
        in_flight = max(m.config.max_in_flight for m in self.members)  # the most episodes a member runs at once
        server = ManagedServer(serve_command(base, serve, port, adapters, in_flight), serve.host, port,
                               [base.label, *adapters], log, serve)
        server.start()
        self.server = server
        self.shared = SharedServer(host=serve.host, port=port, model=base.model, name=base.label,
                                   adapters=adapters, pid=server.server_pid, log=str(log))

    def stop(self, hurry: bool = False) -> None:
        if self.server is not None:
            server, self.server, self.shared = self.server, None, None
            server.stop(hurry=hurry)


def attached() -> bool:
    """Whether the unit running now uses its group's shared server (wrap() hands its children
    SHARED_SERVER_ENV only then): its GPU need was checked once, before that server started."""
    return shared_server() is not None


def served_model(config):
    """The LLM section a unit's server loads: an eval's `model`, a generate's `teacher`."""
    return config.teacher if hasattr(config, "teacher") else config.model


def unit_serve(unit):
    """The `serve:` section a unit's server starts with: its stage's, with the tool-call flags its
    prompting.interface needs (pipeline.llm.serving.for_tool_calls, as the unit's own server would
    start), for the base model the group serves."""
    config = unit.config
    model = replace(served_model(config), model=unit.serves[0])
    return for_tool_calls(config.serve, model, config.prompting.interface)


def lora_name(unit) -> str:
    """A LoRA student's name in a shared server: its eval folder's name (unique in a run)."""
    return Path(unit.config.out_dir).name


def server_key(unit) -> tuple | None:
    """What must be equal for two eval units to share one server; None: it keeps its own."""
    ev = unit.config
    if getattr(unit, "serves", None) is None or getattr(ev, "serve", None) is None:
        return None
    m = served_model(ev)
    settings = (m.backend, m.tensor_parallel_size, m.gpu_memory_utilization, m.dtype, m.max_context,
                m.trust_remote_code, json.dumps(m.extra, sort_keys=True), json.dumps(to_dict(unit_serve(unit)), sort_keys=True))
    return (unit.phase, getattr(unit, "scope", ""), unit.serves[0], *settings)


def plan_groups(units: list, done: Callable[[Any], bool]) -> tuple[list, list[ServerGroup]]:
    """(the units in the order they run, the groups among them). The eval phase's units that can
    share a server are put next to each other (server_order); a group is then a run of
    consecutive units with one key (consecutive_runs), so no shared server is up while a unit
    outside its group runs (that unit's GPU check would find the server, its port be taken).
    Groups of one are left alone. Each member's action and plan line are rewritten to use its
    group's server."""
    units = server_order(units)
    groups = [ServerGroup(i, members, done) for i, members in
              enumerate((m for m in consecutive_runs(units) if len(m) > 1), start=1)]
    index = {id(u): i for i, u in enumerate(units, start=1)}
    for group in groups:
        for unit in group.members:
            unit.needs = group.describe(index)
            unit.action = group.wrap(unit)
            unit.group = group
    return units, groups


# The phase whose units depend on nothing else in it (every eval reads what earlier phases made),
# so their order is free. The teacher phase and the rounds keep their order: a round's eval and
# the next round's generate share a server across no other unit, but a round's units depend on
# each other's outputs.
FREE_ORDER_PHASE = "eval"


def server_order(units: list) -> list:
    """`units` with each eval-phase unit that shares a server key moved up next to the first
    unit of that key (stable otherwise): two students on one base model, or a sweep whose
    students each have a `prompt_model`, would otherwise keep one server up across the units
    between them, or start it twice."""
    first: dict[tuple, int] = {}
    places = []  # (where it goes: its key's first unit's index, its own index)
    for i, unit in enumerate(units):
        key = server_key(unit) if unit.phase == FREE_ORDER_PHASE else None
        places.append((i if key is None else first.setdefault(key, i), i))
    return [units[i] for _, i in sorted(places)]


def consecutive_runs(units: list) -> list[list]:
    """The runs of consecutive units with one server key (units without a key end a run)."""
    runs: list[list] = []
    previous = None
    for unit in units:
        key = server_key(unit)
        if key is not None and key == previous:
            runs[-1].append(unit)
        elif key is not None:
            runs.append([unit])
        previous = key
    return runs


@contextlib.contextmanager
def running(units: list) -> Iterator[Callable[[Any], None]]:
    """Yield `after(unit)`, to call once each unit has run: it stops a group's server after its
    last selected member. Every server still up is stopped on the way out, whatever happened
    (within seconds after a failure)."""
    groups = list({id(u.group): u.group for u in units if getattr(u, "group", None)}.values())
    last = {}
    for group in groups:
        selected = [m for m in group.members if m.selected]
        if selected:
            last[id(selected[-1])] = group

    def after(unit) -> None:
        if id(unit) in last:
            last[id(unit)].stop()
    try:
        yield after
    except BaseException:  # a failure: nothing to drain, each server ends within seconds
        for group in groups:
            group.stop(hurry=True)
        raise
    for group in groups:
        group.stop()


@contextlib.contextmanager
def child_environment(values: dict[str, str]) -> Iterator[None]:
    """These environment variables for the child processes started meanwhile (units run one at
    a time, in this thread)."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
