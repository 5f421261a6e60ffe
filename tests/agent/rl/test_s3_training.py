"""Training the s3 searcher with Gain Beyond RAG in the embedded trainer ("s3: You Don't Need That Much Data to
Train a Search Agent via RL", arXiv 2505.14146): a step's rollouts scored with one generator call and at most one
judge call, both GBR variants, the training-question filters, an RL step end to end, and the settings refused
before any model loads."""

from __future__ import annotations

import json
import re

import pytest

from agent.dialects import SelectedDocuments
from agent.env import EnvConfig, Rollout
from agent.rewards import get_reward
from agent.rl import RLConfig, RLTrainer
from agent.rl.batch_reward import GainBeyondRagReward, prepare_reward
from agentic_retriever.base.corpus import Passage, ScoredPassage
from agentic_retriever.base.llm import LLMConfig
from agentic_retriever.base.llm.protocol import Generation
from agentic_retriever.base.qa_sources import QARow
from tests.fakes import FakeClient

ANSWER = re.compile(r"ANSWER: ([^\n]*)")


class DocumentReader:
    """A scripted frozen generator: answers with the first ``ANSWER: ...`` of its prompt's documents ("unknown"
    when none holds one); records every call's prompts."""

    name = "scripted-generator"

    def __init__(self):
        self.calls: list[list[str]] = []

    def chat_prompt(self, user_message: str) -> str:
        return user_message

    def generate(self, prompts, params) -> list[list[Generation]]:
        self.calls.append(list(prompts))
        answers = [(ANSWER.search(p).group(1) if ANSWER.search(p) else "unknown") for p in prompts]
        return [[Generation(a, [], "stop", None)] for a in answers]


class ScriptedJudge(DocumentReader):
    """Says yes to the responses in `accepts`, no to the rest."""

    name = "scripted-judge"

    def __init__(self, accepts: set[str]):
        super().__init__()
        self.accepts = accepts

    def generate(self, prompts, params) -> list[list[Generation]]:
        self.calls.append(list(prompts))
        return [[Generation("yes" if any(a in p for a in self.accepts) else "no", [], "stop", None)] for p in prompts]


class AnsweringClient(FakeClient):
    """A retriever with a content identity whose passages for a question hold its scripted ``ANSWER``."""

    def __init__(self, answers: dict[str, str]):
        super().__init__()
        self.answers = answers

    def identity(self) -> dict:
        return {"fake": "answering", "answers": self.answers}

    def retrieve(self, queries, topk, questions=None):
        self.calls.append((list(queries), topk, list(questions) if questions is not None else None))
        return [[ScoredPassage(f"{q}#{i}", f"Title {i}", f"passage {i} ANSWER: {self._answer(q)}", 1.0 - i / 10)
                 for i in range(topk)] for q in queries]

    def _answer(self, query: str) -> str:
        return next((answer for key, answer in self.answers.items() if key in query), "nothing")


def selected(question: str, answer: str) -> Rollout:
    """A finished s3 rollout whose searcher selected one document that makes the generator say `answer`."""
    docs = [Passage("d", "Doc", f"ANSWER: {answer}")]
    return Rollout(question, "prompt", [1], [], [], None, "answer", selection=SelectedDocuments(docs, {}))


ROWS = {"q0": QARow("q0", "capital of france?", ("Paris",)), "q1": QARow("q1", "capital of norway?", ("Oslo",)),
        "q2": QARow("q2", "capital of italy?", ("Rome",))}
NAIVE = {"q0": 0.0, "q1": 1.0, "q2": 1.0}


