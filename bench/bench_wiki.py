"""Benchmark the local Wikipedia index: build speed, and Search / Lookup latency through WikiEnv.

    .venv/bin/python bench/bench_wiki.py                       # shared 26k corpus + synthetic 1M pages
    .venv/bin/python bench/bench_wiki.py --pages 100000        # a smaller synthetic corpus
    .venv/bin/python bench/bench_wiki.py --skip-synthetic --json /tmp/wiki-bench.json

Corpora: ../shared/data/wiki/corpus.jsonl (26,311 HotpotQA intro paragraphs) and a deterministic
synthetic corpus (bench/synthetic_wiki.py) generated into a temporary folder.
Queries, all through `WikiEnv.step("Search[...]")` (one page lookup, and on a miss the
similar-title query):
- hit: sampled titles, half of them re-cased or with underscores;
- miss: sampled titles altered (a word dropped, " (film)" appended, two letters swapped);
- agent: real Search[...] arguments written by GPT-4 (FireAct) and text-davinci-002 (ReAct FEVER),
  from ../shared/data, mostly misses with many common words.
Lookup: `Lookup[word]` after a hit. Baselines, in the same process: an in-memory dict of titles
plus `difflib.get_close_matches` over all titles for the similar list (on a sample of misses),
and `build_index` with `BuildSettings.unoptimised()` (SQLite defaults, one INSERT per row, FTS5
merging as it goes) on both corpora. Timings are wall clock; build CPU time and the load
average are printed too, because other processes may share the machine.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import random
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.synthetic_wiki import write_corpus  # noqa: E402
from pipeline.wiki.env import WikiEnv  # noqa: E402
from pipeline.wiki.index import BuildSettings, LocalIndex, build_index, title_key  # noqa: E402

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))] if ordered else float("nan")


def timed_build(sources: list[Path], out: Path, settings: BuildSettings | None = None) -> dict:
    cpu = time.process_time()
    stats = build_index(sources, out, settings=settings)
    cpu = time.process_time() - cpu
    return {"pages": stats.pages, "seconds": stats.seconds, "cpu_seconds": cpu,
            "pages_per_s": stats.pages_per_second, "pages_per_cpu_s": stats.pages / cpu, "mb": stats.bytes / 1e6}


def read_titles(corpus: Path) -> list[str]:
    with open(corpus, encoding="utf-8") as fh:
        return [json.loads(line)["title"] for line in fh]


def agent_queries() -> list[str]:
    """Search[...] arguments from real agent trajectories in the shared data (empty if absent)."""
    queries = []
    fireact = SHARED / "fireact" / "gpt_format" / "hotpotqa.jsonl"
    fever = SHARED / "react" / "fever_react_davinci002_500_trajs.jsonl"
    if fireact.exists():
        queries += [json.loads(f'"{q}"') for q in re.findall(r"search\[([^\]]*)\]", fireact.read_text(), re.I)]
    if fever.exists():
        for line in fever.read_text().splitlines():
            queries += re.findall(r"Search\[([^\]]*)\]", json.loads(line)["traj"])
    return queries


def query_sets(titles: list[str], n: int, seed: int = 0) -> dict[str, list[str]]:
    rng = random.Random(seed)
    hits = []
    for title in rng.sample(titles, n):
        roll = rng.random()
        hits.append(title if roll < 0.5 else title.lower() if roll < 0.75 else title.replace(" ", "_"))
    misses = []
    for title in rng.sample(titles, n // 2):
        words, roll = title.split(), rng.random()
        if roll < 0.33 and len(words) > 1:
            misses.append(" ".join(words[:-1]) + " xq")  # keeps it a miss even if the prefix exists
        elif roll < 0.66:
            misses.append(f"{title} (filmx)")
        else:
            i = rng.randrange(max(1, len(title) - 1))
            misses.append(title[:i] + title[i + 1:i + 2] + title[i:i + 1] + title[i + 2:] + "q")
    return {"hit": hits, "miss": misses, "agent": agent_queries()}


def search_latencies(index: LocalIndex, queries: list[str]) -> tuple[list[float], list[str]]:
    env = WikiEnv(index, max_steps=10**9)
    env.reset("benchmark")
    latencies, observations = [], []
    for query in queries:
        started = time.perf_counter()
        observation = env.step(f"Search[{query}]")[0]
        latencies.append(time.perf_counter() - started)
        observations.append(observation)
    return latencies, observations


def lookup_latencies(index: LocalIndex, titles: list[str]) -> list[float]:
    env = WikiEnv(index, max_steps=10**9)
    env.reset("benchmark")
    latencies = []
    for title in titles:
        page = index.get_page(title)
        words = " ".join(page.sentences[1:3] or page.sentences).split() if page else []
        if not words:
            continue
        env.step(f"Search[{title}]")
        keyword = max(words[:12], key=len).strip(".,;:()\"'")
        for _ in range(2):  # the first walks the page, the second takes the next result
            started = time.perf_counter()
            env.step(f"Lookup[{keyword}]")
            latencies.append(time.perf_counter() - started)
    return latencies


def baseline_similar(titles: list[str], by_key: dict[str, str], queries: list[str]) -> list[float]:
    """The naive backend: dict lookup, then difflib over every title on a miss."""
    latencies = []
    for query in queries:
        started = time.perf_counter()
        if title_key(query) not in by_key:
            difflib.get_close_matches(query, titles, n=5)
        latencies.append(time.perf_counter() - started)
    return latencies


def bench_corpus(name: str, corpus: Path, workdir: Path, n_queries: int, baseline_misses: int,
                 baseline_build: bool) -> list[dict]:
    rows: list[dict] = []
    out = workdir / f"{name}.sqlite"
    build = timed_build([corpus], out)
    rows.append({"corpus": name, "what": "build (ours)", **build})
    print(f"[{name}] build: {build['pages']:,} pages in {build['seconds']:.1f} s wall, "
          f"{build['cpu_seconds']:.1f} s CPU ({build['pages_per_s']:,.0f} pages/s), {build['mb']:.0f} MB", flush=True)
    if baseline_build:
        base = timed_build([corpus], workdir / f"{name}-unoptimised.sqlite", BuildSettings.unoptimised())
        rows.append({"corpus": name, "what": "build (unoptimised settings)", **base})
        print(f"[{name}] unoptimised build: {base['seconds']:.1f} s -> ours is {base['seconds'] / build['seconds']:.1f}x faster", flush=True)
    titles = read_titles(corpus)
    queries = query_sets(titles, n_queries)
    with LocalIndex(out) as index:
        search_latencies(index, queries["hit"][:200])  # warm the page cache
        every: list[float] = []
        for kind, qs in queries.items():
            if not qs:
                continue
            latencies, observations = search_latencies(index, qs)
            every += latencies
            hit_rate = sum(not o.startswith("Could not find") for o in observations) / len(observations)
            rows.append({"corpus": name, "what": f"Search {kind}", "n": len(qs), "hit_rate": hit_rate,
                         "p50_ms": 1e3 * percentile(latencies, 50), "p99_ms": 1e3 * percentile(latencies, 99)})
        rows.append({"corpus": name, "what": "Search all", "n": len(every),
                     "p50_ms": 1e3 * percentile(every, 50), "p99_ms": 1e3 * percentile(every, 99)})
        lookups = lookup_latencies(index, queries["hit"][:500])
        rows.append({"corpus": name, "what": "Lookup", "n": len(lookups),
                     "p50_ms": 1e3 * percentile(lookups, 50), "p99_ms": 1e3 * percentile(lookups, 99)})
        sample = queries["miss"][:baseline_misses]
        ours, _ = search_latencies(index, sample)
    by_key = {title_key(t): t for t in titles}
    naive = baseline_similar(titles, by_key, sample)
    rows.append({"corpus": name, "what": f"Search miss, baseline dict+difflib (n={len(sample)})", "n": len(sample),
                 "p50_ms": 1e3 * percentile(naive, 50), "p99_ms": 1e3 * percentile(naive, 99),
                 "ratio_p50": percentile(naive, 50) / percentile(ours, 50)})
    return rows


def print_table(rows: list[dict]) -> None:
    print(f"\n{'corpus':<14} {'measure':<48} {'n / pages':>10} {'p50 ms':>9} {'p99 ms':>9} {'pages/s':>9} {'note':>22}")
    for r in rows:
        n = r.get("n", r.get("pages", ""))
        if "pages_per_s" in r:
            note = f"{r['pages_per_cpu_s']:,.0f} pages/CPU-s"
            print(f"{r['corpus']:<14} {r['what']:<48} {n:>10,} {'':>9} {'':>9} {r['pages_per_s']:>9,.0f} {note:>22}")
        else:
            note = f"hits {r['hit_rate']:.0%}" if "hit_rate" in r else (
                f"ours {r['ratio_p50']:,.0f}x faster" if "ratio_p50" in r else "")
            print(f"{r['corpus']:<14} {r['what']:<48} {n:>10,} {r['p50_ms']:>9.3f} {r['p99_ms']:>9.3f} {'':>9} {note:>22}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", type=Path, default=SHARED / "wiki" / "corpus.jsonl")
    parser.add_argument("--pages", type=int, default=1_000_000, help="synthetic corpus size")
    parser.add_argument("--queries", type=int, default=2000, help="hit queries per corpus (misses: half)")
    parser.add_argument("--skip-synthetic", action="store_true")
    parser.add_argument("--workdir", type=Path, default=None, help="keep files here (default: a temp dir)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows as JSON")
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)", flush=True)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-wiki-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        if args.corpus.exists():
            rows += bench_corpus("shared-26k", args.corpus, workdir, args.queries, 200, baseline_build=True)
        else:
            print(f"{args.corpus} absent: skipping the shared corpus")
        if not args.skip_synthetic:
            started = time.perf_counter()
            synthetic = write_corpus(args.pages, workdir / f"synthetic-{args.pages}.jsonl")
            print(f"[synthetic] generated {args.pages:,} pages in {time.perf_counter() - started:.1f} s", flush=True)
            name = f"synthetic-{args.pages // 1000}k"
            rows += bench_corpus(name, synthetic, workdir, args.queries, 20 if args.pages > 200_000 else 50,
                                 baseline_build=True)
    print_table(rows)
    print(f"\nload average at end: {os.getloadavg()[0]:.2f} (1 min), {os.getloadavg()[1]:.2f} (5 min)")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "loadavg_end": os.getloadavg()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
