"""WikiEnv: the paper's Wikipedia environment, text in, text out.

    env = WikiEnv(LocalIndex("data/wiki.sqlite"), score=get_task("hotpotqa").scores)
    env.reset(question, gold_answer)
    observation, reward, done, info = env.step("Search[Milhouse]")

It knows Search, Lookup and Finish, and nothing of a task: no question line, no metric. A task
(pipeline.tasks) gives it `score(answer, gold) -> {"em", "f1"}`, which decides the reward a
Finish reports (`em`: 1 when correct) and the `em` / `f1` of `info`; a gold answer without one
is refused at `reset`, and without a gold answer (replay, benchmarks) a Finish is scored 0.
`info["answer"]` is what the episode answered.

Two observation styles (`style=`, or the `observation_style` the config put on the backend):

- "original": the original ReAct `wikienv.py` + notebook, rule for rule. The page text is its
  paragraphs of more than two words, one per line; sentences are `paragraph.split('. ')` with
  '.' re-added to every piece, so a paragraph's last sentence ends in `..`; a hit shows the
  first 5 such sentences and resets the Lookup state; a miss (or a page with "may refer to:"
  in ANY paragraph, shown as a miss on `[X]`) keeps the previous page and Lookup state; Lookup
  matches the same sentences (an empty keyword matches every one); actions are parsed strictly
  (`search[`/`lookup[`/`finish[`/`think[` ... `]` after strip, the loop having lower-cased the
  first letter); `No more results.` and `Episode finished, reward = r` end in a newline, and
  `think[...]` answers `Nice thought.`, all as the original does.
- "clean" (the default): the corpus's own sentence split (no `..`); a disambiguation page is
  one whose first sentences say "may refer to:"; every Search resets page and Lookup state (a
  miss leaves no page); actions in any case with spaces before `[` are accepted; no trailing
  newlines.
Two search modes (`search=`, or the `search_mode` / `search_k` the config put on the backend;
`wiki.search`, docs/environment.md):

- "title" (the default, the paper's): `Search[entity]` looks one page up by its exact
  (normalised) title, as above.
- "bm25" (a retriever, as the field's search agents query a local corpus): `Search[query]` shows
  the top `search_k` pages of the index by BM25 for the query's words, each as
  `(i) Title: its first 5 sentences`, all in one observation; none found reads
  `Could not find X.`. `Lookup[k]` walks the sentences containing `k` in all the retrieved pages
  (whole pages, in rank order), as it walks one page's in the title mode. The style still decides
  the action parser and the trailing newlines; the retrieved text is the corpus's own sentences.

Both: a miss reads `Could not find X. Similar: [...]`; Lookup walks the matching sentences as
`(Result k / n) ...` then `No more results.`; Finish ends the episode with
`Episode finished, reward = r`; anything else is `Invalid action: ...`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pipeline.wiki.actions import Action, parse_action, parse_action_original
from pipeline.wiki.backend import DISAMBIGUATION_MARK, Page, WikiBackend

SENTENCES_SHOWN = 5
SIMILAR_SHOWN = 5
MAX_ARGUMENT_CHARS = 500  # a 10,000-character Search[...] is answered, not sent to the backend
OBSERVATION_STYLES = ("clean", "original")
SEARCH_MODES = ("title", "bm25")  # wiki.search: the paper's exact-title lookup, or a BM25 retriever
DEFAULT_SEARCH_K = 3
Scorer = Callable[[str, str], dict[str, float]]  # (answer, gold) -> {"em", "f1"}: a task's `scores`


def original_page_text(page: Page) -> str:
    """`self.page` of the original: each paragraph of more than two words on its own line."""
    lines = [text for text in (" ".join(p) for p in page.paragraphs()) if len(text.split(" ")) > 2]
    return "".join(line + "\n" for line in lines)


def original_sentences(page_text: str) -> list[str]:
    """wikienv.py's get_page_obs / construct_lookup_list split, verbatim: '. ' then '.' re-added."""
    paragraphs = [p.strip() for p in page_text.split("\n") if p.strip()]
    sentences: list[str] = []
    for p in paragraphs:
        sentences += p.split(". ")
    return [s.strip() + "." for s in sentences if s.strip()]


