"""``trainledger serve JOURNAL|RUN_DIR``: a live dashboard of what verifies (the ``serve`` extra: Starlette, uvicorn).

One page (``static/index.html``, its script and uPlot, all shipped in the package: nothing is fetched from outside)
and a read-only JSON API over a :class:`~.board.Board`. A poller thread reads the journals every
:data:`POLL_S` seconds; the page hears of each change through server-sent events (``/api/stream``) and fetches what
changed. Every journal string reaches the page as JSON and is put into it as text, never as markup; the page runs
under a Content-Security-Policy that allows only its own script and styles.

Safe by default: it binds 127.0.0.1; a loopback bind answers only requests whose ``Host`` is the loopback address
(a page elsewhere cannot rebind a name to it and read the journals); any other bind needs the token printed with
its URL (``?token=``, as Jupyter does), and every request must carry it. There is nothing to write: every route is
a GET.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import math
import secrets
import threading
import time
from importlib import resources
from pathlib import Path
from typing import Any

from trainledger.journal.errors import IntegrityError, TrainledgerError, UsageError
from trainledger.serve.board import METRICS, Board
from trainledger.serve.fleet import MAX_RUNS, Fleet

__all__ = ["make_app", "POLL_S", "CSP", "LOOPBACK"]

POLL_S = 0.25
LOOPBACK = ("127.0.0.1", "::1", "localhost")
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
_STATIC = {"app.js": "text/javascript", "app.css": "text/css", "uPlot.iife.min.js": "text/javascript",
           "uPlot.min.css": "text/css", "index.html": "text/html"}


def _static(name: str) -> bytes:
    return resources.files("trainledger.serve").joinpath("static", name).read_bytes()


class Poller(threading.Thread):
    """Polls the boards until stopped; the server's one writer of them."""

    def __init__(self, board: Any, interval: float = POLL_S) -> None:
        super().__init__(name="trainledger-serve-follow", daemon=True)
        self.board, self.interval = board, interval
        self.stopped = threading.Event()
        self.error: str | None = None

    def run(self) -> None:
        replaying: threading.Thread | None = None
        while not self.stopped.wait(self.interval):
            try:
                self.board.poll()
                # a replay takes seconds (a child process): it runs beside the polling, one at a time, so that the
                # runs go on being followed (and new ones found) while it works
                if (replaying is None or not replaying.is_alive()) and self.board.replay_due():
                    replaying = threading.Thread(target=self._replay, name="trainledger-serve-replay", daemon=True)
                    replaying.start()
            except TrainledgerError as e:  # a journal gone or unreadable: said on the page, the server stays up
                self.error = str(e)
            except Exception as e:  # noqa: BLE001 - the follower must never die silently
                self.error = f"{type(e).__name__}: {e}"

    def _replay(self) -> None:
        try:
            self.board.run_replay()
        except TrainledgerError as e:
            self.error = str(e)
        except Exception as e:  # noqa: BLE001 - said on the page, never a dead thread
            self.error = f"{type(e).__name__}: {e}"


