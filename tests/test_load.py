"""Load generator against the stub: records, timings, failures recorded not raised, summary figures."""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from conftest import stub_command
from servescope.load import random_prompts, run_level, run_sweep, summarize
from servescope.server import ManagedServer, ReadyCheck, free_port
from servescope.spec import LoadSpec


@pytest.fixture
def stub(tmp_path, request):
    args = getattr(request, "param", ())
    port = free_port()
    with ManagedServer(command=stub_command(port, *args), port=port, log_dir=tmp_path, model="stub",
                       ready=ReadyCheck(poll_interval_s=0.1)) as srv:
        yield srv


@pytest.mark.parametrize("stub", [("--ttft-ms", "60", "--itl-ms", "5")], indirect=True)
@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_records_timings_from_stream(stub, endpoint):
    load = LoadSpec(concurrency=(2,), num_requests=4, output_len=10, endpoint=endpoint, warmup_requests=1)
    prompts = random_prompts(None, 4, 8, 10, seed=0)
    recs = run_level(stub.base_url, "stub", load, 2, prompts, prompts[:1], progress=False)
    measured = [r for r in recs if r.phase == "measure"]
    assert len(measured) == 4 and sum(r.phase == "warmup" for r in recs) == 1
    for r in measured:
        assert r.status == "ok", r.error
        assert r.ttft_ms >= 55
        assert len(r.itl_ms) == 9 and np.median(r.itl_ms) >= 4
        assert r.output_tokens == 10 and r.input_tokens == 8
        assert r.e2e_ms >= r.ttft_ms + 9 * 4


@pytest.mark.parametrize("stub", [("--fail-every", "3",)], indirect=True)
def test_failures_are_recorded_not_raised(stub):
    load = LoadSpec(concurrency=(1, 3), num_requests=6, output_len=4, warmup_requests=0)
    df = run_sweep(stub.base_url, "stub", load, None, progress=False)
    assert len(df) == 12
    bad = df[df["status"] == "error"]
    assert len(bad) == 4 and bad["error"].str.contains("HTTP 500").all()
    s = summarize(df)
    assert list(s["concurrency"]) == [1, 3]
    assert s["completed"].sum() == 8 and s["failed"].sum() == 4


def test_unreachable_server_is_an_error_record():
    load = LoadSpec(concurrency=(1,), num_requests=2, warmup_requests=0, request_timeout_s=2)
    recs = run_level(f"http://127.0.0.1:{free_port()}", "m", load, 1, random_prompts(None, 2, 4, 4, 0), progress=False)
    assert [r.status for r in recs] == ["error", "error"]
    assert all("Connect" in r.error or "connect" in r.error for r in recs)


def test_summary_arithmetic():
    import pandas as pd

    rows = [dict(phase="measure", concurrency=1, status="ok", start_unix=100.0 + i, e2e_ms=1000.0, ttft_ms=100.0 * (i + 1),
                 itl_ms=[10.0, 20.0], input_tokens=5, output_tokens=3) for i in range(3)]
    rows.append(dict(phase="warmup", concurrency=1, status="ok", start_unix=90.0, e2e_ms=1.0, ttft_ms=1.0, itl_ms=[],
                     input_tokens=5, output_tokens=3))
    s = summarize(pd.DataFrame(rows)).iloc[0]
    assert s["completed"] == 3 and s["duration_s"] == pytest.approx(3.0)
    assert s["output_tok_s"] == pytest.approx(9 / 3.0)
    assert s["total_tok_s"] == pytest.approx(24 / 3.0)
    assert s["ttft_ms_p50"] == pytest.approx(200.0)
    assert s["tpot_ms_mean"] == pytest.approx(np.mean([(1000 - 100 * (i + 1)) / 2 for i in range(3)]))
    assert s["itl_ms_p50"] == pytest.approx(15.0)


def _tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 20 + ["kernels launch on the GPU"] * 20,
                            trainer=trainer)
    return tok


@pytest.mark.parametrize("n_tokens", [1, 7, 64, 300])
def test_random_prompts_have_exact_token_length(n_tokens):
    tok = _tokenizer()
    prompts = random_prompts(tok, 5, n_tokens, 16, seed=1)
    assert all(p.exact for p in prompts)
    for p in prompts:
        assert len(tok.encode(p.text, add_special_tokens=False).ids) == n_tokens
        assert "<|endoftext|>" not in p.text
    assert prompts == random_prompts(tok, 5, n_tokens, 16, seed=1)  # seeded
    assert prompts != random_prompts(tok, 5, n_tokens, 16, seed=2)


@pytest.mark.parametrize("stub", [()], indirect=True)
def test_runs_inside_a_running_event_loop(stub):
    """Jupyter runs cells inside an event loop; the load must still run there."""
    import asyncio

    load = LoadSpec(concurrency=(2,), num_requests=3, output_len=4, warmup_requests=0)

    async def cell():
        return run_sweep(stub.base_url, "stub", load, None, progress=False)

    df = asyncio.run(cell())
    assert (df["status"] == "ok").all() and len(df) == 3
