"""scripts/gpu_checks/device_check.py, the one prepared check for a GPU machine, on this CPU: its
argument handling, that every check needing CUDA SKIPs with its reason, and that the training
command it builds and the dataset it writes are what `train` accepts (a dry run). What needs
CUDA runs only on a GPU machine (docs/full-scale.md, "The device check").

    .venv/bin/python -m pytest tests/test_device_check.py -q
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_checks" / "device_check.py"


@pytest.fixture(scope="module")
def device_check():
    spec = importlib.util.spec_from_file_location("device_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_without_cuda_every_cuda_check_skips_with_its_reason(device_check, tmp_path, capsys):
    import torch

    assert not torch.cuda.is_available(), "a GPU here: this test is the CPU side"
    assert device_check.main(["--work", str(tmp_path / "work")]) == 0
    lines = capsys.readouterr().out.splitlines()
    checks = dict(re.match(r"CHECK (\S+) +(PASS|FAIL|SKIP) \(\d+ s\) (.*)", line).group(1, 2) for line in lines)
    assert list(checks) == list(device_check.CHECKS)  # one line per check, in order
    assert checks.pop("environment") == "PASS" and set(checks.values()) == {"SKIP"}
    for line in lines[1:]:
        assert "no CUDA device here (torch.cuda.is_available() is False)" in line, line
    assert "no CUDA device; " in lines[0] and f"torch {torch.__version__}" in lines[0]


def test_only_names_known_checks(device_check, tmp_path, capsys):
    assert device_check.main(["--work", str(tmp_path), "--only", "environment"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1
    with pytest.raises(SystemExit) as info:
        device_check.main(["--only", "nope"])
    assert info.value.code == 2 and "invalid choice: 'nope'" in capsys.readouterr().err


def test_the_training_it_launches_is_one_train_accepts(device_check, tmp_path, capsys, monkeypatch):
    """The tiny student made from a prepared tokenizer (as on the GPU machine), the exemplar
    dataset, and each check's `train` command, dry-run on this CPU (the CPU launch in place of
    single_gpu): every key it sets is a training key, the dataset passes train's checks."""
    from pipeline.cli import main

    carry = tmp_path / "carry"
    device_check.prepare(carry)
    assert (carry / "tokenizer" / "tokenizer.json").is_file()
    work = tmp_path / "work"
    student = device_check.tiny_student(work, carry / "tokenizer")
    assert (student / "config.json").is_file() and "llama" in (student / "config.json").read_text()
    monkeypatch.chdir(REPO)
    for name, overrides in (("sft-sdpa", ["attn_implementation=sdpa"]), ("lora", ["finetuning=lora"]),
                            ("zero3", ["accelerate_config=deepspeed_zero3", "num_processes=1"])):
        cmd = device_check.train_command(work, student, name, *overrides)
        cpu = ["deepspeed_on_cpu=true", "precision=fp32"] if name == "zero3" else ["accelerate_config=cpu"]
        assert main([*cmd[3:], *cpu, "--dry-run"]) == 0, capsys.readouterr().err
        out = capsys.readouterr().out
        assert f"{work / 'ck' / name}" in out and "-m pipeline.finetune" in out, out
