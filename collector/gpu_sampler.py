"""The GPU's own telemetry beside the stage timer: an NVML sampler (``nvidia-ml-py``, the
``nvml`` extra) writing ``gpu_health`` points with the rank's ``stage_latency`` tags (job, rank,
host, gpu, ...), at most one sample a second, on a thread of its own, through a
:class:`~collector.writer.background.BackgroundWriter` (nothing on the training thread waits).

Each sample: the clock-event reasons bitmask (field 112, ``nvmlDeviceGetCurrentClocksEventReasons``,
``...ThrottleReasons`` on older drivers), SM clock, temperature, power, the XID critical errors seen
since the last sample (an NVML event set; the last code, 0: none), the volatile uncorrected ECC
count, the remapped-rows counts and the PCIe replay counter. A call the GPU does not support
leaves its field out. No NVML (no ``pynvml`` module, no driver, no GPU): one log line and
nothing else; :meth:`GpuSampler.start` returns False.

A training script need not know this class: :class:`~collector.stage_timer.StageTimer` starts
one beside itself (:func:`beside_timer`, its ``gpu_health`` option: on by default when its sink is a
:class:`~collector.writer.background.BackgroundWriter` and the rank names its GPU, writing through a
second writer on the same store) and closes it with :meth:`StageTimer.close`. By hand::

    writer = BackgroundWriter(store, measurement="gpu_health", name="rankscope-gpu-health")
    sampler = GpuSampler(coords, writer.put)      # coords: the rank's, as the stage timer's
    sampler.start()                               # ... training ...
    sampler.close(); writer.close()

The GPU sampled is the rank's: by its UUID where known (NVML numbers GPUs as the machine does,
not as ``CUDA_VISIBLE_DEVICES`` does), else the ``CUDA_VISIBLE_DEVICES`` entry of its index, else
its index; ``device=`` names an NVML index outright.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from collector.coordinates import RankCoordinates
from collector.writer.background import BackgroundWriter
from rankscope import gpu_health as gh
from rankscope import schema

log = logging.getLogger(__name__)

#: The fastest a GPU is sampled (the issue's bound: one sample a second).
MIN_INTERVAL_S = 1.0
DEFAULT_INTERVAL_S = 5.0
#: XID events drained per sample at most (a storm of them must not hold the thread).
MAX_EVENTS = 32
#: How long closing waits for the last points of a writer the sampler made (training is over).
CLOSE_TIMEOUT_S = 5.0


def load_nvml() -> Any | None:
    """NVML's module, initialised; None (one log line) where there is none."""
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        log.info("no GPU telemetry: the nvidia-ml-py package is not installed (pip install 'rankscope[nvml]')")
        return None
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        log.info("no GPU telemetry: NVML cannot start here (%s)", exc)
        return None
    return pynvml


