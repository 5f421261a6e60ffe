"""A dry run of the paper config (`configs/agentic_r_loop.yaml`, Algorithm 1 of "Agentic-R: Learning to Retrieve for
Agentic Search", arXiv 2601.11888) on this machine: the config with the override set of `dry_run_paper_loop.yaml`
beside this script (models, sizes and devices only), run through both iterations to the report by the same command
a user with 8 GPUs runs (`agentic-retriever loop --config ...`).

    make dry-run-paper        # python benchmarks/experiments/paper_dry_run/dry_run_paper_loop.py --out runs/dry_run_paper_loop
    make dry-run-paper-verl   # the same with --verl --out runs/dry_run_paper_loop_verl
    make dry-run-paper-ray    # the same with --ray --out runs/dry_run_paper_loop_ray
    make dry-run-paper-decoder   # the same with --retriever decoder --out runs/dry_run_paper_loop_decoder

With ``--retriever decoder`` the paper config is the decoder-embedder one,
``configs/agentic_r_qwen3_embedding_4b_lora_loop.yaml`` (Qwen3-Embedding-4B trained with LoRA and the cached loss,
itself extending ``configs/agentic_r_loop.yaml``), and the retriever's stand-in is a small Qwen3-architecture embedder
(`agentic_retriever.standins.decoder_embedder`, 2 layers of 128) in place of e5's MiniLM: last-token pooling, left
padding, the query instruction, LoRA adapters trained, merged and exported in both iterations. Its random weights
retrieve at chance, and the loop then mines nothing (the first try: 0 of 32 rounds above the LR threshold), so it is
first warm-started on the corpus alone, as Qwen3-Embedding starts from contrastive pretraining: the inverse cloze
task (Lee et al., "Latent Retrieval for Weakly Supervised Open Domain Question Answering", arXiv 1906.00300), each
passage's title and 7 random spans of 2-6 of its words as queries of it, one random other passage as the negative,
4 epochs (`warm_started_retriever`). No question and no label is read. It stays a weaker retriever than MiniLM, so
the run mines all 55 RL train questions and trains one query a process a step (`DECODER_EMBEDDER`).

With ``--verl`` (in ``.venv-verl``: verl 0.9.1 and vLLM's CPU build, `make verl-setup`) the agent step of both
iterations is verl's own trainer instead of the embedded stand-in (`VERL_ON_CPU`: ``stand_in`` off, the run launched
by the loop on the CPU platform of `agent.rl.verl.cpu`, one FSDP rank, GRPO in place of PPO, whose
critic verl cannot load without flash-attention, and ``agent_init: previous`` so that the second iteration's verl
run starts from the first one's checkpoint).

What it makes first, in the paper's formats and at the paths the config names (relative to ``--out``):
- ``data/wiki-18.jsonl``: a few hundred passages of the embedded corpus in Search-R1's wiki-18 form
  (``{"id", "contents": '"Title"\\ntext'}``): the evidence pages of the chosen questions and a seeded sample of the rest;
- ``data/FlashRAG_datasets/{triviaqa,hotpotqa}/train.jsonl`` and ``data/FlashRAG_datasets/hotpotqa/dev.jsonl``:
  FanOutQA leaf questions of the prepared train and dev splits as FlashRAG rows in the hub's layout
  (``{"id": "train_0", "question", "golden_answers", "metadata"}``, numbered per file as FlashRAG does: the two
  train files share ids, which the config's merged set namespaces; no evidence titles, no parent question);
- the agent that stands in for Qwen2.5-7B-Base: SmolLM2-135M-Instruct warm-started on other train questions
  (`agent sft`, cached by its inputs), since a base 135M model does not write the dialect's tags and the loop would
  mine nothing. The 72B scorer's server is `agentic_retriever.standins.scripted_scorer` (its docstring says why), started and
  stopped by the loop as the ``lr_scorer`` service; the scorer's tokenizer is SmolLM2's.

Writes ``dry_run.json`` (wall time per step, the report's rows, the verl validation) beside the loop's folder; the
figures go to benchmarks/RESULTS.md, "The paper config's dry run".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/: _common (an experiment runs as a script)
from _common import cpu_model, free_port, usable_cores  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
OVERRIDES = Path(__file__).with_name("dry_run_paper_loop.yaml")
#: The paper config by its retriever: e5-base-v2 (the paper's) or a decoder embedder with LoRA.
PAPER_CONFIGS = {"e5": ROOT / "configs" / "agentic_r_loop.yaml",
                 "decoder": ROOT / "configs" / "agentic_r_qwen3_embedding_4b_lora_loop.yaml"}
#: With ``--retriever decoder``: the retriever's stand-in, a small Qwen3 embedder warm-started on the corpus
#: (`warm_started_retriever`), in the index build and retriever training (in place of the override set's MiniLM),
#: and one query a process a step: the stand-in's candidates pass the LR threshold less often than MiniLM's (3 rows
#: of 32 rounds in its first run, short of the 4 that 2 processes x 2 queries need), so the run also mines every
#: RL train question of the prepared split (`make_data`).
DECODER_EMBEDDER = {"index_build": {"encoder": {"model": "{retriever_model}"}},
                    "retriever_train": {"encoder": {"model": "{retriever_model}"}, "per_device_batch_size": 1}}
#: The loop's verl section with ``--verl``: verl's own trainer on the CPU in place of the stand-in, one Ray GPU label
#: (one FSDP rank and one vLLM CPU server: a second rank would double the run's memory on a 2-core machine).
#: The algorithm is GRPO, not the paper's PPO: verl 0.9.1 loads PPO's critic with flash-attention 2 hard-coded, which
#: has no CPU build (docs/verl.md, "verl on CPUs"). Agent_2 continues Agent_1 (``agent_init: previous``; the paper
#: config restarts from the base model), so that the second verl run starts from the first one's checkpoint, the
#: path of every run with ``previous``; everything else of the agent step is the paper config's.
VERL_ON_CPU = {"loop": {"agent_init": "previous",
                        "verl": {"stand_in": False, "launch": True, "device": "cpu", "n_gpus_per_node": 1,
                                 "poll_seconds": 10, "timeout_seconds": 5400}},
               "agent_train": {"algorithm": "grpo", "samples_per_prompt": 2, "mini_batch_size": 8}}
#: The loop's placement with ``--ray``: the shards and the scorer's server as Ray actors over a local cluster of two
#: nodes declaring one GPU label each (`ray_cluster`), two shards a step as with the local placement, so that the
#: report can be compared figure for figure; the loop's service binds every interface and hands out the node's
#: address, and the scorer binds every interface too (Ray may place it on either node).
RAY_PLACEMENT = {"loop": {"placement": "ray", "rollout_devices": [], "mining_devices": [],
                          "ray": {"rollout_shards": 2, "mining_shards": 2, "gpus_per_shard": 1,
                                  "cpus_per_process": 0.5},
                          "service": {"host": "0.0.0.0"},
                          "step_servers": {"lr_scorer": {
                              "command": "{python} -m agentic_retriever.standins.scripted_scorer --host 0.0.0.0 --port {port}"}}}}
#: Nodes of the ``--ray`` cluster and the GPU labels each declares (resources only: nothing runs on a GPU).
RAY_NODES, RAY_GPUS_PER_NODE = 2, 1
#: Questions per role and passages in the corpus.
TRAIN_QUESTIONS, DEV_QUESTIONS, WARM_QUESTIONS, CORPUS_PASSAGES = 32, 16, 96, 400


def fill(value, names: dict[str, str]):
    """`value` with ``{name}`` placeholders of strings filled from `names` (recursively)."""
    if isinstance(value, dict):
        return {k: fill(v, names) for k, v in value.items()}
    if isinstance(value, list):
        return [fill(v, names) for v in value]
    if isinstance(value, str):
        for name, text in names.items():
            value = value.replace("{" + name + "}", text)
    return value


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    from agentic_retriever.base.jsonl import write_jsonl

    write_jsonl(path, rows)


def flashrag_row(row: dict, row_id: str) -> dict:
    """A FanOutQA leaf row as FlashRAG writes its QA rows (ids numbered per split): no evidence titles, no parent
    question; the FanOutQA id stays in the metadata."""
    return {"id": row_id, "question": row["question"], "golden_answers": row["golden_answers"],
            "metadata": {"source": "fanoutqa", "fanoutqa_id": row["id"]}}


#: Where FlashRAG's QA datasets lie in the paper config (the hub repository's layout).
FLASHRAG = Path("data") / "FlashRAG_datasets"


def make_data(out: Path, seed: int = 0, train_questions: int | None = TRAIN_QUESTIONS) -> dict:
    """The corpus, the two QA files (`train_questions` of the prepared RL train split; None: all of them) and the
    warm start's questions (see the module docstring)."""
    from agentic_retriever.base.data.prepare import PrepareConfig, prepare_defaults

    prepared = out / "prepared"
    prepare_defaults(PrepareConfig(out=str(prepared), dev_fraction=0.3, mining_fraction=0.5))
    train = _jsonl(prepared / "fanoutqa_leaf_train_rl.jsonl")[:train_questions]
    dev = _jsonl(prepared / "fanoutqa_leaf_dev_in_corpus.jsonl")[:DEV_QUESTIONS]
    warm = [r for r in _jsonl(prepared / "fanoutqa_leaf_train_warmstart.jsonl") if r["evidence_in_corpus"]]
    warm = warm[:WARM_QUESTIONS]
    corpus = _jsonl(prepared / "corpus.jsonl")
    from agentic_retriever.base.corpus import split_contents

    wanted = {t for row in train + dev + warm for t in row["supporting_titles"]}
    evidence = [p for p in corpus if split_contents(p["contents"])[0] in wanted]
    rest = [p for p in corpus if split_contents(p["contents"])[0] not in wanted]
    random.Random(seed).shuffle(rest)
    passages = evidence + rest[:max(0, CORPUS_PASSAGES - len(evidence))]
    _write_jsonl(out / "data" / "wiki-18.jsonl", passages)
    half = len(train) // 2
    for name, rows in (("triviaqa", train[:half]), ("hotpotqa", train[half:])):
        _write_jsonl(out / FLASHRAG / name / "train.jsonl", [flashrag_row(r, f"train_{i}") for i, r in enumerate(rows)])
    _write_jsonl(out / FLASHRAG / "hotpotqa" / "dev.jsonl", [flashrag_row(r, f"dev_{i}") for i, r in enumerate(dev)])
    _write_jsonl(out / "warm_start" / "questions.jsonl", warm)
    return {"passages": len(passages), "evidence_passages": len(evidence), "train_questions": len(train),
            "dev_questions": len(dev), "warm_start_questions": len(warm)}


