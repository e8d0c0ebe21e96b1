"""The batched agent runner: same trajectories as one-at-a-time loops, one LLM call per round,
records as soon as episodes finish, and every kind of bad model output or backend failure ending
only its own episode.

    .venv/bin/python -m pytest tests/test_agent.py            # fast (scripted model)
    .venv/bin/python -m pytest tests/test_agent.py -m slow    # a tiny real transformers model
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import replace

import pytest

from bench.original_react import original_react_loop
from pipeline.agent.scheduler import run_episodes, run_one_at_a_time
from pipeline.core.trajectory import render
from pipeline.llm.base import Completion, GenerationRequest, cut_at_stop
from pipeline.llm.scripted import ScriptedLLM
from pipeline.methods import MethodSettings, build_method
from pipeline.methods.prompts import PromptPrefix
from pipeline.tasks.hotpotqa.questions import Question
from pipeline.wiki.backend import Page

RECORD_FIELDS = {"id", "question", "gold_answer", "method", "teacher", "prediction", "em", "f1", "finished",
                 "end_reason", "n_steps", "steps", "trajectory", "text", "prompt_tokens", "completion_tokens",
                 "seconds", "source"}

PAGES = {
    "Milhouse": ["Milhouse Van Houten is a character in The Simpsons.", "He was created by Matt Groening.",
                 "He is Bart's best friend.", "He wears glasses.", "He is blue-haired.",
                 "Milhouse was named after U.S. president Richard Nixon, whose middle name was Milhous."],
    "Richard Nixon": ["Richard Nixon was the 37th president of the United States.",
                      "He was born in Yorba Linda, California."],
    "Arthur's Magazine": ["Arthur's Magazine was an American literary periodical first published in 1844."],
    "First for Women": ["First for Women is a woman's magazine published by Bauer Media Group since 1989."],
}


class DictBackend:
    """A real WikiBackend over a dict; entities listed in `broken` raise like a failed SQLite read."""

    def __init__(self, broken: tuple[str, ...] = ()):
        self.broken = broken

    def get_page(self, entity: str) -> Page | None:
        if entity in self.broken:
            raise sqlite3.OperationalError(f"database disk image is malformed ({entity})")
        sentences = PAGES.get(entity)
        return Page(entity, sentences) if sentences else None

    def similar_titles(self, entity: str, k: int = 5) -> list[str]:
        return sorted(t for t in PAGES if set(t.lower().split()) & set(entity.lower().split()))[:k]


QUESTIONS = [
    Question("q-nixon", "Milhouse was named after who?", "Richard Nixon"),
    Question("q-born", "Where was the president Milhouse was named after born?", "Yorba Linda"),
    Question("q-mag", "Which magazine was started first, Arthur's Magazine or First for Women?", "Arthur's Magazine"),
    Question("q-lost", "What is the airspeed of an unladen swallow?", "11 m/s"),
    Question("q-short", "Who created Milhouse?", "Matt Groening"),
]


# What the scripted model "knows" without the environment (Standard / CoT answers).
RECALLED = {"Milhouse was named after who?": "Richard Nixon", "Who created Milhouse?": "Matt Groening",
            "Which magazine was started first, Arthur's Magazine or First for Women?": "First for Women"}


def current_question(prompt: str) -> str:
    return prompt[prompt.rindex("Question: ") + len("Question: "):].split("\n", 1)[0]


def observations(prompt: str) -> str:
    """The current episode's part of the prompt after its question line."""
    return prompt[prompt.rindex("Question: "):].split("\n", 1)[-1]