def gbr_step(gain: str, judge):
    """Four rollouts: q0 answered by span (acc 1) and by the judge (acc 1 with a judge), q1 wrong (judge says no),
    q2 right by span; naive RAG solved q1 and q2."""
    results = [selected("capital of france?", "It is Paris."), selected("capital of france?", "the French capital"),
               selected("capital of norway?", "Bergen"), selected("capital of italy?", "Rome")]
    rows = [ROWS["q0"], ROWS["q0"], ROWS["q1"], ROWS["q2"]]
    generator, asked = DocumentReader(), []

    def naive_rag(questions):
        asked.append([q.id for q in questions])
        return {q.id: NAIVE[q.id] for q in questions}

    scores, components = GainBeyondRagReward(get_reward(gain), generator, judge, naive_rag).score(results, rows)
    return scores, components, generator, asked


def test_a_step_is_scored_with_one_generator_call_and_one_judge_call_for_the_span_failures():
    judge = ScriptedJudge({"French capital"})
    scores, components, generator, asked = gbr_step("s3_gbr", judge)
    assert len(generator.calls) == 1 and len(generator.calls[0]) == 4  # every rollout in one call
    assert len(judge.calls) == 1 and len(judge.calls[0]) == 2  # only "the French capital" and "Bergen" failed the span
    assert "Bergen" in judge.calls[0][1] and "French capital" in judge.calls[0][0]
    assert asked == [["q0", "q0", "q1", "q2"]]
    assert [c["gen_acc"] for c in components] == [1.0, 1.0, 0.0, 1.0]
    assert [c["naive_rag_acc"] for c in components] == [0.0, 0.0, 1.0, 1.0]
    assert [c["judge_asked"] for c in components] == [0.0, 1.0, 1.0, 0.0]
    # the release's GBR: (Acc_s3 - Acc_RAG) + Acc_s3
    assert scores == [2.0, 2.0, -1.0, 1.0]
    assert [c["gbr"] for c in components] == [1.0, 1.0, -1.0, 0.0]  # Eq. 1's gain, logged for both variants


def test_the_paper_variant_scores_eq_1_and_without_a_judge_the_span_check_decides():
    scores, components, _, _ = gbr_step("s3_gbr_paper", judge=None)
    assert scores == [1.0, 0.0, -1.0, 0.0]  # Acc_s3 - Acc_RAG; "the French capital" fails the span check
    assert "judge_asked" not in components[0]
    with pytest.raises(ValueError, match="env.dialect s3"):
        GainBeyondRagReward(get_reward("s3_gbr"), DocumentReader(), None, lambda rows: NAIVE).score(
            [Rollout("q", "p", [1], [], [], "a", "answer")], [ROWS["q0"]])


def s3_config(tmp_path, policy: str, **overrides) -> RLConfig:
    settings = dict(agent=LLMConfig(model=policy), out=str(tmp_path / "run"), algorithm="grpo", steps=1,
                    prompts_per_step=2, samples_per_prompt=2, micro_batch_size=2, actor_lr=1e-3,
                    env=EnvConfig(dialect="s3", max_turns=1, topk=3, max_new_tokens_per_turn=8, temperature=1.0,
                                  max_context_tokens=1500),
                    reward="s3_gbr", generator=LLMConfig(model="frozen-generator"),
                    naive_rag_cache=str(tmp_path / "naive_rag"), progress=False, report_to=["none"])
    settings.update(overrides)
    return RLConfig(**settings)


TRAIN = [QARow("yn", "is oslo in norway?", ("yes",)), QARow("solved", "who wrote hamlet?", ("Shakespeare",)),
         QARow("a", "which city is number 1?", ("city 1",)), QARow("b", "which city is number 2?", ("city 2",))]
#: naive RAG (the question's own top-3) solves "solved" only; the yes/no question would be solved too
CLIENT_ANSWERS = {"hamlet": "William Shakespeare", "oslo": "yes", "number 1": "city 9", "number 2": "city 8"}


@pytest.fixture
def loaded(monkeypatch):
    """The LLMs `prepare_reward` loads, by config: a `DocumentReader` per load."""
    made: list[tuple[LLMConfig, DocumentReader]] = []

    def load_llm(config):
        made.append((config, DocumentReader()))
        return made[-1][1]
    monkeypatch.setattr("agent.rl.batch_reward.load_llm", load_llm)
    return made


