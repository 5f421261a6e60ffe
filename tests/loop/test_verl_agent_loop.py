"""Our agent on verl: verl 0.9.1's own agent-loop machinery runs `DialectAgentLoop` (and, for tool-calling models,
its hermes ``tool_agent`` loop runs our `SearchTool`).

Every test goes through what verl's trainer does for a rollout step: `prepare_verl_run` writes the run folder,
Hydra composes verl's ``ppo_trainer`` config with the run's overrides, verl's `RLHFDataset` and ``collate_fn`` read
the run's parquet into a ``DataProto`` and verl's `AgentLoopWorker` builds the loop (from the agent-loop config
file, or from ``register``'s entry), runs it and pads its output. Only the LLM server behind verl's server manager
is a fake (`ScriptedServer`: scripted token ids of the real SmolLM2 tokenizer); the retrieval service is ours, in
process, serving a dense index that composes ``Q [SEP] q``, with a spy on what the index was asked. verl is
installed with ``--no-deps`` and the dev extra brings what its agent loop imports (ray, tensordict, ...); without
them these tests skip, saying what is missing.
"""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from agent.dialects import SearchR1Dialect
from agent.env import EnvConfig
from agent.rl.config import RLConfig
from agentic_retriever.client import LocalRetrievalClient
from agentic_retriever.encoder import EncoderConfig
from agentic_retriever.index import IndexBuildConfig, build_index, open_index
from agentic_retriever.loop.verl import AGENT_LOOP_NAME, VerlSettings, prepare_verl_run
from agentic_retriever.server import ServerThread, create_app
from tests.fakes import synthetic_rows, write_jsonl

hydra = pytest.importorskip("hydra", reason="hydra-core is not installed (the dev extra has it)")
pytest.importorskip("ray", reason="ray is not installed (the dev extra has it: verl's agent loop imports it)")
pytest.importorskip("tensordict", reason="tensordict is not installed (the dev extra has it)")
agent_loop = pytest.importorskip("verl.experimental.agent_loop.agent_loop",
                                 reason="verl's agent loop does not import (make setup installs verl==0.9.1)")

from verl.protocol import DataProto  # noqa: E402
from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn  # noqa: E402
from verl.workers.rollout.replica import TokenOutput  # noqa: E402

QUESTIONS = ["Which river holds item 3?", "Where is the comet near the glacier?", "What holds item 7?"]
PROMPT_LENGTH, RESPONSE_LENGTH = 512, 400


class ScriptedServer:
    """verl's server manager (``generate(request_id, *, prompt_ids, sampling_params, ...) -> TokenOutput``) over a
    script: `reply(context_text, turn)` gives the text of a trajectory's turn (turn: how many earlier calls' prompts
    this prompt extends), returned as the tokenizer's ids with a
    log-prob of -0.5 each. Every call's prompt ids and sampling parameters are recorded."""

    def __init__(self, tokenizer, reply):
        self.tokenizer, self.reply, self.calls = tokenizer, reply, []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs) -> TokenOutput:
        context = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        prompt_ids = list(prompt_ids)
        turn = sum(1 for ids, _ in self.calls if len(ids) < len(prompt_ids) and prompt_ids[:len(ids)] == ids)
        self.calls.append((prompt_ids, dict(sampling_params)))
        ids = self.tokenizer.encode(self.reply(context, turn), add_special_tokens=False)[:sampling_params.get("max_tokens")]
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), stop_reason="completed",  # as verl's client:
                           extra_fields={"min_global_steps": 7, "max_global_steps": 7 + turn})  # the policy version


def search_then_answer(context: str, turn: int) -> str:
    return " <think> look it up </think> <search> river castle </search>" if turn == 0 else " <answer> Paris </answer>"


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_model_dir):
    """Our retrieval service on a dense index whose encoder composes ``Q [SEP] q``; `asked` records what the
    index was searched with: (queries, questions) per call."""
    root = tmp_path_factory.mktemp("verl-service")
    corpus = write_jsonl(root / "corpus.jsonl", synthetic_rows(60))
    # fp32 on any device: the observation is compared with a search of another batch shape
    encoder = EncoderConfig(model=tiny_model_dir, composition="question_sep_query", precision="fp32")
    build_index(IndexBuildConfig(corpus=str(corpus), out=str(root / "index"), corpus_cache=str(root / "cache"),
                                 encoder=encoder))
    index = open_index(root / "index", encoder=encoder, corpus_cache=str(root / "cache"))
    asked, search_rows = [], index.search_rows

    def spy(queries, k, questions=None, histories=None):
        asked.append((list(queries), None if questions is None else list(questions)))
        return search_rows(queries, k, questions, histories)

    index.search_rows = spy
    with ServerThread(create_app(index)) as url:
        yield {"url": url, "index": index, "asked": asked}


