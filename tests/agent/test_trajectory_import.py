"""`agent import`: verl rollout dumps, Search-R1 responses and the release's step-1 output become trajectories that
mining reads as its own (the same rows as the trajectories they were written from)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agent.dialects.search_r1 import INVALID_ACTION_MESSAGE, PROMPT_TEMPLATE
from agent.trajectory import Trajectory, read_trajectories
from agent.trajectory_import import ImportConfig, import_trajectories, split_response
from agentic_retriever.app.cli import main
from agentic_retriever.base.jsonl import DataFormatError, read_json
from agentic_retriever.mining import mine
from tests.fakes import FakeAgent, FakeScorer, write_jsonl
from tests.mining.test_mining_pipeline import WORLD, config, trajectories

SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


def search_r1_prompt(question: str) -> str:
    return PROMPT_TEMPLATE.format(question=question if question.endswith("?") else question + "?")


def qa_file(tmp_path, items: list[Trajectory]):
    return write_jsonl(tmp_path / "qa.jsonl", [{"id": t.question_id, "question": t.question,
                                                "golden_answers": t.golden_answers} for t in items])


def write_verl_dump(folder, items: list[Trajectory]) -> None:
    """verl's _log_rollout_data: the prompt and response decoded without special tokens, gts = ground_truth."""
    rows = [{"input": f"system\n{SYSTEM}\nuser\n{search_r1_prompt(t.question)}\nassistant\n",
             "output": t.response_text, "gts": {"target": t.golden_answers}, "score": t.em, "step": 3}
            for t in items]
    write_jsonl(folder / "3.jsonl", rows)


def write_search_r1_generation(path, items: list[Trajectory]) -> None:
    """main_generation's parquet: Search-R1's data columns plus `responses`, one text per sample."""
    pq.write_table(pa.Table.from_pylist([
        {"id": f"train_{i}", "question": t.question, "golden_answers": t.golden_answers, "data_source": "nq",
         "prompt": [{"role": "user", "content": search_r1_prompt(t.question)}], "ability": "fact-reasoning",
         "reward_model": {"style": "rule", "ground_truth": {"target": t.golden_answers}},
         "extra_info": {"split": "train", "index": i}, "responses": [t.response_text]}
        for i, t in enumerate(items)]), path)


def write_release_step1(path, items: list[Trajectory]) -> None:
    """The release's SearchR1Pipeline, saved by FlashRAG: stripped turns, its own <information> layout, and each
    search's docs (corpus id and contents) in output.retrieval_results."""
    data = []
    for t in items:
        prompt = (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{search_r1_prompt(t.question)}"
                  "<|im_end|>\n<|im_start|>assistant\n")
        results = {}
        for turn in t.turns:
            prompt += turn.text.strip()
            if turn.retrieved:
                passages = [WORLD.corpus[i] for i in turn.retrieved[0].ids]
                docs = "".join(f"Doc {k}(Title: \"{p.title}\") {p.text}\n" for k, p in enumerate(passages, start=1))
                prompt += f"\n\n<information>\n{docs}\n</information>\n\n"
                results[str(len(results))] = {"query": turn.queries[0], "query_for_retrieval": turn.queries[0],
                                              "docs": [{"id": p.id, "contents": p.contents} for p in passages]}
        data.append({"id": t.question_id, "question": t.question, "golden_answers": t.golden_answers,
                     "metadata": {}, "output": {"prompt": prompt, "retrieval_results": results,
                                                "retrieved_times": len(results), "pred": t.answer,
                                                "finish_reason": "Finished"}})
    path.write_text(json.dumps(data, indent=4))


def mined_rows(trajectory_file, out) -> list[dict]:
    result = mine(trajectory_file, WORLD, FakeAgent(), FakeScorer(), config(), out)
    return [{k: v for k, v in json.loads(line).items() if k != "dataset"}
            for line in result.rows_path.read_text().splitlines()]


@pytest.fixture(autouse=True)
def _fresh_world_calls():
    WORLD.calls.clear()  # the mining tests' shared client records its calls
    yield
    WORLD.calls.clear()


@pytest.fixture(scope="module")
def original_rows(tmp_path_factory):
    folder = tmp_path_factory.mktemp("original")
    path = write_jsonl(folder / "trajectories.jsonl", [t.to_json() for t in trajectories()])
    rows = mined_rows(path, folder / "mined")
    assert rows, "the fixture trajectories mine to rows"
    return rows


@pytest.mark.parametrize("fmt", ["verl", "search_r1", "flashrag"])
def test_imported_trajectories_mine_to_the_rows_of_the_trajectories_they_came_from(tmp_path, fmt, original_rows):
    items = trajectories()
    inputs = {"verl": tmp_path / "dump", "search_r1": tmp_path / "generation.parquet",
              "flashrag": tmp_path / "intermediate_data.json"}[fmt]
    {"verl": write_verl_dump, "search_r1": write_search_r1_generation, "flashrag": write_release_step1}[fmt](
        inputs, items)
    out = tmp_path / "imported.jsonl"
    stats = import_trajectories(ImportConfig(format=fmt, inputs=[str(inputs)], out=str(out),
                                             qa=str(qa_file(tmp_path, items))), client=WORLD)
    imported = list(read_trajectories(out))
    assert [(t.question_id, t.answer, t.num_searches, [turn.action for turn in t.turns]) for t in imported] == [
        (t.question_id, t.answer, t.num_searches, [turn.action for turn in t.turns]) for t in items]
    assert [[r.ids for turn in t.turns for r in turn.retrieved] for t in imported] == \
        [[r.ids for turn in t.turns for r in turn.retrieved] for t in items]
    searches = sum(t.num_searches for t in items)
    assert stats.trajectories == 4 and stats.searches == searches and stats.questions_matched_to_qa == 4
    if fmt == "flashrag":  # the release names its passages: nothing runs again
        assert (stats.searches_with_ids, stats.searches_run_again, WORLD.calls) == (searches, 0, [])
    else:
        assert (stats.searches_with_ids, stats.searches_run_again, stats.run_again_same_titles) == (0, searches, searches)
        assert imported[0].turns[0].observation == items[0].turns[0].observation  # what the agent saw, kept
    assert read_json(f"{out}.import.json")["searches_run_again"] == stats.searches_run_again
    assert mined_rows(out, tmp_path / "mined") == original_rows


