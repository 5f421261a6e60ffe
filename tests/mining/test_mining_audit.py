"""The mining audit: AUCs, where the evidence went, false negatives, drops, outputs and the CLI."""

import json

import pytest

from agentic_retriever.app.cli import build_parser, main, modernize
from agentic_retriever.base.jsonl import DataFormatError
from agentic_retriever.eval.mining_audit import audit_mining, mann_whitney_auc


def _cand(pid, title, rank, score, lr, gac, contains=False, role=None):
    return {"id": pid, "title": title, "rank": rank, "score": score, "lr": lr, "gac": gac,
            "gac_pass": None if gac is None else gac >= 1, "contains_answer": contains, "role": role}


def _round(qid, index, status, candidates, drop_reason=None):
    return {"round_id": f"{qid}#{index}", "question_id": qid, "question": f"question {qid}", "round_index": index,
            "query": f"query {qid} {index}", "status": status, "drop_reason": drop_reason, "candidates": candidates}


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# q1#1 mined: evidence "Paris" is the positive (a1) and also sampled as a negative (a3); a4 contains the answer.
# q2#1 dropped by LR with its evidence "Berlin" at rank 1 (a missed opportunity); GAC never ran (null).
# q2#2 mined without any evidence or answer among its candidates. q3#1: question not in the QA file.
ROUNDS = [
    _round("q1", 1, "mined", [_cand("a1", "Paris", 2, 0.8, 90, 1, True, "positive"),
                              _cand("a2", "Lyon", 1, 0.9, 50, 0, False, "negative"),
                              _cand("a3", "Paris", 3, 0.7, 40, 0, False, "negative"),
                              _cand("a4", "Nice", 4, 0.6, 40, 0, True, "negative")]),
    _round("q2", 1, "dropped", [_cand("b1", "Berlin", 1, 0.9, 30, None),
                                _cand("b2", "Bonn", 2, 0.8, 30, None),
                                _cand("b3", "Rhine", 3, 0.7, 20, None)], drop_reason="no_lr_pass"),
    _round("q2", 2, "mined", [_cand("c1", "Hamburg", 1, 0.9, 70, 1, False, "positive"),
                              _cand("c2", "Munich", 2, 0.5, 10, 0, False, "negative")]),
    _round("q3", 1, "mined", [_cand("d1", "Rome", 1, 0.9, 80, 1, True, "positive"),
                              _cand("d2", "Milan", 2, 0.4, 10, 0, False, "negative")]),
]
TRAIN_ROWS = [{"query_id": "q1", "round_index": 1, "passage_ids": ["a1", "a2", "a3", "a4"]},
              {"query_id": "q2", "round_index": 2, "passage_ids": ["c1", "c2"]},
              {"query_id": "q3", "round_index": 1, "passage_ids": ["d1", "d2"]}]
QA = [{"id": "q1", "question": "capital of France?", "golden_answers": ["Paris"], "supporting_titles": ["Paris"]},
      {"id": "q2", "question": "capital of Germany?", "golden_answers": ["Berlin"], "supporting_titles": ["Berlin"]}]


@pytest.fixture
def run(tmp_path):
    run_dir = tmp_path / "mining"
    run_dir.mkdir()
    _write(run_dir / "rounds.jsonl", ROUNDS)
    _write(run_dir / "retriever_train.jsonl", TRAIN_ROWS)
    (run_dir / "mining_stats.json").write_text("{}\n")
    return run_dir, _write(tmp_path / "qa.jsonl", QA)


def test_mann_whitney_auc_counts_ties_as_half():
    assert mann_whitney_auc([90, 40], [50, 40]) == pytest.approx(2.5 / 4)
    assert mann_whitney_auc([3], [3, 3]) == 0.5
    assert mann_whitney_auc([1], []) is None


def test_auc_is_the_mean_over_rounds_with_a_member_and_a_non_member(run):
    report = audit_mining(*run)
    auc = report["auc"]
    # evidence LR: q1#1 (90,40 vs 50,40) = 2.5/4, q2#1 (30 vs 30,20) = 1.5/2; q2#2 has no evidence: left out
    assert auc["evidence"]["lr"] == {"absent": False, "mean": pytest.approx((0.625 + 0.75) / 2), "rounds": 2}
    # GAC is null in q2#1 (dropped before GAC): only q1#1 counts, (1,0 vs 0,0) = 3/4
    assert auc["evidence"]["gac"] == {"absent": False, "mean": 0.75, "rounds": 1}
    # retriever score in q1#1: (0.8,0.7 vs 0.9,0.6) = 2/4; q2#1: 0.9 vs 0.8,0.7 = 1
    assert auc["evidence"]["retriever"]["mean"] == pytest.approx(0.75)
    # answer-containing needs no QA file: q1#1 (0.625) and the unjudged q3#1 (1.0); q2#* have no member
    assert auc["answer"]["lr"] == {"absent": False, "mean": pytest.approx((0.625 + 1.0) / 2), "rounds": 2}
    per_round = {r["round_id"]: r for r in report["per_round"]}
    assert per_round["q2#2"]["auc"]["evidence"]["lr"] is None
    assert "evidence" not in per_round["q3#1"]["auc"]


def test_a_signal_missing_from_the_whole_run_is_absent_not_zero(tmp_path):
    rounds = [_round("q1", 1, "mined", [_cand("a1", "Paris", 1, 0.9, 90, None, True, "positive"),
                                        _cand("a2", "Lyon", 2, 0.5, 10, None, False, "negative")])]
    _write(tmp_path / "rounds.jsonl", rounds)
    report = audit_mining(tmp_path, _write(tmp_path / "qa.jsonl", QA))
    assert report["auc"]["evidence"]["gac"] == {"absent": True, "mean": None, "rounds": 0}
    assert report["auc"]["evidence"]["lr"]["mean"] == 1.0
    assert "| gac | absent | absent |" in (tmp_path / "audit.md").read_text()
    assert report["false_negatives"]["by_row"] is None  # no retriever_train.jsonl in this run


