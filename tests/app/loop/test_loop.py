"""The co-training loop (agentic_retriever.app.loop) end to end on tiny fixtures: a real two-iteration run (RL of a tiny
random Llama against a served index of a tiny random BERT, rollouts, mining, retriever training, re-indexing, index
swaps, evaluation) with scripted LLMs where the agent must search and answer (a random-weight model never writes a
search tag): resume after a kill in every step, recomputation from the first changed setting, the manifest's
errors, `loop status` and the report."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import httpx
import pytest

from agent.env import EnvConfig
from agent.rl import RLConfig
from agent.rollouts import RolloutConfig
from agentic_retriever.app.cli import main
from agentic_retriever.app.loop import (STEPS, LoopConfig, LoopEvalConfig, LoopJob, LoopManifest, LoopManifestError,
                                        run_loop)
from agentic_retriever.app.loop import runner as loop_runner
from agentic_retriever.app.loop import steps as loop_steps
from agentic_retriever.base.client import RetrievalConfig
from agentic_retriever.base.encoder import EncoderConfig
from agentic_retriever.base.llm import LLMConfig
from agentic_retriever.index import DenseParams, IndexBuildConfig
from agentic_retriever.mining.config import MiningConfig
from agentic_retriever.mining.job import MineJobConfig
from agentic_retriever.mining.selection import SelectionConfig
from agentic_retriever.training.config import RetrieverTrainConfig
from tests.fakes import FakeAgent, FakeScorer, Killed, write_jsonl

CITIES = 24


def _write_data(folder: Path) -> None:
    """A corpus where passage ``j`` says the answer of question ``j`` (as the scripted agent reads it), and train /
    dev question files."""
    folder.mkdir(parents=True, exist_ok=True)
    def judged(j: int) -> int:  # the scripted scorer's relevance: high for the mining questions' own passages
        return 80 if 4 <= j < 10 else 20

    write_jsonl(folder / "corpus.jsonl", [{"id": str(j), "contents": f'"City {j}"\nAbout city {j}, lr={judged(j)}. '
                                                                    f"ANSWER=city {j}."} for j in range(CITIES)])

    def questions(ids, parent=False):
        return [{"id": f"q{j}", "question": f"Which city is number {j}?", "golden_answers": [f"city {j}"],
                 "supporting_titles": [f"City {j}"]} | ({"parent_id": f"m{j}"} if parent else {}) for j in ids]

    write_jsonl(folder / "rl.jsonl", questions(range(0, 4)))
    write_jsonl(folder / "mining.jsonl", questions(range(4, 10)))
    write_jsonl(folder / "dev_leaf.jsonl", questions(range(16, 20), parent=True))
    write_jsonl(folder / "dev_multihop.jsonl", [
        {"id": f"m{j}", "question": f"Which cities are numbers {j} and {j + 1}?", "golden_answers": ["both"],
         "supporting_titles": [f"City {j}", f"City {j + 1}"]} for j in range(16, 20)])


def make_job(tiny_model_dir: str, tiny_causal_lm_dir: str, **loop) -> LoopJob:
    """The loop over the data of `_write_data` in ``data/`` of the working folder (paths relative to it)."""
    encoder = EncoderConfig(model=tiny_model_dir, max_length=32)
    env = EnvConfig(max_turns=2, max_new_tokens_per_turn=8, max_context_tokens=400, temperature=1.0)
    return LoopJob(
        loop=LoopConfig(out="loop", base_index="index/base", mining_qa="data/mining.jsonl", progress=False,
                        eval=LoopEvalConfig(leaf_qa="data/dev_leaf.jsonl", multihop_qa="data/dev_multihop.jsonl",
                                            agent_qa="data/dev_leaf.jsonl", agent_questions=2, ks=[1, 5]),
                        **loop),
        agent_train=RLConfig(qa="data/rl.jsonl", agent=LLMConfig(model=tiny_causal_lm_dir), algorithm="grpo",
                             steps=1, prompts_per_step=2, samples_per_prompt=2, micro_batch_size=2, actor_lr=1e-3,
                             env=env, progress=False, report_to=["none"], reward="search_r1_format"),
        rollout=RolloutConfig(batch_size=8, env=EnvConfig(max_turns=2, topk=3)),
        mine=MineJobConfig(scorer=LLMConfig(model="fake-scorer"), mining=MiningConfig(
            num_candidates=20, lr_scorer="pointwise", use_sub_answers=False, gac_mode="answer_likelihood",
            progress=False, plot=False, selection=SelectionConfig(num_negatives=3, gac_threshold=0.1))),
        train=RetrieverTrainConfig(encoder=dataclasses.replace(encoder, composition="question_sep_query"),
                                   epochs=1, per_device_batch_size=2, progress=False,
                                   report_to=["none"], temperature=0.05),
        index=IndexBuildConfig(corpus="data/corpus.jsonl", encoder=encoder, dense=DenseParams(type="flat")),
    )


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    """A working folder holding the data; scripted LLMs wherever the loop loads an agent or a scorer to generate
    (the RL step trains the real tiny Llama)."""
    _write_data(tmp_path / "data")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("agentic_retriever.base.llm.load_llm",
                        lambda config: FakeScorer() if config.model == "fake-scorer" else FakeAgent())
    return tmp_path


def comparable(manifest: LoopManifest) -> dict:
    """The manifest without what differs between equal runs: times and attempts."""
    return {name: {k: v for k, v in vars(r).items() if k not in ("seconds", "attempts", "started_at", "finished_at")}
            for name, r in manifest.steps.items()}


def count_calls(monkeypatch) -> dict[str, int]:
    calls: dict[str, int] = {}
    for name in ("train_agent", "roll_out", "mine_rows", "train_retriever_step", "build_index_step",
                 "evaluate_iteration"):
        real = getattr(loop_steps, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            calls[_name] = calls.get(_name, 0) + 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(loop_steps, name, counted)
    return calls


STEP_FUNCTIONS = dict(zip(STEPS, ("train_agent", "roll_out", "mine_rows", "train_retriever_step",
                                  "build_index_step", "evaluate_iteration")))


def served_index(monkeypatch) -> list[tuple[str, str]]:
    """Record, for every call of the steps that search the service (agent RL, rollouts, mining), the index folder
    the service held at that moment (its ``/health``), in call order."""
    served = []
    token = "loop-admin-token"  # the loop's admin token, known here so the recorder reads /health as the loop does
    monkeypatch.setattr("agentic_retriever.app.loop.service.secrets.token_urlsafe", lambda nbytes=None: token)
    for name in ("train_agent", "roll_out", "mine_rows"):
        real = getattr(loop_steps, name)

        def recorded(*args, _real=real, _name=name, **kwargs):
            url = next(a.url if isinstance(a, RetrievalConfig) else a for a in args
                       if isinstance(a, RetrievalConfig) or isinstance(a, str) and a.startswith("http"))
            health = httpx.get(f"{url}/health", headers={"Authorization": f"Bearer {token}"}, timeout=30).json()
            served.append((_name, health["index_dir"]))
            return _real(*args, **kwargs)

        monkeypatch.setattr(loop_steps, name, recorded)
    return served


def test_two_iterations_run_end_to_end_with_versioned_artifacts_a_report_and_a_status_table(
        workdir, tiny_model_dir, tiny_causal_lm_dir, capsys, monkeypatch):
    served = served_index(monkeypatch)
    released = []
    monkeypatch.setattr(loop_runner, "release_freed_memory", lambda: released.append(True))
    report = run_loop(make_job(tiny_model_dir, tiny_causal_lm_dir))

    manifest = LoopManifest.load("loop")
    assert [n for n in manifest.steps] == ["0/base_index", "0/initial_agent"] + [
        f"{i}/{s}" for i in (1, 2) for s in STEPS]
    assert len(released) == len(manifest.steps), "what each step freed goes back to the system before the next"
    assert all(r.status == "done" for r in manifest.steps.values())
    for i in (1, 2):
        for step in STEPS:
            record = manifest.get(i, step)
            assert record.artifact == f"iter_{i}/{step}/{record.key[:12]}"
            assert (workdir / "loop" / record.artifact).is_dir()
    # Algorithm 1: Agent_i trains, rolls out and is mined against Agentic-R_{i-1}: the base index in iteration 1,
    # iteration 1's index in iteration 2 (never its own iteration's)
    base, first_index = str((workdir / "index" / "base").resolve()), manifest.get(1, "index").summary["index"]
    assert [(name, str(Path(index).resolve())) for name, index in served] == [
        (name, index) for index in (base, str(Path(first_index).resolve())) for name in ("train_agent", "roll_out",
                                                                                          "mine_rows")]
    # the chain: Agent_2 starts from Agent_1; each iteration's rows train a retriever from the base encoder
    assert manifest.get(2, "agent").summary["model"] != manifest.get(1, "agent").summary["model"]
    assert manifest.get(1, "mining").summary["rows"] > 0
    assert manifest.get(2, "retriever").summary["init"] == tiny_model_dir
    assert [r["iteration"] for r in report["rows"]] == [0, 1, 2]
    first = report["rows"][1]
    assert set(first["agent_with_previous_retriever"]) == {"em", "f1", "searches", "questions", "by_dataset"}
    assert first["agent_with_new_retriever"]["by_dataset"]["dev_leaf"]["questions"] == 2  # the file's name
    # the evaluation's agent searches the service, moved onto R_i-1 and then R_i (as its rollout processes must)
    evaluated = workdir / "loop" / manifest.get(1, "evaluate").artifact
    for name in ("agent_previous_retriever.jsonl", "agent_new_retriever.jsonl"):
        assert json.loads((evaluated / name).read_text().splitlines()[0])["retriever"].startswith("http://")
    assert first["rl"]["rewards"] and first["mining"]["rows"] > 0 and first["mining"]["rounds"] == 6
    assert f"| {first['mining']['rows']} / 6 |" in (workdir / "loop" / "loop_report.md").read_text()
    assert set(first["seconds"]) == set(STEPS)
    for name in ("loop_report.md", "loop_report.json", "loop_report.png"):
        assert (workdir / "loop" / name).stat().st_size > 0
    assert "| 2 |" in (workdir / "loop" / "loop_report.md").read_text()
    out = capsys.readouterr().out
    assert "[iteration 2/2] evaluate: done in" in out
    assert out.count("retrieval service now serves") == 6  # R_1 after step 5, then R_0 and R_1 for the agent; twice

    assert main(["loop", "status", "loop"]) == 0
    table = capsys.readouterr().out
    assert table.count("| done |") == 14 and "| 2 | evaluate |" in table

    # a second run finds everything done and runs nothing
    with pytest.MonkeyPatch.context() as patch:  # undone on leaving: later tests see the real step functions
        calls = count_calls(patch)
        run_loop(make_job(tiny_model_dir, tiny_causal_lm_dir))
    assert calls == {} and loop_steps.roll_out.__name__ == "recorded"  # the test's own patch is the fixture's


def test_a_run_killed_in_every_step_resumes_to_the_uninterrupted_manifest(tmp_path, tiny_model_dir,
                                                                          tiny_causal_lm_dir, monkeypatch):
    """Each step is killed once, after its work and before it is recorded as done (the worst moment: the work
    exists, the record says running); every rerun continues where the last stopped and the final record equals
    the one of a run never interrupted."""
    monkeypatch.setattr("agentic_retriever.base.llm.load_llm",
                        lambda config: FakeScorer() if config.model == "fake-scorer" else FakeAgent())
    manifests = {}
    for name in ("straight", "killed"):
        folder = tmp_path / name
        _write_data(folder / "data")
        monkeypatch.chdir(folder)
        if name == "killed":
            for step, function in STEP_FUNCTIONS.items():
                real = getattr(loop_steps, function)

                def killed_after(*args, _real=real, **kwargs):
                    _real(*args, **kwargs)
                    raise Killed("killed before the step was recorded as done")

                with monkeypatch.context() as patch:
                    patch.setattr(loop_steps, function, killed_after)
                    with pytest.raises(Killed):
                        run_loop(make_job(tiny_model_dir, tiny_causal_lm_dir, iterations=1))
                record = LoopManifest.load("loop").get(1, step)
                assert record.status == "running" and record.attempts == 1
        run_loop(make_job(tiny_model_dir, tiny_causal_lm_dir, iterations=1))
        manifests[name] = LoopManifest.load("loop")
    assert comparable(manifests["killed"]) == comparable(manifests["straight"])
    assert all(r.attempts == 2 for n, r in manifests["killed"].steps.items() if n.startswith("1/"))
    rows = {name: (tmp_path / name / "loop" / m.get(1, "mining").artifact / "retriever_train.jsonl").read_text()
            for name, m in manifests.items()}
    assert rows["killed"] == rows["straight"]


def test_a_changed_mining_setting_reruns_mining_and_after_and_nothing_before(workdir, tiny_model_dir,
                                                                            tiny_causal_lm_dir, monkeypatch):
    run_loop(make_job(tiny_model_dir, tiny_causal_lm_dir, iterations=1))
    before = LoopManifest.load("loop")
    calls = count_calls(monkeypatch)
    job = make_job(tiny_model_dir, tiny_causal_lm_dir, iterations=1)
    job.mine.mining.selection.seed = 1   # other negatives sampled
    run_loop(job)
    after = LoopManifest.load("loop")
    assert calls == {"mine_rows": 1, "train_retriever_step": 1, "build_index_step": 1, "evaluate_iteration": 1}
    for step in ("agent", "trajectories"):
        assert after.get(1, step).key == before.get(1, step).key
    for step in ("mining", "retriever", "index", "evaluate"):
        assert after.get(1, step).key != before.get(1, step).key
        assert (workdir / "loop" / before.get(1, step).artifact).is_dir()   # never overwritten in place

    # back to the first setting: its finished versions are found again, nothing is recomputed
    calls.clear()
    run_loop(make_job(tiny_model_dir, tiny_causal_lm_dir, iterations=1))
    assert calls == {}
    assert comparable(LoopManifest.load("loop")) == comparable(before)

    calls.clear()
    run_loop(job, from_iteration=1, from_step="index")
    assert calls == {"build_index_step": 1, "evaluate_iteration": 1}


def test_keys_hold_only_settings_that_differ_from_the_defaults():
    """A setting added with its default by a later release leaves the keys of a finished loop as they were."""
    from agentic_retriever.app.loop.steps import changed_settings

    assert changed_settings(RLConfig(), ("out",)) == {}
    config = RLConfig(steps=3, env=EnvConfig(temperature=1.0, max_turns=2), agent=LLMConfig(model="m"))
    assert changed_settings(config, ("agent.model",)) == {"steps": 3, "env": {"max_turns": 2}, "agent": {}}


def test_the_runner_runs_the_step_table_in_order_and_reruns_a_step_whose_inputs_changed_and_those_after(
        workdir, tiny_model_dir, tiny_causal_lm_dir, monkeypatch):
    """A step is a row of `steps.ITERATION`: the runner runs what the table holds, in order, each step seeing the
    records of the steps before it (`Iteration.done`), and a changed input reruns that step and the ones after. (A
    table keeps an ``index`` step: the next iteration serves its index; here it hands on the base index.)"""
    ran, setting = [], {"value": 1}

    def first(it, out):
        out.mkdir(parents=True)
        ran.append(("first", it.number, setting["value"]))
        return {"value": setting["value"]}

    def index(it, out):
        out.mkdir(parents=True)
        ran.append(("index", it.number, it.done["first"].summary["value"]))
        return {"index": it.previous_index}

    monkeypatch.setattr(loop_runner, "ITERATION", (
        loop_steps.IterationStep("first", lambda it: dict(setting), first),
        loop_steps.IterationStep("index", lambda it: {"first": it.done["first"].identity}, index)))
    run_loop(make_job(tiny_model_dir, tiny_causal_lm_dir, iterations=2))
    assert ran == [("first", 1, 1), ("index", 1, 1), ("first", 2, 1), ("index", 2, 1)]
    assert [n for n in LoopManifest.load("loop").steps] == ["0/base_index", "0/initial_agent", "1/first", "1/index",
                                                            "2/first", "2/index"]
    run_loop(make_job(tiny_model_dir, tiny_causal_lm_dir, iterations=2))
    assert len(ran) == 4, "a finished loop runs nothing again"
    setting["value"] = 2
    run_loop(make_job(tiny_model_dir, tiny_causal_lm_dir, iterations=2))
    assert ran[4:] == [("first", 1, 2), ("index", 1, 2), ("first", 2, 2), ("index", 2, 2)]


def test_a_corrupt_manifest_a_missing_artifact_and_a_new_corpus_are_errors_naming_the_file(
        workdir, tiny_model_dir, tiny_causal_lm_dir):
    run_loop(make_job(tiny_model_dir, tiny_causal_lm_dir, iterations=1))
    manifest = LoopManifest.load("loop")

    corpus = workdir / "data" / "corpus.jsonl"
    original = corpus.read_text()
    corpus.write_text(original + json.dumps({"id": "extra", "contents": '"Extra"\nmore'}) + "\n")
    with pytest.raises(LoopManifestError, match=r"corpus .*loop\.json.*new loop folder"):
        run_loop(make_job(tiny_model_dir, tiny_causal_lm_dir, iterations=1))
    corpus.write_text(original)

    trained = workdir / "loop" / manifest.get(1, "retriever").artifact
    os.rename(trained, trained.with_name("moved"))
    with pytest.raises(LoopManifestError, match=r"'retriever' of iteration 1 .*missing.*--from-step retriever"):
        run_loop(make_job(tiny_model_dir, tiny_causal_lm_dir, iterations=1))

    (workdir / "loop" / "loop.json").write_text('{"version": 1, "steps": {')
    with pytest.raises(LoopManifestError, match=r"loop\.json is not valid JSON \(line 1"):
        LoopManifest.load("loop")
    assert main(["loop", "--workdir", str(workdir), "status", "loop"]) == 2


def test_loop_flags_are_checked_before_anything_runs(workdir, tiny_model_dir, tiny_causal_lm_dir):
    job = make_job(tiny_model_dir, tiny_causal_lm_dir)
    with pytest.raises(ValueError, match="both --from-iteration and --from-step"):
        run_loop(job, from_iteration=1)
    with pytest.raises(ValueError, match="--from-step one of"):
        run_loop(job, from_iteration=3, from_step="mining")
    assert not (workdir / "loop").exists()


def test_the_retriever_step_runs_under_a_launcher_from_the_config_file(workdir, tiny_model_dir, tiny_causal_lm_dir):
    """`loop.retriever_launcher` (torchrun in a cluster; the interpreter here) runs `retriever train` in a new
    process from the loop's config file, with the paths the loop chains as flags."""
    import sys

    rows = write_jsonl(workdir / "rows.jsonl", [
        {"dataset": "t", "query_id": str(q), "question": f"Which city is number {q}?", "round_index": 1,
         "history_queries": [], "query_text": "misc facts", "passage_ids": [str(q), *(str((q + d) % CITIES)
                                                                                    for d in (5, 9, 13))],
         "scores": [{"em": 1, "local_utility": 0.9}] + [{"em": 0, "local_utility": 0.1}] * 3} for q in range(6)])
    config = workdir / "loop.yaml"
    config.write_text("retriever_train:\n  encoder:\n    composition: question_sep_query\n    max_length: 32\n"
                      "  epochs: 1\n  per_device_batch_size: 2\n  report_to: [none]\n"
                      "  progress: false\n")
    job = dataclasses.replace(make_job(tiny_model_dir, tiny_causal_lm_dir, retriever_launcher=sys.executable),
                              config_file=str(config))
    summary = loop_steps.train_retriever_step(job, str(rows), tiny_model_dir, workdir / "step")
    trained = Path(summary["model"])
    assert trained == workdir / "step" / "model"
    manifest = json.loads((trained / "train_manifest.json").read_text())
    assert manifest["settings"]["data"] == str(rows) and manifest["settings"]["encoder"]["max_length"] == 32
    assert manifest["updates"] == 3 and (trained / "config.json").is_file()

    with pytest.raises(ValueError, match="start the loop from a config file"):
        loop_steps.train_retriever_step(dataclasses.replace(job, config_file=""), str(rows), tiny_model_dir,
                                        workdir / "other")