def make_app(board: Board | Fleet, *, token: str | None, follow: bool = True) -> Any:
    """The Starlette application over ``board`` (one run's :class:`Board`, or a :class:`Fleet` of runs: every API
    call then takes ``run=NAME``, the first run by default). ``token``: every request must carry it (``?token=``);
    None on a loopback bind, where the ``Host`` header must name the loopback address instead."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    fleet = board if isinstance(board, Fleet) else Fleet([board.path], board.trust, boards={str(board.path): board})
    follower = Poller(fleet) if follow else None

    def run_of(request: Request) -> Board:
        return fleet.board(request.query_params.get("run"))

    def guard(request: Request) -> Response | None:
        if token is not None:
            got = request.query_params.get("token", "")
            if not hmac.compare_digest(got.encode(), token.encode()):
                return Response("a token is needed: open the URL serve printed\n", status_code=403,
                                media_type="text/plain")
        elif _host_name(request.headers.get("host", "")) not in ("127.0.0.1", "localhost", "[::1]"):
            return Response("this server answers its loopback address only\n", status_code=403,
                            media_type="text/plain")
        return None

    def headers(extra: dict[str, str] | None = None) -> dict[str, str]:
        h = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
             "Cache-Control": "no-store", "Cross-Origin-Opener-Policy": "same-origin",
             "Cross-Origin-Resource-Policy": "same-origin", "X-Frame-Options": "DENY"}
        h.update(extra or {})
        return h

    def api(fn):
        async def handler(request: Request) -> Response:
            bad = guard(request)
            if bad is not None:
                return bad
            try:
                body = await asyncio.to_thread(fn, request)
            except UsageError as e:
                return JSONResponse({"error": str(e)}, status_code=400, headers=headers())
            except IntegrityError as e:
                return JSONResponse({"error": str(e)}, status_code=409, headers=headers())
            except (ValueError, TypeError) as e:
                return JSONResponse({"error": f"bad request: {e}"}, status_code=400, headers=headers())
            if isinstance(body, Response):
                return body
            try:  # the curves are finite (most bodies are): checked by the encoder, not walked in Python
                text = json.dumps(body, allow_nan=False, default=str)
            except ValueError:
                text = json.dumps(_finite(body), allow_nan=False, default=str)
            return Response(text, media_type="application/json", headers=headers())
        return handler

    def _int(request: Request, name: str, default: int | None = None) -> int | None:
        v = request.query_params.get(name)
        if v is None or v == "":
            return default
        n = int(v)
        if not -(1 << 63) <= n < (1 << 63):
            raise UsageError(f"{name}={v[:40]}: past a 64-bit integer")
        return n

    def _float(request: Request, name: str) -> float | None:
        v = request.query_params.get(name)
        if v is None or v == "":
            return None
        f = float(v)
        if not math.isfinite(f):
            raise UsageError(f"{name}={v[:40]}: not a finite number")
        return f

    def _runs(request: Request) -> list[str | None]:
        """The runs a request names (``run=A&run=B...``; none: the first), at most :data:`MAX_RUNS`."""
        names: list[str | None] = list(request.query_params.getlist("run")) or [None]
        if len(names) > MAX_RUNS:
            raise UsageError(f"{len(names)} runs asked for: at most {MAX_RUNS}")
        return names

    def _rank(request: Request) -> int | None:
        return _int(request, "rank")

    def state(request: Request) -> dict[str, Any]:
        s = run_of(request).state()
        # the run table; with runs_since=CURSOR (the page's, from the answer before) only the rows made since
        rs = fleet.runs_since(_int(request, "runs_since"))
        s["runs"], s["runs_partial"], s["runs_cursor"] = rs["rows"], rs["partial"], rs["cursor"]
        if rs["partial"]:
            s["runs_names"] = rs["names"]
        s["server_error"] = follower.error if follower is not None else None
        s["metrics"] = list(METRICS)
        return s

    def _curve(request: Request) -> tuple[str, int | None, Any, Any, str, bool]:
        """A curve request's (metric, width, lo, hi, x, logged): the bounds are steps (64-bit integers) on the step
        axis, finite numbers in the units of another; ``logged=NAME`` asks for a logged metric instead of
        ``metric``."""
        x = request.query_params.get("x", "step")
        num = _int if x == "step" else _float
        name = request.query_params.get("logged")
        if name is not None and not 0 < len(name) <= 1024:
            raise UsageError("logged=: a metric's name, 1 to 1024 characters")
        return (name if name is not None else request.query_params.get("metric", "loss"),
                _int(request, "width", 1200), num(request, "lo"), num(request, "hi"), x, name is not None)

    def _since(request: Request, n: int) -> list[int | None]:
        """``since=CURSOR`` once per run asked for (``-1``: none, the whole curve), or none at all."""
        got = request.query_params.getlist("since")
        if not got:
            return [None] * n
        if len(got) != n:
            raise UsageError(f"since=: one cursor a run, {n} here, got {len(got)}")
        out: list[int | None] = []
        for v in got:
            c = int(v)
            if not -1 <= c < (1 << 31):
                raise UsageError(f"since={v[:40]}: not a cursor")
            out.append(None if c < 0 else c)
        return out

    def series(request: Request) -> dict[str, Any]:
        metric, width, lo, hi, x, logged = _curve(request)
        return run_of(request).series(metric, width, lo, hi, x=x, logged=logged, since=_since(request, 1)[0])

    def logged(request: Request) -> dict[str, Any]:
        """The names of the metrics logged in the runs asked for (``run=A&run=B...``; none: the first), each with
        its points in all of them together."""
        names = _runs(request)
        points: dict[str, int] = {}
        left_out = 0
        for name in names:
            got = fleet.board(name).logged_names()
            left_out += got["left_out"]
            for k, n in got["names"]:
                points[k] = points.get(k, 0) + n
        return {"names": [[k, points[k]] for k in sorted(points)], "left_out": left_out}

    def curves(request: Request) -> dict[str, Any]:
        """One curve of several runs at once (``run=A&run=B...``; none: the first run): what the page overlays.
        ``since=C1&since=C2...``: each run's cursor from the answer before (-1: none): what is new since, where it is
        little (Board.series)."""
        names = _runs(request)
        metric, width, lo, hi, x, logged = _curve(request)
        since = _since(request, len(names))
        out = []
        for name, c in zip(names, since):
            body = dict(fleet.board(name).series(metric, width, lo, hi, x=x, logged=logged, since=c))
            body["run"] = name
            out.append(body)
        return {"metric": metric, "x_axis": x, "runs": out}

    def heatmap(request: Request) -> dict[str, Any]:
        return run_of(request).heatmap(_int(request, "width", 600))

    def telemetry(request: Request) -> dict[str, Any]:
        return run_of(request).telemetry()

    def devices(request: Request) -> dict[str, Any]:
        return run_of(request).device_series(request.query_params.get("metric", "temp_c"),
                                             _int(request, "width", 900))

    def runs(request: Request) -> dict[str, Any]:
        return {"version": fleet.version, "runs": fleet.runs()}

    def event(request: Request) -> dict[str, Any]:
        return run_of(request).event(_rank(request), _int(request, "seq", -1))

    def proof(request: Request) -> Response:
        rank, seq = _rank(request), _int(request, "seq", -1)
        bundle = run_of(request).proof(rank, seq)
        name = f"proof-{'' if rank is None else f'rank{rank}-'}seq{seq}.json"
        return Response(json.dumps(bundle, indent=1) + "\n", media_type="application/json",
                        headers=headers({"Content-Disposition": f'attachment; filename="{name}"'}))

    async def page(request: Request) -> Response:
        bad = guard(request)
        if bad is not None:
            return bad
        return Response(_static("index.html"), media_type="text/html; charset=utf-8", headers=headers())

    async def static(request: Request) -> Response:
        bad = guard(request)
        if bad is not None:
            return bad
        name = request.path_params["name"]
        if name not in _STATIC:
            return Response("not found\n", status_code=404, media_type="text/plain")
        return Response(_static(name), media_type=_STATIC[name], headers=headers({"Cache-Control": "max-age=60"}))

    async def stream(request: Request) -> Response:
        bad = guard(request)
        if bad is not None:
            return bad

        async def events():
            seen = -1
            last = time.monotonic()
            while True:
                if await request.is_disconnected():
                    break
                v = fleet.version
                if v != seen:
                    seen = v
                    last = time.monotonic()
                    yield f"data: {json.dumps({'version': v})}\n\n"
                elif time.monotonic() - last > 15:
                    last = time.monotonic()
                    yield ": keep-alive\n\n"
                await asyncio.sleep(0.1)

        return StreamingResponse(events(), media_type="text/event-stream", headers=headers())

    @contextlib.asynccontextmanager
    async def lifespan(app: Any):
        if follower is not None:
            follower.start()
        try:
            yield
        finally:
            if follower is not None:
                follower.stopped.set()

    async def favicon(request: Request) -> Response:
        return Response(status_code=204)

    routes = [Route("/", page), Route("/favicon.ico", favicon), Route("/static/{name}", static), Route("/api/state", api(state)),
              Route("/api/series", api(series)), Route("/api/curves", api(curves)), Route("/api/logged", api(logged)), Route("/api/heatmap", api(heatmap)),
              Route("/api/telemetry", api(telemetry)), Route("/api/devices", api(devices)), Route("/api/event", api(event)),
              Route("/api/proof", api(proof)), Route("/api/runs", api(runs)), Route("/api/stream", stream)]
    return Starlette(routes=routes, lifespan=lifespan)


def _finite(x: Any) -> Any:
    """``x`` with every non-finite float spelled as the journal spells it ("NaN", "Infinity", "-Infinity"): JSON has
    no such numbers, and a journal's anomaly may well hold one."""
    if isinstance(x, float):
        return x if math.isfinite(x) else ("NaN" if x != x else ("Infinity" if x > 0 else "-Infinity"))
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def _host_name(host: str) -> str:
    """The name part of a ``Host`` header (``[::1]:8765`` -> ``[::1]``, ``localhost:8765`` -> ``localhost``)."""
    if host.startswith("["):
        return host.split("]", 1)[0] + "]"
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def new_token() -> str:
    return secrets.token_urlsafe(24)


