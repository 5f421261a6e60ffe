"""The paper config's dry run (benchmarks/experiments/paper_dry_run/dry_run_paper_loop.py): its override set swaps
models, sizes and devices only, and the merged config is one every section of the loop reads. The run itself
(about half an hour on 2 cores) is an experiment, with its figures in benchmarks/RESULTS.md."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from agentic_retriever.app.commands import command
from agentic_retriever.app.config_loader import build_config, merged_sections
from agentic_retriever.base.qa_sources import read_qa_rows
from agentic_retriever.standins import scripted_scorer as scripted
from tests.fakes import import_benchmark

ROOT = Path(__file__).resolve().parents[3]


def _script():
    """The experiment's script as a module, imported as it finds its neighbours when run."""
    return import_benchmark("experiments.paper_dry_run.dry_run_paper_loop")


def _leaves(node: dict, prefix: str = "") -> set[str]:
    out: set[str] = set()
    for key, value in node.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and not dotted.startswith("loop.step_servers"):
            out |= _leaves(value, dotted + ".")
        else:
            out.add(dotted)
    return out


#: What the override set may change, by kind (the header of benchmarks/experiments/paper_dry_run/dry_run_paper_loop.yaml).
MODELS = {"agent.model", "agent.precision", "index_build.encoder.model", "index_build.encoder.precision",
          "agent_rollout.agent.backend", "agent_rollout.agent.precision", "mine_run.agent.backend",
          "mine_run.agent.precision", "mine_run.scorer.model", "mine_run.scorer.base_url",
          "retriever_train.encoder.model", "retriever_train.precision", "loop.step_servers"}
SIZES = {"loop.eval.agent_questions", "index_build.encoder.batch_size", "agent_train.steps",
         "agent_train.prompts_per_step", "agent_train.mini_batch_size", "agent_train.micro_batch_size",
         "agent_train.env.max_new_tokens_per_turn", "agent_train.env.observation_max_tokens",
         "agent_train.env.max_context_tokens", "agent_train.save_steps", "agent_rollout.batch_size",
         "agent_rollout.env.max_new_tokens_per_turn", "mine_run.scorer.max_concurrency", "mine_run.mining.num_candidates",
         "mine_run.mining.lr_window", "mine_run.mining.lr_max_new_tokens", "mine_run.mining.sub_answer_max_new_tokens",
         "mine_run.mining.env.max_new_tokens_per_turn", "mine_run.mining.selection.num_negatives",
         "retriever_train.encoder.max_length", "retriever_train.per_device_batch_size",
         "retriever_train.save_steps", "loop.verl.log_prob_micro_batch_size", "loop.verl.critic_micro_batch_size",
         "loop.verl.val_questions"}
DEVICES = {"loop.rollout_devices", "loop.mining_devices", "loop.retriever_launcher", "index_build.encoder.devices",
           "loop.verl.n_gpus_per_node", "loop.verl.stand_in", "loop.service.index_gpu"}


def test_the_override_set_swaps_models_sizes_and_devices_only():
    overrides = yaml.safe_load((ROOT / "benchmarks" / "experiments" / "paper_dry_run" / "dry_run_paper_loop.yaml").read_text())
    assert _leaves(overrides) - (MODELS | SIZES | DEVICES) == set()
    paper = yaml.safe_load((ROOT / "configs" / "agentic_r_loop.yaml").read_text())
    kept = {"mine_run.mining.lr_scorer": "listwise", "mine_run.mining.gac_mode": "rollout",
            "mine_run.mining.selection.lr_threshold": 60, "mine_run.mining.selection.negatives": "release",
            "mine_run.scorer.backend": "openai", "agent_train.algorithm": "ppo", "loop.iterations": 2,
            "retriever_train.encoder.composition": "question_sep_query", "loop.agent_trainer": "verl"}
    merged = merged_sections(paper, overrides)
    for dotted, value in kept.items():
        node = merged
        for part in dotted.split("."):
            node = node[part]
        assert node == value, dotted


