"""`agentic-retriever eval retrieval` as a library call: one index on a judged QA file or a BEIR dataset, the
table printed, the report (with per-question metrics) written and, against an earlier report, each metric's
difference with its paired-bootstrap 95% CI (`bootstrap.compare_reports`). Reads evaluation labels (evidence ids
or titles, BEIR qrels): run it on data that training never sees.

    report = run_retrieval_eval(RetrievalEvalConfig(qa="leaf_dev.jsonl", out="eval.json"),
                                lambda: open_index("runs/quickstart/index/minilm-flat"))
"""

from __future__ import annotations

from collections.abc import Callable

from agentic_retriever.base.jsonl import read_json, write_json
from agentic_retriever.index.base import SearchIndex
from .bootstrap import compare_reports
from .report import render_table
from .retrieval import RetrievalEvalConfig, composition_questions, evaluate_retrieval, load_judged_questions

__all__ = ["run_retrieval_eval"]


def run_retrieval_eval(config: RetrievalEvalConfig, open_index: Callable[[], SearchIndex]) -> dict:
    """Evaluate the index `open_index` opens (called once the settings are checked) as `config` says; returns the
    report (also written to ``config.out`` when given)."""
    if bool(config.qa) == bool(config.beir):
        raise ValueError("eval retrieval: give exactly one of --qa FILE (a QA JSONL with supporting_ids or "
                         "supporting_titles) and --beir FOLDER (a BEIR dataset: corpus.jsonl, queries.jsonl, "
                         "qrels/SPLIT.tsv)")
    baseline = read_json(config.compare_to) if config.compare_to else None
    index = open_index()
    if config.beir:
        from .beir import corpus_size_warning, evaluate_beir, load_beir

        if config.compose_with == "parent":
            raise ValueError("eval retrieval: --compose-with parent needs --qa rows with parent_id; BEIR queries "
                             "have no parent question (use none or self)")
        dataset = load_beir(config.beir, config.beir_split)
        if config.compose_with == "self" and index.composition == "query":
            print("note: the index does not compose queries; --compose-with self changes nothing")
        warning = corpus_size_warning(index, dataset)
        if warning:
            print(f"warning: {warning}")
        report = evaluate_beir(index, dataset, config.ks, config.mrr_k, config.ndcg_k, config.batch_size,
                               config.ignore_identical_ids, compose_self=config.compose_with == "self")
        report |= {"index": config.retrieval.index, "beir": config.beir, "split": config.beir_split,
                   "compose_with": config.compose_with}
    else:
        questions = load_judged_questions(config.qa, config.relevance)
        composed = composition_questions(questions, config.compose_with, config.parent_qa)
        if config.compose_with != "none" and index.composition == "query":
            print(f"note: the index does not compose queries; --compose-with {config.compose_with} changes nothing")
        report = evaluate_retrieval(index, questions, config.ks, config.mrr_k, config.ndcg_k, config.batch_size,
                                    composed)
        report |= {"index": config.retrieval.index, "qa": config.qa, "compose_with": config.compose_with}
    print(render_table({config.retrieval.index: report["metrics"]}))
    if config.beir:
        print(f"{report['questions_evaluated']} queries of {config.beir} ({config.beir_split} split) evaluated, "
              f"{report['queries_without_relevant']} of them without a relevant document (scored 0, as in BEIR)")
        if report["qrels_documents_missing_from_index"]:
            print(f"warning: {report['qrels_documents_missing_from_index']} of the {report['qrels_documents']} "
                  "documents the qrels judge are not in the index's corpus (they can never be retrieved)")
    else:
        print(f"{report['questions_evaluated']} questions evaluated, "
              f"{report['questions_skipped_no_relevant_in_corpus']} skipped (no relevant passage in the corpus); "
              f"answer recall over the {report['questions_with_answers']} with golden answers")
    if baseline is not None:
        report["comparison"] = {"to": config.compare_to, "results": compare_reports(baseline, report)}
        print(f"difference to {config.compare_to} (this minus that, paired bootstrap, 95% CI):")
        for metric, r in report["comparison"]["results"].items():
            print(f"  {metric}: {r['mean_a']:.3f} -> {r['mean_b']:.3f}  diff {r['diff']:+.3f} "
                  f"[{r['ci_low']:+.3f}, {r['ci_high']:+.3f}]  p={r['p_value']:.4f}  n={r['n']}")
    if config.out:
        write_json(config.out, report)
        print(f"wrote {config.out}")
    return report
