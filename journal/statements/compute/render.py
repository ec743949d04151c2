"""A compute statement as a reader reads it: plain text (the terminal), Markdown (a model card, a filing's draft) or
one self-contained HTML page. Every figure to two significant figures with its exact value beside, and its method."""

from __future__ import annotations

import html
import time
from typing import Any

from trainledger.journal.statements.compute.figures import two_figures

__all__ = ["rows", "as_text", "as_markdown", "as_html"]


def _when(ns: int | None) -> str:
    return "-" if ns is None else time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(ns / 1e9))


def _exact(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e300:
        return f"{int(x):,}"
    return f"{x:,}" if isinstance(x, int) else repr(x)


def _peaks(st: dict[str, Any]) -> str:
    seen = []
    for r in st["runs"]:
        for p in r["figures"]["peaks"]:
            text = (f"{p['device_kind'] or 'unnamed device'}: "
                    + (f"{p['peak_flops_per_sec']:.3g} FLOP/s ({p['peak_source'] or 'source not stated'})"
                       if p["peak_flops_per_sec"] is not None else "no peak"))
            if text not in seen:
                seen.append(text)
    return "; ".join(seen) or "none stated"


def rows(st: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(figure, two significant figures, exact, method) for every figure of the model."""
    f = st["figures"]
    kinds = sorted({k for r in st["runs"] for k in r["figures"]["device_kinds"]})
    ratio = f["model_to_hardware"]
    lo, hi = f["mfu_range"]
    agree = ("-" if ratio is None else
             f"{ratio:.2f}: {'within' if f['methods_agree'] else 'OUTSIDE'} the tolerance [{lo:g}, {hi:g}]")
    energy_method = []
    for r in st["runs"]:
        e = r["figures"]["energy"]
        cov = "-" if e["coverage"] is None else f"{e['coverage']:.1%}"
        energy_method.append(f"{r['run']}: " + (f"NVML counter over {cov} of device time" if e["measured_j"] is not None
                                                else "no energy counter sampled")
                             + (f", power samples over {e['power_device_s']:.3g} device-s (estimate)"
                                if e["power_estimate_j"] is not None else "")
                             + (f", the rest from {e['estimate_basis']} (estimate)" if e["estimate_j"] is not None
                                else (f"; the rest {e['estimate_basis']}" if e["estimate_basis"] else ""))
                             + (f"; counter reset {e['counter_resets']}x" if e["counter_resets"] else ""))
    out = [
        ("Training compute, model-based (FLOP)", two_figures(f["model_flops"]), _exact(f["model_flops"]),
         "PaLM appendix B: 6N + 12·L·H·Q·T per token, every step observed, re-done steps included, all ranks"),
        ("Training compute, hardware-based (FLOP)", two_figures(f["hardware_flops"]), _exact(f["hardware_flops"]),
         f"devices x peak x time in steps; peaks: {_peaks(st)}"),
        ("Model-based / hardware-based", "-" if ratio is None else f"{ratio:.2g}", _exact(ratio), agree),
        ("Tokens", two_figures(f["tokens"]), _exact(f["tokens"]), "tokens of every step observed, all ranks"),
        ("Training time (days, first start to last step)", two_figures(f["wall_days"]), _exact(f["wall_days"]),
         f"from {_when(f['started_ns'])} to {_when(f['ended_ns'])}"),
        ("Devices (most at once)", str(f["devices"]), str(f["devices"]),
         "kind: " + (", ".join(kinds) or "not recorded")),
        ("Device-hours in steps", two_figures(f["device_hours"]), _exact(f["device_hours"]),
         "devices x step times"),
        ("Device-hours allocated", two_figures(f["allocated_device_hours"]), _exact(f["allocated_device_hours"]),
         "devices x each journal's first line to its last step"),
        ("Energy (MWh)", two_figures(None if f["energy_kwh"] is None else f["energy_kwh"] / 1000),
         _exact(None if f["energy_kwh"] is None else f["energy_kwh"] / 1000),
         ("includes estimates; " if f["energy_includes_estimates"] else "") + "; ".join(energy_method)),
    ]
    if f["energy_measured_j"] is not None:
        out.append(("Energy measured by the counter (MWh)", two_figures(f["energy_measured_j"] / 3.6e9),
                    _exact(f["energy_measured_j"] / 3.6e9), "nvmlDeviceGetTotalEnergyConsumption rises"))
    recorded = {c["name"]: {"flops": c["threshold"], "reached": True, "by_run": None}
                for r in st["runs"] for j in r["journals"] for c in j["crossings"]}
    for name, t in {**recorded, **f["thresholds"]}.items():
        at = "; ".join(f"crossed at step {c['step']} on {c['date']} (run {r['run']}, rank {j['rank']})"
                       for r in st["runs"] for j in r["journals"] for c in j["crossings"] if c["name"] == name)
        out.append((f"Threshold {name} ({t['flops']:.0e} FLOP)",
                    "reached" if t["reached"] else "not reached", t["by_run"] or "-",
                    at or ("cumulative over the runs" if t["reached"] else "no crossing recorded")))
    out += _settings_rows(f)
    for ft in f["fine_tunes"]:
        out.append((f"Fine-tune {ft['run']} vs a third of {ft['base_run']}", two_figures(ft["flops"]),
                    f"{_exact(ft['flops'])} vs {_exact(ft['third_of_base'])}",
                    "exceeds a third of its base model's compute" if ft["exceeds_third"] else
                    "within a third of its base model's compute"))
    return out


def _settings_rows(f: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """Format 1.10's rows: the settings that move the answer, both of the guidelines' methods and the Form's
    figures (none for a statement of earlier journals)."""
    if "methods" not in f:
        return []
    m = f["methods"]
    ratio = f["recompute_ratio"]
    dis = m["disagreement"]
    variants = "; ".join(f"{v['device_variant'] or 'not named'} (PCI {v['pci_device_id'] or '-'}; "
                         f"{v['variant_source'] or 'source not stated'})" for v in f["device_variant"])
    conv = f["attention_convention"]
    hw = m["hardware"]
    form = f["form"]
    return [
        ("Recompute ratio (executed / model FLOPs)", "-" if ratio is None else f"{ratio:.3g}", _exact(ratio),
         "FlopCounterMode on the real model, with and without activation recomputation; the FLOPs above exclude "
         "the recomputation, as the guidelines do"
         + ("" if not f["recompute_unmeasured_flops"] else
            f"; not measured for {two_figures(f['recompute_unmeasured_flops'])} FLOP (counted as 1)")),
        ("Executed FLOPs (recomputation included)", two_figures(f["executed_flops"]), _exact(f["executed_flops"]),
         "model FLOPs x the measured recompute ratio"),
        ("Attention convention", conv if isinstance(conv, str) else ", ".join(conv), "-",
         "full: 12·L·H·Q·T per token (every score of the square); causal: half of it"),
        ("Accelerator variant", ", ".join(v["device_variant"] or v["pci_device_id"] or "-"
                                          for v in f["device_variant"]) or "not recorded",
         "-", variants or "no PCI device ID read (no NVML device)"),
        ("Power limit (W)", ", ".join(f"{w:g}" for w in f["power_limit_w"]) or "not recorded", "-",
         "NVML's enforced power limit"),
        ("Architecture method (FLOP)", two_figures(m["architecture"]["flops"]), _exact(m["architecture"]["flops"]),
         m["architecture"]["formula"]),
        ("Hardware method (FLOP)", two_figures(hw["flops"]), _exact(hw["flops"]),
         f"{hw['formula']}; utilisation {'-' if hw['utilisation'] is None else format(hw['utilisation'], '.3g')} "
         f"({hw['utilisation_source']})"),
        ("Methods' disagreement", "-" if dis is None else f"{dis:+.1%}", _exact(dis),
         "-" if f["within_30_percent"] is None else
         ("within" if f["within_30_percent"] else "OUTSIDE") + " the 30% the guidelines accept"),
        ("Form: training period", f"{form['training_period'][0]} to {form['training_period'][1]}", "-",
         f"wall clock {two_figures(form['wall_clock_days'])} days; hardware {two_figures(form['hardware_days'])} "
         f"device-days in steps ({two_figures(form['allocated_hardware_days'])} allocated)"),
        ("Form: energy (MWh)", "-" if form["energy_mwh"] is None else f"{form['energy_mwh']:g}", "-",
         form["energy_method"] or "no energy recorded"),
    ]


def _run_lines(st: dict[str, Any]) -> list[str]:
    out = []
    for r in st["runs"]:
        f = r["figures"]
        link = (f", continues {r['continues']}" if r["continues"] else "") + \
               (f", fine-tuned from {r['base_run'] or r['base'][:16] + '...'}" if r["base"] else "") + \
               (f", model sha256:{r['export']} (its last model_exported)" if r["export"] else ", no model exported")
        out.append(f"{r['run']} ({r['path']}): {len(r['journals'])} journal(s) of {r['world_size']}, "
                   f"{two_figures(f['model_flops'])} FLOP, {f['steps']:,} steps, {f['devices']} device(s){link}")
    return out


def as_text(st: dict[str, Any]) -> str:
    ok = not st["findings"]
    lines = [f"{'OK  ' if ok else 'FAIL'}  compute statement: {len(st['runs'])} run(s), "
             f"{sum(len(r['journals']) for r in st['runs'])} journal(s)" + ("" if ok else
                                                                             f", {len(st['findings'])} finding(s)")]
    table = rows(st) if st["runs"] else []  # no run verified: no figure to show, only why
    w = max((len(r[0]) for r in table), default=0)
    for name, two, exact, method in table:
        lines.append(f"  {name:<{w}}  {two:<12} exact {exact}")
        lines.append(f"  {'':<{w}}  {method}")
    lines += ["  run " + x for x in _run_lines(st)]
    lines += [f"  FINDING {x}" for x in st["findings"]]
    lines += [f"  note: {x}" for x in st["notes"]]
    lines.append(f"  not proven: {st['not_proven']}")
    return "\n".join(lines)


def _md(x: str) -> str:
    return x.replace("|", "\\|").replace("\n", " ")


def as_markdown(st: dict[str, Any]) -> str:
    lines = ["# Training compute statement", "",
             f"{len(st['runs'])} run(s), {sum(len(r['journals']) for r in st['runs'])} journal(s); "
             + ("no findings." if not st["findings"] else f"**{len(st['findings'])} finding(s)**."), "",
             "| Figure | Value (2 s.f.) | Exact | Method |", "|---|---|---|---|"]
    lines += [f"| {_md(a)} | {_md(b)} | {_md(c)} | {_md(d)} |" for a, b, c, d in rows(st)]
    lines += ["", "## Runs", ""] + [f"- {_md(x)}" for x in _run_lines(st)]
    if st["findings"]:
        lines += ["", "## Findings", ""] + [f"- {_md(x)}" for x in st["findings"]]
    if st["notes"]:
        lines += ["", "## Notes", ""] + [f"- {_md(x)}" for x in st["notes"]]
    lines += ["", "## What this does not prove", "", st["not_proven"], ""]
    return "\n".join(lines)


def as_html(st: dict[str, Any]) -> str:
    e = html.escape
    body = "".join(f"<tr><td>{e(a)}</td><td>{e(b)}</td><td><code>{e(c)}</code></td><td>{e(d)}</td></tr>"
                   for a, b, c, d in rows(st))
    runs = "".join(f"<li>{e(x)}</li>" for x in _run_lines(st))
    finds = "".join(f"<li>{e(x)}</li>" for x in st["findings"])
    notes = "".join(f"<li>{e(x)}</li>" for x in st["notes"])
    return ("<!doctype html><html lang=en><head><meta charset=utf-8><title>Training compute statement</title>"
            "<style>body{font:15px/1.4 system-ui,sans-serif;margin:2em;max-width:80em}table{border-collapse:collapse}"
            "td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left;vertical-align:top}"
            ".fail{color:#a00}</style></head><body><h1>Training compute statement</h1>"
            f"<p class={'ok' if not st['findings'] else 'fail'}>{len(st['runs'])} run(s); "
            f"{'no findings' if not st['findings'] else str(len(st['findings'])) + ' finding(s)'}</p>"
            "<table><tr><th>Figure</th><th>Value (2 s.f.)</th><th>Exact</th><th>Method</th></tr>"
            f"{body}</table><h2>Runs</h2><ul>{runs}</ul>"
            + (f"<h2>Findings</h2><ul class=fail>{finds}</ul>" if finds else "")
            + (f"<h2>Notes</h2><ul>{notes}</ul>" if notes else "")
            + f"<h2>What this does not prove</h2><p>{e(st['not_proven'])}</p></body></html>\n")