def test_the_merged_config_is_read_by_every_section_of_the_loop(tmp_path, monkeypatch):
    """The file the dry run writes, read as `agentic-retriever loop` reads it: the loop's step servers, the shard
    devices, verl's stand-in, each step's section."""
    script = _script()
    monkeypatch.setattr("agentic_retriever.base.defaults.smollm2_hf_dir", lambda: Path("/models/smollm2"))
    path = script.write_config(tmp_path, "/models/agent")
    text = path.read_text()
    assert "{" + "python}" not in text and sys.executable in text and "/models/smollm2" in text
    loop = build_config(command("loop").config_class(), "loop", None, str(path))
    assert loop.mining_devices == loop.rollout_devices == ["cpu", "cpu"] and loop.verl.stand_in
    assert loop.service.index_gpu == "off"  # the paper config's "on" needs faiss-gpu and GPUs
    (scorer,) = loop.step_servers.values()
    mine = build_config(command("mine_run").config_class(), "mine_run", None, str(path))
    assert scorer["steps"] == ["mining"] and mine.scorer.base_url.startswith(scorer["health_url"].removesuffix("/health"))
    assert mine.scorer.model == "/models/smollm2" and mine.mining.selection.negatives == "release"
    for section in ("agent_train", "agent_rollout", "retriever_train", "index_build"):
        build_config(command(section).config_class(), section, None, str(path),
                     set_by_caller=("qa", "out"))


def test_with_a_decoder_embedder_the_dry_run_is_the_4b_lora_config_with_the_retriever_swapped(tmp_path, monkeypatch):
    """`--retriever decoder`: the paper config is the Qwen3-Embedding-4B LoRA one (its `extends` chain resolved into
    the one file written), the index and the trainer read the stand-in embedder, and what the 4B config sets (LoRA,
    the cached loss, last-token pooling) is kept; the override set swaps only the retriever's model."""
    script = _script()
    assert _leaves(script.DECODER_EMBEDDER) <= MODELS | SIZES
    monkeypatch.setattr("agentic_retriever.base.defaults.smollm2_hf_dir", lambda: Path("/models/smollm2"))
    path = script.write_config(tmp_path, "/models/agent", retriever_model="/models/embedder")
    assert "extends" not in yaml.safe_load(path.read_text())
    train = build_config(command("retriever_train").config_class(), "retriever_train", None, str(path))
    index = build_config(command("index_build").config_class(), "index_build", None, str(path), set_by_caller=("out",))
    assert train.encoder.model == index.encoder.model == "/models/embedder"
    assert (train.lora.rank, train.cached, train.encoder.pooling) == (16, True, "lasttoken")
    assert train.precision == "fp32" and train.encoder.composition == "question_sep_query"
    assert train.per_device_batch_size == 1
    loop = build_config(command("loop").config_class(), "loop", None, str(path))
    assert loop.mining_devices == ["cpu", "cpu"] and loop.verl.stand_in and loop.iterations == 2


def test_the_decoder_stand_in_is_warm_started_on_the_corpus_alone_by_the_inverse_cloze_task():
    """Each passage's title and spans of its own words as its queries, another passage as the negative: the rows
    are made from the corpus, so no question and no label reaches the stand-in retriever."""
    from agentic_retriever.base.corpus import split_contents

    script = _script()
    passages = [{"id": str(i), "contents": f'"Title {i}"\n' + " ".join(f"w{i}x{j}" for j in range(30))}
                for i in range(5)]
    rows = script.ict_rows(passages)
    assert len(rows) == 5 * (1 + script.ICT_SPANS)
    for row in rows:
        (positive,), (negative,) = row["pos"], row["neg"]
        title, text = split_contents(positive)
        assert row["query"] == title or (row["query"] in text and 2 <= len(row["query"].split()) <= 6)
        assert negative != positive and negative in [p["contents"] for p in passages]
    assert rows == script.ict_rows(passages)  # seeded


