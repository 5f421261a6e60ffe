import json

import pytest

from agentic_retriever.app.cli import build_parser, main
from agentic_retriever.app.config_loader import build_config
from agentic_retriever.index import IndexBuildConfig, IndexManifest


def _parse(argv):
    return build_parser().parse_args(argv)


def test_yaml_section_then_flags_override_single_fields(tmp_path):
    config_file = tmp_path / "c.yaml"
    config_file.write_text("index_build:\n  corpus: a.jsonl\n  out: idx\n  dense:\n    type: hnsw\n    ef_search: 32\n"
                           "  encoder:\n    model: m\n    query_prefix: 'query: '\n")
    args = _parse(["index", "build", "--config", str(config_file), "--dense.ef-search", "99",
                   "--no-encoder.normalize", "--encoder.query-prefix", "none"])
    config = build_config(IndexBuildConfig, "index_build", args, args.config)
    assert (config.corpus, config.out, config.dense.type) == ("a.jsonl", "idx", "hnsw")
    assert config.dense.ef_search == 99 and config.encoder.normalize is False
    assert config.encoder.model == "m" and config.encoder.query_prefix is None
    assert config.dense.hnsw_m == 64  # untouched default


def test_unknown_yaml_key_is_an_error_naming_file_and_key(tmp_path):
    config_file = tmp_path / "c.yaml"
    config_file.write_text("index_build:\n  dense:\n    ef_serch: 3\n")
    with pytest.raises(ValueError, match=r"c\.yaml: index_build\.dense: unknown field 'ef_serch'"):
        build_config(IndexBuildConfig, "index_build", None, str(config_file))


def test_a_value_its_settings_class_rejects_is_an_error_from_the_file_and_from_a_flag(tmp_path):
    from agent.rollouts import RolloutConfig

    config_file = tmp_path / "c.yaml"
    config_file.write_text("agent_rollout:\n  qa: q.jsonl\n  env:\n    max_turns: 0\n")
    with pytest.raises(ValueError, match="EnvConfig.max_turns must be at least 1, got 0"):
        build_config(RolloutConfig, "agent_rollout", None, str(config_file))
    config_file.write_text("agent_rollout:\n  qa: q.jsonl\n")
    args = _parse(["agent", "rollout", "--config", str(config_file), "--env.max-turns", "0"])
    with pytest.raises(ValueError, match="EnvConfig.max_turns must be at least 1, got 0"):
        build_config(RolloutConfig, "agent_rollout", args, args.config)
    assert build_config(RolloutConfig, "agent_rollout", None, str(config_file)).env.max_turns == 4


def test_a_value_of_the_wrong_type_is_an_error_naming_file_section_field_and_type_before_any_work(tmp_path, capsys):
    from agentic_retriever.mining.job import MineJobConfig
    from agentic_retriever.server import ServeConfig
    from agentic_retriever.training.config import RetrieverTrainConfig

    config_file = tmp_path / "c.yaml"
    config_file.write_text("index_serve:\n  port: eighty\n")
    assert main(["index", "serve", "--config", str(config_file)]) == 2  # before the (missing) index is opened
    assert capsys.readouterr().err.strip().startswith(
        f"error: {config_file}: index_serve.port: expected int, got 'eighty'")
    config_file.write_text("mine_run:\n  mining:\n    num_candidates: twenty\n")
    with pytest.raises(ValueError, match=r"c\.yaml: mine_run\.mining\.num_candidates: expected int, got 'twenty'"):
        build_config(MineJobConfig, "mine_run", None, str(config_file), set_by_caller=("trajectories", "out"))
    config_file.write_text("index_serve:\n  index_roots: runs\n")
    with pytest.raises(ValueError, match=r"index_serve\.index_roots: expected list\[str\], got 'runs'"):
        build_config(ServeConfig, "index_serve", None, str(config_file))
    # what YAML 1.1 reads as a string but the field's type reads losslessly is taken as that type
    config_file.write_text("retriever_train:\n  learning_rate: 1e-5\n  save_steps: '50'\n")
    config = build_config(RetrieverTrainConfig, "retriever_train", None, str(config_file),
                          set_by_caller=("data", "out", "corpus"))
    assert config.learning_rate == 1e-5 and isinstance(config.learning_rate, float) and config.save_steps == 50
    config_file.write_text("index_serve:\n  max_batch_ms: 2.5.1\n")
    with pytest.raises(ValueError, match=r"index_serve\.max_batch_ms: expected float, got '2\.5\.1'"):
        build_config(ServeConfig, "index_serve", None, str(config_file))


