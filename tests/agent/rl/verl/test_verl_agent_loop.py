"""Our agent on verl: verl 0.9.1's own agent-loop machinery runs `DialectAgentLoop` (and, for tool-calling models,
its hermes ``tool_agent`` loop runs our `SearchTool`).

Every test goes through what verl's trainer does for a rollout step: `prepare_verl_run` writes the run folder,
Hydra composes verl's ``ppo_trainer`` config with the run's overrides, verl's `RLHFDataset` and ``collate_fn`` read
the run's parquet, and the agent-loop worker of the trainer path builds the loop (from the agent-loop config file, or
from ``register``'s entry) and runs it. Each test runs on both of verl's trainer paths (`roll`): ``v1``, the
one our overrides pin (verl's ``AgentLoopWorkerTQ`` puts each trajectory, with the row's fields, into TransferQueue,
from which the test reads back what the trainer would) and ``legacy`` (``AgentLoopWorker`` pads a ``DataProto``).
Only the LLM server behind verl's server manager is a fake (`ScriptedServer`: scripted token ids of the real SmolLM2
tokenizer); the retrieval service is ours, in process, serving a dense index that composes ``Q [SEP] q``, with a spy
on what the index was asked. verl is installed with ``--no-deps`` and the dev extra brings what its agent loop
imports (ray, tensordict, TransferQueue, ...); without them these tests skip, saying what is missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.util
import logging
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from uuid import uuid4

import pytest
import yaml

from agent.dialects import SearchR1Dialect
from agent.env import EnvConfig
from agent.rl.config import RLConfig
from agent.rl.verl import AGENT_LOOP_NAME, VerlSettings, prepare_verl_run
from agentic_retriever.base.client import API_KEY_ENV, RetrievalServiceError
from agentic_retriever.base.sessions import signal_handlers_kept
from agentic_retriever.base.encoder import EncoderConfig
from agentic_retriever.index import IndexBuildConfig, build_index, open_index
from agentic_retriever.retrieval import LocalRetrievalClient
from agentic_retriever.server import ServerThread, create_app
from tests.fakes import free_port, ray_temp_dir, synthetic_rows, wait_until, write_jsonl

hydra = pytest.importorskip("hydra", reason="hydra-core is not installed (the dev extra has it)")
pytest.importorskip("ray", reason="ray is not installed (the dev extra has it: verl's agent loop imports it)")
pytest.importorskip("tensordict", reason="tensordict is not installed (the dev extra has it)")
agent_loop = pytest.importorskip("verl.experimental.agent_loop.agent_loop",
                                 reason="verl's agent loop does not import (make setup installs verl==0.9.1)")

from verl.protocol import DataProto  # noqa: E402
from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn  # noqa: E402
from verl.workers.rollout.replica import TokenOutput  # noqa: E402

QUESTIONS = ["Which river holds item 3?", "Where is the comet near the glacier?", "What holds item 7?"]
#: Our agent loop's fields verl keeps per row (verl's hermes tool loop has only the server's two).
EXTRA_FIELDS = ("searches", "invalid_actions", "finish_reason", "min_global_steps", "max_global_steps")
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
        text = self.reply(context, turn)
        if text is None:  # the engine aborted the request: verl's server manager hands back no tokens
            return TokenOutput(token_ids=[], log_probs=[], stop_reason="aborted", extra_fields={})
        ids = self.tokenizer.encode(text, add_special_tokens=False)[:sampling_params.get("max_tokens")]
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


@pytest.fixture(scope="module")
def transfer_queue(tmp_path_factory):
    """verl's V1 trainer hands trajectories over through TransferQueue: its controller and storage units are Ray
    actors of a local Ray (4 logical CPUs: the controller and two storage units take one each), whose session
    files stay under the test's temporary folder (`ray_temp_dir`; and no token is written to ~/.ray)."""
    tq = pytest.importorskip("transfer_queue", reason="TransferQueue is not installed (the dev extra has it: verl's "
                                                     "V1 trainer imports it)")
    import ray

    with pytest.MonkeyPatch.context() as patch, ray_temp_dir(tmp_path_factory) as temp:
        patch.setenv("RAY_AUTH_MODE", "disabled")
        with signal_handlers_kept():  # ray.init's driver SIGTERM handler would outlive the test
            ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, _temp_dir=temp)
        try:
            tq.init()
            yield tq
            tq.close()
        finally:
            ray.shutdown()


