"""Suite files: which notebooks to run, against which engine and model, with which load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from .architectures import read_config
from .engines import get_engine
from .errors import SpecError
from .models import check_model_path
from .paths import project_root
from .spec import DeploymentSpec, EngineSpec, Knobs, LoadSpec, ModelSpec, ProfileSpec, RunnerSpec, TelemetrySpec, parse


class NotebookEntry(BaseModel):
    """One notebook of a suite and its parameter overrides."""

    model_config = ConfigDict(extra="forbid")
    id: str
    path: str | None = Field(None, description="notebook file, relative to the suite file; default notebooks/<id>.ipynb")
    parameters: dict[str, Any] = Field(default_factory=dict)


class Suite(BaseModel):
    """A suite file (data/suites/*.yaml)."""

    model_config = ConfigDict(extra="forbid")
    name: str
    title: str = ""
    engine: dict[str, Any] = Field(default_factory=lambda: {"name": "vllm"})
    model: dict[str, Any] = Field(default_factory=lambda: {"tiny": {}})
    load: dict[str, Any] = Field(default_factory=dict)
    telemetry: dict[str, Any] = Field(default_factory=dict)
    profile: dict[str, Any] = Field(default_factory=dict, description="ProfileSpec: a kernel profile with each point")
    deployment: dict[str, Any] = Field(default_factory=dict, description="DeploymentSpec: the user's deployment "
                                       "(knobs and flags) every configuration of every thread launches, the thread's "
                                       "own knobs over it")
    baseline: dict[str, Any] = Field(default_factory=dict, description="Knobs of the deployment as it runs today "
                                     "(thread 07 verifies the changes against it); empty: the deployment's knobs, "
                                     "else the engine's defaults")
    runner: dict[str, Any] = Field(default_factory=dict, description="RunnerSpec: where the points run (local, or "
                                   "kind: ray with the cluster's address)")
    compare_with: list[str] = Field(default_factory=list, description="stores of this model under this load served "
                                    "by another engine on the same GPU model (relative to the suite file), read only: "
                                    "the summary sets the engines side by side across them")

    def compare_stores(self, suite_path: str | Path) -> list[Path]:
        """The compare_with stores as absolute paths."""
        return [(Path(suite_path).parent / s).resolve() for s in self.compare_with]

    @property
    def baseline_knobs(self) -> dict[str, Any]:
        """What thread 07 verifies against: the baseline as given, else the deployment's knobs."""
        return self.baseline or dict((self.deployment or {}).get("knobs") or {})
    notebooks: list[NotebookEntry]


def notebook_file(suite_path: str | Path, entry: NotebookEntry) -> Path:
    """Where a suite entry's notebook lives."""
    if entry.path:
        return (Path(suite_path).parent / entry.path).resolve()
    return project_root() / "notebooks" / f"{entry.id}.ipynb"


def load_suite(path: str | Path) -> Suite:
    """Read and validate a suite file; every error is raised here, before anything is launched."""
    p = Path(path)
    if not p.is_file():
        raise SpecError(f"suite file {p} does not exist")
    try:
        raw = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise SpecError(f"suite file {p} is not valid YAML: {e}") from None
    suite = parse(Suite, raw, f"suite {p}") if isinstance(raw, dict) else None
    if suite is None:
        raise SpecError(f"suite file {p} must be a mapping with at least 'name' and 'notebooks'")
    get_engine(parse(EngineSpec, suite.engine, f"{p}: engine").name)  # an unknown engine is named here, not at launch
    model = parse(ModelSpec, suite.model, f"{p}: model")
    parse(Knobs, suite.baseline, f"{p}: baseline")
    parse(DeploymentSpec, suite.deployment, f"{p}: deployment")
    if model.path:
        check_model_path(model.path)
    if model.architecture:
        read_config(model.architecture)
    parse(LoadSpec, suite.load, f"{p}: load")
    parse(TelemetrySpec, suite.telemetry, f"{p}: telemetry")
    parse(ProfileSpec, suite.profile, f"{p}: profile")
    parse(RunnerSpec, suite.runner, f"{p}: runner")
    for nb in suite.notebooks:
        if not notebook_file(p, nb).is_file():
            raise SpecError(f"suite {p} names notebook {nb.id!r}, but {notebook_file(p, nb)} does not exist")
        if "load" in nb.parameters:
            parse(LoadSpec, {**suite.load, **nb.parameters["load"]}, f"{p}: notebooks[{nb.id}].load")
    for given, store in zip(suite.compare_with, suite.compare_stores(p), strict=True):
        if not store.is_dir() or not any(store.iterdir()):
            raise SpecError(f"suite {p}: compare_with {given!r} is no store with points ({store})")
    return suite
