"""What a search-agent family says and how the environment reads it: the `Dialect` interface.

The environment loop (`agent.env`) is the same for every method; a dialect supplies the rest
(docs/agent.md, "The environment (`agent.env`) and dialects"):

* `build_prompt`: question (and, for dialects that retrieve before the first turn, those passages) -> the
  user message; `initial_queries` names those first searches and `initial_topk` their depth (s3 retrieves naive
  RAG's top-3 for the question itself);
* `stop`: the stop strings that end a generated turn; `truncate_turn` cuts a turn right after the first one;
* `parse_action`: one generated turn -> `Action` (search with one or more queries, answer, or invalid);
* `format_observation`: the passages of one search action (a list per query) -> the inserted text;
* `invalid_action_message`: the text inserted after an invalid turn;
* `extract_answer`: a whole response -> the final answer (None when there is none);
* `search_disabled_on_last_turn`: after `max_turns` turns the agent gets one more generation whose searches
  are not executed (Search-R1's final rollout); when False the trajectory ends after `max_turns` turns;
* `document_tracker`: a fresh per-trajectory `DocumentTracker`, the hooks through which a dialect decides which
  retrieved documents the agent is shown and which it selects for a frozen generator. The base tracker passes
  everything through and selects nothing (Search-R1); s3's `S3Selection` shows whole documents within a per-turn
  token budget and collects D_s3 ("s3: You Don't Need That Much Data to Train a Search Agent via RL",
  arXiv 2505.14146, section 3.1).

Adding a method is adding a subclass and registering it in `agent.dialects`: QAgent returns several queries
per search action and formats one block for all of them; s3's searcher overrides `initial_queries` and
ends with an "answer" action carrying no answer text (its frozen generator answers outside the
environment); when-to-search changes the prompt and tag set only.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from agentic_retriever.base.corpus import Passage, ScoredPassage
from agentic_retriever.base.llm.text import find_stop
from agentic_retriever.base.qa_metrics import Golden, qa_scores

if TYPE_CHECKING:
    from ..env import Rollout

__all__ = ["Action", "ActionKind", "Dialect", "DialectSettings", "DocumentTracker", "SelectedDocuments"]

ActionKind = Literal["search", "answer", "invalid"]


@dataclass(frozen=True)
class DialectSettings:
    """A dialect's sizes, each a positive integer: the fields named in `OWN` are the dialect's own, the others the
    environment's share (`env_fields`: ``EnvConfig(**settings.env_fields())``)."""

    DIALECT: ClassVar[str] = ""        # the dialect's name (`Dialect.name`)
    OWN: ClassVar[tuple[str, ...]] = ()  # the fields the dialect takes; the rest are `agent.env.EnvConfig` fields

    def __post_init__(self):
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            if value < 1:
                raise ValueError(f"{type(self).__name__}.{item.name} must be at least 1, got {value}")

    def env_fields(self) -> dict[str, object]:
        """The `agent.env.EnvConfig` fields these settings fix: the dialect, and every field not in `OWN`."""
        return {"dialect": self.DIALECT} | {item.name: getattr(self, item.name) for item in dataclasses.fields(self)
                                            if item.name not in self.OWN}


@dataclass(frozen=True)
class Action:
    """What one generated turn asks the environment to do.

    ``search`` carries at least one query (possibly empty strings: an empty tag is still a search call);
    ``answer`` ends the trajectory, with the answer text when the dialect's agent answers itself;
    ``invalid`` is a turn the dialect cannot read (the environment inserts `Dialect.invalid_action_message`).
    """

    kind: ActionKind
    queries: tuple[str, ...] = ()
    answer: str | None = None

    def __post_init__(self):
        if self.kind == "search" and not self.queries:
            raise ValueError("a search action needs at least one query")
        if self.kind != "search" and self.queries:
            raise ValueError(f"an {self.kind} action carries no queries")


@dataclass
class SelectedDocuments:
    """The documents a searcher selected for a frozen generator, in order (s3's D_s3, "s3: You Don't Need That
    Much Data to Train a Search Agent via RL", arXiv 2505.14146, section 3.1), and the counters of the
    bookkeeping that selected them (what it ignored or could not read, by name)."""

    documents: list[Passage]
    counters: dict[str, int]


class DocumentTracker:
    """One trajectory's document bookkeeping; the environment calls its hooks in the order things happen:

    * `observe` for each result list of a search (the searches before turn 1 included): it returns the passages
      the agent is shown, which go to `Dialect.build_prompt` or `Dialect.format_observation`;
    * `read_turn` with every generated turn's text (invalid turns and the search-disabled last turn included);
    * `selected` once the trajectory is finished: the selected documents, or None when the dialect selects none.

    When `bounds_observations` is True, `observe` keeps every observation within the dialect's own token budget
    and the environment does not cut it to `EnvConfig.observation_max_tokens` (a cut could split a document).
    This base class is the pass-through of dialects that show every retrieved passage and select nothing
    (Search-R1).
    """

    bounds_observations: ClassVar[bool] = False

    def observe(self, passages: Sequence[ScoredPassage]) -> list[ScoredPassage]:
        """The passages of one result list that the agent is shown, in order (all of them)."""
        return list(passages)

    def read_turn(self, turn_text: str) -> object:
        """Take note of one generated turn (nothing to note)."""
        return None

    def selected(self) -> SelectedDocuments | None:
        """The trajectory's selected documents (none)."""
        return None


class Dialect(abc.ABC):
    """Prompt, stop strings, action parser, observation format and answer extractor of one agent family."""

    name: ClassVar[str]
    stop: ClassVar[tuple[str, ...]]
    invalid_action_message: ClassVar[str]
    search_disabled_on_last_turn: ClassVar[bool]
    #: Passages per search of `initial_queries` (None: `EnvConfig.topk`, as every later search).
    initial_topk: ClassVar[int | None] = None

    @abc.abstractmethod
    def build_prompt(self, question: str, initial_passages: Sequence[Sequence[ScoredPassage]] = ()) -> str:
        """The user message for `question`; `initial_passages` are the results of `initial_queries`."""

    def initial_queries(self, question: str) -> tuple[str, ...]:
        """Searches the environment runs before the first turn, their results going into the prompt (none)."""
        return ()

    @abc.abstractmethod
    def parse_action(self, turn_text: str) -> Action:
        """The action of one generated turn (already cut by `truncate_turn`)."""

    @abc.abstractmethod
    def format_observation(self, results: Sequence[Sequence[ScoredPassage]]) -> str:
        """The text inserted after a search action: `results` holds the passages of each of its queries."""

    @abc.abstractmethod
    def extract_answer(self, response_text: str) -> str | None:
        """The final answer in a response (generated and inserted text, prompt excluded), or None."""

    def document_tracker(self, count_tokens: Callable[[str], int]) -> DocumentTracker:
        """A fresh tracker for one trajectory; `count_tokens` counts a text's tokens with the agent's tokenizer
        (the pass-through: every passage shown, none selected)."""
        return DocumentTracker()

    def training_diagnostics(self, result: Rollout, golden: Golden) -> dict[str, float]:
        """What the RL trainer logs of one rollout next to its reward's own components (means over a step): the
        EM of the answer; a dialect adds the checks of its own format."""
        return {"em": qa_scores(result.answer, list(golden)).em}

    def truncate_turn(self, text: str) -> str:
        """`text` cut right after the earliest stop string in it (unchanged when it holds none)."""
        found = find_stop(text, self.stop)
        return text[:found[0]] if found else text
