"""Fakes and synthetic data shared by the tests (``from tests.fakes import ...``); `tests/test_fakes.py` checks
that they fit the protocols they stand in for.

* Synthetic corpora: Search-R1 rows whose texts differ in a few topical words, and a JSONL writer.
* The agent environment: a scripted LLM over the real SmolLM2 tokenizer, and a retrieval client that makes up
  passages.
* The benchmarks' modules, imported as their scripts import their neighbours (`import_benchmark`).
* The mining world, pure Python: a character tokenizer, a scripted agent, a scripted scorer, a dict retriever.
  Every passage says what the fake models make of it:

  * ``lr=NN`` in a passage is the relevance the fake scorer gives it (listwise: printed; pointwise: p(Yes)).
  * ``ANSWER=x`` in the passage of the agent's latest ``<information>`` makes the fake agent answer x;
    without it, the agent searches once more ("misc ...") and then answers "unknown".
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import math
import os
import re
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import httpx

from agent.dialects import SearchR1Dialect
from agent.trajectory import Retrieved, Trajectory, Turn
from agentic_retriever.base.corpus import ScoredPassage
from agentic_retriever.base.llm.protocol import Generation, SamplingParams

# ------------------------------------------------------------------------------------------- synthetic corpora

WORDS = ("river mountain castle violin comet harbor desert glacier falcon library orchard volcano "
         "lantern meadow canyon reef tundra prairie lagoon summit").split()


BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def import_benchmark(name: str):
    """The module `name` of benchmarks/ (a script, a helper such as ``_common``, a check as ``checks.NAME``, an
    experiment as ``experiments.FOLDER.SCRIPT``), imported with benchmarks/ on the path only while it loads, as the
    script itself finds its neighbours."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCHMARKS))


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


#: Queries about the passages of `synthetic_rows` (by words that occur in them).
SYNTHETIC_QUERIES = ["river castle", "comet near the glacier", "item 42", "holds item 7 of kind reef"]


#: The retriever-training tests' passages: 60 short texts over 7 topics, their ids "0".."59".
TRAINING_PASSAGES = [f"Passage number {i} about topic {i % 7} and some words {i * 13 % 11}." for i in range(60)]


def write_training_corpus(path: Path) -> Path:
    """`TRAINING_PASSAGES` as a corpus file, each passage titled "Title i"."""
    path.write_text("".join(json.dumps({"id": str(i), "contents": f'"Title {i}"\n{text}'}) + "\n"
                            for i, text in enumerate(TRAINING_PASSAGES)))
    return path


def synthetic_rows(n: int) -> list[dict]:
    """Search-R1 rows whose texts differ in a few topical words (so retrieval has a right answer)."""
    return [
        {"id": str(i), "contents": f'"Topic {i}"\nThe {WORDS[i % 20]} near the {WORDS[(i * 7) % 20]} '
                                   f"holds item {i} of kind {WORDS[(i * 3) % 20]}."}
        for i in range(n)
    ]


# --------------------------------------------------------------------------------------- the agent environment

def smollm2_tokenizer_dir() -> Path:
    """SmolLM2's tokenizer as `gguf_tokenizer` reads it from the embedded GGUF, saved once in the cache (the session's:
    tests/conftest.py) and read from there: transformers takes about 8 s to convert the GGUF's vocabulary, in each
    test process and each child a test starts, where the saved folder loads in a fraction of a second. Keyed by the
    GGUF and the transformers version that converted it."""
    import transformers

    from agentic_retriever.base.defaults import cache_root, gguf_tokenizer, smollm2_gguf_path
    from agentic_retriever.base.fingerprint import stable_hash
    from agentic_retriever.base.jsonl import folder_built_once

    gguf = smollm2_gguf_path().resolve()
    key = stable_hash([str(gguf), gguf.stat().st_size, gguf.stat().st_mtime_ns, transformers.__version__])[:16]
    return folder_built_once(cache_root() / "tokenizers" / f"smollm2-{key}",
                             lambda building: gguf_tokenizer(gguf).save_pretrained(building))


