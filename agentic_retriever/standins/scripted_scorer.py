"""The 72B scorer's stand-in in the paper-config dry run (benchmarks/experiments/paper_dry_run/): an OpenAI-compatible
chat server that answers the mining prompts in their formats, so the dry run mines rows on a CPU.

A 135M model cannot stand in: served by `transformers serve`, SmolLM2-135M-Instruct answered 9% of the listwise
windows of Figures 6/7 ("Agentic-R: Learning to Retrieve for Agentic Search", arXiv 2601.11888) in a parsable form
and no Figure 8 sub-answer (benchmarks/RESULTS.md, "The paper config's dry run"), and the loop stopped at
retriever training with one mined row. This server reads each listwise window and scores every passage by the share
of the search query's words it contains (0-100, space-separated, the release's format); a sub-answer prompt gets
"Not Sure" (no sub-answer: every round takes Figure 7). Our OpenAI backend, the parsers, the LR stage, the service's
start and stop and the health check run as they would against `vllm serve`.

    python -m agentic_retriever.standins.scripted_scorer --host 127.0.0.1 --port 8001
"""

from __future__ import annotations

import argparse
import re
import time

import uvicorn
from fastapi import FastAPI, Request

_WINDOW = re.compile(r"\*\*Search Query:\*\*\n(.*?)\n\n\*\*Passages:\*\*\n(.*?)\n\n(?:\*\*Reference Answer|Please output)",
                     re.DOTALL)
_PASSAGE = re.compile(r"Passage \[\d+\] ")
_WORD = re.compile(r"[a-z0-9]{3,}")


def _keywords(text: str) -> set[str]:
    return set(_WORD.findall(text.lower()))


def answer(prompt: str) -> str:
    """The stand-in's reply to one mining prompt."""
    window = _WINDOW.search(prompt)
    if window is None:
        return "<sub-answer> Not Sure </sub-answer>"
    query = _keywords(window.group(1)) or {""}
    passages = [p for p in _PASSAGE.split(window.group(2)) if p.strip()]
    return " ".join(str(round(100 * len(query & _keywords(p)) / len(query))) for p in passages)


def make_app() -> FastAPI:
    app = FastAPI()

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        text = answer(body["messages"][-1]["content"])
        return {"id": "scripted", "object": "chat.completion", "created": int(time.time()), "model": body["model"],
                "choices": [{"index": i, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                            for i in range(body.get("n", 1))]}

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    args = parser.parse_args()
    uvicorn.run(make_app(), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
