"""The `oracle` teacher: a STAND-IN that writes correct trajectories from HotpotQA's gold
supporting facts. It is NOT the paper's teacher (PaLM-540B prompted with ReAct); its records say
`teacher: "oracle"`. It exists so offline runs and tests have correct, environment-grounded
trajectories in every format without a large model.

  react / act  Search each gold page through the real WikiEnv; when a supporting sentence is not
               among the 5 sentences a search shows, Lookup a keyword of that sentence (chosen so
               the sentence comes up first when possible); then Finish[gold answer]. Templated
               thoughts (ReAct) restate the evidence the observations showed. Two styles
               (the stage's `oracle` key: `oracle: exact` or `oracle: agent`):
               exact  search each gold title exactly as written (`Search[Adorable (band)]`): never
                      misses, so its trajectories show no recovery;
               agent  search each entity the way an agent reading the question would (see
                      `search_query`: `Search[Adorable]`); on a miss pick the gold title from the
                      `Similar:` list (or, when it is not there, search the full title), and on a
                      page that is not the one meant, search the full title. Its trajectories
                      show misses and recoveries, as a prompted teacher's do (though its
                      recovery always knows the gold title: it is still a stand-in).
               In the bm25 search mode (wiki.search=bm25, a retriever; `agent` style only: `exact`
               is refused, a student could not know the gold titles) it searches the way a
               student could: the name as the question writes it (a bridge entity as an earlier
               observation writes it), else the question itself, and reads the gold page among
               the retrieved ones; when it is not retrieved, it searches the question; if the
               page is still not retrieved the episode ends unanswered (`oracle_not_retrieved`).
               Its Lookups walk the retrieved pages' sentences, as the environment's do.
  cot          reasoning = the supporting sentences, then "So the answer is <gold>."
  standard     the gold answer.

A gold page that the index does not hold ends the episode unanswered with end_reason
`oracle_missing_page: <title>`: the oracle never answers without its evidence. Both styles are
deterministic: the agent style draws the wording of its recovery thoughts from a generator seeded
by the question id and `prompting.seed`.

    from pipeline.agent.scheduler import run_episodes
    from pipeline.tasks.hotpotqa.oracle import oracle_method
    run_episodes(None, lambda: index, questions, oracle_method("react", style="agent"), sink, teacher="oracle")
"""

from __future__ import annotations

import ast
import random
import re

from pipeline.core.errors import PipelineError
from pipeline.core.trajectory import FORMATS, Step, Trajectory, one_line
from pipeline.methods.base import (
    EpisodeContext,
    MethodSettings,
    Outcome,
    Program,
    backend_errors,
    episode_seed,
)
from pipeline.tasks.base import DEFAULT_ORACLE_STYLE, check_oracle_style
from pipeline.wiki.backend import Page
from pipeline.wiki.index import title_key

TEACHER = "oracle"
MAX_THOUGHT_WORDS = 45
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9'\-]*")
_STOPWORDS = frozenset("""a an and are as at be been by did do does for from had has have he her his how in
into is it its of on or she that the their them they this to was were what when where which who whom
whose why with which also than then there these those both either same other name named first""".split())


def oracle_method(fmt: str, settings: MethodSettings | None = None, style: str = DEFAULT_ORACLE_STYLE) -> OracleMethod:
    if fmt not in FORMATS:
        raise PipelineError(f"the oracle teacher writes {', '.join(FORMATS)} trajectories, not '{fmt}'")
    check_oracle_style(style)
    return OracleMethod(fmt, settings or MethodSettings(), style)