def test_the_question_filters_drop_yes_no_and_naive_rag_solved_questions_and_count_them(tmp_path, loaded):
    client = AnsweringClient(CLIENT_ANSWERS)
    prepared = prepare_reward(s3_config(tmp_path, "policy"), client, TRAIN)
    assert [row.id for row in prepared.rows] == ["a", "b"]
    assert prepared.question_filters == {"questions": 4, "dropped_yes_no": 1, "dropped_naive_rag_solved": 1,
                                         "kept": 2}
    ((config, generator),) = loaded  # the generator, loaded once from its own settings; no judge
    assert config.model == "frozen-generator"
    assert len(generator.calls) == 1 and len(generator.calls[0]) == 3  # naive RAG of the non-yes/no questions
    assert client.calls == [(["who wrote hamlet?", "which city is number 1?", "which city is number 2?"], 3,
                             ["who wrote hamlet?", "which city is number 1?", "which city is number 2?"])]
    assert list((tmp_path / "naive_rag").glob("naive_rag-*.jsonl"))  # cached for the next run

    again = prepare_reward(s3_config(tmp_path, "policy", drop_yes_no=False), client, TRAIN)
    assert [row.id for row in again.rows] == ["a", "b"]  # naive RAG solves the yes/no question too
    assert again.question_filters == {"questions": 4, "dropped_yes_no": 0, "dropped_naive_rag_solved": 2, "kept": 2}
    assert len(loaded[-1][1].calls[0]) == 1  # only the yes/no question was not cached yet
    unfiltered = prepare_reward(s3_config(tmp_path, "policy", drop_yes_no=False, keep_naive_rag_failures=False),
                                client, TRAIN)
    assert len(unfiltered.rows) == 4 and unfiltered.question_filters["kept"] == 4
    with pytest.raises(ValueError, match="left no training question"):
        prepare_reward(s3_config(tmp_path, "policy"), client, TRAIN[:2])


@pytest.mark.slow
def test_an_rl_step_with_the_gbr_reward_runs_end_to_end_and_logs_its_components(tmp_path, tiny_causal_lm_dir,
                                                                                 loaded):
    trainer = RLTrainer(s3_config(tmp_path, tiny_causal_lm_dir), AnsweringClient(CLIENT_ANSWERS), TRAIN)
    ((_, generator),) = loaded
    assert generator is not trainer.llm and [row.id for row in trainer.rows] == ["a", "b"]
    before = len(generator.calls)
    policy = trainer.train()
    assert len(generator.calls) == before + 1  # the step's 4 rollouts, in one generator call
    assert len(generator.calls[-1]) == 4
    (metrics,) = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert {"reward", "gen_acc", "naive_rag_acc", "gbr", "selected_documents", "searches"} <= set(metrics)
    assert "em" not in metrics  # the searcher gives no answer of its own
    assert metrics["naive_rag_acc"] == 0.0 and metrics["selected_documents"] > 0
    # the generator reads "city 9" / "city 8" in the question's own documents: wrong, GBR 0 unless a search helped
    assert metrics["reward"] == pytest.approx(2 * metrics["gen_acc"])
    filters = json.loads((tmp_path / "run" / "question_filters.json").read_text())
    assert filters["kept"] == 2 and filters["dropped_yes_no"] == 1
    assert json.loads((policy / "rl_manifest.json").read_text())["question_filters"] == filters


