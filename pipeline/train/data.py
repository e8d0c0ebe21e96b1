"""The training data and tokenizer of a run: the format's SFT dataset (refused unless complete by its
manifest), the task its trajectories answer, and the student's tokenizer with a padding token.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.core.storage import read_jsonl, read_manifest, require_complete
from pipeline.hub import models
from pipeline.train.config import FinetuneConfig


def check_dataset(cfg: FinetuneConfig) -> Path:
    """The format's train.jsonl, refused unless present and complete by its manifest (the
    `train` stage calls this too, before it launches anything)."""
    folder = cfg.dataset_dir / cfg.format
    path = folder / ("messages.jsonl" if cfg.layout == "messages" else "train.jsonl")
    if not path.is_file():
        raise PipelineError(f"dataset_dir: {path} not found; run `python -m pipeline filter` first (or set dataset_dir)")
    require_complete(folder / "manifest.json", f"SFT dataset {folder}")
    return path


def dataset_task(dataset_path: Path):
    """The task the SFT dataset's trajectories answer, from its manifest (pipeline.tasks.task_of)."""
    from pipeline.tasks import get_task, task_of

    return get_task(task_of(read_manifest(dataset_path.parent / "manifest.json")))


def dataset_search(dataset_path: Path) -> str:
    """The wiki.search mode of the SFT dataset's observations, from its manifest (eval refuses
    the student in the other mode: pipeline.wiki.config.search_of)."""
    from pipeline.wiki.config import search_of

    return search_of(read_manifest(dataset_path.parent / "manifest.json"))


def load_sft_records(cfg: FinetuneConfig) -> tuple[Path, list[dict]]:
    path = check_dataset(cfg)
    records = read_jsonl(path, tolerate_torn_tail=False)
    if cfg.max_examples is not None:
        records = records[: cfg.max_examples]
    if not records:
        raise PipelineError(f"{path}: no training examples")
    return path, records


def load_tokenizer(cfg: FinetuneConfig):
    tokenizer = models.load_tokenizer(cfg.tokenizer or cfg.student, key="tokenizer" if cfg.tokenizer else "student",
                                      trust_remote_code=cfg.trust_remote_code)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = own_pad_token(tokenizer) or tokenizer.eos_token  # labels mask padding either way
    if cfg.layout == "messages":
        set_chat_template(cfg, tokenizer)
    return tokenizer


def set_chat_template(cfg: FinetuneConfig, tokenizer) -> None:
    """layout=messages: the chat template the student learns (saved in final/ with the tokenizer),
    one that marks the assistant's turns ({% generation %}) so that they alone are in the loss."""
    from pipeline.hub.chat_template import TOOL_CALLS_TEMPLATE

    name = cfg.chat_template
    if name is None and "smollm2" in f"{cfg.tokenizer or ''} {cfg.student}".lower():
        name = "smollm2-tool-calls"  # SmolLM2's own template writes content only
    if name is not None:
        path = TOOL_CALLS_TEMPLATE if name == "smollm2-tool-calls" else Path(name)
        if not path.is_file():
            raise PipelineError(f"chat_template: {name} is not a file; give a Jinja template or smollm2-tool-calls")
        tokenizer.chat_template = path.read_text(encoding="utf-8")
    from trl.chat_template_utils import has_generation_markers

    if not has_generation_markers(tokenizer.chat_template or ""):
        raise PipelineError("layout=messages: the tokenizer's chat template does not mark the assistant's turns "
                            "({% generation %} ... {% endgeneration %}), so the loss cannot be the assistant's alone; "
                            "set chat_template to one that does (pipeline/hub/smollm2_tool_calls.jinja is one)")


# Padding tokens some tokenizers define without declaring them (Llama-3.x: reserved for fine-tuning).
OWN_PAD_TOKENS = ("<|finetune_right_pad_id|>", "<|finetune_right_pad|>", "<|pad|>", "<pad>", "[PAD]")


def own_pad_token(tokenizer) -> str | None:
    """The model's own padding token where its vocabulary has one: distinct from EOS, so that
    padding is never counted (or generated) as an end of sequence."""
    vocab = tokenizer.get_vocab()
    return next((token for token in OWN_PAD_TOKENS if token in vocab), None)
