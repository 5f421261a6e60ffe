"""Generation Accuracy of a frozen generator: s3's answer metric ("s3: You Don't Need That Much Data to Train a
Search Agent via RL", arXiv 2505.14146, section 4.1 Eq. 3, Appendix A.4, Figures 12 and 13).

    GenAcc = span_check OR judge_check

The frozen generator answers the question from the searcher's documents (Figure 12 prompt); `span_check` accepts
the answer when a normalised golden answer is a token span of the normalised answer; only when it fails is the
judge LLM asked whether the answer contains a golden answer (Figure 13 prompt). Both LLMs are called through the
project's `LLM` protocol, one batched `generate` call each (the judge call skipped when every span check passes).

Prompt details [P] leaves open, read from the authors' release [R] (github.com/pat-jj/s3, ``rag_2.py``) or
inferred [I]: the context lists the documents as ``Doc {i} (Title: {title})\\n{text}\\n\\n`` [R]; the golden
answers fill the judge prompt as a Python list literal [I]; prompts go through the model's chat template
(`LLM.chat_prompt`) [I]; decoding is greedy.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from agentic_retriever.base.corpus import Passage
from agentic_retriever.base.llm.protocol import LLM, Generation, Prompt, SamplingParams, generate_checked
from agentic_retriever.base.qa_metrics import Golden, golden_strings, span_match

__all__ = ["GENERATOR_PROMPT", "GENERATOR_SAMPLING", "JUDGE_PROMPT", "JUDGE_SAMPLING", "S3_GENERATOR",
           "FirstDocumentsReader", "GenAcc", "GenAccResult", "GeneratorPrompt", "format_context", "gen_acc",
           "generate_answers", "generation_accuracy", "judge_check", "span_check"]

#: Figure 12 of [P], byte for byte as the paper's text gives it; placeholders ``{context}`` and ``{question}``.
GENERATOR_PROMPT = (
    "Use the following contexts (some might be irrelevant) on demand: Contexts: {context} Question: {question} "
    "Important: You MUST directly answer the question without any other text."
)

#: Figure 13 of [P], byte for byte (its quotes are \u2019); placeholders ``{response}`` and ``{golden_answers}``.
JUDGE_PROMPT = (
    "Please check if any of the golden answers is contained in the following response: {response} "
    "Golden answers: {golden_answers} Please directly answer with \u2019yes\u2019 or \u2019no\u2019."
)

GENERATOR_SAMPLING = SamplingParams(max_new_tokens=128)
JUDGE_SAMPLING = SamplingParams(max_new_tokens=8)

_VERDICT = re.compile(r"^\W*(yes|no)\b", re.IGNORECASE)

How = Literal["span", "judge", "none"]


def format_context(documents: Sequence[Passage]) -> str:
    """The generator's ``{context}``: ``Doc {i} (Title: {title})\\n{text}\\n\\n`` per document, from 1 ([R])."""
    return "".join(f"Doc {i} (Title: {d.title})\n{d.text}\n\n" for i, d in enumerate(documents, start=1))


@dataclass(frozen=True)
class GeneratorPrompt:
    """How a frozen generator is asked: `template` with the placeholders ``{context}`` and ``{question}``,
    `context`, which writes the documents into ``{context}``, and `question`, which writes the question into
    ``{question}`` (as given by default). s3's is `S3_GENERATOR`; QAgent's is `agent.rewards.qagent.QAGENT_GENERATOR`."""

    template: str
    context: Callable[[Sequence[Passage]], str]
    question: Callable[[str], str] = str

    def render(self, question: str, documents: Sequence[Passage]) -> str:
        """The user message for one question and its documents."""
        return self.template.format(context=self.context(documents), question=self.question(question))


#: s3's generator prompt: Figure 12 with the release's document list.
S3_GENERATOR = GeneratorPrompt(GENERATOR_PROMPT, format_context)


class FirstDocumentsReader:
    """A frozen generator by rule: it answers with the first `documents` documents of its Figure 12 context, as
    `format_context` wrote them (titles included), and with "" when the context is empty. Its Generation Accuracy
    is therefore whether a golden answer occurs in those documents: the "answer in the top-k passages" accuracy of
    open-domain QA ("Dense Passage Retrieval for Open-Domain Question Answering", arXiv 2004.04906, section 5.1),
    measured on the searcher's selection instead of a ranking.

    What it is for: a deterministic generator that needs no model, answers exactly when the selected documents
    hold the answer, and reads only the first `documents` of them (a reader with a small window): the task on
    which `benchmarks/experiments/s3/s3_training.py` shows that the s3 trainer learns to select (docs/rl.md, "s3"). It implements
    the `LLM` protocol's `generate` and `chat_prompt` (no chat template) for `generate_answers`; it has no
    tokenizer and is never a policy.

        reader = FirstDocumentsReader(1)
        generate_answers(reader, ["who?"], [[Passage("7", "Ada", "Ada Lovelace wrote it.")]])  # ['Doc 1 (Title: Ada)...']
    """

    def __init__(self, documents: int = 1):
        if documents < 1:
            raise ValueError(f"FirstDocumentsReader reads at least one document, got documents={documents}")
        self.documents = documents
        self.name = f"first-documents-reader-{documents}"
        self.fingerprint = f"{self.name}:v1"  # the naive-RAG cache's key (agentic_retriever.base.fingerprint)

    @property
    def tokenizer(self):
        return None

    def chat_prompt(self, user_message: str) -> str:
        return user_message

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Generation]]:
        return [[Generation(self.answer(prompt), [], "stop")] * params.n for prompt in prompts]

    def answer(self, prompt: Prompt) -> str:
        """The first `documents` documents of a `GENERATOR_PROMPT`'s context; ValueError on any other prompt."""
        head, middle = GENERATOR_PROMPT.split("{context}")[0], " Question: "
        if not isinstance(prompt, str) or not prompt.startswith(head) or middle not in prompt:
            raise ValueError(f"{self.name} reads the Figure 12 generator prompt; got {str(prompt)[:80]!r}")
        context = prompt[len(head):].rsplit(middle, 1)[0]
        end = context.find(f"\n\nDoc {self.documents + 1} (Title: ")
        return (context if end < 0 else context[:end]).strip()


