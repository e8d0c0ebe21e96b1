"""The offline data folder (`../shared/data` on the machines this was built on) rebuilt from its
public sources, where the network allows:

    python -m pipeline data build                    # -> ../shared/data beside the repository
    python -m pipeline data build --out DIR          # elsewhere: then REACT_PIPELINE_MIRROR=DIR

What each file is and where it comes from (docs/data.md has the table):
  - taken as published: the ReAct repository's dev list, exemplars and FEVER claims, FireAct's
    released trajectories and eval runs (`COPIED`);
  - made here from HotpotQA's official files (the dev distractor file and the train file, both
    downloaded): `hotpotqa/with_context.jsonl`, the official records of the questions
    `splits/offline-questions.json` names, and `wiki/corpus.jsonl`, every distinct context
    paragraph of those records, the local Wikipedia;
  - then the committed offline split (`splits/offline-v1/`) is checked against what was built:
    each of its ids is a record, and each eval question's supporting pages are in the corpus.
Each file is downloaded or written under a temporary name and renamed, and a file already in the
folder is kept (a re-run resumes; `--force` takes everything again). Not rebuilt:
`react/fever_react_davinci002_500_trajs.jsonl`, parsed from the printed outputs of the ReAct
repository's FEVER notebook (FEVER's offline corpus: docs/fever.md).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.download import download
from pipeline.core.errors import PipelineError
from pipeline.core.paths import REPO_ROOT, downloads_allowed, mirror_dir
from pipeline.core.storage import atomic_write_text, check_writable_dir

# Where each source publishes its files (a mirror of one, or a test's server, is given instead)
BASE_URLS = {
    "hotpotqa": "http://curtis.ml.cmu.edu/datasets/hotpot",
    "react": "https://raw.githubusercontent.com/ysymyth/ReAct/master",
    "fireact": "https://raw.githubusercontent.com/anchen1011/FireAct/HEAD",  # its default branch
}
QUESTIONS_LIST = REPO_ROOT / "splits" / "offline-questions.json"
SPLIT_DIR = REPO_ROOT / "splits" / "offline-v1"
OFFICIAL = {"dev": "hotpot_dev_distractor_v1.json", "train": "hotpot_train_v1.1.json"}  # HotpotQA's own names
FIREACT_RUNS = (
    "hotpotqa_dev_0_500_ft_gpt-3.5-turbo-0613_princeton-nlp__7woQRsdi_0.0_2023-09-21-16-19-51.json",
    "hotpotqa_dev_0_500_llama_models_lora_llama-2-13b-d_1000_0.7_2023-09-18-13-40-08.json",
    "hotpotqa_dev_0_500_llama_models_lora_llama-2-7b-d_1000_0.7_2023-09-19-00-49-36.json",
)
FIREACT_SETS = ("hotpotqa", "hotpotqa_multimethod", "multitask", "multitask_multimethod")


@dataclass(frozen=True)
class Copied:
    """A file of the folder taken as its source publishes it."""

    path: str  # in the folder
    source: str  # a BASE_URLS key
    remote: str  # below that source's base URL


COPIED = [
    Copied("hotpotqa/dev_simplified.json", "react", "data/hotpot_dev_v1_simplified.json"),
    Copied("react/prompts_naive.json", "react", "prompts/prompts_naive.json"),
    Copied("react/fever.json", "react", "prompts/fever.json"),
    Copied("fever/paper_dev.jsonl", "react", "data/paper_dev.jsonl"),
    *(Copied(f"fireact/alpaca_format/{s}.json", "fireact", f"data/finetune/alpaca_format/{s}.json") for s in FIREACT_SETS),
    *(Copied(f"fireact/gpt_format/{s}.jsonl", "fireact", f"data/finetune/gpt_format/{s}.jsonl") for s in FIREACT_SETS),
    *(Copied(f"fireact/trajs/{name}", "fireact", f"trajs/{name}") for name in FIREACT_RUNS),
]


def build_offline_data(out: Path, base_urls: dict[str, str] | None = None, force: bool = False,
                       say: Callable[[str], None] = print) -> None:
    """Download, build and check every file of the offline data folder into `out`."""
    urls = {**BASE_URLS, **(base_urls or {})}
    check_writable_dir(out, "--out")
    for item in COPIED:
        fetched(out / item.path, f"{urls[item.source].rstrip('/')}/{item.remote}", force, say)
    rows_path, corpus_path = out / "hotpotqa" / "with_context.jsonl", out / "wiki" / "corpus.jsonl"
    if force or not (rows_path.is_file() and corpus_path.is_file()):
        official = {split: fetched(out / "hotpotqa" / name, f"{urls['hotpotqa'].rstrip('/')}/{name}", force, say)
                    for split, name in OFFICIAL.items()}
        rows = offline_rows(official)
        write_jsonl(rows_path, rows)
        write_jsonl(corpus_path, corpus_pages(rows))
        say(f"built {rows_path} ({len(rows):,} questions) and {corpus_path} from HotpotQA's official files")
    else:
        say(f"kept {rows_path} and {corpus_path} (already there; --force builds them again)")
    say(check_split(rows_path, corpus_path))


def default_folder() -> Path:
    """Where the stages look for the offline data folder: REACT_PIPELINE_MIRROR, else ../shared/data
    beside the repository (pipeline/core/paths.py)."""
    return mirror_dir() or REPO_ROOT.parent / "shared" / "data"


def fetched(dest: Path, url: str, force: bool, say: Callable[[str], None]) -> Path:
    if dest.is_file() and not force:
        say(f"kept {dest} (already there; --force takes it again)")
        return dest
    if not downloads_allowed():
        raise PipelineError(f"{dest} is missing and downloads are off (REACT_PIPELINE_OFFLINE); unset it where "
                            f"the network is reachable, or put the file there ({url})")
    download(url, dest)
    say(f"downloaded {dest} from {url}")
    return dest


def offline_rows(official: dict[str, Path]) -> list[dict]:
    """The official records (with their distractor-setting context) of the questions the offline
    folder holds, in the list's order, each with its split and, for dev, its index in the official
    dev order (`react_dev_idx`: the ReAct sample's index space)."""
    listed = read_json(QUESTIONS_LIST)["questions"]
    wanted = {qid for qid, _ in listed}
    found: dict[str, dict] = {}
    for split, path in official.items():
        records = read_json(path)
        if not isinstance(records, list) or (records and "_id" not in records[0]):
            raise PipelineError(f"{path}: not HotpotQA's official file (a list of records with `_id`); "
                                "delete it and build again")
        for index, record in enumerate(records):
            if record.get("_id") in wanted:
                extra = {"react_dev_idx": index} if split == "dev" else {}
                found[record["_id"]] = {**record, "split": split, **extra, "sources": [f"hotpotqa:{path.name}"],
                                        "context_setting": "distractor"}
        del records  # the train file is 540 MB: one at a time
    missing = [qid for qid, _ in listed if qid not in found]
    if missing:
        raise PipelineError(f"{len(missing)} questions of {QUESTIONS_LIST} (e.g. {missing[0]}) are in none of "
                            f"{', '.join(str(p) for p in official.values())}; are these HotpotQA's official files?")
    return [found[qid] for qid, _ in listed]


def corpus_pages(rows: list[dict]) -> list[dict]:
    """Every distinct context paragraph of the rows, as a page {title, sentences}, first seen first."""
    pages: dict[str, list[str]] = {}
    for row in rows:
        for title, sentences in row["context"]:
            pages.setdefault(title, sentences)
    return [{"title": t, "sentences": s} for t, s in pages.items()]


def check_split(rows_path: Path, corpus_path: Path) -> str:
    """The committed offline split on the built files: every id a record, every eval question's
    supporting pages in the corpus; the line saying so, or a PipelineError saying what fails."""
    ids = {row["_id"]: row for row in map(json.loads, rows_path.read_text(encoding="utf-8").splitlines())}
    titles = {json.loads(line)["title"] for line in corpus_path.read_text(encoding="utf-8").splitlines()}
    counts = {}
    for part in ("eval", "bootstrap"):
        split = read_json(SPLIT_DIR / f"{part}.json")["ids"]
        missing = [i for i in split if i not in ids]
        if missing:
            raise PipelineError(f"{SPLIT_DIR.name}/{part}.json: {len(missing)} ids (e.g. {missing[0]}) are not in "
                                f"{rows_path}; the built file does not hold the split's questions")
        counts[part] = len(split)
        if part == "eval":
            short = [i for i in split if not all(t in titles for t, _ in ids[i]["supporting_facts"])]
            if short:
                raise PipelineError(f"{SPLIT_DIR.name}/eval.json: {len(short)} questions (e.g. {short[0]}) have a "
                                    f"supporting page missing from {corpus_path}")
    return (f"split {SPLIT_DIR.name} holds on {rows_path.parents[1]}: {counts['eval']} eval questions, each with its "
            f"supporting pages in the corpus, and {counts['bootstrap']} bootstrap questions")


def read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PipelineError(f"{path}: not valid JSON ({str(exc).splitlines()[0]}); delete it and build again") from None


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
