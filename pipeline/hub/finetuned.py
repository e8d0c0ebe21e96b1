"""Any fine-tuned model to evaluate (eval's `finetuned=`), not only ours: a local folder or hub id
of a full model or a PEFT adapter, with the format it decodes in.

    resolve_finetuned("forestai/fireact_llama_2_7b_lora")            # a known released agent
    resolve_finetuned("downloads/my-agent", format="react", params_b=7.6)   # any folder

Our own `train` outputs carry a manifest and are read by the eval stage as before; this module
handles everything else (the eval stage calls it when a `finetuned=` folder has no manifest.json;
GRPO when its `student=` is a released model):

- a folder with adapter_config.json is a PEFT adapter: its base is `base_model=` when given, else
  the base its adapter_config.json names (when that is a hub id or an existing folder), else the
  registry's (pipeline.hub.released);
- a folder with config.json is a full model;
- anything else that is not a path is a hub id: it is fetched with huggingface_hub (the cache
  first); offline and not cached, one line names what to download and where to pass it.

The format comes from `format=`, else the registry; the size from `size_class=`/`params_b=`, else
the registry, else the model's config (its parameters counted on the meta device, no weights read).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.hub.models import size_label

# How a fine-tuned model decodes: the trajectory format it runs (methods must use only it)
# and the prompting style that builds its prompts (pipeline.methods).
DECODE_FORMATS = {
    "standard": ("standard", "zero_shot"), "cot": ("cot", "zero_shot"),
    "act": ("act", "zero_shot"), "react": ("react", "zero_shot"),  # ours: the paper's numbered text
    "fireact": ("react", "fireact"),  # FireAct's Alpaca-wrapped ReAct (pipeline.methods.fireact)
}
NOT_IMPLEMENTED = {
    "agentlm": "AgentLM decodes in Llama-2-chat conversations with AgentTuning's own task prompts, "
               "which this pipeline does not implement",
}
ADAPTER_FILES = ["adapter_config.json", "adapter_model.safetensors", "adapter_model.bin", "*.json",
                 "tokenizer*", "*.model"]
MODEL_FILES = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.tiktoken"]


@dataclass
class ResolvedFinetuned:
    model: str  # what LLMConfig.model gets: a local folder (or a hub id left to transformers)
    adapter: str | None  # a local PEFT adapter folder applied on `model`
    format: str  # a key of DECODE_FORMATS
    label: str
    size_class: str
    params_b: float
    source: str  # the fine-tuned model as given (a hub id or a path)

    @property
    def trained_format(self) -> str:
        return DECODE_FORMATS[self.format][0]

    @property
    def decode_style(self) -> str:
        return DECODE_FORMATS[self.format][1]


def resolve_finetuned(finetuned: str, *, format: str | None = None, base_model: str | None = None,
                      size_class: str | None = None, params_b: float | None = None,
                      name: str | None = None, key: str = "finetuned") -> ResolvedFinetuned:
    """`finetuned` resolved to what loads it; `key` is the config key that gave it (named in the
    offline message: eval's `finetuned`, GRPO's `student`)."""
    from pipeline.hub.released import find_agent

    given = str(finetuned)
    agent = find_agent(given)
    folder = Path(given).expanduser()
    if not folder.is_dir():
        if looks_like_local(given):
            raise PipelineError(f"fine-tuned model {given}: no such folder; give a fine-tuned model or adapter "
                                "folder, or a hub id")
        folder = None
    elif not (folder / "adapter_config.json").is_file() and not (folder / "config.json").is_file():
        raise PipelineError(f"fine-tuned model {folder}: not a model: no manifest at {folder}/manifest.json "
                            "(ours), no adapter_config.json (a PEFT adapter), no config.json (a full model)")
    fmt = check_format(format or (agent.format if agent else None), given)
    adapter_config = _adapter_config(folder, given, agent)
    missing: list[tuple[str, str, str]] = []  # (what, hub id, key)
    if adapter_config is not None:
        base = choose_base(base_model, adapter_config.get("base_model_name_or_path"),
                           agent.base_model if agent else None, given)
        adapter_dir = str(folder) if folder else fetch(given, ADAPTER_FILES, "adapter", key, missing)
        model_dir = base if Path(base).expanduser().is_dir() else fetch(base, MODEL_FILES, "base model", "base_model",
                                                                         missing)
    else:
        adapter_dir = None
        model_dir = str(folder) if folder else fetch(given, MODEL_FILES, "model", key, missing)
    if missing:
        raise PipelineError(offline_message(missing))
    if params_b is None:
        params_b = agent.params_b if agent else count_params_b(model_dir, given)
    size_class = size_class or (agent.size_class if agent else size_label(params_b))
    label = finetuned_label(given, name)
    return ResolvedFinetuned(model_dir, adapter_dir, fmt, label, size_class, float(params_b), given)


def finetuned_label(given: str, name: str | None = None) -> str:
    """How the figure and the tables name a fine-tuned model given by folder or hub id: `name`, a
    known released agent's label, else its folder's name (`run` reads it at plan time too)."""
    from pipeline.hub.released import find_agent

    agent = find_agent(given)
    return name or (agent.label if agent else f"{Path(given.rstrip('/')).name} (released)")


def check_format(fmt: str | None, given: str) -> str:
    if fmt is None:
        raise PipelineError(f"fine-tuned model {given} has no manifest of ours and is not a known released agent "
                            f"(pipeline/hub/released.py): set format=<{'|'.join(DECODE_FORMATS)}> to say how it decodes")
    if fmt in NOT_IMPLEMENTED:
        raise PipelineError(f"fine-tuned model {given}: format '{fmt}' is not supported: {NOT_IMPLEMENTED[fmt]}; "
                            f"formats that run: {', '.join(DECODE_FORMATS)}")
    if fmt not in DECODE_FORMATS:
        raise PipelineError(f"format '{fmt}' is unknown; use one of {', '.join(DECODE_FORMATS)}")
    return fmt


def looks_like_local(given: str) -> bool:
    from pipeline.hub.models import looks_like_path

    return looks_like_path(given)


def _adapter_config(folder: Path | None, given: str, agent) -> dict | None:
    """The adapter's config when the fine-tuned model is an adapter (None for a full model)."""
    if folder is not None:
        path = folder / "adapter_config.json"
        if not path.is_file():
            return None
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise PipelineError(f"{path}: unreadable adapter config ({exc})") from None
    if agent is not None:
        if not agent.adapter:
            return None
        cached = _cached_file(given, "adapter_config.json")
        return json.loads(Path(cached).read_text(encoding="utf-8")) if cached else {}
    cached = _cached_file(given, "adapter_config.json", download=True)
    return json.loads(Path(cached).read_text(encoding="utf-8")) if cached else None


