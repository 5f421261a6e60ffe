"""`agentic-retriever data prepare`: the embedded default corpus and FanOutQA QA sets.

Writes, into one folder:

* ``corpus.jsonl``: one Search-R1 passage per Wikipedia lead summary (ids "0".. in title order);
* ``fanoutqa_leaf_{train,dev}.jsonl``: the leaf sub-questions of FanOutQA's decomposition trees as
  FlashRAG QA rows (``id``, ``question``, ``golden_answers``, ``supporting_titles``) plus ``parent_id`` and, for an
  answer of several parts (a list or a dict), ``answer_parts`` (`answer_parts`);
* ``fanoutqa_leaf_{train,dev}_in_corpus.jsonl``: the leaves whose evidence page is in the corpus (the
  ones retrieval, and an agent answering from what it retrieves, can get right);
* ``fanoutqa_leaf_{train,dev}_answerable.jsonl``: of those, the leaves with a golden answer inside the
  evidence passage (normalised, on word boundaries): the ones where the right passage alone lets a reader
  answer, so answer correctness after a passage (mining's GAC) measures that passage;
* the train questions fall in three roles, by hashes of the top-level question id, so that a question (and
  every leaf under it) has one role only (`train_role`): the held-out slice (``heldout_fraction``), the mining
  questions (``mining_fraction`` of the rest) and the warm-start questions (the others). The agent's warm start
  reads only its own questions, so mining never reads a question (nor a sibling leaf) that the agent saw with
  its evidence passage and gold answer, and GAC measures the passage, not a memorised answer:

  * ``fanoutqa_leaf_train_warmstart.jsonl``: the leaves of the warm-start questions (the warm start keeps those
    whose evidence it retrieves);
  * ``fanoutqa_leaf_train_mining.jsonl``: the answerable leaves of the mining questions (the quickstart's mining
    input); ``fanoutqa_leaf_train_mining_in_corpus.jsonl``: their in-corpus leaves (the larger mining input,
    questions and gold answers only); ``fanoutqa_leaf_train_mining_all.jsonl``: all their leaves, evidence in the
    corpus or not (mining needs gold answers only);
  * ``fanoutqa_leaf_train_heldout.jsonl``: the in-corpus leaves of the held-out questions: the slice that
    chooses retriever training settings and checkpoints (it reads evidence labels), never mined or trained on;
  * ``fanoutqa_leaf_train_rl.jsonl``: the answerable leaves of the warm-start and mining questions, the co-training
    loop's agent RL set (never the held-out slice, which ``..._train_answerable.jsonl`` includes);
  * ``fanoutqa_multihop_train_{warmstart,mining,heldout}.jsonl``: the top-level train questions of each role;
* ``fanoutqa_multihop_{train,dev}.jsonl``: the top-level questions with the evidence titles of all
  their leaves (for evidence recall of whole trajectories);
* ``prepare_summary.json``: counts, including how many leaves have their evidence page in the corpus.

The split is by top-level question id (a hash, so it is deterministic and independent of file order):
a question and all its leaves fall in the same split.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ..defaults import fanoutqa_dev_path, wiki_summaries_path
from ..jsonl import atomic_write, write_json
from ..qa_metrics import contains_match, normalize_answer


@dataclass
class PrepareConfig:
    """Settings of `agentic-retriever data prepare` (section ``data_prepare``)."""

    out: str = field(default="", metadata={"help": "folder to write the corpus and QA files to",
                                           "derive": "{workdir}/data"})
    dev_fraction: float = field(default=0.3, metadata={"help": "share of top-level FanOutQA questions in dev"})
    mining_fraction: float = field(default=0.5, metadata={
        "help": "share of the train questions outside the held-out slice set aside for mining (the others "
                "warm-start the agent)"})
    heldout_fraction: float = field(default=0.3, metadata={
        "help": "share of train top-level questions whose leaves choose training settings (never mined)"})


#: The roles of the top-level train questions (`train_role`).
TRAIN_ROLES = ("warmstart", "mining", "heldout")
#: Bump when the set of files written changes, so an older prepared folder is rewritten.
FILES_VERSION = 12


def answer_strings(answer) -> list[str]:
    """FanOutQA answers (str, number, bool, list, dict) as FlashRAG ``golden_answers``.

    A list or dict is ONE answer made of several parts, so it becomes one string joining them
    ("A, B" / "k: v, k2: v2"), not several alternative answers. Booleans become yes/no.
    """
    if isinstance(answer, bool):
        return ["yes" if answer else "no"]
    if isinstance(answer, float) and answer.is_integer():
        return [str(int(answer))]
    if isinstance(answer, list):
        return [", ".join(answer_strings(a)[0] for a in answer)]
    if isinstance(answer, dict):
        return [", ".join(f"{k}: {answer_strings(v)[0]}" for k, v in answer.items())]
    return [str(answer)]


def answer_parts(answer) -> list[list[str]] | None:
    """The parts of a FanOutQA answer made of several (None for a single answer), each as its alternatives: a list's
    items, a dict's entries as [key, value] (the question may ask for either: "Who are the founders of YouTube?"
    gives {name: age}, "the population of the 5 smallest countries" {country: population}). Answer recall scores
    them part by part, since the joined golden string occurs in no passage."""
    if isinstance(answer, list):
        return [answer_strings(item) for item in answer]
    if isinstance(answer, dict):
        return [[str(key), answer_strings(value)[0]] for key, value in answer.items()]
    return None


def is_dev(question_id: str, dev_fraction: float) -> bool:
    """Deterministic split by hash of the top-level question id."""
    bucket = int(hashlib.sha256(question_id.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return bucket < dev_fraction


def is_heldout(question_id: str, heldout_fraction: float) -> bool:
    """Deterministic held-out slice of the train questions, by a hash independent of the dev split's."""
    return is_dev(f"heldout:{question_id}", heldout_fraction)


