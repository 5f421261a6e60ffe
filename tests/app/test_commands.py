"""One vocabulary: the command registry, config sections named after commands, shared settings, paths derived
from the work folder, required settings, and the spellings of the previous release."""

from __future__ import annotations

import ast
import json
import os
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from agent.rollouts import RolloutConfig
from agent.sft import WarmStartConfig
from agentic_retriever.app.cli import HANDLERS, build_parser, main, modernize
from agentic_retriever.app.commands import COMMANDS, DEPRECATED_COMMANDS, DEPRECATED_SECTIONS
from agentic_retriever.app.config_loader import build_config, load_config_file
from agentic_retriever.base.encoder import EncoderConfig
from agentic_retriever.index import IndexBuildConfig
from agentic_retriever.mining.job import MineJobConfig
from agentic_retriever.training.config import RetrieverTrainConfig


def _write(tmp_path, text: str) -> str:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return str(path)


def test_every_command_is_typed_group_verb_reads_its_own_section_and_has_a_handler():
    parser = build_parser()
    for command in COMMANDS:
        assert command.section == command.name.replace(" ", "_")
        assert command.section in HANDLERS, f"no handler for {command.name}"
        args = parser.parse_args(command.name.split())
        assert args.command_spec is command
    assert set(HANDLERS) == {c.section for c in COMMANDS}


def test_unknown_section_is_an_error_naming_the_file_and_the_valid_names(tmp_path):
    path = _write(tmp_path, "index_buld:\n  out: x\n")
    with pytest.raises(ValueError, match=r"c\.yaml: unknown section 'index_buld' \(valid: workdir, retrieval, agent, "
                                         r"data_prepare, data_qa, index_build"):
        load_config_file(path)


def test_sections_of_the_previous_release_are_read_with_a_warning_but_not_beside_their_new_name(tmp_path):
    path = _write(tmp_path, "train_retriever:\n  epochs: 3\n")
    with pytest.warns(FutureWarning, match="section 'train_retriever' is deprecated, name it 'retriever_train'"):
        assert build_config(RetrieverTrainConfig, "retriever_train", None, path).epochs == 3
    both = _write(tmp_path, "mine:\n  shard: 0/2\nmine_run:\n  shard: 1/2\n")
    with pytest.raises(ValueError, match="both 'mine' and its new name 'mine_run' are given"), \
            pytest.warns(FutureWarning):
        load_config_file(both)
    assert set(DEPRECATED_SECTIONS.values()) <= {c.section for c in COMMANDS}


def test_renamed_keys_and_precision_spellings_still_load_with_a_warning(tmp_path):
    path = _write(tmp_path, "agent_rollout:\n  index: idx\n  llm:\n    model: m\n    dtype: bfloat16\n  qa: q\n"
                            "agent_sft:\n  qa: q\n  train:\n    model: base\n    epochs: 1\n")
    with pytest.warns(FutureWarning) as caught:
        rollout = build_config(RolloutConfig, "agent_rollout", None, path)
        warm = build_config(WarmStartConfig, "agent_sft", None, path)
    assert (rollout.retrieval.index, rollout.agent.model, rollout.agent.precision) == ("idx", "m", "bf16")
    assert (warm.agent.model, warm.train.epochs) == ("base", 1)
    messages = " ".join(str(w.message) for w in caught)
    assert "'llm' is deprecated, write 'agent'" in messages and "'train.model' is deprecated" in messages
    assert EncoderConfig.from_dict({"model": "m", "dtype": "float16"}).precision == "fp16"  # an older index manifest


