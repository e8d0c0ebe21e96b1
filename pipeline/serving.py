"""A `vllm serve` process managed by the pipeline for one unit: start, wait until healthy, hand
the unit an OpenAI-compatible LLMConfig pointing at it, stop it, wait until it has exited.

    eval:
      model: {backend: vllm, model: meta-llama/Llama-3.1-70B, tensor_parallel_size: 8}
      serve:
        command: [/opt/vllm/bin/vllm, serve]   # vLLM pins its own torch: its own environment
        port: 8100

The model's own settings (tensor parallel size, GPU memory fraction, max context, dtype) come
from its `model` section and become `vllm serve` flags; a LoRA student is served as
`--enable-lora --lora-modules NAME=PATH --max-lora-rank R` (R from the adapter's own
adapter_config.json) and addressed by NAME in each request's `model` field; a full fine-tune is
served from its `final/` folder. A server that dies mid-run stops the unit (ServerGone) instead
of letting every waiting episode be recorded as failed; the next run resumes.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.llm.base import Completion, GenerationRequest
from pipeline.llm.config import LLMConfig

# vLLM accepts only these values for --max-lora-rank (vllm/config LoRAConfig: possible_max_ranks;
# older releases stop at 64 or 256, newer ones add 320 and 512).
VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
LORA_NAME = "student-lora"  # the name a served adapter answers to in the `model` field


@dataclass
class ServeConfig:
    # The command that takes the model as its first argument: `vllm serve` in vLLM's own environment
    # (e.g. [/opt/vllm/bin/vllm, serve] or [/opt/vllm/bin/python, -m, vllm.entrypoints.cli.main, serve]).
    command: list[str] = field(default_factory=lambda: ["vllm", "serve"])
    host: str = "127.0.0.1"
    port: int = 8100  # 0 = any free port
    startup_timeout_s: float = 1800.0  # loading a 70B model and capturing CUDA graphs takes minutes
    stop_grace_s: float = 60.0  # SIGTERM, then SIGKILL after this long
    extra_args: list[str] = field(default_factory=list)  # more `vllm serve` flags, e.g. [--enforce-eager]
    env: dict = field(default_factory=dict)  # extra environment variables, e.g. {CUDA_VISIBLE_DEVICES: "0,1"}


class ServerGone(BaseException):  # noqa: N818 (a signal to stop, like KeyboardInterrupt)
    """The managed server exited while the unit was using it. A BaseException on purpose: the
    episode runner turns any Exception of a backend into one episode's error record, and a dead
    server must stop the run instead, so that no episode is recorded as failed because of it."""


def serve_command(llm: LLMConfig, serve: ServeConfig, port: int) -> tuple[list[str], str]:
    """The `vllm serve` command for `llm` (an in-process description: model, adapter, settings)
    and the name to put in each request's `model` field."""
    if not serve.command:
        raise PipelineError("serve.command is empty; give the command that runs `vllm serve`, e.g. [vllm, serve]")
    served_name = llm.label
    cmd = [*serve.command, llm.model, "--host", serve.host, "--port", str(port),
           "--served-model-name", served_name, "--tensor-parallel-size", str(llm.tensor_parallel_size),
           "--gpu-memory-utilization", str(llm.gpu_memory_utilization), "--dtype", llm.dtype,
           "--enable-prefix-caching"]  # every prompt starts with the same exemplars
    if llm.max_context:
        cmd += ["--max-model-len", str(llm.max_context)]
    if llm.trust_remote_code:
        cmd += ["--trust-remote-code"]
    cmd += extra_flags(llm.extra)
    if llm.adapter:
        cmd += ["--enable-lora", "--lora-modules", f"{LORA_NAME}={llm.adapter}"]
        if "max_lora_rank" not in llm.extra:  # a rank the user set is already among the extra flags
            cmd += ["--max-lora-rank", str(max_lora_rank(Path(llm.adapter)))]
        served_name = LORA_NAME
    return cmd + [str(a) for a in serve.extra_args], served_name


