"""Cards: the text that makes a fine-tuned model or an SFT dataset reusable by someone else.

    model_card(manifest, eval_rows)      # README.md of a fine-tuned `final/` (train, grpo, run, publish)
    dataset_card(folders)                # README.md of a published SFT dataset (publish)

A model card holds the Hugging Face metadata block (base model, library, licence note, tags), how
the model decodes (our zero-shot format), its training config, where its data came from (teacher,
method, counts, filter rule), and its EM / F1 table from our eval summaries. `train` writes it
into every `final/` (no eval yet), `run` rewrites it once that model is evaluated, and
`publish` writes the same text into the folder it uploads. A GRPO `final/` (its manifest's stage
is grpo) gets `grpo_card`: where the policy started, its rollouts and reward instead of a dataset.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.core.storage import atomic_write_text, read_manifest
from pipeline.hub.models import licence_of
from pipeline.tasks import Task, get_task, task_of

WIKIPEDIA = "Wikipedia (2017 text via HotpotQA, or the live API): observation text, CC BY-SA"
FIREACT_DATA = ("FireAct's released GPT-4 trajectories (github.com/anchen1011/FireAct, MIT): observations are "
                "Google search snippets, kept verbatim; their own terms apply to that text")
FORMAT_TEXT = {  # HotpotQA's; format_text(fmt, task) writes another task's question line
    "standard": "Question: <question>\\nAnswer: <answer>",
    "cot": "Question: <question>\\nThought: Let's think step by step. <reasoning>\\nAnswer: <answer>",
    "act": "Question: <question>\\nAction 1: Search[...]\\nObservation 1: ...\\n...Action n: Finish[<answer>]",
    "react": ("Question: <question>\\nThought 1: ...\\nAction 1: Search[...]\\nObservation 1: ...\\n..."
              "Action n: Finish[<answer>]"),
}
FILTER_RULE = ("finished episodes with {rule} against the gold answer{min_f1}; repeated question ids "
               "dropped (the first kept); at most {cap} per method by a seeded draw (seed {seed})")


def format_text(fmt: str, task: Task) -> str:
    """How the `fmt` trajectory reads, with the task's question line."""
    text = FORMAT_TEXT.get(fmt, fmt)
    return text.replace("Question: <question>", f"{task.question_label}: <{task.question_label.lower()}>", 1)


def front_matter(meta: dict, extra: list[str] | None = None) -> str:
    """The YAML block the Hub reads (values written as JSON, which YAML accepts), plus raw
    `extra` YAML lines (the datasets library's `configs:`)."""
    lines = ["---"]
    lines += [f"{key}: {json.dumps(value)}" for key, value in meta.items() if value not in (None, [])]
    return "\n".join(lines + (extra or []) + ["---", ""])


# ---------------------------------------------------------------- datasets


def dataset_teachers(manifest: dict) -> list[str]:
    """Who wrote a dataset's trajectories: the `teacher` of each generate run it was built from."""
    teachers = []
    for item in manifest.get("inputs") or []:
        path = Path(item.get("path", ""))
        source = read_manifest(path.parent / "manifest.json") if path.parent.is_dir() else None
        if source and source.get("teacher"):
            teacher = str(source["teacher"])
        elif "fireact" in str(path).lower():
            from pipeline.hub.importers import TEACHER

            teacher = TEACHER
        else:
            teacher = f"unknown (no generate manifest beside {path})"
        if teacher not in teachers:
            teachers.append(teacher)
    return teachers or ["unknown (the dataset's manifest lists no inputs)"]


def filter_rule(manifest: dict) -> str:
    settings = manifest.get("settings") or {}
    min_f1 = settings.get("min_f1")
    return FILTER_RULE.format(rule=get_task(task_of(manifest)).correct_rule,
                              min_f1=f" and F1 >= {min_f1}" if min_f1 is not None else "",
                              cap=settings.get("max_per_method", "?"), seed=settings.get("seed", "?"))


