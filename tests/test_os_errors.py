"""Where the pipeline meets the operating system and the launcher: every failure a user can
cause ends in one `error:` line and exit code 2, never a traceback. Real `python -m pipeline`
processes against unwritable folders (a path under a file, a read-only mount, no permission, a
system folder), bad `--config` files, too few file descriptors, a full disk mid-run (a tmpfs
of a few KB, or a file-size limit), files a kill left behind, and a `train` whose launched
child fails (relayed without accelerate's or torchrun's traceback).

    .venv/bin/python -m pytest tests/test_os_errors.py -q
    .venv/bin/python -m pytest tests/test_os_errors.py -q -m "not slow"   # without the training launches
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml
from episode_testdata import CORPUS, REPO, child_env, read_records, run_pipeline, without_timing
from sft_testdata import DATA, fireact_records, write_dataset

TINY = REPO / "configs" / "students" / "tiny.yaml"
IS_ROOT = os.geteuid() == 0
SETPRIV = shutil.which("setpriv")

needs_corpus = pytest.mark.skipif(not CORPUS.is_file(), reason=f"offline corpus not found at {CORPUS}")


def assert_one_line(proc: subprocess.CompletedProcess, *fragments: str, besides: str | None = None) -> str:
    """Exit 2, no traceback, and exactly one non-empty stderr line: `error: ...` with the fragments
    (`besides`: the start of an expected earlier line of another stage, e.g. a warning, set apart)."""
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr + proc.stdout
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip() and not (besides and line.startswith(besides))]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def oracle(index: Path, out: Path, *extra: str) -> list[str]:
    return ["generate", "oracle=exact", f"wiki.index={index}", "questions=offline-eval",
            f"out_dir={out}", *extra]


# ------------------------------------------------------------ unwritable output folders, every stage

def stage_commands(tmp_path: Path, bad: Path) -> dict[str, list[str]]:
    """For each stage, a command whose only fault is an output folder under `bad`."""
    demo = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text())
    demo["out_dir"] = str(bad / "run")
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump(demo))
    dataset = tmp_path / "sft"
    write_dataset(dataset, "react", fireact_records(limit=2))
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"title": "A", "text": "A is a page."}) + "\n")
    return {
        "generate": ["generate", "oracle=exact", "limit=2", f"out_dir={bad / 'gen'}"],
        "filter": ["filter", f"inputs=[{tmp_path}]", f"out_dir={bad / 'sft'}"],
        "eval": ["eval", f"out_dir={bad / 'eval'}"],
        "plot": ["plot", f"summaries=[{tmp_path / 'summary.json'}]", f"out_dir={bad / 'plot'}"],
        "train": ["train", "--config", str(TINY), "accelerate_config=cpu", f"dataset_dir={dataset}",
                  f"output_root={bad / 'ck'}"],
        "run": ["run", "--config", str(grid)],
        "data split": ["data", "split", "--out", str(bad / "split")],
        "wiki build": ["wiki", "build", "--corpus", str(corpus), "--out", str(bad / "wiki.sqlite")],
    }


@pytest.mark.parametrize("stage", ["generate", "filter", "eval", "plot", "train", "run", "data split", "wiki build"])
def test_an_output_folder_under_a_file_is_one_line_before_any_work(stage, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")
    proc = run_pipeline(*stage_commands(tmp_path, blocker)[stage])
    assert_one_line(proc, str(blocker), "is a file, not a folder")
    assert blocker.read_text() == "not a folder\n"


def test_an_output_folder_that_is_a_file_or_a_system_folder(tmp_path):
    existing = tmp_path / "out"
    existing.write_text("x")
    assert_one_line(run_pipeline("generate", "oracle=exact", f"out_dir={existing}"),
                    f"{existing} is a file, not a folder")
    assert_one_line(run_pipeline("plot", "summaries=[x.json]", "out_dir=/proc/pipeline-out"),
                    "/proc", "cannot create files there")


@pytest.fixture
def read_only_mount(tmp_path):
    """A read-only tmpfs (root only: mount needs CAP_SYS_ADMIN)."""
    point = tmp_path / "ro"
    point.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(point)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here ({proc.stderr.strip() or 'mount failed'})")
    yield point
    subprocess.run(["umount", str(point)], check=True)


def test_a_read_only_file_system_is_one_line(read_only_mount):
    proc = run_pipeline("generate", "oracle=exact", f"out_dir={read_only_mount / 'gen'}")
    assert_one_line(proc, str(read_only_mount), "Read-only file system")


def unprivileged(args: list[str]) -> list[str]:
    """Run as a user that file permissions apply to: root keeps its uid but loses the
    capabilities that override them (util-linux setpriv)."""
    if not IS_ROOT:
        return args
    if SETPRIV is None:
        pytest.skip("running as root and setpriv is not installed: permissions cannot be tested")
    return [SETPRIV, "--bounding-set=-dac_override,-dac_read_search", *args]


def pipeline_as_unprivileged(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(unprivileged([sys.executable, "-m", "pipeline", *args]), cwd=REPO, env=child_env(),
                          capture_output=True, text=True, timeout=120)


def test_permission_denied_on_the_output_folder_is_one_line(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    proc = pipeline_as_unprivileged("generate", "oracle=exact", f"out_dir={locked / 'gen'}")
    assert_one_line(proc, str(locked), "Permission denied", "choose a folder you can write")
    assert list(locked.iterdir()) == []


# ------------------------------------------------------------ --config that is not a readable file

def test_a_config_that_is_not_a_readable_file_is_one_line(tmp_path):
    assert_one_line(run_pipeline("generate", "--config", str(tmp_path / "missing.yaml")), "config file not found")
    assert_one_line(run_pipeline("generate", "--config", str(tmp_path)), "is a folder")
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    assert_one_line(run_pipeline("filter", "--config", str(binary)), "not UTF-8 text")
    unreadable = tmp_path / "secret.yaml"
    unreadable.write_text("limit: 2\n")
    unreadable.chmod(0)
    proc = pipeline_as_unprivileged("generate", "--config", str(unreadable))
    assert_one_line(proc, f"config file {unreadable}: Permission denied")


# ------------------------------------------------------------ missing inputs

def test_missing_inputs_are_one_line(tmp_path):
    missing = tmp_path / "nowhere"
    assert_one_line(run_pipeline("filter", f"inputs=[{missing}]", f"out_dir={tmp_path / 'sft'}"), str(missing))
    assert_one_line(run_pipeline("plot", f"summaries=[{missing / 'summary.json'}]", f"out_dir={tmp_path / 'p'}"),
                    str(missing))
    assert_one_line(run_pipeline("wiki", "info", "--index", str(missing / "x.sqlite")), str(missing))
    assert_one_line(run_pipeline("data", "show", str(missing / "q.jsonl")), str(missing))
    assert not (tmp_path / "sft").exists() and not (tmp_path / "p").exists()


# ------------------------------------------------------------ too many open files

@needs_corpus
def test_too_many_open_files_is_one_line(index, tmp_path):
    """The stage runs with its descriptor limit set to what is open at start (+0, +1, +2): it
    either finishes or stops with one EMFILE line; at +0 it cannot finish."""
    wrapper = ("import os, resource, sys\n"
               "from pipeline.cli import main\n"
               "n = len(os.listdir('/proc/self/fd')) - 1 + int(sys.argv[1])\n"
               "resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))\n"
               "sys.exit(main(sys.argv[2:]))\n")
    emfile = 0
    for spare in range(3):
        out = tmp_path / f"gen{spare}"
        proc = subprocess.run([sys.executable, "-c", wrapper, str(spare), *oracle(index, out, "limit=2")],
                              cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=120)
        if proc.returncode == 0:
            continue
        assert_one_line(proc, "Too many open files", "ulimit -n")
        emfile += 1
    assert emfile >= 1


# ------------------------------------------------------------ a full disk mid-run

@contextlib.contextmanager
def tmpfs(point: Path, size: str):
    """A small tmpfs at `point` that can be grown in place (root only; skips otherwise)."""
    point.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({proc.stderr.strip() or 'mount failed'}); "
                    "the file-size-limit test covers a full disk instead")
    try:
        yield point
    finally:
        subprocess.run(["umount", str(point)], check=True)


def grow(point: Path, size: str) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(point)], check=True)


@pytest.fixture
def small_tmpfs(tmp_path):
    with tmpfs(tmp_path / "small", "128k") as point:
        yield point


def assert_resumed_equals_reference(index: Path, out: Path, tmp_path: Path, *args: str) -> None:
    reference = tmp_path / "reference"
    assert run_pipeline(*oracle(index, reference, *args)).returncode == 0
    for method in ("react", "act"):
        got = [without_timing(r) for r in read_records(out / f"{method}.jsonl")]
        want = [without_timing(r) for r in read_records(reference / f"{method}.jsonl")]
        assert sorted(got, key=lambda r: r["id"]) == sorted(want, key=lambda r: r["id"])


@needs_corpus
def test_a_full_disk_stops_in_one_line_keeps_records_and_resumes(index, small_tmpfs, tmp_path):
    out = small_tmpfs / "gen"
    args = ("limit=30", "methods=[react,act]")  # ~290 KB of records: more than the 128 KB disk
    proc = run_pipeline(*oracle(index, out, *args))
    assert_one_line(proc, "No space left on device", "re-run the same command")
    written = (out / "react.jsonl").read_bytes()
    assert written.endswith(b"\n")  # the record being written when space ran out was cut off
    kept = [json.loads(line) for line in written.splitlines()]  # every line a whole record
    assert 0 < len(kept) < 30
    assert json.loads((out / "manifest.json").read_text())["complete"] is False
    assert not list(out.glob(".*.tmp"))
    grow(small_tmpfs, "2m")  # space freed
    proc = run_pipeline(*oracle(index, out, *args))
    assert proc.returncode == 0, proc.stderr
    assert (out / "react.jsonl").read_bytes().startswith(written)  # resumed: nothing rewritten
    assert json.loads((out / "manifest.json").read_text())["complete"] is True
    assert_resumed_equals_reference(index, out, tmp_path, *args)


@needs_corpus
def test_a_file_size_limit_mid_run_stops_in_one_line_and_resumes(index, tmp_path):
    """The same with RLIMIT_FSIZE (EFBIG; Python ignores SIGXFSZ), which needs no root."""
    out = tmp_path / "gen"
    args = ("limit=30", "methods=[react,act]")
    limit = 60_000  # react.jsonl reaches ~170 KB at 30 questions
    proc = subprocess.run([sys.executable, "-m", "pipeline", *oracle(index, out, *args)], cwd=REPO,
                          env=child_env(), capture_output=True, text=True, timeout=120,
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)))
    assert_one_line(proc, "File too large", "re-run the same command")
    written = (out / "react.jsonl").read_bytes()
    assert written.endswith(b"\n") and len(written) <= limit
    assert all(json.loads(line)["id"] for line in written.splitlines())
    proc = run_pipeline(*oracle(index, out, *args))
    assert proc.returncode == 0, proc.stderr
    assert (out / "react.jsonl").read_bytes().startswith(written)
    assert_resumed_equals_reference(index, out, tmp_path, *args)


# ------------------------------------------------------------ files a kill left behind

def stale_name(target: str) -> str:
    """A temporary as atomic_path names it, from a writer that no longer runs."""
    return f".{target}.{_dead_pid()}.{uuid.uuid4().hex[:8]}.tmp"


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid  # reaped: no process has this id now (reuse within the test is negligible)


@needs_corpus
def test_temporaries_left_by_a_kill_are_removed_and_never_read(index, tmp_path):
    gen = tmp_path / "gen"
    assert run_pipeline(*oracle(index, gen, "limit=3", "methods=[react]")).returncode == 0
    records = (gen / "react.jsonl").read_bytes()
    # a kill mid-write leaves these beside their targets; one of a live writer must stay
    planted = [gen / stale_name("manifest.json"), gen / stale_name("react.jsonl")]
    for path in planted:
        path.write_bytes(records[: len(records) // 2])
    live = gen / f".summary.json.{os.getpid()}.abcdefgh.tmp"
    live.write_text("{}")
    assert run_pipeline(*oracle(index, gen, "limit=4", "methods=[react]")).returncode == 0
    assert not any(p.exists() for p in planted) and live.exists()
    assert len(read_records(gen / "react.jsonl")) == 4

    sft = tmp_path / "sft"
    assert run_pipeline("filter", f"inputs=[{gen}]", f"out_dir={sft}").returncode == 0
    half_dataset = sft / stale_name("react")  # a killed dataset swap: a whole folder
    half_dataset.mkdir()
    (half_dataset / "train.jsonl").write_text('{"id": "planted"}\n')
    old_dataset = sft / stale_name("react").replace(".tmp", ".old.tmp")
    old_dataset.mkdir()
    assert run_pipeline("filter", f"inputs=[{gen}]", f"out_dir={sft}", "force=true").returncode == 0
    assert not half_dataset.exists() and not old_dataset.exists()
    assert "planted" not in (sft / "react" / "train.jsonl").read_text()
    leftovers = [p for p in sft.rglob(".*") if p.name.endswith(".tmp")]
    assert leftovers == []


# ------------------------------------------------------------ train: checks before launching, and the child's line

@pytest.fixture
def dataset(tmp_path) -> Path:
    if not (DATA / "fireact").is_dir():
        pytest.skip(f"offline data not found at {DATA}")
    sft = tmp_path / "sft"
    write_dataset(sft, "react", fireact_records(limit=8))
    return sft


def train(tmp_path: Path, dataset: Path, *extra: str, accelerate_config: str = "cpu") -> subprocess.CompletedProcess:
    return run_pipeline("train", "--config", str(TINY), f"accelerate_config={accelerate_config}",
                        f"dataset_dir={dataset}", f"output_root={tmp_path / 'ck'}", "max_steps=1", *extra,
                        timeout=300)


def test_train_checks_what_the_child_would_before_launching(tmp_path, dataset):
    assert_one_line(train(tmp_path, tmp_path / "nowhere"), "train.jsonl not found", "pipeline filter")
    incomplete = tmp_path / "incomplete"
    write_dataset(incomplete, "react", fireact_records(limit=2), complete=False)
    assert_one_line(train(tmp_path, incomplete), "incomplete")
    ro = tmp_path / "file"
    ro.write_text("x")
    assert_one_line(train(tmp_path, dataset, f"output_dir={ro / 'out'}"), "output_dir", "is a file, not a folder")
    proc = train(tmp_path, dataset, accelerate_config=str(tmp_path / "missing.yaml"))
    assert_one_line(proc, "accelerate_config", "not found")
    assert not (tmp_path / "ck").exists()


@pytest.mark.slow
@pytest.mark.parametrize("accelerate_config", ["cpu", "cpu_ddp"])
def test_a_failing_child_is_relayed_as_its_own_line_and_code(tmp_path, dataset, accelerate_config):
    """max_length=4 drops every example: only the child can find that out (it tokenizes).
    accelerate's simple launcher would add a CalledProcessError traceback and exit 1; torchrun
    (cpu_ddp) a ChildFailedError report; each of the 2 ranks would print the line."""
    proc = train(tmp_path, dataset, "max_length=4", accelerate_config=accelerate_config)
    assert_one_line(proc, "every example is longer than max_length=4")
    assert "ChildFailedError" not in proc.stdout and "CalledProcessError" not in proc.stdout
    assert "[train]" in proc.stdout  # the launch's own output still streams


@pytest.mark.slow
@needs_corpus
def test_run_relays_a_failing_train_unit_in_one_line(tmp_path, shared_data):
    config = {
        "experiment": "fail", "out_dir": str(tmp_path / "run"), "formats": ["react"],
        "wiki": {"index": str(tmp_path / "wiki.sqlite"), "corpus": [str(CORPUS)]},
        "generate": {"oracle": "exact", "questions": "offline-bootstrap", "limit": 4},
        "train": {"output_root": str(tmp_path / "ck"), "max_steps": 1, "global_batch_size": 4,
                  "accelerate_config": "cpu", "max_length": 4},
        "plot": {"reference_points": False},
        "students": [{"name": "tiny", "config": str(TINY), "size_class": "tiny", "params_b": 0.0032}],
    }
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = run_pipeline("run", "--config", str(path), timeout=600)
    # generate's note that the offline index lacks one of these 4 questions' pages comes first
    assert "warning: wiki.index" in proc.stderr
    assert_one_line(proc, "training tiny on react", "every example is longer than max_length=4",
                    besides="warning: wiki.index")
    assert "ChildFailedError" not in proc.stdout and "CalledProcessError" not in proc.stdout



@pytest.mark.slow
def test_a_full_disk_while_checkpointing_is_one_line_and_training_resumes(tmp_path, dataset):
    """60 MB holds one checkpoint of the tiny student (~41 MB: weights + Adam state), not two:
    the second save fails inside torch.save / safetensors, which give no OSError."""
    with tmpfs(tmp_path / "disk", "60m") as disk:
        args = ("train", "--config", str(TINY), "accelerate_config=cpu", f"dataset_dir={dataset}",
                f"output_root={disk}", "max_steps=2", "save_steps=1")
        proc = run_pipeline(*args, timeout=600)
        assert_one_line(proc, "re-run the same command")
        out = disk / "default" / "tiny" / "react"
        assert (out / "checkpoint-1" / "trainer_state.json").is_file()
        grow(disk, "400m")
        proc = run_pipeline(*args, timeout=600)
        assert proc.returncode == 0, proc.stderr
        assert f"resuming from {out / 'checkpoint-1'}" in proc.stdout
        assert json.loads((out / "final" / "manifest.json").read_text())["steps"] == 2
