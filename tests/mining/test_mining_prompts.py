"""The scorer prompts are the paper's Figures 6, 7 and 8, byte for byte.

The figure texts below are copied verbatim from the paper text
("Agentic-R: Learning to Retrieve for Agentic Search", appendix), PDF-extraction
artifacts included; `undo_extraction` applies the four documented rules of `agentic_retriever.mining.prompts`
and nothing else.
"""

from __future__ import annotations

import re

import pytest

from agentic_retriever.base.corpus import Passage
from agentic_retriever.mining import prompts
from agentic_retriever.mining.prompts import passage_text, relevance_prompt, sub_answer_prompt

FIGURE_6 = '''You are an expert evaluator whose role is to determine how effectively a passage answers a search query.

Given a Search Query and a list of passages, you need to assign a utility score (from a scale of 0 to 100) for each passage. The utility score should reflect how well each passage ****directly answers**** or ****contains the necessary information**** to resolve the information need of the Search Query.

I will also provide you with a reference answer to the Search Query to help you assess the utility score of each passage.

The scoring criteria is shown as follows:

****81-100 (Excellent Utility):**** The passage directly and comprehensively addresses the Search Query or completely contains the answer required by the current Search Query.

****61-80 (High Utility):**** The passage contains the majority of the information needed to directly answer the Search Query but might miss some minor details.

****41-60 (Moderate Utility):**** The passage is on-topic and addresses a part of the query's intent, but it is not a comprehensive answer.

****21-40 (Low Utility):**** The passage mentions keywords from the query, but its main topic is different. It offers very limited value.

****0-20 (Very Low Utility):**** The passage is completely irrelevant to the Search Query. It contains no useful facts or is actively distracting.

Now, I will give you the Search Query and `{num}` passages (each indicated by a number identifier `[]`). Please compare all passages globally before outputting the utility scores, ensuring relative scoring consistency and more precise utility determination for each passage.

****Search Query:****
`{query}`

****Passages:****
 Passage [1] `{passage1}`
 Passage [2] `{passage2}`
 ...

****Reference Answer:****
`{reference answer}`

Please output the utility scores of the passages (strictly as integers between 0 and 100) in the order of the passage identifiers, separating the scores with a single space. If there is only one passage, output a single number. Example output for 3 passages: "68 42 97". Only output the utility scores, without any words or explanations.'''

FIGURE_7 = '''You are an expert evaluator whose role is to determine how effectively a passage answers a search query.

Given a Search Query and a list of passages, you need to assign a utility score (from a scale of 0 to 100) for each passage. The utility score should reflect how well each passage ****directly answers**** or ****contains the necessary information**** to resolve the information need of the Search Query.

The scoring criteria is shown as follows:

****81-100 (Excellent Utility):**** The passage directly and comprehensively addresses the Search Query or completely contains the answer required by the current Search Query.

****61-80 (High Utility):**** The passage contains the majority of the information needed to directly answer the Search Query but might miss some minor details.

****41-60 (Moderate Utility):**** The passage is on-topic and addresses a part of the query's intent, but it is not a comprehensive answer.

****21-40 (Low Utility):**** The passage mentions keywords from the query, but its main topic is different. It offers very limited value.

****0-20 (Very Low Utility):**** The passage is completely irrelevant to the Search Query. It contains no useful facts or is actively distracting.

Now, I will give you the Search Query and {num} passages (each indicated by a number identifier []). Please compare all passages globally before outputting the utility scores, ensuring relative scoring consistency and more precise utility determination for each passage.

****Search Query:****

{query}

****Passages:****

Passage [1] {passage₁}

Passage [2] {passage₂}

...

Please output the utility scores of the passages (strictly as integers between 0 and 100) in the order of the passage identifiers, separating the scores with a single space. If there is only one passage, output a single number. Example output for 3 passages: "68 42 97". Only output the utility scores, without any words or explanations.'''

