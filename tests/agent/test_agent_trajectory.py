"""Trajectory records: JSONL round trip, precise read errors, the resumable writer, run_rollouts, evaluation."""

from __future__ import annotations

import json
import logging
import os

import pytest

from agent.env import EnvConfig
from agent.evaluate import evaluate_trajectories
from agent.rollouts import RolloutSettingsMismatch, rollout_settings_path, run_rollouts
from agent.trajectory import Retrieved, Trajectory, TrajectoryWriter, Turn, read_trajectories
from agentic_retriever.base.jsonl import DataFormatError
from agentic_retriever.base.qa_sources import QARow, read_qa_rows
from tests.fakes import FakeClient, ScriptedLLM, load_smollm2_tokenizer


def trajectory(qid: str, answer: str | None, golden: list[str], titles: list[list[str]] = (), invalid: bool = False,
               finish: str = "answer") -> Trajectory:
    turns = [Turn(f"<search> q{i} </search>", "search", [f"q{i}"], [Retrieved([f"id{i}"] * len(t), t, [1.0] * len(t))],
                  "\n\n<information>..</information>\n\n") for i, t in enumerate(titles)]
    if invalid:
        turns.append(Turn("oops", "invalid", observation="\nMy previous action is invalid.\n"))
    if answer is not None:
        turns.append(Turn(f"<answer> {answer} </answer>", "answer"))
    return Trajectory(qid, f"question {qid}", golden, "search_r1", "m", "r", turns, answer, len(titles), 0.0, 0.0, 0.0,
                      finish)


def test_trajectories_round_trip_through_jsonl(tmp_path):
    original = trajectory("q1", "Paris", ["paris"], titles=[["France", "Paris"]])
    original.token_ids, original.mask = [1, 2, 3], [1, 0, 0]
    with TrajectoryWriter(tmp_path / "t.jsonl") as writer:
        writer.write([original, trajectory("q2", None, ["x"], finish="max_turns")])
    read = list(read_trajectories(tmp_path / "t.jsonl"))
    assert read[0] == original and read[1].answer is None and read[1].token_ids is None
    assert "token_ids" not in json.loads((tmp_path / "t.jsonl").read_text().splitlines()[1])
    assert read[0].response_text == original.turns[0].text + original.turns[0].observation + "<answer> Paris </answer>"


@pytest.mark.parametrize("mutate, line, field", [
    (lambda r: r.pop("question_id"), 2, "question_id"),
    (lambda r: r.update(em="high"), 2, "em"),
    (lambda r: r.update(finish_reason="tired"), 2, "finish_reason"),
    (lambda r: r["turns"][0]["retrieved"][0].update(titles=[1]), 2, "turns[0].retrieved[0].titles"),
    (lambda r: r["turns"][0].update(action="dance"), 2, "turns[0].action"),
    (lambda r: r.update(token_ids=[1], mask=None), 2, "mask"),
])
def test_read_errors_name_file_line_and_field(tmp_path, mutate, line, field):
    good = trajectory("q1", "a", ["a"], titles=[["T"]]).to_json()
    bad = trajectory("q2", "a", ["a"], titles=[["T"]]).to_json()
    mutate(bad)
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(DataFormatError) as error:
        list(read_trajectories(path))
    assert (error.value.path, error.value.line, error.value.field) == (str(path), line, field)


def test_writer_drops_a_partial_last_line_and_skips_done_questions(tmp_path, caplog):
    path = tmp_path / "t.jsonl"
    with TrajectoryWriter(path) as writer:
        writer.write([trajectory("q1", "a", ["a"])])
    whole = path.read_text()
    path.write_text(whole + json.dumps(trajectory("q2", "b", ["b"]).to_json())[:40])  # killed mid-line
    with caplog.at_level(logging.WARNING), TrajectoryWriter(path) as writer:
        assert writer.done_ids == {"q1"}
        assert path.read_text() == whole
        with pytest.raises(ValueError, match="q1"):
            writer.write([trajectory("q1", "a", ["a"])])
        writer.write([trajectory("q2", "b", ["b"])])
    assert "partial last line" in caplog.text
    assert [t.question_id for t in read_trajectories(path)] == ["q1", "q2"]


