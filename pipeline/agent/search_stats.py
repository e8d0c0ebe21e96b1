"""How Act / ReAct episodes searched, read from their records' steps: hits and misses, recoveries
from a miss, Lookups (report their rates with pipeline.report.intervals.wilson).

    from pipeline.report.intervals import wilson
    from pipeline.agent.search_stats import search_stats
    s = search_stats(records)              # records: episode records (generate or eval)
    s["search_hit_rate"], wilson(s["search_hits"], s["searches"])

The same counts serve a teacher's trajectories (`generate` stats: does the oracle ever miss and
recover?) and a student's evaluation (does it search pages that exist?). A Search is a miss when
its observation is the environment's `Could not find ...` (a missing title or a disambiguation
page); any other Search observation showed a page and is a hit. An episode recovers when a hit
follows one of its misses.
"""

from __future__ import annotations

from collections.abc import Iterable

from pipeline.wiki.actions import parse_action

MISS_PREFIX = "Could not find"


def search_stats(records: Iterable[dict]) -> dict:
    """Counts and rates over the records that took at least one environment step."""
    n = searches = hits = lookups = missed = recovered = looked_up = 0
    for record in records:
        steps = record.get("steps") or []
        if not steps:
            continue  # Standard / CoT records: no environment
        n += 1
        episode = episode_searches(steps)
        searches += episode["searches"]
        hits += episode["hits"]
        lookups += episode["lookups"]
        missed += episode["missed"]
        recovered += episode["recovered"]
        looked_up += episode["lookups"] > 0
    return {
        "episodes": n,
        "searches": searches,
        "search_hits": hits,
        "search_hit_rate": ratio(hits, searches),
        "miss_episodes": missed,  # episodes with at least one miss
        "recovered_episodes": recovered,  # ... of which a later Search hit a page
        "lookup_episodes": looked_up,
        "lookups": lookups,
        "miss_rate": ratio(missed, n),
        "recover_rate": ratio(recovered, missed),  # of the episodes that missed
        "lookup_rate": ratio(looked_up, n),
    }


def episode_searches(steps: list[dict]) -> dict:
    """One episode's searches, hits and Lookups; whether it missed, and recovered after."""
    searches = hits = lookups = 0
    missed = recovered = False
    for step in steps:
        action = parse_action(step.get("action") or "")
        if action is None:
            continue
        if action.name == "lookup":
            lookups += 1
        elif action.name == "search":
            searches += 1
            if (step.get("observation") or "").startswith(MISS_PREFIX):
                missed = True
            else:
                hits += 1
                recovered = recovered or missed
    return {"searches": searches, "hits": hits, "lookups": lookups, "missed": missed, "recovered": recovered}


def ratio(k: int, n: int) -> float | None:
    return k / n if n else None
