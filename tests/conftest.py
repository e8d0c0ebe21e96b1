"""Shared fixtures: the offline data folder and one local Wikipedia index built from it per session."""

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
