"""Settings of `agentic-retriever loop` (section ``loop``) and the step sections it runs.

The ``loop`` section holds what chains the iterations (how many, where each agent and retriever starts from, the
questions of each step, the service, the evaluation); every step takes the rest of its settings from its own
command's section of the same file (``agent_train``, ``agent_rollout``, ``mine_run``, ``retriever_train``,
``index_build``, and, for the initial agent, ``agent_sft``), exactly as that command would read them. The loop then
sets what it chains: the model each step starts from, the retriever it searches, its input and its output folder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from agent.rl.verl import VerlSettings
from agentic_retriever.base.precision import Precision


__all__ = ["LoopConfig", "LoopEvalConfig", "LoopJob", "LoopServiceConfig"]


@dataclass
class LoopServiceConfig:
    """The retrieval service every step searches: one kept running across iterations, its index swapped in
    place (``POST /admin/swap-index``) when an iteration's retriever is ready."""

    url: str = field(default="", metadata={
        "help": "a service already running (started with an admin token); empty: the loop serves in this process"})
    admin_token_env: str = field(default="AGENTIC_RETRIEVER_ADMIN_TOKEN", metadata={
        "help": "environment variable holding the admin token of the service at url (a served-here service gets a "
                "fresh random token)"})
    host: str = field(default="127.0.0.1", metadata={
        "help": "address a served-here service binds; under loop.placement ray one the other nodes reach (0.0.0.0: "
                "every interface, the URL handed out being this node's address)"})
    port: int = field(default=0, metadata={"help": "port of a served-here service (0: a free one)"})
    index_gpu: Literal["auto", "on", "off"] = field(default="auto", metadata={
        "help": "where the loop's process searches each iteration's dense index (a served-here service, for the "
                "whole loop, and step 6's retrieval metrics): off: host memory (every step's GPUs stay free of "
                "it); on: sharded in fp16 over every visible GPU (faiss-gpu; "
                "an error without it); auto: as each index's build recorded (index_build.dense.gpu). The query "
                "encoder stays on the index's encoder device (cuda:0 when a GPU is visible). docs/loop.md, "
                "\"The GPU plan\""})
    query_precision: Precision = field(default="native", metadata={
        "help": "what a served-here service encodes queries in, as index serve's --query-precision (native: bf16 "
                "where the CPU computes bf16 in hardware, else fp32; on a GPU as auto)"})

    @property
    def open_gpu(self) -> str | None:
        """`open_index`'s ``gpu`` for every index the loop opens in its own process (None: as built)."""
        return None if self.index_gpu == "auto" else self.index_gpu


@dataclass
class LoopRayConfig:
    """``loop.placement: ray``: the shards of steps 2, 3 and 6 and the step servers as Ray actors over a running
    cluster (docs/loop.md, "The GPU plan", N nodes)."""

    address: str = field(default="auto", metadata={
        "help": "the Ray cluster to join (ray.init's address): auto: the one this node belongs to (`ray start` here, "
                "or $RAY_ADDRESS); or HOST:PORT of its head"})
    rollout_shards: int = field(default=0, metadata={
        "help": "agent rollout processes of steps 2 and 6 (0: the cluster's free GPUs // gpus_per_shard when the "
                "step starts)"})
    mining_shards: int = field(default=0, metadata={
        "help": "mine run processes of step 3 (0: the free GPUs // gpus_per_shard once the step's servers are up)"})
    gpus_per_shard: float = field(default=1.0, metadata={
        "help": "GPUs each rollout or mining shard asks Ray for (its vLLM engine's; 0: CPU shards, counts given)"})
    cpus_per_process: float = field(default=1.0, metadata={"help": "CPUs each shard or server asks Ray for"})

    def __post_init__(self):
        for name in ("rollout_shards", "mining_shards", "gpus_per_shard", "cpus_per_process"):
            if getattr(self, name) < 0:
                raise ValueError(f"loop.ray.{name} must be >= 0, got {getattr(self, name)}")


@dataclass
class LoopEvalConfig:
    """Step 6: retrieval on the leaf dev questions and multi-hop recall for Agentic-R_{i-1} and Agentic-R_i, and
    the agent Agent_i with each. Reads evidence labels where the rows carry them: dev data only, never training
    data."""

    leaf_qa: str = field(default="", metadata={
        "help": "leaf dev questions (retrieval metrics: by evidence labels where the rows carry them, else by "
                "answer recall)", "derive": "{workdir}/data/fanoutqa_leaf_dev.jsonl"})
    multihop_qa: str = field(default="", metadata={
        "help": "multi-hop dev questions (recall, judged as leaf_qa; also the parents of leaf rows with parent_id)",
        "derive": "{workdir}/data/fanoutqa_multihop_dev.jsonl"})
    agent_qa: str = field(default="", metadata={"help": "questions the agent answers with each retriever",
                                                "derive": "{workdir}/data/fanoutqa_leaf_dev_in_corpus.jsonl"})
    agent_questions: int = field(default=48, metadata={"help": "first N of agent_qa (0: skip the agent)"})
    ks: list[int] = field(default_factory=lambda: [1, 5, 20], metadata={"help": "Recall@k cut-offs"})
    mrr_k: int = field(default=10, metadata={"help": "MRR cut-off"})
    ndcg_k: int = field(default=10, metadata={"help": "nDCG cut-off"})


