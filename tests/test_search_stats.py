"""Search statistics read from episode records, the Wilson interval, and the oracle-probe report
script, on hand-made records whose counts are worked out by hand.

    .venv/bin/python -m pytest tests/test_search_stats.py
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.agent.search_stats import episode_searches, search_stats
from pipeline.report.intervals import difference_interval, mcnemar_exact, wilson

REPO = Path(__file__).resolve().parents[1]
PAGE = "Adorable was an alternative rock band, formed in Coventry in 1990."
MISS = "Could not find Adorable. Similar: ['Adorable (band)', 'Dubrovniks']."


def step(action: str, observation: str) -> dict:
    return {"thought": None, "action": action, "observation": observation}


def record(em: float, *steps: dict, finished: bool = True) -> dict:
    return {"id": str(len(steps)), "em": em, "finished": finished, "steps": list(steps)}


RECORDS = [
    # missed, recovered, one Lookup: 2 searches, 1 hit
    record(1.0, step("Search[Adorable]", MISS), step("Search[Adorable (band)]", PAGE),
           step("Lookup[Coventry]", f"(Result 1 / 1) {PAGE}"), step("Finish[Adorable]", "Episode finished, reward = 1")),
    # missed twice, never recovered: 2 searches, 0 hits
    record(0.0, step("search[Adorable]", MISS), step("Search[Adorable band]", "Could not find Adorable band. Similar: []."),
           step("Finish[Lit]", "Episode finished, reward = 0")),
    # a hit, then a miss: missed but not recovered (the hit came before)
    record(1.0, step("Search[Adorable (band)]", PAGE), step("Search[Lit]", "Could not find Lit. Similar: []."),
           step("Finish[Adorable]", "Episode finished, reward = 1")),
    # an invalid action is not a search; unfinished
    record(0.0, step("Think[hm]", "Invalid action: Think[hm]"), step("Search[Adorable (band)]", PAGE), finished=False),
    # Standard / CoT: no environment steps, not counted
    record(1.0),
]


def test_search_stats_counts_by_hand():
    s = search_stats(RECORDS)
    assert s == {
        "episodes": 4, "searches": 7, "search_hits": 3, "search_hit_rate": 3 / 7,
        "miss_episodes": 3, "recovered_episodes": 1, "lookup_episodes": 1, "lookups": 1,
        "miss_rate": 3 / 4, "recover_rate": 1 / 3, "lookup_rate": 1 / 4,
    }
    assert episode_searches(RECORDS[2]["steps"]) == {"searches": 2, "hits": 1, "lookups": 0,
                                                     "missed": True, "recovered": False}


def test_search_stats_of_nothing_has_no_rates():
    s = search_stats([record(1.0)])
    assert s["episodes"] == 0 and s["search_hit_rate"] is None and s["recover_rate"] is None


@pytest.mark.parametrize("k, n, low, high", [
    (0, 10, 0.0, 0.2775), (5, 10, 0.2366, 0.7634), (10, 10, 0.7225, 1.0), (6, 100, 0.0278, 0.1247),
])
def test_wilson_interval_known_values(k, n, low, high):
    lo, hi = wilson(k, n)
    assert lo == pytest.approx(low, abs=1e-4) and hi == pytest.approx(high, abs=1e-4)


def test_wilson_bounds_are_exact_at_none_and_all():
    for n in (1, 3, 5, 150):
        assert wilson(0, n)[0] == 0.0 and wilson(n, n)[1] == 1.0


def test_wilson_rejects_impossible_counts():
    assert wilson(0, 0) is None
    with pytest.raises(ValueError):
        wilson(11, 10)


def write_probe(root: Path, style: str, records: list[dict], teacher: dict | None, old_key: bool = True) -> Path:
    """A run folder as `run` writes it: eval records, and (when `teacher`) generate's manifest
    naming the oracle style (the folder name is the label otherwise), under generate's `oracle` key
    or, as manifests written before it did (`old_key`), under `teacher.oracle_style`."""
    run = root / f"run-{style}"
    folder = run / "eval" / "smollm2-135m-ft-react"
    folder.mkdir(parents=True)
    (folder / "react.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if teacher is not None:
        (run / "generate").mkdir()
        config = {"teacher": {"oracle_style": style}} if old_key else {"oracle": style, "teacher": None}
        (run / "generate" / "manifest.json").write_text(json.dumps(
            {"config": config, "stats": {"react": {"search_correct": teacher}}}))
    return run


def test_probe_report_reads_the_style_from_generates_oracle_key(tmp_path):
    run = write_probe(tmp_path, "exact", RECORDS[:2], search_stats(RECORDS[:1]), old_key=False)
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "oracle_style_report.py"), str(run)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert any(line.startswith("| exact | smollm2-135m-ft-react | 100.0 / 100.0 / 100.0 | 2 |")
               for line in proc.stdout.splitlines()), proc.stdout


def test_probe_report_prints_em_and_search_hit_rate_with_intervals(tmp_path):
    teacher = search_stats(RECORDS[:1])  # missed 100%, recovered 100%, looked up 100%
    runs = [write_probe(tmp_path, "agent", RECORDS[:4], teacher), write_probe(tmp_path, "exact", RECORDS[2:4], None),
            write_probe(tmp_path, "silent", [record(0.0, step("Think[hm]", "Invalid action: Think[hm]"),
                                                    finished=False)], None)]
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "oracle_style_report.py"), *map(str, runs)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ") and not line.startswith("| style")]
    lo, hi = wilson(2, 4)
    hit_lo, hit_hi = wilson(3, 7)
    assert rows[0] == (f"| agent | smollm2-135m-ft-react | 100.0 / 100.0 / 100.0 | 4 | 75.0 | 50.0 "
                       f"[{100 * lo:.1f}, {100 * hi:.1f}] | 7 | 42.9 [{100 * hit_lo:.1f}, {100 * hit_hi:.1f}] |")
    lo, hi = wilson(1, 2)
    hit_lo, hit_hi = wilson(2, 3)
    assert rows[1] == (f"| run-exact | smollm2-135m-ft-react | - | 2 | 50.0 | 50.0 [{100 * lo:.1f}, {100 * hi:.1f}] "
                       f"| 3 | 66.7 [{100 * hit_lo:.1f}, {100 * hit_hi:.1f}] |")
    assert rows[2] == "| run-silent | smollm2-135m-ft-react | - | 1 | 0.0 | 0.0 [0.0, 79.3] | 0 | - |"  # no search: no rate
    em_gap = difference_interval(2, 4, 1, 2)
    assert "Fine-tuned on agent minus fine-tuned on run-exact" in proc.stdout
    assert f"- EM: 0.0 points [{100 * em_gap[0]:.1f}, {100 * em_gap[1]:.1f}]: within noise" in proc.stdout


def test_difference_interval_is_newcombes():
    from pipeline.report.intervals import rate_interval
    # Newcombe (1998), Table II, example (a): 56/70 - 48/80 = 0.2000, method 10: 0.0524 to 0.3339
    lo, hi = difference_interval(56, 70, 48, 80)
    assert lo == pytest.approx(0.0524, abs=1e-4) and hi == pytest.approx(0.3339, abs=1e-4)
    assert difference_interval(0, 0, 1, 2) is None
    assert rate_interval(0.06, 100) == wilson(6, 100) and rate_interval(0.5, 0) is None


def test_probe_report_without_records_exits_2(tmp_path):
    script = str(REPO / "scripts" / "oracle_style_report.py")
    for root in (tmp_path / "missing", tmp_path):
        proc = subprocess.run([sys.executable, script, str(root)], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and proc.stderr.startswith("error: "), proc.stderr


def test_mcnemars_exact_p_by_hand():
    """Two-sided: twice the smaller tail of Binomial(b + c, 1/2), at most 1."""
    assert mcnemar_exact(0, 5) == mcnemar_exact(5, 0) == 2 / 32
    assert mcnemar_exact(1, 9) == 2 * (1 + 10) / 1024
    assert mcnemar_exact(4, 4) == 1.0 and mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(7, 36) < 1e-4 < mcnemar_exact(14, 17)