def test_a_loaded_generator_is_used_instead_of_loading_one_and_only_for_a_gain(tmp_path, monkeypatch):
    monkeypatch.setattr("agent.rl.batch_reward.load_llm", lambda *a, **k: pytest.fail("loaded a generator"))
    reader = DocumentReader()
    prepared = prepare_reward(s3_config(tmp_path, "policy"), AnsweringClient(CLIENT_ANSWERS), TRAIN, generator=reader)
    assert [row.id for row in prepared.rows] == ["a", "b"] and prepared.reward.generator is reader
    assert len(reader.calls) == 1  # the naive-RAG filter ran on the given generator
    with pytest.raises(ValueError, match="does not use one"):
        prepare_reward(s3_config(tmp_path, "policy", reward="search_r1_em", env=EnvConfig()), FakeClient(), TRAIN,
                       generator=reader)


def test_an_s3_reward_without_a_generator_is_refused_before_any_model_loads(tmp_path, monkeypatch):
    monkeypatch.setattr("agent.rl.trainer.load_policy", lambda *a, **k: pytest.fail("loaded the policy"))
    monkeypatch.setattr("agent.rl.batch_reward.load_llm", lambda *a, **k: pytest.fail("loaded the generator"))
    client = AnsweringClient(CLIENT_ANSWERS)
    with pytest.raises(ValueError, match=r"reward s3_gbr .* set generator\.model"):
        RLTrainer(s3_config(tmp_path, "policy", generator=LLMConfig(model="")), client, TRAIN)
    with pytest.raises(ValueError, match="set env.dialect s3"):
        RLTrainer(s3_config(tmp_path, "policy", env=EnvConfig()), client, TRAIN)
    with pytest.raises(ValueError, match="unknown reward 'gbr'.*s3_gbr, s3_gbr_paper"):
        RLTrainer(s3_config(tmp_path, "policy", reward="gbr"), client, TRAIN)
    with pytest.raises(ValueError, match="reward 's3_gbr' takes no option lambda_f"):
        RLTrainer(s3_config(tmp_path, "policy", reward_options={"lambda_f": 0.4}), client, TRAIN)


class RankedClient:
    """Every query's passages in rank order; the answer is in the 5th (deeper than naive RAG's top 3)."""

    def identity(self) -> dict:
        return {"fake": "ranked"}

    def retrieve(self, queries, topk, questions=None):
        return [[ScoredPassage(f"{q}#{i}", f"T{i}", f"passage {i}" + (" ANSWER: Paris" if i == 4 else ""), 1 - i / 10)
                 for i in range(topk)] for q in queries]


def test_a_searcher_that_completes_at_once_gains_nothing_beyond_naive_rag(tmp_path):
    """GBR measures what search adds beyond naive RAG (s3, section 3: "s3 begins by retrieving top-k (k=3) documents
    from the original question, just like naive RAG"): a searcher that declares search_complete before searching
    hands the generator D_0, naive RAG's own documents, so its gain is 0 whatever env.topk is."""
    from agent.dialects.s3 import NAIVE_RAG_TOPK
    from agent.env import rollout
    from agent.s3_rag_baseline import NaiveRagCache, retriever_identity
    from tests.fakes import CharScriptedLLM

    client, generator = RankedClient(), DocumentReader()
    llm = CharScriptedLLM({"capital of france": ["<search_complete>True</search_complete>"]})
    env = EnvConfig(dialect="s3", topk=8, max_turns=2, max_new_tokens_per_turn=60, max_context_tokens=20000)
    [result] = rollout(["capital of france"], llm, client, env)
    naive = NaiveRagCache(tmp_path / "naive", retriever_identity(client), "scripted-generator", None, NAIVE_RAG_TOPK)
    reward = GainBeyondRagReward(get_reward("s3_gbr_paper"), generator, None,
                                 lambda rows: naive.accuracies(rows, client, generator, None))
    scores, components = reward.score([result], [QARow("q0", "capital of france", ("Paris",))])
    d_rag = client.retrieve(["capital of france"], NAIVE_RAG_TOPK, ["capital of france"])[0]
    assert [d.id for d in result.selection.documents] == [p.id for p in d_rag]
    assert scores == [0.0] and components[0]["gbr"] == 0.0
