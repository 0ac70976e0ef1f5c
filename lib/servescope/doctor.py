"""`servescope doctor`: does this machine run the suite, end to end? One table of what works, what does not, and why.

The cheap checks (suite environment, engine environment, CPU, model, NVML, nsys, disk) take a second. The token
checks launch the engine once per configuration class the default suite uses (eager and compiled) and wait for a
real generated token; their results are cached per engine environment, CPU fingerprint and model, so that
`make report` can run `doctor --quick` first and stop early when a configuration is known to die on this machine.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from . import __version__, hostcpu
from .engines import get_engine
from .engines.base import EngineAdapter
from .errors import ServerError, ServescopeError
from .paths import cache_root, project_root
from .server import read_logs
from .spec import EngineSpec, Knobs, ModelSpec, parse, stable_hash
from .util import atomic_write_json

CheckStatus = Literal["ok", "warn", "fail", "n/a"]
# What the default suite launches: thread 1 and thread 5's compiled side use the engine defaults, 5's eager side
# turns compile and graphs off.
TOKEN_CLASSES: dict[str, Knobs] = {"eager": Knobs(torch_compile=False, cuda_graph="off"), "compiled": Knobs()}
FREE_AFTER_GIB = 1.0
ENV_HEADROOM_GIB = 0.6  # beside the environment itself: pip's cache and wheels while it installs


@dataclass
class Check:
    """One row of the doctor's table."""

    check: str
    status: CheckStatus
    detail: str
    seconds: float | None = None
    cached: str = ""  # for a result read from the cache: when it was measured

    def failed(self) -> bool:
        """True for a check that stops the suite here."""
        return self.status == "fail"


def _suite_parts(suite: str | Path | None) -> tuple[EngineSpec, ModelSpec]:
    if suite is None:
        default = project_root() / "data" / "suites" / "default.yaml"
        suite = default if default.is_file() else None
    if suite is None:
        return EngineSpec(), ModelSpec(tiny={})
    from .suite import load_suite

    s = load_suite(suite)
    return parse(EngineSpec, s.engine, "engine"), parse(ModelSpec, s.model, "model")


def _pins() -> dict[str, str]:
    """name -> pinned version, from the project's pyproject.toml (empty when run outside a checkout)."""
    p = project_root() / "pyproject.toml"
    if not p.is_file():
        return {}
    import tomllib

    data = tomllib.loads(p.read_text())
    deps = list(data["project"]["dependencies"]) + list(data["project"].get("optional-dependencies", {}).get("dev", []))
    # a pin may name extras ('ray[client]==2.60.0'): the package is the name before them
    return dict(re.match(r"([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==(\S+)", d).groups() for d in deps  # type: ignore[union-attr]
                if "==" in d)


def check_suite_env() -> Check:
    """The suite's interpreter and its pinned packages."""
    wrong, missing = [], []
    for name, want in _pins().items():
        try:
            have = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
            continue
        if have != want:
            wrong.append(f"{name} {have} (pinned {want})")
    where = f"Python {sys.version.split()[0]} at {sys.prefix}, servescope {__version__}"
    if missing:
        return Check("suite environment", "fail", f"{where}; missing: {', '.join(missing)} (make venv)")
    if wrong:
        return Check("suite environment", "warn", f"{where}; not the pinned versions: {', '.join(wrong)}")
    return Check("suite environment", "ok", f"{where}; {len(_pins())} pinned packages as pinned")


def check_engine(engine: EngineSpec, adapter: EngineAdapter) -> tuple[Check, str, str | None]:
    """The engine's environment and version (nothing is created); also the key its token results are cached under
    and its interpreter."""
    from .launch import find_install

    if not adapter.launches:
        return _check_external(engine), f"external-{stable_hash(engine.url or '', n=8)}", None
    try:
        install = find_install(engine, adapter)
    except ServescopeError as e:
        return Check("engine environment", "fail", str(e).splitlines()[0]), "", None
    assert install is not None
    env = adapter.managed_env(engine.version) if not engine.python else None
    key = env.key if env else f"{engine.name}-{install.version}-{stable_hash(install.python, n=8)}"
    return Check("engine environment", "ok", f"{install.distribution} {install.version} ({install.platform}) at "
                 f"{install.python}"), key, install.python


def _check_external(engine: EngineSpec) -> Check:
    from .engines.http import get_json

    url = (engine.url or "").rstrip("/")
    try:
        models = [m.get("id") for m in get_json(f"{url}/v1/models", 10).get("data", [])]
    except (OSError, ValueError) as e:
        return Check("engine environment", "fail", f"external server {url} does not answer /v1/models: {e}")
    return Check("engine environment", "ok", f"external server {url} serves {models}")


