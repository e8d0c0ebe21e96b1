"""`run`: one experiment grid end to end: generate -> filter -> train -> eval -> plot.

    python -m pipeline run --config configs/demo.yaml          # the CPU demo (scripts/demo.sh)
    python -m pipeline run --config configs/paper.yaml         # the full-scale grid (GPUs)

The experiment YAML names the teacher, the methods, the students by size class, the question
sets and each stage's settings (sections `generate`, `filter`, `train`, `eval`, `plot`, with
`students:` a list; a student given as `checkpoint:` is already fine-tuned, e.g. a released agent,
and is only evaluated). Every unit (a generate run, a dataset, a student x method training run, an
evaluation) is skipped when its manifest says it is complete with the same config; an interrupted
unit resumes (episodes by id, training from its latest complete checkpoint). The run ends with
the table and the figure's path.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pipeline import precision
from pipeline.config import (
    add_config_arguments,
    build,
    load_config,
    read_section,
    read_yaml,
    to_dict,
)
from pipeline.errors import PipelineError
from pipeline.finetune import FinetuneConfig, resolve
from pipeline.stages.eval import EvalConfig, evaluate, model_under_test, precision_record
from pipeline.stages.filter import FilterConfig, run_filter
from pipeline.stages.generate import GenerateConfig, generate
from pipeline.stages.plot import PlotConfig, run_plot
from pipeline.stages.train import gpu_count, pick_accelerate_config, train
from pipeline.storage import check_writable_dir, is_done


@dataclass
class Student:
    name: str  # folder label, e.g. smollm2-135m
    config: Path | None = None  # its FinetuneConfig YAML (configs/students/...); not with `checkpoint`
    size_class: str | None = None  # 135m | 8b | 62b ...; a known released checkpoint has its own
    params_b: float | None = None  # billions of parameters: the figure's x axis
    prompt_model: dict = field(default_factory=dict)  # LLMConfig keys to prompt the base model; {} = skip
    finetune: bool = True  # train it on each method and evaluate zero-shot
    train: dict = field(default_factory=dict)  # FinetuneConfig overrides for this student
    # Already fine-tuned (a folder or hub id, e.g. forestai/fireact_llama_2_7b_lora): evaluated
    # and plotted beside ours, never trained; `format` says how it decodes when it is not known.
    checkpoint: str | None = None
    format: str | None = None


@dataclass
class RunConfig:
    experiment: str = "default"
    out_dir: Path = Path("runs/default")
    methods: list[str] = field(default_factory=lambda: ["standard", "cot", "act", "react"])
    wiki: dict = field(default_factory=dict)  # WikiConfig keys shared by generate and eval
    generate: dict = field(default_factory=dict)  # GenerateConfig keys
    filter: dict = field(default_factory=dict)  # FilterConfig keys
    train: dict = field(default_factory=dict)  # FinetuneConfig keys shared by every student
    eval: dict = field(default_factory=dict)  # EvalConfig keys shared by every evaluation
    plot: dict = field(default_factory=dict)  # PlotConfig keys
    students: list[dict] = field(default_factory=list)  # Student entries


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, RunConfig)  # --print-config prints every unit's effective config


def main(args: argparse.Namespace) -> int:
    if args.config is None:
        raise PipelineError("run needs --config configs/<experiment>.yaml (e.g. configs/demo.yaml)")
    cfg = load_config(RunConfig, args.config, args.overrides)
    students = [build(Student, s, where=f"{args.config} students[{i}]") for i, s in enumerate(cfg.students)]
    if args.print_config:
        print_plan(plan(cfg, students))
        return 0
    run(cfg, students)
    return 0


def print_plan(units: list[Unit]) -> None:
    """Each unit's title and the config it would run with, as YAML (nothing runs)."""
    for i, unit in enumerate(units, start=1):
        print(f"# [{i}/{len(units)}] {unit.title}")
        print(yaml.safe_dump(to_dict(unit.config), sort_keys=False))


@dataclass
class Unit:
    """One step of the grid: its title, its stage config, and how to run it."""

    title: str
    config: Any
    action: Any  # callable(config) -> result


