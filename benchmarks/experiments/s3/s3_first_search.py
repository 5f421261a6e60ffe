"""Does s3_training.py's task change now that s3's first search is naive RAG's? ("Q" instead of "Q?", both top-3.)

s3's first retrieval D_0 used to search the question with "?" appended (Search-R1's prompt form), while naive RAG
searched it as written; since issue 30 both are the same search (`agent.dialects.s3.S3Dialect.initial_topk`). This
script compares the two searches with the quickstart index on what `s3_training.py` reads: the task questions (answer
at rank 2 or 3 of the top-3) of the train and held-out leaves, and the questions of its format warm start. Where all
of them have the same passages in the same order, every prompt of that benchmark is unchanged, and so are its
figures. Not a speed benchmark; needs `agentic-retriever data prepare` and `index build` of configs/quickstart.yaml.

    python benchmarks/experiments/s3/s3_first_search.py
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/: _common (an experiment runs as a script)
from _common import REPO_ROOT
from s3_training import DATA, answer_rank


def same_order(a, b) -> bool:
    return [p.id for p in a] == [p.id for p in b]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", default=str(REPO_ROOT / "runs/quickstart/index/minilm-flat"))
    parser.add_argument("--topk", type=int, default=3)
    parser.add_argument("--sft-examples", type=int, default=64, help="as s3_training.py")
    parser.add_argument("--seed", type=int, default=0, help="as s3_training.py")
    args = parser.parse_args()

    from agent.dialects.search_r1 import search_r1_question
    from agent.s3_rag_baseline import is_yes_no
    from agentic_retriever.base.qa_sources import read_qa_rows
    from agentic_retriever.index import open_index
    from agentic_retriever.retrieval import LocalRetrievalClient

    client = LocalRetrievalClient(open_index(args.index))

    def both(rows):
        return (client.retrieve([search_r1_question(r.question) for r in rows], topk=args.topk),
                client.retrieve([r.question for r in rows], topk=args.topk))

    for name in ("fanoutqa_leaf_train.jsonl", "fanoutqa_leaf_dev.jsonl"):
        rows = [r for r in read_qa_rows(DATA / name) if not is_yes_no(r.golden_answers)]
        before, now = both(rows)
        task = [(r, a, b) for r, a, b in zip(rows, before, now) if (k := answer_rank(a, r.golden_answers)) and k > 1]
        task_now = [r for r, b in zip(rows, now) if (k := answer_rank(b, r.golden_answers)) and k > 1]
        print(f"{name}: {len(rows)} questions, the same top-{args.topk} in order for "
              f"{sum(same_order(a, b) for a, b in zip(before, now))}; task questions before {len(task)}, now "
              f"{len(task_now)}, the same top-{args.topk} in order for {sum(same_order(a, b) for _, a, b in task)} "
              f"of {len(task)}")
    rows = read_qa_rows(DATA / "fanoutqa_leaf_train.jsonl")
    random.Random(args.seed).shuffle(rows)
    before, now = both(rows[: args.sft_examples])
    print(f"warm-start questions: the same top-{args.topk} in order for "
          f"{sum(same_order(a, b) for a, b in zip(before, now))} of {len(before)}")


if __name__ == "__main__":
    main()
