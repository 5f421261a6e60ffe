"""verl's agent loops for our search agents: `DialectAgentLoop`, registered as ``agentic_retriever_agent``, and
`SearchToolAgentLoop` (verl's hermes ``tool_agent`` loop around our `SearchTool`), registered as
``agentic_retriever_tool_agent``.

verl ("HybridFlow: A Flexible and Efficient RLHF Framework", arXiv 2409.19256; written against verl 0.9.1) runs
one `AgentLoopBase` coroutine per trajectory and trains on what it returns. This one runs the environment of our
own rollouts (`agent.env.Environment`), so the agent verl trains writes the actions that our rollouts, mining and
evaluation read (Algorithm 1 of "Agentic-R: Learning to Retrieve for Agentic Search", arXiv 2601.11888: "train
Agent_i using PPO by interacting with retriever Agentic-R_{i-1}"). Per trajectory:

1. the question comes from the row's ``extra_info.question``; a dialect that searches before the first turn (s3)
   retrieves first; the prompt is the dialect's, rendered by the tokenizer's chat template as our rollouts do;
2. each turn generates through verl's server manager (vLLM or SGLang) until the dialect's stop strings
   (``</search>``, ``</answer>``, ...), at most ``env.max_new_tokens_per_turn`` tokens;
3. the dialect parses the turn (`Environment.take_turn`); a search calls our retrieval service (``POST
   /retrieve`` with ``questions``, so an encoder trained on ``Q [SEP] q`` gets it) and its observation, cut to
   ``env.observation_max_tokens``, is appended as tokens with response mask 0; an invalid turn gets the
   dialect's message, also masked;
4. it stops at an answer, after ``env.max_turns`` turns (Search-R1's search-disabled last turn included), or when
   a full turn no longer fits ``env.max_context_tokens`` (prompt + response) or verl's response budget
   (``data.max_response_length``).

The settings come from the agent-loop config file the run folder writes (`run_folder.agent_loop_config`), which verl's
``actor_rollout_ref.rollout.agent.agent_loop_config_path`` names: ``env`` (our `EnvConfig` fields),
``retrieval_service_url`` and ``timeout`` (read from that file when verl builds the loop from its ``register``
entry, which keeps the class only). This module imports verl, so it is imported only where verl runs
(`agent.rl.verl` does not import it).

**A failed search fails its trajectory, in both loops.** A search the service does not answer after the client's
retries (`HttpRetrievalClient`: connection errors, timeouts, 5xx and 429, with back-off) raises
`RetrievalServiceError`, naming the service and the trajectory's question, out of the loop's ``run``: verl never
trains on it. On verl's trainer (``use_v1``, which our overrides pin) the question's group is marked ``failure`` and
only its finished trajectories reach the batch (verl logs the error; ``trainer.v1.sampler.sync_refill_failed_groups``
draws replacements; a step where nothing finished stops with verl's error); on the legacy trainer the step fails with
it. Left to itself, verl's ``tool_agent`` would hand the policy the text "Error executing tool ..." as an observation
and train on it; `SearchToolAgentLoop` raises instead.
"""

from __future__ import annotations

import asyncio
import functools
import time
from pathlib import Path
from typing import Any
from uuid import uuid4

import yaml

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register
from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop

from agent.env import EnvConfig, Environment, Episode, retrieve_checked
from agentic_retriever.base.client import HttpRetrievalClient, RetrievalServiceError
from agentic_retriever.base.llm.protocol import Generation

from .overrides import AGENT_LOOP_NAME, TOOL_AGENT_LOOP_NAME
from .search_tool import SEARCH_FAILED

__all__ = ["AGENT_LOOP_NAME", "TOOL_AGENT_LOOP_NAME", "DialectAgentLoop", "SearchToolAgentLoop"]

#: What each rollout engine needs to keep a stop string in the returned tokens (the dialect parses it).
_KEEP_STOP_STRING = {"vllm": {"include_stop_str_in_output": True}, "sglang": {"no_stop_trim": True}}


@functools.cache
def _client(url: str, timeout: float, api_key: str | None) -> HttpRetrievalClient:
    """One HTTP client per service and worker process (verl builds a loop object per trajectory); `api_key` None
    sends ``$AGENTIC_RETRIEVER_API_KEY`` when set."""
    return HttpRetrievalClient(url, timeout=timeout, api_key=api_key)


