"""Engine adapters against the real published sources of SGLang 0.4.10, 0.5.9, 0.5.23, vLLM 0.32 and transformers
5.17: flags, knob translation, the graph-disable audit; and the SGLang HTTP paths against its protocol stub."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from servescope.engines import engine_names, get_engine
from servescope.engines.audit import find_rules, graph_disable_audit
from servescope.engines.base import KNOB_PROBES
from servescope.engines.flagscan import help_flags, typer_flags
from servescope.errors import KnobError, UnknownEngineError
from servescope.spec import Knobs

VERSIONS = ["sglang-0.4.10", "sglang-0.5.9", "sglang-0.5.23", "vllm-0.32.0", "transformers-5.17.0"]


def test_registry_names_and_unknown_engine():
    assert {"sglang", "vllm", "transformers", "external"} <= set(engine_names())
    with pytest.raises(UnknownEngineError, match="no engine named 'sglng'; known engines: .*sglang"):
        get_engine("sglng")


@pytest.mark.parametrize("key,has,lacks", [
    ("sglang-0.4.10", ["--disable-cuda-graph", "--cuda-graph-max-bs", "--enable-dp-attention", "--enable-ep-moe"],
     ["--enable-piecewise-cuda-graph", "--moe-runner-backend", "--cuda-graph-backend-prefill"]),
    ("sglang-0.5.9", ["--enable-piecewise-cuda-graph", "--moe-runner-backend", "--cuda-graph-max-bs"],
     ["--cuda-graph-backend-prefill", "--attn-dp-size"]),
    ("sglang-0.5.23", ["--cuda-graph-backend-decode", "--cuda-graph-backend-prefill", "--attn-dp-size",
                       "--cuda-graph-max-bs-decode", "--tensor-parallel-size", "--ep"],
     ["--enable-piecewise-cuda-graph", "--cuda-graph-max-bs"]),
    ("vllm-0.32.0", ["--enforce-eager", "--compilation-config", "-cc", "--profiler-config", "--moe-backend",
                     "--host", "--port", "--disable-uvicorn-access-log"], ["--disable-cuda-graph"]),
    ("transformers-5.17.0", ["--continuous-batching", "--compile", "--no-compile", "--cb-use-cuda-graph", "<force_model>"],
     ["--force-model"]),
])
def test_flag_scan_of_published_sources(wheel_install, key, has, lacks):
    inst = wheel_install(key)
    fs = get_engine(key.split("-")[0]).flag_set(inst)
    assert [f for f in has if not fs.has(f)] == []
    assert [f for f in lacks if fs.has(f)] == []


def test_sglang_0523_marks_the_old_graph_switch_deprecated(wheel_install):
    fs = get_engine("sglang").flag_set(wheel_install("sglang-0.5.23"))
    assert fs.is_deprecated("--disable-cuda-graph") and fs.is_deprecated("--enable-dp-attention")
    assert not fs.is_deprecated("--cuda-graph-backend-prefill")
    assert "breakable" in (fs.choices("--cuda-graph-backend-prefill") or ["breakable"])  # choices are a constant


@pytest.mark.parametrize("key", VERSIONS)
def test_every_command_uses_only_flags_the_version_defines(wheel_install, key):
    """For every knob setting the adapter accepts on this version, the whole launch command is made of flags the
    version's source declares; the ones it refuses say which version and what it can do instead."""
    engine = key.split("-")[0]
    ad, inst = get_engine(engine), wheel_install(key)
    fs = ad.flag_set(inst)
    supported = 0
    for probe in KNOB_PROBES:
        knobs = Knobs(**probe)
        try:
            plan = ad.plan(install=inst, model_path="/models/m", served_name="m", host="127.0.0.1", port=30000,
                           knobs=knobs, extra_env={})
        except KnobError as e:
            assert inst.version in str(e), str(e)
            continue
        supported += 1
        args = plan.command[plan.command.index("-m") + 2:]  # after `python -m module`
        flags = [t for t in args if t.startswith("-") and not re.fullmatch(r"-?\d+(\.\d+)?", t)]
        assert [f for f in flags if not fs.has(f)] == [], shlex.join(plan.command)
    assert supported >= 5


