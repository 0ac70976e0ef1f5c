"""Every engine version (issue 15): one published release per flag-declaration form and per audit form, read from
its real source (wheels and vLLM's sdist, fetched once per user); the scan's and the audit's forms on small sources
written here; `--help` as the truth for a version servescope has not read; the check-engines matrix and docs/engines.md
table it writes."""

from __future__ import annotations

import textwrap

import pandas as pd
import pytest

from servescope.engines import base, get_engine
from servescope.engines.audit import PER_BATCH, SILENT, STARTUP, audit_source, find_rules, graph_disable_audit
from servescope.engines.flagscan import Constants, FlagSet, help_flags, scan_flags
from servescope.engines.helpcheck import known_release
from servescope.engines.matrix import CI_SUBSET, check_engines, readme_table, release_key, select_releases, source_tree
from servescope.engines.source import SourceTree
from servescope.errors import KnobError, ServescopeError
from servescope.paths import project_root
from servescope.spec import Knobs

# ---- the flag scan: every declaration form ----------------------------------------------------------------------

@pytest.mark.parametrize("key,form,at_least", [
    ("sglang-0.4.10", ("argparse", "sglang/srt/server_args.py"), 150),
    ("sglang-0.5.14", ("field", "sglang/srt/server_args.py"), 400),  # annotated dataclass fields in server_args.py
    ("sglang-0.5.23", ("field", "sglang/srt/arg_groups/fields/"), 500),  # annotated fields under arg_groups/
    ("vllm-0.33.0", ("field", "vllm/entrypoints/common/cli_args.py"), 350),  # frontend args moved in 0.33
    ("transformers-5.23.0", ("option", "transformers/cli/serve.py"), 25),
])
def test_every_declaration_form_gives_the_core_flags(wheel_install, key, form, at_least):
    engine = key.split("-")[0]
    fs = get_engine(engine).flag_set(wheel_install(key))
    assert len(fs) >= at_least
    kind, where = form
    assert ((fs.table["kind"] == kind) & fs.table["file"].str.startswith(where)).sum() >= 2
    core = {"sglang": ["--model-path", "--host", "--port"], "vllm": ["--model", "--host", "--port"],
            "transformers": ["<force_model>", "--host", "--port"]}[engine]
    assert all(fs.has(f) for f in core)


def test_a_scan_without_the_core_flags_is_an_error(tmp_path):
    pkg = tmp_path / "sglang" / "srt"
    pkg.mkdir(parents=True)
    (pkg / "server_args.py").write_text("def add(parser):\n    parser.add_argument('--tp-size', type=int)\n")
    with pytest.raises(ServescopeError, match=r"found 1 flags but not --model-path, --host, --port"):
        scan_flags(SourceTree("sglang", "9.9.9", str(tmp_path)))


CHOICES_SRC = textwrap.dedent('''
    import enum
    from typing import Literal, Optional
    MODES = ["a", "b"]
    MORE = MODES + ["c"]
    TABLE = {"x": 1, "y": 2}
    Alias = Literal["p", "q"]
    class Backend:
        FULL = "full"
        OFF = "disabled"
        ALL = (FULL, OFF)
    class Color(str, enum.Enum):
        RED = "red"
        BLUE = "blue"
    class Phase:
        DECODE = "decode"
        PREFILL = "prefill"
    ALLOWED_BACKENDS_PER_PHASE = {Phase.DECODE: (Backend.FULL, Backend.OFF), Phase.PREFILL: (Backend.OFF,)}
''')


@pytest.mark.parametrize("expr,want", [
    ("MODES", ["a", "b"]), ("MORE", ["a", "b", "c"]), ("list(TABLE.keys())", ["x", "y"]), ("Backend.ALL",
     ["full", "disabled"]), ("[c.value for c in Color]", ["red", "blue"]), ("Color", ["red", "blue"]),
    ("sorted(MODES)", ["a", "b"]), ("UNKNOWN_NAME", None), ("MODES + UNKNOWN", None),
])
def test_choices_from_constants_enums_and_class_attributes(expr, want):
    import ast

    c = Constants().add(CHOICES_SRC)
    assert c.resolve(ast.parse(expr, mode="eval").body) == want


