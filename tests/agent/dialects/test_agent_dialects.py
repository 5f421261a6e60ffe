import pytest

from agent.dialects import Action, SearchR1Dialect, get_dialect
from agentic_retriever.base.corpus import ScoredPassage

EXPECTED_PROMPT = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get "
    "new information. After reasoning, if you find you lack some knowledge, you can call a search engine by "
    "<search> query </search> and it will return the top searched results between <information> and "
    "</information>. You can search as many times as your want. If you find no further external knowledge "
    "needed, you can directly provide the answer inside <answer> and </answer>, without detailed "
    "illustrations. For example, <answer> Beijing </answer>. Question: who wrote hamlet?\n"
)
EXPECTED_INVALID = (
    "\nMy previous action is invalid. If I want to search, I should put the query between <search> and "
    "</search>. If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again.\n"
)


@pytest.fixture
def dialect() -> SearchR1Dialect:
    return get_dialect("search_r1")


@pytest.mark.parametrize("question", ["who wrote hamlet", "  who wrote hamlet?  ", "who wrote hamlet?\n"])
def test_prompt_is_the_release_text_byte_for_byte(dialect, question):
    assert dialect.build_prompt(question) == EXPECTED_PROMPT


def test_prompt_rejects_an_empty_question_and_initial_passages(dialect):
    with pytest.raises(ValueError, match="empty"):
        dialect.build_prompt("   ")
    with pytest.raises(ValueError, match="retrieves nothing"):
        dialect.build_prompt("q", [[ScoredPassage("1", "T", "x")]])


def test_invalid_action_message_and_stop_strings_are_the_release_ones(dialect):
    assert dialect.invalid_action_message == EXPECTED_INVALID
    assert dialect.stop == ("</search>", "</answer>")
    assert dialect.search_disabled_on_last_turn


@pytest.mark.parametrize("turn, action", [
    ("<think>x</think>\n<search> who wrote hamlet </search>", Action("search", ("who wrote hamlet",))),
    ("<answer> Shakespeare </answer>", Action("answer", answer="Shakespeare")),
    ("<search>\nmulti\nline\n</search>", Action("search", ("multi\nline",))),
    ("<search>   </search>", Action("search", ("",))),  # an empty query is still a search call ([R])
    ("<answer></answer>", Action("answer", answer="")),
    ("<answer> Paris </answer> then <search> more </search>", Action("answer", answer="Paris")),  # first decides
    ("<search> a </search><search> b </search>", Action("search", ("a",))),  # repeated: the first one
    ("<search> unclosed query", Action("invalid")),
    ("<search> mixed </answer>", Action("invalid")),  # the closing tag must match
    ("<search> outer <answer> inner </answer> </search>", Action("search", ("outer <answer> inner </answer>",))),
    ("<answer> outer <search> q </search>", Action("search", ("q",))),  # nested: first complete pair wins
    ("<SEARCH> q </SEARCH>", Action("invalid")),
    ("just thinking, no tags", Action("invalid")),
    ("", Action("invalid")),
])
def test_parser_edge_cases(dialect, turn, action):
    assert dialect.parse_action(turn) == action


def test_turns_are_cut_after_the_first_stop_string(dialect):
    assert dialect.truncate_turn("<search> q </search> trailing <answer>a</answer>") == "<search> q </search>"
    assert dialect.truncate_turn("<answer> a </answer><search> q </search>") == "<answer> a </answer>"
    assert dialect.truncate_turn("no stop here") == "no stop here"


def test_observation_is_the_release_format(dialect):
    passages = [ScoredPassage("7", "Hamlet", "Hamlet is a tragedy.", 0.9),
                ScoredPassage("3", "William Shakespeare", "An English playwright.\nBorn 1564.", 0.8)]
    assert dialect.format_observation([passages]) == (
        '\n\n<information>Doc 1(Title: "Hamlet") Hamlet is a tragedy.\n'
        'Doc 2(Title: "William Shakespeare") An English playwright.\nBorn 1564.</information>\n\n')
    assert dialect.format_observation([[]]) == "\n\n<information></information>\n\n"


def test_answer_is_the_last_answer_of_the_response(dialect):
    response = "<answer> first </answer>\n\n<information>x</information>\n\n<answer>  second\n</answer>"
    assert dialect.extract_answer(response) == "second"
    assert dialect.extract_answer("<answer> unclosed") is None


def test_unknown_dialect_names_the_choices():
    with pytest.raises(ValueError, match="search_r1"):
        get_dialect("nope")


def test_a_search_action_needs_a_query():
    with pytest.raises(ValueError):
        Action("search")
    with pytest.raises(ValueError):
        Action("answer", queries=("q",))


def test_every_dialects_settings_share_one_base_named_after_its_dialect():
    """One validation and one environment share for all of them (`agent.dialects.base.DialectSettings`)."""
    from agent.dialects.base import DialectSettings
    from agent.dialects.qagent import QAgentDialect, QAgentSettings
    from agent.dialects.reflect import ReflectDialect, ReflectSettings
    from agent.dialects.s3 import S3Dialect, S3Settings
    from agent.env import EnvConfig

    for settings, dialect in ((QAgentSettings, QAgentDialect), (ReflectSettings, ReflectDialect),
                              (S3Settings, S3Dialect)):
        assert issubclass(settings, DialectSettings) and settings.DIALECT == dialect.name
        env = EnvConfig(**settings().env_fields())  # every field not the dialect's own is the environment's
        assert env.dialect == dialect.name and env.topk == settings().topk
        with pytest.raises(ValueError, match=f"{settings.__name__}.max_turns must be at least 1, got 0"):
            settings(max_turns=0)
    assert set(S3Settings().env_fields()) == {"dialect", "topk", "max_turns", "max_context_tokens"}