@functools.cache
def _config_entry(path: str | None) -> dict[str, Any]:
    """Our entry of verl's agent-loop config file: verl's ``register`` keeps only the class of a registered loop,
    and once this module is imported its bare entry replaces the file's, so the settings are read back here."""
    if not path:
        raise ValueError(f"{AGENT_LOOP_NAME} reads its settings from actor_rollout_ref.rollout.agent."
                         "agent_loop_config_path, which is not set; write the run with prepare_verl_run")
    entries = [dict(entry) for entry in yaml.safe_load(Path(path).read_text(encoding="utf-8")) or []]
    found = [entry for entry in entries if entry.get("name") == AGENT_LOOP_NAME]
    if not found or not {"env", "retrieval_service_url"} <= found[0].keys():
        raise ValueError(f"{path}: no entry named {AGENT_LOOP_NAME} with the fields env and retrieval_service_url")
    return {"timeout": 60.0, "api_key": None, **found[0]}


@register(AGENT_LOOP_NAME)
class DialectAgentLoop(AgentLoopBase):
    """One trajectory of our search agent in any dialect (``search_r1``, ``s3``, ``qagent``, ``reflect``) on verl.

    ``env``: `EnvConfig` fields (dialect and budgets; ``max_response_tokens`` is verl's response length);
    ``retrieval_service_url``: our service (``index serve`` or the loop's); ``timeout``: seconds per request;
    ``api_key``: the service's key, when it takes one.
    """

    def __init__(self, *args: Any, env: dict[str, Any] | None = None, retrieval_service_url: str | None = None,
                 timeout: float = 60.0, api_key: str | None = None, **kwargs: Any):
        kwargs.pop("tools", None)  # verl hands every loop its tool list; the dialect is our tool
        kwargs.pop("name", None)   # the config entry's own name
        super().__init__(*args, **kwargs)
        if env is None or retrieval_service_url is None:  # built from `register`'s bare entry: read the file's
            entry = _config_entry(self.rollout_config.agent.agent_loop_config_path)
            env, retrieval_service_url = entry["env"], entry["retrieval_service_url"]
            timeout, api_key = entry["timeout"], entry["api_key"]
        self.prompt_length = self.rollout_config.prompt_length
        self.response_length = self.rollout_config.response_length
        config = EnvConfig(**{**env, "max_response_tokens": self.response_length})
        self.environment = Environment(self.tokenizer, config)
        self.client = _client(retrieval_service_url, float(timeout), api_key)
        engine = self.rollout_config.name
        if engine not in _KEEP_STOP_STRING:
            raise ValueError(f"{AGENT_LOOP_NAME} supports the rollout engines {', '.join(_KEEP_STOP_STRING)}, "
                             f"not actor_rollout_ref.rollout.name={engine!r}")
        self.stop_params = {"stop": list(self.environment.dialect.stop), **_KEEP_STOP_STRING[engine]}

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        question = _question(kwargs.get("extra_info"))
        env, timing = self.environment, {"generate_sequences": 0.0, "tool_calls": 0.0}
        initial = env.initial_queries(question)
        results = await self._retrieve(list(initial), question, timing, env.initial_topk) if initial else []
        episode = env.start(question, results)
        if len(episode.prompt_ids) > self.prompt_length:
            raise ValueError(f"the {env.dialect.name} prompt of {question!r} has {len(episode.prompt_ids)} tokens, "
                             f"more than data.max_prompt_length={self.prompt_length} (VerlSettings.max_prompt_length)")
        request_id, logprobs, server_fields = uuid4().hex, [], {}
        params = {**sampling_params, **self.stop_params, "max_tokens": env.config.max_new_tokens_per_turn}
        while env.can_generate(episode):
            start = time.perf_counter()
            output = await self.server_manager.generate(request_id=request_id, prompt_ids=episode.context_ids(),
                                                        sampling_params=params)
            timing["generate_sequences"] += time.perf_counter() - start
            logprobs.append(list(output.log_probs or []))
            _merge_server_fields(server_fields, output.extra_fields)
            action = env.take_turn(episode, self._generation(output.token_ids, params["max_tokens"],
                                                             output.stop_reason))
            if action is not None:
                env.observe(episode, await self._retrieve(list(action.queries), question, timing, env.config.topk))
        return self._output(episode, logprobs, bool(sampling_params.get("logprobs")), timing, server_fields)

    async def _retrieve(self, queries: list[str], question: str, timing: dict[str, float], topk: int):
        """The service's top-`topk` for each of `queries`, each sent with the trajectory's `question`."""
        start = time.perf_counter()
        try:
            results = await asyncio.to_thread(retrieve_checked, self.client, queries, [question] * len(queries), topk)
        except RetrievalServiceError as error:  # after the client's retries: the trajectory fails (module docstring)
            raise RetrievalServiceError(f"the search of the trajectory of {question!r} failed: {error}",
                                        error.status_code, error.url) from error
        timing["tool_calls"] += time.perf_counter() - start
        return results

    def _generation(self, token_ids: list[int], max_tokens: int, stop_reason: str | None = None) -> Generation:
        """The server's tokens as a turn; an aborted one (verl's ``stop_reason`` "aborted", when its server manager
        gives up retrying) ends the trajectory as ``aborted`` instead of becoming an empty or cut turn."""
        text = self.tokenizer.decode(token_ids, skip_special_tokens=True)
        if stop_reason in ("aborted", "abort"):
            return Generation(text, list(token_ids), "abort")
        return Generation(text, list(token_ids), "length" if len(token_ids) >= max_tokens else "stop")

    def _output(self, episode: Episode, generation_logprobs: list[list[float]], with_logprobs: bool,
                timing: dict[str, float], server_fields: dict[str, Any]) -> AgentLoopOutput:
        """verl's output: the response cut to its response length (only observation tokens can fall past it,
        since every turn starts with room for a full turn), the mask, per-token log-probs (0 for inserted ones),
        and the server's own fields beside ours."""
        response_ids, mask, logprobs = [], [], []
        turns = iter(generation_logprobs)
        for segment in episode.segments:
            response_ids += segment.token_ids
            mask += [int(segment.generated)] * len(segment.token_ids)
            values = next(turns)[:len(segment.token_ids)] if segment.generated else []
            logprobs += values + [0.0] * (len(segment.token_ids) - len(values))
        cut = self.response_length
        extra = {**server_fields, "searches": sum(1 for turn in episode.turns if turn.retrieved),
                 "invalid_actions": sum(1 for turn in episode.turns if turn.action == "invalid"),
                 "finish_reason": episode.finish, "retrieval_seconds": timing["tool_calls"],
                 "turn_scores": [], "tool_rewards": []}
        return AgentLoopOutput(prompt_ids=episode.prompt_ids, response_ids=response_ids[:cut], response_mask=mask[:cut],
                               response_logprobs=logprobs[:cut] if with_logprobs else None,
                               num_turns=1 + len(episode.segments), metrics=timing, extra_fields=extra)


