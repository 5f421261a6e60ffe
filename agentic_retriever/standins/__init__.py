"""Servers that stand in for costly parts, so that a path runs its real code on a small machine.

* `instant_index`: the retrieval service over an index whose search costs nothing (what the service itself
  costs per request, `benchmarks/bench_service.py --mode overhead`).
* `scripted_scorer`: an OpenAI-compatible chat server answering the mining prompts in their formats, the
  72B scorer's stand-in in the paper config's dry run (`benchmarks/experiments/paper_dry_run/`).
* `decoder_embedder`: a random-weight decoder embedder of Qwen3-Embedding's architecture (a toy size or
  Qwen3-Embedding-0.6B's), for the tests, the dry run and the GPU check, where its weights cannot be downloaded.

Each runs as ``python -m agentic_retriever.standins.NAME``; tests import them as any module.
"""