class OracleMethod:
    """An episode program (pipeline.methods.base) that never asks a model."""

    def __init__(self, fmt: str, settings: MethodSettings, style: str = DEFAULT_ORACLE_STYLE):
        from pipeline.tasks import get_task

        self.name, self.settings, self.style = fmt, settings, style
        self.task = get_task("hotpotqa")  # it reads HotpotQA's gold supporting facts

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
            if env.search_mode == "bm25":
                return self.write_retrieved(q, env, traj)
            if self.style == "agent":
                return self.write_agent(q, env, traj)
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
            fresh, used = self.show_evidence(q, env, traj, title, page, observation, lookups_left)
            lookups_left -= used
            seen += fresh
            evidence = " ".join(clip(s) for s in fresh) or f"The {title} page has the facts I need."
            if k + 1 < len(titles):
                thought = f"{evidence} Next, I need to search {titles[k + 1]}."
            else:
                thought = f"{evidence} So the answer is {q.answer}."
        return self.finish(q, env, traj, thought)

    def finish(self, q, env, traj: Trajectory, thought: str) -> Outcome:
        self.act(env, traj, thought, f"Finish[{q.answer}]")
        info = env.info()
        if not info["finished"]:
            return Outcome(traj, None, "step_limit")
        traj.answer = info["answer"]
        return Outcome(traj, info["answer"], "finish")

    def show_evidence(self, q, env, traj: Trajectory, title: str, page: Page, observation: str,
                      lookups_left: int, looked_in: Page | None = None) -> tuple[list[str], int]:
        """The supporting sentences of `title` the search showed, or that a Lookup brings up while
        `lookups_left` steps allow; returns them and the Lookup steps taken. `looked_in`: what a
        Lookup walks when it is not the page alone (the bm25 mode: every retrieved page)."""
        fresh: list[str] = []
        used = 0
        for sentence in supporting_sentences(q, title, page):
            if one_line(sentence) in observation:
                fresh.append(sentence)
                continue
            keyword, rank = lookup_keyword(sentence, looked_in or page, q.question, title)
            if keyword is None or used + rank + 1 > lookups_left:
                continue
            thought = (f"The paragraph does not say it yet. I need to look up {keyword} "
                       f"on the {title} page.")
            for _ in range(rank + 1):
                observation = self.act(env, traj, thought, f"Lookup[{keyword}]")
                thought = "The result is not the one I need. I need to look up the next one."
            used += rank + 1
            if one_line(sentence) in observation:
                fresh.append(sentence)
        return fresh, used

    # -- Act / ReAct, agent style ----------------------------------------------------------------
    def write_agent(self, q, env, traj: Trajectory) -> Outcome:
        """Search each entity as the question (or an earlier observation) writes it, recover
        from a miss or a wrong page, Lookup what the search did not show, Finish."""
        rng = random.Random(episode_seed(q.id, self.settings.seed))
        titles = agent_order(q)
        if len(titles) + 1 > self.settings.max_steps:
            return Outcome(traj, None, "step_limit")
        query = self.affordable_query(traj, titles, 0, q.question)
        thought = agent_opening(q, titles, query)
        for k, title in enumerate(titles):
            observation = self.act(env, traj, thought, f"Search[{query}]")
            if not on_page(env, title) and title_key(query) != title_key(title):
                thought = recovery_thought(query, title, observation, env.state.page is not None, rng)
                observation = self.act(env, traj, thought, f"Search[{title}]")
            if not on_page(env, title):
                return Outcome(traj, None, f"oracle_missing_page: {title}")
            reserve = len(titles) - k  # the later titles' searches and the Finish
            lookups_left = self.settings.max_steps - len(traj.steps) - reserve
            fresh, _ = self.show_evidence(q, env, traj, title, env.state.page, observation, lookups_left)
            evidence = " ".join(clip(s) for s in fresh) or f"The {title} page has the facts I need."
            if k + 1 < len(titles):
                query = self.affordable_query(traj, titles, k + 1, q.question)
                thought = f"{evidence} Next, I need to search {query}."
            else:
                thought = f"{evidence} So the answer is {q.answer}."
        return self.finish(q, env, traj, thought)

    # -- Act / ReAct, the bm25 (retriever) mode ---------------------------------------------------
    def write_retrieved(self, q, env, traj: Trajectory) -> Outcome:
        """Search each gold page with a query a student could write, find it among the retrieved
        pages (else search the question), Lookup what they did not show, Finish."""
        titles = agent_order(q)
        if len(titles) + 1 > self.settings.max_steps:
            return Outcome(traj, None, "step_limit")
        query = retriever_query(titles[0], q.question, "")
        thought = agent_opening(q, titles, query)
        for k, title in enumerate(titles):
            observation = self.act(env, traj, thought, f"Search[{query}]")
            steps_left = self.settings.max_steps - len(traj.steps)
            if retrieved(env, title) is None and query != q.question and steps_left > len(titles) - k:
                thought = f"None of these is the page I need. I need to search the question's words: {q.question}"
                observation = self.act(env, traj, thought, f"Search[{q.question}]")
            page = retrieved(env, title)
            if page is None:
                return Outcome(traj, None, f"oracle_not_retrieved: {title}")
            lookups_left = self.settings.max_steps - len(traj.steps) - (len(titles) - k)
            everything = Page("retrieved", [s for p in env.state.pages for s in p.sentences])
            fresh, _ = self.show_evidence(q, env, traj, title, page, observation, lookups_left, everything)
            evidence = " ".join(clip(s) for s in fresh) or f"The {title} page has the facts I need."
            if k + 1 < len(titles):
                read = " ".join(step.observation for step in traj.steps)
                query = retriever_query(titles[k + 1], q.question, read)
                thought = f"{evidence} Next, I need to search {query}."
            else:
                thought = f"{evidence} So the answer is {q.answer}."
        return self.finish(q, env, traj, thought)

    def affordable_query(self, traj: Trajectory, titles: list[str], k: int, question: str) -> str:
        """The query for titles[k]; the exact title when a miss could not be recovered within
        the step limit (the later titles' searches and the Finish come first)."""
        title = titles[k]
        read = " ".join(step.observation for step in traj.steps)  # where a bridge entity is named
        query = search_query(title, question, read)
        steps_left = self.settings.max_steps - len(traj.steps)
        if title_key(query) != title_key(title) and steps_left < (len(titles) - k) + 2:
            return title
        return query

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