def react_policy(prompt: str) -> tuple[str, str]:
    """A scripted agent that READS the observations in its prompt, so a runner that mixed up
    episodes or observations would change the trajectories. Returns (thought, action)."""
    q, seen = current_question(prompt), observations(prompt)
    if "named after who" in q:
        if "Observation 1:" not in seen:
            return "I need to search Milhouse.", "Search[Milhouse]"
        m = re.search(r"named after U\.S\. president (\w+ \w+)", seen)
        if not m:
            return "The paragraph does not say who. I need to look up named after.", "Lookup[named after]"
        return f"Milhouse was named after {m.group(1)}.", f"Finish[{m.group(1)}]"
    if "born" in q:
        m = re.search(r"born in ([\w ]+),", seen)
        if m:
            return f"He was born in {m.group(1)}.", f"Finish[{m.group(1)}]"
        m = re.search(r"president (\w+ \w+)", seen)
        if m:
            return f"I need to search {m.group(1)}.", f"Search[{m.group(1)}]"
        if "Observation 1:" in seen:
            return "I need to look up named after.", "Lookup[named after]"
        return "I need to search Milhouse first.", "Search[Milhouse]"
    if "magazine" in q:
        years = re.findall(r"(?:published in|since) (\d{4})", seen)
        if len(years) == 2:
            return f"{years[0]} is before {years[1]}.", "Finish[Arthur's Magazine]"
        return "I need to search the next magazine.", ("Search[Arthur's Magazine]" if not years else "Search[First for Women]")
    if "swallow" in q:
        return "I need to search swallow.", "Search[Unladen swallow]"  # never found: step limit
    return "Milhouse was created by Matt Groening.", "Finish[Matt Groening]"


def responder(prompt: str, request: GenerationRequest) -> str:
    cue = prompt.rsplit("\n", 1)[-1]
    m = re.fullmatch(r"Thought (\d+):", cue)
    if m:
        i = m.group(1)
        thought, action = react_policy(prompt)
        # The junk after the action must be cut by the stop string, as a real model's would.
        return f" {thought}\nAction {i}: {action}\nObservation {i}: made-up text\nThought 9: more"
    m = re.fullmatch(r"Action (\d+):", cue)
    if m:
        return f" {react_policy(prompt)[1]}\nObservation {m.group(1)}: made-up"
    answer = RECALLED.get(current_question(prompt).split(": ", 1)[-1], "unknown")
    if cue == "Answer:":
        return f" {answer}\nQuestion: an invented next question"
    if cue == "Thought:":
        return f" Let's think step by step. I recall it.\nAnswer: {answer}\nQuestion: next"
    raise AssertionError(f"unexpected cue {cue!r}")


def scripted(name: str = "scripted") -> ScriptedLLM:
    return ScriptedLLM(responder, name=name)


class RecordingLLM:
    """Wraps an LLM and remembers each generate() call's requests."""

    def __init__(self, llm):
        self.llm, self.name, self.calls = llm, llm.name, []

    def generate(self, requests):
        self.calls.append(list(requests))
        return self.llm.generate(requests)


def comparable(records: list[dict]) -> dict[str, dict]:
    return {r["id"]: {k: v for k, v in r.items() if k != "seconds"} for r in records}


SETTINGS = MethodSettings(exemplars="paper")


@pytest.fixture(scope="module")
def paper_prompts(shared_data):
    return shared_data / "react" / "prompts_naive.json"


def settings_for(paper_prompts) -> MethodSettings:
    return replace(SETTINGS, exemplars=str(paper_prompts))


@pytest.mark.parametrize("method_name", ["react", "act", "standard", "cot", "react_to_cot_sc"])
def test_batched_equals_one_at_a_time(method_name, paper_prompts):
    method = build_method(method_name, settings_for(paper_prompts))
    batched = run_episodes(scripted(), DictBackend, QUESTIONS, method, max_in_flight=3)
    single = run_one_at_a_time(scripted(), DictBackend, QUESTIONS, method)
    assert comparable(batched) == comparable(single)
    assert len(batched) == len(QUESTIONS)