def dataset_facts(folder: Path) -> dict:
    """One format's dataset folder (filter output) -> the facts a card states."""
    manifest = read_manifest(folder / "manifest.json") or {}
    stats = json.loads((folder / "stats.json").read_text(encoding="utf-8")) if (folder / "stats.json").is_file() else {}
    fmt = manifest.get("format") or manifest.get("method")  # "method": written before the rename
    return {"format": fmt or folder.name, "task": task_of(manifest),
            "teachers": dataset_teachers(manifest),
            "rule": filter_rule(manifest), "stats": stats,
            "fireact": any("fireact" in s for s in (stats.get("sources") or {})),
            # the messages layout's counts, when the folder has one (filter writes it since the layout exists)
            "messages": stats.get("messages") if (folder / "messages.jsonl").is_file()
            and (stats.get("messages") or {}).get("rows") else None}


def dataset_card(folders: list[Path], *, name: str) -> str:
    facts = [dataset_facts(f) for f in folders]
    task = get_task(facts[0]["task"] if facts else None)
    total = sum(f["stats"].get("kept", 0) for f in facts)
    meta = {"license": "cc-by-sa-4.0", "language": ["en"], "pretty_name": name,
            "task_categories": ["text-generation", "question-answering"],
            "tags": ["react", "agents", task.name, "trajectories", "sft"],
            "size_categories": [_size_category(total)]}
    lines = [front_matter(meta, configs_yaml([f["format"] for f in facts], [f["format"] for f in facts if f["messages"]])),
             f"# {name}", "",
             f"Supervised fine-tuning data for ReAct-style {task.title} agents, one configuration per trajectory "
             "format, written by react-finetune-pipeline (`generate` -> `filter` -> `publish`).", "",
             "    from datasets import load_dataset",
             f"    ds = load_dataset(\"<this repo or folder>\", \"{facts[0]['format']}\")", "",
             "| format | examples | seen | teacher | tokens p50 / p95 / max |", "|---|---:|---:|---|---|"]
    for f in facts:
        tokens = f["stats"].get("tokens")
        token_text = (f"{tokens['p50']} / {tokens['p95']} / {tokens['max']} ({tokens['tokenizer']})" if tokens
                      else "not counted (no tokenizer configured in `filter`)")
        lines.append(f"| {f['format']} | {f['stats'].get('kept', '?')} | {f['stats'].get('seen', '?')} | "
                     f"{'; '.join(f['teachers'])} | {token_text} |")
    lines += ["", "## Format", ""]
    for f in facts:
        lines.append(f"- `{f['format']}`: `prompt` is the question line, `completion` the trajectory "
                     f"(`{format_text(f['format'], task)}`); `observation_spans` are [start, end) "
                     "character offsets of observation text in `completion`, for optional loss masking.")
    lines += messages_section(facts)
    lines += ["", "## How the examples were chosen", ""]
    for f in facts:
        dropped = json.dumps(f["stats"].get("dropped") or {})
        lines.append(f"- `{f['format']}`: {f['rule']}. Dropped: {dropped}. Sources: "
                     f"{json.dumps(f['stats'].get('sources') or {})}.")
    lines += ["", "## Licence and sources", "", f"- {task.data_line()}", f"- {WIKIPEDIA}"]
    if any(f["fireact"] for f in facts):
        lines.append(f"- {FIREACT_DATA}")
    lines += ["- This dataset: CC BY-SA 4.0 (share-alike, as its sources require).", ""]
    return "\n".join(lines)


def configs_yaml(methods: list[str], messages: list[str] = ()) -> list[str]:
    """`configs:` for the datasets library: one per method, each its own train.jsonl (the first is
    the default), and `<method>-messages` for each method in `messages`, its messages.jsonl."""
    lines = ["configs:"]
    for i, method in enumerate(methods):
        lines += [f"- config_name: {method}"] + (["  default: true"] if i == 0 else [])
        lines += ["  data_files:", "  - split: train", f"    path: {method}/train.jsonl"]
    for method in messages:
        lines += [f"- config_name: {method}-messages", "  data_files:", "  - split: train",
                  f"    path: {method}/messages.jsonl"]
    return lines


