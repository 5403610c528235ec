"""The embedded engine with real models: greedy output equals transformers' `generate`, abort
returns exactly the streamed prefix, requests join mid-flight, weight updates change outputs, and
bad input fails before any generation."""

from __future__ import annotations

import json
import time
import warnings

import pytest
import torch
from devices import DEVICES

from rollpacker.backends.embedded.engine import EmbeddedEngine, UnknownRequest
from rollpacker.backends.models import ModelError, load_model, resolve_model, tiny_random_llama
from rollpacker.backends.errors import BackendMisuse
from rollpacker.core.errors import ConfigError, SchedulerMisuse
from rollpacker.core.protocols import GenerationProgress, GenerationRequest, GenerationResult, RolloutEngine

Req = GenerationRequest


@pytest.fixture(scope="module")
def tiny():
    model, tokenizer = load_model(tiny_random_llama())
    return model, tokenizer


def run_all(engine, requests, timeout=120.0):
    """Submit and poll until every request has its result; returns (results by id, events)."""
    engine.submit(requests)
    results, events, end = {}, [], time.monotonic() + timeout
    while len(results) < len(requests):
        assert time.monotonic() < end, "engine did not finish in time"
        for e in engine.poll(0.5):
            events.append(e)
            if isinstance(e, GenerationResult):
                assert e.request_id not in results, "exactly one result per request"
                results[e.request_id] = e
    return results, events


