"""The settings of benchmarks/fidelity.py: each family of runs' flags and sizes, and how it was chosen."""

from __future__ import annotations

from attrs import frozen

POLICIES = {"sync": ["--policy", "sync"], "tail": ["--policy", "tail"],
            "tail-unbiased": ["--policy", "tail", "--tail.eta-responses", "1.0"]}
"""Name -> train.py flags of each policy, in the order they run."""


@frozen
class Setting:
    """The sizes of one family of runs; every run of it differs only in policy and seed."""

    flags: tuple[str, ...]
    steps: int
    what: str
    """The setting in words, for the output and RESULTS.md."""
    why: str = ""
    """How it was chosen (measured), for RESULTS.md."""
    design: str = "curves"
    """"curves": the reward curves side by side; "tost": also the pre-registered equivalence test of
    tail against sync on paired seeds (benchmarks/fidelity_equivalence.py)."""
    seeds: tuple[int, ...] = (0, 1)
    """The seeds the setting runs (each with every policy) unless --seeds says otherwise."""
    policies: tuple[str, ...] = tuple(POLICIES)
    control: tuple[int, int] = (0, 1)
    """The sync-against-sync control pair of a "tost" design (seeds)."""


CPU_LR5E5_WHY = (
    "How it was chosen, by measuring on this machine: SmolLM2-135M-Instruct's greedy replies to chain_sum and "
    "basic_arithmetic are short (12 and 9 tokens on average over 24 problems each) and end with a number, so the "
    "last-number extraction reads them; what fails is the arithmetic: greedy scored 0.08 on chain_sum and 0.50 "
    "on basic_arithmetic, while sampled at temperature 1 (as training samples) the replies ramble and score "
    "0.05 (chain_sum, a probe step at P=4 R=8, 96 tokens) and 0.06 (basic_arithmetic, this setting's first "
    "step, a quarter of its groups holding a correct answer). basic_arithmetic leaves the wider room between "
    "what sampling scores and what the model can already do, so GRPO has something to find in tens of steps; "
    "lr 5e-5 (5x the trainer's default) so that it moves within them; 80 tokens cut 1 of the 48 greedy held-out "
    "replies at step 0 while bounding the rambling ones. The first step took 246 s (rollout 74 s, training "
    "169 s: about 15 trained tokens/s against 100-160 on an idle 2-core machine) under a load average of 15-18 "
    "from other jobs, the runs at nice 19. On an idle machine a step would take some 30-40 s (estimated from those "
    "rates and the engine's 124 tokens/s at 16 rows), a run of 60 steps about the 30-minute budget; here a run "
    "takes hours, and spans sessions.")

CPU_WHY = (
    "How it was chosen, by measuring on this machine: the `cpu-lr5e-5` runs (below: the same task and sizes at "
    "lr 5e-5) showed the trained samples' reward rising from 0.06 to about 0.3 within 8 steps while the greedy "
    "held-out reward did not move beyond its noise (0.229 -> 0.190 after 60 steps of sync, seed 0), and the kept "
    "length collapsing to about 9 tokens under every policy (tail's trained reward fell to 0.025). Training "
    "sharpens the sampled replies towards what greedy decoding already writes (SmolLM2-135M-Instruct's greedy "
    "replies are short and end with a number), so a greedy evaluation cannot show it: the held-out set is also "
    "sampled as trained (--eval-samples 2, fixed seeds). A probe run of sync at lr 2e-5 (reference/train.py with "
    "these flags less --eval-samples, seed 0, 24 steps, median step 49.9 s on the otherwise idle 2-core machine) kept "
    "its length (6-step means of the launched length 28.0, 37.6, 36.1, 25.7 tokens) while its trained reward rose "
    "(6-step means 0.107, 0.255, 0.344, 0.375); its greedy held-out reward read 0.229, 0.312, 0.292, 0.271, 0.250, "
    "0.271, 0.354 at steps 0, 4, ..., 24 (one evaluation's standard error is up to 0.072). Hence lr 2e-5. "
    "A run of 60 steps is about an hour here with its evaluations; six runs span sessions.")

