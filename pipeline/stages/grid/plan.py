"""A grid's plan: every unit (round 1's generate, filter, trainings and evals, the GRPO units,
the self-training rounds, the plot) with its stage config, in phase order, each checked before
anything runs; and the plan as printed."""

from __future__ import annotations

import difflib
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from pipeline import rounds
from pipeline.agent.answerers import check_oracle
from pipeline.core.config import build, merged, repeated_items, to_dict
from pipeline.core.errors import PipelineError
from pipeline.hub.finetuned import finetuned_label
from pipeline.llm.serve_groups import plan_groups
from pipeline.methods.prompts import NAMED_EXEMPLARS
from pipeline.report.rounds import RoundsReport, write_rounds_report
from pipeline.stages.filter import FilterConfig, run_filter
from pipeline.stages.generate import GenerateConfig
from pipeline.stages.grid import checks
from pipeline.stages.grid.children import (
    evaluate_in_child,
    generate_in_child,
    launch_grpo,
    launch_train,
    skip_or,
    unit_skips,
    with_model_card,
)
from pipeline.stages.grid.precision import eval_precision, training_precision_record
from pipeline.stages.grid.spec import RunConfig, Student
from pipeline.stages.grid.unit import PHASES, Unit
from pipeline.stages.grid.unit_configs import (
    check_adapter_reachable,
    check_student,
    eval_config,
    filter_config,
    finetuned_eval_config,
    generate_config,
    grpo_config,
    grpo_formats,
    oracle_filter_config,
    oracle_generate_config,
    plot_config,
    served_as,
    train_config,
)
from pipeline.stages.plot import run_plot
from pipeline.tasks import get_task
from pipeline.train import launcher


def plan(cfg: RunConfig, students: list[Student]) -> list[Unit]:
    """Build and check every unit's config before anything runs, so a typo in the eval section
    fails in a second, not after hours of training; return them in phase order."""
    checks.check_unit_keys(cfg, students)
    repeated = repeated_items([s.name for s in students])  # two students' units would share folders
    if repeated:
        raise PipelineError(f"students: {repeated[0]!r} names two students; give each its own name (it names its folders)")
    dataset_dir = cfg.out_dir / "sft"
    units, compared, rows = [], [], {}  # compared: prompted evals with the other exemplar sets; rows: check_one_row
    oracle_data = []  # compare_oracle: the evals of students trained on the stand-in's data
    teacher = None
    if not students or not all(s.finetuned for s in students):  # a grid of released students needs no data
        gen = generate_config(cfg)
        check_oracle(gen.oracle, gen.serve, gen.teacher, "teacher")
        teacher = gen.teacher if gen.oracle is None else None  # the stand-in teacher is served by no one
        units = [Unit("generate: the teacher writes trajectories", gen, skip_or(generate_in_child), "teacher",
                      needs_model(gen.teacher, gen.serve, oracle=gen.oracle)),
                 Unit("filter: correct trajectories -> SFT datasets", filter_config(cfg, dataset_dir), run_filter,
                      "filter", "no model: CPU only")]
        units += oracle_data_units(cfg, gen, dataset_dir)
    if cfg.compare_oracle is not None and not any(s.finetune and not s.finetuned for s in students):
        raise PipelineError(f"compare_oracle: {cfg.compare_oracle} but no student here is trained (each is prompted "
                            "only or already `finetuned`): none would learn from either teacher's data; drop the key")
    for student in students:
        check_student(student)
        if student.prompt_model:
            ev = eval_config(cfg, student, None)
            check_one_row(rows, student, ev, "prompt", ev.model.label)
            phase = "teacher" if teacher is not None and same_model(ev.model, teacher) else "eval"
            units.append(Unit(f"eval: {student.name} prompted", ev, skip_or(evaluate_in_child, eval_precision),
                              phase, needs_eval(ev), precision=eval_precision, serves=(ev.model.model, None)))
            other_sets = compared_exemplars(cfg, student, ev.prompting.exemplars)
            units += other_sets  # beside it: one server serves both
            compared += other_sets
        if student.finetuned:
            ev = finetuned_eval_config(cfg, student)
            check_one_row(rows, student, ev, "finetune", finetuned_label(student.finetuned, ev.model.name))
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
            ev = eval_config(cfg, student, final, method, layout=ft.layout)
            check_adapter_reachable(ev, ft)
            units.append(Unit(f"eval: {student.name} fine-tuned on {method}", ev,
                              with_model_card(final, skip_or(evaluate_in_child, eval_precision)), "eval", needs_eval(ev),
                              precision=eval_precision, serves=served_as(ft, final)))
            if method in grpo_formats(cfg, student) and cfg.grpo.from_round == 1:
                units += grpo_units(cfg, student, ft)
            if cfg.compare_oracle is not None:
                on_oracle_data = oracle_data_student_units(cfg, student, method)
                units += on_oracle_data
                oracle_data += on_oracle_data[1:]
    summaries = [u.config.out_dir / "summary.json" for u in units
                 if u.title.startswith("eval") and u not in compared and u not in oracle_data]
    later = round_units(cfg, students, dataset_dir)  # self-training rounds 2..N and their report
    units += later
    rounds_evals = [u.config.out_dir / "summary.json" for u in later if u.title.startswith("eval (round")]
    summaries += [u.config.out_dir / "summary.json" for u in later if u.title.startswith("eval:")]  # GRPO after a round
    if cfg.compare_exemplars and not any(s.prompt_model for s in students):
        raise PipelineError(f"compare_exemplars: {cfg.compare_exemplars} but no student here is prompted "
                            "(a `prompt_model`): nothing to compare; drop the key or prompt a student")
    units.append(Unit("plot: figure 3 and the table",
                      plot_config(cfg, summaries, rounds_evals, [u.config.out_dir / "summary.json" for u in compared],
                                  [u.config.out_dir / "summary.json" for u in oracle_data]),
                      run_plot, "plot", "no model: CPU only"))
    order = list(PHASES)
    units = sorted(units, key=lambda u: order.index(u.phase))  # stable: the grid's order within a phase
    checks.check_grpo_students(cfg, students)
    for unit in units:
        checks.check_unit(unit)
    checks.check_questions_apart(cfg, units)
    checks.check_search_modes(units)
    units, _ = plan_groups(units, done=unit_skips)  # in server order: no shared server spans another unit
    return units


