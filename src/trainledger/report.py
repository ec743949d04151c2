"""trainledger report: one self-contained HTML page about a run.

The page is built from :func:`trainledger.audit.replay` (verification, every
projection, every recomputed conclusion) plus one more pass over the verified
bytes for the curves: loss, grad norm, step time and MFU by step, with
anomalies, checkpoints, resumes and rewinds marked. Plots are drawn by
matplotlib (Agg, PNG) and embedded as data URIs; the page has no scripts and
fetches nothing. matplotlib is the ``report`` extra:
``pip install 'trainledger[report]'``.
"""

from __future__ import annotations

import base64
import html
import io
import math
import os
import re
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from trainledger.journal import __version__
from trainledger.journal.errors import JournalIOError, UsageError
from trainledger.journal.trust import TrustPolicy
from trainledger.journal.events import RunOpened, RunResumed, StepObserved
from trainledger.training.health.detectors import AnomalyDetected, RunConfigured
from trainledger.training.health.mfu import MfuAccounting
from trainledger.training.kinds import CheckpointSaved, RewindDecided
from trainledger.ladder.kinds import DecisionRecorded, GateVerdict, RungStarted, ScalingFitted
from trainledger.audit import Reconstruction, replay

__all__ = ["write_report", "write_run_dir_report", "MAX_POINTS"]

#: Longer series are drawn as per-bucket mean lines with a min-max band of this many buckets.
MAX_POINTS = 2000


def _matplotlib():
    try:
        import matplotlib
    except ImportError:
        raise UsageError("trainledger report needs matplotlib: pip install 'trainledger[report]'") from None
    matplotlib.use("Agg", force=True)
    matplotlib.rcParams["text.parse_math"] = False  # a rung named "$\\frac{$" is a name, not mathtext
    import matplotlib.pyplot as plt

    return plt


class _Series:
    """What the curves and the ladder tables need, folded during replay's pass over the journal."""

    def __init__(self) -> None:
        self.step: list[int] = []
        self.loss: list[float] = []
        self.grad_norm: list[float] = []
        self.step_time: list[float] = []
        self.mfu: list[float] = []
        #: (index into the series of the observation it was raised on, kind)
        self.anomalies: list[tuple[int, str]] = []
        self._last_index: dict[int, int] = {}
        self.checkpoints: list[int] = []
        self.resumes: list[int] = []
        #: indices of observations a later resume or rewind went back before (not the final timeline)
        self.abandoned: set[int] = set()
        self._segment = 0
        self.rewinds: list[int] = []
        self.opened: RunOpened | None = None
        self.verdicts: list[GateVerdict] = []
        self.decisions: list[DecisionRecorded] = []
        #: (index of the first observation after it, rung name) for each rung_started
        self.rungs: list[tuple[int, str]] = []
        self.fits: list[Any] = []  # scaling_fitted (F5)
        self.fit_png: str | None = None
        self._mfu: MfuAccounting | None = None  # from the run_configured in force
        self.segments = 0  # run_configured events seen (a ladder: one per rung)
        self.plot_error: str | None = None

    def apply(self, ev: Any) -> None:
        """Fold one event (called by :func:`trainledger.audit.replay` for every event, in order)."""
        if isinstance(ev, StepObserved):
            nan = math.nan
            self._last_index[ev.step] = len(self.step)
            self.step.append(ev.step)
            self.loss.append(ev.loss)
            self.grad_norm.append(nan if ev.grad_norm is None else ev.grad_norm)
            st = ev.step_time_s
            self.step_time.append(nan if st is None else st)
            m = self._mfu.step(ev.tokens, ev.examples, st) if self._mfu is not None else None
            self.mfu.append(nan if m is None else m)
        elif isinstance(ev, AnomalyDetected):
            i = self._last_index.get(ev.step)
            if i is not None:
                self.anomalies.append((i, ev.kind))
        elif isinstance(ev, CheckpointSaved):
            self.checkpoints.append(ev.step)
        elif isinstance(ev, RunResumed):
            if ev.from_step is not None:
                self.resumes.append(ev.from_step)
                # Observations past the step it went back to were abandoned: the run took them again.
                self.abandoned.update(i for i in range(self._segment, len(self.step)) if self.step[i] > ev.from_step)
        elif isinstance(ev, RewindDecided):
            self.rewinds.append(ev.spike_step)
        elif isinstance(ev, RunConfigured):
            self._mfu = MfuAccounting(ev)  # the same MFU the monitor and replay compute
            self.segments += 1
            self._segment = len(self.step)  # a new segment (a ladder's rung): its steps start over
        elif isinstance(ev, RunOpened):
            self.opened = ev
        elif isinstance(ev, GateVerdict):
            self.verdicts.append(ev)
        elif isinstance(ev, DecisionRecorded):
            self.decisions.append(ev)
        elif isinstance(ev, RungStarted):
            self.rungs.append((len(self.step), ev.rung))
        elif isinstance(ev, ScalingFitted):
            self.fits.append(ev)


