"""A child's progress bars relayed as redraws, not one line each (pipeline/core/relay.py): the
`train` stage's launch output and `run`'s eval stderr, from real child processes."""

from __future__ import annotations

import subprocess
import sys

# a tqdm-like bar: three redraws of one line, then a log line, then the last (unterminated) bit
BAR = "import sys, time\nfor i in range(3):\n    sys.stdout.write(f'\\rstep {i}/3'); sys.stdout.flush(); time.sleep(0.05)\n" \
      "sys.stdout.write('\\ndone\\n'); sys.stdout.write('tail'); sys.stdout.flush()\n"
RELAYED = "\rstep 0/3\rstep 1/3\rstep 2/3\ndone\ntail"


def test_the_train_stage_passes_redraws_through(capsys):
    from pipeline.train.launcher import stream
    code, held = stream([sys.executable, "-c", BAR])
    assert code == 0 and held == []
    assert capsys.readouterr().out == RELAYED  # universal newlines gave "\nstep 0/3\nstep 1/3..."


def test_the_train_stage_still_holds_back_the_launchers_report(capsys):
    from pipeline.train.launcher import stream
    child = BAR + "sys.stdout.write('\\nTraceback (most recent call last):\\n  boom\\r  again\\n'); sys.exit(3)\n"
    code, held = stream([sys.executable, "-c", child])
    assert code == 3 and held == ["Traceback (most recent call last):\n", "  boom\r", "  again\n"]
    assert capsys.readouterr().out == RELAYED + "\n"


def test_the_eval_relay_passes_redraws_and_keeps_the_error_line(capfd):
    from pipeline.stages.grid.children import relay_stderr
    child = BAR.replace("sys.stdout", "sys.stderr") + "sys.stderr.write('\\nerror: the one line\\n')\n"
    proc = subprocess.Popen([sys.executable, "-c", child], stderr=subprocess.PIPE)
    assert relay_stderr(proc) == "the one line" and proc.wait() == 0
    assert capfd.readouterr().err == RELAYED + "\n"
