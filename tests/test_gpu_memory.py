"""Free GPU memory before a train or eval unit starts (pipeline/core/gpu_memory.py, called by `run`).

This machine has no GPU: the tests put a STAND-IN `nvidia-smi` on PATH (a shell script, below)
that answers the two queries the check makes with what a real nvidia-smi prints on an 8 x H100
node (CSV rows, MiB), and one of the processes it lists is real (a `sleep`), so that the line
names it by its command line from /proc as it would a real `vllm serve`. Without nvidia-smi and
without CUDA the check does nothing, as on this machine.

    .venv/bin/python -m pytest tests/test_gpu_memory.py -q
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from pipeline.core import gpu_memory
from pipeline.core.config import build, read_yaml
from pipeline.core.errors import PipelineError
from pipeline.core.gpu_memory import App, GpuNeed, check, parse_apps, parse_gpus

REPO = Path(__file__).resolve().parents[1]
H100_MIB = 81559  # memory.total of an H100 80GB HBM3
IDLE_FREE = 81004  # memory.free of an idle one (the driver reserves the rest)
UUIDS = [f"GPU-6c2f1b0e-4f3a-8d1e-9a7c-0b5d3e2f1a{i:02d}" for i in range(8)]

# The STAND-IN nvidia-smi: the exact arguments pipeline/core/gpu_memory.py passes, answered from files
# the test writes; any other call fails, so a changed query shows here.
NVIDIA_SMI = f"""#!/bin/bash
here=$(dirname "$0")
if [[ "$*" == "{' '.join(gpu_memory.GPU_QUERY)}" ]]; then cat "$here/gpus.csv"
elif [[ "$*" == "{' '.join(gpu_memory.APPS_QUERY)}" ]]; then cat "$here/apps.csv"
else echo "stand-in nvidia-smi: unexpected arguments: $*" >&2; exit 2; fi
"""


def gpus_csv(free: list[int]) -> str:
    return "".join(f"{i}, {UUIDS[i]}, {H100_MIB}, {f}\n" for i, f in enumerate(free))


@pytest.fixture
def node(tmp_path, monkeypatch):
    """A stand-in nvidia-smi on PATH; returns a function that sets what it reports."""
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "nvidia-smi").write_text(NVIDIA_SMI)
    (folder / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def report(free: list[int], apps: str = "") -> None:
        (folder / "gpus.csv").write_text(gpus_csv(free))
        (folder / "apps.csv").write_text(apps)
    report([IDLE_FREE] * 8)
    return report


@pytest.fixture
def teacher():
    """A real process standing for the teacher's `vllm serve` (its worker on GPU 0), and the
    compute-apps rows of an 8-GPU vLLM server at gpu_memory_utilization 0.9 (one worker per GPU)."""
    proc = subprocess.Popen(["sleep", "300"])
    pids = [proc.pid] + [4000001 + i for i in range(7)]  # the other workers: pids not visible here
    rows = "".join(f"{UUIDS[i]}, {pid}, VLLM::Worker_TP{i}, 73402\n" for i, pid in enumerate(pids))
    yield proc.pid, rows
    proc.kill()
    proc.wait()


TRAIN_8B = GpuNeed("training llama-3.1-8b on react", 8, share=gpu_memory.TRAIN_SHARE,
                   why="a training launch expects its GPUs to itself")


def test_a_teacher_left_running_stops_training_in_one_line_naming_it(node, teacher):
    pid, rows = teacher
    node([IDLE_FREE - 73402] * 8, rows)
    with pytest.raises(PipelineError) as err:
        check(TRAIN_8B)
    line = str(err.value)
    assert "\n" not in line
    assert line.startswith("training llama-3.1-8b on react needs 90% of each GPU's memory free on GPU 0-7 "
                           "(a training launch expects its GPUs to itself); GPU 0 has 7.4 of 79.6 GiB free, "
                           "and 7 more GPU(s) are short; ")
    assert f"held by pid {pid} `sleep 300` (71.7 GiB on GPU 0), pid 4000001 `VLLM::Worker_TP1` (71.7 GiB on GPU 1)" in line
    assert " and 5 more: stop it (kill " in line and f"kill {pid} 4000001 " in line and "4000007)" in line


def test_free_gpus_pass_and_a_partly_used_node_passes_only_the_units_that_fit(node):
    check(TRAIN_8B)  # an idle node
    node([IDLE_FREE] * 4 + [20000] * 4, "".join(f"{UUIDS[i]}, 777, python3, 61000\n" for i in range(4, 8)))
    vllm_tp4 = GpuNeed("eval runs/x", 4, share=0.9, why="vLLM")
    check(vllm_tp4)  # GPUs 0-3 are free
    with pytest.raises(PipelineError, match=r"GPU 4 has 19.5 of 79.6 GiB free, and 3 more .*held by pid 777 "
                                            r"`python3` \(238.3 GiB on GPU 4-7\): stop it \(kill 777\)"):
        check(TRAIN_8B)
    # the unit's own CUDA_VISIBLE_DEVICES (a server's env), by index or UUID
    with pytest.raises(PipelineError, match="free on GPU 4-7"):
        check(GpuNeed("eval runs/x", 4, share=0.9, devices="4,5,6,7"))
    check(GpuNeed("eval runs/x", 2, share=0.9, devices=f"{UUIDS[1][:12]},{UUIDS[0]}"))


def test_a_transformers_model_needs_its_weights_free_on_one_gpu(node):
    need = gpu_memory.llm_need("eval runs/x", build_llm(backend="transformers", device="auto"), params_b=70.6)
    assert need.gpus == 1 and need.mib == 134658  # 70.6e9 x 2 bytes, in MiB
    node([IDLE_FREE] * 8)
    with pytest.raises(PipelineError, match=r"needs 131.5 GiB free on GPU 0 \(its weights, 2 bytes per parameter\); "
                                            r"GPU 0 has 79.1 of 79.6 GiB free; nvidia-smi lists no process on it"):
        check(need)
    assert gpu_memory.llm_need("x", build_llm(backend="openai"), params_b=70.6) is None  # served elsewhere
    assert gpu_memory.llm_need("x", build_llm(backend="transformers", device="cpu"), params_b=70.6) is None


def build_llm(**keys):
    from pipeline.llm.config import LLMConfig
    return build(LLMConfig, keys)


def test_nvidia_smi_rows_parse_as_printed():
    assert parse_gpus("0, GPU-a, 81559, 8157\n1, GPU-b, [N/A], [N/A]\n") == [gpu_memory.Gpu(0, "GPU-a", 81559, 8157)]
    assert parse_apps("GPU-a, 12, /usr/bin/python3, 1024\nGPU-a, 13, a, b, c, [N/A]\nNo running processes found\n") == [
        App("GPU-a", 12, "/usr/bin/python3", 1024), App("GPU-a", 13, "a, b, c", None)]


def test_a_device_nvidia_smi_does_not_list_is_not_checked_and_says_so(node, capsys, monkeypatch):
    node([1000] * 8)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-3a1b")
    check(TRAIN_8B)
    assert "not checking free memory: CUDA_VISIBLE_DEVICES=MIG-3a1b" in capsys.readouterr().out


def test_without_gpus_nothing_is_checked(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi; torch here is a CPU build
    assert gpu_memory.query_nvidia_smi() is None

    def no_child(devices):
        raise AssertionError("a machine without CUDA needs no torch child process")
    monkeypatch.setattr(gpu_memory, "query_torch", no_child)
    check(TRAIN_8B)
    check(None)


def test_run_checks_each_unit_when_it_starts(node, teacher, monkeypatch, tmp_path):
    """Through `run`'s own unit actions on the paper grid, the GPU count patched to 8: the 8B's
    training and the 70B's served eval stop before anything is launched or written."""
    from pipeline.stages.grid import children as grid_children
    from pipeline.stages.grid import precision as grid_precision
    from pipeline.stages.grid import spec as grid_spec
    from pipeline.stages.grid.plan import plan as grid_plan
    from pipeline.train import launcher

    monkeypatch.setattr(launcher, "gpu_count", lambda: 8)
    # the 8B trains bf16 under ZeRO-2 on GPUs; on this CPU the precision rule would refuse bf16
    # under DeepSpeed before the unit got as far as its GPUs
    monkeypatch.setattr(grid_precision, "training_precision", lambda ft: "bf16")
    cfg = build(grid_spec.RunConfig, read_yaml(REPO / "configs" / "paper.yaml"))
    units = {u.title: u for u in grid_plan(cfg, [build(grid_spec.Student, s) for s in cfg.students])}
    pid, rows = teacher
    node([IDLE_FREE - 73402] * 8, rows)
    ft = units["train: llama-3.1-8b on react"].config
    ft.output_dir = tmp_path / "8b"
    with pytest.raises(PipelineError, match=rf"^training llama-3.1-8b on react needs 90% .*held by pid {pid} `sleep 300`"):
        grid_children.launch_train(ft)
    assert not (tmp_path / "8b").exists()  # the launch never started (it writes its resolved config first)
    ev = units["eval: llama-3.1-70b fine-tuned on react"].config
    with pytest.raises(PipelineError, match=r"^eval runs/paper/eval/llama-3.1-70b-ft-react needs 90% of each GPU's "
                                            r"memory free on GPU 0-7 \(vLLM starts only"):
        grid_children.evaluate_in_child(ev)
    node([IDLE_FREE] * 8)
    assert grid_children.train_gpu_need(ft).gpus == 8
    monkeypatch.setattr(launcher, "gpu_count", lambda: 0)  # no GPU: the training unit needs none
    assert grid_children.train_gpu_need(ft) is None