def test_react_matches_the_original_loop_and_is_correct(paper_prompts):
    settings = settings_for(paper_prompts)
    method = build_method("react", settings)
    batched = comparable(run_episodes(scripted(), DictBackend, QUESTIONS, method, max_in_flight=4))
    prefix = method.prefix
    original = comparable(original_react_loop(scripted(), DictBackend, QUESTIONS, prefix,
                                              max_new_tokens=settings.max_new_tokens))
    assert batched == original
    assert {i: r["em"] for i, r in batched.items()} == {"q-nixon": 1.0, "q-born": 1.0, "q-mag": 1.0,
                                                         "q-lost": 0.0, "q-short": 1.0}
    nixon = batched["q-nixon"]
    assert [s["action"] for s in nixon["steps"]] == ["Search[Milhouse]", "Lookup[named after]", "Finish[Richard Nixon]"]
    assert nixon["steps"][1]["observation"].startswith("(Result 1 / 1) Milhouse was named after")
    assert nixon["steps"][2]["observation"] == "Episode finished, reward = 1"
    lost = batched["q-lost"]
    assert (lost["end_reason"], lost["n_steps"], lost["finished"], lost["prediction"]) == ("step_limit", 7, False, None)
    assert lost["steps"][0]["observation"].startswith("Could not find Unladen swallow. Similar:")


def test_record_fields_and_rendered_text(paper_prompts):
    method = build_method("react", settings_for(paper_prompts))
    llm = RecordingLLM(scripted("teacher-x"))
    records = run_episodes(llm, DictBackend, QUESTIONS[:1], method, source="generate")
    [rec] = records
    assert set(rec) == RECORD_FIELDS
    assert (rec["teacher"], rec["method"], rec["source"], rec["finished"], rec["end_reason"]) == \
        ("teacher-x", "react", "generate", True, "finish")
    assert rec["prediction"] == "Richard Nixon" and rec["em"] == 1.0 and rec["f1"] == 1.0
    assert rec["n_steps"] == len(rec["steps"]) == 3
    assert rec["prompt_tokens"] > 0 and rec["completion_tokens"] > 0 and rec["seconds"] >= 0
    # The last prompt the model saw is the prefix + the rendered trajectory so far + the cue.
    last_prompt = llm.calls[-1][0].prompt
    text = rec["text"]
    assert last_prompt == method.prefix.text + text[: text.index("Thought 3:")] + "Thought 3:"
    assert text.startswith("Question: Milhouse was named after who?\nThought 1: I need to search Milhouse.\n"
                           "Action 1: Search[Milhouse]\nObservation 1: Milhouse Van Houten")
    assert text.endswith("Action 3: Finish[Richard Nixon]\nObservation 3: Episode finished, reward = 1\n")


def test_one_llm_call_per_round_and_records_as_they_finish(paper_prompts):
    method = build_method("react", settings_for(paper_prompts))
    llm = RecordingLLM(scripted())
    calls_at_record = []
    records = run_episodes(llm, DictBackend, QUESTIONS, method,
                           on_record=lambda r: calls_at_record.append((r["id"], len(llm.calls))),
                           max_in_flight=3)
    sizes = [len(c) for c in llm.calls]
    assert sizes[0] == 3 and max(sizes) == 3  # every waiting episode in the same call, no more than the limit
    # q-lost takes 7 rounds; the 1-step q-short joins when a slot frees and finishes long before it.
    order = [i for i, _ in calls_at_record]
    assert order.index("q-short") < order.index("q-lost")
    assert dict(calls_at_record)["q-lost"] == len(llm.calls)  # the last retired after the last call
    assert dict(calls_at_record)["q-short"] < len(llm.calls)  # retired at once, not at the end
    # Fewer rounds than a one-at-a-time run has calls.
    total_steps = sum(r["n_steps"] for r in records)
    assert len(llm.calls) < total_steps


def test_zero_shot_prompt_is_the_rendered_question_alone():
    llm = RecordingLLM(scripted())
    for name in ("react", "act", "standard", "cot"):
        run_episodes(llm, DictBackend, QUESTIONS[:1], build_method(name, MethodSettings(style="zero_shot")))
    first_prompts = [c[0].prompt for c in llm.calls]
    assert "Question: Milhouse was named after who?\nThought 1:" in first_prompts
    assert "Question: Milhouse was named after who?\nAction 1:" in first_prompts
    assert "Question: Milhouse was named after who?\nAnswer:" in first_prompts
    assert "Question: Milhouse was named after who?\nThought:" in first_prompts


