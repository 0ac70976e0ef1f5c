"""Two engines serving the same model under the same load, side by side: which serves it better at each level.

Each engine's best measured configuration at a level (the highest median output tok/s among its configurations with
at least MIN_REPS repetitions) against the other engine's, with a 90% interval of the ratio from the two sides'
repetitions (Welch's t on log tok/s: the launches of two engines are not paired). Picking the best of several
configurations favours the side with more of them: the words say how many each side had.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from itertools import combinations

import numpy as np
import pandas as pd

from ..architectures import model_key
from ..spec import Knobs, LoadSpec, ModelSpec
from ..store import Point, Store

MIN_REPS = 3
LEVEL = 0.90


def _engine_name(pt: Point) -> str:
    inst = pt.install
    return f"{inst.distribution} {inst.version}" if inst is not None else str(pt.parts.get("engine", "?"))


def _points(stores: Store | Sequence[Store]) -> Iterator[Point]:
    """Every complete point of one store or of several (a point two stores hold is read once)."""
    seen: set[str] = set()
    for store in [stores] if isinstance(stores, Store) else stores:
        for pt in store.points():
            if pt.path.name not in seen:
                seen.add(pt.path.name)
                yield pt


def measured(stores: Store | Sequence[Store]) -> pd.DataFrame:
    """One row per point and level of one store or several: engine, configuration, model and load (as keys), the GPU
    model it ran on ('' where none was read), repetition, output tok/s."""
    rows = []
    for pt in _points(stores):
        s = pt.table("summary")
        if s.empty or "output_tok_s" not in s or "concurrency" not in s:
            continue
        knobs = Knobs(**(pt.parts.get("knobs") or {}))
        if knobs.replicas > 1:  # several servers behind a balancer: not one engine's server
            continue
        for r in s.itertuples():
            rows.append({"model": json.dumps(pt.parts.get("model"), sort_keys=True),
                         "load": json.dumps(pt.parts.get("load"), sort_keys=True), "card": pt.card,
                         "machine_start": pt.machine_start,
                         "engine": _engine_name(pt),
                         "config": knobs.label(), "rep": pt.parts.get("rep"), "concurrency": int(r.concurrency),
                         "output_tok_s": float(r.output_tok_s)})
    return pd.DataFrame(rows, columns=["model", "load", "card", "machine_start", "engine", "config", "rep",
                                       "concurrency", "output_tok_s"])


def _best(g: pd.DataFrame) -> tuple[str, np.ndarray, int, set[str]] | None:
    """The configuration with the highest median among those with enough repetitions, its values, how many
    configurations had enough, the machine starts its repetitions ran on ('' for one not recorded)."""
    enough = {c: x for c, x in g.groupby("config") if len(x) >= MIN_REPS}
    if not enough:
        return None
    best = max(enough, key=lambda c: float(np.median(enough[c]["output_tok_s"])))
    return best, enough[best]["output_tok_s"].to_numpy(), len(enough), set(enough[best]["machine_start"])


# machines()'s word for sides that never shared a machine start: a comparison's evidence carries it, and readers test it
APART = "different machine starts"


def machines(a: set[str], b: set[str]) -> str:
    """How two sides' repetitions relate to the machines they ran on: 'one machine start' when every repetition of
    both ran on one boot, 'different machine starts' when the sides share none, 'not recorded' where a start is unknown,
    else 'partly shared'."""
    if "" in a or "" in b:
        return "not recorded"
    if len(a | b) == 1:
        return "one machine start"
    return APART if not a & b else "partly shared"


def side_by_side(stores: Store | Sequence[Store], model: ModelSpec | None = None,
                 load: LoadSpec | None = None) -> pd.DataFrame:
    """Per model, load and GPU model the stores hold on two or more engines (only this model, this load, where given;
    never across cards), per level and pair of engines: each side's best configuration, its median and repetitions,
    the ratio (second against first, %) with its 90% interval, and which serves the model better ('no resolved
    difference' where the interval holds 0)."""
    m = measured(stores)
    if model is not None:  # as point keys name them (experiment.point_parts): an architecture with its config's digest
        m = m[m["model"] == json.dumps(model_key(model), sort_keys=True)]
    if load is not None:
        m = m[m["load"] == json.dumps(load.key_dump(), sort_keys=True)]
    out = []
    for (model, load, card), g in m.groupby(["model", "load", "card"], sort=False):
        engines = sorted(g["engine"].unique())
        if len(engines) < 2:
            continue
        for a, b in combinations(engines, 2):
            for level in sorted(set(g["concurrency"])):
                sa = _best(g[(g["engine"] == a) & (g["concurrency"] == level)])
                sb = _best(g[(g["engine"] == b) & (g["concurrency"] == level)])
                if sa is None or sb is None:
                    continue
                la, lb = np.log(sa[1]), np.log(sb[1])
                from scipy import stats  # here, not at import (see analysis.ab._t)

                ci = stats.ttest_ind(lb, la, equal_var=False).confidence_interval(LEVEL)
                ratio = float(np.median(sb[1]) / np.median(sa[1]))
                lo, hi = 100 * (np.exp(ci.low) - 1), 100 * (np.exp(ci.high) - 1)
                better = b if lo > 0 else a if hi < 0 else "no resolved difference"
                out.append({"model": model, "load": load, "card": card, "concurrency": level, "engine_a": a,
                            "config_a": sa[0],
                            "output_tok_s_a": float(np.median(sa[1])), "n_a": len(sa[1]), "configs_a": sa[2],
                            "engine_b": b, "config_b": sb[0], "output_tok_s_b": float(np.median(sb[1])),
                            "n_b": len(sb[1]), "configs_b": sb[2], "b_vs_a_pct": 100 * (ratio - 1),
                            "ci_low_pct": float(lo), "ci_high_pct": float(hi), "better": better,
                            "machines": machines(sa[3], sb[3])})
    return pd.DataFrame(out)


def words(t: pd.DataFrame) -> str:
    """The comparison in a few sentences: per GPU model, which engine serves it better at which levels; each side's
    configuration; whether the sides ran on one machine start ('' where the store holds one engine)."""
    if t.empty:
        return ""
    said = []
    loads = list(dict.fromkeys(zip(t["model"], t["load"], strict=True)))
    for (model, load, card), g in t.groupby(["model", "load", "card"], sort=False):
        by = {w: [int(c) for c in x["concurrency"]] for w, x in g.groupby("better", sort=False)}
        parts = [f"{w} serves it better at c={', '.join(map(str, cs))}" if w != "no resolved difference" else
                 f"no resolved difference at c={', '.join(map(str, cs))}" for w, cs in by.items()]
        which = f" (load {loads.index((model, load)) + 1} of {len(loads)})" if len(loads) > 1 else ""
        said.append(f"{'On ' + card if card else 'Here'}{which}: {'; '.join(parts)}.")
    first = t.iloc[0]
    sides = []
    for eng, cfg, n in (("engine_a", "config_a", "configs_a"), ("engine_b", "config_b", "configs_b")):
        cfgs = sorted(set(t[cfg]))
        best = f", the best of {first[n]}" if first[n] > 1 else ""
        sides.append(f"{first[eng]} {cfgs[0] if len(cfgs) == 1 else '(its best per level)'}{best}")
    said.append(f"Each side is its configuration measured {MIN_REPS} or more times: {'; '.join(sides)}"
                + (" (the best of several reads a little high)." if max(first.configs_a, first.configs_b) > 1 else "."))
    apart = sorted({m for m in t["machines"] if m != "one machine start"})
    if apart:
        said.append(f"The sides ran on {' and '.join(apart).replace('not recorded', 'machine starts not all recorded')}"
                    ": the interval holds one engine's launch-to-launch spread, not the machines', so a difference of a "
                    "few percent may be the machines'.")
    return " ".join(said)


def table(t: pd.DataFrame) -> pd.DataFrame:
    """The comparison as a page shows it: per level, each side's median output tok/s, the second against the first
    with its interval, repetitions, which is better and the machine starts (the card only where there are several)."""
    a, b = t["engine_a"].iloc[0], t["engine_b"].iloc[0]
    out = pd.DataFrame({"card": t["card"], "c": t["concurrency"],
                        f"{a} output_tok_s": t["output_tok_s_a"].round(0), f"{b} output_tok_s": t["output_tok_s_b"].round(0),
                        f"{b} vs {a} %": t["b_vs_a_pct"].round(1),
                        "90% CI %": [f"{lo:+.1f}..{hi:+.1f}" for lo, hi in zip(t["ci_low_pct"], t["ci_high_pct"], strict=True)],
                        "n": [f"{x} / {y}" for x, y in zip(t["n_a"], t["n_b"], strict=True)],
                        "better": t["better"], "machines": t["machines"]})
    return out.drop(columns="card") if out["card"].nunique() <= 1 else out