def test_shared_settings_apply_to_every_command_then_sections_then_flags_override(tmp_path):
    path = _write(tmp_path, "workdir: w\nretrieval:\n  index: shared-idx\nagent:\n  model: shared-agent\n"
                            "  precision: fp32\nmine_run:\n  agent:\n    model: own-agent\n")
    mine = build_config(MineJobConfig, "mine_run", None, path)
    assert (mine.retrieval.index, mine.agent.model, mine.agent.precision) == ("shared-idx", "own-agent", "fp32")
    assert (mine.trajectories, mine.out) == ("w/agent/trajectories.jsonl", "w/mining"), "paths derive from workdir"
    args = build_parser().parse_args(["mine", "run", "--url", "http://h:1", "--index", "", "--workdir", "v",
                                      "--agent.model", "flag-agent"])
    mine = build_config(MineJobConfig, "mine_run", args, path)
    assert (mine.retrieval.url, mine.retrieval.index, mine.agent.model, mine.out) == ("http://h:1", "", "flag-agent",
                                                                                      "v/mining")
    build = build_config(IndexBuildConfig, "index_build", None, path)
    assert (build.corpus, build.out) == ("w/data/corpus.jsonl", "shared-idx"), "index build writes the shared index"
    train = build_config(RetrieverTrainConfig, "retriever_train", None, path)
    assert (train.data, train.select_index, train.out) == ("w/mining/retriever_train.jsonl", "shared-idx", "w/retriever")
    explicit = _write(tmp_path, "workdir: w\nretriever_train:\n  out: elsewhere\n")
    assert build_config(RetrieverTrainConfig, "retriever_train", None, explicit).out == "elsewhere"


