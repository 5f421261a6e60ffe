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
* with `SynthesisConfig.grounded_steps` the plan names only what the agent has read: the tree names the next
  part's entity even when no search returned it, which the agent could only guess; the names of a sub-question
  (capitalised words) that are neither in the multi-hop question nor in an observation so far become "each one"
  in the plan and leave its query, no phrasing naming an unread word is tried, and a part whose query would
  repeat an earlier search is not searched;
* the last turn answers with the question's gold answer. The corpus holds only some sub-answers (the counts say how
  many: ``leaves_found``), so unlike the leaf warm start the answer is not always supported by what was read: these
  examples teach the search plan; what the agent answers is left to RL.

Dialect: Search-R1's tags (the agent the loop mines and verl trains).
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from agentic_retriever.base.client import RetrievalClient
from agentic_retriever.base.corpus import ScoredPassage
from agentic_retriever.base.jsonl import DataFormatError, iter_jsonl
from agentic_retriever.base.qa_metrics import part_answers
from agentic_retriever.base.qa_sources import QARow

from .data import SynthesisConfig, _Builder, _evidence_hit, content_words, query_phrasings
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


def _lowercase_words(text: str) -> set[str]:
    """The lower-cased words of `text`."""
    return {w.lower() for w in re.findall(r"[\w'-]+", text)}


def _unread_names(text: str, read: set[str]) -> set[str]:
    """The names in `text` (capitalised content words) that are not among the `read` words (lower-cased)."""
    return {w for w in content_words(text).split() if w[:1].isupper() and w.lower() not in read}


#: A name as a question writes it: capitalised words joined by spaces and lower-case joining words ("The Writing's
#: on the Wall"), with numbers around them ("8 Days of Christmas", "Ioniq 5", "ID.4") and an article before.
_NAME_RUN = re.compile(r"(?:\b(?:the|a|an)\s+)?(?:\b\d+\s+)?\b[A-Z][\w'-]*(?:[.-]?\d+)?"
                       r"(?:(?:\s+(?:of|on|the|and|de|la|del|von|van|for))*\s+[A-Z][\w'-]*(?:[.-]?\d+)?)*"
                       r"(?:\s+\d+\b)?")


def _without_names(question: str, names: set[str], replacement: str) -> str:
    """`question` with every name (`_NAME_RUN`) that holds one of `names` replaced by `replacement`."""
    def replace(match: re.Match) -> str:
        return replacement if names & set(re.findall(r"[\w'-]+", match.group())) else match.group()
    return re.sub(r"\s+", " ", _NAME_RUN.sub(replace, question)).strip()


def _plan_leaf(leaf: QARow, read: set[str] | None) -> tuple[str, list[str]]:
    """How the agent names a leaf in its plan and the queries it may search for it. Without `read` (the words of
    the question and of every observation so far), the leaf as it stands. With `read`, only what the agent has
    read: names it has not read become "each one" in the plan and leave the query, and a phrasing naming anything
    unread is not tried (an empty list: nothing left to search)."""
    if read is None:
        return _step(leaf.question), _candidate_queries(leaf)
    unread = _unread_names(leaf.question, read)
    if not unread:
        return _step(leaf.question), [q for q in _candidate_queries(leaf) if not _unread_names(q, read)]
    query = content_words(_without_names(leaf.question, unread, " "))
    return _step(_without_names(leaf.question, unread, "each one")), [query] if query else []


@dataclass
class _Trajectory:
    """A multi-search trajectory being written: its turns, what it has read, and the leaves it has yet to plan."""

    row: MultiHopRow
    read: set[str] | None
    pending: list[QARow]
    segments: list[tuple[str, bool]] = field(default_factory=list)
    queries: list[str] = field(default_factory=list)
    reading: str = ""
    skipped: int = 0

    def next_leaf(self, max_searches: int) -> tuple[QARow, str, list[str]] | None:
        """The next leaf with something new to search (its plan step and untried queries), or None when done; a
        leaf with nothing new to search is skipped (counted)."""
        while self.pending and len(self.queries) < max_searches:
            leaf = self.pending.pop(0)
            step, queries = _plan_leaf(leaf, self.read)
            if self.read is not None:
                searched = {done.lower() for done in self.queries}
                queries = [q for q in queries if q.lower() not in searched]
            if queries:
                return leaf, step, queries
            self.skipped += 1
        return None


