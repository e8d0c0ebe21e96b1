"""`eval`: run a prompted base model or a fine-tuned student through the environment -> EM / F1.

    python -m pipeline eval model.model=smollm2 size_class=135m params_b=0.135 methods=[react,cot] limit=20
    python -m pipeline eval checkpoint=checkpoints/demo/smollm2-135m/react/final limit=20
    python -m pipeline eval --config configs/demo.yaml          # the demo's `eval` section

A base model is prompted with the method's instruction and exemplars (mode `prompt`); a
fine-tuned checkpoint of ours runs zero-shot in the format it was trained on (mode `finetune`:
the question line alone), its base model, adapter, format and size read from its manifest.
Per-question records are appended as episodes finish (a re-run resumes), then `summary.json`
gets one row per method: the input of `python -m pipeline plot`.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import ClassVar

from pipeline.config import add_config_arguments, stage_config, to_dict
from pipeline.episodes import answerer, run_methods, start_run, writing_run
from pipeline.errors import PipelineError
from pipeline.llm.config import LLMConfig
from pipeline.methods import FORMATS_USED, MethodSettings
from pipeline.storage import atomic_write_json, require_complete, write_manifest
from pipeline.wiki.config import WikiConfig

# Sizes (billions of parameters) of models a config may name without saying params_b.
KNOWN_SIZES_B = {"smollm2": 0.135, "HuggingFaceTB/SmolLM2-135M-Instruct": 0.135,
                 "meta-llama/Llama-3.1-8B": 8.0, "meta-llama/Llama-3.1-8B-Instruct": 8.0,
                 "Qwen/Qwen2.5-7B": 7.6, "Qwen/Qwen2.5-7B-Instruct": 7.6,
                 "meta-llama/Llama-3.1-70B": 70.6, "meta-llama/Llama-3.1-70B-Instruct": 70.6,
                 "Qwen/Qwen2.5-72B": 72.7, "Qwen/Qwen2.5-72B-Instruct": 72.7}


# Keys whose change makes old records incomparable with new ones (a larger `limit` is fine).
IDENTITY_KEYS = ("model", "checkpoint", "questions", "prompting", "wiki")


@dataclass
class EvalConfig:
    RENAMED_KEYS: ClassVar[dict[str, str]] = {"method": "prompting"}  # old key -> new (pipeline.config)

    model: LLMConfig = field(default_factory=LLMConfig)  # a base model to prompt
    checkpoint: Path | None = None  # or one of our fine-tuned `final` folders (mode finetune)
    size_class: str | None = None  # e.g. 135m, 8b, 62b; from the checkpoint when not given
    params_b: float | None = None  # billions of parameters (the figure's x axis)
    methods: list[str] = field(default_factory=lambda: ["standard", "cot", "act", "react"])
    questions: str = "offline-eval"  # react-dev500 needs wiki.backend=live or a full local index
    limit: int | None = None
    out_dir: Path = Path("runs/eval/default")
    prompting: MethodSettings = field(default_factory=MethodSettings)  # mode is set from the model (prompt | zero_shot)
    wiki: WikiConfig = field(default_factory=WikiConfig)
    max_in_flight: int = 16


@dataclass
class ModelUnderTest:
    llm: LLMConfig
    label: str
    mode: str  # prompt | finetune
    size_class: str
    params_b: float
    trained_format: str | None  # the format a fine-tuned student decodes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, EvalConfig)


def main(args: argparse.Namespace) -> int:
    evaluate(stage_config(EvalConfig, args, section="eval"))
    return 0


def evaluate(cfg: EvalConfig) -> list[dict]:
    """Run every method, write records and `summary.json`; return the summary rows."""
    target = model_under_test(cfg)
    settings = replace(cfg.prompting, mode="zero_shot" if target.mode == "finetune" else "prompt")
    check_finetuned_methods(cfg.methods, target)
    model = answerer(target.llm)
    questions, backend, llm, _ = start_run(cfg, "eval", model, settings, IDENTITY_KEYS)
    manifest = dict(stage="eval", config=to_dict(cfg), model=target.label, mode=target.mode,
                    n_questions=len(questions))
    with writing_run(cfg, IDENTITY_KEYS, manifest):
        # A summary of an earlier (smaller) run must not outlive this run's start: if this run is
        # killed, no summary.json is left to be plotted as if it were this run's result.
        (cfg.out_dir / "summary.json").unlink(missing_ok=True)
        stats = run_methods(model, llm, cfg.methods, questions, settings, backend, cfg.out_dir,
                            max_in_flight=cfg.max_in_flight, source="eval")
        rows = [summary_row(target, name, cfg.questions, s) for name, s in stats.items()]
        atomic_write_json(cfg.out_dir / "summary.json", rows)
        write_manifest(cfg.out_dir / "manifest.json", complete=True, summary=rows, **manifest)
    for row in rows:
        print(f"{target.label} [{target.mode}] {row['method']:>16}: EM {row['em']:.3f} "
              f"F1 {row['f1']:.3f} over {row['n']} ({row['question_set']})")
    return rows


def model_under_test(cfg: EvalConfig) -> ModelUnderTest:
    if cfg.checkpoint is None:
        params_b = cfg.params_b or KNOWN_SIZES_B.get(cfg.model.model)
        missing = [k for k, v in (("size_class", cfg.size_class), ("params_b", params_b)) if not v]
        if missing:
            raise PipelineError(f"model '{cfg.model.model}': its size is not known; set "
                                + " and ".join(f"{k}=<{SIZE_HINTS[k]}>" for k in missing))
        return ModelUnderTest(cfg.model, cfg.model.label, "prompt", cfg.size_class, params_b, None)
    from pipeline.llm.hf import looks_like_path

    final = Path(cfg.checkpoint)
    manifest = require_complete(final / "manifest.json", f"fine-tuned checkpoint {final}")
    fmt = manifest.get("format") or manifest.get("method")  # "method": written before the rename
    missing = [k for k, v in (("format", fmt), ("student", manifest.get("student"))) if not v]
    if missing:
        raise PipelineError(f"{final}/manifest.json names no {' or '.join(repr(k) for k in missing)}; is it a `train` output folder?")
    if manifest.get("adapter"):
        base = manifest.get("base_model")
        if not base or looks_like_path(str(base)) and not Path(base).expanduser().exists():
            raise PipelineError(f"{final} is a LoRA adapter whose base model '{base}' is missing; "
                                "restore it there (or edit base_model in its manifest.json)")
        llm = replace(cfg.model, model=str(base), adapter=str(final), gguf_file=None)
    else:
        llm = replace(cfg.model, model=str(final), adapter=None, gguf_file=None)
    # One label per student across its methods, so the figure groups them as one model.
    label = cfg.model.name or f"{manifest['student']} (fine-tuned)"
    llm = replace(llm, name=label)
    size_class = cfg.size_class or manifest.get("size_class") or ""
    params_b = cfg.params_b or manifest.get("params_b")
    if not size_class or not params_b:
        raise PipelineError(f"{final}: its manifest has no size; set size_class= and params_b=")
    return ModelUnderTest(llm, label, "finetune", size_class, float(params_b), fmt)


SIZE_HINTS = {"size_class": "e.g. 8b", "params_b": "billions, e.g. 8.0"}


def check_finetuned_methods(methods: list[str], target: ModelUnderTest) -> None:
    """A student decodes only the format it was trained on (CoT-SC needs a CoT student)."""
    if target.mode != "finetune":
        return
    bad = [m for m in methods if set(FORMATS_USED.get(m, (m,))) != {target.trained_format}]
    if bad:
        raise PipelineError(
            f"checkpoint was trained on '{target.trained_format}' trajectories; it cannot run "
            f"{', '.join(bad)} (set methods=[{target.trained_format}])"
        )


def summary_row(target: ModelUnderTest, method: str, question_set: str, stats: dict) -> dict:
    return {"model": target.label, "size_class": target.size_class, "params_b": target.params_b,
            "mode": target.mode, "method": method, "question_set": question_set, **stats,
            "source": "ours"}