def check_one_row(rows: dict[tuple, str], student: Student, ev, mode: str, label: str) -> None:
    """Two students on one base model, each with a `prompt_model` (or two given one `finetuned`
    model), write the same row of the figure (mode, model, size, method, question set) twice,
    which plot refuses after every eval has run: refused here, when the plan is made. `rows`: the
    rows of the students seen so far, by key."""
    prompted = mode == "prompt"
    fix = (f"set `prompt_model: {{}}` on {student.name!r}, or give each prompt_model a `name` to plot both" if prompted
           else f"drop student {student.name!r}, or give each an `eval: {{model: {{name: ...}}}}` to plot both")
    # a fine-tuned model decodes its own format whatever eval's default methods list
    for method in ev.methods if prompted else [student.format or "its own format"]:
        key = (mode, label, ev.size_class, method, ev.questions)
        if key in rows:
            raise PipelineError(
                f"students {rows[key]!r} and {student.name!r} both {'prompt' if prompted else 'evaluate'} {label} "
                f"({method} on {ev.questions}): the same row twice, which plot refuses; {fix}")
        rows[key] = student.name


def compared_exemplars(cfg: RunConfig, student: Student, figure_set: str) -> list[Unit]:
    """A prompted student's eval with each of the grid's other exemplar sets (compare_exemplars)."""
    units = []
    task = get_task(cfg.task)
    for name in cfg.compare_exemplars:
        if name not in NAMED_EXEMPLARS or name == figure_set:  # the sets offered: only those it may name
            others = [s for s in NAMED_EXEMPLARS if s != figure_set and s in task.exemplar_sets]
            close = difflib.get_close_matches(name, others, n=1)
            raise PipelineError(f"compare_exemplars: '{name}' must be a set other than figure 3's "
                                f"(eval.prompting.exemplars: {figure_set})"
                                + (f", one of {', '.join(others)}" if others else f"; the {task.title} task has no "
                                   "other set: drop the key")
                                + (f"; did you mean '{close[0]}'?" if close else ""))
        if name not in task.exemplar_sets:  # else the unit's own check says "set prompting.exemplars=..."
            raise PipelineError(f"compare_exemplars: the {task.title} task has no '{name}' exemplars (it has: "
                                f"{', '.join(task.exemplar_sets)}): nothing to compare figure 3's with; drop the key")
        ev = eval_config(cfg, student, None, exemplars=name)
        whose = {"ours": "our", "paper": "the paper's"}[name]
        units.append(Unit(f"eval: {student.name} prompted with {whose} exemplars", ev,
                          skip_or(evaluate_in_child, eval_precision), "eval", needs_eval(ev),
                          precision=eval_precision, serves=(ev.model.model, None)))
    return units