def prompt_ids(tokenizer, text):
    return tuple(tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("spec_max_rows", [0, 2])
def test_greedy_equals_transformers_generate_on_default_model(spec_max_rows, device):
    model, tokenizer = load_model(None, device=device)
    texts = ["What is 2+3?", "Name three colors of the rainbow, please.", "Write a haiku about the sea at night."]
    prompts = [prompt_ids(tokenizer, t) for t in texts]
    expected = []
    for p in prompts:
        with torch.inference_mode():
            out = model.generate(torch.tensor([p], device=device), max_new_tokens=24, do_sample=False,
                                 output_logits=True, return_dict_in_generate=True)
        ids = out.sequences[0, len(p):].tolist()
        lps = [torch.log_softmax(lg[0].float(), -1)[t].item() for lg, t in zip(out.logits, ids)]
        expected.append((ids, lps))
    # capacity 2: later requests join the batch only when a row frees up; each prompt runs twice
    # (siblings of one group, not at the same time), so the second run can draft from the first
    requests = [Req(f"g{i}{k}", p, 24, temperature=0.0, group=f"p{i}") for k in "ab" for i, p in enumerate(prompts)]
    with EmbeddedEngine(model, capacity=2, spec_max_rows=spec_max_rows, spec_tokens=4) as engine:
        assert isinstance(engine, RolloutEngine)
        results, _ = run_all(engine, requests)
        stats = engine.speculation_stats
        stops = engine.stop_token_ids  # the model's EOS ids (its generation config may name several)
    for i, (ids, lps) in enumerate(expected):
        for k in "ab":
            r = results[f"g{i}{k}"]
            assert list(r.token_ids) == ids, f"prompt {i}: {tokenizer.decode(r.token_ids)!r} vs {tokenizer.decode(ids)!r}"
            assert r.finish_reason == ("stop" if ids[-1] in stops else "length")
            assert r.logprobs == pytest.approx(lps, abs=1e-3)
    if spec_max_rows:
        assert stats.num_accepted > 0 and stats.accepted_per_verify > 0
    else:
        assert stats.num_verify_steps == 0


@pytest.mark.timeout(120)
def test_abort_returns_exactly_the_streamed_prefix(tiny):
    model, tokenizer = tiny
    prompt = prompt_ids(tokenizer, "Tell me a long story.")
    with EmbeddedEngine(model, capacity=4, progress_every=1, stop_token_ids=()) as engine:
        engine.submit([Req("a", prompt, 400, temperature=1.0, seed=7)])
        seen = 0
        while seen < 5:
            for e in engine.poll(5.0):
                assert isinstance(e, GenerationProgress)
                seen = max(seen, e.num_tokens)
        engine.abort(["a"])
        aborted = None
        while aborted is None:
            for e in engine.poll(5.0):
                if isinstance(e, GenerationResult):
                    aborted = e
                else:
                    seen = max(seen, e.num_tokens)
        assert aborted.finish_reason == "abort"
        assert seen <= len(aborted.token_ids) < 400
        assert len(aborted.logprobs) == len(aborted.token_ids)
        engine.abort(["a"])  # already finished: a harmless race, no second result
        assert engine.poll(0.2) == []
        # the same seeded request, run to the end, starts with exactly the aborted tokens
        full, _ = run_all(engine, [Req("b", prompt, len(aborted.token_ids) + 10, temperature=1.0, seed=7)])
    b = full["b"]
    assert b.token_ids[: len(aborted.token_ids)] == aborted.token_ids
    assert b.logprobs[: len(aborted.logprobs)] == pytest.approx(aborted.logprobs, abs=1e-5)
    assert b.finish_reason == "length" and len(b.token_ids) == len(aborted.token_ids) + 10


@pytest.mark.timeout(120)
def test_requests_join_mid_flight_and_waiting_ones_abort(tiny):
    model, tokenizer = tiny
    p = prompt_ids(tokenizer, "Count to one hundred.")
    with EmbeddedEngine(model, capacity=3, progress_every=4, stop_token_ids=()) as engine:
        engine.submit([Req("long1", p, 150, seed=1), Req("long2", p[:-3], 150, seed=2)])
        progressed = set()
        while progressed != {"long1", "long2"}:
            progressed |= {e.request_id for e in engine.poll(5.0) if isinstance(e, GenerationProgress)}
        # one free slot: "short" joins the running batch; "queued" waits for a slot, then is aborted
        engine.submit([Req("short", p, 5, seed=3), Req("queued", p, 5, seed=4), Req("late", p, 3, seed=5)])
        engine.abort(["queued"])
        order, results = [], {}
        while len(results) < 5:
            for e in engine.poll(5.0):
                if isinstance(e, GenerationResult):
                    order.append(e.request_id)
                    results[e.request_id] = e
    assert results["queued"].finish_reason == "abort" and results["queued"].token_ids == ()
    assert len(results["short"].token_ids) == 5 and results["short"].finish_reason == "length"
    # both short requests finished while the long ones were still running
    assert order.index("short") < order.index("long1") and order.index("late") < order.index("long2")
    assert all(len(results[r].token_ids) == 150 for r in ("long1", "long2"))


@pytest.mark.timeout(120)
def test_weight_update_changes_outputs_and_version(tiny, tmp_path):
    model, tokenizer = tiny
    p = prompt_ids(tokenizer, "Hello!")
    original = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        with EmbeddedEngine(model, capacity=2, stop_token_ids=()) as engine:
            before, _ = run_all(engine, [Req("x0", p, 12, temperature=0.0)])
            gen = torch.Generator().manual_seed(0)
            noisy = {k: v + 0.5 * torch.randn(v.shape, generator=gen) for k, v in original.items()
                     if k.endswith("mlp.down_proj.weight") or k.endswith("o_proj.weight")}
            engine.pause()
            engine.update_weights(noisy, version=1)
            engine.resume()
            after, _ = run_all(engine, [Req("x1", p, 12, temperature=0.0)])
            assert engine.weight_version == 1
            # back to the original weights from a safetensors directory
            from safetensors.torch import save_file
            save_file({k: v.contiguous() for k, v in original.items() if k != "lm_head.weight"},
                      str(tmp_path / "model.safetensors"))
            engine.update_weights(tmp_path, version=2)
            restored, _ = run_all(engine, [Req("x2", p, 12, temperature=0.0)])
            with pytest.raises(ConfigError, match="not in the model"):
                engine.update_weights({"no.such.weight": torch.zeros(1)}, version=3)
            with pytest.raises(ConfigError, match="shape"):
                engine.update_weights({"model.norm.weight": torch.zeros(3)}, version=3)
            assert engine.weight_version == 2
    finally:
        model.load_state_dict(original)
    assert before["x0"].weight_version == 0 and after["x1"].weight_version == 1
    assert after["x1"].token_ids != before["x0"].token_ids
    assert restored["x2"].token_ids == before["x0"].token_ids and restored["x2"].weight_version == 2


@pytest.mark.timeout(120)
def test_resume_ids_pause_and_close(tiny):
    model, tokenizer = tiny
    p = prompt_ids(tokenizer, "Go on.")
    engine = EmbeddedEngine(model, capacity=2, stop_token_ids=())
    try:
        whole, _ = run_all(engine, [Req("w", p, 10, temperature=0.0)])
        w = whole["w"].token_ids
        # continuing after 4 resumed tokens gives the remaining 6, and only those
        rest, _ = run_all(engine, [Req("r", p, 6, temperature=0.0, resume_ids=w[:4])])
        assert rest["r"].token_ids == w[4:]
        engine.pause()
        engine.submit([Req("p", p, 50)])
        t = time.monotonic()
        assert engine.poll(0.3) == []  # paused: nothing runs, and poll honours its timeout
        assert time.monotonic() - t < 10  # honours its timeout: a paused engine does not block poll
        engine.resume()
        engine.submit([Req("c", p, 10_000)])
        while not any(isinstance(e, GenerationResult) and e.request_id == "p" for e in engine.poll(5.0)):
            pass
    finally:
        engine.close()
    # close ends whatever still runs as aborted, with the tokens it had
    left = engine.poll(1.0)
    assert [(e.request_id, e.finish_reason) for e in left if isinstance(e, GenerationResult)] == [("c", "abort")]
    assert engine.poll(None) == []  # nothing in flight: returns at once
    with pytest.raises(BackendMisuse, match="closed"):
        engine.submit([Req("z", p, 1)])


@pytest.mark.timeout(120)
def test_sampling_top_p_and_logprobs(tiny):
    model, tokenizer = tiny
    p = prompt_ids(tokenizer, "Pick a word.")
    with EmbeddedEngine(model, capacity=4, stop_token_ids=()) as engine:
        res, _ = run_all(engine, [Req("s1", p, 20, temperature=1.0, top_p=0.9, seed=11),
                                  Req("s2", p, 20, temperature=1.0, top_p=0.9, seed=11),
                                  Req("s3", p, 20, temperature=0.7, top_p=1e-6, seed=12),
                                  Req("g", p, 20, temperature=0.0)])
    assert res["s1"].token_ids == res["s2"].token_ids  # same seed, same tokens
    assert res["s3"].token_ids == res["g"].token_ids  # a tiny nucleus is greedy
    for r in res.values():
        assert len(r.logprobs) == len(r.token_ids) == 20 and all(lp <= 1e-6 for lp in r.logprobs)


@pytest.mark.timeout(120)
def test_ignore_eos_runs_a_request_past_the_engines_stop_token_to_its_length(tiny):
    """The engine's stop tokens end a request unless it asks `ignore_eos`; its own stop_token_ids still do."""
    model, tokenizer = tiny
    p = prompt_ids(tokenizer, "Count.")
    with EmbeddedEngine(model, capacity=4, stop_token_ids=()) as engine:
        free, _ = run_all(engine, [Req("g", p, 24, temperature=0.0)])
    stop = free["g"].token_ids[5]  # a token the greedy reply meets: taken as the engine's EOS below
    end = free["g"].token_ids.index(stop) + 1
    with EmbeddedEngine(model, capacity=4, stop_token_ids=(stop,)) as engine:
        res, _ = run_all(engine, [Req("eos", p, 24, temperature=0.0),
                                  Req("ignored", p, 24, temperature=0.0, ignore_eos=True),
                                  Req("own", p, 24, temperature=0.0, ignore_eos=True, stop_token_ids=(stop,))])
    assert res["eos"].token_ids == free["g"].token_ids[:end] and res["eos"].finish_reason == "stop"
    assert res["ignored"].token_ids == free["g"].token_ids and res["ignored"].finish_reason == "length"
    assert res["own"].token_ids == free["g"].token_ids[:end] and res["own"].finish_reason == "stop"


@pytest.mark.timeout(60)
def test_bad_input_fails_before_generation(tiny, tmp_path):
    model, tokenizer = tiny
    with EmbeddedEngine(model, capacity=2) as engine:
        too_long = (5,) * model.config.max_position_embeddings
        with pytest.raises(ConfigError, match="context"):
            engine.submit([Req("ok", (5, 6), 4), Req("long", too_long, 4)])
        with pytest.raises(ConfigError, match="vocabulary"):
            engine.submit([Req("v", (5, 10**9), 4)])
        with pytest.raises(BackendMisuse, match="duplicate"):
            engine.submit([Req("d", (5, 6), 4), Req("d", (5, 6), 4)])
        with pytest.raises(UnknownRequest, match="nope") as info:
            engine.abort(["nope"])
        assert isinstance(info.value, BackendMisuse) and not isinstance(info.value, SchedulerMisuse)
        assert engine.poll(0.2) == []  # nothing of the rejected batches ran
    with pytest.raises(ValueError):
        Req("m", (5,), 0)  # max_new_tokens < 1
    with pytest.raises(ModelError, match="does not exist"):
        resolve_model(tmp_path / "missing")
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text(json.dumps({"architectures": ["BertModel"]}))
    with pytest.raises(ModelError, match="not a causal LM"):
        EmbeddedEngine(tmp_path / "bert")
    with pytest.raises(ConfigError, match="capacity"):
        EmbeddedEngine(model, capacity=0)


@pytest.mark.timeout(180)
def test_default_model_converts_once_from_the_gguf(tmp_path, monkeypatch):
    from rollpacker.backends.models import default_gguf_path, default_model_dir

    monkeypatch.setenv("ROLLPACKER_CACHE", str(tmp_path))
    assert default_gguf_path().suffix == ".gguf"
    first = default_model_dir()
    assert first.parent == tmp_path / "models" and (first / "config.json").is_file()
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert default_model_dir() == first  # reused, not rebuilt (the file below is not rewritten)
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp
    config = json.loads((first / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    assert resolve_model(None) == first


@pytest.mark.timeout(120)
def test_slot_cache_allocated_once_and_rows_move_without_changing_outputs(tiny):
    """With the row length known up front the cache never grows; a row moved into a freed slot
    (the engine's compaction) decodes exactly as if it had stayed."""
    from rollpacker.backends.embedded.runner import Runner

    model, _ = tiny
    prompts = [[5, 6, 7, 8, 9], [11, 12, 13]]

    def greedy(runner, rows, steps, drop_first_after=None):
        toks = [[int(t)] for t in runner.prefill(0, [prompts[r] for r in rows]).argmax(-1)]
        for step in range(steps):
            if step == drop_first_after:  # row 0 leaves: the last row moves into its slot
                runner.move(len(rows) - 1, 0, len(prompts[rows[-1]]) + len(toks[-1]) - 1)
                rows, toks = rows[1:], toks[1:]
            lens = [len(prompts[r]) + len(t) - 1 for r, t in zip(rows, toks)]
            out = runner.decode(torch.tensor([[t[-1]] for t in toks]), lens)[:, 0].argmax(-1)
            for t, x in zip(toks, out.tolist()):
                t.append(x)
        return toks

    # col_multiple 256 (CUDA's): each decode's columns round up to 256, past the planned 40
    fixed = Runner(model, 0, capacity=2, cols_per_slot=40, col_multiple=256)
    moved = greedy(fixed, [0, 1], 30, drop_first_after=10)
    assert fixed.cache.length == 40  # the memory plan's size exactly, allocated once, never grown
    alone = greedy(Runner(model, 0, capacity=2), [1], 30)
    assert moved == alone
    with pytest.raises(ValueError, match="a row needs 41 KV cache columns but the cache holds 40 per row"):
        fixed.decode(torch.tensor([[1]]), [40])
    assert fixed.cache.length == 40


@pytest.mark.timeout(120)
def test_a_prompt_met_again_in_one_prefill_is_computed_once_and_each_slot_decodes_as_if_alone(tiny):
    """A group's samples share their prompt and are admitted together: the prefill computes each
    distinct prompt once (torch's FLOP counter: the FLOPs of the distinct prompts alone) and copies
    its cache to the other slots, so at every step of a greedy continuation each row's logits are
    those it gets prefilled by itself."""
    from torch.utils.flop_counter import FlopCounterMode

    from rollpacker.backends.embedded.runner import Runner

    model, _ = tiny
    a, b = [5, 6, 7, 8, 9], [11, 12, 13]
    prompts = [a, a, b, a, b]  # b is computed into slot 1, which row 1 (a) takes only once row 2 has it

    def greedy(prompts, steps=12):
        """The prefill's FLOPs, and each row's logits at every step: the prefill's, then each decode's."""
        runner = Runner(model, 0, capacity=len(prompts))
        counter = FlopCounterMode(display=False)
        with counter:
            logits = [runner.prefill(0, prompts)]
        toks = [[int(t)] for t in logits[0].argmax(-1)]
        for _ in range(steps):
            lens = [len(p) + len(t) - 1 for p, t in zip(prompts, toks)]
            logits.append(runner.decode(torch.tensor([[t[-1]] for t in toks]), lens)[:, 0])
            for t, x in zip(toks, logits[-1].argmax(-1).tolist()):
                t.append(x)
        return torch.stack(logits, 1), counter.get_total_flops()

    rows, flops = greedy(prompts)
    (alone_a,), _ = greedy([a])
    (alone_b,), _ = greedy([b])
    assert flops == greedy([a, b])[1]  # the two distinct prompts, not five
    for row, alone in zip(rows, [alone_a, alone_a, alone_b, alone_a, alone_b]):
        assert torch.allclose(row, alone, atol=1e-5)  # prefill and every decode step, as if alone


def test_speculation_default_is_off_on_cpu_and_explicit_values_hold(tiny):
    """Measured no faster on CPU (benchmarks/spec_decode.py), so off there unless asked for."""
    model, _ = tiny
    with EmbeddedEngine(model, capacity=4) as engine:
        assert engine._speculator.max_rows == 0
    with EmbeddedEngine(model, capacity=4, spec_max_rows=3) as engine:
        assert engine._speculator.max_rows == 3
    with pytest.raises(ConfigError, match="spec_max_rows"):
        EmbeddedEngine(model, capacity=4, spec_max_rows=-1)


@pytest.mark.gpu
def test_speculation_default_is_on_in_the_tail_on_cuda(tiny):
    from rollpacker.backends.embedded.speculation import SPEC_MAX_ROWS_CUDA

    model, _ = load_model(tiny_random_llama(), device="cuda")
    with EmbeddedEngine(model, capacity=4) as engine:
        assert engine._speculator.max_rows == SPEC_MAX_ROWS_CUDA


@pytest.mark.timeout(120)
def test_engine_forwards_make_no_future_warning(tiny):
    """transformers deprecates `past_key_values` for `cache` (a FutureWarning at every forward that
    uses the old name, printed before each step of a run): prefill, decode and speculative verify
    pass the KV cache by the name the model's forward takes."""
    model, tokenizer = tiny
    prompt = prompt_ids(tokenizer, "Count to twenty.")
    with warnings.catch_warnings(record=True) as caught:  # the engine's thread reports here too
        warnings.simplefilter("always")
        with EmbeddedEngine(model, capacity=2, spec_max_rows=2, spec_tokens=2) as engine:
            results, _ = run_all(engine, [Req(f"r{k}", prompt, 12, temperature=0.0, group="p") for k in range(3)])
    assert all(len(r.token_ids) == 12 or r.finish_reason == "stop" for r in results.values())
    assert [str(w.message) for w in caught if issubclass(w.category, FutureWarning)] == []


def test_a_conversion_that_loses_the_race_leaves_no_copy_behind(tiny, tmp_path):
    """Two runs that convert the default model at once: the second finds the directory taken and
    removes its own temporary copy (half a gigabyte for the default model), keeping the first."""
    from rollpacker.backends.models import is_converted, save_once

    model, tokenizer = tiny
    target = tmp_path / "models" / "m"
    assert save_once(model, tokenizer, target) == target and is_converted(target)
    stamp = (target / "model.safetensors").stat().st_mtime_ns
    assert save_once(model, tokenizer, target) == target
    assert [p.name for p in target.parent.iterdir()] == ["m"]
    assert (target / "model.safetensors").stat().st_mtime_ns == stamp