def searched(served) -> list[tuple[str, str | None]]:
    """Every (query, question) the index was searched with, sorted (the service batches concurrent requests)."""
    return sorted((query, question) for queries, questions in served["asked"]
                  for query, question in zip(queries, questions or [None] * len(queries)))


def _qa(path: Path, questions=QUESTIONS) -> Path:
    return write_jsonl(path, [{"id": f"q{i}", "question": q, "golden_answers": ["Paris"]} for i, q in enumerate(questions)])


def _rl(**env) -> RLConfig:
    settings = dict(dialect="search_r1", max_turns=3, topk=2, max_new_tokens_per_turn=40, observation_max_tokens=120,
                    max_context_tokens=2048) | env
    return RLConfig(qa="unused.jsonl", algorithm="grpo", steps=1, prompts_per_step=2, samples_per_prompt=1,
                    micro_batch_size=2, env=EnvConfig(**settings))


def roll_out(tmp_path: Path, served, model_dir: str, reply, rl: RLConfig, questions: int = 2,
             registered_only: bool = False, **settings) -> tuple[DataProto, ScriptedServer, SimpleNamespace]:
    """One rollout step of the run `prepare_verl_run` writes, through verl's dataset, collate and agent-loop worker:
    (verl's output, the server, the run with ``questions``: what each row of the batch asks, in order).
    `registered_only`: the loop is built from verl's ``register`` entry, which holds the class and no settings."""
    qa = _qa(tmp_path / "train.jsonl", QUESTIONS + ["A held-out question?"])
    settings = {"val_questions": 1, "max_prompt_length": PROMPT_LENGTH, "max_response_length": RESPONSE_LENGTH} | settings
    run = SimpleNamespace(**vars(prepare_verl_run(tmp_path / "verl", VerlSettings(**settings), rl, served["url"],
                                                  model_dir, qa)))
    overrides = (run.out_dir / "overrides.txt").read_text().splitlines()
    config_dir = Path(list(importlib.util.find_spec("verl").submodule_search_locations)[0]) / "trainer" / "config"
    with hydra.initialize_config_dir(config_dir=str(config_dir), version_base=None):
        config = hydra.compose("ppo_trainer", overrides=[*overrides, f"+data.cache_dir={tmp_path / 'verl-cache'}"])
    server = ScriptedServer(None, reply)
    worker = agent_loop.AgentLoopWorker(config, llm_client=server)
    if registered_only:  # as in a worker process that imports our module after reading the config file
        from agentic_retriever.loop.verl.agent_loop import DialectAgentLoop

        agent_loop.register(AGENT_LOOP_NAME)(DialectAgentLoop)
    server.tokenizer = worker.tokenizer
    dataset = RLHFDataset(data_files=[str(run.out_dir / "train.parquet")], tokenizer=worker.tokenizer,
                          config=config.data)
    rows = [dataset[i] for i in range(questions)]
    batch = DataProto.from_single_dict(collate_fn(rows))
    batch.meta_info = {"global_steps": 1, "validate": False}
    run.questions = [row["extra_info"]["question"] for row in rows]  # what each row of the batch asks
    return asyncio.run(worker.generate_sequences(batch)), server, run


def _split(output: DataProto, tokenizer, row: int) -> tuple[str, str]:
    """(the generated text, the inserted text) of one row's response, by its response mask."""
    response, mask = output.batch["responses"][row], output.batch["response_mask"][row]
    real = output.batch["attention_mask"][row, PROMPT_LENGTH:].bool()
    return (tokenizer.decode(response[mask.bool()], skip_special_tokens=False),
            tokenizer.decode(response[real & ~mask.bool()], skip_special_tokens=False))


