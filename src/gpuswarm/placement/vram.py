"""The VRAM sampler: one thread that looks at the run's GPUs through :mod:`.nvml` every
``interval`` seconds and attributes each compute process to the attempt it belongs to.

An attempt is watched from its launch to its end with a ``pids`` callable: its backend's
:meth:`~gpuswarm.exec.base.Handle.pids` (the host pids of its process tree, or of its
container). A pid on a GPU that no watched attempt has is *foreign* (another user's job, a
leftover of another run). The sampler itself never looks at a process: no psutil here, only
the pids the backends give it, asked only when a GPU shows a pid not attributed yet (a GPU
without processes costs one NVML call a look).

Per attempt it keeps the peak and mean GPU memory of its processes and the peak and mean
utilisation of its GPUs (a GPU's utilisation is the device's: shared between the attempts
packed on it); :meth:`VramSampler.end` hands them over as a :class:`Usage` (None: not measured,
e.g. the process list could not be read, or the attempt ended before the first look).

After its end an attempt is *releasing* until no pid of it holds memory on its GPUs (the
driver frees a dead process's memory a moment later; a dataloader worker that escaped its
tree keeps it). Past ``release_timeout`` its GPUs are reported *held* (``on_held``), and freed
again (``on_freed``) once the pids are gone. The placement (:mod:`gpuswarm.supervise.packing`)
reads :meth:`VramSampler.snapshot` and :meth:`VramSampler.releasing` before it places a task.

Layer: placement (below exec and store), since it knows GPUs and pids but nothing of attempts
beyond a key and a callable; the supervisor (:mod:`gpuswarm.supervise.packing`) creates it,
feeds it the live handles' pids and reads it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from gpuswarm.placement.devices import Gpu
from gpuswarm.placement.energy import EnergyBook, split
from gpuswarm.placement.nvml import DeviceSample, GpuQuery
from gpuswarm.placement.watched import GpuState, PidsOf, Usage, Watched, usage_of

__all__ = ["GpuState", "PidsOf", "Usage", "VramSampler"]

SAMPLE_SECONDS = 0.25  # 3 NVML calls per GPU a look: ~0.1 ms each on a real driver
SETTLED_SAMPLE_SECONDS = 1.0  # once every attempt has run YOUNG_SECONDS and none is releasing
YOUNG_SECONDS = 30.0  # a young attempt (short tasks, a peak while it loads) is looked at often
RELEASE_TIMEOUT_SECONDS = 30.0
FOREIGN_RECHECK_SECONDS = 5.0  # a pid once found foreign is asked about again after this


class VramSampler:
    """Samples the GPUs ``gpus`` (host ids -> records) through ``query``; thread-safe."""

    def __init__(
        self,
        query: GpuQuery,
        gpus: Sequence[Gpu],
        *,
        interval: float = SAMPLE_SECONDS,
        release_timeout: float = RELEASE_TIMEOUT_SECONDS,
        on_change: Callable[[], None] | None = None,
        on_held: Callable[[int, str, tuple[int, ...], int], None] | None = None,
        on_freed: Callable[[int, str], None] | None = None,
        on_tick: Callable[[], None] | None = None,
    ) -> None:
        self.query = query
        self.gpus = {g.index: g for g in gpus}
        self.interval = interval
        self.release_timeout = release_timeout
        self.on_change = on_change  # room may have appeared (a release, a foreign exit)
        self.on_held = on_held  # (gpu, attempt key, pids, MB): still held past the timeout
        self.on_freed = on_freed  # (gpu, attempt key): a held GPU is free again
        self.on_tick = on_tick  # after every look (the host book publishes what it holds)
        self._lock = threading.Lock()
        self._watched: dict[str, Watched] = {}
        self._owner: dict[int, str] = {}  # pid -> attempt key
        self._foreign: dict[int, float] = {}  # pid -> when it was found foreign
        self._states: dict[int, GpuState] = {}
        self._energy = EnergyBook()
        self._energy_mj = getattr(query, "energy_mj", None)  # issue 37 (an older query: none)
        self._power_mw = getattr(query, "power_mw", None)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- life ----------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self.tick()
            self._thread = threading.Thread(target=self._serve, name="vram", daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
        with contextlib.suppress(Exception):
            self.query.close()

    def _serve(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(self.interval):
            if time.monotonic() - last < self._next_wait() - 1e-3:
                continue  # settled: a look a second (a new attempt makes it due at once)
            last = time.monotonic()
            try:
                self.tick()
            except Exception:  # never the run's end: the next look tries again
                continue

    def _next_wait(self) -> float:
        """Every ``interval`` while an attempt is young or releasing; else once a second (a
        long task's memory grows slowly; the supervisor's CPU stays near zero)."""
        now = time.monotonic()
        with self._lock:
            busy = any(
                w.ended_at is not None or now - w.since < YOUNG_SECONDS
                for w in self._watched.values()
            )
        return self.interval if busy else max(self.interval, SETTLED_SAMPLE_SECONDS)

    # -- attempts --------------------------------------------------------------------------------
    def watch(self, key: str, gpus: Sequence[int], pids_of: PidsOf) -> None:
        """Measure attempt ``key`` on ``gpus`` from now; ``pids_of`` gives its host pids."""
        with self._lock:
            self._watched[key] = Watched(key, tuple(gpus), pids_of)

    def end(self, key: str) -> Usage | None:
        """Attempt ``key`` ended: what it used (None: not measured). It stays *releasing*
        while a pid of it holds memory on a GPU (see :meth:`releasing`)."""
        with self._lock:
            w = self._watched.get(key)
            if w is None or w.ended_at is not None:
                return None
            w.ended_at = time.monotonic()
            if not self._holds(w):
                self._forget(w)
            return usage_of(w)

    def releasing(self, gpu: int) -> list[str]:
        """Keys of ended attempts whose processes still hold memory on ``gpu``."""
        with self._lock:
            return [
                w.key
                for w in self._watched.values()
                if w.ended_at is not None and gpu in w.gpus and self._holds(w, gpu)
            ]

    def held(self) -> dict[int, str]:
        """GPUs still held past the release timeout -> the attempt key holding them."""
        with self._lock:
            return {g: w.key for w in self._watched.values() if w.held for g in w.gpus}

    def snapshot(self) -> dict[int, GpuState]:
        with self._lock:
            return dict(self._states)

    def current_mb(self, key: str) -> int | None:
        """What attempt ``key``'s processes hold now (None: unknown)."""
        with self._lock:
            w = self._watched.get(key)
            if w is None or not w.readable:
                return None
            return sum(s.ours_mb.get(key, 0) for s in self._states.values())

    # -- one look --------------------------------------------------------------------------------
    def tick(self) -> None:
        """Look at every GPU once, attribute its processes, update the attempts."""
        looks = {gpu: self.query.sample(_device_key(g)) for gpu, g in self.gpus.items()}
        energy = self._read_energy()
        with self._lock:
            unknown, ask = self._unknown(looks)
        answers = _ask(ask) if unknown else []  # the backends' pids: outside the lock
        with self._lock:
            self._attribute(unknown, answers)
            changed = self._account(looks)
            self._apportion(energy)
            events = self._check_releases()
        for event in events:
            event()
        if self.on_tick is not None:
            self.on_tick()
        if changed and self.on_change is not None:
            self.on_change()

    def _unknown(self, looks: Mapping[int, DeviceSample]) -> tuple[set[int], list[Watched]]:
        """Pids on a GPU not attributed yet (a foreign one is asked about again after a while),
        and the live attempts to ask: only those on a GPU showing one."""
        now = time.monotonic()
        unknown: set[int] = set()
        where: set[int] = set()
        listed = {p.pid for look in looks.values() for p in look.procs or ()}
        if len(self._foreign) > len(listed):  # forget foreign pids no GPU lists any more
            self._foreign = {p: t for p, t in self._foreign.items() if p in listed}
        for gpu, look in looks.items():
            for p in look.procs or ():
                recheck = now - self._foreign.get(p.pid, -1e9) > FOREIGN_RECHECK_SECONDS
                if p.pid not in self._owner and recheck:
                    unknown.add(p.pid)
                    where.add(gpu)
        ask = [
            w
            for w in self._watched.values()
            if w.ended_at is None and where.intersection(w.gpus)  # an ended one runs nothing
        ]
        return unknown, ask

    def _attribute(self, unknown: set[int], answers: list[tuple[Watched, set[int]]]) -> None:
        now = time.monotonic()
        for w, pids in answers:
            if self._watched.get(w.key) is not w:
                continue  # forgotten meanwhile
            for pid in unknown & pids:
                self._owner[pid] = w.key
                w.pids.add(pid)
        for pid in unknown - self._owner.keys():
            self._foreign[pid] = now

    def _account(self, looks: Mapping[int, DeviceSample]) -> bool:
        """New GpuStates from ``looks``; per-attempt usage; True when room may have grown."""
        changed = False
        per_key: dict[str, int] = {}
        for gpu, look in looks.items():
            ours: dict[str, int] = {}
            foreign_pids: list[int] = []
            unknown_size: dict[str, bool] = {}
            for p in look.procs or ():
                key = self._owner.get(p.pid)
                if key is None:
                    foreign_pids.append(p.pid)
                    continue
                if p.used_mb is None:
                    unknown_size[key] = True
                ours[key] = ours.get(key, 0) + (p.used_mb or 0)
            if look.used_mb is not None and len(ours) == 1 and not foreign_pids:
                (only,) = ours
                if unknown_size.get(only):  # the driver hides per-process memory: alone on it
                    ours[only] = look.used_mb
            held = sum(ours.values())
            foreign_mb = max(0, (look.used_mb or 0) - held)
            old = self._states.get(gpu)
            state = GpuState(
                look.total_mb,
                look.used_mb,
                look.util,
                ours,
                foreign_mb,
                tuple(foreign_pids),
                look.procs is not None,
            )
            if old is not None and (
                state.foreign_mb < old.foreign_mb or len(state.ours_mb) < len(old.ours_mb)
            ):
                changed = True
            self._states[gpu] = state
            for key, mb in ours.items():
                per_key[key] = per_key.get(key, 0) + mb
        for w in self._watched.values():
            if w.ended_at is None:
                self._count(w, per_key.get(w.key, 0), looks)
        return changed

    def _read_energy(self) -> dict[int, tuple[float, int | None, int | None]]:
        """Each GPU's energy counter (else its power) now: outside the lock, like the looks."""
        if self._energy_mj is None:
            return {}
        out: dict[int, tuple[float, int | None, int | None]] = {}
        for gpu, g in self.gpus.items():
            mj = self._energy_mj(_device_key(g))
            mw = self._power_mw(_device_key(g)) if mj is None and self._power_mw else None
            out[gpu] = (time.monotonic(), mj, mw)
        return out

    def _apportion(self, energy: Mapping[int, tuple[float, int | None, int | None]]) -> None:
        """Each GPU's energy since the last look, split between the attempts on it."""
        for gpu, (now, mj, mw) in energy.items():
            got = self._energy.look(gpu, now, mj, mw)
            if got is None:
                continue
            on = [w for w in self._watched.values() if w.ended_at is None and gpu in w.gpus]
            state = self._states.get(gpu)
            held = {w.key: state.ours_mb.get(w.key, 0) if state else 0 for w in on}
            for w in on:
                w.energy_j += split(got[0], held)[w.key]
                w.energy_known = True
                w.shared = w.shared or len(on) > 1

    def _count(self, w: Watched, mb: int, looks: Mapping[int, DeviceSample]) -> None:
        mine = [looks[g] for g in w.gpus if g in looks]
        if not any(look.procs is not None for look in mine):
            return  # no process list of its GPUs: not measured
        w.readable = True
        w.samples += 1
        w.peak = max(w.peak, mb)
        w.total += mb
        utils = [look.util for look in mine if look.util is not None]
        if utils:
            util = round(sum(utils) / len(utils))
            w.util_peak = util if w.util_peak is None else max(w.util_peak, util)
            w.util_total += util
            w.util_samples += 1

    def _holds(self, w: Watched, gpu: int | None = None) -> bool:
        """Whether a pid of ``w`` holds memory on ``gpu`` (any of its GPUs) at the last look."""
        gpus = w.gpus if gpu is None else (gpu,)
        return any(w.key in self._states[g].ours_mb for g in gpus if g in self._states)

    def _forget(self, w: Watched) -> None:
        self._watched.pop(w.key, None)
        for pid in w.pids:
            if self._owner.get(pid) == w.key:
                del self._owner[pid]

    def _check_releases(self) -> list[Callable[[], None]]:
        events: list[Callable[[], None]] = []
        now = time.monotonic()
        for w in list(self._watched.values()):
            if w.ended_at is None:
                continue
            if not self._holds(w):
                self._forget(w)
                if w.held and self.on_freed is not None:
                    events.extend(_bind_freed(self.on_freed, g, w.key) for g in w.gpus)
                continue
            if not w.held and now - w.ended_at >= self.release_timeout:
                w.held = True
                if self.on_held is not None:
                    for g in w.gpus:
                        mb = self._states[g].ours_mb.get(w.key, 0) if g in self._states else 0
                        pids = tuple(sorted(p for p in w.pids if self._owner.get(p) == w.key))
                        events.append(_bind_held(self.on_held, g, w.key, pids, mb))
        return events


def _ask(watched: list[Watched]) -> list[tuple[Watched, set[int]]]:
    """Each attempt's pids from its backend; one that cannot say leaves its pids unattributed."""
    out = []
    for w in watched:
        try:
            out.append((w, set(w.pids_of())))
        except Exception:
            continue
    return out


def _bind_held(
    fn: Callable[[int, str, tuple[int, ...], int], None],
    gpu: int,
    key: str,
    pids: tuple[int, ...],
    mb: int,
) -> Callable[[], None]:
    return lambda: fn(gpu, key, pids, mb)


def _bind_freed(fn: Callable[[int, str], None], gpu: int, key: str) -> Callable[[], None]:
    return lambda: fn(gpu, key)


def _device_key(gpu: Gpu) -> str | int:
    """How the query finds a GPU: its UUID (MIG instances have nothing else), else its id."""
    return gpu.uuid or gpu.index
