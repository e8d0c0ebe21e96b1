"""Shared fixtures. Only `shared_data` lives here; each test file keeps its own fixtures."""

from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The read-only offline data folder (../shared/data beside the repo); skip the test without it."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"offline data not found at {SHARED_DATA}")
    return SHARED_DATA
