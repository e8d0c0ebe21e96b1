"""The wheel holds every file of the package: `pip install react-pipeline` (not editable) must find
the exemplars, the chat template and the accelerate configs the code reads at run time. Package
data is listed by glob in pyproject.toml, and a new folder (the retriever mode's exemplars/bm25/)
is not matched by its parent's `exemplars/*.json`: an editable install never notices."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def tracked(*paths: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", *paths], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return out.split()


def test_the_wheel_holds_every_tracked_file_of_the_package(tmp_path):
    src = tmp_path / "src"  # a copy of the tracked files: the build writes build/ and *.egg-info where it runs
    for name in tracked():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, src / name, follow_symlinks=False)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    wheel, = (tmp_path / "dist").glob("*.whl")
    in_wheel = set(zipfile.ZipFile(wheel).namelist())
    expected = {name for name in tracked("pipeline") if not (REPO / name).is_symlink()}
    # pipeline/accelerate_configs links to the top-level folder: the wheel holds copies of its files
    expected |= {f"pipeline/{name}" for name in tracked("accelerate_configs")}
    assert expected - in_wheel == set()