class StubServer:
    """STAND-IN for serve_groups.ManagedServer (no vLLM here): start() runs a real process (a
    `sleep`) and makes the stand-in nvidia-smi report it holding 90% of every GPU, as a shared
    `vllm serve` at gpu_memory_utilization 0.9 does once it has started (vLLM fills its share)."""

    started: list[StubServer] = []
    report = None  # the `node` fixture's function

    def __init__(self, cmd, host, port, served_names, log_path, serve):
        self.cmd, self.proc, self.server_pid = cmd, None, None

    def start(self) -> None:
        self.proc = subprocess.Popen(["sleep", "300"])
        self.server_pid = self.proc.pid
        held = int(0.9 * H100_MIB)
        StubServer.report([IDLE_FREE - held] * 8,
                          "".join(f"{UUIDS[i]}, {self.proc.pid}, VLLM::Worker_TP{i}, {held}\n" for i in range(8)))
        StubServer.started.append(self)

    def stop(self, hurry: bool = False) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def paper_grid(node, monkeypatch):
    """The paper grid's plan on a stand-in 8 x H100 node, its shared servers STAND-INs
    (StubServer) and `run`'s child processes recorded (stage, out_dir), not started."""
    from pipeline.llm import serve_groups
    from pipeline.stages.grid import children as grid_children
    from pipeline.stages.grid import precision as grid_precision
    from pipeline.stages.grid import spec as grid_spec
    from pipeline.stages.grid.plan import plan as grid_plan
    from pipeline.train import launcher

    monkeypatch.setattr(launcher, "gpu_count", lambda: 8)
    monkeypatch.setattr(grid_precision, "training_precision", lambda ft: "bf16")
    monkeypatch.setattr(serve_groups, "ManagedServer", StubServer)
    monkeypatch.setattr(StubServer, "report", staticmethod(node))
    monkeypatch.setattr(StubServer, "started", [])
    children = []
    monkeypatch.setattr(grid_children, "in_child", lambda stage, config: children.append((stage, str(config.out_dir))))

    def plan(**changes) -> tuple[list, list]:
        cfg = build(grid_spec.RunConfig, read_yaml(REPO / "configs" / "paper.yaml"))
        for key, value in changes.items():
            setattr(cfg, key, value)
        return grid_plan(cfg, [build(grid_spec.Student, s) for s in cfg.students]), children
    return plan


