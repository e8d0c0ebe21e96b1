"""A GGUF model dequantised once into a plain Hugging Face folder under the cache root: the
embedded models (smollm2.py, gemma3.py) are shipped as GGUF files inside packages, and loading a
GGUF through transformers dequantises it every time (20-60 s); the saved fp32 copy reloads in
about a second, in whatever precision the stage asks for.

    converted("smollm2-135m-instruct", lambda workdir: path_of_the_gguf)

The cache root is ~/.cache/react-pipeline, or $REACT_PIPELINE_CACHE when set.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from pipeline.core.paths import cache_root


def converted(name: str, gguf_of: Callable[[Path], Path]) -> Path:
    """<cache root>/<name>: fp32 weights + tokenizer, converted on first use from the GGUF file
    `gguf_of(workdir)` returns (it may assemble the file in `workdir`, a scratch folder deleted
    afterwards). The folder appears by one rename, so no process ever sees it half-written; a
    lock makes a concurrent second process wait for the first conversion instead of repeating it."""
    target = cache_root() / name
    if is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(target.parent / f".{name}.lock"):
        if is_complete(target):  # another process converted it while we waited
            return target
        _remove_stale_temp_dirs(target)
        if target.exists():  # not ours, not complete (e.g. an empty dir made by hand)
            shutil.rmtree(target)
        work = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=target.parent))
        try:
            _convert(gguf_of(work), target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return target


def is_complete(path: Path) -> bool:
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
        # fp32: a dequantised block is exact in it; the stages load it in the precision they pick
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
