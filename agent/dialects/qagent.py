"""The QAgent dialect and its passage set ("QAgent: A modular Search Agent with Interactive Query Understanding",
arXiv 2510.08383, section 3.2 "Multi-Turn Query Optimation Loop", Algorithm 1, Appendix C, Table 5).

QAgent is Search-R1's loop with planning, reflection and several queries per search; each turn
"plan -> search -> information -> reflect" (Figure 2):

* the prompt is Table 5 byte for byte (`PROMPT_TEMPLATE`); the paper's text gives its placeholder as
  ``{questionquestion}``, kept as is and filled with the stripped question (nothing appended: the template itself
  ends with "."). The prompt asks for ``<reflection>`` in one sentence and ``<reflect>`` in another; both are kept;
* a turn stops at ``</search>`` or ``</answer>``; the first closed ``<search>``/``<answer>`` (``<search >``, as the
  prompt's loop writes it, included) decides the action, as in Search-R1;
* a search holds S_t = {q_t1 .. q_tm}, "no more than 3" queries (Table 5; Eq. 4): the contents of its closed
  ``<query>..</query>`` pairs when it has any, otherwise its lines (a stray ``<query>`` or ``</query>`` tag
  removed); every query stripped, empty ones dropped. Beyond `QAgentSettings.max_queries` the first ones are kept
  and the rest counted (``queries_beyond_limit``); a search with no query left is an invalid action
  (``searches_without_queries``);
* the environment retrieves every query of the turn in one call and answers with ONE ``<information>`` block for
  all of them, C_t = R(q_t1) (+) .. (+) R(q_tm) (Eq. 5): Search-R1's ``Doc {i}(Title: {title}) {text}`` lines,
  numbered across the queries in query order, top-1 per query (Appendix C: "1 for iterative methods", so
  ``Doc i`` is the passage of query i);
* an unreadable turn gets Search-R1's rethink message (Algorithm 1, line 18); the answer is the last
  ``<answer>`` (or ``<answer >``) of the response, stripped;
* the passage set K (Algorithm 1, line 14; parseDocSet of Eq. 8) is every passage the agent was shown in the
  episode, deduplicated by passage id, first seen first (`QAgentPassages`): ``Rollout.selection.documents``,
  what QAgent's stage-2 reward and the submodule evaluation give the frozen generator.

[P] = the paper, [R] = the authors' release (github.com/OpenStellarTeam/QAgent), as in docs/paper-deviations.md;
[R] was not read for this module. [P] gives neither the observation lines nor the end of the loop; both follow
Search-R1's release, whose rethink message [P] reuses: after `max_turns` turns, each one's search executed
(Algorithm 1 runs B actions), the agent gets one more generation whose searches are not executed, so it can still
answer (what it asks for is not retrieved, so K does not change).

The paper's settings (Appendix C) are `QAgentSettings`: top-1 per query, at most 3 queries per search, 5 turns,
512 generated tokens per turn, an 8,192-token sequence. The environment's share is
``EnvConfig(**QAgentSettings().env_fields())``: the environment reads its passages per query from `EnvConfig.topk`,
whose default (3, Search-R1's) is not QAgent's, so a QAgent config sets ``topk: 1``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, ClassVar, Literal

from agentic_retriever.base.corpus import Passage, ScoredPassage
from agentic_retriever.base.qa_metrics import Golden

from .base import Action, Dialect, DialectSettings, DocumentTracker, SelectedDocuments
from .search_r1 import SearchR1Dialect

if TYPE_CHECKING:
    from ..env import Rollout

__all__ = ["PROMPT_TEMPLATE", "QUESTION_PLACEHOLDER", "QAgentCounters", "QAgentDialect", "QAgentPassages",
           "QAgentSettings", "QAgentTurn", "parse_turn", "search_queries"]

#: Table 5 of [P], byte for byte as the paper's text gives it (curly quotes, the missing spaces after closing
#: tags, the literal ``\\n`` of the inline example, no newline at the end); the question goes in for
#: `QUESTION_PLACEHOLDER`.
PROMPT_TEMPLATE = (
    "Search for information to answer the given question. You can search as many times as needed if you find you "
    "lack some knowledge. You will go through a loop of:\n"
    "\u201c<plan>xxx</plan>\n"
    "<search >xxx</search>\n"
    "<information>xxx</information>\n"
    "<reflection>xxx </reflection>\n"
    "<plan>xxx</plan>(if not complete)\n"
    "<reflection>xxx </reflection>\n"
    "<answer>xxx</answer>\u201d.\n"
    "You must conduct planning inside <plan>and </plan>first every time you call a search engine.\n"
    "After planing, you can call a search engine to search multiple queries (no more than 3) by\n"
    "<search>\n"
    "<query>query1</query>\n"
    "<query>query2</query>\n"
    "<query>queryk</query>\n"
    "</search>,\n"
    "and it will return the searched results between <information>and </information>.\n"
    "After getting information, you must conduct a reflection on the information and place your reflection between "
    "the <reflection>and </reflection>tags.\n"
    "Note that you must plan within <plan>and </plan>before searching, and reflect within <reflect>and "
    "</reflect>after receiving information.\n"
    "Note that each query must be enclosed between <query>and </query>, and all queries must be placed between "
    "<search>and </search>, such as <search>\\n <query>query1</query>\\n <query>query2</query>\\n\\n "
    "<query>queryk</query>\\n </search>.\n"
    "If the task is not yet complete, begin a new <plan>.\n"
    "If you find no further external knowledge needed, you can directly provide the answer inside <answer>and "
    "</answer>without detailed illustrations.\n"
    "For example, <answer>\\n xxx\\n </answer>.\n"
    "The answer, \u201cxxx\u201d, should be a few short words.\n"
    "Question: {questionquestion}."
)

#: The question's placeholder in `PROMPT_TEMPLATE`, as the paper's text spells it.
QUESTION_PLACEHOLDER = "{questionquestion}"

#: The opening tags QAgent acts on: Table 5's loop spells ``<search >``, so whitespace before the ``>`` is allowed.
#: One pattern for the dialect's parser, its answer extraction and the format gate (`agent.rewards.qagent_format`).
SEARCH_OPEN, ANSWER_OPEN = r"<search\s*>", r"<answer\s*>"
_ACTION = re.compile(r"<(search|answer)\s*>(.*?)</\1>", re.DOTALL)
_ANSWER = re.compile(rf"{ANSWER_OPEN}(.*?)</answer>", re.DOTALL)
_QUERY = re.compile(r"<query>(.*?)</query>", re.DOTALL)
_STRAY_QUERY_TAG = re.compile(r"</?query>")


@dataclass(frozen=True)
class QAgentSettings(DialectSettings):
    """QAgent's sizes; defaults are [P]'s (Appendix C, Table 5).

    The dialect takes `max_queries`; the rest is the environment's share, ``EnvConfig(**settings.env_fields())``.
    """

    DIALECT: ClassVar[str] = "qagent"
    OWN: ClassVar[tuple[str, ...]] = ("max_queries",)

    topk: int = 1
    max_queries: int = 3
    max_turns: int = 5
    max_new_tokens_per_turn: int = 512
    max_context_tokens: int = 8192


@dataclass(frozen=True)
class QAgentTurn:
    """What one generated turn says: `kind` is the first closed ``<search>`` or ``<answer>`` (None: neither);
    `queries` the search's first `max_queries` queries, `dropped_queries` how many more it had; `answer` the
    answer's content, stripped."""

    kind: Literal["search", "answer"] | None
    queries: tuple[str, ...] = ()
    dropped_queries: int = 0
    answer: str | None = None