@pytest.mark.parametrize("ann,want", [("Literal['x', 'y']", ["x", "y"]), ("Optional[Literal['x', 1]]", ["x", "1"]),
                                      ("Literal['x'] | None", ["x"]), ("Alias", ["p", "q"]), ("Optional[str]", None),
                                      ("Union[Literal['u'], None]", ["u"])])
def test_literal_choices_through_optional_union_and_aliases(ann, want):
    import ast

    assert Constants().add(CHOICES_SRC).literal(ast.parse(ann, mode="eval").body) == want


def test_sglang_0514_has_no_full_prefill_graph_and_says_what_it_accepts(wheel_install):
    ad = get_engine("sglang")
    inst = wheel_install("sglang-0.5.14")
    fs = ad.flag_set(inst)
    assert fs.phases["prefill"] == ["breakable", "tc_piecewise", "disabled"]
    assert fs.choices("--cuda-graph-backend-prefill") == ["breakable", "tc_piecewise", "disabled"]
    with pytest.raises(KnobError, match=r"cuda_graph='full'.*prefill full is not accepted; it takes breakable, "
                                        r"tc_piecewise, disabled"):
        ad.knob_flags(Knobs(cuda_graph="full"), inst)
    assert ad.knob_flags(Knobs(cuda_graph="piecewise"), inst) == [
        "--cuda-graph-backend-decode", "full", "--cuda-graph-backend-prefill", "breakable"]
    # 0.5.23 allows a full prefill graph: the same intent builds there
    assert ad.knob_flags(Knobs(cuda_graph="full"), wheel_install("sglang-0.5.23"))[-1] == "full"


def test_values_are_checked_against_the_version_before_launch(wheel_install):
    sg, inst = get_engine("sglang"), wheel_install("sglang-0.5.23")
    with pytest.raises(KnobError, match=r"--cuda-graph-backend-decode sideways is not accepted; it takes full, "
                                        r"breakable, disabled"):
        sg.check_flags(["--cuda-graph-backend-decode", "sideways"], inst)
    sg.check_flags(["--cuda-graph-backend-decode=full", "--tp-size", "2"], inst)
    vl, v33 = get_engine("vllm"), wheel_install("vllm-0.33.0")
    with pytest.raises(KnobError, match=r"--moe-backend no_such is not accepted; it takes auto, triton"):
        vl.knob_flags(Knobs(moe_backend="no_such"), v33)
    assert vl.knob_flags(Knobs(moe_backend="triton"), v33) == ["--moe-backend", "triton"]
    assert vl.flag_set(v33).enums["CUDAGraphMode"] == ["NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY",
                                                       "FULL_AND_PIECEWISE"]


def test_vllm_033_plans_from_its_published_source(wheel_install):
    ad, inst = get_engine("vllm"), wheel_install("vllm-0.33.0")
    plan = ad.plan(install=inst, model_path="/m", served_name="m", host="127.0.0.1", port=8000,
                   knobs=Knobs(cuda_graph="piecewise", tp=2), extra_env={})
    assert plan.command[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]  # still shipped (forwards) in 0.33
    assert "--tensor-parallel-size" in plan.command and '"cudagraph_mode": "FULL_AND_PIECEWISE"' in " ".join(
        plan.command)
    assert "(sdist)" in ad.flag_set(inst).origin or "vllm-0.33.0" in ad.flag_set(inst).origin


def test_transformers_0523_model_argument_and_knobs(wheel_install):
    ad, inst = get_engine("transformers"), wheel_install("transformers-5.23.0")
    plan = ad.plan(install=inst, model_path="/models/m", served_name="m", host="127.0.0.1", port=8000,
                   knobs=Knobs(cuda_graph="full", torch_compile=True), extra_env={})
    serve = plan.command.index("serve")
    assert plan.command[serve + 1] == "/models/m"  # positional force_model: no --force-model in 5.23
    assert plan.flags == ["--cb-use-cuda-graph", "--compile"]
    with pytest.raises(KnobError, match="transformers 5.23.0 serve has no knob for expert parallelism"):
        ad.knob_flags(Knobs(tp=2, ep=2), inst)


# ---- the audit: every form --------------------------------------------------------------------------------------

