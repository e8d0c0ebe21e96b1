"""`python -m pipeline data build` (pipeline/hub/offline_data.py): the offline data folder rebuilt
from its public sources. The network is not reachable here, so the sources are a real HTTP server
on 127.0.0.1 serving files in the sources' own formats and layouts: HotpotQA's official dev
distractor and train files (lists of official records: this folder's questions at their
official places, the other dev places filled from ReAct's dev list), and the ReAct and FireAct
repositories' files themselves (copied from the offline folder, which holds them as published).

    .venv/bin/python -m pytest tests/test_data_build.py -n 0 -q
"""

from __future__ import annotations

import functools
import json
import shutil
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from episode_testdata import CORPUS, run_pipeline

from pipeline.hub.offline_data import COPIED, OFFICIAL, default_folder

SHARED = CORPUS.parents[1]
EXTRA_KEYS = ("split", "react_dev_idx", "sources", "context_setting")  # the offline file's, not HotpotQA's

pytestmark = pytest.mark.skipif(not CORPUS.is_file(), reason=f"offline data not found at {SHARED}")


class Sources:
    """A real static HTTP server over `root` (one folder per source), recording each path asked."""

    def __init__(self, root: Path):
        self.requests: list[str] = []
        requests = self.requests

        class Handler(SimpleHTTPRequestHandler):
            def do_GET(self):
                requests.append(self.path)
                super().do_GET()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def urls(self) -> list[str]:
        base = f"http://127.0.0.1:{self.server.server_address[1]}"
        return [f"--{s}-url={base}/{s}" for s in ("hotpotqa", "react", "fireact")]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Path:
    """The three sources' files, laid out as each publishes them."""
    root = tmp_path_factory.mktemp("sources")
    for item in COPIED:
        dest = root / item.source / item.remote
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(SHARED / item.path, dest)
    rows = [json.loads(line) for line in (SHARED / "hotpotqa" / "with_context.jsonl").read_text(encoding="utf-8").splitlines()]
    simplified = json.loads((SHARED / "hotpotqa" / "dev_simplified.json").read_text(encoding="utf-8"))
    dev = [{"_id": f"dev-{i}", "question": q["question"], "answer": q["answer"], "type": q["type"], "level": "medium",
            "supporting_facts": [], "context": []} for i, q in enumerate(simplified)]
    train = [{"_id": "train-other", "question": "?", "answer": "no", "type": "comparison", "level": "easy",
              "supporting_facts": [], "context": []}]
    for row in rows:
        official = {k: v for k, v in row.items() if k not in EXTRA_KEYS}
        if row["split"] == "dev":
            dev[row["react_dev_idx"]] = official
        else:
            train.append(official)
    (root / "hotpotqa").mkdir()
    (root / "hotpotqa" / OFFICIAL["dev"]).write_text(json.dumps(dev), encoding="utf-8")
    (root / "hotpotqa" / OFFICIAL["train"]).write_text(json.dumps(train), encoding="utf-8")
    return root


def test_build_fills_the_folder_from_the_sources_and_the_offline_split_loads_from_it(served, tmp_path, monkeypatch):
    out = tmp_path / "data"
    sources = Sources(served)
    try:
        proc = run_pipeline("data", "build", "--out", str(out), *sources.urls(), timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert f"split offline-v1 holds on {out}: 500 eval questions" in proc.stdout, proc.stdout[-2000:]
        for item in COPIED:  # taken as published, byte for byte
            assert (out / item.path).read_bytes() == (served / item.source / item.remote).read_bytes(), item.path
        # what the stages read: the same questions as the offline folder's, the split's among them
        built = [json.loads(line) for line in (out / "hotpotqa" / "with_context.jsonl").read_text(encoding="utf-8").splitlines()]
        shared = [json.loads(line) for line in (SHARED / "hotpotqa" / "with_context.jsonl").read_text(encoding="utf-8").splitlines()]
        keys = ("_id", "question", "answer", "supporting_facts", "split", "type", "level")
        assert [tuple(str(r.get(k)) for k in keys) for r in built] == [tuple(str(r.get(k)) for k in keys) for r in shared]
        assert [r.get("react_dev_idx") for r in built] == [r.get("react_dev_idx") for r in shared]
        pages = [json.loads(line) for line in (out / "wiki" / "corpus.jsonl").read_text(encoding="utf-8").splitlines()]
        assert len({p["title"] for p in pages}) == len(pages) > 20000
        # a re-run asks the sources for nothing and keeps every file
        asked = len(sources.requests)
        again = run_pipeline("data", "build", "--out", str(out), *sources.urls(), timeout=600)
        assert again.returncode == 0 and len(sources.requests) == asked, again.stderr[-2000:]
        assert "downloaded" not in again.stdout and again.stdout.count("kept ") == len(COPIED) + 1
    finally:
        sources.close()
    # the offline split, read from the built folder alone (no mirror), is the committed one
    from pipeline.tasks.hotpotqa.questions import load_question_set

    monkeypatch.setenv("REACT_PIPELINE_DATA", str(tmp_path / "empty"))
    monkeypatch.setenv("REACT_PIPELINE_MIRROR", str(out))  # the built folder as the stages' mirror
    from_built = {name: load_question_set(name) for name in ("offline-eval", "offline-bootstrap")}
    monkeypatch.setenv("REACT_PIPELINE_MIRROR", str(SHARED))
    monkeypatch.setenv("REACT_PIPELINE_DATA", str(tmp_path / "empty"))
    for name, questions in from_built.items():
        mirrored = load_question_set(name)
        assert [(q.id, q.question, q.answer) for q in questions] == [(q.id, q.question, q.answer) for q in mirrored]


def test_unreachable_sources_and_offline_mode_are_one_line_and_leave_no_half_file(tmp_path):
    out = tmp_path / "data"
    dead = Sources(tmp_path)
    urls = dead.urls()
    dead.close()  # nothing listens there now
    proc = run_pipeline("data", "build", "--out", str(out), *urls)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("error: could not download http://127.0.0.1:")
    assert not [p for p in out.rglob("*") if p.is_file()]
    proc = run_pipeline("data", "build", "--out", str(out), *urls, env={"REACT_PIPELINE_OFFLINE": "1"})
    assert proc.returncode == 2 and "downloads are off (REACT_PIPELINE_OFFLINE)" in proc.stderr, proc.stderr


def test_the_default_folder_is_where_the_stages_look_for_the_mirror(monkeypatch, tmp_path):
    from pipeline.core.paths import REPO_ROOT, mirror_dir

    monkeypatch.setenv("REACT_PIPELINE_MIRROR", str(tmp_path))
    assert default_folder() == mirror_dir() == tmp_path
    monkeypatch.delenv("REACT_PIPELINE_MIRROR")
    assert default_folder() == REPO_ROOT.parent / "shared" / "data"