# -- the agent style's search rule ----------------------------------------------------------------
_NAME_WORD = re.compile(r"[^\W_]+(?:['\u2019.][^\W_]+)*")  # words; "Arthur's", "U.S" stay whole
_DISAMBIGUATOR = re.compile(r"\s*\([^()]*\)\s*$")  # a trailing "(band)", "(2007 film)"
_POSSESSIVE = ("'s", "\u2019s")


def base_title(title: str) -> str:
    """The title without its trailing parenthetical disambiguator: "Adorable (band)" -> "Adorable"."""
    return _DISAMBIGUATOR.sub("", title).strip() or title


def name_span(title: str, text: str) -> str | None:
    """The span of `text` that names the page `title`, as `text` writes it, or None.

    The rule: compare words case-insensitively (a possessive "'s" in the text is ignored) and
    take the longest run of consecutive words of `text` that is also a run of consecutive words
    of the title without its disambiguator (the earliest, among equally long ones). It counts
    when it is the whole of that title, or at least 2 words and at least half of the title's
    words, with a word written as a name (capitalised or a number, not a stopword); otherwise
    the text does not name the page."""
    title_words = [w.casefold() for w in _NAME_WORD.findall(base_title(title))]
    if not title_words:
        return None
    want = [_strip_possessive(w) for w in title_words]
    words = list(_NAME_WORD.finditer(text))
    have = [_strip_possessive(m.group().casefold()) for m in words]
    best = (0, 0, 0)  # (length, start in text words, start in title words)
    for i in range(len(have)):
        for j in range(len(want)):
            n = 0
            while i + n < len(have) and j + n < len(want) and have[i + n] == want[j + n]:
                n += 1
            if n > best[0]:
                best = (n, i, j)
    n, i, j = best
    if n == 0 or not (n == len(want) or (n >= 2 and 2 * n >= len(want))):
        return None
    if not any(_is_name_word(m.group()) for m in words[i:i + n]):
        return None  # "high school" does not name "DuSable High School"; "DuSable" would
    span = text[words[i].start():words[i + n - 1].end()]
    # "Adele's album" names "Adele": the possessive is the text's, not the title's
    return span if title_words[j + n - 1].endswith(_POSSESSIVE) else _strip_possessive(span)


