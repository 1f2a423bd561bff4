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

A workload profile (sources such as ruler:niah_single_2@2048, `polykv.profile.workload`) scores each
calibration prompt's gold answer: methods.csv adds danswer (the change of the answer's NLL per token against
FullKV) with its interval, and reference.csv the scored tokens and the answer's length of each sequence.

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
import stat
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

from polykv.errors import PolyKVError, first_line, validation_line
from polykv.files import read_json
from polykv.profile.statistics import STATISTICS

FORMAT = "polykv.profile"
VERSION = 1
METHOD_COLUMNS = ["layer", "scope", "method", "cosine", "dppl"]
INTERVAL_COLUMNS = ["cosine_low", "cosine_high", "dppl_low", "dppl_high"]
ANSWER_COLUMNS = ["danswer", "danswer_low", "danswer_high"]  # a workload profile's methods.csv adds these
SEQUENCE_COLUMNS = ["layer", "scope", "method", "sequence", "cosine", "nll"]
REFERENCE_COLUMNS = ["sequence", "source", "nll"]
# A workload profile's reference.csv adds each sequence's scored tokens and its gold answer's length.
WORKLOAD_REFERENCE_COLUMNS = ["tokens", "answer_tokens"]
NO_ANSWER = (
    "danswer needs a workload profile: this one was measured on text, which has no gold answer; profile on a "
    "suite's prompts (sources ruler:TASK@LENGTH or longbench:PATH)"
)


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
    as_recorded: bool = False  # a report rendered again reads the profile its runs were made from, stale or not

    @cached_property
    def meta(self) -> ProfileMetadata:
        """The metadata, typed (parsed once; `metadata` stays the dict that is written to profile.json)."""
        return parse_metadata(self.metadata, f"profile {self.metadata.get('key', '?')}")

    @property
    def key(self) -> str:
        return self.meta.key

    @property
    def num_layers(self) -> int:
        return self.meta.num_layers

    @property
    def is_workload(self) -> bool:
        """Measured on a suite's prompts with gold answers (it has danswer), not on text."""
        return "danswer" in self.table.columns

    def statistics(self) -> list[str]:
        """The statistics this profile measured (danswer in a workload profile only)."""
        return [s for s in STATISTICS if s != "danswer" or self.is_workload]

    def per_sequence_tokens(self):
        """(scored tokens, answer tokens) per sequence in sequence order, for the bootstrap: numpy arrays,
        or the profile's one continuation and None for a text profile."""
        reference = self.reference.sort_values("sequence")
        if "tokens" not in reference.columns:
            return self.meta.continuation, None
        answer = reference["answer_tokens"].to_numpy(dtype=float) if "answer_tokens" in reference.columns else None
        return reference["tokens"].to_numpy(dtype=float), answer

    @property
    def entropy(self) -> list[float]:
        return self.layers.sort_values("layer")["entropy"].tolist()

    def check_model(self, model_name: str, num_layers: int) -> None:
        if self.meta.model != model_name or self.num_layers != num_layers:
            raise ProfileError(
                f"profile {self.key} was measured on {self.meta.model!r} ({self.num_layers} layers), "
                f"not on {model_name!r} ({num_layers} layers)"
            )

    def stale_reasons(self, phases: Iterable | None = None) -> list[str]:
        """Why this profile no longer describes the registered methods (empty when it is current).

        Checked: the profiler revision, and for every registered method compatible with one of `phases`
        (default: the profile's scopes) that the profile measured it, at the method's current revision."""
        # imported here: they pull in torch, which reading a profile does not need
        from polykv.methods import REGISTRY, for_phase
        from polykv.plan import Phase
        from polykv.profile.profiler import PROFILE_REVISION

        if self.as_recorded:
            return []
        measured = self.meta.methods
        revision = self.metadata.get("profile_revision")
        if not isinstance(measured, Mapping) or revision is None:
            return ["it predates method revisions in profiles"]
        reasons = []
        if revision != PROFILE_REVISION:
            reasons.append(f"profiler revision {revision} (now {PROFILE_REVISION})")
        phases = [Phase(p) for p in (self.meta.scopes if phases is None else phases)]
        wanted = dict.fromkeys(m for phase in phases for m in for_phase(phase))
        missing = [m for m in wanted if m not in measured]
        if missing:
            reasons.append(f"lacks {', '.join(missing)}")
        changed = [
            f"{m} at revision {measured[m]} (now {REGISTRY[m].revision})"
            for m in wanted
            if m in measured and measured[m] != REGISTRY[m].revision
        ]
        if changed:
            reasons.append("measured " + ", ".join(changed))
        return reasons

    def check_current(self, phases: Iterable | None = None) -> None:
        """Raise a one-line ProfileError naming what is stale and the command that refreshes it."""
        reasons = self.stale_reasons(phases)
        if reasons:
            raise ProfileError(
                f"profile {self.key} is stale: {'; '.join(reasons)}; refresh it with `{refresh_command(self)}`"
            )


