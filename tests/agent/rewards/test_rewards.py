"""Search-agent rewards: EM (Eq. 2), the is_valid_sequence state machine, f_ret, Eq. 3/4 in both variants,
the registry and the verl-signature wrappers, on hand-made Search-R1 responses."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from agent.dialects.search_r1 import INVALID_ACTION_MESSAGE
from agent.rewards import (
    KINDS,
    QWEN_ASSISTANT_MARKER,
    REWARDS,
    em_reward,
    extract_answer,
    format_reward,
    format_reward_paper,
    get_reward,
    gold_in_information,
    information_blocks,
    is_valid_sequence,
    judge,
    register,
    retrieval_hit_reward,
    retrieval_reward,
    retrieval_reward_paper,
    reward_options,
    shaped_reward,
    search_r1_valid_format_reward,
)
from agent.rl.verl import reward as verl_rewards
from agent.trajectory import Retrieved, Trajectory, Turn

GOLD = ["Eiffel Tower", "Tour Eiffel"]


def info(text: str) -> str:
    """An observation exactly as the Search-R1 environment inserts it."""
    return f"\n\n<information>Doc 1(Title: \"Paris\") {text}</information>\n\n"


def search_turn(query: str = "tallest structure in paris") -> str:
    return f"<think> I need to look this up. </think>\n<search> {query} </search>"


def answer_turn(answer: str) -> str:
    return f"<think> The passage says so. </think>\n<answer> {answer} </answer>"


FOUND = info("The Eiffel Tower is the tallest structure in Paris.")
NOT_FOUND = info("Paris is the capital of France.")

# Valid responses (every tag in order, only whitespace outside tags).
CORRECT_VALID = search_turn() + FOUND + answer_turn("the Eiffel tower!")
WRONG_VALID_HIT = search_turn() + FOUND + answer_turn("Louvre")
WRONG_VALID_MISS = search_turn() + NOT_FOUND + answer_turn("Louvre")
# Invalid responses: text outside tags before the answer.
CORRECT_INVALID = "Sure! " + search_turn() + FOUND + answer_turn("Eiffel Tower")
WRONG_INVALID_HIT = "Sure! " + search_turn() + FOUND + answer_turn("Louvre")
NO_ANSWER_INVALID = search_turn() + FOUND + "<think> I am out of turns"


# --- Eq. 2: the EM outcome reward -------------------------------------------------------------------------------

def test_em_reward_is_one_for_a_correct_answer_after_squad_normalisation():
    assert em_reward(CORRECT_VALID, GOLD) == 1.0
    assert em_reward("<answer> tour   eiffel. </answer>", GOLD) == 1.0  # any golden answer
    assert em_reward("<answer> 1889 </answer>", [1889]) == 1.0


def test_em_reward_is_zero_for_a_wrong_answer_a_partial_answer_and_no_answer():
    assert em_reward(WRONG_VALID_HIT, GOLD) == 0.0
    assert em_reward("<answer> the Eiffel Tower in Paris </answer>", GOLD) == 0.0  # exact, not contains
    assert em_reward(NO_ANSWER_INVALID, GOLD) == 0.0
    assert extract_answer(NO_ANSWER_INVALID) is None


def test_em_reward_reads_the_last_answer_of_the_response_not_the_information():
    two_answers = "<answer> Louvre </answer> <answer> Eiffel Tower </answer>"
    assert extract_answer(two_answers) == "Eiffel Tower" and em_reward(two_answers, GOLD) == 1.0
    assert em_reward("<answer> Eiffel Tower </answer> <answer> Louvre </answer>", GOLD) == 0.0
    assert em_reward(search_turn() + FOUND, GOLD) == 0.0  # the gold only in the passages is no answer


def test_an_invalid_action_message_counts_as_an_answer_as_in_the_release():
    response = "<think> hmm </think> I give up" + INVALID_ACTION_MESSAGE
    assert extract_answer(response) == "and"  # the message's example "<answer> and </answer>"
    assert format_reward(response, GOLD) == pytest.approx(0.1)  # release: wrong, invalid, an answer extracted
    assert format_reward_paper(response, GOLD) == 0.0


def test_a_trajectory_scores_like_its_response_text():
    turns = [Turn(search_turn(), "search", ["tallest structure in paris"], [Retrieved(["0"], ["Paris"], [0.9])],
                  FOUND),
             Turn(answer_turn("Louvre"), "answer")]
    trajectory = Trajectory("q1", "What is the tallest structure in Paris?", GOLD, "search_r1", "m", "r", turns,
                            "Louvre", 1, 0.0, 0.0, 0.0, "answer")
    assert trajectory.response_text == WRONG_VALID_HIT
    for name in (name for name, entry in REWARDS.items() if entry.kind == "response"):
        assert get_reward(name)(trajectory, GOLD) == get_reward(name)(WRONG_VALID_HIT, GOLD), name
    assert retrieval_reward(trajectory, GOLD) == pytest.approx(0.3)
    with pytest.raises(TypeError, match="response_text"):
        em_reward(42, GOLD)


# --- the is_valid_sequence state machine (Appendix C) ---------------------------------------------------------

ACCEPTED = {
    "think then answer": "<think> easy </think><answer> Paris </answer>",
    "one search": CORRECT_VALID,
    "two searches": search_turn("a") + NOT_FOUND + search_turn("b") + FOUND + answer_turn("x"),
    "whitespace and newlines between tags": "\n <think>a</think>\n\n\t<answer>b</answer>\n  ",
    "empty tag contents": "<think></think><search></search><information></information><think></think>"
                          "<answer></answer>",
    "text with other markup inside tags": "<think> 2 < 3 and <b>bold</b> </think><answer> x </answer>",
}

REJECTED = {
    "answer without thinking": ("<answer> Paris </answer>", "Unexpected tag <answer> in state start"),
    "text before the first tag": ("Let me think. <think> a </think><answer> b </answer>",
                                  "Unexpected content 'Let me think.' between tags (state: start)"),
    "text between think and search": ("<think> a </think> so <search> q </search>" + FOUND + answer_turn("x"),
                                      "between tags (state: after_think)"),
    "text after the answer": ("<think> a </think><answer> b </answer> Done!", "Unexpected content in state end"),
    "a tag after the answer": ("<think> a </think><answer> b </answer><think> c </think>",
                               "Unexpected tag <think> in state end"),
    "answer right after information": (search_turn() + FOUND + "<answer> b </answer>",
                                       "Unexpected tag <answer> in state information"),
    "search right after information": (search_turn() + FOUND + "<search> q </search>",
                                       "Unexpected tag <search> in state information"),
    "think right after search": ("<think> a </think><search> q </search><think> b </think><answer> c </answer>",
                                 "Unexpected tag <think> in state after_search"),
    "information without search": ("<think> a </think>" + FOUND + answer_turn("x"),
                                   "Unexpected tag <information> in state after_think"),
    "two thinks in a row": ("<think> a </think><think> b </think><answer> c </answer>",
                            "Unexpected tag <think> in state after_think"),
    "nested tags": ("<think> a <search> q </search> </think><answer> c </answer>",
                    "Unexpected tag <search> in state in_think"),
    "unclosed think": ("<think> a <answer> b </answer>", "Mismatch in think tags: 1 opening vs 0 closing tags"),
    "closing without opening": ("<think> a </think></search><answer> b </answer>",
                                "Mismatch in search tags: 0 opening vs 1 closing tags"),
    "information cut inside its closing tag": (search_turn() + "\n\n<information>Doc 1 ... </inform",
                                               "Mismatch in information tags"),
    "no answer": (search_turn() + FOUND, "Incomplete sequence, ended in state information"),
    "empty response": ("", "Incomplete sequence, ended in state start"),
    "an invalid action": ("<think> a </think> oops" + INVALID_ACTION_MESSAGE + answer_turn("x"),
                          "Unexpected content 'oops"),
}


@pytest.mark.parametrize("response", list(ACCEPTED.values()), ids=list(ACCEPTED))
def test_state_machine_accepts_think_search_information_answer_sequences(response):
    assert is_valid_sequence(response) == (True, "Valid sequence format")
    assert search_r1_valid_format_reward(response) == 1.0


@pytest.mark.parametrize("response, reason", list(REJECTED.values()), ids=list(REJECTED))
def test_state_machine_rejects_malformed_sequences_with_listing_1_reasons(response, reason):
    valid, why = is_valid_sequence(response)
    assert not valid and reason in why
    assert search_r1_valid_format_reward(response) == 0.0


def test_state_machine_with_the_assistant_marker_checks_only_the_text_after_it():
    prompt = "<|im_start|>user\nFor example, <answer> Beijing </answer>. Question: x?<|im_end|>\n"
    response = "<think> a </think><answer> b </answer>"
    assert not is_valid_sequence(prompt + response).valid  # the prompt's text and example break the sequence
    assert is_valid_sequence(prompt + "<|im_start|>assistant\n" + response,
                             assistant_marker=QWEN_ASSISTANT_MARKER).valid
    assert is_valid_sequence(response, assistant_marker=QWEN_ASSISTANT_MARKER) == (False, "Missing assistant marker")


# --- f_ret: a golden answer in the retrieved information -------------------------------------------------------

def test_retrieval_hit_looks_only_inside_information_blocks():
    assert information_blocks(CORRECT_VALID) == ['Doc 1(Title: "Paris") The Eiffel Tower is the tallest structure in Paris.']
    assert retrieval_hit_reward(WRONG_VALID_HIT, GOLD) == 1.0
    assert retrieval_hit_reward(WRONG_VALID_MISS, GOLD) == 0.0
    assert retrieval_hit_reward("<think> the Eiffel Tower </think><answer> Eiffel Tower </answer>", GOLD) == 0.0
    assert retrieval_hit_reward(search_turn() + "\n\n<information>the Eiffel Tower ...", GOLD) == 0.0  # unclosed


def test_retrieval_hit_matches_substrings_by_default_and_words_on_request():
    response = search_turn() + info("Its phone number is 1234.")
    assert gold_in_information(response, ["4"]) is True  # the release's substring match
    assert gold_in_information(response, ["4"], match="word") is False
    assert gold_in_information(response, ["1234"], match="word") is True
    assert gold_in_information(response, ["The"]) is False  # a gold that normalises to nothing never matches
    with pytest.raises(ValueError, match="unknown match"):
        gold_in_information(response, ["4"], match="regex")


# --- Eq. 3 and Eq. 4 -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("response, paper, release", [
    (CORRECT_VALID, 1.0, 1.0),
    (CORRECT_INVALID, 0.8, 0.8),             # 1 - lambda_f
    (WRONG_VALID_MISS, 0.2, 0.2),            # lambda_f
    (WRONG_VALID_HIT, 0.2, 0.2),             # Eq. 3 has no retrieval term
    (WRONG_INVALID_HIT, 0.0, 0.1),           # release: final_format_score for an extracted, wrong answer
    (NO_ANSWER_INVALID, 0.0, 0.0),           # no answer, invalid: 0 in both
], ids=["correct-valid", "correct-invalid", "wrong-valid", "wrong-valid-hit", "wrong-invalid", "no-answer"])
def test_format_reward_eq3_in_the_paper_and_release_variants(response, paper, release):
    assert format_reward_paper(response, GOLD) == pytest.approx(paper)
    assert format_reward(response, GOLD, variant="paper") == pytest.approx(paper)
    assert format_reward(response, GOLD) == pytest.approx(release)


def test_format_reward_scales_with_lambda_f():
    assert format_reward(CORRECT_INVALID, GOLD, lambda_f=0.4) == pytest.approx(0.6)
    assert format_reward(WRONG_VALID_MISS, GOLD, lambda_f=0.4) == pytest.approx(0.4)


@pytest.mark.parametrize("response, paper, release", [
    (CORRECT_VALID, 1.0, 1.0),
    (CORRECT_INVALID, 0.8, 0.8),
    (WRONG_VALID_HIT, 0.3, 0.3),             # lambda_f + lambda_r: the gold was retrieved
    (WRONG_VALID_MISS, 0.2, 0.2),            # lambda_f: it was not
    (WRONG_INVALID_HIT, 0.0, 0.1),           # an invalid response gets no retrieval term
], ids=["correct-valid", "correct-invalid", "wrong-valid-hit", "wrong-valid-miss", "wrong-invalid-hit"])
def test_retrieval_reward_eq4_adds_lambda_r_only_to_valid_wrong_responses(response, paper, release):
    assert retrieval_reward_paper(response, GOLD) == pytest.approx(paper)
    assert retrieval_reward(response, GOLD) == pytest.approx(release)


def test_retrieval_reward_options_reach_the_match_and_the_weights():
    response = search_turn() + info("Room 1234.") + answer_turn("5")
    assert retrieval_reward(response, ["4"]) == pytest.approx(0.3)
    assert retrieval_reward(response, ["4"], match="word") == pytest.approx(0.2)
    assert retrieval_reward(WRONG_VALID_HIT, GOLD, lambda_f=0.4, lambda_r=0.5) == pytest.approx(0.9)


def test_judgement_exposes_each_term_and_bad_weights_are_rejected():
    judgement = judge(WRONG_VALID_HIT, GOLD)
    assert (judgement.answer, judgement.correct, judgement.valid_format, judgement.retrieval_hit) == (
        "Louvre", False, True, True)
    assert judge(CORRECT_INVALID, GOLD).format_reason.startswith("Unexpected content 'Sure!'")
    for bad in ({"lambda_f": 1.5}, {"lambda_f": -0.1}, {"lambda_r": -1.0}):
        with pytest.raises(ValueError, match="lambda"):
            shaped_reward(judgement, **bad)
    with pytest.raises(ValueError, match="unknown variant"):
        shaped_reward(judgement, variant="both")


# --- the registry ----------------------------------------------------------------------------------------------

def test_one_table_holds_every_methods_rewards_each_saying_what_it_needs_and_binds_options():
    kinds = {kind: {name for name, r in REWARDS.items() if r.kind == kind} for kind in KINDS}
    assert {"search_r1_em", "search_r1_format", "qagent_stage1", "when_to_search_format"} <= kinds["response"]
    assert (kinds["gain"], kinds["submodule"]) == ({"s3_gbr", "s3_gbr_paper"}, {"qagent_stage2"})
    assert kinds["when_to_search"] == {"when_to_search_stage1", "when_to_search_stage2"}
    assert all(not REWARDS[name].needs and REWARDS[name].dialect is None for name in kinds["response"]), \
        "a response reward reads the response alone, whatever the dialect"
    assert REWARDS["s3_gbr"].dialect == "s3" and "naive_rag_cache" in REWARDS["s3_gbr"].needs
    assert REWARDS["qagent_stage2"].needs == ("generator",) and REWARDS["when_to_search_stage1"].dialect == "reflect"
    with pytest.raises(ValueError, match="already registered"):
        register("search_r1_em")(lambda response, golden: 0.0)
    with pytest.raises(ValueError, match="kind must be one of"):
        register("new_reward", kind="listwise")
    assert reward_options("search_r1_retrieval") == {"lambda_f": 0.2, "lambda_r": 0.1, "variant": "release",
                                                     "match": "substring"}
    assert get_reward("search_r1_format", lambda_f=0.4)(WRONG_VALID_MISS, GOLD) == pytest.approx(0.4)
    assert get_reward("search_r1_em") is em_reward
    assert get_reward("constant", value=0.5)(WRONG_VALID_MISS, GOLD) == 0.5
    with pytest.raises(ValueError, match="unknown reward 'exact'; choose a response reward: constant, qagent_hit, "
                                         ".*search_r1_em.*; a gain over naive RAG .*: s3_gbr, s3_gbr_paper"):
        get_reward("exact")
    with pytest.raises(ValueError, match="takes no option lambda_r; its options: lambda_f"):
        get_reward("search_r1_format_paper", lambda_r=0.1)


# --- verl's compute_score signature ---------------------------------------------------------------------------

@pytest.mark.parametrize("ground_truth", [
    {"target": ["Eiffel Tower", "Tour Eiffel"]},                            # Search-R1's data, as written
    {"target": np.array(["Eiffel Tower", "Tour Eiffel"], dtype=object)},    # ... as read back from parquet
    ["Tour Eiffel", "Eiffel Tower"],
    ("Eiffel Tower",),
    "Eiffel Tower",
], ids=["dict-list", "dict-numpy", "list", "tuple", "str"])
def test_verl_wrappers_accept_search_r1_ground_truth_shapes(ground_truth):
    assert verl_rewards.compute_score("nq", CORRECT_VALID, ground_truth) == 1.0
    assert verl_rewards.compute_score("nq", WRONG_VALID_HIT, ground_truth, {"index": 0}) == 0.0
    assert verl_rewards.search_r1_retrieval("nq", WRONG_VALID_HIT, ground_truth) == pytest.approx(0.3)
    assert verl_rewards.search_r1_format_paper("hotpotqa", WRONG_INVALID_HIT, ground_truth) == 0.0


def test_verl_wrappers_score_like_the_registered_rewards_with_reward_kwargs():
    response_rewards = {name: entry.fn for name, entry in REWARDS.items() if entry.kind == "response"}
    assert set(verl_rewards.VERL_REWARDS) == set(response_rewards)
    for name, reward in response_rewards.items():
        wrapper = getattr(verl_rewards, name)
        assert wrapper.__name__ == name
        for response in (CORRECT_VALID, CORRECT_INVALID, WRONG_VALID_HIT, WRONG_INVALID_HIT, NO_ANSWER_INVALID):
            score = wrapper(data_source="nq", solution_str=response, ground_truth={"target": GOLD}, extra_info=None)
            assert isinstance(score, float) and score == reward(response, GOLD), (name, response)
    assert verl_rewards.search_r1_format("nq", WRONG_VALID_MISS, {"target": GOLD}, lambda_f=0.4) == pytest.approx(0.4)
    assert verl_rewards.compute_score("nq", WRONG_INVALID_HIT, GOLD, reward="search_r1_format") == pytest.approx(0.1)
    with pytest.raises(ValueError, match="reward 's3_gbr' is a gain over naive RAG .* embedded trainer"):
        verl_rewards.compute_score("nq", CORRECT_VALID, GOLD, reward="s3_gbr")


@pytest.mark.parametrize("ground_truth, message", [
    ({"answers": ["x"]}, "no 'target' key"),
    (None, "got NoneType"),
    (1889, "got int"),
    ({"target": {"a": 1}}, "got dict"),
    ([], "no golden answers"),
    ({"target": np.array([], dtype=object)}, "no golden answers"),
    ([["x"], {"a": 1}], "something other than answer strings"),
])
def test_verl_wrappers_reject_other_ground_truth_with_a_clear_error(ground_truth, message):
    with pytest.raises(ValueError, match=message):
        verl_rewards.compute_score("nq", CORRECT_VALID, ground_truth)


def test_verl_can_load_the_wrapper_file_by_path():
    # verl's get_custom_reward_fn: spec_from_file_location("custom_module", custom_reward_function.path)
    spec = importlib.util.spec_from_file_location("custom_module", Path(verl_rewards.__file__))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.search_r1_format("nq", CORRECT_INVALID, {"target": GOLD}) == pytest.approx(0.8)
    with pytest.raises(TypeError, match="decoded response text"):
        module.compute_score("nq", [1, 2, 3], {"target": GOLD})
