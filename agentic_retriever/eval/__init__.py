"""Evaluation of retrievers: retrieval metrics (Recall@k, MRR@k, nDCG@k) on QA files (`retrieval`) and BEIR
datasets (`beir`), the paired bootstrap (`bootstrap`), reports (`report`) and the audit of a mining run against
evidence labels (`mining_audit`, with its records and report; `mine audit`). QA metrics (EM, F1) are shared with the
agent: `agentic_retriever.base.qa_metrics`."""