def refresh_command(profile: Profile) -> str:
    """The `polykv profile` command that measures this profile's settings again with the current code."""
    meta = profile.meta
    spec = profile.metadata.get("corpus", {}).get("spec", {})
    scopes = meta.scopes
    args = [
        "polykv",
        "profile",
        "--model",
        str(meta.model),
        "--b-cal",
        str(meta.b_cal),
        "--seed",
        str(profile.metadata.get("seed", spec.get("seed", 0))),
    ]
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
        from polykv.workspace import default_workspace

        if workspace.resolve() != default_workspace().resolve():  # the command's default workspace
            args += ["-w", str(workspace)]
    return shlex.join(args)


def profile_key(
    model: str, settings: dict[str, Any], capacity: int, seed: int, methods: Mapping[str, int], profile_revision: int
) -> str:
    """A readable, stable directory name for everything a profile depends on: the model, `settings` (the
    corpus, scopes and continuation), b_cal, the seed, the methods measured with their revisions
    ({name: revision}) and the profiler's revision. Changing any of them gives a new key."""
    blob = json.dumps(
        {
            "model": model,
            "corpus": settings,
            "capacity": capacity,
            "seed": seed,
            "methods": dict(methods),
            "profile_revision": profile_revision,
        },
        sort_keys=True,
    )
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", Path(model).name if os.sep in model else model).strip("-")[:40] or "model"
    return f"{slug}-b{capacity}-s{seed}-{hashlib.sha256(blob.encode()).hexdigest()[:10]}"


