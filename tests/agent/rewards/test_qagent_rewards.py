"""QAgent's rewards ("QAgent: A modular Search Agent with Interactive Query Understanding", arXiv 2510.08383,
Eqs. 7 and 10): the format rule clause by clause, stage 1 = format x strict EM, Hit over the response only,
stage 2 with a scripted frozen generator in one batched call, the verl wrappers, the reward schedule and the
submodule evaluation."""

from __future__ import annotations

import dataclasses

import pytest

from agent.dialects import QAgentDialect, SelectedDocuments
from agent.env import Rollout, Segment
from agent.evaluate import AgentEvalConfig, evaluate_agent, evaluate_submodule, generator_protocol
from agent.rewards import REWARDS, check_format, get_reward
from agent.rewards.generation import S3_GENERATOR, generate_answers
from agent.rewards.qagent import QAGENT_GENERATOR, hit
from agent.rl.batch_reward import ResponseReward, SubmoduleReward
from agent.rl.reward_schedule import RewardSchedule
from agent.rl.verl import reward as verl_rewards
from agent.trajectory import TrajectoryWriter
from agentic_retriever.base.corpus import Passage
from agentic_retriever.base.llm.protocol import Generation
from agentic_retriever.base.qa_sources import QARow
from tests.fakes import ClosableLLM, make_trajectory

PLAN = "<plan> find the capital </plan>\n"
SEARCH = "<search>\n<query>capital of France</query>\n</search>"
INFO = "\n\n<information>Doc 1(Title: France) Paris is the capital of France.</information>\n\n"
REFLECT = "<reflection> Paris it is </reflection>\n"
ANSWER = "<answer> Paris </answer>"
GOOD = PLAN + SEARCH + INFO + REFLECT + ANSWER
GOLD = ["Paris"]


# --- the format rule ----------------------------------------------------------------------------------------

def test_a_response_with_plan_reflection_and_answer_has_the_format():
    assert check_format(GOOD) == (True, "ok")
    two_rounds = PLAN + SEARCH + INFO + REFLECT + PLAN + SEARCH + INFO + REFLECT + ANSWER
    assert check_format(two_rounds).valid
    assert check_format(ANSWER).valid  # no search: clauses 1 and 2 hold vacuously
    assert check_format("<plan>p</plan>  \n\t<search>q</search>" + INFO + "\n \n" + REFLECT + ANSWER).valid


@pytest.mark.parametrize("response, clause", [
    (SEARCH + INFO + REFLECT + ANSWER, "<search>"),                                  # no plan at all
    (PLAN + "let me search\n" + SEARCH + INFO + REFLECT + ANSWER, "<search>"),      # text between plan and search
    ("<plan> unclosed\n" + SEARCH + INFO + REFLECT + ANSWER, "<search>"),           # plan never closed
    (PLAN + SEARCH + PLAN + SEARCH + "<search>again</search>" + INFO + REFLECT + ANSWER, "<search>"),
    (PLAN + SEARCH + INFO + ANSWER, "<information>"),                                 # no reflection
    (PLAN + SEARCH + INFO + "so: " + REFLECT + ANSWER, "<information>"),              # text before the reflection
    (PLAN + SEARCH + INFO + "<reflection> unclosed " + ANSWER, "<information>"),     # reflection never closed
    (PLAN + SEARCH + "<information>cut off", "<information>"),                        # information never closed
    (PLAN + SEARCH + INFO + REFLECT, "<answer>"),                                     # no answer
    (PLAN + SEARCH + INFO + REFLECT + "<answer> Paris", "<answer>"),                  # answer never closed
])
def test_each_clause_of_the_format_fails_on_its_own(response, clause):
    check = check_format(response)
    assert not check.valid and clause in check.reason


def test_the_gate_reads_search_and_answer_tags_as_the_dialect_does():
    """Table 5's loop writes ``<search >``, and the dialect executes it: a search so spelled with no plan before it
    fails the gate (stage 1 gives it 0, not 1), and with its plan it passes, as ``<answer >`` does."""
    spaced = "<search >\n<query>capital of France</query>\n</search>"
    assert QAgentDialect().parse_action(spaced).kind == "search"
    assert not check_format(spaced + INFO + REFLECT + ANSWER).valid
    assert get_reward("qagent_stage1")(spaced + INFO + REFLECT + ANSWER, GOLD) == 0.0
    assert check_format(PLAN + spaced + INFO + REFLECT + ANSWER).valid
    spaced_answer = PLAN + SEARCH + INFO + REFLECT + "<answer > Paris </answer>"
    assert QAgentDialect().extract_answer(spaced_answer) == "Paris" and check_format(spaced_answer).valid
    assert get_reward("qagent_stage1")(spaced_answer, GOLD) == 1.0


