"""Encoder runtimes on the CPU: PyTorch against OpenVINO and ONNX Runtime, speed and agreement, in one process.

The same `Encoder` (the embedded MiniLM unless `--model`) encodes a pool of passages and the leaf dev questions
with its transformer run by each runtime; prefixes, tokenisation, length sorting, pooling and normalisation stay
sentence-transformers' own, so only the network's runtime differs:

* ``torch-fp32``: the baseline; ``torch-bf16``: the weights in bf16 (what ``precision: native`` picks on a CPU
  with AMX; on other CPUs only with ``--all``, as it is slower there);
* ``openvino-f32``: ``openvino.convert_model`` of the transformer, compiled with ``INFERENCE_PRECISION_HINT`` f32;
  ``openvino-default``: compiled with OpenVINO's default hint (bf16 on a CPU with bf16 hardware, else f32);
* ``onnxruntime-fp32``: ``torch.onnx.export`` of the transformer in ONNX Runtime; ``onnxruntime-int8``: the same
  graph after ``onnxruntime.quantization.quantize_dynamic`` (int8 weights, activations quantised per batch).

sentence-transformers' own ``backend="onnx" | "openvino"`` would do these exports, but its extras need
optimum-onnx (transformers < 4.58) and optimum-intel (transformers < 5.6), which this project's transformers 5
excludes (benchmarks/RESULTS.md, "Encoder runtimes on the CPU"). Runtimes whose package is missing are reported
as such: ``pip install openvino onnxruntime onnx`` brings both.

Speed: passages/s over the pool, A B C ... in turn (`--repeats` rounds), the best round each, and the ratio to
torch-fp32. Agreement with torch-fp32: the cosine of each passage's embedding (min and mean), and Recall@1 and
MRR@10 of the leaf dev questions against the pool, judged by their evidence titles (evaluation labels; dev
questions, which no training reads). The pool holds the passages of the questions' evidence pages first, then
other passages, up to `--pool` rows.
"""

from __future__ import annotations

import importlib.util
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from _common import alternate, base_parser, describe_device, device_line, write_json

INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def runtime_model(hf_model, run: Callable[[dict], np.ndarray]):
    """A module standing in for the Hugging Face model inside sentence-transformers' Transformer module: called
    with the tokenizer's tensors, it returns ``last_hidden_state`` computed by `run` (numpy in, numpy out)."""
    import torch

    class RuntimeModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.config = hf_model.config

        def forward(self, **features):
            arrays = {name: features[name].numpy() for name in INPUTS if name in features}
            return {"last_hidden_state": torch.from_numpy(run(arrays))}

    return RuntimeModel()


def openvino_runtime(hf_model, example: dict, hint: str | None) -> Callable[[dict], np.ndarray]:
    import openvino

    converted = openvino.convert_model(hf_model, example_input=example)
    compiled = openvino.Core().compile_model(converted, "CPU", {"INFERENCE_PRECISION_HINT": hint} if hint else {})
    names = [port.get_any_name() for port in compiled.inputs]
    return lambda arrays: compiled({name: arrays[name] for name in names})[0]


def onnx_runtime(hf_model, example: dict, folder: Path, int8: bool, threads: int) -> Callable[[dict], np.ndarray]:
    import onnxruntime
    import torch

    names = [name for name in INPUTS if name in example]

    class Positional(torch.nn.Module):  # the exporter passes inputs by position
        def __init__(self):
            super().__init__()
            self.model = hf_model

        def forward(self, *tensors):
            return self.model(**dict(zip(names, tensors))).last_hidden_state

    path = folder / "model.onnx"
    if not path.exists():
        axes = {name: {0: "batch", 1: "tokens"} for name in [*names, "last_hidden_state"]}
        torch.onnx.export(Positional().eval(), tuple(example[name] for name in names), str(path), dynamo=False,
                          input_names=names, output_names=["last_hidden_state"], dynamic_axes=axes)
    if int8:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantised = folder / "model-int8.onnx"
        quantize_dynamic(str(path), str(quantised), weight_type=QuantType.QInt8)
        path = quantised
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return lambda arrays: session.run(None, {name: arrays[name] for name in names})[0]


def pool_and_questions(data: Path, pool_size: int):
    """(passage texts, their titles, judged leaf dev questions whose evidence page is in the pool)."""
    from agentic_retriever.base.corpus import Corpus
    from agentic_retriever.eval.retrieval import load_judged_questions

    questions = load_judged_questions(str(data / "fanoutqa_leaf_dev.jsonl"), relevance="title")
    wanted = set().union(*(q.relevant for q in questions))
    with tempfile.TemporaryDirectory(prefix="bench-corpus-cache-") as cache:
        corpus = Corpus.open(data / "corpus.jsonl", cache_dir=cache)
        titles = corpus.titles_at(np.arange(len(corpus)))
        evidence = [row for row, title in enumerate(titles) if title in wanted]
        others = [row for row, title in enumerate(titles) if title not in wanted]
        rows = sorted((evidence + others)[:pool_size])
        texts = [text for batch in corpus.iter_contents(0, len(corpus)) for text in batch]
    pool_titles = [titles[row] for row in rows]
    present = set(pool_titles)
    return [texts[row] for row in rows], pool_titles, [q for q in questions if q.relevant & present]


