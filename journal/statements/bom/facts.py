"""The numbers a model's documents state, as facts: each a value and the signed lines it is computed from (journal,
seq, field), with the operations that compute it. Every fact's value is :func:`value_of` its sources and
operations, so what the proof pack states of a fact is how it was computed; ``verify-bom`` collects the facts again
from the proven lines alone.

A fold over verified events (:func:`collect`), no I/O. Facts are only taken from events replay recomputes or from
observations signed as they were made; which is which is kept (``reproduced``: a conclusion replay recomputed, a gate
verdict; ``attested``: what the trainer signed, an evaluation's metrics, a configuration)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import msgspec

__all__ = ["Fact", "collect", "value_of", "OPS", "GATE_METRICS"]

#: the operations a fact may apply to its sources' values, in order: ``sum`` (of every source), ``kwh`` (joules to
#: kilowatt-hours), ``hours`` (seconds to hours), ``first`` (the one source)
OPS = ("first", "sum", "kwh", "hours")

#: a gate's bar and the measured value it holds: ``max_final_loss`` holds ``final_loss`` at most, ``min_mfu_mean``
#: holds ``mfu_mean`` at least (ladder/outcome.py's bars)
GATE_METRICS = {"max_": "<=", "min_": ">="}


@dataclasses.dataclass(frozen=True)
class Fact:
    """One number (or digest) a document states: ``sources`` as (journal index, seq, field path with ``/``),
    ``ops`` applied in order, ``value`` what they give, ``basis`` ``reproduced`` or ``attested``."""

    name: str
    value: Any
    sources: tuple[tuple[int, int, str], ...]
    ops: tuple[str, ...] = ("first",)
    basis: str = "attested"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "value": self.value, "sources": [list(s) for s in self.sources],
                "ops": list(self.ops), "basis": self.basis}


def _path(*parts: str) -> str:
    """A field path into an event's fields: its parts joined by ``/``, each escaped as a JSON pointer's (``~0``,
    ``~1``), so that a metric named ``eval/loss`` is one part."""
    return "/".join(x.replace("~", "~0").replace("/", "~1") for x in parts)


def _get(record: dict[str, Any], path: str) -> Any:
    cur: Any = record
    for part in path.split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(cur, dict) or part not in cur:
            raise KeyError(path)
        cur = cur[part]
    return cur


def value_of(sources: Any, ops: Any, lines: dict[tuple[int, int], dict[str, Any]]) -> Any:
    """A fact's value from ``lines`` ({(journal index, seq): the event's fields}); ``KeyError`` for a source that
    is not among them or a field it lacks, ``ValueError`` for an operation not in :data:`OPS`."""
    vals = [_get(lines[(int(j), int(s))], str(f)) for j, s, f in sources]
    out: Any = vals
    for op in ops:
        if op == "first":
            if len(out) != 1:
                raise ValueError(f"'first' of {len(out)} values")
            out = out[0]
        elif op == "sum":
            out = math.fsum(v for v in out if v is not None) if any(isinstance(v, float) for v in out) \
                else sum(v for v in out if v is not None)
        elif op == "kwh":
            out = out / 3.6e6
        elif op == "hours":
            out = out / 3600.0
        else:
            raise ValueError(f"an operation {op!r} not in {OPS}")
    return out


def _fields(ev: Any) -> dict[str, Any]:
    d = msgspec.to_builtins(ev)
    d.setdefault("seq", ev.seq)
    return d


def _tag(ev: Any) -> str:
    return type(ev).__struct_config__.tag


@dataclasses.dataclass
class Collected:
    """What :func:`collect` found: the facts by name, the lines they rest on ({(journal, seq): fields}), and per run
    its name, whether it fine-tuned a released model, and the names of its compute facts; the gates, evaluations
    and hyperparameters a document lists; the model (the last run's export)."""

    facts: dict[str, Fact]
    lines: dict[tuple[int, int], dict[str, Any]]
    runs: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    gates: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    evaluations: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    hyperparameters: list[str] = dataclasses.field(default_factory=list)

    @property
    def run(self) -> str | None:
        """The run that made the model (the last one named)."""
        return self.runs[-1]["run"] if self.runs else None

    @property
    def fine_tune(self) -> bool:
        return bool(self.runs) and self.runs[-1]["fine_tune"]


def collect(runs: list[list[list[Any]]]) -> Collected:
    """The facts of a model's runs, in lifecycle order (pre-training, then what continued or fine-tuned it), from
    each run's journals' verified events (``runs[r][0]``: rank 0's, or the run's one journal); journals are numbered
    across runs in that order. Per run: its compute (every journal's last ``compute_totaled``: FLOPs, tokens,
    energy; rank 0's steps and time in steps) and whether it fine-tuned a released model (its ``model_exported``
    names a base); of every run, its gate verdicts (metric, threshold, passed: ``reproduced``, replay recomputes
    them) and its evaluations (``evaluation_recorded``'s metrics: ``attested``); of the last run, the one that made
    the model, its shape and hyperparameters (its last ``run_configured`` before its total, every scalar of its
    ``config_logged``) and its model (its last ``model_exported``: digest and base model)."""
    out = Collected({}, {})
    g = 0
    for r, journals in enumerate(runs):
        _collect_run(out, r, journals, g, last=r == len(runs) - 1)
        g += len(journals)
    return out


def _collect_run(out: Collected, r: int, journals: list[list[Any]], g0: int, *, last: bool) -> None:
    facts, lines = out.facts, out.lines
    p = f"run{r}:"

    def add(name: str, sources: list[tuple[int, Any, str]], ops: tuple[str, ...] = ("first",),
            basis: str = "attested") -> None:
        for j, ev, _ in sources:
            lines[(j, ev.seq)] = _fields(ev)
        refs = tuple((j, ev.seq, f) for j, ev, f in sources)
        facts[name] = Fact(name, value_of(refs, ops, lines), refs, ops, basis)

    info: dict[str, Any] = {"run": None, "fine_tune": False, "journals": list(range(g0, g0 + len(journals)))}
    out.runs.append(info)
    totals: list[tuple[int, Any]] = []
    for k, events in enumerate(journals):
        tot = None
        for ev in events:
            if _tag(ev) == "compute_totaled":
                tot = ev
        if tot is not None:
            totals.append((g0 + k, tot))
    if totals:
        add(p + "training_flops", [(j, t, "flops") for j, t in totals], ("sum",), "reproduced")
        add(p + "tokens", [(j, t, "tokens") for j, t in totals], ("sum",), "reproduced")
        j0, t0 = totals[0]
        add(p + "steps", [(j0, t0, "steps")], basis="reproduced")
        if t0.busy_s is not None:
            add(p + "training_hours", [(j0, t0, "busy_s")], ("first", "hours"), "reproduced")
        energy = [(j, t, f) for j, t in totals for f in ("energy_j", "power_j") if getattr(t, f) is not None]
        if energy:
            add(p + "energy_kwh", energy, ("sum", "kwh"), "reproduced")
    rank0 = journals[0] if journals else []
    config = None
    model = None
    for ev in rank0:
        tag = _tag(ev)
        if tag == "run_opened" and info["run"] is None:
            info["run"] = ev.run_id
        elif tag == "rank_joined":
            info["run"] = ev.run
        elif tag == "run_configured" and (not totals or ev.seq < totals[0][1].seq):
            config = ev
        elif tag == "config_logged" and last:
            for k, v in sorted((getattr(ev, "config", None) or {}).items()):
                if "/" not in k and isinstance(v, (bool, int, float, str)) \
                        and not (isinstance(v, float) and not math.isfinite(v)):
                    name = f"hyperparameter:{k}"
                    add(name, [(g0, ev, _path("config", k))])
                    if name not in out.hyperparameters:
                        out.hyperparameters.append(name)
        elif tag == "gate_verdict":
            gate = {"run": r, "rung": ev.rung, "passed": f"{p}gate:{ev.rung}:passed", "metrics": []}
            add(gate["passed"], [(g0, ev, "passed")], basis="reproduced")
            for bar, threshold in sorted(ev.bars.items()):
                prefix, metric = bar[:4], bar[4:]
                if threshold is None or prefix not in GATE_METRICS or metric not in ev.measured:
                    continue
                m = f"{p}gate:{ev.rung}:{metric}"
                add(m, [(g0, ev, _path("measured", metric))], basis="reproduced")
                add(m + ":threshold", [(g0, ev, _path("bars", bar))], basis="reproduced")
                gate["metrics"].append({"metric": metric, "comparator": GATE_METRICS[prefix], "value": m,
                                        "threshold": m + ":threshold"})
            out.gates.append(gate)
        elif tag == "evaluation_recorded":
            e = {"run": r, "hook": ev.hook, "role": ev.role, "step": ev.step,
                 "cases": f"{p}eval:{ev.hook}:{ev.step}:cases", "metrics": []}
            add(e["cases"], [(g0, ev, "cases")])
            for k, v in sorted(ev.metrics.items()):
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                    name = f"{p}eval:{ev.hook}:{ev.step}:{k}"
                    add(name, [(g0, ev, _path("metrics", k))])
                    e["metrics"].append({"metric": k, "value": name})
            out.evaluations.append(e)
        elif tag == "model_exported":
            model = ev
    if model is not None and model.base is not None:
        info["fine_tune"] = True
    if not last:
        return
    if config is not None:
        for f in ("n_params", "n_layer", "n_head", "head_dim", "seq_len"):
            if getattr(config, f) is not None:
                add(f"shape:{f}", [(g0, config, f)])
    if model is not None:
        add("model_digest", [(g0, model, "digest")])
        if model.base is not None:
            add("base_model_digest", [(g0, model, "base")])
