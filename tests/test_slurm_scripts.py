"""The SLURM examples under scripts/slurm/, run here with SLURM's variables set and stand-ins for
`srun` / `scontrol` on PATH (small shell scripts, labelled as such below): a job array of two
oracle generation shards merged by filter, and the multi-node training job's launch commands.

    .venv/bin/python -m pytest tests/test_slurm_scripts.py -q
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from episode_testdata import CORPUS, child_env, read_records, run_pipeline
from sft_testdata import fireact_records, write_dataset

REPO = Path(__file__).resolve().parents[1]
SLURM_DIR = REPO / "scripts" / "slurm"

# Stand-ins for SLURM's commands (this machine has no SLURM): `scontrol show hostnames` prints
# the nodes of "gpu[01-02]"; `srun` runs its command once per node with that node's variables.
# The srun stand-in gives the step the CPUs Slurm 22.05-23.02 would: its own --cpus-per-task, else
# one (those versions ignore the job's SLURM_CPUS_PER_TASK), and says so on stderr.
SCONTROL = """#!/bin/bash
[[ "$1 $2" == "show hostnames" ]] || exit 1
printf 'gpu01\\ngpu02\\n'
"""
SRUN = """#!/bin/bash
cpus=1
while [[ "$1" == --* ]]; do
  [[ "$1" == --cpus-per-task=* ]] && cpus=${1#--cpus-per-task=}
  shift
done
echo "srun stand-in: step of $SLURM_JOB_NUM_NODES node(s), $cpus CPU(s) per task" >&2
for ((node = 0; node < SLURM_JOB_NUM_NODES; node++)); do
  SLURM_NODEID=$node SLURM_STEP_NUM_NODES=$SLURM_JOB_NUM_NODES SLURM_CPUS_PER_TASK=$cpus "$@" || exit $?
done
"""


def stand_ins(folder: Path) -> str:
    folder.mkdir()
    for name, text in (("scontrol", SCONTROL), ("srun", SRUN)):
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    return f"{folder}{os.pathsep}{os.environ['PATH']}"


def sbatch(script: str, env: dict, *args: str) -> subprocess.CompletedProcess:
    """Run a batch script as SLURM would on the job's first node (bash, variables set)."""
    clean = {k: v for k, v in child_env(env).items() if not k.startswith("SLURM_") or k in env}
    return subprocess.run(["bash", str(SLURM_DIR / script), *args], env=clean, cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def test_the_scripts_are_valid_bash():
    for script in ("train.sbatch", "generate_array.sbatch"):
        subprocess.run(["bash", "-n", str(SLURM_DIR / script)], check=True)


def train_job_env(tmp_path: Path) -> dict:
    """What sbatch sets for train.sbatch's header on two 128-CPU nodes (--cpus-per-task=64), and
    the filtered dataset the job trains on (a dry run checks it as the real one does)."""
    write_dataset(tmp_path / "sft", "react", fireact_records(limit=2))
    return {"PATH": stand_ins(tmp_path / "bin"), "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "gpu[01-02]",
            "SLURM_CPUS_PER_TASK": "64", "SLURM_CPUS_ON_NODE": "128",
            "SLURM_SUBMIT_DIR": str(REPO), "PYTHON": sys.executable, "CONFIG": "configs/students/tiny.yaml",
            "ACCELERATE_CONFIG": "cpu_ddp", "DATASET_DIR": str(tmp_path / "sft")}


def test_train_sbatch_starts_one_launch_per_node_with_its_rank(tmp_path):
    proc = sbatch("train.sbatch", train_job_env(tmp_path), f"output_root={tmp_path / 'ck'}", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    # the job's CPUs reach the step (Slurm 22.05-23.02 would give it one without --cpus-per-task)
    assert "srun stand-in: step of 2 node(s), 64 CPU(s) per task" in proc.stderr
    out = proc.stdout
    assert "train: 2 nodes, machine 0 at gpu01:29500" in out
    for rank in (0, 1):  # cpu_ddp: 2 processes per node, 4 in all
        assert f"x 4 processes (2 here, machine {rank} of 2 (machine 0 at gpu01:29500))" in out
        assert (f"--num_processes 4 --num_machines 2 --machine_rank {rank} --main_process_ip gpu01 "
                "--main_process_port 29500") in out
    assert not (tmp_path / "ck").exists()  # a dry run writes nothing


def test_train_sbatch_gives_the_step_the_node_cpus_without_a_cpus_per_task_header(tmp_path):
    env = {k: v for k, v in train_job_env(tmp_path).items() if k != "SLURM_CPUS_PER_TASK"}
    proc = sbatch("train.sbatch", env, f"output_root={tmp_path / 'ck'}", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "srun stand-in: step of 2 node(s), 128 CPU(s) per task" in proc.stderr


@pytest.mark.skipif(not CORPUS.is_file(), reason=f"offline corpus not found at {CORPUS}")
def test_generate_array_runs_its_shard_of_an_experiment_config_and_filter_merges_them(tmp_path, index):
    experiment = tmp_path / "exp.yaml"
    experiment.write_text(f"experiment: t\nout_dir: {tmp_path / 'run'}\nformats: [react, act]\n"
                          f"wiki: {{index: {index}}}\n"
                          "generate: {oracle: exact, questions: offline-eval, limit: 5}\n")
    out = tmp_path / "gen"
    for task in (1, 2):  # --array=1-2: shards 0/2 and 1/2
        env = {"SLURM_ARRAY_TASK_ID": str(task), "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_COUNT": "2",
               "SLURM_SUBMIT_DIR": str(REPO), "PYTHON": sys.executable, "CONFIG": str(experiment), "OUT": str(out)}
        proc = sbatch("generate_array.sbatch", env)
        assert proc.returncode == 0, proc.stderr
        assert f"generate: shard {task - 1}/2 -> {out}/shard-{task - 1}" in proc.stdout
    manifest = json.loads((out / "shard-1" / "manifest.json").read_text())
    assert manifest["config"]["shard"] == "1/2" and manifest["config"]["wiki"]["index"] == str(index)
    assert manifest["config"]["methods"] == ["react", "act"]  # the experiment's, as `run` would use
    assert [len(read_records(out / f"shard-{i}" / "react.jsonl")) for i in range(2)] == [3, 2]
    proc = run_pipeline("filter", f"inputs=[{out}/shard-0,{out}/shard-1]", f"out_dir={tmp_path / 'sft'}")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "sft" / "react" / "train.jsonl").is_file()


def test_generate_array_outside_an_array_says_how_to_submit(tmp_path):
    proc = sbatch("generate_array.sbatch", {"SLURM_ARRAY_TASK_ID": "0", "PYTHON": sys.executable})
    assert proc.returncode != 0 and "run as a job array: sbatch --array=0-N" in proc.stderr