def test_verl_runs_our_search_r1_agent_with_the_question_reaching_the_service(tmp_path, served, tiny_causal_lm_dir):
    served["asked"].clear()
    output, server, run = roll_out(tmp_path, served, tiny_causal_lm_dir, search_then_answer, _rl())
    tokenizer = server.tokenizer
    # the <search> action was executed, each query sent with its own trajectory's question
    assert searched(served) == sorted(("river castle", q) for q in run.questions)
    assert len(server.calls) == 4 and all(params["stop"] == ["</search>", "</answer>"] and params["max_tokens"] == 40
                                          and params["include_stop_str_in_output"] for _, params in server.calls)
    for row, question in enumerate(run.questions):
        generated, inserted = _split(output, tokenizer, row)
        assert generated == search_then_answer("", 0) + search_then_answer("", 1)  # the model's tokens: mask 1
        expected = LocalRetrievalClient(served["index"]).retrieve(["river castle"], 2, questions=[question])
        assert inserted == SearchR1Dialect().format_observation(expected)      # the service's passages: mask 0
        assert expected != LocalRetrievalClient(served["index"]).retrieve(["river castle"], 2)  # Q [SEP] q mattered
        prompt = tokenizer.decode(output.batch["prompts"][row][output.batch["attention_mask"][row, :PROMPT_LENGTH]
                                                             .bool()], skip_special_tokens=False)
        assert prompt.endswith("<|im_start|>assistant\n") and f"Question: {question}\n" in prompt
    batch = output.batch
    assert batch["prompts"].shape == (2, PROMPT_LENGTH) and batch["responses"].shape == (2, RESPONSE_LENGTH)
    assert batch["input_ids"].shape == batch["attention_mask"].shape == (2, PROMPT_LENGTH + RESPONSE_LENGTH)
    assert batch["rollout_log_probs"][batch["response_mask"].bool()].eq(-0.5).all()
    assert batch["rollout_log_probs"][~batch["response_mask"].bool()].eq(0).all()
    assert list(output.non_tensor_batch["searches"]) == [1, 1]
    assert list(output.non_tensor_batch["finish_reason"]) == ["answer", "answer"]
    assert list(output.non_tensor_batch["invalid_actions"]) == [0, 0]
    assert list(output.non_tensor_batch["__num_turns__"]) == [4, 4]  # prompt, search, observation, answer
    assert list(output.non_tensor_batch["min_global_steps"]) == [7, 7]  # the server's fields, the last turn's version
    assert list(output.non_tensor_batch["max_global_steps"]) == [8, 8]


def test_the_turn_limit_ends_with_searchr1s_search_disabled_last_turn(tmp_path, served, tiny_causal_lm_dir):
    served["asked"].clear()
    output, server, _ = roll_out(tmp_path, served, tiny_causal_lm_dir, lambda context, turn: " <search> more </search>",
                                 _rl(max_turns=2), questions=1)
    assert len(server.calls) == 3 and len(searched(served)) == 2  # 2 searched turns, then one whose search is not run
    assert output.non_tensor_batch["finish_reason"][0] == "max_turns" and output.non_tensor_batch["searches"][0] == 2


def test_a_full_turn_must_fit_the_response_budget_and_an_observation_past_it_is_cut(tmp_path, served, tiny_causal_lm_dir):
    """Per turn 100 tokens, in all 400: the agent stops when the next full turn would not fit, and an observation
    running past the budget is cut there (its tokens only: every turn started with room for all of it)."""
    long_turn = " <think>" + " river" * 70 + " </think> <search> river </search>"  # about 80 tokens
    output, server, _ = roll_out(tmp_path, served, tiny_causal_lm_dir, lambda context, turn: long_turn,
                                 _rl(max_turns=8, topk=10, max_new_tokens_per_turn=100, observation_max_tokens=150),
                                 questions=1)
    responses = [len(ids) - len(server.calls[0][0]) for ids, _ in server.calls]
    assert all(length + 100 <= RESPONSE_LENGTH for length in responses)  # every turn had room for a full turn
    assert output.non_tensor_batch["finish_reason"][0] == "context_exhausted"
    assert output.batch["attention_mask"][0, PROMPT_LENGTH:].sum() == RESPONSE_LENGTH  # cut at the budget
    assert output.batch["response_mask"][0, -1] == 0 and all(params["max_tokens"] == 100 for _, params in server.calls)