def warm_started_agent(out: Path) -> str:
    """SmolLM2-135M-Instruct warm-started (`agent sft`) on the warm-start questions over the dry run's corpus (its
    index kept under the corpus's content hash: `make_data` writes another corpus with ``--retriever decoder``)."""
    from agent.sft import WarmStartConfig, warm_start_agent
    from agent.sft.data import SynthesisConfig
    from agent.sft.train import SFTConfig
    from agentic_retriever.base.client import RetrievalConfig
    from agentic_retriever.base.encoder import EncoderConfig
    from agentic_retriever.base.fingerprint import stable_hash
    from agentic_retriever.index import DenseParams, IndexBuildConfig, build_index

    corpus = _jsonl(out / "data" / "wiki-18.jsonl")
    index = out / "warm_start" / f"index-{stable_hash(corpus, digits=16)}"
    if not (index / "manifest.json").is_file():
        build_index(IndexBuildConfig(corpus=str(out / "data" / "wiki-18.jsonl"), out=str(index),
                                     encoder=EncoderConfig(model="default"), dense=DenseParams(type="flat")))
    config = WarmStartConfig(qa=str(out / "warm_start" / "questions.jsonl"), retrieval=RetrievalConfig(index=str(index)),
                             synthesis=SynthesisConfig(topk=3, retry_chains=True),
                             train=SFTConfig(epochs=1.0, learning_rate=1e-4, batch_size=4, save_steps=10))
    return str(warm_start_agent(config))


