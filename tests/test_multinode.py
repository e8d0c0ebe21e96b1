"""Training on several machines: `python -m pipeline train` with num_machines / machine_rank /
main_process_ip / main_process_port from its arguments or the launcher's environment (SLURM).

Fast: the settings read from SLURM's variables, the one-line refusals, and the launch command as
the installed accelerate parses it (torchrun's nnodes / node_rank / rendezvous for DDP, DeepSpeed
and FSDP configs). Slow: two "machines" on 127.0.0.1, two real `python -m pipeline train`
processes (each one `accelerate launch --num_machines 2 --machine_rank r`, DDP over gloo on CPU)
training the tiny test student: the same losses as a one-machine two-process run; then one
machine SIGKILLed mid-run and both relaunched: resumed from the latest complete checkpoint.

    .venv/bin/python -m pytest tests/test_multinode.py -q            # slow one included (~5 min)
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from sft_testdata import DATA, fireact_records, write_dataset
from test_finetune import LOSS_TOLERANCE, TINY, kill_tree, losses_by_step

from pipeline.core.errors import PipelineError
from pipeline.stages.train import (
    DEFAULT_PORT,
    Machines,
    launch_command,
    machines_from,
    pick_accelerate_config,
)
from pipeline.train.checkpoints import latest_complete_checkpoint
from pipeline.train.checks import is_complete_checkpoint

SLURM = {"SLURM_NNODES": "4", "SLURM_NODEID": "2", "MASTER_ADDR": "node017", "MASTER_PORT": "29601"}


# ----------------------------------------------------------------------------- settings

def test_one_machine_unless_told_otherwise():
    assert machines_from({}) == Machines()
    assert machines_from({"SLURM_NNODES": "1", "SLURM_NODEID": "0"}) == Machines()
    assert Machines().launch_args() == ["--main_process_port", "0"]  # a free port, never a fixed one


def test_slurm_variables_give_the_machines_and_arguments_win():
    assert machines_from(SLURM) == Machines(4, 2, "node017", 29601)
    # a job step on 2 of the allocation's 4 nodes: the step's own count
    assert machines_from({**SLURM, "SLURM_STEP_NUM_NODES": "2", "SLURM_NODEID": "1"}).count == 2
    assert machines_from({**SLURM, "MASTER_PORT": ""}).main_port == DEFAULT_PORT
    given = machines_from(SLURM, count=2, rank=0, main_ip="10.0.0.1", main_port=1234)
    assert given == Machines(2, 0, "10.0.0.1", 1234)
    assert given.launch_args() == ["--num_machines", "2", "--machine_rank", "0",
                                   "--main_process_ip", "10.0.0.1", "--main_process_port", "1234"]


@pytest.mark.parametrize("env,message", [
    ({"SLURM_NNODES": "2", "SLURM_NODEID": "0"}, "no address for machine 0: pass --main-process-ip or set MASTER_ADDR "
                                                 "(under SLURM: export MASTER_ADDR=$(scontrol show hostnames"),
    ({"SLURM_NNODES": "2", "MASTER_ADDR": "a"}, "machine rank not given: with 2 machines each needs its rank 0 .. 1"),
    ({"SLURM_NNODES": "2", "SLURM_NODEID": "2", "MASTER_ADDR": "a"}, "machine rank 2: with 2 machines"),
    ({"SLURM_NNODES": "two"}, "$SLURM_NNODES='two' is not a whole number"),
    ({**SLURM, "MASTER_PORT": "70000"}, "main process port 70000 is not a TCP port"),
])
def test_incomplete_settings_are_one_line_errors(env, message):
    with pytest.raises(PipelineError) as info:
        machines_from(env)
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("config,launcher", [("cpu_ddp", "multi_gpu"), ("multi_gpu", "multi_gpu"),
                                             ("fsdp", "multi_gpu"), ("deepspeed_zero2", "deepspeed"),
                                             ("deepspeed_zero3", "deepspeed")])
def test_the_installed_accelerate_reads_the_launch_as_machine_1_of_2(config, launcher):
    """Parse our command with accelerate's own parser and build what it hands torchrun
    (accelerate/utils/launch.py): 8 processes here, 16 in all, rendezvous at machine 0."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

    machines = Machines(2, 1, "10.0.0.7", 29555)
    cmd = launch_command(pick_accelerate_config(config, 8), 8, Path("/ck/finetune_config.yaml"), 8, machines,
                         precision="bf16")
    assert cmd[cmd.index("--num_processes") + 1] == "16"
    args, _, _ = _validate_launch_command(launch_command_parser().parse_args(cmd[3:]))
    if launcher == "deepspeed":
        args.deepspeed_fields_from_accelerate_config = ""
        command, env = prepare_deepspeed_cmd_env(args)
        assert command is None and args.deepspeed_multinode_launcher == "standard"  # torchrun per node, no pdsh
        assert env["ACCELERATE_USE_DEEPSPEED"] == "true"
    else:
        env = prepare_multi_gpu_env(args)
        assert env.get("ACCELERATE_USE_FSDP") == ("true" if config == "fsdp" else None)
    assert (args.nnodes, args.node_rank, args.nproc_per_node) == ("2", 1, "8")
    assert args.rdzv_backend == "static" and args.rdzv_endpoint == "10.0.0.7:29555"


