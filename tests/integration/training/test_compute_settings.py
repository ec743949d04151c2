"""The settings that move a compute statement past the guidelines' 30% (format 1.10, docs/compute.md): activation
recomputation measured with FlopCounterMode on a real tiny GPT (its executed FLOPs above its model FLOPs by the
measured ratio, the statement excluding the recomputation), the attention convention, the accelerator variant from
the PCI device ID (an NVML stand-in: no GPU here) and the power limit, recorded in run_configured, carried into the
signed total, replayed, shown with both estimation methods, and refused when a statement's figure is edited."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from trainledger.audit import compute_statement, replay  # noqa: E402
from trainledger.journal.errors import IntegrityError  # noqa: E402
from trainledger.journal.keys import keygen, load_signer  # noqa: E402
from trainledger.journal.reader import read_events  # noqa: E402
from trainledger.journal.statements.compute.statement import check_statement  # noqa: E402
from trainledger.training import Recorder  # noqa: E402
from trainledger.training.health.flops import (PCI_VARIANTS, device_variant, flop_config_from_causal_lm,  # noqa: E402
                                               measure_recompute_ratio)
from trainledger.training.health.telemetry import device_settings  # noqa: E402
from trainledger.training.kinds import ComputeTotaled, RunConfigured  # noqa: E402
from trainledger.training.reference.model import build_causal_lm  # noqa: E402

VOCAB, D, LAYERS, HEADS, T, B = 64, 64, 4, 4, 32, 4


class FakeNvml:
    """NVML's functions for one device, as pynvml names them (no GPU here): its PCI info and power limit."""

    def __init__(self, pci_device_id: int, limit_mw: int):
        self.pci = type("PciInfo", (), {"pciDeviceId": pci_device_id})()
        self.limit = limit_mw

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByIndex(self, i):
        if i != 0:
            raise RuntimeError("no such device")
        return "h0"

    def nvmlDeviceGetPciInfo(self, h):
        return self.pci

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return self.limit


def _model():
    torch.manual_seed(0)
    return build_causal_lm(VOCAB, D, LAYERS, HEADS, T)


def _batch(step: int):
    g = torch.Generator().manual_seed(step)
    return torch.randint(0, VOCAB, (B, T), generator=g)


def _loss(model, idx):
    logits = model(idx)
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), idx.flatten())


def test_the_recompute_ratio_is_what_flop_counter_mode_counts_with_and_without_checkpointing():
    from torch.utils.flop_counter import FlopCounterMode

    m = _model()
    idx = _batch(0)

    def run_step():
        _loss(m, idx).backward()

    assert measure_recompute_ratio(m, run_step) == 1.0  # nothing recomputed: the model is left as it was
    assert m.activation_checkpointing is False
    m.gradient_checkpointing_enable()
    ratio = measure_recompute_ratio(m, run_step)
    assert m.activation_checkpointing is True and all(p.grad is None for p in m.parameters())
    counts = []
    for on in (True, False):
        (m.gradient_checkpointing_enable if on else m.gradient_checkpointing_disable)()
        with FlopCounterMode(display=False) as c:
            run_step()
        counts.append(c.get_total_flops())
    assert ratio == counts[0] / counts[1]
    # PyTorch's non-reentrant checkpoint stops recomputing once every saved tensor is back: each block's last
    # matmul is not redone, so the measured ratio is below the textbook full recompute's 4/3
    formula = flop_config_from_causal_lm(m, T, recompute="full")
    assert 1.2 < ratio < formula.hardware_flops_per_token / formula.flops_per_token == 4 / 3
    with pytest.raises(ValueError, match="gradient_checkpointing_enable"):
        measure_recompute_ratio(torch.nn.Linear(2, 2), run_step)