def plan(cfg: RunConfig, students: list[Student]) -> list[Unit]:
    """Build and check every unit's config before anything runs, so a typo in the eval section
    fails in a second, not after hours of training."""
    dataset_dir = cfg.out_dir / "sft"
    units = []
    if not students or not all(s.checkpoint for s in students):  # a grid of released students needs no data
        units = [Unit("generate: the teacher writes trajectories", generate_config(cfg), skip_or(generate)),
                 Unit("filter: correct trajectories -> SFT datasets", filter_config(cfg, dataset_dir), run_filter)]
    for student in students:
        check_student(student)
        if student.prompt_model:
            units.append(Unit(f"eval: {student.name} prompted", eval_config(cfg, student, None),
                              skip_or(evaluate, eval_precision)))
        if student.checkpoint:
            units.append(Unit(f"eval: {student.name} (already fine-tuned: {student.checkpoint})",
                              checkpoint_eval_config(cfg, student), skip_or(evaluate, eval_precision)))
            continue
        if not student.finetune:
            continue
        for method in cfg.methods:
            ft = train_config(cfg, student, method, dataset_dir)
            final = Path(ft.output_dir) / "final"
            units.append(Unit(f"train: {student.name} on {method}", ft, launch_train))
            units.append(Unit(f"eval: {student.name} fine-tuned on {method}",
                              eval_config(cfg, student, final, method), with_model_card(final, skip_or(evaluate, eval_precision))))
    summaries = [u.config.out_dir / "summary.json" for u in units if u.title.startswith("eval")]
    units.append(Unit("plot: figure 3 and the table", plot_config(cfg, summaries), run_plot))
    return units


def run(cfg: RunConfig, students: list[Student]) -> dict:
    started = time.monotonic()
    units = plan(cfg, students)
    check_outputs(cfg, units)
    outputs: dict = {}
    for i, unit in enumerate(units, start=1):
        stage(f"[{i}/{len(units)}] {unit.title}")
        outputs = unit.action(unit.config)
    print(f"[run] done in {time.monotonic() - started:.0f} s; figure: {outputs['png']} (and .svg), "
          f"table: {outputs['md']}, csv: {outputs['csv']}, orderings: {outputs['orderings']}")
    return outputs


def check_outputs(cfg: RunConfig, units: list[Unit]) -> None:
    """Every folder the grid will write must be writable before the first unit starts: a
    read-only checkpoint root should not surface after hours of generation."""
    check_writable_dir(cfg.out_dir, "out_dir")
    for unit in units:
        if unit.action is launch_train:
            ft = unit.config
            check_writable_dir(ft.output_dir, f"train output_dir ({ft.student_name}, {ft.format})")


def stage(title: str) -> None:
    print(f"\n[run] === {title}", flush=True)


def merged(*layers: dict) -> dict[str, Any]:
    """Deep-merge config mappings, later layers winning."""
    out: dict[str, Any] = {}
    for layer in layers:
        for key, value in (layer or {}).items():
            if isinstance(value, dict) and isinstance(out.get(key), dict):
                out[key] = merged(out[key], value)
            else:
                out[key] = value
    return out


def skip_or(action, identity=None):
    """Run a generate/eval unit unless its manifest says it is complete with this config (and
    the same `identity(config)`: an eval run in another precision is not this one)."""
    def run_unit(config):
        manifest = Path(config.out_dir) / "manifest.json"
        if is_done(manifest, config=to_dict(config), **(identity(config) if identity else {})):
            print(f"[run] skip: {config.out_dir} is complete")
            return None
        return action(config)
    return run_unit


def with_model_card(final: Path, action):
    """Evaluate, then rewrite final/README.md with the EM / F1 rows: the card `publish` uploads."""
    def run_unit(config):
        from pipeline.cards import eval_rows_for, write_model_card

        result = action(config)
        summary = Path(config.out_dir) / "summary.json"
        if summary.is_file():
            write_model_card(final, eval_rows_for(final, [summary]))
        return result
    return run_unit


def generate_config(cfg: RunConfig):
    layers = merged({"methods": cfg.methods, "wiki": cfg.wiki}, cfg.generate,
                    {"out_dir": str(cfg.out_dir / "generate")})
    return build(GenerateConfig, layers, where="generate")


def filter_config(cfg: RunConfig, dataset_dir: Path):
    layers = merged({"methods": cfg.methods}, cfg.filter,
                    {"inputs": [str(cfg.out_dir / "generate")], "out_dir": str(dataset_dir)})
    return build(FilterConfig, layers, where="filter")  # filter skips unchanged methods itself


