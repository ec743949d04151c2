"""The compute statement's figures from the ``compute_totaled`` of each journal: one function for the command that
writes the statement and for ``verify-proof``, which recomputes every figure from the proven events and holds the
statement to it. Pure arithmetic over plain dicts (JSON in, JSON out), in a fixed order, so that both sides get the
same floats bit for bit.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DEFAULT_COMPUTE_THRESHOLDS", "DEFAULT_MFU_RANGE", "MARGIN", "run_figures", "model_figures", "two_figures",
           "architecture_estimate", "hardware_estimate", "method_disagreement", "within_margin"]

#: The cumulative training compute watched by default (model FLOPs; docs/compute.md): the EU Commission's indicative
#: threshold for a general-purpose AI model, and the AI Act's presumption of systemic risk (Article 51(2)), whose
#: crossing starts a two-week notification clock (Article 52).
DEFAULT_COMPUTE_THRESHOLDS = {"gpai": 1e23, "systemic-risk": 1e25}

#: model-based FLOPs over hardware-based FLOPs (devices x peak x busy time): above 1 the model's FLOPs exceed what the
#: devices can do at their peak (a wrong peak or a wrong FLOP shape); below 0.01 the hardware figure overstates the
#: work a hundredfold (devices idle in steps, or a peak far too high). Outside, the two methods disagree.
DEFAULT_MFU_RANGE = (0.01, 1.0)


def two_figures(x: float | int | None) -> str:
    """``x`` to two significant figures, as the forms ask: ``2.3e+24``."""
    return "-" if x is None else f"{float(x):.1e}"


def _journal_span(c: dict[str, Any]) -> tuple[int, float]:
    """(devices at once, device-seconds from the journal's first line to its last step)."""
    devices = max((h["devices"] for h in c.get("hardware") or ()), default=1)
    s, e = c.get("started_ns"), c.get("ended_ns")
    span = (e - s) / 1e9 if s is not None and e is not None and e > s else 0.0
    return devices, devices * span


def run_figures(journals: list[dict[str, Any]], *, board_power_w: float | None = None) -> dict[str, Any]:
    """One run's figures from its journals' ``compute_totaled`` (``journals``: each ``{"compute": {...}}``, in rank
    order): model FLOPs and tokens summed over ranks, the hardware-based FLOPs (each journal's steps by hardware:
    devices x peak x busy seconds), time, devices, device-hours, and energy: NVML's counter where sampled, the
    power samples' trapezoid where not, and for the device time neither covers an estimate from the measured mean
    power (else from ``board_power_w``, declared), each labelled."""
    model = 0.0
    tokens = steps = without_tokens = tokens_without_shape = without_time = resets = 0
    hw = 0.0
    priced_model = 0.0  # model FLOPs of the journals whose every step has a peak: the ones the ratio compares
    unpriced_s = busy_dev_s = span_dev_s = 0.0
    energy_j = energy_s = power_j = power_s = 0.0
    energy_seen = power_seen = False
    devices = 0
    kinds: list[str] = []
    peaks: list[dict[str, Any]] = []
    started = ended = None
    busy = 0.0
    for j in journals:
        c = j["compute"]
        model += c["flops"]
        tokens += c["tokens"]
        steps = max(steps, c["steps"])
        without_tokens += c.get("steps_without_tokens", 0)
        tokens_without_shape += c.get("tokens_without_shape", 0)
        without_time += c.get("steps_without_time", 0)
        busy = max(busy, c.get("busy_s") or 0.0)
        all_priced = True
        jhw = 0.0
        for h in c.get("hardware") or ():
            dev_s = h["devices"] * h["busy_s"]
            busy_dev_s += dev_s
            if h["peak_flops_per_sec"] is None:
                unpriced_s += dev_s
                all_priced = False
            else:
                jhw += h["devices"] * h["peak_flops_per_sec"] * h["busy_s"]
            peak = {k: h[k] for k in ("device_kind", "peak_flops_per_sec", "peak_source")}
            if peak not in peaks:
                peaks.append(peak)
            if h["device_kind"] is not None and h["device_kind"] not in kinds:
                kinds.append(h["device_kind"])
        hw += jhw
        if all_priced and c.get("hardware"):
            priced_model += c["flops"]
        d, span = _journal_span(c)
        devices += d
        span_dev_s += span
        s, e = c.get("started_ns"), c.get("ended_ns")
        if s is not None:
            started = s if started is None else min(started, s)
        if e is not None:
            ended = e if ended is None else max(ended, e)
        if c.get("energy_j") is not None:
            energy_seen = True
            energy_j += c["energy_j"]
        energy_s += c.get("energy_s", 0.0)
        if c.get("power_j") is not None:
            power_seen = True
            power_j += c["power_j"]
        power_s += c.get("power_s", 0.0)
        resets += c.get("energy_resets", 0)
    settings = _settings(journals)
    measured_s = energy_s + power_s
    uncovered = max(span_dev_s - measured_s, 0.0)
    estimate, basis = None, None
    if uncovered > 0:
        if measured_s > 0:
            w = (energy_j + power_j) / measured_s
            estimate, basis = uncovered * w, f"measured mean power ({w:.4g} W per device) x device time not measured"
        elif board_power_w is not None:
            estimate, basis = uncovered * board_power_w, f"declared board power ({board_power_w:.4g} W per device) " \
                                                         "x device time not measured"
        else:
            basis = "not estimated: no energy counter, no power samples, no declared board power"
    total = None
    if energy_seen or power_seen or estimate is not None:
        total = energy_j + power_j + (estimate or 0.0)
    return {
        "model_flops": model, "tokens": tokens, "steps": steps, "steps_without_tokens": without_tokens,
        "tokens_without_shape": tokens_without_shape,
        "hardware_flops": hw if peaks and any(p["peak_flops_per_sec"] is not None for p in peaks) else None,
        "model_to_hardware": priced_model / hw if hw > 0 else None,
        "unpriced_device_s": unpriced_s, "peaks": peaks,
        "devices": devices, "device_kinds": kinds, "journals": len(journals),
        "started_ns": started, "ended_ns": ended,
        "wall_s": (ended - started) / 1e9 if started is not None and ended is not None else None,
        "busy_s": busy, "steps_without_time": without_time,
        "device_busy_s": busy_dev_s, "device_span_s": span_dev_s,
        "energy": {"measured_j": energy_j if energy_seen else None, "measured_device_s": energy_s,
                   "power_estimate_j": power_j if power_seen else None, "power_device_s": power_s,
                   "coverage": energy_s / span_dev_s if span_dev_s > 0 else None, "counter_resets": resets,
                   "uncovered_device_s": uncovered, "estimate_j": estimate, "estimate_basis": basis,
                   "total_j": total},
        **({} if settings is None else {"settings": settings}),
    }


def _settings(journals: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A run's format 1.10 compute settings, from the hardware entries that carry them: the model FLOPs those
    steps count and the FLOPs they executed (each entry's FLOPs x its measured recompute ratio; 1 where none was
    measured), their 6·N·D FLOPs (the architecture method), and every attention convention, accelerator variant and
    power limit they ran under. None where no entry carries settings (a journal before 1.10)."""
    covered = executed = six_nd = 0.0
    unmeasured = 0.0
    conventions: list[str] = []
    variants: list[dict[str, Any]] = []
    limits: list[float] = []
    seen = False
    for j in journals:
        for h in j["compute"].get("hardware") or ():
            if "flops" not in h:
                continue
            seen = True
            covered += h["flops"]
            six_nd += h["six_nd_flops"]
            ratio = h.get("recompute_ratio")
            executed += h["flops"] * (ratio if ratio is not None else 1.0)
            if ratio is None:
                unmeasured += h["flops"]
            conv = h.get("attention_convention") or "full"
            if conv not in conventions:
                conventions.append(conv)
            v = {k: h.get(k) for k in ("device_variant", "pci_device_id", "variant_source")}
            if any(x is not None for x in v.values()) and v not in variants:
                variants.append(v)
            if h.get("power_limit_w") is not None and h["power_limit_w"] not in limits:
                limits.append(h["power_limit_w"])
    if not seen:
        return None
    return {"covered_flops": covered, "executed_flops": executed, "six_nd_flops": six_nd,
            "recompute_ratio": executed / covered if covered > 0 else None,
            "recompute_unmeasured_flops": unmeasured, "attention_conventions": conventions,
            "device_variants": variants, "power_limits_w": sorted(limits)}


def model_figures(runs: list[dict[str, Any]], thresholds: dict[str, float],
                  mfu_range: tuple[float, float] = DEFAULT_MFU_RANGE, *,
                  utilisation: float | None = None) -> dict[str, Any]:
    """A model's figures over its runs (``runs``: each ``{"run", "figures", "base_run", ...}``, in the statement's
    order): sums, the time span, every threshold the cumulative model FLOPs reach and at which run, each
    fine-tune's compute against a third of its base's, and whether the two FLOP methods agree within
    ``mfu_range``."""
    model = hw = priced = 0.0
    tokens = devices = 0
    busy_dev_s = span_dev_s = 0.0
    started = ended = None
    total_j = measured_j = 0.0
    any_energy = False
    estimated = False
    crossed: dict[str, str] = {}
    order = sorted(range(len(runs)), key=lambda i: (runs[i]["figures"]["started_ns"] or 0, i))
    running = 0.0
    for i in order:
        running += runs[i]["figures"]["model_flops"]
        for name, v in sorted(thresholds.items(), key=lambda kv: (kv[1], kv[0])):
            if name not in crossed and running >= v:
                crossed[name] = runs[i]["run"]
    for r in runs:
        f = r["figures"]
        model += f["model_flops"]
        tokens += f["tokens"]
        if f["hardware_flops"] is not None:
            hw += f["hardware_flops"]
            if f["model_to_hardware"] is not None:
                priced += f["model_to_hardware"] * f["hardware_flops"]
        devices = max(devices, f["devices"])
        busy_dev_s += f["device_busy_s"]
        span_dev_s += f["device_span_s"]
        if f["started_ns"] is not None:
            started = f["started_ns"] if started is None else min(started, f["started_ns"])
        if f["ended_ns"] is not None:
            ended = f["ended_ns"] if ended is None else max(ended, f["ended_ns"])
        e = f["energy"]
        if e["total_j"] is not None:
            any_energy = True
            total_j += e["total_j"]
            measured_j += e["measured_j"] or 0.0
            estimated = estimated or bool(e["power_estimate_j"] or e["estimate_j"])
    ratio = priced / hw if hw > 0 else None
    fine_tunes = []
    by_run = {r["run"]: r for r in runs}
    for r in runs:
        base = by_run.get(r.get("base_run"))
        if base is not None:
            third = base["figures"]["model_flops"] / 3
            fine_tunes.append({"run": r["run"], "base_run": base["run"], "flops": r["figures"]["model_flops"],
                               "base_flops": base["figures"]["model_flops"], "third_of_base": third,
                               "exceeds_third": r["figures"]["model_flops"] > third})
    return {
        "model_flops": model, "tokens": tokens, "hardware_flops": hw if hw > 0 else None,
        "model_to_hardware": ratio, "mfu_range": list(mfu_range),
        "methods_agree": None if ratio is None else mfu_range[0] <= ratio <= mfu_range[1],
        "runs": len(runs), "devices": devices,
        "device_hours": busy_dev_s / 3600, "allocated_device_hours": span_dev_s / 3600,
        "started_ns": started, "ended_ns": ended,
        "wall_days": (ended - started) / 86400e9 if started is not None and ended is not None else None,
        "energy_j": total_j if any_energy else None, "energy_measured_j": measured_j if any_energy else None,
        "energy_kwh": total_j / 3.6e6 if any_energy else None, "energy_includes_estimates": estimated,
        "thresholds": {name: {"flops": v, "reached": name in crossed, "by_run": crossed.get(name)}
                       for name, v in sorted(thresholds.items(), key=lambda kv: (kv[1], kv[0]))},
        "fine_tunes": fine_tunes,
        **_methods(runs, model, hw if hw > 0 else None, busy_dev_s, span_dev_s, started, ended,
                   total_j if any_energy else None, estimated, utilisation),
    }


#: the margin the Commission's guidelines accept for a training compute estimate
MARGIN = 0.30


def architecture_estimate(parameters: float, tokens: float) -> float:
    """The guidelines' architecture method: about 6 FLOP per parameter per training token (forward and backward of
    every weight), recomputation and attention left out."""
    return 6.0 * parameters * tokens


def hardware_estimate(device_seconds_at_peak: float, utilisation: float, recompute_ratio: float = 1.0) -> float:
    """The guidelines' hardware method: devices x time x peak (``device_seconds_at_peak``, FLOP: every device's
    peak times its time) x the average utilisation, less the recomputation the guidelines leave out (divided by
    the executed-over-model FLOP ratio)."""
    return device_seconds_at_peak * utilisation / recompute_ratio


def method_disagreement(hardware: float, architecture: float) -> float:
    """How far the hardware method's figure is from the architecture method's: hardware over architecture, less one
    (+0.069: the hardware figure is 6.9% above)."""
    return hardware / architecture - 1


def within_margin(disagreement: float) -> bool:
    """Whether two estimates that differ by ``disagreement`` agree within the 30% the guidelines accept."""
    return abs(disagreement) <= MARGIN


def _methods(runs: list[dict[str, Any]], model: float, hw: float | None, busy_dev_s: float, span_dev_s: float,
             started: int | None, ended: int | None, energy_j: float | None, estimated: bool,
             utilisation: float | None) -> dict[str, Any]:
    """Format 1.10's settings over the model's runs, the guidelines' two estimation methods side by side, and the
    Model Documentation Form's figures. Nothing where no run recorded the settings (a statement of journals before
    1.10 keeps its figures as they were)."""
    sets = [r["figures"]["settings"] for r in runs if r["figures"].get("settings") is not None]
    if not sets:
        return {}
    covered = sum(x["covered_flops"] for x in sets)
    executed = sum(x["executed_flops"] for x in sets)
    six_nd = sum(x["six_nd_flops"] for x in sets)
    ratio = executed / covered if covered > 0 else None
    conventions = sorted({c for x in sets for c in x["attention_conventions"]})
    variants: list[dict[str, Any]] = []
    for x in sets:
        for v in x["device_variants"]:
            if v not in variants:
                variants.append(v)
    limits = sorted({w for x in sets for w in x["power_limits_w"]})
    # the hardware method: devices x busy time x peak x utilisation. Declared, the utilisation is the provider's
    # own; else the one measured here, the executed FLOPs over what the devices could do at their peak in their busy
    # time (what a profiler counting executed work reads). Recomputation is left out, as the guidelines ask.
    if hw is not None and hw > 0:
        u = utilisation if utilisation is not None else executed / hw * (model / covered if covered > 0 else 1.0)
        source = "declared" if utilisation is not None else "measured: executed FLOPs over peak x busy time"
        hardware = hardware_estimate(hw, u, ratio or 1.0)
    else:
        u, source, hardware = utilisation, "no peak recorded: the hardware method cannot be computed", None
    disagreement = method_disagreement(hardware, six_nd) if hardware is not None and six_nd > 0 else None
    wall_days = (ended - started) / 86400e9 if started is not None and ended is not None else None
    return {
        "recompute_ratio": ratio, "executed_flops": executed * (model / covered) if covered > 0 else None,
        "recompute_unmeasured_flops": sum(x["recompute_unmeasured_flops"] for x in sets),
        "attention_convention": conventions[0] if len(conventions) == 1 else conventions,
        "device_variant": variants, "power_limit_w": limits,
        "methods": {
            "architecture": {"flops": six_nd, "formula": "6 x parameters x tokens"},
            "hardware": {"flops": hardware, "utilisation": u, "utilisation_source": source,
                         "formula": "devices x busy time x peak x utilisation / recompute ratio"},
            "counted": {"flops": model, "formula": "each step's tokens x (6N + attention), as recorded"},
            "disagreement": disagreement,
        },
        "within_30_percent": None if disagreement is None else within_margin(disagreement),
        "form": {
            "training_compute_flop": two_figures(model),
            "training_period": [_day(started), _day(ended)],
            "wall_clock_days": wall_days, "hardware_days": busy_dev_s / 86400, "allocated_hardware_days":
                span_dev_s / 86400,
            "energy_mwh": None if energy_j is None else float(two_figures(energy_j / 3.6e9)),
            "energy_method": None if energy_j is None else ("estimated in part" if estimated else "measured"),
        },
    }


def _day(ns: int | None) -> str | None:
    import time

    return None if ns is None else time.strftime("%Y-%m-%d", time.gmtime(ns / 1e9))
