"""The graph ceiling probe: what CUDA graphs take off a decode step on this hardware, engine-free (an estimate of the
kernel-launch share, not a bound on what graphs return in an engine, which also sheds host work). A decode-like layer
stack of the model's shapes (per layer: RMSNorm, the fused q/k/v product, attention of one new token against a fixed
context, the output product, RMSNorm, the router and an MoE block of the model's experts) is timed per step, for each
batch size, in up to four forms:

- eager: every kernel launched from Python;
- full: the whole step captured as one CUDA graph and replayed;
- piecewise: each layer's non-MoE part captured as a graph, the MoE block run eagerly between replays;
- compile: torch.compile of a layer (inductor's default mode, which captures no CUDA graphs), compiled once and run
  for every layer, as engines compile a model's repeated layer.

On a CPU only eager and compile run (CUDA graphs need CUDA). Runs as a script under the *engine's* interpreter:
    python graph_ceiling.py '{"layers": 4, "hidden": 128, "heads": 4, "kv_heads": 2, "head_dim": 32, "experts": 16,
                              "top_k": 4, "inter": 64, "batches": [1, 16], "context": 64, "device": "cpu",
                              "dtype": "float32", "steps": 10, "reps": 7, "forms": ["eager", "compile"]}'
prints one JSON object: {"rows": [...], "errors": {form: why}, "moe_method": ..., "compile_s": ..., "torch": ...};
each row has the median ms per step of `reps` runs of `steps` steps and the runs themselves, the forms interleaved
run by run so that a slow moment of the machine falls on all of them.
The MoE block has static shapes in every form so that it can be captured: on CUDA in bf16 with torch._grouped_mm,
tokens are sorted by expert and run as one grouped product; otherwise every expert runs on every token and the
router's weights (zero for the experts not chosen) combine them; the method is named in the output.
"""

from __future__ import annotations

import json
import math
import sys
import time
from typing import Any


