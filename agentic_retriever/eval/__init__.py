"""Evaluation: retrieval metrics (Recall@k, MRR@k, nDCG@k) on QA files (`retrieval`) and BEIR datasets (`beir`),
QA metrics (`qa`), the paired bootstrap (`bootstrap`) and reports (`report`)."""
