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

GPUs: the units run in phases, so that one model holds the GPUs at a time (PHASES below):
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
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

import yaml

from pipeline import rounds
from pipeline.agent.answerers import check_oracle, unread_model_dropped
from pipeline.core import gpu_memory, precision
from pipeline.core.config import (
    add_config_arguments,
    at_least,
    build,
    checked,
    distinct,
    folder_name,
    listed,
    load_config,
    merged,
    read_section,
    read_yaml,
    repeated_items,
    to_dict,
    upgrade_keys,
)
from pipeline.core.errors import PipelineError
from pipeline.core.relay import pieces
from pipeline.core.storage import check_writable_dir, is_done, read_manifest
from pipeline.llm.serve_groups import attached, plan_groups, running
from pipeline.report.rounds import RoundsReport, write_rounds_report
from pipeline.rl.heldout import HeldoutSettings
from pipeline.rounds import SelfTrainingConfig
from pipeline.stages.eval import EvalConfig, model_under_test, precision_record
from pipeline.stages.eval import check_settings as check_eval
from pipeline.stages.filter import FilterConfig, run_filter
from pipeline.stages.filter import check_settings as check_filter
from pipeline.stages.generate import GenerateConfig
from pipeline.stages.generate import check_settings as check_generate
from pipeline.stages.grpo import GrpoConfig, grpo
from pipeline.stages.grpo import resolve as resolve_grpo
from pipeline.stages.plot import PlotConfig, run_plot
from pipeline.stages.train import gpu_count, pick_accelerate_config, processes_for, train
from pipeline.tasks import DEFAULT_TASK, get_task
from pipeline.train.config import FinetuneConfig, resolve
from pipeline.train.plan import foreseen
from pipeline.train.preflight import check_question_sets, preflight_launch
from pipeline.train.sft import split_batch


@dataclass
class Student:
    RENAMED_KEYS: ClassVar[dict[str, str]] = {"checkpoint": "finetuned"}  # old key -> new (pipeline.core.config)

    name: str = checked(folder_name)  # folder label, e.g. smollm2-135m
    config: Path | None = None  # its FinetuneConfig YAML (configs/students/...); not with `finetuned`
    size_class: str | None = None  # 135m | 8b | 62b ...; a known released agent has its own
    params_b: float | None = None  # billions of parameters: the figure's x axis
    prompt_model: dict = field(default_factory=dict)  # LLMConfig keys to prompt the base model; {} = skip
    finetune: bool = True  # train it on each method and evaluate zero-shot
    train: dict = field(default_factory=dict)  # FinetuneConfig overrides for this student
    # Already fine-tuned (a folder or hub id, e.g. forestai/fireact_llama_2_7b_lora): evaluated
    # and plotted beside ours, never trained; `format` says how it decodes when it is not known.
    finetuned: str | None = None  # eval's `finetuned=` for it
    format: str | None = None
    # EvalConfig keys for this student's evaluations, over the experiment's `eval` section: e.g. a
    # 70B student's model.tensor_parallel_size, model.gpu_memory_utilization, model.max_context,
    # model.backend, or a `serve:` section (pipeline/llm/serving.py)
    eval: dict = field(default_factory=dict)


@dataclass
class GrpoPhase:
    """The grid's optional `grpo` section: GRPO (pipeline/stages/grpo.py) of each trained student's
    fine-tuned `final/` of these formats, then an eval of each result (docs/grpo.md)."""

    formats: list[str] = checked(distinct, default_factory=list)  # react and/or act; [] (the default): no grpo phase
    config: Path | None = None  # a GrpoConfig YAML to start from (its `grpo` section or the whole file)
    students: list[str] | None = checked(distinct, default=None)  # the student names to run it for; None: every student trained here
    settings: dict = field(default_factory=dict)  # GrpoConfig keys over `config` (e.g. max_steps, group_size)
    # Whose student GRPO continues: 1, the grid's fine-tuned students (the `grpo` phase, before the
    # evals); N > 1, self-training round N's (after that round, in the `rounds` phase): the chain
    # round 1 -> rounds -> GRPO of the last round's student in one command (configs/small-chain.yaml)
    from_round: int = at_least(1, default=1)


@dataclass
class RunConfig:
    RENAMED_KEYS: ClassVar[dict[str, str]] = {"methods": "formats"}  # old key -> new (pipeline.core.config)

    experiment: str = checked(folder_name, default="default")  # a folder under each student's output_root
    out_dir: Path = Path("runs/default")
    task: str = "hotpotqa"  # hotpotqa | fever (pipeline.tasks), for generate and every eval
    # The grid's trajectory formats: the teacher generates each (prompted with the method of the same
    # name), filter makes its SFT dataset, each student trains on it, and prompted students are evaluated with it
    formats: list[str] = checked(listed, default_factory=lambda: ["standard", "cot", "act", "react"])
    wiki: dict = field(default_factory=dict)  # WikiConfig keys shared by generate and eval
    generate: dict = field(default_factory=dict)  # GenerateConfig keys
    filter: dict = field(default_factory=dict)  # FilterConfig keys
    train: dict = field(default_factory=dict)  # FinetuneConfig keys shared by every student
    eval: dict = field(default_factory=dict)  # EvalConfig keys shared by every evaluation
    plot: dict = field(default_factory=dict)  # PlotConfig keys
    # Student entries: name, config, size_class, params_b, prompt_model, finetune, train, finetuned,
    # format, and eval (this student's EvalConfig keys, e.g. model.tensor_parallel_size or serve)
    students: list[dict] = field(default_factory=list)
    grpo: GrpoPhase = field(default_factory=GrpoPhase)  # GRPO of the trained students; off unless `formats` names one
    # Self-training rounds after round 1 (the grid): each round's student is the next round's
    # teacher (pipeline/rounds.py)
    self_training: SelfTrainingConfig = field(default_factory=SelfTrainingConfig)
    # true: the questions a student trains on (generate's, the rounds', GRPO's) may be among those
    # its fine-tuned evals score (pipeline/tasks/overlap.py); refused otherwise
    allow_question_overlap: bool = False


