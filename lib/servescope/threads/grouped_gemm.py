"""Thread 6: MoE grouped GEMM: which MoE kernel path runs, its share of device time, and what a grouped GEMM would
save where experts run one by one.

From a profiled point of the engine's defaults (a kernel table stored with the point: nsys on a GPU, the PyTorch
profiler on a CPU build): kernel time by category, the MoE path by kernel or op name (Triton fused_moe, CUTLASS or
FlashInfer grouped GEMM, DeepGEMM, torch `_grouped_mm`, vLLM CPU fused MoE, ...), its share of the time, and launches
per MoE layer per forward step; a per-expert loop shows as dense matrix products, many per layer per step. A ceiling
probe on the model's own expert shapes times a per-expert loop against one grouped product for the sweep's token
counts. Verdict: already grouped, per-expert (with what it costs), or not MoE.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from .. import probes
from ..analysis import kernels as ak
from ..context import RepetitionPlan, RunContext
from ..errors import ServescopeError, SpecError
from ..experiment import Results
from ..findings import Change, Finding
from ..launch import find_install
from ..models import EXPERT_KEYS, TOP_K_KEYS, model_config
from ..probes.run import ProbeRun
from ..profile.window import window_load
from ..queries import kept_probe
from ..spec import Knobs, LoadSpec, ModelSpec, ProfileSpec
from ..study import Arm, Study, drop_empty, read_or_run
from ..util import known

THREAD = "06_grouped_gemm"
QUESTION = "Is the MoE path a grouped GEMM, which kernel runs, and what share of GPU time does it take?"
DEFAULTS = "engine default"
# MoE paths that run the experts as one grouped or fused product (analysis/kernel_categories.csv names them)
GROUPED_PATHS = {"triton_fused_moe", "flashinfer_cutlass", "flashinfer_trtllm", "flashinfer_cutedsl", "deep_gemm",
                 "sgl_kernel_cutlass", "triton_kernel_ogs", "torch_grouped_mm", "cpu_experts"}
# dense products a transformer layer launches per step besides its experts: q, k, v, o (or fused), the router, and
# up to three of a shared expert; more than this plus one per routed expert means the experts loop one by one
DENSE_PER_LAYER = 8


@dataclass(frozen=True)
class MoeShape:
    """The model's MoE facts: experts, top-k, hidden and expert intermediate sizes, layers with experts."""

    experts: int
    top_k: int
    hidden: int
    inter: int
    layers: int
    moe_layers: int
    dtype: str

    @property
    def is_moe(self) -> bool:
        """Whether the model routes tokens to experts at all."""
        return self.experts > 1 and self.moe_layers > 0