AUDIT_SRC = textwrap.dedent('''
    def disable_if_incompatible(cfg):
        rules = [
            ("two-batch overlap", lambda: cfg.enable_two_batch_overlap),
            (None, lambda: cfg.attn_cp_size > 1),
        ]
        for name, predicate in rules:
            if predicate():
                if name is not None:
                    logger.warning("Breakable CUDA graph is incompatible with %s; disabling.", name)
                cfg.graph = with_phase(cfg.graph, Phase.PREFILL, backend=Backend.DISABLED)
                return

    def handle_attention(self):
        if self.attention_backend == "torch_native":
            self.cuda_graph_config.decode.backend = Backend.DISABLED
            _set(Phase.PREFILL, "backend", Backend.DISABLED)

    def cuda_graph_fully_disabled():
        return check_cuda_graph_backend(Phase.DECODE, Backend.DISABLED)

    def add_cli_args(parser):
        parser.add_argument("--disable-piecewise", const_value=Backend.DISABLED, dest="cuda_graph_backend_prefill")

    class ServerArgs:
        disable_cuda_graph: bool = True

    class DraftCudaGraphRunner:
        def _init_and_capture(self):
            if cuda_graph_fully_disabled():
                return
            self.capture()

        def can_run(self, batch):
            if batch.size > self.max_bs:
                return False
            return True

    class Sampler:
        def can_run(self, batch):
            return False

    class OldCudaGraphRunner:
        def can_run(self, forward_batch):
            is_bs_supported = forward_batch.batch_size <= self.max_bs
            is_bs_supported = is_bs_supported and forward_batch.can_run_dp_cuda_graph
            return is_bs_supported and self.other_ok
''')


CHOOSING_SRC = textwrap.dedent('''
    def decide(cb_config, is_attn_mask_needed, requested):
        if not cuda_ok():
            cb_config.use_cuda_graph = (False, False)
        elif requested:
            cb_config.use_cuda_graph = (True, True)
        else:
            paths = []
            for c in cb_config.configs:
                if c is None:
                    paths.append(not is_attn_mask_needed)
                    continue
                logger.warning("compile mode uses cudagraphs")
                paths.append(False)
            cb_config.use_cuda_graph = tuple(paths)
        logger.info(f"Using cuda graphs for paths: {cb_config.use_cuda_graph}")

    def resolve(self, cudagraph_mode, support, backend):
        if cudagraph_mode.has_full() and support == NEVER:
            msg = f"CUDAGraphMode.{cudagraph_mode.name} is not supported with {backend} backend"
            if self.piecewise:
                msg += "; setting cudagraph_mode=PIECEWISE"
                cudagraph_mode = CUDAGraphMode.PIECEWISE
            logger.warning(msg)
        if not self.capture_available:
            fallback_mode = cudagraph_mode.without_piecewise()
            logger.warning("Overriding to %s.", fallback_mode)
            cudagraph_mode = fallback_mode
        self.cudagraph_mode = cudagraph_mode

    def choose_phase(server_args, cfg):
        if supports_cp(server_args):
            declare(server_args, cuda_graph_config=with_phase(cfg.cuda_graph_config, Phase.PREFILL,
                                                              backend=Backend.BREAKABLE))
        attn = with_phase(cfg.attention_config, "x", backend=pick())
        wrapper = Wrapper(use_cuda_graph=True)

    class Wrapper:
        def __init__(self, use_cuda_graph):
            self.use_cuda_graph = bool(use_cuda_graph)
''')


