"""The GPU path's own checks, in one run on one CUDA GPU (an H100 or H200): what the CPU rehearsal
cannot show. One line per check, PASS / FAIL / SKIP with the reason; exit 1 on any FAIL.

    bash scripts/gpu_checks/gather_wheels.sh          # here: carry/1, carry/2 (each under what one call carries)
    python scripts/gpu_checks/device_check.py --install scripts/gpu_checks/carry/1 --only environment  # GPU, call 1
    python scripts/gpu_checks/device_check.py --install scripts/gpu_checks/carry/2    # GPU, call 2: every check

The checks, each on a tiny random model of Llama 3.1 8B's architecture (pipeline/rehearsal/models.py,
made on the GPU machine from SmolLM2's tokenizer, which --prepare copies: nothing is downloaded):
  environment   torch, CUDA, the GPU, bf16, and which of the libraries below import here
  sft-sdpa      `python -m pipeline train` (accelerate launch -m pipeline.finetune) on CUDA, bf16, SDPA
  sft-flash     the same under `attn_implementation: auto` where a flash kernel loads (else SKIP, why)
  zero3         the same under DeepSpeed ZeRO-3 on one rank over NCCL (deepspeed_zero3, 1 process)
  lora          LoRA on the frozen bf16 base (single_gpu)
  packing       scripts/gpu_checks/packing_flash.py (packed rows vs one by one, per kernel)
  eval          the transformers backend on CUDA: the LoRA student's final/ loaded as `eval` loads it
                (base + adapter, pipeline.llm.factory.load_llm), greedy answers to a batch of prompts
  gpu-memory    pipeline/core/gpu_memory.py against the real nvidia-smi: its totals against torch's,
                an idle GPU passes, and a GPU this process fills is refused naming this process
A machine without CUDA runs the environment line and SKIPs the rest, saying so (the fast test
tests/test_device_check.py runs it so).

What the GPU machine lacks is carried: gather_wheels.sh downloads the wheels of TRL, datasets,
DeepSpeed and what they need beside torch, transformers, accelerate and PEFT, at the tested
versions (constraints.txt), into parts of at most 60 MiB, and has --prepare write SmolLM2's
tokenizer (3.5 MB) into the first. --install puts a part's wheels and tokenizer into .gpu-deps/
(gitignored), which this script puts on every process's path: a part installed by an earlier
call on the same machine stays there.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # the repository's pipeline/, not an installed one
DEPS = REPO / ".gpu-deps"  # where --install puts the carried wheels (gitignored)
if DEPS.is_dir():
    sys.path.insert(1, str(DEPS))
STUDENT = "meta-llama/Llama-3.1-8B"  # the architecture of the tiny student
LIBRARIES = ("transformers", "accelerate", "peft", "trl", "datasets", "deepspeed", "flash_attn", "kernels")
CHECKS = ("environment", "sft-sdpa", "sft-flash", "zero3", "lora", "packing", "eval", "gpu-memory")
STEPS = 4
LAUNCH_TIMEOUT = 300  # seconds per training launch (a tiny model: well under a minute once loaded)


class Skip(Exception):
    """A check that cannot run here, with the reason."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prepare", type=Path, metavar="DIR", help="write what the GPU machine lacks into DIR, then exit")
    parser.add_argument("--install", type=Path, metavar="DIR", help="install DIR's wheels into .gpu-deps/, then run the checks")
    parser.add_argument("--tokenizer", type=Path, metavar="DIR", help="SmolLM2's tokenizer (default: the --install or "
                        "prepared folder's tokenizer/, else the embedded model's)")
    parser.add_argument("--only", nargs="+", choices=CHECKS, help="these checks only (default: all)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/react-device-check"), help="scratch folder (emptied first)")
    args = parser.parse_args(argv)
    if args.prepare:
        prepare(args.prepare)
        return 0
    if args.install:
        install(args.install)
    tokenizer = args.tokenizer or (DEPS / "tokenizer" if (DEPS / "tokenizer" / "tokenizer.json").is_file() else None)
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    failed = 0
    for name in args.only or CHECKS:
        started = time.monotonic()
        try:
            status, detail = "PASS", CHECK_FUNCTIONS[name](args.work, tokenizer)
        except Skip as skip:
            status, detail = "SKIP", str(skip)
        except Exception as exc:  # a check's failure is its line, and the next check still runs
            status, detail = "FAIL", f"{type(exc).__name__}: {one_line(str(exc))}"
            failed += 1
        print(f"CHECK {name:<11} {status} ({time.monotonic() - started:.0f} s) {detail}", flush=True)
    return 1 if failed else 0


