"""The precision each unit computes in on this machine, and the refusal to mix: a unit whose
finished results were computed in another precision stops the run before any work."""

from __future__ import annotations

from pathlib import Path

from pipeline.core import precision as core_precision
from pipeline.core.config import read_yaml
from pipeline.core.errors import PipelineError
from pipeline.core.storage import read_manifest
from pipeline.stages.eval import model_under_test, precision_record
from pipeline.stages.grid.unit import Unit
from pipeline.train import launcher
from pipeline.train.config import FinetuneConfig
from pipeline.train.plan import foreseen


def training_precision(ft) -> str:
    """The precision this training unit would run in (on this machine, under its accelerate config)."""
    world = launcher.config_world(ft)
    return foreseen(ft, read_yaml(world.config), world.processes, world.gpus).precision.precision


def training_precision_record(ft) -> dict:
    return {"precision": training_precision(ft)}  # what train's final manifest records


def eval_precision(config) -> dict:
    return precision_record(model_under_test(config))


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
    env = f"{core_precision.ENV}={was['precision']}, or " if was.get("precision") else ""
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
    if isinstance(unit.config, FinetuneConfig):  # a training unit: its final/ holds the result
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