def test_the_variant_comes_from_the_pci_device_id_and_pci_ids_names_it_so():
    assert device_settings(nvml=FakeNvml(0x233110DE, 350_000)) == {
        "pci_device_id": "0x2331", "device_variant": "H100 PCIe",
        "variant_source": "PCI device ID; name per pci.ids (the PCI ID Repository)", "power_limit_w": 350.0}
    # a device not listed is left unnamed, never guessed; a vendor other than NVIDIA's is not looked up
    assert device_settings(nvml=FakeNvml(0x233510DE, 700_000)) == {"pci_device_id": "0x2335", "power_limit_w": 700.0}
    assert "device_variant" not in device_settings(nvml=FakeNvml(0x23301002, 1))
    assert device_settings(nvml=FakeNvml(0x233010DE, 1)).get("device_variant") == "H100 SXM5 80GB"
    assert device_variant("0x2330") == ("H100 SXM5 80GB", "h100-sxm") and device_variant("zz") is None
    # the table says what Debian's pci.ids says of each ID (setup.sh --browser installs it)
    ids = Path("/usr/share/misc/pci.ids").read_text(errors="replace")
    nvidia = ids[ids.index("\n10de  NVIDIA"):]
    nvidia = nvidia[:re.search(r"\n[0-9a-f]{4}  ", nvidia[1:]).start() + 1]
    for dev_id, (name, _) in PCI_VARIANTS.items():
        line = re.search(rf"\n\t{dev_id:04x}  (.*)", nvidia)
        assert line is not None and name in line.group(1), (hex(dev_id), name)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny GPT trained 24 steps with full activation checkpointing through the Recorder: the recompute ratio
    measured first, the device read through an NVML stand-in (an H100 PCIe at 350 W)."""
    tmp = tmp_path_factory.mktemp("settings")
    priv, pub = keygen(tmp / "keys")
    m = _model()
    m.gradient_checkpointing_enable()
    ratio = measure_recompute_ratio(m, lambda: _loss(m, _batch(0)).backward())
    fc = flop_config_from_causal_lm(m, T, recompute="full")
    fc = type(fc)(**{**fc.to_dict(), "recompute_ratio": ratio})
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    rec = Recorder(tmp / "run", key=priv, model=m, optimizer=opt, flop_config=fc, peak_flops_per_sec=1e12,
                   device_settings=device_settings(nvml=FakeNvml(0x233110DE, 350_000)))
    for s in range(24):
        loss = _loss(m, _batch(s))
        loss.backward()
        opt.step()
        opt.zero_grad()
        rec.step(s, loss.item(), tokens=B * T, step_time_s=0.01)
    rec.close()
    return tmp / "run", pub, ratio, fc


def test_the_settings_are_signed_totalled_and_replayed(run):
    path, pub, ratio, fc = run
    events = list(read_events(path / "journal.jsonl"))
    cfg = next(e for e in events if isinstance(e, RunConfigured))
    assert (cfg.recompute_ratio, cfg.attention_convention, cfg.device_variant, cfg.pci_device_id,
            cfg.power_limit_w) == (ratio, "full", "H100 PCIe", "0x2331", 350.0)
    total = next(e for e in events if isinstance(e, ComputeTotaled))
    (h,) = total.hardware
    assert h["recompute_ratio"] == ratio and h["flops"] == total.flops == 24 * B * T * fc.flops_per_token
    assert h["six_nd_flops"] == 24 * B * T * 6 * fc.n_params
    rec = replay(path / "journal.jsonl", keys=[load_signer(path.parent / "keys" / "trainledger.key").public])
    assert rec.differences == []


def test_the_statement_shows_both_methods_and_excludes_the_recomputation(run, tmp_path, capsys):
    path, pub, ratio, fc = run
    st = compute_statement([path], [load_signer(path.parent / "keys" / "trainledger.key").public])
    f = st["figures"]
    assert f["recompute_ratio"] == pytest.approx(ratio, rel=1e-12)
    assert f["executed_flops"] == pytest.approx(f["model_flops"] * ratio, rel=1e-12)
    assert f["executed_flops"] > f["model_flops"]
    assert f["attention_convention"] == "full" and f["power_limit_w"] == [350.0]
    assert f["device_variant"][0]["device_variant"] == "H100 PCIe"
    m = f["methods"]
    # measured utilisation: the hardware method, recomputation left out, gives the counted model FLOPs back
    assert m["hardware"]["flops"] == pytest.approx(f["model_flops"], rel=1e-9)
    assert m["architecture"]["flops"] == 24 * B * T * 6 * fc.n_params
    assert m["disagreement"] == pytest.approx(f["model_flops"] / m["architecture"]["flops"] - 1, rel=1e-9)
    assert f["within_30_percent"] == (abs(m["disagreement"]) <= 0.3)
    assert f["form"]["training_compute_flop"] == f"{f['model_flops']:.1e}"
    # a declared utilisation: the hardware method is the provider's estimate, held to the 30%
    low = compute_statement([path], [load_signer(path.parent / "keys" / "trainledger.key").public],
                            utilisation=0.01)["figures"]
    assert low["methods"]["hardware"]["utilisation_source"] == "declared" and low["within_30_percent"] is False
    # the statement checks offline, and an edited setting is refused by name
    out = tmp_path / "st.json"
    out.write_text(json.dumps(st))
    check_statement(out.read_bytes(), [load_signer(path.parent / "keys" / "trainledger.key").public])
    for edit in (lambda d: d["figures"].__setitem__("recompute_ratio", 1.0),
                 lambda d: d["figures"]["methods"]["architecture"].__setitem__("flops", 1.0),
                 lambda d: d["runs"][0]["journals"][0]["compute"]["hardware"][0].__setitem__("power_limit_w", 700.0)):
        d = json.loads(out.read_text())
        edit(d)
        with pytest.raises(IntegrityError):
            check_statement(json.dumps(d).encode(), [load_signer(path.parent / "keys" / "trainledger.key").public])


def test_the_two_estimation_methods_are_the_guidelines_formulas():
    """Worked by hand, beside the Commission's own examples (tests/unit/journal/test_commission_examples.py): 1,000
    H100 SXM for 30 days at 40% utilisation, and a 7B model on 2T tokens; a full checkpointing ratio taken back out,
    which none of the Commission's examples has."""
    from trainledger.journal.statements.compute.figures import architecture_estimate, hardware_estimate

    at_peak = 1_000 * 30 * 86_400 * 989.4e12
    assert hardware_estimate(at_peak, 0.4) == at_peak * 0.4
    assert f"{hardware_estimate(at_peak, 0.4):.2e}" == "1.03e+24"
    assert hardware_estimate(at_peak, 0.4, 4 / 3) == pytest.approx(at_peak * 0.3)
    assert architecture_estimate(7e9, 2e12) == 8.4e22


