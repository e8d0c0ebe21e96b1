"""`publish`: package an SFT dataset or a fine-tuned checkpoint for others, and upload it.

    python -m pipeline publish dataset=runs/demo/sft                    # every method's dataset
    python -m pipeline publish checkpoint=checkpoints/demo/smollm2-135m/react/final \\
        summaries=[runs/demo/eval/*/summary.json] hub_id=me/smollm2-135m-react

A dataset becomes a `datasets`-loadable folder: `<method>/train.jsonl` per method (and its
`messages.jsonl`, the same trajectories as chat messages with tool calls) and a README.md
dataset card (teacher, format, counts, filter rule, token statistics, licences) whose `configs:`
block makes `load_dataset(folder, "<method>")` read the text layout and
`load_dataset(folder, "<method>-messages")` the messages layout. A checkpoint becomes a copy of its
`final/` folder (weights or adapter, tokenizer, manifest) with the model card (pipeline.hub.cards:
training config, data provenance, EM / F1 from the eval summaries that evaluated it), loadable
with `from_pretrained`. The folder is written to a temporary name and renamed.

With `hub_id` set and a token in the environment (HF_TOKEN), the folder is uploaded with
huggingface_hub (a private repository unless private=false). Without either, or with
HF_HUB_OFFLINE=1, it stops after writing the folder and says so in one line.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.core.config import add_config_arguments, checked, folder_name, stage_config
from pipeline.core.errors import PipelineError
from pipeline.core.storage import require_complete


@dataclass
class PublishConfig:
    dataset: str | None = None  # an SFT dataset: filter's out_dir (every method) or one <method>/ folder
    checkpoint: str | None = None  # or one of our fine-tuned `final/` folders
    summaries: list[str] = field(default_factory=list)  # eval summary.json files or globs: the card's EM/F1
    name: str | None = checked(folder_name, default=None)  # the card's title and the folder's name (default: from the input)
    out_dir: str = "runs/publish"  # the folder is <out_dir>/<name>
    hub_id: str | None = None  # <user or org>/<repo>: upload there when a token is present
    private: bool = True  # a new hub repository is private unless set false
    token_env: str = "HF_TOKEN"  # the environment variable holding the hub token (never a config value)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, PublishConfig)


def main(args: argparse.Namespace) -> int:
    publish(stage_config(PublishConfig, args, section="publish"))
    return 0


def publish(cfg: PublishConfig, api=None) -> dict:
    """Write the folder, then upload it when configured; returns {folder, kind, url}.
    `api`: an huggingface_hub.HfApi-like object (tests pass a stand-in); default: a real HfApi."""
    if bool(cfg.dataset) == bool(cfg.checkpoint):
        raise PipelineError("publish: give exactly one of dataset=<SFT dataset folder> or checkpoint=<final folder>")
    if cfg.hub_id and cfg.hub_id.count("/") != 1:
        raise PipelineError(f"publish: hub_id '{cfg.hub_id}' must be <user or org>/<name>")
    if cfg.dataset:
        kind, name, files, card = dataset_package(Path(cfg.dataset), cfg.name)
    else:
        kind, name, files, card = model_package(Path(cfg.checkpoint), cfg.name, expand(cfg.summaries))
    if reason := folder_name(name):  # a default made from a manifest's student is checked as a given one
        raise PipelineError(f"publish: the folder name {reason}; set name=<a folder name>")
    folder = Path(cfg.out_dir) / name
    write_folder(folder, files, card)
    url = upload(folder, kind, cfg, api)
    return {"folder": folder, "kind": kind, "url": url}


# ---------------------------------------------------------------- what goes in the folder


def method_folders(dataset: Path) -> list[Path]:
    """One method's folder (it holds train.jsonl) or every method folder under filter's out_dir."""
    if (dataset / "train.jsonl").is_file():
        folders = [dataset]
    else:
        folders = sorted(p.parent for p in dataset.glob("*/train.jsonl"))
    if not folders:
        raise PipelineError(f"publish: {dataset} holds no SFT dataset (no train.jsonl in it or in <method>/ below it); "
                            "give a `filter` output folder")
    for folder in folders:
        require_complete(folder / "manifest.json", f"SFT dataset {folder}")
    return folders


def dataset_package(dataset: Path, name: str | None) -> tuple[str, str, dict[str, Path], str]:
    from pipeline.hub.cards import dataset_card, dataset_facts

    folders = method_folders(dataset)
    facts = [dataset_facts(f) for f in folders]
    formats = [f["format"] for f in facts]
    name = name or f"{facts[0]['task']}-react-sft-{'-'.join(formats)}"
    files = {f"{m}/{n}": f / n for m, f in zip(formats, folders, strict=True) for n in ("train.jsonl", "messages.jsonl", "stats.json")
             if (f / n).is_file()}
    return "dataset", name, files, dataset_card(folders, name=name)


def model_package(final: Path, name: str | None, summaries: list[Path]) -> tuple[str, str, dict[str, Path], str]:
    from pipeline.hub.cards import eval_rows_for, model_card

    manifest = require_complete(final / "manifest.json", f"fine-tuned checkpoint {final}")
    if manifest.get("stage") != "train":
        raise PipelineError(f"publish: {final} is not a `train` output (its manifest says stage "
                            f"{manifest.get('stage')!r}); give a checkpoint's final/ folder")
    rows = eval_rows_for(final, summaries)
    if summaries and not rows:
        print(f"note: none of the {len(summaries)} summaries evaluated {final}; the card says 'not evaluated yet'")
    name = name or f"{manifest.get('student', 'student')}-{manifest.get('format') or manifest.get('method', 'model')}"
    files = {p.name: p for p in sorted(final.iterdir()) if p.is_file() and p.name != "README.md"}
    return "model", name, files, model_card(manifest, rows)


def expand(patterns: list[str]) -> list[Path]:
    paths = []
    for pattern in patterns:
        found = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        paths += [Path(p) for p in found if Path(p).is_file()]
        if not glob.has_magic(pattern) and not Path(pattern).is_file():
            raise PipelineError(f"publish: summary {pattern} not found; give eval summary.json files (globs allowed)")
    return paths


def write_folder(folder: Path, files: dict[str, Path], card: str) -> None:
    """Copy the files and write README.md into a temporary folder, then swap it in by rename."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".tmp", dir=folder.parent))
    try:
        for relative, source in files.items():
            (tmp / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, tmp / relative)
        (tmp / "README.md").write_text(card, encoding="utf-8")
        tmp.chmod(0o755)
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------- upload


