"""The embedded search agent: environment, dialects, rewards and RL trainer.

It reaches a retriever only through `agentic_retriever.client.RetrievalClient`.
"""
