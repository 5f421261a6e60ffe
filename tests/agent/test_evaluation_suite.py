"""`eval suite`: the agent over several QA sets into the paper's Table 1 (per-dataset EM, F1, searches, Avg.)."""

from __future__ import annotations

import json

import pytest

from agent.evaluation_suite import PAPER_QA, SuiteConfig, run_suite
from agentic_retriever.app.cli import main
from agentic_retriever.base.encoder import EncoderConfig
from agentic_retriever.base.qa_sources import parse_qa_sources
from agentic_retriever.index import IndexBuildConfig, build_index
from tests.fakes import FakeAgent, make_world, synthetic_rows, write_jsonl

def qa(path, dataset_rows):
    return write_jsonl(path, [{"id": f"dev_{i}", "question": q, "golden_answers": [a]} for i, (q, a) in enumerate(dataset_rows)])


def test_the_table_holds_each_datasets_scores_and_their_plain_mean(tmp_path):
    # FakeAgent searches once, then answers what the latest passage says: every search here finds "ANSWER=Paris"
    world = make_world({"misc facts": [(90, "Paris")] * 3})
    hotpot = qa(tmp_path / "hotpotqa" / "dev.jsonl", [("Capital of France?", "Paris"), ("Capital of Peru?", "Lima")])
    nq = qa(tmp_path / "nq" / "test.jsonl", [("Where is the Louvre?", "Paris"), ("Capital of Norway?", "Oslo"),
                                            ("Seat of the French government?", "Paris"), ("Capital of Chile?", "Santiago")])
    popqa = qa(tmp_path / "popqa" / "test.jsonl", [("Largest city of France?", "Paris")])
    config = SuiteConfig(qa=f"{nq},{popqa},{hotpot}", out=str(tmp_path / "suite"), per_dataset=3)
    report = run_suite(config, llm=FakeAgent(), client=world)
    assert list(report["datasets"]) == ["hotpotqa", "nq", "popqa"]  # the paper's column order, not the input's
    ems = {name: d["em"] for name, d in report["datasets"].items()}
    assert ems == {"hotpotqa": 0.5, "nq": pytest.approx(2 / 3), "popqa": 1.0}
    assert {name: d["questions"] for name, d in report["datasets"].items()} == {"hotpotqa": 2, "nq": 3, "popqa": 1}
    assert report["average"]["em"] == pytest.approx((0.5 + 2 / 3 + 1.0) / 3)  # unweighted, as the paper's Avg.
    assert all(d["searches"] == 1.0 for d in report["datasets"].values())
    table = (tmp_path / "suite" / "suite.md").read_text()
    assert "|  | HotpotQA | NQ | PopQA | Avg. |" in table and "| EM | 50.00 | 66.67 | 100.00 | 72.22 |" in table
    assert json.loads((tmp_path / "suite" / "suite.json").read_text()) == report

    agent = FakeAgent()
    assert run_suite(config, llm=agent, client=world) == report and agent.calls == [], "a rerun reuses the rollouts"
    agent = FakeAgent()
    with pytest.raises(ValueError, match="another QA set"):  # refused before any rollout
        run_suite(SuiteConfig(qa=f"{nq},{popqa},{hotpot}", out=str(tmp_path / "suite"), per_dataset=1),
                  llm=agent, client=world)
    assert agent.calls == []


def test_the_default_qa_is_the_papers_seven_flashrag_splits_as_search_r1_evaluates():
    sources = parse_qa_sources(PAPER_QA)
    assert [(s.location, s.config, s.split) for s in sources] == [
        ("RUC-NLPIR/FlashRAG_datasets", name, split) for name, split in (
            ("hotpotqa", "dev"), ("2wikimultihopqa", "dev"), ("musique", "dev"), ("bamboogle", "test"),
            ("nq", "test"), ("triviaqa", "test"), ("popqa", "test"))]


def test_eval_suite_runs_end_to_end_with_a_real_model_index_and_fanoutqa_stand_ins(tmp_path, tiny_model_dir,
                                                                                  tiny_causal_lm_dir, capsys):
    """The default stack's shape: a dense index over a small corpus, the transformers backend, and two FanOutQA
    files standing in for the paper's sets (a random-weight model answers nothing: the mechanism is tested)."""
    corpus = write_jsonl(tmp_path / "corpus.jsonl", synthetic_rows(30))
    build_index(IndexBuildConfig(corpus=str(corpus), out=str(tmp_path / "index"), encoder=EncoderConfig(model=tiny_model_dir)))
    leaf = qa(tmp_path / "fanoutqa_leaf_dev.jsonl", [("Which river is near the castle?", "river"), ("Item 7?", "reef"),
                                                    ("Item 9?", "x")])
    multihop = qa(tmp_path / "fanoutqa_multihop_dev.jsonl", [("Which comet passed the glacier?", "comet")])
    out = tmp_path / "suite"
    main(["eval", "suite", "--qa", f"leaf={leaf},multihop={multihop}", "--index", str(tmp_path / "index"),
          "--agent.model", tiny_causal_lm_dir, "--agent.backend", "transformers", "--agent.device", "cpu",
          "--env.max-turns", "1", "--env.max-new-tokens-per-turn", "6", "--per-dataset", "2", "--out", str(out)])
    printed = capsys.readouterr().out
    assert "|  | leaf | multihop | Avg. |" in printed and "| questions | 2 | 1 | |" in printed
    report = json.loads((out / "suite.json").read_text())
    assert report["questions"] == 3 and report["retriever"] == str(tmp_path / "index")
    trajectories = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert [t["question_id"] for t in trajectories] == ["leaf/dev_0", "leaf/dev_1", "multihop/dev_0"]