def extra_flags(extra: dict) -> list[str]:
    """The in-process engine's extra kwargs (llm.extra, e.g. enforce_eager, max_num_seqs) as the
    same `vllm serve` flags, so one model section describes both ways of running it."""
    flags = []
    for key, value in extra.items():
        flag = "--" + str(key).replace("_", "-")
        if value is True:
            flags.append(flag)
        elif value not in (False, None):
            flags += [flag, json.dumps(value) if isinstance(value, dict | list) else str(value)]
    return flags


def max_lora_rank(adapter: Path) -> int:
    """The smallest rank vLLM accepts that holds the adapter's own rank (`r`, and any larger
    per-module rank in `rank_pattern`), read from its adapter_config.json."""
    path = adapter / "adapter_config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
        ranks = [int(config["r"]), *(int(r) for r in (config.get("rank_pattern") or {}).values())]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PipelineError(f"{path}: cannot read the adapter's rank ({type(exc).__name__}: {exc}); "
                            "is it a PEFT LoRA adapter folder?") from None
    rank = max(ranks)
    fitting = [r for r in VLLM_LORA_RANKS if r >= rank]
    if not fitting:
        raise PipelineError(f"{path}: LoRA rank {rank} is above vLLM's largest --max-lora-rank "
                            f"({VLLM_LORA_RANKS[-1]}); merge the adapter and serve the full model")
    return fitting[0]