def _bucketed(xs: list[int], ys: list[float], buckets: int = MAX_POINTS
              ) -> tuple[list[float], list[float], list[float], list[float]] | None:
    """Per-bucket (x, mean, min, max) over finite values, for series longer than ``buckets`` (else None)."""
    n = len(xs)
    if n <= buckets:
        return None
    bx, mean, lo, hi = [], [], [], []
    for b in range(buckets):
        i, j = b * n // buckets, (b + 1) * n // buckets
        vals = [v for v in ys[i:j] if v - v == 0]
        if not vals:
            continue
        bx.append((xs[i] + xs[j - 1]) / 2)
        mean.append(sum(vals) / len(vals))
        lo.append(min(vals))
        hi.append(max(vals))
    return bx, mean, lo, hi


#: Values beyond this magnitude are not drawn (no axis spans +/-1e308); the tables still show them.
PLOT_LIMIT = 1e100


def _drawable(ys: list[float]) -> list[float]:
    return [v if v - v == 0 and -PLOT_LIMIT <= v <= PLOT_LIMIT else math.nan for v in ys]


def _figure(plt, s: _Series) -> str:
    panels = [("loss (nats)", _drawable(s.loss), False), ("grad norm (L2)", _drawable(s.grad_norm), True),
              ("step time (s)", _drawable(s.step_time), False),
              ("MFU (%)", _drawable([100 * m for m in s.mfu]), False)]  # a percent, as in the tables
    panels = [p for p in panels if any(v - v == 0 for v in p[1])]
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 2.6 * len(panels)), sharex=True, squeeze=False)
    marks = [(s.checkpoints, "tab:green", "checkpoint", ":"), (s.resumes, "tab:blue", "resume", "--"),
             (s.rewinds, "tab:orange", "rewind", "-.")]
    # A resume or rewind runs steps again: each stretch of increasing steps is its own line.
    cuts = [0] + [i for i in range(1, len(s.step)) if s.step[i] <= s.step[i - 1]] + [len(s.step)]
    total = len(s.step)
    names = [n for _, n in s.rungs]
    for row, (ax, (label, ys, logy)) in enumerate(zip(axes[:, 0], panels)):
        seen: set[str] = set()
        gone = s.abandoned
        # Each stretch of increasing steps (a rung of a ladder, the steps after a resume) is drawn on its own,
        # bucketed within itself when the record is too long to draw point by point: a bucket never spans two
        # stretches, so no band or line joins one rung's end to the next one's start.
        for k in range(len(cuts) - 1):
            i, j = cuts[k], cuts[k + 1]
            rung = next((name for at, name in reversed(s.rungs) if at <= i), None)
            color = "tab:gray" if rung is None else f"C{names.index(rung) % 10}"
            name = label if rung is None else rung
            first = name not in seen
            seen.add(name)
            kept = [math.nan if x in gone else ys[x] for x in range(i, j)]
            budget = max(2, MAX_POINTS * (j - i) // total) if total > MAX_POINTS else j - i
            b = _bucketed(s.step[i:j], kept, budget)
            if b is None:
                ax.plot(s.step[i:j], kept, lw=0.9, color=color, label=name if first else None)
            else:
                ax.fill_between(b[0], b[2], b[3], color=color, alpha=0.2, lw=0,
                                label="min-max of each bucket" if "band" not in seen else None)
                seen.add("band")
                ax.plot(b[0], b[1], lw=0.9, color=color, label=name if first else None)
            if any(x in gone for x in range(i, j)):  # drawn apart: the run went back and took these again
                ax.plot(s.step[i:j], [ys[x] if x in gone else math.nan for x in range(i, j)], lw=0.9, ls=":",
                        color="tab:red", alpha=0.6, label="abandoned (resumed/rewound)" if "ab" not in seen
                        else None)
                seen.add("ab")
        if logy and all(v > 0 for v in ys if v - v == 0):
            ax.set_yscale("log")
            # Plain numbers: with mathtext off (a journal's strings are never parsed as math), the log axis's
            # default labels would print as raw "$\mathdefault{...}$".
            from matplotlib.ticker import FuncFormatter

            from matplotlib.ticker import LogLocator

            plain = FuncFormatter(lambda v, _: f"{v:g}")
            # labelled ticks at 1, 2 and 5 times each power of ten, or at every multiple within a range narrower
            # than a decade (a grad norm between 0.3 and 0.9 would otherwise get one label, or none)
            shown = [v for v in ys if v - v == 0 and v > 0]
            narrow = bool(shown) and max(shown) / min(shown) < 10
            ax.yaxis.set_major_locator(LogLocator(base=10, subs=tuple(range(1, 10)) if narrow else (1.0, 2.0, 5.0)))
            ax.yaxis.set_major_formatter(plain)
            ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
        for steps, color, name, style in marks:
            for k, x in enumerate(steps):
                ax.axvline(x, color=color, ls=style, lw=1, label=name if k == 0 else None)
        pts = [(s.step[i], ys[i]) for i, _ in s.anomalies if ys[i] - ys[i] == 0]
        if pts:
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker="x", color="tab:red", s=36, zorder=3,
                       label="anomaly")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        if row == 0 or not s.rungs:  # a ladder's rungs share their colours across panels: one legend, on top
            ax.legend(loc="upper right", fontsize=7, ncol=4)
    axes[-1, 0].set_xlabel("step")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=96)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _fit_figure(plt, s: _Series) -> str:
    """The scaling-law fit: each point's held-out loss and the law's value there, against training compute (6ND); the run it sized,
    predicted with its interval, and measured."""
    fig, ax = plt.subplots(figsize=(8, 3.6))
    for k, f in enumerate(s.fits):
        p = f.params
        law = lambda n, d: p["E"] + p["A"] / n ** p["alpha"] + p["B"] / d ** p["beta"]  # noqa: E731
        xs = [6 * n * d for n, d, _ in f.points]
        ax.scatter(xs, [ls for _, _, ls in f.points], color="tab:blue", label="rung held-out loss" if k == 0 else None)
        for x, (n, d, ls) in zip(xs, f.points):  # two standard errors, where the rung's verdict recorded one
            se = next((g.measured.get("eval_loss_se") for g in s.verdicts if g.measured.get("n_params") == n
                       and g.measured.get("tokens") == d), None)
            if isinstance(se, (int, float)) and math.isfinite(se):
                ax.errorbar([x], [ls], yerr=[[2 * se], [2 * se]], fmt="none", color="tab:blue", capsize=3)
        ax.scatter(xs, [law(n, d) for n, d, _ in f.points], marker="x", color="tab:gray",
                   label="the fitted law" if k == 0 else None)
        cand = f.choice.get("candidate") or {}
        n, d = cand.get("n_params"), f.choice.get("tokens")
        lo, hi = f.choice.get("interval", [None, None])
        if n and d and lo is not None:
            pred = f.choice.get("predicted_loss")
            ax.errorbar([6 * n * d], [pred], yerr=[[pred - lo], [hi - pred]], fmt="s", color="tab:orange", capsize=4,
                        label=f"{f.rung}: predicted, {f.level:.0%} interval")
            v = next((g for g in s.verdicts if g.rung == f.rung), None)
            if v is not None and isinstance(v.measured.get("eval_loss"), (int, float)):
                ax.scatter([6 * n * d], [v.measured["eval_loss"]], marker="*", s=120, color="tab:red", zorder=3,
                           label=f"{f.rung}: measured")
    ax.set_xscale("log")
    from matplotlib.ticker import FuncFormatter

    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.0e}"))  # mathtext is off: no $10^{8}$
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    ax.set_xlabel("training compute 6ND (FLOPs)")
    ax.set_ylabel("held-out loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=96)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _e(x: Any) -> str:
    """HTML-escaped, and every control character (an ESC in a node or run name a journal carries) shown as
    ``\\xNN`` instead of copied into the page."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", html.escape(str(x)))


def _table(headers: list[str], rows: list[list[Any]], empty: str) -> str:
    if not rows:
        return f"<p class=muted>{_e(empty)}</p>"
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _fmt(v: Any, key: str = "") -> str:
    """A value as the tables show it: 4 significant digits, an MFU (a key naming it) in percent as everywhere else
    on the page, an interval as ``[lo, hi]`` of such numbers."""
    if isinstance(v, float):
        return f"{v:.2%}" if "mfu" in key.lower() and v - v == 0 else f"{v:.4g}"
    if isinstance(v, dict):
        return ", ".join(f"{k}={_fmt(x, str(k))}" for k, x in v.items() if x is not None)
    if isinstance(v, (list, tuple)) and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
        return "[" + ", ".join(_fmt(float(x), key) for x in v) + "]"
    return str(v)


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:70em;color:#222;
padding:0 1em}h1{font-size:1.5em;margin-bottom:.2em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.9em;margin:.5em 0}td,th{border:1px solid #ddd;padding:.25em .6em;
text-align:left;vertical-align:top}th{background:#f4f4f4}.ok{color:#176b2c;font-weight:600}
.bad{color:#b3261e;font-weight:600}.muted{color:#777}code{font-size:.9em}img{max-width:100%}
dl{display:grid;grid-template-columns:max-content auto;gap:.2em 1em}dt{color:#555}dd{margin:0}
"""


def render(rec: Reconstruction, s: _Series, png: str | None) -> str:
    v = rec.verify
    o = s.opened
    trust = {"pinned": "a pinned key", "embedded": "the key embedded in the journal (integrity only: authenticity "
             "not established)", "unsigned": "no key (the journal is unsigned)"}.get(v.trust or "", v.trust)
    replay_ok = ("<span class=ok>every recorded conclusion follows from the observations</span>" if rec.ok else
                 f"<span class=bad>{len(rec.differences)} recorded conclusion(s) differ from the recomputation</span>")
    manifest = o.manifest_id if o is not None else None
    label = o.manifest_label if o is not None else None
    ident = [  # (label, HTML)
        ("run", _e(v.run_id)), ("file", _e(v.path)),
        *([("IMPORTED", "<span class=bad>IMPORTED</span> from " + _e(
            f"{len(v.imported.get('files') or [])} {v.imported.get('tool')} file(s) by {v.imported.get('by')} at "
            f"{v.imported.get('at')}") + ": it attests what those files said then, not that the run happened")]
          if v.imported is not None else []),
        ("verification", (f"<span class=bad>NOT SIGNED</span> {v.events:,} events: the journal carries no signatures"
                          if v.trust == "unsigned" else
                          f"<span class=ok>VERIFIED</span> {v.trusted_last_seq + 1:,} events (seq 0 to "
                          f"{v.trusted_last_seq}) against {_e(trust)}")
         + (f"; <span class=bad>{v.unsealed_events:,} events after them are NOT signed</span> and are left out of "
            "this page" if v.unsealed_events and v.trust != "unsigned" else "")),
        ("key id", f"<code>{_e(v.key_id)}</code>"),
        ("head", f"<code>{_e(v.head)}</code>"),
        ("tail", _e(f"{v.tail}; {v.seals} seals, last sealed seq {v.last_sealed_seq}")),
        ("replay", replay_ok),
        ("manifest", f"<code>{_e(manifest)}</code>" + (f" ({_e(label)})" if label else "")
         if manifest else "<span class=muted>no manifest recorded in run_opened</span>"),
        ("created", time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(v.created_ns / 1e9)) if v.created_ns else "-"),
    ]
    parts = [f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>trainledger report {_e(v.run_id)}</title>"
             f"<style>{_CSS}</style></head><body>",
             f"<h1>Run {_e(v.run_id)}</h1><p class=muted>trainledger {__version__} report</p><dl>",
             "".join(f"<dt>{_e(k)}</dt><dd>{val}</dd>" for k, val in ident), "</dl>"]
    if rec.differences:
        parts.append("<h2>Differences from the recomputation</h2>")
        parts.append(_table(["seq", "kind", "detail"], [[d["seq"], d["kind"], d["detail"]] for d in rec.differences], ""))
    parts.append("<h2>Curves</h2>")
    if png:
        parts.append(f'<img alt="loss, grad norm, step time and MFU by step" src="data:image/png;base64,{png}">')
    elif s.plot_error:
        parts.append(f"<p class=bad>the curves could not be drawn: {_e(s.plot_error)}</p>")
    else:
        parts.append("<p class=muted>no step observations in this journal</p>")
    h = rec.health or {}
    parts.append("<h2>Health</h2>")
    mfu = (h.get("mfu") or {})
    if s.segments > 1:  # a ladder: every rung is a segment, and the monitor's own figures are the last one's
        # the MFU figures are replay's (the health projection's: the last segment's steps), as `trainledger replay`
        # prints them, each said to cover those steps; each rung's own are in the ladder's table
        parts.append(_table(["segments", "steps (all)", "anomalies", "MFU mean", "MFU min", "MFU max",
                             "MFU over"],
                            [[s.segments, f"{len(s.step):,}", sum(len(x) for x in rec.anomalies_by_kind.values()),
                              *(f"{mfu[k]:.2%}" if mfu.get(k) is not None else "-" for k in ("mean", "min", "max")),
                              f"the last segment's {mfu.get('count', 0):,} steps"]], ""))
        parts.append(f"<p class=muted>{s.segments} segments (one <code>run_configured</code> each: a ladder's "
                     "rungs, or a monitor started over): the MFU figures are the last segment's, as replay prints "
                     "them" + ("; each rung's own are in the ladder's table below" if rec.ladder is not None else "")
                     + ".</p>")
    else:
        parts.append(_table(["steps", "last step", "anomalies", "MFU mean", "MFU min", "MFU max", "tokens/s"],
                            [[h.get("steps", 0), h.get("last_step", "-"),
                              sum(len(x) for x in rec.anomalies_by_kind.values()),
                              *(f"{mfu[k]:.2%}" if mfu.get(k) is not None else "-" for k in ("mean", "min", "max")),
                              f"{h['tokens_per_s']:,.0f}" if h.get("tokens_per_s") else "-"]], ""))
    parts.append(_table(["anomaly", "count", "steps"],
                        [[k, len(st), rec.anomaly_steps(k, 20)] for k, st in sorted(rec.anomalies_by_kind.items())],
                        "no anomalies"))
    c = rec.compute
    if c is not None:
        parts.append("<p>Training compute, every step observed in every segment (what <code>compute_totaled</code> "
                     f"records and <code>trainledger prove --compute</code> proves): {c['steps']:,} steps, "
                     f"{c['tokens']:,} tokens, {c['flops']:.4g} model FLOPs"
                     + (f"; {c['steps_without_tokens']:,} steps without a token count" if c.get("steps_without_tokens")
                        else "") + ".</p>")
    if h.get("spikes_suspected"):
        parts.append(f"<p>{h['spikes_suspected']:,} spike candidate(s) the next step did not confirm "
                     "(<code>spike_suspected</code>): on record for review, not counted as anomalies.</p>")
    for note in rec.notes:
        parts.append(f"<p class=bad>{_e(note)}</p>")
    parts.append("<h2>Checkpoints, resumes, rewinds, stops</h2>")
    restored = {r.get("checkpoint") for r in rec.resumes} | {r.get("checkpoint") for r in rec.rewinds}
    parts.append(_table(["seq", "step", "path", "sha256", "restored"],
                        [[c["seq"], c["step"], c["path"], c["sha256"][:16], "yes" if c["path"] in restored else ""]
                         for c in rec.checkpoints], "no checkpoints"))
    parts.append(_table(["seq", "resumed from step", "checkpoint", "reason"],
                        [[r["seq"], r["from_step"], r["checkpoint"], r["reason"]] for r in rec.resumes], "no resumes"))
    parts.append(_table(["seq", "spike step", "back to step", "checkpoint", "reason"],
                        [[r["seq"], r["spike_step"], r["from_step"], r["checkpoint"], r["reason"]] for r in rec.rewinds],
                        "no rewinds"))
    parts.append(_table(["seq", "rule", "reason"], [[x["seq"], x["rule"], x["reason"]] for x in rec.stops], "no stops"))
    if rec.ladder is not None:  # a plain run has no ladder section at all
        parts.append("<h2>Pilot ladder</h2>")
        lad = rec.ladder
        parts.append(f"<p>GO: {_e(', '.join(lad['passed_rungs']) or 'none')}; "
                     f"{_e('halted at ' + lad['halted_at'] if lad['halted_at'] else 'no rung halted')}</p>")
        parts.append("<h3>Gate verdicts</h3>")
        parts.append(_table(["seq", "rung", "verdict", "reason", "measured", "bars"],
                            [[g.seq, g.rung, "GO" if g.passed else "NO-GO", g.reason, _fmt(dict(g.measured)),
                              _fmt(dict(g.bars))] for g in s.verdicts], "no verdicts"))
        for f in s.fits:  # F5: the law against the points it was fitted to, and the run it sized
            p = f.params
            verdict = next((g for g in s.verdicts if g.rung == f.rung), None)
            measured = verdict.measured.get("eval_loss") if verdict is not None else None
            lo, hi = f.choice.get("interval", [None, None])
            if s.fit_png and f is s.fits[0]:
                parts.append(f'<img alt="scaling-law fit: the law against the rungs and the headline" '
                             f'src="data:image/png;base64,{s.fit_png}">')
            parts.append(f"<h3>Scaling-law fit: the law that sized {_e(f.rung)}</h3><p>L(N, D) = {p['E']:.4g} + "
                         f"{p['A']:.4g} / N<sup>{p['alpha']:.4f}</sup> + {p['B']:.4g} / D<sup>{p['beta']:.4f}</sup>; "
                         f"leave-one-out error {f.loo_error:.2%}; fitted E {p['E']:.4g}"
                         + (f" against the corpus's true entropy rate {f.entropy_rate:.4g} nats"
                            if f.entropy_rate is not None else "") + "</p>")
            warned = (lad.get("fit_warnings") or {}).get(f.rung, [])  # recomputed by replay, never read off the event
            if warned:
                parts.append('<p class=bad><b>FIT WARNING:</b> ' + "<br>".join(_e(w) for w in warned) + "</p>")
            rows = [[f"{n:,.0f}", f"{d:,.0f}", f"{ls:.4f}",
                     f"{p['E'] + p['A'] / n ** p['alpha'] + p['B'] / d ** p['beta']:.4f}"] for n, d, ls in f.points]
            parts.append(_table(["params", "tokens", "held-out loss", "the law's"], rows, "no points"))
            cand = f.choice.get("candidate") or {}
            parts.append(_table(["chosen", "params", "tokens", "binding", "predicted", f"{f.level:.0%} interval",
                                 "measured"],
                                [[cand.get("name"), f"{cand.get('n_params', 0):,}", f"{f.choice.get('tokens', 0):,}",
                                  f.choice.get("binding"), f"{f.choice.get('predicted_loss', float('nan')):.4f}",
                                  f"[{lo:.4f}, {hi:.4f}]" if lo is not None else "-",
                                  "-" if measured is None else f"{measured:.4f}"]], ""))
        parts.append("<h3>Decisions</h3>")
        parts.append(_table(["seq", "rung", "action", "belief before", "belief after", "evidence"],
                            [[d.seq, d.rung, d.action_chosen, _fmt(dict(d.belief_before)), _fmt(dict(d.belief_after)),
                              ", ".join(x[:12] for x in d.evidence)] for d in s.decisions], "no decisions"))
    parts.append("</body></html>\n")
    return "".join(parts)


