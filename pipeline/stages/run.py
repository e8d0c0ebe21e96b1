"""`run`: one experiment grid end to end, in phases: generate -> filter -> train -> grpo -> eval -> rounds -> plot.

    python -m pipeline run --config configs/demo.yaml          # the CPU demo (scripts/demo.sh)
    python -m pipeline run --config configs/paper.yaml         # the full-scale grid (GPUs)

The experiment YAML names the task (`task: fever`; default hotpotqa), the teacher, the formats
(`formats:` the trajectory formats generated, filtered, trained and prompted with the method of the same name),
the students by size class, the question sets and each stage's settings (sections `generate`, `filter`, `train`, `eval`, `plot`, with
`students:` a list; a student given as `finetuned:` is already fine-tuned, e.g. a released agent,
and is only evaluated). Every unit (a generate run, a dataset, a student x method training run, an
evaluation) is skipped when its manifest says it is complete with the same config; an interrupted
unit resumes (episodes by id, training from its latest complete checkpoint). The run ends with
the table and the figure's path.

GPUs: the units run in phases, so that one model holds the GPUs at a time (PHASES, pipeline/stages/grid/unit.py):
teacher (generate, and the teacher's own prompted eval), filter, train, grpo (only with a
`grpo` section: GRPO of the fine-tuned students, docs/grpo.md), eval (every other eval), rounds
(only with a `self_training` section: docs/rounds.md), plot.
`--only`, `--from` and `--until` take phase names and select a part of the grid, e.g. `--only teacher` while the teacher is served, then `--from filter` once it is stopped.
The plan printed first lists every unit with its phase and what it needs served where; units
outside the selection are listed as "not selected" and never run; selected units still skip
when complete. Each generate and eval runs in its own `python -m pipeline generate|eval` process
(as training runs under `accelerate launch`), so one model's GPU memory is free before the next one loads.

Self-training (`self_training: {rounds: N, ...}`, pipeline/rounds.py, docs/rounds.md): after round 1 (the grid
above), rounds 2..N run in the `rounds` phase, each four units with their own folders
(generate with the last round's student as the teacher, filter, train, eval), and `plot` adds
the rounds table and figure (EM by round):

    python -m pipeline run --config configs/small-rounds.yaml

This module is the command; the grid's plan, checks and unit runs are its parts in pipeline/stages/grid/.
"""

from __future__ import annotations

import argparse
import difflib
import shutil
import time

from pipeline.core import gpu_memory
from pipeline.core.config import add_config_arguments, build, load_config
from pipeline.core.errors import PipelineError
from pipeline.llm.serve_groups import running
from pipeline.stages.grid.checks import check_selected
from pipeline.stages.grid.children import unit_skips
from pipeline.stages.grid.plan import plan, print_plan, select, show_plan
from pipeline.stages.grid.spec import RunConfig, Student
from pipeline.stages.grid.unit import PHASES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, RunConfig)  # --print-config prints every unit's effective config
    phases = ", ".join(PHASES)
    parser.add_argument("--only", metavar="PHASE[,PHASE]", help=f"run only these phases ({phases})")
    parser.add_argument("--from", dest="from_phase", metavar="PHASE", help="run from this phase on")
    parser.add_argument("--until", metavar="PHASE", help="run up to and including this phase")
    parser.add_argument("--rehearse", action="store_true",
                        help="rehearse the grid on this CPU: tiny models of the same architectures, the local "
                        "data, CPU launches, in <out_dir>-rehearsal (pipeline/rehearsal)")
    parser.description = (parser.description or "") + "\n\nphases, in the order they run:\n" + "\n".join(
        f"  {name:<8} {text}" for name, text in PHASES.items()) + (
        "\n\nEach phase can run on its own, e.g. with the teacher served: run --only teacher; "
        "then, the teacher stopped: run --from filter. Units outside the selection are listed as "
        "'not selected' in the plan and never run.")


def main(args: argparse.Namespace) -> int:
    if args.config is None:
        raise PipelineError("run needs --config configs/<experiment>.yaml (e.g. configs/demo.yaml)")
    phases = selected_phases(args.only, args.from_phase, args.until)
    cfg = load_config(RunConfig, args.config, args.overrides)
    students = [build(Student, s, where=f"{args.config} students[{i}]") for i, s in enumerate(cfg.students)]
    if args.rehearse:  # an ordinary config from here on: tiny models, local data, CPU launches
        return rehearse_grid(cfg, students, phases, args.print_config)
    if args.print_config:
        units = select(plan(cfg, students), phases)
        print_plan(units)
        check_selected(cfg, units)  # what the real run refuses before its first unit: exit 2 here too
        return 0
    run(cfg, students, phases)
    return 0


