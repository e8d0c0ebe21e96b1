"""What `run` refuses before the first unit: keys it sets itself, each unit's own settings, the
questions trained on apart from those scored, and, for the units selected on this machine,
writable folders, model folders, each launch's devices and the precision of results already there."""

from __future__ import annotations

from pathlib import Path

from pipeline import rounds
from pipeline.core.errors import PipelineError
from pipeline.core.storage import check_writable_dir
from pipeline.stages.eval import EvalConfig
from pipeline.stages.eval import check_settings as check_eval
from pipeline.stages.filter import FilterConfig
from pipeline.stages.filter import check_settings as check_filter
from pipeline.stages.generate import GenerateConfig
from pipeline.stages.generate import check_settings as check_generate
from pipeline.stages.grid.precision import check_precisions
from pipeline.stages.grid.spec import RunConfig, Student
from pipeline.stages.grid.unit import Unit
from pipeline.stages.grid.unit_configs import grpo_formats
from pipeline.stages.grpo import GrpoConfig, check_search_mode
from pipeline.tasks import get_task
from pipeline.train import launcher
from pipeline.train.config import FinetuneConfig
from pipeline.train.preflight import check_question_sets, preflight_launch
from pipeline.train.sft import split_batch


def check_selected(cfg: RunConfig, units: list[Unit]) -> None:
    """What depends on this machine and on earlier results, for the units selected to run here:
    writable folders, model folders, each launch's devices, the precision of results already there."""
    selected = [u for u in units if u.selected]
    check_outputs(cfg, selected)
    check_model_folders(units)
    check_launch_devices(selected)
    check_interpreters(selected)
    check_precisions(selected)


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
            split_batch(config.global_batch_size, launcher.config_world(config).processes, config.per_device_batch_size,
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


def launches(unit: Unit) -> bool:
    """Whether a unit is an `accelerate launch` (a training or a GRPO unit), known by its config:
    a rehearsal may wrap its action."""
    return isinstance(unit.config, FinetuneConfig | GrpoConfig)


def made_finals(units: list[Unit]) -> set[str]:
    """The final/ folders the grid's train and grpo units make."""
    return {str(Path(u.config.output_dir) / "final") for u in units if launches(u)}


def check_search_modes(units: list[Unit]) -> None:
    """A student the grid trains (on its generate units' observations, or by GRPO) is evaluated
    in the wiki.search mode it was trained in: refused at plan time otherwise, unless that eval
    unit sets allow_search_mismatch (its rows then say trained_search)."""
    trained = {u.config.wiki.search for u in units if isinstance(u.config, GenerateConfig | GrpoConfig)}
    made = made_finals(units)
    for unit in units:
        config = unit.config
        if (isinstance(config, EvalConfig) and str(config.finetuned) in made and not config.allow_search_mismatch
                and trained - {config.wiki.search}):
            raise PipelineError(f"{unit.title}: its student is trained on wiki.search={'/'.join(sorted(trained))} "
                                f"observations and evaluated with wiki.search={config.wiki.search}; give the grid one "
                                "wiki.search, or set eval.allow_search_mismatch=true (its rows are labelled)")


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


def check_grpo(gr) -> None:
    """A grpo unit's batch split over its launch, its training question set's name, its held-out
    set apart from it (vLLM where its rollouts need it: check_interpreters)."""
    from pipeline.rl.config import check_heldout_apart
    from pipeline.rl.plan import batch_plan

    batch_plan(gr, launcher.config_world(gr).processes)
    check_question_sets(gr)  # the training set and the held-out curve's, as `grpo` checks them
    check_search_mode(gr)
    check_heldout_apart(gr)


def check_interpreters(units: list[Unit]) -> None:
    """A unit whose own process needs vLLM (the in-process engine, GRPO's vLLM rollouts) runs in
    the vLLM environment where this interpreter has none (pipeline/llm/interpreter.py); where no
    interpreter has it, or the vLLM environment lacks what a GRPO launch imports, it is refused
    now, not after the phases before it."""
    from pipeline.core.config import read_yaml
    from pipeline.rl.config import rollout_python
    from pipeline.stages.grid.children import unit_python

    for unit in units:
        try:
            if isinstance(unit.config, EvalConfig | GenerateConfig):
                unit_python(unit.config)
            elif isinstance(unit.config, GrpoConfig):
                world = launcher.config_world(unit.config)
                rollout_python(unit.config.rollout.engine, read_yaml(world.config).get("distributed_type"))
        except PipelineError as exc:
            raise PipelineError(f"{unit.title}: {exc}") from None


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


def check_launch_devices(units: list[Unit]) -> None:
    """What `train` and `grpo` refuse of every launch when their phase starts (the one list,
    pipeline/train/preflight.py: devices, QLoRA or an 8-bit optimizer without a GPU, an embedded
    model's package, a `resume` path), refused here before the first phase instead."""
    for unit in units:
        if launches(unit):
            world = launcher.config_world(unit.config)
            try:
                preflight_launch(unit.config, world.config, world.processes, world.gpus)
            except PipelineError as exc:
                raise PipelineError(f"{unit.title}: {exc}") from None


def check_outputs(cfg: RunConfig, units: list[Unit]) -> None:
    """Every folder the selected units will write must be writable before the first one starts:
    a read-only checkpoint root should not surface after hours of generation."""
    check_writable_dir(cfg.out_dir, "out_dir")
    for unit in units:
        if launches(unit):
            ft = unit.config
            check_writable_dir(ft.output_dir, f"{unit.phase} output_dir ({ft.student_name}, {ft.format})")
