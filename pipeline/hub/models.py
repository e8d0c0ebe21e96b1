"""The one model-and-tokenizer resolver: what a config's model name means, and the one tokenizer
loader that `filter`, `finetune` and the transformers backend share.

    resolve_model_path("smollm2")      # the embedded SmolLM2-135M-Instruct, converted on first use
    load_tokenizer("smollm2", key="filter.tokenizer")

A name is the alias "smollm2", a local folder, or a hub id (loaded from the local HF cache when
offline). Only the alias is rewritten; everything else is passed to `from_pretrained` as given.
"""

from __future__ import annotations

import re
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.hub.smollm2 import local_smollm2_dir

SMOLLM2 = "smollm2"  # the alias of the embedded SmolLM2-135M-Instruct (pipeline.hub.smollm2)
SMOLLM2_LABEL = "smollm2-135m-instruct"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def resolve_model_path(name: str) -> str:
    """What `from_pretrained` loads for `name`: the alias becomes the local converted folder."""
    if name == SMOLLM2:
        return str(local_smollm2_dir())  # converted from the GGUF on first use
    return name


def model_label(name: str) -> str:
    """A short folder label for a model name (the alias, a folder, or a hub id)."""
    if name == SMOLLM2:
        return SMOLLM2_LABEL
    return Path(name.rstrip("/")).name.lower() or "student"


def size_label(params_b: float) -> str:
    """The one size label of a model from its parameter count (billions): 135m, 8.03b, 70b."""
    return f"{params_b * 1000:.3g}m" if params_b < 1 else f"{params_b:.3g}b"


def load_tokenizer(name: str, *, key: str = "tokenizer", label: str | None = None,
                   trust_remote_code: bool = False, **kwargs):
    """The tokenizer of `name` (resolved here); a failure is one PipelineError naming the config
    `key` and the name the user wrote (`label`, default `name`)."""
    from transformers import AutoTokenizer

    source = resolve_model_path(name)
    try:
        return AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code, **kwargs)
    except (OSError, ValueError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PipelineError(f"{key}: cannot load {label or name} ({reason}); give a local folder, "
                            f"a hub id in the local cache, or '{SMOLLM2}'") from None


def looks_like_path(model: str) -> bool:
    """A filesystem path rather than a hub id ("name" or "org/name")."""
    return (model.startswith(("/", "./", "../", "~")) or Path(model).expanduser().exists()
            or not _HUB_ID.match(model))
