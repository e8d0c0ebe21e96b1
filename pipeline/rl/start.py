"""Where a GRPO run starts: a base model, a `final/` of ours, or a released fine-tuned model.

    start = resolve_start("checkpoints/small/smollm2-135m/react/final", fmt="react")

- a folder with our manifest.json (a `train` or `grpo` final/): its weights, or its LoRA adapter
  on the base its manifest names; it must have been trained on the loop GRPO runs;
- a PEFT adapter or a known released agent (pipeline.hub.finetuned resolves it as `eval` does: the
  base from `base_model=`, its adapter_config.json or the registry); it must decode in our
  format (FireAct's and AgentLM's own formats are not this project's loop);
- anything else is a base model: "smollm2", a folder with config.json, or a hub id.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.core.storage import require_complete
from pipeline.hub.models import SMOLLM2, model_label, origin_model, resolve_model_path


@dataclass
class StartPoint:
    model: str  # what from_pretrained loads: the full model, or the base of `adapter`
    adapter: str | None  # a PEFT adapter folder to put on `model`
    tokenizer: str
    label: str  # the start's student label (the default output name is <label>-grpo)
    size_class: str | None
    kind: str  # base | ours | released
    trained_format: str | None  # what the start was fine-tuned to decode (None: a base model)
    origin: str | None = None  # the pretrained model at the root of its lineage (whose licence binds it)


def is_ours(student: str) -> bool:
    return (Path(student).expanduser() / "manifest.json").is_file()


def start_label(student: str) -> str:
    """The start's label without loading anything: our manifest's student, else the student
    folder of our layout (<student>/<format>/final), else the folder or hub id's last part."""
    path = Path(student).expanduser()
    if is_ours(student):
        from pipeline.core.storage import read_manifest

        return str((read_manifest(path / "manifest.json") or {}).get("student") or model_label(student))
    if path.name == "final" and len(path.parts) >= 3:
        return model_label(str(path.parent.parent))
    return model_label(student)


def resolve_start(student: str, *, fmt: str, base_model: str | None = None, size_class: str | None = None) -> StartPoint:
    if is_ours(student):
        return _ours(Path(student).expanduser(), fmt)
    folder = Path(student).expanduser()
    from pipeline.hub.released import find_agent

    if find_agent(student) is not None or (folder / "adapter_config.json").is_file():
        return _released(student, fmt, base_model, size_class)
    if base_model:
        raise PipelineError(f"base_model={base_model} names the base of an adapter, but {student} is not one; drop it")
    from pipeline.hub.models import looks_like_path

    if student != SMOLLM2 and looks_like_path(student) and not folder.is_dir():
        raise PipelineError(f"student: {student} not found; give a final/ of ours (e.g. from `train`), a model or "
                            f"adapter folder, a hub id, or '{SMOLLM2}'")
    model = resolve_model_path(student)
    return StartPoint(model, None, student, model_label(student), size_class, "base", None, model)


def _ours(final: Path, fmt: str) -> StartPoint:
    manifest = require_complete(final / "manifest.json", f"starting checkpoint {final}")
    trained = manifest.get("format") or manifest.get("method")
    if trained != fmt:
        raise PipelineError(f"{final} was trained on '{trained}' trajectories; GRPO in the '{fmt}' loop needs a "
                            f"student of that format (set format={trained}, or start from a {fmt} student)")
    if manifest.get("layout") == "messages":  # GRPO's rollouts are the text loop's prompt and completions
        raise PipelineError(f"{final} was trained in the messages layout (train.layout=messages) and GRPO's rollouts "
                            "decode the text layout; start from a student trained in the text layout")
    model, adapter = str(final), None
    if manifest.get("adapter"):
        from pipeline.hub.models import looks_like_path

        model, adapter = str(manifest.get("base_model") or ""), str(final)
        if not model or looks_like_path(model) and not Path(model).expanduser().exists():
            raise PipelineError(f"{final} is a LoRA adapter whose base model '{model}' is missing; restore it "
                                "(or edit base_model in its manifest.json)")
    return StartPoint(model, adapter, str(final), str(manifest.get("student") or final.name),
                      manifest.get("size_class"), "ours", trained, origin_model(str(final)))


def _released(student: str, fmt: str, base_model: str | None, size_class: str | None) -> StartPoint:
    from pipeline.hub.finetuned import DECODE_FORMATS, resolve_finetuned
    from pipeline.hub.released import find_agent

    agent = find_agent(student)
    decodes = agent.format if agent else fmt
    if DECODE_FORMATS.get(decodes) != (fmt, "zero_shot"):  # checked before anything is fetched
        raise PipelineError(f"{student} decodes in the '{decodes}' format, not this project's '{fmt}' loop; "
                            "GRPO runs the project's own ReAct / Act text (start from a student trained on it)")
    ckpt = resolve_finetuned(student, format=fmt, base_model=base_model, size_class=size_class, key="student")
    own_tokenizer = ckpt.adapter and (Path(ckpt.adapter) / "tokenizer_config.json").is_file()
    return StartPoint(ckpt.model, ckpt.adapter, ckpt.adapter if own_tokenizer else ckpt.model,
                      model_label(student), ckpt.size_class, "released", ckpt.trained_format, ckpt.model)