def synthesize_multihop_examples(rows: Sequence[MultiHopRow], client: RetrievalClient, tokenizer,
                                 config: SynthesisConfig | None = None) -> tuple[list[SFTExample], dict]:
    """One multi-search trajectory per multi-hop row with at least two leaves (module docstring), and counts.

    The trajectories advance together, one search each per retrieval call (every candidate query of every
    trajectory's next leaf, the multi-hop question sent as each search's question); per leaf, the first candidate
    query whose results hold its evidence with a sub-answer is searched, else the natural one (`_plan_leaf`)."""
    config = config or SynthesisConfig()
    if config.dialect != "search_r1":
        raise ValueError(f"multi-search warm-start trajectories are written in the search_r1 dialect, not "
                         f"{config.dialect!r}")
    builder = _Builder(tokenizer, config)
    trajectories = [_Trajectory(row, _lowercase_words(row.question) if config.grounded_steps else None, list(row.leaves))
                    for row in rows if len(row.leaves) >= 2 and row.golden_answers]
    counts = Counter(rows=len(rows), rows_used=len(trajectories), searches=0, leaves_found=0, leaves_skipped=0,
                     leaves_with_unread_names=0)
    while steps := [(t, *planned) for t in trajectories if (planned := t.next_leaf(config.max_searches))]:
        flat = [(i, query) for i, (_, _, _, queries) in enumerate(steps) for query in queries]
        results = client.retrieve([q for _, q in flat], topk=config.topk,
                                  questions=[steps[i][0].row.question for i, _ in flat])
        tried: dict[int, list[tuple[str, Sequence[ScoredPassage]]]] = {}
        for (i, query), hits in zip(flat, results):
            tried.setdefault(i, []).append((query, hits))
        for i, (trajectory, leaf, step, _) in enumerate(steps):
            query, hits, found = next(((q, h, hit) for q, h in tried[i] if (hit := _evidence_hit(h, leaf))),
                                      (*tried[i][0], None))
            template = MULTIHOP_VOICE.next_search if trajectory.queries else MULTIHOP_VOICE.first_search
            trajectory.segments.append((template.format(goal=_step(trajectory.row.question),
                                                        reading=trajectory.reading, step=step, query=query), True))
            observation = builder.observation([hits])
            trajectory.segments.append((observation, False))
            trajectory.queries.append(query)
            if trajectory.read is not None:
                counts["leaves_with_unread_names"] += step != _step(leaf.question)
                trajectory.read |= _lowercase_words(observation)
            counts["leaves_found"] += found is not None
            trajectory.reading = (MULTIHOP_VOICE.found.format(title=found[0].title, sentence=found[2]) if found
                                  else MULTIHOP_VOICE.missed.format(step=step))

    examples: list[SFTExample] = []
    for trajectory in trajectories:
        row, queries = trajectory.row, trajectory.queries
        counts["searches"] += len(queries)
        counts["leaves_skipped"] += trajectory.skipped
        answer = row.golden_answers[0]
        segments = [*trajectory.segments, (MULTIHOP_VOICE.answer.format(reading=trajectory.reading, answer=answer),
                                           True)]
        examples.append(SFTExample(id=f"{row.id}:multihop", prompt=builder.prompt(row.question), segments=segments,
                                   meta={"question_id": row.id, "kind": "multihop", "queries": queries,
                                         "searches": [1] * len(queries), "answer": answer, "evidence_title": ""}))
    counts["examples_multihop"] = counts["examples"] = len(examples)
    return examples, dict(counts)
