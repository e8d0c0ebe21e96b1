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
Lookup: `Lookup[word]` after a hit.
The retriever mode (wiki.search=bm25): `Search[question]` through `WikiEnv(search="bm25")`, the
top 3 pages by BM25, for questions: HotpotQA's 500 offline-eval questions (real question text) and
as many built around sampled titles of the corpus ("Which magazine is <title> ... ?"), so that on
the synthetic corpus too the words select pages. `--retriever-only` builds each index once and
measures this row alone (what docs/environment.md extrapolates to the 5M-page abstracts dump). Every latency set is measured `--repeats` times; the table
gives the median over repeats and the spread (min-max of the repeats' p50).

Baseline, in the same process: what a user would otherwise write for a local Wikipedia, an
in-memory dict of titles plus rapidfuzz (`process.extract`, the WRatio scorer, titles
pre-processed once) over every title for the "Similar:" list of a miss. Both are scored on the
same misses, each made from a known title, for latency and for the quality of the list: how often
the title the miss was made from is among the 5 similar titles shown (recall@5, with a 95% Wilson
interval) and its mean reciprocal rank. The live MediaWiki API is the other alternative; no
latency of it is recorded in this repository (no internet here), so it is not compared.
Also: `build_index` with `BuildSettings.unoptimised()` (SQLite defaults, one INSERT per row, FTS5
merging as it goes) on both corpora. Timings are wall clock; build CPU time and the load average
(at start, per corpus, at end) are printed too, because other processes may share the machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.synthetic_wiki import write_corpus  # noqa: E402
from pipeline.wiki.env import SIMILAR_SHOWN, WikiEnv  # noqa: E402
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


def query_sets(titles: list[str], n: int, seed: int = 0) -> tuple[dict[str, list[str]], list[str]]:
    """Query sets by kind, and for each miss the title it was made from (its right suggestion)."""
    rng = random.Random(seed)
    hits = []
    for title in rng.sample(titles, n):
        roll = rng.random()
        hits.append(title if roll < 0.5 else title.lower() if roll < 0.75 else title.replace(" ", "_"))
    misses, sources = [], []
    for title in rng.sample(titles, n // 2):
        words, roll = title.split(), rng.random()
        if roll < 0.33 and len(words) > 1:
            misses.append(" ".join(words[:-1]) + " xq")  # keeps it a miss even if the prefix exists
        elif roll < 0.66:
            misses.append(f"{title} (filmx)")
        else:
            i = rng.randrange(max(1, len(title) - 1))
            misses.append(title[:i] + title[i + 1:i + 2] + title[i:i + 1] + title[i + 2:] + "q")
        sources.append(title)
    return {"hit": hits, "miss": misses, "agent": agent_queries()}, sources


def retrieval_queries(titles: list[str], n: int, seed: int = 0) -> dict[str, list[str]]:
    """Question-like queries for the bm25 mode, by kind: offline-eval questions (when the offline
    split is there) and questions built around n sampled titles."""
    rng = random.Random(seed)
    from pipeline.core.errors import PipelineError
    from pipeline.tasks import get_task

    try:
        questions = [q.question for q in get_task("hotpotqa").load_questions("offline-eval", limit=n)]
    except PipelineError:  # no offline split here: the built questions alone
        questions = []
    shapes = ("Which {noun} was {title} part of?", "When was the {noun} that {title} belongs to founded?",
              "What is {title} and which {noun} is it in?")
    built = [rng.choice(shapes).format(title=t, noun=rng.choice(("magazine", "band", "film", "city", "team")))
             for t in rng.sample(titles, min(n, len(titles)))]
    return {"offline-eval questions": questions, "questions on sampled titles": built}


def search_latencies(index: LocalIndex, queries: list[str], search: str = "title") -> tuple[list[float], list[str]]:
    env = WikiEnv(index, max_steps=10**9, search=search, search_k=3)
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


class RapidfuzzWiki:
    """The baseline a user would write: a dict of titles for the page lookup and, on a miss,
    rapidfuzz's WRatio over every title (pre-processed once: lower case, punctuation removed)."""

    def __init__(self, titles: list[str]):
        from rapidfuzz import utils

        self.titles = titles
        self.by_key = {title_key(t): t for t in titles}
        self.processed = [utils.default_process(t) for t in titles]

    def similar(self, query: str, k: int = SIMILAR_SHOWN) -> list[str]:
        from rapidfuzz import fuzz, process, utils

        found = process.extract(utils.default_process(query), self.processed, scorer=fuzz.WRatio, limit=k)
        return [self.titles[i] for _, _, i in found]

    def search(self, query: str) -> list[str] | None:
        """None on a hit (the page is shown); the similar titles on a miss."""
        return None if title_key(query) in self.by_key else self.similar(query)


def timed_similar(search, queries: list[str]) -> tuple[list[float], list[list[str]]]:
    latencies, lists = [], []
    for query in queries:
        started = time.perf_counter()
        lists.append(search(query))
        latencies.append(time.perf_counter() - started)
    return latencies, lists


def list_quality(lists: list[list[str] | None], sources: list[str]) -> dict:
    """recall@k (the source title among the titles shown, 95% Wilson interval) and MRR."""
    n = len(sources)
    ranks = [(lst or []).index(src) + 1 if src in (lst or []) else None for lst, src in zip(lists, sources, strict=True)]
    found = sum(r is not None for r in ranks)
    p, z = found / n, 1.96
    centre, half = (p + z * z / (2 * n)) / (1 + z * z / n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return {"recall": p, "recall_lo": centre - half, "recall_hi": centre + half,
            "mrr": sum(1 / r for r in ranks if r) / n}


def repeated(measure, repeats: int) -> dict:
    """Run `measure()` (-> latencies in s) `repeats` times: median p50/p99 over the repeats and
    the spread of the p50s (min-max)."""
    p50s, p99s = [], []
    for _ in range(repeats):
        latencies = measure()
        latencies = latencies[0] if isinstance(latencies, tuple) else latencies
        p50s.append(1e3 * percentile(latencies, 50))
        p99s.append(1e3 * percentile(latencies, 99))
    return {"p50_ms": statistics.median(p50s), "p99_ms": statistics.median(p99s),
            "p50_min_ms": min(p50s), "p50_max_ms": max(p50s), "repeats": repeats}


def repeated_build(sources: list[Path], out: Path, repeats: int, settings: BuildSettings | None = None) -> dict:
    runs = []
    for _ in range(repeats):
        out.unlink(missing_ok=True)
        runs.append(timed_build(sources, out, settings))
    seconds = [r["seconds"] for r in runs]
    best = sorted(runs, key=lambda r: r["seconds"])[len(runs) // 2]  # the median run
    return {**best, "seconds_min": min(seconds), "seconds_max": max(seconds), "repeats": repeats}


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min)"


def bench_corpus(name: str, corpus: Path, workdir: Path, n_queries: int, n_baseline: int,
                 repeats: int, build_repeats: int, fuzz_repeats: int) -> list[dict]:
    rows: list[dict] = []
    print(f"[{name}] start: {load()}", flush=True)
    out = workdir / f"{name}.sqlite"
    base = repeated_build([corpus], workdir / f"{name}-unoptimised.sqlite", build_repeats, BuildSettings.unoptimised())
    (workdir / f"{name}-unoptimised.sqlite").unlink()
    build = repeated_build([corpus], out, build_repeats)
    rows.append({"corpus": name, "what": "build (ours)", **build})
    rows.append({"corpus": name, "what": "build (SQLite defaults)", **base})
    rows += bench_retriever(name, out, read_titles(corpus), n_queries, repeats)
    print(f"[{name}] build: {build['pages']:,} pages in {build['seconds']:.1f} s wall (median of {build_repeats}; "
          f"{build['seconds_min']:.1f}-{build['seconds_max']:.1f}), {build['cpu_seconds']:.1f} s CPU; "
          f"SQLite defaults {base['seconds']:.1f} s -> ours {base['seconds'] / build['seconds']:.1f}x faster", flush=True)
    titles = read_titles(corpus)
    queries, sources = query_sets(titles, n_queries)
    with LocalIndex(out) as index:
        search_latencies(index, queries["hit"][:200])  # warm the page cache
        every: list[float] = []
        for kind, qs in queries.items():
            if not qs:
                continue
            latencies, observations = search_latencies(index, qs)
            hit_rate = sum(not o.startswith("Could not find") for o in observations) / len(observations)
            stats = repeated(lambda qs=qs: search_latencies(index, qs)[0], repeats)
            every += latencies
            rows.append({"corpus": name, "what": f"Search {kind}", "n": len(qs), "hit_rate": hit_rate, **stats})
        rows.append({"corpus": name, "what": "Search all (one pass)", "n": len(every),
                     "p50_ms": 1e3 * percentile(every, 50), "p99_ms": 1e3 * percentile(every, 99)})
        hits = queries["hit"][:500]
        rows.append({"corpus": name, "what": "Lookup", "n": 2 * len(hits),
                     **repeated(lambda: lookup_latencies(index, hits), repeats)})
        misses, truth = queries["miss"][:n_baseline], sources[:n_baseline]
        ours_lists = [index.similar_titles(q, SIMILAR_SHOWN) for q in misses]
        ours_ms = repeated(lambda: timed_similar(lambda q: index.similar_titles(q, SIMILAR_SHOWN), misses), repeats)
        env_ms = repeated(lambda: search_latencies(index, misses)[0], repeats)
    rows.append({"corpus": name, "what": "Search miss through WikiEnv (these misses)", "n": len(misses), **env_ms})
    rows.append({"corpus": name, "what": "Similar list: ours (FTS5 BM25)", "n": len(misses), **ours_ms,
                 **list_quality(ours_lists, truth)})
    print(f"[{name}] rapidfuzz over {len(titles):,} titles, {len(misses)} misses x {fuzz_repeats} repeats: {load()}",
          flush=True)
    started = time.perf_counter()
    baseline = RapidfuzzWiki(titles)
    prepare_s = time.perf_counter() - started
    passes: list = []  # the lists come from the timed passes (all equal: rapidfuzz is deterministic)
    fuzz_ms = repeated(lambda: passes.append(timed_similar(baseline.search, misses)) or passes[-1], fuzz_repeats)
    fuzz_lists = passes[0][1]
    assert all(lists == fuzz_lists for _, lists in passes)
    rows.append({"corpus": name, "what": "Similar list: dict + rapidfuzz WRatio", "n": len(misses), **fuzz_ms,
                 **list_quality(fuzz_lists, truth), "ratio_p50": fuzz_ms["p50_ms"] / ours_ms["p50_ms"],
                 "prepare_s": prepare_s})
    print(f"[{name}] end: {load()}", flush=True)
    return rows


def bench_retriever(name: str, out: Path, titles: list[str], n_queries: int, repeats: int) -> list[dict]:
    """The bm25 mode's Search[question] (top 3 pages) over the built index `out`."""
    rows = []
    with LocalIndex(out) as index:
        for kind, queries in retrieval_queries(titles, min(n_queries, 500)).items():
            if not queries:
                continue
            search_latencies(index, queries[:100], "bm25")  # warm the page cache
            stats = repeated(lambda queries=queries: search_latencies(index, queries, "bm25")[0], repeats)
            found = sum(not o.startswith("Could not find") for o in search_latencies(index, queries, "bm25")[1])
            print(f"[{name}] bm25 Search[{kind}]: p50 {stats['p50_ms']:.1f} ms over {len(queries)}; {load()}", flush=True)
            rows.append({"corpus": name, "what": f"Search bm25 top 3: {kind}", "n": len(queries),
                         "hit_rate": found / len(queries), **stats})
    return rows


def retriever_only(name: str, corpus: Path, workdir: Path, n_queries: int, repeats: int) -> list[dict]:
    out = workdir / f"{name}.sqlite"
    print(f"[{name}] start: {load()}", flush=True)
    if out.exists():  # a --workdir kept from an earlier run: the same corpus, built already
        print(f"[{name}] reusing {out}", flush=True)
    else:
        build = timed_build([corpus], out)
        print(f"[{name}] build: {build['pages']:,} pages in {build['seconds']:.1f} s wall", flush=True)
    return bench_retriever(name, out, read_titles(corpus), n_queries, repeats)


def print_table(rows: list[dict]) -> None:
    print(f"\n{'corpus':<14} {'measure':<44} {'n':>9} {'p50 ms':>9} {'p50 spread':>15} {'p99 ms':>9}  note")
    for r in rows:
        if "pages_per_s" in r:
            note = (f"{r['pages_per_s']:,.0f} pages/s wall, {r['pages_per_cpu_s']:,.0f}/CPU-s; {r['seconds']:.1f} s "
                    f"(median of {r['repeats']}: {r['seconds_min']:.1f}-{r['seconds_max']:.1f})")
            print(f"{r['corpus']:<14} {r['what']:<44} {r['pages']:>9,} {'':>9} {'':>15} {'':>9}  {note}")
            continue
        spread = f"{r['p50_min_ms']:.3f}-{r['p50_max_ms']:.3f}" if "p50_min_ms" in r else ""
        note = f"hits {r['hit_rate']:.0%}" if "hit_rate" in r else ""
        if "recall" in r:
            note = (f"recall@{SIMILAR_SHOWN} {r['recall']:.1%} [{r['recall_lo']:.1%}, {r['recall_hi']:.1%}], "
                    f"MRR {r['mrr']:.3f}")
        if "ratio_p50" in r:
            note += f"; ours {r['ratio_p50']:,.0f}x faster (p50); titles prepared in {r['prepare_s']:.1f} s"
        print(f"{r['corpus']:<14} {r['what']:<44} {r['n']:>9,} {r['p50_ms']:>9.3f} {spread:>15} {r['p99_ms']:>9.3f}  {note}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", type=Path, default=SHARED / "wiki" / "corpus.jsonl")
    parser.add_argument("--pages", type=int, default=1_000_000, help="synthetic corpus size")
    parser.add_argument("--queries", type=int, default=2000, help="hit queries per corpus (misses: half)")
    parser.add_argument("--baseline-misses", type=int, default=500,
                        help="misses scored against the rapidfuzz baseline (26k corpus; above 200k pages: 20)")
    parser.add_argument("--repeats", type=int, default=5, help="repeats of every latency measurement")
    parser.add_argument("--baseline-repeats", type=int, default=3,
                        help="repeats of the rapidfuzz baseline (above 200k pages: 2; each query scans every title)")
    parser.add_argument("--build-repeats", type=int, default=3, help="builds per corpus (1M corpus: 1)")
    parser.add_argument("--skip-synthetic", action="store_true")
    parser.add_argument("--workdir", type=Path, default=None, help="keep files here (default: a temp dir)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows as JSON")
    parser.add_argument("--retriever-only", action="store_true",
                        help="build each index once and measure the bm25 mode's Search alone")
    args = parser.parse_args()
    print(f"{' '.join(sys.argv)}\nstart: {load()}, {os.cpu_count()} CPUs", flush=True)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-wiki-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        if args.retriever_only:
            if args.corpus.exists():
                rows += retriever_only("shared-26k", args.corpus, workdir, args.queries, args.repeats)
            if not args.skip_synthetic:
                synthetic = workdir / f"synthetic-{args.pages}.jsonl"
                if not synthetic.exists():
                    write_corpus(args.pages, synthetic)
                rows += retriever_only(f"synthetic-{args.pages // 1000}k", synthetic, workdir, args.queries, args.repeats)
        elif args.corpus.exists():
            rows += bench_corpus("shared-26k", args.corpus, workdir, args.queries, args.baseline_misses,
                                 args.repeats, args.build_repeats, args.baseline_repeats)
        else:
            print(f"{args.corpus} absent: skipping the shared corpus")
        if not args.skip_synthetic and not args.retriever_only:
            started = time.perf_counter()
            synthetic = write_corpus(args.pages, workdir / f"synthetic-{args.pages}.jsonl")
            print(f"[synthetic] generated {args.pages:,} pages in {time.perf_counter() - started:.1f} s", flush=True)
            big = args.pages > 200_000
            rows += bench_corpus(f"synthetic-{args.pages // 1000}k", synthetic, workdir, args.queries,
                                 20 if big else args.baseline_misses, args.repeats,
                                 1 if big else args.build_repeats, min(2, args.baseline_repeats) if big else args.baseline_repeats)
    print_table(rows)
    print(f"\nend: {load()}")
    if args.json:
        args.json.write_text(json.dumps({"argv": sys.argv, "rows": rows, "loadavg_end": os.getloadavg()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