def search_queries(body: str) -> list[str]:
    """The queries of a ``<search>`` body: its closed ``<query>`` pairs, or without any its lines (stray query
    tags removed); stripped, empty ones dropped, in order."""
    pairs = _QUERY.findall(body)
    raw = pairs if pairs else [_STRAY_QUERY_TAG.sub("", line) for line in body.splitlines()]
    return [q.strip() for q in raw if q.strip()]


def parse_turn(text: str, max_queries: int = 3) -> QAgentTurn:
    """Read one generated turn (see `QAgentTurn`)."""
    match = _ACTION.search(text)
    if match is None:
        return QAgentTurn(None)
    if match.group(1) == "answer":
        return QAgentTurn("answer", answer=match.group(2).strip())
    queries = search_queries(match.group(2))
    return QAgentTurn("search", tuple(queries[:max_queries]), max(0, len(queries) - max_queries))


class QAgentDialect(SearchR1Dialect):
    """QAgent: ``<plan>``, ``<search>`` with 1-3 ``<query>``, one ``<information>`` per search, ``<reflection>``,
    ``<answer>``. From Search-R1 it keeps the stop strings, the rethink message, the search-disabled last turn,
    the observation lines and the answer extraction."""

    name = "qagent"

    def __init__(self, settings: QAgentSettings | None = None):
        self.settings = settings if settings is not None else QAgentSettings()

    def build_prompt(self, question: str, initial_passages: Sequence[Sequence[ScoredPassage]] = ()) -> str:
        """Table 5 with the stripped question for `QUESTION_PLACEHOLDER`."""
        if initial_passages:
            raise ValueError("the qagent dialect retrieves nothing before the first turn")
        question = question.strip()
        if not question:
            raise ValueError("the question is empty")
        return PROMPT_TEMPLATE.replace(QUESTION_PLACEHOLDER, question)

    def extract_answer(self, response_text: str) -> str | None:
        """The last ``<answer>`` (``<answer >`` too, as the parser reads it) of the response, stripped."""
        matches = _ANSWER.findall(response_text)
        return matches[-1].strip() if matches else None

    def training_diagnostics(self, result: Rollout, golden: Golden) -> dict[str, float]:
        """EM, the format (Eq. 7's r_fmt), Hit (Eq. 10), the passages retrieved (|K|, deduplicated) and the queries
        searched (1-3 a search: against the searches, how many it searches at once), by the rewards' own checks
        (`agent.rewards`, which read this dialect's tags: imported when called)."""
        from ..rewards import check_format
        from ..rewards.qagent import hit

        return Dialect.training_diagnostics(self, result, golden) | {
            "valid_format": float(check_format(result).valid), "hit": float(hit(result, golden)),
            "retrieved_documents": float(len(result.selection.documents) if result.selection else 0),
            "queries": float(sum(len(turn.queries) for turn in result.turns if turn.retrieved))}

    def parse_action(self, turn_text: str) -> Action:
        """A search with at least one query, an answer, or invalid (neither, or a search with no query)."""
        turn = parse_turn(turn_text, self.settings.max_queries)
        if turn.kind == "answer":
            return Action("answer", answer=turn.answer)
        if turn.kind == "search" and turn.queries:
            return Action("search", queries=turn.queries)
        return Action("invalid")

    def document_tracker(self, count_tokens: Callable[[str], int]) -> QAgentPassages:
        """The episode's passage set K (`count_tokens` is unused: QAgent shows every retrieved passage)."""
        return QAgentPassages(self.settings.max_queries)