# ---- bad model output, model errors and backend errors ----------------------------------------


class CompletionLLM:
    """An LLM whose responder returns a full Completion (finish reasons, errors), with stop strings
    applied as a backend would; raises when the responder raises."""

    name = "completion-llm"

    def __init__(self, respond):
        self.respond = respond

    def generate(self, requests):
        out = []
        for r in requests:
            c = self.respond(r.prompt, r)
            if c.finish_reason != "error":
                text, stopped = cut_at_stop(c.text, r.stop)
                c = Completion(text, len(r.prompt) // 4, max(1, len(text) // 4),
                               "stop" if stopped else c.finish_reason)
            out.append([c] * r.n)
        return out


def bad_responder(prompt: str, request: GenerationRequest) -> Completion:
    q = current_question(prompt)
    cue = prompt.rsplit("\n", 1)[-1]
    good = Completion(responder(prompt, request))
    if "silent" in q:  # never emits an action, even when asked again
        return Completion(" I am thinking." if cue.startswith("Thought") else "")
    if "several" in q and cue == "Thought 1:":
        return Completion(" Two at once.\nAction 1: Search[Milhouse]\nAction 1: Search[Richard Nixon]")
    if "bracket" in q:
        return Completion(" Unbalanced.\nAction 1: Search[Milhouse" if cue.startswith("Thought") else " Search[Milhouse")
    if "runaway" in q:
        return Completion(" and then" * 200, finish_reason="length")
    if "context" in q:
        return Completion("", finish_reason="error", error="context window exceeded: 9000 > 8192 tokens")
    if "crash" in q:
        raise RuntimeError("CUDA out of memory")
    return good


BAD = [
    Question("b-silent", "silent: Milhouse was named after who?", "Richard Nixon"),
    Question("b-several", "several: Milhouse was named after who?", "Richard Nixon"),
    Question("b-bracket", "bracket: Who created Milhouse?", "Matt Groening"),
    Question("b-runaway", "runaway: Who created Milhouse?", "Matt Groening"),
    Question("b-context", "context: Who created Milhouse?", "Matt Groening"),
    Question("b-crash", "crash: Who created Milhouse?", "Matt Groening"),
    Question("b-backend", "Where was the president Milhouse was named after born?", "Yorba Linda"),
    QUESTIONS[0],
]


def run_bad(method_name: str, paper_prompts, max_in_flight: int = 8):
    method = build_method(method_name, replace(settings_for(paper_prompts), max_steps=3))
    backend = DictBackend(broken=("Richard Nixon",))
    records = run_episodes(CompletionLLM(bad_responder), lambda: backend, BAD, method, max_in_flight=max_in_flight)
    single = run_one_at_a_time(CompletionLLM(bad_responder), lambda: backend, BAD, method)
    assert comparable(records) == comparable(single)
    return {r["id"]: r for r in records}


def test_bad_react_output_ends_only_its_episode(paper_prompts):
    recs = run_bad("react", paper_prompts)
    assert recs["b-silent"]["end_reason"] == "no_action"
    assert recs["b-silent"]["steps"] == [{"thought": "I am thinking.", "action": "", "observation": None}]
    assert recs["b-several"]["steps"][0]["action"] == "Search[Milhouse]"  # the first action is taken
    bracket = recs["b-bracket"]
    assert bracket["steps"][0]["observation"] == "Invalid action: search[Milhouse"
    assert (bracket["end_reason"], bracket["n_steps"]) == ("step_limit", 3)
    assert recs["b-runaway"]["end_reason"] == "runaway"
    assert recs["b-context"]["end_reason"] == "context_exceeded"
    assert recs["b-crash"]["end_reason"] == "llm_error: RuntimeError: CUDA out of memory"
    assert recs["b-backend"]["end_reason"].startswith("backend_error: OperationalError: database disk image")
    assert recs["b-backend"]["n_steps"] == 3  # Milhouse, Lookup, then the broken Richard Nixon page
    assert recs["q-nixon"]["em"] == 1.0 and recs["q-nixon"]["end_reason"] == "finish"
    for rec in recs.values():
        assert set(rec) == RECORD_FIELDS and rec["text"] == render_record(rec)
        if rec["end_reason"] != "finish":
            assert rec["finished"] is False and rec["prediction"] is None and rec["em"] == 0.0