def test_a_unit_on_its_groups_shared_server_is_not_stopped_by_that_servers_own_memory(node, teacher, paper_grid):
    """The paper grid's 70B prompted eval shares one `vllm serve` (0.9 of all 8 GPUs) with its LoRA
    students: the group checks its need once, before the server starts, and the unit attached to
    it does not check again (it would find the group's own server holding the memory)."""
    from pipeline.llm import serve_groups
    from pipeline.stages.grid import children as grid_children

    units, children = paper_grid()
    prompted = next(u for u in units if u.title == "eval: llama-3.1-70b prompted")
    assert prompted.group is not None and len(prompted.group.members) == 5  # prompted + 4 LoRA students

    pid, rows = teacher  # before the group's server starts, another process holds the GPUs: refused
    node([IDLE_FREE - 73402] * 8, rows)
    with pytest.raises(PipelineError, match=rf"^shared server #\d+ for meta-llama/Llama-3.1-70B needs 90% of each "
                                            rf"GPU's memory free on GPU 0-7 .*held by pid {pid} `sleep 300`"):
        prompted.action(prompted.config)
    assert StubServer.started == [] and children == []  # nothing started

    node([IDLE_FREE] * 8)
    with serve_groups.running([prompted]):
        prompted.action(prompted.config)
        assert len(StubServer.started) == 1  # its server now holds 90% of every GPU
        assert children == [("eval", "runs/paper/eval/llama-3.1-70b-prompt")]
        with pytest.raises(PipelineError, match=rf"held by pid {StubServer.started[0].server_pid} "):
            grid_children.evaluate_in_child(prompted.config)  # the same unit NOT attached to the server: checked


