"""What the core decides reaches the real engine through its commands: each request is sampled with
the seed of its `LaunchRequest` (the core's `sampling_seed` of the run seed and the request number),
so the R samples of a GRPO group differ, and a rerun with the same seed samples the same answers;
the run's --temperature and --top-p reach every request.
The real embedded engine and trainer on the tiny model, one sync step of 2 groups of 4."""

from __future__ import annotations

from collections import defaultdict

import pytest
from test_colocate import Prompts
from test_train_worker import ParityRewards

from rollpacker.backends.embedded.engine import EmbeddedEngine
from rollpacker.backends.models import load_model, tiny_random_llama
from rollpacker.backends.trainer.pytorch import TorchTrainer, TorchTrainerConfig
from rollpacker.core import BatcherConfig, Scheduler, make_policy
from rollpacker.core.records import request_number, sampling_seed
from rollpacker.driver import LoopConfig, StepLoop

RUN_SEED = 7
R = 4
TEMPERATURE, TOP_P = 0.8, 0.95


def one_step(run_seed: int) -> tuple[dict[str, int], list]:
    """(each launch command's seed by request id, the step's timeline) of one real step."""
    tiny = tiny_random_llama()
    model, _ = load_model(tiny)
    engine = EmbeddedEngine(model, capacity=2 * R, stop_token_ids=())
    trainer = TorchTrainer(TorchTrainerConfig(model_dir=str(tiny), lr=1e-3, seed=0, device="cpu"))
    sched = Scheduler(make_policy("sync", prompts=2, samples=R, max_tokens=8), num_prompts=4, seed=run_seed,
                      batcher=BatcherConfig(token_budget=1))
    loop = StepLoop(sched, engine, ParityRewards(), trainer, Prompts(), LoopConfig(temperature=TEMPERATURE, top_p=TOP_P))
    commanded: dict[str, int] = {}
    launch = loop.live.launch

    def launch_watched(commands):  # the test notes what the core commanded; the backend runs as ever
        commanded.update({c.request_id: c.seed for c in commands})
        launch(commands)

    loop.live.launch = launch_watched
    try:
        loop.run_step()
    finally:
        loop.close()
        engine.close()
    return commanded, loop.last_timeline


@pytest.mark.timeout(600)
def test_each_request_samples_with_its_commands_seed_so_a_groups_answers_differ():
    commanded, timeline = one_step(RUN_SEED)
    assert len(timeline) == 2 * R
    assert {i.request_id: i.request.seed for i in timeline} == commanded, "the engine got the command's seed"
    assert {(i.request.temperature, i.request.top_p) for i in timeline} == {(TEMPERATURE, TOP_P)}, "the run's sampling"
    assert commanded == {rid: sampling_seed(RUN_SEED, request_number(rid)) for rid in commanded}
    groups: dict[int, list] = defaultdict(list)
    for i in timeline:
        groups[i.prompt].append(tuple(i.token_ids))
    assert len(groups) == 2
    for prompt, answers in groups.items():
        assert len(answers) == R and all(len(a) == 8 for a in answers)
        assert len(set(answers)) == R, f"prompt {prompt}: {len(set(answers))} distinct answers of {R}"

    again, rerun = one_step(RUN_SEED)
    assert again == commanded
    assert [tuple(i.token_ids) for i in rerun] == [tuple(i.token_ids) for i in timeline], "same seed, same answers"
