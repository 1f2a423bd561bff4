"""Profiles on disk: one directory per (model, corpus, b_cal, seed, scopes, continuation, profiler
revision, methods and their revisions), reused when asked for again.

    <root>/<key>/profile.json   metadata: model, layers, corpus (spec and the text each sequence came
                                from), b_cal, seed, scopes, continuation, methods ({name: revision}),
                                profile_revision, fullkv_ppl ({source: ppl}), versions, timing
    <root>/<key>/methods.csv    layer, scope, method, cosine, dppl, then the bootstrap 95% intervals
                                cosine_low, cosine_high, dppl_low, dppl_high
    <root>/<key>/layers.csv     layer, entropy
    <root>/<key>/sequences.csv  layer, scope, method, sequence, cosine, nll: the values behind each cell,
                                per calibration sequence (nll summed over the continuation)
    <root>/<key>/reference.csv  sequence, source, nll: FullKV's continuation NLL per sequence

A profile measured with another profiler revision, or lacking a registered method, or holding a method
measured at another revision is stale: `Profile.check_current` refuses it with the command that
refreshes it. Older profiles without method revisions are stale by that rule.

CSV and JSON: readable by pandas and by people, and never pickle. A directory is written under a
temporary name and renamed into place, so a crash leaves no half-written profile.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from polykv.errors import PolyKVError

FORMAT = "polykv.profile"
VERSION = 1
METHOD_COLUMNS = ["layer", "scope", "method", "cosine", "dppl"]
INTERVAL_COLUMNS = ["cosine_low", "cosine_high", "dppl_low", "dppl_high"]
SEQUENCE_COLUMNS = ["layer", "scope", "method", "sequence", "cosine", "nll"]
REFERENCE_COLUMNS = ["sequence", "source", "nll"]


class ProfileError(PolyKVError):
    """A profile that cannot be read or does not fit; one line."""


@dataclass
class Profile:
    metadata: dict[str, Any]
    table: pd.DataFrame  # METHOD_COLUMNS (+ INTERVAL_COLUMNS)
    layers: pd.DataFrame  # layer, entropy
    path: Path | None = None
    sequences: pd.DataFrame | None = None  # SEQUENCE_COLUMNS; None for profiles saved without them
    reference: pd.DataFrame | None = None  # REFERENCE_COLUMNS

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

    def stale_reasons(self, phases: Iterable | None = None) -> list[str]:
        """Why this profile no longer describes the registered methods (empty when it is current).

        Checked: the profiler revision, and for every registered method compatible with one of `phases`
        (default: the profile's scopes) that the profile measured it, at the method's current revision."""
        # imported here: they pull in torch, which reading a profile does not need
        from polykv.methods import REGISTRY
        from polykv.plan import Phase
        from polykv.profile.profiler import PROFILE_REVISION, compatible_methods

        measured = self.metadata.get("methods")
        revision = self.metadata.get("profile_revision")
        if not isinstance(measured, Mapping) or revision is None:
            return ["it predates method revisions in profiles"]
        reasons = []
        if revision != PROFILE_REVISION:
            reasons.append(f"profiler revision {revision} (now {PROFILE_REVISION})")
        phases = [Phase(p) for p in (self.metadata.get("scopes", []) if phases is None else phases)]
        wanted = dict.fromkeys(m for phase in phases for m in compatible_methods(phase))
        missing = [m for m in wanted if m not in measured]
        if missing:
            reasons.append(f"lacks {', '.join(missing)}")
        changed = [f"{m} at revision {measured[m]} (now {REGISTRY[m].revision})"
                   for m in wanted if m in measured and measured[m] != REGISTRY[m].revision]
        if changed:
            reasons.append("measured " + ", ".join(changed))
        return reasons

    def check_current(self, phases: Iterable | None = None) -> None:
        """Raise a one-line ProfileError naming what is stale and the command that refreshes it."""
        reasons = self.stale_reasons(phases)
        if reasons:
            raise ProfileError(f"profile {self.key} is stale: {'; '.join(reasons)}; refresh it with `{refresh_command(self)}`")


def refresh_command(profile: Profile) -> str:
    """The `polykv profile` command that measures this profile's settings again with the current code."""
    meta = profile.metadata
    spec = meta.get("corpus", {}).get("spec", {})
    scopes = meta.get("scopes", [])
    args = ["polykv", "profile", "--model", str(meta["model"]), "--b-cal", str(meta["capacity"]),
            "--seed", str(meta.get("seed", spec.get("seed", 0)))]
    if spec.get("sources"):
        args += ["--sources", ",".join(spec["sources"])]
    if spec.get("num_sequences"):
        args += ["--sequences", str(spec["num_sequences"])]
    if spec.get("max_tokens"):
        args += ["--max-tokens", str(spec["max_tokens"])]
    if len(scopes) == 1:  # both scopes is the command's default
        args += ["--scope", scopes[0]]
    if profile.path is not None and profile.path.parent.name == "profiles":
        workspace = profile.path.parent.parent
        if workspace.resolve() != Path(".polykv").resolve():  # the command's default workspace
            args += ["-w", str(workspace)]
    return shlex.join(args)


def profile_key(
    model: str, settings: dict[str, Any], capacity: int, seed: int, methods: Mapping[str, int], profile_revision: int
) -> str:
    """A readable, stable directory name for everything a profile depends on: the model, `settings` (the
    corpus, scopes and continuation), b_cal, the seed, the methods measured with their revisions
    ({name: revision}) and the profiler's revision. Changing any of them gives a new key."""
    blob = json.dumps({"model": model, "corpus": settings, "capacity": capacity, "seed": seed,
                       "methods": dict(methods), "profile_revision": profile_revision}, sort_keys=True)
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", Path(model).name if os.sep in model else model).strip("-")[:40] or "model"
    return f"{slug}-b{capacity}-s{seed}-{hashlib.sha256(blob.encode()).hexdigest()[:10]}"


def save_profile(profile: Profile, root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    final = root / profile.key
    tmp = Path(tempfile.mkdtemp(prefix=f".{profile.key}.", dir=root))
    try:
        (tmp / "profile.json").write_text(json.dumps({"format": FORMAT, "version": VERSION, **profile.metadata}, indent=2))
        columns = METHOD_COLUMNS + [c for c in INTERVAL_COLUMNS if c in profile.table.columns]
        profile.table[columns].to_csv(tmp / "methods.csv", index=False)
        profile.layers.to_csv(tmp / "layers.csv", index=False)
        if profile.sequences is not None:
            profile.sequences[SEQUENCE_COLUMNS].to_csv(tmp / "sequences.csv", index=False)
        if profile.reference is not None:
            profile.reference[REFERENCE_COLUMNS].to_csv(tmp / "reference.csv", index=False)
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
        # absent in profiles saved before per-sequence values were kept
        sequences = pd.read_csv(path / "sequences.csv") if (path / "sequences.csv").is_file() else None
        reference = pd.read_csv(path / "reference.csv") if (path / "reference.csv").is_file() else None
    except (OSError, ValueError) as exc:
        raise ProfileError(f"{path}: unreadable profile ({exc.__class__.__name__}: {str(exc).splitlines()[0]})") from None
    if metadata.pop("format", None) != FORMAT or metadata.pop("version", None) != VERSION:
        raise ProfileError(f"{path}: not a version-{VERSION} PolyKV profile")
    missing = set(METHOD_COLUMNS) - set(table.columns)
    if missing:
        raise ProfileError(f"{path}: methods.csv lacks columns {', '.join(sorted(missing))}")
    for name, frame, columns in (("sequences.csv", sequences, SEQUENCE_COLUMNS), ("reference.csv", reference, REFERENCE_COLUMNS)):
        lacking = set(columns) - set(frame.columns) if frame is not None else set()
        if lacking:
            raise ProfileError(f"{path}: {name} lacks columns {', '.join(sorted(lacking))}")
    return Profile(metadata=metadata, table=table, layers=layers, path=path, sequences=sequences, reference=reference)


def find_profile(root: Path, key: str) -> Profile | None:
    return load_profile(root / key) if (root / key / "profile.json").is_file() else None
