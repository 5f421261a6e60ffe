"""`agentic-retriever agent import`: trajectories other tools wrote, as ours, so that `mine run` reads them.

Three formats (docs/data-formats.md, "Imported trajectories", maps each field):

* ``verl``: verl's rollout dumps (``trainer.rollout_data_dir``, or ``validation_data_dir``): one ``STEP.jsonl``
  per training step with ``input`` (the decoded prompt), ``output`` (the decoded response, observations
  included), ``gts`` (the row's ``reward_model.ground_truth``), ``score`` and ``step``;
* ``search_r1``: Search-R1's data parquet (or JSONL of the same fields) with a ``responses`` column, one response
  text per sample, as verl's ``main_generation`` writes beside the input columns;
* ``flashrag``: the Agentic-R release's step-1 output, FlashRAG's ``intermediate_data.json`` from its
  ``SearchR1Pipeline`` (``id``, ``question``, ``golden_answers``, ``output.prompt`` with the whole trajectory and
  ``output.retrieval_results`` with each search's ``query`` and ``docs``, corpus ``id`` and ``contents``).

A response is cut into turns with the Search-R1 dialect ("Search-R1", arXiv 2503.09516): a turn ends at the
first ``</search>`` or ``</answer>``; the ``<information>...</information>`` block after a search (with the
whitespace around it) is its observation, kept as the agent saw it; Search-R1's invalid-action message ends
an invalid turn. Only the flashrag format says which passages a search returned. For the others the searches
are run again, with the question, against the retriever the user names (``retrieval``): the ids, titles and
scores then come from that retriever, and the statistics count these searches and how many got the very titles
the observation showed. A question gets its id from ``qa`` when given, matched by normalised question (a
merged set's namespaced ids), else the input's own id (flashrag), else ``q-`` and a hash of the question; an id
given to two different questions is an error; a question's trajectories are numbered as samples in order.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from agentic_retriever.base.client import RetrievalClient, RetrievalConfig
from agentic_retriever.base.corpus import split_contents
from agentic_retriever.base.jsonl import DataFormatError, iter_jsonl, read_json, write_json, write_jsonl
from agentic_retriever.base.qa_metrics import golden_strings, normalize_answer, qa_scores
from agentic_retriever.base.qa_sources import iter_search_r1_file, question_after_marker, search_r1_qa_row
from agentic_retriever.base.qa_sources import read_qa_rows
from agentic_retriever.retrieval import open_client

from .dialects.search_r1 import INVALID_ACTION_MESSAGE, SearchR1Dialect
from .trajectory import Retrieved, Trajectory, Turn

__all__ = ["ImportConfig", "ImportStats", "import_summary", "import_trajectories", "split_response"]

log = logging.getLogger(__name__)

ImportFormat = Literal["verl", "search_r1", "flashrag"]
_DIALECT = SearchR1Dialect()
_STOP = re.compile(r"</search>|</answer>")
_OBSERVATION = re.compile(r"\s*<information>.*?</information>\s*", re.DOTALL)
_DOC_TITLE = re.compile(r"Doc \d+\(Title: (.*?)\) ")
#: Where the release's FlashRAG prompts hand over to the model (its step 2 cuts there too).
_ASSISTANT = "<|im_start|>assistant\n"


@dataclass
class ImportConfig:
    """Settings of `agentic-retriever agent import` (section ``agent_import``)."""

    format: ImportFormat = field(default="verl", metadata={"help": "what wrote the inputs"})
    inputs: list[str] = field(default_factory=list, metadata={
        "help": "files or folders to read (verl: STEP.jsonl files or their folder, in step order)", "required": True})
    out: str = field(default="", metadata={"help": "trajectory file to write (JSONL)",
                                           "derive": "{workdir}/agent/imported_trajectories.jsonl"})
    qa: str = field(default="", metadata={
        "help": "QA set giving question ids and datasets (matched by normalised question); empty: hashed ids"})
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    topk: int = field(default=3, metadata={
        "help": "passages per search run again, when the observation does not show how many"})
    model: str = field(default="", metadata={"help": "the agent that wrote them, as recorded (default: FORMAT import)"})
    retriever: str = field(default="", metadata={
        "help": "the retriever they searched, as recorded (default: the one searches are run again with)"})


@dataclass
class ImportStats:
    """What an import read, wrote and ran again (written as ``OUT.import.json``)."""

    format: str
    inputs: list[str]
    trajectories: int = 0
    searches: int = 0  # search turns with an observation
    searches_with_ids: int = 0  # their passages named by the input
    searches_run_again: int = 0  # their passages from `retrieval`, run again
    run_again_same_titles: int = 0  # of those, the ones whose titles equal the observation's, in order
    questions_matched_to_qa: int = 0
    questions_hashed: int = 0
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> rows not imported
    retriever: str = ""


@dataclass
class _Raw:
    """One trajectory as read: the response text, and the passages of each executed search when the input has them."""

    question: str
    golden: list[str]
    response: str
    where: str
    line: int
    question_id: str | None = None
    known: list[Retrieved] | None = None


def split_response(response: str) -> tuple[list[Turn], str]:
    """`response` as Search-R1 turns (observations verbatim, ``retrieved`` left empty), and any text after the
    answer (nothing for an agent that stops at ``</answer>``)."""
    turns, pos = [], 0
    while pos < len(response):
        stop = _STOP.search(response, pos)
        invalid = response.find(INVALID_ACTION_MESSAGE, pos)
        if invalid >= 0 and (stop is None or invalid < stop.start()):
            turns.append(Turn(response[pos:invalid], "invalid", observation=INVALID_ACTION_MESSAGE))
            pos = invalid + len(INVALID_ACTION_MESSAGE)
            continue
        if stop is None:
            rest = response[pos:]
            if rest.strip():
                turns.append(Turn(rest, _DIALECT.parse_action(rest).kind))
            return turns, ""
        text = response[pos:stop.end()]
        action = _DIALECT.parse_action(text)
        pos = stop.end()
        if action.kind == "search":
            observation = _OBSERVATION.match(response, pos)
            seen = observation.group(0) if observation else ""
            turns.append(Turn(text, "search", list(action.queries), observation=seen))
            pos += len(seen)
        else:
            turns.append(Turn(text, action.kind))
            if action.kind == "answer":
                return turns, response[pos:]
    return turns, ""


def _golden(value: Any, where: str, line: int, field_name: str) -> list[str]:
    if isinstance(value, dict):
        value = value.get("target")
    try:
        golden = golden_strings(value)
    except TypeError as error:
        raise DataFormatError(where, line, str(error), field=field_name) from None
    if not golden:
        raise DataFormatError(where, line, "no golden answers", field=field_name)
    return golden


def _input_files(inputs: Sequence[str], pattern: str) -> list[Path]:
    files = []
    for name in inputs:
        path = Path(name)
        if path.is_dir():
            found = sorted(path.glob(pattern), key=lambda p: (int(p.stem) if p.stem.isdigit() else float("inf"), p.name))
            if not found:
                raise FileNotFoundError(f"{path} holds no {pattern} files")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise FileNotFoundError(f"import input not found: {path}")
    return files


def _verl_raws(inputs: Sequence[str]) -> Iterator[_Raw]:
    for path in _input_files(inputs, "*.jsonl"):
        for line, row in iter_jsonl(path):
            for name in ("input", "output", "gts"):
                if name not in row:
                    raise DataFormatError(path, line, "missing (verl's rollout dumps have input, output, gts)",
                                          field=name)
            for name in ("input", "output"):
                if not isinstance(row[name], str):
                    raise DataFormatError(path, line, f"expected a string, got {type(row[name]).__name__}", field=name)
            yield _Raw(question_after_marker(row["input"], str(path), line, "input"),
                       _golden(row["gts"], str(path), line, "gts"), row["output"], str(path), line)


def _search_r1_raws(inputs: Sequence[str]) -> Iterator[_Raw]:
    for path in _input_files(inputs, "*.parquet"):
        for line, row in iter_search_r1_file(path):
            qa = search_r1_qa_row(row, str(path), line)
            responses = row.get("responses")
            if isinstance(responses, str):
                responses = [responses]
            if not isinstance(responses, list) or not all(isinstance(r, str) for r in responses):
                raise DataFormatError(path, line, "missing or not a list of response texts", field="responses")
            for response in responses:
                yield _Raw(qa["question"], _golden(qa["golden_answers"], str(path), line, "golden_answers"),
                           response, str(path), line)


def _flashrag_raws(inputs: Sequence[str]) -> Iterator[_Raw]:
    for path in _input_files(inputs, "intermediate_data.json"):
        items = read_json(path)
        if not isinstance(items, list):
            raise DataFormatError(path, None, "expected FlashRAG's list of items (intermediate_data.json)")
        for number, item in enumerate(items, start=1):
            where = str(path)
            if not isinstance(item, dict):
                raise DataFormatError(where, number, f"expected an item object, got {type(item).__name__}")
            for name in ("id", "question", "golden_answers", "output"):
                if name not in item:
                    raise DataFormatError(where, number, "missing", field=name)
            output = item["output"]
            prompt = output.get("prompt") if isinstance(output, dict) else None
            if not isinstance(prompt, str):
                raise DataFormatError(where, number, "missing or not a string", field="output.prompt")
            response = prompt.split(_ASSISTANT)[-1] if _ASSISTANT in prompt else \
                prompt.split(f"Question: {item['question']}\n", 1)[-1]
            yield _Raw(item["question"], _golden(item["golden_answers"], where, number, "golden_answers"), response,
                       where, number, str(item["id"]), _flashrag_retrievals(output, where, number))


def _flashrag_retrievals(output: dict, where: str, number: int) -> list[Retrieved]:
    results = output.get("retrieval_results") or {}
    if not isinstance(results, dict):
        raise DataFormatError(where, number, "expected an object keyed by search number", field="output.retrieval_results")
    known = []
    for key in sorted(results, key=lambda k: int(k) if str(k).isdigit() else -1):
        docs = results[key].get("docs") if isinstance(results[key], dict) else None
        label = f"output.retrieval_results.{key}.docs"
        if not isinstance(docs, list) or not all(isinstance(d, dict) and "id" in d and "contents" in d for d in docs):
            raise DataFormatError(where, number, "expected a list of corpus rows with id and contents", field=label)
        titles = [split_contents(d["contents"])[0] for d in docs]
        scores = [float(d["score"]) for d in docs] if all("score" in d for d in docs) else []
        known.append(Retrieved([str(d["id"]) for d in docs], titles, scores))
    return known


_READERS = {"verl": _verl_raws, "search_r1": _search_r1_raws, "flashrag": _flashrag_raws}


def _qa_index(spec: str) -> dict[str, str]:
    """Normalised question -> the id of the first row asking it."""
    index: dict[str, str] = {}
    for row in read_qa_rows(spec):
        index.setdefault(normalize_answer(row.question), row.id)
    return index


def _hashed_id(question: str) -> str:
    return "q-" + hashlib.sha1(normalize_answer(question).encode("utf-8")).hexdigest()[:12]


def _observed_titles(observation: str) -> list[str]:
    return [title[1:-1] if len(title) >= 2 and title[0] == title[-1] == '"' else title
            for title in _DOC_TITLE.findall(observation)]


def import_trajectories(config: ImportConfig, client: RetrievalClient | None = None) -> ImportStats:
    """Read `config.inputs` in `config.format`, write our trajectories to `config.out` (whole or not at all) and
    the statistics beside it (``OUT.import.json``); `client` overrides `config.retrieval` (tests, callers that
    hold one)."""
    if not config.inputs:
        raise ValueError("agent import needs --inputs (the files or folders to read)")
    if not config.out:
        raise ValueError("agent import needs --out (the trajectory file to write)")
    stats = ImportStats(config.format, list(config.inputs))
    by_question = _qa_index(config.qa) if config.qa else {}
    built: list[tuple[Trajectory, list[int]]] = []  # the trajectory and its search turns still without passages
    samples: Counter[str] = Counter()
    question_of: dict[str, str] = {}  # question id -> the question it was first given to
    for raw in _READERS[config.format](config.inputs):
        turns, trailing = split_response(raw.response)
        searched = [i for i, t in enumerate(turns) if t.action == "search" and t.observation]
        if raw.known is not None:
            if len(raw.known) != len(searched):
                stats.skipped["searches_do_not_match_retrieval_results"] = \
                    stats.skipped.get("searches_do_not_match_retrieval_results", 0) + 1
                continue
            for i, retrieved in zip(searched, raw.known):
                turns[i].retrieved = [retrieved]
            stats.searches_with_ids += len(searched)
        if trailing.strip():
            log.debug("%s:%d: text after the answer dropped: %r", raw.where, raw.line, trailing[:80])
        matched = by_question.get(normalize_answer(raw.question))
        question_id = matched or raw.question_id or _hashed_id(raw.question)
        stats.questions_matched_to_qa += matched is not None
        stats.questions_hashed += matched is None and raw.question_id is None
        earlier = question_of.setdefault(question_id, raw.question)
        if normalize_answer(earlier) != normalize_answer(raw.question):
            raise DataFormatError(raw.where, raw.line, f"question id {question_id!r} also names another question "
                                  f"({earlier!r}): inputs of several datasets number their ids alike; give --qa "
                                  "with the merged QA set to take its namespaced ids", field="id")
        answer = _DIALECT.extract_answer(raw.response)
        scores = qa_scores(answer, raw.golden)
        sample = samples[question_id]
        samples[question_id] += 1
        trajectory = Trajectory(
            question_id=question_id, question=raw.question, golden_answers=raw.golden, dialect=_DIALECT.name,
            model=config.model or f"{config.format} import", retriever=config.retriever, turns=turns, answer=answer,
            num_searches=len(searched), em=scores.em, f1=scores.f1, contains_em=scores.contains_em,
            finish_reason="answer" if answer is not None else "max_turns", sample=sample)
        built.append((trajectory, [] if raw.known is not None else searched))
        stats.searches += len(searched)
    missing = [(t, i) for t, turns in built for i in turns]
    if missing:
        _search_again(config, client, missing, stats)
    for trajectory, _ in built:
        trajectory.retriever = trajectory.retriever or stats.retriever
    stats.trajectories = write_jsonl(config.out, (t.to_json() for t, _ in built))
    write_json(f"{config.out}.import.json", asdict(stats))
    log.info("imported %d trajectories (%d searches, %d run again) into %s", stats.trajectories, stats.searches,
             stats.searches_run_again, config.out)
    return stats


def _search_again(config: ImportConfig, client: RetrievalClient | None, missing: list[tuple[Trajectory, int]],
                  stats: ImportStats) -> None:
    """Fill the passages of searches the input does not name by running them again, with their question."""
    if client is None:
        if not (config.retrieval.index or config.retrieval.url):
            raise ValueError(f"the {config.format} format does not say which passages a search returned: name the "
                             "retriever to run its searches again with (--index DIR or --url URL)")
        client = open_client(config.retrieval)
    stats.retriever = config.retriever or config.retrieval.index or config.retrieval.url or "given client"
    groups: dict[int, list[tuple[Trajectory, int]]] = defaultdict(list)
    for trajectory, turn_index in missing:
        shown = len(_DOC_TITLE.findall(trajectory.turns[turn_index].observation))
        groups[shown or config.topk].append((trajectory, turn_index))
    for k, group in sorted(groups.items()):
        results = client.retrieve([t.turns[i].queries[0] for t, i in group], topk=k,
                                  questions=[t.question for t, _ in group])
        for (trajectory, turn_index), hits in zip(group, results, strict=True):
            turn = trajectory.turns[turn_index]
            turn.retrieved = [Retrieved([p.id for p in hits], [p.title for p in hits], [float(p.score) for p in hits])]
            stats.run_again_same_titles += [p.title for p in hits] == _observed_titles(turn.observation)
        stats.searches_run_again += len(group)


def import_summary(stats: ImportStats) -> str:
    """Two lines for the shell: what was written, and where passages came from."""
    skipped = ", ".join(f"{n} {reason}" for reason, n in stats.skipped.items()) or "none"
    again = (f"{stats.searches_run_again} run again with {stats.retriever} ({stats.run_again_same_titles} gave the "
             "titles the agent saw)") if stats.searches_run_again else "none run again"
    return (f"{stats.trajectories} trajectories, {stats.searches} searches ({stats.searches_with_ids} with the "
            f"input's passage ids, {again}); skipped: {skipped}")

