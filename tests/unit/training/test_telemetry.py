"""Device telemetry: real NVML where a GPU is lent (not here); here, a small NVML stand-in, and the honest
"unavailable" path this machine really takes."""

from __future__ import annotations

from trainledger.journal import Journal, read_events
from trainledger.training.health.telemetry import DeviceTelemetry


class FakeNVML:
    """The NVML functions the sampler calls, with values a test scripts (hardware absent here)."""

    class NotSupported(Exception):
        pass

    class Timeout(Exception):
        pass

    class EventData:
        def __init__(self, device, xid):
            self.device, self.eventData, self.eventType = device, xid, 0x8

    def __init__(self):
        self.ecc_uncorrected = 0
        self.reasons = 0
        self.queued = []  # XIDs waiting in the event set
        self.registered = []

    def nvmlEventSetCreate(self):
        return "event-set"

    def nvmlDeviceRegisterEvents(self, h, types, es):
        self.registered.append((h, types, es))

    def nvmlEventSetWait_v2(self, es, timeout_ms):
        assert timeout_ms == 0  # never waits in the sampler
        if not self.queued:
            raise self.Timeout()
        return self.EventData(0, self.queued.pop(0))

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


def test_faults_and_throttling_are_anomalies_that_replay_derives_again(tmp_path, signer, capsys):
    """An XID, uncorrected ECC errors rising and thermal throttling each become an anomaly in the journal, dated by
    the monitor's last step; replay derives the same from the device changes, and names one that was left out."""
    from trainledger.cli import main
    from trainledger.training.health.monitor import TrainingHealthMonitor

    nvml = FakeNVML()
    p = tmp_path / "j.jsonl"
    with Journal.create(p, signer=signer, background=False) as j:
        mon = TrainingHealthMonitor(journal=j)
        t = DeviceTelemetry(j, nvml=nvml, log_every_s=1e9, monitor=mon).start()
        t.stop()
        assert t.xid_events and nvml.registered == [(0, 0x8, "event-set")]
        t.sample_once()
        for step in range(5):
            mon.observe_step(step, 3.0, grad_norm=1.0)
        nvml.queued = [79]  # XID 79: the GPU has fallen off the bus
        nvml.ecc_uncorrected = 2
        nvml.reasons = 0x40
        t.sample_once()
    evs = list(read_events(p))
    found = sorted((e.kind, e.value, e.step, e.device) for e in evs if type(e).__struct_config__.tag == "anomaly_detected")
    assert found == [("device_fault", 2.0, 4, 0), ("device_fault", 79.0, 4, 0), ("thermal_throttle", 61.0, 4, 0)]
    xid = [e for e in evs if type(e).__struct_config__.tag == "device_changed" and e.change == "xid"]
    assert xid[0].detail == {"xid": 79} and xid[0].step == 4
    pub = tmp_path / "k.pub"
    pub.write_text(signer.public.line() + "\n")
    assert main(["replay", "--pubkey", str(pub), str(p)]) == 0
    capsys.readouterr()
    # The same events, signed, but without the XID's anomaly: replay names what the device change implies.
    q = tmp_path / "doctored.jsonl"
    with Journal.create(q, signer=signer, background=False) as j:
        for e in evs:
            tag = type(e).__struct_config__.tag
            if tag in ("run_opened", "seal", "run_closed") or (tag == "anomaly_detected" and e.value == 79.0):
                continue
            fields = {f: getattr(e, f) for f in type(e).__struct_fields__ if f not in ("seq", "ts", "h")}
            j.append(_event_class(e)(**fields))
    assert main(["replay", "--pubkey", str(pub), str(q)]) == 1
    out = capsys.readouterr().out
    assert "device_fault" in out and "not recorded" in out


def _event_class(rec):
    from trainledger.journal import codec

    return codec.known_kinds()[type(rec).__struct_config__.tag]


def test_the_energy_counter_is_sampled_and_totalled_and_a_reset_is_counted(tmp_path, signer):
    """NVML's total energy counter (format 1.7) goes into every sample; the compute totals count its rises and name
    its fall (a driver reload) without counting it."""
    from trainledger.journal import read_events
    from trainledger.training.health.mfu import record_compute

    class EnergyNVML(FakeNVML):
        def __init__(self):
            super().__init__()
            self.mj = None  # set once the sampler's own thread has stopped: the readings below are the test's

        def nvmlDeviceGetTotalEnergyConsumption(self, h):
            return next(self.mj)

    p = tmp_path / "j.jsonl"
    with Journal.create(p, signer=signer, background=False) as j:
        nvml = EnergyNVML()
        t = DeviceTelemetry(j, nvml=nvml, log_every_s=0.0)
        t.start()
        t.stop()
        nvml.mj = iter([10_000, 12_500, 15_000, 1_000, 4_000])  # rises, then a reset, then a rise
        for _ in range(5):
            t.sample_once()
        record_compute(j)
    samples = [e for e in read_events(p) if type(e).__struct_config__.tag == "device_sampled"]
    assert [s.energy_mj for s in samples if s.energy_mj is not None] == [10_000, 12_500, 15_000, 1_000, 4_000]
    total = [e for e in read_events(p) if type(e).__struct_config__.tag == "compute_totaled"][0]
    assert total.energy_j == 8.0 and total.energy_resets == 1  # 2.5 + 2.5 + 3 J; the fall not counted
    assert total.power_j is not None  # the reset's interval: its power readings' trapezoid, an estimate
