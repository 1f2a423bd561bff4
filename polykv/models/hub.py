"""Talking to transformers and the Hugging Face hub without surprises on the terminal.

A hub id is looked up on the hub only when the hub answers a quick probe; otherwise it is read from the
local cache alone (`local_files_only`), so a machine with no network neither waits through the hub
client's retries nor prints them: a model in the cache loads, one that is not fails in one line.
`HF_HUB_OFFLINE=1` skips the probe. transformers' and the hub's own warnings, notices and bars are
kept off the terminal while PolyKV loads a model, unless `POLYKV_DEBUG=1`.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from polykv.errors import PolyKVError, debug

PROBE_SECONDS = 3.0


class HubUnreachableError(PolyKVError):
    """A hub model that is not in the local cache, while the hub cannot be reached."""


def hub_reachable(timeout: float = PROBE_SECONDS) -> bool:
    """Whether the hub answers within `timeout` seconds (never, in offline mode). The probe goes through
    the hub client's own session, so it takes the same proxies and certificates as a download would; it
    runs in a thread that is not waited for past the timeout, since a name lookup with no network can
    take longer than any connection timeout bounds."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    answered: list[bool] = []
    probe = threading.Thread(target=lambda: answered.append(_probe(constants.ENDPOINT, timeout)), daemon=True)
    probe.start()
    probe.join(timeout)
    return answered == [True]


def _probe(endpoint: str, timeout: float) -> bool:
    from huggingface_hub.utils import get_session

    try:
        get_session().head(endpoint, timeout=timeout)
    except Exception:  # noqa: BLE001 - any failure to connect (refused, DNS, timeout, proxy, TLS) means no hub
        return False
    return True


def hub_files_only(repo_id: str) -> bool:
    """Whether `repo_id` must be read from the local cache alone (the hub cannot be reached); a
    HubUnreachableError at once when it is not there either."""
    if hub_reachable():
        return False
    from huggingface_hub import constants, try_to_load_from_cache

    if not isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
        offline = constants.HF_HUB_OFFLINE
        why = "offline mode is on (HF_HUB_OFFLINE)" if offline else f"{constants.ENDPOINT} cannot be reached"
        raise HubUnreachableError(f"model {repo_id!r} is not in the local Hugging Face cache and {why}")
    return True


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' and the hub's log messages below errors, and Python warnings, kept off the terminal
    for the duration (errors still raise); everything is shown under POLYKV_DEBUG=1."""
    if debug():
        yield
        return
    from huggingface_hub.utils import logging as hub_logging
    from transformers.utils import logging as transformers_logging

    levels = transformers_logging.get_verbosity(), hub_logging.get_verbosity()
    transformers_logging.set_verbosity_error()
    hub_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        transformers_logging.set_verbosity(levels[0])
        hub_logging.set_verbosity(levels[1])
