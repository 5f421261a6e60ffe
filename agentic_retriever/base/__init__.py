"""The shared base: what the retriever's side and the agent's side both stand on, importing nothing above it.

Model backends (`llm`: transformers, vLLM, OpenAI-compatible HTTP behind one protocol; `encoder`: a
sentence-transformers embedder with prompts, pooling and query composition), the retrieval-client protocol and its
HTTP client (`client`), corpus and JSONL I/O (`corpus`, `jsonl`), QA sets and their metrics (`qa_sources`,
`qa_metrics`), the embedded default stack and its data (`defaults`, `data`), precision, content fingerprints and the
canonical hash (`fingerprint`), child sessions and their guard (`sessions`, `session_guard`), single-writer locks
(`writer_lock`), training curves and checkpoint picking (`curves`, `hf_checkpoints`), and returning freed memory
(`memory_release`). The layers are in docs/architecture.md ("Layers").
"""
