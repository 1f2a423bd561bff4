"""Profiles on disk: one directory per (model, corpus, b_cal, seed), reused when asked for again.

    <root>/<key>/profile.json   metadata: model, layers, corpus (spec and the text each sequence came
                                from), b_cal, seed, scopes, continuation, versions, timing
    <root>/<key>/methods.csv    layer, scope, method, cosine, dppl
    <root>/<key>/layers.csv     layer, entropy

CSV and JSON: readable by pandas and by people, and never pickle. A directory is written under a
temporary name and renamed into place, so a crash leaves no half-written profile.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

FORMAT = "polykv.profile"
VERSION = 1
METHOD_COLUMNS = ["layer", "scope", "method", "cosine", "dppl"]


class ProfileError(ValueError):
    """A profile that cannot be read or does not fit; one line."""


@dataclass
class Profile:
    metadata: dict[str, Any]
    table: pd.DataFrame  # METHOD_COLUMNS
    layers: pd.DataFrame  # layer, entropy
    path: Path | None = None

    @property
    def key(self) -> str:
        return self.metadata["key"]

    @property
    def num_layers(self) -> int:
        return int(self.metadata["num_layers"])

    @property
    def entropy(self) -> list[float]:
        return self.layers.sort_values("layer")["entropy"].tolist()

    def check_model(self, model_name: str, num_layers: int) -> None:
        if self.metadata["model"] != model_name or self.num_layers != num_layers:
            raise ProfileError(
                f"profile {self.key} was measured on {self.metadata['model']!r} ({self.num_layers} layers), "
                f"not on {model_name!r} ({num_layers} layers)"
            )


def profile_key(model: str, corpus: dict[str, Any], capacity: int, seed: int) -> str:
    """A readable, stable directory name for the settings a profile depends on."""
    blob = json.dumps({"model": model, "corpus": corpus, "capacity": capacity, "seed": seed}, sort_keys=True)
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", Path(model).name if os.sep in model else model).strip("-")[:40] or "model"
    return f"{slug}-b{capacity}-s{seed}-{hashlib.sha256(blob.encode()).hexdigest()[:10]}"


def save_profile(profile: Profile, root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    final = root / profile.key
    tmp = Path(tempfile.mkdtemp(prefix=f".{profile.key}.", dir=root))
    try:
        (tmp / "profile.json").write_text(json.dumps({"format": FORMAT, "version": VERSION, **profile.metadata}, indent=2))
        profile.table[METHOD_COLUMNS].to_csv(tmp / "methods.csv", index=False)
        profile.layers.to_csv(tmp / "layers.csv", index=False)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    profile.path = final
    return final


def load_profile(path: str | os.PathLike) -> Profile:
    path = Path(path)
    meta_file = path / "profile.json"
    if not meta_file.is_file():
        raise ProfileError(f"{path}: not a profile directory (no profile.json)")
    try:
        metadata = json.loads(meta_file.read_text())
        table = pd.read_csv(path / "methods.csv")
        layers = pd.read_csv(path / "layers.csv")
    except (OSError, ValueError) as exc:
        raise ProfileError(f"{path}: unreadable profile ({exc.__class__.__name__}: {str(exc).splitlines()[0]})") from None
    if metadata.pop("format", None) != FORMAT or metadata.pop("version", None) != VERSION:
        raise ProfileError(f"{path}: not a version-{VERSION} PolyKV profile")
    missing = set(METHOD_COLUMNS) - set(table.columns)
    if missing:
        raise ProfileError(f"{path}: methods.csv lacks columns {', '.join(sorted(missing))}")
    return Profile(metadata=metadata, table=table, layers=layers, path=path)


def find_profile(root: Path, key: str) -> Profile | None:
    return load_profile(root / key) if (root / key / "profile.json").is_file() else None
