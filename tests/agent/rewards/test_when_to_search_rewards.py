"""The multi-stage reward of "Learning When to Search: Multi-Stage Reward Design for Efficient Agentic RAG with
Reasoning Language Models" (section 3.3, Eqs. 6-12): r_format by the reflect dialect's shape check, r_search's
concise rule and mean pairwise cosine (a tiny encoder), both stages of r_answer, the YES/NO judge with its exact
match fallback, the batch reward that calls judge and encoder once per step, the config checks, and dynamic
sampling that refills a step and stops when every group is flat."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from agent.env import EnvConfig
from agent.rewards import REWARDS, get_reward
from agent.rewards.answer_judge import JUDGE_PROMPT, judge_answers, judge_prompt
from agent.rewards.when_to_search import answer_reward, is_concise, mean_pairwise_cosine, search_reward
from agent.rl import RLConfig
from agent.rl.batch import Sample
from agent.rl.batch_reward import ResponseReward, WhenToSearchReward, prepare_reward, query_encoder
from agent.rl.config import SecondStage
from agent.rl.verl import reward as verl_rewards
from agentic_retriever.base.qa_sources import QARow
from agent.rl.reward_schedule import RewardSchedule
from agent.rl.rollout import RolloutCollector
from agentic_retriever.base.encoder import Encoder, EncoderConfig
from agentic_retriever.base.llm import LLMConfig
from agentic_retriever.base.llm.protocol import Generation
from agentic_retriever.retrieval import LocalRetrievalClient
from tests.fakes import ClosableLLM, FakeClient

THINK = "<think> I am not sure </think>\n"
REFLECT = "<reflect> the passage says Paris </reflect>\n"
ANSWER = "<answer> Paris </answer>"


def search(query: str) -> str:
    return f"<search> {query} </search>\n<information>Doc 1(Title: France) Paris is the capital.</information>\n"


NO_SEARCH = THINK + REFLECT + ANSWER
ONE_SEARCH = THINK + search("France capital") + REFLECT + ANSWER
THREE_SEARCHES = THINK + "".join(search(q) + REFLECT for q in ("France capital", "Paris city", "Eiffel tower")) + ANSWER


# --- r_format (Eq. 6) ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("response, expected", [
    (NO_SEARCH, 1.0), (ONE_SEARCH, 1.0), (THREE_SEARCHES, 1.0),
    (THINK + ANSWER, -1.0),                                   # no reflect
    (REFLECT + ANSWER, -1.0),                                 # no think
    (THINK + search("France capital") + ANSWER, -1.0),        # information without a reflect after it
    (THINK + REFLECT, -1.0),                                  # no answer
])
def test_the_format_reward_is_plus_one_for_the_allowed_shapes_and_minus_one_otherwise(response, expected):
    assert get_reward("when_to_search_format")(response, ["Paris"]) == expected
    assert verl_rewards.when_to_search_format("nq", response, {"target": ["Paris"]}) == expected


# --- r_search (Eq. 9) ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("query, concise", [
    ("France capital", True), ("Lavinia Norcross Dickinson father death date", True),
    ("when did Lavinia Norcross Dickinson's father die", False),   # the paper's example: a question
    ("Who wrote Hamlet", False), ("capital of France?", False), ("", False), ("   ", False),
    ("one two three four five six seven eight nine ten", True),
    ("one two three four five six seven eight nine ten eleven", False),
])
def test_a_query_is_concise_when_short_and_not_a_question(query, concise):
    assert is_concise(query) is concise


def test_the_word_bound_of_the_concise_rule_is_an_option():
    assert not is_concise("France capital city", max_words=2)
    assert search_reward(["France capital city"], 1, None, max_query_words=2) == -1.0
    assert search_reward(["France capital city"], 1, None, max_query_words=3) == 0.0


def test_with_at_most_one_retrieval_the_search_reward_is_zero_or_minus_one():
    assert search_reward([], 0, None) == 0.0
    assert search_reward(["France capital"], 1, None) == 0.0
    assert search_reward(["what is the capital of France"], 1, None) == -1.0


def test_with_more_retrievals_the_search_reward_is_minus_the_mean_pairwise_cosine():
    embeddings = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])  # cosines: 0, 1/sqrt2, 1/sqrt2
    assert mean_pairwise_cosine(embeddings) == pytest.approx(2 / np.sqrt(2) / 3)
    assert search_reward(["a", "b", "c"], 3, embeddings) == pytest.approx(-2 / np.sqrt(2) / 3)
    assert search_reward(["a b", "a b"], 2, np.array([[3.0, 4.0], [6.0, 8.0]])) == pytest.approx(-1.0)
    assert mean_pairwise_cosine(np.ones((1, 4))) == 0.0
    with pytest.raises(ValueError, match="needs one embedding per query: got none for 2"):
        search_reward(["a", "b"], 2, None)


def test_the_search_reward_of_a_tiny_encoder_charges_repeated_queries_most(tiny_model_dir):
    encoder = Encoder(EncoderConfig(model=tiny_model_dir, device="cpu"))
    repeated = encoder.encode_queries(["France capital", "France capital"])
    varied = encoder.encode_queries(["France capital", "violin comet glacier harbor"])
    assert search_reward(["France capital"] * 2, 2, repeated) == pytest.approx(-1.0, abs=1e-5)
    assert search_reward(["France capital", "violin comet glacier harbor"], 2, varied) > -1.0 + 1e-3


# --- r_answer (Eqs. 10-11) ----------------------------------------------------------------------------------

@pytest.mark.parametrize("retrievals, stage1, stage2", [
    (0, (1.0, -1.0), (1.0, -1.0)),
    (1, (1.0, -0.7), (0.7, -1.0)),
    (3, (1.0, -0.1), (0.1, -1.0)),
])
def test_the_answer_reward_of_each_stage(retrievals, stage1, stage2):
    assert (answer_reward(True, retrievals, stage=1), answer_reward(False, retrievals, stage=1)) == \
        pytest.approx(stage1)
    assert (answer_reward(True, retrievals, stage=2), answer_reward(False, retrievals, stage=2)) == \
        pytest.approx(stage2)
    with pytest.raises(ValueError, match="stages 1 and 2"):
        answer_reward(True, retrievals, stage=3)


def test_the_stage_rewards_add_the_three_terms():
    assert {n for n, r in REWARDS.items() if r.kind == "when_to_search"} == {"when_to_search_stage1",
                                                                             "when_to_search_stage2"}
    stage1, stage2 = (get_reward(f"when_to_search_stage{i}") for i in (1, 2))
    assert stage1(True, NO_SEARCH) == (1.0, 0.0, 1.0) and stage1(True, NO_SEARCH).total == 2.0
    assert stage2(True, ONE_SEARCH).total == pytest.approx(0.7 + 0.0 + 1.0)
    embeddings = np.eye(3)  # orthogonal queries: r_search 0
    assert stage1(False, THREE_SEARCHES, embeddings).total == pytest.approx(-0.1 + 0.0 + 1.0)
    assert stage2(False, THINK + ANSWER).total == -1.0 + 0.0 - 1.0
    assert get_reward("when_to_search_stage2", beta=0.5)(True, ONE_SEARCH).answer == 0.5
    with pytest.raises(ValueError, match="takes no option lambda_f"):
        get_reward("when_to_search_stage1", lambda_f=0.1)


# --- the judge ----------------------------------------------------------------------------------------------

class ScriptedJudge(ClosableLLM):
    """Answers each judge prompt with the next scripted verdict; records its calls."""

    name = "scripted-judge"

    def __init__(self, verdicts):
        self.verdicts, self.calls = list(verdicts), []

    def chat_prompt(self, user_message: str) -> str:
        return user_message

    def generate(self, prompts, params):
        self.calls.append(list(prompts))
        return [[Generation(self.verdicts.pop(0), [], "stop")] for _ in prompts]


def test_the_judge_prompt_is_the_papers_with_normalised_answers():
    assert JUDGE_PROMPT.startswith("You are an evaluation assistant. Your task is to determine whether")
    assert JUDGE_PROMPT.endswith("- NO \u2192 otherwise. Only respond with YES or NO.")
    prompt = judge_prompt("The Eiffel Tower!", ["Eiffel tower", "La Tour"])
    assert "Prediction: eiffel tower Reference Answers: ['eiffel tower', 'la tour'] Please answer" in prompt


def test_the_judge_reads_malformed_verdicts_as_wrong_in_one_batched_call():
    judge = ScriptedJudge([" yes.", "**NO**", "The answer is yes", "", "Yes, it is"])
    predictions = ["Paris", "the French capital", "Lyon", "capital Paris", "Paname", "Pariss", None]
    verdicts = judge_answers(predictions, [["Paris"]] * 7, judge)
    assert len(judge.calls) == 1 and len(judge.calls[0]) == 5  # no call for the exact match nor the missing answer
    assert verdicts.correct == [True, True, False, False, False, True, False]
    assert verdicts.asked == [False, True, True, True, True, True, False]
    assert verdicts.method == "judge" and verdicts.judge_calls == 1 and verdicts.judge_malformed == 2


def test_without_a_judge_exact_match_decides():
    verdicts = judge_answers(["Paris", "the city of Paris", None], [["Paris"]] * 3, None)
    assert verdicts.correct == [True, False, False] and verdicts.method == "exact_match"
    assert verdicts.judge_calls == 0
    with pytest.raises(ValueError, match="parallel"):
        judge_answers(["Paris"], [], None)


# --- the batch reward ---------------------------------------------------------------------------------------

class RecordingEncoder:
    """Embeds each query as a one-hot of its first letter; records its calls."""

    def __init__(self):
        self.calls = []

    def encode_queries(self, queries):
        self.calls.append(list(queries))
        return np.array([[float(q[0] == letter) for letter in "abcdefghijklmnopqrstuvwxyz"] for q in queries])


def rollout(response: str, answer: str | None, searches: int) -> SimpleNamespace:
    return SimpleNamespace(response_text=response, answer=answer, num_searches=searches)


def test_the_batch_reward_asks_the_judge_and_the_encoder_once_per_step():
    twice = THINK + search("alpha one") + REFLECT + search("alpha two") + REFLECT + ANSWER   # cosine 1
    apart = THINK + search("beta") + REFLECT + search("gamma") + REFLECT + ANSWER            # cosine 0
    results = [rollout(NO_SEARCH, "Paris", 0), rollout(twice, "Lyon", 2), rollout(apart, "Paname", 2)]
    rows = [QARow("q", "capital of france?", ("Paris",))] * 3
    judge, encoder = ScriptedJudge(["NO", "YES"]), RecordingEncoder()
    reward = WhenToSearchReward(get_reward("when_to_search_stage1"), encoder, judge)
    scores, components = reward.score(results, rows)
    assert encoder.calls == [["alpha one", "alpha two", "beta", "gamma"]] and len(judge.calls) == 1
    assert scores == pytest.approx([2.0, (-1.0 + 0.6) - 1.0 + 1.0, 1.0 + 0.0 + 1.0])
    assert components[1] == {"r_answer": pytest.approx(-0.4), "r_search": -1.0, "r_format": 1.0,
                             "answer_correct": 0.0, "correct_by_judge": 1.0, "judge_asked": 1.0}
    assert components[0]["judge_asked"] == 0.0
    stage2 = WhenToSearchReward(get_reward("when_to_search_stage2"), RecordingEncoder(), None)
    scores, components = stage2.score(results, rows)
    assert scores == pytest.approx([2.0, -1.0 - 1.0 + 1.0, -1.0 + 0.0 + 1.0])  # exact match: Paname is wrong
    assert components[2]["correct_by_judge"] == 0.0 and "judge_asked" not in components[2]


# --- configuration ------------------------------------------------------------------------------------------

ROWS = [QARow("a", "capital of france?", ("Paris",)), QARow("b", "capital of norway?", ("Oslo",))]


def when_to_search_config(tmp_path, **overrides) -> RLConfig:
    settings = dict(agent=LLMConfig(model="policy"), out=str(tmp_path / "run"), steps=2, prompts_per_step=1,
                    samples_per_prompt=2, env=EnvConfig(dialect="reflect", max_turns=2), progress=False,
                    reward="when_to_search_stage1", stage2=SecondStage("when_to_search_stage2", {}, after_step=1),
                    report_to=["none"])
    settings.update(overrides)
    return RLConfig(**settings)


@pytest.mark.parametrize("overrides, message", [
    ({"env": EnvConfig()}, r"reward when_to_search_stage1 \(a when-to-search reward\) scores rollouts of the "
                           r"reflect dialect: set env.dialect reflect \(got 'search_r1'\)"),
    ({"stage2": SecondStage("when_to_search_stage3", after_step=1)},
     r"unknown stage2.reward 'when_to_search_stage3'.*a when-to-search reward: when_to_search_stage1, "),
    ({"stage2": SecondStage("when_to_search_stage2")}, r"needs stage2.after_step >= 1"),
])
def test_bad_when_to_search_settings_are_refused(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        when_to_search_config(tmp_path, **overrides).validate()


def test_prepare_reward_shares_one_encoder_and_judge_between_the_stages(tmp_path, tiny_model_dir, monkeypatch):
    loaded = []
    monkeypatch.setattr("agent.rl.batch_reward.load_llm", lambda config: loaded.append(config.model) or
                        ScriptedJudge([]))
    config = when_to_search_config(tmp_path, judge=LLMConfig(model="judge-model"),
                                   search_encoder=EncoderConfig(model=tiny_model_dir, device="cpu"))
    config.validate()
    prepared = prepare_reward(config, FakeClient(), ROWS)
    assert isinstance(prepared.reward, WhenToSearchReward) and isinstance(prepared.stage2, WhenToSearchReward)
    assert prepared.reward.encoder is prepared.stage2.encoder and isinstance(prepared.reward.encoder, Encoder)
    assert prepared.reward.judge is prepared.stage2.judge and loaded == ["judge-model"]
    mixed = prepare_reward(when_to_search_config(tmp_path, reward="when_to_search_format", stage2=SecondStage()),
                           FakeClient(), ROWS)
    assert isinstance(mixed.reward, ResponseReward) and loaded == ["judge-model"]


def test_the_retrievers_own_encoder_is_the_default_and_a_service_needs_one_named(tmp_path):
    config = when_to_search_config(tmp_path)
    own = RecordingEncoder()
    assert query_encoder(config, LocalRetrievalClient(SimpleNamespace(encoder=own))) is own
    with pytest.raises(ValueError, match=r"FakeClient.* set search_encoder.model"):
        query_encoder(config, FakeClient())
    with pytest.raises(ValueError, match="takes no option lambda_f"):
        prepare_reward(when_to_search_config(tmp_path, reward_options={"lambda_f": 0.1}), FakeClient(), ROWS)


# --- dynamic sampling (DAPO) --------------------------------------------------------------------------------

def flat_or_varied(varied_groups: set[int]):
    """A stand-in for `RolloutCollector.rollout_samples`: two samples per question; the questions whose id is in
    `varied_groups` get rewards 0 and 1, the others 0 and 0; records the questions of every batch."""
    batches = []

    def rollout_samples(rows, samples_per_prompt, seed, first_group=0, *, step):
        batches.append([row.id for row in rows])
        return [Sample([1], [2], [1], group=first_group + i, score=float(j and int(row.id) in varied_groups))
                for i, row in enumerate(rows) for j in range(samples_per_prompt)]
    return rollout_samples, batches


def collector(tmp_path, rows, **overrides) -> RolloutCollector:
    settings = {"dynamic_sampling_filter": "score", **overrides}
    config = when_to_search_config(tmp_path, reward="constant", stage2=SecondStage(), env=EnvConfig(),
                                   dynamic_sampling=True, prompts_per_step=2, **settings)
    return RolloutCollector(config, rows, llm=None, client=None, rewards=RewardSchedule(None))


def scripted_groups(groups: list[list[tuple[float, float]]]):
    """A stand-in for `RolloutCollector.rollout_samples`: group g's samples score ``groups[g][j][0]`` and have
    ``answer_correct`` ``groups[g][j][1]`` (the when-to-search reward's verdict component)."""
    def rollout_samples(rows, samples_per_prompt, seed, first_group=0, *, step):
        return [Sample([1], [2], [1], group=first_group + i, score=score, components={"answer_correct": correct})
                for i, _ in enumerate(rows) for score, correct in groups[first_group + i]]
    return rollout_samples


def test_dynamic_sampling_by_correctness_drops_all_correct_and_all_wrong_groups_whatever_their_scores(tmp_path):
    """DAPO (arXiv 2503.14476, Eq. 11) keeps a group with some but not all answers correct: an all-correct group
    whose scores differ only by a continuous term (query diversity) teaches no correctness and is dropped, where the
    score filter would keep it and std-normalisation would amplify that noise."""
    groups = [[(1.0, 1.0), (1.13, 1.0)],    # all correct, scores differ by the diversity term
              [(-1.0, 0.0), (-0.7, 0.0)],   # all wrong, scores differ
              [(1.0, 1.0), (-1.0, 0.0)],    # mixed: kept by both filters
              [(0.4, 0.0), (0.9, 1.0)]]     # mixed
    rows = [QARow(str(i), f"q{i}", ("a",)) for i in range(4)]
    by_correctness = collector(tmp_path, rows, dynamic_sampling_filter="correctness", dynamic_sampling_max_batches=2)
    by_correctness.rollout_samples = scripted_groups(groups)
    samples, kept, _ = by_correctness.collect(step=0, cursor=0)
    assert kept == 2 and sorted({s.group for s in samples}) == [2, 3]
    by_score = collector(tmp_path, rows, dynamic_sampling_max_batches=2)
    by_score.rollout_samples = scripted_groups(groups)
    samples, kept, _ = by_score.collect(step=0, cursor=0)
    assert kept == 2 and sorted({s.group for s in samples}) == [0, 1]  # the first two differing groups
    by_correctness.rollout_samples = lambda rows, n, seed, first_group=0, *, step: [
        Sample([1], [2], [1], group=first_group, score=float(j)) for j in range(n)]
    with pytest.raises(ValueError, match="dynamic_sampling_filter: score"):
        by_correctness.collect(step=0, cursor=0)


def test_dynamic_sampling_refills_the_step_with_groups_whose_rewards_differ(tmp_path):
    rows = [QARow(str(i), f"q{i}", ("a",)) for i in range(8)]
    collect = collector(tmp_path, rows, dynamic_sampling_max_batches=4)
    collect.rollout_samples, batches = flat_or_varied({1, 5, 6})
    samples, kept, cursor = collect.collect(step=0, cursor=0)
    assert kept == 2 and len(samples) == 4
    assert all(len({s.score for s in samples if s.group == g}) == 2 for g in {s.group for s in samples})
    assert 2 <= len(batches) <= 4 and cursor == 2 * len(batches)  # stopped as soon as the step was full


def test_dynamic_sampling_stops_after_its_batches_when_every_group_is_flat(tmp_path):
    rows = [QARow(str(i), f"q{i}", ("a",)) for i in range(4)]
    collect = collector(tmp_path, rows, dynamic_sampling_max_batches=3)
    collect.rollout_samples, batches = flat_or_varied(set())
    samples, kept, cursor = collect.collect(step=0, cursor=0)
    assert samples == [] and kept == 0
    assert len(batches) == 3 and cursor == 6  # three batches of two questions, then the step gives up


def test_the_training_diagnostics_give_the_shape_and_whether_the_rollout_answered_without_search(tmp_path):
    from tests.agent.test_reflect_rollout import run_reflect

    (hamlet, france, _), _ = run_reflect()
    collect = RolloutCollector(when_to_search_config(tmp_path), [], llm=None, client=None, rewards=RewardSchedule(None))
    paris = QARow("1", "capital of france", ("Paris",))
    assert collect.components(hamlet, paris) == {"em": 0.0, "valid_format": 1.0, "answered_without_search": 0.0}
    assert collect.components(france, paris) == {"em": 1.0, "valid_format": 1.0, "answered_without_search": 1.0}
    (unanswered,), _ = run_reflect({"who painted it": ["<think>x</think>", "<reflect>y</reflect>"]}, max_turns=1)
    assert unanswered.num_searches == 0 and unanswered.finish_reason != "answer"
    assert collect.components(unanswered, paris) == {"em": 0.0, "valid_format": 0.0, "answered_without_search": 0.0}


# --- evaluation and the shipped configs ---------------------------------------------------------------------

def test_the_report_gives_the_share_of_questions_answered_without_search(tmp_path):
    from agent.evaluate import evaluate_trajectories
    from agent.trajectory import Retrieved, Turn, TrajectoryWriter
    from tests.fakes import make_trajectory

    searched = Turn("<search> x </search>", "search", ["x"], [Retrieved(["1"], ["T"], [1.0])], "<information>")
    rows = [make_trajectory("a", "q", ["Paris"], [], answer="Paris"),                # answered, no search
            make_trajectory("b", "q", ["Paris"], [searched], answer="Lyon"),         # answered after a search
            make_trajectory("c", "q", ["Paris"], [])]                                # no answer
    with TrajectoryWriter(tmp_path / "t.jsonl") as writer:
        writer.write(rows)
    report = evaluate_trajectories(tmp_path / "t.jsonl")
    assert report["answered_without_search"] == pytest.approx(1 / 3)
    assert report["avg_searches"] == pytest.approx(1 / 3) and report["em"] == pytest.approx(1 / 3)


@pytest.mark.parametrize("config_file", ["configs/when_to_search_dapo.yaml", "configs/when_to_search_quickstart.yaml"])
def test_the_shipped_when_to_search_configs_build_and_switch_to_stage_2(config_file):
    from pathlib import Path

    from agentic_retriever.app.config_loader import build_config

    path = Path(__file__).resolve().parents[3] / config_file
    config = build_config(RLConfig, "agent_train", None, str(path))
    config.validate()
    assert config.rewards == ["when_to_search_stage1", "when_to_search_stage2"] and config.uses_query_encoder
    assert config.env.dialect == "reflect" and config.algorithm == "grpo" and config.dynamic_sampling
    assert config.dynamic_sampling_filter == "correctness"  # DAPO's definition
    assert config.loss_aggregation == "token-mean" and config.clip_high > config.clip_low
    assert 1 <= config.stage2.after_step < config.steps