def _is_name_word(word: str) -> bool:
    return word.casefold() not in _STOPWORDS and (word[:1].isupper() or word[:1].isdigit())


def _strip_possessive(word: str) -> str:
    for suffix in _POSSESSIVE:
        if word.endswith(suffix) and len(word) > len(suffix):
            return word[: -len(suffix)]
    return word


def search_query(title: str, question: str, read: str = "") -> str:
    """What the agent style searches for the page `title`: the name as the question writes it;
    for a page the question does not name (a bridge entity), the name as an earlier observation
    writes it; else the full title."""
    return name_span(title, question) or name_span(title, read) or title


def retriever_query(title: str, question: str, read: str) -> str:
    """The bm25 mode's query for the page `title`: the name as the question (or, for a bridge
    entity, an earlier observation) writes it; else the question itself, never the gold title."""
    return name_span(title, question) or name_span(title, read) or question


def retrieved(env, title: str) -> Page | None:
    """The gold page `title` among the last Search's retrieved pages, or None."""
    return next((p for p in env.state.pages if title_key(p.title) == title_key(title)), None)


def agent_order(q) -> list[str]:
    """Gold titles in the order an agent meets them: those the question names, by where it
    names them, then the others (bridge entities) in the supporting facts' order."""
    titles = gold_titles(q)
    named = {t: _span_start(t, q.question) for t in titles}
    return sorted(titles, key=lambda t: (named[t] is None, named[t] or 0, titles.index(t)))


def _span_start(title: str, text: str) -> int | None:
    span = name_span(title, text)
    return None if span is None else text.find(span)


def on_page(env, title: str) -> bool:
    """Whether the environment's current page is the gold page `title`."""
    page = env.state.page
    return page is not None and title_key(page.title) == title_key(title)


def similar_shown(observation: str) -> list[str]:
    """The titles a miss observation lists after `Similar:` ([] if it lists none or reads otherwise)."""
    found = re.search(r"Similar: (\[.*\])\.?\s*$", observation)
    if not found:
        return []
    try:
        listed = ast.literal_eval(found.group(1))  # a Python list repr of strings: data, never code
    except (ValueError, SyntaxError):
        return []
    return [t for t in listed if isinstance(t, str)] if isinstance(listed, list) else []


_FROM_SIMILAR = ("The search for {q} found no page; the similar titles include {t}, which is the one the question means.",
                 "There is no page for {q}. Of the similar titles, {t} is the one the question is about.")
_NOT_SIMILAR = ("The search for {q} found no page, and none of the similar titles is the one I need. "
                "I need to search the full name, {t}.",
                "{q} is not a page title here, and the similar titles do not help. I should search {t} instead.")
_WRONG_PAGE = ("This {q} is not the one the question means. I need to search {t}.",
               "That page is about a different {q}. The question means {t}, so I need to search that.")


def recovery_thought(query: str, title: str, observation: str, got_a_page: bool, rng: random.Random) -> str:
    """Why the agent style searches `title` after `Search[query]` did not reach it, in words
    grounded in the observation: a different page, or a miss whose Similar list does or does not
    hold the title."""
    if got_a_page:
        templates = _WRONG_PAGE
    elif title in similar_shown(observation):
        templates = _FROM_SIMILAR
    else:
        templates = _NOT_SIMILAR
    thought = rng.choice(templates).format(q=query, t=title)
    return thought[:1].upper() + thought[1:]


def agent_opening(q, titles: list[str], first_query: str) -> str:
    """The first thought: the entities the question names (as it names them), in order."""
    named = [search_query(t, q.question) for t in titles if name_span(t, q.question)]
    if len(named) <= 1:
        if len(titles) == 1:
            return f"I need to search {first_query} and find the answer there."
        return f"I need to search {first_query} first, then follow what it says to the answer."
    listed = ", ".join(named[:-1]) + f" and {named[-1]}"
    if getattr(q, "type", None) == "comparison":
        return f"I need to search {listed}, then compare them."
    return f"I need to search {listed}, and combine what they say to find the answer."


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


