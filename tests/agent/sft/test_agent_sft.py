"""The agent's supervised warm start: trajectory synthesis, loss masks, training, the cache."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest
import torch

from agent.dialects import SearchR1Dialect
from agent.sft import IGNORE_INDEX, SFTConfig, SFTExample, read_sft_examples, tokenize_example, train_sft, write_sft_examples
from agent.sft import SynthesisConfig, query_phrasings, synthesize_sft_examples
from agentic_retriever.base.client import RetrievalConfig
from agentic_retriever.base.corpus import ScoredPassage
from agentic_retriever.base.jsonl import DataFormatError
from agentic_retriever.base.llm import LLMConfig
from agentic_retriever.base.qa_sources import QARow

EVIDENCE = ScoredPassage("7", "Islamabad", "Islamabad is the capital city of Pakistan. It lies in the north.", 0.9)
OTHER = ScoredPassage("8", "Lahore", "Lahore is the second-largest city of Pakistan.", 0.5)
ROW = QARow("q1", "What is the capital of Pakistan?", ("Islamabad",), ("Islamabad",))


class TableClient:
    """Returns the passages listed for a query (OTHER for any other query) and records the calls."""

    def __init__(self, table: dict[str, list[ScoredPassage]]):
        self.table, self.calls = table, []

    def retrieve(self, queries: Sequence[str], topk: int, questions=None) -> list[list[ScoredPassage]]:
        self.calls.append((list(queries), topk, list(questions or [])))
        return [self.table.get(q, [OTHER])[:topk] for q in queries]


@pytest.fixture(scope="module")
def tokenizer(tiny_causal_lm_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_causal_lm_dir)


def test_phrasings_are_the_question_its_content_words_and_the_title_with_the_rest():
    assert query_phrasings(ROW) == ["What is the capital of Pakistan?", "capital Pakistan", "Islamabad capital Pakistan"]


def test_a_search_that_retrieves_the_evidence_holding_the_answer_becomes_a_trajectory_in_the_dialects_text(tokenizer):
    client = TableClient({"capital Pakistan": [OTHER, EVIDENCE]})
    examples, counts = synthesize_sft_examples([ROW], client, tokenizer, SynthesisConfig(retry_chains=False))
    assert [e.meta["queries"] for e in examples] == [["capital Pakistan"]]
    (ex,) = examples
    dialect = SearchR1Dialect()
    assert ex.prompt.endswith("Question: What is the capital of Pakistan?\n<|im_end|>\n<|im_start|>assistant\n")
    (think_search, True_), (observation, False_), (final, True__) = ex.segments
    assert (True_, False_, True__) == (True, False, True)
    assert think_search.endswith("<search> capital Pakistan </search>")
    assert dialect.parse_action(think_search).queries == ("capital Pakistan",)
    assert observation == dialect.format_observation([[OTHER, EVIDENCE]])
    assert "Islamabad is the capital city of Pakistan." in final
    assert dialect.extract_answer(ex.response) == "Islamabad" and final.endswith("</answer>")
    assert client.calls[0][2] == [ROW.question] * 3, "every phrasing is searched with its original question"
    assert counts["rows_used"] == 1 and counts["examples"] == 1


def test_no_trajectory_when_the_evidence_is_not_retrieved_or_does_not_hold_the_answer(tokenizer):
    without_answer = ScoredPassage("7", "Islamabad", "The city lies at the foot of the Margalla Hills.", 0.9)
    for table in ({}, {"capital Pakistan": [without_answer]}):
        examples, counts = synthesize_sft_examples([ROW], TableClient(table), tokenizer)
        assert examples == [] and counts["rows_used"] == 0


def test_the_answer_must_match_on_word_boundaries(tokenizer):
    row = QARow("q2", "How many moons?", ("4",), ("Islamabad",))
    passage = ScoredPassage("7", "Islamabad", "It has 1234 residents.", 0.9)
    examples, _ = synthesize_sft_examples([row], TableClient({"How many moons?": [passage]}), tokenizer)
    assert examples == []


def test_a_missing_phrasing_followed_by_a_finding_one_becomes_a_two_search_chain(tokenizer):
    client = TableClient({"Islamabad capital Pakistan": [EVIDENCE]})
    examples, counts = synthesize_sft_examples([ROW], client, tokenizer)
    retry = [e for e in examples if e.meta["kind"] == "retry"]
    assert [e.meta["queries"] for e in retry] == [["What is the capital of Pakistan?", "Islamabad capital Pakistan"],
                                                  ["capital Pakistan", "Islamabad capital Pakistan"]]
    generated = [text for text, gen in retry[0].segments if gen]
    assert len(generated) == 3 and "search with other words" in generated[1]
    assert counts["examples_single"] == 1 and counts["examples_retry"] == 2


def test_qagent_trajectories_plan_before_every_search_and_reflect_after_every_observation(tokenizer):
    from agent.dialects import QAgentDialect
    from agent.rewards.qagent import qagent_stage1_reward
    from agent.rewards.qagent_format import check_format

    client = TableClient({"Islamabad capital Pakistan": [EVIDENCE]})
    config = SynthesisConfig(dialect="qagent", topk=1)
    examples, _ = synthesize_sft_examples([ROW], client, tokenizer, config)
    dialect = QAgentDialect()
    assert len(examples) == 3 and all("<plan>" in e.prompt for e in examples)
    for example in examples:  # the single search and both miss-then-find chains
        first = example.segments[0][0]
        assert first.startswith("<plan> I need to find what is the capital of pakistan. </plan>")
        assert dialect.parse_action(first).queries == (example.meta["queries"][0],)
        assert check_format(example.response).valid, check_format(example.response)
        assert qagent_stage1_reward(example.response, ROW.golden_answers) == 1.0
        assert example.segments[1][0] == dialect.format_observation([client.retrieve([example.meta["queries"][0]], 1)[0]])
    with pytest.raises(ValueError, match="written for the dialects qagent, reflect, search_r1; got 's3'"):
        synthesize_sft_examples([ROW], client, tokenizer, SynthesisConfig(dialect="s3"))


def test_qagent_searches_several_phrasings_at_once_with_every_querys_results_in_one_observation(tokenizer):
    from agent.dialects import QAgentDialect
    from agent.rewards.qagent import qagent_stage1_reward
    from agent.rewards.qagent_format import check_format

    client = TableClient({"Islamabad capital Pakistan": [EVIDENCE]})
    config = SynthesisConfig(dialect="qagent", topk=1, queries_per_search=2)
    examples, counts = synthesize_sft_examples([ROW], client, tokenizer, config)
    dialect = QAgentDialect()
    # groups of two phrasings: [as asked, content words] misses, [title + the rest] finds the evidence
    assert [(e.meta["kind"], e.meta["searches"]) for e in examples] == [("single", [1]), ("retry", [2, 1])]
    retry = examples[1]
    first_search = retry.segments[0][0]
    assert dialect.parse_action(first_search).queries == ("What is the capital of Pakistan?", "capital Pakistan")
    assert "<query>What is the capital of Pakistan?</query>\n<query>capital Pakistan</query>\n</search>" in first_search
    assert retry.segments[1][0] == dialect.format_observation([[OTHER], [OTHER]])
    assert check_format(retry.response).valid and qagent_stage1_reward(retry.response, ROW.golden_answers) == 1.0
    assert counts["phrasings_finding_evidence_with_answer"] == 1 and counts["searches"] == 3

    # all three at once: one search, found by its third query; the answer is read from that query's passage
    examples, _ = synthesize_sft_examples([ROW], client, tokenizer, SynthesisConfig(dialect="qagent", topk=1,
                                                                                    queries_per_search=3))
    (only,) = examples
    assert only.meta["searches"] == [3] and "Islamabad is the capital city of Pakistan." in only.segments[2][0]
    assert only.segments[1][0] == dialect.format_observation([[OTHER], [OTHER], [EVIDENCE]])


def test_one_query_per_search_is_all_search_r1_and_reflect_searches_hold(tokenizer):
    for dialect in ("search_r1", "reflect"):
        with pytest.raises(ValueError, match=rf"queries_per_search=2: a '{dialect}' search holds at most 1 query "
                                             r"\(qagent up to 3\)"):
            synthesize_sft_examples([ROW], TableClient({}), tokenizer, SynthesisConfig(dialect=dialect,
                                                                                       queries_per_search=2))
    with pytest.raises(ValueError, match="a 'qagent' search holds at most 3 queries"):
        synthesize_sft_examples([ROW], TableClient({}), tokenizer, SynthesisConfig(dialect="qagent",
                                                                                   queries_per_search=4))
    with pytest.raises(ValueError, match="queries_per_search must be at least 1, got 0"):
        SynthesisConfig(queries_per_search=0)


def test_reflect_trajectories_search_with_keywords_and_reflect_after_every_observation(tokenizer):
    from agent.dialects import get_dialect
    from agent.dialects.reflect import check_shape, search_queries
    from agent.rewards.when_to_search import is_concise

    client = TableClient({"Islamabad capital Pakistan": [EVIDENCE]})
    examples, counts = synthesize_sft_examples([ROW], client, tokenizer, SynthesisConfig(dialect="reflect", topk=1))
    assert [e.meta["queries"] for e in examples] == [["Islamabad capital Pakistan"],
                                                     ["capital Pakistan", "Islamabad capital Pakistan"]]
    assert client.calls[0][0] == ["capital Pakistan", "Islamabad capital Pakistan"], "never the question as asked"
    dialect = get_dialect("reflect")
    for example in examples:
        assert "Please answer the given question by following the structured reasoning protocol" in example.prompt
        shape = check_shape(example.response)
        assert shape.valid and f"x{len(example.meta['queries'])}" in shape.reason, shape
        assert search_queries(example.response) == example.meta["queries"]
        assert all(is_concise(query) for query in example.meta["queries"])
        assert dialect.extract_answer(example.response) == "Islamabad"
    assert counts["examples_direct"] == 0


def test_direct_answers_make_the_configured_share_of_reflect_examples(tokenizer):
    from agent.dialects.reflect import check_shape

    rows = [QARow(f"q{i}", f"What is the capital of country {i}?", (f"City {i}",), ("Islamabad",)) for i in range(8)]
    evidence = {f"capital country {i}": [ScoredPassage(str(i), "Islamabad", f"City {i} is the capital of it.", 0.9)]
                for i in range(8)}
    config = SynthesisConfig(dialect="reflect", topk=1, retry_chains=False, direct_answer_share=0.25)
    examples, counts = synthesize_sft_examples(rows, TableClient(evidence), tokenizer, config)
    direct = [e for e in examples if e.meta["kind"] == "direct"]
    assert counts["examples_single"] == 8 and counts["examples_direct"] == len(direct) == 3  # 3 of 11, nearest 1/4
    for example in direct:
        (turn, generated), = example.segments
        assert generated and "<search>" not in turn and check_shape(turn).reason == "think -> reflect -> answer"
        answer = rows[int(example.meta["question_id"][1:])].golden_answers[0]
        assert turn.endswith(f"<answer> {answer} </answer>")
    searching = next(e for e in examples
                     if (e.meta["kind"], e.meta["question_id"]) == ("single", direct[0].meta["question_id"]))
    assert direct[0].segments[0][0].split(".")[0] == searching.segments[0][0].split(".")[0], \
        "both branches open with the same words: the choice to search is made at one place"
    shuffled, _ = synthesize_sft_examples(rows[::-1], TableClient(evidence), tokenizer, config)
    assert {e.id for e in shuffled if e.meta["kind"] == "direct"} == {e.id for e in direct}, "chosen by id, not order"


def test_direct_answers_need_a_dialect_that_may_answer_without_searching(tokenizer):
    with pytest.raises(ValueError, match="direct_answer_share needs a dialect .*\\(reflect\\); 'qagent' always searches"):
        synthesize_sft_examples([ROW], TableClient({}), tokenizer, SynthesisConfig(dialect="qagent",
                                                                                   direct_answer_share=0.5))
    with pytest.raises(ValueError, match=r"direct_answer_share must be in \[0, 1\), got 1.0"):
        SynthesisConfig(dialect="reflect", direct_answer_share=1.0)


def test_observations_are_cut_to_the_environments_token_budget(tokenizer):
    long = ScoredPassage("7", "Islamabad", "Islamabad is the capital of Pakistan. " + "word " * 400, 0.9)
    config = SynthesisConfig(observation_max_tokens=40, retry_chains=False)
    examples, _ = synthesize_sft_examples([ROW], TableClient({"capital Pakistan": [long]}), tokenizer, config)
    observation = examples[0].segments[1][0]
    assert len(tokenizer.encode(observation, add_special_tokens=False)) <= 40


def test_labels_cover_exactly_the_generated_segments(tokenizer):
    ex = SFTExample("x", "PROMPT ", [("<think> a </think>\n<search> q </search>", True),
                                     ("\n\n<information>Doc 1 text</information>\n\n", False),
                                     ("<answer> b </answer>", True)])
    feature = tokenize_example(tokenizer, ex)
    assert len(feature["input_ids"]) == len(feature["labels"])
    trained = [t for t, label in zip(feature["input_ids"], feature["labels"]) if label != IGNORE_INDEX]
    assert tokenizer.decode(trained) == "<think> a </think>\n<search> q </search><answer> b </answer>"
    assert all(label in (IGNORE_INDEX, t) for t, label in zip(feature["input_ids"], feature["labels"]))


def test_examples_round_trip_and_bad_rows_name_file_line_and_field(tmp_path):
    path = tmp_path / "sft.jsonl"
    ex = SFTExample("x", "P", [("a", True), ("b", False)], {"kind": "single"})
    write_sft_examples(path, [ex])
    assert read_sft_examples(path) == [ex]
    path.write_text(json.dumps({"id": "x", "prompt": "P", "segments": [{"text": "a"}]}) + "\n")
    with pytest.raises(DataFormatError, match=r"sft.jsonl:1: field 'segments\[0\]'"):
        read_sft_examples(path)
    path.write_text(json.dumps({"id": "x", "prompt": "P", "segments": [{"text": "a", "generated": False}]}) + "\n")
    with pytest.raises(DataFormatError, match="no generated segment"):
        read_sft_examples(path)


def _mean_loss(model_dir: str, tokenizer, examples: list[SFTExample]) -> float:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    losses = []
    with torch.no_grad():
        for ex in examples:
            f = tokenize_example(tokenizer, ex)
            losses.append(model(input_ids=torch.tensor([f["input_ids"]]), labels=torch.tensor([f["labels"]])).loss.item())
    return sum(losses) / len(losses)


@pytest.mark.slow
@pytest.mark.parametrize("lora, factor", [(False, 0.8), (True, 0.99)])
def test_training_lowers_the_loss_and_saves_a_plain_hf_model(tmp_path, tiny_causal_lm_dir, tokenizer, lora, factor):
    examples = [SFTExample(str(i), f"Question {i}?\n", [(f"<search> topic {i} </search>", True),
                                                       ("\n\n<information>text</information>\n\n", False),
                                                       ("<answer> yes </answer>", True)]) for i in range(4)]
    config = SFTConfig(epochs=8, learning_rate=1e-2 if lora else 3e-3, batch_size=2,
                       lora=lora, lora_r=4, save_steps=100, logging_steps=1)
    out = train_sft(config, LLMConfig(model=tiny_causal_lm_dir), examples, tmp_path / "agent", extra_manifest={"note": "test"})
    manifest = json.loads((out / "sft_manifest.json").read_text())
    assert manifest["examples_trained"] == 4 and manifest["note"] == "test" and manifest["updates"] == 16
    assert (out / "training_curves.png").stat().st_size > 0 and (out / "metrics.jsonl").read_text().count("loss") >= 1
    assert not (tmp_path / "agent.checkpoints").exists() and not list(tmp_path.glob(".agent*"))
    assert not any(p.name.startswith("adapter") for p in out.iterdir()), "LoRA is merged into a plain model"
    assert _mean_loss(str(out), tokenizer, examples) < factor * _mean_loss(tiny_causal_lm_dir, tokenizer, examples)


@pytest.mark.slow
def test_training_resumes_from_the_last_checkpoint(tmp_path, tiny_causal_lm_dir, monkeypatch):
    from transformers import Trainer

    examples = [SFTExample(str(i), "Q?\n", [(f"<answer> {i} </answer>", True)]) for i in range(4)]
    config = SFTConfig(epochs=2, batch_size=2, save_steps=2, learning_rate=1e-3)
    original_train = Trainer.train
    resumed_from = []

    def crash_after_first_checkpoint(self, resume_from_checkpoint=None, **kwargs):
        resumed_from.append(resume_from_checkpoint)
        if len(resumed_from) == 1:
            self.args.max_steps = 2  # stop after the first checkpoint, as a kill would
            original_train(self, resume_from_checkpoint=resume_from_checkpoint, **kwargs)
            raise KeyboardInterrupt
        return original_train(self, resume_from_checkpoint=resume_from_checkpoint, **kwargs)

    monkeypatch.setattr(Trainer, "train", crash_after_first_checkpoint)
    with pytest.raises(KeyboardInterrupt):
        train_sft(config, LLMConfig(model=tiny_causal_lm_dir), examples, tmp_path / "agent")
    assert not (tmp_path / "agent").exists(), "an interrupted run leaves no model folder"
    out = train_sft(config, LLMConfig(model=tiny_causal_lm_dir), examples, tmp_path / "agent")
    assert resumed_from[0] is None and resumed_from[1].endswith("checkpoint-2")
    assert json.loads((out / "sft_manifest.json").read_text())["updates"] == 4


def test_examples_longer_than_max_length_are_dropped_and_counted(tmp_path, tiny_causal_lm_dir):
    examples = [SFTExample("short", "Q?\n", [("<answer> a </answer>", True)]),
                SFTExample("long", "Q?\n", [("<answer> " + "word " * 200 + "</answer>", True)])]
    config = SFTConfig(epochs=1, batch_size=1, max_length=64)
    out = train_sft(config, LLMConfig(model=tiny_causal_lm_dir), examples, tmp_path / "agent")
    manifest = json.loads((out / "sft_manifest.json").read_text())
    assert (manifest["examples_trained"], manifest["examples_dropped_too_long"]) == (1, 1)


def test_the_warm_started_agent_is_cached_by_its_inputs(tmp_path, tiny_causal_lm_dir, monkeypatch):
    import agent.sft.warm_start as warm_start

    qa = tmp_path / "qa.jsonl"
    qa.write_text(json.dumps({"id": ROW.id, "question": ROW.question, "golden_answers": list(ROW.golden_answers),
                              "supporting_titles": list(ROW.supporting_titles)}) + "\n")
    monkeypatch.setattr(warm_start, "open_client", lambda retrieval: TableClient({"capital Pakistan": [EVIDENCE]}))
    trained = []

    def fake_train(config, agent, examples, out, extra_manifest=None):
        trained.append((config.epochs, len(examples)))
        out.mkdir(parents=True)
        (out / "sft_manifest.json").write_text(json.dumps(extra_manifest))
        return out

    monkeypatch.setattr(warm_start, "train_sft", fake_train)
    config = warm_start.WarmStartConfig(qa=str(qa), retrieval=RetrievalConfig(index="unused"),
                                        agent=LLMConfig(model=tiny_causal_lm_dir))
    first = warm_start.warm_start_agent(config)
    assert warm_start.warm_start_agent(config) == first and len(trained) == 1, "same inputs: reused"
    config.train.gradient_checkpointing = True  # the same weights, computed in less memory
    assert warm_start.warm_start_agent(config) == first and len(trained) == 1, "gradient checkpointing: reused"
    assert len(read_sft_examples(first.with_name(first.name + ".examples.jsonl"))) == 3
    config.train.epochs = 3
    assert warm_start.warm_start_agent(config) != first and len(trained) == 2, "other settings: trained again"
    assert json.loads((first / "sft_manifest.json").read_text())["synthesis_counts"]["examples"] == 3
    config.exclude_qa = str(qa)
    with pytest.raises(ValueError, match="no warm-start trajectory"):
        warm_start.warm_start_agent(config)  # its only question is held out


def recording_trainer(trained: list):
    """A stand-in for `train_sft` that records the examples it gets and writes only the manifest."""
    def fake_train(config, agent, examples, out, extra_manifest=None):
        trained.append(examples)
        out.mkdir(parents=True)
        (out / "sft_manifest.json").write_text(json.dumps(extra_manifest))
        return out

    return fake_train


def _warm_start_setup(tmp_path, tiny_causal_lm_dir, monkeypatch):
    """A warm start whose base model lives inside the cache root (as ``default`` does: the embedded model is
    converted into ``cache_root()/models``), with training replaced by a record of what would be trained."""
    import shutil

    import agent.sft.warm_start as warm_start

    qa = tmp_path / "qa.jsonl"
    qa.write_text(json.dumps({"id": ROW.id, "question": ROW.question, "golden_answers": list(ROW.golden_answers),
                              "supporting_titles": list(ROW.supporting_titles)}) + "\n")
    monkeypatch.setattr(warm_start, "open_client", lambda retrieval: TableClient({"capital Pakistan": [EVIDENCE]}))
    monkeypatch.setenv("AGENTIC_RETRIEVER_CACHE", str(tmp_path / "root-a"))
    base = warm_start.cache_root() / "models" / "base"
    shutil.copytree(tiny_causal_lm_dir, base)
    monkeypatch.setattr(warm_start, "resolve_llm_name", lambda name: str(warm_start.cache_root() / "models" / "base"))
    trained = []
    monkeypatch.setattr(warm_start, "train_sft", recording_trainer(trained))
    config = warm_start.WarmStartConfig(qa=str(qa), retrieval=RetrievalConfig(index="unused"),
                                        agent=LLMConfig(model="default"))
    return warm_start, config, base, trained


def test_the_warm_start_cache_survives_a_moved_cache_root_and_sees_a_base_retrained_in_place(
        tmp_path, tiny_causal_lm_dir, monkeypatch):
    warm_start, config, base, trained = _warm_start_setup(tmp_path, tiny_causal_lm_dir, monkeypatch)
    first = warm_start.warm_start_agent(config)
    assert len(trained) == 1 and first.parent == tmp_path / "root-a" / "agents"
    assert json.loads((first / "sft_manifest.json").read_text())["base_model_fingerprint"].startswith("sha256:")
    # the cache root moves (the base model, inside it, moves along): still a hit
    (tmp_path / "root-a").rename(tmp_path / "root-b")
    monkeypatch.setenv("AGENTIC_RETRIEVER_CACHE", str(tmp_path / "root-b"))
    moved = warm_start.warm_start_agent(config)
    assert len(trained) == 1, "same contents under another root: reused"
    assert moved == tmp_path / "root-b" / "agents" / first.name and (moved / "sft_manifest.json").is_file()
    # the base model retrained in place (same path, same name): trained again
    import torch
    from safetensors.torch import load_file, save_file

    weights = tmp_path / "root-b" / "models" / "base" / "model.safetensors"
    tensors = load_file(weights)
    name = sorted(tensors)[0]
    tensors[name] = tensors[name] + torch.ones_like(tensors[name])
    save_file(tensors, weights, metadata={"format": "pt"})
    retrained = warm_start.warm_start_agent(config)
    assert len(trained) == 2 and retrained != moved
    assert warm_start.warm_start_agent(config) == retrained and len(trained) == 2, "unchanged inputs: reused"
    config.train.logging_steps, config.train.save_steps = 1, 7  # how often it logs and saves: the same weights
    assert warm_start.warm_start_agent(config) == retrained and len(trained) == 2


def test_a_warm_start_cached_by_the_previous_release_is_adopted(tmp_path, tiny_causal_lm_dir, monkeypatch):
    warm_start, config, base, trained = _warm_start_setup(tmp_path, tiny_causal_lm_dir, monkeypatch)
    import dataclasses
    import hashlib

    from agent.sft import data_fingerprint
    from agentic_retriever.base.fingerprint import model_fingerprint

    current = warm_start.warm_start_agent(config)
    # make it what the previous release left: a folder named by its key, a SHA-256 of a text of its own holding
    # the examples' and base model's fingerprints and the settings that change the weights
    settings = {k: v for k, v in dataclasses.asdict(config.train).items()
                if k not in ("report_to", "logging_steps", "save_steps")} | {"dtype": "auto"}
    text = f"v2|{data_fingerprint(trained[0])}|{model_fingerprint(base)}|{json.dumps(settings, sort_keys=True)}"
    legacy_key = hashlib.sha256(text.encode()).hexdigest()[:16]
    legacy = current.with_name(f"sft-{legacy_key}")
    current.rename(legacy)
    current.with_name(current.name + ".examples.jsonl").rename(legacy.with_name(legacy.name + ".examples.jsonl"))
    adopted = warm_start.warm_start_agent(config)
    assert len(trained) == 1, "the previous release's agent is reused, not trained again"
    assert adopted == current and (adopted / "sft_manifest.json").is_file()
    assert adopted.with_name(adopted.name + ".examples.jsonl").is_file()
    assert legacy.resolve() == adopted.resolve(), "the old name still leads to it"
    assert warm_start.warm_start_agent(config) == adopted and len(trained) == 1