def test_a_missing_required_setting_is_an_error_naming_it_and_help_says_required(tmp_path, capsys):
    with pytest.raises(ValueError, match=r"agent rollout: required setting qa missing \(set --qa\)"):
        build_config(RolloutConfig, "agent_rollout")
    with pytest.raises(ValueError, match=r"index build: required setting out missing"):
        build_config(IndexBuildConfig, "index_build")  # no out and no shared retrieval index to derive it from
    assert main(["agent", "rollout", "--index", str(tmp_path)]) == 2
    assert "required setting qa missing" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_parser().parse_args(["agent", "rollout", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "QA rows (JSONL: id, question, golden_answers) (required)" in help_text
    assert "(default: {workdir}/agent/trajectories.jsonl)" in help_text


def test_commands_and_flags_of_the_previous_release_still_run_with_a_note(tmp_path, corpus_file, capsys):
    assert modernize(["mine-merge", "--out", "o"]) == ["mine", "merge", "--out", "o"]
    assert modernize(["mine", "--trajectories", "t"]) == ["mine", "run", "--trajectories", "t"]
    assert modernize(["mine", "audit", "r"]) == ["mine", "audit", "r"]
    assert modernize(["agent", "train", "--model", "m", "--precision", "bf16"]) == \
        ["agent", "train", "--agent.model", "m", "--agent.precision", "bf16"]
    assert modernize(["agent", "rollout", "--llm.model=m", "--index", "i"]) == \
        ["agent", "rollout", "--agent.model=m", "--index", "i"], "--index is an alias, not a deprecation"
    capsys.readouterr()
    index = tmp_path / "bm25"
    assert main(["index", "build", "--corpus", str(corpus_file), "--out", str(index), "--backend", "bm25"]) == 0
    capsys.readouterr()
    assert main(["search", "--index", str(index), "--queries", "item 9", "--json"]) == 0
    captured = capsys.readouterr()
    assert "'agentic-retriever search' is deprecated; use 'agentic-retriever index search'" in captured.err
    assert json.loads(captured.out.splitlines()[0])["query"] == "item 9"


def test_index_search_and_serve_take_the_shared_retrieval_setting(tmp_path, corpus_file, capsys):
    index = tmp_path / "bm25"
    config = _write(tmp_path, f"retrieval:\n  index: {index}\nindex_build:\n  corpus: {corpus_file}\n  backend: bm25\n")
    assert main(["index", "build", "--config", config]) == 0
    capsys.readouterr()
    assert main(["index", "search", "--config", config, "--queries", "item 9", "--k", "2", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["hits"]) == 2
    assert main(["index", "serve", "--url", "http://127.0.0.1:1"]) == 2
    assert "opens the index in this process" in capsys.readouterr().err


def test_index_swap_moves_a_running_service_and_a_refusal_is_an_error_not_a_traceback(tmp_path, corpus_file, capsys,
                                                                                       monkeypatch):
    from agentic_retriever.index import open_index
    from agentic_retriever.server import running_server

    folders = {}
    for name, k1 in (("a", 1.2), ("b", 0.9)):
        folders[name] = tmp_path / name
        assert main(["index", "build", "--corpus", str(corpus_file), "--out", str(folders[name]), "--backend", "bm25",
                     "--bm25.k1", str(k1)]) == 0
    capsys.readouterr()
    with running_server(open_index(str(folders["a"])), admin_token="s3cret") as url:
        monkeypatch.setenv("AGENTIC_RETRIEVER_ADMIN_TOKEN", "s3cret")
        assert main(["index", "swap", "--url", url, "--index", str(folders["b"])]) == 0
        assert f"now serves {folders['b']} (generation 1, 300 passages" in capsys.readouterr().out
        assert main(["index", "swap", "--url", url, "--index", str(folders["a"]), "--token", "wrong"]) == 2
        assert "refused the swap" in capsys.readouterr().err
        monkeypatch.delenv("AGENTIC_RETRIEVER_ADMIN_TOKEN")
        assert main(["index", "swap", "--url", url, "--index", str(folders["a"])]) == 2
        assert "give the service's admin token" in capsys.readouterr().err


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_retriever_export_turns_a_checkpoint_into_the_drop_in_folder(tmp_path, tiny_model_dir, capsys):
    from sentence_transformers import SentenceTransformer

    checkpoint = tmp_path / "run.checkpoints" / "checkpoint-4"
    SentenceTransformer(tiny_model_dir, device="cpu").save(str(checkpoint))
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 4, "log_history": [{"loss": 1.0}]}))
    out = tmp_path / "exported"
    assert main(["retriever", "export", "--checkpoint", str(checkpoint), "--out", str(out),
                 "--encoder.model", tiny_model_dir, "--encoder.query-prefix", "query: "]) == 0
    settings = json.loads((out / "agentic_retriever.json").read_text())
    assert (settings["composition"], settings["query_prefix"]) == ("question_sep_query", "query: ")
    manifest = json.loads((out / "train_manifest.json").read_text())
    assert manifest["updates"] == 4 and manifest["exported_from"].endswith("checkpoint-4")
    new_file_mode = 0o666 & ~_current_umask()  # safetensors writes its weights 0600; the export gives what open() does
    assert {oct(p.stat().st_mode & 0o777) for p in out.rglob("*") if p.is_file()} == {oct(new_file_mode)}
    card = (out / "README.md").read_text()
    assert "not recorded (exported from a checkpoint)" in card
    model = SentenceTransformer(str(out), device="cpu")
    assert model.encode(["x"]).shape[1] == SentenceTransformer(tiny_model_dir, device="cpu").encode(["x"]).shape[1]
    # the card's example query goes through encode_query, which adds the prefix: the example must not add it too
    example = _card_example_query(card)
    assert card.count("Apple founders") == 1 and "query: query:" not in card
    assert not example.startswith("query: ") and example.endswith("[SEP] Apple founders")
    assert np.allclose(model.encode_query([example]), model.encode(["query: " + example]), atol=1e-6)
    assert main(["retriever", "export", "--checkpoint", str(tmp_path / "missing"), "--out", str(out)]) == 2
    assert "checkpoint folder" in capsys.readouterr().err
    assert main(["retriever", "export", "--checkpoint", str(checkpoint), "--out", str(out),
                 "--encoder.model", tiny_model_dir]) == 0, "a previous export is replaced"
    card = (out / "README.md").read_text()
    example = _card_example_query(card)
    assert json.loads((out / "agentic_retriever.json").read_text())["query_prefix"] == ""
    assert card.count("Apple founders") == 1 and "query: " not in card and "no query prefix" in card
    model = SentenceTransformer(str(out), device="cpu")
    assert np.allclose(model.encode_query([example]), model.encode([example]), atol=1e-6)
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("mine")
    assert main(["retriever", "export", "--checkpoint", str(checkpoint), "--out", str(precious),
                 "--encoder.model", tiny_model_dir]) == 2
    assert "is not an exported retriever" in capsys.readouterr().err
    assert (precious / "notes.txt").read_text() == "mine", "a folder that is not an export is never deleted"