def upload(folder: Path, kind: str, cfg: PublishConfig, api=None) -> str | None:
    """Upload with huggingface_hub when a hub id and a token are there; else say why not, in one line."""
    token = os.environ.get(cfg.token_env)
    reason = ("no hub_id configured (set hub_id=<user>/<name>)" if not cfg.hub_id
              else f"no token in ${cfg.token_env}" if not token
              else "HF_HUB_OFFLINE is set" if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
              else None)
    if reason:
        print(f"[publish] wrote {folder}; not uploaded: {reason}")
        return None
    if api is None:
        from huggingface_hub import HfApi

        api = HfApi(token=token)
    try:
        api.create_repo(cfg.hub_id, repo_type=kind, private=cfg.private, exist_ok=True)
        info = api.upload_folder(repo_id=cfg.hub_id, folder_path=str(folder), repo_type=kind,
                                 commit_message=f"react-finetune-pipeline: publish {folder.name}")
    except Exception as exc:  # network, permissions, a name taken by another kind of repo
        raise PipelineError(f"publish: wrote {folder}, but uploading to {cfg.hub_id} failed "
                            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from None
    url = getattr(info, "commit_url", None) or f"https://huggingface.co/{'datasets/' if kind == 'dataset' else ''}{cfg.hub_id}"
    print(f"[publish] wrote {folder}; uploaded to {url}")
    return url