@functools.cache
def load_smollm2_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_tokenizer_dir()))


class ClosableLLM:
    """What every LLM backend has besides generating: `close` (recorded here) and the context manager."""

    closed = False

    def close(self) -> None:
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ScriptedLLM(ClosableLLM):
    """The LLM protocol over scripted turns: each question (found in the decoded prompt) gets its turns in order.

    Stop strings are honoured as the protocol says (text ends right after the first one) unless
    `honour_stop` is False; every call's prompts and parameters are recorded.
    """

    name = "scripted"

    def __init__(self, tokenizer, script: dict[str, list[str]], honour_stop: bool = True):
        self._tokenizer, self.script, self.honour_stop = tokenizer, script, honour_stop
        self.served: Counter[str] = Counter()
        self.calls: list[tuple[list[list[int]], SamplingParams]] = []

    @property
    def tokenizer(self):
        return self._tokenizer

    def chat_prompt(self, user_message: str) -> str:
        return self._tokenizer.apply_chat_template([{"role": "user", "content": user_message}], tokenize=False,
                                                   add_generation_prompt=True)

    def generate(self, prompts, params: SamplingParams) -> list[list[Generation]]:
        assert all(isinstance(p, list) for p in prompts), "the env must pass token ids"
        self.calls.append(([list(p) for p in prompts], params))
        outputs = []
        for prompt in prompts:
            text = self._tokenizer.decode(prompt)
            question = next(q for q in self.script if q in text)
            turn = self.script[question][self.served[question]]
            self.served[question] += 1
            ends = [turn.find(s) + len(s) for s in params.stop if s in turn]
            stop = None
            if ends and self.honour_stop:
                turn, stop = turn[:min(ends)], next(s for s in params.stop if turn[:min(ends)].endswith(s))
            ids = self._tokenizer.encode(turn, add_special_tokens=False)
            outputs.append([Generation(turn, ids, "stop" if stop else "length", stop)])
        return outputs


class CharScriptedLLM(ScriptedLLM):
    """The scripted LLM over the character tokenizer; the chat prompt is the user message itself."""

    def __init__(self, script: dict[str, list[str]]):
        super().__init__(CharTokenizer(), script)

    def chat_prompt(self, user_message: str) -> str:
        return user_message


class FakeClient:
    """Returns `topk` made-up passages per query and records every call."""

    def __init__(self, text_words: int = 5):
        self.text_words = text_words
        self.calls: list[tuple[list[str], int, list[str | None] | None]] = []

    def retrieve(self, queries: Sequence[str], topk: int, questions=None) -> list[list[ScoredPassage]]:
        self.calls.append((list(queries), topk, list(questions) if questions is not None else None))
        words = " ".join(["word"] * self.text_words)
        return [[ScoredPassage(f"{q}#{i}", f"Title {q} {i}", f"{q} passage {i} {words}", 1.0 - i / 10)
                 for i in range(topk)] for q in queries]


# -------------------------------------------------------------------------------------------- the mining world

DIALECT = SearchR1Dialect()


class CharTokenizer:
    """One token per character (ids are code points): exact, reversible, instant."""

    chat_template = None
    eos_token_id = None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens: bool = False, clean_up_tokenization_spaces: bool = False) -> str:
        return "".join(chr(i) for i in ids)


class Killed(RuntimeError):
    """What a fake LLM raises to simulate a run killed in the middle of a stage."""


