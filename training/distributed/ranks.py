"""A distributed run's journals: one per rank in a shared run folder, anchored to each other at checkpoints.

Inside a process that ``torchrun`` started (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and
``TORCHELASTIC_RUN_ID`` in the environment), :func:`open_rank_journal` opens ``RUN_DIR/rank-00003.jsonl`` for
rank 3: created on the first start, continued with ``open_append`` after a torchrun restart (a torn tail, or
unsigned events, moved aside as always), and records ``rank_joined`` with the run identity every rank shares,
the rank, the world size, the node and the restart count. No rank ever waits on another to append.

A hash chain cannot see its own truncation, so at points every rank reaches together (checkpoints)
:func:`anchor_ranks` gathers every rank's latest sealed head with one small collective: rank 0 records them all
(``ranks_anchored``) and every other rank records rank 0's (``anchor_recorded``). ``trainledger verify RUN_DIR``
then checks every rank journal against the anchors in the others (:func:`trainledger.journal.audit.rundir.verify_run_dir`).
Collectives are ``torch.distributed``'s (gloo on the CPU, NCCL on GPUs); nothing here is home-made.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import re
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from trainledger.journal import Journal, Signer
from trainledger.journal.errors import UsageError
from trainledger.journal.kinds import AnchorRecorded, RankJoined, RanksAnchored
from trainledger.training.distributed.stragglers import DEFAULT_THRESHOLD

__all__ = ["RankInfo", "rank_info", "open_rank_journal", "certify_rank_key", "RANK_KEYS", "anchor_ranks", "anchor_record", "rank_journal_name", "in_torchrun",
           "journal_name", "init_process_group",
           "StragglerDetector", "ComputeClock", "save_sharded", "restore_sharded", "ShardedCheckpointer", "ShardedRestore", "rank_key"]


@dataclasses.dataclass(frozen=True)
class RankInfo:
    run: str
    rank: int
    world_size: int
    local_rank: int
    node: str
    restart_count: int


def rank_info(env: dict[str, str] | None = None, *, run_dir: str | os.PathLike | None = None) -> RankInfo:
    """This process's place in a ``torchrun`` job, from its environment; ``UsageError`` outside one.

    The run identity every rank shares: a run folder that already holds a run (its rank-0 journal, else its
    lowest rank's) continues that run, whatever id the launcher made this time: ``torchrun --standalone`` and a
    single-node ``torchrun --nproc_per_node=N`` give every launch a fresh random rendezvous id, so a job relaunched
    by hand after it died would otherwise write a second run into the folder, which no audit can verify. A name
    the user chose (``TRAINLEDGER_RUN``, else an explicit ``--rdzv-id``, i.e. ``TORCHELASTIC_RUN_ID`` that is not a
    launcher-made UUID) that differs from the folder's run is refused here, at start: a different run needs its
    own folder (or ``TRAINLEDGER_RUN=<the folder's run>`` to continue it).

    In a new folder: ``TRAINLEDGER_RUN``, else ``TORCHELASTIC_RUN_ID``; torchrun's ``none`` (no ``--rdzv-id``)
    counts as no identity, and then, with the process group initialized, rank 0 makes one and broadcasts it (one
    collective, so every rank must call this)."""
    env = os.environ if env is None else env
    try:
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    except (KeyError, ValueError):
        raise UsageError("not a torchrun process: RANK and WORLD_SIZE are not set") from None
    chosen = _clean_run(env.get("TRAINLEDGER_RUN") or "")
    launcher = env.get("TORCHELASTIC_RUN_ID") or ""
    launcher = "" if launcher == "none" else _clean_run(launcher)   # "none": torchrun's placeholder
    if not chosen and launcher and not _LAUNCHER_MADE.fullmatch(launcher):
        chosen = launcher                                              # --rdzv-id=$JOB_ID
    recorded, where = _recorded_run(Path(run_dir)) if run_dir is not None else ("", None)
    if recorded and chosen and chosen != recorded:
        source = "TRAINLEDGER_RUN" if env.get("TRAINLEDGER_RUN") else "--rdzv-id (TORCHELASTIC_RUN_ID)"
        raise UsageError(f"{where} holds run {recorded!r}, but {source} names {chosen!r}: a different run needs "
                         f"its own folder; to continue this one, set TRAINLEDGER_RUN={recorded}")
    # without any id (torchrun's "none") every rank takes rank 0's answer through one broadcast, as before: a rank
    # must never skip that collective because it saw a file its peers did not
    run = (recorded or chosen or launcher) if (chosen or launcher) else _shared_run_id(run_dir)
    return RankInfo(run=run, rank=rank, world_size=world, local_rank=int(env.get("LOCAL_RANK", "0")),
                    node=socket.gethostname(), restart_count=int(env.get("TORCHELASTIC_RESTART_COUNT", "0")))


#: the rendezvous id torchrun makes itself (``--standalone``, a single node without ``--rdzv-id``): a UUID
_LAUNCHER_MADE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _clean_run(run: str) -> str:
    run = re.sub(r"[^A-Za-z0-9._:-]", "-", run)[:100]
    return run if run and run[0].isalnum() else ""


def _recorded_run(run_dir: Path) -> tuple[str, Path | None]:
    """The run identity a run folder already holds, and the journal it was read from: the first line of
    ``rank-00000.jsonl`` (a bounded read); ("", None) for a new folder."""
    import json

    path = run_dir / rank_journal_name(0)
    try:
        with open(path, "rb") as f:
            line = f.readline(1 << 16)
        meta = json.loads(line).get("meta") or {}
        run = _clean_run(str(meta.get("run") or ""))
    except (OSError, ValueError, AttributeError):
        return "", None
    return (run, path) if run else ("", None)


def _shared_run_id(run_dir: str | os.PathLike | None) -> str:
    import secrets
    import time

    try:
        import torch.distributed as dist

        grouped = dist.is_available() and dist.is_initialized()
    except ImportError:  # pragma: no cover - the torch extra is installed wherever torchrun runs
        grouped = False
    recorded = _recorded_run(Path(run_dir))[0] if run_dir is not None else ""
    if grouped:  # rank 0 decides, so that every rank takes the same branch and gets the same answer
        box = [recorded or f"run-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{secrets.token_hex(4)}"
               if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(box, src=0)
        return str(box[0])
    if recorded:
        return recorded
    raise UsageError("no run identity: torchrun was started without --rdzv-id (its run id is 'none'); pass "
                     "--rdzv-id, set TRAINLEDGER_RUN, or initialize the process group first so that rank 0 "
                     "can choose one")


def init_process_group(backend: str = "gloo", **kwargs: Any) -> None:
    """``torch.distributed.init_process_group`` for a ``torchrun`` worker that survives torchrun restarts.

    The gloo pitfall: after a restart the new workers meet in the same rendezvous store (torchrun's agent
    keeps it), where the previous round left its processes' addresses under the same keys; gloo reads those
    stale keys and fails with "connectFullMesh ... Connection refused". Each round here gets its own key
    prefix (``trainledger/round-<TORCHELASTIC_RESTART_COUNT>``) on the agent's store, so no round reads
    another's keys. Outside torchrun's agent store it is the plain call.
    """
    import datetime

    import torch.distributed as dist

    env = os.environ
    if "MASTER_ADDR" not in env or "MASTER_PORT" not in env or "store" in kwargs:
        dist.init_process_group(backend, **kwargs)
        return
    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    timeout = kwargs.pop("timeout", datetime.timedelta(minutes=5))
    base = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), world, is_master=False, timeout=timeout)
    store = dist.PrefixStore(f"trainledger/round-{env.get('TORCHELASTIC_RESTART_COUNT', '0')}", base)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout, **kwargs)


def rank_journal_name(rank: int) -> str:
    return f"rank-{rank:05d}.jsonl"


def in_torchrun(env: dict[str, str] | None = None) -> bool:
    """Whether this process is one rank of a multi-process torchrun job (``RANK`` set, ``WORLD_SIZE`` > 1)."""
    env = os.environ if env is None else env
    return "RANK" in env and int(env.get("WORLD_SIZE", "1") or 1) > 1


def journal_name(env: dict[str, str] | None = None) -> str:
    """This process's journal in a run folder: ``rank-NNNNN.jsonl`` under torchrun, else ``journal.jsonl``. From
    the environment alone (no collective: a call on one rank only is safe)."""
    env = os.environ if env is None else env
    return rank_journal_name(int(env["RANK"])) if in_torchrun(env) else "journal.jsonl"


#: how a rank signs its journal (``open_rank_journal(rank_keys=)``): with the run's key itself, or with an
#: ephemeral key made in memory and certified by the run's key (journal.certify); None: ephemeral when the run's
#: key is held by a token or a service (a pkcs11: URI, a KMS), the key itself for a key file
RANK_KEYS = ("key", "ephemeral")


def _rank_keys(signer: Signer, rank_keys: str | None) -> str:
    if rank_keys is None:
        return "key" if type(signer) is Signer else "ephemeral"
    if rank_keys not in RANK_KEYS:
        raise UsageError(f"rank_keys={rank_keys!r}: use 'key' (every rank signs with the run's key) or 'ephemeral' "
                         "(each rank a key in memory, certified by the run's key)")
    return rank_keys


def certify_rank_key(issuer: Signer, info: RankInfo, *, group: Any = None,
                     validity_s: float | None = None) -> tuple[Signer, Any]:
    """This rank's signing key for this round, made in memory (never written anywhere), and its certificate
    (a ``key_certified``): every rank calls it (one ``all_gather_object`` of the public keys, one broadcast of the
    roster); rank 0 alone has ``issuer`` sign the round's roster (one signature a round, whatever the world size).
    Without a process group (one process) the roster is of this rank alone."""
    from trainledger.journal.certify import DEFAULT_VALIDITY_S, RankRoster

    key = Signer.generate()
    validity = DEFAULT_VALIDITY_S if validity_s is None else validity_s
    try:
        import torch.distributed as dist

        grouped = dist.is_available() and dist.is_initialized()
    except ImportError:  # pragma: no cover - the torch extra is installed wherever torchrun runs
        grouped = False
    if not grouped:
        roster = RankRoster.sign(issuer, run=info.run, round=info.restart_count, keys=[key.public], validity_s=validity)
        return key, roster.certificate(0)
    world = dist.get_world_size(group)
    got: list[Any] = [None] * world
    dist.all_gather_object(got, key.public.b64, group=group)
    box: list[Any] = [None]
    if dist.get_rank(group) == 0:
        try:  # a failing token must not leave the other ranks waiting in the broadcast: they get the error
            box = [RankRoster.sign(issuer, run=info.run, round=info.restart_count, keys=got, validity_s=validity)]
        except Exception as e:  # noqa: BLE001 - handed to every rank, raised there in one line
            box = [f"{type(e).__name__}: {e}"]
    dist.broadcast_object_list(box, src=0, group=group)
    roster = box[0]
    if isinstance(roster, str):
        raise UsageError(f"rank 0 could not have the run's key certify the rank keys: {roster}")
    rank = dist.get_rank(group)
    if roster.keys[rank] != key.public.b64:
        raise UsageError(f"rank {rank}: the roster rank 0 had signed holds another key than this rank's")
    return key, roster.certificate(rank)


def open_rank_journal(run_dir: str | os.PathLike, signer: Signer, *, info: RankInfo | None = None,
                      meta: dict[str, Any] | None = None, rank_keys: str | None = None,
                      **journal_options: Any) -> Journal:
    """This rank's journal in ``run_dir``: created, or continued after a torchrun restart; ``rank_joined`` first.

    Each rank's journal has its own run id (the shared run identity and the rank: ``RUN.r00003``), so a line or
    a file of one rank can never pass as another's; ``rank_joined`` and ``run_opened.meta`` name the shared run.

    ``rank_keys``: ``"key"`` signs with ``signer`` itself; ``"ephemeral"`` has every rank make a key in memory
    for this round, certified by ``signer`` (:func:`certify_rank_key`: a collective every rank joins), so that
    the run's key signs once a round and no rank's key is ever on disk; the journals then verify under
    ``signer``'s public key. Default: ephemeral for a key a token or service holds, the key itself for a file.
    """
    info = info or rank_info(run_dir=run_dir)
    path = Path(run_dir) / rank_journal_name(info.rank)
    certificate = issuer = None
    if _rank_keys(signer, rank_keys) == "ephemeral":
        issuer = signer
        signer, certificate = certify_rank_key(signer, info)
    if path.exists():
        j = Journal.open_append(path, signer=signer, certificate=certificate, **journal_options)
    else:
        j = Journal.create(path, signer=signer, run_id=f"{info.run}.r{info.rank:05d}",
                           meta={"run": info.run, "rank": info.rank, "world_size": info.world_size,
                                 **(meta or {})}, certificate=certificate, **journal_options)
    versions = {"python": platform.python_version()}
    try:
        import torch

        versions["torch"] = str(torch.__version__)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            versions["backend"] = str(torch.distributed.get_backend())
        if torch.cuda.is_available():
            versions["cuda"] = str(torch.version.cuda)
            try:
                versions["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
            except (AttributeError, RuntimeError):  # a build without NCCL
                pass
    except ImportError:  # pragma: no cover - the torch extra is installed wherever this runs
        pass
    if issuer is not None and info.rank == 0:
        j.certifier = issuer  # rank 0 countersigns every anchor with the run key
    j.append(RankJoined(run=info.run, rank=info.rank, world_size=info.world_size, local_rank=info.local_rank,
                        node=info.node, restart_count=info.restart_count, versions=versions), durable=True)
    return j


def anchor_ranks(journal: Journal, *, step: int | None = None, group: Any = None) -> dict[int, str]:
    """At a point every rank reaches together: seal, gather every rank's sealed head and the id of its key (one
    ``all_gather_object``), record them (rank 0: all of them, its record of which key signs which rank; the others:
    rank 0's head and key). With rank keys certified by the run key, rank 0 has that key countersign the anchor
    (``ranks_anchored.cosig``: one signature of the run key an anchor). Returns ``{rank: "SEQ:HASH"}``."""
    import torch.distributed as dist

    journal.seal(durable=True, signed=True)  # a head the others record: signed before they do
    seq, h = journal.head
    mine = (f"{seq}:{h}", journal.key_id)
    got: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(got, mine, group=group)
    record = anchor_record(dist.get_rank(group), got, step=step)
    if isinstance(record, RanksAnchored) and journal.certifier is not None:
        import base64

        import msgspec

        from trainledger.journal.roster import split_run_id
        from trainledger.journal.certify import anchor_statement

        run = (split_run_id(journal.run_id) or (journal.run_id, 0))[0]
        sig = journal.certifier.sign(anchor_statement(run, step, record.heads, record.keys))
        record = msgspec.structs.replace(record, cosig=base64.b64encode(sig).decode())
    journal.append(record, durable=True)
    return {r: head for r, (head, _) in enumerate(got)}


def anchor_record(rank: int, got: list[tuple[str, str | None]], *, step: int | None = None
                  ) -> RanksAnchored | AnchorRecorded:
    """What ``rank`` records of every rank's gathered ``(head, key id)`` (``got[r]``): rank 0 every rank's head and
    key (its record of which key signs which rank), another rank rank 0's."""
    if rank == 0:
        return RanksAnchored(heads={str(r): head for r, (head, _) in enumerate(got)}, step=step,
                             keys={str(r): key for r, (_, key) in enumerate(got) if key is not None})
    return AnchorRecorded(rank=0, head=got[0][0], step=step, key=got[0][1])


class ComputeClock:
    """The moment a DDP model's last gradient bucket of a step is ready (its communication hook: the default
    all-reduce, with a timestamp when ``bucket.is_last()``): the end of this rank's own backward, before it waits on
    the other ranks. :meth:`take` gives the time from the previous step's end to that moment."""

    __slots__ = ("ready", "start", "capture")

    def __init__(self) -> None:
        self.ready: float | None = None
        self.start = 0.0
        #: when a list (armed for a replay check, docs/sdc.md): each bucket's (parameters, their local gradients'
        #: fingerprint sums) appended before its all-reduce; None: nothing captured
        self.capture: list[tuple[list[Any], Any]] | None = None

    @classmethod
    def attach(cls, model: Any) -> ComputeClock | None:
        """A clock on ``model``'s communication hook; None, said once on stderr, where there is no DDP model to
        time or it has a hook of its own (then the straggler windows score the step time, which every rank shares
        under a synchronous all-reduce)."""
        from torch.nn.parallel import DistributedDataParallel

        if not isinstance(model, DistributedDataParallel):
            sys.stderr.write("trainledger: the model is not a DistributedDataParallel: the straggler windows score "
                             "the step time (pass the DDP model as model= for each rank's own compute time)\n")
            return None
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        clock = cls()

        def hook(group, bucket):
            if bucket.is_last():
                clock.ready = time.perf_counter()
            if clock.capture is not None:  # this rank's own gradients, before the average replaces them
                from trainledger.training.health.state_fingerprint import sums_of

                clock.capture.append((list(bucket.parameters()), sums_of(list(bucket.gradients()))))
            return allreduce_hook(group, bucket)

        import torch
        import torch.distributed as dist

        # DDP checks the hook's annotations as objects (this module's are strings: postponed evaluation)
        hook.__annotations__ = {"bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]}

        try:
            model.register_comm_hook(model.process_group, hook)
        except RuntimeError as e:  # a hook of the user's own (compression, PowerSGD): DDP takes one
            sys.stderr.write(f"trainledger: cannot time this rank's compute ({str(e).splitlines()[0][:120]}): the "
                             "straggler windows score the step time\n")
            return None
        return clock

    def take(self, now: float) -> float | None:
        ready, self.ready = self.ready, None
        start, self.start = self.start, now
        return None if ready is None or ready < start else ready - start


class StragglerDetector:
    """Every rank calls :meth:`observe` after each step (a dict insert); every window the ranks exchange their
    window medians (one ``all_gather_object`` of a tuple) and rank 0 records ``straggler_scores`` (relative and
    individual scores) and a ``straggler_detected`` for each rank whose relative score is below ``threshold``.

    The window: ``every`` steps if given; by default about ``interval_s`` of wall time (a minute, as
    nvidia-resiliency-ext reports), measured on the first ``calibration_steps`` steps: the first exchange comes
    after those, and every rank then derives the same window length from the slowest rank's median (the ranks
    agree because they compute it from the same gathered numbers). All ranks must observe the same steps (call
    it at the same place in the loop). The arithmetic is ``journal.stragglers``', which replay runs again.
    """

    def __init__(self, journal: Journal, *, every: int | None = None, interval_s: float = 60.0,
                 calibration_steps: int = 20, threshold: float = DEFAULT_THRESHOLD, group: Any = None):
        if (every is not None and every < 1) or calibration_steps < 1 or not interval_s > 0 \
                or not 0 < threshold <= 1:
            raise UsageError("every and calibration_steps must be >= 1, interval_s > 0 and threshold in (0, 1]; "
                             f"got {every}, {calibration_steps}, {interval_s}, {threshold}")
        self.journal, self.threshold, self.group = journal, threshold, group
        self.interval_s = interval_s
        self.every = every if every is not None else calibration_steps
        self._calibrating = every is None
        self._t_first: float | None = None
        self._times: dict[int, float] = {}
        self._best: dict[int, float] = {}
        #: seconds the last exchange took (the collective and, on rank 0, the records)
        self.last_exchange_s: float | None = None

    def observe(self, step: int, step_time_s: float) -> None:
        """Note a step's time (the value journaled as its ``compute_time_s``, or ``step_time_s`` without one)."""
        if self._calibrating and self._t_first is None:
            import time

            self._t_first = time.monotonic()
        self._times[step] = step_time_s
        if len(self._times) >= self.every:
            self.exchange()

    def finish(self) -> dict[int, float]:
        """At the end of training, on every rank: score the last window if it is partial (steps observed since the
        last exchange), so no steps go unscored. Returns ``{rank: relative score}`` ({} when there was none)."""
        import torch.distributed as dist

        every: list[Any] = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(every, len(self._times), group=self.group)  # every rank agrees whether to exchange
        return self.exchange() if any(every) else {}

    def exchange(self) -> dict[int, float]:
        """Gather the window's medians now; rank 0 records the scores. Returns ``{rank: relative score}``."""
        import time

        import torch.distributed as dist

        from trainledger.training.kinds import StragglerDetected, StragglerScores
        from trainledger.training.distributed.stragglers import individual_scores, relative_scores, window_median

        t0 = time.perf_counter()
        steps = sorted(self._times)
        mine = (steps[0], steps[-1], window_median(list(self._times.values()))) if steps else None
        # While calibrating: the wall time per step since the first observation (the window is set by wall time).
        wall = ((time.monotonic() - self._t_first) / max(1, len(steps) - 1)
                if self._calibrating and self._t_first is not None else None)
        self._times = {}
        gathered: list[Any] = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(gathered, (mine, socket.gethostname(), wall), group=self.group)
        if self._calibrating:  # the same numbers on every rank: the same window length everywhere
            self._calibrating = False
            walls = [g[2] for g in gathered if g[2] is not None and g[2] > 0]
            if walls:
                self.every = max(1, min(1_000_000, round(self.interval_s / max(walls))))
        if any(g is None or g[0] is None or g[0][2] is None for g in gathered):
            return {}
        medians = {r: g[0][2] for r, g in enumerate(gathered)}
        scores = relative_scores(medians)
        individual = individual_scores(medians, self._best)
        if dist.get_rank(self.group) == 0:
            start, end = min(g[0][0] for g in gathered), max(g[0][1] for g in gathered)
            self.journal.append(StragglerScores(window_start=start, window_end=end,
                                                medians={str(r): m for r, m in medians.items()},
                                                scores={str(r): s for r, s in scores.items()},
                                                individual={str(r): s for r, s in individual.items()},
                                                threshold=self.threshold), durable=True)
            for r, s in scores.items():
                if s < self.threshold:
                    self.journal.append(StragglerDetected(rank=r, score=s, window_start=start, window_end=end,
                                                          node=gathered[r][1]), durable=True)
        self.last_exchange_s = time.perf_counter() - t0
        return scores


def _digest_file(p: Path) -> tuple[str, int]:
    """fsync (durable before it is recorded), then :func:`~trainledger.training.checkpoints.state.file_sha256`."""
    from trainledger.training.checkpoints.state import file_sha256

    fd = os.open(p, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return file_sha256(p)


def _shard_folder(run_dir: str | os.PathLike, step: int) -> tuple[str, Path]:
    """``checkpoints/step-000000019``; a later torchrun round saving the same step again writes
    ``step-000000019-restart1`` beside it (every rank names it alike), so a save that an earlier round left
    half-recorded is never overwritten under a record that no longer matches."""
    from trainledger.journal.paths import confined

    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    rel = f"checkpoints/step-{step:09d}" + (f"-restart{restart}" if restart else "")
    (Path(run_dir) / "checkpoints").mkdir(parents=True, exist_ok=True)
    return rel, confined(run_dir, rel, what="checkpoint path")


def _record_shards(journal: Journal, folder: Path, rel: str, step: int, rank: int, world: int,
                   save_id: str | None) -> Any:
    from trainledger.training.kinds import ShardsSaved

    mine = sorted(p for p in folder.iterdir() if re.fullmatch(rf"__{rank}_\d+\.distcp", p.name))
    files = []
    for p in mine:
        digest, size = _digest_file(p)
        files.append({"file": p.name, "bytes": size, "sha256": digest})
    meta = _digest_file(folder / ".metadata")[0] if rank == 0 else None
    ev = ShardsSaved(step=step, path=rel, rank=rank, world_size=world, files=files, metadata_sha256=meta,
                     save_id=save_id if rank == 0 else None)
    journal.append(ev, durable=True)
    return ev


def save_sharded(run_dir: str | os.PathLike, journal: Journal, state_dict: dict[str, Any], *, step: int,
                 group: Any = None) -> Any:
    """Write ``state_dict`` with ``torch.distributed.checkpoint.save`` (every rank together) and record what DCP
    does not: this rank's shard files (``__RANK_*.distcp``) with their digests, and on rank 0 the metadata's and
    DCP's ``save_id``. Returns this rank's ``shards_saved``. :class:`ShardedCheckpointer` saves in the background.

    Values that differ between ranks (RNG states, data cursors) need keys of their own per rank (DCP keeps one copy
    of a key every rank saves): :func:`rank_key`."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    rel, folder = _shard_folder(run_dir, step)
    writer = dcp.FileSystemWriter(str(folder))
    dcp.save(state_dict, storage_writer=writer, process_group=group)
    return _record_shards(journal, folder, rel, step, dist.get_rank(group), dist.get_world_size(group),
                          writer.save_id)


def rank_key(rank: int) -> str:
    """The state-dict key for one rank's own state in a sharded checkpoint (``rank-00003``)."""
    return f"rank-{rank:05d}"


_ATOMS = (int, float, bool, str, bytes, type(None))


def _reusable_stager() -> Any:
    """A DCP stager that keeps its host buffers from one save to the next (pinned where a GPU is), or ``None`` on a
    torch whose ``async_save`` takes no stager (DCP's default staging then).

    Not DCP's own ``DefaultStager``: torch 2.11's clears its tables after every staging and fails on the next save
    (``KeyError: <class 'type'>``, seen on an H200), and keeps no buffers there anyway."""
    import inspect

    import torch
    import torch.distributed.checkpoint as dcp

    try:
        from torch.distributed.checkpoint.staging import BlockingAsyncStager
    except ImportError:
        return None
    if "async_stager" not in inspect.signature(dcp.async_save).parameters:
        return None

    class KeptBuffersStager(BlockingAsyncStager):
        """Copies each tensor of the state into a host buffer kept under its place in the state (its keys), its
        shape and its dtype; a place whose tensor changed shape or dtype gets a new buffer, a place gone drops
        its. State holding anything but plain tensors, dicts, lists, tuples and atoms (a DTensor, an object) is
        staged DCP's way, with fresh buffers."""

        def __init__(self, pin: bool):
            super().__init__(cache_staged_state_dict=False)
            self.pin = pin
            self.buffers: dict[tuple[Any, ...], torch.Tensor] = {}

        def stage(self, state_dict: Any) -> Any:
            if not _plain_state(state_dict, torch):
                return super().stage(state_dict)
            seen: set[tuple[Any, ...]] = set()
            devices: set[Any] = set()  # the GPUs copied from without waiting: each waited for before returning

            def copy(obj: Any, path: tuple[Any, ...]) -> Any:
                if isinstance(obj, torch.Tensor):
                    key = (path, tuple(obj.shape), obj.dtype)
                    buf = self.buffers.get(key)
                    if buf is None:
                        buf = self.buffers[key] = torch.empty(key[1], dtype=obj.dtype, pin_memory=self.pin)
                    overlap = self.pin and obj.device.type == "cuda"  # a copy the GPU does while this goes on
                    if overlap:
                        devices.add(obj.device)
                    buf.copy_(obj.detach(), non_blocking=overlap)
                    seen.add(key)
                    return buf
                if isinstance(obj, dict):
                    return {k: copy(v, (*path, k)) for k, v in obj.items()}
                if isinstance(obj, (list, tuple)):
                    return type(obj)(copy(v, (*path, i)) for i, v in enumerate(obj))
                return obj

            out = copy(state_dict, ())
            for key in set(self.buffers) - seen:
                del self.buffers[key]
            for dev in devices:  # the copies are done before the training thread moves on
                torch.cuda.synchronize(dev)
            return out

        def close(self) -> None:
            self.buffers.clear()

    return KeptBuffersStager(torch.cuda.is_available())


def _plain_state(obj: Any, torch: Any) -> bool:
    """Only plain tensors (not DTensor, not another subclass but Parameter), dicts, lists, tuples and atoms."""
    if isinstance(obj, torch.Tensor):
        return type(obj) in (torch.Tensor, torch.nn.Parameter)
    if isinstance(obj, dict):
        return all(_plain_state(v, torch) for v in obj.values())
    if type(obj) in (list, tuple):
        return all(_plain_state(v, torch) for v in obj)
    return isinstance(obj, _ATOMS)


class ShardedCheckpointer:
    """Sharded saves that overlap training: ``save(..., background=True)`` stages the state and returns
    (``torch.distributed.checkpoint.async_save``); a helper thread waits for DCP's writes, then hashes the shards and
    records ``shards_saved``, off the training thread. At most one save is in flight (as DCP requires): the next
    ``save``, or ``wait``, joins it and raises what it failed with.

    A background save finishes with collectives of its own while training runs collectives of its own (DDP's
    all-reduce): on one process group they would interleave and hang. So the checkpointer runs its saves on a
    group of its own (gloo, made here with ``torch.distributed.new_group``: every rank constructs it at the same
    point), unless ``group`` is given.

    A background save copies the state to host memory before it returns (DCP's staging), into buffers the
    checkpointer keeps from one save to the next (pinned on a GPU): the first background save allocates them, the
    later ones only copy. On an H200 this took the stall of a 512 MB save from 0.34-0.40 s (fresh buffers every
    save, DCP's default) to 0.012-0.013 s (docs/bench/device.txt). The price is a host copy of this rank's state
    held between saves; ``reuse_staging=False`` gives DCP's default back (as does a torch whose ``async_save``
    takes no stager). ``close()`` (or ``with``) waits for the save in flight and frees the buffers."""

    def __init__(self, run_dir: str | os.PathLike, journal: Journal, *, group: Any = None,
                 reuse_staging: bool = True):
        import torch.distributed as dist

        if group is None:
            group = dist.new_group(backend="gloo")
        self.run_dir, self.journal, self.group = run_dir, journal, group
        self._thread: threading.Thread | None = None
        self._outcome: list[Any] = []
        self._stager = _reusable_stager() if reuse_staging else None

    def __enter__(self) -> ShardedCheckpointer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Wait for the save in flight (raising what it failed with) and free the staging buffers."""
        try:
            self.wait()
        finally:
            stager, self._stager = self._stager, None
            if stager is not None:
                stager.close()

    def save(self, state_dict: dict[str, Any], *, step: int, background: bool = False) -> Any:
        """Save; blocking returns ``shards_saved``, background returns ``None`` (recorded when written)."""
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp

        self.wait()
        if not background:
            return save_sharded(self.run_dir, self.journal, state_dict, step=step, group=self.group)
        rel, folder = _shard_folder(self.run_dir, step)
        writer = dcp.FileSystemWriter(str(folder))
        extra = {"async_stager": self._stager} if self._stager is not None else {}
        future = dcp.async_save(state_dict, storage_writer=writer, process_group=self.group, **extra)
        rank, world = dist.get_rank(self.group), dist.get_world_size(self.group)

        def finish() -> None:
            try:
                result = future.result()
                if hasattr(result, "result") and callable(result.result):  # newer DCP wraps a second future
                    result.result()
                self._outcome.append(_record_shards(self.journal, folder, rel, step, rank, world, writer.save_id))
            except BaseException as e:  # raised by the next save or wait, never dropped
                self._outcome.append(e)

        self._thread = threading.Thread(target=finish, name=f"trainledger-dcp-{step}", daemon=True)
        self._thread.start()
        return None

    def wait(self) -> Any:
        """Wait for the save in flight; return its ``shards_saved`` (or ``None``); raise what it failed with."""
        t, self._thread = self._thread, None
        if t is None:
            return None
        t.join()
        out = self._outcome.pop()
        if isinstance(out, BaseException):
            raise out
        return out


@dataclasses.dataclass(frozen=True)
class ShardedRestore:
    """What :func:`restore_sharded` loaded: the checkpoint's step and folder, and the world size that saved it."""

    step: int
    path: str
    saved_world_size: int
    resharded: bool


def _shard_records(path: Path, keys: list[Any]) -> dict[str, Any]:
    """``{folder: shards_saved}`` from one rank journal's signed events (the newest record per folder)."""
    from trainledger.journal import read_signed_events
    from trainledger.training.kinds import ShardsSaved

    return {e.path: e for e in read_signed_events(path, keys) if isinstance(e, ShardsSaved)}


def _checked_reader(folder: Path, metadata_sha256: str | None) -> Any:
    """DCP's file reader, except that ``.metadata`` (a pickle) is read once into memory and unpickled only if its
    digest is the signed one: no window between the check and the load for a swapped file to slip through."""
    import hashlib
    import io
    import pickle

    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    from trainledger.training.checkpoints.state import ResumeRejected

    class CheckedReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            data = (folder / ".metadata").read_bytes()
            if metadata_sha256 is None or hashlib.sha256(data).hexdigest() != metadata_sha256:
                raise ResumeRejected("resume-invalid-digest", f"{folder.name}/.metadata differs from its signed record")
            md = pickle.load(io.BytesIO(data))  # noqa: S301 - the bytes are the ones the signed record names
            if getattr(md, "storage_meta", None) is None:
                md.storage_meta = StorageMeta()
            md.storage_meta.load_id = self.load_id
            return md

    return CheckedReader(str(folder))


def _safe_planner() -> Any:
    """DCP's default load planner, except that non-tensor values load with ``torch.load(weights_only=True)``
    (DCP's own uses ``weights_only=False``: a pickle that could run code)."""
    import torch
    from torch.distributed.checkpoint import DefaultLoadPlanner
    from torch.distributed.checkpoint._traverse import set_element

    class SafePlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: Any) -> None:
            obj = torch.load(value, weights_only=True)
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
            else:
                self.state_dict[read_item.dest_index.fqn] = obj

    return SafePlanner()


def restore_sharded(run_dir: str | os.PathLike, journal: Journal, state_dict: dict[str, Any], *,
                    step: int | None = None, group: Any = None, keys: list[Any] | None = None) -> ShardedRestore:
    """Restore the newest sharded checkpoint complete on every rank that saved it (or ``step``'s) into
    ``state_dict`` with ``torch.distributed.checkpoint.load``, after every shard was checked against its signed
    record and the metadata against rank 0's. All ranks agree before anything is loaded: any problem on any rank is
    a ``resume_rejected`` on every rank naming the rank and the file, and :class:`ResumeRejected`.

    Into another world size (resharding, e.g. 2 ranks saved, 1 restores), rank ``r`` also checks the shards of the
    saving ranks ``r + k*world`` from their journals in the run folder (signed under ``keys``, default the
    journal's own key), and ``run_resumed`` says ``resharded``. DCP reshards the tensors; state saved under
    :func:`rank_key` for a rank that no longer exists is not loaded.
    """
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    from trainledger.journal import RunResumed
    from trainledger.journal.paths import confined
    from trainledger.journal.errors import TrainledgerError as _TLError
    from trainledger.training.kinds import ResumeRejectedEvent
    from trainledger.training.checkpoints.state import ResumeRejected, file_sha256

    rank, world = dist.get_rank(group), dist.get_world_size(group)
    run = Path(run_dir)
    keys = keys or [journal.public_key]
    if journal.public_key is None:  # as signed_history refuses it, without reading the journal for it
        raise ResumeRejected("resume-invalid-unsigned", f"{journal.path}: an unsigned journal cannot drive a resume")
    journal.flush()  # every event appended so far is in the file the records are read from
    # Records by saving rank: this rank's own, and those of saving ranks beyond the world that fall to it.
    known: dict[int, dict[str, Any]] = {rank: _shard_records(journal.path, keys)}
    problem = None
    saved_worlds = {e.world_size for e in known[rank].values()}
    for old in sorted(r for w in saved_worlds for r in range(world, w) if r % world == rank):
        p = run / rank_journal_name(old)
        try:
            known[old] = _shard_records(p, keys) if p.exists() else {}
        except _TLError as e:
            problem = ("resume-invalid-journal", f"rank {old}'s journal: {e}")
    offer = {r: {path: (e.step, e.world_size) for path, e in recs.items()} for r, recs in known.items()}
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, offer, group=group)
    by_path: dict[str, tuple[int, int, set[int]]] = {}
    for offered in gathered:
        for r, recs in offered.items():
            for path, (st, w) in recs.items():
                by_path.setdefault(path, (st, w, set()))[2].add(r)
    complete = {path: (st, w) for path, (st, w, ranks) in by_path.items() if ranks >= set(range(w))}
    candidates = sorted((st, path) for path, (st, _) in complete.items() if step is None or st == step)
    pick = candidates[-1][1] if candidates else None
    meta = None
    if problem is None and pick is None:
        problem = ("resume-invalid-unknown-checkpoint", "no sharded checkpoint that every saving rank recorded"
                   + (f" at step {step}" if step is not None else ""))
    elif problem is None:
        try:  # every rank reaches the gather below: a problem here is a verdict, never an exception
            for old, recs in known.items():
                rec = recs.get(pick)
                if rec is None:
                    continue
                checks = [(f["file"], f["sha256"]) for f in rec.files]
                if old == 0:
                    meta = rec.metadata_sha256
                    checks.append((".metadata", rec.metadata_sha256 or ""))
                for name, want in checks:
                    p = confined(run, f"{rec.path}/{name}", what="shard file")  # a recorded name may not lead out
                    if not p.is_file():
                        problem = ("resume-invalid-missing-state", f"rank {old}: {rec.path}/{name} is missing")
                    elif file_sha256(p)[0] != want:
                        problem = ("resume-invalid-digest",
                                   f"rank {old}: {rec.path}/{name} differs from its signed record")
                    if problem:
                        break
                if problem:
                    break
        except (_TLError, KeyError, TypeError, OSError) as e:
            problem = ("resume-invalid-path", f"rank {rank}: {e}")
    verdicts: list[Any] = [None] * world
    dist.all_gather_object(verdicts, (problem, meta), group=group)
    bad = next((v[0] for v in verdicts if v[0] is not None), None)
    meta = next((v[1] for v in verdicts if v[1] is not None), None)
    rel = pick or "checkpoints/?"
    if bad is not None:
        journal.append(ResumeRejectedEvent(path=rel, reason=bad[0], detail=bad[1]), durable=True)
        raise ResumeRejected(bad[0], bad[1])
    st, saved_world = complete[pick]
    folder = confined(run, pick, what="checkpoint path")
    try:
        dcp.load(state_dict, storage_reader=_checked_reader(folder, meta), planner=_safe_planner(),
                 process_group=group)
    except ResumeRejected as e:
        journal.append(ResumeRejectedEvent(path=rel, reason=e.code, detail=str(e)), durable=True)
        raise
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - DCP's (a BaseException, on every rank), ...
        full = str(e)
        found = re.search(r"Missing key in checkpoint state_dict: [^\n]*", full)
        text = found.group(0) if found else " ".join(full.split())[:300]
        code = "resume-invalid-missing-state" if found else "resume-invalid-format"
        detail = f"{pick}: torch.distributed.checkpoint could not load it into this state ({type(e).__name__}: {text})"
        journal.append(ResumeRejectedEvent(path=rel, reason=code, detail=detail), durable=True)
        raise ResumeRejected(code, detail) from None
    journal.append(RunResumed(reason="checkpoint", from_step=st, checkpoint=pick,
                              detail={"sharded": True, "world_size": world, "saved_world_size": saved_world,
                                      "resharded": saved_world != world}), durable=True)
    return ShardedRestore(step=st, path=pick, saved_world_size=saved_world, resharded=saved_world != world)