def one_line(text: str, limit: int = 600) -> str:
    text = " | ".join(line.strip() for line in text.strip().splitlines()[-4:] if line.strip())
    return text[-limit:]


# ----------------------------------------------------------------------------- what is carried

def prepare(folder: Path) -> None:
    """SmolLM2's tokenizer (from the embedded model's package) into <folder>/tokenizer."""
    from transformers import AutoTokenizer

    from pipeline.hub.smollm2 import local_smollm2_dir

    AutoTokenizer.from_pretrained(local_smollm2_dir()).save_pretrained(folder / "tokenizer")
    size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**20
    print(f"prepared {folder}: {size:.1f} MiB in all (the wheels: bash scripts/gpu_checks/gather_wheels.sh)")


def install(folder: Path) -> None:
    """Every wheel (and DeepSpeed's source archive) in `folder` into .gpu-deps/, without the
    network and without their dependencies (the gathered set is what is missing), and the
    folder's tokenizer/ beside them: a later call finds both there without carrying them again."""
    if (folder / "tokenizer").is_dir():
        shutil.copytree(folder / "tokenizer", DEPS / "tokenizer", dirs_exist_ok=True)
    archives = sorted([*folder.glob("*.whl"), *folder.glob("*.tar.gz")])
    if not archives:
        print(f"install: no wheels in {folder}", flush=True)
        return
    env = {**os.environ, "DS_BUILD_OPS": "0"}  # DeepSpeed from source: no ops compiled now (JIT later)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--no-build-isolation",
                    "--target", str(DEPS), "--upgrade", *map(str, archives)], check=True, env=env)
    print(f"install: {len(archives)} archive(s) from {folder} into {DEPS}", flush=True)


def child_env() -> dict[str, str]:
    """The launched processes' environment: this repository and .gpu-deps/ on the path, offline."""
    paths = [str(REPO), *([str(DEPS)] if DEPS.is_dir() else []), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p), "HF_HUB_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}


def missing(names=LIBRARIES) -> list[str]:
    import importlib.util
    return [n for n in names if importlib.util.find_spec(n) is None]


def need_cuda() -> None:
    import torch
    if not torch.cuda.is_available():
        raise Skip("no CUDA device here (torch.cuda.is_available() is False)")


def need(*modules: str) -> None:
    absent = missing(modules)
    if absent:
        raise Skip(f"{', '.join(absent)} not installed here (carry the wheels: scripts/gpu_checks/gather_wheels.sh, "
                   "then --install)")


# ----------------------------------------------------------------------------- the checks

def check_environment(work: Path, tokenizer: Path | None) -> str:
    import torch
    absent = missing()
    libs = f"missing: {', '.join(absent)}" if absent else "every library imports"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__}, no CUDA device; {libs}"
    name = torch.cuda.get_device_name(0)
    return (f"torch {torch.__version__} (CUDA {torch.version.cuda}), {torch.cuda.device_count()} x {name}, "
            f"capability {torch.cuda.get_device_capability(0)}, bf16 {torch.cuda.is_bf16_supported()}; {libs}")


def tiny_student(work: Path, tokenizer: Path | None) -> Path:
    from pipeline.rehearsal.models import tiny_model
    if tokenizer is None:
        from pipeline.hub.smollm2 import local_smollm2_dir
        try:
            local_smollm2_dir()
        except Exception as exc:
            raise Skip(f"no tokenizer: pass --tokenizer, or --install a folder --prepare wrote ({exc})") from None
    return tiny_model(STUDENT, work / "models", tokenizer)