def train_config(cfg: RunConfig, student: Student, fmt: str, dataset_dir: Path):
    """The student's FinetuneConfig (its YAML < the experiment's `train` < the student's `train`
    < this unit's keys), built and resolved once; `train` hands it to the launched processes."""
    layers = merged(read_section(student.config, "train"), cfg.train, student.train, {
        "experiment": cfg.experiment, "student_name": student.name, "format": fmt,
        "dataset_dir": str(dataset_dir), "size_class": student.size_class})
    return resolve(build(FinetuneConfig, layers, where=f"{student.config} (train, {student.name} on {fmt})"))


def launch_train(ft) -> None:
    """`train` for one student x method, unless its final model is done with this config."""
    final = Path(ft.output_dir) / "final"
    if is_done(final / "manifest.json", config=to_dict(ft), precision=training_precision(ft)):
        print(f"[run] skip: {final} is complete")
        return
    try:
        code = train(ft)
    except PipelineError as exc:  # the child's own error line, relayed by the train stage
        failure = PipelineError(f"training {ft.student_name} on {ft.format}: {exc}")
        failure.exit_code = exc.exit_code
        raise failure from None
    if code != 0:
        raise PipelineError(f"training {ft.student_name} on {ft.format} failed (exit code {code}); "
                            "fix the cause and re-run: it resumes from the latest checkpoint")


def training_precision(ft) -> str:
    """The precision this training unit would run in (on this machine, under its accelerate config)."""
    accelerate = read_yaml(pick_accelerate_config(ft.accelerate_config, gpu_count()))
    return precision.training(ft.precision, deepspeed=accelerate.get("distributed_type") == "DEEPSPEED").precision


def eval_precision(config) -> dict:
    return precision_record(model_under_test(config))


def eval_config(cfg: RunConfig, student: Student, final: Path | None, fmt: str | None = None):
    """The eval unit of a prompted base model (final=None) or of the checkpoint `final`
    trained on trajectory format `fmt` (evaluated with the method of the same name)."""
    if final is None:
        name, layer = f"{student.name}-prompt", {
            "model": student.prompt_model, "methods": cfg.methods,
            "size_class": student.size_class, "params_b": student.params_b}
    else:
        name, layer = f"{student.name}-ft-{fmt}", {
            "checkpoint": str(final), "methods": [fmt],
            "size_class": student.size_class, "params_b": student.params_b}
    layers = merged({"wiki": cfg.wiki}, cfg.eval, layer, {"out_dir": str(cfg.out_dir / "eval" / name)})
    return build(EvalConfig, layers, where=f"eval ({name})")


def check_student(student: Student) -> None:
    """A student we train needs its training config and size; one given as a checkpoint is not trained."""
    if student.checkpoint:
        if student.train or student.config:
            raise PipelineError(f"student {student.name}: `checkpoint` is already fine-tuned; drop `config`/`train` "
                                "(or drop `checkpoint` to train it here)")
        return
    if student.format:
        raise PipelineError(f"student {student.name}: `format` describes a `checkpoint`; a student trained here "
                            "decodes in each method's own format")
    needed = ["config"] if student.finetune else []
    needed += ["size_class", "params_b"] if student.finetune or student.prompt_model else []
    missing = [k for k in needed if getattr(student, k) in (None, "")]
    if missing:
        raise PipelineError(f"student {student.name}: set {', '.join(missing)} (or give a fine-tuned `checkpoint`)")


def checkpoint_eval_config(cfg: RunConfig, student: Student):
    """Eval of an already fine-tuned student: its own format (EvalConfig's default methods mean that)."""
    name = f"{student.name}-checkpoint"
    layer = {"checkpoint": student.checkpoint, "format": student.format, "methods": EvalConfig().methods,
             "size_class": student.size_class, "params_b": student.params_b}
    layers = merged({"wiki": cfg.wiki}, cfg.eval, layer, {"out_dir": str(cfg.out_dir / "eval" / name)})
    return build(EvalConfig, layers, where=f"eval ({name})")


def plot_config(cfg: RunConfig, summaries: list[Path]):
    layers = merged(cfg.plot, {"summaries": [str(s) for s in summaries], "out_dir": str(cfg.out_dir / "plot")})
    return build(PlotConfig, layers, where="plot")