def test_bad_act_and_direct_output(paper_prompts):
    act = run_bad("act", paper_prompts, max_in_flight=3)
    assert act["b-silent"]["end_reason"] == "no_action"
    assert act["b-bracket"]["steps"][0]["observation"] == "Invalid action: search[Milhouse"
    assert act["b-runaway"]["end_reason"] == "runaway"
    assert act["b-context"]["end_reason"] == "context_exceeded"
    assert act["q-nixon"]["end_reason"] == "finish"
    for name in ("standard", "cot"):
        recs = run_bad(name, paper_prompts)
        assert recs["b-runaway"]["end_reason"] == "runaway"
        assert recs["b-context"]["end_reason"] == "context_exceeded"
        assert recs["b-crash"]["end_reason"].startswith("llm_error: ")
        assert recs["q-nixon"]["prediction"] == "Richard Nixon" and recs["q-nixon"]["em"] == 1.0
    assert run_bad("cot", paper_prompts)["b-silent"]["end_reason"] == "no_action"


def render_record(rec: dict) -> str:
    from pipeline.core.trajectory import Trajectory

    return render(Trajectory.from_dict(rec["trajectory"])).text


# ---- CoT-SC and the hybrids ------------------------------------------------------------------


def voting_llm(answers_by_question: dict[str, list[str]]):
    def respond(prompt, request):
        q = current_question(prompt)
        if prompt.endswith("Thought:"):
            answers = answers_by_question[q]
            return [Completion(f" Let's think step by step. Guess {k}.\nAnswer: {a}\nQuestion: x")
                    for k, a in enumerate(answers)]
        return [Completion(responder(prompt, request))]

    class VotingLLM:
        name = "voting"

        def generate(self, requests):
            out = []
            for r in requests:
                cs = respond(r.prompt, r)
                cs = cs if len(cs) == r.n else cs * r.n
                out.append([Completion(cut_at_stop(c.text, r.stop)[0], 10, 5) for c in cs])
            return out

    return VotingLLM()


def test_cot_sc_majority_and_cot_sc_to_react_fallback(paper_prompts):
    settings = replace(settings_for(paper_prompts), cot_sc_samples=5)
    strong = ["Richard Nixon", "richard nixon.", "Nixon", "The Richard Nixon", "Nixon"]  # 4 of 5 agree
    weak = ["Matt Groening", "Bart", "Lisa", "Homer", "Marge"]  # 1 of 5: below n/2
    llm = voting_llm({QUESTIONS[0].question: strong, QUESTIONS[4].question: weak})
    qs = [QUESTIONS[0], QUESTIONS[4]]
    sc = {r["id"]: r for r in run_episodes(llm, DictBackend, qs, build_method("cot_sc", settings))}
    assert sc["q-nixon"]["prediction"] == "Richard Nixon" and sc["q-nixon"]["trajectory"]["format"] == "cot"
    assert sc["q-nixon"]["trajectory"]["reasoning"] == "Guess 0."
    assert sc["q-short"]["prediction"] == "Matt Groening"  # a 5-way tie: the answer seen first
    hybrid = {r["id"]: r for r in run_episodes(llm, DictBackend, qs, build_method("cot_sc_to_react", settings))}
    assert hybrid["q-nixon"]["trajectory"]["format"] == "cot"  # 4 >= 5/2 votes: kept
    assert hybrid["q-short"]["trajectory"]["format"] == "react"  # 1 < 5/2: fell back to ReAct
    assert hybrid["q-short"]["method"] == "cot_sc_to_react" and hybrid["q-short"]["em"] == 1.0
    # The 5 samples came in ONE request with n=5 at the CoT-SC temperature.
    rec_llm = RecordingLLM(llm)
    run_episodes(rec_llm, DictBackend, qs, build_method("cot_sc", settings))
    [[r1, r2]] = rec_llm.calls
    assert (r1.n, r1.temperature, r1.stop) == (5, 0.7, ["\nQuestion:"]) and r1.seed != r2.seed