def _v1_worker(config, server):
    """verl's V1 agent-loop worker (``AgentLoopWorkerTQ``, a Ray actor class) built in this process, so the scripted
    server and the spy on the index stay visible; its TransferQueue client talks to the module's Ray actors."""
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

    return AgentLoopWorkerTQ.__ray_metadata__.modified_class(config, llm_client=server)


def _rows_of_v1(worker, batch_dict, tq, groups: list | None = None) -> list[dict]:
    """One step as verl's V1 trainer submits it (``_fetch_one_gen_batch``: a uid per row, then a TensorDict with
    ``global_steps``): wait for the worker's fire-and-forget tasks, then read what its post-processing put into
    TransferQueue (one key ``{uid}_0_0`` per row, as ``rollout.n`` is 1). Every row must have succeeded, unless
    `groups` is given: it then receives each row's group status (``finished`` or ``failure``), and only the
    trajectories verl stored are returned, as its replay buffer would read them."""
    import numpy as np
    from verl.utils import tensordict_utils as tu

    batch_dict["uid"] = np.array([uuid4().hex for _ in range(len(batch_dict["raw_prompt"]))], dtype=object)
    batch = tu.get_tensordict(batch_dict)
    tu.assign_non_tensor_data(batch, "global_steps", 1)

    async def generate():
        await worker.generate_sequences(batch)
        await asyncio.gather(*list(worker.background_tasks))

    asyncio.run(generate())
    tags = tq.kv_list("train")["train"]
    if groups is not None:
        groups += [tags[uid]["status"] for uid in batch_dict["uid"]]
    keys = [f"{uid}_0_0" for uid in batch_dict["uid"] if groups is None or f"{uid}_0_0" in tags]
    assert [tags[key]["status"] for key in keys] == ["success"] * len(keys)  # not "failure": our output packed
    data = tq.kv_batch_get(keys=keys, partition_id="train")
    tq.kv_clear(keys=keys + list(batch_dict["uid"]), partition_id="train")
    if not keys:
        return []
    fields = {name: data[name].unbind() for name in ("prompts", "responses", "response_mask", "rollout_log_probs")}
    extras, turns = list(data["extra_fields"]), list(data["num_turns"])  # as verl reads non-tensor fields back
    return [{**{name: values[i].tolist() for name, values in fields.items()}, "num_turns": turns[i],
             **{name: extras[i][name] for name in EXTRA_FIELDS if name in extras[i]}} for i in range(len(keys))]


def _rows_of_legacy(output: DataProto) -> list[dict]:
    """The legacy worker's padded batch, row by row without its padding."""
    rows = []
    for i in range(len(output)):
        mask = output.batch["attention_mask"][i].bool()
        real = mask[PROMPT_LENGTH:]
        rows.append({"prompts": output.batch["prompts"][i][mask[:PROMPT_LENGTH]].tolist(),
                     **{name: output.batch[name][i][real].tolist()
                        for name in ("responses", "response_mask", "rollout_log_probs")},
                     "num_turns": output.non_tensor_batch["__num_turns__"][i],
                     **{name: output.non_tensor_batch[name][i] for name in EXTRA_FIELDS
                        if name in output.non_tensor_batch}})
    return rows


