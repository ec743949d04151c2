"""Device telemetry through NVML, on a background thread, never in the step's hot path (seed 004's signals).

``DeviceTelemetry(journal).start()`` reads, at most once per ``interval_s``, every visible GPU's temperature, HBM
temperature, ECC error counts (corrected and uncorrected, volatile and aggregate), power, SM clock and
clock-event (throttle) reasons through ``nvidia-ml-py`` (the ``telemetry`` extra). It journals one
``device_sampled`` per device every ``log_every_s`` (with, from format 1.7, NVML's cumulative energy counter, which
the compute statement's energy figure rests on) and a ``device_changed`` at once when something that matters
changes: an ECC count rising, throttling starting or stopping, an XID critical error (NVML's event API, polled
without waiting). Each change that is a fault (uncorrected ECC errors rising, an XID) or throttling starting is
followed by the ``anomaly_detected`` it implies (``device_fault``, ``thermal_throttle``), which replay derives from
the change again. A value a device does not report is ``null``, never a guess. Without NVML (no driver, no GPU, the package missing) it journals ``telemetry_unavailable`` once, with the
reason, and stops: it never invents values.

The reads go through a small object with NVML's function names (``pynvml`` itself by default), so tests can hand
it a stand-in; the real calls run on a GPU machine.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from trainledger.journal import Journal
from trainledger.training.kinds import DeviceChanged, DeviceSampled, TelemetryUnavailable, device_anomaly

__all__ = ["DeviceTelemetry", "read_device", "device_settings"]

# NVML constants (nvml.h), so that a stand-in needs no pynvml.
_TEMPERATURE_GPU = 0
_CLOCK_SM = 1
_MEMORY_ERROR_CORRECTED, _MEMORY_ERROR_UNCORRECTED = 0, 1
_VOLATILE_ECC, _AGGREGATE_ECC = 0, 1
_FI_DEV_MEMORY_TEMP = 82
_EVENT_XID = 0x0000000000000008  # nvmlEventTypeXidCriticalError
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
    # millijoules since the driver loaded (Volta or newer; NotSupported before): the compute statement's energy
    energy = _try(getattr(nvml, "nvmlDeviceGetTotalEnergyConsumption", None), handle)
    return {"energy_mj": None if energy is None else int(energy), "temp_c": None if temp is None else float(temp), "temp_hbm_c": temp_hbm,
            "power_w": None if power is None else power / 1000.0, "sm_clock_mhz": None if sm is None else int(sm),
            "clock_event_reasons": None if reasons is None else int(reasons), "ecc": ecc}


def device_settings(index: int = 0, *, nvml: Any = None) -> dict[str, Any]:
    """What a compute statement needs of device ``index`` (format 1.10's ``run_configured`` fields): its PCI
    device ID, the variant that ID names (SXM or PCIe, training.health.flops.PCI_VARIANTS) and where the name comes
    from, and the power limit it runs under (NVML's enforced limit, watts). Empty where NVML cannot be read (no
    driver, no GPU, the ``telemetry`` extra missing): nothing is guessed. ``nvml``: a stand-in with NVML's function
    names (tests); pynvml by default."""
    from trainledger.training.health.flops import VARIANT_SOURCE, device_variant

    try:
        if nvml is None:
            import pynvml as nvml  # nvidia-ml-py
        nvml.nvmlInit()
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
    except Exception:  # noqa: BLE001 - ImportError, NVMLError_LibraryNotFound, no driver, no such device
        return {}
    out: dict[str, Any] = {}
    pci = _try(nvml.nvmlDeviceGetPciInfo, handle)
    raw = getattr(pci, "pciDeviceId", None)
    if isinstance(raw, int) and raw >= 0:
        dev_id = (raw >> 16) & 0xFFFF  # NVML packs the device ID over the vendor ID: 0x233010DE
        out["pci_device_id"] = f"0x{dev_id:04x}"
        named = device_variant(dev_id) if raw & 0xFFFF == 0x10DE else None
        if named is not None:
            out["device_variant"], out["variant_source"] = named[0], VARIANT_SOURCE
    limit = _try(nvml.nvmlDeviceGetEnforcedPowerLimit, handle)  # milliwatts
    if isinstance(limit, (int, float)) and limit > 0:
        out["power_limit_w"] = limit / 1000.0
    return out


class DeviceTelemetry:
    """The sampler. ``start()`` / ``stop()``; ``samples`` counts readings (for tests and reports)."""

    def __init__(self, journal: Journal, *, interval_s: float = 1.0, log_every_s: float = 60.0, nvml: Any = None,
                 monitor: Any = None, devices: list[int] | None = None):
        if not interval_s >= 1.0 and nvml is None:
            raise ValueError("NVML is read at most once a second: interval_s must be >= 1")
        self.journal, self.interval_s, self.log_every_s = journal, interval_s, log_every_s
        self.monitor = monitor  # a TrainingHealthMonitor: its last step dates each change
        self.devices = devices  # NVML indices to read (a rank: its own, LOCAL_RANK); None: every visible one
        self._nvml = nvml
        self._events: Any = None
        #: whether NVML delivers XID critical errors here (its event API; some devices and containers refuse it)
        self.xid_events = False
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
            self._index = list(range(n)) if self.devices is None else [i for i in self.devices if 0 <= i < n]
            if not self._index:
                raise RuntimeError(f"NVML sees {n} devices, none of {self.devices}")
            self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in self._index]
            try:  # XID critical errors through NVML's event API, where it is offered
                es = nvml.nvmlEventSetCreate()
                for h in self._handles:
                    nvml.nvmlDeviceRegisterEvents(h, _EVENT_XID, es)
                self._events, self.xid_events = es, True
            except Exception:  # noqa: BLE001 - NotSupported, NoPermission: sampled values still come
                pass
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
        step = getattr(self.monitor, "last_step", None)
        for i, xid in self._xids():
            self._record(DeviceChanged(device=i, change="xid", detail={"xid": xid}, step=step))
        for i, h in zip(self._index, self._handles):
            cur = read_device(self._nvml, h)
            prev = self._last.get(i)
            if prev is not None:
                for what, detail in _changes(prev, cur):
                    self._record(DeviceChanged(device=i, change=what, detail=detail, step=step))
            self._last[i] = cur
            if log:
                self.journal.append(DeviceSampled(device=i, **{k: v for k, v in cur.items() if k != "ecc"},
                                                  ecc={k: v for k, v in cur["ecc"].items() if v is not None}))
        if log:
            self._last_logged = now
        self.samples += 1

    def _record(self, ev: DeviceChanged) -> None:
        """The change, and the anomaly it is (the same function replay derives it with), both durable."""
        self.journal.append(ev, durable=True)
        an = device_anomaly(ev)
        if an is not None:
            self.journal.append(an, durable=True)

    def _xids(self) -> list[tuple[int, int]]:
        """XID critical errors NVML has queued since the last look (never waits)."""
        out: list[tuple[int, int]] = []
        if self._events is None:
            return out
        nvml = self._nvml
        wait = getattr(nvml, "nvmlEventSetWait_v2", None) or nvml.nvmlEventSetWait
        for _ in range(64):  # a storm of XIDs is still one look's worth
            try:
                data = wait(self._events, 0)
            except Exception:  # noqa: BLE001 - NVMLError_Timeout: nothing queued
                break
            try:
                dev = self._index[self._handles.index(data.device)]
            except ValueError:
                dev = _try(nvml.nvmlDeviceGetIndex, data.device)
            out.append((dev if dev is not None else -1, int(data.eventData)))
        return out

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample_once()
            self._stop.wait(self.interval_s)


def _changes(prev: dict[str, Any], cur: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for cls in ("corrected", "uncorrected"):  # one change per class: the volatile counter, else the aggregate
        for name in (f"{cls}_volatile", f"{cls}_aggregate"):
            v, p = cur["ecc"].get(name), prev["ecc"].get(name)
            if v is not None and p is not None and v > p:
                out.append((f"ecc_{cls}", {"counter": name, "before": p, "after": v}))
                break
    pr, cr = prev["clock_event_reasons"], cur["clock_event_reasons"]
    if pr is not None and cr is not None and bool(pr & _THROTTLE_MASK) != bool(cr & _THROTTLE_MASK):
        out.append(("throttle_started" if cr & _THROTTLE_MASK else "throttle_stopped",
                    {"reasons": cr, "temp_c": cur["temp_c"]}))
    return out