@dataclass
class QAgentCounters:
    """What `QAgentPassages` counted in one episode.

    * ``duplicate_passages``: retrieved passages already in K (shown again, kept once);
    * ``searches_without_queries``: ``<search>`` blocks with no non-empty query (invalid actions);
    * ``queries_beyond_limit``: queries past `QAgentSettings.max_queries` in a search (not searched).
    """

    duplicate_passages: int = 0
    searches_without_queries: int = 0
    queries_beyond_limit: int = 0


@dataclass
class QAgentPassages(DocumentTracker):
    """K of one episode (Algorithm 1, line 14: K <- K u C): every passage of every result list, in the order
    retrieved, deduplicated by passage id keeping the first. The agent is shown every passage (a pass-through, the
    environment cuts observations to `EnvConfig.observation_max_tokens`); `selected` hands over K and the
    counters, which is what QAgent's frozen generator reads."""

    max_queries: int = 3
    counters: QAgentCounters = field(default_factory=QAgentCounters)
    _passages: dict[str, Passage] = field(default_factory=dict, init=False, repr=False)

    def observe(self, passages: Sequence[ScoredPassage]) -> list[ScoredPassage]:
        """Add one result list to K; return it whole."""
        for p in passages:
            if p.id in self._passages:
                self.counters.duplicate_passages += 1
            else:
                self._passages[p.id] = Passage(p.id, p.title, p.text)
        return list(passages)

    def read_turn(self, turn_text: str) -> QAgentTurn:
        """Read one generated turn and count its empty search or its queries past the limit."""
        turn = parse_turn(turn_text, self.max_queries)
        self.counters.searches_without_queries += turn.kind == "search" and not turn.queries
        self.counters.queries_beyond_limit += turn.dropped_queries
        return turn

    def selected(self) -> SelectedDocuments:
        """K (id, title, text of each passage, first seen first) and the counters, by `QAgentCounters` name."""
        return SelectedDocuments(list(self._passages.values()), asdict(self.counters))