def test_the_paper_loop_trains_the_retriever_under_torchrun_with_the_papers_4096_passages_a_step():
    """Appendix B: per-device batch 32 x 8 GPUs x 16 passages, in-batch and cross-device negatives."""
    from agentic_retriever.app.config_loader import build_config
    from agentic_retriever.base.sessions import command_words
    from agentic_retriever.training.config import RetrieverTrainConfig

    path = str(Path(__file__).resolve().parents[3] / "configs" / "agentic_r_loop.yaml")
    loop, train = build_config(LoopConfig, "loop", None, path), build_config(RetrieverTrainConfig, "retriever_train",
                                                                             None, path)
    launcher = command_words(loop.retriever_launcher)  # torchrun of the loop's own interpreter
    assert launcher[1:3] == ["-m", "torch.distributed.run"] and launcher[launcher.index("--nproc_per_node") + 1] == "8"
    negatives = build_config(MineJobConfig, "mine_run", None, path).mining.selection.num_negatives  # mining's count
    assert train.gather_across_devices and train.per_device_batch_size * 8 * (1 + negatives) == 4096


def test_a_verl_stand_in_writes_and_validates_the_run_then_trains_embedded(workdir, tiny_model_dir,
                                                                           tiny_causal_lm_dir):
    """``loop.verl.stand_in``: the verl run folder is written and passes verl's own validation at its GPU count,
    and the step's policy comes from the embedded trainer (a dry run of a cluster config on one machine)."""
    pytest.importorskip("ray", reason="ray is not installed (the dev extra has it: verl's trainer imports it)")
    from agent.rl.verl import VerlSettings

    job = make_job(tiny_model_dir, tiny_causal_lm_dir, agent_trainer="verl",
                   verl=VerlSettings(n_gpus_per_node=2, val_questions=1, stand_in=True))
    job = dataclasses.replace(job, agent_train=dataclasses.replace(job.agent_train, algorithm="ppo", prompts_per_step=2,
                                                                   samples_per_prompt=1, micro_batch_size=2))
    summary = loop_steps.train_agent_on_verl(job, tiny_causal_lm_dir, "http://127.0.0.1:1", workdir / "agent")
    assert summary["trainer"] == "embedded" and Path(summary["model"]).parent == workdir / "agent" / "embedded"
    assert (Path(summary["model"]) / "config.json").is_file()
    assert summary["verl_run"] == str(workdir / "agent") and (workdir / "agent" / "overrides.txt").is_file()
    assert summary["verl_validated"]["gpus"] == 2 and summary["verl_validated"]["ppo_micro_batch_size_per_gpu"] == 1

    refused = dataclasses.replace(job, loop=dataclasses.replace(job.loop, verl=VerlSettings(
        n_gpus_per_node=2, val_questions=1, stand_in=True, overrides=["actor_rollout_ref.actor.ppo_mini_batch_size=3"])))
    with pytest.raises(Exception, match="ppo_mini_batch_size|mini"):
        loop_steps.train_agent_on_verl(refused, tiny_causal_lm_dir, "http://127.0.0.1:1", workdir / "refused")
    assert not (workdir / "refused" / "embedded").exists()  # nothing trains on a run verl refuses