def _card_example_query(card: str) -> str:
    """The one query string of the model card's ``model.encode_query([...])`` example."""
    calls = re.findall(r"model\.encode_query\(\[(.*?)\]\)", card)
    assert len(calls) == 1, calls
    return ast.literal_eval(calls[0])


class _FakeHfApi:
    """huggingface_hub.HfApi without the network: records the repository and what `upload_folder` would send."""

    calls: list[tuple] = []

    def __init__(self, token=None, **_):
        self.token = token

    def create_repo(self, repo_id, *, private=None, repo_type=None, exist_ok=False, **_):
        self.calls.append(("create_repo", repo_id, private, repo_type, exist_ok, self.token))
        return SimpleNamespace(repo_id=repo_id)

    def upload_folder(self, *, repo_id, folder_path, repo_type=None, **_):
        if repo_id == "me/broken":
            raise OSError("the Hub is unreachable")
        folder = Path(folder_path)
        files = {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
        self.calls.append(("upload_folder", repo_id, folder, repo_type, files))
        return SimpleNamespace(commit_url=f"https://huggingface.co/{repo_id}/commit/0123")


def test_retriever_export_pushes_the_exported_folder_to_the_hub(tmp_path, tiny_model_dir, monkeypatch, capsys):
    import huggingface_hub
    from sentence_transformers import SentenceTransformer

    checkpoint = tmp_path / "checkpoint-2"
    SentenceTransformer(tiny_model_dir, device="cpu").save(str(checkpoint))
    monkeypatch.setattr(huggingface_hub, "HfApi", _FakeHfApi)
    monkeypatch.setattr(_FakeHfApi, "calls", [])
    monkeypatch.setenv("MY_HUB_TOKEN", "hf_secret")
    out = tmp_path / "exported"
    export = ["retriever", "export", "--checkpoint", str(checkpoint), "--encoder.model", tiny_model_dir,
              "--encoder.query-prefix", "query: "]
    assert main([*export, "--out", str(out), "--push-to-hub", "me/agentic-r", "--private",
                 "--hub-token-env", "MY_HUB_TOKEN"]) == 0
    (create, repo, private, repo_type, exist_ok, token), upload = _FakeHfApi.calls
    assert (create, repo, private, repo_type, exist_ok, token) == ("create_repo", "me/agentic-r", True, "model",
                                                                   True, "hf_secret")
    _, repo, folder, repo_type, files = upload
    assert (repo, folder, repo_type) == ("me/agentic-r", out, "model")
    assert {"model.safetensors", "modules.json", "config_sentence_transformers.json", "agentic_retriever.json",
            "train_manifest.json", "README.md"} <= set(files)
    assert files == {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}, \
        "the folder is uploaded exactly as exported"
    assert json.loads(files["agentic_retriever.json"])["query_prefix"] == "query: "
    card = files["README.md"].decode()
    assert "SentenceTransformer('me/agentic-r')" in card and "query: query:" not in card
    assert not any(b"hf_secret" in content for content in files.values()), "the token is never written"

    monkeypatch.setattr(_FakeHfApi, "calls", [])
    monkeypatch.delenv("HF_TOKEN", raising=False)
    assert main([*export, "--out", str(tmp_path / "public"), "--push-to-hub", "me/public"]) == 0
    assert _FakeHfApi.calls[0][2] is None and _FakeHfApi.calls[0][5] is None, "the account's default and login"
    assert main([*export, "--out", str(tmp_path / "bad"), "--push-to-hub", "not a/repo//id"]) == 2
    assert "repo" in capsys.readouterr().err.lower() and not (tmp_path / "bad").exists(), "refused before exporting"
    assert main([*export, "--out", str(tmp_path / "offline"), "--push-to-hub", "me/broken"]) == 2
    assert "the Hub is unreachable" in capsys.readouterr().err, "a network failure is an error line, not a traceback"
    assert (tmp_path / "offline" / "README.md").is_file(), "a failed push leaves the complete export"


def test_demo_reads_the_sections_of_the_steps_it_runs(tmp_path, monkeypatch):
    import agentic_retriever.app.demo as demo

    seen = {}
    monkeypatch.setattr(demo, "run_demo", lambda job: seen.setdefault("job", job))
    path = _write(tmp_path, "workdir: w\nretrieval:\n  index: i\nagent_sft:\n  qa: q\nagent_rollout:\n  qa: r\n"
                            "mine_run:\n  shard: 0/1\nretriever_train:\n  epochs: 1\n")
    assert main(["demo", "--config", path, "--workdir", "v"]) == 0
    job = seen["job"]
    assert job.demo.workdir == "v" and job.warm_start.retrieval.index == "i" and job.rollout.qa == "r"
    assert job.mine.out == "v/mining" and job.train.epochs == 1


def test_loop_reads_its_section_and_the_steps_sections_and_trains_the_agent_with_ppo_unless_told(tmp_path,
                                                                                                 monkeypatch):
    import agentic_retriever.app.loop as loop

    seen = []
    monkeypatch.setattr(loop, "run_loop", lambda job, i, s: seen.append((job, i, s)))
    text = ("workdir: w\nretrieval:\n  index: i\nloop:\n  iterations: 3\n  agent_init: initial\n"
            "agent_train:\n  qa: t\nagent_rollout:\n  batch_size: 4\nmine_run:\n  shard: 0/1\n"
            "retriever_train:\n  epochs: 1\n")
    path = _write(tmp_path, text)
    assert main(["loop", "--config", path, "--iterations", "2", "--from-iteration", "2", "--from-step", "mining"]) == 0
    job, iteration, step = seen[-1]
    assert (iteration, step) == (2, "mining")
    assert job.loop.iterations == 2 and job.loop.agent_init == "initial" and job.loop.out == "w/loop"
    assert job.loop.base_index == "i" and job.loop.mining_qa == "w/data/fanoutqa_leaf_train_mining.jsonl"
    assert job.agent_train.qa == "t" and job.agent_train.algorithm == "ppo" and job.rollout.batch_size == 4
    assert job.train.epochs == 1 and job.warm_start is None and job.prepare is None and job.config_file == path
    path = _write(tmp_path, text.replace("  qa: t\n", "  qa: t\n  algorithm: grpo\n"))
    assert main(["loop", "--config", path]) == 0
    assert seen[-1][0].agent_train.algorithm == "grpo" and seen[-1][1:] == (None, None)


def test_docs_cli_lists_exactly_the_commands_of_the_parser():
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    documented = re.findall(r"^\| `agentic-retriever ([a-z -]+)` \| `([a-z_]+)` \|", page, flags=re.MULTILINE)
    assert documented, "docs/cli.md has no command table"
    assert sorted(documented) == sorted((c.name, c.section) for c in COMMANDS)
    deprecated = {" ".join(old) for old in DEPRECATED_COMMANDS}
    assert all(f"| `{old}" in page for old in deprecated), "every deprecated spelling is documented"


def test_readme_is_a_front_door_whose_commands_all_parse():
    """README is a front door (at most 130 lines: narratives live in benchmarks/RESULTS.md) and every
    `agentic-retriever ...` command it shows, in code blocks or inline, parses with the CLI (placeholders such as
    AGENT_FOLDER are values to argparse)."""
    import re
    import shlex
    from pathlib import Path

    from agentic_retriever.app.cli import build_parser

    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert len(text.splitlines()) <= 130
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL)
    commands = [line.split("#")[0] for block in blocks for line in block.splitlines()
                if line.startswith("agentic-retriever ")]
    commands += re.findall(r"`(agentic-retriever [^`]+)`", text)
    assert len(commands) >= 10, commands
    parser = build_parser()
    for command in commands:
        argv = shlex.split(command)[1:]
        try:
            parser.parse_args(argv)
        except SystemExit as exit_:
            raise AssertionError(f"README command does not parse: {command!r}") from exit_
