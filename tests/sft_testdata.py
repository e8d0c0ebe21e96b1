"""Small real SFT datasets for the training tests (docs/formats.md: SFT dataset), written by hand
here so these tests do not depend on the `filter` stage: real GPT-4 ReAct trajectories from
FireAct's release and the paper's own exemplars, rendered by pipeline.core.trajectory."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.core.storage import write_manifest
from pipeline.core.trajectory import parse, render

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
FIREACT = DATA / "fireact" / "alpaca_format" / "hotpotqa.json"
EXEMPLARS = DATA / "react" / "prompts_naive.json"
EXEMPLAR_KEYS = {"react": "webthink_simple6", "act": "webact_simple6", "cot": "cotqa_simple6", "standard": "webqa_simple6"}


def record(traj, rid: str, source: str) -> dict:
    rendered = render(traj)
    return {"id": rid, "question": traj.question, "method": traj.format, "prompt": rendered.prompt,
            "completion": rendered.completion, "observation_spans": [list(s) for s in rendered.observation_spans],
            "answer": traj.answer, "source": source}


def fireact_records(limit: int | None = None, max_chars: int | None = None) -> list[dict]:
    """FireAct's ReAct trajectories (unnumbered lines, parsed and re-rendered in our format)."""
    rows = json.loads(FIREACT.read_text(encoding="utf-8"))
    out = []
    for i, row in enumerate(rows):
        traj = parse(f"Question: {row['instruction']}\n{row['output']}", "react")
        rec = record(traj, f"fireact-{i}", "fireact")
        if max_chars is None or len(rec["prompt"]) + len(rec["completion"]) <= max_chars:
            out.append(rec)
        if limit is not None and len(out) >= limit:
            break
    return out


def exemplar_records(method: str) -> list[dict]:
    """The paper's six HotpotQA exemplars of one format."""
    text = json.loads(EXEMPLARS.read_text(encoding="utf-8"))[EXEMPLAR_KEYS[method]]
    blocks = ["Question:" + b for b in text.split("Question:")[1:]]
    return [record(parse(b, method), f"exemplar-{method}-{i}", "paper") for i, b in enumerate(blocks)]


def write_dataset(dataset_dir: Path, method: str, records: list[dict], complete: bool = True) -> Path:
    folder = dataset_dir / method
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "train.jsonl", "w", encoding="utf-8") as fh:
        for rec in records:
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
    write_manifest(folder / "manifest.json", stage="filter", config={"test": True}, complete=complete,
                   counts={"kept": len(records)})
    return folder