#: The inverse cloze task's queries per passage (its title, then random spans) and epochs.
ICT_SPANS, ICT_EPOCHS = 7, 4


def ict_rows(passages: list[dict], seed: int = 0) -> list[dict]:
    """Training rows of the inverse cloze task over `passages`: the title and `ICT_SPANS` random spans of 2-6 words
    of each passage as queries of it, a random other passage as the negative; shuffled."""
    from agentic_retriever.base.corpus import split_contents

    rng = random.Random(seed)
    rows = []
    for index, passage in enumerate(passages):
        title, text = split_contents(passage["contents"])
        words = text.split()
        queries = [title]
        for _ in range(ICT_SPANS):
            length = rng.randint(2, 6)
            start = rng.randint(0, max(0, len(words) - length))
            queries.append(" ".join(words[start:start + length]))
        others = [j for j in range(len(passages)) if j != index]
        rows += [{"query": query, "pos": [passage["contents"]], "neg": [passages[rng.choice(others)]["contents"]]}
                 for query in queries]
    rng.shuffle(rows)
    return rows


def warm_started_retriever(out: Path) -> str:
    """The retriever's stand-in of ``--retriever decoder`` (`DECODER_EMBEDDER`): a small random-weight Qwen3
    embedder with SmolLM2's tokenizer, trained on `ict_rows` of the dry run's corpus (see the module docstring); kept
    under the hash of its training rows and settings, so that another corpus trains another one."""
    from agentic_retriever.base.defaults import smollm2_hf_dir
    from agentic_retriever.base.encoder import EncoderConfig
    from agentic_retriever.base.fingerprint import stable_hash
    from agentic_retriever.standins.decoder_embedder import random_decoder_embedder
    from agentic_retriever.training.config import RetrieverTrainConfig
    from agentic_retriever.training.trainer import train_retriever

    rows = ict_rows(_jsonl(out / "data" / "wiki-18.jsonl"))
    base_shape, max_length = "small", 128
    train = {"per_device_batch_size": 32, "epochs": ICT_EPOCHS, "learning_rate": 2e-3, "temperature": 0.05,
             "precision": "fp32"}
    folder = out / "retriever" / stable_hash({"rows": rows, "shape": base_shape, "max_length": max_length,
                                              "train": train}, digits=16)
    trained = folder / "ict-qwen3-embedder"
    if (trained / "modules.json").is_file():
        return str(trained)
    base = folder / "random-qwen3-embedder"
    if not (base / "modules.json").is_file():
        random_decoder_embedder(base, smollm2_hf_dir(), base_shape, max_length=max_length)
    _write_jsonl(folder / "ict.jsonl", rows)
    return str(train_retriever(RetrieverTrainConfig(
        data=str(folder / "ict.jsonl"), out=str(trained),
        encoder=EncoderConfig(model=str(base), max_length=max_length, composition="query"), save_steps=100_000,
        **train)))