@pytest.mark.parametrize("key,flags", [
    ("sglang-0.4.10", None),
    ("sglang-0.5.9", ["--enable-piecewise-cuda-graph"]),
    ("sglang-0.5.23", ["--cuda-graph-backend-decode", "full", "--cuda-graph-backend-prefill", "breakable"]),
])
def test_piecewise_intent_per_sglang_version(wheel_install, key, flags):
    ad, inst = get_engine("sglang"), wheel_install(key)
    if flags is None:
        with pytest.raises(KnobError, match=r"SGLang 0\.4\.10 has no piecewise CUDA graphs.*it can: off, decode_only"):
            ad.knob_flags(Knobs(cuda_graph="piecewise"), inst)
    else:
        assert ad.knob_flags(Knobs(cuda_graph="piecewise"), inst) == flags


def test_sglang_dp_attention_spelling_per_version(wheel_install):
    ad = get_engine("sglang")
    k = Knobs(tp=4, attn_dp=4)
    assert ad.knob_flags(k, wheel_install("sglang-0.5.9")) == ["--tp-size", "4", "--dp-size", "4",
                                                              "--enable-dp-attention"]
    assert ad.knob_flags(k, wheel_install("sglang-0.5.23")) == ["--tp-size", "4", "--attn-dp-size", "4"]
    with pytest.raises(KnobError, match="rejected"):
        ad.knob_flags(Knobs(tp=4, dp=2, attn_dp=2), wheel_install("sglang-0.5.23"))


