"""pipeline/report/copies.py: the answers an eval or a teacher said again (the one said most, and
a prompted model's copies of its exemplars' answers), read from a real eval folder (the eval CLI against a scripted teacher on a stand-in server, labelled as such:
it answers what the test tells it to, so the copies are known) over the real 26k-page index in
the retriever mode, with the paper's exemplars as this mode ships them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from episode_testdata import REPO, ScriptedTeacher, child_env, run_pipeline, write_questions
from http_servers import FakeOpenAI

from pipeline.methods.prompts import load_prompt
from pipeline.report.copies import copies_markdown, exemplar_answers, folder_copies


def copies_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline.report.copies", *args], cwd=REPO, env=child_env(),
                          capture_output=True, text=True, timeout=120)


def test_the_exemplar_answers_of_each_shipped_set_in_prompt_order():
    """The last answer is the exemplar next to the question: the paper's sets end in yes, ours in 1948."""
    for fmt in ("standard", "cot", "act", "react"):
        ours = exemplar_answers(load_prompt(fmt, "ours", search="bm25").exemplars)
        assert ours == ["The Conversation", "66,135", "no", "mathematician", "July 8, 1951", "1948"], fmt
        paper = exemplar_answers(load_prompt(fmt, "paper", search="bm25").exemplars)
        assert len(paper) == 6 and paper[0] == "1,800 to 7,000 ft" and paper[-1].lower() == "yes", (fmt, paper)
    assert exemplar_answers(load_prompt("act", "ours").exemplars)[-1] == "1948"  # the title mode's set too


def copying_run(stage: str, out, index):
    """A prompted `eval` or `generate` (Act and Standard, the paper's exemplars, bm25) of four
    questions by a scripted teacher (a stand-in server): the first, whose gold answer is yes,
    answered yes (a right copy of the last exemplar's answer); the second answered yes (a wrong
    copy); the third answered the first exemplar's answer (a wrong copy of another exemplar); the
    fourth answered right."""
    from pipeline.tasks.hotpotqa.questions import load_question_set

    pool = load_question_set("offline-eval")
    yes = next(q for q in pool if q.answer == "yes")
    others = [q for q in pool if q.answer.lower() not in ("yes", "no")][:3]
    questions = [yes, *others]
    answers = {others[0].question: "yes", others[1].question: "1,800 to 7,000 ft"}
    model = {"eval": ("model", "size_class=270m", "params_b=0.27"), "generate": ("teacher",)}[stage]
    with FakeOpenAI(model="copier") as server:
        server.replies = ScriptedTeacher(questions, answers=answers)
        proc = run_pipeline(stage, f"{model[0]}.backend=openai", f"{model[0]}.model=copier",
                            f"{model[0]}.base_url={server.url}/v1", *model[1:],
                            f"questions={write_questions(out.parent / 'q.jsonl', questions)}",
                            f"wiki.index={index}", "wiki.search=bm25", "prompting.exemplars=paper",
                            f"out_dir={out}", "methods=[act,standard]")
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture(scope="module")
def copying_eval(tmp_path_factory, index):
    return copying_run("eval", tmp_path_factory.mktemp("eval") / "copying-prompt", index)


def counts(c) -> tuple:
    return (c.n, c.right, c.most.answer, c.most.times, c.most.right, c.last_exemplar.times, c.last_exemplar.right,
            c.any_exemplar.times, c.any_exemplar.right, c.right_without_copies)


def test_a_prompted_eval_folders_copies_are_counted_per_method(copying_eval):
    act, standard = folder_copies(copying_eval)
    assert counts(act) == (4, 2, "yes", 2, 1, 2, 1, 3, 1, 1), act
    assert counts(standard) == (4, 2, "yes", 2, 1, 2, 1, 3, 1, 1), standard
    assert act.last_exemplar.answer == "yes" and standard.last_exemplar.answer == "Yes"  # as each format's exemplars write it
    table = copies_markdown([("copying-prompt", act)])
    assert "| copying-prompt | act | 4 | 50.0 | 'yes' 2 | 1 | 'yes' 2 | 1 | 3 | 1 | 25.0 |" in table


def test_a_prompted_teachers_generate_folder_is_read_the_same_way(tmp_path, index):
    """The teacher's episodes (generate's folder): the same counts, so a report can say how many of
    the rows a prompted teacher's data keeps are copies."""
    for c in folder_copies(copying_run("generate", tmp_path / "generate", index)):
        assert counts(c) == (4, 2, "yes", 2, 1, 2, 1, 3, 1, 1), c


def test_a_folder_without_exemplars_gets_the_answer_said_most_alone(copying_eval, tmp_path):
    """A fine-tuned student's eval (zero-shot: no exemplars) or the stand-in's generate run: the
    answer said most is counted, the exemplar columns are dashes."""
    manifest = json.loads((copying_eval / "manifest.json").read_text())
    for name, changes in (("tuned", {"mode": "finetune"}),
                          ("oracle", {"stage": "generate", "config": {**manifest["config"], "oracle": "agent"}})):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "manifest.json").write_text(json.dumps({**manifest, **changes}))
        for method in ("act", "standard"):
            (folder / f"{method}.jsonl").write_bytes((copying_eval / f"{method}.jsonl").read_bytes())
        act = folder_copies(folder)[0]
        assert (act.most.answer, act.most.times, act.most.right, act.last_exemplar, act.any_exemplar) == ("yes", 2, 1, None, None)
        assert f"| {name} | act | 4 | 50.0 | 'yes' 2 | 1 | – | – | – | – | – |" in copies_markdown([(name, act)])


def test_the_command_refuses_what_it_cannot_read_in_one_line(copying_eval, tmp_path):
    """An unfinished run, a missing folder, a listed method without records: exit 2, one line."""
    def refused(folder) -> str:
        proc = copies_cli(str(folder))
        assert proc.returncode == 2 and proc.stdout == "", (proc.returncode, proc.stdout, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
        return lines[0]

    manifest = json.loads((copying_eval / "manifest.json").read_text())
    unfinished, no_records = tmp_path / "unfinished", tmp_path / "no-records"
    for folder, changes in ((unfinished, {"complete": False}), (no_records, {})):
        folder.mkdir()
        (folder / "manifest.json").write_text(json.dumps({**manifest, **changes}))
    assert "incomplete" in refused(unfinished)
    assert "act.jsonl: no records of act" in refused(no_records)
    assert "no manifest" in refused(tmp_path / "nothing-here")
    ok = copies_cli(str(copying_eval))
    assert ok.returncode == 0 and "| copying-prompt | standard | 4 | 50.0 | 'yes' 2 | 1 | 'Yes' 2 | 1 | 3 | 1 | 25.0 |" in ok.stdout, ok.stderr
