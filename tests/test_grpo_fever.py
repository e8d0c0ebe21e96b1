"""GRPO on FEVER (`task: fever`): the policy reads claim lines, its reward is FEVER's accuracy
(the task's own `scores`, no partial credit), its final/ says FEVER; and a tiny policy learns the
labels. Real parts, as tests/test_grpo.py: TRL's GRPOTrainer through the project's ReAct loop.

    .venv/bin/python -m pytest tests/test_grpo_fever.py -m "not slow"   # one short run
    .venv/bin/python -m pytest tests/test_grpo_fever.py                 # + learning (40 steps)

The world (tests/rl_testdata.py, build_fever_world): sixteen pages, each naming a colour, gold or
red; a claim per page, "The colour of alpha is gold.", SUPPORTS where the page says gold and
REFUTES where it says red. The warm start knows the format and gives the right label 30% of the
time (the other label otherwise): about 65% accuracy, which GRPO has to raise.
"""

from __future__ import annotations

import json

import pytest
from rl_testdata import build_fever_world, warm_start
from test_grpo import LEARNING_MARGIN, log_history, one_thread, world_cfg

from pipeline.tasks import get_task

FEVER = get_task("fever")


@pytest.fixture(scope="module")
def fever_world(tmp_path_factory):
    return build_fever_world(tmp_path_factory.mktemp("fever-world"))


@pytest.fixture(scope="module")
def fever_student(fever_world, tmp_path_factory):
    """The warm-started FEVER policy (SFT, plain torch, one core)."""
    with one_thread():
        return warm_start(fever_world, tmp_path_factory.mktemp("fever-warm"), copy_rate=0.3, steps=500, task="fever")


def rollouts_of(output_dir, step: int) -> list[dict]:
    path = output_dir / "rollouts" / f"step-{step:06d}.rank-0.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


# A Finish where FEVER's scores and HotpotQA's differ: HotpotQA's EM is FEVER's accuracy on a
# one-word label (the same normalisation), but its token F1 gives this one partial credit.
WORDY = {"prediction": ["SUPPORTS, it is gold"], "answer": ["SUPPORTS"], "completions": [""]}


def test_fevers_reward_is_fevers_accuracy_where_hotpotqas_metric_differs():
    from pipeline.rl.reward import reward_functions

    em, f1, _ = reward_functions(FEVER)
    assert em(**WORDY) == f1(**WORDY) == [0.0]
    assert get_task("hotpotqa").scores(WORDY["prediction"][0], "SUPPORTS")["f1"] == pytest.approx(0.4)


def test_a_fever_run_reads_claims_and_is_rewarded_by_fevers_accuracy(fever_world, fever_student, tmp_path, monkeypatch):
    """Two steps of 4 claims x 4 rollouts: the run's reward functions are built from FEVER's
    scores (and score WORDY as FEVER does), every rollout starts with the claim line, its `em` is
    FEVER's accuracy of its Finish, each step's logged reward is their mean; the final/ manifest
    and card name FEVER and its claim line."""
    from pipeline.rl import reward
    from pipeline.rl.train import run

    built, real = [], reward.reward_functions  # (task, functions) of each reward_functions call the run makes

    def recording(task):
        built.append((task, real(task)))
        return built[-1][1]

    monkeypatch.setattr(reward, "reward_functions", recording)
    cfg = world_cfg(fever_world, fever_student, tmp_path / "ck", "task=fever", "questions_per_step=4", "group_size=4",
                    "max_steps=2", "save_steps=2")
    with one_thread():
        manifest = run(cfg)
    [(task, (em, f1, _))] = built
    assert task.name == "fever" and em(**WORDY) == f1(**WORDY) == [0.0]
    assert (manifest["task"], manifest["prompt_format"], manifest["steps"]) == ("fever", "Claim: {question}\n", 2)
    history = log_history(cfg.output_dir)
    assert len(history) == 2
    labels = set()
    for step, entry in enumerate(history, 1):
        rollouts = rollouts_of(cfg.output_dir, step)
        assert len(rollouts) == 16 and all(r["text"].startswith("Claim: The colour of ") for r in rollouts)
        assert all(r["em"] == FEVER.score(r["prediction"], r["gold_answer"]) for r in rollouts)
        mean = sum(r["em"] for r in rollouts) / len(rollouts)
        assert entry["rewards/em/mean"] == pytest.approx(mean) and entry["reward"] == pytest.approx(mean)
        assert entry["rewards/f1/mean"] == pytest.approx(mean)  # a label has no partial credit
        labels |= {r["prediction"] for r in rollouts if r["finished"]}
    assert labels == {"SUPPORTS", "REFUTES"}  # the warm start answers both, right and wrong
    card = (cfg.output_dir / "final" / "README.md").read_text(encoding="utf-8")
    assert "GRPO in the FEVER Wikipedia environment (react)" in card and "`Claim: <claim>\\n`" in card
    assert "rewarded by the task's metric (accuracy)" in card and "FEVER (Thorne et al. 2018)" in card
    assert 'datasets: ["fever/fever"]' in card and '"fever", "grpo"' in card and "HotpotQA (Yang" not in card


@pytest.mark.slow
def test_grpo_learns_fevers_labels(fever_world, fever_student, tmp_path):
    """40 steps of 8 claims x 8 rollouts (in process): the mean reward (FEVER accuracy) of the last
    5 steps exceeds the first 5 steps' by LEARNING_MARGIN, and greedy accuracy on the 16 claims
    (`eval task=fever` of the final/) rises over the warm start's."""
    from pipeline.core.config import load_config
    from pipeline.rl.train import run
    from pipeline.stages.eval import EvalConfig, evaluate

    cfg = world_cfg(fever_world, fever_student, tmp_path / "ck", "task=fever", "questions_per_step=8", "group_size=8",
                    "max_steps=40", "save_steps=40", "log_rollouts=false")
    with one_thread():
        run(cfg)
    rewards = [e["reward"] for e in log_history(cfg.output_dir)]
    assert len(rewards) == 40
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    print(f"[grpo fever learning] mean accuracy of the first 5 steps {first:.3f}, of the last 5 {last:.3f}")
    assert last - first >= LEARNING_MARGIN, rewards

    def greedy_accuracy(checkpoint, out) -> float:
        eval_cfg = load_config(EvalConfig, None, [
            "task=fever", f"finetuned={checkpoint}", f"questions={fever_world.questions}",
            f"wiki.index={fever_world.index}", f"wiki.corpus=[{fever_world.corpus}]", f"out_dir={out}",
            "prompting.max_new_tokens=24", "prompting.max_steps=4", "model.dtype=float32", "size_class=tiny",
            "params_b=0.0001"])
        [row] = evaluate(eval_cfg)
        assert row["task"] == "fever"
        return row["em"]

    from test_grpo import warm_start_final

    before = greedy_accuracy(warm_start_final(fever_student, tmp_path), tmp_path / "eval-before")
    after = greedy_accuracy(cfg.output_dir / "final", tmp_path / "eval-after")
    print(f"[grpo fever learning] greedy accuracy on the 16 claims: {before:.3f} -> {after:.3f}")
    assert after > before