def test_an_invalid_turn_gets_the_dialects_message_masked(tmp_path, served, tiny_causal_lm_dir):
    output, server, _ = roll_out(tmp_path, served, tiny_causal_lm_dir,
                                 lambda context, turn: " I am not sure." if turn == 0 else " <answer> Paris </answer>",
                                 _rl(), questions=1)
    generated, inserted = _split(output, server.tokenizer, 0)
    assert inserted == SearchR1Dialect.invalid_action_message and generated == " I am not sure. <answer> Paris </answer>"
    assert output.non_tensor_batch["invalid_actions"][0] == 1 and output.non_tensor_batch["searches"][0] == 0


def test_the_same_loop_serves_qagents_several_queries_per_search(tmp_path, served, tiny_causal_lm_dir):
    served["asked"].clear()

    def qagent(context: str, turn: int) -> str:
        return ("<plan> two angles </plan>\n<search>\n<query> river castle </query>\n<query> item 3 </query>\n</search>"
                if turn == 0 else "<answer> Paris </answer>")

    output, server, run = roll_out(tmp_path, served, tiny_causal_lm_dir, qagent, _rl(dialect="qagent"), questions=1)
    assert searched(served) == [("item 3", run.questions[0]), ("river castle", run.questions[0])]
    assert output.non_tensor_batch["searches"][0] == 1 and output.non_tensor_batch["finish_reason"][0] == "answer"
    assert server.calls[0][1]["stop"] == ["</search>", "</answer>"]
    assert yaml.safe_load((run.out_dir / "agent_loop.yaml").read_text())[0]["env"]["dialect"] == "qagent"


def test_s3s_first_search_runs_before_the_first_turn_and_fills_the_prompt(tmp_path, served, tiny_causal_lm_dir):
    served["asked"].clear()
    output, server, run = roll_out(tmp_path, served, tiny_causal_lm_dir,
                                   lambda context, turn: "<search_complete> True </search_complete>",
                                   _rl(dialect="s3", max_new_tokens_per_turn=40), questions=1)
    assert searched(served) == [(run.questions[0], run.questions[0])]  # q_0 = Q, before any generation
    first_prompt = server.tokenizer.decode(server.calls[0][0])
    assert first_prompt.count("Doc ") == 3 and len(server.calls) == 1  # naive RAG's top 3, not env.topk (2)
    assert output.non_tensor_batch["finish_reason"][0] == "answer"


def test_the_loop_built_from_verls_register_entry_reads_its_settings_from_the_config_file(tmp_path, served,
                                                                                          tiny_causal_lm_dir):
    """Importing our module registers the class under its name with no settings (verl's ``register``), replacing the
    config file's entry in that process; the loop so built must still search our service with the run's budgets."""
    served["asked"].clear()
    output, server, run = roll_out(tmp_path, served, tiny_causal_lm_dir, search_then_answer, _rl(max_new_tokens_per_turn=24),
                                   questions=3, registered_only=True)
    entry = agent_loop._agent_loop_registry[AGENT_LOOP_NAME]
    assert entry == {"_target_": "agentic_retriever.loop.verl.agent_loop.DialectAgentLoop"}  # no settings in it
    assert searched(served) == sorted(("river castle", q) for q in run.questions)
    assert all(params["max_tokens"] == 24 for _, params in server.calls)
    assert list(output.non_tensor_batch["searches"]) == [1, 1, 1]


def test_the_hermes_tool_loop_hands_the_question_to_our_search_tool(tmp_path, served, tiny_causal_lm_dir):
    """verl's ``tool_agent`` calls ``tool.create(create_kwargs=...)``: the row's question must reach the service."""
    served["asked"].clear()
    call = '<tool_call>\n{"name": "search", "arguments": {"query_list": ["river castle"]}}\n</tool_call>'
    output, server, run = roll_out(tmp_path, served, tiny_causal_lm_dir,
                                   lambda context, turn: call if turn == 0 else "<answer> Paris </answer>",
                                   _rl(), questions=1, agent_loop="tool_agent")
    assert searched(served) == [("river castle", run.questions[0])]
    _, inserted = _split(output, server.tokenizer, 0)
    assert '<information>Doc 1(Title: "Topic' in inserted
