"""The loop's evaluation step (`steps.evaluate_iteration`) on the paper's data: FlashRAG QA rows carry no evidence
labels and no parent question, and the retriever composes ``Q [SEP] q``."""

from __future__ import annotations

import pytest

from agentic_retriever.app.loop.config import LoopConfig, LoopEvalConfig, LoopJob
from agentic_retriever.app.loop.report import _retriever_metrics
from agentic_retriever.app.loop.steps import evaluate_iteration
from agentic_retriever.base.client import RetrievalConfig
from agentic_retriever.base.encoder import EncoderConfig
from agentic_retriever.index import IndexBuildConfig, build_index, open_index
from tests.fakes import synthetic_rows, write_jsonl

#: FlashRAG's row format (``{id, question, golden_answers, metadata}``), as in its hotpotqa/dev.jsonl.
FLASHRAG_DEV = [
    {"id": "dev_0", "question": "Which river holds item 3?", "golden_answers": ["item 3"], "metadata": {"type": "x"}},
    {"id": "dev_1", "question": "Where does the glacier hold item 7?", "golden_answers": ["item 7"], "metadata": {}},
    {"id": "dev_2", "question": "Is the comet near the glacier?", "golden_answers": ["yes"], "metadata": {}},
]


@pytest.fixture
def composing_index(tmp_path, tiny_model_dir, monkeypatch) -> tuple[str, list]:
    """A dense index whose encoder composes ``Q [SEP] q``, and a record of every (queries, questions) it searched."""
    corpus = write_jsonl(tmp_path / "wiki-18.jsonl", synthetic_rows(40))
    encoder = EncoderConfig(model=tiny_model_dir, composition="question_sep_query", precision="fp32")
    build_index(IndexBuildConfig(corpus=str(corpus), out=str(tmp_path / "index"), encoder=encoder,
                                 corpus_cache=str(tmp_path / "cache")))
    searched = []

    def recording_open(path, *args, **kwargs):
        index = open_index(path, *args, **kwargs)
        search = index.search

        def spy(queries, k, questions=None, **rest):
            searched.append((list(queries), None if questions is None else list(questions)))
            return search(queries, k, questions=questions, **rest)

        index.search = spy
        return index

    monkeypatch.setattr("agentic_retriever.index.open_index", recording_open)
    return str(tmp_path / "index"), searched


def test_the_loop_evaluates_flashrag_rows_by_answer_recall_composing_each_with_its_own_question(tmp_path,
                                                                                                composing_index):
    index, searched = composing_index
    dev = write_jsonl(tmp_path / "hotpotqa_dev.jsonl", FLASHRAG_DEV)
    job = LoopJob(loop=LoopConfig(eval=LoopEvalConfig(leaf_qa=str(dev), multihop_qa=str(dev), agent_qa=str(dev),
                                                      agent_questions=0, ks=[1, 5, 20])),
                  agent_train=None, rollout=None, mine=None, train=None, index=None)
    report = evaluate_iteration(job, index, index, "unused-agent", tmp_path / "eval")
    new = report["retrieval"]["new"]
    assert new["leaf_judged_by"] == new["multihop_judged_by"] == "answers" and not new["composed_with_parent"]
    assert set(new["leaf"]) == {"answer_recall@1", "answer_recall@5", "answer_recall@20"}
    assert new["leaf_questions"] == 2  # the yes/no row has no answer to look for
    leaf_searches = [call for call in searched if call[1] is not None]
    assert leaf_searches and all(questions == queries for queries, questions in leaf_searches)  # Q = q
    assert _retriever_metrics(new) == {**new["leaf"], "multihop_answer_recall@20": new["multihop"]["answer_recall@20"]}


def test_the_agent_is_reported_per_dataset_as_the_papers_tables(tmp_path, composing_index, monkeypatch):
    """A merged dev set (rows with ``dataset``) gives EM and F1 per dataset; a FlashRAG file without the field
    counts under its file's name; the report's table has one column pair per dataset."""
    from agent.rollouts import RolloutConfig
    from agentic_retriever.app.loop.report import _dataset_table
    from agentic_retriever.app.loop.steps import _agent
    from tests.fakes import FakeAgent

    monkeypatch.setattr("agentic_retriever.base.llm.load_llm", lambda config: FakeAgent())
    monkeypatch.setattr("agentic_retriever.index.open_index", open_index)  # the agent searches the plain index
    index, _ = composing_index
    merged = write_jsonl(tmp_path / "dev_merged.jsonl", [dict(row, dataset=name) for row, name in
                                                         zip(FLASHRAG_DEV, ("nq", "hotpotqa", "nq"))])
    job = LoopJob(loop=LoopConfig(eval=LoopEvalConfig(agent_qa=str(merged), agent_questions=3)), agent_train=None,
                  rollout=RolloutConfig(), mine=None, train=None, index=None)
    result = _agent(job, "fake-agent", RetrievalConfig(index=index), tmp_path / "merged.jsonl")
    assert {name: group["questions"] for name, group in result["by_dataset"].items()} == {"hotpotqa": 1, "nq": 2}
    assert all(0 <= group["em"] <= group["f1"] <= 1 for group in result["by_dataset"].values())

    plain = write_jsonl(tmp_path / "hotpotqa_dev.jsonl", FLASHRAG_DEV)
    job = LoopJob(loop=LoopConfig(eval=LoopEvalConfig(agent_qa=str(plain), agent_questions=2)), agent_train=None,
                  rollout=RolloutConfig(), mine=None, train=None, index=None)
    plain_report = _agent(job, "fake-agent", RetrievalConfig(index=index), tmp_path / "plain.jsonl")
    assert list(plain_report["by_dataset"]) == ["hotpotqa_dev"]

    row = {"iteration": 1, "agent_with_previous_retriever": {"by_dataset": {"nq": {"questions": 2, "em": 0.5,
                                                                                   "f1": 0.6}}},
           "agent_with_new_retriever": {"by_dataset": {"nq": {"questions": 2, "em": 1.0, "f1": 1.0},
                                                       "hotpotqa": {"questions": 1, "em": 0.0, "f1": 0.25}}}}
    table = _dataset_table([row])
    assert "| iteration | hotpotqa EM (R_i-1 / R_i) | nq EM (R_i-1 / R_i) | hotpotqa F1 | nq F1 |" in table
    assert "| 1 |  / 0.000 | 0.500 / 1.000 |  / 0.250 | 0.600 / 1.000 |" in table