def test_audit_lists_rules_that_choose_graph_use():
    """Rules that choose graph use from a computed condition, not only those that turn it off: the value with its
    locals, the log line beside it or after the branches; not a component's own option, nor a write-back."""
    a = audit_source(CHOOSING_SRC, "x.py")
    chosen = a[a["form"] == "chooses"]
    per_path = chosen[chosen["resolves_to"].str.startswith("tuple(paths)")]
    assert len(per_path) == 1 and "not is_attn_mask_needed | False" in per_path["resolves_to"].iloc[0]
    assert per_path["condition"].iloc[0] == "not (not cuda_ok()) and not (requested)"
    # logged once after the if-chain, not the warning nested in the loop
    assert per_path["message"].iloc[0] == "Using cuda graphs for paths: \u2039x\u203a"
    on = chosen[chosen["effect"] == "CUDA graphs on (both paths)"]
    assert list(on["condition"]) == ["not (not cuda_ok()) and requested"]
    assert a[a["effect"].str.contains("off")]["form"].eq("disables").all()
    # vLLM's downgrade: the warning built in a local, with this branch's own part
    pw = chosen[chosen["effect"] == "CUDA-graph mode set to PIECEWISE"]
    assert pw["message"].iloc[0] == "CUDAGraphMode.\u2039x\u203a is not supported with \u2039x\u203a backend; " \
                                    "setting cudagraph_mode=PIECEWISE"
    fallback = chosen[chosen["resolves_to"].str.startswith("fallback_mode")]
    assert fallback["resolves_to"].iloc[0] == "fallback_mode, where fallback_mode = cudagraph_mode.without_piecewise()"
    assert fallback["message"].iloc[0] == "Overriding to %s."
    assert not chosen["statement"].str.startswith("self.cudagraph_mode = cudagraph_mode").any()  # write-back
    phase = chosen[chosen["function"] == "choose_phase"]
    assert list(phase["effect"]) == ["prefill CUDA graph set to BREAKABLE"]  # not attention's backend, nor Wrapper's
    assert not a["function"].eq("Wrapper.__init__").any()


def test_audit_forms_on_a_small_source():
    a = audit_source(AUDIT_SRC, "x.py")
    named = find_rules(a, condition="two-batch overlap")
    assert list(named["rule"]) == ["two-batch overlap"] and named["kind"].iloc[0] == STARTUP
    assert named["condition"].iloc[0] == "(cfg.enable_two_batch_overlap)"
    assert named["message"].iloc[0] == "Breakable CUDA graph is incompatible with two-batch overlap; disabling."
    assert named["effect"].iloc[0] == "prefill CUDA graph off"
    unnamed = find_rules(a, condition=r"attn_cp_size > 1")
    assert list(unnamed["rule"]) == ["(unnamed rule)"] and unnamed["message"].iloc[0] == SILENT
    attn = find_rules(a, condition="torch_native")
    assert sorted(attn["effect"]) == ["decode CUDA graph off", "prefill CUDA graph off"]
    early = a[a["function"] == "DraftCudaGraphRunner._init_and_capture"]
    assert list(early["effect"]) == ["this graph runner captures nothing (returns before capture)"]
    batch = a[a["kind"] == PER_BATCH]
    # a plain can_run of a runner (not Sampler's); a verdict returned as `a and b`: one row per conjunct
    assert list(batch["function"]) == ["DraftCudaGraphRunner.can_run"] + ["OldCudaGraphRunner.can_run"] * 2
    assert list(batch["condition"].iloc[1:]) == [
        "not (is_bs_supported := (forward_batch.batch_size <= self.max_bs) and forward_batch.can_run_dp_cuda_graph)",
        "not (self.other_ok)"]
    assert not a["function"].isin(["cuda_graph_fully_disabled", "add_cli_args", "ServerArgs"]).any()


def test_audit_of_sglang_0514_reads_silent_rule_tables_and_phase_assignments(wheel_install):
    a = graph_disable_audit(get_engine("sglang").source_tree(wheel_install("sglang-0.5.14")))
    dp = find_rules(a, condition="DP attention")  # by the rule's name
    assert len(dp) == 1 and dp["message"].iloc[0] == SILENT and dp["condition"].iloc[0] == "(self.enable_dp_attention)"
    native = find_rules(a, condition=r"attention_backend == 'torch_native'", effect="CUDA graph off")
    assert set(native["effect"]) == {"decode CUDA graph off", "prefill CUDA graph off"}
    assert set(native["file"]) == {"sglang/srt/server_args.py"}
    assert (find_rules(a, effect="captures nothing")["kind"] == STARTUP).all()
    assert not a["function"].str.endswith("cuda_graph_fully_disabled").any()


