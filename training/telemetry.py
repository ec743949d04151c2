"""Device telemetry through NVML, on a background thread, never in the step's hot path (seed 004's signals).

``DeviceTelemetry(journal).start()`` reads, at most once per ``interval_s``, every visible GPU's temperature, HBM
temperature, ECC error counts (corrected and uncorrected, volatile and aggregate), power, SM clock and
clock-event (throttle) reasons through ``nvidia-ml-py`` (the ``telemetry`` extra). It journals one
``device_sampled`` per device every ``log_every_s`` and a ``device_changed`` at once when something that matters
changes: an ECC count rising, throttling starting or stopping. A value a device does not report is ``null``, never
a guess. Without NVML (no driver, no GPU, the package missing) it journals ``telemetry_unavailable`` once, with the
reason, and stops: it never invents values.

The reads go through a small object with NVML's function names (``pynvml`` itself by default), so tests can hand
it a stand-in; the real calls run on a GPU machine.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from trainledger.journal import Journal
from trainledger.journal.kinds import DeviceChanged, DeviceSampled, TelemetryUnavailable

__all__ = ["DeviceTelemetry", "read_device"]

# NVML constants (nvml.h), so that a stand-in needs no pynvml.
_TEMPERATURE_GPU = 0
_CLOCK_SM = 1
_MEMORY_ERROR_CORRECTED, _MEMORY_ERROR_UNCORRECTED = 0, 1
_VOLATILE_ECC, _AGGREGATE_ECC = 0, 1
_FI_DEV_MEMORY_TEMP = 82
#: Clock-event reasons that mean the device is slowing itself down (nvml.h: SW/HW thermal, HW slowdown,
#: power brake).
_THROTTLE_MASK = 0x20 | 0x40 | 0x8 | 0x80


def _try(fn, *args) -> Any:
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - NVMLError_NotSupported and friends: the device does not report it
        return None


def read_device(nvml: Any, handle: Any) -> dict[str, Any]:
    """One reading of one device: every field NVML gives, ``None`` for what it does not."""
    temp_hbm = None
    fv = _try(nvml.nvmlDeviceGetFieldValues, handle, [_FI_DEV_MEMORY_TEMP])
    if fv:
        v = fv[0]
        if getattr(v, "nvmlReturn", 1) == 0:
            temp_hbm = float(getattr(v.value, "uiVal", getattr(v.value, "ullVal", 0)))
    ecc = {}
    for name, kind, counter in (("corrected_volatile", _MEMORY_ERROR_CORRECTED, _VOLATILE_ECC),
                                ("uncorrected_volatile", _MEMORY_ERROR_UNCORRECTED, _VOLATILE_ECC),
                                ("corrected_aggregate", _MEMORY_ERROR_CORRECTED, _AGGREGATE_ECC),
                                ("uncorrected_aggregate", _MEMORY_ERROR_UNCORRECTED, _AGGREGATE_ECC)):
        ecc[name] = _try(nvml.nvmlDeviceGetTotalEccErrors, handle, kind, counter)
    reasons = _try(getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
                   or nvml.nvmlDeviceGetCurrentClocksThrottleReasons, handle)
    power = _try(nvml.nvmlDeviceGetPowerUsage, handle)
    temp = _try(nvml.nvmlDeviceGetTemperature, handle, _TEMPERATURE_GPU)
    sm = _try(nvml.nvmlDeviceGetClockInfo, handle, _CLOCK_SM)
    return {"temp_c": None if temp is None else float(temp), "temp_hbm_c": temp_hbm,
            "power_w": None if power is None else power / 1000.0, "sm_clock_mhz": None if sm is None else int(sm),
            "clock_event_reasons": None if reasons is None else int(reasons), "ecc": ecc}


class DeviceTelemetry:
    """The sampler. ``start()`` / ``stop()``; ``samples`` counts readings (for tests and reports)."""

    def __init__(self, journal: Journal, *, interval_s: float = 1.0, log_every_s: float = 60.0, nvml: Any = None):
        if not interval_s >= 1.0 and nvml is None:
            raise ValueError("NVML is read at most once a second: interval_s must be >= 1")
        self.journal, self.interval_s, self.log_every_s = journal, interval_s, log_every_s
        self._nvml = nvml
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last: dict[int, dict[str, Any]] = {}
        self._last_logged = 0.0
        self.samples = 0
        self.available = False

    def start(self) -> DeviceTelemetry:
        nvml = self._nvml
        try:
            if nvml is None:
                import pynvml as nvml  # nvidia-ml-py
            nvml.nvmlInit()
            n = nvml.nvmlDeviceGetCount()
            if n < 1:
                raise RuntimeError("NVML sees no device")
            self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
        except Exception as e:  # noqa: BLE001 - ImportError, NVMLError_LibraryNotFound, no driver, no device
            why = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            self.journal.append(TelemetryUnavailable(reason=why), durable=True)
            return self
        self._nvml, self.available = nvml, True
        self._thread = threading.Thread(target=self._run, name="trainledger-telemetry", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def sample_once(self) -> None:
        """Read every device now; journal a sample when the log interval is up, a change at once."""
        now = time.monotonic()
        log = now - self._last_logged >= self.log_every_s
        for i, h in enumerate(self._handles):
            cur = read_device(self._nvml, h)
            prev = self._last.get(i)
            if prev is not None:
                for what, detail in _changes(prev, cur):
                    self.journal.append(DeviceChanged(device=i, change=what, detail=detail), durable=True)
            self._last[i] = cur
            if log:
                self.journal.append(DeviceSampled(device=i, **{k: v for k, v in cur.items() if k != "ecc"},
                                                  ecc={k: v for k, v in cur["ecc"].items() if v is not None}))
        if log:
            self._last_logged = now
        self.samples += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample_once()
            self._stop.wait(self.interval_s)


def _changes(prev: dict[str, Any], cur: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for name, v in cur["ecc"].items():
        p = prev["ecc"].get(name)
        if v is not None and p is not None and v > p:
            out.append(("ecc_uncorrected" if "uncorrected" in name else "ecc_corrected",
                        {"counter": name, "before": p, "after": v}))
    pr, cr = prev["clock_event_reasons"], cur["clock_event_reasons"]
    if pr is not None and cr is not None and bool(pr & _THROTTLE_MASK) != bool(cr & _THROTTLE_MASK):
        out.append(("throttle_started" if cr & _THROTTLE_MASK else "throttle_stopped",
                    {"reasons": cr, "temp_c": cur["temp_c"]}))
    return out
