"""`loop plan`: each step's work from the loop's settings divided by the throughput table, the GPUs each step
holds, the scorer-bound mining step, overrides, refusals by name, and the command on the paper config."""

from __future__ import annotations

import dataclasses

import pytest

from agentic_retriever.app.cli import main
from agentic_retriever.app.loop.plan import RATES, plan_loop, plan_table
from tests.fakes import write_jsonl
from tests.app.loop.test_loop import make_job

SCORER = {"lr_scorer": {"command": "serve", "health_url": "http://localhost:1/health", "steps": ["mining"],
                        "devices": "4,5,6,7"}}


@pytest.fixture
def job(tmp_path, monkeypatch, tiny_model_dir, tiny_causal_lm_dir):
    """The tests' loop with 100 mining questions and a corpus of 1,000 passages on disk."""
    monkeypatch.chdir(tmp_path)
    write_jsonl(tmp_path / "data" / "mining.jsonl", [{"id": f"q{i}", "question": "?", "golden_answers": ["a"]}
                                                     for i in range(100)])
    write_jsonl(tmp_path / "data" / "corpus.jsonl", [{"id": str(i), "contents": "x"} for i in range(1000)])
    return make_job(tiny_model_dir, tiny_causal_lm_dir, step_servers=SCORER)


def _step(plan: dict, prefix: str) -> dict:
    (step,) = [s for s in plan["steps"] if s["step"].startswith(prefix)]
    return step


def test_each_step_is_its_work_over_the_throughput_on_the_gpus_it_holds(job):
    plan = plan_loop(job, gpus=16, gpu_type="H100")
    rates = {k: r.value for k, r in RATES["H100"].items()}
    rl = job.agent_train  # grpo: prompts x samples sequences a step
    agent = _step(plan, "1 agent")
    assert agent["gpus"] == 16 and agent["hours"] == pytest.approx(
        rl.steps * rl.prompts_per_step * rl.samples_per_prompt * rates["rl_seconds_per_sequence"] / 16 / 3600)
    index = _step(plan, "5 index")
    rates |= {key: plan["rates"][key]["value"] for key in ("encode", "train")}  # scaled to the tests' tiny retriever
    assert index["gpus"] == 8 and index["hours"] == pytest.approx(1000 / rates["encode"] / 8 / 3600)  # loop's node
    assert index["gpu_hours"] == pytest.approx(index["hours"] * 8)
    mining = plan["mining_plan"]
    assert mining["trajectories"] == plan["questions"] == 100
    train = _step(plan, "4 retriever")
    assert train["hours"] == pytest.approx(mining["rounds"] * (1 + job.mine.mining.selection.num_negatives) * job.train.epochs
                                           / rates["train"] / 8 / 3600)
    assert plan["hours"] == pytest.approx(sum(s["hours"] for s in plan["steps"]))


def test_mining_takes_the_longer_of_the_scorer_on_its_gpus_and_the_gac_shards_on_the_rest(job):
    listwise = dataclasses.replace(job, mine=dataclasses.replace(job.mine, mining=dataclasses.replace(
        job.mine.mining, lr_scorer="listwise", use_sub_answers=True, gac_mode="rollout")))
    eight, thirty_two = plan_loop(listwise, gpus=8), plan_loop(listwise, gpus=32)
    stages = eight["mining_plan"]["stages"]
    rates = {k: r.value for k, r in RATES["H100"].items()}
    scorer_s = sum(stages[s]["prompt_tokens"] for s in ("sub_answers", "local_relevance")) / rates["llm_72b_prefill"] \
        + sum(stages[s]["completion_tokens"] for s in ("sub_answers", "local_relevance")) / rates["llm_72b_decode"]
    gac_s = stages["gac"]["prompt_tokens"] / rates["llm_7b_prefill"] + \
        stages["gac"]["completion_tokens"] / rates["llm_7b_decode"]
    for plan, shards in ((eight, 4), (thirty_two, 28)):
        step = _step(plan, "3 mining")
        assert step["hours"] == pytest.approx(max(scorer_s / 4, gac_s / shards) / 3600)
        assert f"on {shards}" in step["work"] and step["gpus"] == plan["gpus"]
    assert _step(thirty_two, "3 mining")["bound_by"] == "the scorer"  # more GPUs do not shorten it


