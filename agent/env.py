"""The agent environment: batched multi-turn rollouts of a search agent against a retrieval client.

One `rollout` call advances a batch of questions together (the loop of ``run_llm_loop`` in the authors'
release of Search-R1, arXiv 2503.09516, written [R] below):

1. every active trajectory generates one turn: one `LLM.generate` call over all of them, stopping at the
   dialect's stop strings (the turn is cut right after the first one);
2. the dialect reads each turn's action: an answer finishes the trajectory; the queries of all search
   actions of the step go to the retriever in ONE `RetrievalClient.retrieve` call (each with its original
   question, for retrievers trained on ``Q [SEP] q``) and the formatted passages are inserted; an invalid
   action gets the dialect's invalid-action message;
3. every inserted text is cut to `EnvConfig.observation_max_tokens` tokens ([R] cuts each observation's
   token ids, so the cut may fall inside ``</information>``), except the observations of a dialect whose
   document tracker bounds them itself (below).

Each trajectory has its dialect's `DocumentTracker` (`Dialect.document_tracker`; Search-R1's passes everything
through): every result list, the searches before turn 1 included, goes through `DocumentTracker.observe`, whose
passages are the ones the prompt or the observation shows; every generated turn goes to
`DocumentTracker.read_turn`; the finished `Rollout.selection` is `DocumentTracker.selected`. For s3 ("s3: You Don't
Need That Much Data to Train a Search Agent via RL", arXiv 2505.14146, section 3.1) that is `S3Selection`: whole
documents within the per-turn token budget, and D_s3 with its counters.

Turns are generation steps, as in [R]: an invalid action uses one. After `max_turns` turns a dialect with
`search_disabled_on_last_turn` gets one last generation whose searches are not executed ([R]'s final
rollout with ``do_search=False``); an answer there finishes normally, anything else ends the trajectory
without an answer (finish reason ``max_turns``). A trajectory also stops, with ``context_exhausted``,
when its next generation could take prompt + response past `max_context_tokens` (every sequence the
model sees fits the budget).

The LLM gets token-id prompts (prompt ids + response ids so far), so nothing is re-tokenised between turns.
The response is kept as segments: generated text (mask 1, the model's own token ids) and inserted text
(mask 0: observations, messages, a resumed rollout's prefix); decoding the ids of an inserted segment gives
back exactly its text, which is what RL's state masking needs (retrieved tokens masked from the loss).

Resuming (global answer correctness of "Agentic-R: Learning to Retrieve for Agentic Search", section 4.1.1;
docs/mining.md): a `Prefix` starts a
trajectory from a response-so-far ending with a search call; the first observation shows the given
passages (Doc 1...) instead of retrieving, later turns retrieve normally. The document tracker sees the prompt's
documents and what follows the prefix, not the prefix's own turns.

This module is the agent's public face toward the retriever side (mining, the co-training loop): `__all__`
lists what it offers, including the re-exported `Trajectory` (with `Trajectory.from_json` to read one) and
`get_dialect`. Mining reaches it only through `agentic_retriever.mining.environment` (docs/architecture.md).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from agentic_retriever.client import RetrievalClient
from agentic_retriever.corpus import ScoredPassage
from agentic_retriever.llm.base import LLM, Generation, SamplingParams, generate_checked

from .dialects import Action, Dialect, DocumentTracker, SelectedDocuments, get_dialect
from .trajectory import FinishReason, Retrieved, Trajectory, Turn

__all__ = ["EnvConfig", "Prefix", "Rollout", "Segment", "Trajectory", "cut_to_tokens", "get_dialect", "rollout"]

log = logging.getLogger(__name__)


@dataclass
class EnvConfig:
    """Settings of the agent environment (defaults: Search-R1's release; Agentic-R uses max_turns=5)."""

    dialect: str = field(default="search_r1", metadata={"help": "agent dialect (prompt, tags, observations)"})
    max_turns: int = field(default=4, metadata={"help": "generation turns before the search-disabled last one"})
    topk: int = field(default=3, metadata={"help": "passages per search query"})
    max_new_tokens_per_turn: int = field(default=512, metadata={"help": "generated tokens per turn"})
    observation_max_tokens: int = field(default=500, metadata={
        "help": "cut of every inserted text, in tokens (not of observations the dialect bounds itself, e.g. s3's)"})
    max_context_tokens: int = field(default=4096, metadata={"help": "budget of prompt + response tokens"})
    temperature: float = field(default=0.0, metadata={"help": "0 = greedy"})
    top_p: float = field(default=1.0, metadata={"help": "nucleus sampling mass"})
    seed: int | None = field(default=0, metadata={"help": "sampling seed (step s of a rollout uses seed + s)"})
    store_token_ids: bool = field(default=False, metadata={"help": "write response token ids and mask"})

    def __post_init__(self):
        for name in ("max_turns", "topk", "max_new_tokens_per_turn", "observation_max_tokens", "max_context_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"EnvConfig.{name} must be at least 1, got {getattr(self, name)}")
        get_dialect(self.dialect)  # fail early on an unknown name

    def sampling_params(self, stop: Sequence[str], step: int) -> SamplingParams:
        return SamplingParams(max_new_tokens=self.max_new_tokens_per_turn, temperature=self.temperature,
                              top_p=self.top_p, stop=list(stop), seed=None if self.seed is None else self.seed + step)


@dataclass(frozen=True)
class Prefix:
    """Where a resumed trajectory starts: the response so far (ending with a search call), the passages its
    next observation shows instead of retrieval, and how many turns that response used.

    `turns_used` None counts the dialect's stop strings in `response_text` (one per turn that ended on one;
    turns that ran out of tokens are missed): pass it, or build the prefix with `from_trajectory`, to be exact.
    """

    response_text: str
    forced_passages: Sequence[ScoredPassage]
    turns_used: int | None = None

    @classmethod
    def from_trajectory(cls, trajectory: Trajectory, turn_index: int, passages: Sequence[ScoredPassage]) -> Prefix:
        """The context of `trajectory` up to and including the search call of turn `turn_index`."""
        turns = trajectory.turns
        if not 0 <= turn_index < len(turns) or turns[turn_index].action != "search" or not turns[turn_index].text:
            raise ValueError(f"turn {turn_index} of question {trajectory.question_id} is not a generated search turn")
        before = trajectory.prefix + "".join(t.text + t.observation for t in turns[:turn_index])
        used = trajectory.prefix_turns + sum(1 for t in turns[:turn_index + 1] if t.text)
        return cls(before + turns[turn_index].text, tuple(passages), used)


@dataclass
class Segment:
    """A piece of the response: generated by the model (mask 1) or inserted by the environment (mask 0)."""

    text: str
    token_ids: list[int]
    generated: bool


@dataclass
class Rollout:
    """One question's finished rollout; `selection` holds the documents the dialect's searcher selected for a
    frozen generator and its counters (s3's D_s3), None for dialects that select none."""

    question: str
    prompt: str
    prompt_ids: list[int]
    segments: list[Segment]
    turns: list[Turn]
    answer: str | None
    finish_reason: FinishReason
    prefix: str = ""
    prefix_turns: int = 0
    selection: SelectedDocuments | None = None

    @property
    def response_text(self) -> str:
        return "".join(s.text for s in self.segments)

    @property
    def response_ids(self) -> list[int]:
        return [i for s in self.segments for i in s.token_ids]

    @property
    def response_mask(self) -> list[int]:
        """1 for every generated token, 0 for every inserted one, parallel to `response_ids`."""
        return [int(s.generated) for s in self.segments for _ in s.token_ids]

    @property
    def num_searches(self) -> int:
        """Searches whose passages the agent saw (forced observations and searches before turn 1 included)."""
        return sum(1 for t in self.turns if t.retrieved)


@dataclass
class _State:
    question: str
    prompt: str
    prompt_ids: list[int]
    tracker: DocumentTracker
    turns_used: int = 0
    prefix: str = ""
    prefix_turns: int = 0
    segments: list[Segment] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    length: int = 0
    finish: FinishReason | None = None
    answer: str | None = None

    def __post_init__(self):
        self.length = len(self.prompt_ids)

    def append(self, segment: Segment) -> None:
        self.segments.append(segment)
        self.length += len(segment.token_ids)

    def context_ids(self) -> list[int]:
        return self.prompt_ids + [i for s in self.segments for i in s.token_ids]


def cut_to_tokens(tokenizer, text: str, limit: int) -> tuple[str, list[int]]:
    """`text` cut to its first `limit` tokens ([R] cuts every inserted text's token ids), as (text, ids)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) <= limit:
        return text, ids
    log.debug("inserted text of %d tokens cut to %d", len(ids), limit)
    ids = ids[:limit]
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False), ids


class _Session:
    """The pieces one rollout call shares: dialect, tokenizer, LLM, retriever, config."""

    def __init__(self, llm: LLM, client: RetrievalClient, config: EnvConfig):
        self.llm, self.client, self.config = llm, client, config
        self.dialect: Dialect = get_dialect(config.dialect)
        self.tokenizer = llm.tokenizer

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def inserted(self, text: str) -> Segment:
        """An inserted text as the model will see it: its tokens, cut to the observation budget."""
        text, ids = cut_to_tokens(self.tokenizer, text, self.config.observation_max_tokens)
        return Segment(text, ids, generated=False)

    def observation(self, tracker: DocumentTracker, results: Sequence[Sequence[ScoredPassage]]) -> Segment:
        """The observation of a search's result lists: the passages `tracker` shows, formatted by the dialect;
        cut to the observation budget unless the tracker bounds it."""
        text = self.dialect.format_observation([tracker.observe(hits) for hits in results])
        return Segment(text, self.encode(text), generated=False) if tracker.bounds_observations else self.inserted(text)

    def count_tokens(self, text: str) -> int:
        """Tokens of `text` with the LLM's tokenizer (what a document tracker's budget counts)."""
        return len(self.encode(text))

    def generated(self, generation: Generation) -> Segment:
        """A generated turn cut right after its first stop string, with the token ids that produced it."""
        text = self.dialect.truncate_turn(generation.text)
        ids = list(generation.token_ids)
        if text != generation.text:  # the backend did not stop at the stop string
            ids = self._ids_covering(ids, text)
        return Segment(text, ids, generated=True)

    def _ids_covering(self, ids: list[int], text: str) -> list[int]:
        """The shortest prefix of `ids` whose decoding starts with `text` (what a stop-aware backend returns)."""
        for end in range(1, len(ids) + 1):
            if self.tokenizer.decode(ids[:end], skip_special_tokens=True).startswith(text):
                return ids[:end]
        log.warning("the generated ids do not decode to the generated text; re-tokenising the cut turn")
        return self.encode(text)

    def retrieve(self, queries: list[str], questions: list[str]) -> list[list[ScoredPassage]]:
        """One retrieval call for all queries of a step."""
        results = self.client.retrieve(queries, topk=self.config.topk, questions=questions)
        if len(results) != len(queries):
            raise RuntimeError(f"the retrieval client answered {len(results)} result lists for {len(queries)} queries")
        return results


def rollout(questions: Sequence[str], llm: LLM, client: RetrievalClient, config: EnvConfig,
            prefixes: Sequence[Prefix | None] | None = None) -> list[Rollout]:
    """Run the agent on a batch of questions to the end; one `Rollout` per question, in order.

    `prefixes` (parallel to `questions`, entries may be None) resumes trajectories from a given context.
    Greedy decoding (the default) is deterministic; with sampling, step s of the loop passes the seed
    ``config.seed + s``, so a rerun of the same batch draws the same samples as far as the backend's seeding does.
    """
    if prefixes is not None and len(prefixes) != len(questions):
        raise ValueError(f"prefixes must be parallel to questions: got {len(prefixes)} for {len(questions)}")
    session = _Session(llm, client, config)
    states = _start(session, list(questions), list(prefixes) if prefixes is not None else [None] * len(questions))
    step = 0
    while True:
        active = [s for s in states if s.finish is None]
        for state in active:
            if state.length + config.max_new_tokens_per_turn > config.max_context_tokens:
                state.finish = "context_exhausted"
        active = [s for s in active if s.finish is None]
        if not active:
            break
        outputs = generate_checked(llm, [s.context_ids() for s in active],
                                   config.sampling_params(session.dialect.stop, step))
        searches = []
        for state, gens in zip(active, outputs):
            search = _take_turn(session, state, gens[0])
            if search is not None:
                searches.append((state, *search))
        if searches:
            _observe(session, searches)
        step += 1
    return [Rollout(s.question, s.prompt, s.prompt_ids, s.segments, s.turns, s.answer, s.finish, s.prefix,
                    s.prefix_turns, s.tracker.selected()) for s in states]


def _start(session: _Session, questions: list[str], prefixes: list[Prefix | None]) -> list[_State]:
    """Prompts (after any searches the dialect runs before turn 1), and the forced first observations."""
    dialect = session.dialect
    initial = [dialect.initial_queries(q) for q in questions]
    flat = [(i, q) for i, qs in enumerate(initial) for q in qs]
    results = session.retrieve([q for _, q in flat], [questions[i] for i, _ in flat]) if flat else []
    per_question: list[list[list[ScoredPassage]]] = [[] for _ in questions]
    for (i, _), hits in zip(flat, results):
        per_question[i].append(hits)
    states = []
    for question, queries, passages, prefix in zip(questions, initial, per_question, prefixes):
        tracker = dialect.document_tracker(session.count_tokens)
        prompt = session.llm.chat_prompt(dialect.build_prompt(question, [tracker.observe(h) for h in passages]))
        state = _State(question, prompt, session.encode(prompt), tracker)
        if queries:
            state.turns.append(Turn("", "search", list(queries), [_retrieved(h) for h in passages]))
        if prefix is not None:
            _apply_prefix(session, state, prefix)
        states.append(state)
    return states


def _apply_prefix(session: _Session, state: _State, prefix: Prefix) -> None:
    if not prefix.forced_passages:
        raise ValueError("a prefix needs at least one forced passage")
    used = prefix.turns_used if prefix.turns_used is not None else \
        sum(prefix.response_text.count(s) for s in session.dialect.stop)
    if not 1 <= used <= session.config.max_turns:
        raise ValueError(f"a prefix must have used 1..max_turns={session.config.max_turns} turns, got {used}")
    state.turns_used = state.prefix_turns = used
    state.prefix = prefix.response_text
    state.append(Segment(prefix.response_text, session.encode(prefix.response_text), generated=False))
    observation = session.observation(state.tracker, [prefix.forced_passages])
    state.append(observation)
    state.turns.append(Turn("", "search", [], [_retrieved(prefix.forced_passages)], observation.text, forced=True))


def _take_turn(session: _Session, state: _State, generation: Generation) -> tuple[Turn, Action] | None:
    """Record one generated turn and act on it; return (turn, action) when it needs retrieval."""
    dialect, config = session.dialect, session.config
    segment = session.generated(generation)
    state.append(segment)
    state.tracker.read_turn(segment.text)
    action = dialect.parse_action(segment.text)
    search_disabled = state.turns_used >= config.max_turns  # this was the last, search-disabled generation
    state.turns_used += 1
    turn = Turn(segment.text, action.kind, list(action.queries))
    state.turns.append(turn)
    if action.kind == "answer":
        state.finish, state.answer = "answer", dialect.extract_answer("".join(s.text for s in state.segments))
        return None
    out_of_turns = state.turns_used >= config.max_turns and not dialect.search_disabled_on_last_turn
    if search_disabled or out_of_turns:
        state.finish = "max_turns"
        return None
    if action.kind == "search":
        return turn, action
    message = session.inserted(dialect.invalid_action_message)
    state.append(message)
    turn.observation = message.text
    return None


def _observe(session: _Session, searches: list[tuple[_State, Turn, Action]]) -> None:
    """Retrieve for every search action of the step in one call, and insert the observations."""
    queries = [q for _, _, action in searches for q in action.queries]
    questions = [state.question for state, _, action in searches for _ in action.queries]
    results = iter(session.retrieve(queries, questions))
    for state, turn, action in searches:
        hits = [next(results) for _ in action.queries]
        observation = session.observation(state.tracker, hits)
        state.append(observation)
        turn.retrieved = [_retrieved(h) for h in hits]
        turn.observation = observation.text


def _retrieved(passages: Sequence[ScoredPassage]) -> Retrieved:
    return Retrieved([p.id for p in passages], [p.title for p in passages], [float(p.score) for p in passages])