@dataclass
class LoopConfig:
    """Settings of `agentic-retriever loop` (section ``loop``)."""

    #: 0.1's key (read with a deprecation warning): "service" now means the retrieval service alone.
    RENAMED: ClassVar[dict[str, str]] = {"services": "step_servers"}

    workdir: str = field(default="", metadata={"help": "run folder", "derive": "{workdir}"})
    out: str = field(default="", metadata={"help": "the loop's folder: loop.json, iter_*/, loop_report.*",
                                           "derive": "{workdir}/loop"})
    iterations: int = field(default=2, metadata={"help": "K, the number of iterations (the paper: 2)"})
    base_index: str = field(default="", metadata={
        "help": "index of the initial retriever Agentic-R_0 (built with index_build's settings when missing)",
        "derive": "{index}"})
    mining_qa: str = field(default="", metadata={
        "help": "training questions Q the agent rolls out on to mine retriever training rows",
        "derive": "{workdir}/data/fanoutqa_leaf_train_mining.jsonl"})
    agent_init: Literal["previous", "initial"] = field(default="previous", metadata={
        "help": "Agent_i starts from Agent_{i-1} (previous) or from the initial agent every time (initial: the "
                "paper's 'we initialize the search agent with Qwen2.5-7B-Base', read per iteration)"})
    retriever_init: Literal["initial", "previous"] = field(default="initial", metadata={
        "help": "Agentic-R_i is trained from the base encoder (initial: the paper, 'we initialize our Agentic-R "
                "with E5') or from Agentic-R_{i-1} (previous)"})
    agent_trainer: Literal["embedded", "verl"] = field(default="embedded", metadata={
        "help": "embedded: agent train in this process; verl: write verl's run config and wait for its checkpoint"})
    retriever_launcher: str = field(default="", metadata={
        "help": "run step 4 as `LAUNCHER -m agentic_retriever.app.cli retriever train --config FILE ...` (e.g. "
                "`torchrun --nproc_per_node 8` for cross-device negatives, or with retriever_train.deepspeed), reading "
                "retriever_train from the loop's config file; empty: in this process"})
    rollout_devices: list[str] = field(default_factory=list, metadata={
        "help": "step 2 as one `agent rollout --shard i/n` process per entry, each seeing the GPUs the entry names "
                "('0', '0,1', or 'cpu'; CUDA_VISIBLE_DEVICES), their trajectories joined in question order; empty: "
                "in this process"})
    mining_devices: list[str] = field(default_factory=list, metadata={
        "help": "step 3 as one `mine run --shard i/n` process per entry (as rollout_devices), all searching the "
                "loop's service, merged into the step's folder (mine merge); empty: in this process"})
    placement: Literal["local", "ray"] = field(default="local", metadata={
        "help": "local: shards and servers on this node, on the devices rollout_devices, mining_devices and each "
                "step server's devices name; ray: as Ray actors anywhere in the cluster of loop.ray, each asking "
                "for its GPUs (a step server: as many as its devices list)"})
    ray: LoopRayConfig = field(default_factory=LoopRayConfig)
    step_servers: dict[str, Any] = field(default_factory=dict, metadata={
        "help": "servers some steps need ('services' in 0.1), NAME -> {command, health_url, steps, devices, "
                "start_timeout_s}: started "
                "(and awaited on health_url) before the first of their steps, stopped before any other step, so "
                "verl finds its GPUs free (e.g. the LR scorer as `vllm serve ... --tensor-parallel-size 4` for "
                "mining); '{python}' in a command is this interpreter"})
    verl: VerlSettings = field(default_factory=VerlSettings)
    service: LoopServiceConfig = field(default_factory=LoopServiceConfig)
    eval: LoopEvalConfig = field(default_factory=LoopEvalConfig)
    progress: bool = field(default=True, metadata={"help": "progress bars"})

    def __post_init__(self):
        from .processes import check_devices, step_server_specs
        from .steps import STEPS

        check_devices(self.rollout_devices, "loop.rollout_devices")
        check_devices(self.mining_devices, "loop.mining_devices")
        step_server_specs(self.step_servers, STEPS)
        if self.placement == "ray" and (self.rollout_devices or self.mining_devices):
            raise ValueError("loop.placement ray: Ray places the shards, so loop.rollout_devices and "
                             "loop.mining_devices stay empty; give their counts as loop.ray.rollout_shards and "
                             "loop.ray.mining_shards (0: from the cluster's free GPUs)")


@dataclass
class LoopJob:
    """The loop's settings plus the sections of the steps it runs (`warm_start` None: the shared ``agent.model``
    is the initial agent; `prepare` None: the data files are already there)."""

    loop: LoopConfig
    agent_train: Any          # agent.rl.config.RLConfig (section agent_train)
    rollout: Any              # agent.rollouts.RolloutConfig (section agent_rollout)
    mine: Any                 # mining.job.MineJobConfig (section mine_run)
    train: Any                # training.config.RetrieverTrainConfig (section retriever_train)
    index: Any                # index.IndexBuildConfig (section index_build)
    warm_start: Any = None    # agent.sft.WarmStartConfig (section agent_sft)
    prepare: Any = None       # data.prepare.PrepareConfig (section data_prepare): the data, when the file has it
    config_file: str = ""