def check_port_free(host: str, port: int) -> None:
    """Refuse before starting: a second server on a taken port would fail after loading the
    model for minutes, or (worse) the unit would talk to whatever already listens there."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PipelineError(f"serve: port {port} on {host} is already in use (another server?); "
                                    "stop it, or set serve.port to a free port (0 = any)") from None
            raise PipelineError(f"serve: cannot listen on {host}:{port} ({exc.strerror}); "
                                "set serve.host / serve.port") from None


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def own_session_dying_with_parent() -> None:
    """In the server's child before exec: its own session, so that stop() can signal the server
    and every worker it starts as one group (and a Ctrl-C reaches only the unit, which stops it
    in order); and on Linux a SIGTERM when the unit's process dies, even by SIGKILL, so that no
    orphaned server keeps the GPUs (and the port) after a killed run."""
    os.setsid()
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


class ManagedServer:
    """One server process: `start()` returns once GET /health answers 200 and /v1/models lists
    the served name; `stop()` ends the whole process group and waits until it has exited."""

    def __init__(self, cmd: list[str], host: str, port: int, served_name: str, log_path: Path,
                 serve: ServeConfig):
        self.cmd, self.host, self.port, self.served_name = cmd, host, port, served_name
        self.log_path, self.serve = log_path, serve
        self.proc: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self) -> None:
        check_port_free(self.host, self.port)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        print(f"[serve] starting: {' '.join(self.cmd)} (log: {self.log_path})", flush=True)
        with open(self.log_path, "ab") as log:
            try:
                self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, preexec_fn=own_session_dying_with_parent,
                                             env={**os.environ, **{k: str(v) for k, v in self.serve.env.items()}})
            except OSError as exc:
                raise PipelineError(f"serve.command {self.cmd[0]!r} cannot be started ({exc.strerror}); "
                                    "give the `vllm serve` of vLLM's environment, e.g. [/opt/vllm/bin/vllm, serve]") from None
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise

    def _wait_healthy(self) -> None:
        started = time.monotonic()
        deadline = started + self.serve.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise PipelineError(f"serve: the server exited with code {self.proc.returncode} before it was "
                                    f"healthy; last log line: {self.last_log_line()} (log: {self.log_path})")
            if self._get("/health") == 200 and self.served_name in self._served_models():
                print(f"[serve] healthy at {self.base_url} after {time.monotonic() - started:.0f} s", flush=True)
                return
            time.sleep(0.2)
        raise PipelineError(f"serve: the server at {self.base_url} was not healthy within "
                            f"{self.serve.startup_timeout_s:g} s (serve.startup_timeout_s); it was stopped; "
                            f"last log line: {self.last_log_line()} (log: {self.log_path})")

    def _get(self, path: str) -> int | None:
        try:
            with urllib.request.urlopen(f"http://{self.host}:{self.port}{path}", timeout=5) as response:
                self._body = response.read()
                return response.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except (OSError, ValueError):  # not listening yet, reset, timed out
            return None

    def _served_models(self) -> list[str]:
        if self._get("/v1/models") != 200:
            return []
        try:
            data = json.loads(self._body).get("data") or []
            return [str(m.get("id")) for m in data if isinstance(m, dict)]
        except (ValueError, AttributeError):
            return []

    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def stop(self) -> None:
        """SIGTERM to the server's process group, SIGKILL after `stop_grace_s`, then wait until
        every process of it has exited (its GPU memory is free only then)."""
        if self.proc is None:
            return
        import psutil

        try:
            root = psutil.Process(self.proc.pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            tree = []
        self._signal(tree, signal.SIGTERM)
        if not self._gone(tree, self.serve.stop_grace_s):
            print(f"[serve] still running {self.serve.stop_grace_s:g} s after SIGTERM: SIGKILL", flush=True)
            self._signal(tree, signal.SIGKILL)
            if not self._gone(tree, 30):
                raise PipelineError(f"serve: server process {self.proc.pid} survived SIGKILL; stop it by hand")
        print(f"[serve] stopped (exit code {self.proc.returncode})", flush=True)

    def _signal(self, tree: list, sig: int) -> None:
        import psutil

        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)
        for process in tree:  # a worker that left the group would keep its GPU memory
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(sig)

    def _gone(self, tree: list, timeout_s: float) -> bool:
        import psutil

        deadline = time.monotonic() + timeout_s
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
        _, alive = psutil.wait_procs(tree, timeout=max(deadline - time.monotonic(), 0.1))
        return not alive

    def last_log_line(self) -> str:
        try:
            lines = self.log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return lines[-1][-300:] if lines else "(empty log)"


class ServedLLM:
    """The OpenAI-compatible backend over a managed server, checking after each call that the
    server is still alive: if it died, the call's error completions are not handed on."""

    def __init__(self, inner, server: ManagedServer):
        self.inner, self.server, self.name = inner, server, inner.name

    def generate(self, requests: list[GenerationRequest]) -> list[list[Completion]]:
        self._check_alive()
        out = self.inner.generate(requests)
        self._check_alive()
        return out

    def _check_alive(self) -> None:
        code = self.server.exit_code()
        if code is not None:
            raise ServerGone(f"the served model's server exited (code {code}) mid-run; last log line: "
                             f"{self.server.last_log_line()} (log: {self.server.log_path}); finished episodes "
                             "are kept: re-run the same command to resume")

    def __getattr__(self, name: str):  # the backend's own attributes (max_concurrency, base_url, ...)
        return getattr(self.inner, name)


@contextlib.contextmanager
def served(llm: LLMConfig, serve: ServeConfig, log_path: Path) -> Iterator[tuple[LLMConfig, ManagedServer]]:
    """Start `vllm serve` for `llm` (backend vllm or transformers: a model to load), yield the
    OpenAI-compatible LLMConfig that reaches it and the server; stop it on the way out."""
    if llm.backend == "openai":
        raise PipelineError(f"serve: model '{llm.model}' is already an OpenAI-compatible endpoint "
                            f"({llm.base_url}); drop `serve` or set model.backend: vllm")
    port = serve.port or free_port(serve.host)
    cmd, served_name = serve_command(llm, serve, port)
    server = ManagedServer(cmd, serve.host, port, served_name, log_path, serve)
    server.start()
    try:
        yield replace(llm, backend="openai", base_url=server.base_url, model=served_name, adapter=None,
                      name=llm.label, extra={}), server
    finally:
        server.stop()