class GpuSampler:
    """Samples one GPU every ``interval_s`` (>= 1 s) and hands each point to ``sink``.

    ``nvml``: NVML's module (default :func:`load_nvml`); ``device``: the NVML index (default the
    rank's GPU: see the module docstring). ``writer``: a writer to close with the sampler (one
    made for it, as :func:`beside_timer` does)."""

    def __init__(self, coords: RankCoordinates, sink: Callable[[dict], None], interval_s: float = DEFAULT_INTERVAL_S,
                 nvml: Any | None = None, device: int | None = None,
                 wall_clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
                 writer: BackgroundWriter | None = None, env: Mapping[str, str] | None = None):
        if not interval_s >= MIN_INTERVAL_S:
            raise ValueError(f"interval_s must be at least {MIN_INTERVAL_S:g} (one sample a second), got {interval_s!r}")
        self.coords, self.sink, self.interval_s = coords, sink, float(interval_s)
        self._nvml, self._given = nvml, nvml is not None
        self._index_given = device is not None
        self.device = device if device is not None else (coords.gpu if coords.gpu is not None else 0)
        self.writer = writer
        self._env = os.environ if env is None else env
        self._wall_ms = wall_clock_ms
        self._tags = {k: v for k, v in coords.rows(0, 0, {}).to_dict("records")[0].items()
                      if k in schema.RANK_TAGS}
        if coords.gpu_uuid:
            self._tags[gh.UUID_FIELD] = coords.gpu_uuid
        self._handle = self._events = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.samples = 0

    # ------------------------------------------------------------------ life
    def open(self) -> bool:
        """Find the GPU (and its UUID) and register for XID events; False where NVML is missing.
        Opening an open sampler does nothing (True)."""
        if self._handle is not None:
            return True
        nv = self._nvml if self._given else load_nvml()
        if nv is None:
            return False
        self._nvml = nv
        try:
            self._handle = self._find(nv)
        except Exception as exc:  # noqa: BLE001
            log.info("no GPU telemetry: NVML has no device %s (%s)", self.device, exc)
            return False
        uuid = self._call("nvmlDeviceGetUUID", self._handle)
        if uuid is not None:
            self._tags[gh.UUID_FIELD] = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        try:
            self._events = nv.nvmlEventSetCreate()
            nv.nvmlDeviceRegisterEvents(self._handle, nv.nvmlEventTypeXidCriticalError, self._events)
        except Exception:  # noqa: BLE001 - XIDs are not reported on this GPU: the rest is
            self._events = None
        return True

    def _find(self, nv: Any) -> Any:
        """The rank's GPU in NVML's numbering: by its UUID, else its ``CUDA_VISIBLE_DEVICES``
        entry, else its index (``device=`` given: that index)."""
        if not self._index_given:
            uuid = self._tags.get(gh.UUID_FIELD)
            visible = [v.strip() for v in str(self._env.get("CUDA_VISIBLE_DEVICES", "")).split(",") if v.strip()]
            entry = visible[int(self.device)] if int(self.device) < len(visible) else None
            for key in (uuid, entry if entry and not entry.isdigit() else None):
                if key and hasattr(nv, "nvmlDeviceGetHandleByUUID"):
                    try:
                        return nv.nvmlDeviceGetHandleByUUID(key)
                    except Exception:  # noqa: BLE001 - a MIG or unknown UUID: the next way
                        pass
            if entry and entry.isdigit():
                return nv.nvmlDeviceGetHandleByIndex(int(entry))
        return nv.nvmlDeviceGetHandleByIndex(int(self.device))

    def start(self) -> bool:
        """Open and sample on a daemon thread; False (nothing started) without NVML."""
        if self._closed or not self.open():
            return False
        if self._thread is not None:
            return True
        self._thread = threading.Thread(target=self._run, name="rankscope-gpu-sampler", daemon=True)
        self._thread.start()
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                self.sink(self.sample())
            except Exception as exc:  # noqa: BLE001 - the sampler never stops training
                log.warning("GPU sample failed: %s", exc)
            self._stop.wait(max(MIN_INTERVAL_S, self.interval_s) - min(time.monotonic() - t0, 0.5))

    @property
    def running(self) -> bool:
        """The sampling thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop sampling, free the XID event set and close the sampler's own writer (once)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self._events is not None:
            self._call("nvmlEventSetFree", self._events)
        if self.writer is not None:
            self.writer.close(CLOSE_TIMEOUT_S)

    # ------------------------------------------------------------------ one sample
    def _call(self, name: str, *args: Any) -> Any:
        """One NVML call; None where the GPU or driver does not support it."""
        fn = getattr(self._nvml, name, None)
        if fn is None:
            return None
        try:
            return fn(*args)
        except Exception:  # noqa: BLE001 - NVMLError_NotSupported and friends: the field is left out
            return None

    def _xid(self) -> int:
        """The last XID critical error since the previous sample (0: none)."""
        code = 0
        for _ in range(MAX_EVENTS if self._events is not None else 0):
            data = self._call("nvmlEventSetWait_v2", self._events, 0) or self._call("nvmlEventSetWait", self._events, 0)
            if data is None:
                break
            code = int(getattr(data, "eventData", 0) or 0)
        return code

    def sample(self) -> dict:
        """One ``gpu_health`` point of the GPU now."""
        nv, h = self._nvml, self._handle
        reasons = self._call("nvmlDeviceGetCurrentClocksEventReasons", h)
        if reasons is None:
            reasons = self._call("nvmlDeviceGetCurrentClocksThrottleReasons", h)
        power = self._call("nvmlDeviceGetPowerUsage", h)
        rows = self._call("nvmlDeviceGetRemappedRows", h)
        values = {
            gh.REASONS: reasons, gh.SM_CLOCK: self._call("nvmlDeviceGetClockInfo", h, getattr(nv, "NVML_CLOCK_SM", 1)),
            gh.TEMPERATURE: self._call("nvmlDeviceGetTemperature", h, getattr(nv, "NVML_TEMPERATURE_GPU", 0)),
            gh.POWER: None if power is None else power / 1000.0, gh.XID: self._xid(),
            gh.ECC_DBE: self._call("nvmlDeviceGetTotalEccErrors", h, getattr(nv, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1),
                                   getattr(nv, "NVML_VOLATILE_ECC", 0)),
            gh.REMAPPED_ROWS: None if rows is None else rows[1], gh.ROW_REMAP_FAILURE: None if rows is None else int(bool(rows[3])),
            gh.PCIE_REPLAYS: self._call("nvmlDeviceGetPcieReplayCounter", h),
        }
        self.samples += 1
        point = {"time": int(self._wall_ms()), **self._tags}
        point.update({k: (float(v) if k in gh.LEVELS else int(v)) for k, v in values.items() if v is not None})
        return point


def beside_timer(coords: RankCoordinates, stage_sink: Callable[[dict], None] | None, gpu_health: Any = None,
                 cuda: bool = False, nvml: Any | None = None, interval_s: float = DEFAULT_INTERVAL_S
                 ) -> GpuSampler | None:
    """The started sampler of a stage timer's rank (:class:`~collector.stage_timer.StageTimer`'s
    ``gpu_health``), or None:

    - ``None`` (the default): on when ``stage_sink`` is a :class:`BackgroundWriter` (or its ``put``)
      and the rank names its GPU (its ``gpu`` index or ``gpu_uuid``; a CUDA rank that names neither
      gets one log line: NVML numbers the machine's GPUs, index 0 is another rank's); the points go through a
      second writer on that writer's store, made once NVML has opened and closed with the sampler;
    - ``True``: the same, and a ``stage_sink`` that is no writer is an error;
    - a callable: the ``gpu_health`` points go to it;
    - ``False``: off.

    Without NVML: one log line (:func:`load_nvml`) and None, no thread, no writer."""
    if not (gpu_health is None or isinstance(gpu_health, bool) or callable(gpu_health)):
        raise TypeError(f"gpu_health must be None, True, False or a callable, got {gpu_health!r}")
    if gpu_health is False:
        return None
    writer = stage_sink if isinstance(stage_sink, BackgroundWriter) else getattr(stage_sink, "__self__", None)
    writer = writer if isinstance(writer, BackgroundWriter) else None
    if callable(gpu_health) and not isinstance(gpu_health, bool):
        sink = gpu_health
    elif writer is None:
        if gpu_health is True:
            raise ValueError("gpu_health=True writes through the stage timer's BackgroundWriter: pass "
                             "sink=writer.put, or gpu_health=<a callable taking each gpu_health point>")
        return None
    elif gpu_health is None and coords.gpu is None and not coords.gpu_uuid:
        if cuda:   # NVML numbers the machine's GPUs: a guess (index 0) would blame another rank's
            log.info("no GPU telemetry: rank %s names no GPU (RankCoordinates gpu or gpu_uuid); "
                     "gpu_health=True samples index 0", coords.rank)
        return None   # a rank that names no GPU: nothing to watch that is surely its own
    else:
        sink = None
    sampler = GpuSampler(coords, sink or (lambda _point: None), interval_s=interval_s, nvml=nvml)
    if not sampler.open():
        return None
    if sink is None:
        sampler.writer = BackgroundWriter(writer.store, measurement=schema.GPU_HEALTH, name="rankscope-gpu-health")
        sampler.sink = sampler.writer.put
    sampler.start()
    return sampler
