"""The tiny model's example manifest as data and on disk, with edits for the tests."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import msgspec
import yaml

from trainledger.training.experiment.loop import example_files, example_manifest_dict
from trainledger.training.experiment.manifest import ExperimentManifest, config_digest

_FILES = None


def files() -> dict[str, bytes]:
    global _FILES
    if _FILES is None:
        _FILES = example_files()
    return _FILES


def base() -> dict[str, Any]:
    return copy.deepcopy(example_manifest_dict(files()))


def short(d: dict[str, Any] | None = None, updates: int = 60) -> dict[str, Any]:
    """A shorter run: checkpoints every 10 updates, hooks every 20, futility at 40."""
    d = d or base()
    d["optimization"].update(planned_updates=updates, warmup_fraction_of=updates)
    d["checkpoint"]["every_updates"] = 10
    for h in d["evaluation"]["hooks"]:
        h["every_updates"] = 20
    d["question"]["futility"]["by_update"] = 40
    return d


def write(root: Path, d: dict[str, Any], name: str = "manifest.yaml") -> Path:
    for rel, data in files().items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        if not (root / rel).exists():
            (root / rel).write_bytes(data)
    d["artifacts"]["config"] = config_digest(d["model"])
    (root / name).write_text(yaml.safe_dump(d, sort_keys=False))
    return root / name


def typed(d: dict[str, Any]) -> ExperimentManifest:
    d["artifacts"]["config"] = config_digest(d["model"])
    return msgspec.convert(d, ExperimentManifest)