@dataclass
class EpisodeState:
    question: str = ""
    gold_answer: str | None = None
    page: Page | None = None
    lookup_keyword: str | None = None
    lookup_results: list[str] = field(default_factory=list)
    lookup_index: int = 0
    steps: int = 0
    answer: str | None = None
    done: bool = False
    page_text: str | None = None  # original style: the current page as the original holds it
    pages: list[Page] = field(default_factory=list)  # bm25 mode: the last Search's retrieved pages


class WikiEnv:
    def __init__(self, backend: WikiBackend, max_steps: int = 7, style: str | None = None,
                 score: Scorer | None = None, search: str | None = None, search_k: int | None = None):
        self.backend = backend
        self.max_steps = max_steps
        self.score = score
        self.style = style or getattr(backend, "observation_style", "clean")
        if self.style not in OBSERVATION_STYLES:
            raise ValueError(f"observation style {self.style!r}: expected one of {OBSERVATION_STYLES}")
        self.search_mode = search or getattr(backend, "search_mode", "title")
        self.search_k = search_k or getattr(backend, "search_k", DEFAULT_SEARCH_K)
        if self.search_mode not in SEARCH_MODES or self.search_k < 1:
            raise ValueError(f"search mode {self.search_mode!r} with k={self.search_k}: expected one of "
                             f"{SEARCH_MODES} and k >= 1")
        self.original = self.style == "original"
        self.state = EpisodeState()

    def reset(self, question: str, gold_answer: str | None = None) -> None:
        """A new episode (the question is kept for the record only; the task's question line
        is the method's to write). A gold answer needs the task's `score` to mean anything."""
        if gold_answer is not None and self.score is None:
            raise ValueError("WikiEnv.reset got a gold answer but the env has no score=: pass the task's "
                             "(e.g. WikiEnv(backend, score=get_task('hotpotqa').scores))")
        self.state = EpisodeState(question=question, gold_answer=gold_answer)

    def step(self, action_text: str) -> tuple[str, float, bool, dict]:
        """Apply one action. Never raises on bad model text: it becomes an observation."""
        state = self.state
        if state.done:
            return "Episode already finished.", 0.0, True, self.info()
        state.steps += 1
        action = self.parse(action_text)
        reward = 0.0
        end = "\n" if self.original else ""  # the original's "No more results.\n", "...reward = r\n"
        if action is None:
            shown = action_text.strip() if self.original else action_text
            observation = f"Invalid action: {shown}"
        elif action.name == "search" and self.search_mode == "bm25":
            observation = self.retrieve(action.argument)
        elif action.name == "search":
            observation = self.search_original(action.argument) if self.original else self.search(action.argument)
        elif action.name == "lookup":
            observation = self.lookup(action.argument)
            if observation == "No more results.":
                observation += end
        elif action.name == "think":
            observation = "Nice thought."
        else:
            state.answer, state.done = action.argument, True
            reward = self.reward()
            observation = f"Episode finished, reward = {int(reward)}{end}"
        if not state.done and state.steps >= self.max_steps:
            state.done = True  # step limit: ends unanswered, like the original loop
        return observation, reward, state.done, self.info()

    def parse(self, action_text: str) -> Action | None:
        return parse_action_original(action_text) if self.original else parse_action(action_text)

    def search_original(self, entity: str) -> str:
        """wikienv.py's search_step: only a hit changes the page and resets the Lookup state."""
        state = self.state
        if len(entity) > MAX_ARGUMENT_CHARS:
            return f"Could not find {entity[:MAX_ARGUMENT_CHARS]}... Similar: []."
        page = self.backend.get_page(entity) if entity.strip() else None
        if page is None:
            return self.miss(entity, entity)
        if any(DISAMBIGUATION_MARK in s for s in page.sentences):  # any block, as the original
            return self.miss(f"[{entity}]", entity)  # the original re-searches "[X]": a miss
        state.page, state.page_text = page, original_page_text(page)
        state.lookup_keyword, state.lookup_results, state.lookup_index = None, [], 0
        return " ".join(original_sentences(state.page_text)[:SENTENCES_SHOWN])

    def search(self, entity: str) -> str:
        state = self.state
        state.lookup_keyword, state.lookup_results, state.lookup_index = None, [], 0
        if len(entity) > MAX_ARGUMENT_CHARS:
            return f"Could not find {entity[:MAX_ARGUMENT_CHARS]}... Similar: []."
        page = self.backend.get_page(entity) if entity.strip() else None
        if page is not None and page.is_disambiguation:
            state.page = None
            return self.miss(f"[{entity}]", entity)
        if page is None:
            state.page = None
            return self.miss(entity, entity)
        state.page = page
        return " ".join(s.strip() for s in page.sentences[:SENTENCES_SHOWN])

    def retrieve(self, query: str) -> str:
        """The bm25 mode's Search: the top `search_k` pages for `query`, one observation."""
        state = self.state
        state.lookup_keyword, state.lookup_results, state.lookup_index = None, [], 0
        shown = query if len(query) <= MAX_ARGUMENT_CHARS else query[:MAX_ARGUMENT_CHARS] + "..."
        state.pages = self.backend.retrieve(query[:MAX_ARGUMENT_CHARS], self.search_k) if query.strip() else []
        state.page = state.pages[0] if state.pages else None
        state.page_text = None
        if not state.pages:
            return f"Could not find {shown}."
        return " ".join(f"({i}) {page.title}: " + " ".join(s.strip() for s in page.sentences[:SENTENCES_SHOWN])
                        for i, page in enumerate(state.pages, 1))

    def miss(self, shown: str, query: str) -> str:
        similar = self.backend.similar_titles(query, SIMILAR_SHOWN) if query.strip() else []
        return f"Could not find {shown}. Similar: {similar[:SIMILAR_SHOWN]}."

    def lookup(self, keyword: str) -> str:
        state = self.state
        if keyword != state.lookup_keyword:  # a new keyword restarts the count
            state.lookup_keyword = keyword
            state.lookup_results = self.sentences_with(keyword)
            state.lookup_index = 0
        if state.lookup_index >= len(state.lookup_results):
            return "No more results."
        state.lookup_index += 1
        total = len(state.lookup_results)
        return f"(Result {state.lookup_index} / {total}) {state.lookup_results[state.lookup_index - 1]}"

    def sentences_with(self, keyword: str) -> list[str]:
        page = self.state.page
        if self.search_mode == "bm25":  # every retrieved page's sentences, in rank order
            needle = keyword.lower()
            return [s.strip() for p in self.state.pages for s in p.sentences if needle and needle in s.lower()]
        if self.original:  # construct_lookup_list: no page -> []; "" is in every sentence
            if self.state.page_text is None:
                return []
            return [s for s in original_sentences(self.state.page_text) if keyword.lower() in s.lower()]
        if page is None or not keyword:
            return []
        needle = keyword.lower()
        return [s.strip() for s in page.sentences if needle in s.lower()]

    def scores(self) -> dict[str, float]:
        s = self.state
        if self.score is None or s.gold_answer is None or s.answer is None:
            return {"em": 0.0, "f1": 0.0}
        return self.score(s.answer, s.gold_answer)

    def reward(self) -> float:
        return self.scores()["em"]

    def info(self) -> dict:
        s = self.state
        return {"steps": s.steps, "answer": s.answer, **self.scores(), "finished": s.answer is not None}
