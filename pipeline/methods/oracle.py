"""The `oracle` teacher: a STAND-IN that writes correct trajectories from HotpotQA's gold
supporting facts. It is NOT the paper's teacher (PaLM-540B prompted with ReAct); its records say
`teacher: "oracle"`. It exists so offline runs and tests have correct, environment-grounded
trajectories in every format without a large model.

  react / act  Search each gold title through the real WikiEnv; when a supporting sentence is not
               among the 5 sentences a search shows, Lookup a keyword of that sentence (chosen so
               the sentence comes up first when possible); then Finish[gold answer]. Templated
               thoughts (ReAct) restate the evidence the observations showed.
  cot          reasoning = the supporting sentences, then "So the answer is <gold>."
  standard     the gold answer.

A gold page that the index does not hold ends the episode unanswered with end_reason
`oracle_missing_page: <title>`: the oracle never answers without its evidence.

    from pipeline.agent import run_episodes
    from pipeline.methods.oracle import oracle_method
    run_episodes(None, lambda: index, questions, oracle_method("react"), sink, teacher="oracle")
"""

from __future__ import annotations

import re

from pipeline.errors import PipelineError
from pipeline.methods.base import EpisodeContext, MethodSettings, Outcome, Program, backend_errors
from pipeline.trajectory import FORMATS, Step, Trajectory, one_line
from pipeline.wiki.backend import Page

TEACHER = "oracle"
MAX_THOUGHT_WORDS = 45
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9'\-]*")
_STOPWORDS = frozenset("""a an and are as at be been by did do does for from had has have he her his how in
into is it its of on or she that the their them they this to was were what when where which who whom
whose why with which also than then there these those both either same other name named first""".split())


def oracle_method(fmt: str, settings: MethodSettings | None = None) -> OracleMethod:
    if fmt not in FORMATS:
        raise PipelineError(f"the oracle teacher writes {', '.join(FORMATS)} trajectories, not '{fmt}'")
    return OracleMethod(fmt, settings or MethodSettings())


class OracleMethod:
    """An episode program (pipeline.methods.base) that never asks a model."""

    def __init__(self, fmt: str, settings: MethodSettings):
        self.name, self.settings = fmt, settings

    def run(self, ctx: EpisodeContext) -> Program:
        return self.write(ctx)
        yield  # unreachable: makes run() a generator, like every other method's program

    def write(self, ctx: EpisodeContext) -> Outcome:
        q = ctx.question
        traj = Trajectory(ctx.text, self.name)
        if self.name == "standard":
            traj.answer = q.answer
            return Outcome(traj, q.answer, "finish")
        env = ctx.make_env()
        env.reset(ctx.text, q.answer)
        try:
            if self.name == "cot":
                return self.write_cot(q, env.backend, traj)
            return self.write_interactive(q, env, traj)
        except backend_errors() as exc:
            return Outcome(traj, None, f"backend_error: {type(exc).__name__}: {exc}")

    # -- CoT ----------------------------------------------------------------------------------
    def write_cot(self, q, backend, traj: Trajectory) -> Outcome:
        evidence = []
        for title in gold_titles(q):
            page = backend.get_page(title)
            if page is None or page.is_disambiguation:
                return Outcome(traj, None, f"oracle_missing_page: {title}")
            evidence += [s for s in supporting_sentences(q, title, page) if s not in evidence]
        traj.reasoning = " ".join(clip(s) for s in evidence) + f" So the answer is {q.answer}."
        traj.answer = q.answer
        return Outcome(traj, q.answer, "finish")

    # -- Act / ReAct ---------------------------------------------------------------------------
    def write_interactive(self, q, env, traj: Trajectory) -> Outcome:
        titles = gold_titles(q)
        lookups_left = self.settings.max_steps - len(titles) - 1  # the step budget bounds lookups
        if lookups_left < 0:
            return Outcome(traj, None, "step_limit")
        thought = opening_thought(q, titles)
        seen: list[str] = []  # evidence sentences the observations showed, for the next thought
        for k, title in enumerate(titles):
            observation = self.act(env, traj, thought, f"Search[{title}]")
            page = env.state.page
            if page is None:
                return Outcome(traj, None, f"oracle_missing_page: {title}")
            fresh: list[str] = []
            for sentence in supporting_sentences(q, title, page):
                if one_line(sentence) in observation:
                    fresh.append(sentence)
                    continue
                keyword, rank = lookup_keyword(sentence, page, q.question, title)
                if keyword is None or rank + 1 > lookups_left:
                    continue
                thought = (f"The paragraph does not say it yet. I need to look up {keyword} "
                           f"on the {title} page.")
                for _ in range(rank + 1):
                    observation = self.act(env, traj, thought, f"Lookup[{keyword}]")
                    thought = "The result is not the one I need. I need to look up the next one."
                lookups_left -= rank + 1
                if one_line(sentence) in observation:
                    fresh.append(sentence)
            seen += fresh
            evidence = " ".join(clip(s) for s in fresh) or f"The {title} page has the facts I need."
            if k + 1 < len(titles):
                thought = f"{evidence} Next, I need to search {titles[k + 1]}."
            else:
                thought = f"{evidence} So the answer is {q.answer}."
        self.act(env, traj, thought, f"Finish[{q.answer}]")
        info = env.info()
        if not info["finished"]:
            return Outcome(traj, None, "step_limit")
        traj.answer = info["answer"]
        return Outcome(traj, info["answer"], "finish")

    def act(self, env, traj: Trajectory, thought: str, action: str) -> str:
        """Take one action in the real environment and append the step."""
        observation, _, _, _ = env.step(action)
        step = Step(thought if self.name == "react" else None, action, one_line(observation))
        traj.steps.append(step)
        return step.observation