def test_a_given_throughput_replaces_the_tables_and_says_so(job):
    plan = plan_loop(job, gpus=8, overrides={"encode": 10.0})
    assert _step(plan, "5 index")["hours"] == pytest.approx(1000 / 10.0 / 8 / 3600)
    assert f"`encode` = 10 passages/s per GPU ({job.train.encoder.model} 16-bit): given on the command line" \
        in plan_table(plan)
    with pytest.raises(ValueError, match="unknown throughput 'encoder'"):
        plan_loop(job, gpus=8, overrides={"encoder": 10.0})
    with pytest.raises(ValueError, match="no throughputs for GPU type 'V100'"):
        plan_loop(job, gpus=8, gpu_type="V100")
    with pytest.raises(ValueError, match="leaving none of 4 for shards"):
        plan_loop(job, gpus=4)


def test_every_throughput_names_its_source():
    for gpu, rates in RATES.items():
        assert set(rates) == set(RATES["H100"]), gpu
        for key, rate in rates.items():
            assert rate.value > 0 and rate.unit and any(
                word in rate.source for word in ("published", "derived", "ours", "arXiv")), (gpu, key)


def test_missing_inputs_are_asked_for_by_name(tmp_path, monkeypatch, tiny_model_dir, tiny_causal_lm_dir):
    monkeypatch.chdir(tmp_path)
    job = make_job(tiny_model_dir, tiny_causal_lm_dir)
    with pytest.raises(ValueError, match=r"--questions N"):
        plan_loop(job, gpus=8)
    with pytest.raises(ValueError, match=r"--corpus-passages N"):
        plan_loop(job, gpus=8, questions=10)
    unset = dataclasses.replace(job, loop=dataclasses.replace(job.loop, mining_qa=""))
    with pytest.raises(ValueError, match=r"the questions \(loop.mining_qa\) are not here.*--questions N"):
        plan_loop(unset, gpus=8)  # no QA set named: asked for, not planned as zero questions


def test_loop_plan_prints_the_paper_configs_iteration(capsys):
    main(["loop", "--config", "configs/agentic_r_loop.yaml", "plan", "--gpus", "32", "--questions", "169232",
          "--corpus-passages", "21015324", "--throughput", "llm_72b_prefill=2000"])
    out = capsys.readouterr().out
    assert out.startswith("One iteration on 32 x H100 (4 node(s) of 8), 169,232 mining questions")
    assert "| 3 mining | 338,464 rounds" in out and "GAC engines on 28" in out
    assert "| 5 index | 21,015,324 passages | 8 |" in out and "2 iterations:" in out


def test_without_a_mining_server_on_gpus_the_scorers_work_is_counted_on_the_shards(job):
    listwise = dataclasses.replace(job, loop=dataclasses.replace(job.loop, step_servers={}), mine=dataclasses.replace(
        job.mine, mining=dataclasses.replace(job.mine.mining, lr_scorer="listwise", use_sub_answers=True,
                                             gac_mode="rollout")))
    plan = plan_loop(listwise, gpus=8)
    stages, rates = plan["mining_plan"]["stages"], {k: r.value for k, r in RATES["H100"].items()}
    scorer_s = sum(stages[s]["prompt_tokens"] / rates["llm_72b_prefill"]
                   + stages[s]["completion_tokens"] / rates["llm_72b_decode"]
                   for s in ("sub_answers", "local_relevance"))
    gac_s = stages["gac"]["prompt_tokens"] / rates["llm_7b_prefill"] + \
        stages["gac"]["completion_tokens"] / rates["llm_7b_decode"]
    step = _step(plan, "3 mining")
    assert scorer_s > 0 and step["hours"] == pytest.approx((scorer_s + gac_s) / 8 / 3600)
    assert "to the scorer on the shards' GPUs" in step["work"] and "bound_by" not in step


def test_a_step_without_a_price_is_listed_as_not_priced_and_the_totals_are_the_priced_steps(job, monkeypatch):
    from agentic_retriever.app.loop import plan as plan_module

    priced = plan_loop(job, gpus=8)
    monkeypatch.setattr(plan_module, "STEPS", (*plan_module.STEPS, "audit"))
    plan = plan_loop(job, gpus=8)
    audit = _step(plan, "7 audit")
    assert "not priced" in audit["work"] and audit["hours"] == audit["gpu_hours"] == 0
    assert plan["hours"] == pytest.approx(priced["hours"]) and "| 7 audit | not priced" in plan_table(plan)
    monkeypatch.delitem(plan_module.PRICES, "index")
    assert "not priced" in _step(plan_loop(job, gpus=8), "5 index")["work"]