def _cached_file(repo: str, filename: str, download: bool = False) -> str | None:
    """A file of a hub repo from the local cache (or downloaded when `download`); None if absent."""
    try:
        from huggingface_hub import hf_hub_download, try_to_load_from_cache

        cached = try_to_load_from_cache(repo, filename)
        if isinstance(cached, str):
            return cached
        return hf_hub_download(repo, filename) if download else None
    except Exception:  # not on the hub, offline, no such file: the caller decides what that means
        return None


def choose_base(override: str | None, named: str | None, registry: str | None, given: str) -> str:
    """`base_model=` wins; then the adapter's own adapter_config.json when it names something
    reachable (a hub id or an existing folder; trainers often record a path on their machine);
    then the registry's base."""
    from pipeline.hub.models import looks_like_path

    if override:
        return override
    if named and (not looks_like_path(named) or Path(named).expanduser().is_dir()):
        return named
    if registry:
        return registry
    raise PipelineError(f"fine-tuned model {given} is a PEFT adapter whose base model "
                        f"{named!r} is not here; set base_model=<its folder or hub id>")


def fetch(repo: str, patterns: list[str], what: str, key: str, missing: list) -> str:
    """A local snapshot of a hub repo (from the cache when it is there, else downloaded).
    Failures are collected in `missing`, so one error can name everything to download."""
    try:
        from huggingface_hub import snapshot_download

        folder = snapshot_download(repo, allow_patterns=patterns)
        if what != "adapter" and not any(Path(folder).glob("*.safetensors")):  # older repos: .bin only
            folder = snapshot_download(repo, allow_patterns=[*patterns, "*.bin"])
        return folder
    except Exception as exc:  # offline, not cached, gated, no such repo
        missing.append((what, repo, key, type(exc).__name__))
        return repo


def offline_message(missing: list) -> str:
    parts = [f"{what} {repo} ({reason})" for what, repo, _, reason in missing]
    how = "; ".join(f"`hf download {repo} --local-dir <{key}-dir>` and pass {key}=<{key}-dir>"
                    for _, repo, key, _ in missing)
    return (f"cannot get {', '.join(parts)}: not in the local hub cache and not downloadable from here. "
            f"On a machine with internet run {how} (copy the folders here), or run there with HF_TOKEN "
            "set for gated models")


def count_params_b(model_dir: str, given: str) -> float:
    """Billions of parameters from the model's config alone (a meta-device model: no weights)."""
    try:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(model_dir)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        return sum(p.numel() for p in model.parameters()) / 1e9
    except Exception as exc:
        raise PipelineError(f"fine-tuned model {given}: cannot count its parameters ({type(exc).__name__}); "
                            "set params_b=<billions> and size_class=<e.g. 7b>") from None

