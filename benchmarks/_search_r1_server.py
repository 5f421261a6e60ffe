"""Run Search-R1's own retrieval server (``search_r1/search/retrieval_server.py`` of "Search-R1: Training LLMs to
Reason and Leverage Search Engines with Reinforcement Learning", arXiv 2503.09516) over one of our index folders, as
`bench_service.py --peer-script` measures it: the user's copy of that file, run unmodified.

The script is run as ``__main__`` with its own flags, built from the index folder: ``--index_path`` (the folder's
FAISS file), ``--corpus_path`` (the corpus the index was built from), ``--topk``, ``--retriever_name`` and
``--retriever_model`` (the index's encoder folder; its name decides the script's e5/bge prefixes, and the script
mean-pools and L2-normalises, as the MiniLM and e5 encoders do). Three things a user on a machine without a GPU, or
running a second server, has to change are changed here, from outside the file:

* with no CUDA device, ``Module.cuda``/``Tensor.cuda`` leave the model and its inputs on the CPU and
  ``Module.half`` leaves it in fp32 (the script asks for fp16 on its GPU; fp16 on a CPU is slower, not a setting
  anyone serves with), so both servers encode in fp32 on the same CPU;
* ``uvicorn.run`` listens on 127.0.0.1 and the ``--port`` given here (the script fixes 0.0.0.0:8000);
* the datasets library caches the corpus in a temporary folder (``HF_DATASETS_CACHE``), not the user's cache,
  removed when the server stops.

Not a benchmark itself (run_all.py only runs ``bench_*.py``).

    python benchmarks/_search_r1_server.py --script Search-R1/search_r1/search/retrieval_server.py \\
        --index runs/quickstart/index/minilm-flat --port 8001
"""

from __future__ import annotations

import argparse
import os
import runpy
import signal
import sys
import tempfile
from pathlib import Path


def script_arguments(index_dir: str, topk: int) -> list[str]:
    """The script's own flags for the index folder `index_dir`: its FAISS file, corpus and encoder."""
    from agentic_retriever.base.defaults import resolve_model_name
    from agentic_retriever.index.generations import FAISS_FILE
    from agentic_retriever.index.manifest import IndexManifest

    manifest = IndexManifest.load(index_dir)
    if manifest.backend != "dense" or not manifest.encoder:
        raise SystemExit(f"{index_dir} is a {manifest.backend} index: Search-R1's dense server needs a dense one")
    model = manifest.encoder["model"]
    model_dir = resolve_model_name(model)
    return ["--index_path", str(manifest.data_folder(index_dir) / FAISS_FILE), "--corpus_path", manifest.corpus_path,
            "--topk", str(topk), "--retriever_name", Path(model if model != "default" else model_dir).name,
            "--retriever_model", model_dir]


def keep_on_cpu() -> None:
    """With no CUDA device: ``.cuda()`` on modules and tensors is a no-op and ``Module.half()`` keeps fp32."""
    import torch

    if torch.cuda.is_available():
        return
    torch.nn.Module.cuda = lambda self, *args, **kwargs: self
    torch.nn.Module.half = lambda self: self
    torch.Tensor.cuda = lambda self, *args, **kwargs: self


def listen_on(port: int) -> None:
    """Make the script's ``uvicorn.run(app, host=..., port=...)`` listen on 127.0.0.1:`port`."""
    import uvicorn

    run = uvicorn.run

    def run_here(app, *args, **kwargs):
        kwargs.update(host="127.0.0.1", port=port)
        kwargs.setdefault("log_level", "warning")
        return run(app, **kwargs)

    uvicorn.run = run_here


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--script", required=True, help="Search-R1's search_r1/search/retrieval_server.py")
    parser.add_argument("--index", required=True, help="one of our dense index folders")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--topk", type=int, default=3)
    args = parser.parse_args()
    script = Path(args.script).resolve()
    if not script.is_file():
        raise SystemExit(f"--script {args.script}: no such file")
    sys.argv = [str(script), *script_arguments(args.index, args.topk)]
    keep_on_cpu()
    listen_on(args.port)
    sys.path.insert(0, str(script.parent))
    # uvicorn stops on SIGTERM and then raises it again with the handler it found: this one, so the cache is removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with tempfile.TemporaryDirectory(prefix="search-r1-datasets-") as cache:
        os.environ.setdefault("HF_DATASETS_CACHE", cache)
        runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