def oracle_data_units(cfg: RunConfig, gen, dataset_dir: Path) -> list[Unit]:
    """compare_oracle's stand-in teacher: its generate unit on the model teacher's questions and
    wiki settings, and its filter unit matched to the model teacher's datasets; none without the key."""
    if cfg.compare_oracle is None:
        return []
    if gen.oracle is not None:
        raise PipelineError(f"compare_oracle: {cfg.compare_oracle} compares a model teacher's data with the stand-in's, "
                            f"and this grid's teacher is the stand-in already (generate.oracle: {gen.oracle}); drop "
                            "the key, or give generate a `teacher` model instead of `oracle`")
    stand_in = oracle_generate_config(cfg, gen)
    flt = oracle_filter_config(cfg, stand_in.out_dir, cfg.out_dir / "sft-oracle", dataset_dir)
    return [Unit(f"generate: the oracle stand-in ({cfg.compare_oracle}) on the same questions", stand_in,
                 skip_or(generate_in_child), "teacher", needs_model(stand_in.teacher, oracle=stand_in.oracle)),
            Unit("filter: the stand-in's trajectories of the teacher's questions, as many rows -> SFT datasets", flt,
                 run_filter, "filter", "no model: CPU only")]


def oracle_data_student_units(cfg: RunConfig, student: Student, method: str) -> list[Unit]:
    """The student trained on the stand-in's `method` rows (sft-oracle/) as `<student>-oracle-data`,
    and its eval: beside the same student trained on the model teacher's."""
    data_student = replace(student, name=cfg.oracle_data_name(student.name), prompt_model={})
    ft = train_config(cfg, data_student, method, cfg.out_dir / "sft-oracle")
    final = Path(ft.output_dir) / "final"
    ev = eval_config(cfg, data_student, final, method, layout=ft.layout)
    check_adapter_reachable(ev, ft)
    return [Unit(f"train: {student.name} on {method}, the stand-in's data", ft, launch_train, "train", needs_train(ft),
                 precision=training_precision_record),
            Unit(f"eval: {student.name} fine-tuned on {method}, the stand-in's data", ev,
                 with_model_card(final, skip_or(evaluate_in_child, eval_precision)), "eval", needs_eval(ev),
                 precision=eval_precision, serves=served_as(ft, final))]


def round_units(cfg: RunConfig, students: list[Student], dataset_dir: Path) -> list[Unit]:
    """Self-training rounds 2..N of each student and format that self-trains (pipeline/rounds.py),
    then the rounds report; none without a `self_training` section."""
    trained = {s.name: s for s in students if s.finetune and not s.finetuned}
    st, units, report = cfg.self_training, [], []
    for name, fmt in rounds.lines(st, list(trained), cfg.formats):
        student = trained[name]
        ft = train_config(cfg, student, fmt, dataset_dir)
        ev = eval_config(cfg, student, Path(ft.output_dir) / "final", fmt, layout=ft.layout)
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
    acts = {"prompting": {"interface": ev_before.prompting.interface}}  # the teacher acts as in its eval (layout)
    gen = build(GenerateConfig, merged({"task": cfg.task, "wiki": cfg.wiki}, rounds.generate_layer(
        st, cfg.generate, merged(cfg.eval, student.eval), teacher, serve, earlier, r), acts), where=f"{where}: generate")
    flt = build(FilterConfig, rounds.filter_layer(st, cfg.filter, before, r), where=f"{where}: filter")
    ft = train_config(cfg, student, r.format, r.dataset_dir, rounds.train_layer(st, before, r))
    rounds.check_init(st, ft.finetuning, where)
    ev = eval_config(cfg, student, r.final, r.format, r.number, layout=ft.layout)
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