def test_react_to_cot_sc_falls_back_when_react_gives_no_answer(paper_prompts):
    settings = replace(settings_for(paper_prompts), cot_sc_samples=3)
    lost = QUESTIONS[3]
    llm = voting_llm({lost.question: ["11 m/s", "11 m/s", "20 mph"]})
    [rec] = run_episodes(llm, DictBackend, [lost], build_method("react_to_cot_sc", settings))
    assert rec["trajectory"]["format"] == "cot" and rec["prediction"] == "11 m/s" and rec["em"] == 1.0
    [kept] = run_episodes(llm, DictBackend, [QUESTIONS[0]], build_method("react_to_cot_sc", settings))
    assert kept["trajectory"]["format"] == "react" and kept["end_reason"] == "finish"


# ---- a tiny real model: the batched runner against the one-at-a-time loops --------------------


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    """A random tiny Llama over a character vocabulary, its newline logit scaled up so that its
    (meaningless) outputs break into lines: Act episodes then run several steps of invalid
    actions, ReAct ones take the ask-again path; enough to exercise every branch of the runner."""
    import string

    torch = pytest.importorskip("torch")
    from tokenizers import Tokenizer, decoders, models
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    chars = ["<unk>", "<eos>"] + sorted(set(string.ascii_letters + string.digits + string.punctuation + " \n"))
    core = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(chars)}, merges=[], unk_token="<unk>"))
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", eos_token="<eos>", pad_token="<eos>")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(chars), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=4, intermediate_size=128, max_position_embeddings=4096,
                         tie_word_embeddings=False, initializer_range=0.2, eos_token_id=1, bos_token_id=1,
                         pad_token_id=1)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight[chars.index("\n")] *= 3
    path = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.mark.slow
def test_tiny_real_model_batched_equals_sequential(tiny_model_dir):
    from pipeline.llm.config import LLMConfig
    from pipeline.llm.hf import TransformersLLM

    llm = TransformersLLM(LLMConfig(model=str(tiny_model_dir), dtype="float32", device="cpu", max_batch_size=8))
    settings = MethodSettings(style="zero_shot", max_steps=3, max_new_tokens=24)
    prefix = PromptPrefix("react", "Answer questions with Search, Lookup and Finish.\n",
                          "Question: Who created Milhouse?\nThought 1: Search him.\nAction 1: Search[Milhouse]\n", "test")
    react = build_method("react", settings)
    react.prefix = prefix  # a short few-shot prefix shared by every prompt (the backend's prefix cache)
    batched = comparable(run_episodes(llm, DictBackend, QUESTIONS, react, max_in_flight=5))
    single = comparable(run_one_at_a_time(llm, DictBackend, QUESTIONS, react))
    original = comparable(original_react_loop(llm, DictBackend, QUESTIONS, prefix, max_steps=3, max_new_tokens=24))
    assert batched == single == original
    assert all(r["completion_tokens"] > 0 for r in batched.values())
    act = build_method("act", settings)
    batched = comparable(run_episodes(llm, DictBackend, QUESTIONS, act, max_in_flight=5))
    assert batched == comparable(run_one_at_a_time(llm, DictBackend, QUESTIONS, act))
    assert max(r["n_steps"] for r in batched.values()) == 3  # several rounds with episodes in flight