def rehearse_grid(cfg: RunConfig, students: list[Student], phases: list[str], print_config: bool) -> int:
    """`run --rehearse`: the grid as written is planned and checked first (the user's own values,
    what the target node can hold: pipeline/stages/grid/node_fit.py), then rewritten into its CPU
    rehearsal (pipeline/rehearsal), whose plan is checked before anything is written (its tiny
    models included): a refused plan leaves nothing behind."""
    from pipeline.rehearsal.rewrite import check_vllm_build, print_rehearsal, rehearse
    from pipeline.stages.grid.node_fit import check_node

    fit = check_node(cfg.node, plan(cfg, students))
    rehearsal = rehearse(cfg, students)
    rehearsal.target_needs = fit.needs
    check_vllm_build(rehearsal)
    cfg, students = rehearsal.config, rehearsal.students
    units = select(plan(cfg, students), phases)
    print_rehearsal(rehearsal, "#" if print_config else "[run]")
    fresh = not cfg.out_dir.exists()
    made = rehearsal.write_models()
    try:
        check_selected(cfg, units)
    except PipelineError:
        for folder in [cfg.out_dir] if fresh else made:  # nothing of a refused plan stays
            shutil.rmtree(folder, ignore_errors=True)
        raise
    if print_config:
        on_target_node(units, rehearsal.target_needs)
        print_plan(units)
        return 0
    from pipeline.rehearsal.session import session

    with session(rehearsal) as prepare:
        run(cfg, students, phases, prepare)
    return 0


def on_target_node(units: list, needs: dict[str, str]) -> None:
    """Each launch's line in the plan: the stand-in's launch here beside the target node's."""
    for unit in units:
        if unit.title in needs:
            unit.needs = f"{unit.needs}\n#        on the target node: {needs[unit.title]}"


def selected_phases(only: str | None, start: str | None, until: str | None) -> list[str]:
    """The phases --only / --from / --until select, in run order (all of them by default)."""
    names = list(PHASES)
    if only is not None and (start is not None or until is not None):
        raise PipelineError("--only names the phases to run; it cannot be combined with --from / --until")
    if only is not None:  # `--only ''` or `--only ,` selects nothing: refused, not run as everything
        chosen = {check_phase(p.strip(), "--only") for p in only.split(",")}
        return [p for p in names if p in chosen]
    first = names.index(check_phase(start, "--from")) if start is not None else 0
    last = names.index(check_phase(until, "--until")) if until is not None else len(names) - 1
    if first > last:
        raise PipelineError(f"--from {start} comes after --until {until}; phases run in the order {', '.join(names)}")
    return names[first:last + 1]


def check_phase(name: str, option: str) -> str:
    if not name:
        raise PipelineError(f"{option}: names no phase (empty); give one of {', '.join(PHASES)}"
                            + (", several joined by commas" if option == "--only" else ""))
    if name not in PHASES:
        close = difflib.get_close_matches(name, PHASES, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise PipelineError(f"{option} {name}: not a phase{hint} (phases: {', '.join(PHASES)})")
    return name


def run(cfg: RunConfig, students: list[Student], phases: list[str] | None = None, prepare=None) -> dict:
    """`prepare(units, done)`, where given (a rehearsal's: pipeline/rehearsal/session.py), sees the
    selected plan before it runs and may wrap units' actions; `done(unit)`: whether it will skip."""
    started = time.monotonic()
    units = select(plan(cfg, students), phases or list(PHASES))
    check_selected(cfg, units)
    if prepare is not None:  # after the checks, which know the units by their actions
        prepare(units, unit_skips)
    show_plan(units)
    outputs = run_units(units)
    if "png" not in outputs:
        chosen = [p for p in PHASES if any(u.selected and u.phase == p for u in units)]
        print(f"[run] phases {', '.join(chosen) or '(none)'} done in {time.monotonic() - started:.0f} s")
        return outputs
    print(f"[run] done in {time.monotonic() - started:.0f} s; figure: {outputs['png']} (and .svg), "
          f"table: {outputs['md']}, csv: {outputs['csv']}, orderings: {outputs['orderings']}")
    return outputs


def run_units(units: list) -> dict:
    """Each selected unit in order, the servers units share up around them; a unit's refusal is
    re-read once those servers are stopped, so it advises killing none of them."""
    outputs: dict = {}
    running_then: set[int] = set()  # the processes a unit's refusal advised killing, alive when it failed
    try:
        with running(units) as after:  # the servers units share (pipeline/llm/serve_groups.py)
            for i, unit in enumerate(units, start=1):
                if unit.selected:
                    stage(f"[{i}/{len(units)}] {unit.title}")
                    unit_started = time.monotonic()
                    try:
                        outputs = unit.action(unit.config) or {}
                    except PipelineError as exc:
                        running_then = gpu_memory.advised_pids(str(exc))
                        raise
                    after(unit)
                    # each unit's wall time (a skipped one's too): where a long grid's hours went
                    print(f"[run] [{i}/{len(units)}] done in {time.monotonic() - unit_started:.0f} s", flush=True)
    except PipelineError as exc:  # the servers are stopped now
        now = gpu_memory.advice_now(str(exc), running_then)
        if now == str(exc):
            raise
        reread = PipelineError(now)
        reread.exit_code = exc.exit_code  # a child's own exit code, as in_child raised it
        raise reread from None
    return outputs


def stage(title: str) -> None:
    print(f"\n[run] === {title}", flush=True)
