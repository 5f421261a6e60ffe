"""Supervised warm-start data: search trajectories synthesised from decomposed QA and real retrieval.

A small instruction model prompted as Search-R1 neither uses the tags nor answers from what it reads
(docs/offline-defaults.md measures 0 of 40), so mining has no agent to learn from. We teach the format and
the habit of answering from the passages with trajectories built from FanOutQA's decomposition leaves:

* the searches are phrasings of a leaf sub-question (the question itself, its content words, the
  evidence page's title with the content words not already in it);
* the ``<information>`` blocks are the retriever's real top-k results for each phrasing, formatted and cut
  exactly as the environment does (`Dialect.format_observation`, `cut_to_tokens`);
* the final answer is the leaf's gold answer, and a trajectory is built ONLY when the evidence passage is
  among the passages the trajectory retrieved and holds that answer (word-bounded, normalised): the
  model must learn to answer from what it read, never to guess;
* when a phrasing misses the evidence and another phrasing finds it, the miss becomes a first search
  followed by a second one: a real two-search chain that teaches searching again instead of guessing;
* a dialect whose search holds several queries (QAgent's 1-3 ``<query>`` lines) may search several phrasings at
  once (`SynthesisConfig.queries_per_search`): the phrasings are taken in groups of that size, one search per
  group with every query's results in its observation, and the rules above apply to groups instead of phrasings.

The reasoning lines are short, fixed templates grounded in the retrieved text (the sentence of the
evidence passage that holds the answer), written in the dialect's tags (`VOICES`: Search-R1's ``<think>``, QAgent's
``<plan>`` before every search and ``<reflection>`` after every observation, or the `reflect` dialect's
``<reflect>`` after every observation). Every example records how it was built in `SFTExample.meta`.

One dialect may also answer without searching: the `reflect` agent of "Learning When to Search" thinks, reflects
and answers from its own knowledge when it can. With `SynthesisConfig.direct_answer_share` > 0 a share of the
examples is such a direct answer (the gold answer, stated from memory), so the warm-started agent starts with both
branches open and RL decides between them (`benchmarks/experiments/when_to_search/when_to_search_training.py`). These examples teach recall of
train answers, not reading: leave the share at 0 for any other use.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from agentic_retriever.base.client import RetrievalClient
from agentic_retriever.base.corpus import ScoredPassage
from agentic_retriever.base.llm.text import render_chat_prompt
from agentic_retriever.base.qa_metrics import normalize_answer
from agentic_retriever.base.qa_sources import QARow

from ..dialects import get_dialect
from ..env import cut_to_tokens
from .train import SFTExample

__all__ = ["VOICES", "SynthesisConfig", "Voice", "query_phrasings", "synthesize_sft_examples"]

_QUESTION_WORDS = frozenset(
    "what which who whom whose when where why how is are was were do does did the a an of in on at to for by "
    "from with and or as be been being has have had it its this that these those there their find name list "
    "give tell me".split())


@dataclass
class SynthesisConfig:
    """How the warm-start trajectories are built (the `agent_sft.synthesis` section of a config file)."""

    topk: int = field(default=3, metadata={"help": "passages per search, as the agent will see them"})
    observation_max_tokens: int = field(default=500, metadata={"help": "cut of every observation, in tokens"})
    dialect: str = field(default="search_r1", metadata={
        "help": "agent dialect of the trajectories (search_r1, qagent, reflect)"})
    retry_chains: bool = field(default=True, metadata={"help": "add miss-then-find two-search trajectories"})
    direct_answer_share: float = field(default=0.0, metadata={
        "help": "share of the examples that answer from memory without searching, in [0, 1) (dialects whose agent "
                "may answer without a search: reflect)"})
    queries_per_search: int = field(default=1, metadata={
        "help": "phrasings searched at once, in one search (dialects whose search holds several queries: qagent, "
                "up to 3)"})
    max_searches: int = field(default=6, metadata={
        "help": "most searches of a multi-search trajectory (its first leaf sub-questions; agent_sft.multihop_qa)"})
    grounded_steps: bool = field(default=False, metadata={
        "help": "multi-search trajectories name only what the agent has read: a sub-question's names absent from "
                "the question and the observations so far become 'each one' in the plan and leave its query "
                "(agent.sft.multihop)"})

    def __post_init__(self):
        if not 0.0 <= self.direct_answer_share < 1.0:
            raise ValueError(f"synthesis.direct_answer_share must be in [0, 1), got {self.direct_answer_share}")
        if self.queries_per_search < 1:
            raise ValueError(f"synthesis.queries_per_search must be at least 1, got {self.queries_per_search}")
        if self.max_searches < 2:
            raise ValueError(f"synthesis.max_searches must be at least 2, got {self.max_searches}")


def content_words(question: str) -> str:
    """The question without question words, articles and punctuation (a keyword query)."""
    words = re.findall(r"[\w'-]+", question)
    kept = [w for w in words if w.lower() not in _QUESTION_WORDS]
    return " ".join(kept)


def query_phrasings(row: QARow, keywords_only: bool = False) -> list[str]:
    """Distinct search phrasings of a leaf question: as asked (unless `keywords_only`), its content words, and its
    evidence title with the content words the title does not already hold."""
    phrasings = [] if keywords_only else [row.question.strip()]
    phrasings.append(content_words(row.question))
    for title in row.supporting_titles or ():
        title_words = {w.lower() for w in re.findall(r"[\w'-]+", title)}
        rest = [w for w in content_words(row.question).split() if w.lower() not in title_words]
        phrasings.append(" ".join([title, *rest]))
    seen, unique = set(), []
    for phrasing in phrasings:
        key = phrasing.lower()
        if phrasing and key not in seen:
            seen.add(key)
            unique.append(phrasing)
    return unique


def _answer_sentence(passage: ScoredPassage, golden: Sequence[str]) -> tuple[str, str] | None:
    """(gold answer, sentence of the passage holding it), word-bounded after normalisation; None if absent."""
    sentences = re.split(r"(?<=[.!?])\s+", passage.text.strip())
    for answer in golden:
        target = normalize_answer(answer)
        if not target:
            continue
        pattern = re.compile(rf"\b{re.escape(target)}\b")
        for sentence in sentences:
            if pattern.search(normalize_answer(sentence)):
                return answer, sentence.strip()
    return None


def _evidence_hit(hits: Sequence[ScoredPassage], row: QARow) -> tuple[ScoredPassage, str, str] | None:
    """The first retrieved evidence passage that holds a gold answer, with that answer and sentence."""
    titles = {t.casefold() for t in row.supporting_titles or ()}
    for passage in hits:
        if passage.title.casefold() in titles and (found := _answer_sentence(passage, row.golden_answers)):
            return passage, *found
    return None


@dataclass(frozen=True)
class Voice:
    """How a dialect's agent writes the synthesised turns: the first search (``{goal}``, ``{queries}``), a search
    after a miss (``{queries}``), the answer grounded in the evidence sentence (``{title}``, ``{sentence}``,
    ``{answer}``), and, for an agent that may answer without searching, the direct answer from memory (``{goal}``,
    ``{answer}``; None: it always searches). ``{queries}`` is the search's queries, each written as `query`
    (``{query}``), one per line; `max_queries` is how many one search may hold. `keyword_queries`: the agent is asked
    for keyword queries, so the question as asked is not one of its phrasings."""

    first_search: str
    next_search: str
    answer: str
    direct: str | None = None
    keyword_queries: bool = False
    query: str = "{query}"
    max_queries: int = 1

    def queries(self, queries: Sequence[str]) -> str:
        return "\n".join(self.query.format(query=q) for q in queries)


#: The turns per dialect. Search-R1 reasons in ``<think>``; QAgent ("QAgent: A modular Search Agent with Interactive
#: Query Understanding", arXiv 2510.08383, Table 5) plans in ``<plan>`` before every search, puts each query in
#: ``<query>`` tags, at most 3 per search (`QAgentSettings.max_queries`), and reflects in ``<reflection>`` right
#: after every ``<information>`` (the format its stage-1 reward checks, `agent.rewards.qagent_format`).
VOICES: dict[str, Voice] = {
    "search_r1": Voice(
        first_search="<think> I need to find {goal}. </think>\n<search> {queries} </search>",
        next_search="<think> The results do not answer the question. I will search with other words. </think>\n"
                    "<search> {queries} </search>",
        answer="<think> The passage about {title} says: {sentence} </think>\n<answer> {answer} </answer>"),
    "qagent": Voice(
        first_search="<plan> I need to find {goal}. </plan>\n<search>\n{queries}\n</search>",
        next_search="<reflection> The results do not answer the question. </reflection>\n"
                    "<plan> I will search with other words. </plan>\n<search>\n{queries}\n</search>",
        answer="<reflection> The passage about {title} says: {sentence} </reflection>\n<answer> {answer} </answer>",
        query="<query>{query}</query>", max_queries=3),
    # "Learning When to Search" (Appendix B.4's prompt): one <think> first, a <reflect> after every <information>,
    # "a brief keyword-based search query", and think -> reflect -> answer when the agent knows the answer. Both
    # branches open with the same words, so the choice to search is made at one place.
    "reflect": Voice(
        first_search="<think> I need to find {goal}. I will search for it. </think>\n<search> {queries} </search>",
        next_search="<reflect> The results do not answer the question. I will search with other words. </reflect>\n"
                    "<search> {queries} </search>",
        answer="<reflect> The passage about {title} says: {sentence} </reflect>\n<answer> {answer} </answer>",
        direct="<think> I need to find {goal}. I know it. </think>\n<reflect> I recall that the answer is {answer}. "
               "</reflect>\n<answer> {answer} </answer>",
        keyword_queries=True),
}


@dataclass(frozen=True)
class _Search:
    """One synthesised search: its queries, each query's retrieved passages, and the first retrieved evidence
    passage holding a gold answer (with that answer and its sentence; None: the search missed)."""

    queries: tuple[str, ...]
    results: tuple[Sequence[ScoredPassage], ...]
    found: tuple[ScoredPassage, str, str] | None


def _goal(row: QARow) -> str:
    """What the agent says it needs to find: the question, lower-cased, without its question mark."""
    return row.question.strip().rstrip("?").lower()


@dataclass
class _Builder:
    """Renders trajectories in the dialect's exact text, with the environment's observation cut."""

    tokenizer: object
    config: SynthesisConfig

    def __post_init__(self):
        if self.config.dialect not in VOICES:
            raise ValueError(f"warm-start trajectories are written for the dialects {', '.join(sorted(VOICES))}; "
                             f"got {self.config.dialect!r} (its agent does not search and answer)")
        self.dialect = get_dialect(self.config.dialect)
        self.voice = VOICES[self.config.dialect]
        if self.config.direct_answer_share and self.voice.direct is None:
            with_direct = sorted(name for name, voice in VOICES.items() if voice.direct)
            raise ValueError(f"synthesis.direct_answer_share needs a dialect whose agent may answer without searching "
                             f"({', '.join(with_direct)}); {self.config.dialect!r} always searches")
        if self.config.queries_per_search > self.voice.max_queries:
            several = ", ".join(f"{name} up to {voice.max_queries}" for name, voice in sorted(VOICES.items())
                                if voice.max_queries > 1)
            raise ValueError(f"synthesis.queries_per_search={self.config.queries_per_search}: a {self.config.dialect!r} "
                             f"search holds at most {self.voice.max_queries} quer"
                             f"{'y' if self.voice.max_queries == 1 else 'ies'} ({several})")

    def prompt(self, question: str) -> str:
        return render_chat_prompt(self.tokenizer, self.dialect.build_prompt(question))

    def observation(self, results: Sequence[Sequence[ScoredPassage]]) -> str:
        """One search's observation: every query's results in one block, cut as the environment cuts it."""
        text, _ = cut_to_tokens(self.tokenizer, self.dialect.format_observation([list(hits) for hits in results]),
                                self.config.observation_max_tokens)
        return text

    def example(self, row: QARow, searches: Sequence[_Search], answer: str, sentence: str, title: str,
                kind: str) -> SFTExample:
        goal = _goal(row)
        segments: list[tuple[str, bool]] = []
        for turn, search in enumerate(searches):
            template = self.voice.first_search if turn == 0 else self.voice.next_search
            segments.append((template.format(goal=goal, queries=self.voice.queries(search.queries)), True))
            segments.append((self.observation(search.results), False))
        segments.append((self.voice.answer.format(title=title, sentence=sentence, answer=answer), True))
        queries = [q for search in searches for q in search.queries]
        return SFTExample(id=f"{row.id}:{kind}:{'|'.join(queries)}", prompt=self.prompt(row.question),
                          segments=segments, meta={"question_id": row.id, "kind": kind, "queries": queries,
                                                   "searches": [len(search.queries) for search in searches],
                                                   "answer": answer, "evidence_title": title})

    def direct(self, row: QARow) -> SFTExample:
        """The answer from memory: no search, the first gold answer."""
        goal, answer = _goal(row), row.golden_answers[0]
        return SFTExample(id=f"{row.id}:direct", prompt=self.prompt(row.question),
                          segments=[(self.voice.direct.format(goal=goal, answer=answer), True)],
                          meta={"question_id": row.id, "kind": "direct", "queries": [], "answer": answer,
                                "evidence_title": ""})


def _direct_answer_rows(rows: Sequence[QARow], searching_examples: int, share: float) -> list[QARow]:
    """The rows that get a direct answer, so that they make `share` of all examples: as many as needed (at most one
    each, so at most all rows), in an order fixed by a hash of their ids (not by the file's order)."""
    wanted = round(share / (1.0 - share) * searching_examples)
    ordered = sorted((row for row in rows if row.golden_answers),
                     key=lambda row: hashlib.sha256(row.id.encode()).hexdigest())
    return ordered[:wanted]


def synthesize_sft_examples(rows: Sequence[QARow], client: RetrievalClient, tokenizer,
                            config: SynthesisConfig | None = None) -> tuple[list[SFTExample], dict]:
    """Warm-start examples from leaf QA rows (with `supporting_titles`), and counts of what was kept.

    One retrieval call for all phrasings of all rows; the phrasings of a row are grouped into searches of
    `queries_per_search` (in order); per row, one single-search example per search that retrieves an evidence
    passage holding the answer, and (with `retry_chains`) one two-search example per search that misses, followed
    by the first search that hits. With `direct_answer_share`, direct answers (no search) for as many rows as make
    that share of the examples (`_direct_answer_rows`), after the others.
    """
    config = config or SynthesisConfig()
    builder = _Builder(tokenizer, config)
    rows = [r for r in rows if r.supporting_titles]
    phrasings = [query_phrasings(r, keywords_only=builder.voice.keyword_queries) for r in rows]
    flat = [(i, q) for i, qs in enumerate(phrasings) for q in qs]
    results = client.retrieve([q for _, q in flat], topk=config.topk, questions=[rows[i].question for i, _ in flat])
    per_row: list[list[tuple[str, list[ScoredPassage]]]] = [[] for _ in rows]
    for (i, query), hits in zip(flat, results):
        per_row[i].append((query, hits))

    examples: list[SFTExample] = []
    counts = Counter(rows=len(rows), searches=len(flat), phrasings_finding_evidence_with_answer=0, rows_used=0,
                     examples_single=0, examples_retry=0, examples_direct=0)
    size = config.queries_per_search
    for row, results in zip(rows, per_row):
        found = [_evidence_hit(hits, row) for _, hits in results]
        counts["phrasings_finding_evidence_with_answer"] += sum(hit is not None for hit in found)
        searches = [_Search(tuple(q for q, _ in results[i:i + size]), tuple(h for _, h in results[i:i + size]),
                            next((hit for hit in found[i:i + size] if hit is not None), None))
                    for i in range(0, len(results), size)]
        hitting = [search for search in searches if search.found is not None]
        if not hitting:
            continue
        counts["rows_used"] += 1
        for search in hitting:
            passage, answer, sentence = search.found
            examples.append(builder.example(row, [search], answer, sentence, passage.title, "single"))
        if config.retry_chains:
            passage, answer, sentence = hitting[0].found
            examples.extend(builder.example(row, [search, hitting[0]], answer, sentence, passage.title, "retry")
                            for search in searches if search.found is None)
    if config.direct_answer_share and examples:
        examples.extend(builder.direct(row) for row in
                        _direct_answer_rows(rows, len(examples), config.direct_answer_share))
    counts.update(Counter(f"examples_{ex.meta['kind']}" for ex in examples))
    counts["examples"] = len(examples)
    return examples, dict(counts)
