"""Model FLOPs, hardware FLOPs, peak FLOPs and MFU.

Model FLOPs per token follow PaLM (Chowdhery et al. 2022), appendix B:
``6N + 12·L·H·Q·T`` for N parameters (position embeddings excluded, as in
nanoGPT's ``get_num_params(non_embedding=True)``), L layers, H heads of
dimension Q and sequence length T: 6N for the weight matmuls forward and
backward, 12·L·H·Q·T for the attention score and value matmuls. MFU is
achieved model FLOPs per second over peak FLOPs per second; when the peak is
not known, MFU is ``None``, never a guess.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from trainledger.journal.errors import TrainledgerError
from trainledger.training.health.mfu import model_flops_per_token
from trainledger.training.kinds import ATTENTION_CONVENTIONS

__all__ = [
    "FlopConfig",
    "device_kind",
    "flop_config_from_causal_lm",
    "PEAK_FLOPS",
    "peak_flops_per_sec",
    "mfu",
    "FlopCrossCheckRefused",
    "count_training_flops",
    "measure_matmul_peak",
    "PeakMeasurement",
    "PCI_VARIANTS",
    "VARIANT_SOURCE",
    "device_variant",
    "measure_recompute_ratio",
    "is_checkpointing",
]

_RECOMPUTE = ("none", "selective", "full")


def check_recompute_ratio(ratio: Any, name: str = "recompute_ratio") -> None:
    """A recompute ratio as FlopConfig and the callbacks take it: executed over model FLOPs, from 1 (nothing
    recomputed) to 4, or None (not measured). ``ValueError`` naming ``name`` otherwise."""
    if ratio is not None and not (isinstance(ratio, (int, float)) and 1 <= ratio <= 4):
        raise ValueError(f"{name} must be a number from 1 to 4 (executed over model FLOPs), got {ratio!r}")


@dataclasses.dataclass(frozen=True)
class FlopConfig:
    """Shape-derived FLOP accounting of a decoder-only transformer."""

    n_params: int
    n_layer: int
    n_head: int
    head_dim: int
    seq_len: int
    #: Activation recompute: "none", "selective" (attention recomputed) or "full"
    #: (the whole forward recomputed in the backward pass). Model FLOPs ignore it;
    #: hardware FLOPs count it.
    recompute: str = "none"
    #: Which attention FLOPs model FLOPs count (format 1.10, ``run_configured.attention_convention``): "full",
    #: PaLM's 12·L·H·Q·T (every score of the square, as PaLM and the Chinchilla-style 6N counts do), or "causal",
    #: half of it (the scores a causal mask keeps; what FlopCounterMode counts for a causal SDPA kernel is neither).
    attention: str = "full"
    #: Executed over model FLOPs of one training step, measured once on the real model
    #: (:func:`measure_recompute_ratio`): 1.0 without recomputation, about 4/3 with full activation checkpointing.
    #: Recorded (``run_configured.recompute_ratio``) and shown by the compute statement, which excludes the
    #: recomputation from its FLOPs as the Commission's guidelines do. None: not measured.
    recompute_ratio: float | None = None

    def __post_init__(self) -> None:
        for name in ("n_params", "n_layer", "n_head", "head_dim", "seq_len"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"FlopConfig.{name} must be a positive integer, got {v!r}")
        if self.recompute not in _RECOMPUTE:
            raise ValueError(f"FlopConfig.recompute must be one of {_RECOMPUTE}, got {self.recompute!r}")
        if self.attention not in ATTENTION_CONVENTIONS:
            raise ValueError(f"FlopConfig.attention must be 'full' or 'causal', got {self.attention!r}")
        check_recompute_ratio(self.recompute_ratio, "FlopConfig.recompute_ratio")

    @property
    def attention_flops_per_token(self) -> int:
        """12·L·H·Q·T: QK^T and AV, forward (4·L·H·Q·T) and backward (twice that); half under "causal"."""
        return (6 if self.attention == "causal" else 12) * self.n_layer * self.n_head * self.head_dim * self.seq_len

    @property
    def flops_per_token(self) -> int:
        """Model FLOPs per token, PaLM appendix B: 6N + 12·L·H·Q·T (``journal.mfu``, the one implementation)."""
        return model_flops_per_token(self.n_params, self.n_layer, self.n_head, self.head_dim, self.seq_len,
                                     self.attention)

    def flops_per_iter(self, batch: int) -> int:
        """Model FLOPs of one optimizer step on ``batch`` sequences of ``seq_len`` tokens."""
        if not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch must be a positive integer, got {batch!r}")
        return self.flops_per_token * self.seq_len * batch

    @property
    def hardware_flops_per_token(self) -> int:
        """FLOPs the hardware executes, counting recomputed activations.

        Full recompute repeats the forward pass (2N + 4·L·H·Q·T); selective
        recompute repeats the attention forward (4·L·H·Q·T).
        """
        attn_fwd = self.attention_flops_per_token // 3
        extra = {"none": 0, "selective": attn_fwd, "full": 2 * self.n_params + attn_fwd}[self.recompute]
        return self.flops_per_token + extra

    def hardware_flops_per_iter(self, batch: int) -> int:
        return self.hardware_flops_per_token * self.seq_len * batch

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def flop_config_from_causal_lm(model, seq_len: int, *, recompute: str = "none") -> FlopConfig:
    """The FLOP config of a :class:`trainledger.training.reference.model.CausalLM` (or any model with the same attributes).

    Example: ``flop_config_from_causal_lm(build_causal_lm(32, 16, 2, 2, 8), seq_len=8)``.
    """
    n_head = model.n_head
    return FlopConfig(
        n_params=model.num_params(non_embedding=True),
        n_layer=model.n_layer,
        n_head=n_head,
        head_dim=model.d_model // n_head,
        seq_len=seq_len,
        recompute=recompute,
    )


def flop_config_from_hf(model, seq_len: int, *, recompute: str = "none") -> FlopConfig:
    """The FLOP config of a Hugging Face decoder (GPT-2, Llama-style and other ``*ForCausalLM`` models) from its
    config and its parameters: layers, heads, head size (``head_dim`` where the config has one), and the parameters
    that do matmul work: all of them, less learned position embeddings and, where the output head is not tied to
    it, the input embedding (a lookup). With a tied head the token embedding counts once, as the head (nanoGPT's
    convention, as :func:`flop_config_from_causal_lm`)."""
    import torch

    cfg = model.config
    n_layer = int(getattr(cfg, "num_hidden_layers"))
    n_head = int(getattr(cfg, "num_attention_heads"))
    hidden = int(getattr(cfg, "hidden_size"))
    head_dim = int(getattr(cfg, "head_dim", None) or hidden // n_head)
    total = sum(p.numel() for p in model.parameters())
    emb_in = model.get_input_embeddings()
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    tied = out is not None and getattr(out, "weight", None) is not None and \
        out.weight.data_ptr() == emb_in.weight.data_ptr()
    n = total - (0 if tied else emb_in.weight.numel())
    max_pos = getattr(cfg, "max_position_embeddings", None)
    for m in model.modules():
        if isinstance(m, torch.nn.Embedding) and m is not emb_in and m.num_embeddings == max_pos:
            n -= m.weight.numel()  # learned position embeddings (GPT-2's wpe)
    return FlopConfig(n_params=n, n_layer=n_layer, n_head=n_head, head_dim=head_dim, seq_len=seq_len,
                      recompute=recompute)


# Dense (no structured sparsity) tensor-core peaks per device, FLOPs/s.
# Vendors quote "with sparsity" figures too; those are twice the dense ones and are not used.
_T = 1e12
PEAK_FLOPS: Mapping[tuple[str, str], tuple[float, str]] = {
    # NVIDIA A100 Tensor Core GPU datasheet (SXM4 and PCIe): BF16/FP16 312 TF, TF32 156 TF, FP32 19.5 TF.
    ("a100", "bf16"): (312 * _T, "NVIDIA A100 datasheet"),
    ("a100", "fp16"): (312 * _T, "NVIDIA A100 datasheet"),
    ("a100", "tf32"): (156 * _T, "NVIDIA A100 datasheet"),
    ("a100", "fp32"): (19.5 * _T, "NVIDIA A100 datasheet"),
    # NVIDIA H100 Tensor Core GPU datasheet, SXM: BF16/FP16 989.4 TF dense (1,979 sparse), FP8 1,979 TF dense,
    # TF32 494.7 TF dense, FP32 67 TF.
    ("h100-sxm", "bf16"): (989.4 * _T, "NVIDIA H100 datasheet, SXM, dense"),
    ("h100-sxm", "fp16"): (989.4 * _T, "NVIDIA H100 datasheet, SXM, dense"),
    ("h100-sxm", "fp8"): (1978.9 * _T, "NVIDIA H100 datasheet, SXM, dense"),
    ("h100-sxm", "tf32"): (494.7 * _T, "NVIDIA H100 datasheet, SXM, dense"),
    ("h100-sxm", "fp32"): (67 * _T, "NVIDIA H100 datasheet, SXM"),
    # Same datasheet, PCIe: BF16/FP16 756 TF dense, FP8 1,513 TF dense, TF32 378 TF dense, FP32 51 TF.
    ("h100-pcie", "bf16"): (756 * _T, "NVIDIA H100 datasheet, PCIe, dense"),
    ("h100-pcie", "fp16"): (756 * _T, "NVIDIA H100 datasheet, PCIe, dense"),
    ("h100-pcie", "fp8"): (1513 * _T, "NVIDIA H100 datasheet, PCIe, dense"),
    ("h100-pcie", "tf32"): (378 * _T, "NVIDIA H100 datasheet, PCIe, dense"),
    ("h100-pcie", "fp32"): (51 * _T, "NVIDIA H100 datasheet, PCIe"),
    # NVIDIA H200 Tensor Core GPU datasheet, SXM: BF16/FP16 1,979 TF and FP8 3,958 TF with sparsity
    # (dense: half), TF32 989 TF with sparsity, FP32 67 TF. Same compute as H100 SXM, more memory.
    ("h200", "bf16"): (989.4 * _T, "NVIDIA H200 datasheet, SXM, dense (sparse figure halved)"),
    ("h200", "fp16"): (989.4 * _T, "NVIDIA H200 datasheet, SXM, dense (sparse figure halved)"),
    ("h200", "fp8"): (1978.9 * _T, "NVIDIA H200 datasheet, SXM, dense (sparse figure halved)"),
    ("h200", "tf32"): (494.7 * _T, "NVIDIA H200 datasheet, SXM, dense (sparse figure halved)"),
    ("h200", "fp32"): (67 * _T, "NVIDIA H200 datasheet, SXM"),
    # NVIDIA HGX B200 datasheet, per GPU: FP16/BF16 4.5 PF and FP8 9 PF with sparsity (dense: half),
    # TF32 2.2 PF with sparsity, FP32 75 TF.
    ("b200", "bf16"): (2250 * _T, "NVIDIA HGX B200 datasheet, per GPU, dense (sparse figure halved)"),
    ("b200", "fp16"): (2250 * _T, "NVIDIA HGX B200 datasheet, per GPU, dense (sparse figure halved)"),
    ("b200", "fp8"): (4500 * _T, "NVIDIA HGX B200 datasheet, per GPU, dense (sparse figure halved)"),
    ("b200", "tf32"): (1100 * _T, "NVIDIA HGX B200 datasheet, per GPU, dense (sparse figure halved)"),
    ("b200", "fp32"): (75 * _T, "NVIDIA HGX B200 datasheet, per GPU"),
    # AMD Instinct MI300X datasheet: FP16/BF16 1,307.4 TF dense (2,614.9 sparse), FP8 2,614.9 TF dense,
    # TF32 653.7 TF, FP32 matrix 163.4 TF.
    ("mi300x", "bf16"): (1307.4 * _T, "AMD Instinct MI300X datasheet, dense"),
    ("mi300x", "fp16"): (1307.4 * _T, "AMD Instinct MI300X datasheet, dense"),
    ("mi300x", "fp8"): (2614.9 * _T, "AMD Instinct MI300X datasheet, dense"),
    ("mi300x", "tf32"): (653.7 * _T, "AMD Instinct MI300X datasheet"),
    ("mi300x", "fp32"): (163.4 * _T, "AMD Instinct MI300X datasheet, matrix"),
}

#: NVIDIA PCI device IDs (vendor 0x10de) -> (the variant, its key in PEAK_FLOPS). A device's name ("NVIDIA H100
#: 80GB HBM3") does not say SXM or PCIe, whose peaks differ 1.31x (989.4 / 756 TF BF16): the PCI device ID does.
#: Names as the PCI ID Repository's pci.ids lists them (Debian's ``pci.ids`` package; a test holds this table to
#: it where it is installed). A device not listed is left unnamed, never guessed.
PCI_VARIANTS: Mapping[int, tuple[str, str]] = {
    0x20B0: ("A100 SXM4 40GB", "a100"),
    0x20B2: ("A100 SXM4 80GB", "a100"),
    0x20B5: ("A100 PCIe 80GB", "a100"),
    0x20F1: ("A100 PCIe 40GB", "a100"),
    0x2330: ("H100 SXM5 80GB", "h100-sxm"),
    0x2331: ("H100 PCIe", "h100-pcie"),
}
VARIANT_SOURCE = "PCI device ID; name per pci.ids (the PCI ID Repository)"


def device_variant(pci_device_id: int | str | None) -> tuple[str, str] | None:
    """(variant, peak key) of an NVIDIA PCI device ID (``0x2330`` or ``"0x2330"``), None when not listed."""
    if pci_device_id is None:
        return None
    try:
        i = int(pci_device_id, 16) if isinstance(pci_device_id, str) else int(pci_device_id)
    except ValueError:
        return None
    return PCI_VARIANTS.get(i)


_ALIASES = {"a100-sxm": "a100", "a100-pcie": "a100", "h100": "h100-sxm", "h200-sxm": "h200", "bfloat16": "bf16",
            "float16": "fp16", "half": "fp16", "float32": "fp32", "float8": "fp8"}


def peak_flops_per_sec(device: str | None, dtype: str = "bf16", *, devices: int = 1) -> float | None:
    """Dense peak FLOPs/s of ``devices`` accelerators of a known kind, or ``None`` when unknown.

    ``device`` is a key of :data:`PEAK_FLOPS` (``"h100-sxm"``, ``"mi300x"``, ...)
    or a name as ``torch.cuda.get_device_name`` reports it. A CPU, or anything
    not in the table, is ``None``: pass ``peak_flops_per_sec=`` explicitly.
    """
    if device is None:
        return None
    key = _normalize_device(device)
    dt = _ALIASES.get(dtype.lower(), dtype.lower())
    hit = PEAK_FLOPS.get((key, dt)) if key else None
    return hit[0] * devices if hit else None


def _normalize_device(name: str) -> str | None:
    n = name.lower().replace("nvidia", "").replace("amd", "").replace("instinct", "").strip()
    if n in {k for k, _ in PEAK_FLOPS} or n in _ALIASES:
        return _ALIASES.get(n, n)
    if "h200" in n:
        return "h200"
    if "h100" in n:
        return "h100-pcie" if "pcie" in n else "h100-sxm"
    if "a100" in n:
        return "a100"
    if "b200" in n:
        return "b200"
    if "mi300x" in n:
        return "mi300x"
    return None


def mfu(flops_per_iter: float, step_time_s: float | None, peak: float | None, *, devices: int = 1) -> float | None:
    """Model FLOPs utilization: (flops_per_iter / step_time_s) / (peak × devices).

    ``flops_per_iter`` counts the whole step across all devices (for data
    parallelism: 6·N·tokens per step, all replicas' tokens). ``None`` when the
    peak or the step time is unknown or not positive.
    """
    if peak is None or step_time_s is None or not step_time_s > 0 or not peak > 0:
        return None
    return flops_per_iter / step_time_s / (peak * devices)


@dataclasses.dataclass(frozen=True)
class PeakMeasurement:
    """A measured matmul peak and how much its repeats varied (a loaded machine varies a lot)."""

    peak: float  # FLOP/s of the fastest product
    median: float  # FLOP/s of the median product
    samples: int

    @property
    def spread(self) -> float:
        """(best - median) / best: 0 on a quiet machine; large when the measurement is not to be trusted."""
        return (self.peak - self.median) / self.peak


def measure_matmul_peak(n: int = 512, seconds: float = 0.3, dtype=None, *, detail: bool = False):
    """This machine's measured dense matmul throughput in FLOP/s (the best of repeated n x n products).

    A CPU has no datasheet peak that MFU could honestly be measured against; the
    best sustained matmul rate, with torch's current thread count, is the
    practical roofline. Recorded as ``peak_flops_per_sec`` like a datasheet peak, with
    ``peak_source="measured"`` and the spread. ``detail=True`` returns a :class:`PeakMeasurement`.
    """
    import time

    import torch

    a = torch.randn(n, n, dtype=dtype or torch.float32)
    b = torch.randn(n, n, dtype=dtype or torch.float32)
    torch.mm(a, b)  # warm-up
    times = []
    deadline = time.perf_counter() + seconds
    while True:
        t0 = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - t0)
        if time.perf_counter() > deadline:
            break
    times.sort()
    flops = 2.0 * n ** 3
    m = PeakMeasurement(peak=flops / times[0], median=flops / times[len(times) // 2], samples=len(times))
    return m if detail else m.peak


class FlopCrossCheckRefused(TrainledgerError, RuntimeError):
    """The FLOP counter cannot see this model's attention, so a comparison would prove nothing."""


def count_training_flops(model_factory, batch: int, seq_len: int) -> int:
    """FLOPs of one forward + backward, counted by ``torch.utils.flop_counter.FlopCounterMode``.

    The model is built by ``model_factory()`` on the meta device (no memory,
    no compute), so large shapes are cheap. Refuses (raises
    :class:`FlopCrossCheckRefused`) for a model whose attention runs in a
    fused kernel: the counter would credit it with formula FLOPs, or miss it,
    and the comparison would not be a check of our accounting.
    """
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        model = model_factory()
        idx = torch.zeros(batch, seq_len, dtype=torch.long)
    if getattr(model, "attn_impl", "unfused") != "unfused":
        raise FlopCrossCheckRefused(
            f"attention runs as {model.attn_impl!r}, a fused kernel: the cross-check needs attention "
            "computed unfused (attn_impl='unfused') so that every matmul is counted"
        )
    with FlopCounterMode(display=False) as counter:
        logits = model(idx)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), idx.flatten())
        loss.backward()
    counts = counter.get_flop_counts().get("Global", {})
    ops = {str(op) for op in counts}
    if not any("bmm" in op or "matmul" in op for op in ops):
        raise FlopCrossCheckRefused(f"the counter saw no attention matmuls (ops: {sorted(ops)})")
    return int(counter.get_total_flops())