def test_with_verl_the_agent_step_is_verls_own_trainer_on_the_cpu_and_its_run_is_valid(tmp_path, monkeypatch,
                                                                                       tiny_causal_lm_dir):
    """`--verl`: the stand-in off, the loop launching verl on the cpu platform, GRPO in place of PPO (verl cannot load
    PPO's critic without flash-attention), and the run the loop writes from it passes verl's own validation."""
    import pytest

    pytest.importorskip("hydra", reason="hydra-core is not installed (the dev extra has it)")
    pytest.importorskip("ray", reason="ray is not installed (the dev extra has it)")
    from agent.rl.config import RLConfig
    from agent.rl.verl import prepare_verl_run
    from agent.rl.verl.validate import validate_verl_run

    script = _script()
    monkeypatch.setattr("agentic_retriever.base.defaults.smollm2_hf_dir", lambda: Path("/models/smollm2"))
    path = script.write_config(tmp_path, "/models/agent", verl=True)
    loop = build_config(command("loop").config_class(), "loop", None, str(path))
    rl = build_config(RLConfig, "agent_train", None, str(path))
    assert not loop.verl.stand_in and loop.verl.launch and loop.verl.device == "cpu"
    from agentic_retriever.base.sessions import command_words

    assert command_words(loop.verl.launcher) == [sys.executable]  # the loop's own interpreter
    assert rl.algorithm == "grpo" and rl.samples_per_prompt == 2
    assert loop.agent_init == "previous"  # the second verl run starts from the first one's checkpoint
    qa = tmp_path / "qa.jsonl"
    qa.write_text("".join(f'{{"id": "q{i}", "question": "question {i}?", "golden_answers": ["a"]}}\n' for i in range(12)))
    run = prepare_verl_run(tmp_path / "verl", loop.verl, rl, "http://127.0.0.1:1", tiny_causal_lm_dir, qa)
    assert validate_verl_run(run)["gpus"] == 1 and "VERL_PLATFORM=cpu" in run.launch_script.read_text()


def test_the_stand_in_files_are_flashrag_rows_without_evidence_labels(tmp_path, monkeypatch):
    """The dry run's QA files carry what FlashRAG's do (so the loop's evaluation must judge by answers), and its
    corpus is wiki-18's form holding every chosen question's evidence page."""
    from agentic_retriever.base.corpus import split_contents

    script = _script()
    summary = script.make_data(tmp_path)
    folder = tmp_path / script.FLASHRAG
    trivia, hotpot = (script._jsonl(folder / name / "train.jsonl") for name in ("triviaqa", "hotpotqa"))
    dev = script._jsonl(folder / "hotpotqa" / "dev.jsonl")
    assert {tuple(sorted(r)) for r in trivia + hotpot + dev} == {("golden_answers", "id", "metadata", "question")}
    assert trivia[0]["id"] == hotpot[0]["id"] == "train_0" and dev[0]["id"] == "dev_0"  # numbered per split
    assert not {r["metadata"]["fanoutqa_id"] for r in trivia + hotpot} & {r["metadata"]["fanoutqa_id"] for r in dev}
    loop = build_config(command("loop").config_class(), "loop", None, str(ROOT / "configs" / "agentic_r_loop.yaml"))
    monkeypatch.chdir(tmp_path)  # the config's paths are relative to where the loop runs, as the dry run runs it
    merged = read_qa_rows(loop.mining_qa)
    assert len(merged) == len(trivia) + len(hotpot) and merged[0].id == "triviaqa/train_0"  # the config's set
    corpus = script._jsonl(tmp_path / "data" / "wiki-18.jsonl")
    assert len(corpus) == summary["passages"] == script.CORPUS_PASSAGES and set(corpus[0]) == {"id", "contents"}
    titles = {split_contents(p["contents"])[0] for p in corpus}
    warm = script._jsonl(tmp_path / "warm_start" / "questions.jsonl")
    assert all(set(r["supporting_titles"]) <= titles for r in warm)