def write_report(path: str | os.PathLike, out: str | os.PathLike, *, trust: TrustPolicy | None = None,
                 progress: Any = None, **trust_options: Any) -> Reconstruction:
    """Verify and replay ``path`` and write the HTML page to ``out`` (atomically); return the reconstruction.
    ``progress(done, total)``, when given, is told the bytes verified.

    Raises what :func:`trainledger.journal.verify.verify` raises when the journal does not verify: no page is written
    for a journal that does not verify.
    """
    plt = _matplotlib()
    s = _Series()
    rec = replay(path, trust=TrustPolicy.of(trust, **trust_options), observe=s.apply, progress=progress)
    png = None
    if s.step:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # numpy's overflow warnings included: a bad plot is no plot
                png = _figure(plt, s)
        except (ValueError, OverflowError, RuntimeError, Warning) as e:  # values no axis can hold
            s.plot_error = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    if s.fits:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                s.fit_png = _fit_figure(plt, s)
        except (ValueError, OverflowError, RuntimeError, Warning, TypeError, KeyError):
            s.fit_png = None  # the tables still say it all
    _write_atomic(Path(out), render(rec, s, png))
    return rec


def _write_atomic(dest: Path, text: str) -> None:
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    except OSError as e:
        raise JournalIOError(f"{dest.parent}: cannot write there: {e.strerror}") from None
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text.encode("utf-8"))
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)  # a link planted at dest is replaced, not followed
    except OSError as e:
        raise JournalIOError(f"{dest}: cannot write the report: {e.strerror}") from None
    finally:
        tmp.unlink(missing_ok=True)


