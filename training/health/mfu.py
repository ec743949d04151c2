"""Model FLOPs and MFU: the one implementation the health fold, the report, replay's ladder audit, the ladder
runner and ``training.flops.FlopConfig`` share (the SQL ``mfu`` view spells the same formula; a test holds it to
this one).

PaLM (Chowdhery et al. 2022), appendix B: a training step costs ``6N + 12·L·H·Q·T`` FLOPs per token, N the
parameters without position embeddings, L layers, H heads of size Q, T the sequence length. MFU is the model
FLOPs of the step over its time, over the peak of every device.
"""

from __future__ import annotations

from typing import Any

__all__ = ["model_flops_per_token", "MfuAccounting", "ComputeTotals", "record_compute"]


def model_flops_per_token(n_params: int, n_layer: int, n_head: int, head_dim: int, seq_len: int) -> int:
    """PaLM appendix B: 6N + 12·L·H·Q·T."""
    return 6 * n_params + 12 * n_layer * n_head * head_dim * seq_len


class MfuAccounting:
    """MFU per step under one ``run_configured`` (anything with its FLOP-shape, peak and devices fields)."""

    __slots__ = ("fpt", "peak", "seq_len")

    def __init__(self, config: Any) -> None:
        c = config
        self.fpt = (model_flops_per_token(c.n_params, c.n_layer, c.n_head, c.head_dim, c.seq_len)
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


class ComputeTotals:
    """The training compute a journal's steps add up to (``compute_totaled``): one fold, for the writer that records
    the figure and for replay that recomputes it. Integers throughout; ``flops`` becomes a float only in the
    event."""

    __slots__ = ("steps", "tokens", "flops", "last_step", "steps_without_tokens", "tokens_without_shape", "_fpt",
                 "_seq_len")

    def __init__(self) -> None:
        self.steps = self.tokens = self.flops = self.steps_without_tokens = self.tokens_without_shape = 0
        self.last_step: int | None = None
        self._fpt: int | None = None
        self._seq_len: int | None = None

    def configure(self, config: Any) -> None:
        """A ``run_configured``: the steps after it are counted under its FLOP shape."""
        self._fpt = MfuAccounting(config).fpt
        self._seq_len = config.seq_len

    def add(self, step: Any) -> None:
        """A ``step_observed``."""
        self.steps += 1
        self.last_step = step.step
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

    def add_run(self, steps: int, last_step: int, tokens: int, without_tokens: int) -> None:
        """``steps`` step records at once (replay's run in C): ``tokens`` the sum of their token counts,
        ``without_tokens`` how many had none (none of them counted by examples: those take :meth:`add`)."""
        self.steps += steps
        self.last_step = last_step
        self.steps_without_tokens += without_tokens
        self.tokens += tokens
        if self._fpt is None:
            self.tokens_without_shape += tokens
        else:
            self.flops += self._fpt * tokens

    def event(self) -> Any:
        from trainledger.journal.kinds import ComputeTotaled

        return ComputeTotaled(steps=self.steps, tokens=self.tokens, flops=float(self.flops), last_step=self.last_step,
                              steps_without_tokens=self.steps_without_tokens,
                              tokens_without_shape=self.tokens_without_shape)

    def fold(self, events: Any) -> ComputeTotals:
        from trainledger.journal.events import StepObserved
        from trainledger.journal.kinds import RunConfigured

        for ev in events:
            if isinstance(ev, StepObserved):
                self.add(ev)
            elif isinstance(ev, RunConfigured):
                self.configure(ev)
        return self


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
