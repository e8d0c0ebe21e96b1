"""HotpotQA data layer: formats, source resolution, downloads, named sets, the offline split, CLI."""

import json
import os
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pipeline.core.download import USER_AGENT, download
from pipeline.core.errors import PipelineError
from pipeline.core.paths import REPO_ROOT, SOURCES, data_dir, mirror_dir, resolve_source
from pipeline.tasks.hotpotqa import questions as hotpotqa
from pipeline.tasks.hotpotqa.questions import (
    Question,
    build_offline_split,
    detect_format,
    load_file,
    load_question_set,
    questions_from_hf,
    react_dev500_indices,
)

OFFICIAL = [
    {"_id": "5a8b57f25542995d1e6f1371", "question": "Were Scott Derrickson and Ed Wood of the same nationality?",
     "answer": "yes", "type": "comparison", "level": "hard",
     "supporting_facts": [["Scott Derrickson", 0], ["Ed Wood", 0]],
     "context": [["Ed Wood", ["Edward Davis Wood Jr. was an American filmmaker."]],
                 ["Scott Derrickson", ["Scott Derrickson is an American director.", " He lives in LA."]]]},
    {"_id": "5a8c7595554299585d9e36b6", "question": "What government position was held by the woman who "
     "portrayed Corliss Archer in the film Kiss and Tell?", "answer": "Chief of Protocol", "type": "bridge",
     "level": "medium", "supporting_facts": [["Kiss and Tell (1945 film)", 0], ["Shirley Temple", 1]],
     "context": [["Kiss and Tell (1945 film)", ["Kiss and Tell is a 1945 comedy film."]],
                 ["Shirley Temple", ["Shirley Temple was an actress.", " She was Chief of Protocol."]]]},
]
SIMPLIFIED = [{"question": q["question"], "answer": q["answer"], "type": q["type"]} for q in OFFICIAL]


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """An empty data/ cache and an empty mirror under tmp_path; downloads allowed."""
    (tmp_path / "data").mkdir()
    (tmp_path / "mirror").mkdir()
    monkeypatch.setenv("REACT_PIPELINE_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("REACT_PIPELINE_MIRROR", str(tmp_path / "mirror"))
    monkeypatch.delenv("REACT_PIPELINE_OFFLINE", raising=False)
    return tmp_path


@pytest.fixture
def mirror_is_shared(shared_data, tmp_path, monkeypatch):
    """The shared offline data as the mirror, an empty data/ cache, no downloads."""
    monkeypatch.setenv("REACT_PIPELINE_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("REACT_PIPELINE_MIRROR", str(shared_data))
    monkeypatch.setenv("REACT_PIPELINE_OFFLINE", "1")
    return shared_data


class FileServer:
    """A real HTTP server on 127.0.0.1 serving `routes` (path -> bytes); records each request."""

    def __init__(self):
        self.routes: dict[str, bytes] = {}
        self.requests: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                outer.requests.append({"path": self.path, "user_agent": self.headers.get("User-Agent")})
                body = outer.routes.get(self.path)
                if self.path == "/truncated":
                    self.send_response(200)
                    self.send_header("Content-Length", "1000")
                    self.end_headers()
                    self.wfile.write(b"x" * 100)
                    self.close_connection = True
                    return
                if body is None:
                    self.send_error(404, "Not Found")
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    srv = FileServer()
    yield srv
    srv.close()


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/nothing.json"


def write_json(path: Path, obj) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj), encoding="utf-8")
    return path


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# ---------------------------------------------------------------- formats


def test_official_json(tmp_path):
    path = write_json(tmp_path / "hotpot_dev_distractor_v1.json", OFFICIAL)
    assert detect_format(path) == "official"
    questions = load_file(path, split="dev")
    assert [q.id for q in questions] == [r["_id"] for r in OFFICIAL]
    q = questions[1]
    assert q.answer == "Chief of Protocol" and q.type == "bridge" and q.level == "medium"
    assert q.supporting_facts == [["Kiss and Tell (1945 film)", 0], ["Shirley Temple", 1]]
    assert q.context[1] == ["Shirley Temple", ["Shirley Temple was an actress.", " She was Chief of Protocol."]]
    assert q.gold_titles == ["Kiss and Tell (1945 film)", "Shirley Temple"]
    assert q.split == "dev" and q.source == path.name
    assert Question.from_dict(q.to_dict()) == q