def url_of(host: str, port: int, token: str | None) -> str:
    """The URL to open: a wildcard bind is shown under this machine's name."""
    import socket

    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostname()
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/" + (f"?token={token}" if token else "")


def is_loopback(host: str) -> bool:
    return host in LOOPBACK


def serve(path: str | Path | list[str | Path], *, trust: Any, host: str = "127.0.0.1", port: int = 8765,
          ready: Any = None, progress: Any = None, wait: bool | None = None) -> int:
    """Verify what ``path`` holds now, then serve it until Ctrl-C. ``path``: a journal or a run folder (one run), or
    several paths, or a folder of runs (every run under them, on one page: :class:`Fleet`). ``ready(url)`` is told
    the URL once the server listens (the CLI prints it). ``wait``: a path that does not exist yet is waited for
    (True), refused (False), or by default waited for with a deprecation note."""
    try:
        import uvicorn
    except ImportError:
        raise UsageError("serve needs its extra: pip install 'trainledger[serve]'") from None
    from trainledger.serve.board import open_board
    from trainledger.serve.fleet import _is_run, find_runs

    paths = [Path(p) for p in (path if isinstance(path, (list, tuple)) else [path])]
    # one run (or a folder that holds no run yet: waited for), else every run under the paths
    one = len(paths) == 1 and (_is_run(paths[0]) or not paths[0].exists() or not find_runs(paths))
    if one:
        _wait_for_journal(paths[0], wait=wait)
    elif not find_runs(paths):
        raise UsageError(f"{', '.join(map(str, paths))}: no journal or run folder here")
    first = paths[0] if one else next(iter(find_runs(paths).values()))
    _precheck_trust(first, trust)   # a missing key is named before a taken port is
    sock = _listen(host, port)
    try:
        board = open_board(paths[0], trust, progress=progress) if one else Fleet(paths, trust, progress=progress)
    except BaseException:
        sock.close()
        raise
    port = sock.getsockname()[1]
    token = None if is_loopback(host) else new_token()
    app = make_app(board, token=token)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on", server_header=False,
                            date_header=False)
    import signal

    server = _server(config, sigint_ignored=signal.getsignal(signal.SIGINT) is signal.SIG_IGN)

    async def main() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.05)
        if server.started and ready is not None:
            ready(url_of(host, port, token), board if one else board.board(None))
        await task

    def terminated(signum: int, frame: Any) -> None:
        # uvicorn stops on SIGTERM, then raises the signal again under the handler it found: this one, so that
        # the board's private folder and replay's processes are removed before the process ends
        raise SystemExit(128 + signum)

    before = signal.signal(signal.SIGTERM, terminated) if threading.current_thread() is threading.main_thread() \
        else None
    try:
        asyncio.run(main())
    finally:
        board.close()
        sock.close()
        if before is not None:
            signal.signal(signal.SIGTERM, before)
    return 0


