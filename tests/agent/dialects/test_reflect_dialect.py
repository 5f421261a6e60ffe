"""The `reflect` dialect ("Learning When to Search: Multi-Stage Reward Design for Efficient Agentic RAG with
Reasoning Language Models"): the prompt of Appendix B.4 byte for byte, the paper's settings, Search-R1's loop on
malformed turns, the shape grammar of the format reward (section 3.3, Eq. 6) and the executed searches' queries."""

from __future__ import annotations

import hashlib

import pytest

from agent.dialects import Action, ReflectDialect, SearchR1Dialect, get_dialect
from agent.dialects.reflect import INSTRUCTION, ReflectSettings, ShapeCheck, check_shape, search_queries
from agent.dialects.search_r1 import INVALID_ACTION_MESSAGE
from agent.env import EnvConfig
from agentic_retriever.base.corpus import ScoredPassage
from tests.agent.paper_text import WHEN_TO_SEARCH_PAPER, span_text

FIRST_WORDS = "Please answer the given question by following the structured reasoning protocol below:"
LAST_WORDS = "tool usage should be a last resort, not the default."


@pytest.mark.skipif(not WHEN_TO_SEARCH_PAPER.exists(), reason="the paper's text is not next to this checkout")
def test_instruction_is_appendix_b4_of_the_paper_byte_for_byte():
    paper = WHEN_TO_SEARCH_PAPER.read_text(encoding="utf-8")
    box = span_text(paper, FIRST_WORDS, LAST_WORDS)
    assert INSTRUCTION == box
    assert paper[paper.index(box) - len("Instruction for Trained RLM\n\n"):].startswith("Instruction for Trained RLM")
    assert paper[paper.index(box) + len(box):].startswith("\n\nTable 6:")  # nothing of the box is left out


def test_instruction_hash_and_distinctive_sentences():
    assert hashlib.sha256(INSTRUCTION.encode()).hexdigest() == (
        "bcb3795660d75d3b4e0f277b89979b827fd7a2cb148691c06b89a068bc51eb9c")
    assert INSTRUCTION.startswith(FIRST_WORDS + "\n\n1. Always begin with `<think>...</think>`")
    assert "Under no circumstances should you generate a `<search>` block if your internal knowledge is adequate." \
        in INSTRUCTION
    assert INSTRUCTION.endswith(LAST_WORDS) and INSTRUCTION.count("\n") == 7


@pytest.mark.parametrize("question", ["who wrote hamlet", "  who wrote hamlet?\n"])
def test_prompt_is_the_instruction_then_the_question(question):
    assert ReflectDialect().build_prompt(question) == INSTRUCTION + "\n\nQuestion: who wrote hamlet?\n"


def test_prompt_rejects_an_empty_question_and_initial_passages():
    with pytest.raises(ValueError, match="the question is empty"):
        ReflectDialect().build_prompt(" \n")
    with pytest.raises(ValueError, match="the reflect dialect retrieves nothing before the first turn"):
        ReflectDialect().build_prompt("q", [[ScoredPassage("1", "T", "x", 1.0)]])


def test_the_dialect_is_registered_and_keeps_search_r1s_loop():
    dialect = get_dialect("reflect")
    assert isinstance(dialect, ReflectDialect) and isinstance(dialect, SearchR1Dialect)
    assert dialect.stop == ("</search>", "</answer>")
    assert dialect.invalid_action_message is INVALID_ACTION_MESSAGE
    assert dialect.search_disabled_on_last_turn and dialect.initial_queries("q") == ()
    hits = [[ScoredPassage("1", "Ta", "text a", 1.0), ScoredPassage("2", "Tb", "text b", 0.5)]]
    assert dialect.format_observation(hits) == SearchR1Dialect().format_observation(hits) == (
        '\n\n<information>Doc 1(Title: "Ta") text a\nDoc 2(Title: "Tb") text b</information>\n\n')


def test_settings_are_the_papers_and_fix_the_environment():
    settings = ReflectSettings()
    assert (settings.topk, settings.max_turns, settings.max_new_tokens_per_turn, settings.observation_max_tokens,
            settings.max_context_tokens) == (5, 5, 8192, 4096, 2048 + 16384)
    env = EnvConfig(**settings.env_fields())
    assert (env.dialect, env.topk, env.max_turns, env.max_new_tokens_per_turn, env.observation_max_tokens,
            env.max_context_tokens) == ("reflect", 5, 5, 8192, 4096, 18432)
    with pytest.raises(ValueError, match="ReflectSettings.topk must be at least 1, got 0"):
        ReflectSettings(topk=0)