def test_simplified_json_ids_are_positions(tmp_path):
    path = write_json(tmp_path / "simple.json", SIMPLIFIED)
    assert detect_format(path) == "simplified"
    questions = load_file(path)
    assert [q.id for q in questions] == ["dev:0", "dev:1"]
    assert questions[0].answer == "yes" and questions[0].context is None and questions[0].supporting_facts == []


def test_with_context_jsonl(tmp_path):
    rows = [dict(r, split=s, context_setting="distractor") for r, s in zip(OFFICIAL, ["dev", "train"], strict=True)]
    path = write_lines(tmp_path / "with_context.jsonl", [json.dumps(r) for r in rows])
    assert detect_format(path) == "jsonl"
    questions = load_file(path)
    assert [q.id for q in questions] == [r["_id"] for r in OFFICIAL]
    assert [q.split for q in questions] == ["dev", "train"]
    assert questions[0].context[0][0] == "Ed Wood"


def hf_dataset():
    datasets = pytest.importorskip("datasets")
    from datasets import Features, Sequence, Value

    features = Features({  # the hub's hotpotqa/hotpot_qa schema
        "id": Value("string"), "question": Value("string"), "answer": Value("string"),
        "type": Value("string"), "level": Value("string"),
        "supporting_facts": Sequence({"title": Value("string"), "sent_id": Value("int32")}),
        "context": Sequence({"title": Value("string"), "sentences": Sequence(Value("string"))}),
    })
    records = [{
        "id": r["_id"], "question": r["question"], "answer": r["answer"], "type": r["type"], "level": r["level"],
        "supporting_facts": {"title": [t for t, _ in r["supporting_facts"]], "sent_id": [i for _, i in r["supporting_facts"]]},
        "context": {"title": [t for t, _ in r["context"]], "sentences": [s for _, s in r["context"]]},
    } for r in OFFICIAL]
    return datasets.Dataset.from_list(records, features=features)


def test_hf_dataset_converter_matches_official(tmp_path):
    dataset = hf_dataset()
    from_hf = questions_from_hf(dataset, split="validation")
    from_official = load_file(write_json(tmp_path / "o.json", OFFICIAL), split="validation")
    for a, b in zip(from_hf, from_official, strict=True):
        assert (a.id, a.question, a.answer, a.type, a.level) == (b.id, b.question, b.answer, b.type, b.level)
        assert a.supporting_facts == b.supporting_facts and a.context == b.context
    # the same records exported by `datasets` load as a file too
    exported = tmp_path / "hf.jsonl"
    dataset.to_json(str(exported))
    assert detect_format(exported) == "hf-jsonl"
    assert [q.context for q in load_file(exported)] == [q.context for q in from_official]


def test_unknown_and_corrupt_inputs(tmp_path):
    with pytest.raises(PipelineError, match="unknown format"):
        load_file(write_json(tmp_path / "x.json", [{"foo": 1}]))
    with pytest.raises(PipelineError, match="unknown format"):
        load_file(write_lines(tmp_path / "x.txt", ["hello"]))
    with pytest.raises(PipelineError, match="empty"):
        load_file(write_lines(tmp_path / "e.json", [""]))
    with pytest.raises(PipelineError, match="not found"):
        load_file(tmp_path / "missing.json")
    good = json.dumps(dict(OFFICIAL[0], split="dev"))
    corrupt = write_lines(tmp_path / "c.jsonl", [good, '{"_id": "broken", "question": ', good])
    with pytest.raises(PipelineError, match=rf"{corrupt}:2: not valid JSON"):
        load_file(corrupt)
    torn = write_lines(tmp_path / "t.jsonl", [good, good[:40]])  # an input file, so a torn tail is an error
    with pytest.raises(PipelineError, match=rf"{torn}:2: not valid JSON"):
        load_file(torn)
    truncated = tmp_path / "trunc.json"
    truncated.write_text(json.dumps(OFFICIAL)[:-30], encoding="utf-8")
    with pytest.raises(PipelineError, match=rf"{truncated}:1: not valid JSON"):
        load_file(truncated)
    no_answer = write_json(tmp_path / "test_fullwiki.json", [OFFICIAL[0], {k: v for k, v in OFFICIAL[1].items() if k != "answer"}])
    with pytest.raises(PipelineError, match="item 1: malformed official record"):
        load_file(no_answer)
    mixed = write_lines(tmp_path / "m.jsonl", [good, json.dumps({"foo": 1})])
    with pytest.raises(PipelineError, match=rf"{mixed}:2: record does not match"):
        load_file(mixed)


