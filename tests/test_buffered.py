"""Output delivered buffered: a request whose tokens after the first all arrive within a millisecond of it got its
output flushed at once, not streamed as it was decoded. Its TPOT then measures delivery and its TTFT includes the
decoding, so a latency comparison with such a side must not call TPOT better or worse.

Known answer from real engines: the default suite's one 2-core vLLM CPU server (data/reference/store) delivered 22-75%
of its requests' output at once per level (its API process starved by the engine's), its two 1-core replicas none;
vLLM 0.26 and SGLang 0.5.17 on the H200 none of 9,532 and 11,438 requests. Before, 04 on the embedded engine said
"TPOT +2123.6% (90% CI +11.3..+44328.9%), higher" for the replicas."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from servescope import nb
from servescope.load.metrics import buffered
from servescope.store import Store
from servescope.suite import load_suite
from servescope.threads import graph_modes as t02
from servescope.threads import parallelism as t04

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "data" / "reference"


def test_a_request_whose_output_came_at_once_is_buffered():
    df = pd.DataFrame({"output_tokens": [64, 64, 1, 64], "ttft_ms": [300.0, 300.0, 300.0, 20.0],
                       "e2e_ms": [300.4, 300.0, 300.0, 400.0]})
    assert buffered(df).tolist() == [True, True, False, False]  # one token has nothing after it to buffer


def _ctx(suite: str, store: Path, tmp: Path):
    s = load_suite(ROOT / "data" / "suites" / f"{suite}.yaml")
    shutil.copytree(store, tmp / "store")
    return nb.context(s.engine, s.model, s.load, repetitions=3, max_repetitions=4, store_dir=str(tmp / "store"),
                      offline=True, telemetry=s.telemetry)


def test_the_cpu_engines_one_server_delivered_buffered_and_04_does_not_compare_its_tpot(tmp_path):
    ps = t04.run(_ctx("default", REFERENCE / "store", tmp_path), routes=("round_robin",))
    one, two = ps.study.buffered_share("1 server"), ps.study.buffered_share("2 replicas, round-robin")
    assert one > 0.3 and two == 0
    table = ps.table()  # the page's layout table says it beside TTFT and TPOT
    assert (table[table["config"] == "1 server"]["buffered_pct"] > 10).all()
    assert (table[table["config"] == "2 replicas, round-robin"]["buffered_pct"] == 0).all()
    (f,) = [f for f in t04.findings(ps) if f.title.startswith("2 replicas, round-robin vs 1 server")]
    assert (f"TPOT not compared: the output after the first token came at once, within 1 ms of it, for {100 * one:.0f}% "
            "of the requests on 1 server (the server delivered it buffered, not as it decoded)") in f.claim
    assert "TPOT +" not in f.claim and "TPOT -" not in f.claim


@pytest.mark.parametrize("ref", ["vllm-h200", "sglang-h200"])
def test_gpu_engines_streamed_every_request_and_their_tables_have_no_buffered_column(ref, tmp_path):
    store = Store(REFERENCE / ref / "store")
    requests = [pt.table("requests") for pt in store.points()]
    r = pd.concat([x for x in requests if len(x)])
    r = r[(r["phase"] == "measure") & (r["status"] == "ok")]
    assert len(r) > 9000 and not buffered(r).any()
    gs = t02.run(_ctx(ref, REFERENCE / ref / "store", tmp_path), ceiling=False)
    assert "buffered_pct" not in gs.study.table()
    cmp = gs.study.compare("off", "piecewise", ("cuda_graph",))
    assert cmp.buffered_words() == ""