def test_audit_of_sglang_0410_reads_its_can_run_verdict(wheel_install):
    a = graph_disable_audit(get_engine("sglang").source_tree(wheel_install("sglang-0.4.10")))
    bs = find_rules(a, condition=r"cuda_graph_bs <= self\.max_bs", file="cuda_graph_runner.py")
    assert len(bs) and (bs["kind"] == PER_BATCH).all() and (bs["function"] == "CudaGraphRunner.can_run").any()


def test_audit_of_sglang_0523_names_each_rule_of_its_tables(wheel_install):
    a = graph_disable_audit(get_engine("sglang").source_tree(wheel_install("sglang-0.5.23")))
    tbo = find_rules(a, condition="^two-batch overlap$")
    assert len(tbo) == 1 and "incompatible with two-batch overlap" in tbo["message"].iloc[0]
    assert tbo["condition"].iloc[0] == "(cfg.enable_two_batch_overlap)"
    assert set(a["kind"]) == {STARTUP, PER_BATCH}
    assert not a["function"].str.endswith("_cuda_graph_disabled").any()  # a predicate, not a rule


# ---- --help as the truth -----------------------------------------------------------------------------------------

HELP = """usage: serve [-h] [--host HOST] [--mode {fast,slow}] [--new-flag]

options:
  -h, --help            show this help message and exit
  --host HOST           address
  --mode {fast,slow}    how
  --new-flag            only the running version has it
"""


def test_help_is_the_truth_and_disagreements_are_listed():
    static_rows = [{"flag": f, "dest": f[2:], "file": "s.py", "line": 1, "deprecated": False, "kind": "argparse",
                    "choices": c} for f, c in (("--host", None), ("--mode", ["fast"]), ("--old-flag", None))]
    static = FlagSet("sglang", "9.9", pd.DataFrame(static_rows), "static")
    fs = base.reconcile_flags(static, help_flags(HELP, "sglang", "9.9", "--help"))
    assert fs.has("--new-flag") and not fs.has("--old-flag")
    assert fs.choices("--mode") == ["fast", "slow"]  # what --help prints wins
    assert fs.table.set_index("flag").at["--host", "file"] == "s.py"
    assert sorted(map(tuple, fs.disagreements.values.tolist())) == [("--new-flag", "--help only"),
                                                                   ("--old-flag", "source only")]
    failed = base.reconcile_flags(None, help_flags(HELP, "sglang", "9.9", "--help"), ServescopeError("moved"))
    assert failed.has("--host") and "static scan failed (moved)" in failed.disagreements["in"].iloc[0]


def test_an_unread_version_asks_its_help(monkeypatch):
    calls = []

    def fake_help(python, engine, version, argv, env=()):
        calls.append(argv)
        return help_flags(HELP.replace("--new-flag", "--model-path MODEL_PATH --port PORT"), engine, version, "h")

    monkeypatch.setattr(base, "_help_cached", fake_help)
    monkeypatch.setattr(base, "_scan_cached", lambda tree: (_ for _ in ()).throw(ServescopeError("form not read")))
    ad = get_engine("sglang")
    monkeypatch.setattr(type(ad), "source_tree", lambda self, inst: SourceTree("sglang", inst.version, "/nowhere"))
    inst = base.EngineInstall(python="/usr/bin/python3", version="0.9.99", distribution="sglang", platform="cuda")
    fs = ad.flag_set(inst)
    assert calls == [("-m", "sglang.launch_server", "--help")] and fs.has("--model-path")
    with pytest.raises(ServescopeError, match="form not read"):  # a read release trusts its scan; none here
        ad.flag_set(base.EngineInstall(python="/x", version="0.9.99", distribution="sglang", platform="cuda",
                                       source="/nowhere"))


# ---- check-engines -----------------------------------------------------------------------------------------------

def test_release_selection():
    vs = ["0.3.6", "0.4.0", "0.4.0.post2", "0.4.1", "0.4.10", "0.4.10.post2", "0.5.0rc2", "0.5.1", "0.5.1.post1",
          "0.5.23", "0.6.0"]
    assert select_releases("sglang", vs) == ["0.4.0.post2", "0.4.1", "0.4.10.post2", "0.5.1", "0.5.1.post1", "0.5.23"]
    assert select_releases("vllm", ["0.25.0", "0.26.0", "0.30.0", "0.33.0", "0.34.0", "0.33.0rc1"]) == ["0.26.0", "0.30.0",
                                                                                           "0.33.0"]
    assert release_key("0.4.10.post2") > release_key("0.4.9.post6")