class _RankSeries:
    """One rank's curves and records in a run folder (the last observation of each step: a resumed rank runs some
    steps twice), folded during replay's pass."""

    def __init__(self) -> None:
        self.loss: dict[int, float] = {}
        self.time: dict[int, float] = {}  # compute_time_s where journaled (what straggler scores rest on)
        self.shards: list[Any] = []
        self.resumes: list[RunResumed] = []
        self.node: str | None = None
        self.telemetry: str | None = None
        self.devices: set[int] = set()

    def apply(self, ev: Any) -> None:
        from trainledger.training.kinds import DeviceSampled, ShardsSaved, TelemetryUnavailable
        from trainledger.journal.kinds import RankJoined
        from trainledger.training.distributed.stragglers import step_time_for_stragglers

        if isinstance(ev, StepObserved):
            self.loss[ev.step] = ev.loss
            t = step_time_for_stragglers(ev)
            if t is not None:
                self.time[ev.step] = t
        elif isinstance(ev, ShardsSaved):
            self.shards.append(ev)
        elif isinstance(ev, RunResumed):
            self.resumes.append(ev)
        elif isinstance(ev, RankJoined):
            self.node = ev.node
        elif isinstance(ev, TelemetryUnavailable):
            self.telemetry = f"unavailable: {ev.reason}"
        elif isinstance(ev, DeviceSampled):
            self.devices.add(ev.device)