def is_checkpointing(model: Any) -> bool:
    """Whether ``model`` recomputes its activations in the backward pass, as it says: transformers 5's
    ``is_activation_checkpointing``, 4's ``is_gradient_checkpointing`` (read through the class, so that 5's
    deprecation warning is not raised), the reference CausalLM's ``activation_checkpointing``."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(model), name):
            return bool(getattr(model, name))
    return bool(getattr(model, "activation_checkpointing", False))


def measure_recompute_ratio(model: Any, run_step: Any, *, checkpointing: Any = None) -> float:
    """Executed over model FLOPs of one training step, counted by ``torch.utils.flop_counter.FlopCounterMode`` on
    the real model: ``run_step()`` (your forward and ``loss.backward()`` on one batch, no optimizer step) is
    counted once as the model is set up and once with recomputation off, and the model is left as it was.
    ``checkpointing(on: bool)`` turns recomputation on and off (given: the model is taken to recompute as it is, and
    is turned back on after); by default the model's own
    ``gradient_checkpointing_enable``/``_disable`` (Hugging Face models, the reference CausalLM). The gradients
    the two passes leave are cleared. Returns 1.0 for a model that recomputes nothing; about 4/3 with full
    activation checkpointing (the forward done twice). Record it with
    ``FlopConfig(..., recompute_ratio=...)``: the compute statement shows it and excludes the recomputation, as the
    Commission's guidelines do."""
    from torch.utils.flop_counter import FlopCounterMode

    if checkpointing is None:
        # transformers 5's names first (activation_...), then 4's (gradient_..., deprecated in 5), the reference
        # CausalLM's
        prefix = "activation" if hasattr(model, "activation_checkpointing_enable") else "gradient"
        on, off = (getattr(model, f"{prefix}_checkpointing_enable", None),
                   getattr(model, f"{prefix}_checkpointing_disable", None))
        if on is None or off is None:
            raise ValueError("measure_recompute_ratio: the model has no gradient_checkpointing_enable/_disable; "
                             "pass checkpointing=lambda on: ... that turns its recomputation on and off")
        was = is_checkpointing(model)

        def checkpointing(flag: bool) -> None:
            (on if flag else off)()
    else:
        was = True

    def counted() -> int:
        with FlopCounterMode(display=False) as counter:
            run_step()
        model.zero_grad(set_to_none=True)
        return int(counter.get_total_flops())

    try:
        executed = counted()  # as the model is set up
        checkpointing(False)
        plain = counted()
    finally:
        checkpointing(was)
    if plain <= 0:
        raise ValueError("measure_recompute_ratio: the step counted no FLOPs (does run_step call backward?)")
    return executed / plain


def device_kind(model: Any) -> str | None:
    """What the model's first parameter is on, as the compute statement names it (``run_configured.device_kind``):
    the CUDA device's name ("NVIDIA H100 80GB HBM3"), else the device type ("cpu"); None without a parameter."""
    try:
        p = next(iter(model.parameters()))
    except (AttributeError, StopIteration, TypeError):
        return None
    dev = p.device
    if dev.type == "cuda":
        import torch

        return torch.cuda.get_device_name(dev)
    return dev.type