@pytest.mark.parametrize("key, lie", [("recompute_ratio", 1.0), ("six_nd_flops", 1.0), ("flops", 1.0),
                                      ("device_variant", "H100 SXM5 80GB"), ("power_limit_w", 700.0)])
def test_a_total_whose_settings_lie_is_named_by_replay(tmp_path, key, lie):
    """The settings a total carries per hardware group are derived from the run_configured in force: a total signed
    by the run's key that moves the ratio, the 6ND FLOPs, the group's FLOPs, the variant or the power limit is a
    difference replay names."""
    import msgspec

    from trainledger.journal import Journal, Signer
    from trainledger.journal.reader import read_signed_events
    from trainledger.training.health.flops import FlopConfig
    from trainledger.training.health.mfu import ComputeTotals
    from trainledger.training.health.monitor import TrainingHealthMonitor

    s = Signer.generate()
    p = tmp_path / "lie.jsonl"
    with Journal.create(p, signer=s, run_id="lie", background=False) as j:
        m = TrainingHealthMonitor(journal=j, flop_config=FlopConfig(n_params=1_000_000, n_layer=2, n_head=4,
                                                                    head_dim=16, seq_len=64, recompute="full",
                                                                    recompute_ratio=1.25),
                                  peak_flops_per_sec=1e12, device_settings=device_settings(
                                      nvml=FakeNvml(0x233110DE, 350_000)))
        for step in range(10):
            m.observe_step(step, 2.0, grad_norm=1.0, step_time_s=0.01, tokens=512)
        j.seal(durable=True, signed=True)
        honest = ComputeTotals().fold(read_signed_events(p, [s.public])).event()
        fields = {k: v for k, v in msgspec.to_builtins(honest).items() if k not in ("kind", "seq", "ts", "h")}
        assert fields["hardware"][0][key] != lie
        fields["hardware"] = [{**fields["hardware"][0], key: lie}]
        j.append(ComputeTotaled(**fields), durable=True)
    diffs = replay(p, keys=[s.public]).differences
    assert [d["kind"] for d in diffs] == ["compute_totaled"] and "recorded hardware " in diffs[0]["detail"]