def _server(config: Any, *, sigint_ignored: bool) -> Any:
    """uvicorn's server, but a SIGINT the process came with ignored (``nohup``, ``CMD &`` in a script) stays ignored:
    uvicorn installs its own handler for it while it serves."""
    import signal

    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            if not (sigint_ignored and sig == signal.SIGINT):
                super().handle_exit(sig, frame)

    return Server(config)


def _wait_for_journal(path: Path, interval: float = 0.5, *, wait: bool | None = None) -> None:
    """Started beside the training (as ``watch`` may be): wait until ``path`` holds a journal, saying so once on
    stderr. A path whose folder does not exist is a usage error at once (a misspelt path is never waited for); a
    missing path in a folder that exists is waited for with ``wait`` (True), refused (False), or by default waited
    for with a note that says it does not exist and that waiting without ``--wait`` is deprecated."""
    import sys
    import time

    def has_journal() -> bool:
        if path.is_file():
            return True
        return path.is_dir() and any(path.glob("*.jsonl"))

    if has_journal():
        return
    if not path.exists() and not path.parent.is_dir():
        raise UsageError(f"{path}: no such file or folder, and no folder {path.parent} to wait in")
    from trainledger.journal.text import did_you_mean, missing_path_note, safe

    if not path.exists() and wait is False:
        raise UsageError(f"{path}: no such file or folder{did_you_mean(path)}")
    sys.stderr.write((missing_path_note(path, asked=bool(wait)) if not path.exists() else
                      f"waiting for {safe(str(path))} to hold a journal (Ctrl-C to stop)") + "\n")
    sys.stderr.flush()
    while not has_journal():
        time.sleep(interval)
    time.sleep(interval)  # the writer's first lines: the opening is written durably at create


def _precheck_trust(path: Path, trust: Any) -> None:
    """No key and no --trust-embedded for a signed journal: the usage error, before the port is bound."""
    if trust.keys or trust.trust_embedded:
        return
    from trainledger.journal.audit.rundir import rank_files, run_journal

    try:
        first = path if path.is_file() else (next(iter(rank_files(path).values()), None) or run_journal(path))
        with open(first, "rb") as f:
            opening = json.loads(f.readline(1 << 16) or b"{}")
    except (OSError, ValueError, TypeError, UsageError):
        return  # the board names what is wrong with the path itself
    if isinstance(opening, dict) and opening.get("key_id") is not None:
        raise UsageError("serve shows only what verifies: pass --pubkey FILE (or --trust-embedded)")


def _listen(host: str, port: int) -> Any:
    """The listening socket, bound here so that a port in use or an address not this machine's is one line
    (exit 2) before anything is read."""
    import socket

    from trainledger.journal.errors import JournalIOError

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise UsageError(f"--host {host}: {e.strerror}") from None
    family, kind, proto, _, addr = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise JournalIOError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.setblocking(False)
    return sock