def write_config(out: Path, agent_model: str, verl: bool = False, ray: bool = False,
                 retriever_model: str | None = None) -> Path:
    """The paper config (with `retriever_model`, the decoder-embedder one: `PAPER_CONFIGS`) with the override set
    (and with `verl`, `VERL_ON_CPU`; with `ray`, `RAY_PLACEMENT`; with `retriever_model`, `DECODER_EMBEDDER`) merged
    in and its placeholders filled: ``agentic_r_loop.dry_run.yaml``, one file (the paper config's ``extends``
    resolved)."""
    from agentic_retriever.app.config_loader import load_config_file, merged_sections
    from agentic_retriever.base.defaults import smollm2_hf_dir

    names = {"agent_model": agent_model, "scorer_model": str(smollm2_hf_dir()), "python": sys.executable,
             "root": str(ROOT), "port": str(free_port()), "retriever_model": retriever_model or ""}
    overrides = yaml.safe_load(OVERRIDES.read_text())
    for wanted, extra in ((verl, VERL_ON_CPU), (ray, RAY_PLACEMENT), (retriever_model, DECODER_EMBEDDER)):
        overrides = merged_sections(overrides, extra) if wanted else overrides
    paper = load_config_file(PAPER_CONFIGS["decoder" if retriever_model else "e5"])
    config = merged_sections(paper, fill(overrides, names))
    path = out / "agentic_r_loop.dry_run.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