class _FakeLLM(ClosableLLM):
    name = "fake"

    def __init__(self, fail_after: int | None = None):
        self._tokenizer = CharTokenizer()
        self.fail_after = fail_after
        self.calls: list[list[str]] = []  # decoded prompts of every generate/score call

    @property
    def tokenizer(self):
        return self._tokenizer

    def chat_prompt(self, user_message: str) -> str:
        return user_message

    def _enter(self, prompts) -> list[str]:
        if self.fail_after is not None and len(self.calls) >= self.fail_after:
            raise Killed(f"{self.name} killed after {len(self.calls)} calls")
        texts = [p if isinstance(p, str) else self._tokenizer.decode(p) for p in prompts]
        self.calls.append(texts)
        return texts

    def _generation(self, text: str, params: SamplingParams) -> list[Generation]:
        stop = next((s for s in params.stop if text.endswith(s)), None)
        return [Generation(text, self._tokenizer.encode(text), "stop", stop)]

    def prompts(self, marker: str) -> list[str]:
        """Every prompt this LLM got that contains `marker`."""
        return [p for call in self.calls for p in call if marker in p]


def last_information(text: str) -> str:
    blocks = re.findall(r"<information>(.*?)</information>", text, re.DOTALL)
    return blocks[-1] if blocks else ""


class FakeAgent(_FakeLLM):
    """The search agent: answers what the latest passage says, else searches once more, then gives up."""

    name = "fake-agent"

    def generate(self, prompts, params: SamplingParams) -> list[list[Generation]]:
        outputs = []
        for text in self._enter(prompts):
            found = re.search(r"ANSWER=([^.;]+)", last_information(text))
            if found:
                turn = f"<think> the passage says it </think>\n<answer> {found.group(1).strip()} </answer>"
            elif "<search> misc" not in text:
                turn = "<think> not there </think>\n<search> misc facts </search>"
            else:
                turn = "<think> giving up </think>\n<answer> unknown </answer>"
            outputs.append(self._generation(turn, params))
        return outputs

    def score(self, prompts, continuations) -> list[list[float]]:
        """Answer likelihood: p(" x") is 0.9 when the latest passage says ANSWER=x, else 0.1."""
        texts = self._enter(prompts)
        out = []
        for text, continuation in zip(texts, continuations):
            answer = self._tokenizer.decode(continuation).strip()
            p = 0.9 if f"ANSWER={answer}" in last_information(text) else 0.1
            out.append([math.log(p) / len(continuation)] * len(continuation))
        return out


class FakeScorer(_FakeLLM):
    """The scorer LLM: sub-answers, listwise scores from the passages' ``lr=NN``, pointwise log-probabilities.

    Queries containing "garbled" get an unparsable listwise answer when decoding greedily (a retry samples and
    parses); "hopeless" ones always get one. Questions about Freedonia get "Not Sure" sub-answers.
    """

    name = "fake-scorer"

    def generate(self, prompts, params: SamplingParams) -> list[list[Generation]]:
        outputs = []
        for text in self._enter(prompts):
            if "Expert Trajectory Analyst" in text:
                outputs.append(self._generation(self._sub_answers(text), params))
            else:
                outputs.append(self._generation(self._scores(text, params), params))
        return outputs

    @staticmethod
    def _sub_answers(text: str) -> str:
        question = text.split("Question:\n\n")[-1].split("\n")[0]
        trajectory = text.split("Agent Trajectory:\n\n", 1)[1]
        queries = re.findall(r"<search>(.*?)</search>", trajectory)
        if "Freedonia" in question:
            return " ".join("<sub-answer> Not Sure </sub-answer>" for _ in queries)
        return " ".join(f"<sub-answer> sub {q.strip()} </sub-answer>" for q in queries)

    @staticmethod
    def _scores(text: str, params: SamplingParams) -> str:
        query = re.search(r"\*\*Search Query:\*\*\n+(.*?)\n", text).group(1)
        if "hopeless" in query or ("garbled" in query and params.greedy):
            return "These passages are all quite relevant."
        passages = text.split("**Passages:**", 1)[1]
        return " ".join(re.findall(r"lr=(\d+)", passages))

    def score(self, prompts, continuations) -> list[list[float]]:
        """Pointwise judgement: p(Yes) = lr / 100 of the passage in the prompt."""
        out = []
        for text, continuation in zip(self._enter(prompts), continuations):
            p = min(max(int(re.search(r"lr=(\d+)", text).group(1)) / 100, 0.01), 0.99)
            p = p if continuation == "Yes" else 1 - p
            out.append([math.log(p)] + [0.0] * (len(continuation) - 1))
        return out