def roll_out(request, tmp_path: Path, served, model_dir: str, reply, rl: RLConfig, questions: int = 2,
             registered_only: bool = False, failures_allowed: bool = False, service_url: str | None = None,
             preparing_env: dict[str, str] | None = None, **settings) -> tuple[list[dict], ScriptedServer, SimpleNamespace]:
    """One rollout step of the run `prepare_verl_run` writes, through verl's dataset, collate and agent-loop worker
    of the trainer path ``request.param`` (the `roll` fixture's): (the rows verl trains on, each with ``prompts``,
    ``responses``, ``response_mask``, ``rollout_log_probs``, ``num_turns`` and our fields; the server; the run, with
    ``questions``: what each row asks, in order, ``trainer``: the path, and ``output``: the legacy worker's padded
    batch).
    `registered_only`: the loop is built from verl's ``register`` entry, which holds the class and no settings.
    `failures_allowed` (v1): rows may fail; ``run.groups`` then holds each row's group status. `service_url`: a
    service other than `served`'s."""
    qa = _qa(tmp_path / "train.jsonl", QUESTIONS + ["A held-out question?"])
    settings = {"val_questions": 1, "n_gpus_per_node": 1, "max_prompt_length": PROMPT_LENGTH,
                "max_response_length": RESPONSE_LENGTH} | settings
    if request.param == "legacy":
        settings["overrides"] = ["trainer.use_v1=false"]
    with pytest.MonkeyPatch.context() as patch:
        for name, value in (preparing_env or {}).items():
            patch.setenv(name, value)
        run = SimpleNamespace(**vars(prepare_verl_run(tmp_path / "verl", VerlSettings(**settings), rl,
                                                      service_url or served["url"], model_dir, qa)))
    overrides = (run.out_dir / "overrides.txt").read_text().splitlines()
    config_dir = Path(list(importlib.util.find_spec("verl").submodule_search_locations)[0]) / "trainer" / "config"
    with hydra.initialize_config_dir(config_dir=str(config_dir), version_base=None):
        config = hydra.compose("ppo_trainer", overrides=[*overrides, f"+data.cache_dir={tmp_path / 'verl-cache'}"])
    assert config.trainer.use_v1 == (request.param == "v1")  # the path verl's main_ppo takes with these overrides
    server = ScriptedServer(None, reply)
    tq = request.getfixturevalue("transfer_queue") if config.trainer.use_v1 else None
    worker = _v1_worker(config, server) if tq else agent_loop.AgentLoopWorker(config, llm_client=server)
    if registered_only:  # as in a worker process that imports our module after reading the config file
        from agent.rl.verl.agent_loop import DialectAgentLoop

        agent_loop.register(AGENT_LOOP_NAME)(DialectAgentLoop)
    server.tokenizer = worker.tokenizer
    dataset = RLHFDataset(data_files=[str(run.out_dir / "train.parquet")], tokenizer=worker.tokenizer,
                          config=config.data)
    rows = [dataset[i] for i in range(questions)]
    run.questions = [row["extra_info"]["question"] for row in rows]  # what each row of the batch asks
    run.trainer, run.groups = request.param, []
    if tq:
        return _rows_of_v1(worker, collate_fn(rows), tq, run.groups if failures_allowed else None), server, run
    batch = DataProto.from_single_dict(collate_fn(rows))
    batch.meta_info = {"global_steps": 1, "validate": False}
    run.output = asyncio.run(worker.generate_sequences(batch))
    return _rows_of_legacy(run.output), server, run


@pytest.fixture(params=["v1", "legacy"])
def roll(request, tmp_path, served, tiny_causal_lm_dir):
    """`roll_out` on one of verl's trainer paths, called with (reply, rl, **options): ``v1`` (``trainer.use_v1=true``,
    what our overrides pin and verl 0.9.1 defaults to: the TransferQueue agent-loop worker) or ``legacy``
    (``main_ppo_v0``'s worker, for runs that set use_v1=false)."""
    return functools.partial(roll_out, request, tmp_path, served, tiny_causal_lm_dir)


def _split(row: dict, tokenizer) -> tuple[str, str]:
    """(the generated text, the inserted text) of one row's response, by its response mask."""
    generated = [token for token, mask in zip(row["responses"], row["response_mask"]) if mask]
    inserted = [token for token, mask in zip(row["responses"], row["response_mask"]) if not mask]
    return (tokenizer.decode(generated, skip_special_tokens=False),
            tokenizer.decode(inserted, skip_special_tokens=False))


