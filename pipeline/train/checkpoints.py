"""The checkpoint-N folders of a run's output_dir: which are there, the latest complete one to
resume from, incomplete ones set aside, and their removal once final/ is complete
(`keep_checkpoints: false`). What makes one complete under each strategy: pipeline.train.checks.
"""

from __future__ import annotations

import time
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.train.checks import checkpoint_step, incomplete_reason, is_complete_checkpoint
from pipeline.train.config import FinetuneConfig


def list_checkpoints(output_dir: Path) -> list[Path]:
    if not output_dir.is_dir():
        return []
    found = [p for p in output_dir.iterdir() if p.is_dir() and checkpoint_step(p) >= 0]
    return sorted(found, key=checkpoint_step)


def latest_complete_checkpoint(output_dir: Path) -> Path | None:
    complete = [p for p in list_checkpoints(output_dir) if is_complete_checkpoint(p)]
    return complete[-1] if complete else None


def set_aside_incomplete(output_dir: Path) -> list[tuple[Path, str]]:
    """Rename incomplete checkpoint folders (a run killed mid-save) so that neither resume nor the
    trainer's rotation mistakes them for real ones; returns their new paths, each with what it
    lacked. Rank 0 only."""
    moved = []
    for path in list_checkpoints(output_dir):
        why = incomplete_reason(path)
        if why is not None:
            target = path.with_name(f"incomplete-{path.name}-{int(time.time())}")
            path.rename(target)
            moved.append((target, why))
    return moved


def choose_resume(cfg: FinetuneConfig) -> Path | None:
    if cfg.resume == "none":
        return None
    if cfg.resume == "latest":
        return latest_complete_checkpoint(cfg.output_dir)
    path = Path(cfg.resume)
    if not is_complete_checkpoint(path):
        raise PipelineError(f"resume: {path} is not a complete checkpoint (needs trainer_state.json, weights, optimizer state)")
    return path


def remove_checkpoints(output_dir: Path) -> list[tuple[Path, int]]:
    """Delete every checkpoint-* (and set-aside incomplete-*) folder of a finished run: what is
    left is final/, all that eval and publish read. Returns (path, bytes) per folder. Rank 0 only,
    after final/ is in place, so a kill in between leaves a resumable or a finished run."""
    import shutil
    freed = []
    for path in sorted([*output_dir.glob("checkpoint-*"), *output_dir.glob("incomplete-checkpoint-*")]):
        if path.is_dir():
            size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
            shutil.rmtree(path)
            freed.append((path, size))
    return freed
