"""WikiEnv: the paper's HotpotQA environment, text in, text out.

    env = WikiEnv(LocalIndex("data/wiki.sqlite"))
    env.reset(question, gold_answer)
    observation, reward, done, info = env.step("Search[Milhouse]")

Observation text follows the original ReAct `wikienv.py` exactly (ReAct repository, `wikienv.py`):
a hit shows the page's first 5 sentences; a miss `Could not find X. Similar: [...]`; a
disambiguation page counts as a miss on `[X]`; Lookup walks the page's sentences containing the
keyword as `(Result k / n) ...`; Finish ends the episode with `Episode finished, reward = r`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.metrics import exact_match, f1_score
from pipeline.wiki.actions import parse_action
from pipeline.wiki.backend import Page, WikiBackend

SENTENCES_SHOWN = 5
SIMILAR_SHOWN = 5
MAX_ARGUMENT_CHARS = 500  # a 10,000-character Search[...] is answered, not sent to the backend


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


class WikiEnv:
    def __init__(self, backend: WikiBackend, max_steps: int = 7):
        self.backend = backend
        self.max_steps = max_steps
        self.state = EpisodeState()

    def reset(self, question: str, gold_answer: str | None = None) -> str:
        self.state = EpisodeState(question=question, gold_answer=gold_answer)
        return f"Question: {question}"

    def step(self, action_text: str) -> tuple[str, float, bool, dict]:
        """Apply one action. Never raises on bad model text: it becomes an observation."""
        state = self.state
        if state.done:
            return "Episode already finished.", 0.0, True, self.info()
        state.steps += 1
        action = parse_action(action_text)
        reward = 0.0
        if action is None:
            observation = f"Invalid action: {action_text}"
        elif action.name == "search":
            observation = self.search(action.argument)
        elif action.name == "lookup":
            observation = self.lookup(action.argument)
        else:
            state.answer, state.done = action.argument, True
            reward = self.reward()
            observation = f"Episode finished, reward = {int(reward)}"
        if not state.done and state.steps >= self.max_steps:
            state.done = True  # step limit: ends unanswered, like the original loop
        return observation, reward, state.done, self.info()

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
        if page is None or not keyword:
            return []
        needle = keyword.lower()
        return [s.strip() for s in page.sentences if needle in s.lower()]

    def reward(self) -> float:
        if self.state.gold_answer is None:
            return 0.0
        return exact_match(self.state.answer, self.state.gold_answer)

    def info(self) -> dict:
        s = self.state
        gold = s.gold_answer
        return {
            "steps": s.steps,
            "answer": s.answer,
            "em": exact_match(s.answer, gold) if gold is not None and s.answer is not None else 0.0,
            "f1": f1_score(s.answer, gold) if gold is not None and s.answer is not None else 0.0,
            "finished": s.answer is not None,
        }
