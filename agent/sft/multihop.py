"""Multi-search warm-start trajectories: the agent reads a multi-hop question and searches its parts one by one.

The leaf warm start (`agent.sft.data`) teaches one search per question, so the agent it makes searches once even
for a multi-hop question, and every mined round has Q (the question) and q (the query) nearly the same text: the
input the method trains, ``Q [SEP] q`` ("Agentic-R: Learning to Retrieve for Agentic Search", arXiv 2601.11888,
Eq. 4), is then never exercised with Q different from q. These trajectories come from FanOutQA's decomposition
trees (train questions only), and teach the plan an agent would follow on such a question:

* the prompt is the multi-hop question; the agent searches its leaf sub-questions in tree order, one search each
  (at most `SynthesisConfig.max_searches`), every query written as a keyword query (the sub-question's content
  words, `content_words`) unless another phrasing retrieves the sub-question's evidence passage with its answer
  (the question as asked, then the evidence title with the other content words; `query_phrasings`);
* every ``<information>`` block is the retriever's real top-k for that query, formatted and cut as the environment
  does, with the multi-hop question sent as the searches' question (a ``Q [SEP] q`` retriever composes it);
* after each observation the agent says what it read: the sentence of the evidence passage that holds the
  sub-answer when it was retrieved (a list answer: any of its parts), else that the results do not say it;
  then it names the next part and searches for it;
* the last turn answers with the question's gold answer. The corpus holds only some sub-answers (the counts say how
  many: ``leaves_found``), so unlike the leaf warm start the answer is not always supported by what was read: these
  examples teach the search plan; what the agent answers is left to RL.

Dialect: Search-R1's tags (the agent the loop mines and verl trains).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from agentic_retriever.client import RetrievalClient
from agentic_retriever.corpus import ScoredPassage
from agentic_retriever.eval.qa import part_answers
from agentic_retriever.jsonl import DataFormatError, iter_jsonl

from .data import SynthesisConfig, _Builder, _evidence_hit, content_words, query_phrasings
from ..qa_data import QARow
from .train import SFTExample

__all__ = ["MULTIHOP_VOICE", "MultiHopRow", "read_multihop_rows", "synthesize_multihop_examples"]


@dataclass(frozen=True)
class MultiHopVoice:
    """The turns of a multi-search trajectory: the first search (``{goal}``, ``{step}``, ``{query}``), a later search
    after reading (``{reading}``, ``{step}``, ``{query}``), the answer (``{reading}``, ``{answer}``), and what the agent
    read: the sentence holding a sub-answer (``{title}``, ``{sentence}``) or nothing on that part (``{step}``)."""

    first_search: str
    next_search: str
    answer: str
    found: str
    missed: str


#: Search-R1's tags: one ``<think>`` per turn, then ``<search>`` or ``<answer>``.
MULTIHOP_VOICE = MultiHopVoice(
    first_search="<think> I need to find {goal}. I will look up each part. First, {step}. </think>\n"
                 "<search> {query} </search>",
    next_search="<think> {reading} Next, {step}. </think>\n<search> {query} </search>",
    answer="<think> {reading} I have looked up every part. </think>\n<answer> {answer} </answer>",
    found="The passage about {title} says: {sentence}",
    missed="The results do not say {step}.")


@dataclass(frozen=True)
class MultiHopRow:
    """A multi-hop question, its golden answers, and its leaf sub-questions in tree order (each a `QARow` whose
    golden answers also list the parts of a list or dict answer, any of which counts as read)."""

    id: str
    question: str
    golden_answers: tuple[str, ...]
    leaves: tuple[QARow, ...]


def read_multihop_rows(multihop_path: str | os.PathLike, leaf_path: str | os.PathLike) -> list[MultiHopRow]:
    """Multi-hop QA rows (``leaf_ids`` in tree order, `data prepare`'s ``fanoutqa_multihop_*.jsonl``) with their
    leaves from `leaf_path`. A leaf missing from `leaf_path` (a sub-question shared with another question is kept
    once, under its first parent) is left out; a row without ``leaf_ids`` raises DataFormatError naming file, line
    and field."""
    leaves: dict[str, QARow] = {}
    for line, row in iter_jsonl(leaf_path):
        leaf = QARow.from_json(row, leaf_path, line)
        leaves[leaf.id] = QARow(leaf.id, leaf.question, (*leaf.golden_answers, *part_answers(row.get("answer_parts"))),
                                leaf.supporting_titles)
    rows = []
    for line, row in iter_jsonl(multihop_path):
        parent = QARow.from_json(row, multihop_path, line)
        ids = row.get("leaf_ids")
        if not isinstance(ids, list):
            raise DataFormatError(multihop_path, line, "missing or not a list", field="leaf_ids")
        rows.append(MultiHopRow(parent.id, parent.question, parent.golden_answers,
                                tuple(leaves[str(i)] for i in ids if str(i) in leaves)))
    return rows


def _step(question: str) -> str:
    """A question as the agent names it in its plan: lower-cased, without its final question mark or full stop."""
    return question.strip().rstrip("?. ").lower()


def _candidate_queries(leaf: QARow) -> list[str]:
    """The queries tried for a leaf, the natural one first: its content words (the question as asked when they are
    a single word), then the leaf's other phrasings."""
    keywords = content_words(leaf.question)
    first = keywords if len(keywords.split()) > 1 else leaf.question.strip()
    return [first, *(q for q in query_phrasings(leaf) if q != first)]


def synthesize_multihop_examples(rows: Sequence[MultiHopRow], client: RetrievalClient, tokenizer,
                                 config: SynthesisConfig | None = None) -> tuple[list[SFTExample], dict]:
    """One multi-search trajectory per multi-hop row with at least two leaves (module docstring), and counts.

    One retrieval call for every candidate query of every leaf, the multi-hop question sent as each search's
    question; per leaf, the first candidate query whose results hold its evidence with a sub-answer is searched,
    else the natural one (`_candidate_queries`)."""
    config = config or SynthesisConfig()
    if config.dialect != "search_r1":
        raise ValueError(f"multi-search warm-start trajectories are written in the search_r1 dialect, not "
                         f"{config.dialect!r}")
    builder = _Builder(tokenizer, config)
    plans = [(row, row.leaves[:config.max_searches]) for row in rows if len(row.leaves) >= 2 and row.golden_answers]
    flat = [(p, j, query) for p, (_, leaves) in enumerate(plans) for j, leaf in enumerate(leaves)
            for query in _candidate_queries(leaf)]
    results = client.retrieve([q for _, _, q in flat], topk=config.topk,
                              questions=[plans[p][0].question for p, _, _ in flat])
    tried: dict[tuple[int, int], list[tuple[str, Sequence[ScoredPassage]]]] = {}
    for (p, j, query), hits in zip(flat, results):
        tried.setdefault((p, j), []).append((query, hits))

    examples: list[SFTExample] = []
    counts = Counter(rows=len(rows), rows_used=len(plans), searches=0, leaves_found=0)
    for p, (row, leaves) in enumerate(plans):
        segments: list[tuple[str, bool]] = []
        reading, queries = "", []
        for j, leaf in enumerate(leaves):
            options = tried[(p, j)]
            query, hits = next(((q, h) for q, h in options if _evidence_hit(h, leaf)), options[0])
            template = MULTIHOP_VOICE.first_search if j == 0 else MULTIHOP_VOICE.next_search
            segments.append((template.format(goal=_step(row.question), reading=reading, step=_step(leaf.question),
                                             query=query), True))
            segments.append((builder.observation([hits]), False))
            found = _evidence_hit(hits, leaf)
            counts["leaves_found"] += found is not None
            reading = (MULTIHOP_VOICE.found.format(title=found[0].title, sentence=found[2]) if found
                       else MULTIHOP_VOICE.missed.format(step=_step(leaf.question)))
            queries.append(query)
        answer = row.golden_answers[0]
        segments.append((MULTIHOP_VOICE.answer.format(reading=reading, answer=answer), True))
        counts["searches"] += len(leaves)
        examples.append(SFTExample(id=f"{row.id}:multihop", prompt=builder.prompt(row.question), segments=segments,
                                   meta={"question_id": row.id, "kind": "multihop", "queries": queries,
                                         "searches": [1] * len(queries), "answer": answer, "evidence_title": ""}))
    counts["examples_multihop"] = counts["examples"] = len(examples)
    return examples, dict(counts)

