"""Each unit's stage config, layered from the grid's sections (the experiment's, then the
student's, then the keys `run` sets itself), built and checked as its stage would."""

from __future__ import annotations

from pathlib import Path

from pipeline.core.config import build, merged, read_section, to_dict
from pipeline.core.errors import PipelineError
from pipeline.stages.eval import EvalConfig, check_layout
from pipeline.stages.filter import FilterConfig
from pipeline.stages.generate import GenerateConfig
from pipeline.stages.grid.spec import RunConfig, Student
from pipeline.stages.grpo import GrpoConfig
from pipeline.stages.grpo import resolve as resolve_grpo
from pipeline.stages.plot import PlotConfig
from pipeline.train.config import FinetuneConfig, resolve


def generate_config(cfg: RunConfig):
    layers = merged({"task": cfg.task, "methods": cfg.formats, "wiki": cfg.wiki}, cfg.generate,
                    {"out_dir": str(cfg.out_dir / "generate")})
    return build(GenerateConfig, layers, where="generate")


def oracle_generate_config(cfg: RunConfig, gen):
    """compare_oracle's generate unit: the stand-in teacher on the model teacher's question set
    (its first `limit` questions; all of them in target mode, whose draw can reach any), in its
    resolved wiki settings, one episode per question (the stand-in does not sample), in generate-oracle/."""
    layers = {"task": cfg.task, "methods": cfg.formats, "oracle": cfg.compare_oracle, "questions": gen.questions,
              "limit": gen.limit if gen.target_correct is None else None, "wiki": to_dict(gen.wiki),
              "prompting": {"max_steps": gen.prompting.max_steps},  # the same step budget in the environment
              "max_in_flight": gen.max_in_flight, "out_dir": str(cfg.out_dir / "generate-oracle")}
    return build(GenerateConfig, layers, where="compare_oracle (the stand-in's generate)")


def oracle_filter_config(cfg: RunConfig, gen_dir: Path, dataset_dir: Path, matched_dir: Path):
    """compare_oracle's filter unit: the grid's filter settings on the stand-in's episodes, matched
    to the model teacher's datasets (same questions, at most its rows: match_dataset), so its own
    row counts follow those, never equal_rows'."""
    layers = merged({"formats": cfg.formats}, cfg.filter, {
        "inputs": [str(gen_dir)], "out_dir": str(dataset_dir), "match_dataset": str(matched_dir), "equal_rows": False})
    return build(FilterConfig, layers, where="compare_oracle (the stand-in's filter)")


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


def eval_config(cfg: RunConfig, student: Student, final: Path | None, fmt: str | None = None,
                round_number: int = 1, exemplars: str | None = None, layout: str = "text"):
    """The eval unit of a prompted base model (final=None; with `exemplars`, one of the grid's
    compare_exemplars, in a folder of its own) or of the fine-tuned `final` trained on trajectory
    format `fmt` in `layout` (its train unit's: a messages student acts through tool calls, so its
    eval sets prompting.interface=tools), evaluated with the method of the same name, in round 1
    or a later self-training round (pipeline/rounds.py: its own folder and model label)."""
    if final is None:
        name, layer = f"{student.name}-prompt", {
            "model": student.prompt_model, "methods": [*cfg.formats, *cfg.prompted_methods],
            "size_class": student.size_class, "params_b": student.params_b}
        if exemplars is not None:
            name, layer = f"{name}-{exemplars}", merged(layer, {"prompting": {"exemplars": exemplars}})
    else:
        name, layer = f"{student.name}-ft-{fmt}", {
            "finetuned": str(final), "methods": [fmt],
            "size_class": student.size_class, "params_b": student.params_b}
        if layout == "messages":
            layer["prompting"] = {"interface": "tools"}
    if round_number > 1:
        name, layer = f"{name}-round{round_number}", merged(layer, {"model": {
            "name": f"{student.name} round {round_number} (fine-tuned)"}})
    layers = merged({"task": cfg.task, "wiki": cfg.wiki}, cfg.eval, student.eval, layer,
                    {"out_dir": str(cfg.out_dir / "eval" / name)})
    ev = build(EvalConfig, layers, where=f"eval ({name})")
    check_serving(ev, f"eval ({name})")
    if final is not None:
        check_student_layout(ev, final, layout, f"eval ({name})")
    return ev


def check_student_layout(ev, final: Path, layout: str, where: str) -> None:
    """The student's eval decodes the layout its train unit writes (eval's own check, made when
    the plan is, not after the training): a text student is never sent tool calls."""
    try:
        check_layout(final, layout, ev.prompting.interface)
    except PipelineError as exc:
        raise PipelineError(f"{where}: {exc} (or train this student with `train: {{layout: messages}}`)") from None


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


def plot_config(cfg: RunConfig, summaries: list[Path], rounds_evals: list[Path] | None = None,
                compared: list[Path] | None = None, oracle_data: list[Path] | None = None):
    """The plot unit: every eval's summary, the self-training rounds' (points of the figure with
    sizes on its x axis), the prompted evals with other exemplars (exemplars.md), the students
    trained on the stand-in's data (compare_oracle: teachers.md), into
    <out_dir>/plot unless the `plot` section names its own out_dir (a grid that extends another's
    folders keeps that grid's figure: configs/small-scaling.yaml)."""
    layers = merged({"out_dir": str(cfg.out_dir / "plot")}, cfg.plot, {
        "summaries": [str(s) for s in summaries], "rounds": [str(s) for s in rounds_evals or []],
        "exemplar_comparison": [str(s) for s in compared or []],
        "oracle_data_comparison": [str(s) for s in oracle_data or []]})
    return build(PlotConfig, layers, where="plot")


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


def served_as(ft, final: Path) -> tuple[str, str | None]:
    """What a server loads for a student trained by `ft` into `final`: (base model, LoRA adapter or None)."""
    return (str(final), None) if ft.finetuning == "full" else (ft.student, str(final))


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
