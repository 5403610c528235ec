"""TRL's GRPOTrainer with rollpacker's tail batching, on CPU, in a few steps.

The only lines that differ from a plain TRL GRPO script are the import and the trainer's class
with its `rollout=`: the step's rollout runs on rollpacker's embedded engine (TRL's weights synced
to it every step), launches 1.25x the step's prompts with 1.25x their responses, trains the first P
prompts to finish (the first R responses of each) and defers the rest to a long round.

    .venv/bin/python examples/trl_grpo_tail.py --steps 4          # the default model, SmolLM2-135M
    .venv/bin/python examples/trl_grpo_tail.py --policy sync      # TRL's own schedule, on our engine
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model is local: nothing downloads
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in trl 1.16

from trl import GRPOConfig  # noqa: E402

from rollpacker.backends.models import default_model_dir  # noqa: E402
from rollpacker.integrations.trl import RollpackerGRPOTrainer, RolloutSettings  # noqa: E402
from rollpacker.integrations.trl.tasks import reasoning_dataset, task_reward  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--policy", default="tail", help="sync, oversample, tail or sorted")
    parser.add_argument("--model", default=None, help="a local HF model directory (default: SmolLM2-135M-Instruct)")
    opts = parser.parse_args()
    args = GRPOConfig(output_dir="runs/trl-grpo-tail", per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=128, max_steps=opts.steps, learning_rate=1e-6, bf16=False, use_cpu=True,
                      logging_steps=1, report_to=[], save_strategy="no")
    trainer = RollpackerGRPOTrainer(opts.model or str(default_model_dir()), task_reward, args,
                                    reasoning_dataset(size=8 * opts.steps),
                                    rollout=RolloutSettings(policy=opts.policy))
    trainer.train()
    for played in trainer.rollpacker.rounds:
        report = played.report
        print(f"{played.kind:6} round: {played.seconds:5.1f} s, trained {report.trained_prompts} prompts, "
              f"deferred {report.deferred_prompts}, mean kept length {report.mean_kept_length:.0f}")
    trainer.close_rollout()


if __name__ == "__main__":
    main()
