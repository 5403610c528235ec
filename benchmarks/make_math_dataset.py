"""A small math dataset in veRL's RL layout, made from reasoning-gym problems (nothing downloaded).

    python benchmarks/make_math_dataset.py --out data/math.parquet --size 64
    python reference/train.py --dataset data/math.parquet --reward math

Each row is what veRL's data preprocessors write: `prompt` (chat messages), `data_source` (the
reasoning-gym task), `ability`, `reward_model` {"style": "rule", "ground_truth": the answer} and
`extra_info` {"split", "index", "question"}.  A `.jsonl` path writes JSON lines instead of Parquet.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rollpacker.backends.data.tasks import make_problems, rows_from_problems

MATH_TASKS = ("chain_sum", "basic_arithmetic", "gsm_symbolic")


def verl_records(size: int, seed: int, tasks=MATH_TASKS) -> list[dict]:
    """`size` problems of `tasks` as veRL RL rows."""
    rows = rows_from_problems(make_problems(list(tasks), size=size, seed=seed))
    return [{"prompt": [dict(m) for m in row.messages],
             "data_source": row.data_source,
             "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": str(row.ground_truth)},
             "extra_info": {"split": "train", "index": i, "question": row.extra_info["entry"]["question"]}}
            for i, row in enumerate(rows)]


def write(records: list[dict], out: Path) -> Path:
    import datasets

    datasets.disable_progress_bars()
    out.parent.mkdir(parents=True, exist_ok=True)
    table = datasets.Dataset.from_list(records)
    if out.suffix == ".jsonl":
        table.to_json(str(out), lines=True)
    else:
        table.to_parquet(str(out))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("data/math.parquet"), help=".parquet or .jsonl")
    parser.add_argument("--size", type=int, default=64, help="rows")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.size < 1:
        parser.error(f"--size must be >= 1, got {args.size}")
    if args.out.suffix not in (".parquet", ".jsonl"):
        parser.error(f"--out {args.out}: use a .parquet or .jsonl path")
    path = write(verl_records(args.size, args.seed), args.out)
    print(f"{args.size} rows ({', '.join(MATH_TASKS)}) in veRL's layout: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
