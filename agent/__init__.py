"""The embedded search agent: environment, dialects, rewards and RL trainer.

It holds a retriever as a `agentic_retriever.base.client.RetrievalClient` and opens one only through
`agentic_retriever.retrieval` (docs/architecture.md, "Layers").
"""