@register(TOOL_AGENT_LOOP_NAME)
class SearchToolAgentLoop(ToolAgentLoop):
    """verl's hermes tool loop, except that a search the service failed (`SearchTool`'s ``SEARCH_FAILED``) fails
    the trajectory instead of becoming the observation the policy trains on."""

    async def _call_tool(self, tool_call: Any, tools_kwargs: dict[str, Any],
                         agent_data: Any) -> tuple[Any, float, dict]:
        response, reward, metrics = await super()._call_tool(tool_call, tools_kwargs, agent_data)
        if isinstance(metrics, dict) and metrics.get(SEARCH_FAILED):
            raise RetrievalServiceError(metrics[SEARCH_FAILED])
        return response, reward, metrics


def _merge_server_fields(fields: dict[str, Any], new: dict[str, Any]) -> None:
    """The server's extra fields over a trajectory's turns, as verl's tool loop keeps them: the first turn's, with
    the latest ``max_global_steps`` (the policy version of the last turn, for verl's asynchronous trainers)."""
    if not fields:
        fields.update(new)
    elif new.get("max_global_steps") is not None:
        fields["max_global_steps"] = new["max_global_steps"]


def _question(extra_info: Any) -> str:
    """The row's question (``extra_info.question``, written by `prepare_verl_run`)."""
    question = extra_info.get("question") if isinstance(extra_info, dict) else None
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"{AGENT_LOOP_NAME} reads the question from the row's extra_info.question, got "
                         f"{question!r}; write the data with agent.rl.verl.prepare_verl_run")
    return question