def test_check_engines_on_one_release_per_form():
    matrix, knobs = check_engines(list(CI_SUBSET), {e: list(v) for e, v in CI_SUBSET.items()}, say=lambda s: None)
    assert list(matrix["problems"]) == [""] * len(matrix), matrix[["engine", "version", "problems"]]
    assert (matrix["core"] == "present").all() and (matrix["audit_startup"] > 0).all()
    row = matrix.set_index("version").loc["0.5.14"]
    assert row["graph_intents"] == "off, decode_only, piecewise" and "prefill: breakable" in row["phases"]
    refused = knobs[(knobs["version"] == "0.5.14") & (knobs["status"] == "refused")]
    assert list(refused["knobs"]) == ["cuda_graph=full"] and "it takes breakable" in refused["reason"].iloc[0]
    assert set(knobs["status"]) <= {"built", "refused"}
    # the committed matrix (the table of docs/engines.md) is what this code reads from these releases today
    committed = pd.read_csv(project_root() / "data" / "engines" / "matrix.csv", dtype={"version": str},
                            keep_default_na=False).set_index(["engine", "version"])
    cols = ["flags", "choices", "knobs_built", "knobs_refused", "audit_startup", "audit_per_batch", "audit_chooses",
            "audit_named_rules", "audit_silent", "graph_intents", "declared"]
    now = matrix.set_index(["engine", "version"])[cols]
    pd.testing.assert_frame_equal(now, committed.loc[now.index, cols], check_dtype=False)


def test_readme_engine_table_is_the_committed_matrix():
    matrix = pd.read_csv(project_root() / "data" / "engines" / "matrix.csv", dtype={"version": str},
                         keep_default_na=False)
    assert len(matrix) >= 69 and (matrix["problems"] == "").all()
    readme = (project_root() / "docs" / "engines.md").read_text()
    assert readme_table(matrix) in readme


def test_source_tree_of_a_release_is_the_sdist_for_vllm(wheel_install):
    wheel_install("vllm-0.33.0")  # cached
    tree = source_tree(get_engine("vllm"), "0.33.0")
    assert tree.origin == "sdist" and tree.exists("vllm/entrypoints/common/cli_args.py")
    assert tree.label() == "vllm 0.33.0 (sdist)"


def test_check_engines_exits_non_zero_on_an_inconsistency(monkeypatch, tmp_path, capsys):
    from servescope import cli
    from servescope.engines import matrix as mx

    real = mx.check_release

    def broken(adapter, tree):
        res = real(adapter, tree)
        res.row["problems"] = "cuda_graph=full: AttributeError: boom"
        return res

    args = ["check-engines", "--engine", "transformers", "--version", "transformers=5.23.0",
            "--csv", str(tmp_path / "m.csv"), "--knobs-csv", str(tmp_path / "k.csv")]
    assert cli.main(args) == 0
    monkeypatch.setattr(mx, "check_release", broken)
    assert cli.main(args) == 1
    out = capsys.readouterr().out
    assert "1 releases, 1 with problems" in out and "transformers 5.23.0: cuda_graph=full: AttributeError" in out
    assert pd.read_csv(tmp_path / "m.csv")["problems"].iloc[0].startswith("cuda_graph=full")


def test_flags_cli_reads_vllm_from_its_sdist(wheel_install, capsys):
    from servescope import cli

    wheel_install("vllm-0.33.0")  # cached
    assert cli.main(["flags", "vllm", "--wheel", "vllm==0.33.0"]) == 0
    assert "vllm 0.33.0: 371 flags (vllm 0.33.0 (" in capsys.readouterr().out


def test_the_vllm_release_recorded_on_the_h200_is_read_from_its_source():
    """vLLM 0.26 (data/suites/vllm-h200.yaml) is in the matrix: its static scan is trusted, so a suite on it does not
    pay a cold `--help` import of the engine in every notebook process."""
    assert known_release("vllm", "0.26.0") and not known_release("vllm", "0.25.0")
