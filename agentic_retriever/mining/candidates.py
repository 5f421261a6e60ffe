"""Stage 2: candidate passages of each round from the current retriever R_{i-1} ("Agentic-R: Learning to
Retrieve for Agentic Search", section 4.1.1: |P_i| = 20).

The round's query goes to the retrieval client with its original question, exactly as the agent's own
searches do (`agent.env`): a retriever trained on ``Q [SEP] q`` composes its input itself (the server's
``questions`` extension, or the index's composition in process), a plain one ignores the question. So
candidates come from the retriever with its own query composition, as the agent saw it.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentic_retriever.base.client import RetrievalClient
from agentic_retriever.base.corpus import ScoredPassage
from .rounds import Round

__all__ = ["passage_from_record", "passage_record", "retrieve_candidates"]


def retrieve_candidates(client: RetrievalClient, rounds: Sequence[Round], k: int) -> list[list[ScoredPassage]]:
    """Per round, up to `k` passages for its query, best first (one client call; the client batches)."""
    if k < 1:
        raise ValueError(f"the number of candidates must be at least 1, got {k}")
    if not rounds:
        return []
    results = client.retrieve([r.query for r in rounds], topk=k, questions=[r.question for r in rounds])
    if len(results) != len(rounds):
        raise RuntimeError(f"the retrieval client answered {len(results)} result lists for {len(rounds)} queries")
    return [list(hits) for hits in results]


def passage_record(passage: ScoredPassage) -> dict:
    return {"id": passage.id, "title": passage.title, "text": passage.text, "score": float(passage.score)}


def passage_from_record(record: dict) -> ScoredPassage:
    return ScoredPassage(record["id"], record["title"], record["text"], record["score"])