def test_evidence_sampled_as_negative_is_counted_and_where_it_went(run):
    report = audit_mining(*run)
    q1 = next(r for r in report["per_round"] if r["round_id"] == "q1#1")
    assert q1["evidence"] == {"retrieved": True, "members": 2, "best_rank": 2, "fate": "positive",
                              "positive_is_member": True, "member_as_negative": True, "positive_otherwise": None}
    evidence = report["evidence"]
    assert (evidence["rounds"], evidence["retrieved"], evidence["at_rank_1"]) == (3, 2, 1)
    assert evidence["fate"] == {"positive": 1, "negative": 0, "excluded": 0, "unused": 0, "round_dropped": 1,
                                "not_retrieved": 1}
    assert evidence["mined_rounds_with_member"] == evidence["positive_is_member"] == evidence["member_as_negative"] == 1
    assert report["rounds"] == {"total": 4, "mined": 3, "dropped": 1, "judged": 3, "unjudged": 1,
                                "without_supporting_titles": 0}


def test_positive_is_neither_when_the_evidence_is_only_a_negative(tmp_path):
    rounds = [_round("q1", 1, "mined", [_cand("a1", "Lyon", 1, 0.9, 90, 1, False, "positive"),
                                        _cand("a2", "Paris", 2, 0.8, 80, 0, True, "negative"),
                                        _cand("a3", "Nice", 3, 0.7, 10, 0, False, "excluded")])]
    _write(tmp_path / "rounds.jsonl", rounds)
    report = audit_mining(tmp_path, _write(tmp_path / "qa.jsonl", QA))
    assert report["evidence"]["fate"]["negative"] == 1
    assert report["evidence"]["positive_otherwise"] == {"other_class": 0, "neither": 1, "unjudged": 0}
    assert report["positives"]["classes"]["neither"] == 1


def test_false_negative_rate_by_row_slot_and_by_candidate(run):
    fn = audit_mining(*run)["false_negatives"]
    row = fn["by_row"]
    # judged rows q1#1 (a2 a3 a4) and q2#2 (c2): 1 of 4 negatives is evidence (a3); every row: a4 of 5 has the answer
    assert (row["evidence"], row["judged_negatives"], row["evidence_rate"]) == (1, 4, 0.25)
    assert (row["answer"], row["negatives"], row["answer_rate"]) == (1, 5, 0.2)
    assert (row["rows_with_evidence_negative"], row["judged_rows"]) == (1, 2)
    assert fn["by_candidate"]["evidence"] == 1 and fn["by_candidate"]["negatives"] == 5


def test_dropped_round_with_evidence_at_rank_1_is_a_missed_opportunity(run):
    drops = audit_mining(*run)["drops"]
    assert drops["by_reason"]["no_lr_pass"] == {"rounds": 1, "judged": 1, "evidence_retrieved": 1,
                                                   "evidence_at_rank_1": 1, "answer_at_rank_1": 0}
    assert drops["missed_opportunities"] == 1


def test_positive_rank_distribution(run):
    positives = audit_mining(*run)["positives"]
    assert positives["count"] == 3 and positives["rank_buckets"]["1"] == 2 and positives["rank_buckets"]["2"] == 1
    assert positives["at_rank_1_rate"] == pytest.approx(2 / 3, abs=1e-4)


def test_json_markdown_and_png_are_written_to_the_out_folder(run, tmp_path):
    out = tmp_path / "audit_out"
    report = audit_mining(*run, out_dir=out)
    assert json.loads((out / "audit.json").read_text())["rounds"] == report["rounds"]
    assert len(json.loads((out / "audit.json").read_text())["per_round"]) == 4
    markdown = (out / "audit.md").read_text()
    assert "| lr | 0.688 (n=2) | 0.812 (n=2) |" in markdown
    assert (out / "audit.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (run[0] / "audit.json").exists()


def test_cli_mine_audit_prints_the_table_and_plain_mine_still_parses(run, capsys):
    run_dir, qa = run
    assert main(["mine", "audit", str(run_dir), "--qa", str(qa)]) == 0
    printed = capsys.readouterr().out
    assert "| retrieved (any rank) | 2 / 3 (66.7%)" in printed and (run_dir / "audit.png").exists()
    parser = build_parser()
    assert parser.parse_args(modernize(["mine", "--trajectories", "t.jsonl", "--out", "o"])).command_spec.section == "mine_run"
    assert parser.parse_args(["mine", "audit", "--run", "r", "--qa", "q"]).command_spec.section == "mine_audit"


def test_malformed_line_names_the_file_line_and_field(run, capsys):
    run_dir, qa = run
    bad = dict(ROUNDS[1], candidates=[{k: v for k, v in ROUNDS[1]["candidates"][0].items() if k != "rank"}])
    _write(run_dir / "rounds.jsonl", [ROUNDS[0], bad])
    with pytest.raises(DataFormatError, match=r"rounds\.jsonl:2: field 'candidates\[0\]\.rank': missing"):
        audit_mining(run_dir, qa)
    assert main(["mine", "audit", str(run_dir), "--qa", str(qa)]) == 2
    assert "rounds.jsonl:2" in capsys.readouterr().err


def test_missing_rounds_file_says_what_writes_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="agentic-retriever mine"):
        audit_mining(tmp_path, None)