def check_disk(engine_ready: bool, adapter: EngineAdapter) -> Check:
    """Free space where the engine environments and models are cached."""
    root = cache_root()
    probe = root
    while not probe.exists():
        probe = probe.parent
    free_gib = shutil.disk_usage(probe).free / 2**30
    env_gib = adapter.env_size_gib if not engine_ready else 0.0
    need = max(FREE_AFTER_GIB, env_gib + ENV_HEADROOM_GIB) if env_gib else FREE_AFTER_GIB
    status: CheckStatus = "ok" if free_gib >= need else ("warn" if engine_ready else "fail")
    why = f" (the engine environment still needs about {env_gib:.1f} GB)" if env_gib else ""
    return Check("disk", status, f"{free_gib:.1f} GiB free at {probe} for {root}; need {need:.0f} GiB{why}")


def check_cpu(model: ModelSpec, adapter: EngineAdapter) -> Check:
    """CPU model, the extensions that pick a CPU engine's kernels, and what AMX means for the engine's processes."""
    detail = f"{hostcpu.cpu_model()}; {hostcpu.isa_text()}; fingerprint {hostcpu.fingerprint()}; {hostcpu.amx_note()}"
    if hostcpu.isa()["amx_tile"] and os.environ.get("SERVESCOPE_AMX_PERMISSION", "1") == "0" and adapter.uses_amx_tiles:
        return Check("CPU", "warn", detail + "; but SERVESCOPE_AMX_PERMISSION=0: eager vLLM CPU workers running "
                     "bfloat16 will die from SIGILL at their first AMX attention call")
    return Check("CPU", "ok", detail)


def check_model(model: ModelSpec, python: str | None, build: bool) -> Check:
    """The model the suite serves: a generated tiny model in the cache, or a local folder."""
    from .models import ensure_tiny_model, model_info, tiny_model_dir

    if model.tiny is not None:
        d = tiny_model_dir(model.tiny)
        if not (d / "servescope-model.json").is_file():
            if not build or python is None:
                return Check("model", "warn", f"tiny model not built yet ({d}); the first run builds it in seconds")
            t0 = time.monotonic()
            ensure_tiny_model(model.tiny, python)
            return Check("model", "ok", f"built {d} ({model.tiny.dtype})", time.monotonic() - t0)
        info = model_info(d)
        return Check("model", "ok", f"{d} ({model.tiny.dtype}, {info.get('num_parameters', '?')} parameters)")
    path = model.path or ""
    if path.startswith("/") and not Path(path).exists():
        return Check("model", "fail", f"{path} does not exist")
    return Check("model", "ok", f"{path} (not generated by servescope; read by the engine at launch)")


def check_nvml() -> Check:
    """NVML's view of the GPUs, or why there is none."""
    from .telemetry.nvml import Nvml, NvmlUnavailable

    try:
        n = Nvml()
    except NvmlUnavailable as e:
        return Check("NVML", "n/a", f"no NVIDIA GPU / NVML: {e}; GPU telemetry is left out, never invented")
    try:
        gpus = n.static()
    finally:
        n.close()
    names = sorted({g.get("name", "?") for g in gpus})
    return Check("NVML", "ok", f"{len(gpus)} GPU(s): {', '.join(names)}")


def check_nsys() -> Check:
    """Nsight Systems for kernel traces, or why not."""
    from .profile.nsys import locate_nsys

    try:
        return Check("nsys", "ok", locate_nsys())
    except ServescopeError as e:
        return Check("nsys", "n/a", f"{e}; kernel traces come from the PyTorch profiler instead")


def token_check(cls: str, engine: EngineSpec, adapter: EngineAdapter, model: ModelSpec, log_root: Path) -> Check:
    """Launch one configuration class and wait for a real generated token (the readiness check asks for one)."""
    from .launch import prepare, serve

    t0 = time.monotonic()
    log_dir = log_root / cls
    shutil.rmtree(log_dir, ignore_errors=True)
    try:
        prep = prepare(engine, model, say=lambda m: None, adapter=adapter)
        with serve(prep, TOKEN_CLASSES[cls], log_dir) as target:
            first = target.startup.get("first_token_s")
            st = adapter.resolved_state(target.resolved_config)
        served = f"; weights served in {st.dtype_words()}" if st.dtype else f"; dtype {st.why_missing('dtype')}"
        return Check(f"token: {cls}", "ok", f"first token {first:.0f} s after launch "
                     f"({' '.join(target.flags) or 'no flags'}){served}{amx_evidence(log_dir)}", time.monotonic() - t0)
    except ServerError as e:
        head = e.deaths[0].text().replace("\n", "; ") if e.deaths else str(e).splitlines()[0]
        return Check(f"token: {cls}", "fail", f"{head} (logs: {log_dir})", time.monotonic() - t0)
    except ServescopeError as e:
        return Check(f"token: {cls}", "fail", str(e).splitlines()[0], time.monotonic() - t0)


