"""trainledger watch: follow a journal while a run writes it, with a live summary.

Reads complete lines as they are appended (a torn last line waits for its
newline), checks each against the chain and every seal's signature under the
pinned key (with no key pinned: the chain only, and the view says so; the
same trust options as ``verify``), folds steps and anomalies through
the health projection, and redraws: step, loss, grad norm, tokens/s, MFU,
last anomaly, last checkpoint, seal lag. Exits when the run closes (0), on
Ctrl-C (130), or at the first line that does not check out (1, with the
same one-line FAIL as ``verify``). On a terminal the view redraws in place; otherwise it prints
one line per refresh.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from . import codec, health, kinds  # noqa: F401 - registers the kinds the view shows
from ._scan import RangeResult, ScanContext, Scanner
from ._text import safe
from .chain import genesis
from .errors import IntegrityError
from .events import RunClosed, Seal, StepObserved
from .health import AnomalyDetected, HealthProjection, RunConfigured
from .keys import PublicKey
from .kinds import CheckpointSaved
from .verify import _open_checked, _read_opening, resolve_key

__all__ = ["watch"]


class _View:
    def __init__(self, trust: str = "") -> None:
        self.trust = trust
        self.proj = HealthProjection()
        self.step: StepObserved | None = None
        self.anomaly: AnomalyDetected | None = None
        self.checkpoint: CheckpointSaved | None = None
        self.events = 0
        self.last_seal_seq = -1
        self.last_seq = -1
        self.closed = False

    def apply(self, ev: Any) -> None:
        self.events += 1
        self.last_seq = ev.seq
        if isinstance(ev, RunConfigured):
            self.proj = HealthProjection(ev)
        elif isinstance(ev, StepObserved):
            self.step = ev
            self.proj.apply(ev)
        elif isinstance(ev, AnomalyDetected):
            self.anomaly = ev
        elif isinstance(ev, CheckpointSaved):
            self.checkpoint = ev
        elif isinstance(ev, Seal):
            self.last_seal_seq = ev.seq
        elif isinstance(ev, RunClosed):
            self.closed = True
        else:
            self.proj.apply(ev)

    def lines(self, path: Path) -> list[str]:
        r = self.proj.report()
        s = self.step
        mfu = r["mfu"]["mean"]
        out = [f"trainledger watch  {path}  ({self.events:,} events{', closed' if self.closed else ''}; "
               f"{self.trust})"]
        if s is None:
            out.append("  no steps yet")
        else:
            gn = "-" if s.grad_norm is None else f"{s.grad_norm:.4g}"
            tps = r["tokens_per_s"]
            out.append(f"  step {s.step}  loss {s.loss:.4f}  grad norm {gn}  tokens/s "
                       f"{'-' if tps is None else f'{tps:,.0f}'}  MFU {'-' if mfu is None else f'{mfu:.3%}'}")
        a = self.anomaly
        out.append("  last anomaly: " + ("none" if a is None else f"{a.kind} at step {a.step} (z {a.z_score})"))
        c = self.checkpoint
        out.append("  last checkpoint: " + ("none" if c is None else f"step {c.step} {c.path}"))
        out.append(f"  seal lag: {max(0, self.last_seq - self.last_seal_seq)} events after the last seal")
        return out


def watch(path: str | Path, *, interval: float = 0.5, out: TextIO = sys.stdout, timeout: float | None = None,
          keys: Sequence[PublicKey] = (), trust_embedded: bool = False, allow_unsigned: bool = False) -> int:
    """Follow ``path`` until the run closes (return 0), Ctrl-C (130), ``timeout`` seconds (3) or a line that
    does not check out (1). With ``keys`` (or ``trust_embedded``) every seal's signature is checked too."""
    p = Path(path)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:  # the writer may not have created the file yet
        try:
            size = _open_checked(p)
            if size > 0 and b"\n" in p.read_bytes()[:1 << 20]:
                break
        except Exception:  # noqa: BLE001 - not there yet: keep waiting, like tail -F
            pass
        if deadline is not None and time.monotonic() > deadline:
            return 3
        time.sleep(interval)
    opened, _ = _read_opening(p, _open_checked(p))
    if keys or trust_embedded or opened.key_id is None:
        raw, trust, _ = resolve_key(opened, keys=keys, trust_embedded=trust_embedded)
        if trust == "unsigned" and not allow_unsigned:
            out.write(safe(f"FAIL  {p}: the journal is unsigned (pass --allow-unsigned to follow it anyway)") + "\n")
            return 1
        label = {"pinned": f"signatures checked: key {opened.key_id}, pinned",
                 "embedded": f"signatures checked against the embedded key {opened.key_id}: authenticity not "
                             "established", "unsigned": "unsigned journal: chain only"}[trust]
        ctx = ScanContext(opened.run_id, opened.key_id, raw, trust != "unsigned", None)
    else:
        label = "chain checked, signatures NOT checked: pass --pubkey"
        ctx = ScanContext(opened.run_id, opened.key_id, None, False, None)
    res = RangeResult(0, 0)
    scanner = Scanner(ctx, -1, genesis(opened.run_id), res)
    view = _View(label)
    tty = out.isatty()
    if not tty:
        out.write(f"watching {p} ({label})\n")
    offset = 0
    carry = b""
    drawn = 0
    try:
        with open(p, "rb", buffering=0) as f:
            while True:
                f.seek(offset)
                data = f.read()
                if data:
                    offset += len(data)
                    chunk = carry + data
                    cut = chunk.rfind(b"\n")
                    if cut >= 0:
                        lines = chunk[:cut].split(b"\n")
                        carry = chunk[cut + 1:]
                        for ev in scanner.feed(lines, offset - len(chunk)):
                            view.apply(ev)
                    else:
                        carry = chunk
                text = [safe(x) for x in view.lines(p)]  # journal strings never reach the terminal raw
                if tty:
                    out.write(("\x1b[F\x1b[2K" * drawn) + "\n".join(text) + "\n")
                    drawn = len(text)
                else:
                    out.write(" | ".join(x.strip() for x in text[1:]) + "\n")
                out.flush()
                if view.closed:
                    return 0
                if deadline is not None and time.monotonic() > deadline:
                    return 3
                time.sleep(interval)
    except KeyboardInterrupt:
        return 130
    except IntegrityError as e:
        out.write(safe(e.fail_line(str(p))) + "\n")
        out.flush()
        return 1