def retrieval_metrics(queries: np.ndarray, passages: np.ndarray, titles: list[str], questions) -> dict:
    from agentic_retriever.eval.ranking import measure_rankings

    top = np.argsort(-(queries @ passages.T), axis=1)[:, :10]
    rankings = {str(i): [titles[row] for row in rows] for i, rows in enumerate(top)}
    qrels = {str(i): dict.fromkeys(q.relevant, 1) for i, q in enumerate(questions)}
    values = measure_rankings(rankings, qrels, ["recall@1", "mrr@10"])
    return {name: float(np.mean([v[name] for v in values.values()])) for name in ("recall@1", "mrr@10")}


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--data", default="runs/quickstart/data",
                        help="a folder of `data prepare` (corpus.jsonl, fanoutqa_leaf_dev.jsonl); made if missing")
    parser.add_argument("--pool", type=int, default=2000, help="passages encoded per timed run")
    parser.add_argument("--repeats", type=int, default=2, help="timed rounds of every runtime, in turn")
    parser.add_argument("--model", default="default", help="encoder (default: the embedded MiniLM)")
    parser.add_argument("--all", action="store_true", help="also torch-bf16 on a CPU without bf16 hardware")
    args = parser.parse_args()

    import torch

    from agentic_retriever.base.data.prepare import PrepareConfig, prepare_defaults
    from agentic_retriever.base.encoder import Encoder, EncoderConfig
    from agentic_retriever.base.precision import cpu_computes_bf16_natively

    data = Path(args.data)
    if not (data / "fanoutqa_leaf_dev.jsonl").is_file():
        prepare_defaults(PrepareConfig(out=str(data)))
    texts, titles, questions = pool_and_questions(data, args.pool)
    device = describe_device()
    bf16_hardware = cpu_computes_bf16_natively()
    print(f"{device_line(device)}; torch CPU capability {torch.backends.cpu.get_cpu_capability()}, bf16 hardware "
          f"(AMX): {bf16_hardware}; {len(texts)} passages, {len(questions)} leaf dev questions")

    encoders: dict[str, Encoder] = {"torch-fp32": Encoder(EncoderConfig(model=args.model, precision="fp32"))}
    if bf16_hardware or args.all:
        encoders["torch-bf16"] = Encoder(EncoderConfig(model=args.model, precision="bf16"))
    missing = [package for package in ("openvino", "onnxruntime", "onnx") if importlib.util.find_spec(package) is None]
    work = Path(tempfile.mkdtemp(prefix="bench-runtimes-"))
    runtimes = {}
    if "openvino" not in missing:
        runtimes["openvino-f32"] = lambda hf, example: openvino_runtime(hf, example, "f32")
        runtimes["openvino-default"] = lambda hf, example: openvino_runtime(hf, example, None)
    if "onnxruntime" not in missing and "onnx" not in missing:
        runtimes["onnxruntime-fp32"] = lambda hf, example: onnx_runtime(hf, example, work, False, torch.get_num_threads())
        runtimes["onnxruntime-int8"] = lambda hf, example: onnx_runtime(hf, example, work, True, torch.get_num_threads())
    for name, make in runtimes.items():
        encoder = Encoder(EncoderConfig(model=args.model, precision="fp32"))
        transformer = encoder.model[0]
        example = {k: v for k, v in encoder.model.preprocess(texts[:4]).items() if k in INPUTS}
        with torch.inference_mode():
            transformer.model = runtime_model(transformer.model, make(transformer.model, example))
        encoders[name] = encoder
    for package in missing:
        print(f"{package}: not installed (pip install {package}); its runtimes are left out")

    embeddings: dict[str, np.ndarray] = {}

    def encode(name: str) -> Callable[[], None]:
        def run() -> None:
            embeddings[name] = encoders[name].encode_passages(texts)
        return run

    seconds = alternate({name: encode(name) for name in encoders}, args.repeats, warmup=0)
    reference = embeddings["torch-fp32"]
    baseline = min(seconds["torch-fp32"])
    results = {}
    print("\n| runtime | passages/s | vs torch-fp32 | cosine min | cosine mean | Recall@1 | MRR@10 |\n|---|---:|---:|---:|---:|---:|---:|")
    for name, encoder in encoders.items():
        ours = embeddings[name] / np.linalg.norm(embeddings[name], axis=1, keepdims=True)
        cosine = np.sum(ours * reference / np.linalg.norm(reference, axis=1, keepdims=True), axis=1)
        queries = encoder.encode_queries([q.question for q in questions])
        metrics = retrieval_metrics(queries, embeddings[name], titles, questions)
        best = min(seconds[name])
        results[name] = {"passages_per_s": len(texts) / best, "ratio": baseline / best, "seconds": seconds[name],
                         "cosine_min": float(cosine.min()), "cosine_mean": float(cosine.mean()), **metrics}
        print(f"| {name} | {len(texts) / best:.1f} | {baseline / best:.2f}x | {cosine.min():.6f} | "
              f"{cosine.mean():.6f} | {metrics['recall@1']:.3f} | {metrics['mrr@10']:.3f} |")
    write_json(args.json, "bench_encoder_runtimes", args, device, results)


if __name__ == "__main__":
    main()