def per_gpu(shape: MoeShape, knobs: Knobs) -> tuple[MoeShape, str]:
    """One GPU's share of an MoE layer under the deployment's parallelism, and how it was cut ('' where whole):
    expert parallelism (ep) gives each GPU experts/ep whole experts, and each token about top_k/ep of its choices
    there; tensor parallelism alone cuts every expert's intermediate size by tp."""
    if knobs.ep and knobs.ep > 1:
        local = max(1, shape.experts // knobs.ep)
        return (dataclasses.replace(shape, experts=local, top_k=max(1, min(local, round(shape.top_k / knobs.ep)))),
                f"EP={knobs.ep}: {local} of {shape.experts} experts per GPU")
    if knobs.tp > 1:
        return (dataclasses.replace(shape, inter=max(1, shape.inter // knobs.tp)),
                f"TP={knobs.tp}: expert intermediate size {shape.inter} / {knobs.tp} per GPU")
    return shape, ""


def shape_of(model: ModelSpec) -> MoeShape | None:
    """The MoE facts of a generated model (from its spec), a shipped architecture or a local model folder (its
    config.json); None where nothing can be read (a hub id not on disk)."""
    if model.tiny is not None:
        t = model.tiny
        return MoeShape(t.num_experts, t.top_k, t.hidden_size, t.moe_intermediate_size, t.num_layers, t.num_layers,
                        t.dtype)
    if model.architecture is not None:
        from ..architectures import read_config

        cfg = read_config(model.architecture)
    else:
        cfg = model_config(model.path or "")
    if not cfg:
        return None
    experts = next((int(cfg[k]) for k in EXPERT_KEYS if cfg.get(k)), 0)
    top_k = next((int(cfg[k]) for k in TOP_K_KEYS if cfg.get(k)), 0)
    layers = int(cfg.get("num_hidden_layers") or 0)
    step = int(cfg.get("decoder_sparse_step") or 1)
    dense = set(cfg.get("mlp_only_layers") or []) | set(range(int(cfg.get("first_k_dense_replace") or 0)))
    moe_layers = sum(1 for i in range(layers) if (i + 1) % step == 0 and i not in dense) if experts > 1 else 0
    inter = int(cfg.get("moe_intermediate_size") or cfg.get("intermediate_size") or 0)
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    return MoeShape(experts, top_k, int(cfg.get("hidden_size") or 0), inter, layers, moe_layers, dtype)


def path_of(kernels: pd.DataFrame, shape: MoeShape | None, window_steps: float | None = None) -> dict[str, Any]:
    """What the kernel table says about the MoE path: kernel time and share of the MoE category, the path(s) by name,
    forward steps in the window (forward_steps, else the window's load),
    launches per MoE layer per step, and dense products per layer per step (a per-expert loop's sign)."""
    k = ak.with_categories(kernels)
    total_ms = float(k["dur_ns"].sum()) / 1e6
    cats = ak.categories(k)
    paths = ak.moe_path(k)
    moe = k[k["category"] == "moe_grouped_gemm"]
    dense = k[k["category"] == "dense_gemm"]
    layers = shape.layers if shape else 0
    moe_layers = shape.moe_layers if shape else 0
    steps, how = forward_steps(k, layers)
    if not known(steps) and window_steps:
        steps, how = float(window_steps), "requests x output tokens / concurrency of the profiled window"
    per_step = (lambda n, per: n / (per * steps)) if known(steps) and steps > 0 else (lambda n, per: float("nan"))
    grouped = [p for p in paths["moe_path"] if p in GROUPED_PATHS] if len(paths) else []
    return {"total_ms": total_ms, "categories": cats, "paths": paths, "grouped_paths": grouped,
            "moe_ms": float(moe["dur_ns"].sum()) / 1e6, "moe_share": float(moe["dur_ns"].sum()) / 1e6 / total_ms
            if total_ms else float("nan"), "moe_kernels": int(len(moe)),
            "dense_ms": float(dense["dur_ns"].sum()) / 1e6, "dense_kernels": int(len(dense)),
            "steps": steps, "steps_from": how,
            "moe_launches_per_layer_step": per_step(len(moe), moe_layers) if moe_layers else float("nan"),
            # which kernels make that number: the same path reads differently on two engines by its helpers (the
            # expert sort, the top-k, the sum of the experts' outputs), so each is named with its own count
            "moe_launch_kinds": [{"kernel": kernel_label(str(n)), "per_layer_step": per_step(int(c), moe_layers)}
                                 for n, c in moe["name"].astype(str).value_counts().items()] if moe_layers else [],
            "dense_launches_per_layer_step": per_step(len(dense), layers) if layers else float("nan"),
            "device": "CPU" if (k["device"] < 0).all() else "GPU"}


GENERIC_KERNELS = ("device_kernel", "kernel", "kernel_entry", "generic_kernel")


def kernel_label(name: str, width: int = 48) -> str:
    """A kernel's name as a sentence can hold it: its function without template arguments and namespaces, cut to
    width."""
    base = name.replace("(anonymous namespace)::", "").replace("<unnamed>::", "").split("(")[0]
    base = re.sub(r"^void\s+", "", re.sub(r"<.*", "", base).strip())
    base = base.rsplit("::", 1)[-1] or name
    if base.lower() in GENERIC_KERNELS:  # a library's launcher: the kernel it runs is its template's first argument
        inner = re.search(r"<\s*([\w:]+)", name.replace("(anonymous namespace)::", "").replace("<unnamed>::", ""))
        base = inner.group(1).rsplit("::", 1)[-1] if inner else base
    return base if len(base) <= width else base[:width - 1] + "…"


# kernels that write each step's keys and values into the KV cache: once per layer per step, prefill and decode alike
KV_WRITE = r"reshape_and_cache|rope_store|store_kv|kv_store|set_kv_buffer|write_kv|kv_write"


def forward_steps(k: pd.DataFrame, layers: int) -> tuple[float, str]:
    """Forward steps in a kernel window, and from what kernel: the KV-cache write (once per layer per step, prefill
    and decode alike), else the most launched attention kernel, per layer. A norm (twice per layer) or a decode-only
    attention kernel would miscount. NaN where no such kernel runs a whole number of times per layer."""
    if not layers or k.empty:
        return float("nan"), ""
    names = k["name"].astype(str)
    counts = names.value_counts()
    whole = counts[(counts >= layers) & (counts % layers == 0)]
    writes = whole[whole.index.str.contains(KV_WRITE, case=False, regex=True)]
    if len(writes):
        name = writes.index[0]
        return float(writes.iloc[0] // layers), f"launches of {ak.bare_name(name)!r} (the KV-cache write) per layer"
    if "category" in k:
        att = names[k["category"].astype(str) == "attention"].value_counts()
        if len(att):
            return float(att.iloc[0]) / layers, f"launches of {ak.bare_name(att.index[0])!r} per layer"
    return float("nan"), ""


def verdict(info: dict[str, Any], shape: MoeShape | None, probe: pd.DataFrame | None = None) -> dict[str, Any]:
    """'not MoE', 'already grouped', 'per-expert' (with the estimated cost), or 'undecided', with the numbers."""
    if shape is not None and not shape.is_moe:
        return {"verdict": "not MoE", "why": f"the model has {shape.experts} experts in {shape.moe_layers} layers"}
    if shape is None:
        return {"verdict": "undecided", "why": "the model's config (experts, top-k, layers) could not be read"}
    if info["grouped_paths"]:
        return {"verdict": "already grouped", "paths": info["grouped_paths"]}
    per = info["dense_launches_per_layer_step"]
    threshold = DENSE_PER_LAYER + shape.top_k
    if known(per) and per > threshold:
        # the products beyond a dense layer's are the experts': their time, and what a grouped product saves on it
        expert_share_of_dense = max(0.0, (per - DENSE_PER_LAYER) / per)
        expert_ms = info["dense_ms"] * expert_share_of_dense
        speedup = float("nan")
        if probe is not None and len(probe):
            speedup = float(probe.sort_values("tokens")["speedup"].iloc[-1])
        saving = expert_ms * (1 - 1 / speedup) / info["total_ms"] if known(speedup) and speedup > 0 else float(
            "nan")
        return {"verdict": "per-expert", "dense_per_layer_step": per, "threshold": threshold,
                "expert_ms": expert_ms, "expert_share": expert_ms / info["total_ms"] if info["total_ms"] else np.nan,
                "probe_speedup": speedup, "saving_share": saving}
    if info["moe_kernels"]:
        return {"verdict": "undecided", "why": "MoE kernels ran under a name servescope does not classify "
                f"({', '.join(info['paths']['moe_path'])}), and dense products per layer per step "
                f"({per:.1f}) do not show a per-expert loop"}
    return {"verdict": "undecided", "why": f"no MoE kernel by name, and {per:.1f} dense products per layer per step "
            f"(threshold {threshold}) do not show a per-expert loop"}


@dataclass
class MoeStudy:
    """The profiled point of the engine's defaults, the model's MoE shape, and the ceiling probe (or why not)."""

    study: Study
    shape: MoeShape | None
    output_len: int = 64  # tokens per request of the load (and of its profiled window)
    probe: ProbeRun = field(default_factory=ProbeRun)  # the ceiling probe: its rows and what ran, or why not
    probe_cut: str = ""  # how the probe's layer is one GPU's share of the deployment's ('' where the whole layer)

    def kernels(self) -> pd.DataFrame:
        """The stored kernel table(s) of the profiled point, with categories and MoE path."""
        return self.study.kernels()

    def window_steps(self) -> float | None:
        """Forward steps the profiled window's load implies (requests x output tokens / concurrency)."""
        w = self.study.results.profiles
        if w.empty:
            return None
        r = w.iloc[0]
        return float(r.get("requests", 0)) * self.output_len / max(1, float(r.get("concurrency", 1)))

    def info(self) -> dict[str, Any] | None:
        """path_of on the first profiled repetition's kernels, or None when nothing was profiled."""
        k = self.kernels()
        if k.empty:
            return None
        first = k[k["rep"] == k["rep"].min()]
        return path_of(first, self.shape, self.window_steps())

    def categories(self) -> pd.DataFrame:
        """Kernel time by category (ms, launches, share of all kernel time)."""
        i = self.info()
        return i["categories"] if i else pd.DataFrame()

    def moe_paths(self) -> pd.DataFrame:
        """Each MoE path that ran: its kernel time, launches, share and an example kernel name."""
        i = self.info()
        return i["paths"] if i else pd.DataFrame()

    def launches(self) -> pd.DataFrame:
        """Launches per MoE layer per step (and dense products per layer per step), with how steps were counted."""
        i = self.info()
        if not i:
            return pd.DataFrame()
        return pd.DataFrame([{"device": i["device"], "kernel_ms": i["total_ms"], "moe_kernels": i["moe_kernels"],
                              "moe_share": i["moe_share"], "steps": i["steps"], "steps_from": i["steps_from"],
                              "moe_launches_per_layer_step": i["moe_launches_per_layer_step"],
                              "dense_launches_per_layer_step": i["dense_launches_per_layer_step"]}])

    def top_kernels(self, n: int = 12) -> pd.DataFrame:
        """The kernels (or CPU ops) with the most time."""
        k = self.kernels()
        return drop_empty(ak.top_kernels(k, n)) if len(k) else k

    def verdict(self) -> dict[str, Any]:
        """See verdict()."""
        i = self.info()
        if self.shape is not None and not self.shape.is_moe:
            return verdict({}, self.shape)
        if i is None:
            return {"verdict": "undecided", "why": "no kernel table: the profiled point was not measured"}
        return verdict(i, self.shape, self.probe)


def run(ctx: RunContext, probe: bool = True) -> MoeStudy:
    """Measure (or read) one profiled point of the engine's defaults and run the ceiling probe on the model's expert
    shapes for the sweep's token counts (kept in the store for offline renders)."""
    def measuring(c: RunContext) -> RunContext:  # the suite asked for no profile: this thread needs one
        return profiled_once(c, c.profile if c.profile.kind != "none" else ProfileSpec(kind=default_profile(c)))
    study, _ = read_or_run(THREAD, ctx, [Arm(DEFAULTS, Knobs(), "the engine's defaults, profiled")],
                           reuse=_profiled, measuring=measuring)
    ms = MoeStudy(study, shape_of(ctx.model), output_len=ctx.load.output_len)
    if probe and ms.shape is not None and ms.shape.is_moe:
        _probe(ms, ctx)
    return ms


def profiled_once(ctx: RunContext, prof: ProfileSpec) -> RunContext:
    """The context of one profiled launch: one repetition, under prof, with its own load (profiled_load)."""
    return ctx.with_(plan=RepetitionPlan(1, 1), profile=prof, load=profiled_load(prof, ctx.load))


def profiled_load(prof: ProfileSpec, load: LoadSpec) -> LoadSpec:
    """The profiled point's own load: a closed loop only at the window's level. This thread reads the window alone;
    the point's level there warms every batch shape the window reaches, and the lower levels (the longest part of
    a point on a CPU) would only repeat what threads 01-05 measured without a profiler armed."""
    if load.mode != "closed":
        return load
    return load.model_copy(update={"concurrency": window_load(prof, load).concurrency})


def _profiled(res: Results) -> tuple[Results, list[Arm]] | None:
    """A profiled point of this engine and model already in the store (the engine's defaults first, else the first
    configuration by name), as one arm; None when the store holds none."""
    if res.kernels.empty:
        return None
    names = sorted(set(res.kernels["config"]))
    defaults = res.engine_default_configs()
    pick = next((n for n in names if n in defaults), names[0])
    one = res.select([pick])
    one.kernels = one.kernels[one.kernels["rep"] == one.kernels["rep"].min()]
    return one, [Arm(pick, Knobs(), f"{pick}: a profiled point read from the store")]


def default_profile(ctx: RunContext) -> str:
    """nsys for an engine on CUDA (every engine runs under it), the PyTorch profiler for a CPU build."""
    try:
        install = find_install(ctx.engine, ctx.adapter)
    except ServescopeError as ex:
        raise SpecError(f"thread 06 needs a kernel profile and cannot tell which kind suits this engine ({ex}): "
                        "give profile {kind: torch} or {kind: nsys}") from None
    return "nsys" if install is not None and install.platform == "cuda" else "torch"


def _probe(ms: MoeStudy, ctx: RunContext) -> None:
    """The ceiling probe on the model's expert shapes, kept like a point (offline renders read the kept answer)."""
    load, install = ctx.load, ms.study.install
    assert ms.shape is not None
    # the layer one GPU of the deployment runs (a whole layer of a model served with TP=8 is 8 GPUs' work)
    s, ms.probe_cut = per_gpu(ms.shape, ctx.deployed(Knobs()))
    parts = {"engine": ctx.engine_identity, "shape": s.__dict__, "tokens": sorted(set(load.concurrency))}

    device = "cuda" if install is not None and install.platform == "cuda" else "cpu"
    dtype = s.dtype if s.dtype in ("bfloat16", "float16", "float32") else "bfloat16"
    ms.probe = kept_probe(ctx, "moe_ceiling", parts, install, lambda inst: probes.moe_ceiling(
        inst.python, s.experts, s.top_k, s.hidden, s.inter, sorted(set(load.concurrency)), device=device,
        dtype=dtype, env=inst.env))


def findings(ms: MoeStudy) -> list[Finding]:
    """One finding: the MoE path and its share, launches per layer per step, and the verdict with the probe."""
    v = ms.verdict()
    i = ms.info()
    s = ms.shape
    probe = _probe_words(ms)
    ev: dict[str, Any] = {"verdict": v, "shape": s.__dict__ if s else None, "probe": ms.probe.rows.to_dict("records"),
                          "probe_info": ms.probe.info}
    if ms.probe.outcome is not None:
        ev["probe_outcome"] = ms.probe.to_kept()["outcome"]
    if i is not None:
        ev |= {"categories": i["categories"].to_dict("records"), "paths": i["paths"].to_dict("records"),
               "launches": ms.launches().to_dict("records")}
    if v["verdict"] == "not MoE":
        return [Finding(thread=THREAD, kind="kernel_path", title="Not a mixture-of-experts model", applies=False,
                        confidence="high", headline=f"Grouped GEMM does not apply: {v['why']}", reason=v["why"],
                        evidence=ev)]
    if i is None:
        errs = ms.study.results.errors
        first = f": {errs['summary'].iloc[0]}" if len(errs) else ""
        return [Finding(thread=THREAD, kind="failure", title="MoE path: not measured", applies=False,
                        confidence="none", headline=f"No kernel table of the engine's defaults was measured{first}",
                        reason=v["why"], evidence=ev)]
    where = f"{i['device']} time"
    kinds = [x for x in i.get("moe_launch_kinds", []) if x["per_layer_step"] == x["per_layer_step"]]
    launch = (f"{i['moe_launches_per_layer_step']:.1f} MoE launches per MoE layer per step"
              + (" (" + ", ".join(f"{x['kernel']} {x['per_layer_step']:.1f}" for x in kinds[:6])
                 + (f", {len(kinds) - 6} more" if len(kinds) > 6 else "") + ")" if kinds else "")
              if known(i["moe_launches_per_layer_step"]) else "")
    steps = f" ({i['steps']:.0f} forward steps in the window, from {i['steps_from']})" if known(i["steps"]) \
        else ""
    if v["verdict"] == "already grouped":
        p = i["paths"]
        names = ", ".join(f"{r.moe_path} ({r.share:.1%} of {where}, {r.kernels} launches)" for r in p.itertuples()
                          if r.moe_path in v["paths"])
        return [Finding(thread=THREAD, kind="kernel_path", title=f"MoE already grouped: {', '.join(v['paths'])}",
                        applies=False, confidence="high" if launch and i["moe_launches_per_layer_step"] <= 6 else
                        "medium", reason="already optimal: the MoE path is grouped",
                        headline=f"The experts already run as one grouped product per layer: {names}; {launch}{steps}",
                        detail=probe, evidence=ev, optimal=True)]
    if v["verdict"] == "per-expert":
        cost = (f" A grouped product would save about {v['saving_share']:.0%} of {where} (the experts' "
                f"{v['expert_share']:.0%} share, sped up {v['probe_speedup']:.1f}x as the probe measured at the "
                f"largest token count)" if known(v["saving_share"]) else
                f" The experts' products take about {v['expert_share']:.0%} of {where}; the probe did not run, so "
                "what a grouped product saves is not measured")
        headline = (f"The experts run one by one: {v['dense_per_layer_step']:.0f} dense matrix products per layer "
                    f"per step{steps}, above the {v['threshold']} a layer with grouped experts launches "
                    f"(top-{s.top_k if s else '?'}), and no grouped MoE kernel by name")
        return [Finding(thread=THREAD, kind="kernel_path", title="MoE runs per expert: switch to a grouped GEMM",
                        applies=True, confidence="medium", headline=headline, detail=f"{cost.strip()}. {probe}",
                        evidence=ev, change=Change(flags=ms.study.adapter.grouped_moe_flags(),
                                                   words=ms.study.adapter.grouped_moe_advice()))]
    return [Finding(thread=THREAD, kind="kernel_path", title="MoE path: undecided", applies=False, confidence="none",
                    headline=f"The kernel table does not say how the experts ran: {v['why']}", detail=probe,
                    reason=v["why"], evidence=ev)]


def _probe_words(ms: MoeStudy) -> str:
    p, info = ms.probe.rows, ms.probe.info
    if p.empty:
        return f"Ceiling probe: not run ({ms.probe.why_not})."
    rows = "; ".join(f"{int(r.tokens)} tokens: loop {r.loop_ms:.3f} ms vs grouped {r.grouped_ms:.3f} ms "
                     f"({r.speedup:.1f}x, {int(r.launches_loop)} vs {int(r.launches_grouped)} launches)"
                     for r in p.itertuples())
    cut = f"; {ms.probe_cut}" if ms.probe_cut else ""
    return (f"Ceiling probe on these expert shapes, one MoE layer ({info.get('grouped_method', 'grouped')}, "
            f"{info.get('device', '')}{cut}): {rows}.")