def test_a_rounds_generate_on_the_server_it_shares_with_the_last_rounds_eval_is_not_stopped_by_it(
        node, paper_grid, tmp_path):
    """Round 3's teacher is round 2's 70B LoRA student, served by the server round 2's eval started:
    its generate, attached to it, does not check the GPUs that server holds."""
    from pipeline.core.storage import write_manifest
    from pipeline.llm import serve_groups
    from pipeline.rounds import SelfTrainingConfig

    units, children = paper_grid(out_dir=tmp_path / "paper", train={"output_root": str(tmp_path / "checkpoints")},
                                 self_training=SelfTrainingConfig(rounds=3, formats=["react"], students=["llama-3.1-70b"]))
    generate = next(u for u in units if u.title.startswith("generate (round 3): llama-3.1-70b"))
    assert [m.title for m in generate.group.members] == ["eval (round 2): llama-3.1-70b on react", generate.title]
    final = Path(generate.serves[1])  # round 2's student, trained (a LoRA adapter folder)
    assert final.is_relative_to(tmp_path)
    final.mkdir(parents=True)
    (final / "adapter_config.json").write_text('{"r": 64}')
    write_manifest(final / "manifest.json", stage="train", config={}, complete=True)
    with serve_groups.running([generate]):
        generate.action(generate.config)
    assert len(StubServer.started) == 1 and children == [("generate", str(generate.config.out_dir))]