def test_bytes_that_are_not_utf8_are_named_by_file_and_line(tmp_path):
    from agentic_retriever.base.jsonl import DataFormatError, iter_jsonl

    config_file = tmp_path / "c.yaml"
    config_file.write_bytes(b"index_serve:\n  host: caf\xe9\n")
    with pytest.raises(DataFormatError, match=r"c\.yaml:2: not UTF-8 text \(byte 0xe9 at column 12\)"):
        build_config(IndexBuildConfig, "index_build", None, str(config_file))
    rows = tmp_path / "qa.jsonl"
    rows.write_bytes(b'{"id": "1"}\n\n{"id": "caf\xe9"}\n')
    with pytest.raises(DataFormatError, match=r"qa\.jsonl:3: not UTF-8 text \(byte 0xe9 at column 12\)"):
        list(iter_jsonl(rows))


def test_invalid_choice_is_rejected_by_the_parser():
    with pytest.raises(SystemExit):
        _parse(["index", "build", "--dense.type", "annoy"])


def test_cli_builds_searches_and_evaluates_an_index(tmp_path, corpus_file, tiny_model_dir, capsys):
    out = tmp_path / "idx"
    assert main(["index", "build", "--corpus", str(corpus_file), "--out", str(out),
                 "--encoder.model", tiny_model_dir, "--dense.type", "hnsw"]) == 0
    assert IndexManifest.load(out).index_type == "hnsw"
    capsys.readouterr()
    assert main(["index", "search", "--index", str(out), "--k", "2", "--json", "--queries", "river castle", "item 9"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["query"] for line in lines] == ["river castle", "item 9"]
    assert all(len(line["hits"]) == 2 and {"id", "title", "text", "score"} <= set(line["hits"][0]) for line in lines)

    qa = tmp_path / "qa.jsonl"
    qa.write_text(json.dumps({"id": "q", "question": "item 9", "supporting_ids": ["9"]}) + "\n")
    assert main(["eval", "retrieval", "--index", str(out), "--qa", str(qa), "--ks", "1", "50",
                 "--out", str(tmp_path / "eval.json")]) == 0
    report = json.loads((tmp_path / "eval.json").read_text())
    assert report["questions_evaluated"] == 1 and set(report["metrics"]) == {"recall@1", "recall@50", "mrr@10", "ndcg@10"}
    assert "| Recall@1 |" in capsys.readouterr().out


def test_cli_reports_bad_input_as_an_error_not_a_traceback(tmp_path, capsys):
    assert main(["index", "build", "--corpus", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "i"),
                 "--backend", "bm25"]) == 2
    assert "corpus file not found" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_rolls_out_evaluates_and_mines_with_a_tiny_agent(tmp_path, corpus_file, tiny_causal_lm_dir, capsys):
    index = tmp_path / "bm25"
    assert main(["index", "build", "--corpus", str(corpus_file), "--out", str(index), "--backend", "bm25"]) == 0
    qa = tmp_path / "qa.jsonl"
    qa.write_text("".join(json.dumps({"id": f"q{i}", "question": f"Where is item {i}?", "golden_answers": ["river"],
                                      "supporting_titles": [f"Topic {i}"]}) + "\n" for i in range(3)))
    trajectories = tmp_path / "traj.jsonl"
    rollout = ["agent", "rollout", "--qa", str(qa), "--index", str(index), "--out", str(trajectories), "--limit", "2",
               "--agent.model", tiny_causal_lm_dir, "--agent.device", "cpu", "--env.max-turns", "1",
               "--env.max-new-tokens-per-turn", "4"]
    assert main(rollout) == 0
    assert [json.loads(line)["question_id"] for line in trajectories.read_text().splitlines()] == ["q0", "q1"]
    assert main([*rollout[:8], "--limit", "3", *rollout[10:]]) == 0, "a rerun completes the file"
    assert len(trajectories.read_text().splitlines()) == 3
    capsys.readouterr()
    assert main(["eval", "agent", "--trajectories", str(trajectories), "--qa", str(qa),
                 "--out", str(tmp_path / "eval.json")]) == 0
    report = json.loads((tmp_path / "eval.json").read_text())
    assert report["trajectories"] == 3 and report["evidence_questions"] == 3 and 0 <= report["em"] <= 1
    assert main(["mine", "run", "--trajectories", str(trajectories), "--index", str(index), "--out", str(tmp_path / "mined"),
                 "--agent.model", tiny_causal_lm_dir, "--scorer.model", tiny_causal_lm_dir,
                 "--mining.lr-scorer", "pointwise", "--no-mining.plot", "--no-mining.progress"]) == 0
    stats = json.loads((tmp_path / "mined" / "mining_stats.json").read_text())
    assert stats["trajectories"] == 3 and stats["rows"] == sum(1 for _ in open(tmp_path / "mined" / "retriever_train.jsonl"))



