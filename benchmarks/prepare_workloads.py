"""Build the compact length tables shipped in rollpacker/data/ from ../shared/traces.

    .venv/bin/python benchmarks/prepare_workloads.py [TRACES_DIR]

Each workload becomes `rollpacker/data/<name>/lengths.json`: the quantile function of the pooled
output-token (and input-token) distribution at ~2,000 probability levels (dense in the tail), plus
the summary statistics it was checked against.  The source LICENSE is copied beside it.

servegen-r1: every 6-hour window of every client is an empirical distribution {value: probability};
its request count is recovered as 1 / (smallest probability), and windows are pooled by that count
(pooled by request volume, as ../shared/traces/README.md states: mean 1527, p50 792, p90 3432).
"""

from __future__ import annotations

import ast
import csv
import glob
import json
import shutil
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "rollpacker" / "data"
LEVELS = np.unique(np.concatenate([np.linspace(0.0, 0.99, 991), np.linspace(0.99, 1.0, 1001)]))


def quantiles(values: np.ndarray, weights: np.ndarray) -> list[int]:
    order = np.argsort(values)
    values, weights = values[order], weights[order]
    cdf = np.cumsum(weights) / weights.sum()
    idx = np.minimum(np.searchsorted(cdf, LEVELS, side="left"), len(values) - 1)
    return [int(v) for v in values[idx]]


def summary(values: np.ndarray, weights: np.ndarray) -> dict:
    w = weights / weights.sum()
    order = np.argsort(values)
    cdf = np.cumsum(w[order])
    q = lambda u: int(values[order][min(np.searchsorted(cdf, u), len(cdf) - 1)])  # noqa: E731
    return {"mean": float((values * w).sum()), "p50": q(0.5), "p90": q(0.9), "p99": q(0.99),
            "max": int(values.max())}


def pooled_servegen(folder: Path, field: str) -> tuple[np.ndarray, np.ndarray]:
    mass: dict[int, float] = {}
    for path in sorted(glob.glob(str(folder / "chunk-*-dataset.json"))):
        for window in json.loads(Path(path).read_text()).values():
            dist = {int(k): p for k, p in ast.literal_eval(window[field]).items() if p > 0}
            if not dist:
                continue
            count = round(1.0 / min(dist.values()))
            for value, p in dist.items():
                mass[value] = mass.get(value, 0.0) + p * count
    values = np.array(sorted(mass))
    return values, np.array([mass[v] for v in values])


def azure(path: Path, column: str) -> tuple[np.ndarray, np.ndarray]:
    with open(path) as f:
        values = np.array([int(row[column]) for row in csv.DictReader(f)])
    return values, np.ones(len(values))


def write(name: str, source: str, license_path: Path, out: dict[str, tuple[np.ndarray, np.ndarray]],
          note: str) -> None:
    folder = OUT / name
    folder.mkdir(parents=True, exist_ok=True)
    data = {"name": name, "source": source, "note": note, "levels": [round(float(u), 6) for u in LEVELS]}
    for key, (values, weights) in out.items():
        data[key] = quantiles(values, weights)
        data[key + "_summary"] = summary(values, weights)
    (folder / "lengths.json").write_text(json.dumps(data, separators=(",", ":")))
    shutil.copy(license_path, folder / "LICENSE")
    print(name, {k: data[k + "_summary"] for k in out})


def main(traces: Path) -> None:
    sg = traces / "servegen-deepseek-r1"
    write("servegen-r1", "alibaba/ServeGen data/reason/deepseek-r1 (commit 4d6f0c77), arXiv 2505.09999; Apache-2.0",
          sg / "LICENSE",
          {"output": pooled_servegen(sg, "output_tokens"), "input": pooled_servegen(sg, "input_tokens")},
          "DeepSeek-R1 production traffic pooled over 73 clients by request volume; output capped at 32768.")
    az = traces / "azure-llm-2023"
    for name, file in (("azure-code", "AzureLLMInferenceTrace_code.csv"), ("azure-conv", "AzureLLMInferenceTrace_conv.csv")):
        write(name, f"Azure/AzurePublicDataset {file} (commit 79092101), Patel et al. ISCA 2024; CC-BY-4.0",
              az / "LICENSE",
              {"output": azure(az / file, "GeneratedTokens"), "input": azure(az / file, "ContextTokens")},
              "Azure LLM inference trace 2023 (Splitwise).")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT.parent / "shared" / "traces")