def test_a_server_over_nodes_is_spelled_with_each_engines_own_multi_node_flags(wheel_install):
    """nodes > 1: SGLang's --nnodes/--node-rank/--dist-init-addr (every rank the same address, rank 0's), vLLM's
    multiprocessing launch (--nnodes/--node-rank/--master-addr/--master-port, the other ranks --headless), pp in each
    engine's spelling; an engine without a multi-node launch refuses before anything launches."""
    sg, vl = get_engine("sglang"), get_engine("vllm")
    for key in ("sglang-0.4.10", "sglang-0.5.23"):
        assert sg.node_flags(wheel_install(key), 2, 1, "10.0.0.1", 5000) == \
            ["--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "10.0.0.1:5000"]
        assert sg.knob_flags(Knobs(tp=4, pp=2, nodes=2), wheel_install(key)) == ["--tp-size", "4", "--pp-size", "2"]
    inst = wheel_install("vllm-0.32.0")
    assert vl.node_flags(inst, 2, 0, "10.0.0.1", 29501) == \
        ["--nnodes", "2", "--node-rank", "0", "--master-addr", "10.0.0.1", "--master-port", "29501"]
    assert vl.node_flags(inst, 2, 1, "10.0.0.1", 29501)[-1] == "--headless"
    assert "--pipeline-parallel-size" in vl.knob_flags(Knobs(tp=2, pp=2, nodes=2), inst)
    with pytest.raises(KnobError, match="no multi-node launch of this engine"):
        get_engine("transformers").node_flags(wheel_install("transformers-5.17.0"), 2, 0, "10.0.0.1", 5000)
    with pytest.raises(KnobError, match="no tp/pp/dp"):
        get_engine("transformers").knob_flags(Knobs(pp=2), wheel_install("transformers-5.17.0"))


def test_sglang_moe_backend_choices_are_checked(wheel_install):
    ad = get_engine("sglang")
    with pytest.raises(KnobError, match="not one of"):
        ad.knob_flags(Knobs(moe_backend="no_such_backend"), wheel_install("sglang-0.5.23"))
    assert ad.knob_flags(Knobs(moe_backend="flashinfer_cutedsl"), wheel_install("sglang-0.5.23")) == \
        ["--moe-runner-backend", "flashinfer_cutedsl"]


def test_transformers_model_positional_or_force_model(wheel_install):
    ad, inst = get_engine("transformers"), wheel_install("transformers-5.17.0")
    plan = ad.plan(install=inst, model_path="/m", served_name="x", host="127.0.0.1", port=1, knobs=Knobs(
        torch_compile=True, cuda_graph="full"), extra_env={})
    assert plan.command[3:5] == ["serve", "/m"] and plan.command[-2:] == ["--cb-use-cuda-graph", "--compile"]
    assert ad.served_name("/m", "x") == "/m"
    # its CUDA-graph decision is logged at INFO on continuous batching's own logger, which --log-level misses
    assert plan.env["SERVESCOPE_LOGGER_LEVELS"] == "ContinuousBatchingLogger=INFO" and "--log-level" in plan.command
    line = ("2026-12-02 00:49:16,208 - ContinuousBatchingLogger - INFO - Using cuda graphs for (varlen, decode) "
            "paths: (False, False)")
    st = ad.resolved_state(ad.resolved_from_command(plan.command), line)
    assert (st.graph_prefill, st.graph_decode, st.graph_mode) == ("off", "off", "log: (varlen, decode) = (False, False)")
    newer = typer_flags("def serve(force_model: Annotated[str | None, typer.Option(help='m')] = None,\n"
                        "          compile: Annotated[bool, typer.Option()] = False): pass\n", "serve.py")
    assert {r["flag"] for r in newer} == {"--force-model", "--compile", "--no-compile"}


def test_help_text_parsing():
    text = ("usage: api_server.py [-h] [--headless] [--enforce-eager | --no-enforce-eager]\n"
            "                     [--compilation-config COMPILATION_CONFIG, -cc COMPILATION_CONFIG]\n\n"
            "options:\n  -h, --help            show this help\n  --port PORT           Port number. (default: 8000)\n")
    fs = help_flags(text, "vllm", "x", "help")
    assert {"--headless", "--enforce-eager", "--no-enforce-eager", "--compilation-config", "-cc", "--port",
            "--help"} == set(fs.table["flag"])


@pytest.mark.parametrize("key", ["sglang-0.4.10", "sglang-0.5.9", "sglang-0.5.23"])
def test_audit_finds_sglang_torch_native_and_deepep_normal_rules(wheel_install, key):
    a = graph_disable_audit(get_engine("sglang").source_tree(wheel_install(key)))
    native = find_rules(a, condition=r"attention_backend == 'torch_native'", effect="graph off|graphs off")
    deepep = find_rules(a, condition=r"deepep_mode == 'normal'", effect="graph off|graphs off")
    assert len(native) >= 1 and len(deepep) >= 1
    if key == "sglang-0.5.23":  # per phase: both decode and prefill go off, in the attention and MoE hooks
        assert set(native["effect"]) == {"decode CUDA graph off", "prefill CUDA graph off"}
        assert set(native["file"]) == {"sglang/srt/arg_groups/attention_hook.py"}
        assert set(deepep["file"]) == {"sglang/srt/arg_groups/moe_hook.py"}
    else:
        assert set(native["file"]) == {"sglang/srt/server_args.py"} and set(native["effect"]) == {"CUDA graphs off"}
    assert "torch native" in native["message"].iloc[0]


def test_audit_finds_sglang_059_compile_excludes_piecewise(wheel_install):
    a = graph_disable_audit(get_engine("sglang").source_tree(wheel_install("sglang-0.5.9")))
    rule = find_rules(a, condition="enable_torch_compile")
    assert len(rule) and (rule["function"].str.contains("can_run_piecewise_cuda_graph")).any()
    assert (rule["kind"] == "per-batch").all()


def test_audit_finds_vllm_enforce_eager_and_no_graph_platform(wheel_install):
    a = graph_disable_audit(get_engine("vllm").source_tree(wheel_install("vllm-0.32.0")))
    eager = find_rules(a, condition=r"model_config\.enforce_eager$", effect="cudagraph_mode NONE", file="config/vllm.py")
    platform = find_rules(a, condition=r"^not \(current_platform\.support_static_graph_mode\(\)\)$",
                          effect="cudagraph_mode NONE")
    assert len(eager) >= 1 and len(platform) == 1
    assert platform.iloc[0]["file"] == "vllm/config/vllm.py" and platform.iloc[0]["function"] == "VllmConfig.__post_init__"
    dispatch = find_rules(a, effect="this step runs eager", file="cudagraph_dispatcher")
    assert dispatch["condition"].str.contains("num_tokens > max_size").any()
    # the attention backend's support downgrades the mode, and says so only as a WARNING (vllm PR #32936)
    down = find_rules(a, condition="min_cg_support", effect="set to PIECEWISE", file="config/compilation.py")
    assert len(down) >= 1 and (down["form"] == "chooses").all()
    assert down["message"].str.contains(r"is not supported with \u2039x\u203a backend .*setting cudagraph_mode=PIECEWISE").any()
    fallback = find_rules(a, effect="mode chosen from a computed value", file="config/vllm.py")
    assert fallback["resolves_to"].str.contains("without_piecewise").any()


def test_cli_audit_and_flags_read_published_wheels(wheel_install, capsys, tmp_path):
    from servescope.cli import main

    wheel_install("sglang-0.4.10")  # cached for the CLI's own fetch
    assert main(["audit", "sglang", "--wheel", "sglang==0.4.10", "--condition", "torch_native",
                 "--out", str(tmp_path / "a.csv")]) == 0
    out = capsys.readouterr().out
    assert "sglang 0.4.10: 1 places" in out and "sglang/srt/server_args.py" in out
    assert (tmp_path / "a.csv").read_text().startswith("file,line,function")
    assert main(["flags", "sglang", "--wheel", "sglang==0.4.10"]) == 0
    assert "SGLang 0.4.10 has no piecewise CUDA graphs" in capsys.readouterr().out
    assert main(["audit", "sglang", "--wheel", "sglang"]) == 2


def test_vllm_config_from_its_startup_log():
    """Without /server_info, the resolved graph mode comes from the recorded real log's config line."""
    from pathlib import Path

    log = Path(__file__).parents[1] / "data/reference/store/f9eb5e4c8e9c9562/server.stdout.log"
    st = get_engine("vllm").resolved_state(None, log.read_text())
    assert (st.graphs, st.graph_mode, st.compile, st.compile_mode) == ("off", "NONE", "on", "DYNAMO_TRACE_ONCE")
    assert st.facts["device"] == "cpu" and st.facts["enforce_eager"] is False and st.source.startswith("log")
    assert st.moe_backend == "CPU" and st.tp is None and "no /server_info" in st.why_missing("tp")
    assert st.dtype == "bfloat16"  # the config line's dtype=torch.bfloat16


def test_sglang_059_explains_piecewise_off_by_torch_compile(wheel_install):
    """Resolved by SGLang 0.5.9 with compile on: the audit rule that keeps piecewise graphs from running is named."""
    from servescope.threads.graph_disable import explain_state

    ad = get_engine("sglang")
    st = ad.resolved_state({"enable_torch_compile": True, "enable_piecewise_cuda_graph": True,
                            "disable_cuda_graph": False, "attention_backend": "fa3", "version": "0.5.9"})
    audit = graph_disable_audit(ad.source_tree(wheel_install("sglang-0.5.9")))
    why = explain_state(ad.fact_rules(st), audit, __import__("pandas").DataFrame())
    assert st.graphs == "piecewise"
    assert (why["fact"] == "torch.compile is on").any()
    assert why["where"].str.contains("can_run_piecewise_cuda_graph").any()


def test_transformers_resolved_settings_are_its_arguments():
    ad = get_engine("transformers")
    r = ad.resolved_from_command(["py", "-m", "transformers.cli.transformers", "serve", "/m", "--host", "h",
                                  "--continuous-batching", "--no-cb-use-cuda-graph", "--compile"])
    assert r == {"transformers_serve_args": {"model": "/m", "host": "h", "continuous_batching": True,
                                             "cb_use_cuda_graph": False, "compile": True}}


def test_transformers_audit_and_graph_decision_from_its_log(wheel_install):
    from servescope.engines.logs import analyze_log, patterns_for

    a = graph_disable_audit(get_engine("transformers").source_tree(wheel_install("transformers-5.17.0")))
    rule = find_rules(a, condition=r"^not torch\.cuda\.is_available\(\)$")
    assert list(rule["function"]) == ["decide_use_cuda_graphs"]
    assert rule["effect"].iloc[0] == "continuous-batching CUDA graphs off (both paths)"
    log = analyze_log("INFO Using cuda graphs for (varlen, decode) paths: (False, True)", patterns_for("transformers"))
    assert (log["varlen"].iloc[0], log["decode"].iloc[0]) == ("False", "True")


def test_transformers_on_the_h200_states_its_graph_decision_from_its_own_log():
    """Recorded on the H200 (tests/fixtures/h200_thread01): with continuous batching's logger raised to INFO, the
    server's log says both paths run without CUDA graphs, and why (an attention implementation that needs a mask)."""
    import json

    fix = Path(__file__).parent / "fixtures" / "h200_thread01"
    ad = get_engine("transformers")
    log = (fix / "server.stdout.log").read_text() + "\n" + (fix / "server.stderr.log").read_text()
    st = ad.resolved_state(json.loads((fix / "resolved_config.json").read_text()), log)
    assert (st.graph_prefill, st.graph_decode) == ("off", "off") and st.source == "command line + log"
    assert "is_attn_mask_needed = True" in log and "--log-level info" in (fix / "command.txt").read_text()
    silent = ad.resolved_state(json.loads((fix / "resolved_config.json").read_text()), "")
    assert silent.graphs is None and "not logged" in silent.why_missing("graph_decode")


def test_transformers_audit_lists_the_rule_that_chose_graphs_off_on_the_h200(wheel_install):
    """The audit lists continuous batching's choosing rule (graphs per path iff no attention mask is needed) with its
    log line; the H200 server's resolved facts (tests/fixtures/h200_thread01) satisfy it, and name its remedy."""
    import json

    from servescope.engines.audit import CHOOSES
    from servescope.engines.logs import analyze_log
    from servescope.threads.graph_disable import explain_state

    ad = get_engine("transformers")
    a = graph_disable_audit(ad.source_tree(wheel_install("transformers-5.17.0")))
    chosen = a[(a["form"] == CHOOSES) & a["resolves_to"].str.contains("is_attn_mask_needed")]
    assert list(chosen["function"]) == ["decide_use_cuda_graphs"]
    assert "not (cuda_graph_requested)" in chosen["condition"].iloc[0]
    assert chosen["message"].iloc[0].startswith("Using cuda graphs for (varlen, decode) paths")
    assert set(a["form"]) == {CHOOSES, "disables"}
    fix = Path(__file__).parent / "fixtures" / "h200_thread01"
    log = (fix / "server.stdout.log").read_text() + "\n" + (fix / "server.stderr.log").read_text()
    st = ad.resolved_state(json.loads((fix / "resolved_config.json").read_text()), log)
    assert st.facts["is_attn_mask_needed"] is True
    why = explain_state(ad.fact_rules(st), a, analyze_log(log, ad.log_patterns()))
    audit_rows = why[why["source"] == "audit"]
    assert list(audit_rows["where"]) == [f"{chosen['file'].iloc[0]}:{chosen['line'].iloc[0]} decide_use_cuda_graphs"]
    assert "attention mask" in audit_rows["fact"].iloc[0] and "flash" in audit_rows["remedy"].iloc[0]
    # asked for explicitly, the user's choice is followed: no default rule explains it
    st.graph_mode = "--no-cb-use-cuda-graph"
    assert ad.fact_rules(st) == []


def test_transformers_load_goes_without_ignore_eos():
    """transformers serve answers 422 to ignore_eos/min_tokens (seen on the H200): the load drops them for it."""
    from servescope.spec import LoadSpec

    ld = LoadSpec(concurrency=(1,), num_requests=1, input_len=4, output_len=4)
    said = []
    assert get_engine("transformers").effective_load(ld, said.append).ignore_eos is False and said
    assert get_engine("vllm").effective_load(ld).ignore_eos is True


def test_recorded_h200_transformers_run_of_threads_0_and_1():
    """Recorded on the H200 (tests/fixtures/h200/README.md): thread 0 saw the GPU through NVML, thread 1 read the
    server's arguments as its resolved config and did not guess a graph mode the server never reported."""
    import json
    from pathlib import Path

    import pandas as pd

    from servescope.engines.logs import analyze_log_file

    d = Path(__file__).parent / "fixtures" / "h200" / "threads_transformers"
    (env,) = json.loads((d / "00_environment.findings.json").read_text())
    assert env["claim"].startswith("transformers 5.17.0 (cuda) on 1 x NVIDIA H200")
    assert env["evidence"]["gpus"][0]["power_limit_w"] == 700.0
    st = get_engine("transformers").resolved_state(json.loads((d / "resolved_config.json").read_text()))
    assert st.graphs is None and st.compile == "off" and st.facts["device"] == "cuda"
    assert "transformers decides at run time" in st.why_missing("graph_decode")
    (why,) = json.loads((d / "01_cuda_graph_disable_reason.findings.json").read_text())
    assert not why["applies"] and "did not report its graph mode" in why["claim"]
    assert "--continuous-batching --log-level info --device cuda" in (d / "command.txt").read_text()
    assert pd.read_parquet(d / "summary.parquet")["failed"].sum() == 0
    assert "uvicorn_ready" in set(analyze_log_file(d / "server.stderr.log", "transformers")["name"])


def test_help_is_run_once_per_environment_the_suite_made(tmp_path, monkeypatch):
    """`--help` (a cold import of the engine, ~10 s of each thread 00 here) is run once in an environment of the
    suite's cache and read back after; a user's own interpreter is asked every time (it may be upgraded in place)."""
    from servescope.engines.helpcheck import run_help

    monkeypatch.setenv("SERVESCOPE_CACHE", str(tmp_path / "cache"))
    script = ("#!/bin/sh\necho run >> {log}\n"
              "printf 'usage: api_server [-h] [--max-num-seqs MAX_NUM_SEQS]\\n\\noptions:\\n  --max-num-seqs MAX_NUM_SEQS\\n'\n")
    pythons = {}
    for where in ("managed", "own"):
        root = tmp_path / "cache" / "envs" / "vllm-x-1.0" if where == "managed" else tmp_path / "own"
        py = root / "bin" / "python"
        py.parent.mkdir(parents=True)
        py.write_text(script.format(log=tmp_path / f"{where}.log"))
        py.chmod(0o755)
        pythons[where] = py
    for _ in range(3):
        for py in pythons.values():
            flags = run_help(str(py), "vllm", "1.0", ("-m", "x", "--help"))
            assert "--max-num-seqs" in set(flags.table["flag"])
    assert (tmp_path / "managed.log").read_text().count("run") == 1
    assert (tmp_path / "own.log").read_text().count("run") == 3
    # another version's help is another text
    run_help(str(pythons["managed"]), "vllm", "1.1", ("-m", "x", "--help"))
    assert (tmp_path / "managed.log").read_text().count("run") == 2
