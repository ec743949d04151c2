"""The tiny causal LM, FLOP accounting, peak FLOPs and MFU."""

from __future__ import annotations

import math

import pytest
import torch

from trainledger.training.reference.corpus import MarkovSource, random_batches, text_tokens
from trainledger.training.health.flops import (
    PEAK_FLOPS,
    FlopConfig,
    FlopCrossCheckRefused,
    count_training_flops,
    flop_config_from_causal_lm,
    mfu,
    peak_flops_per_sec,
)
from trainledger.training.reference.model import build_causal_lm


def test_seed_document_receipts_for_the_tiny_model():
    """000_…: n_params = 7104 and flops_per_iter(batch=4) = 1.462e+06 for vocab 32, d 16, 2 layers, block 8."""
    model = build_causal_lm(vocab=32, d_model=16, n_layer=2, n_head=2, block=8)
    cfg = flop_config_from_causal_lm(model, seq_len=8)
    assert cfg.n_params == 7104
    assert cfg.flops_per_iter(batch=4) == 1_462_272
    assert f"{cfg.flops_per_iter(4):.3e}" == "1.462e+06"


def test_position_embedding_excluded_and_head_tied():
    m = build_causal_lm(vocab=50, d_model=8, n_layer=1, n_head=2, block=12)
    assert m.lm_head.weight is m.wte.weight
    assert m.num_params(non_embedding=False) - m.num_params() == 12 * 8


# GPT-2 small / medium / large / XL widths and depths, with T from 256 to 8192.


def test_fused_attention_makes_the_cross_check_refuse():
    with pytest.raises(FlopCrossCheckRefused, match="fused"):
        count_training_flops(lambda: build_causal_lm(50257, 768, 2, 12, 1024, attn_impl="sdpa"), 1, 1024)


def test_sdpa_and_unfused_attention_compute_the_same_function():
    torch.manual_seed(0)
    a = build_causal_lm(40, 32, 2, 4, 16)
    b = build_causal_lm(40, 32, 2, 4, 16, attn_impl="sdpa")
    b.load_state_dict(a.state_dict())
    x = torch.randint(0, 40, (3, 16))
    torch.testing.assert_close(a(x), b(x), rtol=1e-5, atol=1e-5)


def test_hardware_flops_count_recompute():
    base = FlopConfig(n_params=1000, n_layer=2, n_head=2, head_dim=4, seq_len=8)
    full = FlopConfig(n_params=1000, n_layer=2, n_head=2, head_dim=4, seq_len=8, recompute="full")
    sel = FlopConfig(n_params=1000, n_layer=2, n_head=2, head_dim=4, seq_len=8, recompute="selective")
    assert base.hardware_flops_per_token == base.flops_per_token == full.flops_per_token
    assert full.hardware_flops_per_token == base.flops_per_token + 2 * 1000 + 4 * 2 * 2 * 4 * 8
    assert sel.hardware_flops_per_token == base.flops_per_token + 4 * 2 * 2 * 4 * 8


@pytest.mark.parametrize("bad", [dict(n_params=0), dict(seq_len=-1), dict(recompute="some")])
def test_flop_config_validates(bad):
    kw = {**dict(n_params=10, n_layer=1, n_head=1, head_dim=1, seq_len=1), **bad}
    with pytest.raises(ValueError):
        FlopConfig(**kw)


def test_mfu_is_a_ratio_and_none_without_a_peak():
    assert mfu(1e12, 1.0, 1e13) == pytest.approx(0.1)
    assert mfu(8e12, 1.0, 1e12, devices=8) == pytest.approx(1.0)  # across devices: divide by peak × devices
    assert mfu(1e12, 1.0, None) is None
    assert mfu(1e12, None, 1e12) is None
    assert mfu(1e12, 0.0, 1e12) is None