def messages_section(facts: list[dict]) -> list[str]:
    """The card's words on the messages layout (pipeline/core/messages.py; docs/formats.md)."""
    with_messages = [f["format"] for f in facts if f["messages"]]
    if not with_messages:
        return []
    lines = ["", "## Two layouts", "",
             "Each format comes in two layouts holding the same trajectories, row for row:", "",
             "- `<format>` (`<format>/train.jsonl`): text completion in the paper's layout, `prompt` and `completion`.",
             "- `<format>-messages` (`<format>/messages.jsonl`): chat `messages` with `tool_calls`, `role: tool` "
             "observations and a `tools` column (JSON schemas of `search`, `lookup`, `finish`), the layout TRL's "
             "SFTTrainer takes. Act and ReAct: one assistant turn per step, its thought as `content` and its action "
             "as one tool call; the last turn is the `finish` call (the environment's reply to it is not written). "
             "Standard and CoT: one plain assistant answer. Train it with a chat template that renders tool "
             "calls and `assistant_only_loss=True`, so observations are never in the loss.", "",
             "    from datasets import load_dataset",
             f"    ds = load_dataset(\"<this repo or folder>\", \"{with_messages[0]}-messages\")  # messages, tools"]
    left_out = {f["format"]: f["messages"]["left_out"] for f in facts if f["messages"] and f["messages"]["left_out"]}
    if left_out:
        lines += ["", f"Rows with no tool-call form (an action the environment refused), left out of the messages "
                  f"layout only: {json.dumps(left_out)}."]
    return lines


def _size_category(n: int) -> str:
    return "n<1K" if n < 1000 else "1K<n<10K" if n < 10000 else "10K<n<100K"


# ---------------------------------------------------------------- models


def model_card(manifest: dict, eval_rows: list[dict]) -> str:
    """The card of one of our fine-tuned `final/` folders, from its manifest and eval rows."""
    if manifest.get("stage") == "grpo":  # trained in the environment, not on trajectories
        return grpo_card(manifest, eval_rows)
    cfg = manifest.get("config") or {}
    task = get_task(task_of(manifest))
    method = manifest.get("format") or manifest.get("method", "?")  # "method": before the rename
    base = manifest.get("base_model")
    adapter = bool(manifest.get("adapter"))
    meta = {"base_model": base if base and not Path(str(base)).is_absolute() else None,
            "library_name": "peft" if adapter else "transformers", "pipeline_tag": "text-generation",
            "license": "other", "datasets": [task.hub_dataset] if task.hub_dataset else [],
            "tags": ["react", "agents", task.name, f"format:{method}"]}
    dataset = manifest.get("dataset") or {}
    data_folder = Path(dataset["path"]).parent if dataset.get("path") else None
    data = dataset_facts(data_folder) if data_folder and data_folder.is_dir() else None
    lines = [front_matter(meta),
             f"# {manifest.get('student', 'student')} fine-tuned on {method} trajectories ({task.title})", "",
             f"{'A ' + str(manifest.get('finetuning', 'LoRA')).upper() + ' adapter on' if adapter else 'A full fine-tune of'} "
             f"`{base}`, trained by react-finetune-pipeline on {task.title} {method} "
             "trajectories to answer questions by acting in a Wikipedia environment, as in ReAct (Yao et al. 2022).",
             "", "## How it decodes", "",
             f"Zero-shot, in the `{method}` format it was trained on: the prompt is "
             f"`{task.question_label}: <{task.question_label.lower()}>\\n` and "
             f"the whole text reads `{format_text(method, task)}`; the model writes one step per call and "
             "the environment appends each observation. With this pipeline:", "",
             f"    python -m pipeline eval finetuned=<this folder> methods=[{method}]", "",
             "## Results (our eval)", ""]
    lines += results_table(eval_rows)
    lines += ["", "## Training", "", "| setting | value |", "|---|---|"]
    settings = [("base model", base), ("fine-tuning", manifest.get("finetuning")), ("format", method),
                ("steps", f"{manifest.get('steps')} of {manifest.get('max_steps')}"),
                ("global batch", f"{manifest.get('global_batch_size')} = {manifest.get('per_device_batch_size')} per "
                 f"device x {manifest.get('gradient_accumulation_steps')} accumulation x "
                 f"{manifest.get('num_processes')} processes"),
                ("learning rate", f"{cfg.get('learning_rate')} ({cfg.get('lr_scheduler')}, warmup ratio "
                 f"{cfg.get('warmup_ratio')})"),
                ("precision", cfg.get("precision")), ("observations in the loss", not manifest.get("mask_observations")),
                ("LoRA", json.dumps(cfg.get("lora")) if adapter else None), ("seed", cfg.get("seed")),
                ("final training loss", manifest.get("train_loss")), ("wall time (s)", manifest.get("seconds")),
                ("parameters (B)", manifest.get("params_b")), ("code", f"git {manifest.get('git_commit')}")]
    lines += [f"| {k} | {v} |" for k, v in settings if v is not None]
    lines += ["", "## Data", ""]
    examples = dataset.get("examples")
    lines.append(f"- Dataset: `{dataset.get('path')}` ({examples} examples used).")
    if data:
        lines.append(f"- Teacher: {'; '.join(data['teachers'])}.")
        lines.append(f"- Selection: {data['rule']}.")
    else:
        lines.append("- The dataset folder is not beside this model any more: teacher and selection unknown.")
    lines += ["", "## Licence", "", licence_line([cfg.get("student"), manifest.get("origin_model"), base], task, fireact=bool(data and data["fireact"])),
              "", "<details><summary>Full training config</summary>", "", "```json",
              json.dumps(cfg, indent=2, sort_keys=True, default=str), "```", "", "</details>", ""]
    return "\n".join(lines)


