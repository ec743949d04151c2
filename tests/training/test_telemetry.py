"""Device telemetry: real NVML where a GPU is lent (not here); here, a small NVML stand-in, and the honest
"unavailable" path this machine really takes."""

from __future__ import annotations

from trainledger.journal import Journal, read_events
from trainledger.training.telemetry import DeviceTelemetry


class FakeNVML:
    """The NVML functions the sampler calls, with values a test scripts (hardware absent here)."""

    class NotSupported(Exception):
        pass

    def __init__(self):
        self.ecc_uncorrected = 0
        self.reasons = 0

    def nvmlInit(self):
        pass

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetTemperature(self, h, kind):
        return 61

    def nvmlDeviceGetFieldValues(self, h, ids):
        raise self.NotSupported()  # this "device" reports no HBM temperature

    def nvmlDeviceGetTotalEccErrors(self, h, kind, counter):
        return self.ecc_uncorrected if kind == 1 else 3

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self.reasons

    def nvmlDeviceGetPowerUsage(self, h):
        return 412_000

    def nvmlDeviceGetClockInfo(self, h, kind):
        return 1980


def _events(p):
    return [e for e in read_events(p) if type(e).__struct_config__.tag.startswith(("device_", "telemetry_"))]


def test_samples_changes_and_nothing_invented(tmp_path, signer):
    nvml = FakeNVML()
    p = tmp_path / "j.jsonl"
    with Journal.create(p, signer=signer, background=False) as j:
        t = DeviceTelemetry(j, nvml=nvml, log_every_s=0.0)
        t.start()
        t.stop()  # sampled by hand below: deterministic
        t.sample_once()
        nvml.ecc_uncorrected = 2
        nvml.reasons = 0x40  # hardware thermal slowdown
        t.sample_once()
    evs = _events(p)
    samples = [e for e in evs if type(e).__struct_config__.tag == "device_sampled"]
    changes = [(e.change, e.detail.get("after")) for e in evs if type(e).__struct_config__.tag == "device_changed"]
    assert samples[0].temp_c == 61.0 and samples[0].power_w == 412.0 and samples[0].temp_hbm_c is None
    assert ("ecc_uncorrected", 2) in changes and any(c == "throttle_started" for c, _ in changes)


def test_without_nvml_it_says_so_once(tmp_path, signer):
    """This machine has no GPU: the real import or init fails, and the journal says why, once."""
    import pytest

    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - the expected case here
        pass
    else:
        pytest.skip("NVML works on this machine: the unavailable path cannot be shown here")
    p = tmp_path / "j.jsonl"
    with Journal.create(p, signer=signer, background=False) as j:
        t = DeviceTelemetry(j).start()
        assert not t.available
        t.stop()
    (ev,) = _events(p)
    assert type(ev).__struct_config__.tag == "telemetry_unavailable" and ev.reason