FIGURE_8 = '''You are an **Expert Trajectory Analyst and Answer Generator**. Your task is to analyze Agentic Search Agent Search-R1's complete reasoning trajectory for answering a given Question. Based on the Question and its Gold Answer(s), you must infer the **precise sub-answer** intended to be found by each generated search query in the trajectory.

Search-R1's Multi-Turn Reasoning-Search Process:

To answer a question, Search-R1 needs to conduct reasoning first every time it gets new information. After reasoning, if Search-R1 finds it lacks some knowledge, it will call a search engine by `<search> query </search>` and obtain the top searched results between `<information>` and `</information>`. Search-R1 can search as many times as it wants. If Search-R1 finds no further external knowledge needed, it can directly provide the answer inside `<answer>` and `</answer>` without detailed illustrations. For example, `<answer> xxx </answer>`.

Given the Question, Gold Answer(s) List and the Search-R1's Trajectory, you need to analyze the provided Trajectory step-by-step. For **every** search query, determine the **precise sub-answer** it was intended to find. The required sub-answer **MUST** be a direct fact or short piece of information that answers or resolves the `<search>` query and **CRITICALLY** must align with one of the provided Gold Answers.

If you can find such a sub-answer for each query, output it. If the sub-answer of a certain query cannot be reliably inferred (which often occurs when the Search-R1 ultimately predicts an incorrect answer), output "Not Sure".

Strictly wrap each generated sub-answer (or "Not Sure") using the tag `<sub-answer> </sub-answer>`. Generate at most one sub-answer for each query. Output the results according to the order of the corresponding queries in the trajectory. Output the answers **contiguously** and separated only by a single space. **Output only the answers wrapped with tags, nothing else.** For example: `<sub-answer> Beijing </sub-answer> <sub-answer> Not Sure </sub-answer>`.

Here are the Question, Gold Answer(s) List and the Agent Trajectory:

Question:

{question}

Gold Answer(s) List:

[{gold_answers}]

Agent Trajectory:

{trajectory}'''


def undo_extraction(text: str) -> str:
    """The documented rules 1-3: literal bold, typewriter backticks, Figure 6's indent."""
    text = re.sub(r"\*\*\*\*(.+?)\*\*\*\*", r"**\1**", text)
    text = re.sub(r"`([^`\n]*)`", r"\1", text)
    return re.sub(r"^ (Passage \[|\.\.\.)", r"\1", text, flags=re.MULTILINE)


QUERY = "Gilley's Club founder"
PASSAGES = ['"Gilley\'s Club"\nGilley\'s was a bar/honky tonk founded in 1971 by Mickey Gilley.',
            '"Honky-tonk"\nA honky-tonk is a bar that provides country music {with braces}.']
SUB_ANSWER = "Mickey Gilley"


def test_figure_6_with_sub_answer_is_byte_exact():
    expected = (undo_extraction(FIGURE_6)
                .replace("{num}", "2").replace("{query}", QUERY)
                .replace("{passage1}", PASSAGES[0]).replace("{passage2}", PASSAGES[1])
                .replace("\n...\n", "\n")  # the figure's "and so on" line: exactly two passages here
                .replace("{reference answer}", SUB_ANSWER))
    assert relevance_prompt(QUERY, PASSAGES, SUB_ANSWER) == expected
    assert "****" not in expected and "`" not in expected and "**directly answers**" in expected


def test_figure_7_without_sub_answer_is_byte_exact():
    expected = (undo_extraction(FIGURE_7)
                .replace("{num}", "2").replace("{query}", QUERY)
                .replace("{passage\u2081}", PASSAGES[0]).replace("{passage\u2082}", PASSAGES[1])
                .replace("\n\n...\n\n", "\n\n"))
    assert relevance_prompt(QUERY, PASSAGES, None) == expected
    assert "Reference Answer" not in expected and "reference answer" not in expected


def test_figure_8_sub_answer_prompt_is_byte_exact():
    trajectory = "<think> a </think>\n<search> q1 </search>\n\n<information>Doc 1(Title: \"T\") x</information>\n\n"
    expected = (undo_extraction(FIGURE_8).replace("{question}", "Who founded it?")
                .replace("{gold_answers}", "Mickey Gilley, Gilley").replace("{trajectory}", trajectory))
    assert sub_answer_prompt("Who founded it?", ["Mickey Gilley", "Gilley"], trajectory) == expected
    assert expected.endswith(trajectory) and "<sub-answer> Beijing </sub-answer> <sub-answer> Not Sure" in expected


def test_the_extraction_rules_change_only_typography():
    for figure in (FIGURE_6, FIGURE_7, FIGURE_8):
        words = lambda t: re.sub(r"[*`\u2081\u2082\d\s]", "", t)
        assert words(undo_extraction(figure)) == words(figure)


def test_windows_are_numbered_from_one_with_each_figures_layout():
    texts = [f"passage {i}" for i in range(10)]
    with_sub = relevance_prompt("q", texts, "a")
    without = relevance_prompt("q", texts, None)
    assert "identifier []" in with_sub and "Search Query and 10 passages" in with_sub
    assert "Passage [9] passage 8\nPassage [10] passage 9\n\n**Reference Answer:**\na\n\n" in with_sub
    assert "Passage [9] passage 8\n\nPassage [10] passage 9\n\nPlease output" in without
    assert "**Search Query:**\n\nq\n\n**Passages:**\n\nPassage [1] passage 0" in without


def test_passages_are_the_corpus_contents_and_empty_windows_are_refused():
    assert passage_text(Passage("7", "Hamlet", "A tragedy.")) == '"Hamlet"\nA tragedy.'
    with pytest.raises(ValueError):
        relevance_prompt("q", [], None)


def test_prompt_version_is_named():
    assert prompts.PROMPT_VERSION and "fig6" in prompts.PROMPT_VERSION