def _with_retriever(job, model: str, **train):
    encoder = dataclasses.replace(job.train.encoder, model=model)
    return dataclasses.replace(job, train=dataclasses.replace(job.train, encoder=encoder, **train))


def test_the_retrievers_shapes_are_their_published_sizes():
    """Parameters counted from each config on the meta device, against the sizes published for them (KerasHub's
    Qwen3-Embedding presets: 595,776,512 and 4,021,774,336; e5-base-v2 is BERT-base)."""
    from agentic_retriever.app.loop.retriever_cost import encoder_shape

    assert encoder_shape("Qwen/Qwen3-Embedding-0.6B").parameters == 595_776_512
    assert encoder_shape("Qwen/Qwen3-Embedding-4B").parameters == 4_021_774_336
    e5 = encoder_shape("intfloat/e5-base-v2")
    assert e5.parameters == 109_482_240 and (e5.hidden, e5.layers) == (768, 12)
    with pytest.raises(ValueError, match="the retriever 'no/such-model' is neither a folder here"):
        encoder_shape("no/such-model")


def test_a_lora_adapters_size_is_what_peft_trains(tiny_decoder_embedder_dir):
    """The plan's count of a LoRA adapter against the parameters PEFT makes trainable on the same model."""
    from agentic_retriever.app.loop.retriever_cost import encoder_shape
    from agentic_retriever.base.encoder import Encoder, EncoderConfig
    from agentic_retriever.training.config import LoraSettings
    from agentic_retriever.training.lora import prepare_trainable

    shape = encoder_shape(tiny_decoder_embedder_dir)
    for targets in (["all-linear"], ["q_proj", "v_proj"]):
        model = Encoder(EncoderConfig(model=tiny_decoder_embedder_dir, device="cpu")).model
        counts = prepare_trainable(model, LoraSettings(rank=4, target_modules=targets))
        assert shape.adapter_parameters(4, targets) == counts["trainable_parameters"], targets


def test_a_larger_retriever_costs_e5s_fixed_time_a_passage_plus_its_own_compute(job):
    """The encode and train rates of another backbone: e5-base-v2's time a passage less e5's compute, plus the
    backbone's compute at the 7B prefill's FLOPs (forward passes x tokens x parameters outside the embeddings);
    LoRA divides the compute by its published 1.25."""
    from agentic_retriever.app.loop.plan import _PARAMS_7B
    from agentic_retriever.app.loop.retriever_cost import encoder_shape

    e5 = plan_loop(_with_retriever(job, "intfloat/e5-base-v2"), gpus=8)
    qwen = plan_loop(_with_retriever(job, "Qwen/Qwen3-Embedding-0.6B"), gpus=8)
    table = RATES["H100"]
    assert e5["rates"]["encode"]["value"] == table["encode"].value  # the table's own retriever: as it is
    tokens, flops = job.mine.plan.passage_tokens, table["llm_7b_prefill"].value * _PARAMS_7B
    small, large = (encoder_shape(m).body_parameters for m in ("intfloat/e5-base-v2", "Qwen/Qwen3-Embedding-0.6B"))
    for key, forwards in (("encode", 1), ("train", 4)):
        seconds = 1 / table[key].value + forwards * tokens * (large - small) / flops
        assert qwen["rates"][key]["value"] == pytest.approx(1 / seconds)
        assert "Qwen/Qwen3-Embedding-0.6B" in qwen["rates"][key]["unit"] and "ms a passage" in qwen["rates"][key]["source"]
    assert table["encode"].value > qwen["rates"]["encode"]["value"]
    assert _step(qwen, "5 index")["hours"] == pytest.approx(
        _step(e5, "5 index")["hours"] * table["encode"].value / qwen["rates"]["encode"]["value"])
    lora = plan_loop(_with_retriever(job, "Qwen/Qwen3-Embedding-0.6B", lora=dataclasses.replace(job.train.lora, rank=16)),
                     gpus=8)
    seconds = 1 / table["train"].value + 4 * tokens * (large / 1.25 - small) / flops
    assert lora["rates"]["train"]["value"] == pytest.approx(1 / seconds) and "LoRA r=16" in lora["rates"]["train"]["unit"]