def test_an_invalid_action_message_breaks_the_format():
    rethink = ("\nMy previous action is invalid. If I want to search, I should put the query between <search> and "
               "</search>. If I want to give the final answer, I should put the answer between <answer> and "
               "</answer>. Let me try again.\n")
    assert not check_format(PLAN + "oops" + rethink + GOOD).valid


# --- stage 1 and Hit -----------------------------------------------------------------------------------------

def test_stage1_is_the_format_gate_times_strict_em():
    stage1 = get_reward("qagent_stage1")
    assert stage1(GOOD, GOLD) == 1.0
    assert stage1(GOOD.replace("Paris </answer>", "the city of Paris </answer>"), GOLD) == 0.0  # EM is strict
    assert stage1(GOOD.replace(REFLECT, ""), GOLD) == 0.0  # right answer, no format
    assert stage1(GOOD, ["Lyon"]) == 0.0
    assert get_reward("qagent_valid_format")(GOOD, ["Lyon"]) == 1.0


def rollout(response: str, documents: list[Passage] | None = None, prompt: str = "Question: capital?") -> Rollout:
    """A finished QAgent rollout: `response` as generated text, `documents` as its passage set K."""
    return Rollout("capital of france?", prompt, [1], [Segment(response, [2], True)], [], None, "answer",
                   selection=SelectedDocuments(documents or [], {}))


def test_hit_reads_the_response_and_not_the_prompt():
    assert hit(rollout(INFO + ANSWER.replace("Paris", "Lyon")), GOLD)  # in the inserted information
    assert hit(rollout("<reflection> it is Paris </reflection>"), GOLD)  # in the agent's own text
    assert not hit(rollout("<answer> Lyon </answer>", prompt="Example: Paris is a capital."), GOLD)
    assert not hit(rollout("Parisian cafes"), GOLD)  # word boundaries
    assert get_reward("qagent_hit")(INFO, GOLD) == 1.0


# --- stage 2 ---------------------------------------------------------------------------------------------------

class ScriptedGenerator(ClosableLLM):
    """A frozen generator that answers with the title of the first passage of its prompt; records its calls."""

    name = "scripted-generator"

    def __init__(self):
        self.calls: list[list[str]] = []

    def chat_prompt(self, user_message: str) -> str:
        return user_message

    def generate(self, prompts, params):
        self.calls.append(list(prompts))
        return [[Generation(p.split("(Title: ")[1].split(")")[0] if "(Title: " in p else "no idea", [], "stop")]
                for p in prompts]


def test_stage2_scores_the_generators_answer_and_hit_in_one_batched_call():
    paris, lyon = Passage("1", "Paris", "the capital"), Passage("2", "Lyon", "a city")
    results = [rollout(INFO, [paris, lyon]),                    # generator right, Hit: 1 + 0.5
               rollout("<answer> no </answer>", [paris]),       # generator right, no Hit: 1
               rollout(INFO, [lyon, paris]),                    # generator wrong, Hit: 0.5
               rollout("<plan>x</plan>", [])]                   # nothing: 0
    rows = [QARow("q", "capital of france?", ("Paris",))] * 4
    generator = ScriptedGenerator()
    scores, components = SubmoduleReward(get_reward("qagent_stage2"), generator).score(results, rows)
    assert scores == [1.5, 1.0, 0.5, 0.0]
    assert [c["submodule_contains_em"] for c in components] == [1.0, 1.0, 0.0, 0.0]
    assert len(generator.calls) == 1 and len(generator.calls[0]) == 4
    assert generator.calls[0][0] == ("Doc 1(Title: Paris) the capital\nDoc 2(Title: Lyon) a city\n\nAnswer the given "
                                     "question. The answer should be a few short words. Question: capital of france?")
    weighted = SubmoduleReward(get_reward("qagent_stage2", hit_weight=1.0), ScriptedGenerator())
    assert weighted.score(results[:1], rows[:1]).scores == [2.0]
    with pytest.raises(ValueError, match="env.dialect qagent"):
        SubmoduleReward(get_reward("qagent_stage2"), generator).score(
            [dataclasses.replace(results[0], selection=None)], rows[:1])


def test_stage2_is_a_submodule_reward_verl_cannot_run_and_checks_its_options():
    assert REWARDS["qagent_stage2"].kind == "submodule" and REWARDS["qagent_stage2"].dialect == "qagent"
    assert not hasattr(verl_rewards, "qagent_stage2")
    with pytest.raises(ValueError, match="reward 'qagent_stage2' takes no option lambda_f"):
        get_reward("qagent_stage2", lambda_f=0.2)
    with pytest.raises(ValueError, match="hit_weight must be >= 0"):
        get_reward("qagent_stage2", hit_weight=-1)("Paris", GOOD, GOLD)


