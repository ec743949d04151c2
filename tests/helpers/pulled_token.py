"""A SoftHSM token pulled out in the middle of a run (run by tests/integration/journal/test_pkcs11.py, in a process
of its own: SoftHSM reads its config once per process, and a token that went away stays gone for that process).

    python pulled_token.py WORKDIR MODE      # MODE: delay (the default policy) or strict (fail_closed_after_s=0.5)

Prints one JSON line: how many steps were appended and how long the slowest append took after the token went away,
what the journal on disk holds, and (strict) how the run failed closed.
"""

import glob
import json
import os
import subprocess
import sys
import time
from pathlib import Path

work, mode = Path(sys.argv[1]), sys.argv[2]
(work / "tokens").mkdir(parents=True)
conf = work / "softhsm2.conf"
conf.write_text(f"directories.tokendir = {work / 'tokens'}\nobjectstore.backend = file\nlog.level = ERROR\n")
os.environ["SOFTHSM2_CONF"] = str(conf)
subprocess.run(["softhsm2-util", "--init-token", "--free", "--label", "pull", "--pin", "1234", "--so-pin", "5678"],
               check=True, capture_output=True)
(work / "pin").write_text("1234")
(work / "pin").chmod(0o600)
module = next(p for p in ("/usr/lib/softhsm/libsofthsm2.so", "/usr/lib/x86_64-linux-gnu/softhsm/libsofthsm2.so")
              if Path(p).is_file())
uri = f"pkcs11:token=pull;object=run?module-path={module}&pin-source=file:{work / 'pin'}"

from trainledger.journal import Journal, StepObserved  # noqa: E402
from trainledger.journal.errors import JournalIOError  # noqa: E402
from trainledger.journal.backends.hsm import generate_pkcs11_key  # noqa: E402
from trainledger.journal.keys import load_signer  # noqa: E402

generate_pkcs11_key(uri)
(work / "run.pub").write_text(load_signer(uri).public.line() + "\n")
signer = load_signer(uri)
opts = {"fail_closed_after_s": 0.5} if mode == "strict" else {}
j = Journal.create(work / "journal.jsonl", signer=signer, seal_every=200, seal_interval_s=0.05, **opts)
for i in range(1000):
    j.append(StepObserved(step=i, loss=1.0))
j.seal(durable=True, signed=True)  # everything so far is signed by the token
token_dir = glob.glob(str(work / "tokens" / "*"))[0]
os.rename(token_dir, token_dir + ".pulled")  # the token goes away
appended, slowest, failed, t0 = 0, 0.0, None, time.monotonic()
for i in range(1000, 6000):
    a = time.perf_counter()
    try:
        j.append(StepObserved(step=i, loss=1.0))
    except JournalIOError as e:
        failed = {"at_step": i, "after_s": round(time.monotonic() - t0, 2), "error": str(e)}
        break
    slowest = max(slowest, time.perf_counter() - a)
    appended += 1
    if i % 250 == 0:
        time.sleep(0.05)  # seals come due, by count and by time, while the token is gone
j.flush()
j._sealer.sign_wait_s = 1.0  # close cannot get a signature: fail fast here (60 s by default)
try:
    j.close()
    closed = "closed"
except JournalIOError as e:
    closed = str(e)
lines = [json.loads(x) for x in (work / "journal.jsonl").read_text().splitlines()]
print(json.dumps({"appended": appended, "slowest_append_ms": round(slowest * 1e3, 3), "failed": failed,
                  "close": closed, "steps_on_disk": sum(x["kind"] == "step_observed" for x in lines),
                  "pending_seals": sum(x["kind"] == "seal" and x.get("sig") is None for x in lines)}))