def test_peak_table_covers_the_required_devices_and_cites_sources():
    for dev in ("a100", "h100-sxm", "h100-pcie", "h200", "b200", "mi300x"):
        assert peak_flops_per_sec(dev, "bf16") > 1e14
    assert all(src for _, src in PEAK_FLOPS.values())
    assert peak_flops_per_sec("NVIDIA H100 80GB HBM3", "bf16") == 989.4e12
    assert peak_flops_per_sec("NVIDIA H100 PCIe", "bf16") == 756e12
    assert peak_flops_per_sec("NVIDIA H200", "bfloat16", devices=8) == 8 * 989.4e12
    assert peak_flops_per_sec("cpu") is None and peak_flops_per_sec(None) is None
    assert peak_flops_per_sec("Some Future GPU", "bf16") is None  # unknown: None, never a guess


def test_model_validates_its_shape():
    with pytest.raises(ValueError, match="divisible"):
        build_causal_lm(32, 10, 1, 3, 8)
    with pytest.raises(ValueError, match="attn_impl"):
        build_causal_lm(32, 8, 1, 2, 8, attn_impl="flash")
    with pytest.raises(ValueError, match="block size"):
        build_causal_lm(32, 8, 1, 2, 8)(torch.zeros(1, 9, dtype=torch.long))


def test_markov_source_is_reproducible_and_has_a_sane_entropy_rate():
    a, b = MarkovSource(32, seed=3), MarkovSource(32, seed=3)
    assert torch.equal(a.transition, b.transition)
    assert 0.5 < a.entropy_rate < math.log(32)
    assert torch.equal(a.sample(500, seed=1), b.sample(500, seed=1))
    assert torch.allclose(a.transition.sum(dim=1), torch.ones(32, dtype=torch.float64))


def test_tiny_model_learns_the_markov_source_in_seconds():
    src = MarkovSource(32, seed=0)
    tokens = src.sample(20_000, seed=1)
    torch.manual_seed(0)
    model = build_causal_lm(vocab=32, d_model=32, n_layer=2, n_head=2, block=16)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    batches = random_batches(tokens, 16, 16, seed=0)
    first = None
    for _ in range(300):
        x, y = next(batches)
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        first = first if first is not None else loss.item()
    assert first > math.log(32) - 0.1  # starts near uniform
    assert loss.item() < src.entropy_rate + 0.25  # ends close to the floor


def test_text_file_tokens(tmp_path):
    p = tmp_path / "t.txt"
    p.write_text("hello trainledger")
    toks = text_tokens(p)
    assert toks.tolist()[:5] == list(b"hello")
    x, y = next(random_batches(toks, 2, 4, seed=0))
    assert x.shape == y.shape == (2, 4) and torch.equal(x[:, 1:], y[:, :-1])


def test_the_callbacks_take_the_datasheet_peak_of_a_known_device_at_the_training_precision():
    """monitor_options (the HF and Lightning callbacks): a given peak is 'given'; none given, a device the table
    knows at the precision the steps run at gives its dense datasheet peak ('datasheet'); a CPU gives none. (No GPU
    here: the device's name is given as torch.cuda.get_device_name reports it.)"""
    import torch

    from trainledger.training.integrations.hooks import monitor_options, training_dtype

    model = torch.nn.Linear(2, 2)
    o = monitor_options(model, device_kind=None, compute_thresholds=None, carried_flops=None, peak=5e12, dtype="bf16")
    assert (o["device_kind"], o["peak_flops_per_sec"], o["peak_source"]) == ("cpu", 5e12, "given")
    o = monitor_options(model, device_kind=None, compute_thresholds=None, carried_flops=None, dtype="fp32")
    assert (o["peak_flops_per_sec"], o["peak_source"]) == (None, None)
    o = monitor_options(model, device_kind="NVIDIA H100 80GB HBM3", compute_thresholds=None, carried_flops=None,
                        dtype=training_dtype(model, bf16=True))
    assert (o["peak_flops_per_sec"], o["peak_source"]) == (989.4e12, "datasheet")
    assert training_dtype(model) == "fp32" and training_dtype(model.to(torch.bfloat16)) == "bf16"
    assert training_dtype(model, fp16=True) == "fp16"
