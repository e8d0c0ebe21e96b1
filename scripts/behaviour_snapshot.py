"""Run a reduced demo grid and write what it produced, minus timings, as one JSON file; or
compare two such files. A refactor that keeps behaviour must give identical snapshots.

    python scripts/behaviour_snapshot.py run runs/snapshot-before      # -> runs/snapshot-before/snapshot.json
    python scripts/behaviour_snapshot.py compare runs/snapshot-before runs/snapshot-after

The reduced grid is configs/demo.yaml with fewer questions (8 to generate from, 4 to evaluate),
2 training steps per format and its own out_dir and checkpoint root. The snapshot holds every
episode record (generate and eval, sorted by method and id), every SFT row, the training loss
of each logged step and the eval summary rows; fields that measure time or say where and when a
thing ran (seconds, timestamps, paths, versions) are dropped.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
# Fields that differ between two runs of the same code: wall time, throughput, dates, places.
VOLATILE = {"seconds", "started", "finished_at", "created", "timestamp", "time", "train_runtime",
            "train_samples_per_second", "train_steps_per_second", "tokens_per_s", "tflops", "mfu",
            "total_flos", "epoch_seconds", "git_commit", "versions", "out_dir", "output_dir"}


def reduced_config(out: Path) -> Path:
    cfg = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text(encoding="utf-8"))
    cfg["out_dir"] = str(out / "run")
    cfg["generate"]["limit"] = 8
    cfg["eval"]["limit"] = 4
    cfg["train"]["output_root"] = str(out / "checkpoints")
    for student in cfg["students"]:
        student.setdefault("train", {})["max_steps"] = 2
    path = out / "reduced-demo.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    return path


def scrub(value):
    if isinstance(value, dict):
        return {k: scrub(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [scrub(v) for v in value]
    return value


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def records(folder: Path) -> dict[str, list]:
    """Every `<method>.jsonl` of a generate or eval folder, sorted by id."""
    return {p.stem: sorted((scrub(r) for r in jsonl(p)), key=lambda r: str(r["id"]))
            for p in sorted(folder.glob("*.jsonl"))}


def losses(root: Path) -> dict[str, list]:
    """The logged training loss per step of every training run under `root`."""
    out = {}
    for state in sorted(root.rglob("trainer_state.json")):
        if state.parent.name.startswith("checkpoint-"):
            continue  # final/'s state holds the whole history
        history = json.loads(state.read_text(encoding="utf-8")).get("log_history", [])
        out[str(state.parent.relative_to(root))] = [(h["step"], h["loss"]) for h in history if "loss" in h]
    if not out:  # no trainer_state in final/: take the last checkpoint's
        for state in sorted(root.rglob("checkpoint-*/trainer_state.json")):
            history = json.loads(state.read_text(encoding="utf-8")).get("log_history", [])
            out[str(state.parent.parent.relative_to(root))] = [(h["step"], h["loss"]) for h in history if "loss" in h]
    return out


def snapshot(out: Path) -> dict:
    run = out / "run"
    return {
        "generate": records(run / "generate"),
        "sft": {p.parent.name: [scrub(r) for r in jsonl(p)] for p in sorted((run / "sft").glob("*/train.jsonl"))},
        "losses": losses(out / "checkpoints"),
        "eval": {d.name: records(d) for d in sorted((run / "eval").iterdir()) if d.is_dir()},
        "summaries": {d.name: scrub(json.loads((d / "summary.json").read_text(encoding="utf-8")))
                      for d in sorted((run / "eval").iterdir()) if (d / "summary.json").is_file()},
    }


def cmd_run(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    config = reduced_config(out)
    code = subprocess.call([sys.executable, "-m", "pipeline", "run", "--config", str(config)], cwd=REPO)
    if code != 0:
        print(f"error: the reduced demo failed (exit {code})", file=sys.stderr)
        return code
    path = out / "snapshot.json"
    path.write_text(json.dumps(snapshot(out), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"snapshot: {path}")
    return 0


def differences(a, b, where: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{where}/{k}: only in {'first' if k in a else 'second'}" for k in sorted(set(a) ^ set(b))]
        for k in sorted(set(a) & set(b)):
            out += differences(a[k], b[k], f"{where}/{k}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{where}[{i}]")]
    return [] if a == b else [f"{where}: {json.dumps(a)[:120]} != {json.dumps(b)[:120]}"]


def cmd_compare(first: Path, second: Path) -> int:
    a, b = (json.loads((p / "snapshot.json").read_text(encoding="utf-8")) for p in (first, second))
    diffs = differences(a, b)
    for line in diffs[:50]:
        print(line)
    counts = {k: sum(len(v) for v in a[k].values()) if isinstance(a[k], dict) else len(a[k]) for k in a}
    print(f"{len(diffs)} difference(s); compared {counts}")
    return 1 if diffs else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run").add_argument("out", type=Path)
    cmp = sub.add_parser("compare")
    cmp.add_argument("first", type=Path)
    cmp.add_argument("second", type=Path)
    args = parser.parse_args()
    return cmd_run(args.out) if args.command == "run" else cmd_compare(args.first, args.second)


if __name__ == "__main__":
    sys.exit(main())