def test_verl_runs_our_search_r1_agent_with_the_question_reaching_the_service(roll, served):
    served["asked"].clear()
    rows, server, run = roll(search_then_answer, _rl())
    tokenizer = server.tokenizer
    # the <search> action was executed, each query sent with its own trajectory's question
    assert searched(served) == sorted(("river castle", q) for q in run.questions)
    assert len(server.calls) == 4 and all(params["stop"] == ["</search>", "</answer>"] and params["max_tokens"] == 40
                                          and params["include_stop_str_in_output"] for _, params in server.calls)
    for row, question in zip(rows, run.questions):
        generated, inserted = _split(row, tokenizer)
        assert generated == search_then_answer("", 0) + search_then_answer("", 1)  # the model's tokens: mask 1
        expected = LocalRetrievalClient(served["index"]).retrieve(["river castle"], 2, questions=[question])
        assert inserted == SearchR1Dialect().format_observation(expected)      # the service's passages: mask 0
        assert expected != LocalRetrievalClient(served["index"]).retrieve(["river castle"], 2)  # Q [SEP] q mattered
        prompt = tokenizer.decode(row["prompts"], skip_special_tokens=False)
        assert prompt.endswith("<|im_start|>assistant\n") and f"Question: {question}\n" in prompt
        assert [-0.5 if mask else 0.0 for mask in row["response_mask"]] == row["rollout_log_probs"]
    assert [(row["searches"], row["finish_reason"], row["invalid_actions"]) for row in rows] == [(1, "answer", 0)] * 2
    assert [row["num_turns"] for row in rows] == [4, 4]  # prompt, search, observation, answer
    # the server's fields, with the policy version of the last turn
    assert [(row["min_global_steps"], row["max_global_steps"]) for row in rows] == [(7, 8)] * 2
    if run.trainer == "legacy":  # its padded batch
        batch = run.output.batch
        assert batch["prompts"].shape == (2, PROMPT_LENGTH) and batch["responses"].shape == (2, RESPONSE_LENGTH)
        assert batch["input_ids"].shape == batch["attention_mask"].shape == (2, PROMPT_LENGTH + RESPONSE_LENGTH)


def test_the_turn_limit_ends_with_searchr1s_search_disabled_last_turn(roll, served):
    served["asked"].clear()
    rows, server, _ = roll(lambda context, turn: " <search> more </search>",
                           _rl(max_turns=2), questions=1)
    assert len(server.calls) == 3 and len(searched(served)) == 2  # 2 searched turns, then one whose search is not run
    assert rows[0]["finish_reason"] == "max_turns" and rows[0]["searches"] == 2


def test_a_full_turn_must_fit_the_response_budget_and_an_observation_past_it_is_cut(roll, served):
    """Per turn 100 tokens, in all 400: the agent stops when the next full turn would not fit, and an observation
    running past the budget is cut there (its tokens only: every turn started with room for all of it)."""
    long_turn = " <think>" + " river" * 70 + " </think> <search> river </search>"  # about 80 tokens
    rows, server, _ = roll(lambda context, turn: long_turn,
                           _rl(max_turns=8, topk=10, max_new_tokens_per_turn=100, observation_max_tokens=150),
                           questions=1)
    responses = [len(ids) - len(server.calls[0][0]) for ids, _ in server.calls]
    assert all(length + 100 <= RESPONSE_LENGTH for length in responses)  # every turn had room for a full turn
    assert rows[0]["finish_reason"] == "context_exhausted"
    assert len(rows[0]["responses"]) == RESPONSE_LENGTH  # cut at the budget
    assert rows[0]["response_mask"][-1] == 0 and all(params["max_tokens"] == 100 for _, params in server.calls)


def test_an_aborted_generation_ends_the_trajectory_as_aborted_not_as_an_empty_turn(roll, served):
    rows, server, _ = roll(lambda context, turn: search_then_answer(context, 0) if turn == 0 else None, _rl(),
                           questions=1)
    generated, _ = _split(rows[0], server.tokenizer)
    assert rows[0]["finish_reason"] == "aborted" and len(server.calls) == 2
    assert generated == search_then_answer("", 0) and rows[0]["invalid_actions"] == 0 and rows[0]["searches"] == 1