def train_role(question_id: str, mining_fraction: float, heldout_fraction: float) -> str:
    """The role of a top-level train question: ``heldout`` (model selection), ``mining`` or ``warmstart``."""
    if is_heldout(question_id, heldout_fraction):
        return "heldout"
    return "mining" if is_dev(f"mining:{question_id}", mining_fraction) else "warmstart"


def _leaves(node: dict) -> Iterator[dict]:
    if not node.get("decomposition"):
        yield node
    for child in node.get("decomposition") or ():
        yield from _leaves(child)


def corpus_rows(summaries: dict) -> list[dict]:
    """Search-R1 corpus rows, one per summary, ids in title order."""
    entries = sorted(summaries.values(), key=lambda e: e["title"])
    return [{"id": str(i), "contents": _passage(e)} for i, e in enumerate(entries)]


def _passage(entry: dict) -> str:
    return f'"{entry["title"]}"\n{entry["extract"].strip()}'


def fanoutqa_rows(questions: list[dict], corpus_text: dict[str, str], dev_fraction: float):
    """(leaf rows, multi-hop rows), each split into {'train': [...], 'dev': [...]}.

    `corpus_text` maps a page title to its passage text; a leaf is ``evidence_in_corpus`` when its evidence
    page is a key, and ``answer_in_evidence`` when a golden answer also occurs in that passage.

    FanOutQA shares some leaves between top-level questions ("What is the capital of China?" under four of
    them, sometimes across the split): each split keeps a leaf once (its first parent), and a train leaf
    whose id or question text is also a dev leaf is left out of train, so no dev leaf is trained on.
    """
    leaves: dict[str, list[dict]] = {"train": [], "dev": []}
    multihop: dict[str, list[dict]] = {"train": [], "dev": []}
    for question in questions:
        split = "dev" if is_dev(question["id"], dev_fraction) else "train"
        titles: list[str] = []
        for leaf in _leaves(question):
            title = (leaf.get("evidence") or {}).get("title")
            parts = answer_parts(leaf["answer"])
            leaves[split].append({
                "id": leaf["id"], "question": leaf["question"], "golden_answers": answer_strings(leaf["answer"]),
                **({"answer_parts": parts} if parts else {}),
                "supporting_titles": [title] if title else [], "parent_id": question["id"],
                "evidence_in_corpus": title in corpus_text,
                "answer_in_evidence": bool(title in corpus_text
                                           and contains_match(corpus_text[title], answer_strings(leaf["answer"]))),
            })
            if title and title not in titles:
                titles.append(title)
        multihop[split].append({
            "id": question["id"], "question": question["question"], "golden_answers": answer_strings(question["answer"]),
            "supporting_titles": titles, "leaf_ids": [leaf["id"] for leaf in _leaves(question)],
        })
    dev_keys = split_keys(leaves["dev"])  # parents never meet (split by top-level question): ids and questions do
    # one row per normalised question: a sub-question asked under two parents is one training question, so the
    # held-out slice drawn afterwards (by parent) cannot hold a question the rest of train also holds
    leaves["train"] = _first_of_each([row for row in leaves["train"] if not split_keys([row]) & dev_keys],
                                     lambda row: normalize_answer(row["question"]))
    return {split: _first_of_each(rows, lambda row: row["id"]) for split, rows in leaves.items()}, multihop