# ---------------------------------------------------------------- sources and downloads


def test_download_from_local_server(server, tmp_path):
    body = os.urandom(3 * 1024 * 1024 + 17)  # several read chunks
    server.routes["/dir/file.bin"] = body
    dest = tmp_path / "sub" / "file.bin"
    assert download(server.url + "/dir/file.bin", dest, quiet=True) == dest
    assert dest.read_bytes() == body
    assert server.requests[-1]["user_agent"] == USER_AGENT and "react-finetune-pipeline" in USER_AGENT
    assert sorted(p.name for p in dest.parent.iterdir()) == ["file.bin"]  # no temporary left behind


@pytest.mark.parametrize("path, message", [("/missing", "HTTP 404"), ("/truncated", "cut short")])
def test_download_failures_leave_nothing(server, tmp_path, path, message):
    dest = tmp_path / "out" / "f.json"
    with pytest.raises(PipelineError, match=message):
        download(server.url + path, dest, quiet=True)
    assert not dest.exists() and (not dest.parent.exists() or list(dest.parent.iterdir()) == [])


def test_download_unreachable(tmp_path):
    with pytest.raises(PipelineError, match="could not download"):
        download(closed_port_url(), tmp_path / "f.json", timeout=5, quiet=True)
    assert not (tmp_path / "f.json").exists()


def test_resolution_order(isolated, server, monkeypatch):
    server.routes["/prompts.json"] = b'{"from": "download"}'
    where = dict(mirror_relpath="react/p.json", cache_relpath="react/p.json", url=server.url + "/prompts.json")
    explicit = write_json(isolated / "mine.json", {"from": "explicit"})
    cached = write_json(isolated / "data" / "react" / "p.json", {"from": "cache"})
    mirrored = write_json(isolated / "mirror" / "react" / "p.json", {"from": "mirror"})

    assert resolve_source("prompts", explicit, **where) == explicit
    assert resolve_source("prompts", **where) == cached
    cached.unlink()
    assert resolve_source("prompts", **where) == mirrored
    assert server.requests == []
    mirrored.unlink()
    got = resolve_source("prompts", **where)  # downloaded into the cache
    assert got == data_dir() / "react" / "p.json" and json.loads(got.read_text()) == {"from": "download"}
    assert len(server.requests) == 1
    assert resolve_source("prompts", **where) == got and len(server.requests) == 1  # now cached

    got.unlink()
    monkeypatch.setenv("REACT_PIPELINE_OFFLINE", "1")
    with pytest.raises(PipelineError, match="downloads are off"):
        resolve_source("prompts", **where)
    assert len(server.requests) == 1
    with pytest.raises(PipelineError, match="does not exist"):
        resolve_source("prompts", isolated / "nope.json", **where)  # a wrong explicit path never falls back


def test_offline_error_says_how_to_provide(isolated, monkeypatch):
    monkeypatch.setitem(SOURCES, "react-prompts", SOURCES["react-prompts"].__class__(
        **{**SOURCES["react-prompts"].__dict__, "url": closed_port_url()}))
    with pytest.raises(PipelineError) as err:
        resolve_source("react-prompts")
    message = str(err.value)
    assert "could not download" in message
    assert str(isolated / "data" / "react" / "prompts_naive.json") in message  # where to put it
    assert "python -m pipeline data fetch prompts" in message  # which command downloads it
    assert "REACT_PIPELINE_MIRROR" in message and "\n" not in message
    with pytest.raises(PipelineError, match="unknown data source"):
        resolve_source("no-such-thing")


def test_mirror_dir_default_and_overrides(monkeypatch, tmp_path):
    monkeypatch.delenv("REACT_PIPELINE_MIRROR", raising=False)
    default = REPO_ROOT.parent / "shared" / "data"
    assert mirror_dir() == (default if default.is_dir() else None)
    monkeypatch.setenv("REACT_PIPELINE_MIRROR", "none")
    assert mirror_dir() is None
    monkeypatch.setenv("REACT_PIPELINE_MIRROR", str(tmp_path))
    assert mirror_dir() == tmp_path
    monkeypatch.delenv("REACT_PIPELINE_DATA", raising=False)
    assert data_dir() == REPO_ROOT / "data"


# ---------------------------------------------------------------- named sets


def test_react_dev500_indices():
    idx = react_dev500_indices()
    assert idx[:5] == [3687, 6238, 5388, 3522, 3824]
    assert len(idx) == 500 == len(set(idx)) and all(0 <= i < 7405 for i in idx)
    assert idx == react_dev500_indices()


