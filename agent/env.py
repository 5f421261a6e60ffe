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
when its next generation could take prompt + response past `max_context_tokens`, or the response past
`max_response_tokens` when set (every sequence the model sees fits the budget).

The LLM gets token-id prompts (prompt ids + response ids so far), so nothing is re-tokenised between turns.
The response is kept as segments: generated text (mask 1, the model's own token ids) and inserted text
(mask 0: observations, messages, a resumed rollout's prefix); decoding the ids of an inserted segment gives
back exactly its text, which is what RL's state masking needs (retrieved tokens masked from the loss).

The rules of all this live in `Environment`, applied to one trajectory (`Episode`) at a time; `rollout` drives it
in batches, and verl's agent loop (`agent.rl.verl.agent_loop`) drives the same class one trajectory
per coroutine, so an agent trained on verl is the agent our rollouts and mining read.

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

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from agentic_retriever.base.client import RetrievalClient
from agentic_retriever.base.corpus import ScoredPassage
from agentic_retriever.base.llm.protocol import LLM, Generation, SamplingParams, derived_seed, generate_checked
from agentic_retriever.base.llm.text import render_chat_prompt

from .dialects import Action, Dialect, DocumentTracker, SelectedDocuments, get_dialect
from .trajectory import FinishReason, Retrieved, Trajectory, Turn, trajectory_id

__all__ = ["EnvConfig", "Environment", "Episode", "Prefix", "Rollout", "Segment", "Trajectory", "cut_to_tokens",
           "get_dialect", "retrieve_checked", "rollout", "trajectory_id"]

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
    max_response_tokens: int | None = field(default=None, metadata={
        "help": "budget of response tokens, all turns and observations (None: max_context_tokens alone; verl's "
                "agent loop sets its data.max_response_length)"})
    temperature: float = field(default=0.0, metadata={"help": "0 = greedy"})
    top_p: float = field(default=1.0, metadata={"help": "nucleus sampling mass"})
    seed: int | None = field(default=0, metadata={"help": "sampling seed (step s of a rollout uses seed + s)"})
    store_token_ids: bool = field(default=False, metadata={"help": "write response token ids and mask"})

    def __post_init__(self):
        for name in ("max_turns", "topk", "max_new_tokens_per_turn", "observation_max_tokens", "max_context_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"EnvConfig.{name} must be at least 1, got {getattr(self, name)}")
        if self.max_response_tokens is not None and self.max_response_tokens < self.max_new_tokens_per_turn:
            raise ValueError(f"EnvConfig.max_response_tokens ({self.max_response_tokens}) leaves no room for one turn of "
                             f"max_new_tokens_per_turn={self.max_new_tokens_per_turn} tokens")
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
class Episode:
    """One trajectory in progress: its prompt, the response so far (as segments), its turns, and how it ended
    (`finish` None while it runs). `pending` holds the search turn (and its action) waiting for its results."""

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
    pending: tuple[Turn, Action] | None = None

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


class Environment:
    """The rules of the environment for one dialect, tokenizer and `EnvConfig`, applied one trajectory at a time.

    Two drivers share it, so that every trainer sees the same agent: the batched `rollout` below (one generation
    call and one retrieval call per step for the whole batch) and verl's agent loop
    (`agent.rl.verl.agent_loop`, one coroutine per trajectory). A driver calls, per trajectory:
    `initial_queries` (and retrieves them), `start`; then, while `can_generate`: generate one turn with
    `sampling_params`, `take_turn`, and when it returns a search action, retrieve its queries (each with
    ``episode.question``) and `observe`; finally `finish`. `chat_prompt` renders the user message as the model
    sees it (default: the tokenizer's chat template, `render_chat_prompt`).
    """

    def __init__(self, tokenizer, config: EnvConfig, chat_prompt: Callable[[str], str] | None = None):
        self.tokenizer, self.config = tokenizer, config
        self.dialect: Dialect = get_dialect(config.dialect)
        self.chat_prompt = chat_prompt or (lambda message: render_chat_prompt(tokenizer, message))

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def inserted(self, text: str) -> Segment:
        """An inserted text as the model will see it: its tokens, cut to the observation budget."""
        text, ids = cut_to_tokens(self.tokenizer, text, self.config.observation_max_tokens)
        return Segment(text, ids, generated=False)

    def observation_segment(self, tracker: DocumentTracker, results: Sequence[Sequence[ScoredPassage]]) -> Segment:
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

    def sampling_params(self, step: int) -> SamplingParams:
        """The parameters of generation step `step`: the turn budget, the dialect's stop strings, the seed."""
        return self.config.sampling_params(self.dialect.stop, step)

    def initial_queries(self, question: str) -> tuple[str, ...]:
        """The searches the dialect runs before the first turn (s3: the question), their results for `start`."""
        return self.dialect.initial_queries(question)

    @property
    def initial_topk(self) -> int:
        """Passages per initial search: the dialect's (s3: naive RAG's 3), else `EnvConfig.topk`."""
        return self.dialect.initial_topk or self.config.topk

    def start(self, question: str, initial_results: Sequence[Sequence[ScoredPassage]] = (),
              prefix: Prefix | None = None) -> Episode:
        """A new trajectory: the prompt (with the results of `initial_queries`), and, with `prefix`, the resumed
        response and its forced first observation."""
        queries = self.initial_queries(question)
        if len(initial_results) != len(queries):
            raise ValueError(f"{len(initial_results)} result lists for the {len(queries)} initial queries of the "
                             f"{self.dialect.name} dialect")
        tracker = self.dialect.document_tracker(self.count_tokens)
        shown = [tracker.observe(hits) for hits in initial_results]
        prompt = self.chat_prompt(self.dialect.build_prompt(question, shown))
        episode = Episode(question, prompt, self.encode(prompt), tracker)
        if queries:
            episode.turns.append(Turn("", "search", list(queries), [_retrieved(h) for h in initial_results]))
        if prefix is not None:
            self._apply_prefix(episode, prefix)
        return episode

    def _apply_prefix(self, episode: Episode, prefix: Prefix) -> None:
        if not prefix.forced_passages:
            raise ValueError("a prefix needs at least one forced passage")
        used = prefix.turns_used if prefix.turns_used is not None else \
            sum(prefix.response_text.count(s) for s in self.dialect.stop)
        if not 1 <= used <= self.config.max_turns:
            raise ValueError(f"a prefix must have used 1..max_turns={self.config.max_turns} turns, got {used}")
        episode.turns_used = episode.prefix_turns = used
        episode.prefix = prefix.response_text
        episode.append(Segment(prefix.response_text, self.encode(prefix.response_text), generated=False))
        observation = self.observation_segment(episode.tracker, [prefix.forced_passages])
        episode.append(observation)
        episode.turns.append(Turn("", "search", [], [_retrieved(prefix.forced_passages)], observation.text,
                                  forced=True))

    def can_generate(self, episode: Episode) -> bool:
        """Whether `episode` takes another turn: it has not finished, and a full turn fits `max_context_tokens`
        and `max_response_tokens` (else it finishes with ``context_exhausted``)."""
        config, turn = self.config, self.config.max_new_tokens_per_turn
        response = episode.length - len(episode.prompt_ids)
        if episode.finish is None and (episode.length + turn > config.max_context_tokens or (
                config.max_response_tokens is not None and response + turn > config.max_response_tokens)):
            episode.finish = "context_exhausted"
        return episode.finish is None

    def take_turn(self, episode: Episode, generation: Generation) -> Action | None:
        """Record one generated turn and act on it; the search action when it needs retrieval (also kept in
        ``episode.pending`` for `observe`), else None (an answer, the end of the turns, or an invalid action,
        whose message is inserted here)."""
        dialect, config = self.dialect, self.config
        if generation.finish_reason == "abort":  # not a turn of the agent: the engine stopped it midway
            episode.finish = "aborted"
            return None
        segment = self.generated(generation)
        episode.append(segment)
        episode.tracker.read_turn(segment.text)
        action = dialect.parse_action(segment.text)
        search_disabled = episode.turns_used >= config.max_turns  # this was the last, search-disabled generation
        episode.turns_used += 1
        turn = Turn(segment.text, action.kind, list(action.queries))
        episode.turns.append(turn)
        if action.kind == "answer":
            episode.finish, episode.answer = "answer", dialect.extract_answer("".join(s.text for s in episode.segments))
            return None
        out_of_turns = episode.turns_used >= config.max_turns and not dialect.search_disabled_on_last_turn
        if search_disabled or out_of_turns:
            episode.finish = "max_turns"
            return None
        if action.kind == "search":
            episode.pending = (turn, action)
            return action
        message = self.inserted(dialect.invalid_action_message)
        episode.append(message)
        turn.observation = message.text
        return None

    def observe(self, episode: Episode, results: Sequence[Sequence[ScoredPassage]]) -> Segment:
        """Insert the observation of the pending search: `results` holds one result list per query."""
        if episode.pending is None:
            raise RuntimeError(f"no search is waiting for its results in the trajectory of {episode.question!r}")
        turn, action = episode.pending
        if len(results) != len(action.queries):
            raise RuntimeError(f"{len(results)} result lists for the {len(action.queries)} queries of a search")
        observation = self.observation_segment(episode.tracker, results)
        episode.append(observation)
        turn.retrieved = [_retrieved(h) for h in results]
        turn.observation = observation.text
        episode.pending = None
        return observation

    def finish(self, episode: Episode) -> Rollout:
        """The finished trajectory as a `Rollout` (with the document tracker's selection)."""
        return Rollout(episode.question, episode.prompt, episode.prompt_ids, episode.segments, episode.turns,
                       episode.answer, episode.finish, episode.prefix, episode.prefix_turns, episode.tracker.selected())


def retrieve_checked(client: RetrievalClient, queries: list[str], questions: list[str], topk: int
                     ) -> list[list[ScoredPassage]]:
    """One retrieval call for `queries` (each with its question), refusing an answer with another list count."""
    results = client.retrieve(queries, topk=topk, questions=questions)
    if len(results) != len(queries):
        raise RuntimeError(f"the retrieval client answered {len(results)} result lists for {len(queries)} queries")
    return results


def rollout(questions: Sequence[str], llm: LLM, client: RetrievalClient, config: EnvConfig,
            prefixes: Sequence[Prefix | None] | None = None, seeds: Sequence[int] | None = None) -> list[Rollout]:
    """Run the agent on a batch of questions to the end; one `Rollout` per question, in order.

    `prefixes` (parallel to `questions`, entries may be None) resumes trajectories from a given context.
    Greedy decoding (the default) is deterministic. With sampling, every trajectory has its own seed: `seeds`
    (parallel to `questions`; `run_rollouts` derives them from the question id and the sample, so a trajectory
    draws the same in any batch), else one derived from ``config.seed`` and its place in the batch; step s of the
    loop passes that seed + s. vLLM and OpenAI-compatible servers seed each request alone, so a question repeated in
    the batch (its samples, an RL group) gets different samples only this way.
    """
    if prefixes is not None and len(prefixes) != len(questions):
        raise ValueError(f"prefixes must be parallel to questions: got {len(prefixes)} for {len(questions)}")
    if seeds is not None and len(seeds) != len(questions):
        raise ValueError(f"seeds must be parallel to questions: got {len(seeds)} for {len(questions)}")
    engine_context = getattr(llm, "max_context", None)
    if engine_context is not None and config.max_context_tokens > engine_context:
        raise ValueError(f"env.max_context_tokens={config.max_context_tokens} is more than the {engine_context} tokens "
                         f"{llm.name} takes (its max_model_len): a long trajectory's prompt would be refused midway; "
                         "lower env.max_context_tokens or raise the agent's max_model_len")
    if config.seed is None:
        seeds = None
    elif seeds is None:
        seeds = [derived_seed(config.seed, "position", j) for j in range(len(questions))]
    env = Environment(llm.tokenizer, config, llm.chat_prompt)
    questions = list(questions)
    initial = [env.initial_queries(q) for q in questions]
    flat = [(i, q) for i, qs in enumerate(initial) for q in qs]
    results = iter(retrieve_checked(client, [q for _, q in flat], [questions[i] for i, _ in flat], env.initial_topk)
                   if flat else [])
    episodes = [env.start(question, [next(results) for _ in queries], prefix)
                for question, queries, prefix in zip(questions, initial, prefixes or [None] * len(questions))]
    seed_of = {id(e): seed for e, seed in zip(episodes, seeds)} if seeds is not None else {}
    step = 0
    while active := [e for e in episodes if env.can_generate(e)]:
        params = env.sampling_params(step)
        if seed_of:
            params.seeds = [seed_of[id(e)] + step for e in active]
        outputs = _generate_retrying_aborts(llm, [e.context_ids() for e in active], params)
        searching = []
        for episode, gens in zip(active, outputs):
            if env.take_turn(episode, gens[0]) is not None:  # a search: its results come in one call below
                searching.append(episode)
        if searching:
            queries = [(e, q) for e in searching for q in e.pending[1].queries]
            results = iter(retrieve_checked(client, [q for _, q in queries], [e.question for e, _ in queries],
                                            config.topk))
            for episode in searching:
                env.observe(episode, [next(results) for _ in episode.pending[1].queries])
        step += 1
    return [env.finish(e) for e in episodes]


def _generate_retrying_aborts(llm: LLM, prompts: list, params: SamplingParams) -> list[list[Generation]]:
    """`generate_checked`, with the prompts whose generation the engine aborted (vLLM's ``finish_reason="abort"``:
    preempted, or an engine shutting down) generated once more; an abort again ends that trajectory as
    ``aborted`` (`Environment.take_turn`), never as a stop."""
    outputs = generate_checked(llm, prompts, params)
    aborted = [k for k, gens in enumerate(outputs) if gens[0].finish_reason == "abort"]
    if aborted:
        log.warning("%s aborted %d of %d generations; trying them once more", llm.name, len(aborted), len(prompts))
        again = dataclasses.replace(params, seeds=None if params.seeds is None else [params.seeds[k] for k in aborted])
        for k, gens in zip(aborted, generate_checked(llm, [prompts[k] for k in aborted], again)):
            outputs[k] = gens
    return outputs


def _retrieved(passages: Sequence[ScoredPassage]) -> Retrieved:
    return Retrieved([p.id for p in passages], [p.title for p in passages], [float(p.score) for p in passages])