def test_an_invalid_turn_gets_the_dialects_message_masked(roll, served):
    rows, server, _ = roll(lambda context, turn: " I am not sure." if turn == 0 else " <answer> Paris </answer>",
                           _rl(), questions=1)
    generated, inserted = _split(rows[0], server.tokenizer)
    assert inserted == SearchR1Dialect.invalid_action_message and generated == " I am not sure. <answer> Paris </answer>"
    assert rows[0]["invalid_actions"] == 1 and rows[0]["searches"] == 0


def test_the_same_loop_serves_qagents_several_queries_per_search(roll, served):
    served["asked"].clear()

    def qagent(context: str, turn: int) -> str:
        return ("<plan> two angles </plan>\n<search>\n<query> river castle </query>\n<query> item 3 </query>\n</search>"
                if turn == 0 else "<answer> Paris </answer>")

    rows, server, run = roll(qagent, _rl(dialect="qagent"), questions=1)
    assert searched(served) == [("item 3", run.questions[0]), ("river castle", run.questions[0])]
    assert rows[0]["searches"] == 1 and rows[0]["finish_reason"] == "answer"
    assert server.calls[0][1]["stop"] == ["</search>", "</answer>"]
    assert yaml.safe_load((run.out_dir / "agent_loop.yaml").read_text())[0]["env"]["dialect"] == "qagent"


def test_s3s_first_search_runs_before_the_first_turn_and_fills_the_prompt(roll, served):
    served["asked"].clear()
    rows, server, run = roll(lambda context, turn: "<search_complete> True </search_complete>",
                             _rl(dialect="s3", max_new_tokens_per_turn=40), questions=1)
    assert searched(served) == [(run.questions[0], run.questions[0])]  # q_0 = Q, before any generation
    first_prompt = server.tokenizer.decode(server.calls[0][0])
    assert first_prompt.count("Doc ") == 3 and len(server.calls) == 1  # naive RAG's top 3, not env.topk (2)
    assert rows[0]["finish_reason"] == "answer"


def test_the_loop_built_from_verls_register_entry_reads_its_settings_from_the_config_file(roll, served):
    """Importing our module registers the class under its name with no settings (verl's ``register``), replacing the
    config file's entry in that process; the loop so built must still search our service with the run's budgets."""
    served["asked"].clear()
    rows, server, run = roll(search_then_answer, _rl(max_new_tokens_per_turn=24),
                             questions=3, registered_only=True)
    entry = agent_loop._agent_loop_registry[AGENT_LOOP_NAME]
    assert entry == {"_target_": "agent.rl.verl.agent_loop.DialectAgentLoop"}  # no settings in it
    assert searched(served) == sorted(("river castle", q) for q in run.questions)
    assert all(params["max_tokens"] == 24 for _, params in server.calls)
    assert [row["searches"] for row in rows] == [1, 1, 1]


def test_the_hermes_tool_loop_hands_the_question_to_our_search_tool(roll, served):
    """verl's ``tool_agent`` calls ``tool.create(create_kwargs=...)``: the row's question must reach the service."""
    served["asked"].clear()
    call = '<tool_call>\n{"name": "search", "arguments": {"query_list": ["river castle"]}}\n</tool_call>'
    rows, server, run = roll(lambda context, turn: call if turn == 0 else "<answer> Paris </answer>",
                             _rl(), questions=1, agent_loop="tool_agent")
    assert searched(served) == [("river castle", run.questions[0])]
    _, inserted = _split(rows[0], server.tokenizer)
    assert '<information>Doc 1(Title: "Topic' in inserted


@pytest.fixture(scope="module")
def bm25_index(tmp_path_factory) -> Path:
    """A BM25 index over the synthetic corpus, for a service in a process of its own."""
    root = tmp_path_factory.mktemp("bm25-service")
    corpus = write_jsonl(root / "corpus.jsonl", synthetic_rows(60))
    build_index(IndexBuildConfig(corpus=str(corpus), out=str(root / "index"), backend="bm25",
                                 corpus_cache=str(root / "cache")))
    return root / "index"