@contextlib.contextmanager
def ray_cluster():
    """A Ray cluster of `RAY_NODES` nodes on this machine (`ray.cluster_utils.Cluster`), each declaring
    `RAY_GPUS_PER_NODE` GPU labels; yields its address (the loop joins it through ``RAY_ADDRESS``)."""
    from ray.cluster_utils import Cluster

    temp = tempfile.mkdtemp(prefix="ray-")  # short: Ray's socket paths must fit 107 characters
    # Ray's default temporary folder too: `Cluster` writes the head's address to <it>/ray/ray_current_cluster
    os.makedirs(os.path.join(temp, "ray"))
    os.environ["RAY_TMPDIR"] = temp
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "num_gpus": RAY_GPUS_PER_NODE, "object_store_memory": 100 * 2**20, "temp_dir": temp})
    for _ in range(RAY_NODES - 1):
        cluster.add_node(num_cpus=2, num_gpus=RAY_GPUS_PER_NODE, object_store_memory=100 * 2**20)
    try:
        yield cluster.address
    finally:
        cluster.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/dry_run_paper_loop", help="the dry run's folder (its cwd)")
    parser.add_argument("--verl", action="store_true", help="verl's own trainer in the agent step (VERL_ON_CPU)")
    parser.add_argument("--ray", action="store_true",
                        help=f"shards and servers placed by Ray over a local {RAY_NODES}-node cluster (RAY_PLACEMENT)")
    parser.add_argument("--retriever", choices=list(PAPER_CONFIGS), default="e5",
                        help="the paper config's retriever: e5-base-v2, or a decoder embedder with LoRA (its stand-in: "
                             "a random-weight Qwen3 embedder)")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    data = make_data(out, train_questions=None if args.retriever == "decoder" else TRAIN_QUESTIONS)
    print(f"data: {data}", flush=True)
    agent = warm_started_agent(out)
    setup_s = time.perf_counter() - started
    print(f"the stand-in agent: {agent} (set-up {setup_s:.0f} s)", flush=True)
    retriever = warm_started_retriever(out) if args.retriever == "decoder" else None
    config = write_config(out, agent, args.verl, args.ray, retriever)
    command = [sys.executable, "-m", "agentic_retriever.app.cli", "loop", "--config", config.name]
    print(f"running in {out}: {' '.join(command)}", flush=True)
    loop_started = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    with ray_cluster() if args.ray else contextlib.nullcontext() as address:
        finished = subprocess.run(command, cwd=out, env=env | ({"RAY_ADDRESS": address} if address else {}),
                                  check=False)
    loop_s = time.perf_counter() - loop_started
    loop_dir = out / yaml.safe_load(config.read_text())["workdir"] / "loop"  # the loop's own folder (loop.out)
    manifest = json.loads((loop_dir / "loop.json").read_text())
    report_path = loop_dir / "loop_report.json"
    result = {"exit_status": finished.returncode, "setup_seconds": round(setup_s, 1), "loop_seconds": round(loop_s, 1),
              "data": data, "machine": f"{cpu_model()}, {usable_cores()} CPU cores", "retriever": args.retriever,
              "steps": {name: {"status": r["status"], "seconds": round(r["seconds"], 1)}
                        for name, r in manifest["steps"].items()},
              "agent_steps": {name: {key: (r.get("summary") or {}).get(key) for key in ("trainer", "model", "verl_validated")}
                              for name, r in manifest["steps"].items() if name.endswith("/agent")},
              "report": json.loads(report_path.read_text())["rows"] if report_path.is_file() else None}
    (out / "dry_run.json").write_text(json.dumps(result, indent=2), encoding="utf-8")
    print(json.dumps({k: v for k, v in result.items() if k != "report"}, indent=2))
    print(f"report: {loop_dir / 'loop_report.md'}")
    sys.exit(finished.returncode)


if __name__ == "__main__":
    main()
