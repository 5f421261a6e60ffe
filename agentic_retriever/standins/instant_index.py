"""The retrieval service over an index whose search costs nothing: what `bench_service.py --mode overhead` measures,
the service's own CPU per request (HTTP, validation, batching, passage lookup, rendering), which RL rollouts' many
small requests take from the encoder on the same cores.

`InstantIndex` answers every query with the corpus rows after the previous answer's (no encoder, no FAISS), over
the corpus of an index folder, and `agentic_retriever.server.serve` serves it with the service's defaults, as
``agentic-retriever index serve`` serves a real index.

    python -m agentic_retriever.standins.instant_index --index runs/quickstart/index/minilm-flat --port 8001
"""

from __future__ import annotations

import argparse

import numpy as np

from agentic_retriever.index import open_index
from agentic_retriever.index.base import SearchIndex
from agentic_retriever.server import serve


class InstantIndex(SearchIndex):
    """The passages of `index`'s corpus in turn, found in no time: scores 1, rows following on from call to call."""

    def __init__(self, index: SearchIndex):
        super().__init__(index.manifest, index.corpus, index.index_dir)
        self.next_row = 0

    def search_rows(self, queries, k, questions=None, histories=None):
        rows = (self.next_row + np.arange(len(queries) * k).reshape(len(queries), k)) % len(self.corpus)
        self.next_row = int(rows[-1, -1]) + 1
        return np.ones(rows.shape, dtype=np.float32), rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", required=True, help="an index folder: its corpus is served")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    serve(InstantIndex(open_index(args.index)), port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