def split_keys(rows: list[dict]) -> set[str]:
    """What makes two QA rows the same question for a split: its id, its parent's id, its normalised question
    ("What is the capital of the United States?" and "What is the capital of United States?" are one question)."""
    keys = set()
    for row in rows:
        keys |= {f"id:{row['id']}", f"q:{normalize_answer(row['question'])}"}
        if row.get("parent_id"):
            keys.add(f"parent:{row['parent_id']}")
    return keys


def assert_disjoint(left: list[dict], right: list[dict], left_name: str, right_name: str) -> None:
    """Refuse two splits that share a question by id, parent id or normalised question (ValueError naming both
    and up to five shared keys): a selection or training slice must never meet the dev set, after normalisation."""
    shared = split_keys(left) & split_keys(right)
    if shared:
        raise ValueError(f"{left_name} and {right_name} share {len(shared)} question keys (ids, parents or normalised "
                         f"questions), e.g. {sorted(shared)[:5]}: they must be disjoint")


def _first_of_each(rows: list[dict], key: Callable[[dict], str]) -> list[dict]:
    """The first row of each `key`."""
    seen: set[str] = set()
    return [row for row in rows if not ((k := key(row)) in seen or seen.add(k))]


def _write_if_changed(path: Path, rows: list[dict]) -> None:
    """Write `rows` as JSONL atomically, unless the file already holds exactly them (its date then stays, so
    caches keyed on it, like the corpus's Arrow copy, remain valid when a newer prepare adds files)."""
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    if path.is_file() and path.read_text(encoding="utf-8") == text:
        return
    with atomic_write(path) as handle:
        handle.write(text)