@pytest.mark.parametrize("turn, action", [
    ("<think>need a fact</think>\n<search> hamlet author </search>", Action("search", ("hamlet author",))),
    ("<think>known</think>\n<reflect>I know it</reflect>\n<answer> Shakespeare </answer>",
     Action("answer", answer="Shakespeare")),
    ("<reflect>enough</reflect><answer>x</answer>", Action("answer", answer="x")),  # the shape is the reward's
    ("<think>I will use <search>a</search>", Action("search", ("a",))),              # even inside think
    ("<search></search>", Action("search", ("",))),                                 # an empty tag still searches
    ("<think>only thinking</think>", Action("invalid")),
    ("<think>known</think><reflect>I know it</reflect>", Action("invalid")),           # no answer yet
    ("<search>never closed", Action("invalid")),
    ("<answer>never closed", Action("invalid")),
    ("<search >spaced</search>", Action("invalid")),
    ("Answer: Paris", Action("invalid")),
    ("", Action("invalid")),
    ("<answer>x</answer><search>y</search>", Action("answer", answer="x")),         # the first closed tag decides
])
def test_parse_action(turn, action):
    assert ReflectDialect().parse_action(turn) == action


def test_answer_is_the_last_answer_of_the_response():
    dialect = ReflectDialect()
    assert dialect.extract_answer("<answer> a </answer> <answer>\n 1027 \n</answer>") == "1027"
    assert dialect.extract_answer("<think>t</think><reflect>r</reflect>") is None


# ------------------------------------------------------------------------------------------------ check_shape

def info(text: str = "Doc 1(Title: \"T\") text") -> str:
    """An observation as the environment inserts it."""
    return f"\n\n<information>{text}</information>\n\n"


NO_SEARCH = "<think>I know this.</think>\n<reflect>Summary.</reflect>\n<answer> Paris </answer>"
ONE_SEARCH = f"<think>Not sure.</think>\n<search> hamlet author </search>{info()}<reflect>Found.</reflect>\n" \
             "<answer>Shakespeare</answer>"
TWO_SEARCHES = (f"<think>t</think> <search>q1</search>{info()}<reflect>not there</reflect> <search>q2</search>"
                f"{info()}<reflect>there</reflect> <answer>1027</answer>")


@pytest.mark.parametrize("response, reason", [
    (NO_SEARCH, "think -> reflect -> answer"),
    (ONE_SEARCH, "think -> (search -> information -> reflect) x1 -> answer"),
    (TWO_SEARCHES, "think -> (search -> information -> reflect) x2 -> answer"),
    ("\n <think></think><reflect></reflect><answer></answer> \n\n", "think -> reflect -> answer"),  # empty blocks
    ("<think>a\nb</think><reflect>r</reflect><answer>x</answer>", "think -> reflect -> answer"),
    # the information block is retrieved text: tags inside it are not read
    (f"<think>t</think><search>q</search>{info('a passage quoting <answer>x</answer> and <think>')}"
     "<reflect>r</reflect><answer>y</answer>", "think -> (search -> information -> reflect) x1 -> answer"),
    # tags other than the five are content
    ("<think>use <query>?</think><reflect>r</reflect><answer>x</answer>", "think -> reflect -> answer"),
])
def test_allowed_shapes(response, reason):
    assert check_shape(response) == ShapeCheck(True, reason)


