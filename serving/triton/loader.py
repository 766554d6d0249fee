"""Models loaded on demand into the embedded Triton, held within a memory budget.

With ``SERVING_TRITON_MEMORY_BUDGET_MB`` set, the embedded Triton no longer keeps every deployed
model loaded. Each model is loaded once when deployed (admission: a model that cannot load fails
there, visibly, not on a client's request; its memory is measured), then stays loaded while there
is room. When a model must be loaded and the budget would be exceeded, the least recently used
idle models are unloaded first (serving/triton/budget.py decides which). A worker whose request
finds its model cold asks for it over serving/triton/loader_http.py and waits: the request costs
the load time, never an error.

Memory is measured, not guessed: the resident set (RSS) of each model's Python-backend stub
processes, read with psutil. RSS counts the interpreter's and onnxruntime's shared pages once per
stub, so the sum overstates what the machine really holds; the budget errs on the safe side.

Instances are sized by use: a model loads with one instance (one stub), and grows to its full
instance count (serving/triton/python_backend.py's ``instance_layout``) while it is busy, back to
one after ``SHRINK_IDLE_S`` without requests. Triton swaps a reloaded model in while the old
instances keep answering, so resizing loses no request.
"""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable

from serving.triton.budget import COLD, FAILED, LOADED, PROTECT_S, MemoryBudget
from serving.triton.python_backend import control_call

log = logging.getLogger(__name__)

STUB = "triton_python_backend_stub"
SHRINK_IDLE_S = 30.0   # a grown model idle this long goes back to one instance
GROW_BUSY = 0.6        # share of a window its instances spent computing, past which a model grows
GROW_QUEUE = 0.25      # or requests waiting for an instance this share of the window
HEADROOM_IDLE_S = 30.0  # a model idle this long may be unloaded ahead of need, keeping room for one more
UNLOAD_WAIT_S = 20.0   # how long an unload may take before its memory is counted as freed anyway
UNLOAD_POLL_S = 0.02   # how often an unload under way is looked at (its stubs, Triton's index)
HOLDING = frozenset({"READY", "LOADING", "UNLOADING"})  # index states of a model Triton still holds


class NotLoadable(LookupError):
    """The model is not deployed here, or never loaded successfully: nothing to load on demand."""


class BudgetBusy(RuntimeError):
    """Every model holding the budget is busy: the load waits, then gives up (a 503 to retry)."""


class LoadFailed(RuntimeError):
    """Triton could not load the model."""


def stub_processes(server_pid: int) -> list[tuple[str, Any]]:
    """(model name, process) of each running Python-backend stub under tritonserver (the stub's
    second argument is ``<repository>/<model>/<version>/model.py``)."""
    import psutil

    try:
        children = psutil.Process(server_pid).children(recursive=True)
    except psutil.Error:
        return []
    found = []
    for p in children:
        try:
            cmd = p.cmdline()
            if len(cmd) > 1 and cmd[0].endswith(STUB) and p.status() != psutil.STATUS_ZOMBIE:
                found.append((Path(cmd[1]).parts[-3], p))
        except (psutil.Error, IndexError):
            continue
    return found


def stub_memory(server_pid: int) -> dict[str, int]:
    """Resident bytes (RSS) of each model's stubs, by model name."""
    import psutil

    found: dict[str, int] = {}
    for name, p in stub_processes(server_pid):
        try:
            found[name] = found.get(name, 0) + p.memory_info().rss
        except psutil.Error:
            continue
    return found


