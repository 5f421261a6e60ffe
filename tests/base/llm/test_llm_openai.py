"""The OpenAI-compatible backend against a small fake server on 127.0.0.1 (started in the test)."""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from agentic_retriever.base.llm import LLM, LLMConfig, SamplingParams, load_llm
from agentic_retriever.base.llm.openai import OpenAIError, OpenAILLM
from agentic_retriever.server import ServerThread
from tests.fakes import free_port
from tests.faults.harness import ROOT

#: What the fake model "generates" after any prompt, cut by the server at the request's stop strings.
SCRIPT = "Let me look. <search>capital of France</search> then more text"
TOKENS = ["Let", " me", " look", ".", " <", "search", ">", "capital", " of", " France", "</", "search", ">",
          " then", " more", " text"]


def fake_openai_app() -> FastAPI:
    """Completions and chat completions with vLLM's stop semantics, plus scripted failures:
    a prompt containing FLAKY fails with 503 on its first request, BAD always gets a 404, SLOW sleeps, and
    TRIM gets its stop string trimmed (a server that ignores ``include_stop_str_in_output``)."""
    app = FastAPI()
    app.state.requests = []
    app.state.attempts = collections.Counter()
    app.state.in_flight = app.state.max_in_flight = 0

    async def answer(body: dict, chat: bool) -> JSONResponse:
        app.state.requests.append(body)
        prompt = body["messages"][-1]["content"] if chat else body["prompt"]
        key = str(prompt)
        app.state.attempts[key] += 1
        if "BAD" in key:
            return JSONResponse({"error": {"message": f"The model `{body['model']}` does not exist."}}, status_code=404)
        if "FLAKY" in key and app.state.attempts[key] == 1:
            return JSONResponse({"error": {"message": "overloaded"}}, status_code=503)
        if "SLOW" in key:
            # not counted in flight: the client gives up on it, and its handler wakes during later tests
            await asyncio.sleep(1.0)
        else:
            app.state.in_flight += 1
            app.state.max_in_flight = max(app.state.max_in_flight, app.state.in_flight)
            await asyncio.sleep(0.05)
            app.state.in_flight -= 1
        tokens, logprobs, text, stop_reason = [], [], "", None
        for i, token in enumerate(TOKENS[:body["max_tokens"]]):
            tokens.append(token)
            logprobs.append(-0.5 - i)
            text += token
            hit = [s for s in body.get("stop") or [] if s in text]
            if hit:
                stop_reason = hit[0]
                if "TRIM" in key or not body.get("include_stop_str_in_output"):  # a server without the option
                    text = text[:text.index(stop_reason)]
                break
        finish = "abort" if "ABORT" in key else "stop" if stop_reason else "length"
        choices = []
        for index in range(body["n"]):
            choice = {"index": index, "finish_reason": finish, "stop_reason": stop_reason}
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
                if body.get("logprobs"):
                    choice["logprobs"] = {"content": [{"token": t, "logprob": lp} for t, lp in zip(tokens, logprobs)]}
            else:
                choice["text"] = text
                if body.get("logprobs") is not None:
                    choice["logprobs"] = {"tokens": tokens, "token_logprobs": logprobs}
            choices.append(choice)
        return JSONResponse({"id": "x", "object": "text_completion", "choices": choices[::-1]})  # any order

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await answer(await request.json(), chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await answer(await request.json(), chat=True)

    return app


@pytest.fixture(scope="module")
def server():
    app = fake_openai_app()
    with ServerThread(app) as url:
        yield app, url + "/v1"


def make_llm(url: str, tokenizer_dir: str, **overrides) -> OpenAILLM:
    settings = dict(backend="openai", model="Qwen/Qwen2.5-72B-Instruct", base_url=url, tokenizer=tokenizer_dir,
                    retry_backoff=0.01, timeout=5.0)
    settings.update(overrides)
    return load_llm(LLMConfig(**settings))


def test_completions_keep_the_stop_string_and_give_token_ids_and_logprobs(server, tiny_causal_lm_dir):
    app, url = server
    llm = make_llm(url, tiny_causal_lm_dir)
    assert isinstance(llm, LLM)

    outputs = llm.generate(["Q1", [5, 6, 7]], SamplingParams(max_new_tokens=32, stop=["</search>"], n=2,
                                                             logprobs=True, seed=3, temperature=0.5))

    assert [len(o) for o in outputs] == [2, 2]
    g = outputs[0][0]
    assert g.text == "Let me look. <search>capital of France</search>"
    assert (g.finish_reason, g.stop_string) == ("stop", "</search>")
    assert g.token_ids == llm.tokenizer(g.text, add_special_tokens=False).input_ids
    assert g.logprobs == [-0.5 - i for i in range(13)]
    sent = {str(r["prompt"]): r for r in app.state.requests}
    assert sent["[5, 6, 7]"]["prompt"] == [5, 6, 7]  # token ids go out as a token array
    assert {k: sent["Q1"][k] for k in ("model", "max_tokens", "n", "seed", "temperature", "stop",
                                       "include_stop_str_in_output")} == {
        "model": "Qwen/Qwen2.5-72B-Instruct", "max_tokens": 32, "n": 2, "seed": 3, "temperature": 0.5,
        "stop": ["</search>"], "include_stop_str_in_output": True}


def test_a_stop_string_the_server_trims_is_put_back_and_length_is_reported(server, tiny_causal_lm_dir):
    _, url = server
    llm = make_llm(url, tiny_causal_lm_dir)
    trimmed = llm.generate(["TRIM"], SamplingParams(stop=["</search>"]))[0][0]
    assert (trimmed.text, trimmed.stop_string) == ("Let me look. <search>capital of France</search>", "</search>")

    g = llm.generate(["Q2"], SamplingParams(max_new_tokens=3))[0][0]
    assert (g.text, g.finish_reason, g.stop_string, g.logprobs) == ("Let me look", "length", None, None)


def test_a_503_is_retried_and_a_4xx_raises_with_the_servers_message(server, tiny_causal_lm_dir):
    app, url = server
    llm = make_llm(url, tiny_causal_lm_dir, max_retries=2)

    assert llm.generate(["FLAKY once"], SamplingParams(max_new_tokens=2))[0][0].text == "Let me"
    assert app.state.attempts["FLAKY once"] == 2

    with pytest.raises(OpenAIError, match=r"refused the request \(HTTP 404: The model `Qwen/Qwen2.5-72B-Instruct` does"):
        llm.generate(["fine", "BAD prompt"], SamplingParams(max_new_tokens=2))
    assert app.state.attempts["BAD prompt"] == 1  # not retried


def test_timeouts_and_connection_errors_are_retried_then_reported(server, tiny_causal_lm_dir):
    app, url = server
    slow = make_llm(url, tiny_causal_lm_dir, timeout=0.2, max_retries=1)
    with pytest.raises(OpenAIError, match="failed 2 times; last error: ReadTimeout"):
        slow.generate(["SLOW"], SamplingParams(max_new_tokens=2))
    assert app.state.attempts["SLOW"] == 2

    closed = make_llm("http://127.0.0.1:9/v1", tiny_causal_lm_dir, max_retries=1)
    with pytest.raises(OpenAIError, match="failed 2 times; last error: ConnectError"):
        closed.generate(["Q"], SamplingParams(max_new_tokens=2))


def test_requests_run_concurrently_up_to_the_limit_and_keep_prompt_order(server, tiny_causal_lm_dir):
    app, url = server
    app.state.max_in_flight = 0
    # a generous timeout: on a loaded machine a 5 s timeout fires and its retry is a 4th request in flight
    llm = make_llm(url, tiny_causal_lm_dir, max_concurrency=3, timeout=60.0)
    outputs = llm.generate([f"P{i}" for i in range(9)], SamplingParams(max_new_tokens=1))
    assert len(outputs) == 9 and all(o[0].text == "Let" for o in outputs)
    assert 1 < app.state.max_in_flight <= 3


def test_the_chat_endpoint_sends_the_message_and_refuses_token_ids(server, tiny_causal_lm_dir):
    app, url = server
    llm = make_llm(url, tiny_causal_lm_dir, endpoint="chat")
    assert llm.chat_prompt("Who wrote Hamlet?") == "Who wrote Hamlet?"  # the server applies the template

    g = llm.generate(["Who wrote Hamlet?"], SamplingParams(max_new_tokens=32, stop=["</search>"], logprobs=True))[0][0]

    assert app.state.requests[-1]["messages"] == [{"role": "user", "content": "Who wrote Hamlet?"}]
    assert g.text.endswith("</search>") and g.logprobs == [-0.5 - i for i in range(13)]
    with pytest.raises(ValueError, match="prompt 0 is token ids"):
        llm.generate([[1, 2]], SamplingParams(max_new_tokens=2))


def test_the_completions_endpoint_renders_the_chat_template_locally(server, tiny_causal_lm_dir):
    _, url = server
    llm = make_llm(url, tiny_causal_lm_dir)
    assert llm.chat_prompt("hi").endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_an_unloadable_tokenizer_names_the_setting_to_fix(server, tmp_path):
    _, url = server
    llm = make_llm(url, str(tmp_path))  # a folder without tokenizer files
    with pytest.raises(OpenAIError, match="set the LLM config's `tokenizer` to a local tokenizer folder"):
        llm.generate(["Q"], SamplingParams(max_new_tokens=2))


def test_every_request_carries_its_seed_and_vllms_sampling_fields(server, tiny_causal_lm_dir):
    """One seed per prompt (identical prompts sample apart on a server that seeds each request), and
    repetition_penalty, top_k and min_p sent always: a vLLM server fills missing ones from the model's
    generation_config (Qwen2.5-Instruct's repetition_penalty 1.05), which the in-process backends never apply."""
    app, url = server
    llm = make_llm(url, tiny_causal_lm_dir)
    app.state.requests.clear()
    llm.generate(["SEEDS"] * 3, SamplingParams(max_new_tokens=4, temperature=1.0, seeds=[7, 8, 9]))
    sent = sorted(app.state.requests, key=lambda body: body["seed"])
    assert [body["seed"] for body in sent] == [7, 8, 9]
    assert {(b["repetition_penalty"], b["top_k"], b["min_p"]) for b in sent} == {(1.0, -1, 0.0)}
    app.state.requests.clear()
    llm.generate(["SEEDS"], SamplingParams(max_new_tokens=4, top_k=20, min_p=0.05, repetition_penalty=1.1))
    (body,) = app.state.requests
    assert (body["top_k"], body["min_p"], body["repetition_penalty"]) == (20, 0.05, 1.1) and "seed" not in body
    ((aborted,),) = llm.generate(["ABORT"], SamplingParams(max_new_tokens=2))
    assert aborted.finish_reason == "abort"  # vLLM's server gave up on it: not a stop, not a length
    with pytest.raises(ValueError, match="2 seeds for 3 prompts"):
        llm.generate(["SEEDS"] * 3, SamplingParams(seeds=[1, 2]))


_DYING_SERVER = """
import os, signal, sys
import uvicorn
from tests.base.llm.test_llm_openai import fake_openai_app

port, answers, log = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
app = fake_openai_app()
served = [0]

@app.middleware("http")
async def dies_after_its_answers(request, call_next):
    served[0] += 1
    if served[0] > answers:  # the scorer's process dies (OOM killer, a node failure): connections reset
        os.kill(os.getpid(), signal.SIGKILL)
    response = await call_next(request)
    with open(log, "a") as handle:
        handle.write("answered\\n")
    return response

uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
"""


def _start_server(port: int, answers: int, log) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", _DYING_SERVER, str(port), str(answers), str(log)],
                               cwd=ROOT, env=os.environ | {"PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return process
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError("the fake server did not start")


def test_a_server_that_dies_mid_call_loses_only_the_requests_in_flight(tmp_path, tiny_causal_lm_dir):
    """A real server process SIGKILLed after 5 of 12 replies: the call fails, the 5 replies are in the store, and
    the same call against a restarted server sends only the other 7 and gives what an uninterrupted call gives."""
    from agentic_retriever.mining.store import StageStore

    port, log = free_port(), tmp_path / "answered.log"
    prompts = [f"Rate passage {i}" for i in range(12)]
    params = SamplingParams(max_new_tokens=4, seed=7)
    server = _start_server(port, answers=5, log=log)
    try:
        with StageStore(tmp_path / "replies.jsonl") as store:
            llm = make_llm(f"http://127.0.0.1:{port}/v1", tiny_causal_lm_dir, max_concurrency=1, max_retries=1)
            llm.reply_store = store
            with pytest.raises(OpenAIError, match="failed 2 times"):
                llm.generate(prompts, params)
            assert len(list(store.keys())) == 5 and server.wait(timeout=30) == -signal.SIGKILL
    finally:
        server.kill()
    assert len(log.read_text().splitlines()) == 5

    server = _start_server(port, answers=100, log=log)
    try:
        with StageStore(tmp_path / "replies.jsonl") as store:
            llm = make_llm(f"http://127.0.0.1:{port}/v1", tiny_causal_lm_dir)
            llm.reply_store = store
            resumed = llm.generate(prompts, params)
            assert len(log.read_text().splitlines()) == 5 + 7  # the 5 stored replies were not asked again
            llm.reply_store = None
            uninterrupted = llm.generate(prompts, params)
    finally:
        server.kill()
        server.wait()
    assert [[g.text for g in gens] for gens in resumed] == [[g.text for g in gens] for gens in uninterrupted]


def test_a_hung_server_is_an_error_after_the_requests_deadline_not_after_every_retry(server, tiny_causal_lm_dir):
    app, url = server
    llm = make_llm(url, tiny_causal_lm_dir, timeout=0.3, max_retries=50, deadline_s=1.0)
    started = time.monotonic()
    with pytest.raises(OpenAIError, match=r"no answer within the request's deadline of 1 s .*deadline_s"):
        llm.generate(["SLOW to answer"], SamplingParams(max_new_tokens=2))
    assert time.monotonic() - started < 3.0 and app.state.attempts["SLOW to answer"] <= 4