def _run_dir_figure(plt, ranks: dict[int, _RankSeries], stragglers: list[dict[str, Any]],
                    divergences: list[dict[str, Any]] = ()) -> str:
    """Per-rank step-time heatmap (stragglers boxed, a replica whose state diverged marked where it did) above
    per-rank loss curves."""
    import statistics

    from matplotlib.patches import Rectangle

    rows = sorted(ranks)
    last = max((max(r.time) for r in ranks.values() if r.time), default=0)
    width = max(1, math.ceil((last + 1) / 200))  # steps per column: at most 200 columns
    ncol = last // width + 1
    grid = [[math.nan] * ncol for _ in rows]
    for i, r in enumerate(rows):
        cols: dict[int, list[float]] = {}
        for st, t in ranks[r].time.items():
            if t - t == 0 and 0 <= t <= PLOT_LIMIT:
                cols.setdefault(st // width, []).append(t * 1e3)
        for c, ts in cols.items():
            grid[i][c] = statistics.median(ts)
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(11, 2.2 + 0.35 * len(rows) + 3), squeeze=True,
                                   gridspec_kw={"height_ratios": [1 + 0.15 * len(rows), 2.4]})
    im = ax1.imshow(grid, aspect="auto", interpolation="nearest", cmap="viridis",
                    extent=(-0.5 * width, (ncol - 0.5) * width, len(rows) - 0.5, -0.5))
    fig.colorbar(im, ax=ax1, label="own step time (ms, median)")
    ax1.set_yticks(range(len(rows)), [f"rank {r}" for r in rows])
    for k, sd in enumerate(stragglers):
        if sd["rank"] in rows:
            y = rows.index(sd["rank"])
            a, b = sd["window"]
            ax1.add_patch(Rectangle((a - 0.5, y - 0.5), b - a + 1, 1, fill=False, ec="red", lw=2,
                                    label="straggler" if k == 0 else None))
    marked = [(d["step"], rows.index(r)) for d in divergences for r in d["ranks"] if r in rows]
    if marked:
        ax1.scatter([s for s, _ in marked], [y for _, y in marked], marker="X", s=90, c="red", edgecolors="white",
                    linewidths=0.8, zorder=3, label="state diverged (docs/sdc.md)")
    if stragglers or marked:
        ax1.legend(loc="upper right", fontsize=7)
    ax1.set_title("per-rank step time (the rank's own time; stragglers boxed, state divergences marked)", fontsize=9)
    for r in rows:
        xs = sorted(ranks[r].loss)
        ys = _drawable([ranks[r].loss[x] for x in xs])
        ax2.plot(xs, ys, lw=0.9, label=f"rank {r}")
    ax2.set_xlim(ax1.get_xlim())
    ax2.set_ylabel("loss")
    ax2.set_xlabel("step")
    ax2.grid(alpha=0.3)
    ax2.legend(loc="upper right", fontsize=7, ncol=4)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=96)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def write_run_dir_report(path: str | os.PathLike, out: str | os.PathLike, *, trust: TrustPolicy | None = None,
                         partial: bool = False, **trust_options: Any) -> Any:
    """The page for a distributed run's folder: every rank verified, anchored and replayed, straggler windows
    recomputed; a per-rank step-time heatmap with stragglers boxed, per-rank loss curves, the ranks, stragglers,
    differences, and the shards of every sharded checkpoint. Nothing is written for a folder that does not verify.
    ``partial``: a folder with ranks missing is shown as far as the ranks present go, labelled PARTIAL at the top."""
    import statistics

    from trainledger.audit import replay_run_dir

    plt = _matplotlib()
    ranks: dict[int, _RankSeries] = {}
    policy = TrustPolicy.of(trust, **trust_options)
    rec = replay_run_dir(path, trust=policy, partial=partial,
                         observe=lambda r, ev: ranks.setdefault(r, _RankSeries()).apply(ev))
    png, plot_error = None, None
    if any(x.loss for x in ranks.values()):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                png = _run_dir_figure(plt, ranks, rec.stragglers, rec.divergences)
        except (ValueError, OverflowError, RuntimeError, Warning) as e:
            plot_error = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    v = rec.verify
    ok = ("<span class=ok>every recorded conclusion follows from the observations</span>" if rec.ok else
          f"<span class=bad>{len(rec.differences)} recorded conclusion(s) differ from the recomputation</span>")
    tag = " (PARTIAL)" if v.partial else ""
    parts = [f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>trainledger report {_e(v.path)}{tag}"
             f"</title><style>{_CSS}</style></head><body>",
             f"<h1>Run folder {_e(Path(v.path).name)}{tag}</h1><p class=muted>trainledger {__version__} report</p><dl>",
             f"<dt>folder</dt><dd>{_e(v.path)}</dd>",
             "<dt>verification</dt><dd>" + (
                 f"<span class=bad>PARTIAL</span> {len(v.ranks)} of {v.world_size} ranks verified; no journal for "
                 f"rank(s) {_e(', '.join(map(str, v.missing[:50])))}{' ...' if len(v.missing) > 50 else ''}: this "
                 "page covers only the ranks present, and nothing checks that the missing ones agree"
                 if v.partial else f"<span class=ok>VERIFIED</span> {len(v.ranks)} of {v.world_size} ranks") +
             f", {v.anchors} cross-rank anchors hold; keys bound to ranks by {_e(v.keys_binding(policy.roster))}</dd>",
             f"<dt>replay</dt><dd>{ok}</dd>",
             f"<dt>stragglers</dt><dd>{len(rec.stragglers)} flagged</dd>",
             "<dt>replicas' state</dt><dd>" + (f"<span class=bad>{len(rec.divergences)} divergence(s)</span>"
                                                 if rec.divergences else "no divergence recorded or recomputed")
             + "</dd></dl>"]
    if rec.differences:
        parts.append("<h2>Differences from the recomputation</h2>")
        parts.append(_table(["rank", "seq", "kind", "detail"],
                            [[d["rank"], d["seq"], d["kind"], d["detail"]] for d in rec.differences], ""))
    parts.append("<h2>Ranks</h2>")
    rows = []
    for r, one in sorted(rec.ranks.items()):
        rs, vr = ranks.get(r, _RankSeries()), v.ranks[r]
        h = one.health or {}
        times = list(rs.time.values())
        rows.append([r, rs.node or "-", f"{vr.events:,}", vr.key_id, vr.tail, h.get("steps", 0),
                     sum(len(x) for x in one.anomalies_by_kind.values()),
                     f"{rs.loss[max(rs.loss)]:.4f}" if rs.loss else "-",
                     f"{statistics.median(times) * 1e3:.2f}" if times else "-",
                     f"{h['tokens_per_s']:,.0f}" if h.get("tokens_per_s") else "-", len(rs.resumes),
                     rs.telemetry or (f"{len(rs.devices)} device(s) sampled" if rs.devices else "-")])
    parts.append(_table(["rank", "node", "events", "key", "tail", "steps", "anomalies", "last loss",
                         "own step time (ms, median)", "tokens/s", "resumes", "telemetry"], rows, "no ranks"))
    parts.append("<h2>Curves</h2>")
    if png:
        parts.append(f'<img alt="per-rank step time heatmap and loss curves" src="data:image/png;base64,{png}">')
    elif plot_error:
        parts.append(f"<p class=bad>the curves could not be drawn: {_e(plot_error)}</p>")
    else:
        parts.append("<p class=muted>no step observations in these journals</p>")
    parts.append("<h2>Stragglers</h2>")
    parts.append(_table(["seq", "rank", "node", "score", "steps"],
                        [[x["seq"], x["rank"], x["node"] or "-", f"{x['score']:.3f}", f"{x['window'][0]}-{x['window'][1]}"]
                         for x in rec.stragglers], "no straggler flagged"))
    parts.append("<h2>Silent data corruption</h2>")
    parts.append(_table(["step", "ranks", "of replicas", "tensor", "majority"],
                        [[d["step"], ", ".join(map(str, d["ranks"])), d["replicas"], d["tensor"] or "-",
                          "yes" if d["majority"] else "none (every rank named)"] for d in rec.divergences],
                        "the replicas' fingerprints never disagreed (or none were recorded)"))
    checks = [[r, n] for r, one in sorted(rec.ranks.items()) for n in one.notes if n.startswith("replay check")]
    if checks:
        parts.append(_table(["rank", "replay check"], checks, ""))
    anomalies = [[r, k, len(st), one.anomaly_steps(k, 20)]
                 for r, one in sorted(rec.ranks.items()) for k, st in sorted(one.anomalies_by_kind.items())]
    parts.append("<h2>Anomalies</h2>")
    parts.append(_table(["rank", "anomaly", "count", "steps"], anomalies, "no anomalies"))
    parts.append("<h2>Sharded checkpoints</h2>")
    by_path: dict[str, dict[int, Any]] = {}
    for r, rs in ranks.items():
        for sh in rs.shards:
            by_path.setdefault(sh.path, {})[r] = sh
    restored = {e.checkpoint for rs in ranks.values() for e in rs.resumes}
    srows = []
    for p_, recs in sorted(by_path.items(), key=lambda kv: (next(iter(kv[1].values())).step, kv[0])):
        any_ = next(iter(recs.values()))
        meta = recs.get(0)
        srows.append([any_.step, p_, f"{len(recs)} of {any_.world_size}",
                      "yes" if len(recs) >= any_.world_size else "NO",
                      sum(len(x.files) for x in recs.values()),
                      f"{sum(f['bytes'] for x in recs.values() for f in x.files) / 2**20:.2f}",
                      (meta.metadata_sha256 or "")[:16] if meta else "-",
                      (meta.save_id or "-") if meta else "-", "yes" if p_ in restored else ""])
    parts.append(_table(["step", "folder", "ranks recorded", "complete", "shard files", "MiB", ".metadata sha256",
                         "DCP save id", "restored"], srows, "no sharded checkpoints"))
    srows = [[r, sh.step, sh.path, f["file"], f"{f['bytes']:,}", f["sha256"][:16]]
             for r, rs in sorted(ranks.items()) for sh in rs.shards for f in sh.files]
    parts.append("<details><summary>every shard file</summary>"
                 + _table(["rank", "step", "folder", "file", "bytes", "sha256"], srows, "none") + "</details>")
    parts.append("</body></html>\n")
    _write_atomic(Path(out), "".join(parts))
    return rec