def test_the_retrievers_memory_is_its_states_activations_and_index_per_gpu(job):
    """The memory rows from their terms (retriever_cost's docstring): 16 bytes a parameter with AdamW, 2 + 14/G
    under ZeRO-2, 4 + an adapter's 16 with LoRA; activations by the tokens in flight; the fp16 index over 8 GPUs."""
    from agentic_retriever.app.loop.retriever_cost import QUERY_TOKENS, encoder_shape

    gib = 2**30
    shape = encoder_shape("Qwen/Qwen3-Embedding-4B")
    selection = dataclasses.replace(job.mine.mining.selection, num_negatives=15)  # the paper's 16 passages a query
    job = dataclasses.replace(job, mine=dataclasses.replace(job.mine, mining=dataclasses.replace(
        job.mine.mining, selection=selection)))
    plain = _with_retriever(job, "Qwen/Qwen3-Embedding-4B", gradient_checkpointing=True, per_device_batch_size=32)
    memory = plan_loop(plain, gpus=8, corpus_passages=21_015_324)["retriever"]
    passages = 1 + job.mine.mining.selection.num_negatives
    tokens = 32 * (QUERY_TOKENS + passages * job.mine.plan.passage_tokens)
    activations = (4 * 36 + 34) * 2560 * tokens  # checkpointed inputs of 36 layers in fp32, one layer recomputed
    assert memory["tokens_in_flight"] == tokens and memory["activations_gib"] == pytest.approx(activations / gib)
    assert memory["index_per_gpu_gib"] == pytest.approx(21_015_324 * 2560 * 2 / 8 / gib)
    assert memory["service_encoder_gib"] == pytest.approx(2 * shape.parameters / gib)
    assert memory["service_gib"] == pytest.approx(memory["service_encoder_gib"] + memory["index_per_gpu_gib"])
    full, zero2, lora = memory["training"].values()
    assert full["states_gib"] == pytest.approx(16 * shape.parameters / gib) and memory["chosen"] == "full (DDP)"
    assert zero2["states_gib"] == pytest.approx((2 + 14 / 8) * shape.parameters / gib)
    assert lora["states_gib"] == pytest.approx((4 * shape.parameters + 16 * memory["adapter_parameters"]) / gib)
    assert full["total_gib"] > 80 > lora["total_gib"]  # 4B fully fine-tuned without ZeRO does not fit a card
    cached = plan_loop(_with_retriever(job, "Qwen/Qwen3-Embedding-4B", gradient_checkpointing=True, cached=True,
                                       mini_batch_size=16, lora=dataclasses.replace(job.train.lora, rank=8)),
                       gpus=8, corpus_passages=21_015_324)["retriever"]
    assert cached["tokens_in_flight"] == 16 * job.mine.plan.passage_tokens and cached["chosen"].startswith("LoRA r=8")
    small = plan_loop(_with_retriever(job, "Qwen/Qwen3-Embedding-4B", cached=True, mini_batch_size=64,
                                      per_device_batch_size=2), gpus=8, corpus_passages=21_015_324)["retriever"]
    assert small["tokens_in_flight"] == 2 * (QUERY_TOKENS + passages * job.mine.plan.passage_tokens)  # all 34 texts


def test_loop_plan_gives_the_4b_lora_configs_memory_beside_the_service(capsys):
    """configs/agentic_r_qwen3_embedding_4b_lora_loop.yaml: a 4B retriever fully fine-tuned does not fit GPU 0
    beside the service's encoder and index shard; the config's LoRA with the cached loss does."""
    main(["loop", "--config", "configs/agentic_r_qwen3_embedding_4b_lora_loop.yaml", "plan", "--gpus", "8",
          "--questions", "169232", "--corpus-passages", "21015324"])
    out = capsys.readouterr().out
    assert "Retriever Qwen/Qwen3-Embedding-4B: 4,022M parameters" in out and "2560-d vectors" in out
    rows = {line.split(":")[0]: line for line in out.splitlines() if line.startswith("| training, ")}
    assert rows["| training, full (DDP)"].endswith("| no |")
    assert rows["| training, LoRA r=16 (all-linear) (the config)"].endswith("| yes |")
    assert "| 5 index | 21,015,324 passages | 8 |" in out and "Qwen/Qwen3-Embedding-4B 16-bit" in out
