"""The one model-and-tokenizer resolver: what a config's model name means, and the one tokenizer
loader that `filter`, `finetune` and the transformers backend share.

    resolve_model_path("smollm2")      # the embedded SmolLM2-135M-Instruct, converted on first use
    resolve_model_path("gemma3-270m")  # the embedded Gemma 3 270M (installed only when a config names it)
    load_tokenizer("smollm2", key="filter.tokenizer")

A name is an embedded model's alias (`EMBEDDED`: a GGUF inside a package, dequantised once into a
cached folder), a local folder, or a hub id (loaded from the local HF cache when offline). Only
an alias is rewritten; everything else is passed to `from_pretrained` as given.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.core.paths import cache_root
from pipeline.core.storage import read_manifest
from pipeline.hub import gemma3, smollm2
from pipeline.hub.gguf_cache import is_complete

SMOLLM2 = "smollm2"  # the alias of the embedded SmolLM2-135M-Instruct (pipeline.hub.smollm2)
SMOLLM2_LABEL = "smollm2-135m-instruct"
GEMMA3 = "gemma3-270m"  # the alias of the embedded Gemma 3 270M base (pipeline.hub.gemma3)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


@dataclass(frozen=True)
class Embedded:
    """A model found by name: a GGUF inside an installed package, converted on first use."""

    label: str  # its folder label (checkpoints/<experiment>/<label>/...)
    cache_name: str  # its converted folder under the cache root
    local_dir: Callable[[], Path]  # that folder, converted on first use
    check_installed: Callable[[], None]  # raises the one-line install hint when its package is missing
    licence: str | None = None  # its weights' licence where it is not an open one (named in cards)


EMBEDDED = {
    SMOLLM2: Embedded(SMOLLM2_LABEL, smollm2.CACHE_DIR_NAME, smollm2.local_smollm2_dir, smollm2.gguf_path),
    GEMMA3: Embedded(GEMMA3, gemma3.CACHE_DIR_NAME, gemma3.local_gemma3_dir, gemma3.check_installed, gemma3.LICENCE),
}


def resolve_model_path(name: str) -> str:
    """What `from_pretrained` loads for `name`: an alias becomes its local converted folder."""
    if name in EMBEDDED:
        require_installed(name)  # before the cache folder, its lock or a scratch file is made
        return str(EMBEDDED[name].local_dir())  # converted from the GGUF on first use
    return name


def origin_model(name: str) -> str:
    """The pretrained model at the root of `name`'s lineage, whose licence binds every model trained
    from it (hub/cards.py): for a final/ of ours (a later round's start, `self_training.init:
    previous`, or a GRPO final) the root its manifest names, followed through manifests older than
    the field (their `base_model`); for anything else the model `name` resolves to."""
    seen: set[str] = set()
    while (Path(name).expanduser() / "manifest.json").is_file() and name not in seen:
        seen.add(name)
        name = lineage_root(read_manifest(Path(name).expanduser() / "manifest.json") or {}) or name
    return resolve_model_path(name)


def lineage_root(manifest: dict) -> str | None:
    """The root a final/'s manifest names: `origin_model` (train and grpo write it), else its
    `base_model` (what an SFT manifest written before the field trained from)."""
    return manifest.get("origin_model") or manifest.get("base_model")


def require_installed(name: str | None) -> None:
    """Before anything is written: an embedded model's package must be installed (or its folder
    already converted); otherwise the one-line error saying how to install it. Other names pass."""
    model = EMBEDDED.get(name or "")
    if model is not None and not is_complete(cache_root() / model.cache_name):
        model.check_installed()


def licence_of(model: str | None) -> str | None:
    """The licence an embedded model's weights carry (by alias, or by its converted folder), for
    the cards of models trained from it; None for any other model (its own card says)."""
    for alias, embedded in EMBEDDED.items():
        if model and (model == alias or Path(model) == cache_root() / embedded.cache_name):
            return embedded.licence
    return None


def model_label(name: str) -> str:
    """A short folder label for a model name (an alias, a folder, or a hub id)."""
    if name in EMBEDDED:
        return EMBEDDED[name].label
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
                            f"a hub id in the local cache, or one of {', '.join(map(repr, EMBEDDED))}") from None


def looks_like_path(model: str) -> bool:
    """A filesystem path rather than a hub id ("name" or "org/name")."""
    return (model.startswith(("/", "./", "../", "~")) or Path(model).expanduser().exists()
            or not _HUB_ID.match(model))