def test_the_generator_prompt_is_a_parameter_and_s3s_stays_the_default():
    generator, docs = ScriptedGenerator(), [[Passage("7", "Ada", "wrote it")]]
    generate_answers(generator, ["who?"], docs)
    generate_answers(generator, ["who?", " name the author "], docs * 2, prompt=QAGENT_GENERATOR)
    assert generator.calls[0][0] == S3_GENERATOR.render("who?", docs[0])
    assert generator.calls[0][0].startswith("Use the following contexts")
    assert generator.calls[1][0] == "Doc 1(Title: Ada) wrote it\n\nAnswer the given question. The answer should " \
                                    "be a few short words. Question: who?"  # no "?." after a question mark
    assert generator.calls[1][1].endswith("Question: name the author.")  # the release's period, where none ends it


# --- verl ----------------------------------------------------------------------------------------------------

def test_the_qagent_rewards_have_verl_wrappers():
    assert verl_rewards.qagent_stage1("nq", GOOD, {"target": GOLD}) == 1.0
    assert verl_rewards.qagent_stage1("nq", GOOD.replace(PLAN, ""), {"target": GOLD}) == 0.0
    assert verl_rewards.qagent_valid_format("nq", GOOD, ["Lyon"]) == 1.0
    assert verl_rewards.qagent_hit("nq", INFO, "Paris") == 1.0
    assert verl_rewards.compute_score("nq", GOOD, {"target": GOLD}, reward="qagent_stage1") == 1.0


# --- the schedule ----------------------------------------------------------------------------------------------

def test_the_schedule_scores_steps_up_to_after_step_with_stage_1_and_later_ones_with_stage_2():
    one, two = ResponseReward(lambda r, g: 1.0), ResponseReward(lambda r, g: 2.0)
    schedule = RewardSchedule(one, two, after_step=3)
    assert [schedule.stage(finished) for finished in range(6)] == [1, 1, 1, 2, 2, 2]
    assert schedule.reward(2) is one and schedule.reward(3) is two
    assert RewardSchedule(one).stage(10**6) == 1
    with pytest.raises(ValueError, match="both its reward and after_step"):
        RewardSchedule(one, two)
    with pytest.raises(ValueError, match="at least 1"):
        RewardSchedule(one, two, after_step=0)


# --- evaluation ------------------------------------------------------------------------------------------------

@pytest.fixture
def qagent_file(tmp_path):
    """Two QAgent trajectories: q1 answers "Paris" itself and its K leads the generator to "Paris"; q2's K holds
    only "Lyon" and it answers "the Everest" (strict EM 0, contains-EM 1)."""
    right = make_trajectory("q1", "capital of France", ["Paris"], [], answer="Paris")
    wrong = make_trajectory("q2", "tallest mountain", ["Everest"], [], answer="the Everest peak")
    path = tmp_path / "trajectories.jsonl"
    with TrajectoryWriter(path) as writer:
        writer.write([
            dataclasses.replace(right, dialect="qagent", selection=SelectedDocuments(
                [Passage("1", "Paris", "capital"), Passage("2", "Lyon", "city")], {})),
            dataclasses.replace(wrong, dialect="qagent", selection=SelectedDocuments([Passage("2", "Lyon", "city")], {}))])
    return path


def test_submodule_evaluation_reports_the_generators_contains_em_and_f1_and_the_end_to_end_em(qagent_file):
    generator = ScriptedGenerator()
    report = evaluate_submodule(qagent_file, generator)
    assert len(generator.calls) == 1 and "Answer the given question" in generator.calls[0][0]
    assert report["submodule_contains_em"] == 0.5 and report["submodule_f1"] == 0.5
    assert report["em"] == 0.5 and report["contains_em"] == 1.0  # end to end: strict and the paper's non-strict
    assert report["documents_per_question"] == 1.5
    assert report["generation"]["protocol"] == "qagent"


def test_the_protocol_follows_the_dialect_unless_named(qagent_file, tmp_path, monkeypatch):
    assert generator_protocol("auto", qagent_file) == "qagent"
    assert generator_protocol("s3", qagent_file) == "s3"
    other = tmp_path / "search_r1.jsonl"
    with TrajectoryWriter(other) as writer:
        writer.write([make_trajectory("q", "x", ["y"], [], answer="y")])
    assert generator_protocol("auto", other) == "s3" and generator_protocol("qagent", other) == "qagent"
    monkeypatch.setattr("agentic_retriever.base.llm.load_llm", lambda config: ScriptedGenerator())
    config = AgentEvalConfig(trajectories=str(qagent_file))
    config.generator.model = "frozen"
    assert evaluate_agent(config)["submodule_contains_em"] == 0.5  # no retriever opened: none configured
    config.judge.model = "judge"
    with pytest.raises(ValueError, match="asks no judge"):
        evaluate_agent(config)
