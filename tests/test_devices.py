"""The GPU count (pipeline/core/devices.py): torch's own answer, asked only where a GPU driver is
installed, so that planning a grid or a launch on a machine without one imports no torch.

    .venv/bin/python -m pytest tests/test_devices.py -q
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from episode_testdata import REPO, child_env
from sft_testdata import fireact_records, write_dataset

from pipeline.core import devices

NO_DRIVER = not any(os.path.exists(f) for f in devices.DRIVER_FILES)


def in_child(code: str) -> str:
    """What `code` prints in a fresh interpreter (no torch imported before it runs)."""
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=child_env(), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_the_count_is_torchs_own():
    import torch
    assert devices.gpu_count() == (torch.cuda.device_count() if torch.cuda.is_available() else 0)


def test_without_a_driver_file_the_count_is_zero_and_torch_is_not_imported():
    said = in_child("import sys; from pipeline.core import devices; devices.DRIVER_FILES = ('/nonexistent/nvidiactl',); "
                    "print(devices.gpu_count(), 'torch' in sys.modules)")
    assert said == "0 False"


def test_with_a_driver_file_torch_is_asked(tmp_path):
    """On a machine without CUDA torch's answer is 0 too, so the count alone cannot show torch was
    asked: the child also says whether torch was imported by the call itself."""
    driver = tmp_path / "nvidiactl"
    driver.touch()
    said = in_child(f"import sys; from pipeline.core import devices; devices.DRIVER_FILES = ({str(driver)!r},); "
                    "n = devices.gpu_count(); asked = 'torch' in sys.modules; import torch; "
                    "print(n == (torch.cuda.device_count() if torch.cuda.is_available() else 0), asked)")
    assert said == "True True"


def test_with_a_driver_file_the_count_is_the_one_torch_gives(monkeypatch, tmp_path):
    """torch's answer taken as it is: torch.cuda stood in (monkeypatched) to say 3 GPUs, which no
    CPU machine's real answer (0) can be mistaken for."""
    import torch
    driver = tmp_path / "nvidiactl"
    driver.touch()
    monkeypatch.setattr(devices, "DRIVER_FILES", (str(driver),))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    assert devices.gpu_count() == 3
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert devices.gpu_count() == 0


# Each driver's device file, as its kernel driver creates it: a typo in devices.DRIVER_FILES would
# plan every GPU node of that kind as a CPU, and no machine without that GPU could see it otherwise.
DRIVERS = {
    "NVIDIA (nvidia.ko's control device, opened by every CUDA context)": "/dev/nvidiactl",
    "AMD ROCm (amdkfd, the kernel fusion driver HIP opens)": "/dev/kfd",
    "WSL2 (dxgkrnl, the GPU paravirtualization device)": "/dev/dxg",
}


def test_each_driver_file_is_its_drivers_real_path():
    assert devices.DRIVER_FILES == tuple(DRIVERS.values())


@pytest.mark.skipif(NO_DRIVER, reason="no GPU driver here")
def test_on_a_gpu_machine_torch_sees_what_the_driver_file_promised():
    """Where a driver file exists and torch sees a GPU, the count is not cut to 0 by the check."""
    import torch
    if not torch.cuda.is_available():
        pytest.skip("a driver file but no CUDA device torch can use")
    assert devices.gpu_count() == torch.cuda.device_count() > 0


def planning(command: str, tmp_path) -> list[str]:
    """A grid's plan (`run --print-config`) or a launch's checks (`train --dry-run`)."""
    if command == "run":
        return ["run", "--config", "configs/small-rounds.yaml", "--print-config"]
    write_dataset(tmp_path / "sft", "react", fireact_records(limit=4))
    return ["train", "--config", "configs/students/tiny.yaml", "format=react", f"dataset_dir={tmp_path / 'sft'}",
            f"output_root={tmp_path / 'out'}", "--dry-run"]


@pytest.mark.skipif(not NO_DRIVER, reason="a GPU driver is installed here: torch is asked, as it should be")
@pytest.mark.parametrize("command", ["run", "train"])
def test_planning_on_a_machine_without_a_gpu_imports_no_torch(command, tmp_path):
    """torch (1.4 s of a 2.3 s `run --print-config`) is left to the processes that compute."""
    args = planning(command, tmp_path)
    said = in_child("import atexit, runpy, sys; "
                    "atexit.register(lambda: print('torch imported:', 'torch' in sys.modules)); "
                    f"sys.argv = ['pipeline', *{args!r}]; runpy.run_module('pipeline', run_name='__main__')")
    assert said.splitlines()[-1] == "torch imported: False", said


@pytest.mark.parametrize("gpus, device, expected", [
    (0, "auto", "cpu"), (2, "auto", "cuda"), (2, "cuda:1", "cuda:1"),
    (0, "cuda", r"llm.device: cuda asked for but no CUDA device is available; use device=cpu"),
    (2, "cuda:2", r"llm.device: cuda:2 does not exist: this machine has 2 CUDA device\(s\), cuda:0 to cuda:1"),
])
def test_the_in_process_backend_resolves_its_device_by_the_same_count(monkeypatch, gpus, device, expected):
    """pipeline/llm/hf.py's `auto` and its checks follow devices.gpu_count(), as eval's plan does."""
    from pipeline.core.errors import PipelineError
    from pipeline.llm import hf

    monkeypatch.setattr(devices, "gpu_count", lambda: gpus)
    if expected.startswith("llm.device"):
        with pytest.raises(PipelineError, match=expected):
            hf._resolve_device(device)
    else:
        assert hf._resolve_device(device) == expected