def sft_dataset(work: Path) -> Path:
    """The project's own six ReAct exemplars as an SFT dataset (docs/formats.md), rendered as
    `filter` renders them: <work>/sft/react/train.jsonl with its manifest."""
    from pipeline.core.storage import write_manifest
    from pipeline.core.trajectory import Trajectory, render

    folder = work / "sft" / "react"
    if (folder / "manifest.json").is_file():
        return folder.parent
    folder.mkdir(parents=True)
    rows = json.loads((REPO / "pipeline" / "methods" / "exemplars" / "react.json").read_text(encoding="utf-8"))
    with open(folder / "train.jsonl", "w", encoding="utf-8") as out:
        for row in rows:
            traj = Trajectory.from_dict(row["trajectory"])
            rendered = render(traj)
            out.write(json.dumps({"id": row["id"], "question": traj.question, "method": "react",
                                  "prompt": rendered.prompt, "completion": rendered.completion,
                                  "observation_spans": [list(s) for s in rendered.observation_spans],
                                  "answer": row["gold_answer"], "source": "exemplar"}) + "\n")
    write_manifest(folder / "manifest.json", stage="filter", config={"device_check": True}, complete=True,
                   counts={"kept": len(rows)})
    return folder.parent


def train(work: Path, tokenizer: Path | None, name: str, *overrides: str) -> tuple[Path, str]:
    """`python -m pipeline train` of the tiny student on CUDA in bf16; (final/, the launch's output)."""
    need_cuda()
    need("trl", "datasets", "peft", "accelerate")
    cmd = train_command(work, tiny_student(work, tokenizer), name, *overrides)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT, env=child_env(), cwd=REPO)
    log = done.stdout + done.stderr
    (work / f"{name}.log").write_text(log)
    if done.returncode != 0:
        raise RuntimeError(f"exit {done.returncode}: {one_line(log)}")
    final = next((work / "ck" / name).glob("*/react/final"))
    manifest = json.loads((final / "manifest.json").read_text())
    if manifest.get("precision") != "bf16":
        raise RuntimeError(f"final/ says precision {manifest.get('precision')!r}, not bf16")
    return final, log


def train_command(work: Path, student: Path, name: str, *overrides: str) -> list[str]:
    """The `train` command of one check: STEPS steps of batch 4 in bf16 on one GPU, saved at step 2 and 4."""
    return [sys.executable, "-m", "pipeline", "train", f"student={student}", "format=react",
            f"dataset_dir={sft_dataset(work)}", f"output_root={work / 'ck'}", f"experiment={name}", "size_class=8b",
            "global_batch_size=4", f"max_steps={STEPS}", "learning_rate=1e-4", "precision=bf16", "save_steps=2",
            "logging_steps=1", "report_to=none", "accelerate_config=single_gpu", *overrides]


def said(log: str, start: str) -> str:
    """The first line of the launch's output that starts with `start` (its plan's words)."""
    return next((ln.strip() for ln in log.splitlines() if ln.strip().startswith(start)), f"(no '{start}' line)")


def losses(final: Path) -> list[float]:
    state = json.loads((final.parent / f"checkpoint-{STEPS}" / "trainer_state.json").read_text())
    values = [e["loss"] for e in state["log_history"] if "loss" in e]
    if len(values) != STEPS or not all(v == v and v < 1e4 for v in values):
        raise RuntimeError(f"losses {values}: not {STEPS} finite values")
    return values


def check_sft_sdpa(work: Path, tokenizer: Path | None) -> str:
    final, log = train(work, tokenizer, "sft-sdpa", "attn_implementation=sdpa")
    return f"losses {[f'{v:.3f}' for v in losses(final)]}; {said(log, '[finetune] attention')}"


def check_sft_flash(work: Path, tokenizer: Path | None) -> str:
    need_cuda()
    import torch

    from pipeline.train.speed import choose_attention, installed_kernels
    chosen, why = choose_attention("auto", installed_kernels(), True)
    if chosen == "sdpa":
        raise Skip(f"no flash kernel loads here: {why} (capability {torch.cuda.get_device_capability(0)})")
    final, log = train(work, tokenizer, "sft-flash", "attn_implementation=auto")
    return f"{chosen}; losses {[f'{v:.3f}' for v in losses(final)]}; {said(log, '[finetune] batch')}"


