"""Output into a log file (a SLURM job's, `> log 2>&1`): progress as periodic lines, not \\r
redraws, and the training libraries' known-harmless notices dropped (pipeline/core/progress.py,
pipeline/train/notices.py). Real `python -m pipeline` processes with stdout and stderr to a file;
on a terminal (a pseudo-terminal here) the bars stay bars.

    .venv/bin/python -m pytest tests/test_log_output.py -q
"""

from __future__ import annotations

import fcntl
import io
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest
from episode_testdata import CORPUS, REPO
from sft_testdata import fireact_records, write_dataset

from pipeline.core.progress import EVERY_ENV, STYLE_ENV, RedrawsAsLines

TINY = REPO / "configs" / "students" / "tiny.yaml"


def pipeline_env(**extra: str) -> dict:
    """This worktree's pipeline, tqdm on (the other tests' children run with TQDM_DISABLE), and no
    progress choice inherited: the child decides from its own output, as a user's process does."""
    env = {k: v for k, v in os.environ.items() if k not in ("TQDM_DISABLE", STYLE_ENV, EVERY_ENV)}
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    return {**env, "PYTHONPATH": path, **extra}


def run_to_file(log: Path, *args: str, timeout: float = 120, **env: str) -> int:
    with open(log, "w") as out:
        return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=REPO, env=pipeline_env(**env),
                              stdout=out, stderr=subprocess.STDOUT, timeout=timeout).returncode


# -- the stream: redraws become lines at most every N seconds -------------------------------------

def test_redraws_become_a_line_at_most_every_interval_and_the_last_state_always():
    now = [0.0]
    out = io.StringIO()
    stream = RedrawsAsLines(out, every_s=30, clock=lambda: now[0])
    stream.write("[run] a line\n")
    for i in range(10):  # a bar redrawn every 10 s, as tqdm writes it: "\r" + the frame
        now[0] = 10.0 * i
        stream.write(f"\rsteps: {i}/9")
    stream.write("\n")  # the bar closes (leave=True): its last state is a line
    stream.write("\r" + " " * 20 + "\r")  # a bar wiped before a message (tqdm.write) ...
    stream.write("{'loss': 1.5}\n\n")  # ... the message and a blank line stay
    stream.write("\x1b[Alast frame\r\n")  # a nested bar's cursor move; "\r\n" ends a line
    lines = out.getvalue().split("\n")
    assert "\r" not in out.getvalue()
    assert lines[0] == "[run] a line"
    steps = [line for line in lines if line.startswith("steps:")]
    assert steps[-1] == "steps: 9/9" and len(steps) <= 5  # 90 s of redraws: one line per 30 s + the last
    assert lines[-4:] == ["{'loss': 1.5}", "", "last frame", ""]


def test_bytes_written_to_the_streams_buffer_reach_the_file():
    """`run` relays an eval child's stderr as bytes to sys.stderr.buffer (already lines: the child
    took the same choice); without a `buffer` that relay failed with AttributeError."""
    raw = io.BytesIO()
    text = io.TextIOWrapper(raw, encoding="utf-8", line_buffering=True)
    stream = RedrawsAsLines(text, every_s=30)
    stream.write("[run] unit 1\n")
    stream.buffer.write(b"[eval] a child's line\n")
    stream.buffer.flush()
    assert raw.getvalue() == b"[run] unit 1\n[eval] a child's line\n"


# -- a real CLI process --------------------------------------------------------------------------

@pytest.mark.skipif(not CORPUS.is_file(), reason=f"offline corpus not found at {CORPUS}")
def test_generate_into_a_log_file_writes_progress_lines_not_redraws(tmp_path, index):
    log = tmp_path / "generate.log"
    code = run_to_file(log, "generate", "oracle=exact", "questions=offline-eval", "limit=6", "methods=[react]",
                       f"wiki.index={index}", f"out_dir={tmp_path / 'gen'}", **{EVERY_ENV: "0"})
    text = log.read_bytes().decode()  # not read_text: universal newlines would turn each \r into \n
    assert code == 0, text
    assert "\r" not in text  # before issue 46: one \r-separated frame per redraw
    bar = [line for line in text.splitlines() if line.startswith("oracle react:")]
    assert bar and bar[-1].startswith("oracle react: 100%|") and "6/6" in bar[-1], text


@pytest.mark.skipif(not CORPUS.is_file(), reason=f"offline corpus not found at {CORPUS}")
def test_on_a_terminal_the_bar_is_still_redrawn(tmp_path, index):
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # tqdm sizes its bar to it
    proc = subprocess.Popen([sys.executable, "-m", "pipeline", "generate", "oracle=exact", "questions=offline-eval",
                             "limit=6", "methods=[react]", f"wiki.index={index}", f"out_dir={tmp_path / 'gen'}"],
                            cwd=REPO, env=pipeline_env(), stdout=follower, stderr=follower)
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal's other side closed: the process is done
            break
        if not chunk:
            break
        seen += chunk
    os.close(leader)
    assert proc.wait(timeout=60) == 0, seen.decode(errors="replace")
    assert b"\roracle react:" in seen  # a redraw, as a terminal wants


# -- a real launch: the training libraries' notices --------------------------------------------

@pytest.mark.slow
def test_a_two_process_training_into_a_log_file_has_step_lines_and_no_repeated_library_notices(
        tmp_path, smollm2_dir):
    write_dataset(tmp_path / "sft", "react", fireact_records(max_chars=450, limit=16))
    log = tmp_path / "train.log"
    code = run_to_file(log, "train", "--config", str(TINY), f"dataset_dir={tmp_path / 'sft'}",
                       f"output_dir={tmp_path / 'ck'}", "max_steps=3", "save_steps=3", timeout=600,
                       **{EVERY_ENV: "0"})
    text = log.read_bytes().decode()  # not read_text: universal newlines would turn each \r into \n
    assert code == 0, text[-3000:]
    assert "\r" not in text, text[-3000:]
    assert [line for line in text.splitlines() if "3/3 [" in line], text[-3000:]  # the Trainer's bar, as lines
    # TRL's padding-free note (each rank printed it): the plan says the same once, in our words
    assert "annihilate" not in text and text.count("[finetune] micro-batch: 1 trajectory") == 1, text[-3000:]
    # DeepSpeed's notice that it found no GPU (each rank): this machine has none, the plan says so
    assert "Setting accelerator to CPU" not in text, text[-3000:]
    assert "[precision] training:" in text and "[finetune] launch: ddp over 2 process(es)" in text


@pytest.mark.parametrize("env, message", [
    ({STYLE_ENV: "sometimes"}, "REACT_PIPELINE_PROGRESS='sometimes': use one of bars, lines"),
    ({EVERY_ENV: "-5"}, "REACT_PIPELINE_PROGRESS_EVERY_S='-5': give the seconds between progress lines"),
])
def test_a_bad_progress_setting_is_one_line_exit_2(tmp_path, env, message):
    log = tmp_path / "out.log"
    code = run_to_file(log, "data", "show", "offline-eval", **{STYLE_ENV: "lines", **env})
    lines = log.read_text().strip().splitlines()
    assert code == 2 and lines == [f"error: {lines[0].removeprefix('error: ')}"] and message in lines[0], lines