def test_writer_refuses_a_corrupt_line_that_is_not_the_last(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("{not json\n" + json.dumps(trajectory("q1", "a", ["a"]).to_json()) + "\n")
    with pytest.raises(DataFormatError, match=r"t\.jsonl:1"):
        TrajectoryWriter(path)


def test_run_rollouts_resumes_without_duplicates(tmp_path):
    tokenizer = load_smollm2_tokenizer()
    rows = [{"id": f"q{i}", "question": f"question number {i}?", "golden_answers": [f"ans {i}", i]} for i in range(5)]
    script = {f"question number {i}?": ["<search> s </search>", f"<answer> ans {i} </answer>"] for i in range(5)}
    path = tmp_path / "t.jsonl"
    config = EnvConfig(store_token_ids=True)

    class DiesOnSecondBatch(ScriptedLLM):
        def generate(self, prompts, params):
            if len(self.calls) == 2:
                raise KeyboardInterrupt("simulated kill")
            return super().generate(prompts, params)

    with pytest.raises(KeyboardInterrupt):
        run_rollouts(rows, DiesOnSecondBatch(tokenizer, script), FakeClient(), config, path, batch_size=2)
    assert [t.question_id for t in read_trajectories(path)] == ["q0", "q1"]
    path.write_text(path.read_text() + '{"question_id": "q2", "quest')  # and a torn write on top
    llm = ScriptedLLM(tokenizer, script)
    summary = run_rollouts(rows, llm, FakeClient(), config, path, batch_size=2, retriever_id="fake-r")
    assert (summary.questions, summary.skipped, summary.written) == (5, 2, 3)
    assert sorted(llm.served) == [f"question number {i}?" for i in (2, 3, 4)]
    written = list(read_trajectories(path))
    assert [t.question_id for t in written] == ["q0", "q1", "q2", "q3", "q4"]
    last = written[-1]
    assert (last.em, last.answer, last.golden_answers, last.retriever, last.model) == (1.0, "ans 4", ["ans 4", "4"],
                                                                                        "fake-r", "scripted")
    assert len(last.token_ids) == len(last.mask) and 0 in last.mask and 1 in last.mask
    assert run_rollouts(rows, llm, FakeClient(), config, path).written == 0


def test_a_trajectory_file_is_not_completed_with_another_agent_or_environment(tmp_path):
    tokenizer = load_smollm2_tokenizer()
    rows = [{"id": f"q{i}", "question": f"question number {i}?", "golden_answers": [f"ans {i}"]} for i in range(3)]
    script = {f"question number {i}?": [f"<answer> ans {i} </answer>"] for i in range(3)}
    path = tmp_path / "t.jsonl"
    assert run_rollouts(rows[:1], ScriptedLLM(tokenizer, script), FakeClient(), EnvConfig(max_turns=5), path).written == 1
    assert json.loads(rollout_settings_path(path).read_text())["env"]["max_turns"] == 5

    with pytest.raises(RolloutSettingsMismatch, match=r"env: .*'max_turns': 5.* then, .*'max_turns': 4.* now"):
        run_rollouts(rows, ScriptedLLM(tokenizer, script), FakeClient(), EnvConfig(max_turns=4), path)

    class OtherAgent(ScriptedLLM):
        name = "other"

    with pytest.raises(RolloutSettingsMismatch, match="model: 'scripted' then, 'other' now"):
        run_rollouts(rows, OtherAgent(tokenizer, script), FakeClient(), EnvConfig(max_turns=5), path)
    assert [t.id for t in read_trajectories(path)] == ["q0"]  # nothing appended by the refused runs
    # the same settings complete it; a file from before the record existed is taken as this run's
    rollout_settings_path(path).unlink()
    assert run_rollouts(rows, ScriptedLLM(tokenizer, script), FakeClient(), EnvConfig(max_turns=4), path).written == 2
    assert json.loads(rollout_settings_path(path).read_text())["env"]["max_turns"] == 4

    class FolderAgent(ScriptedLLM):  # an agent named by its folder, relative or absolute: the same agent
        name = os.path.relpath(tmp_path)

    folder_file = tmp_path / "by_folder.jsonl"
    run_rollouts(rows[:1], FolderAgent(tokenizer, script), FakeClient(), EnvConfig(), folder_file)
    FolderAgent.name = str(tmp_path)
    assert run_rollouts(rows, FolderAgent(tokenizer, script), FakeClient(), EnvConfig(), folder_file).written == 2


def test_several_sampled_trajectories_per_question_resume_without_losing_or_repeating_one(tmp_path):
    tokenizer = load_smollm2_tokenizer()
    rows = [{"id": f"q{i}", "question": f"question number {i}?", "golden_answers": [f"ans {i}"]} for i in range(2)]
    script = {f"question number {i}?": [f"<answer> ans {i} </answer>"] * 3 for i in range(2)}  # a turn per sample
    path, config = tmp_path / "t.jsonl", EnvConfig(temperature=0.7)
    with pytest.raises(ValueError, match="temperature"):
        run_rollouts(rows, ScriptedLLM(tokenizer, script), FakeClient(), EnvConfig(), path, samples=2)

    class DiesOnSecondBatch(ScriptedLLM):
        def generate(self, prompts, params):
            if len(self.calls) == 1:  # one answer turn per batch: the second batch dies
                raise KeyboardInterrupt("simulated kill")
            return super().generate(prompts, params)

    with pytest.raises(KeyboardInterrupt):
        run_rollouts(rows, DiesOnSecondBatch(tokenizer, script), FakeClient(), config, path, batch_size=4, samples=3)
    assert [t.id for t in read_trajectories(path)] == ["q0", "q0@1", "q0@2", "q1"]
    summary = run_rollouts(rows, ScriptedLLM(tokenizer, script), FakeClient(), config, path, batch_size=4, samples=3)
    assert (summary.skipped, summary.written) == (4, 2)
    written = list(read_trajectories(path))
    assert [(t.question_id, t.sample) for t in written] == [("q0", 0), ("q0", 1), ("q0", 2), ("q1", 0), ("q1", 1),
                                                            ("q1", 2)]
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert "sample" not in lines[0] and lines[1]["sample"] == 1  # files of one trajectory per question are unchanged
    with TrajectoryWriter(path) as writer, pytest.raises(ValueError, match="q1@2"):
        writer.write([written[-1]])
    path.write_text(path.read_text().replace('"sample": 2', '"sample": -2'))
    with pytest.raises(DataFormatError, match="sample") as error:
        list(read_trajectories(path))
    assert error.value.line == 3


def test_run_rollouts_names_the_bad_qa_row():
    with pytest.raises(DataFormatError, match="golden_answers") as error:
        run_rollouts([{"id": 1, "question": "q?", "golden_answers": ["a"]}, {"id": 2, "question": "q?"}],
                     ScriptedLLM(None, {}), FakeClient(), EnvConfig(), "unused.jsonl")
    assert error.value.line == 2


def test_evaluation_of_a_hand_made_file(tmp_path):
    path = tmp_path / "t.jsonl"
    with TrajectoryWriter(path) as writer:
        writer.write([
            trajectory("q1", "Paris", ["paris"], titles=[["France", "Paris"]]),                 # EM 1
            trajectory("q2", "the city of Paris", ["Paris"], titles=[["Paris"], ["Lyon"]]),      # contains only
            trajectory("q3", "Rome", ["Milan"], invalid=True),                                    # wrong, invalid
            trajectory("q4", None, ["x"], titles=[["A"], ["B"], ["C"]], finish="max_turns"),      # no answer
        ])
    qa = tmp_path / "qa.jsonl"
    qa.write_text("\n".join(json.dumps(r) for r in [
        {"id": "q1", "question": "?", "golden_answers": ["paris"], "supporting_titles": ["Paris", "Eiffel Tower"]},
        {"id": "q2", "question": "?", "golden_answers": ["Paris"], "supporting_titles": ["Lyon"]},
        {"id": "q3", "question": "?", "golden_answers": ["Milan"]},
        {"id": "q4", "question": "?", "golden_answers": ["x"], "supporting_titles": ["Z"]},
    ]) + "\n")
    report = evaluate_trajectories(path, qa)
    f1_q2 = 2 * (1 / 3) * 1 / (1 / 3 + 1)  # "city of paris" vs "paris"
    assert report["trajectories"] == 4
    assert report["em"] == pytest.approx(1 / 4)
    assert report["contains_em"] == pytest.approx(2 / 4)
    assert report["f1"] == pytest.approx((1 + f1_q2) / 4)
    assert report["avg_searches"] == pytest.approx((1 + 2 + 0 + 3) / 4)
    assert report["valid_format_rate"] == pytest.approx(2 / 4)
    assert report["evidence_recall"] == pytest.approx((0.5 + 1 + 0) / 3) and report["evidence_questions"] == 3
    assert report["finish_reasons"] == {"answer": 3, "max_turns": 1}
    assert report["by_dataset"] == {"qa": {"questions": 4, "em": report["em"], "f1": report["f1"],
                                           "searches": report["avg_searches"]}}  # the file's name
    assert "evidence_recall" not in evaluate_trajectories(path)

    merged = [dict(json.loads(line), dataset=name) for line, name in
              zip(qa.read_text().splitlines(), ("nq", "hotpotqa", "nq", "hotpotqa"))]
    (tmp_path / "merged.jsonl").write_text("\n".join(json.dumps(r) for r in merged) + "\n")
    by_dataset = evaluate_trajectories(path, tmp_path / "merged.jsonl")["by_dataset"]
    assert by_dataset == {"hotpotqa": {"questions": 2, "em": 0.0, "f1": pytest.approx(f1_q2 / 2), "searches": 2.5},
                          "nq": {"questions": 2, "em": 0.5, "f1": 0.5, "searches": 0.5}}
    (tmp_path / "hotpotqa").mkdir()
    flashrag_layout = tmp_path / "hotpotqa" / "dev.jsonl"  # FlashRAG's DATASET/SPLIT.jsonl: the folder names it
    flashrag_layout.write_text(qa.read_text())
    assert list(evaluate_trajectories(path, flashrag_layout)["by_dataset"]) == ["hotpotqa"]


def test_qa_rows_errors_name_file_line_and_field(tmp_path):
    qa = tmp_path / "qa.jsonl"
    qa.write_text('{"id": "1", "question": "q", "golden_answers": ["a"]}\n'
                  '{"id": "2", "question": "q", "golden_answers": [{"x": 1}]}\n')
    with pytest.raises(DataFormatError) as error:
        read_qa_rows(qa)
    assert (error.value.line, error.value.field) == (2, "golden_answers")
    assert QARow.from_json({"id": 3, "question": "q", "golden_answers": 7}) == QARow("3", "q", ("7",))
    qa.write_text('{"id": "1", "question": "q", "golden_answers": ["a"], "dataset": "nq"}\n'
                  '{"id": "2", "question": "q", "golden_answers": ["a"], "dataset": ["nq"]}\n')
    with pytest.raises(DataFormatError) as error:
        read_qa_rows(qa)
    assert (error.value.line, error.value.field) == (2, "dataset")
