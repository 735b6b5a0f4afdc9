# helm test: one OIP inference per model through the gateway (standard library only).
import json
import os
import sys
import time
import urllib.request

url, timeout = os.environ["GATEWAY_URL"].rstrip("/"), float(os.environ["TIMEOUT_S"])
body = {"inputs": [{"name": "targets", "datatype": "INT64", "shape": [1],
                    "data": [int(os.environ["VERTEX"])]}]}
failed = 0
for model in os.environ["MODELS"].split(","):
    req = urllib.request.Request(f"{url}/v2/models/{model}/infer", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            out = json.load(r)
        ok = bool(out.get("outputs"))
        print(f"{model}: {r.status}, {len(out.get('outputs', []))} output(s), "
              f"{time.monotonic() - t0:.2f} s")
    except Exception as exc:  # noqa: BLE001  (any failure fails the test, said plainly)
        ok = False
        print(f"{model}: failed: {exc}")
    failed += not ok
sys.exit(1 if failed else 0)