# The order units run in, and the names --only / --from / --until take.
PHASES = {
    "teacher": "generate, and the teacher's own prompted eval (while the teacher is served)",
    "filter": "correct trajectories -> SFT datasets (CPU)",
    "train": "every student x format training (accelerate launch)",
    "grpo": "GRPO of the grid's fine-tuned students, when the `grpo` section names formats (accelerate launch); "
            "with grpo.from_round N > 1, round N's students instead, in the rounds phase",
    "eval": "every other eval: prompted students, fine-tuned students, released agents",
    "rounds": "self-training rounds 2..N (self_training:), each: the last student generates, filter, train, eval",
    "plot": "figure 3, the table and the orderings check",
}


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
        from pipeline.rehearsal.rewrite import print_rehearsal, rehearse

        rehearsal = rehearse(cfg, students)
        cfg, students = rehearsal.config, rehearsal.students
        print_rehearsal(rehearsal, "#" if args.print_config else "[run]")
        if not args.print_config:
            from pipeline.rehearsal.session import session

            with session(rehearsal) as prepare:
                run(cfg, students, phases, prepare)
            return 0
    if args.print_config:
        units = select(plan(cfg, students), phases)
        print_plan(units)
        check_selected(cfg, units)  # what the real run refuses before its first unit: exit 2 here too
        return 0
    run(cfg, students, phases)
    return 0


def selected_phases(only: str | None, start: str | None, until: str | None) -> list[str]:
    """The phases --only / --from / --until select, in run order (all of them by default)."""
    names = list(PHASES)
    if only and (start or until):
        raise PipelineError("--only names the phases to run; it cannot be combined with --from / --until")
    if only:
        chosen = {check_phase(p.strip(), "--only") for p in only.split(",") if p.strip()}
        return [p for p in names if p in chosen]
    first = names.index(check_phase(start, "--from")) if start else 0
    last = names.index(check_phase(until, "--until")) if until else len(names) - 1
    if first > last:
        raise PipelineError(f"--from {start} comes after --until {until}; phases run in the order {', '.join(names)}")
    return names[first:last + 1]


