#!/usr/bin/env python3
"""The screenshots in ``docs/serve.md``, made again from real runs, in headless Chromium at 1,280 px.

    .venv/bin/python tools/serve_screenshots.py [--out docs/img]

- ``serve-ladder.png`` and ``serve-fit.png``: the main job (``trainledger ladder``, run now) and its scaling fit;
- ``serve-runs.png``: two ladders on one page: the main job run now beside the format 1.2 golden ladder
  (``tests/assets/golden/scaling_ladder_v1_2.jsonl``, the same ladder as it was sized then), smoothed;
- ``serve-run-folder.png``: two torchrun run folders (two ranks each, DDP over gloo, 60 steps), one uninterrupted and
  one whose rank 1 was SIGKILLed at step 35 and resumed by torchrun from the step-29 sharded checkpoint.

Takes about two minutes on two cores (the ladder and the two torchrun runs).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TL = str(Path(sys.executable).with_name("trainledger"))
GOLDEN = ROOT / "tests" / "assets" / "golden"
WORKER = ROOT / "tests" / "helpers" / "dist_loop_worker.py"


def run(cmd: list[str], **kw) -> None:
    out = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])}...: exit {out.returncode}\n{(out.stdout + out.stderr)[-3000:]}")


def torchrun(run_dir: Path, key: Path, steps: int, die_at: int | None, cwd: Path) -> None:
    args = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
            f"--max-restarts={1 if die_at is not None else 0}", "--monitor-interval=0.1", str(WORKER), str(run_dir),
            str(key), str(steps)] + ([str(die_at)] if die_at is not None else [])
    run(args, cwd=cwd, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=600)


class Server:
    """``trainledger serve PATHS --pubkey K...`` on a free port, until the block ends."""

    def __init__(self, paths: list[Path], keys: list[Path]) -> None:
        cmd = [TL, "serve", *map(str, paths), "--port", "0"]
        for k in keys:
            cmd += ["--pubkey", str(k)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        line = self.proc.stdout.readline()
        while line and " at http" not in line:
            line = self.proc.stdout.readline()
        if " at http" not in line:
            self.close()
            raise SystemExit(f"serve did not start: {line}")
        self.url = line.split(" at ", 1)[1].split()[0]

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self.proc.stdout.close()


def shoot(browser, url: str, out: Path, *, height: int = 1500, smoothing: float = 0.0, element: str | None = None,
          replay: bool = True) -> None:
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    page.goto(url)
    ready = "window.__trainledger && window.__trainledger.drawn > 0 && !window.__trainledger.busy"
    if replay:  # every run's replay done: the page as it stays
        ready += " && window.__trainledger.state && window.__trainledger.state.replay.state !== 'waiting' && " \
                 "window.__trainledger.state.replay.state !== 'running'"
    page.wait_for_function(f"() => {ready}", timeout=300_000, polling=50)
    if smoothing:
        page.evaluate(f"() => {{ const s = document.getElementById('smoothing'); s.value = '{smoothing}'; "
                      "s.dispatchEvent(new Event('input')); }")
    time.sleep(0.5)
    if element:
        page.locator(element).screenshot(path=str(out))
    else:
        page.screenshot(path=str(out), full_page=True, clip={"x": 0, "y": 0, "width": 1280, "height": height})
    errors = page.evaluate("() => window.__trainledger.errors")
    page.close()
    if errors:
        raise SystemExit(f"{out.name}: the page reported {errors}")
    print(f"wrote {out}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "img"))
    a = ap.parse_args()
    from playwright.sync_api import sync_playwright

    from trainledger.journal import keygen

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("chromium is not installed: bash tools/setup.sh --browser")
    out = Path(a.out)
    with tempfile.TemporaryDirectory() as tmp_:
        tmp = Path(tmp_)
        ladders = tmp / "ladders"
        t = time.perf_counter()
        run([TL, "ladder", str(ladders / "scaling-now")], env=dict(os.environ, TRAINLEDGER_KEY_DIR=str(tmp / "keys")),
            timeout=1200)
        (ladders / "scaling-format-1.2").mkdir()
        shutil.copy(GOLDEN / "scaling_ladder_v1_2.jsonl", ladders / "scaling-format-1.2" / "ladder.jsonl")
        keys = [ladders / "scaling-now" / "trainledger.pub", GOLDEN / "scaling_ladder_v1_2.pub"]
        print(f"the main job ran in {time.perf_counter() - t:.0f} s", flush=True)
        priv, pub = keygen(tmp / "ddp-keys")
        ddp = tmp / "ddp"
        ddp.mkdir()
        t = time.perf_counter()
        torchrun(ddp / "uninterrupted", priv, 60, None, tmp)
        torchrun(ddp / "rank1-killed-at-35", priv, 60, 35, tmp)
        print(f"the two torchrun runs took {time.perf_counter() - t:.0f} s", flush=True)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox", "--disable-gpu"])
            s = Server([ladders / "scaling-now"], keys[:1])
            try:
                shoot(browser, s.url, out / "serve-ladder.png")
                shoot(browser, s.url, out / "serve-fit.png", element="#fit-box")
            finally:
                s.close()
            s = Server([ladders], keys)
            try:
                shoot(browser, s.url, out / "serve-runs.png", smoothing=0.8)
            finally:
                s.close()
            s = Server([ddp], [pub])
            try:
                shoot(browser, s.url, out / "serve-run-folder.png")
            finally:
                s.close()
            browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