def test_a_decoder_embedder_trained_with_lora_goes_through_both_iterations_each_starting_from_the_last(
        workdir, tiny_decoder_embedder_dir, tiny_causal_lm_dir, monkeypatch):
    """The loop with a decoder embedder as Agentic-R_0 and LoRA adapters exported alone (``lora.merge: false``):
    the base index and each iteration's index are built with last-token pooling, and with ``retriever_init:
    previous`` Agentic-R_2 trains Agentic-R_1's adapter on (the same base model under it), as Algorithm 1 chains
    the retrievers."""
    from agentic_retriever.base.adapters import adapter_base
    from agentic_retriever.index import open_index
    from agentic_retriever.training.config import LoraSettings

    served_index(monkeypatch)
    job = make_job(tiny_decoder_embedder_dir, tiny_causal_lm_dir, retriever_init="previous")
    job = dataclasses.replace(job, train=dataclasses.replace(
        job.train, lora=LoraSettings(rank=4, merge=False), encoder=dataclasses.replace(job.train.encoder, max_length=64)))
    run_loop(job)
    manifest = LoopManifest.load("loop")
    assert all(r.status == "done" for r in manifest.steps.values())
    first, second = (Path(manifest.get(i, "retriever").summary["model"]) for i in (1, 2))
    assert manifest.get(2, "retriever").summary["init"] == str(first)
    for trained in (first, second):  # adapter-only exports over the one base model
        assert Path(adapter_base(trained)).resolve() == Path(tiny_decoder_embedder_dir).resolve()
        assert json.loads((trained / "train_manifest.json").read_text())["lora"]["rank"] == 4
    for index in ("index/base", manifest.get(2, "index").summary["index"]):
        assert open_index(index).manifest.encoder["pooling"] == "lasttoken"