SHIPPED_CONFIGS = ["configs/quickstart.yaml", "configs/agentic_r.yaml", "configs/search_r1_ppo.yaml",
                   "configs/search_r1_grpo.yaml", "configs/search_r1_quickstart.yaml", "configs/s3_ppo.yaml",
                   "configs/s3_quickstart.yaml", "configs/qagent_grpo.yaml", "configs/qagent_quickstart.yaml",
                   "configs/when_to_search_dapo.yaml", "configs/when_to_search_quickstart.yaml",
                   "configs/agentic_r_qwen3_embedding.yaml"]


@pytest.mark.parametrize("config_file", SHIPPED_CONFIGS)
def test_every_section_of_the_shipped_configs_builds_its_command_config(config_file, recwarn):
    """A typo in a shipped config (an unknown field, a bad nesting, an old name) fails here, not on a user's GPU."""
    from pathlib import Path

    from agentic_retriever.app.commands import command
    from agentic_retriever.app.config_loader import SHARED_SETTINGS, load_config_file

    path = Path(__file__).resolve().parents[2] / config_file
    sections = load_config_file(path)  # raises on unknown sections
    assert set(sections) - set(SHARED_SETTINGS), f"{config_file} has no command section"
    for section in set(sections) - set(SHARED_SETTINGS):
        config = build_config(command(section).config_class(), section, None, str(path))  # raises on unknown fields
        if hasattr(config, "validate"):
            config.validate()
    assert not [w for w in recwarn if issubclass(w.category, FutureWarning)], "shipped configs use current names"


@pytest.mark.parametrize("config_file", ["configs/agentic_r.yaml", "configs/agentic_r_loop.yaml"])
def test_the_paper_configs_train_the_retriever_without_weight_decay_as_the_release(config_file):
    """The release's retriever training sets no weight decay (transformers' TrainingArguments default, 0); the
    library's own default (0.01) is for the CPU configs."""
    from pathlib import Path

    from agentic_retriever.app.commands import command

    path = Path(__file__).resolve().parents[2] / config_file
    config = build_config(command("retriever_train").config_class(), "retriever_train", None, str(path))
    assert config.weight_decay == 0.0 and config.learning_rate == 2e-5 and config.temperature == 0.01


def test_a_key_that_moved_to_another_section_is_refused_naming_where_it_lives_now(tmp_path):
    """The negatives per row are mining's: `retriever_train.num_negatives` (file or flag) names that place."""
    from agentic_retriever.training.config import RetrieverTrainConfig

    config = tmp_path / "train.yaml"
    config.write_text("retriever_train:\n  data: rows.jsonl\n  num_negatives: 7\n")
    with pytest.raises(ValueError, match=r"retriever_train: 'num_negatives' is no longer set here: .*"
                                         r"mine_run\.mining\.selection\.num_negatives"):
        build_config(RetrieverTrainConfig, "retriever_train", None, str(config))
    with pytest.raises(SystemExit, match=r"retriever train: --num-negatives is no longer set here: .*"
                                         r"mine_run\.mining\.selection\.num_negatives"):
        main(["retriever", "train", "--data", "rows.jsonl", "--num-negatives", "7"])


