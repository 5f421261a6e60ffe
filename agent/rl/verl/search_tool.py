"""verl's search tool for the ``tool_agent`` loop: `SearchTool`, and the native-tool config naming it (`search_tool_config`).

verl 0.9.1 ships no search tool (``verl.tools`` holds only the base and function-tool classes; the ``SearchTool``
of earlier verl releases is gone), so the tool config names `SearchTool`, a native verl tool that queries our
service through `HttpRetrievalClient` (``POST /retrieve`` with ``{"queries", "topk", "return_scores": true}``, the
request verl's former search tool sent) and returns Search-R1's ``<information>Doc 1(Title: ...) ...</information>``
text (`SearchR1Dialect.format_observation`).

A search the service still fails after the client's retries is never handed to the policy as an observation:
verl's hermes loop turns any exception of a tool into the text "Error executing tool ..." and trains on it, so
`SearchTool.execute` answers such a search with the failure in its metrics (``SEARCH_FAILED``), and our tool loop
(`agent_loop.SearchToolAgentLoop`, which `prepare_verl_run` names) raises it, failing the trajectory (docs/verl.md,
"When the service fails").
"""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import uuid4

from agent.dialects.search_r1 import SearchR1Dialect
from agentic_retriever.base.client import HttpRetrievalClient, RetrievalServiceError

TOOL_NAME = "search"
#: The key of `SearchTool.execute`'s metrics that carries a failed search's error (the service's URL and cause).
SEARCH_FAILED = "search_failed"


def search_tool_config(service_url: str, topk: int, api_key: str | None = None) -> dict[str, Any]:
    """verl's native-tool config (``multi_turn.tool_config_path``): `SearchTool` at our service (with its `api_key`,
    when it takes one)."""
    return {"tools": [{
        "class_name": f"{__name__}.SearchTool",
        "config": {"type": "native", "retrieval_service_url": service_url, "topk": topk, "timeout": 60}
        | ({"api_key": api_key} if api_key else {}),
        "tool_schema": {"type": "function", "function": {
            "name": TOOL_NAME,
            "description": "Searches the knowledge corpus for passages relevant to each query.",
            "parameters": {"type": "object", "required": ["query_list"], "properties": {
                "query_list": {"type": "array", "description": "the search queries"}}}}},
    }]}


class SearchTool:
    """A native verl tool (``verl.tools.base_tool.BaseTool``'s interface) searching our retrieval service.

    verl builds it from `search_tool_config`: ``config`` holds ``retrieval_service_url``, ``topk``, ``timeout`` and
    the service's ``api_key`` when it takes one (else ``$AGENTIC_RETRIEVER_API_KEY`` is sent, when set);
    ``tool_schema`` is verl's ``OpenAIFunctionToolSchema``. The model calls it with ``{"query_list": [...]}``; the
    answer is Search-R1's observation of all passages (`SearchR1Dialect.format_observation`). Each instance keeps
    the row's question (``create(create_kwargs={"question": ...})``) and sends it along with every query, so a
    service serving an Agentic-R retriever searches with ``Q [SEP] q``, as our own environment does. verl is
    imported only inside `create` and `execute`, which run in verl's workers, so this module imports without it.
    """

    def __init__(self, config: dict[str, Any], tool_schema: Any):
        self.config, self.tool_schema = config, tool_schema
        self.name = tool_schema.function.name
        self.topk = int(config.get("topk", 3))
        self._client = HttpRetrievalClient(config["retrieval_service_url"], timeout=float(config.get("timeout", 60)),
                                           api_key=config.get("api_key"))
        self._questions: dict[str, str | None] = {}

    def get_openai_tool_schema(self) -> Any:
        return self.tool_schema

    def search(self, query_list: list[str] | str, question: str | None = None) -> str:
        """The Search-R1 ``<information>`` text of the top-k passages of every query (`question`: the agent's
        question, for retrievers that compose ``Q [SEP] q``)."""
        queries = [query_list] if isinstance(query_list, str) else [str(q) for q in query_list]
        queries = [q.strip() for q in queries if q and q.strip()]
        if not queries:
            return "No search query given: call search with a non-empty query_list."
        return SearchR1Dialect().format_observation(
            self._client.retrieve(queries, self.topk, questions=[question] * len(queries) if question else None))

    async def create(self, instance_id: str | None = None, create_kwargs: dict[str, Any] | None = None,
                     **kwargs: Any) -> tuple[str, Any]:
        """A new instance keeping the row's question: verl 0.9.1 calls ``create(create_kwargs=...)`` with the row's
        ``tools_kwargs.search.create_kwargs`` (``{"question": ...}``, written by `prepare_verl_run`)."""
        from verl.tools.schemas import ToolResponse

        instance_id = instance_id or str(uuid4())
        self._questions[instance_id] = (create_kwargs or {}).get("question")
        return instance_id, ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> tuple[Any, float, dict]:
        from verl.tools.schemas import ToolResponse

        question = self._questions.get(instance_id)
        try:
            text = await asyncio.to_thread(self.search, parameters.get("query_list", []), question)
        except RetrievalServiceError as error:  # after the client's retries: not an observation (module docstring)
            failure = f"the search of the trajectory of {question!r} failed: {error}"
            return ToolResponse(text=f"Error executing tool '{self.name}': {failure}"), 0.0, {SEARCH_FAILED: failure}
        return ToolResponse(text=text), 0.0, {}

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        return 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        self._questions.pop(instance_id, None)
