"""How a unit runs: generate and eval each in its own `python -m pipeline` process, training
and GRPO under `accelerate launch`, so that one model's (GPU) memory is free before the next one
loads; and when a unit is skipped (its manifest says it is complete with the same config)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from pipeline.agent.answerers import unread_model_dropped
from pipeline.core import gpu_memory
from pipeline.core.config import read_yaml, to_dict, upgrade_keys
from pipeline.core.errors import PipelineError
from pipeline.core.parent_death import ends_with_parent
from pipeline.core.relay import pieces
from pipeline.core.storage import is_done, read_manifest
from pipeline.llm.interpreter import in_process_vllm, python_for
from pipeline.llm.serve_groups import attached
from pipeline.rl.heldout import HeldoutSettings
from pipeline.stages.grid import precision
from pipeline.stages.grpo import grpo
from pipeline.stages.train import train
from pipeline.tasks import DEFAULT_TASK
from pipeline.train import launcher
from pipeline.train.checkpoints import remove_checkpoints


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


def unit_skips(unit) -> bool:
    """Whether a generate or eval unit will skip: complete with its config (and precision)."""
    return unit_done(unit.config, unit.precision)


# Keys a stage config gained after runs were made, each with the value that means what a manifest
# written without it did: such a finished run is still this config's (task: HotpotQA's before
# configs named one; heldout: GRPO without a held-out curve; allow_question_overlap: refused overlaps).
ADDED_LATER = {"task": DEFAULT_TASK, "heldout": to_dict(HeldoutSettings()), "allow_question_overlap": False}


def as_written_then(config: dict, was: dict) -> dict:
    """`config` as a manifest whose config is `was` would hold it: each ADDED_LATER key that `was`
    lacks, at its meaning-preserving value, left out. Key by key, so a manifest written between
    two additions (with `task`, without `allow_question_overlap`) is still this config's."""
    return {k: v for k, v in config.items() if k in was or not (k in ADDED_LATER and v == ADDED_LATER[k])}


# Keys that say what a training keeps and logs, not what it learns: a final model made with other
# values is still this config's (`keep_checkpoints: false` set after a grid filled the disk must
# not retrain its finished units).
HOUSEKEEPING = ("save_steps", "save_total_limit", "keep_checkpoints", "logging_steps", "report_to")


def housekeeping_as_then(config: dict, was: dict) -> dict:
    """`config` with its HOUSEKEEPING keys as the finished run's config `was` had them."""
    return {**config, **{key: was[key] for key in HOUSEKEEPING if key in was}}


def trained_then(final: Path, config: dict, **expected) -> bool:
    """Whether final/ is complete with this training config, its housekeeping aside, and the
    `expected` manifest values (precision). Where `keep_checkpoints` is now false, the checkpoints
    the finished run kept are removed, as the run itself would have."""
    was = (read_manifest(final / "manifest.json") or {}).get("config") or {}
    if not is_done(final / "manifest.json", config=housekeeping_as_then(config, was), **expected):
        return False
    if not config.get("keep_checkpoints", True):
        freed = remove_checkpoints(final.parent)
        if freed:
            print(f"[run] keep_checkpoints: false: removed {len(freed)} checkpoint folder(s) of {final.parent}, "
                  f"{sum(size for _, size in freed) / 1e9:.1f} GB")
    return True


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
        # SIGTERM should `run` be killed outright: it stops as on Ctrl-C, its server with it
        proc = subprocess.Popen([unit_python(config), "-m", "pipeline", stage, "--config", str(path)],
                                stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                preexec_fn=ends_with_parent())
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


def unit_python(config) -> str:
    """The interpreter a generate or eval unit's process runs in: the vLLM environment's for the
    in-process vLLM engine where this one has no vLLM (pipeline/llm/interpreter.py), else this one."""
    llm = config.teacher if hasattr(config, "teacher") else config.model
    if in_process_vllm(llm, config.serve, config.oracle):
        return python_for(f"{llm.model} (backend: vllm without `serve:`)")
    return sys.executable


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


def launch_train(ft) -> None:
    """`train` for one student x method, unless its final model is done with this config."""
    final = Path(ft.output_dir) / "final"
    with training_errors(ft):  # the plan's refusals (a batch that does not divide) name the unit
        trains_in = precision.training_precision(ft)
    if trained_then(final, to_dict(ft), precision=trains_in):
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
    world = launcher.config_world(ft)
    if world.gpus == 0 or read_yaml(world.config).get("use_cpu"):
        return None
    return gpu_memory.training_need(f"training {ft.student_name} on {ft.format}", world.processes)


def launch_grpo(gr) -> None:
    """`grpo` for one fine-tuned student, unless its final policy is done with this config."""
    final = Path(gr.output_dir) / "final"
    was = (read_manifest(final / "manifest.json") or {}).get("config") or {}
    if trained_then(final, as_written_then(to_dict(gr), was)):
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
