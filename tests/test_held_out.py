"""The held-out set of --eval-every: one set for every --seed and --policy of the same tasks, no
question twice, none trained (the run's training rows leave its questions out), each prompt's score
and a few replies kept; sampled as the run samples (--temperature, --top-p).  Checked on the rows,
then through the reference trainer's real path (Session: the real embedded engines, reward workers
and trainer on the tiny model)."""

from __future__ import annotations

import contextlib
import io

import pytest

from rollpacker.train.evaluation import held_out_rows, set_id
from rollpacker.train.prompts import question, without_held_out

FLAGS = ("--preset", "tiny_debug", "--trainer", "torch", "--tasks", "chain_sum", "--dataset-size", "64",
         "--eval-every", "1", "--eval-prompts", "8", "--eval-samples", "2", "--temperature", "0.7", "--top-p", "0.9")


def questions(rows) -> list[str]:
    return [question(row) for row in rows]


def test_the_held_out_set_is_distinct_fixed_and_left_out_of_any_training_rows():
    from rollpacker.backends.data.tasks import make_problems, rows_from_problems

    held = held_out_rows(["basic_arithmetic"], 48)
    assert len(held) == 48 and len(set(questions(held))) == 48  # the task repeats problems: no question twice
    assert questions(held) == questions(held_out_rows(["basic_arithmetic"], 48)) and set_id(held) == set_id(
        held_out_rows(["basic_arithmetic"], 48))
    for seed in (0, 1):  # 2000 problems of 1-2 digit sums repeat some of the held-out ones
        rows = rows_from_problems(make_problems(["basic_arithmetic"], size=2000, seed=seed))
        kept = without_held_out(rows, held)
        asked = [q for q in questions(rows) if q in set(questions(held))]
        assert asked and len(kept) == len(rows) - len(asked)
        assert not set(questions(kept)) & set(questions(held))
        assert questions(kept) == [q for q in questions(rows) if q not in set(questions(held))]  # order kept
    assert set_id(held[:47]) != set_id(held) != set_id(held[::-1])


@pytest.fixture(scope="module")
def sessions(tmp_path_factory):
    """The run's Session for seeds 0 and 1 (built, not stepped), with the first evaluation of each."""
    from rollpacker.backends.models import tiny_random_llama
    from rollpacker.train.config import parse
    from rollpacker.train.outputs import RunDir
    from rollpacker.train.session import Session

    out = {}
    for seed in (0, 1):
        config = parse([*FLAGS, "--model", str(tiny_random_llama()), "--seed", str(seed), "--out",
                        str(tmp_path_factory.mktemp("held") / "run")])
        config.validate()
        said = io.StringIO()
        with contextlib.redirect_stdout(said):
            session = Session(config, RunDir(config.out))
        submitted = []
        submit = session.evaluator.engine.submit  # the real engine, its requests seen on the way in
        session.evaluator.engine.submit = lambda requests: (submitted.extend(requests), submit(requests))[1]
        try:
            out[seed] = (session, session.evaluate_if_due(), submitted, config.load_rows(), said.getvalue())
        except BaseException:
            session.close()
            raise
    yield out
    for session, *_ in out.values():
        session.close()


@pytest.mark.timeout(300)
def test_every_seed_is_scored_on_one_set_that_it_does_not_train(sessions):
    held = {seed: questions(session.evaluator.prompts.rows) for seed, (session, *_) in sessions.items()}
    assert held[0] == held[1] and len(set(held[0])) == len(held[0]) == 8
    left_out = []
    for seed, (session, record, _, all_rows, said) in sessions.items():
        trained = questions(session.prompts.rows)
        assert not set(trained) & set(held[seed])
        assert trained == [q for q in questions(all_rows) if q not in set(held[seed])]
        left_out.append(len(all_rows) - len(trained))
        assert (f"held-out set: 8 problems (the same for every --seed and --policy of these tasks); {left_out[-1]} of "
                f"the 64 training problems ask one of them and are left out") in said
        assert record["eval_set"] == sessions[0][1]["eval_set"]
    assert left_out == [1, 0]  # seed 0's 64 problems ask one held-out question: not trained, and said


@pytest.mark.timeout(300)
def test_an_evaluation_keeps_each_prompt_s_scores_and_samples_as_the_run_samples(sessions):
    session, record, submitted, *_ = sessions[0]
    assert record["step"] == 0 and len(record["eval_scores"]) == 8
    assert sum(record["eval_scores"]) / 8 == pytest.approx(record["eval_reward"])
    scores = record["eval_sampled_scores"]
    assert len(scores) == 8 and all(len(s) == 2 for s in scores)
    assert sum(map(sum, scores)) / 16 == pytest.approx(record["eval_sampled_reward"])
    assert [r["prompt"] for r in record["eval_replies"]] == [0, 1, 2]
    assert all(isinstance(r["greedy"], str) and isinstance(r["sampled"], str) for r in record["eval_replies"])
    greedy = [r for r in submitted if r.temperature == 0.0]
    sampled = [r for r in submitted if r.temperature != 0.0]
    assert len(greedy) == 8 and len(sampled) == 16
    assert {(r.temperature, r.top_p) for r in sampled} == {(0.7, 0.9)}  # --temperature and --top-p reach it