def check_phase(name: str, option: str) -> str:
    if name not in PHASES:
        close = difflib.get_close_matches(name, PHASES, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise PipelineError(f"{option} {name}: not a phase{hint} (phases: {', '.join(PHASES)})")
    return name


def print_plan(units: list[Unit]) -> None:
    """The short plan the real run prints first, then each unit's title and the config it would
    run with, as YAML (nothing runs)."""
    show_plan(units, prefix="#")
    print(f"# the {len(units)} units' configs follow\n")
    for i, unit in enumerate(units, start=1):
        status = "" if unit.selected else " (not selected)"
        print(f"# [{i}/{len(units)}] {unit.phase}: {unit.title}{status}")
        print(f"#   {unit.needs}")
        print(yaml.safe_dump(to_dict(unit.config), sort_keys=False))


@dataclass
class Unit:
    """One step of the grid: its title, its stage config, and how to run it."""

    title: str
    config: Any
    action: Any  # callable(config) -> result
    phase: str = ""  # a PHASES name
    needs: str = ""  # the model it needs and where (the plan prints it)
    selected: bool = True  # False: listed in the plan, never run
    # The precision record this unit would compute in, for a unit whose results carry one (the
    # same call skip_or / launch_train make); None for units without a precision
    precision: Any = None
    # An eval unit with `serve:`: the model its server loads, (base model, LoRA adapter or None);
    # units that need the same server share one (pipeline/llm/serve_groups.py sets `group`)
    serves: tuple[str, str | None] | None = None
    group: Any = None
    # Units share a server only within one scope of a phase: a round's eval and the next round's
    # generate, not the training between them (pipeline/llm/serve_groups.py)
    scope: str = ""


def plan(cfg: RunConfig, students: list[Student]) -> list[Unit]:
    """Build and check every unit's config before anything runs, so a typo in the eval section
    fails in a second, not after hours of training; return them in phase order."""
    check_unit_keys(cfg, students)
    repeated = repeated_items([s.name for s in students])  # two students' units would share folders
    if repeated:
        raise PipelineError(f"students: {repeated[0]!r} names two students; give each its own name (it names its folders)")
    dataset_dir = cfg.out_dir / "sft"
    units = []
    teacher = None
    if not students or not all(s.finetuned for s in students):  # a grid of released students needs no data
        gen = generate_config(cfg)
        check_oracle(gen.oracle, gen.serve, gen.teacher, "teacher")
        teacher = gen.teacher if gen.oracle is None else None  # the stand-in teacher is served by no one
        units = [Unit("generate: the teacher writes trajectories", gen, skip_or(generate_in_child), "teacher",
                      needs_model(gen.teacher, oracle=gen.oracle)),
                 Unit("filter: correct trajectories -> SFT datasets", filter_config(cfg, dataset_dir), run_filter,
                      "filter", "no model: CPU only")]
    for student in students:
        check_student(student)
        if student.prompt_model:
            ev = eval_config(cfg, student, None)
            phase = "teacher" if teacher is not None and same_model(ev.model, teacher) else "eval"
            units.append(Unit(f"eval: {student.name} prompted", ev, skip_or(evaluate_in_child, eval_precision),
                              phase, needs_eval(ev), precision=eval_precision, serves=(ev.model.model, None)))
        if student.finetuned:
            ev = finetuned_eval_config(cfg, student)
            units.append(Unit(f"eval: {student.name} (already fine-tuned: {student.finetuned})",
                              ev, skip_or(evaluate_in_child, eval_precision), "eval", needs_eval(ev),
                              precision=eval_precision))
            continue
        if not student.finetune:
            continue
        for method in cfg.formats:
            ft = train_config(cfg, student, method, dataset_dir)
            final = Path(ft.output_dir) / "final"
            units.append(Unit(f"train: {student.name} on {method}", ft, launch_train, "train", needs_train(ft),
                              precision=training_precision_record))
            ev = eval_config(cfg, student, final, method)
            check_adapter_reachable(ev, ft)
            units.append(Unit(f"eval: {student.name} fine-tuned on {method}", ev,
                              with_model_card(final, skip_or(evaluate_in_child, eval_precision)), "eval", needs_eval(ev),
                              precision=eval_precision, serves=served_as(ft, final)))
            if method in grpo_formats(cfg, student) and cfg.grpo.from_round == 1:
                units += grpo_units(cfg, student, ft)
    summaries = [u.config.out_dir / "summary.json" for u in units if u.title.startswith("eval")]
    later = round_units(cfg, students, dataset_dir)  # self-training rounds 2..N and their report
    units += later
    rounds_evals = [u.config.out_dir / "summary.json" for u in later if u.title.startswith("eval (round")]
    summaries += [u.config.out_dir / "summary.json" for u in later if u.title.startswith("eval:")]  # GRPO after a round
    units.append(Unit("plot: figure 3 and the table", plot_config(cfg, summaries, rounds_evals), run_plot, "plot",
                      "no model: CPU only"))
    order = list(PHASES)
    units = sorted(units, key=lambda u: order.index(u.phase))  # stable: the grid's order within a phase
    check_grpo_students(cfg, students)
    for unit in units:
        check_unit(unit)
    check_questions_apart(cfg, units)
    plan_groups(units, done=lambda unit: unit_done(unit.config, unit.precision))  # an eval's, or none
    return units


# The keys `run` sets on every unit of a kind itself (its folders, names, model and formats):
# given in a section, they would be replaced without a word.
UNIT_KEYS = {
    "generate": ("out_dir",),
    "filter": ("inputs", "out_dir"),
    "train": ("experiment", "student_name", "format", "dataset_dir", "size_class"),
    "eval": ("finetuned", "methods", "format", "size_class", "params_b", "out_dir"),
    "plot": ("summaries", "rounds"),  # its out_dir may be given (plot_config)
    "grpo.settings": ("experiment", "student", "student_name", "format"),
}


def check_unit_keys(cfg: RunConfig, students: list[Student]) -> None:
    sections = {name: getattr(cfg, name) for name in ("generate", "filter", "train", "eval", "plot")}
    sections["grpo.settings"] = cfg.grpo.settings
    for i, student in enumerate(students):
        sections[f"students[{i}].train"], sections[f"students[{i}].eval"] = student.train, student.eval
    for name, section in sections.items():
        given = [k for k in UNIT_KEYS[name.split(".")[-1] if name.startswith("students") else name] if k in section]
        if given:
            raise PipelineError(f"{name}: {', '.join(given)} {'is' if len(given) == 1 else 'are'} set by `run` for "
                                "each unit (its folders, names, formats and model); remove "
                                f"{'it' if len(given) == 1 else 'them'} (the grid's `formats:` and `students:` "
                                "say what runs)")


def check_unit(unit: Unit) -> None:
    """What the unit's stage will refuse about its own settings when its phase starts (names it
    refers to, question sets, the batch split), refused now, with the unit named; what earlier
    phases make (a dataset, a final/) is checked when its phase starts, and what this machine
    holds (model folders, GPUs) before the first selected unit (check_selected)."""
    config = unit.config
    try:
        if isinstance(config, GenerateConfig):
            check_generate(config)
        elif isinstance(config, FilterConfig):
            check_filter(config)
        elif isinstance(config, EvalConfig):
            check_eval(config)
        elif isinstance(config, FinetuneConfig):
            split_batch(config.global_batch_size, launch_world(config)[1], config.per_device_batch_size,
                        config.max_per_device_batch_size)
        elif isinstance(config, GrpoConfig):
            check_grpo(config)
    except PipelineError as exc:
        failure = PipelineError(f"{unit.title}: {exc}")
        failure.exit_code = exc.exit_code
        raise failure from None


def unit_models(config) -> list[tuple[str, str]]:
    """(key, model) of the models a unit loads by name: a teacher, a prompted or fine-tuned
    model, a base model and its adapter, a start (a model an endpoint serves is its name there)."""
    if isinstance(config, GenerateConfig) and config.oracle is None and config.teacher.backend != "openai":
        return [("teacher.model", config.teacher.model), ("teacher.adapter", config.teacher.adapter)]
    if isinstance(config, EvalConfig) and config.oracle is None:
        loaded = [] if config.model.backend == "openai" else [("model.model", config.model.model),
                                                               ("model.adapter", config.model.adapter)]
        return loaded + [("finetuned", config.finetuned), ("base_model", config.base_model)]
    if isinstance(config, FinetuneConfig | GrpoConfig):
        return [("student", config.student)]
    return []


def made_finals(units: list[Unit]) -> set[str]:
    """The final/ folders the grid's train and grpo units make."""
    return {str(Path(u.config.output_dir) / "final") for u in units if u.action in (launch_train, launch_grpo)}


def check_model_folders(units: list[Unit]) -> None:
    """A model the selected units load by a local path that is not there, and that no unit of
    the grid makes (a final/), refused before the first unit; a hub id is fetched when its
    phase starts."""
    from pipeline.hub.models import looks_like_path, require_installed

    made = made_finals(units)
    for unit in (u for u in units if u.selected):
        for key, model in unit_models(unit.config):
            model = None if model is None else str(model)
            try:
                require_installed(model)  # an embedded model's package: not after the units before it ran
            except PipelineError as exc:
                raise PipelineError(f"{unit.title}: {exc}") from None
            if model and model not in made and looks_like_path(model) and not Path(model).expanduser().exists():
                raise PipelineError(f"{unit.title}: {key}: {model} not found; give a model folder that exists, "
                                    "a hub id, or 'smollm2'")


def launch_world(cfg) -> tuple[Path, int]:
    """(accelerate config, processes) of a train or grpo unit's launch on this machine."""
    gpus = gpu_count()
    config = pick_accelerate_config(cfg.accelerate_config, gpus)
    return config, processes_for(config, cfg.num_processes, gpus)


def check_grpo(gr) -> None:
    """A grpo unit's batch split over its launch, its training question set's name, its held-out
    set apart from it, and vLLM where its rollouts need it."""
    from pipeline.rl.config import check_heldout_apart, check_vllm_installed
    from pipeline.rl.plan import batch_plan

    batch_plan(gr, launch_world(gr)[1])
    check_question_sets(gr)  # the training set and the held-out curve's, as `grpo` checks them
    check_vllm_installed(gr.rollout.engine)
    check_heldout_apart(gr)


def check_questions_apart(cfg: RunConfig, units: list[Unit]) -> None:
    """The questions the grid trains on (its generate units': round 1's bootstrap set and the
    rounds'; its grpo units') apart from those its evals of the students it trains score, unless
    allow_question_overlap (pipeline/tasks/overlap.py). A prompted or released model's eval
    trains on nothing here."""
    from pipeline.tasks.overlap import check_apart

    made = made_finals(units)
    trained = {(u.config.questions, u.config.limit) for u in units if isinstance(u.config, GenerateConfig | GrpoConfig)}
    evaluated = {}  # each distinct eval set once, named by its first unit
    for unit in (u for u in units if isinstance(u.config, EvalConfig) and str(u.config.finetuned) in made):
        evaluated.setdefault((unit.config.task, unit.config.questions, unit.config.limit), unit.title)
    for (task, questions, limit), title in evaluated.items():
        for training in sorted(trained, key=str):
            check_apart(get_task(task), training, (questions, limit), f"{title}: eval.questions",
                        cfg.allow_question_overlap)


def check_grpo_students(cfg: RunConfig, students: list[Student]) -> None:
    """A `grpo.students` name that is no student trained here, or a `grpo.from_round` no round of
    the named students and formats reaches, would silently drop its GRPO."""
    trained = [s.name for s in students if s.finetune and not s.finetuned]
    check_grpo_round(cfg, students, trained)
    if cfg.grpo.students is None:
        return
    strangers = [name for name in cfg.grpo.students if name not in trained]
    if strangers:
        raise PipelineError(f"grpo.students: {strangers} are not students trained here ({', '.join(trained) or 'none'}); "
                            "GRPO continues a student fine-tuned in this grid")


def served_as(ft, final: Path) -> tuple[str, str | None]:
    """What a server loads for a student trained by `ft` into `final`: (base model, LoRA adapter or None)."""
    return (str(final), None) if ft.finetuning == "full" else (ft.student, str(final))


def round_units(cfg: RunConfig, students: list[Student], dataset_dir: Path) -> list[Unit]:
    """Self-training rounds 2..N of each student and format that self-trains (pipeline/rounds.py),
    then the rounds report; none without a `self_training` section."""
    trained = {s.name: s for s in students if s.finetune and not s.finetuned}
    st, units, report = cfg.self_training, [], []
    for name, fmt in rounds.lines(st, list(trained), cfg.formats):
        student = trained[name]
        ft = train_config(cfg, student, fmt, dataset_dir)
        ev = eval_config(cfg, student, Path(ft.output_dir) / "final", fmt)
        earlier = [rounds.Round(1, name, fmt, cfg.out_dir / "generate", dataset_dir, Path(ft.output_dir) / "final",
                                Path(ev.out_dir))]
        for _ in range(2, st.rounds + 1):
            r = rounds.next_round(cfg.out_dir, earlier[-1])
            round_of, ft, ev = one_round(cfg, student, earlier, r, ft, ev)
            units += round_of
            if r.number == cfg.grpo.from_round and fmt in grpo_formats(cfg, student):
                units += grpo_units(cfg, student, ft, after_round=r.number)
            earlier.append(r)
        prompted = Path(eval_config(cfg, student, None).out_dir) if student.prompt_model else None
        report.append(rounds.report_line(earlier[0], earlier[1:], prompted))
    if report:
        units.append(Unit("plot: self-training rounds (EM by round)", RoundsReport(str(cfg.out_dir / "plot"), report),
                          write_rounds_report, "plot", "no model: CPU only"))
    return units


def one_round(cfg: RunConfig, student: Student, earlier: list, r, ft_before, ev_before) -> tuple[list[Unit], Any, Any]:
    """Round r's four units (generate, filter, train, eval: pipeline/rounds.py), and its train and
    eval configs, from the round before's (`ft_before`, `ev_before`: its student is r's teacher)."""
    st, before = cfg.self_training, earlier[-1]
    where = f"self_training (round {r.number} of {student.name} on {r.format})"
    teacher = rounds.teacher(to_dict(ev_before.model), ft_before.finetuning, ft_before.student, before)
    serve = to_dict(ev_before.serve) if ev_before.serve is not None else None
    gen = build(GenerateConfig, merged({"task": cfg.task, "wiki": cfg.wiki}, rounds.generate_layer(
        st, cfg.generate, merged(cfg.eval, student.eval), teacher, serve, earlier, r)), where=f"{where}: generate")
    flt = build(FilterConfig, rounds.filter_layer(st, cfg.filter, before, r), where=f"{where}: filter")
    ft = train_config(cfg, student, r.format, r.dataset_dir, rounds.train_layer(st, before, r))
    rounds.check_init(st, ft.finetuning, where)
    ev = eval_config(cfg, student, r.final, r.format, r.number)
    check_adapter_reachable(ev, ft)

    def generate_unit(config):
        rounds.check_teacher_ready(r, before)
        return generate_in_child(config)

    def filter_unit(config):
        return rounds.check_round_data(run_filter(config, allow_empty=True), r, st)

    title = f"(round {r.number}): {student.name} on {r.format}"
    teacher_line = needs_model(gen.teacher, gen.serve, what=f"round {before.number}'s student {before.final}")
    return [
        Unit(f"generate {title}, round {before.number}'s student as the teacher", gen, skip_or(generate_unit),
             "rounds", teacher_line, serves=served_as(ft_before, before.final), scope=f"{r.student}-{r.format}-{before.number}"),
        Unit(f"filter {title}: correct trajectories -> SFT dataset", flt, filter_unit, "rounds", "no model: CPU only"),
        Unit(f"train {title}", ft, launch_train, "rounds", needs_train(ft), precision=training_precision_record),
        Unit(f"eval {title}", ev, with_model_card(r.final, skip_or(evaluate_in_child, eval_precision)), "rounds",
             needs_eval(ev), precision=eval_precision, serves=served_as(ft, r.final), scope=f"{r.student}-{r.format}-{r.number}"),
    ], ft, ev


def check_serving(ev, where: str) -> None:
    """A `serve:` section starts a server for a model to load; an endpoint is already served."""
    if ev.serve is not None and ev.model.backend == "openai":
        raise PipelineError(f"{where}: model.backend is openai (a server at {ev.model.base_url}) and `serve:` "
                            "would start another; drop `serve` for this student (eval: {serve: null}) "
                            "or set model.backend: vllm")


def check_adapter_reachable(ev, ft) -> None:
    """A LoRA student evaluated over HTTP must be served under its own name (`serve:`), or the
    requests would reach the base model: refuse now, not after its training."""
    if ft.finetuning != "full" and ev.model.backend == "openai" and ev.serve is None:
        raise PipelineError(f"eval of {ft.student_name} on {ft.format}: a {ft.finetuning} adapter cannot be "
                            f"evaluated at {ev.model.base_url} as the base model's name; add a `serve:` section "
                            "(the pipeline serves it with --enable-lora and addresses it by name) or use "
                            "model.backend vllm / transformers")


def select(units: list[Unit], phases: list[str]) -> list[Unit]:
    """Mark the units of `phases`; a selection with no unit of this grid (`--only grpo` without
    a grpo section) is refused rather than run as nothing."""
    for unit in units:
        unit.selected = unit.phase in phases
    if not any(unit.selected for unit in units):
        present = [p for p in PHASES if any(u.phase == p for u in units)]
        raise PipelineError(f"this grid has no unit in phase {', '.join(phases)}; its phases: {', '.join(present)}")
    return units


def same_model(a, b) -> bool:
    """Whether two LLM sections name the same model the same way (the teacher prompted on the
    eval set is the teacher generate uses: both need it served at once)."""
    keys = ("backend", "model") + (("base_url",) if a.backend == "openai" else ())
    return all(getattr(a, k) == getattr(b, k) for k in keys)


def needs_model(llm, serve=None, what: str | None = None, oracle: str | None = None) -> str:
    """What a unit needs running, and where, for the plan: one line."""
    what = what or llm.model
    gpus = (f"tensor parallel {llm.tensor_parallel_size}, {llm.gpu_memory_utilization:g} of each GPU's memory"
            if gpu_count() else "vLLM's CPU build: this node has no GPU")
    if oracle is not None:
        return "no model: the oracle stand-in teacher (gold facts)"
    if serve is not None:
        port = serve.port or "a free port"
        return (f"starts `{' '.join(serve.command)}` for {what} on {serve.host}:{port} ({gpus}), "
                "stops it when done")
    if llm.backend == "openai":
        return f"needs {llm.model} served at {llm.base_url} (start it before this phase)"
    if llm.backend == "vllm":
        return f"in-process vLLM engine for {what} ({gpus}), in its own process"
    return f"in-process transformers model {what} (device {llm.device}), in its own process"


def needs_eval(ev) -> str:
    what = f"fine-tuned model {ev.finetuned}" if ev.finetuned else None
    if ev.finetuned and ev.model.backend == "openai" and ev.serve is None:
        return (f"needs {ev.finetuned} served at {ev.model.base_url} under its folder name "
                "(a LoRA adapter is refused: add a `serve:` section)")
    return needs_model(ev.model, ev.serve, what, ev.oracle)


def needs_train(ft) -> str:
    gpus = gpu_count()
    config = pick_accelerate_config(ft.accelerate_config, gpus)
    n = processes_for(config, ft.num_processes, gpus)
    return f"launches accelerate with {n} process{'es' if n > 1 else ''} ({config.stem}; this node has {gpus} GPU(s))"


def run(cfg: RunConfig, students: list[Student], phases: list[str] | None = None, prepare=None) -> dict:
    """`prepare(units)`, where given (a rehearsal's: pipeline/rehearsal/session.py), sees the
    selected plan before it runs and may wrap units' actions."""
    started = time.monotonic()
    units = select(plan(cfg, students), phases or list(PHASES))
    check_selected(cfg, units)
    show_plan(units)
    if prepare is not None:  # after the checks, which know the units by their actions
        prepare(units)
    outputs: dict = {}
    with running(units) as after:  # the servers units share (pipeline/llm/serve_groups.py)
        for i, unit in enumerate(units, start=1):
            if unit.selected:
                stage(f"[{i}/{len(units)}] {unit.title}")
                unit_started = time.monotonic()
                outputs = unit.action(unit.config) or {}
                after(unit)
                # each unit's wall time (a skipped one's too): where a long grid's hours went
                print(f"[run] [{i}/{len(units)}] done in {time.monotonic() - unit_started:.0f} s", flush=True)
    if "png" not in outputs:
        chosen = [p for p in PHASES if any(u.selected and u.phase == p for u in units)]
        print(f"[run] phases {', '.join(chosen) or '(none)'} done in {time.monotonic() - started:.0f} s")
        return outputs
    print(f"[run] done in {time.monotonic() - started:.0f} s; figure: {outputs['png']} (and .svg), "
          f"table: {outputs['md']}, csv: {outputs['csv']}, orderings: {outputs['orderings']}")
    return outputs


def show_plan(units: list[Unit], prefix: str = "[run]") -> None:
    """Before any work: every unit, its phase, what it needs served where, and whether it runs."""
    print(f"{prefix} plan (phases run in the order " + " -> ".join(PHASES) + "):", flush=True)
    for i, unit in enumerate(units, start=1):
        status = "" if unit.selected else "  -- not selected"
        print(f"{prefix}  {i:>3}. {unit.phase:<8} {unit.title}{status}\n{prefix}       {unit.needs}")
    sys.stdout.flush()


def check_selected(cfg: RunConfig, units: list[Unit]) -> None:
    """What depends on this machine and on earlier results, for the units selected to run here:
    writable folders, model folders, each launch's devices, the precision of results already there."""
    selected = [u for u in units if u.selected]
    check_outputs(cfg, selected)
    check_model_folders(units)
    check_launch_devices(selected)
    check_precisions(selected)


def check_launch_devices(units: list[Unit]) -> None:
    """What `train` and `grpo` refuse of every launch when their phase starts (the one list,
    pipeline/train/preflight.py: devices, QLoRA or an 8-bit optimizer without a GPU, an embedded
    model's package, a `resume` path), refused here before the first phase instead."""
    for unit in units:
        if unit.action in (launch_train, launch_grpo):
            config, world = launch_world(unit.config)
            try:
                preflight_launch(unit.config, config, world, gpu_count())
            except PipelineError as exc:
                raise PipelineError(f"{unit.title}: {exc}") from None


def check_outputs(cfg: RunConfig, units: list[Unit]) -> None:
    """Every folder the selected units will write must be writable before the first one starts:
    a read-only checkpoint root should not surface after hours of generation."""
    check_writable_dir(cfg.out_dir, "out_dir")
    for unit in units:
        if unit.action in (launch_train, launch_grpo):
            ft = unit.config
            check_writable_dir(ft.output_dir, f"{unit.phase} output_dir ({ft.student_name}, {ft.format})")


def check_precisions(units: list[Unit]) -> None:
    """Before any work: stop in one line when a unit holds results computed in another precision
    than this run would compute it in (a changed `precision`, `model.dtype` or
    REACT_PIPELINE_PRECISION, or `auto` on other hardware). Such a unit is not done, and its own
    stage would refuse to mix the two or to report the old result as this run's; `run` does not
    redo it either, since that would discard finished work without being asked."""
    changed = [c for c in (precision_change(u) for u in units) if c is not None]
    if not changed:
        return
    where, was, now = changed[0]
    more = f" and {len(changed) - 1} more unit(s)" if len(changed) > 1 else ""
    env = f"{precision.ENV}={was['precision']}, or " if was.get("precision") else ""
    raise PipelineError(
        f"{where} holds results computed in {describe_precision(was)}, this run would compute it in "
        f"{describe_precision(now)}{more}; run mixes no precisions and redoes no finished unit unasked: set "
        f"the precision back ({env}the units' precision / model.dtype), or use another out_dir / "
        "experiment, or delete the folders to redo them")


def precision_change(unit: Unit) -> tuple[Path, dict, dict] | None:
    """(its output, the recorded precision, this run's) when a unit's finished output (a trained
    `final/`, an eval folder) records another precision than the one it would run in now."""
    if unit.precision is None:
        return None
    if unit.action is launch_train:
        output, config = Path(unit.config.output_dir) / "final", unit.config
        recorded = read_manifest(output / "manifest.json") if (output / "manifest.json").is_file() else None
        recorded = recorded if recorded and recorded.get("complete") else None
    else:
        output, config = Path(unit.config.out_dir), unit.config
        recorded = read_manifest(output / "manifest.json") if (output / "manifest.json").is_file() else None
        if config.finetuned and not Path(config.finetuned, "manifest.json").is_file():
            return None  # not trained yet (or a released agent): its own unit checks it when it runs
    if not recorded or "precision" not in recorded:  # nothing yet, or older than the field
        return None
    now = unit.precision(config)
    was = {k: recorded.get(k) for k in now}
    if was == now:
        return None
    return output, was, now


def describe_precision(record: dict) -> str:
    """`bf16`, or `bf16 (trained in fp32)` for a fine-tuned student's eval."""
    trained = record.get("train_precision")
    return f"{record.get('precision') or 'a served precision'}" + (f" (trained in {trained})" if trained else "")


def stage(title: str) -> None:
    print(f"\n[run] === {title}", flush=True)


def skip_or(action, identity=None):
    """Run a generate/eval unit unless its manifest says it is complete with this config (and
    the same `identity(config)`: an eval run in another precision is not this one)."""
    def run_unit(config):
        if unit_done(config, identity):
            print(f"[run] skip: {config.out_dir} is complete")
            return None
        return action(config)
    return run_unit


def unit_done(config, identity=None) -> bool:
    """Whether a generate/eval unit's manifest says it is complete with this config (and
    identity). The manifest's config is read in today's key names (pipeline.core.config
    upgrade_keys: an older run's `backend: oracle` as today's `oracle` key); one written before
    configs had `task` was a HotpotQA run's; where the stand-in teacher answers, the LLM section
    it does not read does not count."""
    try:
        extra = identity(config) if identity else {}
    except PipelineError:  # e.g. a fine-tuned student not trained yet: not done
        return False
    manifest, wanted = Path(config.out_dir) / "manifest.json", to_dict(config)
    if not is_done(manifest, **extra):
        return False
    was = unread_model_dropped(upgrade_keys(type(config), (read_manifest(manifest) or {}).get("config") or {}))
    wanted = unread_model_dropped(wanted)
    return was == as_written_then(wanted, was)


# Keys a stage config gained after runs were made, each with the value that means what a manifest
# written without it did: such a finished run is still this config's (task: HotpotQA's before
# configs named one; heldout: GRPO without a held-out curve; allow_question_overlap: refused overlaps).
ADDED_LATER = {"task": DEFAULT_TASK, "heldout": to_dict(HeldoutSettings()), "allow_question_overlap": False}


def as_written_then(config: dict, was: dict) -> dict:
    """`config` as a manifest whose config is `was` would hold it: each ADDED_LATER key that `was`
    lacks, at its meaning-preserving value, left out. Key by key, so a manifest written between
    two additions (with `task`, without `allow_question_overlap`) is still this config's."""
    return {k: v for k, v in config.items() if k in was or not (k in ADDED_LATER and v == ADDED_LATER[k])}


def with_model_card(final: Path, action):
    """Evaluate, then rewrite final/README.md with the EM / F1 rows: the card `publish` uploads."""
    def run_unit(config):
        from pipeline.hub.cards import eval_rows_for, write_model_card

        result = action(config)
        summary = Path(config.out_dir) / "summary.json"
        if summary.is_file():
            write_model_card(final, eval_rows_for(final, [summary]))
        return result
    return run_unit


def evaluate_in_child(config) -> None:
    """`python -m pipeline eval` with this unit's config, in its own process: the model it loads
    (an in-process vLLM engine, a transformers model, a managed server) is gone, and its GPU
    memory free, when the process ends, before the next unit loads another. Its output streams
    through; its own error line becomes this unit's error. First, the GPUs its model loads on
    must have the memory free (pipeline/core/gpu_memory.py)."""
    gpu_memory.check(answerer_need(f"eval {config.out_dir}", config.oracle, config.model, config.serve,
                                   config.params_b))
    in_child("eval", config)


def generate_in_child(config) -> None:
    """`python -m pipeline generate` in its own process, as evaluate_in_child: the teacher (round
    1's, or a self-training round's student) must not be found still loaded by the next unit."""
    gpu_memory.check(answerer_need(f"generate {config.out_dir}", config.oracle, config.teacher, config.serve))
    in_child("generate", config)


def answerer_need(what: str, oracle: str | None, llm, serve=None, params_b: float | None = None):
    """The GPUs a generate or eval unit's answerer loads its model on (gpu_memory.llm_need); the
    stand-in teacher (`oracle` set) loads no model, whatever its unread LLM section says, and a
    unit on its group's running server loads none either (the group checked before it started)."""
    if oracle is not None or attached():
        return None
    return gpu_memory.llm_need(what, llm, serve, params_b)


def in_child(stage: str, config) -> None:
    """Run `python -m pipeline <stage>` with this config; its error line becomes this unit's error."""
    with tempfile.TemporaryDirectory(prefix=f"pipeline-{stage}-") as folder:
        path = Path(folder) / f"{stage}.yaml"
        path.write_text(yaml.safe_dump(to_dict(config), sort_keys=False), encoding="utf-8")
        proc = subprocess.Popen([sys.executable, "-m", "pipeline", stage, "--config", str(path)],
                                stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            error = relay_stderr(proc)
            code = proc.wait()
        except KeyboardInterrupt:  # the child got the same Ctrl-C: let it save and stop
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise
    if code != 0:
        failure = PipelineError(f"{stage} {config.out_dir}: {error}" if error else
                                f"{stage} {config.out_dir} failed (exit code {code}); fix the cause and "
                                "re-run: finished episodes are kept and it resumes")
        failure.exit_code = code if error else 1
        raise failure


def relay_stderr(proc: subprocess.Popen) -> str | None:
    """Copy the child's stderr as it comes (progress bars redraw with \\r: pipeline/core/relay.py),
    holding back only its final `error: ...` line, which is returned for the caller to raise as its own."""
    error = None
    out = sys.stderr.buffer
    for piece in pieces(proc.stderr.fileno()):
        if piece.startswith(b"error: "):
            error = piece[len(b"error: "):].decode("utf-8", "replace").strip()
        else:
            out.write(piece)
            out.flush()
    return error


def generate_config(cfg: RunConfig):
    layers = merged({"task": cfg.task, "methods": cfg.formats, "wiki": cfg.wiki}, cfg.generate,
                    {"out_dir": str(cfg.out_dir / "generate")})
    return build(GenerateConfig, layers, where="generate")


def filter_config(cfg: RunConfig, dataset_dir: Path):
    layers = merged({"formats": cfg.formats}, cfg.filter,
                    {"inputs": [str(cfg.out_dir / "generate")], "out_dir": str(dataset_dir)})
    return build(FilterConfig, layers, where="filter")  # filter skips unchanged formats itself


def train_config(cfg: RunConfig, student: Student, fmt: str, dataset_dir: Path, round_layer: dict | None = None):
    """The student's FinetuneConfig (its YAML < the experiment's `train` < the student's `train`
    < this unit's keys < a self-training round's: pipeline/rounds.py), built and resolved once;
    `train` hands it to the launched processes."""
    layers = merged(read_section(student.config, "train"), cfg.train, student.train, {
        "experiment": cfg.experiment, "student_name": student.name, "format": fmt,
        "dataset_dir": str(dataset_dir), "size_class": student.size_class}, round_layer)
    where = f"train, {student.name} on {fmt} ({student.config} < the experiment's train keys and the student's)"
    return resolve(build(FinetuneConfig, layers, where=where))


def launch_train(ft) -> None:
    """`train` for one student x method, unless its final model is done with this config."""
    final = Path(ft.output_dir) / "final"
    with training_errors(ft):  # the plan's refusals (a batch that does not divide) name the unit
        trains_in = training_precision(ft)
    if is_done(final / "manifest.json", config=to_dict(ft), precision=trains_in):
        print(f"[run] skip: {final} is complete")
        return
    gpu_memory.check(train_gpu_need(ft))
    with training_errors(ft):  # the child's own error line, relayed by the train stage
        code = train(ft)
    if code != 0:
        raise PipelineError(f"training {ft.student_name} on {ft.format} failed (exit code {code}); "
                            "fix the cause and re-run: it resumes from the latest checkpoint")


@contextlib.contextmanager
def training_errors(ft):
    """A PipelineError raised for a training unit, prefixed with which one, its exit code kept."""
    try:
        yield
    except PipelineError as exc:
        failure = PipelineError(f"training {ft.student_name} on {ft.format}: {exc}")
        failure.exit_code = exc.exit_code
        raise failure from None


def train_gpu_need(ft) -> gpu_memory.GpuNeed | None:
    """A launch under a GPU accelerate config: one process per GPU, each GPU to itself."""
    gpus = gpu_count()
    config = pick_accelerate_config(ft.accelerate_config, gpus)
    if gpus == 0 or read_yaml(config).get("use_cpu"):
        return None
    return gpu_memory.GpuNeed(f"training {ft.student_name} on {ft.format}", processes_for(config, ft.num_processes, gpus),
                              share=gpu_memory.TRAIN_SHARE, why="a training launch expects its GPUs to itself")


def training_precision(ft) -> str:
    """The precision this training unit would run in (on this machine, under its accelerate config)."""
    gpus = gpu_count()
    config = pick_accelerate_config(ft.accelerate_config, gpus)
    return foreseen(ft, read_yaml(config), processes_for(config, ft.num_processes, gpus), gpus).precision.precision


def training_precision_record(ft) -> dict:
    return {"precision": training_precision(ft)}  # what train's final manifest records


def eval_precision(config) -> dict:
    return precision_record(model_under_test(config))


def eval_config(cfg: RunConfig, student: Student, final: Path | None, fmt: str | None = None,
                round_number: int = 1):
    """The eval unit of a prompted base model (final=None) or of the fine-tuned `final`
    trained on trajectory format `fmt` (evaluated with the method of the same name), in round 1
    or a later self-training round (pipeline/rounds.py: its own folder and model label)."""
    if final is None:
        name, layer = f"{student.name}-prompt", {
            "model": student.prompt_model, "methods": cfg.formats,
            "size_class": student.size_class, "params_b": student.params_b}
    else:
        name, layer = f"{student.name}-ft-{fmt}", {
            "finetuned": str(final), "methods": [fmt],
            "size_class": student.size_class, "params_b": student.params_b}
    if round_number > 1:
        name, layer = f"{name}-round{round_number}", merged(layer, {"model": {
            "name": f"{student.name} round {round_number} (fine-tuned)"}})
    layers = merged({"task": cfg.task, "wiki": cfg.wiki}, cfg.eval, student.eval, layer,
                    {"out_dir": str(cfg.out_dir / "eval" / name)})
    ev = build(EvalConfig, layers, where=f"eval ({name})")
    check_serving(ev, f"eval ({name})")
    return ev


def check_student(student: Student) -> None:
    """A student we train needs its training config and size; one given as `finetuned` is not trained."""
    if student.finetuned:
        if student.train or student.config:
            raise PipelineError(f"student {student.name}: `finetuned` is already fine-tuned; drop `config`/`train` "
                                "(or drop `finetuned` to train it here)")
        return
    if student.format:
        raise PipelineError(f"student {student.name}: `format` describes a `finetuned` model; a student trained here "
                            "decodes in each method's own format")
    needed = ["config"] if student.finetune else []
    needed += ["size_class", "params_b"] if student.finetune or student.prompt_model else []
    missing = [k for k in needed if getattr(student, k) in (None, "")]
    if missing:
        raise PipelineError(f"student {student.name}: set {', '.join(missing)} (or give a `finetuned` model)")


def finetuned_eval_config(cfg: RunConfig, student: Student):
    """Eval of an already fine-tuned student: its own format (EvalConfig's default methods mean that).
    Its folder keeps the name `<student>-checkpoint` (before `finetuned` had its own name), so the
    results of earlier runs are found and skipped."""
    name = f"{student.name}-checkpoint"
    layer = {"finetuned": student.finetuned, "format": student.format, "methods": EvalConfig().methods,
             "size_class": student.size_class, "params_b": student.params_b}
    layers = merged({"task": cfg.task, "wiki": cfg.wiki}, cfg.eval, student.eval, layer,
                    {"out_dir": str(cfg.out_dir / "eval" / name)})
    ev = build(EvalConfig, layers, where=f"eval ({name})")
    check_serving(ev, f"eval ({name})")
    return ev


def plot_config(cfg: RunConfig, summaries: list[Path], rounds_evals: list[Path] | None = None):
    """The plot unit: every eval's summary, the self-training rounds' (points of the figure with
    sizes on its x axis), into <out_dir>/plot unless the `plot` section names its own out_dir (a
    grid that extends another's folders keeps that grid's figure: configs/small-scaling.yaml)."""
    layers = merged({"out_dir": str(cfg.out_dir / "plot")}, cfg.plot, {
        "summaries": [str(s) for s in summaries], "rounds": [str(s) for s in rounds_evals or []]})
    return build(PlotConfig, layers, where="plot")


# ---------------------------------------------------------------- the optional grpo phase


def grpo_formats(cfg: RunConfig, student: Student) -> list[str]:
    """The formats the `grpo` section continues this student in (checked against the grid)."""
    phase = cfg.grpo
    if not phase.formats or (phase.students is not None and student.name not in phase.students):
        return []
    from pipeline.rl.config import RL_FORMATS

    for fmt in phase.formats:
        if fmt not in RL_FORMATS or fmt not in cfg.formats:
            raise PipelineError(f"grpo.formats: '{fmt}' must be a format this grid trains ({', '.join(cfg.formats)}) "
                                f"and an interactive loop GRPO runs ({', '.join(RL_FORMATS)})")
    return phase.formats


def check_grpo_round(cfg: RunConfig, students: list[Student], trained: list[str]) -> None:
    """`grpo.from_round: N` continues round N's students: a round the `self_training` section runs,
    of a format and student (of those `trained` here) it self-trains."""
    n, st = cfg.grpo.from_round, cfg.self_training
    if n == 1 or not cfg.grpo.formats:
        return
    if n > st.rounds:
        raise PipelineError(f"grpo.from_round: {n} is past the last self-training round (self_training.rounds: "
                            f"{st.rounds}); set it to a round the grid runs, or 1 for the grid's own students")
    lines = rounds.lines(st, trained, cfg.formats)
    missing = [f"{s.name} on {fmt}" for s in students for fmt in grpo_formats(cfg, s)
               if s.name in trained and (s.name, fmt) not in lines]
    if missing:
        raise PipelineError(f"grpo.from_round: {n}: {', '.join(missing)} does not self-train (self_training.formats / "
                            f"students), so it has no round-{n} student; add it there or set grpo.students / grpo.formats")


def grpo_units(cfg: RunConfig, student: Student, ft, after_round: int = 1) -> list[Unit]:
    """The grpo unit that continues the fine-tuned `ft` student (the grid's, or self-training round
    `after_round`'s) in its loop, and that result's eval; after a round, both in the rounds phase."""
    gr = grpo_config(cfg, student, ft, after_round)
    final = Path(gr.output_dir) / "final"
    ev = eval_config(cfg, student, final, gr.format)
    ev = replace(ev, out_dir=cfg.out_dir / "eval" / f"{gr.student_name}-{gr.format}")
    check_adapter_reachable(ev, gr)
    sft_final = str(Path(ft.output_dir) / "final")
    base = sft_final if ft.finetuning == "full" else ft.student  # what a LoRA GRPO adapter sits on
    start = f"its {gr.format} fine-tune" if after_round == 1 else f"its round-{after_round} {gr.format} student"
    phases = ("grpo", "eval") if after_round == 1 else ("rounds", "rounds")
    return [Unit(f"grpo: {student.name} from {start}", gr, launch_grpo, phases[0], needs_train(gr)),
            Unit(f"eval: {student.name} after GRPO on {gr.format}" + (f" (from round {after_round})" if after_round > 1 else ""), ev,
                 with_model_card(final, skip_or(evaluate_in_child, eval_precision)), phases[1], needs_eval(ev),
                 precision=eval_precision, serves=(str(final), None) if gr.finetuning == "full" else (base, str(final)))]


def grpo_config(cfg: RunConfig, student: Student, ft, after_round: int = 1):
    """The GrpoConfig of one unit: beside the student's checkpoints (its `output_root`) < the
    section's `config` < the grid's task and wiki < its `settings` < this unit's start, format and names."""
    phase = cfg.grpo
    name = f"{student.name}-grpo" if after_round == 1 else f"{student.name}-round{after_round}-grpo"
    layers = merged({"output_root": str(ft.output_root)}, read_section(phase.config, "grpo") if phase.config else {},
                    {"task": cfg.task, "wiki": cfg.wiki},
                    {"allow_question_overlap": True} if cfg.allow_question_overlap else {}, phase.settings, {
                        "experiment": cfg.experiment, "student": str(Path(ft.output_dir) / "final"),
                        "student_name": name, "format": ft.format})
    return resolve_grpo(build(GrpoConfig, layers, where=f"grpo ({student.name} on {ft.format})"))


def launch_grpo(gr) -> None:
    """`grpo` for one fine-tuned student, unless its final policy is done with this config."""
    final = Path(gr.output_dir) / "final"
    was = (read_manifest(final / "manifest.json") or {}).get("config") or {}
    if is_done(final / "manifest.json", config=as_written_then(to_dict(gr), was)):
        print(f"[run] skip: {final} is complete")
        return
    gpu_memory.check(train_gpu_need(gr))  # a launch like train's: its GPUs to itself
    try:
        code = grpo(gr)
    except PipelineError as exc:  # the child's own error line, relayed by the launcher
        failure = PipelineError(f"GRPO of {gr.student_name} on {gr.format}: {exc}")
        failure.exit_code = exc.exit_code
        raise failure from None
    if code != 0:
        raise PipelineError(f"GRPO of {gr.student_name} on {gr.format} failed (exit code {code}); "
                            "fix the cause and re-run: it resumes from the latest checkpoint")