class WorldClient:
    """A dict corpus; a query of a known topic gets that topic's passages in order, others get "misc" ones."""

    def __init__(self, corpus: dict[str, ScoredPassage], topics: dict[str, list[str]]):
        self.corpus, self.topics = corpus, topics
        self.calls: list[tuple[list[str], int, list | None]] = []

    def retrieve(self, queries: Sequence[str], topk: int, questions=None) -> list[list[ScoredPassage]]:
        self.calls.append((list(queries), topk, list(questions) if questions is not None else None))
        return [[self.corpus[i] for i in self.topics.get(q, self.topics["misc facts"])[:topk]] for q in queries]


def make_world(spec: dict[str, list[tuple[int, str | None]]], extra: int = 0) -> WorldClient:
    """A client whose topic `name` holds passages ``name-j`` with (lr, answer) from `spec`, plus filler."""
    corpus, topics = {}, {}
    spec = {"misc facts": [(5, None)] * 25, **spec}
    for name, passages in spec.items():
        topics[name] = []
        for j, (lr, answer) in enumerate(list(passages) + [(10, None)] * extra):
            pid = f"{name.replace(' ', '_')}-{j}"
            said = f" ANSWER={answer}." if answer else ""
            corpus[pid] = ScoredPassage(pid, f"{name} {j}", f"About {name}, lr={lr}.{said}", 1.0 - j / 100)
            topics[name].append(pid)
    return WorldClient(corpus, topics)


def search_turn(query: str, hits: Sequence[ScoredPassage], executed: bool = True) -> Turn:
    text = f"<think> I need {query} </think>\n<search> {query} </search>"
    if not executed:
        return Turn(text, "search", [query])
    retrieved = [Retrieved([p.id for p in hits], [p.title for p in hits], [p.score for p in hits])]
    return Turn(text, "search", [query], retrieved, DIALECT.format_observation([list(hits)]))


def answer_turn(answer: str) -> Turn:
    return Turn(f"<think> done </think>\n<answer> {answer} </answer>", "answer")


def make_trajectory(question_id: str, question: str, golden: list[str], turns: list[Turn],
                    answer: str | None = None) -> Trajectory:
    return Trajectory(question_id=question_id, question=question, golden_answers=golden, dialect="search_r1",
                      model="fake-agent", retriever="fake-retriever", turns=turns, answer=answer,
                      num_searches=sum(1 for t in turns if t.retrieved), em=float(answer in golden), f1=0.0,
                      contains_em=0.0, finish_reason="answer" if answer is not None else "max_turns")


def kill_training_after_first_checkpoint(monkeypatch) -> list[int]:
    """Make a Hugging Face trainer die (KeyboardInterrupt) right after it has saved its first checkpoint and the
    save callbacks have run (so the checkpoint is marked whole, `agentic_retriever.base.hf_checkpoints`), as a process
    killed then would; returns the list of the steps at which checkpoints were saved (the rerun adds to it)."""
    from transformers.trainer_callback import CallbackHandler

    original_on_save, saved_at = CallbackHandler.on_save, []

    def killed_after_first_checkpoint(self, args, state, control):
        control = original_on_save(self, args, state, control)
        saved_at.append(state.global_step)
        if len(saved_at) == 1:
            raise KeyboardInterrupt
        return control

    monkeypatch.setattr(CallbackHandler, "on_save", killed_after_first_checkpoint)
    return saved_at