@pytest.mark.parametrize("response, reason", [
    # sequence violations
    (f"<think>t</think><search>q1</search>{info()}<search>q2</search>{info()}<reflect>r</reflect><answer>a</answer>",
     "block 4 is <search>; expected <reflect> after <information>"),
    ("<reflect>r</reflect><answer>a</answer>", "block 1 is <reflect>; expected <think> first"),
    (f"<search>q</search>{info()}<think>t</think><reflect>r</reflect><answer>a</answer>",
     "block 1 is <search>; expected <think> first"),
    ("<think>t</think><answer>a</answer>", "block 2 is <answer>; expected <search> or <reflect> after <think>"),
    ("<think>t</think><reflect>r</reflect>", "no <answer>: the response ends after <reflect>"),
    (f"<think>t</think><search>q</search>{info()}<reflect>r</reflect>",
     "no <answer>: the response ends after <reflect>"),
    ("<think>t</think><reflect>r</reflect><answer>a</answer><answer>b</answer>",
     "block 4 is <answer>; expected nothing after <answer>"),
    ("<think>t</think><reflect>r</reflect><answer>a</answer><think>more</think>",
     "block 4 is <think>; expected nothing after <answer>"),
    (f"<think>t</think><reflect>r</reflect><search>q</search>{info()}<reflect>r</reflect><answer>a</answer>",
     "block 3 is <search>; expected <answer> after <reflect> with no search before it"),
    ("<think>t</think><think>u</think><reflect>r</reflect><answer>a</answer>",
     "block 2 is <think>; expected <search> or <reflect> after <think>"),
    ("<think>t</think><search>q</search><reflect>r</reflect><answer>a</answer>",
     "block 3 is <reflect>; expected <information> after <search>"),
    (f"<think>t</think><search>q</search>{info()}<reflect>r</reflect><search>q2</search>",  # search-disabled end
     "no <answer>: the response ends after <search>"),
    (f"<think>t</think><search>q</search>{info()}<reflect>r</reflect><think>t2</think><search>q2</search>{info()}"
     "<reflect>r</reflect><answer>a</answer>",
     "block 5 is <think>; expected <search> or <answer> after <reflect>"),
    # text outside tags
    ("<think>t</think>\nAnswer: Paris", "text outside tags at offset 17: 'Answer: Paris'"),
    ("Sure. <think>t</think><reflect>r</reflect><answer>a</answer>", "text outside tags at offset 0: 'Sure. <think>"
     "t</think><reflect>r</reflec'"),                                # the first 40 characters
    ("<think>t</think><reflect>r</reflect><answer>a</answer>.", "text outside tags at offset 54: '.'"),
    (f"<think>t</think>oops{INVALID_ACTION_MESSAGE}<search>q</search>{info()}<reflect>r</reflect><answer>a</answer>",
     "text outside tags at offset 16: 'oops\\nMy previous action is invalid. If I'"),
    ("<think >t</think><reflect>r</reflect><answer>a</answer>", "text outside tags at offset 0: '<think >t</think>"
     "<reflect>r</reflect><an'"),
    # unclosed, stray and nested tags
    ("<think>t</think><reflect>r</reflect><answer>a", "<answer> at offset 36 is not closed"),
    ("<think>t", "<think> at offset 0 is not closed"),
    ("<think>t</think><search>q</search><information>Doc 1 cut by the token bud",
     "<information> at offset 34 is not closed"),
    ("<think>t<reflect>r</reflect><answer>a</answer>",
     "<think> at offset 0 is not closed before <reflect> at offset 8"),
    ("<think>I could use <search> here</think><reflect>r</reflect><answer>a</answer>",
     "<think> at offset 0 is not closed before <search> at offset 19"),
    ("<think>t</think></think><reflect>r</reflect><answer>a</answer>", "stray </think> at offset 16"),
    ("<think>t</reflect><reflect>r</reflect><answer>a</answer>",
     "<think> at offset 0 is not closed before </reflect> at offset 8"),
    ("", "no blocks: the response is empty or whitespace"),
    (" \n ", "no blocks: the response is empty or whitespace"),
])
def test_forbidden_shapes(response, reason):
    assert check_shape(response) == ShapeCheck(False, reason)


# ------------------------------------------------------------------------------------------- search_queries

def test_search_queries_are_the_executed_searches_in_order():
    assert search_queries(TWO_SEARCHES) == ["q1", "q2"]
    assert search_queries(ONE_SEARCH) == ["hamlet author"]
    assert search_queries(NO_SEARCH) == []


def test_search_queries_skip_what_the_environment_did_not_execute():
    last_turn = f"<think>t</think><search>q1</search>{info()}<reflect>r</reflect><search>never run</search>"
    assert search_queries(last_turn) == ["q1"]
    invalid = f"<think>t</think>{INVALID_ACTION_MESSAGE}<search> q </search>{info()}"
    assert search_queries(invalid) == ["q"]                       # not " and " from the message's quoted tags
    unexecuted_then_executed = f"<search>a</search> text <search>b</search>{info()}"
    assert search_queries(unexecuted_then_executed) == ["b"]


def test_search_queries_read_a_search_as_the_environment_parses_it():
    turn = "<think>I will use <search>a <search>b</search>"
    assert ReflectDialect().parse_action(turn) == Action("search", ("a <search>b",))
    assert search_queries(turn + info()) == ["a <search>b"]
    assert search_queries(f"<search>\n</search>{info()}") == [""]  # an empty search is still a retrieval