def gold_titles(q) -> list[str]:
    return list(dict.fromkeys(title for title, _ in q.supporting_facts))


def supporting_sentences(q, title: str, page: Page) -> list[str]:
    """The page's supporting sentences for `title`, in order. A paragraph-level fact (null index)
    stands for the sentence that names the answer, else the first sentence."""
    indices = sorted({idx for t, idx in q.supporting_facts if t == title and idx is not None})
    sentences = [page.sentences[i].strip() for i in indices if 0 <= i < len(page.sentences)]
    if not sentences and page.sentences:
        answer = q.answer.lower()
        sentences = [next((s.strip() for s in page.sentences if answer in s.lower()), page.sentences[0].strip())]
    return [s for s in sentences if s]


def lookup_keyword(sentence: str, page: Page, question: str, title: str) -> tuple[str | None, int]:
    """A word of `sentence` to Lookup, and how many earlier results come before it (0 = first).
    Words the question shares with the sentence are preferred, then names, then long words."""
    question_words = {w.lower() for w in _WORD.findall(question)}
    title_words = {w.lower() for w in _WORD.findall(title)}
    candidates = []
    for position, word in enumerate(_WORD.findall(sentence)):
        low = word.lower()
        if low in _STOPWORDS or low in title_words or len(word) < 4:
            continue
        preference = 0 if low in question_words else 1 if word[0].isupper() else 2
        candidates.append((word, preference, position))
    best = None
    for word, preference, position in candidates:
        results = [s.strip() for s in page.sentences if word.lower() in s.lower()]
        if sentence.strip() not in results:
            continue
        key = (results.index(sentence.strip()), preference, -len(word), position)
        if best is None or key < best[0]:
            best = (key, word)
    if best is None:
        return None, 0
    return best[1], best[0][0]


def opening_thought(q, titles: list[str]) -> str:
    if len(titles) == 1:
        return f"I need to search {titles[0]} and find the answer there."
    listed = ", ".join(titles[:-1]) + f" and {titles[-1]}"
    if getattr(q, "type", None) == "comparison":
        return f"I need to search {listed}, then compare them."
    return f"I need to search {listed}, and combine what they say to find the answer."


def clip(sentence: str) -> str:
    """A sentence as a thought: one line, at most MAX_THOUGHT_WORDS words."""
    words = one_line(sentence).split()
    if len(words) <= MAX_THOUGHT_WORDS:
        return " ".join(words)
    return " ".join(words[:MAX_THOUGHT_WORDS]) + " ..."


