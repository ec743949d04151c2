"""Model FLOPs and MFU: the one implementation the health fold, the report, replay's ladder audit, the ladder
runner and ``training.flops.FlopConfig`` share (the SQL ``mfu`` view spells the same formula; a test holds it to
this one).

PaLM (Chowdhery et al. 2022), appendix B: a training step costs ``6N + 12·L·H·Q·T`` FLOPs per token, N the
parameters without position embeddings, L layers, H heads of size Q, T the sequence length. MFU is the model
FLOPs of the step over its time, over the peak of every device.
"""

from __future__ import annotations

from typing import Any

__all__ = ["model_flops_per_token", "MfuAccounting", "ComputeTotals", "record_compute", "carried_by", "SETTINGS"]


def model_flops_per_token(n_params: int, n_layer: int, n_head: int, head_dim: int, seq_len: int,
                          attention: str | None = None) -> int:
    """PaLM appendix B: 6N + 12·L·H·Q·T; with ``attention="causal"`` (format 1.10's ``attention_convention``) the
    attention term is halved, 6N + 6·L·H·Q·T: only the scores a causal mask keeps."""
    return 6 * n_params + (6 if attention == "causal" else 12) * n_layer * n_head * head_dim * seq_len


class MfuAccounting:
    """MFU per step under one ``run_configured`` (anything with its FLOP-shape, peak and devices fields)."""

    __slots__ = ("fpt", "peak", "seq_len")

    def __init__(self, config: Any) -> None:
        c = config
        self.fpt = (model_flops_per_token(c.n_params, c.n_layer, c.n_head, c.head_dim, c.seq_len,
                                          getattr(c, "attention_convention", None))
                    if c.n_params is not None else None)
        self.peak = c.peak_flops_per_sec * c.devices if c.peak_flops_per_sec is not None else None
        self.seq_len = c.seq_len

    def step(self, tokens: int | None, examples: int | None, step_time_s: float | None) -> float | None:
        """The step's MFU: ``None`` without a FLOP shape, a peak, a positive finite step time, or a token count
        (``tokens``, else ``examples × seq_len``)."""
        fpt, peak = self.fpt, self.peak
        if fpt is None or peak is None or step_time_s is None or not 0 < step_time_s < float("inf"):
            return None
        if tokens is None:
            if examples is None or self.seq_len is None:
                return None
            tokens = examples * self.seq_len
        return fpt * tokens / step_time_s / peak


_INF = float("inf")

#: format 1.10's ``run_configured`` fields that move a compute statement (docs/compute.md), carried into each
#: ``compute_totaled.hardware`` entry they apply to
#: (the last four are the accelerator's: ``device_settings=``, read from NVML)
DEVICE_SETTINGS = ("device_variant", "pci_device_id", "variant_source", "power_limit_w")
SETTINGS = ("recompute_ratio", "attention_convention", *DEVICE_SETTINGS)


def _settings(config: Any) -> tuple | None:
    """A ``run_configured``'s 1.10 compute settings, or None where it records none of them (every journal before
    1.10: its totals stay as they were written)."""
    values = tuple(getattr(config, k, None) for k in SETTINGS)
    return None if all(v is None for v in values) else values