def test_a_config_that_extends_another_changes_only_what_it_names(tmp_path):
    """`extends:` reads the named file (relative to the extending one) first: mappings merge key by key, any other
    value replaces, chains are followed, and a cycle or a missing file is an error naming the files."""
    from agentic_retriever.app.config_loader import load_config_file
    from agentic_retriever.training.config import RetrieverTrainConfig

    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "paper.yaml").write_text(
        "workdir: runs/paper\nretriever_train:\n  encoder: {model: intfloat/e5-base-v2, pooling: mean, max_length: 512}"
        "\n  learning_rate: 2.0e-5\n  epochs: 2\nindex_build:\n  encoder: {devices: [all]}\n")
    (tmp_path / "variant.yaml").write_text(
        "extends: base/paper.yaml\nworkdir: runs/variant\nretriever_train:\n  encoder: {model: Qwen/Qwen3-Embedding-0.6B,"
        " pooling: lasttoken}\n  lora: {rank: 16}\nindex_build:\n  encoder: {devices: ['0', '1']}\n")
    (tmp_path / "four_b.yaml").write_text("extends: variant.yaml\nretriever_train:\n  encoder: {model: Qwen/Qwen3-Embedding-4B}\n")
    sections = load_config_file(tmp_path / "four_b.yaml")
    assert sections["workdir"] == "runs/variant" and sections["index_build"]["encoder"]["devices"] == ["0", "1"]
    config = build_config(RetrieverTrainConfig, "retriever_train", None, str(tmp_path / "four_b.yaml"))
    assert (config.encoder.model, config.encoder.pooling, config.encoder.max_length) == ("Qwen/Qwen3-Embedding-4B",
                                                                                       "lasttoken", 512)
    assert config.lora.rank == 16 and config.learning_rate == 2e-5 and config.epochs == 2
    (tmp_path / "base" / "paper.yaml").write_text("extends: ../four_b.yaml\n")
    with pytest.raises(ValueError, match=r"makes a cycle \(.*four_b.yaml -> .*variant.yaml -> .*paper.yaml -> "):
        load_config_file(tmp_path / "four_b.yaml")
    (tmp_path / "lost.yaml").write_text("extends: nowhere.yaml\n")
    with pytest.raises(FileNotFoundError, match=r"lost.yaml: 'extends: nowhere.yaml' names no file"):
        load_config_file(tmp_path / "lost.yaml")
    (tmp_path / "odd.yaml").write_text("extends: [a.yaml]\n")
    with pytest.raises(ValueError, match="'extends' must be the path of a config file, got list"):
        load_config_file(tmp_path / "odd.yaml")


@pytest.mark.parametrize("config_file", ["configs/agentic_r_qwen3_embedding.yaml",
                                         "configs/agentic_r_qwen3_embedding_loop.yaml",
                                         "configs/agentic_r_qwen3_embedding_4b_lora_loop.yaml"])
def test_the_decoder_embedder_configs_change_only_the_retriever_of_the_paper_configs(config_file):
    """Each Qwen3-Embedding variant is its paper config (`extends`) with the retriever's backbone, pooling and
    precision (and for the 4B, LoRA with the cached loss, the engines' share of a card) changed; the paper's
    composition, loss and schedule are kept, and e5's mean pooling does not carry over."""
    from pathlib import Path

    from agentic_retriever.app.commands import command

    root = Path(__file__).resolve().parents[2]
    path = root / config_file
    paper = root / ("configs/agentic_r_loop.yaml" if "loop" in config_file else "configs/agentic_r.yaml")
    train, base = (build_config(command("retriever_train").config_class(), "retriever_train", None, str(f))
                   for f in (path, paper))
    index = build_config(command("index_build").config_class(), "index_build", None, str(path))
    size = "4B" if "4b" in config_file else "0.6B"
    assert train.encoder.model == index.encoder.model == f"Qwen/Qwen3-Embedding-{size}"
    assert train.encoder.pooling == "lasttoken" and train.precision == index.encoder.precision == "bf16"
    assert (train.encoder.composition, train.temperature, train.learning_rate, train.epochs,
            train.per_device_batch_size) == (base.encoder.composition, base.temperature, base.learning_rate,
                                              base.epochs, base.per_device_batch_size)
    assert (train.lora.rank, train.cached) == ((16, True) if size == "4B" else (0, False))
