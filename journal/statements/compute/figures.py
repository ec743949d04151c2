"""The compute statement's figures from the ``compute_totaled`` of each journal: one function for the command that
writes the statement and for ``verify-proof``, which recomputes every figure from the proven events and holds the
statement to it. Pure arithmetic over plain dicts (JSON in, JSON out), in a fixed order, so that both sides get the
same floats bit for bit.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DEFAULT_COMPUTE_THRESHOLDS", "DEFAULT_MFU_RANGE", "run_figures", "model_figures", "two_figures"]

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
    }


def model_figures(runs: list[dict[str, Any]], thresholds: dict[str, float],
                  mfu_range: tuple[float, float] = DEFAULT_MFU_RANGE) -> dict[str, Any]:
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
    }