RENDEZVOUS = """
import os, time
from accelerate import PartialState
# cpu=True as the trainer says it (pipeline/train/trainer.py): the launch does not pass use_cpu on, and
# without it each rank would see a world of one (process_index 0 on both).
state = PartialState(cpu=True)  # the process group: rank 0 listens on the launch's port
state.wait_for_everyone()
time.sleep(2)  # hold the port while the other launch starts
# One write per rank: the ranks share the launch's pipe, and under PYTHONUNBUFFERED a print's
# pieces interleave (a CI run read "rendezvousrendezvous 0 0"); a write this short is atomic.
os.write(1, f"rendezvous {state.process_index} of {state.num_processes}\\n".encode())
"""


@pytest.mark.slow
def test_two_launches_started_together_on_one_machine_both_rendezvous(tmp_path):
    """Twice, two real 2-process launches (cpu_ddp) started at the same moment on this machine.
    With accelerate's fixed 29500 both found it free and one failed with EADDRINUSE, exit 1 (3 of 4
    runs of this test when it started them three times; likely how a CI run's rehearsal lost a
    training); each now takes a free port."""
    script = tmp_path / "rendezvous.py"
    script.write_text(RENDEZVOUS)
    cmd = launch_command(pick_accelerate_config("cpu_ddp", 0), 2, tmp_path / "unused.yaml", precision="fp32")
    cmd = cmd[:cmd.index("-m", 3)] + [str(script)]  # the launch's own flags, this script instead of finetune
    for _ in range(2):
        procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
        for proc in procs:
            out = proc.communicate(timeout=300)[0]
            ranks = sorted(line for line in out.splitlines() if line.startswith("rendezvous "))
            assert proc.returncode == 0 and ranks == ["rendezvous 0 of 2", "rendezvous 1 of 2"], out[-3000:]


def test_a_deepspeed_config_that_would_ssh_into_the_nodes_is_refused(tmp_path):
    text = pick_accelerate_config("deepspeed_zero2", 0).read_text().replace("standard", "pdsh")
    (tmp_path / "ds.yaml").write_text(text)
    with pytest.raises(PipelineError, match="several machines need deepspeed_multinode_launcher: standard"):
        launch_command(tmp_path / "ds.yaml", 8, tmp_path / "c.yaml", 8, Machines(2, 0, "a", 1), precision="bf16")
    assert launch_command(tmp_path / "ds.yaml", 8, tmp_path / "c.yaml", 8, precision="bf16")  # one machine: pdsh is never used


def test_dry_run_prints_the_multi_machine_launch(tmp_path, capsys, monkeypatch):
    from pipeline.cli import main

    for name in [k for k in os.environ if k.startswith("SLURM_") or k in ("MASTER_ADDR", "MASTER_PORT")]:
        monkeypatch.delenv(name)  # this test gives the machines as arguments

    write_dataset(tmp_path, "react", fireact_records(limit=2))  # a dry run checks the dataset as the real one does
    code = main(["train", "--config", str(TINY), "--dry-run", f"dataset_dir={tmp_path}", "--num-processes", "1",
                 "--num-machines", "2", "--machine-rank", "1", "--main-process-ip", "127.0.0.1"])
    out = capsys.readouterr().out
    assert code == 0
    assert "batch 8 = 1 x 4 accumulation x 2 processes (1 here, machine 1 of 2 (machine 0 at 127.0.0.1:29500))" in out
    assert ("--num_processes 2 --num_machines 2 --machine_rank 1 --main_process_ip 127.0.0.1 "
            "--main_process_port 29500") in out


# ----------------------------------------------------------------------------- two machines on 127.0.0.1