def save_profile(profile: Profile, root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    final = root / profile.key
    tmp = Path(tempfile.mkdtemp(prefix=f".{profile.key}.", dir=root))
    try:
        (tmp / "profile.json").write_text(
            json.dumps({"format": FORMAT, "version": VERSION, **profile.metadata}, indent=2)
        )
        extra = [c for c in INTERVAL_COLUMNS + ANSWER_COLUMNS if c in profile.table.columns]
        profile.table[METHOD_COLUMNS + extra].to_csv(tmp / "methods.csv", index=False)
        profile.layers.to_csv(tmp / "layers.csv", index=False)
        if profile.sequences is not None:
            profile.sequences[SEQUENCE_COLUMNS].to_csv(tmp / "sequences.csv", index=False)
        if profile.reference is not None:
            extra = [c for c in WORKLOAD_REFERENCE_COLUMNS if c in profile.reference.columns]
            profile.reference[REFERENCE_COLUMNS + extra].to_csv(tmp / "reference.csv", index=False)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    profile.path = final
    return final


class CorpusMetadata(BaseModel):
    model_config = ConfigDict(extra="allow")

    num_sequences: StrictInt = Field(ge=1)


class ProfileMetadata(BaseModel):
    """What `profile.json` must hold for PolyKV to use a profile (other fields are kept as they are).

    The JSON key `capacity` is b_cal, the calibration capacity every cell was measured at (`b_cal`)."""

    model_config = ConfigDict(extra="allow")

    key: str = Field(min_length=1, max_length=200)
    model: str = Field(min_length=1)
    num_layers: StrictInt = Field(ge=1, le=4096)
    capacity: StrictInt = Field(ge=1)  # b_cal (the on-disk name)
    scopes: list[Literal["prefill", "decode"]] = Field(min_length=1)
    continuation: StrictInt = Field(default=1, ge=1)
    corpus: CorpusMetadata
    methods: dict[str, StrictInt] | None = None
    method_params: dict[str, dict[str, Any]] = Field(default_factory=dict)
    fullkv_ppl: dict[str, float | None] = Field(default_factory=dict)

    @property
    def b_cal(self) -> int:
        """The calibration capacity: tokens per KV head kept by the method under test in its layer."""
        return self.capacity


def parse_metadata(data: Mapping[str, Any], where: str) -> ProfileMetadata:
    """`data` checked as profile metadata; a ProfileError "<where>: <field>: <problem>" otherwise."""
    try:
        return ProfileMetadata.model_validate(data)
    except ValidationError as exc:
        raise ProfileError(f"{where}: {validation_line(exc, None)}") from None


MAX_CSV_BYTES = 256 * 1024 * 1024  # sequences.csv of a large profile is tens of MB


def _read_csv(path: Path, required: bool = True) -> pd.DataFrame | None:
    """A CSV of the profile: a regular file of bounded size (never a FIFO or device), else ProfileError."""
    if not required and not os.path.lexists(path):
        return None
    _check_regular(path, MAX_CSV_BYTES)
    try:
        return pd.read_csv(path)
    except (OSError, ValueError, pd.errors.ParserError) as exc:
        raise ProfileError(f"{path}: unreadable ({exc.__class__.__name__}: {first_line(exc)})") from None


def _check_regular(path: Path, max_bytes: int) -> None:
    try:
        info = os.stat(path)
    except OSError:
        raise ProfileError(f"{path}: missing") from None
    if not stat.S_ISREG(info.st_mode):
        raise ProfileError(f"{path}: not a regular file")
    if info.st_size > max_bytes:
        raise ProfileError(f"{path}: {info.st_size:,} bytes, more than the {max_bytes:,} PolyKV reads")


def _check_frame(
    path: Path, name: str, frame: pd.DataFrame, columns: list[str], numeric: list[str], num_layers: int
) -> None:
    lacking = set(columns) - set(frame.columns)
    if lacking:
        raise ProfileError(f"{path}: {name} lacks columns {', '.join(sorted(lacking))}")
    for column in numeric:
        if column in frame.columns and not pd.api.types.is_numeric_dtype(frame[column]):
            raise ProfileError(f"{path}: {name} column {column!r} holds non-numbers")
    if "layer" in frame.columns and len(frame):
        layers = frame["layer"]
        if not pd.api.types.is_integer_dtype(layers) or layers.min() < 0 or layers.max() >= num_layers:
            raise ProfileError(f"{path}: {name} has layers outside 0 .. {num_layers - 1}")
    if "scope" in frame.columns and not frame["scope"].isin(["prefill", "decode"]).all():
        raise ProfileError(f"{path}: {name} has scopes other than prefill and decode")


def load_profile(path: str | os.PathLike) -> Profile:
    """Read and check a profile directory; any damage is one ProfileError line naming the file."""
    path = Path(path)
    meta_file = path / "profile.json"
    if not meta_file.is_file():
        raise ProfileError(f"{path}: not a profile directory (no profile.json)")
    data = read_json(meta_file, "profile metadata", allow_nan=True, error=ProfileError)
    if not isinstance(data, dict):
        raise ProfileError(f"{meta_file}: expected a JSON object, got {type(data).__name__}")
    if data.get("format") != FORMAT or data.get("version") != VERSION:
        raise ProfileError(f"{path}: not a version-{VERSION} PolyKV profile")
    checked = parse_metadata(data, str(meta_file))
    metadata = {k: v for k, v in data.items() if k not in ("format", "version")}
    layers_count = checked.num_layers
    table = _read_csv(path / "methods.csv")
    layers = _read_csv(path / "layers.csv")
    # absent in profiles saved before per-sequence values were kept
    sequences = _read_csv(path / "sequences.csv", required=False)
    reference = _read_csv(path / "reference.csv", required=False)
    numeric = ["cosine", "dppl", *INTERVAL_COLUMNS, *ANSWER_COLUMNS]
    _check_frame(path, "methods.csv", table, METHOD_COLUMNS, numeric, layers_count)
    _check_frame(path, "layers.csv", layers, ["layer", "entropy"], ["entropy"], layers_count)
    if sequences is not None:
        _check_frame(path, "sequences.csv", sequences, SEQUENCE_COLUMNS, ["cosine", "nll", "sequence"], layers_count)
    if reference is not None:
        numeric = ["nll", "sequence", *WORKLOAD_REFERENCE_COLUMNS]
        _check_frame(path, "reference.csv", reference, REFERENCE_COLUMNS, numeric, layers_count)
    profile = Profile(
        metadata=metadata, table=table, layers=layers, path=path, sequences=sequences, reference=reference
    )
    profile.meta = checked  # parsed once: the checked metadata is the typed view (a cached property)
    return profile


def scan_profiles(root: str | os.PathLike) -> tuple[list[Profile], list[str]]:
    """Every profile under `root` (sorted by directory name) and one line for each damaged one."""
    root = Path(root)
    found, damaged = [], []
    for meta in sorted(root.glob("*/profile.json")) if root.is_dir() else []:
        try:
            found.append(load_profile(meta.parent))
        except ProfileError as exc:
            damaged.append(str(exc))
    return found, damaged


def find_profile(root: Path, key: str) -> Profile | None:
    return load_profile(root / key) if (root / key / "profile.json").is_file() else None


def profile_named(value: str, workspace: str | os.PathLike) -> Profile:
    """The profile `value` names: a profile key in <workspace>/profiles, else a profile directory."""
    is_key = "/" not in value and value not in ("", ".", "..")
    found = find_profile(Path(workspace) / "profiles", value) if is_key else None
    return found if found is not None else load_profile(value)
