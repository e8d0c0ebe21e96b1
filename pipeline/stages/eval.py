"""`eval`: run a prompted base model or a fine-tuned student through the environment -> EM / F1.

    python -m pipeline eval methods=[react,cot] limit=20      # the embedded SmolLM2-135M, prompted
    python -m pipeline eval finetuned=checkpoints/demo/smollm2-135m/react/final limit=20
    python -m pipeline eval finetuned=forestai/fireact_llama_2_7b_lora    # a released agent
    python -m pipeline eval finetuned=downloads/agent format=react params_b=7.6   # any folder
    python -m pipeline eval --config configs/demo.yaml          # the demo's `eval` section
    python -m pipeline eval task=fever model.model=smollm2 size_class=135m prompting.exemplars=paper limit=20
    python -m pipeline eval oracle=exact size_class=540b params_b=540 limit=20   # the stand-in teacher, no model

A base model is prompted with the method's instruction and exemplars (mode `prompt`); a
fine-tuned model (`finetuned=`) of ours (a `train` or `grpo` final/) runs zero-shot in the format it was trained on (mode `finetune`:
the question line alone), its base model, adapter, format and size read from its manifest.
Any other fine-tuned model or PEFT adapter (a folder or hub id without our manifest, e.g. a
released agent) is resolved by pipeline.hub.finetuned and decodes in its `format`
(pipeline.hub.finetuned.DECODE_FORMATS: ours, or FireAct's).
Per-question records are appended as episodes finish (a re-run resumes), then `summary.json`
gets one row per method: the input of `python -m pipeline plot`.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

from pipeline.agent.answerers import ORACLE, answerer, check_oracle, upgrade_oracle
from pipeline.agent.episodes import MAX_ERROR_SHARE, run_methods
from pipeline.agent.run_folder import check_resumable, sampling_record, start_run, writing_run
from pipeline.agent.run_folder import check_settings as check_run_settings
from pipeline.core import devices
from pipeline.core.config import (
    add_config_arguments,
    bound,
    check,
    in_range,
    listed,
    stage_config,
    to_dict,
)
from pipeline.core.errors import PipelineError
from pipeline.core.same_run import run_keys, same_run
from pipeline.core.shards import parse_shard
from pipeline.core.storage import (
    atomic_write_json,
    check_writable_dir,
    require_complete,
    write_manifest,
)
from pipeline.hub.models import require_installed
from pipeline.llm.config import LLMConfig
from pipeline.llm.serving import ServeConfig
from pipeline.methods import FORMATS_USED, MethodSettings, check_style
from pipeline.tasks import DEFAULT_TASK, get_task
from pipeline.wiki.config import WikiConfig, search_of

# Sizes (size class, billions of parameters) of models a config may name without saying them.
KNOWN_SIZES = {"smollm2": ("135m", 0.135), "HuggingFaceTB/SmolLM2-135M-Instruct": ("135m", 0.135),
               "gemma3-270m": ("270m", 0.268), "google/gemma-3-270m": ("270m", 0.268),
               "meta-llama/Llama-3.1-8B": ("8b", 8.0), "meta-llama/Llama-3.1-8B-Instruct": ("8b", 8.0),
               "Qwen/Qwen2.5-7B": ("7b", 7.6), "Qwen/Qwen2.5-7B-Instruct": ("7b", 7.6),
               "meta-llama/Llama-3.1-70B": ("70b", 70.6), "meta-llama/Llama-3.1-70B-Instruct": ("70b", 70.6),
               "Qwen/Qwen2.5-72B": ("72b", 72.7), "Qwen/Qwen2.5-72B-Instruct": ("72b", 72.7)}


@dataclass
class EvalConfig:
    RENAMED_KEYS: ClassVar[dict[str, str]] = {"method": "prompting", "checkpoint": "finetuned"}  # old key -> new (pipeline.core.config)
    UPGRADE_OLD: ClassVar = staticmethod(upgrade_oracle)  # an older manifest's `model.backend: oracle`

    task: str = same_run("identity", default="hotpotqa")  # hotpotqa | fever (pipeline.tasks): the questions, metric and exemplars
    model: LLMConfig = same_run("identity", default_factory=LLMConfig)  # a base model to prompt
    # exact | agent: evaluate the task's stand-in teacher in that search style instead, no model
    # loaded (labelled `oracle`; set size_class and params_b); null: a model answers (pipeline.agent.answerers)
    oracle: str | None = same_run("identity", default=None)
    finetuned: Path | None = same_run("identity", default=None)  # or a fine-tuned model: our `final` folder, any model/adapter folder, a hub id
    format: str | None = same_run("identity", default=None)  # how a fine-tuned model without our manifest decodes: standard|cot|act|react|fireact
    base_model: str | None = same_run("identity", default=None)  # the base of a fine-tuned adapter (default: its adapter_config.json)
    size_class: str | None = same_run("free", default=None)  # e.g. 135m, 8b, 62b; from the fine-tuned model when not given
    params_b: float | None = same_run("free", default=None, metadata=check(in_range(0, above=True)))  # billions of parameters (the figure's x axis)
    methods: list[str] = same_run("free", metadata=check(listed), default_factory=lambda: ["standard", "cot", "act", "react"])
    questions: str = same_run("identity", default="offline-eval")  # a set of the task's; react-dev500 needs wiki.backend=live or a full local index
    limit: int | None = same_run("free", default=None, metadata=bound(1))
    out_dir: Path = same_run("free", default=Path("runs/eval/default"))
    # How each method prompts. `style` (prompt | zero_shot | fireact) is sent as given to a prompted
    # model; a fine-tuned one decodes in the style it was trained on (leave `style` at its default)
    prompting: MethodSettings = same_run("identity", default_factory=MethodSettings)
    wiki: WikiConfig = same_run("identity", default_factory=WikiConfig)
    # A student fine-tuned on one wiki.search mode's observations is refused in the other; true
    # evaluates it anyway, its rows labelled with the mode it was trained in (`trained_search`)
    allow_search_mismatch: bool = same_run("free", default=False)
    max_in_flight: int = same_run("free", default=16, metadata=bound(1))
    shard: str | None = same_run("identity", default=None)  # i/n: this job's share of the questions, for N jobs (pipeline.core.shards)
    # Stop, with no summary, once more than this share of a method's episodes end in a model or
    # page-source error (end_reason llm_error / backend_error); a re-run runs those episodes again
    max_error_share: float = same_run("free", default=MAX_ERROR_SHARE, metadata=check(in_range(0, 1)))
    # Start `vllm serve` for the model under test (its `model` section's tensor_parallel_size,
    # gpu_memory_utilization, max_context, dtype, extra), evaluate over HTTP, stop it (pipeline/llm/serving.py;
    # keys: command, host, port, startup_timeout_s, stop_grace_s, extra_args, env, cpu_threads)
    serve: ServeConfig | None = same_run("free", default=None)


# Keys whose change makes old records incomparable with new ones (a larger `limit` is fine):
# declared on the fields (pipeline.core.same_run).
IDENTITY_KEYS = run_keys(EvalConfig)


@dataclass
class ModelUnderTest:
    llm: LLMConfig
    label: str
    mode: str  # prompt | finetune
    size_class: str
    params_b: float
    trained_format: str | None  # the format a fine-tuned student decodes
    decode_style: str = "zero_shot"  # how its prompts are built (pipeline.methods STYLES)
    released: dict | None = None  # a fine-tuned model not trained here: {finetuned, format}
    train_precision: str | None = None  # a fine-tuned student's training precision (its manifest)
    training: str | None = None  # "grpo" for a `grpo` final/ (its manifest's stage); None: SFT or prompted
    oracle: str | None = None  # the stand-in teacher's search style, where it answers (no model)
    trained_search: str | None = None  # a student of ours: the wiki.search mode of its training observations


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, EvalConfig)


def main(args: argparse.Namespace) -> int:
    evaluate(stage_config(EvalConfig, args, section="eval"))
    return 0


DEFAULT_STYLE = MethodSettings().style  # "prompt": for a fine-tuned model, "its own"


def check_settings(cfg: EvalConfig) -> None:
    """What eval refuses about its own settings, reading no model and no question (`run` checks
    every eval unit's when it makes its plan; a fine-tuned model's own format is checked when
    the model is read)."""
    check_oracle(cfg.oracle, cfg.serve, cfg.model, "model")
    check_style(cfg.prompting.style)
    # a fine-tuned model's own style is read with it; its trained format's is checked then
    style = "zero_shot" if cfg.finetuned and cfg.prompting.style == DEFAULT_STYLE else cfg.prompting.style
    check_run_settings(cfg, answerer(cfg.model, cfg.task, cfg.oracle, cfg.wiki.search), replace(cfg.prompting, style=style))


def sent_style(given: str, target: ModelUnderTest) -> str:
    """The prompting style sent to `target`: `given` (prompting.style) for a prompted model; a
    fine-tuned model's own (the one it was trained to decode in), which `given` may only repeat:
    exemplars sent to a student trained on the question alone would measure something else."""
    check_style(given)
    if target.mode != "finetune":
        return given
    if given not in (DEFAULT_STYLE, target.decode_style):
        raise PipelineError(f"prompting.style={given}: {target.label} is fine-tuned and decodes in the style it "
                            f"was trained on ({target.decode_style}); remove prompting.style")
    return target.decode_style


def evaluate(cfg: EvalConfig) -> list[dict]:
    """Run every method, write records and `summary.json`; return the summary rows."""
    check_writable_dir(cfg.out_dir)  # before the fine-tuned model is read or any model loaded
    check_style(cfg.prompting.style)
    target = model_under_test(cfg)
    check_trained_search(cfg, target)
    sent_style(cfg.prompting.style, target)  # before a server loads for minutes
    methods = default_methods(cfg.methods, target)
    check_finetuned_methods(methods, target)
    if cfg.serve is None:
        return run_evaluation(cfg, target, target.llm, methods)
    from pipeline.llm.serving import ServerGone, for_tool_calls, served

    record = precision_record(target)
    check_resumable(cfg.out_dir, "eval", cfg, IDENTITY_KEYS)  # refuse before a server loads for minutes
    check_same_precision(cfg.out_dir, record)
    serve = for_tool_calls(cfg.serve, target.llm, cfg.prompting.interface)
    with served(target.llm, serve, cfg.out_dir / "serve.log", cfg.max_in_flight) as (llm, server):
        try:
            return run_evaluation(cfg, target, llm, methods, server)
        except ServerGone as gone:
            raise PipelineError(f"eval {cfg.out_dir}: {gone}") from None


def run_evaluation(cfg: EvalConfig, target: ModelUnderTest, llm_cfg: LLMConfig, methods: list[str],
                   server=None) -> list[dict]:
    """Evaluate `target` through `llm_cfg` (its own config, or the endpoint of a server started
    for it: `server`, watched for dying mid-run)."""
    settings = replace(cfg.prompting, style=sent_style(cfg.prompting.style, target))
    task = get_task(cfg.task)
    model = answerer(llm_cfg, task, target.oracle, cfg.wiki.search)
    record = precision_record(target)  # what the model computes in, however it is reached
    questions, backend, llm, _ = start_run(cfg, "eval", model, settings, IDENTITY_KEYS, methods=methods,
                                           check=lambda: check_same_precision(cfg.out_dir, record))
    if server is not None:
        from pipeline.llm.serving import ServedLLM

        llm = ServedLLM(llm, server)
    manifest = dict(stage="eval", config=to_dict(cfg), task=task.name, model=target.label, mode=target.mode,
                    style=settings.style, n_questions=len(questions), sampling=sampling_record(settings, llm),
                    **record)  # style: what was sent
    try:
        with writing_run(cfg, IDENTITY_KEYS, manifest, check=lambda: check_same_precision(cfg.out_dir, record)):
            # A summary of an earlier (smaller) run must not outlive this run's start: if this run is
            # killed, no summary.json is left to be plotted as if it were this run's result.
            (cfg.out_dir / "summary.json").unlink(missing_ok=True)
            stats = run_methods(model, llm, methods, questions, settings, backend, cfg.out_dir,
                                max_in_flight=cfg.max_in_flight, source="eval",
                                max_error_share=cfg.max_error_share)
            rows = [summary_row(target, name, cfg.questions, s, record, task.name, settings.exemplars,
                                cfg.wiki.search) for name, s in stats.items()]
            if cfg.shard is not None:  # plot merges a shard set's rows into one (pipeline.core.shards)
                rows = [dict(row, shard=str(parse_shard(cfg.shard))) for row in rows]
            atomic_write_json(cfg.out_dir / "summary.json", rows)
            write_manifest(cfg.out_dir / "manifest.json", complete=True, summary=rows, **manifest)
    finally:
        close = getattr(llm, "close", None)  # e.g. an in-process vLLM engine: free its GPUs now
        if close is not None:
            close()
    for row in rows:
        errors = f"; {row['errors']} ended in a backend error (counted wrong)" if row["errors"] else ""
        print(f"{target.label} [{target.mode}] {row['method']:>16}: {task.metric_label} {row['em']:.3f} "
              f"F1 {row['f1']:.3f} over {row['n']} ({row['question_set']}){errors}")
    return rows


def model_under_test(cfg: EvalConfig) -> ModelUnderTest:
    check_oracle(cfg.oracle, cfg.serve, cfg.model, "model")
    if cfg.oracle is not None:
        if cfg.finetuned is not None:
            raise PipelineError(f"oracle={cfg.oracle} evaluates the stand-in teacher; finetuned= names a model: "
                                "set one of them")
        missing = [k for k in ("size_class", "params_b") if not getattr(cfg, k)]
        if missing:
            raise PipelineError(f"oracle={cfg.oracle}: the stand-in teacher has no size of its own; set "
                                + " and ".join(f"{k}=<{SIZE_HINTS[k]}>" for k in missing))
        return ModelUnderTest(cfg.model, ORACLE, "prompt", cfg.size_class, cfg.params_b, None, oracle=cfg.oracle)
    if cfg.finetuned is None:
        if cfg.format or cfg.base_model:
            raise PipelineError("format= and base_model= describe a fine-tuned model; set finetuned= too")
        known_class, known_b = KNOWN_SIZES.get(cfg.model.model, (None, None))
        size_class, params_b = cfg.size_class or known_class, cfg.params_b or known_b
        missing = [k for k, v in (("size_class", size_class), ("params_b", params_b)) if not v]
        if missing:
            raise PipelineError(f"model '{cfg.model.model}': its size is not known; set "
                                + " and ".join(f"{k}=<{SIZE_HINTS[k]}>" for k in missing))
        require_installed(cfg.model.model)  # an embedded model's package, before anything is written
        return ModelUnderTest(cfg.model, cfg.model.label, "prompt", size_class, params_b, None)
    from pipeline.hub.models import looks_like_path

    final = Path(cfg.finetuned)
    if not (final / "manifest.json").exists():
        return released_model_under_test(cfg)
    manifest = require_complete(final / "manifest.json", f"fine-tuned model {final}")
    fmt = manifest.get("format") or manifest.get("method")  # "method": written before the rename
    missing = [k for k, v in (("format", fmt), ("student", manifest.get("student"))) if not v]
    if missing:
        raise PipelineError(f"{final}/manifest.json names no {' or '.join(repr(k) for k in missing)}; is it a `train` output folder?")
    if cfg.format not in (None, fmt):
        raise PipelineError(f"{final} was trained here on '{fmt}' (its manifest); "
                            f"format={cfg.format} contradicts it: drop format=")
    if manifest.get("adapter"):
        base = manifest.get("base_model")
        if not base or looks_like_path(str(base)) and not Path(base).expanduser().exists():
            raise PipelineError(f"{final} is a LoRA adapter whose base model '{base}' is missing; "
                                "restore it there (or edit base_model in its manifest.json)")
        llm = replace(cfg.model, model=str(base), adapter=str(final), gguf_file=None)
    else:
        llm = replace(cfg.model, model=str(final), adapter=None, gguf_file=None)
    # One label per student across its methods, so the figure groups them as one model; a GRPO
    # student (a `grpo` final/, read like a `train` one) says so, and its rows carry `training`.
    training = "grpo" if manifest.get("stage") == "grpo" else None
    messages = check_layout(final, manifest.get("layout") or "text", cfg.prompting.interface)
    label = cfg.model.name or f"{manifest['student']} ({'GRPO' if training else 'fine-tuned'}{', messages' if messages else ''})"
    llm = replace(llm, name=label)
    size_class = cfg.size_class or manifest.get("size_class") or ""
    params_b = cfg.params_b or manifest.get("params_b")
    if not size_class or not params_b:
        raise PipelineError(f"{final}: its manifest has no size; set size_class= and params_b=")
    return ModelUnderTest(llm, label, "finetune", size_class, float(params_b), fmt,
                          train_precision=manifest.get("precision"), training=training,
                          trained_search=search_of(manifest))


def check_trained_search(cfg: EvalConfig, target: ModelUnderTest) -> None:
    """Refuse a student of ours evaluated in another wiki.search mode than the one whose
    observations it was trained on (it would read observations it never saw), unless asked."""
    trained = target.trained_search
    if trained is None or trained == cfg.wiki.search or cfg.allow_search_mismatch:
        return
    raise PipelineError(f"{cfg.finetuned} was trained on wiki.search={trained} observations; evaluating it with "
                        f"wiki.search={cfg.wiki.search} measures another environment: set wiki.search={trained}, "
                        "or allow_search_mismatch=true (its rows then say trained_search)")


SIZE_HINTS = {"size_class": "e.g. 8b", "params_b": "billions, e.g. 8.0"}


def check_layout(final: Path, layout: str, interface: str) -> bool:
    """A student decodes the layout it was trained on (its manifest's `layout`; text before the
    key existed): messages through tool calls (prompting.interface=tools), text through text.
    Returns whether it is a messages student."""
    if layout == "messages" and interface != "tools":
        raise PipelineError(f"{final} was trained on the messages layout (chat turns with tool calls); evaluate it "
                            "with prompting.interface=tools, served (`serve:`) or behind an OpenAI-compatible endpoint")
    if layout == "text" and interface == "tools":
        raise PipelineError(f"{final} was trained on the text layout; prompting.interface=tools would send it chat "
                            "turns it never saw: drop prompting.interface")
    return layout == "messages"


def released_model_under_test(cfg: EvalConfig) -> ModelUnderTest:
    """A fine-tuned model without our manifest (a released agent, any model or adapter folder)."""
    from pipeline.hub.finetuned import resolve_finetuned

    ckpt = resolve_finetuned(str(cfg.finetuned), format=cfg.format, base_model=cfg.base_model,
                             size_class=cfg.size_class, params_b=cfg.params_b, name=cfg.model.name)
    llm = replace(cfg.model, model=ckpt.model, adapter=ckpt.adapter, gguf_file=None, name=ckpt.label)
    return ModelUnderTest(llm, ckpt.label, "finetune", ckpt.size_class, ckpt.params_b, ckpt.trained_format,
                          ckpt.decode_style, {"finetuned": ckpt.source, "format": ckpt.format})


def default_methods(methods: list[str], target: ModelUnderTest) -> list[str]:
    """A fine-tuned model left at the default methods runs its own format only."""
    if target.mode == "finetune" and methods == EvalConfig().methods:
        return [target.trained_format]
    return methods


def check_finetuned_methods(methods: list[str], target: ModelUnderTest) -> None:
    """A student decodes only the format it was trained on (CoT-SC needs a CoT student)."""
    if target.mode != "finetune":
        return
    bad = [m for m in methods if set(FORMATS_USED.get(m, (m,))) != {target.trained_format}]
    if bad:
        raise PipelineError(
            f"the fine-tuned model was trained on '{target.trained_format}' trajectories; it cannot run "
            f"{', '.join(bad)} (set methods=[{target.trained_format}])"
        )


def summary_row(target: ModelUnderTest, method: str, question_set: str, stats: dict, record: dict,
                task: str = "hotpotqa", exemplars: str | None = None, search: str = "title") -> dict:
    """One row of summary.json; `em` is the task's metric (FEVER: accuracy). `task` is written for
    a task other than HotpotQA (a row without it is HotpotQA's, as every row before the key); a
    prompted row says which exemplars its prompts carried (plot compares two sets: exemplars.md)."""
    row = {"model": target.label, "size_class": target.size_class, "params_b": target.params_b,
           "mode": target.mode, "method": method, "question_set": question_set, **stats, **record,
           "source": "ours", "search": search}  # search: the wiki.search mode (a row without it: title)
    if target.trained_search not in (None, search):  # allowed by allow_search_mismatch: labelled
        row["trained_search"] = target.trained_search
    if task != DEFAULT_TASK:
        row["task"] = task
    if target.mode == "prompt" and exemplars is not None:
        row["exemplars"] = exemplars
    if target.released:  # evaluated here, trained elsewhere: plot draws it apart from our students
        row["released"] = target.released
    if target.training:  # a GRPO student: plot draws it beside the fine-tuned ones, with its own marker
        row["training"] = target.training
    return row


def precision_record(target: ModelUnderTest) -> dict:
    """What these records were computed in: the inference precision (the transformers backend
    resolves `auto` by pipeline/core/precision.py's rule, the same call the backend makes when it
    loads the model; vLLM its dtype; a remote server or a stand-in: None) and, for a fine-tuned
    student, the precision it was trained in."""
    from pipeline.core import precision

    llm = target.llm
    if target.oracle is not None:  # the stand-in teacher: no model, no precision
        inference = None
    elif llm.backend == "transformers":
        device = ("cuda" if devices.gpu_count() else "cpu") if llm.device == "auto" else llm.device
        inference = precision.inference(llm.dtype, device.split(":")[0]).precision
    else:
        inference = precision.DTYPE_NAMES.get(llm.dtype) if llm.backend == "vllm" else None
    return {"precision": inference, "train_precision": target.train_precision}


def check_same_precision(out_dir: Path, record: dict) -> None:
    """Refuse to append records computed in one precision to a folder holding another's."""
    from pipeline.core.storage import read_manifest

    old = read_manifest(Path(out_dir) / "manifest.json")
    if old is None or "precision" not in old:  # nothing yet, or a manifest older than the field
        return
    was = {k: old.get(k) for k in record}
    if was != record:
        raise PipelineError(
            f"{out_dir} holds records computed in precision {was}, this run would use {record}; "
            "set model.dtype to match, or use another out_dir (or delete that folder) to start afresh")