STEPS = 9  # checkpoints at 3, 6, 9


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, smollm2_dir):  # tiny.yaml trains with the SmolLM2 tokenizer
    """test_finetune's data: 16 short real FireAct ReAct trajectories, batch 8 spans epochs."""
    if not DATA.is_dir():
        pytest.skip("../shared/data is absent")
    root = tmp_path_factory.mktemp("multinode")
    write_dataset(root / "sft", "react", fireact_records(max_chars=450, limit=16))
    return root


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train(root: Path, experiment: str, *args: str) -> subprocess.Popen:
    """`python -m pipeline train` on the tiny student, CPU DDP over gloo, as a user runs it."""
    cmd = [sys.executable, "-m", "pipeline", "train", "--config", str(TINY), "accelerate_config=cpu_ddp",
           f"dataset_dir={root / 'sft'}", f"output_root={root / 'ck'}", f"experiment={experiment}",
           f"max_steps={STEPS}", "save_steps=3", *args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join(p for p in (str(TINY.parents[2]), os.environ.get("PYTHONPATH")) if p)}
    for name in [k for k in env if k.startswith("SLURM_") or k in ("MASTER_ADDR", "MASTER_PORT")]:
        del env[name]  # the machines are given as arguments here
    log = tempfile.NamedTemporaryFile("w+", prefix=f"{experiment}-", suffix=".log", dir=root, delete=False)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True, env=env, cwd=root,
                            start_new_session=True)
    proc.log_path = Path(log.name)
    return proc


def two_machines(root: Path, experiment: str) -> list[subprocess.Popen]:
    port = str(free_port())
    return [train(root, experiment, "--num-processes", "1", "--num-machines", "2", "--machine-rank", str(rank),
                  "--main-process-ip", "127.0.0.1", "--main-process-port", port) for rank in (0, 1)]


def finish(procs: list[subprocess.Popen], timeout: float = 900) -> list[str]:
    deadline = time.time() + timeout
    try:
        for proc in procs:
            proc.wait(timeout=max(1.0, deadline - time.time()))
    finally:  # leave nothing training in the background
        for proc in procs:
            if proc.poll() is None:
                kill_tree(proc)
                proc.wait()
    logs = [proc.log_path.read_text(encoding="utf-8", errors="replace") for proc in procs]
    for proc, log in zip(procs, logs, strict=True):
        assert proc.returncode == 0, log[-4000:]
    return logs


def assert_same_losses(run: Path, reference: Path, steps: range) -> None:
    got, want = losses_by_step(run / f"checkpoint-{STEPS}"), losses_by_step(reference / f"checkpoint-{STEPS}")
    assert sorted(got) == list(range(1, STEPS + 1)), "the step count must continue, none repeated"
    for step in steps:
        assert got[step] == pytest.approx(want[step], abs=LOSS_TOLERANCE), (step, got, want)


@pytest.mark.slow
def test_two_machines_on_loopback_train_like_one_and_resume_after_a_machine_is_killed(dataset):
    root = dataset
    reference = root / "ck" / "one-machine" / "tiny" / "react"
    [log] = finish([train(root, "one-machine", "--num-processes", "2")])
    assert "x 2 processes," in log

    # two machines of one process each, rendezvous at 127.0.0.1: ranks 0 and 1 as on one machine
    logs = finish(two_machines(root, "two-machines"))
    assert "machine 0 of 2" in logs[0] and "machine 1 of 2" in logs[1]
    assert "--num_machines 2 --machine_rank 1" in logs[1]
    run = root / "ck" / "two-machines" / "tiny" / "react"
    assert_same_losses(run, reference, range(1, STEPS + 1))
    assert (run / "final" / "manifest.json").is_file()

    # SIGKILL machine 1 once checkpoint-3 is complete: machine 0 must stop too (not hang)
    killed = root / "ck" / "killed" / "tiny" / "react"
    procs = two_machines(root, "killed")
    deadline = time.time() + 600
    while not is_complete_checkpoint(killed / "checkpoint-3"):
        assert all(p.poll() is None for p in procs) and time.time() < deadline, "run ended before checkpoint-3"
        time.sleep(0.05)
    kill_tree(procs[1])
    procs[1].wait()
    try:
        code = procs[0].wait(timeout=300)
    finally:
        if procs[0].poll() is None:
            kill_tree(procs[0])
    assert code != 0, "machine 0 finished although machine 1 was killed"
    last = latest_complete_checkpoint(killed)
    assert last is not None and not (killed / "final").exists(), "the kill came after the run ended"
    start = int(last.name.split("-")[1])

    logs = finish(two_machines(root, "killed"))
    assert f"resuming from {last}" in logs[0]
    assert_same_losses(killed, reference, range(start + 1, STEPS + 1))
