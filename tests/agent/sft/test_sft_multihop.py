"""Multi-search warm-start trajectories from decomposition trees (agent.sft.multihop)."""

from __future__ import annotations

import json

import pytest

from agent.dialects import SearchR1Dialect
from agent.env import cut_to_tokens
from agent.sft import SynthesisConfig
from agent.sft.multihop import read_multihop_rows, synthesize_multihop_examples
from agentic_retriever.base.client import RetrievalConfig
from agentic_retriever.base.corpus import ScoredPassage
from agentic_retriever.base.jsonl import DataFormatError
from agentic_retriever.base.llm import LLMConfig
from tests.agent.sft.test_agent_sft import OTHER, TableClient, recording_trainer

LIST_PAGE = ScoredPassage("1", "Nordic countries", "The Nordic countries are Denmark, Finland and Norway.", 0.9)
OSLO = ScoredPassage("2", "Norway", "Norway is a country. Its capital is Oslo, on a fjord.", 0.8)
NOISE = ScoredPassage("3", "Sweden", "Sweden is a country in Scandinavia.", 0.1)
QUESTION = "What are the capitals of the Nordic countries?"


def _write(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture()
def files(tmp_path):
    leaves = _write(tmp_path / "leaves.jsonl", [
        {"id": "p-1", "question": "Which are the Nordic countries?", "golden_answers": ["Denmark, Finland, Norway"],
         "answer_parts": [["Denmark"], ["Finland"], ["Norway"]], "supporting_titles": ["Nordic countries"],
         "parent_id": "p"},
        {"id": "p-2", "question": "What is the capital of Norway?", "golden_answers": ["Oslo"],
         "supporting_titles": ["Norway"], "parent_id": "p"},
        {"id": "p-3", "question": "What is the capital of Denmark?", "golden_answers": ["Copenhagen"],
         "supporting_titles": ["Denmark"], "parent_id": "p"},
        {"id": "s-1", "question": "Who wrote Hamlet?", "golden_answers": ["Shakespeare"], "parent_id": "s"}])
    multihop = _write(tmp_path / "multihop.jsonl", [
        {"id": "p", "question": QUESTION, "golden_answers": ["Norway: Oslo, Denmark: Copenhagen"],
         "leaf_ids": ["p-1", "p-2", "gone", "p-3"]},
        {"id": "s", "question": "Who wrote Hamlet, really?", "golden_answers": ["Shakespeare"], "leaf_ids": ["s-1"]}])
    return multihop, leaves


@pytest.fixture(scope="module")
def tokenizer(tiny_causal_lm_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_causal_lm_dir)


def test_rows_keep_tree_order_skip_missing_leaves_and_count_answer_parts(files, tmp_path):
    multihop, leaves = files
    rows = read_multihop_rows(multihop, leaves)
    assert [leaf.id for leaf in rows[0].leaves] == ["p-1", "p-2", "p-3"]  # "gone" is not among the leaves
    assert rows[0].leaves[0].golden_answers == ("Denmark, Finland, Norway", "Denmark", "Finland", "Norway")
    bad = _write(tmp_path / "bad.jsonl", [{"id": "x", "question": "Q?", "golden_answers": ["a"]}])
    with pytest.raises(DataFormatError, match=r"bad.jsonl:1: field .leaf_ids."):
        read_multihop_rows(bad, leaves)


def test_a_multihop_question_searches_its_parts_one_by_one_and_reads_each_observation(files, tokenizer):
    multihop, leaves = files
    client = TableClient({"Nordic countries": [LIST_PAGE, NOISE], "capital Norway": [NOISE, OSLO]})
    examples, counts = synthesize_multihop_examples(read_multihop_rows(multihop, leaves), client, tokenizer,
                                                    SynthesisConfig(topk=2))
    (ex,) = examples  # a question with a single leaf is not a multi-search question
    assert counts == {"rows": 2, "rows_used": 1, "searches": 3, "leaves_found": 2, "leaves_skipped": 0,
                      "leaves_with_unread_names": 0, "examples_multihop": 1, "examples": 1}
    dialect = SearchR1Dialect()
    assert ex.prompt.endswith(f"Question: {QUESTION}\n<|im_end|>\n<|im_start|>assistant\n")
    turns = [text for text, generated in ex.segments if generated]
    observations = [text for text, generated in ex.segments if not generated]
    # keyword queries, the natural phrasing first: "Nordic countries" finds the list page with a part of the answer
    assert [dialect.parse_action(t).queries for t in turns[:3]] == [("Nordic countries",), ("capital Norway",),
                                                                   ("capital Denmark",)]
    assert observations == [dialect.format_observation([[LIST_PAGE, NOISE]]), dialect.format_observation([[NOISE, OSLO]]),
                            dialect.format_observation([[OTHER]])]
    # each turn reads the previous observation: a sub-answer's sentence when retrieved, else that it was not found
    assert "First, which are the nordic countries." in turns[0]
    assert "The passage about Nordic countries says: The Nordic countries are Denmark, Finland and Norway." in turns[1]
    assert "Its capital is Oslo, on a fjord." in turns[2] and "Next, what is the capital of denmark." in turns[2]
    assert "The results do not say what is the capital of denmark." in turns[3]
    assert dialect.extract_answer(ex.response) == "Norway: Oslo, Denmark: Copenhagen"
    assert ex.meta["queries"] == ["Nordic countries", "capital Norway", "capital Denmark"]
    # one retrieval call per search, each with every candidate query of the leaf, sent with the multi-hop question
    # (a Q [SEP] q retriever composes it)
    assert [queries[0] for queries, _, _ in client.calls] == ex.meta["queries"]
    for queries, topk, questions in client.calls:
        assert topk == 2 and questions == [QUESTION] * len(queries)


def test_the_searched_phrasing_is_the_first_that_finds_the_evidence_and_searches_are_capped(files, tokenizer):
    multihop, leaves = files
    # the keyword query misses Norway's page; the question as asked finds it
    client = TableClient({"What is the capital of Norway?": [OSLO]})
    (ex,), counts = synthesize_multihop_examples(read_multihop_rows(multihop, leaves), client, tokenizer,
                                                 SynthesisConfig(max_searches=2))
    assert ex.meta["queries"] == ["Nordic countries", "What is the capital of Norway?"]
    assert counts["searches"] == 2 and counts["leaves_found"] == 1
    with pytest.raises(ValueError, match="max_searches must be at least 2"):
        SynthesisConfig(max_searches=1)
    with pytest.raises(ValueError, match="search_r1 dialect"):
        synthesize_multihop_examples([], client, tokenizer, SynthesisConfig(dialect="qagent"))


def test_grounded_steps_name_only_what_the_agent_has_read(files, tokenizer):
    multihop, leaves = files
    rows = read_multihop_rows(multihop, leaves)
    grounded = SynthesisConfig(topk=2, grounded_steps=True)
    # the list page names Norway and Denmark: their leaves are planned and searched as they stand
    read = TableClient({"Nordic countries": [LIST_PAGE, NOISE], "capital Norway": [NOISE, OSLO]})
    (ex,), counts = synthesize_multihop_examples(rows, read, tokenizer, grounded)
    assert ex.meta["queries"] == ["Nordic countries", "capital Norway", "capital Denmark"]
    assert counts["leaves_with_unread_names"] == 0 and counts["leaves_skipped"] == 0
    # the first search misses: the agent has not read which countries they are, so the next part is "each one",
    # searched without the name (no phrasing naming Norway, its evidence title included, is tried); the third
    # part would repeat that query, so it is not searched
    unread = TableClient({})
    (ex,), counts = synthesize_multihop_examples(rows, unread, tokenizer, grounded)
    turns = [text for text, generated in ex.segments if generated]
    assert ex.meta["queries"] == ["Nordic countries", "capital"]
    assert "Next, what is the capital of each one." in turns[1] and "<answer>" in turns[2]
    assert "The results do not say what is the capital of each one." in turns[2]
    assert not any("Norway" in query for queries, _, _ in unread.calls for query in queries)
    assert counts["searches"] == 2 and counts["leaves_skipped"] == 1 and counts["leaves_with_unread_names"] == 1
    # without grounding the same misses still name Norway and Denmark, as the decomposition tree does
    (ex,), _ = synthesize_multihop_examples(rows, TableClient({}), tokenizer, SynthesisConfig(topk=2))
    assert ex.meta["queries"] == ["Nordic countries", "capital Norway", "capital Denmark"]


@pytest.mark.parametrize("question, names, expected", [
    ("Where did Ketanji Brown Jackson study law?", {"Ketanji"}, "Where did each one study law?"),
    ("When was The Writing's on the Wall released?", {"Wall"}, "When was each one released?"),
    ("What is the height of the Hyundai Ioniq 5 in inches?", {"Ioniq"}, "What is the height of each one in inches?"),
    ("When was 8 Days of Christmas released in the US?", {"Christmas"}, "When was each one released in the US?"),
    ("What is the capital of Norway?", {"Denmark"}, "What is the capital of Norway?"),
])
def test_a_name_holding_an_unread_word_is_replaced_whole(question, names, expected):
    from agent.sft.multihop import _without_names

    assert _without_names(question, names, "each one") == expected


def test_observations_are_cut_as_the_environment_cuts_them(files, tokenizer):
    multihop, leaves = files
    long = ScoredPassage("9", "Long", "word " * 400, 0.5)
    client = TableClient({"Nordic countries": [long]})
    (ex,), _ = synthesize_multihop_examples(read_multihop_rows(multihop, leaves), client, tokenizer,
                                            SynthesisConfig(observation_max_tokens=40))
    expected, _ = cut_to_tokens(tokenizer, SearchR1Dialect().format_observation([[long]]), 40)
    assert ex.segments[1] == (expected, False)


def test_the_warm_start_adds_multihop_trajectories_when_given_the_questions(files, tmp_path, tiny_causal_lm_dir,
                                                                              monkeypatch):
    import agent.sft.warm_start as warm_start

    multihop, leaves = files
    monkeypatch.setattr(warm_start, "open_client", lambda retrieval: TableClient({"capital Norway": [OSLO]}))
    trained = []
    monkeypatch.setattr(warm_start, "train_sft", recording_trainer(trained))
    config = warm_start.WarmStartConfig(qa=str(leaves), multihop_qa=str(multihop), out=str(tmp_path / "agent"),
                                        retrieval=RetrievalConfig(index="unused"),
                                        agent=LLMConfig(model=tiny_causal_lm_dir),
                                        synthesis=SynthesisConfig(retry_chains=False))
    out = warm_start.warm_start_agent(config)
    kinds = sorted(example.meta["kind"] for example in trained[0])
    assert kinds == ["multihop", "single"]  # the leaf "capital of Norway" alone, and the multi-hop question
    counts = json.loads((out / "sft_manifest.json").read_text())["synthesis_counts"]
    assert counts["examples"] == 2 and counts["multihop_examples"] == 1 and counts["multihop_leaves_found"] == 1
