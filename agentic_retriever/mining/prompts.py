"""The scorer prompts of Agentic-R, byte for byte as printed in the paper
("Agentic-R: Learning to Retrieve for Agentic Search", appendix).

* Figure 6: listwise relevance scoring WITH a reference (sub-)answer (section 4.1.1, Eq. 1, A_i^sub given);
* Figure 7: the same WITHOUT one (A_i^sub = empty: the sub-answer was "Not Sure" or could not be parsed);
* Figure 8: sub-answer generation, one call per trajectory, gold answers shown.

What "byte for byte" means. The paper text is a PDF extraction; its typographic artifacts are undone by
exactly these rules and nothing else (tests/mining/test_mining_prompts.py holds the extracted text verbatim and
applies them):

1. ``****x****`` becomes ``**x**``: the figures print the prompts' literal markdown bold in a bold font,
   which the extraction wraps in a second pair of ``**`` (the authors' release has ``**directly answers**``);
2. backtick code spans lose their backticks (`` `{num}` `` -> ``{num}``, `` `<search> query </search>` ``
   -> ``<search> query </search>``): they mark the figures' typewriter font; Figure 7 prints the very
   sentence of Figure 6 without them, and Figure 5 does the same to Search-R1's prompt, which has none;
3. the one-space indent of Figure 6's passage lines is dropped;
4. placeholders get names (``{passage₁}``, ``{passage1}`` ... the ``...`` line -> the rendered passage list,
   ``{reference answer}`` -> the sub-answer); the list keeps the figure's own layout: one passage per line in
   Figure 6, a blank line between passages in Figure 7 (each figure's layout is kept as printed).

Renderings the paper leaves open, taken from the authors' release where it says:

* a passage is the corpus ``contents`` (``"Title"\\ntext``), as the release puts ``id_doc[pid]`` in
  the prompt;
* passages of each window are numbered from 1 (the release builds one prompt per window of ``batch_passages_size``);
* the trajectory of Figure 8 is the agent's response (prompt excluded): reasoning, searches, the
  ``<information>`` blocks and the answer, i.e. T = {t_1, q_1, D_1, ..., A} of section 4.1.1;
* the gold answers go between the figure's brackets joined by ", " (``[Mickey Gilley, Gilley]``).

Where the release differs from the paper (its prompt has a separate system message, ``* `` bullets, ``Passage [1]:``
with a colon and a different blank-line layout), the paper's figures win; the whole text is sent as one user
message through the scorer's chat template. `PROMPT_VERSION` names this rendering: it is part of every cache
key, so changing a prompt recomputes what depends on it.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentic_retriever.base.corpus import Passage

__all__ = ["LR_WITHOUT_SUB_ANSWER", "LR_WITH_SUB_ANSWER", "PROMPT_VERSION", "SUB_ANSWER", "passage_text",
           "relevance_prompt", "sub_answer_prompt"]

PROMPT_VERSION = "agentic-r-paper-fig6-7-8/v1"

_INTRO = (
    "You are an expert evaluator whose role is to determine how effectively a passage answers a search query.\n"
    "\n"
    "Given a Search Query and a list of passages, you need to assign a utility score (from a scale of 0 to 100) "
    "for each passage. The utility score should reflect how well each passage **directly answers** or **contains "
    "the necessary information** to resolve the information need of the Search Query.\n"
    "\n"
)

_REFERENCE_NOTE = (
    "I will also provide you with a reference answer to the Search Query to help you assess the utility score of "
    "each passage.\n"
    "\n"
)

_CRITERIA = (
    "The scoring criteria is shown as follows:\n"
    "\n"
    "**81-100 (Excellent Utility):** The passage directly and comprehensively addresses the Search Query or "
    "completely contains the answer required by the current Search Query.\n"
    "\n"
    "**61-80 (High Utility):** The passage contains the majority of the information needed to directly answer the "
    "Search Query but might miss some minor details.\n"
    "\n"
    "**41-60 (Moderate Utility):** The passage is on-topic and addresses a part of the query's intent, but it is "
    "not a comprehensive answer.\n"
    "\n"
    "**21-40 (Low Utility):** The passage mentions keywords from the query, but its main topic is different. It "
    "offers very limited value.\n"
    "\n"
    "**0-20 (Very Low Utility):** The passage is completely irrelevant to the Search Query. It contains no useful "
    "facts or is actively distracting.\n"
    "\n"
    "Now, I will give you the Search Query and {num} passages (each indicated by a number identifier []). Please "
    "compare all passages globally before outputting the utility scores, ensuring relative scoring consistency and "
    "more precise utility determination for each passage.\n"
    "\n"
)

_OUTPUT_RULE = (
    "Please output the utility scores of the passages (strictly as integers between 0 and 100) in the order of the "
    "passage identifiers, separating the scores with a single space. If there is only one passage, output a single "
    "number. Example output for 3 passages: \"68 42 97\". Only output the utility scores, without any words or "
    "explanations."
)

#: Figure 6 (with sub-answer). Placeholders: {num}, {query}, {passages}, {reference_answer}.
LR_WITH_SUB_ANSWER = (
    _INTRO + _REFERENCE_NOTE + _CRITERIA
    + "**Search Query:**\n{query}\n\n**Passages:**\n{passages}\n\n**Reference Answer:**\n{reference_answer}\n\n"
    + _OUTPUT_RULE
)

#: Figure 7 (without sub-answer). Placeholders: {num}, {query}, {passages}.
LR_WITHOUT_SUB_ANSWER = (
    _INTRO + _CRITERIA
    + "**Search Query:**\n\n{query}\n\n**Passages:**\n\n{passages}\n\n"
    + _OUTPUT_RULE
)

#: Separator between the "Passage [i] ..." entries, as each figure lays them out.
_PASSAGE_SEPARATOR = {LR_WITH_SUB_ANSWER: "\n", LR_WITHOUT_SUB_ANSWER: "\n\n"}

#: Figure 8. Placeholders: {question}, {gold_answers}, {trajectory}.
SUB_ANSWER = (
    "You are an **Expert Trajectory Analyst and Answer Generator**. Your task is to analyze Agentic Search Agent "
    "Search-R1's complete reasoning trajectory for answering a given Question. Based on the Question and its Gold "
    "Answer(s), you must infer the **precise sub-answer** intended to be found by each generated search query in the "
    "trajectory.\n"
    "\n"
    "Search-R1's Multi-Turn Reasoning-Search Process:\n"
    "\n"
    "To answer a question, Search-R1 needs to conduct reasoning first every time it gets new information. After "
    "reasoning, if Search-R1 finds it lacks some knowledge, it will call a search engine by <search> query </search> "
    "and obtain the top searched results between <information> and </information>. Search-R1 can search as many "
    "times as it wants. If Search-R1 finds no further external knowledge needed, it can directly provide the answer "
    "inside <answer> and </answer> without detailed illustrations. For example, <answer> xxx </answer>.\n"
    "\n"
    "Given the Question, Gold Answer(s) List and the Search-R1's Trajectory, you need to analyze the provided "
    "Trajectory step-by-step. For **every** search query, determine the **precise sub-answer** it was intended to "
    "find. The required sub-answer **MUST** be a direct fact or short piece of information that answers or resolves "
    "the <search> query and **CRITICALLY** must align with one of the provided Gold Answers.\n"
    "\n"
    "If you can find such a sub-answer for each query, output it. If the sub-answer of a certain query cannot be "
    "reliably inferred (which often occurs when the Search-R1 ultimately predicts an incorrect answer), output "
    "\"Not Sure\".\n"
    "\n"
    "Strictly wrap each generated sub-answer (or \"Not Sure\") using the tag <sub-answer> </sub-answer>. Generate at "
    "most one sub-answer for each query. Output the results according to the order of the corresponding queries in "
    "the trajectory. Output the answers **contiguously** and separated only by a single space. **Output only the "
    "answers wrapped with tags, nothing else.** For example: <sub-answer> Beijing </sub-answer> <sub-answer> Not "
    "Sure </sub-answer>.\n"
    "\n"
    "Here are the Question, Gold Answer(s) List and the Agent Trajectory:\n"
    "\n"
    "Question:\n"
    "\n"
    "{question}\n"
    "\n"
    "Gold Answer(s) List:\n"
    "\n"
    "[{gold_answers}]\n"
    "\n"
    "Agent Trajectory:\n"
    "\n"
    "{trajectory}"
)


def passage_text(passage: Passage) -> str:
    """A passage as the scorer sees it: the corpus ``contents`` (``"Title"\\ntext``), as the authors' release does."""
    return passage.contents


def relevance_prompt(query: str, passages: Sequence[str], sub_answer: str | None = None) -> str:
    """The listwise scoring prompt for one window of passages: Figure 6 with a sub-answer, Figure 7 without.

    `passages` are already rendered (`passage_text`); they are numbered ``Passage [1]``... in order.
    """
    if not passages:
        raise ValueError("a relevance prompt needs at least one passage")
    template = LR_WITH_SUB_ANSWER if sub_answer is not None else LR_WITHOUT_SUB_ANSWER
    listing = _PASSAGE_SEPARATOR[template].join(f"Passage [{i}] {p}" for i, p in enumerate(passages, start=1))
    return template.format(num=len(passages), query=query, passages=listing, reference_answer=sub_answer)


def sub_answer_prompt(question: str, golden_answers: Sequence[str], trajectory_text: str) -> str:
    """Figure 8 for one trajectory: the question, its gold answers and the agent's whole response."""
    return SUB_ANSWER.format(question=question, gold_answers=", ".join(golden_answers), trajectory=trajectory_text)