def amx_evidence(log_dir: Path) -> str:
    """How many processes of the server's tree logged that they asked for the AMX tile permission (empty: none did,
    as on a CPU without AMX)."""
    text = read_logs(Path(log_dir))
    granted = len(re.findall(r"servescope: AMX tile permission granted", text))
    return f"; AMX tile permission granted to {granted} engine process(es)" if granted else ""


def cache_path(env_key: str, model: ModelSpec) -> Path:
    """Where token results for this engine environment, CPU and model are cached."""
    model_key = stable_hash(model.model_dump(mode='json'), n=8)
    return cache_root() / "doctor" / f"{env_key}-cpu{hostcpu.fingerprint()}-model{model_key}.json"


def _read_cache(path: Path) -> dict[str, Check]:
    if not path.is_file():
        return {}
    try:
        raw = json.loads(path.read_text())
        return {k: Check(**v) for k, v in raw.get("checks", {}).items()}
    except (ValueError, TypeError):
        return {}


def run_doctor(suite: str | Path | None = None, quick: bool = False, say: Callable[[str], None] = print) -> list[Check]:
    """Every check, in order; with quick, token results come from the cache instead of launching."""
    engine, model = _suite_parts(suite)
    adapter = get_engine(engine.name)  # the entry point: the engine is resolved once, here
    checks = [check_suite_env()]
    engine_check, env_key, python = check_engine(engine, adapter)
    checks.append(engine_check)
    checks.append(check_disk(engine_check.status == "ok", adapter))
    checks.append(check_cpu(model, adapter))
    launches = adapter.launches
    if launches:
        checks.append(check_model(model, python, build=not quick))
    checks += [check_nvml(), check_nsys()]
    if not launches:
        checks.append(Check("tokens", "n/a", "an external server is not launched by servescope"))
        return checks
    if engine_check.status != "ok":
        checks += [Check(f"token: {c}", "fail", "no engine to launch (see engine environment)") for c in TOKEN_CLASSES]
        return checks
    cpath = cache_path(env_key, model)
    if quick:
        cached = _read_cache(cpath)
        for cls in TOKEN_CLASSES:
            c = cached.get(cls)
            checks.append(c if c is not None else Check(f"token: {cls}", "warn", "not checked on this CPU, engine "
                                                         "environment and model yet (make doctor)"))
        return checks
    say(f"launching the engine in {len(TOKEN_CLASSES)} configurations ({', '.join(TOKEN_CLASSES)}) at once; "
        "each waits for one real token")
    log_root = Path(tempfile.mkdtemp(prefix="servescope-doctor-"))
    with ThreadPoolExecutor(len(TOKEN_CLASSES)) as pool:  # both at once: the run must stay under two minutes
        results = list(pool.map(lambda c: token_check(c, engine, adapter, model, log_root), TOKEN_CLASSES))
    when = time.strftime("%Y-%m-%d %H:%M")
    stored = {cls: {**asdict(r), "cached": when} for cls, r in zip(TOKEN_CLASSES, results, strict=True)}
    atomic_write_json(cpath, {"checks": stored, "engine_env": env_key, "cpu": hostcpu.cpu_model(),
                              "cpu_isa": hostcpu.isa_text(), "model": model.model_dump(mode="json")})
    checks += results
    return checks


def table(checks: list[Check]) -> str:
    """The checks as an aligned text table."""
    rows = [("check", "result", "detail")]
    for c in checks:
        result = c.status + (f" ({c.seconds:.0f} s)" if c.seconds is not None else "")
        detail = c.detail + (f" [cached {c.cached}]" if c.cached else "")
        rows.append((c.check, result, detail))
    w0, w1 = (max(len(r[i]) for r in rows) for i in (0, 1))
    return "\n".join(f"{a:<{w0}}  {b:<{w1}}  {c}" for a, b, c in rows)

