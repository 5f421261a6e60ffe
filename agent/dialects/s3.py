"""The s3 searcher's dialect and its document bookkeeping ("s3: You Don't Need That Much Data to Train a Search
Agent via RL", arXiv 2505.14146, section 3.1 "Multi-Turn Search-Select Loop", Figure 11, Appendix A.2).

s3 trains a searcher only; a frozen generator answers from the documents the searcher selected
(`agent.rewards.generation`), and the reward is Gain Beyond RAG (`agent.rewards.gbr`). The loop:

* turn 0 ("Begin with Search"): the environment retrieves with the question itself and puts those documents in
  the prompt (`S3Dialect.initial_queries`, `S3Dialect.build_prompt`, the searcher prompt of Figure 11);
* every generated turn may hold ``<important_info>[ids]</important_info>`` (the documents of the latest
  ``<information>`` block worth keeping, at most `max_selected`), ``<search_complete>True|False</search_complete>``
  and ``<query>{"query": "..."}</query>`` (JSON); the turn stops at ``</query>`` and the environment answers with
  ``<information>`` holding ``Doc {i}(Title: "{title}") {text}`` lines;
* ``search_complete`` True ends the episode (an "answer" action with no answer text: the generator answers
  outside the environment); the searcher gets one last, search-disabled turn after `max_turns` searches, where it
  can still select from the last block ([R] ``run_llm_loop``'s final rollout);
* D_s3 = the union of the selected documents of every block, in block order, deduplicated by passage id keeping
  the first; a block the searcher never selected from contributes all the documents it showed ([R]
  ``extract_titles_and_texts``).

[P] = the paper, [R] = the authors' release (github.com/pat-jj/s3), as in docs/paper-deviations.md. Where they
differ this module follows [R] unless said otherwise:

* observation lines are [R]'s ``Doc {i}(Title: {title}) {text}`` (no space before the parenthesis; the title is the
  first line of a wiki-18 ``contents``, quotes included), the format of the Search-R1 dialect;
* the invalid-action text is [R]'s feedback (it ends inside an opened ``<query>``, so a turn holding ``</query>``
  without ``<query>`` reads the text before ``</query>`` as the query, as [R] prepends ``<query>``);
* a ``<query>`` that is not JSON with a string ``"query"`` is an EMPTY query (the task's rule; [R] searches with
  the raw text), counted in `S3Counters.query_parse_failures`;
* [R] puts the blocks that have a selection before the blocks that have none; here blocks keep their order;
* [R] deduplicates by document text; here by passage id (distinct wiki-18 passages can share a text).

Defaults are the main run of [P] (Table 3, Appendix A.2): 8 retrieved, at most 3 selected per block, 3 turns,
at most 1,400 document tokens shown per block, an 8,000-token context (`S3Settings`).

In the environment (`agent.env.rollout` with ``EnvConfig(dialect="s3")``) the dialect's `document_tracker` is one
`S3Selection` per trajectory: the prompt and every observation show the whole documents that fit the per-turn
budget (observations are not cut to ``EnvConfig.observation_max_tokens``), every generated turn is read for its
selection, and the rollout and its trajectory record carry D_s3 and the counters (``selection``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, ClassVar

from agentic_retriever.base.corpus import Passage, ScoredPassage
from agentic_retriever.base.qa_metrics import Golden

from .base import Action, Dialect, DialectSettings, DocumentTracker, SelectedDocuments
from .search_r1 import search_r1_question

if TYPE_CHECKING:
    from ..env import Rollout

__all__ = ["INVALID_ACTION_MESSAGE", "NAIVE_RAG_TOPK", "S3Counters", "S3Dialect", "S3Selection", "S3Settings", "S3Turn",
           "SEARCHER_PROMPT", "format_documents", "parse_turn"]

#: The searcher prompt of Figure 11 of [P], byte for byte as the paper's text gives it (one line; the arrows
#: are ``\\rightarrow`` and the example is the paper's own placeholder); placeholders ``{question}`` and
#: ``{initial_search_result}``.
#: Passages of the naive-RAG baseline D_RAG, and so of s3's first retrieval D_0 (section 3: "k=3 in our experiments").
NAIVE_RAG_TOPK = 3

SEARCHER_PROMPT = (
    "You are a search copilot for a generation model. Based on a user\u2019s query and initial searched results, "
    "you will first determine if the searched results are enough to produce an answer. If the searched results "
    "are enough, you will use <search_complete>True</search_complete> to indicate that you have gathered enough "
    "information for the generation model to produce an answer. If the searched results are not enough, you will "
    "go through a loop of <query> \\rightarrow <information> \\rightarrow <important_info> \\rightarrow "
    "<search_complete> \\rightarrow <query> (if not complete) \u2026, to help the generation model to generate a "
    "better answer with more relevant information searched. You should show the search query between <query> and "
    "</query> in JSON format. Based on the search query, we will return the top searched results between "
    "<information> and </information>. You need to put the doc ids of the important documents (up to 3 documents, "
    "within the current information window) between <important_info> and </important_info> (e.g., "
    "<important_info>[1, 4]</important_info>). A search query must be followed by a <search_complete> tag if the "
    "search is not complete. After reviewing the information, you must decide whether to continue searching with "
    "a new query or indicate that the search is complete. If you need more information, use "
    "<search_complete>False</search_complete>. Otherwise, use <search_complete>True</search_complete> to "
    "terminate the search. Note: Only the content between <important_info> will be used by the generation model "
    "to produce an answer. [An abstractive example of s3 loop] <question> {question} </question> <information> "
    "{initial_search_result} </information>"
)

#: [R]'s feedback after a turn with neither a query nor ``search_complete`` True (``execute_predictions``).
INVALID_ACTION_MESSAGE = (
    "\n\nThe information is not enough to answer the question. Let me dive deeper by generating a brand new "
    "search query between <query> and </query> tags in JSON format:\n<query>\n"
)

_TAGS = ("query", "important_info", "search_complete")
_TAG = {tag: re.compile(rf"<{tag}>(.*?)</{tag}>", re.DOTALL) for tag in _TAGS}
_COMPLETE = {"true": True, "yes": True, "y": True, "1": True, "false": False, "no": False, "n": False, "0": False}
_INTEGER = re.compile(r"\d+")


@dataclass(frozen=True)
class S3Settings(DialectSettings):
    """The s3 loop's sizes; defaults are [P]'s main run (8 -> 3, 3 turns; Appendix A.2 for the token budgets).

    The environment's share is ``EnvConfig(dialect="s3", topk=topk, max_turns=max_turns,
    max_context_tokens=max_context_tokens)``; the dialect's `S3Selection` takes `max_selected` and `max_doc_tokens`.
    """

    DIALECT: ClassVar[str] = "s3"
    OWN: ClassVar[tuple[str, ...]] = ("max_selected", "max_doc_tokens")

    topk: int = 8
    max_selected: int = 3
    max_turns: int = 3
    max_doc_tokens: int = 1400
    max_context_tokens: int = 8000


@dataclass(frozen=True)
class S3Turn:
    """What one generated turn says.

    `query` is None when the turn has no query (neither ``<query>..</query>`` nor a bare ``..</query>``), ""
    when its content is not JSON with a string ``"query"`` (`query_parse_failed`). `important_ids` is None when
    the turn has no ``<important_info>``, else the integers it names in order (JSON list of integers; other
    content: every integer in it, as [R] reads it, with `selection_malformed`). `search_complete` is None when
    the tag is missing or unreadable (`complete_malformed`); it accepts true/yes/y/1 and false/no/n/0, any case.
    `repeated_tags` names the tags that occur more than once (the first occurrence counts, as in [R]).
    """

    query: str | None
    important_ids: tuple[int, ...] | None
    search_complete: bool | None
    query_parse_failed: bool = False
    selection_malformed: bool = False
    complete_malformed: bool = False
    repeated_tags: tuple[str, ...] = ()


def parse_turn(text: str) -> S3Turn:
    """Read one generated turn (see `S3Turn` for every field's rule)."""
    first = {tag: _TAG[tag].search(text) for tag in _TAGS}
    repeated = tuple(tag for tag in _TAGS if len(_TAG[tag].findall(text)) > 1)

    query, query_failed = None, False
    if first["query"] is not None:
        raw = first["query"].group(1)
    elif "</query>" in text:  # the invalid-action message opened the tag ([R] prepends "<query>")
        raw = text.split("</query>", 1)[0]
    else:
        raw = None
    if raw is not None:
        query = _json_query(raw)
        query_failed = query is None
        query = query if query is not None else ""

    ids, malformed_ids = None, False
    if first["important_info"] is not None:
        ids, malformed_ids = _ids(first["important_info"].group(1))

    complete, malformed_complete = None, False
    if first["search_complete"] is not None:
        complete = _COMPLETE.get(first["search_complete"].group(1).strip().lower())
        malformed_complete = complete is None
    return S3Turn(query, ids, complete, query_failed, malformed_ids, malformed_complete, repeated)


def _json_query(raw: str) -> str | None:
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    query = data.get("query") if isinstance(data, dict) else None
    return query.strip() if isinstance(query, str) else None


def _ids(raw: str) -> tuple[tuple[int, ...], bool]:
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if isinstance(data, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in data):
        return tuple(data), False
    return tuple(int(i) for i in _INTEGER.findall(raw)), True


def format_documents(passages: Sequence[ScoredPassage]) -> str:
    """The ``Doc {i}(Title: "{title}") {text}`` lines of one block, numbered from 1 ([R] ``_passages2string``)."""
    return "".join(_document_line(i, p) for i, p in enumerate(passages, start=1))


def _document_line(number: int, passage: ScoredPassage) -> str:
    return f'Doc {number}(Title: "{passage.title}") {passage.text}\n'


class S3Dialect(Dialect):
    """The s3 searcher: retrieves with the question before turn 1, stops at ``</query>``, ends on
    ``<search_complete>True</search_complete>`` with no answer text (the frozen generator answers)."""

    name = "s3"
    stop = ("</query>",)
    invalid_action_message = INVALID_ACTION_MESSAGE
    search_disabled_on_last_turn = True

    def __init__(self, settings: S3Settings | None = None):
        self.settings = settings if settings is not None else S3Settings()

    #: D_0 is naive RAG's documents: "s3 begins by retrieving top-k (k=3 in our experiments) documents from the
    #: original question, just like naive RAG" (section 3), so that GBR measures what search adds beyond them.
    initial_topk = NAIVE_RAG_TOPK

    def initial_queries(self, question: str) -> tuple[str, ...]:
        """q_0 = Q ("Begin with Search", section 3.1): the question exactly as naive RAG searches it
        (`agent.s3_rag_baseline`), its top-`NAIVE_RAG_TOPK` the prompt's documents."""
        return (question,)

    def build_prompt(self, question: str, initial_passages: Sequence[Sequence[ScoredPassage]] = ()) -> str:
        """Figure 11 with the question ([R]: stripped, "?" appended) and the documents of q_0."""
        if len(initial_passages) != 1:
            raise ValueError(f"the s3 prompt holds the results of exactly one initial search (the question), "
                             f"got {len(initial_passages)} result lists")
        return SEARCHER_PROMPT.format(question=search_r1_question(question),
                                      initial_search_result=format_documents(initial_passages[0]).strip())

    def parse_action(self, turn_text: str) -> Action:
        """``search_complete`` True ends the episode (even with a query); else a query searches (an unparsable
        one with ""); else the turn is invalid."""
        turn = parse_turn(turn_text)
        if turn.search_complete:
            return Action("answer")
        if turn.query is not None:
            return Action("search", queries=(turn.query,))
        return Action("invalid")

    def format_observation(self, results: Sequence[Sequence[ScoredPassage]]) -> str:
        """[R]'s ``\\n\\n<information>{documents, stripped}</information>\\n\\n`` over the passages of the action."""
        passages = [p for hits in results for p in hits]
        return f"\n\n<information>{format_documents(passages).strip()}</information>\n\n"

    def extract_answer(self, response_text: str) -> str | None:
        """None: the searcher never answers; the frozen generator does (`agent.rewards.generation`)."""
        return None

    def training_diagnostics(self, result: Rollout, golden: Golden) -> dict[str, float]:
        """How many documents the searcher selected: it writes no answer (the frozen generator answers, and the
        reward scores that)."""
        return {"selected_documents": float(len(result.selection.documents))}

    def document_tracker(self, count_tokens: Callable[[str], int]) -> S3Selection:
        """D_s3's bookkeeping for one episode, with the settings' `max_selected` and `max_doc_tokens`."""
        return S3Selection(count_tokens, self.settings.max_selected, self.settings.max_doc_tokens)


@dataclass
class S3Counters:
    """What `S3Selection` ignored or could not read, per episode.

    * ``query_parse_failures``: queries that were not JSON with a string ``"query"`` (searched as "");
    * ``turns_without_action``: turns with neither a query nor ``search_complete`` True (invalid actions);
    * ``malformed_selections``: ``<important_info>`` contents that were not a JSON list of integers;
    * ``malformed_search_complete``: ``<search_complete>`` values other than true/false (read as not complete);
    * ``repeated_tags``: tags given more than once in a turn (only the first counts);
    * ``ignored_ids``: selected ids dropped: outside the current block, repeated, or beyond `max_selected`;
    * ``late_selections``: ``<important_info>`` with no unselected block to apply to (e.g. a second one for the
      same block, or one before any block);
    * ``docs_over_budget``: retrieved documents not shown because the block's token budget was spent;
    * ``duplicate_docs``: selected documents already in D_s3 (kept once, first position).
    """

    query_parse_failures: int = 0
    turns_without_action: int = 0
    malformed_selections: int = 0
    malformed_search_complete: int = 0
    repeated_tags: int = 0
    ignored_ids: int = 0
    late_selections: int = 0
    docs_over_budget: int = 0
    duplicate_docs: int = 0


@dataclass
class _Block:
    shown: list[ScoredPassage]
    selected: list[int] | None = None  # 1-based ids; None = the searcher never selected from this block


@dataclass
class S3Selection(DocumentTracker):
    """D_s3 of one episode: feed it every block of retrieved documents (`observe`) and every generated turn
    (`read_turn`) in the order they happen; `documents` is the selected, deduplicated context.

    `count_tokens` measures a rendered document line (use the searcher's tokenizer:
    ``lambda s: len(tok.encode(s, add_special_tokens=False))``). A block shows the longest prefix of its documents
    whose lines fit in `max_doc_tokens` ([P] A.2: "a maximum of 1,400 tokens allocated to the top-k retrieved
    documents per turn"); documents are never cut, the rest is counted in ``docs_over_budget``. The turn after a
    block selects from that block only ("within the current information window", Figure 11).

        selection = S3Selection(count_tokens)
        shown = selection.observe(initial_hits)     # the prompt's documents (block 0)
        selection.read_turn(turn_1_text)            # its <important_info> applies to block 0
        shown = selection.observe(hits_of_query_1)  # the observation of turn 1
        ...
        selection.documents(), selection.counters

    As the environment's `DocumentTracker` it bounds the observations itself (whole documents within
    `max_doc_tokens`), and `selected` hands over D_s3 and the counters.
    """

    bounds_observations: ClassVar[bool] = True
    count_tokens: Callable[[str], int]
    max_selected: int = 3
    max_doc_tokens: int = 1400
    counters: S3Counters = field(default_factory=S3Counters)
    _blocks: list[_Block] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self):
        if self.max_selected < 1 or self.max_doc_tokens < 1:
            raise ValueError(f"S3Selection needs max_selected >= 1 and max_doc_tokens >= 1, "
                             f"got {self.max_selected} and {self.max_doc_tokens}")

    def observe(self, passages: Sequence[ScoredPassage]) -> list[ScoredPassage]:
        """Add the next block of retrieved documents; return those it shows (the budget's prefix, in order)."""
        shown, used = [], 0
        for i, passage in enumerate(passages, start=1):
            cost = self.count_tokens(_document_line(i, passage))
            if used + cost > self.max_doc_tokens:
                self.counters.docs_over_budget += len(passages) - len(shown)
                break
            shown.append(passage)
            used += cost
        self._blocks.append(_Block(shown))
        return shown

    def read_turn(self, turn_text: str) -> S3Turn:
        """Read one generated turn, apply its ``<important_info>`` to the current block, count what it got wrong."""
        turn = parse_turn(turn_text)
        counters = self.counters
        counters.query_parse_failures += turn.query_parse_failed
        counters.turns_without_action += turn.query is None and not turn.search_complete
        counters.malformed_selections += turn.selection_malformed
        counters.malformed_search_complete += turn.complete_malformed
        counters.repeated_tags += len(turn.repeated_tags)
        if turn.important_ids is not None:
            self._select(turn.important_ids)
        return turn

    def _select(self, ids: tuple[int, ...]) -> None:
        block = self._blocks[-1] if self._blocks else None
        if block is None or block.selected is not None:
            self.counters.late_selections += 1
            self.counters.ignored_ids += len(ids)
            return
        kept: list[int] = []
        for i in ids:
            if 1 <= i <= len(block.shown) and i not in kept and len(kept) < self.max_selected:
                kept.append(i)
        self.counters.ignored_ids += len(ids) - len(kept)
        block.selected = kept

    def documents(self) -> list[ScoredPassage]:
        """D_s3: per block in order, its selected documents (in document order) or, never selected from, all it
        showed; a passage id seen before is dropped (``duplicate_docs`` is set to how many were)."""
        out, seen, duplicates = [], set(), 0
        for block in self._blocks:
            chosen = block.shown if block.selected is None else [block.shown[i - 1] for i in sorted(block.selected)]
            for passage in chosen:
                if passage.id in seen:
                    duplicates += 1
                    continue
                seen.add(passage.id)
                out.append(passage)
        self.counters.duplicate_docs = duplicates
        return out

    def selected(self) -> SelectedDocuments:
        """D_s3 (id, title, text of each document, in order) and the counters, by `S3Counters` field name."""
        documents = [Passage(p.id, p.title, p.text) for p in self.documents()]
        return SelectedDocuments(documents, asdict(self.counters))
