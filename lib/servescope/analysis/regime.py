"""One regime per load point (or trace window): what limited the GPU, decided from every piece of evidence the run
has (the load generator's records, NVML with GPM or the DCGM exporter's profiling fields, the server's threads,
a kernel trace), with the numbers that decided it, the named thresholds, and what to try.

Where the evidence cannot separate two regimes the verdict is 'undecided' and names them, with the reading that
would have told them apart; nothing is guessed. Each rule has a known-answer case recorded on an H200
(tests/fixtures/h200/regimes, tests/fixtures/h200_profiles; see their READMEs)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import pandas as pd

from ..util import known
from . import kernels as ak

REGIMES = ("idle", "client-limited", "under-loaded", "host-bound", "launch-bound", "latency-bound",
           "memory-bandwidth-bound", "compute-bound", "power-capped", "thermal-throttled", "hw-slowdown")
# a regime where the server had more to give than the load asked of it: the level at which it first saturated is named
NOT_SATURATED = ("idle", "client-limited", "under-loaded", "undecided")
THERMAL = ("sw_thermal_slowdown", "hw_thermal_slowdown")
HW = ("hw_slowdown", "hw_power_brake_slowdown")
NAN = float("nan")
Confidence = Literal["high", "medium", "low", "none"]


@dataclass(frozen=True)
class RegimeThresholds:
    """Every number a verdict compares against, named so reports quote them."""

    idle_util_pct: float = 10.0  # NVML "utilization" (a kernel was running) below this: the GPU mostly waits
    busy_util_pct: float = 80.0  # at or above: the GPU ran kernels nearly all the time
    host_saturated_pct: float = 80.0  # a server thread at this share of one core saturates it (the GIL and
    # the sampler's 0.5 s windows keep a saturated Python thread at 80-100%: seen on the H200 recordings)
    tiny_kernel_sm_ratio: float = 0.25  # SM activity below this fraction of "utilization": kernels fill few SMs
    sm_active_low_pct: float = 30.0  # GPU "busy" yet SMs active less than this: small kernels, not work
    dram_bw_high_pct: float = 60.0  # GPM / DCGM DRAM bandwidth (share of peak) at or above: memory-bound
    nvml_mem_util_high_pct: float = 60.0  # NVML memory utilization (no GPM): the weaker sign of the same
    tensor_active_high_pct: float = 30.0  # tensor pipes at least this busy: matmul work
    sm_active_high_pct: float = 80.0  # SMs active at least this much: the GPU's compute is in use (an FP32 matmul on
    # CUDA cores read 97% with its tensor pipes idle); between sm_active_low_pct and this, with tensor pipes and DRAM
    # far from their peaks, kernels run one after another without filling the GPU: latency-bound
    power_cap_pct: float = 95.0  # of the enforced limit
    full_clock_pct: float = 90.0  # SM clock as % of its maximum
    low_power_pct: float = 50.0  # a GPU "busy" below this share of its limit does little work
    reason_share: float = 0.2  # a clock-event reason counts when set in this share of readings
    trace_busy_pct: float = 50.0  # a trace window with kernels running less than this: the GPU waits
    launch_share: float = 0.3  # launch-API time as a share of the window: the host spends it launching
    launch_kernels_per_s: float = 20000.0  # with short kernels: launched faster than they can be fed
    short_kernel_us: float = 10.0
    kernel_share: float = 0.6  # kernel-name categories (matmul vs copy/elementwise) deciding a busy trace
    underloaded_util_pct: float = 50.0  # NVML "utilization" below this with no hot server thread: the GPU waits for
    # requests, not for the host (seen on the H200: transformers at c=1, the GPU busy a few percent, 5% of a core)
    underloaded_thread_pct: float = 50.0  # the busiest server thread below this share of a core: far from saturating
    headroom_x: float = 1.5  # a higher level of the same sweep served this many times the output tok/s: room left
    cpu_cores_full_pct: float = 80.0  # a CPU server's processes at this share of its cores: the cores are full
    min_gpu_samples: int = 5  # fewer GPU readings than this (a level over in a few tenths of a second) tell nothing:
    # GPM's per-interval activity swings from 0 to 40% between neighbouring 0.1 s readings (seen on the H200 with
    # SGLang at c=32, 3 readings per level)


ACTIONS = {
    "idle": "No request completed here, so nothing measured the server: check the load's target, the model name "
            "and the point's errors.",
    "client-limited": "The load generator was the limit: rerun with more client processes or a rate it can keep; "
                      "the server's figures at this point understate it.",
    "under-loaded": "The offered load was the limit: the server waited for requests. Raise the concurrency or the "
                    "request rate (the level where it first saturated is named) before tuning the server; its "
                    "figures here say little about its capacity.",
    "host-bound": "A server thread saturates a core while the GPU waits: cut host work per step (more requests per "
                  "step, the engine's overlap or async scheduler, detokenization off the scheduler thread); CUDA "
                  "graphs remove only the launch share of it.",
    "launch-bound": "Kernels are too small or too sparse to keep the GPU busy: capture CUDA graphs (piecewise or "
                    "full), fuse kernels (torch.compile), or put more tokens in each step.",
    "memory-bandwidth-bound": "DRAM bandwidth is near its peak and the tensor pipes mostly idle: more tokens per "
                              "weight read (larger batches), fewer bytes (FP8 weights or KV cache); CUDA graphs "
                              "will not help.",
    "latency-bound": "Kernels run back to back but each uses little of the GPU (neither its SMs, its tensor pipes "
                     "nor its DRAM bandwidth near their peaks): too few tokens per step to fill it. More tokens per "
                     "step (a higher concurrency, larger batches) raise throughput almost for free; fewer, larger "
                     "kernels (fused or grouped MoE GEMMs) shorten each step; CUDA graphs will not help: the GPU is "
                     "already fed.",
    "compute-bound": "The GPU is doing the work: gains now come from lower precision (FP8), better kernels or "
                     "more GPUs.",
    "power-capped": "Power is at the enforced limit and clocks are pulled down: more work per joule (lower "
                    "precision, no wasted tokens) or a higher power limit, an administrator's setting.",
    "thermal-throttled": "Clocks are pulled down for temperature: check the node's cooling.",
    "hw-slowdown": "A hardware slowdown or power brake is active: check the node (power supply, cooling).",
    "undecided": "The readings here cannot separate these regimes; the missing reading is named above.",
}
# a CPU build computes on the host's cores: no GPU, no CUDA graphs, no more GPUs to add
CPU_ACTIONS = {
    "compute-bound": "The server's cores are doing the work: gains now come from more or faster cores (the CPU "
                     "build's AVX-512/AMX kernels), lower precision, or a GPU.",
    "launch-bound": "Operators are too small or too sparse to keep the cores busy: fuse them (torch.compile) or put "
                    "more tokens in each step.",
}


@dataclass
class Evidence:
    """The readings of one point (NaN or None where absent), from whichever sources the run had."""

    requests_sent: float = NAN  # load generator records
    requests_completed: float = NAN
    client_limited: bool | None = None
    client_warning: str = ""
    gpu_util_pct: float = NAN  # NVML
    mem_util_pct: float = NAN
    power_pct_of_limit: float = NAN
    sm_clock_pct_of_max: float = NAN
    reason_shares: dict[str, float] = field(default_factory=dict)
    sm_active_pct: float = NAN  # GPM or DCGM profiling
    dram_bw_util_pct: float = NAN
    tensor_active_pct: float = NAN
    busiest_thread_cpu_pct: float = NAN  # host sampler
    busiest_thread: str = ""
    trace_busy_pct: float = NAN  # kernel trace
    kernels_per_s: float = NAN
    kernel_us_p50: float = NAN
    launch_share: float = NAN
    lead_in_ms: float = NAN
    tail_ms: float = NAN
    gemm_share: float = NAN
    memory_share: float = NAN
    gpu_why_missing: str = ""  # why there are no GPU counters (no GPU, NVML error)
    gpu_samples: float = NAN  # GPU readings behind the medians (a level shorter than a few sampling intervals)
    server_cpu_pct: float = NAN  # the server's processes together, % of one core (host sampler)
    server_cores: float = NAN  # a CPU server's cores (it computes on them); NaN for a GPU server
    headroom_x: float = NAN  # the most output tok/s a higher level of the same sweep served, over this point's
    headroom_point: str = ""  # that level

    def has(self, name: str) -> bool:
        """Whether a reading is present."""
        v = getattr(self, name)
        return v is not None and not (isinstance(v, float) and math.isnan(v))


@dataclass
class Regime:
    """A verdict: the regime (or 'undecided' with the candidates), why in words, the numbers that decided it,
    the thresholds it used, what to try, what was missing, and how sure."""

    regime: str
    because: str
    evidence: dict[str, Any]
    confidence: Confidence
    candidates: tuple[str, ...] = ()
    missing: list[str] = field(default_factory=list)
    thresholds: dict[str, float] = field(default_factory=dict)

    @property
    def action(self) -> str:
        """What to try, in words (for a server that computes on the CPU, in its terms where they differ)."""
        if "server_cores" in self.evidence and self.regime in CPU_ACTIONS:
            return CPU_ACTIONS[self.regime]
        return ACTIONS.get(self.regime, "")

    def headline(self) -> str:
        """The verdict and its because, as one sentence without its period."""
        head = (f"undecided between {', '.join(self.candidates)}" if self.regime == "undecided" else self.regime)
        return f"{head}: {self.because}"

    def missing_words(self) -> str:
        """'Missing: ...' (the readings the verdict lacked), or ''."""
        return f"Missing: {'; '.join(self.missing)}." if self.missing else ""

    def words(self) -> str:
        """The verdict as one sentence an engineer acts on."""
        tail = self.missing_words()
        return f"{self.headline()}." + (f" {tail}" if tail else "")

    def as_dict(self) -> dict[str, Any]:
        """Plain data for findings and tables."""
        d = asdict(self)
        d["candidates"] = list(self.candidates)
        d["action"] = self.action
        return d


def _fmt(v: float, unit: str = "%") -> str:
    return f"{v:.0f}{unit}" if abs(v) >= 10 else f"{v:.1f}{unit}"


def decide(ev: Evidence, th: RegimeThresholds = RegimeThresholds()) -> Regime:
    """The regime of one point from its evidence (see the module docstring)."""
    used = {k: v for k, v in asdict(ev).items() if v not in (None, "") and not (isinstance(v, float) and math.isnan(v))
            and k != "reason_shares"}
    shares = {k: v for k, v in ev.reason_shares.items() if not math.isnan(v)}
    if shares:
        used["reason_shares"] = shares

    def out(regime: str, because: str, conf: Confidence, candidates: tuple[str, ...] = (),
            missing: list[str] | None = None) -> Regime:
        return Regime(regime, because, used, conf, candidates or (regime,), missing or [], asdict(th))

    # 1. the load generator's own records: no completed request means no load reached the GPU
    if ev.has("requests_completed") and ev.requests_completed == 0:
        sent = f"sent {ev.requests_sent:.0f} requests" if ev.has("requests_sent") else "ran"
        return out("idle", f"the load generator {sent} and none completed: no load reached the server", "high")
    if ev.client_limited:
        return out("client-limited", f"the load generator limited this point ({ev.client_warning})", "high")

    host_hot = ev.has("busiest_thread_cpu_pct") and ev.busiest_thread_cpu_pct >= th.host_saturated_pct
    host_words = (f"the server's busiest thread ({ev.busiest_thread or '?'}) used "
                  f"{_fmt(ev.busiest_thread_cpu_pct)} of a core" if ev.has("busiest_thread_cpu_pct") else "")
    launch_trace = ev.has("trace_busy_pct") and (
        (ev.has("launch_share") and ev.launch_share >= th.launch_share)
        or (ev.has("kernels_per_s") and ev.kernels_per_s >= th.launch_kernels_per_s
            and ev.has("kernel_us_p50") and ev.kernel_us_p50 <= th.short_kernel_us))
    trace_words = _trace_words(ev)

    if not ev.has("gpu_util_pct"):
        return _trace_only(ev, th, out, host_hot, host_words, launch_trace, trace_words)

    # 2. clocks pulled down: these override what the GPU was doing
    for names, regime, what in ((THERMAL, "thermal-throttled", "thermal slowdown"),
                                (HW, "hw-slowdown", "hardware slowdown / power brake")):
        hit = {n: shares[n] for n in names if shares.get(n, 0.0) >= th.reason_share}
        if hit:
            return out(regime, f"NVML reports {what} in " + ", ".join(f"{100 * v:.0f}%" for v in hit.values())
                       + " of readings", "high")
    capped_reason = shares.get("sw_power_cap", 0.0) >= th.reason_share
    clock_low = ev.has("sm_clock_pct_of_max") and ev.sm_clock_pct_of_max < th.full_clock_pct
    if ev.has("power_pct_of_limit") and ev.power_pct_of_limit >= th.power_cap_pct and (capped_reason or clock_low):
        return out("power-capped", f"power at {_fmt(ev.power_pct_of_limit)} of the limit, SM clock at "
                   f"{_fmt(ev.sm_clock_pct_of_max)} of max" + (f", NVML's SW power cap set in "
                   f"{100 * shares['sw_power_cap']:.0f}% of readings" if capped_reason else ""), "high")

    if ev.has("gpu_samples") and ev.gpu_samples < th.min_gpu_samples:
        return out("undecided", f"the level was over after {ev.gpu_samples:.0f} GPU readings (fewer than "
                   f"{th.min_gpu_samples}): too few to tell what limited it", "none",
                   ("host-bound", "launch-bound", "compute-bound"),
                   ["a longer level (more requests, or load.duration_s) for enough GPU readings"])
    util = ev.gpu_util_pct
    util_words = f"NVML utilization {_fmt(util)}"
    gpm = ev.has("sm_active_pct")
    # 3. the GPU waits for work
    # (NVML's reading spans the whole point; a trace window is short and may miss kernels longer than itself, so
    # the trace refines what the GPU waited for but never overrules a GPU that NVML saw busy)
    if util < th.busy_util_pct:
        tiny = gpm and util >= th.idle_util_pct and ev.sm_active_pct < th.tiny_kernel_sm_ratio * util
        if launch_trace:
            return out("launch-bound", trace_words + (f"; {host_words}" if host_words else ""), "high")
        under = _under_loaded(ev, th, util, util_words, host_words, out)
        if under is not None:
            return under
        if trace_words and (host_hot or not ev.has("busiest_thread_cpu_pct")):
            return out("host-bound", f"{trace_words}: the GPU waits while the host does other work than launching"
                       + (f"; {host_words}" if host_words else ""), "high" if host_hot else "medium")
        if tiny:
            return out("launch-bound", f"{util_words} but SMs active {_fmt(ev.sm_active_pct)}: each kernel fills "
                       "a few SMs for a few microseconds" + (f"; {host_words}" if host_words else ""), "high")
        if host_hot:
            return out("host-bound", f"{host_words} while the GPU ran kernels {_fmt(util)} of the time",
                       "high" if gpm else "medium", missing=[] if gpm else [
                           "a kernel trace (profile: torch or nsys) or GPM would tell whether the thread is "
                           "launching small kernels (launch-bound)"])
        if not ev.has("busiest_thread_cpu_pct"):
            return out("undecided", f"{util_words}: the GPU waited, and nothing read the server's threads",
                       "none", ("host-bound", "launch-bound"), ["the server's threads (host sampler)"])
        return out("undecided", f"{util_words} and no server thread saturated a core ({host_words}): the wait "
                   "is elsewhere (too little load for this server, synchronisation, I/O)", "low",
                   ("host-bound", "launch-bound"), [])

    # 4. the GPU runs kernels nearly all the time: which resource do they use?
    if gpm:
        if ev.has("dram_bw_util_pct") and ev.dram_bw_util_pct >= th.dram_bw_high_pct:
            return out("memory-bandwidth-bound", f"DRAM bandwidth at {_fmt(ev.dram_bw_util_pct)} of peak, tensor "
                       f"pipes {_fmt(ev.tensor_active_pct)} active, {util_words}", "high")
        if ev.sm_active_pct < th.sm_active_low_pct:
            return out("launch-bound", f"{util_words} but SMs active only {_fmt(ev.sm_active_pct)}: small "
                       "kernels back to back", "high")
        used = (f"SMs active {_fmt(ev.sm_active_pct)}, tensor pipes {_fmt(ev.tensor_active_pct)}, DRAM bandwidth "
                f"{_fmt(ev.dram_bw_util_pct)} of peak")
        if ev.sm_active_pct >= th.sm_active_high_pct or (ev.has("tensor_active_pct")
                                                        and ev.tensor_active_pct >= th.tensor_active_high_pct):
            return out("compute-bound", used, "high")
        return out("latency-bound", f"{util_words}, yet {used}: kernels one after another, none filling the GPU",
                   "high" if ev.has("tensor_active_pct") and ev.has("dram_bw_util_pct") else "medium")
    if launch_trace:
        return out("launch-bound", trace_words, "medium")
    if ev.has("mem_util_pct") and ev.mem_util_pct >= th.nvml_mem_util_high_pct:
        return out("memory-bandwidth-bound", f"NVML memory utilization {_fmt(ev.mem_util_pct)} with {util_words} "
                   "(the memory controller busy that share of the time; GPM's DRAM bandwidth would confirm)",
                   "medium", missing=["DRAM bandwidth (GPM, Hopper or newer; or DCGM)"])
    low_power = ev.has("power_pct_of_limit") and ev.power_pct_of_limit < th.low_power_pct and not clock_low
    if low_power and ev.has("mem_util_pct"):  # memory-bound work keeps the memory controller busy; this does not
        return out("launch-bound", f"{util_words} at full clocks, yet {_fmt(ev.power_pct_of_limit)} of the power "
                   f"limit and NVML memory utilization {_fmt(ev.mem_util_pct)}: small kernels back to back",
                   "medium", missing=["SM activity (GPM or DCGM) to confirm"])
    if low_power:
        return out("undecided", f"{util_words} at full clocks but {_fmt(ev.power_pct_of_limit)} of the power "
                   "limit: kernels that wait (small, latency- or launch-limited)", "low",
                   ("launch-bound", "memory-bandwidth-bound"), ["SM activity and DRAM bandwidth (GPM or DCGM)"])
    return out("compute-bound", f"{util_words}, NVML memory utilization {_fmt(ev.mem_util_pct)}, power "
               f"{_fmt(ev.power_pct_of_limit)} of the limit", "medium",
               missing=["SM activity and DRAM bandwidth (GPM or DCGM) to confirm"])


def _headroom_words(ev: Evidence) -> str:
    return (f"{ev.headroom_point} in this sweep served {ev.headroom_x:.1f}x the output tok/s on the same server"
            if ev.has("headroom_x") else "")


def _under_loaded(ev: Evidence, th: RegimeThresholds, util: float, util_words: str, host_words: str,
                  out: Any) -> Regime | None:
    """A GPU server that waited for requests: they completed, the client kept up, the GPU was mostly idle and no
    server thread came near a full core (or one below saturation, where a higher level of the sweep served more)."""
    if not (ev.has("requests_completed") and ev.requests_completed > 0 and ev.has("busiest_thread_cpu_pct")):
        return None
    room = ev.has("headroom_x") and ev.headroom_x >= th.headroom_x
    cold = ev.busiest_thread_cpu_pct < th.underloaded_thread_pct or (
        ev.busiest_thread_cpu_pct < th.host_saturated_pct and room)
    if util >= th.underloaded_util_pct or not cold:
        return None
    power = f", power {_fmt(ev.power_pct_of_limit)} of the limit" if ev.has("power_pct_of_limit") else ""
    said = (f"{util_words}{power} and no server thread near a full core ({host_words}), with every request "
            "completed and the client keeping up: the server waited for requests")
    return out("under-loaded", said + (f"; {_headroom_words(ev)}" if room else ""), "high" if room else "medium",
               missing=[] if room else ["a higher load level in the same sweep that served more"])


def _cpu_server(ev: Evidence, th: RegimeThresholds, out: Any, host_hot: bool, host_words: str) -> Regime:
    """A server that computes on the CPU: its cores are the device. Their busy share cannot tell work from threads
    that spin while waiting (vLLM's CPU worker reads 95% of a core at every level), so the sweep decides first:
    a higher level that served more shows the server had room."""
    cores = ev.server_cores
    busy = 100 * ev.server_cpu_pct / (100 * cores) if ev.has("server_cpu_pct") else NAN
    cores_words = (f"the CPU server's processes used {_fmt(ev.server_cpu_pct)} of one core over its {cores:.0f} "
                   f"cores ({_fmt(busy)} of them)" if known(busy) else f"the CPU server has {cores:.0f} cores")
    room = ev.has("headroom_x") and ev.headroom_x >= th.headroom_x
    if room:
        return out("under-loaded", f"{_headroom_words(ev)}: the server had room, and the load did not ask for it "
                   f"({cores_words}; on a CPU engine that share includes threads spinning while they wait)",
                   "medium")
    if known(busy) and busy >= th.cpu_cores_full_pct:
        top = "no higher level of this sweep" if not ev.has("headroom_x") else \
            f"{ev.headroom_point} served only {ev.headroom_x:.2f}x as much"
        return out("compute-bound", f"{cores_words}, and {top}: its cores are the limit", "medium",
                   missing=[] if ev.has("headroom_x") else ["a higher load level, to show the cores were doing work"])
    if host_hot:
        return out("host-bound", f"{host_words} while the server's cores were not full ({cores_words})", "medium")
    if known(busy) and ev.has("requests_completed") and ev.requests_completed > 0:
        return out("under-loaded", f"{cores_words} and no thread saturated one: the server waited for requests",
                   "medium")
    return out("undecided", f"{cores_words}; the server's processes were not read", "none",
               ("under-loaded", "host-bound", "compute-bound"), ["the server's processes (host sampler)"])


def _trace_only(ev: Evidence, th: RegimeThresholds, out: Any, host_hot: bool, host_words: str, launch_trace: bool,
                trace_words: str) -> Regime:
    """No GPU counters: the trace (and the host) decide what they can; a CPU server's own cores decide for it."""
    why = ev.gpu_why_missing or "no GPU counters were read"
    if ev.has("server_cores") and not ev.has("trace_busy_pct"):
        return _cpu_server(ev, th, out, host_hot, host_words)
    if not ev.has("trace_busy_pct"):
        if host_hot:
            return out("undecided", f"{host_words}; {why}", "low", ("host-bound", "launch-bound", "compute-bound"),
                       ["GPU counters (NVML) or a kernel trace"])
        return out("undecided", why, "none", tuple(r for r in REGIMES if r not in ("idle", "client-limited")),
                   ["GPU counters (NVML) or a kernel trace"])
    if ev.has("kernels_per_s") and ev.kernels_per_s == 0:
        return out("idle", "no kernel ran in the trace window", "medium")
    if ev.trace_busy_pct < th.trace_busy_pct:
        if launch_trace:
            return out("launch-bound", trace_words, "high")
        return out("host-bound", trace_words + (f"; {host_words}" if host_words else "; the GPU waited between "
                   "sparse kernels while launch calls took little of the host's time"),
                   "high" if host_hot else "medium")
    if ev.has("gemm_share") and ev.gemm_share >= th.kernel_share:
        return out("compute-bound", f"{trace_words}; matmul kernels take {_fmt(100 * ev.gemm_share)} of GPU time",
                   "low", missing=["SM activity and DRAM bandwidth (GPM or DCGM) to confirm"])
    if ev.has("memory_share") and ev.memory_share >= th.kernel_share:
        return out("memory-bandwidth-bound", f"{trace_words}; copies and elementwise kernels take "
                   f"{_fmt(100 * ev.memory_share)} of GPU time", "low",
                   missing=["DRAM bandwidth (GPM or DCGM) to confirm"])
    return out("undecided", trace_words, "low", ("compute-bound", "memory-bandwidth-bound"),
               ["SM activity and DRAM bandwidth (GPM or DCGM)"])


# -- evidence builders ----------------------------------------------------------------------------------------
def trace_evidence(kernels: pd.DataFrame, runtime: pd.DataFrame | None = None,
                   window_ns: tuple[int, int] | None = None) -> dict[str, float]:
    """The trace's readings over a window (default: the whole trace): busy share with the window's lead-in and
    tail, kernels per second, median kernel, launch-API share of the window, matmul and copy shares."""
    if kernels.empty:
        span = (window_ns[1] - window_ns[0]) if window_ns else 0
        return {"trace_busy_pct": 0.0, "kernels_per_s": 0.0, "window_ms": span / 1e6} if window_ns else {}
    host = kernels["device"] < 0  # CPU ops of a torch trace beside GPU kernels: the GPU's kernels decide
    k = kernels[~host] if host.any() and not host.all() else kernels
    w0, w1 = window_ns if window_ns else (None, None)
    b = ak.busy(k, w0, w1)
    r = b.iloc[0] if len(b) == 1 else b.sort_values("kernel_time_ms").iloc[-1]
    lo = ak.launch_overhead(runtime, k, w0, w1) if runtime is not None and len(runtime) else {}
    kk = ak.with_categories(ak.clip(k, w0, w1))
    total = float(kk["dur_ns"].sum()) or 1.0
    cat = kk.groupby("category", observed=True)["dur_ns"].sum() / total
    return {"trace_busy_pct": 100 * float(r.busy_fraction), "kernels_per_s": float(r.kernels_per_s),
            "kernel_us_p50": float(r.kernel_us_p50), "window_ms": float(r.window_ms),
            "launch_share": lo.get("launch_api_ms", NAN) / float(r.window_ms) if lo else NAN,
            "lead_in_ms": float(r.lead_in_ms), "tail_ms": float(r.tail_ms),
            "gemm_share": float(cat.get("dense_gemm", 0.0) + cat.get("moe_grouped_gemm", 0.0)
                                + cat.get("attention", 0.0)),
            "memory_share": float(cat.get("memory_copy", 0.0) + cat.get("elementwise_norm_activation", 0.0))}


def trace_regime(kernels: pd.DataFrame, runtime: pd.DataFrame | None = None,
                 window_ns: tuple[int, int] | None = None, th: RegimeThresholds = RegimeThresholds()) -> Regime:
    """The regime of a trace window on its own (no GPU counters, no load records)."""
    tr = trace_evidence(kernels, runtime, window_ns)
    ev = Evidence(gpu_why_missing="a trace alone has no GPU counters",
                  **{k: v for k, v in tr.items() if k in Evidence.__dataclass_fields__})
    return decide(ev, th)


def _num(row: Any, key: str) -> float:
    try:
        v = row[key]
    except (KeyError, IndexError, TypeError):
        return NAN
    try:
        return float(v)
    except (TypeError, ValueError):
        return NAN


def point_evidence(gpu: pd.Series | None = None, host: pd.Series | None = None, load: pd.Series | None = None,
                   trace: dict[str, float] | None = None, gpu_why_missing: str = "") -> Evidence:
    """Evidence of one point from its rows of the per-point tables (analysis.telemetry gpu_points / host_points,
    the load summary with client health) and its trace readings."""
    ev = Evidence(gpu_why_missing=gpu_why_missing)
    if load is not None:
        ev.requests_completed = _num(load, "completed")
        ev.requests_sent = _num(load, "completed") + _num(load, "failed")
        cl = load.get("client_limited") if hasattr(load, "get") else None
        ev.client_limited = bool(cl) if cl is not None and known(cl) else None
        ev.client_warning = str(load.get("client_warning") or "") if hasattr(load, "get") else ""
    if gpu is not None:
        for f in ("gpu_util_pct", "mem_util_pct", "sm_active_pct", "dram_bw_util_pct", "tensor_active_pct"):
            setattr(ev, f, _num(gpu, f"{f}_p50"))
        ev.power_pct_of_limit = _num(gpu, "power_pct_of_limit_p50")
        ev.gpu_samples = _num(gpu, "samples")
        ev.sm_clock_pct_of_max = _num(gpu, "sm_clock_pct_of_max_p50")
        ev.reason_shares = {k[len("reason_"):-len("_share")]: float(v) for k, v in gpu.items()
                            if str(k).startswith("reason_") and str(k).endswith("_share") and pd.notna(v)}
    if host is not None:
        ev.server_cpu_pct = _num(host, "server_cpu_pct_p50")
        ev.busiest_thread_cpu_pct = _num(host, "busiest_thread_cpu_pct_p50")
        ev.busiest_thread = str(host.get("busiest_thread") or "")
    for k, v in (trace or {}).items():
        if k in Evidence.__dataclass_fields__:
            setattr(ev, k, v)
    return ev


def _trace_words(ev: Evidence) -> str:
    """What a kernel trace of the level showed, each number only where the trace gave it (a CPU build's trace has no
    launch calls: it printed 'launch calls nan%'), and the device it ran on by name."""
    if not ev.has("trace_busy_pct"):
        return ""
    device = "the CPU server's cores" if ev.has("server_cores") else "the GPU"
    parts = [f"the trace shows {device} busy {_fmt(ev.trace_busy_pct)} of its window"]
    if ev.has("kernels_per_s") and ev.has("kernel_us_p50"):
        parts.append(f"{ev.kernels_per_s:,.0f} kernels/s of median {ev.kernel_us_p50:.1f} us")
    if ev.has("launch_share"):
        parts.append(f"launch calls {_fmt(100 * ev.launch_share)} of the window")
    return ", ".join(parts)


def regime_table(verdicts: list[tuple[dict[str, Any], Regime]], per_rep: bool = False) -> pd.DataFrame:
    """One row per verdict (per_rep) or, by default, per configuration, point and GPU and regime, with how many
    repetitions reached it ('2/3') and the words of the first: regime, confidence, why, what was missing, action."""
    rows = [{**ids, "regime": r.regime, "confidence": r.confidence,
             "candidates": ", ".join(r.candidates) if r.regime == "undecided" else "",
             "because": r.because, "missing": "; ".join(r.missing), "action": r.action}
            for ids, r in verdicts]
    df = pd.DataFrame(rows)
    if df.empty or per_rep or "rep" not in df:
        return df
    keys = [c for c in ("config", "point", "gpu") if c in df]
    n = df.groupby(keys, dropna=False, sort=False)["rep"].transform("nunique")
    df = df.assign(_n=n)
    out = df.groupby([*keys, "regime"], dropna=False, sort=False).agg(
        reps=("rep", "nunique"), of=("_n", "first"), confidence=("confidence", "first"),
        candidates=("candidates", "first"), because=("because", "first"), missing=("missing", "first"),
        action=("action", "first")).reset_index()
    out["reps"] = out["reps"].astype(str) + "/" + out["of"].astype(str)
    out = out.drop(columns="of")
    if "point" in out:  # levels in numeric order within each configuration
        lvl = pd.to_numeric(out["point"].astype(str).str.extract(r"(\d+(?:\.\d+)?)")[0], errors="coerce")
        out = out.assign(_l=lvl).sort_values(["config", "_l"], kind="stable").drop(columns="_l")
    return out.reset_index(drop=True)


__all__ = ["ACTIONS", "Evidence", "REGIMES", "Regime", "RegimeThresholds", "decide", "point_evidence", "point_level",
           "regime_table", "trace_evidence", "trace_regime"]


def point_level(point: str) -> float:
    """A point's load level: its concurrency or request rate ('rate=inf' is the highest)."""
    if "=inf" in point:
        return float("inf")
    m = pd.Series([point]).str.extract(r"(\d+(?:\.\d+)?)")[0].iloc[0]
    return float(m) if isinstance(m, str) else NAN


def _kind(point: str) -> str:
    """'c' for a concurrency level, 'rate' for a request rate."""
    return point.split("=", 1)[0]


def _headroom(summary: pd.DataFrame, ids: list[str]) -> dict[tuple, tuple[float, str]]:
    """Per point (ids..., point): the most output tok/s a higher level of the same sweep served, over this point's,
    and that level."""
    if "output_tok_s" not in summary or "point" not in summary:
        return {}
    out: dict[tuple, tuple[float, str]] = {}
    for key, g in (summary.groupby(ids, sort=False) if ids else [((), summary)]):
        key = key if isinstance(key, tuple) else (key,)
        lv = [(point_level(str(r.point)), str(r.point), float(r.output_tok_s)) for r in g.itertuples()]
        for lvl, pt, tok in lv:  # levels of one kind: concurrency against concurrency, rates against rates
            higher = [(t, p) for lv2, p, t in lv if lv2 > lvl and known(t) and _kind(p) == _kind(pt)]
            if higher and known(tok) and tok > 0:
                best = max(higher)
                out[(*key, pt)] = (best[0] / tok, best[1])
    return out


def _name_saturation(out: list[tuple[dict[str, Any], Regime]]) -> None:
    """An under-loaded point names the lowest higher level of its sweep at which the server saturated, if any."""
    for ident, r in out:
        if r.regime != "under-loaded":
            continue
        mine = point_level(ident["point"])
        later = sorted((point_level(i["point"]), i["point"], q.regime) for i, q in out
                       if i.get("config") == ident.get("config") and i.get("rep") == ident.get("rep")
                       and i.get("gpu") == ident.get("gpu") and _kind(i["point"]) == _kind(ident["point"])
                       and point_level(i["point"]) > mine)
        sat = next(((p, g) for _, p, g in later if g not in NOT_SATURATED), None)
        r.because += (f"; the server first read as saturated at {sat[0]} ({sat[1]}) in this sweep" if sat else
                      "; no level of this sweep saturated it")


def point_regimes(summary: pd.DataFrame, gpu_points: pd.DataFrame, host_points: pd.DataFrame,
                  kernels: pd.DataFrame | None = None, runtime: pd.DataFrame | None = None,
                  profiles: pd.DataFrame | None = None, gpu_status: dict[tuple, str] | None = None,
                  th: RegimeThresholds = RegimeThresholds(),
                  cpu_cores: dict[tuple, int] | None = None) -> list[tuple[dict[str, Any], Regime]]:
    """A verdict for every measured point (config, rep, point; per GPU where there are GPUs) from the run's tables:
    the load summary with client health, GPU points, host points, a stored profile of the same level, the sweep's
    higher levels (room the server had), and for a server that computes on the CPU, its cores (cpu_cores per
    config and rep)."""
    out: list[tuple[dict[str, Any], Regime]] = []
    if summary.empty:
        return out
    ids = [c for c in ("config", "rep") if c in summary]
    room = _headroom(summary, ids)
    for _, load in summary.iterrows():
        key = {c: load[c] for c in ids}
        point = str(load["point"]) if "point" in load else f"c={int(load['concurrency'])}"

        def rows(df: pd.DataFrame | None, col: str = "phase", key: dict[str, Any] = key,
                 point: str = point) -> pd.DataFrame:
            if df is None or df.empty or col not in df:
                return pd.DataFrame()
            m = df[col].astype(str) == point
            for c, v in key.items():
                if c in df:
                    m &= df[c] == v
            return df[m]

        host = rows(host_points)
        trace: dict[str, float] = {}
        if kernels is not None and len(kernels) and profiles is not None and len(profiles):
            win = profiles
            for c, v in key.items():
                win = win[win[c] == v] if c in win else win
            if len(win) and "concurrency" in win and f"c={int(win['concurrency'].iloc[0])}" == point:
                k, rt = kernels, runtime if runtime is not None else pd.DataFrame()
                for c, v in key.items():
                    k = k[k[c] == v] if c in k else k
                    rt = rt[rt[c] == v] if c in rt else rt
                trace = trace_evidence(k, rt if len(rt) else None)
        gpus = rows(gpu_points)
        why = (gpu_status or {}).get(tuple(key.values()), "")
        for gpu in ([r for _, r in gpus.iterrows()] or [None]):
            ev = point_evidence(gpu, host.iloc[0] if len(host) else None, load, trace,
                                gpu_why_missing=why or ("" if gpu is not None else "no GPU readings"))
            ev.headroom_x, ev.headroom_point = room.get((*key.values(), point), (NAN, ""))
            cores = (cpu_cores or {}).get(tuple(key.values()))
            if cores and gpu is None:
                ev.server_cores = float(cores)
            ident = {**key, "point": point, "gpu": int(gpu["gpu"]) if gpu is not None and "gpu" in gpu else None}
            out.append((ident, decide(ev, th)))
    _name_saturation(out)
    return out