def prepare_defaults(config: PrepareConfig) -> dict:
    """Write the default corpus and FanOutQA splits to `config.out`; return the summary counts."""
    if not config.out:
        raise ValueError("data prepare: give the output folder (out)")
    for name in ("dev_fraction", "mining_fraction", "heldout_fraction"):
        if not 0.0 < getattr(config, name) < 1.0:
            raise ValueError(f"{name} must be between 0 and 1, got {getattr(config, name)}")
    out = Path(config.out)
    summary_path = out / "prepare_summary.json"
    if summary_path.is_file():  # written last: the folder is complete; keep file dates (caches)
        done = json.loads(summary_path.read_text())
        if (done.get("dev_fraction"), done.get("mining_fraction"), done.get("heldout_fraction"),
                done.get("files_version")) == (config.dev_fraction, config.mining_fraction, config.heldout_fraction,
                                               FILES_VERSION):
            return done
    summaries = json.loads(wiki_summaries_path().read_text(encoding="utf-8"))
    corpus = corpus_rows(summaries)
    _write_if_changed(out / "corpus.jsonl", corpus)
    text = {e["title"]: _passage(e) for e in summaries.values()}
    questions = json.loads(fanoutqa_dev_path().read_text(encoding="utf-8"))
    leaves, multihop = fanoutqa_rows(questions, text, config.dev_fraction)
    for split in ("train", "dev"):
        _write_if_changed(out / f"fanoutqa_leaf_{split}.jsonl", leaves[split])
        _write_if_changed(out / f"fanoutqa_leaf_{split}_in_corpus.jsonl",
                          [r for r in leaves[split] if r["evidence_in_corpus"]])
        _write_if_changed(out / f"fanoutqa_leaf_{split}_answerable.jsonl",
                          [r for r in leaves[split] if r["answer_in_evidence"]])
        _write_if_changed(out / f"fanoutqa_multihop_{split}.jsonl", multihop[split])
    roles = {row["id"]: train_role(row["id"], config.mining_fraction, config.heldout_fraction)
             for row in multihop["train"]}
    by_role = {role: [r for r in leaves["train"] if roles[r["parent_id"]] == role] for role in TRAIN_ROLES}
    for left, right in (("heldout", "mining"), ("heldout", "warmstart"), ("mining", "warmstart")):
        assert_disjoint(by_role[left], by_role[right], f"the {left} questions", f"the {right} questions")
    for role, rows in by_role.items():
        assert_disjoint(rows, leaves["dev"], f"the {role} questions", "the dev leaves")
    for role in TRAIN_ROLES:
        _write_if_changed(out / f"fanoutqa_multihop_train_{role}.jsonl",
                          [r for r in multihop["train"] if roles[r["id"]] == role])
    files = {
        "warmstart": by_role["warmstart"],
        "mining": [r for r in by_role["mining"] if r["answer_in_evidence"]],
        "mining_in_corpus": [r for r in by_role["mining"] if r["evidence_in_corpus"]],
        "mining_all": by_role["mining"],
        "heldout": [r for r in by_role["heldout"] if r["evidence_in_corpus"]],
        "rl": [r for r in by_role["warmstart"] + by_role["mining"] if r["answer_in_evidence"]],
    }
    for name, rows in files.items():
        _write_if_changed(out / f"fanoutqa_leaf_train_{name}.jsonl", rows)
    summary = {
        "corpus_passages": len(corpus),
        "leaf_questions": {s: len(leaves[s]) for s in leaves},
        "leaf_questions_with_evidence_in_corpus": {s: sum(r["evidence_in_corpus"] for r in leaves[s]) for s in leaves},
        "leaf_questions_with_answer_in_evidence": {s: sum(r["answer_in_evidence"] for r in leaves[s]) for s in leaves},
        "leaf_questions_for_mining": len(files["mining"]),
        "leaf_questions_heldout": len(files["heldout"]),
        "leaf_questions_for_mining_in_corpus": len(files["mining_in_corpus"]),
        "leaf_questions_warmstart": len(files["warmstart"]),
        "leaf_questions_warmstart_answerable": sum(r["answer_in_evidence"] for r in files["warmstart"]),
        "leaf_questions_rl": len(files["rl"]),
        "multihop_train_questions": {role: sum(r == role for r in roles.values()) for role in TRAIN_ROLES},
        "multihop_questions": {s: len(multihop[s]) for s in multihop},
        "dev_fraction": config.dev_fraction,
        "mining_fraction": config.mining_fraction,
        "heldout_fraction": config.heldout_fraction,
        "files_version": FILES_VERSION,
    }
    write_json(summary_path, summary)
    return summary