class RecordingSummaryWriter:
    """Stands in for torch.utils.tensorboard.SummaryWriter (tensorboard is optional): records what it is given, and
    appends itself to `made`."""

    def __init__(self, made: list, log_dir=None, purge_step=None, **kwargs):
        self.log_dir, self.purge_step, self.scalars, self.texts, self.closed = log_dir, purge_step, [], {}, False
        made.append(self)

    def add_scalar(self, tag, value, step=None, *args, **kwargs):
        self.scalars.append((tag, value, step))

    def add_text(self, tag, text, step=None, *args, **kwargs):
        self.texts[tag] = text

    def flush(self):
        pass

    def close(self):
        self.closed = True


def result_ids(result_lists):
    """The document ids of a /retrieve answer's result lists."""
    return [[hit["document"]["id"] for hit in hits] for hits in result_lists]


def result_scores(result_lists):
    """The scores of a /retrieve answer's result lists."""
    return [[hit["score"] for hit in hits] for hits in result_lists]


class CountingRetrieve:
    """Wraps index.retrieve: counts calls (their queries and k) and the most calls ever running at once.

    With `hold_first`, the first call waits until that event is set: what arrives meanwhile is queued."""

    def __init__(self, index, fail_on: str | None = None, hold_first: threading.Event | None = None):
        self.original, self.fail_on, self.hold_first = index.retrieve, fail_on, hold_first
        self.calls, self.ks, self.active, self.max_active = [], [], 0, 0
        self._lock = threading.Lock()

    def __call__(self, queries, k, questions=None, histories=None):
        with self._lock:
            self.calls.append(list(queries))
            self.ks.append(k)
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            first = len(self.calls) == 1
        try:
            if first and self.hold_first is not None:
                assert self.hold_first.wait(60), "the test never released the first index call"
            if self.fail_on is not None and self.fail_on in queries:
                raise RuntimeError(f"the index is on fire ({self.fail_on})")
            return self.original(queries, k, questions, histories)
        finally:
            with self._lock:
                self.active -= 1


def wait_until(condition, what: str, timeout: float = 60.0) -> None:
    """Poll `condition` (not a timing assertion: the bound only stops a broken test from hanging)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.005)


def post_in_thread(url: str, body: dict, responses: dict, key, finished: list) -> threading.Thread:
    """POST `body` to the service at `url` from a new thread: the response goes to responses[key], and `key` is
    appended to `finished` when it is answered (the order requests finished in)."""
    def send():
        with httpx.Client(timeout=120) as http:
            responses[key] = http.post(f"{url}/retrieve", json=body)
        finished.append(key)

    thread = threading.Thread(target=send)
    thread.start()
    return thread


def free_port() -> int:
    """A loopback port free at the time of asking."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


#: What Ray appends to its temp folder for a Unix socket (``/session_<date>_<time>_<pid>/sockets/plasma_store.N``),
#: and the longest path a Unix socket may have.
_RAY_SOCKET_SUFFIX, _UNIX_SOCKET_PATH_MAX = 72, 107


@contextlib.contextmanager
def ray_temp_dir(tmp_path_factory):
    """A folder for a test's Ray session, and Ray's default temporary folder while inside (``RAY_TMPDIR``: Ray's
    `Cluster` writes the head's address to ``<default>/ray/ray_current_cluster`` whatever folder it is given, and
    fails where that folder does not exist). Under the test's temporary folder when Ray's socket paths fit there,
    else (a pytest-xdist worker's folder is longer by ``popen-gwN``) a short one in the system's temporary folder,
    removed afterwards: Ray refuses a socket path over 107 bytes."""
    folder = str(tmp_path_factory.mktemp("ray"))
    short = None
    if len(folder) + _RAY_SOCKET_SUFFIX > _UNIX_SOCKET_PATH_MAX:
        folder = short = tempfile.mkdtemp(prefix="ray")
    (Path(folder) / "ray").mkdir()
    before = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = folder
    try:
        yield folder
    finally:
        if before is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = before
        if short is not None:
            shutil.rmtree(short, ignore_errors=True)