def grpo_units(cfg: RunConfig, student: Student, ft, after_round: int = 1) -> list[Unit]:
    """The grpo unit that continues the fine-tuned `ft` student (the grid's, or self-training round
    `after_round`'s) in its loop, and that result's eval; after a round, both in the rounds phase."""
    if ft.layout == "messages":
        raise PipelineError(f"grpo: {student.name} is trained in the messages layout (train.layout) and GRPO's "
                            "rollouts decode the text layout; leave it out of grpo.students, or train it in the text layout")
    gr = grpo_config(cfg, student, ft, after_round)
    final = Path(gr.output_dir) / "final"
    ev = eval_config(cfg, student, final, gr.format)
    ev = replace(ev, out_dir=cfg.out_dir / "eval" / f"{gr.student_name}-{gr.format}")
    check_adapter_reachable(ev, gr)
    sft_final = str(Path(ft.output_dir) / "final")
    base = sft_final if ft.finetuning == "full" else ft.student  # what a LoRA GRPO adapter sits on
    start = f"its {gr.format} fine-tune" if after_round == 1 else f"its round-{after_round} {gr.format} student"
    phases = ("grpo", "eval") if after_round == 1 else ("rounds", "rounds")
    return [Unit(f"grpo: {student.name} from {start}", gr, launch_grpo, phases[0], needs_train(gr) + rollouts_in(gr)),
            Unit(f"eval: {student.name} after GRPO on {gr.format}" + (f" (from round {after_round})" if after_round > 1 else ""), ev,
                 with_model_card(final, skip_or(evaluate_in_child, eval_precision)), phases[1], needs_eval(ev),
                 precision=eval_precision, serves=(str(final), None) if gr.finetuning == "full" else (base, str(final)))]


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
            if launcher.gpu_count() else "vLLM's CPU build: this node has no GPU")
    if oracle is not None:
        return "no model: the oracle stand-in teacher (gold facts)"
    if serve is not None:
        port = serve.port or "a free port"
        return (f"starts `{' '.join(serve.command)}` for {what} on {serve.host}:{port} ({gpus}), "
                "stops it when done")
    if llm.backend == "openai":
        return f"needs {llm.model} served at {llm.base_url} (start it before this phase)"
    if llm.backend == "vllm":
        return f"in-process vLLM engine for {what} ({gpus}), in its own process under {vllm_python()}"
    return f"in-process transformers model {what} (device {llm.device}), in its own process"


def vllm_python() -> str:
    """The interpreter an in-process vLLM unit runs in, for the plan (a refusal is check_selected's)."""
    from pipeline.llm.interpreter import python_for

    try:
        return python_for("the plan")
    except PipelineError:
        return "an interpreter with vLLM: none found (refused before the first unit)"


def rollouts_in(gr) -> str:
    """Where a GRPO launch with vLLM rollouts runs: the vLLM environment where this one has none."""
    return f"; vLLM rollouts: the launch runs under {vllm_python()}" if gr.rollout.engine == "vllm" else ""


def needs_eval(ev) -> str:
    what = f"fine-tuned model {ev.finetuned}" if ev.finetuned else None
    if ev.finetuned and ev.model.backend == "openai" and ev.serve is None:
        return (f"needs {ev.finetuned} served at {ev.model.base_url} under its folder name "
                "(a LoRA adapter is refused: add a `serve:` section)")
    return needs_model(ev.model, ev.serve, what, ev.oracle)


def needs_train(ft) -> str:
    from pipeline.core.config import read_yaml
    from pipeline.train.config import FinetuneConfig
    from pipeline.train.plan import foreseen

    world = launcher.config_world(ft)
    n = world.processes
    line = f"launches accelerate with {n} process{'es' if n > 1 else ''} ({world.config.stem}; this node has {world.gpus} GPU(s))"
    capped = None
    try:  # an SFT unit's micro-batch cap without a flash kernel, and its cost (a bad batch is check_unit's to name)
        if isinstance(ft, FinetuneConfig):
            capped = foreseen(ft, read_yaml(world.config), n, world.gpus).batch.capped
    except PipelineError:
        pass
    return f"{line}; {capped}" if capped else line


def show_plan(units: list[Unit], prefix: str = "[run]") -> None:
    """Before any work: every unit, its phase, what it needs served where, and whether it runs."""
    print(f"{prefix} plan (phases run in the order " + " -> ".join(PHASES) + "):", flush=True)
    for i, unit in enumerate(units, start=1):
        status = "" if unit.selected else "  -- not selected"
        print(f"{prefix}  {i:>3}. {unit.phase:<8} {unit.title}{status}\n{prefix}       {unit.needs}")
    sys.stdout.flush()


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