def test_split_response_cuts_turns_keeps_observations_and_reads_invalid_turns():
    observation = "\n\n<information>Doc 1(Title: \"A\") text a</information>\n\n"
    response = ("<think> hmm </think> no tags here" + INVALID_ACTION_MESSAGE + "<think> ok </think>\n<search> a </search>"
                + observation + "<think> so </think>\n<answer> A </answer>")
    turns, trailing = split_response(response)
    assert [(t.action, t.queries, t.observation) for t in turns] == [
        ("invalid", [], INVALID_ACTION_MESSAGE), ("search", ["a"], observation), ("answer", [], "")]
    assert "".join(t.text + t.observation for t in turns) == response and trailing == ""
    turns, _ = split_response("<think> x </think>\n<search> last turn </search>")
    assert [(t.action, t.observation) for t in turns] == [("search", "")]  # search-disabled last turn: not executed


def test_hashed_ids_number_a_questions_trajectories_as_samples(tmp_path):
    items = trajectories()[:1] * 3
    write_verl_dump(tmp_path / "dump", items)
    out = tmp_path / "imported.jsonl"
    stats = import_trajectories(ImportConfig(format="verl", inputs=[str(tmp_path / "dump")], out=str(out)), client=WORLD)
    imported = list(read_trajectories(out))
    assert len({t.question_id for t in imported}) == 1 and imported[0].question_id.startswith("q-")
    assert [t.sample for t in imported] == [0, 1, 2] and stats.questions_hashed == 3


def test_formats_without_passage_ids_need_a_retriever_and_bad_rows_are_named(tmp_path):
    write_verl_dump(tmp_path / "dump", trajectories()[:1])
    with pytest.raises(ValueError, match="--index DIR or --url URL"):
        import_trajectories(ImportConfig(format="verl", inputs=[str(tmp_path / "dump")], out=str(tmp_path / "o.jsonl")))
    assert not (tmp_path / "o.jsonl").exists()
    bad = write_jsonl(tmp_path / "bad" / "1.jsonl", [{"input": "Question: a?\n", "output": "", "gts": {"target": ["x"]}},
                                                      {"input": "Question: b?\n", "output": ""}])
    with pytest.raises(DataFormatError) as error:
        import_trajectories(ImportConfig(format="verl", inputs=[str(bad)], out=str(tmp_path / "o.jsonl")), client=WORLD)
    assert (error.value.path, error.value.line, error.value.field) == (str(bad), 2, "gts")


def test_agent_import_command_writes_the_trajectories_and_says_where_passages_came_from(tmp_path, capsys):
    items = trajectories()
    write_release_step1(tmp_path / "intermediate_data.json", items)
    out = tmp_path / "imported.jsonl"
    main(["agent", "import", "--format", "flashrag", "--inputs", str(tmp_path), "--out", str(out)])
    printed = capsys.readouterr().out
    assert "4 trajectories" in printed and "none run again" in printed
    assert [t.question_id for t in read_trajectories(out)] == [t.question_id for t in items]


def test_release_outputs_of_two_datasets_take_the_merged_sets_namespaced_ids(tmp_path):
    """The release runs step 1 per dataset, and FlashRAG numbers each dataset's ids alike (train_0, ...)."""
    items = trajectories()
    trivia, hotpot = [], []
    for i, t in enumerate(items[:2]):
        trivia.append(Trajectory(**{**t.__dict__, "question_id": f"train_{i}"}))
    for i, t in enumerate(items[2:]):
        hotpot.append(Trajectory(**{**t.__dict__, "question_id": f"train_{i}"}))
    (tmp_path / "triviaqa").mkdir()
    (tmp_path / "hotpotqa").mkdir()
    write_release_step1(tmp_path / "triviaqa" / "intermediate_data.json", trivia)
    write_release_step1(tmp_path / "hotpotqa" / "intermediate_data.json", hotpot)
    inputs = [str(tmp_path / "triviaqa"), str(tmp_path / "hotpotqa")]
    with pytest.raises(DataFormatError, match="give --qa with the merged QA set") as error:
        import_trajectories(ImportConfig(format="flashrag", inputs=inputs, out=str(tmp_path / "o.jsonl")))
    assert (error.value.path, error.value.line) == (str(tmp_path / "hotpotqa" / "intermediate_data.json"), 1)
    for name, part in (("triviaqa", trivia), ("hotpotqa", hotpot)):
        write_jsonl(tmp_path / "qa" / name / "train.jsonl", [{"id": t.question_id, "question": t.question,
                                                            "golden_answers": t.golden_answers} for t in part])
    merged = f"{tmp_path}/qa/triviaqa/train.jsonl,{tmp_path}/qa/hotpotqa/train.jsonl"
    stats = import_trajectories(ImportConfig(format="flashrag", inputs=inputs, out=str(tmp_path / "o.jsonl"), qa=merged))
    assert [t.question_id for t in read_trajectories(tmp_path / "o.jsonl")] == [
        "triviaqa/train_0", "triviaqa/train_1", "hotpotqa/train_0", "hotpotqa/train_1"]
    assert stats.questions_matched_to_qa == 4 and stats.questions_hashed == 0