def grpo_card(manifest: dict, eval_rows: list[dict]) -> str:
    """The card of a GRPO `final/` (the manifest pipeline.rl.train writes): the policy acted in the
    environment, rewarded by its task's metric."""
    cfg = manifest.get("config") or {}
    task = get_task(task_of(manifest))
    fmt = manifest.get("format", "react")
    start = manifest.get("start") or {}
    grpo = manifest.get("grpo") or {}
    adapter = bool(manifest.get("adapter"))
    base = manifest.get("base_model")
    meta = {"base_model": None, "library_name": "peft" if adapter else "transformers",
            "pipeline_tag": "text-generation", "license": "other",
            "datasets": [task.hub_dataset] if task.hub_dataset else [],
            "tags": ["react", "agents", task.name, "grpo", f"format:{fmt}"]}
    lines = [front_matter(meta),
             f"# {manifest.get('student', 'student')}: GRPO in the {task.title} Wikipedia environment ({fmt})", "",
             f"{'A LoRA adapter on' if adapter else 'A full model, from'} `{base}`, trained by react-finetune-pipeline "
             f"with GRPO (TRL's GRPOTrainer): the policy acted in the Wikipedia environment in the `{fmt}` loop, "
             f"{grpo.get('group_size')} rollouts per question, rewarded by the task's metric ({task.metric_label}); "
             "the environment's observations were never in the loss.", "",
             f"Started from {start.get('kind')} `{start.get('checkpoint')}`.", "",
             "## How it decodes", "",
             f"Zero-shot, in the `{fmt}` format (the prompt is `{task.question_label}: "
             f"<{task.question_label.lower()}>\\n`), as a fine-tuned student:", "",
             f"    python -m pipeline eval finetuned=<this folder> methods=[{fmt}]", "",
             "## Results (our eval)", ""]
    lines += results_table(eval_rows)
    settings = [("start", start.get("checkpoint")), ("fine-tuning", manifest.get("finetuning")),
                ("steps", f"{manifest.get('steps')} of {manifest.get('max_steps')}"),
                ("rollouts per step", f"{manifest.get('global_batch_size')} = {grpo.get('questions_per_step')} "
                 f"questions x {grpo.get('group_size')}"),
                ("reward weights", json.dumps(grpo.get("reward_weights"))),
                ("mean reward, first / last 5 steps", f"{grpo.get('reward_first_steps')} / {grpo.get('reward_last_steps')}"),
                ("training questions", (manifest.get("dataset") or {}).get("questions")),
                ("learning rate", cfg.get("learning_rate")), ("KL beta", grpo.get("beta")),
                ("loss", grpo.get("loss_type")), ("sampling temperature", grpo.get("temperature")),
                ("precision", manifest.get("precision")), ("seed", cfg.get("seed")),
                ("wall time (s)", manifest.get("seconds")), ("parameters (B)", manifest.get("params_b")),
                ("code", f"git {manifest.get('git_commit')}")]
    lines += ["", "## Training", "", "| setting | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in settings if v is not None]
    lines += ["", "## Licence", "", licence_line([cfg.get("student"), manifest.get("origin_model"), base], task), "", "<details><summary>Full training config</summary>", "",
              "```json", json.dumps(cfg, indent=2, sort_keys=True, default=str), "```", "", "</details>", ""]
    return "\n".join(lines)


def licence_line(models: list, task, fireact: bool = False) -> str:
    """The card's licence sentence. An embedded base model's own terms (Gemma's) are named: they
    bind every model trained from it, by SFT or GRPO."""
    terms = next((t for t in (licence_of(str(m)) for m in models if m) if t), None)
    return ("The base model's licence applies to these weights" + (f": the {terms}" if terms else "")
            + f". Training data: {task.data_line()}; {WIKIPEDIA}" + (f"; {FIREACT_DATA}" if fireact else "") + ".")


def results_table(rows: list[dict]) -> list[str]:
    if not rows:
        return ["Not evaluated yet: `python -m pipeline eval finetuned=<this folder>` writes the summary "
                "this table is built from."]
    lines = ["| method | question set | n | EM % | F1 % | finished % |", "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['method']} | {r['question_set']} | {r['n']} | {100 * r['em']:.1f} | "
                     f"{100 * r['f1']:.1f} | {100 * r.get('finish_rate', 0):.1f} |")
    return lines


def eval_rows_for(final: Path, summaries: list[Path]) -> list[dict]:
    """The rows of those eval summaries whose run evaluated this model (by its eval manifest's
    `finetuned`; `checkpoint` in a manifest written before that key was renamed)."""
    rows = []
    for path in summaries:
        manifest = read_manifest(Path(path).parent / "manifest.json") or {}
        config = manifest.get("config") or {}
        finetuned = config.get("finetuned") or config.get("checkpoint")
        if manifest.get("complete") and finetuned and Path(finetuned).resolve() == Path(final).resolve():
            rows += json.loads(Path(path).read_text(encoding="utf-8"))
    return rows


def marked_rehearsal(card: str) -> str:
    """A card of a rehearsal's tiny random model (`run --rehearse`): said in its metadata and first line."""
    head, sep, body = card.partition("\n---\n") if card.startswith("---\n") else ("", "", card)
    banner = "**REHEARSAL**: a tiny random model from `run --rehearse`; its numbers are not a result.\n\n"
    return f"{head}\nrehearsal: true{sep}{banner}{body}" if sep else banner + card


def write_model_card(final: Path, eval_rows: list[dict]) -> Path:
    """(Re)write `final/README.md` from its manifest and these eval rows."""
    manifest = read_manifest(Path(final) / "manifest.json") or {}
    path = Path(final) / "README.md"
    atomic_write_text(path, marked_rehearsal(model_card(manifest, eval_rows)) if manifest.get("rehearsal")
                      else model_card(manifest, eval_rows))
    return path
