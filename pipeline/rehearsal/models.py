"""Tiny random models of the same architecture as a grid's real ones.

The architecture of a model is read from its own config.json where it is on disk (an embedded
model, a local folder, a hub cache), else from KNOWN, the real configs' attention layout of the
families the shipped configs name (read from their published config.json files). What is kept:
the class, the GQA ratio (query heads per key/value head), the RoPE scaling, tied or untied
embeddings; what shrinks: layers, widths and head counts. The head size stays 64: vLLM's CPU
attention refuses a head_dim of 16 ("Unsupported CPU attention configuration").

The tokenizer is the embedded SmolLM2's (the real ones are gated or not on disk), so the
vocabulary is its 49,152 words; the weights are random (seeded by the model's name), so what a
tiny model writes is noise: the rehearsal checks the orchestration, never a result.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.errors import PipelineError

LAYERS = 2
HIDDEN = 128
HEAD_DIM = 64  # vLLM-CPU's attention supports 64 and 128, not 16
INTERMEDIATE = 256

LLAMA31_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192, "rope_theta": 500000.0}
QWEN25_ROPE = {"rope_type": "default", "rope_theta": 1000000.0}


@dataclass(frozen=True)
class Family:
    """The layout of a real model that a tiny one keeps."""

    model_type: str  # transformers' model_type: llama | qwen2 | gemma3_text
    architecture: str  # its CausalLM class
    heads: int  # the real model's query heads
    kv_heads: int  # and key/value heads (GQA)
    tied: bool  # tie_word_embeddings
    rope: dict  # rope_parameters (transformers 5)
    positions: int  # max_position_embeddings (Llama 3.1's RoPE scaling needs it above 8,192)


# Hub ids (lower case, a -Instruct / -FP8 suffix allowed) -> the real model's layout.
KNOWN: dict[str, Family] = {
    "meta-llama/llama-3.1-8b": Family("llama", "LlamaForCausalLM", 32, 8, False, LLAMA31_ROPE, 131072),
    "meta-llama/llama-3.1-70b": Family("llama", "LlamaForCausalLM", 64, 8, False, LLAMA31_ROPE, 131072),
    "meta-llama/llama-3.1-405b": Family("llama", "LlamaForCausalLM", 128, 8, False, LLAMA31_ROPE, 131072),
    "qwen/qwen2.5-7b": Family("qwen2", "Qwen2ForCausalLM", 28, 4, False, QWEN25_ROPE, 32768),
    "qwen/qwen2.5-72b": Family("qwen2", "Qwen2ForCausalLM", 64, 8, False, QWEN25_ROPE, 32768),
    "google/gemma-3-270m": Family("gemma3_text", "Gemma3ForCausalLM", 4, 1, True,
                                  {"rope_type": "default", "rope_theta": 1000000.0}, 32768),
    "google/gemma-3-1b": Family("gemma3_text", "Gemma3ForCausalLM", 4, 1, True,
                                {"rope_type": "default", "rope_theta": 1000000.0}, 32768),
}
# The embedded models' real names, for when their package is not installed here.
ALIASES = {"gemma3-270m": "google/gemma-3-270m", "smollm2": "HuggingFaceTB/SmolLM2-135M-Instruct"}
SUFFIXES = re.compile(r"(-instruct)?(-fp8)?$")


def known_family(model: str) -> Family | None:
    return KNOWN.get(SUFFIXES.sub("", model.lower()))


def family_from_config(config: dict, where: str) -> Family:
    """The layout a model's own config.json describes."""
    text = config.get("text_config") or config  # a multimodal Gemma 3 keeps its LM's in text_config
    try:
        heads = int(text["num_attention_heads"])
        kv = int(text.get("num_key_value_heads") or heads)
        rope = text.get("rope_parameters") or text.get("rope_scaling") or {"rope_type": "default"}
        if rope and all(isinstance(v, dict) for v in rope.values()):  # per attention type (Gemma 3's, in
            rope = rope.get("full_attention") or next(iter(rope.values()))  # transformers 5): tiny_config nests it again
        rope = {**rope, "rope_theta": rope.get("rope_theta", text.get("rope_theta", 10000.0))}
        model_type = text["model_type"]
    except (KeyError, TypeError, ValueError) as exc:
        raise PipelineError(f"{where}: not a decoder config transformers describes ({exc}); the rehearsal "
                            "needs the model's architecture") from None
    arch = {"gemma3": "Gemma3ForCausalLM", "gemma3_text": "Gemma3ForCausalLM"}.get(
        model_type, (text.get("architectures") or config.get("architectures") or ["?"])[0])
    model_type = "gemma3_text" if model_type == "gemma3" else model_type
    return Family(model_type, arch, heads, kv, bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings"))),
                  rope, int(text.get("max_position_embeddings") or 8192))


