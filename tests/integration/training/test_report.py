"""trainledger report on a real run (checkpoints, a spike rewound, a resume), and the page in real Chromium."""

from __future__ import annotations

import base64
import io
import re
import shutil

from pathlib import Path

import pytest

from trainledger.cli import main

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


GOLDEN = Path(__file__).resolve().parents[2] / "assets" / "golden" / "resumed_rewound_v1_1.jsonl"


@pytest.fixture(scope="module")
def run(tmp_path_factory, request):
    """A tiny real run, interrupted at step 50 and resumed, with a poisoned shard the rewind policy skips: the
    signed golden tools/regen_goldens.py wrote (reused, not trained again for every test run)."""
    tmp = tmp_path_factory.mktemp("report")
    (tmp / "run").mkdir()
    shutil.copyfile(GOLDEN, tmp / "run" / "journal.jsonl")
    pub = tmp / "trainledger.pub"
    shutil.copyfile(GOLDEN.with_suffix(".pub"), pub)
    out = tmp / "report.html"
    assert main(["report", str(tmp / "run" / "journal.jsonl"), "--pubkey", str(pub), "-o", str(out)]) == 0
    return tmp, out, pub


def test_report_content(run):
    tmp, out, _ = run
    page = out.read_text()
    assert "VERIFIED" in page and "a pinned key" in page
    assert "every recorded conclusion follows from the observations" in page
    # The curves are one embedded PNG (a real image), and the page fetches nothing.
    imgs = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(imgs) == 1 and base64.b64decode(imgs[0])[:8] == b"\x89PNG\r\n\x1a\n"
    assert not re.search(r'(src|href)="(?!data:)', page) and "<script" not in page
    # Tables name what happened: the spike and its rewind, the resume, the checkpoints and which were restored.
    assert "loss_spike" in page and "rewind" in page
    assert re.search(r"<td>\d+</td><td>39</td><td>checkpoints/step-000000039.pt</td><td>checkpoint</td>", page)
    assert re.search(r"<td>\d+</td><td>120</td><td>99</td><td>checkpoints/step-000000099.pt</td>", page)
    restored = re.findall(r"<td>\d+</td><td>(\d+)</td><td>checkpoints/[^<]*</td><td>[0-9a-f]{16}</td><td>yes</td>", page)
    assert restored == ["39", "99"]
    assert "Pilot ladder" not in page  # a plain run: no empty ladder section


def test_report_renders_in_headless_chromium(run):
    if CHROMIUM is None:
        pytest.skip("chromium is not installed: bash tools/setup.sh --browser installs Debian's package")
    from matplotlib import image as mpimg
    from playwright.sync_api import sync_playwright

    tmp, out, _ = run
    errors: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        page = browser.new_page(viewport={"width": 1200, "height": 1600})
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        requests: list[str] = []
        page.on("request", lambda r: requests.append(r.url))
        page.goto(out.as_uri(), wait_until="load")
        natural = page.eval_on_selector("img", "i => [i.complete, i.naturalWidth, i.naturalHeight]")
        shot = page.screenshot(full_page=True)
        browser.close()
    assert errors == []
    assert [u for u in requests if not u.startswith(("file:", "data:"))] == []
    assert natural[0] and natural[1] > 500 and natural[2] > 500  # the embedded plot decoded
    pixels = mpimg.imread(io.BytesIO(shot), format="png")[..., :3]
    dark = (pixels.mean(axis=2) < 0.5).mean()
    assert 0.01 < dark < 0.5, f"screenshot looks blank or broken: {dark:.3%} dark pixels"
    (tmp / "screenshot.png").write_bytes(shot)


def test_report_refuses_a_tampered_journal_and_writes_nothing(run, capsys):
    tmp, _, pub = run
    src = (tmp / "run" / "journal.jsonl").read_bytes()
    bad = tmp / "bad.jsonl"
    bad.write_bytes(src.replace(b'"step":30,', b'"step":31,', 1))
    out = tmp / "bad.html"
    assert main(["report", str(bad), "--pubkey", str(pub), "-o", str(out)]) == 1
    assert "FAIL" in capsys.readouterr().out and not out.exists()
    assert main(["report", str(bad), "--pubkey", str(pub), "-o", str(tmp / "nowhere" / "x.html")]) == 2
