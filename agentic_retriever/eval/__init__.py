"""Evaluation: retrieval metrics (Recall@k, MRR@k, nDCG@k) on QA files (`retrieval`) and BEIR datasets (`beir`),
QA metrics (`qa`), the paired bootstrap (`bootstrap`), reports (`report`) and the audit of a mining run against
evidence labels (`mining_audit`, with its records and report; `mine audit`)."""
