"""Where PolyKV keeps its results database, profiles and jobs: one rule for the CLI and the app.

1. `$POLYKV_WORKSPACE`, when set;
2. else, for a source checkout (the package sits in a repository with its `pyproject.toml`), `.polykv/`
   at the repository root, wherever the command is run from;
3. else (an installed package), the user's data directory: `$XDG_DATA_HOME/polykv`, by default
   `~/.local/share/polykv`.

`--workspace` on a command (or the app's environment) overrides it for one call.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV = "POLYKV_WORKSPACE"
REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS_FILE = "results.sqlite"  # a workspace's (or a study folder's) results database


def in_checkout() -> bool:
    return (REPO_ROOT / "pyproject.toml").is_file() and (REPO_ROOT / "polykv" / "__init__.py").is_file()


def default_workspace() -> Path:
    """The workspace by the rule above (not created: readers never create it)."""
    chosen = os.environ.get(ENV, "").strip()
    if chosen:
        return Path(chosen).expanduser()
    if in_checkout():
        return REPO_ROOT / ".polykv"
    data = os.environ.get("XDG_DATA_HOME", "").strip()
    return (Path(data).expanduser() if data else Path.home() / ".local" / "share") / "polykv"


def results_path(folder: str | os.PathLike[str]) -> Path:
    """The results database a workspace, a study's or a search's folder keeps its runs in."""
    return Path(folder) / RESULTS_FILE


__all__ = ["ENV", "RESULTS_FILE", "default_workspace", "in_checkout", "results_path"]