class ComputeTotals:
    """The training compute a journal's steps add up to (``compute_totaled``): one fold, for the writer that records
    the figure and for replay that recomputes it. Integers throughout (tokens, FLOPs, nanoseconds, millijoules);
    floats only in the event.

    Format 1.7 adds what the compute statement needs (:mod:`trainledger.journal.statements.compute`): the busy time, the
    steps by hardware (devices, peak and its source, device kind), the journal's first and last timestamps, energy
    from NVML's counter and from power samples, and the thresholds the ``run_configured`` in force watches: after
    every step with tokens, each threshold not yet crossed that the running total (plus ``carried_flops``) has
    reached is crossed at that step (:attr:`crossed`). Format 1.8 adds to the total the thresholds watched, the
    carry and the names crossed, so that a statement's crossings can be shown whole. A journal of an earlier format
    (its ``run_opened`` says so) is totalled as it was written."""

    __slots__ = ("steps", "tokens", "flops", "last_step", "steps_without_tokens", "tokens_without_shape", "_fpt",
                 "_six_n", "_seq_len", "full", "busy_ns", "steps_without_time", "_groups", "_group", "started_ns", "ended_ns",
                 "energy_mj", "energy_ns", "energy_pairs", "energy_resets", "power_j", "power_ns", "power_pairs",
                 "_samples", "_thresholds", "_carried", "_next", "crossed_names", "crossed", "watched")

    def __init__(self) -> None:
        self.steps = self.tokens = self.flops = self.steps_without_tokens = self.tokens_without_shape = 0
        self.last_step: int | None = None
        self._fpt: int | None = None
        self._six_n: int | None = None  # 6N of a run_configured with format 1.10's settings (the 6ND method)
        self._seq_len: int | None = None
        #: whether the event carries format 1.7's fields (a run_opened of an earlier format turns it off)
        self.full = True
        #: whether it carries 1.8's (the thresholds watched, the carry and the crossings)
        self.watched = True
        self.busy_ns = self.steps_without_time = 0
        #: (devices, peak, source, kind, 1.10's settings or None) -> [steps, busy ns, model FLOPs, 6ND FLOPs]
        self._groups: dict[tuple, list[int]] = {}
        self._group: list[int] | None = None
        self.started_ns: int | None = None
        self.ended_ns: int | None = None
        self.energy_mj = self.energy_ns = self.energy_pairs = self.energy_resets = 0
        self.power_j = 0.0
        self.power_ns = self.power_pairs = 0
        self._samples: dict[int, tuple[int, int | None, float | None]] = {}
        self._thresholds: list[tuple[float, str]] = []
        self._carried = 0.0
        self._next: float | None = None
        self.crossed_names: set[str] = set()
        #: the crossings this fold found, in order: (seq of the step, ComputeThresholdCrossed)
        self.crossed: list[tuple[int, Any]] = []

    def open(self, opened: Any) -> None:
        """The journal's ``run_opened``: when it started, and whether its format has 1.7's fields."""
        from trainledger.journal.chain import format_at_least

        if self.started_ns is None:
            self.started_ns = opened.ts
        self.full = format_at_least(opened.format_version, (1, 7))
        self.watched = format_at_least(opened.format_version, (1, 8))

    def configure(self, config: Any) -> None:
        """A ``run_configured``: the steps after it are counted under its FLOP shape, hardware and thresholds."""
        self._fpt = MfuAccounting(config).fpt
        self._seq_len = config.seq_len
        settings = _settings(config)
        self._six_n = 6 * config.n_params if settings is not None and config.n_params is not None else None
        key = (config.devices, config.peak_flops_per_sec, config.peak_source, getattr(config, "device_kind", None),
               settings)
        self._group = self._groups.setdefault(key, [0, 0, 0, 0])
        self._thresholds = sorted((float(v), k) for k, v in getattr(config, "compute_thresholds", {}).items())
        self._carried = float(getattr(config, "carried_flops", 0.0))
        self._set_next()

    @property
    def carried(self) -> float:
        """The model FLOPs of earlier runs the ``run_configured`` in force declares (``carried_flops``)."""
        return self._carried

    def _set_next(self) -> None:
        self._next = next((v for v, k in self._thresholds if k not in self.crossed_names), None)

    def _cross(self, step: Any) -> None:
        """The thresholds the running total has reached after ``step``, crossed there."""
        from trainledger.training.kinds import ComputeThresholdCrossed

        total = float(self.flops) + self._carried
        for v, k in self._thresholds:
            if k not in self.crossed_names and total >= v:
                self.crossed_names.add(k)
                self.crossed.append((getattr(step, "seq", None), ComputeThresholdCrossed(
                    name=k, threshold=v, step=step.step, flops=total, carried_flops=self._carried)))
        self._set_next()

    def _default_group(self) -> list[int]:
        g = self._group = self._groups.setdefault((1, None, None, None, None), [0, 0, 0, 0])
        return g

    def add(self, step: Any) -> None:
        """A ``step_observed``."""
        self.steps += 1
        self.last_step = step.step
        self.ended_ns = getattr(step, "ts", None)  # a record's (the live monitor's own events have none)
        g = self._group or self._default_group()
        g[0] += 1
        st = step.step_time_s
        ns = int(st * 1e9) if st is not None and 0 < st < _INF else 0
        if ns:
            self.busy_ns += ns
            g[1] += ns
        else:
            self.steps_without_time += 1
        t = step.tokens
        if t is None and step.examples is not None and self._seq_len is not None:
            t = step.examples * self._seq_len
        if t is None:
            self.steps_without_tokens += 1
            return
        self.tokens += t
        if self._fpt is None:
            self.tokens_without_shape += t
        else:
            self.flops += self._fpt * t
            if self._six_n is not None:
                g[2] += self._fpt * t
                g[3] += self._six_n * t
            if self._next is not None and float(self.flops) + self._carried >= self._next:
                self._cross(step)

    def watch(self, step: Any) -> None:
        """The live monitor's part of :meth:`add`: only the running FLOPs and the thresholds they cross (the same
        arithmetic and test), for a fold seeded from the journal whose other totals nobody reads."""
        if self._next is None:  # nothing left to cross under this run_configured: nothing to track
            return
        t = step.tokens
        if t is None:
            if step.examples is None or self._seq_len is None:
                return
            t = step.examples * self._seq_len
        if self._fpt is not None:
            self.flops += self._fpt * t
            if float(self.flops) + self._carried >= self._next:
                self._cross(step)

    def add_run(self, steps: int, last_step: int, tokens: int, without_tokens: int, busy: int = 0,
                without_time: int | None = None, events: Any = None, lo: int = 0) -> None:
        """``steps`` step records at once (replay's run in C): ``tokens`` the sum of their token counts,
        ``without_tokens`` how many had none (none of them counted by examples: those take :meth:`add`), ``busy``
        their busy nanoseconds and ``without_time`` how many had none; ``events[lo:lo + steps]`` the records
        themselves. A run that crosses a threshold is folded step by step (:meth:`add`), to find the step."""
        if events is not None and self._next is not None and self._fpt is not None \
                and float(self.flops + self._fpt * tokens) + self._carried >= self._next:
            for k in range(lo, lo + steps):
                self.add(events[k])
            return
        self.steps += steps
        self.last_step = last_step
        if events is not None and steps:
            self.ended_ns = events[lo + steps - 1].ts
        g = self._group or self._default_group()
        g[0] += steps
        g[1] += busy
        self.busy_ns += busy
        self.steps_without_time += steps if without_time is None else without_time
        self.steps_without_tokens += without_tokens
        self.tokens += tokens
        if self._fpt is None:
            self.tokens_without_shape += tokens
        else:
            self.flops += self._fpt * tokens
            if self._six_n is not None:
                g[2] += self._fpt * tokens
                g[3] += self._six_n * tokens

    def sample(self, ev: Any) -> None:
        """A ``device_sampled``: the energy between it and the device's previous sample, from NVML's counter (a
        fall is a reset: counted, the interval not), else the trapezoid of the two power readings."""
        prev = self._samples.get(ev.device)
        e1, p1 = getattr(ev, "energy_mj", None), ev.power_w
        if p1 is not None and not 0 <= p1 < _INF:
            p1 = None
        self._samples[ev.device] = (ev.ts, e1, p1)
        if prev is None:
            return
        t0, e0, p0 = prev
        dt = ev.ts - t0
        if dt <= 0:
            return
        if e0 is not None and e1 is not None:
            if e1 >= e0:
                self.energy_mj += e1 - e0
                self.energy_ns += dt
                self.energy_pairs += 1
                return
            self.energy_resets += 1
        if p0 is not None and p1 is not None:
            self.power_j += (p0 + p1) / 2 * (dt / 1e9)
            self.power_ns += dt
            self.power_pairs += 1

    def hardware(self) -> list[dict[str, Any]]:
        """The steps by the hardware they ran on (groups with steps, in order of first use); under a
        ``run_configured`` with format 1.10's compute settings, those settings too, and the group's model FLOPs
        and its 6·N·D FLOPs (the guidelines' architecture method)."""
        out = []
        for (d, p, s, k, settings), (n, ns, flops, six_nd) in self._groups.items():
            if not n:
                continue
            h: dict[str, Any] = {"devices": d, "peak_flops_per_sec": p, "peak_source": s, "device_kind": k,
                                 "steps": n, "busy_s": ns / 1e9}
            if settings is not None:
                h.update(zip(SETTINGS, settings))
                h.update(flops=float(flops), six_nd_flops=float(six_nd))
            out.append(h)
        return out

    def event(self) -> Any:
        from trainledger.training.kinds import ComputeTotaled

        base = dict(steps=self.steps, tokens=self.tokens, flops=float(self.flops), last_step=self.last_step,
                    steps_without_tokens=self.steps_without_tokens, tokens_without_shape=self.tokens_without_shape)
        if not self.full:
            return ComputeTotaled(**base)
        if self.watched:
            base.update(thresholds={k: v for v, k in sorted(self._thresholds, key=lambda t: t[1])},
                        carried_flops=self._carried, crossed=[c.name for _, c in self.crossed])
        return ComputeTotaled(**base, busy_s=self.busy_ns / 1e9, steps_without_time=self.steps_without_time,
                              hardware=self.hardware(), started_ns=self.started_ns, ended_ns=self.ended_ns,
                              energy_j=self.energy_mj / 1000 if self.energy_pairs else None,
                              energy_s=self.energy_ns / 1e9, energy_resets=self.energy_resets,
                              power_j=self.power_j if self.power_pairs else None, power_s=self.power_ns / 1e9)

    def fold(self, events: Any) -> ComputeTotals:
        from trainledger.journal.events import RunOpened, StepObserved
        from trainledger.training.kinds import DeviceSampled, RunConfigured

        for ev in events:
            if isinstance(ev, StepObserved):
                self.add(ev)
            elif isinstance(ev, RunConfigured):
                self.configure(ev)
            elif isinstance(ev, DeviceSampled):
                self.sample(ev)
            elif isinstance(ev, RunOpened):
                self.open(ev)
        return self


def carried_by(history: Any) -> float:
    """The model FLOPs a run continued from a finished one counts toward its thresholds (``carried_flops``): what
    the finished run's signed events ``history`` spent, plus what that run carried itself."""
    done = ComputeTotals().fold(history)
    return float(done.flops) + done.carried


def record_compute(journal: Any) -> Any:
    """Append ``compute_totaled`` for everything ``journal`` (an open :class:`~trainledger.journal.writer.Journal`) holds, sealed
    and fsynced; return the event. The figure is folded from the journal as written (its signed lines, read back
    after a durable seal), so that a run resumed from a checkpoint, whose process saw only its own steps, still
    totals them all. Call it just before ``close()``; it reads the whole journal (what replay reads)."""
    from trainledger.journal.reader import read_event_batches, read_signed_events

    journal.seal(durable=True, signed=True)  # what is read back (or proven) next must be signed already
    totals = ComputeTotals()
    pub = journal.public_key
    if pub is not None:
        totals.fold(read_signed_events(journal.path, [pub]))
    else:
        for batch in read_event_batches(journal.path):
            totals.fold(batch)
    ev = totals.event()
    journal.append(ev, durable=True)
    return ev