class ModelLoader:
    """Loads, unloads and resizes models in one tritonserver so the budget holds."""

    def __init__(self, http_url: str, headers: dict[str, str], server_pid: int, budget: MemoryBudget,
                 write: Callable[[str, int], None], full_instances: Callable[[str], int],
                 check: Callable[[str], None], known_good: dict[str, str] | None = None) -> None:
        self.http_url = http_url
        self.headers = headers
        self.server_pid = server_pid
        self.budget = budget
        self.write = write                    # (name, instances): write the model's repository entry
        self.full_instances = full_instances  # name -> instances it has when busy
        self.check = check                    # name: raises when the model cannot be opened
        self.known_good = known_good if known_good is not None else {}  # name -> artifact, across restarts
        self.state = threading.Lock()         # guards self.budget
        self.load_lock = threading.Lock()     # one load/unload sequence at a time
        self.demand = 0                       # requests waiting: admissions give way to them
        self.samples: dict[str, tuple[float, int, int]] = {}  # name -> (t, queue ns, compute ns)

    # --- Triton ------------------------------------------------------------------------------
    def _call(self, timeout: float, method: str, *args: Any) -> Any:
        return control_call(self.http_url, self.headers, timeout, method, *args)

    def _index(self) -> dict[str, str]:
        return {m["name"]: m.get("state", "") for m in self._call(10.0, "get_model_repository_index")
                if isinstance(m, dict) and "name" in m}

    def _stats(self) -> list[dict[str, Any]]:
        return self._call(10.0, "get_inference_statistics").get("model_stats", [])

    # --- admission and demand -----------------------------------------------------------------
    def admit(self, name: str, artifact: str) -> None:
        """A newly deployed (or changed) model. While it fits without unloading anything it is
        loaded (warm for its first request, its memory measured); otherwise it is only opened
        with onnxruntime here, to check it loads, and stays cold: deploying many models costs
        no churn of the loaded ones. Raises LoadFailed when it cannot load. A model that loaded
        before under this artifact (before a tritonserver restart) is taken as loadable."""
        with self.state:
            m = self.budget.model(name)
            if self.known_good.get(name) == artifact:
                m.loadable = True
                if not m.in_memory():
                    m.state = COLD
                return
            m.loadable = False
        while self.demand:  # requests waiting for a load go first
            time.sleep(0.05)
        with self.load_lock:
            self._observe()
            with self.state:  # a loaded model whose files changed is reloaded in place; a new one
                # is loaded only while room for one more stays free (the headroom _keep_headroom makes)
                free = self.budget.limit - self.budget.used(exclude={name})
                room = m.in_memory() or free >= 2 * self.budget.estimate(name, 1)
            if room:
                self._load(name, m.instances or 1, protect=False)
                self._fit(keep={name})
            else:
                self._check(name)
        with self.state:
            m.loadable = True
        self.known_good[name] = artifact

    def _check(self, name: str) -> None:
        """Open the model with onnxruntime, as its stub will, without loading it into Triton."""
        m = self.budget.model(name)
        try:
            self.check(name)
        except Exception as exc:
            with self.state:
                m.state, m.error = FAILED, " ".join(str(exc).split())[:500]
            raise LoadFailed(f"{name} cannot be loaded: {m.error}") from None
        with self.state:
            m.state, m.error = COLD, ""

    def ensure(self, name: str, timeout_s: float = 60.0) -> float:
        """Load ``name`` for a waiting request (no-op when loaded); returns the seconds it took."""
        with self.state:
            m = self.budget.models.get(name)
            if m is None or not m.loadable:
                raise NotLoadable(f"{name} is not deployed here or never loaded successfully"
                                  + (f": {m.error}" if m is not None and m.error else ""))
            self.demand += 1
        t0 = time.monotonic()
        try:
            with self.load_lock:
                if self._ready(name):
                    with self.state:
                        m.last_used = time.time()
                        m.protected_until = m.last_used + PROTECT_S
                    return 0.0
                self._load_within_budget(name, protect=True, wait_s=timeout_s)
        finally:
            with self.state:
                self.demand -= 1
        return time.monotonic() - t0

    def forget(self, name: str) -> None:
        """The registry no longer deploys ``name``: unloaded here first, completely, as for an
        eviction (the binder's own unload after it then finds nothing to do), so that its room
        is not counted free while Triton still holds it."""
        with self.load_lock:
            with self.state:
                m = self.budget.models.get(name)
                held = m is not None and m.in_memory()
            if held:
                self._unload(name, "no longer deployed")
            with self.state:
                self.budget.forget(name)
                self.samples.pop(name, None)
        self.known_good.pop(name, None)

    def instances(self, name: str) -> int:
        with self.state:
            m = self.budget.models.get(name)
            return m.instances if m is not None and m.instances else 1

    def _ready(self, name: str) -> bool:
        try:
            return bool(self._call(5.0, "is_model_ready", name))
        except Exception:
            return False

    def _load_within_budget(self, name: str, protect: bool, wait_s: float) -> None:
        """Under ``load_lock``: make room (waiting while busy models hold it), then load."""
        deadline = time.monotonic() + wait_s
        while True:
            self._observe()
            with self.state:
                m = self.budget.model(name)
                if m.state == LOADED:  # loaded meanwhile (another request's load)
                    if protect:
                        m.last_used, m.protected_until = time.time(), time.time() + PROTECT_S
                    return
                victims = self.budget.victims(self.budget.estimate(name, 1), time.time(), keep={name})
                if victims is not None:  # check and reserve at once: no later check can give the room away
                    was = m.state
                    self.budget.reserve(name, 1)
                    break
            if time.monotonic() >= deadline:
                raise BudgetBusy(f"memory budget of {self.budget.limit >> 20} MB is held by busy models; "
                                 f"{name} cannot load now")
            self.load_lock.release()  # let busy models' requests finish meanwhile
            try:
                time.sleep(0.25)
            finally:
                self.load_lock.acquire()
        try:
            for victim in victims:
                self._unload(victim)
        except BaseException:
            with self.state:
                m.state, m.bytes, m.instances = was, 0, 0
            raise
        self._load(name, 1, protect, was=was)
        self._fit(keep={name})

    def _load(self, name: str, instances: int, protect: bool, was: str | None = None) -> None:
        """Load (reserving its room first unless the caller did, as ``was`` says)."""
        with self.state:
            m = self.budget.model(name)
            previous = was or m.state
            if was is None:
                self.budget.reserve(name, instances)
        t0 = time.monotonic()
        try:
            self.write(name, instances)
            self._call(300.0, "load_model", name)
        except Exception as exc:
            with self.state:
                m.state = COLD if m.loadable else FAILED
                m.instances, m.bytes = 0, 0
                m.error = str(exc)[:500]
            raise LoadFailed(f"Triton could not load {name}: {m.error}") from None
        now = time.time()
        measured = stub_memory(self.server_pid).get(name, 0)
        with self.state:
            m.state, m.error = LOADED, ""
            self.budget.loaded(name, measured)
            if protect:
                m.last_used, m.protected_until = now, now + PROTECT_S
        log.info("loaded %s (%d instance(s), %.1f MB, %.2fs; was %s; %.0f/%.0f MB in use)", name, instances,
                 measured / 2**20, time.monotonic() - t0, previous, self.budget.used() / 2**20,
                 self.budget.limit / 2**20)

    def _unload(self, name: str, why: str = "for the memory budget") -> None:
        """Unload and wait until the unload is complete, so the memory is really free again.

        Triton's unload returns at once and completes in the background: the model's stubs exit
        first, and only once the backend has finalized the model (its shared-memory regions
        released) does the index show it UNAVAILABLE. Until then Triton still holds it
        (UNLOADING): a load begun on the stubs' exit alone held one model more than the budget
        for a moment (the flaky walk of issue 26)."""
        try:
            self._call(60.0, "unload_model", name)
        except Exception as exc:
            log.warning("unloading %s failed: %s", name, exc)
        deadline = time.monotonic() + UNLOAD_WAIT_S
        while not self._unloaded(name):
            if time.monotonic() >= deadline:
                log.warning("unloading %s takes over %.0fs; counting its memory as freed", name, UNLOAD_WAIT_S)
                break
            time.sleep(UNLOAD_POLL_S)
        with self.state:
            m = self.budget.model(name)
            m.state, m.bytes, m.instances = COLD, 0, 0
        self.samples.pop(name, None)
        log.info("unloaded %s %s", name, why)

    def _unloaded(self, name: str) -> bool:
        """No stub of ``name`` runs and Triton's index no longer holds it (an unreadable index
        counts as holding it, until the deadline)."""
        if name in stub_memory(self.server_pid):
            return False
        try:
            return self._index().get(name) not in HOLDING
        except Exception:
            return False

    def _fit(self, keep: set[str]) -> None:
        """Measured past the budget (a model grew as onnxruntime allocated): unload idle ones."""
        with self.state:
            held = sum(m.bytes for name, m in self.budget.models.items() if name in keep)
            # what ``keep`` holds must fit beside the rest: unloads exactly the excess (``over``
            # as the need unloaded about twice the excess)
            victims = self.budget.victims(held, time.time(), keep=keep) if self.budget.over() else []
        for victim in victims or []:
            self._unload(victim)

    def _keep_headroom(self) -> None:
        """Room for one more model, made ahead of need from a model idle ``HEADROOM_IDLE_S``: the
        next cold request then waits for its load only, not for an unload first (about 1.5 s of a
        stub's exit here)."""
        now = time.time()
        with self.state:
            if self.demand or self.budget.limit - self.budget.used() >= self.budget.estimate("", 1):
                return
            idle = [m for m in self.budget.models.values()
                    if m.state == LOADED and m.idle(now, HEADROOM_IDLE_S)]
            victim = min(idle, key=lambda m: m.last_used).name if idle else None
        if victim is not None:
            self._unload(victim)

    # --- what Triton reports ------------------------------------------------------------------
    def _observe(self) -> list[dict[str, Any]]:
        """Take Triton's index (models lost or loaded behind our back), its last-use times, and
        each model's measured memory into the budget. Returns the statistics."""
        try:
            index, stats = self._index(), self._stats()
        except Exception as exc:
            log.debug("cannot read Triton's index/statistics: %s", exc)
            return []
        memory = stub_memory(self.server_pid)
        with self.state:
            for name, m in self.budget.models.items():
                if m.state == LOADED and index.get(name) != "READY":
                    m.state, m.bytes, m.instances = COLD, 0, 0
                elif m.state == COLD and index.get(name) == "READY":  # loaded behind our back
                    m.state, m.instances = LOADED, max(1, sum(n == name for n, _ in stub_processes(self.server_pid)))
            for s in stats:
                m = self.budget.models.get(s.get("name", ""))
                if m is not None and int(s.get("last_inference") or 0):
                    m.last_used = max(m.last_used, int(s["last_inference"]) / 1000.0)
            for name, m in self.budget.models.items():
                if m.state == LOADED:
                    self.budget.record(name, memory.get(name, 0))
        return stats

    def refresh(self) -> None:
        """Periodic: sync with Triton, keep within the budget, resize models by use. Skipped while
        a load is under way (it observes Triton itself)."""
        if not self.load_lock.acquire(blocking=False):
            return
        try:
            stats = self._observe()
            self._fit(keep=set())
            self._keep_headroom()
            for name, instances in self._resizes(stats):
                self._resize(name, instances)
        finally:
            self.load_lock.release()

    def _resizes(self, stats: list[dict[str, Any]]) -> list[tuple[str, int]]:
        """(model, instances) for models busy on one instance, or idle on more."""
        now_wall, now = time.time(), time.monotonic()
        out = []
        for s in stats:
            name = s.get("name", "")
            inf = s.get("inference_stats") or {}
            queue_ns, compute_ns = int((inf.get("queue") or {}).get("ns", 0)), int(
                (inf.get("compute_infer") or {}).get("ns", 0))
            before = self.samples.get(name)
            self.samples[name] = (now, queue_ns, compute_ns)
            with self.state:
                m = self.budget.models.get(name)
                if m is None or m.state != LOADED or before is None:
                    continue
                window = max(1e-3, now - before[0])
                busy = (compute_ns - before[2]) / 1e9 / window / max(1, m.instances)
                queued = (queue_ns - before[1]) / 1e9 / window
                full = self.full_instances(name)
                if m.instances < full and (busy > GROW_BUSY or queued > GROW_QUEUE):
                    out.append((name, full))
                elif m.instances > 1 and now_wall - m.last_used > SHRINK_IDLE_S:
                    out.append((name, 1))
        return out

    def _resize(self, name: str, instances: int) -> None:
        """Reload with another instance count when it fits (old and new instances coexist while
        Triton swaps them); skipped when it does not."""
        with self.state:
            m = self.budget.models[name]
            victims = self.budget.victims(m.bytes + self.budget.estimate(name, instances), time.time(), keep={name})
        if victims is None:
            return
        for victim in victims:
            self._unload(victim)
        with self.state:
            previous, m.instances = m.instances, instances
        try:
            self.write(name, instances)
            self._call(300.0, "load_model", name)
        except Exception as exc:
            log.warning("resizing %s to %d instance(s) failed: %s", name, instances, exc)
            with self.state:
                m.instances = previous
            return
        deadline = time.monotonic() + UNLOAD_WAIT_S  # the old instances leave after the swap
        while time.monotonic() < deadline and sum(n == name for n, _ in stub_processes(self.server_pid)) > instances:
            time.sleep(0.05)
        with self.state:
            self.budget.loaded(name, stub_memory(self.server_pid).get(name, 0))
        log.info("%s now runs %d instance(s) (was %d)", name, instances, previous)

    def status(self) -> dict[str, Any]:
        with self.state:
            return self.budget.snapshot()