def family_of(model: str) -> tuple[Family, str]:
    """(its layout, where that came from) of a model named in a grid: its config.json on disk, else KNOWN."""
    from pipeline.hub.models import EMBEDDED, resolve_model_path

    try:
        path = Path(resolve_model_path(model)) if model in EMBEDDED else Path(model).expanduser()
    except PipelineError:  # an embedded model whose package is not installed: its real name below
        path = None
    if path is not None and (path / "config.json").is_file():
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
        return family_from_config(config, str(path / "config.json")), f"its config.json ({path})"
    family = known_family(ALIASES.get(model, model))
    if family is None:
        known = ", ".join(sorted(KNOWN))
        raise PipelineError(f"rehearsal: {model}: its architecture is unknown here (no config.json on disk, not one "
                            f"of {known}); put the model's config.json in a local folder and name that folder")
    return family, "the table of known models (pipeline/rehearsal/models.py)"


def tiny_config(family: Family, vocab: dict) -> dict:
    """A config.json of the same class and attention layout, a few layers and widths wide."""
    ratio = max(1, family.heads // family.kv_heads)  # query heads per key/value head, as in the real model
    hidden = -(-HIDDEN // ratio) * ratio  # transformers wants the width a multiple of the head count
    if family.model_type == "qwen2":
        # vLLM's Qwen2 takes its head size as hidden_size // heads, not from head_dim
        # (vllm/model_executor/models/qwen2.py), as the real Qwen2.5 models have it: 7 heads of a
        # 133 width gave 19, which vLLM-CPU's attention refuses ("head_dim=19"), killing the engine
        hidden = ratio * HEAD_DIM
    config = {
        "architectures": [family.architecture], "model_type": family.model_type,
        "num_hidden_layers": LAYERS, "hidden_size": hidden, "intermediate_size": INTERMEDIATE,
        "head_dim": HEAD_DIM, "num_attention_heads": ratio, "num_key_value_heads": 1,
        "tie_word_embeddings": family.tied, "rope_parameters": dict(family.rope),
        "max_position_embeddings": family.positions, "torch_dtype": "bfloat16", **vocab,
    }
    if family.model_type == "gemma3_text":  # every layer's attention type, as Gemma 3 alternates them
        config |= {"layer_types": ["sliding_attention", "full_attention"][:LAYERS], "sliding_window": 512,
                   "query_pre_attn_scalar": HEAD_DIM,
                   "rope_parameters": {"full_attention": dict(family.rope),
                                       "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}}
    return config


def same_shape(made: dict, wanted: dict) -> bool:
    keys = ("architectures", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "num_hidden_layers")
    return all(made.get(k) == wanted.get(k) for k in keys) and not nested_rope(made)


def nested_rope(config: dict) -> bool:
    """Rope parameters per attention type nested once more (an earlier version made Gemma 3's so:
    vLLM's config hashing stops on the inner dict, `unhashable type: 'dict'`)."""
    return any(isinstance(inner, dict) for outer in (config.get("rope_parameters") or {}).values()
               if isinstance(outer, dict) for inner in outer.values())


def slug(model: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", model.lower()).strip("-")


def tiny_model(model: str, root: Path, tokenizer_dir: Path | None = None) -> Path:
    """<root>/<slug>: a tiny random model of `model`'s architecture with SmolLM2's tokenizer (read
    from `tokenizer_dir` where given: a GPU machine without the embedded model's package), made
    once (it appears by one rename: never half-written) and reused by later rehearsals."""
    target = root / slug(model)
    family, _ = family_of(model)
    if (target / "config.json").is_file() and (target / "tokenizer_config.json").is_file():
        if same_shape(json.loads((target / "config.json").read_text()), tiny_config(family, {})):
            return target
        shutil.rmtree(target)  # made by an earlier version of tiny_config (a Qwen2 one vLLM cannot serve)
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from pipeline.hub.smollm2 import local_smollm2_dir

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir or local_smollm2_dir())
    vocab = {"vocab_size": len(tokenizer), "bos_token_id": tokenizer.bos_token_id,
             "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}
    config = AutoConfig.for_model(**tiny_config(family, vocab))
    torch.manual_seed(zlib.crc32(model.encode()))  # the same tiny model for the same name, every time
    tiny = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=root))
    try:
        tiny.save_pretrained(work)
        tokenizer.save_pretrained(work)
        work.rename(target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target