def test_runs_round_one_generate_loads_its_teacher_in_a_child_process_as_its_plan_says(node, monkeypatch, tmp_path):
    """An in-process teacher (vLLM engine, transformers model) left loaded in `run` would hold the
    GPUs the next unit's check wants free: round 1's generate runs in its own `python -m pipeline
    generate` process (as the rounds' do), after its GPU check, and the plan line says so truly."""
    from pipeline.stages.grid import children as grid_children
    from pipeline.stages.grid import precision as grid_precision
    from pipeline.stages.grid import spec as grid_spec
    from pipeline.stages.grid.plan import plan as grid_plan
    from pipeline.train import launcher

    monkeypatch.setattr(launcher, "gpu_count", lambda: 8)
    monkeypatch.setattr(grid_precision, "training_precision", lambda ft: "bf16")
    children, in_process = [], []
    monkeypatch.setattr(grid_children, "in_child", lambda stage, config: children.append(stage))
    monkeypatch.setattr(grid_children, "generate", lambda config: in_process.append(config), raising=False)  # what run called in-process
    cfg = build(grid_spec.RunConfig, read_yaml(REPO / "configs" / "paper.yaml"))
    cfg.out_dir = tmp_path / "paper"
    cfg.generate["teacher"] = {"backend": "vllm", "model": "meta-llama/Llama-3.1-405B-Instruct-FP8",
                               "tensor_parallel_size": 8}
    units = {u.title: u for u in grid_plan(cfg, [build(grid_spec.Student, s) for s in cfg.students])}
    gen = units["generate: the teacher writes trajectories"]
    # the plan names the interpreter that has vLLM where this one has none (pipeline/llm/interpreter.py)
    assert re.search(r"in its own process( under \S+/python)?$", gen.needs), gen.needs
    node([IDLE_FREE - 73402] + [IDLE_FREE] * 7)  # GPU 0 held: the check comes first
    with pytest.raises(PipelineError, match=r"^generate .* needs 90% of each GPU's memory free on GPU 0-7"):
        gen.action(gen.config)
    node([IDLE_FREE] * 8)
    gen.action(gen.config)
    assert children == ["generate"] and in_process == []


class StandInGroup:
    """STAND-IN for a shared server's group (pipeline/llm/serve_groups.py), labelled as such: its
    server is the real `sleep` process the stand-in nvidia-smi lists on GPU 0; stopping the group
    ends that process, as the run stops its shared server when a unit fails."""

    def __init__(self, proc: subprocess.Popen):
        self.proc, self.members = proc, []

    def stop(self, hurry: bool = False) -> None:
        self.proc.kill()
        self.proc.wait()


def test_after_a_failed_member_the_advice_names_no_server_the_run_has_stopped(node, teacher):
    """A member that could not use its group's server (e.g. its adapter was missing when it
    started) found that server holding the GPU; the run stopped the server on the failure, and
    its line still said `kill <the server's pid>`."""
    from types import SimpleNamespace

    from pipeline.stages.run import run_units

    pid, rows = teacher
    server = subprocess.Popen(["sleep", "300"])  # the group's server: its worker holds GPU 1
    rows = rows.replace(", 4000001,", f", {server.pid},")
    node([IDLE_FREE - 73402] * 8, rows)
    need = GpuNeed("eval runs/x/eval/b-ft-react", 3, share=0.9, why="vLLM")  # GPU 2's holder: not visible here
    unit = SimpleNamespace(title="eval: b fine-tuned on react", selected=True, config=None,
                           group=StandInGroup(server), action=lambda config: check(need))
    unit.group.members = [unit]
    with pytest.raises(PipelineError) as err:
        run_units([unit])
    line = str(err.value)
    assert f"pid {server.pid} `sleep 300`" in line  # what held the GPU when the unit was refused
    assert f"stop the rest (kill {pid} 4000002; 1 of them ended since (this run stopped its own server))" in line, line
    assert str(server.pid) not in line.split("stop the rest")[1]
    # the holder not of this run (the teacher left running) is still advised killed, alone
    node([IDLE_FREE - 73402] * 8, rows.splitlines(keepends=True)[0])
    with pytest.raises(PipelineError, match=rf"stop it \(kill {pid}\) or wait for it to end"):
        run_units([SimpleNamespace(title="eval", selected=True, config=None, action=lambda config: check(need))])
