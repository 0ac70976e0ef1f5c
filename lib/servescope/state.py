"""What a running server resolved, in engine-neutral terms, and whether that is what was asked for.

Each adapter reads its engine's own evidence (vLLM and SGLang `/server_info`, transformers' command line and log)
into one ResolvedState. A field the engine does not report stays None with the reason in `not_reported`; a
verification never treats an unreported field as equal to the request.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, NamedTuple

import pandas as pd

from .spec import Knobs

# graph intent -> (decode phase, prefill/mixed phase); 'piecewise' graphs attention and leaves the rest (MoE) eager
GRAPH_PHASES: dict[str, tuple[str, str]] = {"off": ("off", "off"), "decode_only": ("full", "off"),
                                            "full": ("full", "full"), "piecewise": ("full", "piecewise"),
                                            "compiled_piecewise": ("full", "compiled_piecewise")}
# the fields a request can pin, in table order
FIELDS = ("compile", "graph_decode", "graph_prefill", "eager", "tp", "dp", "ep", "moe_backend", "attention_backend")
NOT_REPORTED = "not reported"


class FactRule(NamedTuple):
    """A fact of a resolved state and the regex of the audit rule it satisfies (matched against the rule's condition
    and what it resolves to; 'file:<regex>' matches the rule's file instead), with the change that undoes it in the
    engine's spelling where there is one beyond turning graphs on."""

    fact: str
    pattern: str
    remedy: str = ""


@dataclass
class ResolvedState:
    """One server's resolved configuration: compile, CUDA graphs per phase, eager, parallelism, backends."""

    engine: str
    source: str = ""  # where it was read: '/server_info', 'command line', 'log', ...
    compile: str | None = None  # 'on' | 'off'
    compile_mode: str | None = None  # the engine's words ('DYNAMO_TRACE_ONCE', 'max-autotune-no-cudagraphs', ...)
    graph_decode: str | None = None  # 'off' | 'full' | 'piecewise' | 'compiled_piecewise'
    graph_prefill: str | None = None  # 'off' | 'full' | 'piecewise' | 'compiled_piecewise'
    graph_mode: str | None = None  # the engine's words ('FULL_AND_PIECEWISE', 'decode=full prefill=breakable', ...)
    eager: bool | None = None  # an engine-level eager switch (vLLM --enforce-eager), where one exists
    tp: int | None = None
    dp: int | None = None
    ep: int | None = None
    moe_backend: str | None = None
    attention_backend: str | None = None
    device: str | None = None
    dtype: str | None = None  # the dtype the server runs the weights in ('bfloat16')
    config_dtype: str | None = None  # what the model's config.json declares, where the folder is readable here
    not_reported: dict[str, str] = field(default_factory=dict)  # field -> why the engine does not say
    facts: dict[str, Any] = field(default_factory=dict)  # further engine facts the audit's rules may test

    @property
    def graphs(self) -> str | None:
        """The graph intent both phases amount to: off, decode_only, full, piecewise (None if a phase is unknown)."""
        pair = (self.graph_decode, self.graph_prefill)
        for intent, phases in GRAPH_PHASES.items():
            if pair == phases:
                return intent
        if pair == ("piecewise", "piecewise"):
            return "piecewise (every batch)"
        return None if None in pair else f"decode {pair[0]}, prefill {pair[1]}"

    def value(self, name: str) -> Any:
        """A field's value, or None when not reported."""
        return getattr(self, name)

    def shown(self, name: str) -> str:
        """A field as a table shows it: its value, or 'not reported'."""
        v = getattr(self, name)
        return NOT_REPORTED if v is None else str(v)

    def why_missing(self, name: str) -> str:
        """Why a field is not reported (empty when it is)."""
        if getattr(self, name) is not None:
            return ""
        return self.not_reported.get(name, f"{self.engine} did not report it ({self.source or 'no resolved config'})")

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (manifests, findings evidence)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ResolvedState:
        """Read back what to_dict wrote (a manifest's record); keys this version does not know are left out."""
        known = {f.name for f in fields(cls)}
        return cls(**{"engine": "", **{k: v for k, v in d.items() if k in known}})

    def row(self) -> dict[str, Any]:
        """The state as one table row: each field shown, 'not reported' where missing."""
        return {"source": self.source, "compile": self.shown("compile"), "compile_mode": self.compile_mode or "",
                "graphs": self.graphs or NOT_REPORTED, "graph_decode": self.shown("graph_decode"),
                "graph_prefill": self.shown("graph_prefill"), "graph_mode": self.graph_mode or "",
                "eager": self.shown("eager"), "tp": self.shown("tp"), "dp": self.shown("dp"), "ep": self.shown("ep"),
                "moe_backend": self.shown("moe_backend"), "attention_backend": self.shown("attention_backend"),
                "device": self.shown("device"), "dtype": self.dtype_words()}

    def dtype_words(self) -> str:
        """The served dtype, and what the model declared where the engine changed it."""
        if self.dtype is None:
            return NOT_REPORTED
        if self.config_dtype and self.config_dtype != self.dtype:
            return f"{self.dtype} (the engine changed it: the model declares {self.config_dtype})"
        return self.dtype

    def complete_missing(self, reasons: dict[str, str]) -> ResolvedState:
        """Record why each still-missing field is missing (reasons the adapter knows), leaving the others."""
        for name in (*FIELDS, "device", "dtype"):
            if getattr(self, name) is None and name not in self.not_reported and name in reasons:
                self.not_reported[name] = reasons[name]
        return self


def expected_state(knobs: Knobs) -> dict[str, Any]:
    """What a request must resolve to, field by field (only what it pins: a knob left at the engine default pins
    nothing, except tp and dp, whose default is 1)."""
    out: dict[str, Any] = {}
    if knobs.torch_compile is not None:
        out["compile"] = "on" if knobs.torch_compile else "off"
    if knobs.cuda_graph is not None:
        out["graph_decode"], out["graph_prefill"] = GRAPH_PHASES[knobs.cuda_graph]
    out["tp"], out["dp"] = knobs.tp, knobs.dp
    if knobs.ep is not None:
        out["ep"] = knobs.ep
    if knobs.moe_backend is not None:
        out["moe_backend"] = knobs.moe_backend
    return out


def verify(expected: dict[str, Any], state: ResolvedState) -> pd.DataFrame:
    """One row per pinned field: requested, resolved, and 'as requested' / 'differs' / 'not verified' (with why)."""
    rows = []
    for name in FIELDS:
        if name not in expected:
            continue
        got = state.value(name)
        want = expected[name]
        if got is None:
            status, why = "not verified", state.why_missing(name)
        elif str(got) == str(want):
            status, why = "as requested", ""
        else:
            status, why = "differs", f"asked {want}, the server resolved {got}"
        rows.append({"field": name, "requested": str(want), "resolved": state.shown(name), "status": status,
                     "why": why})
    return pd.DataFrame(rows, columns=["field", "requested", "resolved", "status", "why"])


def differences(a: ResolvedState, b: ResolvedState, fields: tuple[str, ...] = FIELDS) -> pd.DataFrame:
    """Fields where two resolved states differ, or cannot be compared because one side did not report them."""
    rows = []
    for name in fields:
        va, vb = a.value(name), b.value(name)
        if va is None or vb is None:
            rows.append({"field": name, "a": a.shown(name), "b": b.shown(name), "status": "unknown",
                         "why": a.why_missing(name) or b.why_missing(name)})
        elif str(va) != str(vb):
            rows.append({"field": name, "a": str(va), "b": str(vb), "status": "differs", "why": ""})
    return pd.DataFrame(rows, columns=["field", "a", "b", "status", "why"])