def span_check(prediction: str | None, golden: Golden) -> bool:
    """A normalised golden answer is a contiguous run of tokens of the normalised prediction (A.4 step 2).

    Normalisation: lowercase, drop punctuation, drop the articles a/an/the, collapse whitespace; tokens are runs
    of word characters (pyserini's ``SimpleTokenizer``), so "cat" is not in "catalog"
    (`agentic_retriever.base.qa_metrics.span_match`). No prediction, or a gold that normalises to nothing, fails.
    """
    return span_match(prediction, golden) == 1.0


def judge_check(judge_answer: str) -> bool | None:
    """The judge's verdict: True for yes, False for no, None when it is neither (malformed).

    Accepted: the answer's first word, after any leading non-word characters (spaces, quotes, ``*``...), is
    "yes" or "no" in any case, as a whole word: "Yes", " \u2019no\u2019.", "**YES**", "yes, it is" are verdicts;
    "The answer is yes", "yesno", "" are malformed.
    """
    match = _VERDICT.match(judge_answer)
    return None if match is None else match.group(1).lower() == "yes"


@dataclass(frozen=True)
class GenAcc:
    """One answer's Generation Accuracy: `accuracy` 1.0 or 0.0, decided by `how` ("span", "judge", or "none"
    when both fail); `judge_answer` is the judge's raw text when it was asked, `judge_malformed` when unreadable."""

    prediction: str
    accuracy: float
    how: How
    judge_answer: str | None = None
    judge_malformed: bool = False


@dataclass(frozen=True)
class GenAccResult:
    """GenAcc of a batch, in input order, with the judge's call counts."""

    items: list[GenAcc]
    judge_calls: int
    judge_malformed: int

    @property
    def accuracies(self) -> list[float]:
        return [item.accuracy for item in self.items]


def generate_answers(generator: LLM, questions: Sequence[str], documents: Sequence[Sequence[Passage]],
                     params: SamplingParams = GENERATOR_SAMPLING, prompt: GeneratorPrompt = S3_GENERATOR) -> list[str]:
    """A_hat = G(Q, D) for every question: the prompts (s3's Figure 12 unless `prompt` says otherwise) in ONE
    `generate` call, answers stripped."""
    if len(questions) != len(documents):
        raise ValueError(f"documents must be parallel to questions: got {len(documents)} for {len(questions)}")
    prompts = [generator.chat_prompt(prompt.render(question, docs)) for question, docs in zip(questions, documents)]
    return [gens[0].text.strip() for gens in generate_checked(generator, prompts, params)]


def gen_acc(predictions: Sequence[str], golden: Sequence[Golden], judge: LLM | None,
            params: SamplingParams = JUDGE_SAMPLING) -> GenAccResult:
    """Eq. 3 for every prediction: span_check, and for the predictions it fails, ONE judge `generate` call
    (`judge` None: the span check alone decides)."""
    if len(predictions) != len(golden):
        raise ValueError(f"golden answers must be parallel to predictions: got {len(golden)} for {len(predictions)}")
    spans = [span_check(p, g) for p, g in zip(predictions, golden)]
    if judge is None:
        return GenAccResult([GenAcc(p, float(ok), "span" if ok else "none") for p, ok in zip(predictions, spans)], 0, 0)
    asked = [i for i, ok in enumerate(spans) if not ok]
    prompts = [judge.chat_prompt(JUDGE_PROMPT.format(response=predictions[i],
                                                     golden_answers=str(golden_strings(golden[i]))))
               for i in asked]
    answers = dict(zip(asked, (gens[0].text for gens in generate_checked(judge, prompts, params)))) if prompts else {}
    items = []
    for i, prediction in enumerate(predictions):
        if spans[i]:
            items.append(GenAcc(prediction, 1.0, "span"))
            continue
        verdict = judge_check(answers[i])
        items.append(GenAcc(prediction, float(bool(verdict)), "judge" if verdict else "none", answers[i],
                            verdict is None))
    return GenAccResult(items, len(prompts), sum(item.judge_malformed for item in items))


def generation_accuracy(questions: Sequence[str], documents: Sequence[Sequence[Passage]],
                        golden: Sequence[Golden], *, generator: LLM, judge: LLM | None,
                        generator_params: SamplingParams = GENERATOR_SAMPLING,
                        judge_params: SamplingParams = JUDGE_SAMPLING) -> GenAccResult:
    """Acc(G(Q, D), A) for a batch: `generate_answers` (one generator call) then `gen_acc` (at most one judge
    call; generator and judge may be one LLM; no judge: the span check alone)."""
    return gen_acc(generate_answers(generator, questions, documents, generator_params), golden, judge, judge_params)