def test_react_dev500_from_mirror(mirror_is_shared):
    dev = json.loads((mirror_is_shared / "hotpotqa" / "dev_simplified.json").read_text(encoding="utf-8"))
    questions = load_question_set("react-dev500")
    assert len(questions) == 500
    assert [q.id for q in questions[:3]] == ["dev:3687", "dev:6238", "dev:5388"]
    for q, i in zip(questions, react_dev500_indices(), strict=True):
        assert (q.question, q.answer, q.type, q.split) == (dev[i]["question"], dev[i]["answer"], dev[i]["type"], "dev")
    with_context = [q for q in questions if q.context is not None]
    assert len(with_context) == 130  # rows of with_context.jsonl whose react_dev_idx is in the sample
    assert all(q.supporting_facts and q.level for q in with_context)
    assert load_question_set("react-dev500", limit=7) == questions[:7]


def test_react_dev500_prefers_official_dev_in_cache(isolated):
    # a 7,405-record file in the official format in data/: it wins over a simplified mirror copy
    records = [{"_id": f"id{i}", "question": f"question {i}?", "answer": f"answer {i}", "type": "bridge",
                "level": "easy", "supporting_facts": [[f"T{i}", 0]], "context": [[f"T{i}", [f"s{i}"]]]}
               for i in range(7405)]
    write_json(isolated / "data" / "hotpotqa" / "hotpot_dev_distractor_v1.json", records)
    write_json(isolated / "mirror" / "hotpotqa" / "dev_simplified.json", SIMPLIFIED)
    questions = load_question_set("react-dev500", limit=3)
    assert [q.id for q in questions] == ["dev:3687", "dev:6238", "dev:5388"]
    assert questions[0].question == "question 3687?" and questions[0].context == [["T3687", ["s3687"]]]
    (isolated / "data" / "hotpotqa" / "hotpot_dev_distractor_v1.json").unlink()
    with pytest.raises(PipelineError, match="expected the 7405"):
        load_question_set("react-dev500")  # the 2-question mirror file is not a dev set


def test_unknown_question_set():
    with pytest.raises(PipelineError, match="unknown question set 'dev500'"):
        load_question_set("dev500")


# ---------------------------------------------------------------- offline split


def split_ids(part: str) -> dict:
    return json.loads((hotpotqa.SPLITS_DIR / hotpotqa.OFFLINE_SPLIT / f"{part}.json").read_text(encoding="utf-8"))


def test_committed_split_is_disjoint_and_gold_in_corpus(mirror_is_shared):
    eval_split, boot_split = split_ids("eval"), split_ids("bootstrap")
    assert eval_split["seed"] == boot_split["seed"] == 0
    eval_ids, boot_ids = eval_split["ids"], boot_split["ids"]
    assert len(eval_ids) >= 500 and len(set(eval_ids)) == len(eval_ids) and len(set(boot_ids)) == len(boot_ids)
    assert not set(eval_ids) & set(boot_ids)

    rows = {r["_id"]: r for r in hotpotqa.read_with_context(mirror_is_shared / "hotpotqa" / "with_context.jsonl")}
    titles = hotpotqa.corpus_titles(mirror_is_shared / "wiki" / "corpus.jsonl")
    react = set(react_dev500_indices())
    for i in eval_ids:
        row = rows[i]
        assert row["split"] == "dev" and row["context_setting"] == "distractor"
        assert row["supporting_facts"] and all(t in titles for t, _ in row["supporting_facts"])
    assert not any(rows[i].get("react_dev_idx") in react for i in boot_ids)
    train = {i for i, r in rows.items() if r["split"] == "train"}
    assert train <= set(boot_ids)
    # every dev row is in eval, in bootstrap, or left out only because it is in react-dev500
    for i, row in rows.items():
        if row["split"] == "dev":
            assert (i in eval_ids) + (i in boot_ids) + (row["react_dev_idx"] in react and i not in eval_ids) == 1

    questions = load_question_set("offline-eval")
    assert [q.id for q in questions] == eval_ids and all(q.context for q in questions)
    assert len(load_question_set("offline-bootstrap", limit=10)) == 10
    split_file = hotpotqa.SPLITS_DIR / hotpotqa.OFFLINE_SPLIT / "eval.json"
    assert detect_format(split_file) == "split"
    assert [q.id for q in load_question_set(split_file, limit=3)] == eval_ids[:3]