@contextlib.contextmanager
def serving_process(index: Path, log: Path, *flags: str):
    """``index serve`` in a process of its own, as users and the loop's step servers run it: {"url", "process"}."""
    port = free_port()
    with log.open("w") as sink:
        process = subprocess.Popen([sys.executable, "-m", "agentic_retriever.app.cli", "index", "serve", "--index",
                                    str(index), "--port", str(port), *flags], stdout=sink, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: "Uvicorn running" in log.read_text() or process.poll() is not None, "the service")
        assert process.poll() is None, log.read_text()
        yield {"url": f"http://127.0.0.1:{port}", "process": process}
    finally:
        process.kill()
        process.wait(30)


@pytest.fixture
def mortal_service(bm25_index, tmp_path):
    """A service in a process of its own, for a test to SIGKILL mid-step."""
    with serving_process(bm25_index, tmp_path / "serve.log") as service:
        yield service


SEARCHES = {"dialect": " <search> river castle </search>",
            "tool_agent": '<tool_call>\n{"name": "search", "arguments": {"query_list": ["river castle"]}}\n'
                          '</tool_call>'}


@pytest.mark.parametrize("loop", ["dialect", "tool_agent"])
def test_a_search_the_dead_service_fails_is_never_trained_on(request, roll, mortal_service, loop, caplog):
    """The service is SIGKILLed mid-step, when the first trajectory comes back from its search: that trajectory
    answers and is trained on; the other's search (retried by the client, then refused) fails its trajectory, in
    our dialect loop and in verl's tool loop alike (which alone would make "Error executing tool ..." its
    observation). verl's V1 trainer marks that group ``failure`` and stores none of it (its replay buffer trains on
    the finished groups); the legacy trainer fails the step with our error, naming the service and the question."""
    killed = []

    def reply(context: str, turn: int) -> str:
        if turn == 0:
            return SEARCHES[loop]
        if turn == 1 and not killed:  # the first trajectory back from its search: the service dies now
            mortal_service["process"].kill()
            mortal_service["process"].wait(30)
            killed.append(context)
            return "<answer> Paris </answer>"
        return SEARCHES[loop] if turn == 1 else "<answer> Paris </answer>"

    step = functools.partial(roll, reply, _rl(), questions=2, failures_allowed=True, service_url=mortal_service["url"],
                             **({"agent_loop": loop} if loop == "tool_agent" else {}))
    url = f"{mortal_service['url']}/retrieve"
    if request.node.callspec.params["roll"] == "legacy":
        with pytest.raises(RetrievalServiceError, match=r"the search of the trajectory of '.+' failed: .*"
                                                        + re.escape(url)):
            step()
        return
    with caplog.at_level(logging.ERROR):
        rows, server, run = step()
    survivor = next(q for q in run.questions if q in killed[0])
    assert run.groups == ["finished" if q == survivor else "failure" for q in run.questions]
    assert len(rows) == 1 and rows[0]["num_turns"] == 4  # the survivor: prompt, search, observation, answer
    _, inserted = _split(rows[0], server.tokenizer)
    assert "<information>Doc 1(Title:" in inserted and "Error" not in inserted
    failed = next(q for q in run.questions if q != survivor)
    assert any(f"the search of the trajectory of {failed!r} failed" in record.getMessage() + str(record.exc_info)
               and url in str(record.exc_info) for record in caplog.records), "verl logs our error"


def test_verls_workers_reach_a_keyed_service_with_the_key_the_run_folder_hands_them(roll, bm25_index, tmp_path):
    """A service off loopback takes a key (the loop under Ray makes one, in ``$AGENTIC_RETRIEVER_API_KEY``); verl's
    workers on other nodes do not inherit the loop's environment, so the run folder hands it over: here the
    variable is set only while the folder is written, and the trajectories still search."""
    key = "k3y-" + "x" * 28
    with serving_process(bm25_index, tmp_path / "serve.log", "--api-key", key) as service:
        rows, _, run = roll(search_then_answer, _rl(), questions=2, service_url=service["url"],
                            preparing_env={API_KEY_ENV: key})
    assert [(row["searches"], row["finish_reason"]) for row in rows] == [(1, "answer")] * 2
    loops = run.out_dir / "agent_loop.yaml"
    assert yaml.safe_load(loops.read_text())[0]["api_key"] == key and (loops.stat().st_mode & 0o777) == 0o600
