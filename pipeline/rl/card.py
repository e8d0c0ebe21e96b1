"""The model card of a GRPO `final/` (pipeline.hub.cards.model_card hands a grpo manifest here)."""

from __future__ import annotations

import json

from pipeline.hub.cards import HOTPOTQA, WIKIPEDIA, front_matter, results_table


def grpo_card(manifest: dict, eval_rows: list[dict]) -> str:
    cfg = manifest.get("config") or {}
    fmt = manifest.get("format", "react")
    start = manifest.get("start") or {}
    grpo = manifest.get("grpo") or {}
    adapter = bool(manifest.get("adapter"))
    base = manifest.get("base_model")
    meta = {"base_model": None, "library_name": "peft" if adapter else "transformers",
            "pipeline_tag": "text-generation", "license": "other", "datasets": ["hotpotqa/hotpot_qa"],
            "tags": ["react", "agents", "hotpotqa", "grpo", f"format:{fmt}"]}
    lines = [front_matter(meta),
             f"# {manifest.get('student', 'student')}: GRPO in the HotpotQA Wikipedia environment ({fmt})", "",
             f"{'A LoRA adapter on' if adapter else 'A full model, from'} `{base}`, trained by react-finetune-pipeline "
             f"with GRPO (TRL's GRPOTrainer): the policy acted in the Wikipedia environment in the `{fmt}` loop, "
             f"{grpo.get('group_size')} rollouts per question, rewarded by the task's metric; the environment's "
             "observations were never in the loss.", "",
             f"Started from {start.get('kind')} `{start.get('checkpoint')}`.", "",
             "## How it decodes", "",
             f"Zero-shot, in the `{fmt}` format (the prompt is `Question: <question>\\n`), as a fine-tuned student:", "",
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
    lines += ["", "## Licence", "", f"The base model's licence applies to these weights. Training data: {HOTPOTQA}; "
              f"{WIKIPEDIA}.", "", "<details><summary>Full training config</summary>", "", "```json",
              json.dumps(cfg, indent=2, sort_keys=True, default=str), "```", "", "</details>", ""]
    return "\n".join(lines)