def test_split_is_deterministic_and_seeded(mirror_is_shared):
    rows = hotpotqa.read_with_context(mirror_is_shared / "hotpotqa" / "with_context.jsonl")
    titles = hotpotqa.corpus_titles(mirror_is_shared / "wiki" / "corpus.jsonl")
    again = build_offline_split(list(reversed(rows)), titles, seed=0, exclude_dev_indices=react_dev500_indices())
    assert again["eval"] == split_ids("eval")["ids"] and again["bootstrap"] == split_ids("bootstrap")["ids"]
    other = build_offline_split(rows, titles, seed=1, exclude_dev_indices=react_dev500_indices())
    assert other["eval"] != again["eval"] and set(other["bootstrap"]) != set(again["bootstrap"])


def test_split_prefers_distractor_and_refuses_too_few():
    def row(i, setting, titles, split="dev"):
        return {"_id": f"q{i:02d}", "split": split, "context_setting": setting, "react_dev_idx": i,
                "supporting_facts": [[t, 0] for t in titles]}

    rows = ([row(i, "distractor", ["A", "B"]) for i in range(4)] + [row(i, "fullwiki", ["A"]) for i in range(4, 8)]
            + [row(8, "distractor", ["A", "Missing"]), row(9, "distractor", ["A"], split="train")])
    result = build_offline_split(rows, {"A", "B"}, seed=3, eval_size=6, exclude_dev_indices=[7, 8])
    assert set(result["eval"][:4]) == {"q00", "q01", "q02", "q03"} and len(result["eval"]) == 6
    assert set(result["eval"][4:]) < {"q04", "q05", "q06", "q07"}
    left = {"q04", "q05", "q06", "q07"} - set(result["eval"]) - {"q07"}
    assert set(result["bootstrap"]) == left | {"q09"}  # q08 excluded (react index), q09 is train
    with pytest.raises(PipelineError, match="only 8 dev questions"):
        build_offline_split(rows, {"A", "B"}, eval_size=9)


# ---------------------------------------------------------------- CLI


def run_cli(*args, env_extra=None, timeout=120):
    env = {**os.environ, "REACT_PIPELINE_OFFLINE": "1", **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "pipeline", "data", *map(str, args)], cwd=REPO_ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout)


def test_cli_help():
    for args in (["--help"], ["fetch", "--help"], ["show", "--help"], ["split", "--help"]):
        result = run_cli(*args)
        assert result.returncode == 0, result.stderr
        assert "usage: python -m pipeline data" in result.stdout


def test_cli_show_and_split(mirror_is_shared, tmp_path):
    env = {"REACT_PIPELINE_DATA": str(tmp_path / "data"), "REACT_PIPELINE_MIRROR": str(mirror_is_shared)}
    shown = run_cli("show", "react-dev500", "--sample", "2", env_extra=env)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("react-dev500: 500 questions") and "- dev:3687 [" in shown.stdout

    fetched = run_cli("fetch", "prompts", env_extra=env)
    assert fetched.returncode == 0, fetched.stderr
    assert str(mirror_is_shared / "react" / "prompts_naive.json") in fetched.stdout and "local mirror" in fetched.stdout

    out = tmp_path / "split"
    made = run_cli("split", "--seed", "0", "--out", out, env_extra=env)
    assert made.returncode == 0, made.stderr
    for part in ("eval", "bootstrap"):
        assert json.loads((out / f"{part}.json").read_text())["ids"] == split_ids(part)["ids"]
    assert "seed 0" in (out / "README.md").read_text()


def test_cli_errors_exit_2_with_one_line(tmp_path):
    env = {"REACT_PIPELINE_DATA": str(tmp_path / "data"), "REACT_PIPELINE_MIRROR": "none"}
    missing = run_cli("fetch", "prompts", env_extra=env)
    assert missing.returncode == 2
    assert missing.stderr.startswith("error: react-prompts not found") and missing.stderr.count("\n") == 1
    assert "python -m pipeline data fetch prompts" in missing.stderr

    corrupt = write_lines(tmp_path / "bad.jsonl", [json.dumps(OFFICIAL[0]), "{oops", json.dumps(OFFICIAL[1])])
    shown = run_cli("show", corrupt, env_extra=env)
    assert shown.returncode == 2 and f"{corrupt}:2: not valid JSON" in shown.stderr
    assert "Traceback" not in shown.stderr

    assert run_cli("show", "nope", env_extra=env).returncode == 2
    assert run_cli("fetch", "bogus", env_extra=env).returncode == 2  # argparse rejects the choice