def _sync(torch: Any, device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _ms_per_step(torch: Any, device: str, fn: Any, steps: int) -> float:
    """Milliseconds per step over `steps` back-to-back calls, synchronised once."""
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    _sync(torch, device)
    return (time.perf_counter() - t0) * 1e3 / steps


class Stack:
    """The layer stack's weights and its two parts per layer (attention side, MoE side)."""

    def __init__(self, torch: Any, spec: dict[str, Any], device: str, dtype: Any) -> None:
        self.torch, self.F = torch, torch.nn.functional
        g = torch.Generator().manual_seed(int(spec.get("seed", 0)))
        h, nh, nkv, d = (int(spec[k]) for k in ("hidden", "heads", "kv_heads", "head_dim"))
        e, self.k, self.inter = max(int(spec.get("experts", 1)), 1), int(spec.get("top_k", 1)), int(spec["inter"])
        self.h, self.nh, self.nkv, self.d, self.e, self.ctx = h, nh, nkv, d, e, int(spec.get("context", 64))

        def w(*shape: int) -> Any:
            return (torch.randn(*shape, generator=g) / shape[-2] ** 0.5).to(device, dtype)

        self.layers = [{"qkv": w(h, (nh + 2 * nkv) * d), "o": w(nh * d, h), "router": w(h, e),
                        "w1": w(e, h, 2 * self.inter), "w2": w(e, self.inter, h),
                        "ln1": torch.ones(h, device=device, dtype=dtype),
                        "ln2": torch.ones(h, device=device, dtype=dtype)} for _ in range(int(spec["layers"]))]
        grouped = getattr(torch, "_grouped_mm", None)
        self.grouped = grouped if grouped is not None and device.startswith("cuda") and dtype == torch.bfloat16 \
            else None
        self.moe_method = ("one grouped product over tokens sorted by expert (torch._grouped_mm)" if self.grouped
                           else "every expert on every token, combined by the router's weights")
        self.device, self.dtype, self.g = device, dtype, g
        self.cache: dict[int, Any] = {}
        self.compiled: Any = None

    def kv(self, batch: int) -> tuple[Any, Any]:
        """A fixed context of `context` tokens per sequence (the KV cache a decode step reads)."""
        if batch not in self.cache:
            shape = (batch, self.nkv, self.ctx, self.d)
            self.cache[batch] = tuple(self.torch.randn(*shape, generator=self.g).to(self.device, self.dtype)
                                      for _ in range(2))
        return self.cache[batch]

    def norm(self, x: Any, weight: Any) -> Any:
        """RMSNorm."""
        return x * self.torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight

    def attention(self, x: Any, i: int) -> tuple[Any, Any, Any]:
        """Layer i up to its MoE block: (normed input of the MoE, its router logits, the residual)."""
        return self.attention_of(x, self.layers[i], *self.kv(x.shape[0]))

    def attention_of(self, x: Any, lay: dict[str, Any], k_cache: Any, v_cache: Any) -> tuple[Any, Any, Any]:
        """A layer's attention side from its weights and the KV cache it reads."""
        b = x.shape[0]
        qkv = self.norm(x, lay["ln1"]) @ lay["qkv"]
        q = qkv[:, : self.nh * self.d].view(b, self.nh, 1, self.d)
        a = self.F.scaled_dot_product_attention(q, k_cache, v_cache, enable_gqa=True)
        x = x + a.reshape(b, self.nh * self.d) @ lay["o"]
        h = self.norm(x, lay["ln2"])
        return h, h @ lay["router"], x

    def moe(self, h: Any, logits: Any, x: Any, i: int) -> Any:
        """Layer i's MoE block and the residual."""
        return self.moe_of(h, logits, x, self.layers[i])

    def moe_of(self, h: Any, logits: Any, x: Any, lay: dict[str, Any]) -> Any:
        """The MoE block (static shapes, so that a graph can hold it) and the residual."""
        torch, inter = self.torch, self.inter
        top_w, top_i = torch.topk(torch.softmax(logits.float(), -1), self.k, dim=-1)
        top_w = (top_w / top_w.sum(-1, keepdim=True)).to(h.dtype)
        if self.grouped is not None:
            flat = top_i.reshape(-1)
            order = torch.argsort(flat, stable=True)
            counts = torch.zeros(self.e, device=h.device, dtype=torch.int64).scatter_add_(
                0, flat, torch.ones_like(flat))
            offs = torch.cumsum(counts, 0).to(torch.int32)
            rows = order // self.k
            gu = self.grouped(h[rows], lay["w1"], offs=offs)
            y = self.grouped(self.F.silu(gu[:, :inter]) * gu[:, inter:], lay["w2"], offs=offs)
            y = y * top_w.reshape(-1)[order].unsqueeze(-1)
            return x + torch.zeros_like(h).index_add_(0, rows, y)
        mix = torch.zeros(h.shape[0], self.e, device=h.device, dtype=h.dtype).scatter_(1, top_i, top_w)
        gu = torch.einsum("bh,ehf->bef", h, lay["w1"])
        y = self.F.silu(gu[..., :inter]) * gu[..., inter:]
        return x + torch.einsum("bef,efh,be->bh", y, lay["w2"], mix)

    def layer_of(self, x: Any, lay: dict[str, Any], k_cache: Any, v_cache: Any) -> Any:
        """One whole layer from its weights: what torch.compile compiles once and reuses for every layer."""
        return self.moe_of(*self.attention_of(x, lay, k_cache, v_cache), lay)

    def step(self, x: Any) -> Any:
        """One decode step through every layer."""
        for i in range(len(self.layers)):
            x = self.moe(*self.attention(x, i), i)
        return x

    def compiled_step(self) -> Any:
        """A step whose layers run torch.compile's code (one compiled layer, shared by all: same shapes)."""
        layer = self.torch.compile(self.layer_of, dynamic=True)

        def step(x: Any) -> Any:
            kc, vc = self.kv(x.shape[0])
            for lay in self.layers:
                x = layer(x, lay, kc, vc)
            return x
        return step


def _full_graph(torch: Any, stack: Stack, x: Any) -> Any:
    """The whole step captured once; each call replays it."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            stack.step(x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        stack.step(x)
    return graph.replay


def _piecewise(torch: Any, stack: Stack, x: Any) -> Any:
    """Each layer's attention side captured as a graph; the MoE block eager between replays."""
    inputs = [x.clone() for _ in stack.layers]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(len(stack.layers)):
            for _ in range(3):
                stack.attention(inputs[i], i)
    torch.cuda.current_stream().wait_stream(side)
    graphs, outs = [], []
    for i in range(len(stack.layers)):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs.append(stack.attention(inputs[i], i))
        graphs.append(graph)

    def run() -> None:
        for i, graph in enumerate(graphs):
            graph.replay()
            y = stack.moe(*outs[i], i)
            if i + 1 < len(graphs):
                inputs[i + 1].copy_(y)
    return run


def _form(torch: Any, stack: Stack, form: str, x: Any) -> Any:
    """The step of one form at this batch, ready to call."""
    if form == "eager":
        return lambda: stack.step(x)
    if form == "full":
        return _full_graph(torch, stack, x)
    if form == "piecewise":
        return _piecewise(torch, stack, x)
    if stack.compiled is None:
        stack.compiled = stack.compiled_step()
    return lambda: stack.compiled(x)


def probe(spec: dict[str, Any]) -> dict[str, Any]:
    """Time each form at each batch size (see the module docstring)."""
    import torch

    dev, dtype = spec.get("device", "cpu"), getattr(torch, spec.get("dtype", "float32"))
    forms = [f for f in spec.get("forms", ["eager", "full", "piecewise", "compile"])
             if dev.startswith("cuda") or f in ("eager", "compile")]
    steps, reps = int(spec.get("steps", 20)), int(spec.get("reps", 7))
    t0 = time.perf_counter()
    stack = Stack(torch, spec, dev, dtype)
    print(f"graph_ceiling: weights built in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    errors: dict[str, str] = {}
    compile_s = float("nan")
    rows: list[dict[str, Any]] = []
    with torch.inference_mode() if not dev.startswith("cuda") else torch.no_grad():
        for b in spec["batches"]:
            x = torch.randn(int(b), stack.h, generator=stack.g).to(dev, dtype)
            fns = {}
            for form in forms:
                if form in errors:
                    continue
                try:
                    fns[form] = _form(torch, stack, form, x)
                    if form == "compile" and math.isnan(compile_s):
                        t0 = time.perf_counter()
                        fns[form]()
                        _sync(torch, dev)
                        compile_s = time.perf_counter() - t0
                    for _ in range(3):  # warm: caches, allocator, autotuning
                        fns[form]()
                    _sync(torch, dev)
                except Exception as ex:  # noqa: BLE001 - a form this torch or device cannot run is reported
                    errors[form] = f"{type(ex).__name__}: {str(ex).splitlines()[0][:300] if str(ex) else ''}"
                    fns.pop(form, None)
            runs: dict[str, list[float]] = {f: [] for f in fns}
            for _ in range(reps):  # the forms interleaved, so that a slow moment of the machine hits all of them
                for form, fn in fns.items():
                    runs[form].append(_ms_per_step(torch, dev, fn, steps))
            for form, ms in runs.items():
                med = sorted(ms)[len(ms) // 2]
                print(f"graph_ceiling: batch {b} {form} {med:.3f} ms/step", file=sys.stderr, flush=True)
                rows.append({"form": form, "batch": int(b), "ms_per_step": med, "tokens_per_s": int(b) / med * 1e3,
                             "runs_ms": ms})
    return {"rows": rows, "errors": errors, "moe_method": stack.moe_method, "compile_s": compile_s,
            "torch": torch.__version__, "device": dev, "dtype": spec.get("dtype", "float32"), "forms": forms}


if __name__ == "__main__":
    print(json.dumps(probe(json.loads(sys.argv[1]))))