def check_zero3(work: Path, tokenizer: Path | None) -> str:
    need("deepspeed")
    final, log = train(work, tokenizer, "zero3", "accelerate_config=deepspeed_zero3", "num_processes=1")
    if "zero3" not in log:
        raise RuntimeError("the launch never said zero3")
    return f"losses {[f'{v:.3f}' for v in losses(final)]}; {said(log, '[finetune] launch')}"


def check_lora(work: Path, tokenizer: Path | None) -> str:
    final, log = train(work, tokenizer, "lora", "finetuning=lora", "attn_implementation=sdpa")
    if not (final / "adapter_config.json").is_file():
        raise RuntimeError(f"{final} holds no adapter")
    return f"adapter saved; losses {[f'{v:.3f}' for v in losses(final)]}; {said(log, '[precision] weights')}"


def check_packing(work: Path, tokenizer: Path | None) -> str:
    need_cuda()
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_checks" / "packing_flash.py")],
                          capture_output=True, text=True, timeout=LAUNCH_TIMEOUT, env=child_env(), cwd=REPO)
    lines = [ln.strip() for ln in done.stdout.splitlines() if ln.strip()]
    if done.returncode != 0:
        raise RuntimeError(f"exit {done.returncode}: {one_line(done.stdout + done.stderr)}")
    return " | ".join(lines[-6:])


def check_eval(work: Path, tokenizer: Path | None) -> str:
    """The LoRA student as `eval` loads it (base + adapter) on CUDA, answering a batch greedily."""
    need_cuda()
    finals = list((work / "ck" / "lora").glob("*/react/final"))
    if not finals:
        raise Skip("no LoRA student to load (the lora check did not run or failed)")
    from pipeline.llm.base import GenerationRequest
    from pipeline.llm.config import LLMConfig
    from pipeline.llm.factory import load_llm

    student = tiny_student(work, tokenizer)
    llm = load_llm(LLMConfig(backend="transformers", model=str(student), adapter=str(finals[0]), device="cuda"))
    requests = [GenerationRequest(prompt=f"Question: what is {i} plus {i}?\nThought 1:", max_new_tokens=8)
                for i in range(4)]
    answers = llm.generate(requests)
    if len(answers) != len(requests):
        raise RuntimeError(f"{len(answers)} answers to {len(requests)} requests")
    model = getattr(llm, "model", None)
    where = f"{next(model.parameters()).device}, {next(model.parameters()).dtype}" if model is not None else "?"
    return f"{len(answers)} answers on {where}"


def check_gpu_memory(work: Path, tokenizer: Path | None) -> str:
    need_cuda()
    import torch

    from pipeline.core import gpu_memory
    from pipeline.core.errors import PipelineError

    found = gpu_memory.query_nvidia_smi()
    if not found or not found[0]:
        raise RuntimeError("nvidia-smi gave no GPU")
    gpus, _ = found
    free, total = torch.cuda.mem_get_info(0)
    if abs(gpus[0].total_mib - (total >> 20)) > 0.02 * (total >> 20):
        raise RuntimeError(f"nvidia-smi says {gpus[0].total_mib} MiB, torch {total >> 20} MiB")
    gpu_memory.check(gpu_memory.GpuNeed("device check (idle)", 1, share=0.5))
    held = torch.empty(int(free * 0.7), dtype=torch.uint8, device="cuda")  # this process takes 70% of it
    try:
        gpu_memory.check(gpu_memory.GpuNeed("device check (held)", 1, share=0.5))
    except PipelineError as exc:
        refused = str(exc)
    else:
        raise RuntimeError("half a GPU asked for while this process holds 70% of it: not refused")
    finally:
        del held
        torch.cuda.empty_cache()
    if str(os.getpid()) not in refused:
        raise RuntimeError(f"the refusal does not name this process ({os.getpid()}): {refused}")
    return f"{gpus[0].total_mib} MiB on nvidia-smi and torch; refused while held: {one_line(refused, 200)}"


CHECK_FUNCTIONS = {"environment": check_environment, "sft-sdpa": check_sft_sdpa, "sft-flash": check_sft_flash,
                   "zero3": check_zero3, "lora": check_lora, "packing": check_packing, "eval": check_eval,
                   "gpu-memory": check_gpu_memory}


if __name__ == "__main__":
    sys.exit(main())
