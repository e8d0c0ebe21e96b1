"""A `vllm serve` process managed by the pipeline (pipeline/llm/serving.py), for real on 127.0.0.1:
`python -m pipeline eval` with a `serve:` section starts tests/standin_vllm_serve.py (a labelled
stand-in that speaks vLLM's HTTP API and takes its flags), waits until it is healthy, evaluates
over the OpenAI-compatible backend, stops it and waits until it has exited; and its faults:
never healthy, dying mid-run (one clear line, then a re-run resumes), a port already taken, a
server that ignores SIGTERM.

    .venv/bin/python -m pytest tests/test_serving.py -q
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml
from episode_testdata import CORPUS, read_records, run_pipeline, write_questions

from pipeline.core.errors import PipelineError
from pipeline.llm.config import LLMConfig
from pipeline.llm.leftovers import find_leftovers, live
from pipeline.llm.serving import (
    OMP_BIND,
    ServeConfig,
    cpu_binding,
    max_lora_rank,
    serve_command,
    unit_server,
)

pytestmark = pytest.mark.skipif(not CORPUS.is_file(), reason=f"offline corpus not found at {CORPUS}")

STANDIN = Path(__file__).resolve().parent / "standin_vllm_serve.py"


@pytest.fixture(scope="module")
def question_file(tmp_path_factory):
    from pipeline.tasks.hotpotqa.questions import load_question_set

    return write_questions(tmp_path_factory.mktemp("q") / "q.jsonl", load_question_set("offline-eval", limit=4))


def lora_checkpoint(folder: Path, rank: int = 4, rank_pattern: dict | None = None) -> Path:
    """A `final` folder of a LoRA student as pipeline/finetune.py leaves it (manifest, and the
    adapter_config.json PEFT writes; no weights: the stand-in loads none)."""
    from pipeline.core.storage import write_manifest

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": rank, "rank_pattern": rank_pattern or {},
         "base_model_name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct"}))
    write_manifest(folder / "manifest.json", stage="train", config={}, complete=True, student="tiny-llama",
                   base_model="HuggingFaceTB/SmolLM2-135M-Instruct", adapter=True, finetuning="lora",
                   format="react", size_class="tiny", params_b=0.135, steps=10, max_steps=10)
    return folder


def eval_config(tmp_path: Path, question_file: Path, index: Path, *extra_args: str, **serve) -> Path:
    config = {"finetuned": str(lora_checkpoint(tmp_path / "ckpt" / "final")),
              "model": {"backend": "vllm", "max_retries": 1, "timeout_s": 5.0, "tensor_parallel_size": 2,
                        "gpu_memory_utilization": 0.5, "max_context": 4096},
              "methods": ["react"], "questions": str(question_file), "wiki": {"index": str(index)},
              "max_in_flight": 1, "out_dir": str(tmp_path / "eval"),
              "serve": {"command": [sys.executable, str(STANDIN)], "port": 0, "startup_timeout_s": 30,
                        "stop_grace_s": 5, **serve,
                        "extra_args": ["--standin-questions", str(question_file),
                                       "--standin-record", str(tmp_path / "server.jsonl"), *extra_args]}}
    path = tmp_path / "eval.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def server_log(tmp_path: Path) -> list[dict]:
    path = tmp_path / "server.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def assert_server_gone(tmp_path: Path) -> None:
    """Every stand-in started in this test has exited (not a zombie, not still listening)."""
    pids = [e["pid"] for e in server_log(tmp_path) if "pid" in e]
    assert pids
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, pid


def still_live(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Those of `procs` still live after up to `timeout` seconds. A zombie has exited (as
    `leftovers.live` and assert_server_gone count it): an orphan's zombie waits for the machine's
    init to reap it, which psutil.wait_procs would wait for and this test cannot time."""
    deadline = time.monotonic() + timeout
    while (left := [p for p in procs if live(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def one_error_line(proc) -> str:
    """Exit 2 and one `error:` line, the last (the transport's retry notes may come before it)."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    assert errors == lines[-1:], proc.stderr
    return lines[-1]


# -- the command --------------------------------------------------------------------------------


def test_a_lora_student_is_served_by_name_with_a_rank_vllm_accepts(tmp_path):
    final = lora_checkpoint(tmp_path / "final", rank=4)
    llm = LLMConfig(backend="vllm", model="org/base", adapter=str(final), tensor_parallel_size=8,
                    gpu_memory_utilization=0.85, max_context=8192, extra={"enforce_eager": True, "max_num_seqs": 64})
    base, adapters, name = unit_server(llm)
    cmd = serve_command(base, ServeConfig(command=["/opt/vllm/bin/vllm", "serve"]), 8123, adapters)
    assert cmd[:3] == ["/opt/vllm/bin/vllm", "serve", "org/base"]
    flags = " ".join(cmd[3:])
    for expected in ("--port 8123", "--tensor-parallel-size 8", "--gpu-memory-utilization 0.85",
                     "--max-model-len 8192", "--enforce-eager", "--max-num-seqs 64", "--enable-lora",
                     f"--lora-modules {name}={final}", "--max-lora-rank 8",
                     "--generation-config vllm"):  # vLLM's neutral sampling defaults, not the model's
        assert expected in flags, (expected, flags)
    assert name != "org/base"  # requests name the adapter, never the base


@pytest.mark.parametrize("rank, pattern, expected", [(4, None, 8), (16, None, 16), (16, {"q_proj": 100}, 128),
                                                     (512, None, 512)])
def test_max_lora_rank_is_the_smallest_vllm_value_that_holds_the_adapter(tmp_path, rank, pattern, expected):
    assert max_lora_rank(lora_checkpoint(tmp_path / "f", rank=rank, rank_pattern=pattern)) == expected


def test_an_adapter_above_vllms_largest_rank_or_without_a_config_is_refused(tmp_path):
    with pytest.raises(PipelineError, match="above vLLM's largest"):
        max_lora_rank(lora_checkpoint(tmp_path / "big", rank=1024))
    with pytest.raises(PipelineError, match="is it a PEFT LoRA adapter folder"):
        max_lora_rank(tmp_path)


def test_serve_command_defaults_to_the_projects_vllm_venv_when_there_is_one(tmp_path, monkeypatch):
    from pipeline.llm import serving

    monkeypatch.setattr(serving, "VLLM_VENV", tmp_path / ".venv-vllm")
    assert ServeConfig().command == ["vllm", "serve"]
    python = tmp_path / ".venv-vllm" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("")
    assert ServeConfig().command == [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model"]


def test_a_full_finetune_is_served_from_its_final_folder(tmp_path):
    base, adapters, name = unit_server(LLMConfig(backend="vllm", model=str(tmp_path / "final"), name="s (fine-tuned)"))
    cmd = serve_command(base, ServeConfig(command=["vllm", "serve"]), 8100, adapters)
    assert cmd[:3] == ["vllm", "serve", str(tmp_path / "final")] and "--enable-lora" not in cmd
    assert cmd[cmd.index("--served-model-name") + 1] == name == "s (fine-tuned)"


def test_the_openai_backend_refuses_an_adapter_instead_of_scoring_the_base():
    from pipeline.llm.openai_http import OpenAICompatibleLLM

    with pytest.raises(PipelineError, match="score it as the fine-tuned one"):
        OpenAICompatibleLLM(LLMConfig(backend="openai", model="org/base", adapter="/ckpt/final"))


# -- the lifecycle, for real --------------------------------------------------------------------


def test_a_served_lora_student_is_evaluated_by_name_and_the_server_is_stopped(tmp_path, question_file, index):
    proc = run_pipeline("eval", "--config", str(eval_config(tmp_path, question_file, index)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = read_records(tmp_path / "eval" / "react.jsonl")
    assert len(records) == 4 and all(r["em"] == 1.0 for r in records)
    log = server_log(tmp_path)
    argv = next(e["argv"] for e in log if "argv" in e)
    assert argv[argv.index("--lora-modules") + 1].startswith("student-lora=")
    assert argv[argv.index("--max-lora-rank") + 1] == "8"  # r=4 in its adapter_config.json
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
    assert {e["model"] for e in log if "model" in e} == {"student-lora"}  # never the base model
    assert "[serve] healthy at http://127.0.0.1:" in proc.stdout and "[serve] stopped" in proc.stdout
    assert_server_gone(tmp_path)
    [row] = json.loads((tmp_path / "eval" / "summary.json").read_text())
    assert row["model"] == "tiny-llama (fine-tuned)" and row["mode"] == "finetune"


@pytest.mark.parametrize("max_concurrency, expected", [(None, 12), (3, 3)])
def test_the_episodes_in_flight_reach_the_server_unless_the_model_caps_its_requests(tmp_path, index,
                                                                                   max_concurrency, expected):
    """One knob: eval's max_in_flight (12 here, above the HTTP backend's old fixed 8) is the
    requests the server holds at once and its --max-num-seqs; a model.max_concurrency set in the
    config caps the requests (a hosted API's limit) and leaves the server's batch alone."""
    from pipeline.tasks.hotpotqa.questions import load_question_set

    questions = write_questions(tmp_path / "q12.jsonl", load_question_set("offline-eval", limit=12))
    path = eval_config(tmp_path, questions, index, "--standin-latency", "0.5", cpu_threads="all")
    config = yaml.safe_load(path.read_text())
    config["max_in_flight"] = 12
    if max_concurrency is not None:
        config["model"]["max_concurrency"] = max_concurrency
    path.write_text(yaml.safe_dump(config))
    proc = run_pipeline("eval", "--config", str(path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(read_records(tmp_path / "eval" / "react.jsonl")) == 12
    log = server_log(tmp_path)
    assert max(e["in_flight"] for e in log if "in_flight" in e) == expected
    start = next(e for e in log if "argv" in e)
    assert start["argv"][start["argv"].index("--max-num-seqs") + 1] == "12"
    assert start["omp_bind"] == ",".join(map(str, sorted(os.sched_getaffinity(0))))  # serve.cpu_threads: all


def test_cpu_threads_all_binds_vllms_openmp_threads_to_every_cpu_unless_the_environment_says(monkeypatch):
    every = ",".join(map(str, sorted(os.sched_getaffinity(0))))
    monkeypatch.delenv(OMP_BIND, raising=False)
    assert cpu_binding(ServeConfig(cpu_threads="all")) == {OMP_BIND: every}
    assert cpu_binding(ServeConfig(cpu_threads="vllm")) == {}  # vLLM's own: a CPU kept for its scheduler
    assert cpu_binding(ServeConfig(cpu_threads="all", env={OMP_BIND: "0"})) == {}  # serve.env's value is used
    monkeypatch.setenv(OMP_BIND, "1")
    assert cpu_binding(ServeConfig(cpu_threads="all")) == {}  # and so is this process's


def test_a_server_that_never_becomes_healthy_is_a_clear_error_and_is_killed(tmp_path, question_file, index):
    config = eval_config(tmp_path, question_file, index, "--standin-never-healthy", startup_timeout_s=2)
    line = one_error_line(run_pipeline("eval", "--config", str(config)))
    assert "was not healthy within 2 s" in line and "it was stopped" in line and "serve.log" in line
    assert_server_gone(tmp_path)
    assert not (tmp_path / "eval" / "react.jsonl").exists()


def test_a_server_dying_mid_run_fails_the_unit_in_one_line_and_a_rerun_resumes(tmp_path, question_file, index):
    # max_in_flight 1: each question asks twice (Search, then Finish), so after 3 answers one
    # episode is finished and the second is waiting on the request the server dies on.
    config = eval_config(tmp_path, question_file, index, "--standin-die-after", "3")
    line = one_error_line(run_pipeline("eval", "--config", str(config)))
    assert "exited (code 3) mid-run" in line and "re-run the same command to resume" in line, line
    first = read_records(tmp_path / "eval" / "react.jsonl")
    assert len(first) == 1 and first[0]["em"] == 1.0  # no episode recorded as failed by the crash
    assert not (tmp_path / "eval" / "summary.json").exists()

    healthy = eval_config(tmp_path, question_file, index)
    proc = run_pipeline("eval", "--config", str(healthy))
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = read_records(tmp_path / "eval" / "react.jsonl")
    assert records[0] == first[0] and len({r["id"] for r in records}) == len(records) == 4
    assert all(r["em"] == 1.0 for r in records)
    assert_server_gone(tmp_path)


def test_a_port_already_taken_is_refused_before_any_server_starts(tmp_path, question_file, index):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = one_error_line(run_pipeline("eval", "--config", str(eval_config(tmp_path, question_file, index,
                                                                               port=port))))
    assert f"port {port} on 127.0.0.1 is already in use" in line and "serve.port" in line
    assert server_log(tmp_path) == []  # nothing was started


def test_a_server_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path, question_file, index):
    config = eval_config(tmp_path, question_file, index, "--standin-ignore-sigterm", stop_grace_s=1)
    proc = run_pipeline("eval", "--config", str(config))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "still running 1 s after SIGTERM: SIGKILL" in proc.stdout
    assert_server_gone(tmp_path)


def test_an_in_process_vllm_engine_is_shut_down_when_closed(monkeypatch):
    """VLLMBackend.close() shuts the engine core down and runs vLLM's own cleanup (a stand-in
    `vllm` module records the calls: vLLM is not installed here)."""
    import types

    from pipeline.llm.vllm_backend import VLLMBackend

    calls = []

    class Engine:
        def __init__(self, **kwargs):
            core = types.SimpleNamespace(shutdown=lambda: calls.append("engine_core.shutdown"))
            self.llm_engine = types.SimpleNamespace(engine_core=core)

    vllm, distributed = types.ModuleType("vllm"), types.ModuleType("vllm.distributed")
    vllm.LLM = Engine
    distributed.cleanup_dist_env_and_memory = lambda: calls.append("cleanup_dist_env_and_memory")
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.distributed", distributed)
    backend = VLLMBackend(LLMConfig(backend="vllm", model="org/m"))
    backend.close()
    backend.close()  # a second close is a no-op
    assert calls == ["engine_core.shutdown", "cleanup_dist_env_and_memory"] and backend.engine is None


def test_a_killed_eval_takes_its_server_with_it(tmp_path, question_file, index):
    """kill -9 of the eval process: its guardian (pipeline/llm/guardian.py) sees its pipe close and ends
    the server, so no orphan keeps the GPUs and the port (tests/test_vllm_server.py does the same
    to a real vLLM's process tree)."""
    import subprocess

    from episode_testdata import child_env

    config = eval_config(tmp_path, question_file, index, "--standin-never-healthy", startup_timeout_s=120)
    proc = subprocess.Popen([sys.executable, "-m", "pipeline", "eval", "--config", str(config)],
                            env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not [e for e in server_log(tmp_path) if "pid" in e]:
        assert time.monotonic() < deadline and proc.poll() is None, "the stand-in did not start"
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    [pid] = [e["pid"] for e in server_log(tmp_path) if "pid" in e]
    try:
        server = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return  # already gone
    try:
        assert still_live([server], timeout=10) == [], "the server outlived its eval"
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):  # never leave an orphan behind a failure
            server.kill()


@pytest.mark.parametrize("tail, reason", [
    (["usage: api_server.py [-h] ...", "api_server.py: error: unrecognized arguments: --bogus",
      "/usr/lib/python3.11/multiprocessing/resource_tracker.py:254: UserWarning: resource_tracker: leaked"],
     "api_server.py: error: unrecognized arguments: --bogus"),
    (["(APIServer pid=7) INFO 12-02 [api_utils.py:286] non-default args: {}", "Traceback (most recent call last):",
      '  File "x.py", line 1, in <module>', "(APIServer pid=7) ValueError: Loading lora student-lora failed",
      "nanobind: leaked 3 instances!"],
     "(APIServer pid=7) ValueError: Loading lora student-lora failed"),
    (["(EngineCore pid=9) ERROR 12-02 [core.py:1] EngineCore failed to start.", "(EngineCore pid=9) INFO bye"],
     "(EngineCore pid=9) ERROR 12-02 [core.py:1] EngineCore failed to start."),
    (["INFO: loading", "INFO: still loading"], "INFO: still loading"),
])
def test_a_failed_servers_reason_is_the_last_error_line_of_its_log(tmp_path, tail, reason):
    from pipeline.llm.serving import ServerView

    (tmp_path / "serve.log").write_text("\n".join(tail) + "\n")
    assert ServerView("127.0.0.1", 1, tmp_path / "serve.log").failure_reason() == reason


# -- kills and leftovers (tests/test_vllm_kills.py does the same to a real vLLM) --------------------

# A STAND-IN for a server's process tree: a parent (vLLM's API server) and a child that, like
# vLLM's engine core, has no parent-death signal and stays up when its parent is killed.
STANDIN_TREE = ("import subprocess, sys, time; "
                "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']); time.sleep(300)")
# The same tree, both processes ignoring SIGTERM as vLLM's engine core does while it loads the model:
# only a SIGKILL ends it, so the grace period the guardian applies decides when it is gone.
STANDIN_TREE_IGNORING_SIGTERM = (
    "import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "subprocess.Popen([sys.executable, '-c', 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "time.sleep(300)']); time.sleep(300)")
GRACE_S = 60.0  # the guardian's orderly-stop grace in these tests (its default, a scheduler's case)


def start_guardian(tmp_path: Path, port: int, tree: str = STANDIN_TREE) -> tuple:
    """The guardian of a stand-in tree (grace GRACE_S), with its records in tmp_path/servers and
    its output on a pipe: (guardian, the stand-in's parent, its child)."""
    import os
    import subprocess

    from episode_testdata import child_env

    read_fd, write_fd = os.pipe()
    guardian = subprocess.Popen(
        [sys.executable, "-m", "pipeline.llm.guardian", "--status-fd", str(write_fd), "--log", str(tmp_path / "s.log"),
         "--grace", str(GRACE_S), "--records", str(tmp_path / "servers"), "--address", "127.0.0.1", "--port", str(port),
         "--", sys.executable, "-c", tree], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        pass_fds=(write_fd,), env=child_env())
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as status:
        server = psutil.Process(int(status.readline().split()[1]))
    deadline = time.monotonic() + 30
    while not server.children() or not list((tmp_path / "servers").glob("*.json")):
        assert time.monotonic() < deadline, "the stand-in tree did not start"
        time.sleep(0.05)
    return guardian, server, server.children()[0]


def kill_all(*processes: psutil.Process) -> None:
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()


def test_a_server_left_by_a_killed_guardian_is_named_at_the_next_start_and_not_reused(tmp_path, question_file, index):
    """kill -9 of the guardian itself: the kernel kills its direct child (parent-death signal),
    but the child's own child (as vLLM's engine core) lives on, re-parented to init. The next
    eval refuses to start in one line naming the port and PIDs left, leaves them alone, and
    starts once they are gone."""

    records = {"REACT_PIPELINE_SERVERS": str(tmp_path / "servers")}
    guardian, server, child = start_guardian(tmp_path, port=18099)
    try:
        guardian.kill()
        guardian.wait()
        assert still_live([server], timeout=5) == [], "no parent-death signal reached the server"
        time.sleep(0.5)
        assert child.is_running() and child.ppid() != guardian.pid  # the leftover, re-parented
        line = one_error_line(run_pipeline("eval", "--config", str(eval_config(tmp_path, question_file, index)),
                                           env=records))
        assert "left running by an earlier run" in line and "port 18099 on 127.0.0.1" in line, line
        assert f"kill -9 {child.pid}" in line and str(tmp_path / "s.log") in line, line
        assert server_log(tmp_path) == [] and child.is_running()  # nothing started, nothing stopped
    finally:
        kill_all(server, child)
    psutil.wait_procs([child], timeout=5)
    proc = run_pipeline("eval", "--config", str(eval_config(tmp_path, question_file, index)), env=records)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert list((tmp_path / "servers").glob("*.json")) == []  # the stale record went, the new one too


def test_a_sigterm_to_the_guardian_ends_the_tree_without_waiting_out_the_grace_period(tmp_path):
    """A scheduler's SIGTERM to the guardian (grace 60 s) with a tree that ignores SIGTERM (as
    vLLM's engine core while it loads): the guardian SIGKILLs it after its hurried grace
    (HURRY_GRACE_S), not the 60 s one; the tree is gone well within the grace, and so is the
    guardian's record."""
    import signal

    from pipeline.llm.guardian import HURRY_GRACE_S

    guardian, server, child = start_guardian(tmp_path, port=18098, tree=STANDIN_TREE_IGNORING_SIGTERM)
    try:
        started = time.monotonic()
        guardian.send_signal(signal.SIGTERM)
        guardian.wait(timeout=GRACE_S / 2)  # a guardian that waited out the grace fails here
        assert still_live([server, child], timeout=GRACE_S / 2 - (time.monotonic() - started)) == []
        assert f"still running {HURRY_GRACE_S:g} s after SIGTERM: SIGKILL" in guardian.stdout.read()
        assert list((tmp_path / "servers").glob("*.json")) == []
    finally:
        kill_all(server, child)


def test_a_sigterm_during_start_up_ends_a_server_that_ignores_it_within_seconds(tmp_path, question_file, index):
    """vLLM's engine core ignores SIGTERM while it loads the model; with the default 60 s grace
    the server outlived the killed eval by a minute. Now a SIGTERM'd eval's server gets seconds."""
    import signal
    import subprocess

    from episode_testdata import child_env

    config = eval_config(tmp_path, question_file, index, "--standin-never-healthy", "--standin-ignore-sigterm",
                         stop_grace_s=GRACE_S, startup_timeout_s=120)
    proc = subprocess.Popen([sys.executable, "-m", "pipeline", "eval", "--config", str(config)],
                            env=child_env({"REACT_PIPELINE_SERVERS": str(tmp_path / "servers")}),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not [e for e in server_log(tmp_path) if "pid" in e]:
        assert time.monotonic() < deadline and proc.poll() is None, "the stand-in did not start"
        time.sleep(0.05)
    [pid] = [e["pid"] for e in server_log(tmp_path) if "pid" in e]
    server = psutil.Process(pid)
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(timeout=GRACE_S / 2) == 130  # an eval whose server got the 60 s grace fails here
        assert still_live([server], timeout=1) == [], "the server outlived its eval"
        assert time.monotonic() - started < GRACE_S / 2
    finally:
        kill_all(server)


def test_a_sigterm_at_any_moment_of_the_first_seconds_ends_the_eval(tmp_path, question_file, index):
    """SIGTERM at moments spread over an eval's first 3 s (its imports, the server's command, the
    stand-in starting, never healthy): each eval ends within seconds, by the signal or with 130.
    A SIGTERM during `import torch` was once lost (torch's C start-up turns an error in its numpy
    import into a warning) and the eval waited on; the import now comes before the handler, and a
    lost SIGTERM is raised again at the next wait."""
    import signal
    import subprocess

    from episode_testdata import child_env

    config = eval_config(tmp_path, question_file, index, "--standin-never-healthy", startup_timeout_s=120)
    env = child_env({"REACT_PIPELINE_SERVERS": str(tmp_path / "servers")})
    for moment in [0.3 + 0.25 * i for i in range(12)]:
        proc = subprocess.Popen([sys.executable, "-m", "pipeline", "eval", "--config", str(config)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(moment)
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=30)  # a lost SIGTERM: it waits for the stand-in's health for 120 s
        except subprocess.TimeoutExpired:
            code = "still running 30 s after the SIGTERM"
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert code in (130, -signal.SIGTERM), (moment, code, proc.stderr.read()[-2000:])
    assert find_leftovers(tmp_path / "servers") == []  # each stand-in the evals started is gone


# `run`'s own call for a unit's eval (pipeline/stages/grid/children.py: in_child), in a process of its own.
RUN_UNIT = """import sys
from pipeline.core.config import load_config
from pipeline.stages.eval import EvalConfig
from pipeline.stages.grid.children import in_child
in_child("eval", load_config(EvalConfig, sys.argv[1], []))
"""


def test_a_run_killed_outright_while_its_eval_waits_for_the_server_ends_both(tmp_path, question_file, index):
    """`kill -9` of `run` (the OOM killer) while a unit's eval, its child, waits for its server to
    start: the eval waited on for the whole start-up timeout (30 minutes by default, 120 s here),
    the server with it, as nothing had yet written to the pipe whose break would have ended it.
    The kernel now sends the eval SIGTERM when `run` dies (pipeline/core/parent_death.py)."""
    import signal
    import subprocess

    from episode_testdata import child_env

    config = eval_config(tmp_path, question_file, index, "--standin-never-healthy", startup_timeout_s=120)
    run = subprocess.Popen([sys.executable, "-c", RUN_UNIT, str(config)], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, env=child_env({"REACT_PIPELINE_SERVERS": str(tmp_path / "servers")}))
    deadline = time.monotonic() + 60
    while not [e for e in server_log(tmp_path) if "pid" in e]:
        assert time.monotonic() < deadline and run.poll() is None, "the stand-in did not start"
        time.sleep(0.05)
    [pid] = [e["pid"] for e in server_log(tmp_path) if "pid" in e]
    evaluation, server = psutil.Process(run.pid).children()[0], psutil.Process(pid)
    run.send_signal(signal.SIGKILL)
    run.wait()
    try:
        assert still_live([evaluation, server], timeout=15) == [], "the eval or its server outlived `run`"
    finally:
        kill_all(evaluation, server)
    assert find_leftovers(tmp_path / "servers") == []


def test_a_sigterm_whose_exception_is_lost_is_raised_again_and_at_the_end():
    """A Terminated swallowed where the handler raised it (here by an `except KeyboardInterrupt`,
    standing in for C code that clears errors) is raised again by the next check, and at the end
    of the handler's scope when nothing checked; the handler and the flag are then gone."""
    import signal

    from pipeline.llm.serving import Terminated, raise_if_terminated, sigterm_as_interrupt

    def lose_a_sigterm() -> None:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)  # the handler runs here
        except KeyboardInterrupt:
            pass

    with pytest.raises(Terminated), sigterm_as_interrupt():
        lose_a_sigterm()
        raise_if_terminated()
    with pytest.raises(Terminated), sigterm_as_interrupt():
        lose_a_sigterm()
    raise_if_terminated()  # cleared with the scope
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_a_guardian_killed_under_a_running_eval_leaves_nothing_the_eval_does_not_end(tmp_path, question_file, index):
    """kill -9 of the guardian while the eval waits for its stand-in (with a child that, like
    vLLM's engine core, outlives its parent): the kernel kills the stand-in, the eval ends its
    child and stops in one line; the guardian's stale record does not stop the next start."""
    import signal
    import subprocess

    from episode_testdata import child_env

    env = child_env({"REACT_PIPELINE_SERVERS": str(tmp_path / "servers")})
    config = eval_config(tmp_path, question_file, index, "--standin-never-healthy", "--standin-child",
                         startup_timeout_s=120)
    proc = subprocess.Popen([sys.executable, "-m", "pipeline", "eval", "--config", str(config)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not [e for e in server_log(tmp_path) if e.get("child")]:
        assert time.monotonic() < deadline and proc.poll() is None, "the stand-in did not start"
        time.sleep(0.05)
    [entry] = [e for e in server_log(tmp_path) if e.get("child")]
    server, child = psutil.Process(entry["pid"]), psutil.Process(entry["child"])
    [guardian] = [p for p in psutil.Process(proc.pid).children() if "pipeline.llm.guardian" in p.cmdline()]
    try:
        guardian.send_signal(signal.SIGKILL)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 2, err
        [line] = err.strip().splitlines()
        assert line.startswith("error: ") and "guardian was killed (signal 9)" in line, line
        [ended] = [x for x in out.splitlines() if "ended what it left of the server" in x]
        assert f"{child.pid} python" in ended and "still running" not in ended, ended
        assert still_live([server, child], timeout=10) == [], "the stand-in or its child was left"
    finally:
        kill_all(server, child)
    proc = run_pipeline("eval", "--config", str(eval_config(tmp_path, question_file, index)), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
