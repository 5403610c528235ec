"""rollpacker.sim: a discrete-event simulator of RL rollout, reward and training on many GPUs,
driven by real length data and a stated latency model: a backend of the same driver and core as real engines.

    from rollpacker.sim import SimConfig, Simulation
    result = Simulation(SimConfig(policy="tail", max_tokens=32768, model="qwen2.5-32b",
                                  instances=16, tp=4, steps=5)).run()
"""

from .config import TP_MODES, SimConfig
from .constants import MODELS, PAPER_SETTINGS, SimConstants
from .simulation import Simulation
from .workloads import BUILTIN, WorkloadError, load_workload, parse_jsonl

__all__ = ["BUILTIN", "MODELS", "PAPER_SETTINGS", "SimConfig", "SimConstants", "Simulation", "TP_MODES",
           "WorkloadError", "load_workload", "parse_jsonl"]
