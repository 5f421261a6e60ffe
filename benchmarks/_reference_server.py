"""A per-request retrieval server in the design of Search-R1's own (``search_r1/search/retrieval_server.py`` of
"Search-R1: Training LLMs to Reason and Leverage Search Engines with Reinforcement Learning", arXiv 2503.09516):
the peer that `bench_service.py` measures our service against when no ``--peer-url`` is given.

What it shares with that server, and so what the comparison measures: a synchronous FastAPI endpoint (FastAPI
runs it in its thread pool, so concurrent requests run side by side, each with its own forward pass), a plain
Hugging Face ``AutoModel`` encoder (tokenize, forward, mean pooling, L2 norm) called once per request, one FAISS
search per request, and documents taken from an in-memory list. It serves the same FAISS index, corpus and
encoder weights as the contender (on the same device, in the same precision), so both return the same
passages; only the serving differs. It is written
here from that design, not copied; the real server can be measured as it is with ``--peer-url``.

Not a benchmark itself (run_all.py only runs ``bench_*.py``). Run as a script it serves an index folder in a
process of its own (``bench_service.py --servers process``):

    python benchmarks/_reference_server.py --index DIR --port 8001
"""

from __future__ import annotations

from pydantic import BaseModel

from agentic_retriever.base.defaults import resolve_model_name
from agentic_retriever.index.dense import DenseIndex


class _Query(BaseModel):
    queries: list[str]
    topk: int | None = None
    return_scores: bool = False


class _MeanPoolingEncoder:
    """Queries -> L2-normalised mean-pooled embeddings with a plain transformers model, one call per request."""

    def __init__(self, model_path: str, query_prefix: str, max_length: int, device, dtype):
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.model = AutoModel.from_pretrained(model_path).to(device=device, dtype=dtype).eval()
        self.device, self.prefix, self.max_length = device, query_prefix, max_length

    def encode(self, queries: list[str]):
        torch = self.torch
        inputs = self.tokenizer([self.prefix + q for q in queries], max_length=self.max_length, padding=True,
                                truncation=True, return_tensors="pt").to(self.device)
        with torch.inference_mode():
            hidden = self.model(**inputs).last_hidden_state
        mask = inputs["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled.float(), dim=-1).cpu().numpy()


def create_reference_app(index: DenseIndex, default_topk: int = 3):
    """The per-request peer over `index`'s own FAISS index, corpus and encoder weights."""
    from fastapi import FastAPI

    if index.manifest.dropped:
        raise ValueError(f"the reference server needs an index of every corpus row; {index.index_dir} left "
                         f"{index.manifest.dropped} passages out (built with --drop-empty)")
    settings = index.encoder.settings
    ours = index.encoder.model  # the same device and precision as the contender's encoder
    encoder = _MeanPoolingEncoder(resolve_model_name(settings.model), settings.query_prefix, settings.max_length,
                                  ours.device, next(ours.parameters()).dtype)
    documents = [{"id": p.id, "contents": p.contents} for p in index.corpus.passages_at(list(range(len(index))))]
    app = FastAPI()

    @app.post("/retrieve")
    def retrieve(request: _Query) -> dict:  # sync: FastAPI runs it in its thread pool, one request per call
        k = request.topk or default_topk
        scores, rows = index.index.search(encoder.encode(request.queries), k)
        result = []
        for row_scores, row_ids in zip(scores.tolist(), rows.tolist()):
            docs = [documents[r] for r in row_ids]
            result.append([{"document": d, "score": s} for d, s in zip(docs, row_scores)] if request.return_scores
                          else docs)
        return {"result": result}

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok"}

    return app


def main() -> None:
    import argparse

    import uvicorn

    from agentic_retriever.index import open_index

    parser = argparse.ArgumentParser(description="the per-request reference server over an index folder")
    parser.add_argument("--index", required=True, help="a dense index folder")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--topk", type=int, default=3, help="passages when a request names none")
    args = parser.parse_args()
    uvicorn.run(create_reference_app(open_index(args.index), default_topk=args.topk), host=args.host, port=args.port,
                workers=1)


if __name__ == "__main__":
    main()