def test_the_scorers_stand_in_answers_the_mining_prompts_in_their_formats():
    """The scorer's stand-in (`agentic_retriever.standins.scripted_scorer`) read by the library's own parsers: one
    score per passage of a listwise window (Figure 7 and Figure 6), "Not Sure" for a sub-answer prompt."""
    from agentic_retriever.mining.parse import parse_scores, parse_sub_answers
    from agentic_retriever.mining.prompts import relevance_prompt, sub_answer_prompt

    passages = ["The Little Prince was published in France.", "A river in Asia.", "Prince of Persia."]
    for sub_answer in (None, "France"):
        reply = scripted.answer(relevance_prompt("little prince published country", passages, sub_answer))
        assert parse_scores(reply, 3).scores == [75, 0, 25]
    reply = scripted.answer(sub_answer_prompt("Where was it published?", ["France"], "<search> x </search>"))
    assert parse_sub_answers(reply, 1).answers == [None]


def test_with_ray_the_merged_config_places_the_same_shards_by_ray(tmp_path, monkeypatch):
    """`--ray`: the loop's own shards and scorer placed by Ray, as many as the local placement's (two a step), the
    service and the scorer bound where the cluster's nodes reach them; nothing else of the local dry run changes."""
    script = _script()
    monkeypatch.setattr("agentic_retriever.base.defaults.smollm2_hf_dir", lambda: Path("/models/smollm2"))
    local = build_config(command("loop").config_class(), "loop", None, str(script.write_config(tmp_path, "/m")))
    placed = build_config(command("loop").config_class(), "loop", None,
                          str(script.write_config(tmp_path, "/m", ray=True)))
    assert placed.placement == "ray" and placed.rollout_devices == placed.mining_devices == []
    assert (placed.ray.rollout_shards, placed.ray.mining_shards) == (len(local.rollout_devices),
                                                                     len(local.mining_devices))
    assert placed.service.host == "0.0.0.0" and "--host 0.0.0.0" in placed.step_servers["lr_scorer"]["command"]
    same = {"placement", "ray", "rollout_devices", "mining_devices", "service", "step_servers"}
    assert {f: getattr(placed, f) for f in vars(local) if f not in same} == \
        {f: getattr(local, f) for f in vars(local) if f not in same}


def test_the_decoder_stand_in_is_kept_under_its_corpus_content_and_another_corpus_trains_another(tmp_path,
                                                                                                   monkeypatch):
    """`warm_started_retriever` trains once a corpus: the same corpus again reuses the trained folder, and a corpus
    rewritten in place (as `make_data` does with ``--retriever decoder``, which adds evidence pages) trains anew."""
    import agentic_retriever.base.defaults as defaults
    import agentic_retriever.standins.decoder_embedder as standin
    import agentic_retriever.training.trainer as trainer

    script = _script()
    trained = []

    def fake_embedder(out, tokenizer_dir, shape, max_length, seed=0):
        Path(out).mkdir(parents=True)
        (Path(out) / "modules.json").write_text("[]")
        return Path(out)

    def fake_train(config):
        trained.append(script._jsonl(Path(config.data)))
        fake_embedder(config.out, None, None, None)
        return Path(config.out)

    monkeypatch.setattr(standin, "random_decoder_embedder", fake_embedder)
    monkeypatch.setattr(defaults, "smollm2_hf_dir", lambda: tmp_path / "tokenizer")  # not converted: not read
    monkeypatch.setattr(trainer, "train_retriever", fake_train)
    corpus = tmp_path / "data" / "wiki-18.jsonl"

    def passages(count):
        return [{"id": str(i), "contents": f'"Title {i}"\n' + " ".join(f"w{i}x{j}" for j in range(20))}
                for i in range(count)]

    script._write_jsonl(corpus, passages(3))
    first = script.warm_started_retriever(tmp_path)
    assert script.warm_started_retriever(tmp_path) == first and len(trained) == 1
    script._write_jsonl(corpus, passages(4))
    second = script.warm_started_retriever(tmp_path)
    assert second != first and len(trained) == 2
    assert {row["pos"][0] for row in trained[1]} == {p["contents"] for p in passages(4)}