TOST_FLAGS = ("--tasks", "basic_arithmetic:3", "gsm_symbolic:1", "--prompts", "4", "--samples", "8", "--max-tokens",
              "96", "--lr", "2e-5", "--dataset-size", "256", "--eval-every", "5", "--eval-prompts", "40",
              "--eval-samples", "2", "--dtype", "float32")
TOST_WHAT = ("basic_arithmetic and gsm_symbolic 3:1 (arithmetic learns; word problems keep long replies), P=4 R=8, "
             "96 tokens, lr 2e-5, fp32; held-out: 40 prompts (one set for every run), greedy and 2 sampled replies "
             "each, every 5 steps; sync and tail on paired seeds, the pre-registered equivalence test")
TOST_WHY = (
    "How it was chosen, by measuring on this machine (2026-11-28, before any run of the design): the `cpu` "
    "runs' replies shrank to about 10 tokens by step ~20 in 5 of 6 runs (two-term arithmetic alone: a short reply "
    "that ends with the number is the right one), leaving tail batching nothing to reorder. Probes of other tasks: "
    "the default mix at 128 tokens scored 0.003 in its first step, arithmetic and word problems 1:1 0.008 with a "
    "120 s step (too little reward for GRPO, too slow a step); number_sorting "
    "(3-6 numbers to 20) and spell_backward scored no full answer in 32-48 samples (the model cannot sort; it "
    "copies reasoning-gym's formatting rules). Chosen: arithmetic (learns) with word problems at weight 1 in 4 "
    "(gsm_symbolic: replies that run long whatever training does, near-zero reward, so no length term enters "
    "through them either); the reward is the task's own check of the answer, no length term. Pilot "
    "(reference/train.py with these flags less the evaluation, sync, seed 0, 20 steps): kept lengths p10/p50/p90 "
    "8/28/96 tokens over steps 0-4 and 8/17/96 over steps 15-19 (arithmetic 7/22/96 -> 8/11/84, word problems "
    "23/96/96 -> 92/96/96), the trained reward 0.033 -> 0.248 (5-step means); median step 87 s and 74 s on the "
    "2-core machine beside other jobs. 30 steps a run (a run with its evaluations about an hour here), 4 seeds, "
    "sync and tail: about 8 hours of this CPU, spread over sessions.")

SETTINGS = {
    "cpu-tost": Setting(TOST_FLAGS, steps=30, what=TOST_WHAT, why=TOST_WHY, design="tost", seeds=(0, 1, 2, 3),
                        policies=("sync", "tail")),
    "gpu-tost": Setting((*TOST_FLAGS, "--engine-capacity", "128"), steps=30,
                        what=TOST_WHAT + "; on a GPU (its seeds reported apart from the CPU's)", why=TOST_WHY,
                        design="tost", seeds=(0, 1, 2, 3), policies=("sync", "tail")),
    "cpu": Setting(("--tasks", "basic_arithmetic", "--prompts", "4", "--samples", "8", "--max-tokens", "80", "--lr",
                    "2e-5", "--dataset-size", "256", "--eval-every", "4", "--eval-prompts", "48", "--eval-samples", "2",
                    "--dtype", "float32"),
                   steps=60, what="basic_arithmetic (2 terms of 1-2 digits, + and -), P=4 R=8, 80 tokens, lr 2e-5, "
                                  "fp32; held-out: 48 prompts, greedy and 2 sampled replies each, every 4 steps",
                   why=CPU_WHY),
    "cpu-lr5e-5": Setting(("--tasks", "basic_arithmetic", "--prompts", "4", "--samples", "8", "--max-tokens", "80",
                           "--lr", "5e-5", "--dataset-size", "256", "--eval-every", "4", "--eval-prompts", "48",
                           "--dtype", "float32"),
                          steps=60, what="basic_arithmetic (2 terms of 1-2 digits, + and -), P=4 R=8, 80 tokens, lr "
                                         "5e-5, fp32; held-out: 48 prompts, greedy, every 4 steps (the first "
                                         "setting; superseded by `cpu`)",
                          why=CPU_LR5E5_WHY),
    "tiny": Setting(("--preset", "tiny_debug", "--tasks", "chain_sum", "--eval-every", "1", "--eval-prompts", "2",
                     "--eval-samples", "2"),
                    steps=2, what="tiny_debug sizes (CI)"),
}
