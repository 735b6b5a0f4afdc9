#!/usr/bin/env bash
# Cold install to first answer on the docker platform, from images in a registry.
#
#   scripts/bench-cold-install.sh [PUSHED]     PUSHED: build/pushed-images.txt (`make push`)
#
# Removes every local copy of the pushed memory and compute images (by id: the build's tags too;
# they are put back on the pulled images at the end), then times: pulling the
# memory and compute images by digest (what a fresh node does), `gnn-faas up` on the docker
# platform with those references (functions as containers; the model and graph are prepared
# beforehand, outside the timing, as the chart's prepare Job does), and the first answer of
# POST /v2/models/bitcoin-otc/infer. Prints one JSON line:
#   {"pull_s", "up_to_ready_s", "first_answer_s", "total_s", "images": {...}}
# Needs DOCKER_HOST (an engine) and the registry of PUSHED reachable. For a cold pull point
# DOCKER_HOST at a fresh engine (`scripts/docker-engine.sh start build/docker-cold`): the
# engine that built the images keeps their layers in its build cache, so a pull there only
# fetches manifests. Noisy on a shared machine: run it on a quiet one.
set -euo pipefail
cd "$(dirname "$0")/.."
PUSHED=${1:-build/pushed-images.txt}
PY=${PYTHON:-.venv/bin/python}
GNN=${GNN_FAAS:-.venv/bin/gnn-faas}
docker=$(scripts/docker-engine.sh docker)
work=$(mktemp -d /tmp/gnn-faas-cold-XXXXXX); chmod 755 "$work"
gw=""; trap '[ -n "$gw" ] && kill "$gw" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; retag 2>/dev/null || true' EXIT
# REGISTRY/NAME:TAG@DIGEST -> REGISTRY/NAME@DIGEST (the registry may have a port)
pinned() { local r=${1%@*}; echo "${r%:*}@${1#*@}"; }
mem=$(grep '/gnn-faas-memory:' "$PUSHED"); comp=$(grep '/gnn-faas-compute:' "$PUSHED")
memd=$(pinned "$mem"); compd=$(pinned "$comp")
# the store and checkpoint, outside the timing (the prepare Job's work)
$GNN datasets prepare bitcoin-otc --store "file://$work/store" >/dev/null
$GNN train --dataset bitcoin-otc --store "file://$work/store" --arch gcn --epochs 2 \
  --out "$work/models/bitcoin-otc" >/dev/null 2>&1
chmod -R a+rX "$work"
# every local copy goes (by image id: all its tags, the build's included); the pulled images
# get the build's tags back at the end (same content, same id)
for ref in "$mem" "$comp"; do
  id=$($docker image inspect -f '{{.Id}}' "${ref%@*}" 2>/dev/null || true)
  [ -n "$id" ] && $docker image rm -f "$id" >/dev/null
done
retag() {
  for ref in "$mem" "$comp"; do
    local r=${ref%@*} local=gnn-faas-${ref##*/gnn-faas-}; local=${local%@*}
    $docker tag "$(pinned "$ref")" "$r" && $docker tag "$r" "$local" && $docker tag "$r" "${local%:*}:latest"
  done
}
port=$($PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat >"$work/serving.yaml" <<YAML
store: file://$work/store
gateway: {host: 127.0.0.1, port: $port}
platform:
  kind: docker
  docker: {memory_image: "$memd", compute_image: "$compd", start_timeout_s: 300}
models:
  - {name: bitcoin-otc, graph: bitcoin-otc, dataset: null, checkpoint: $work/models/bitcoin-otc}
YAML
t0=$($PY -c 'import time; print(time.time())')
$docker pull -q "$memd" >/dev/null
$docker pull -q "$compd" >/dev/null
t1=$($PY -c 'import time; print(time.time())')
$GNN up --config "$work/serving.yaml" >"$work/up.log" 2>&1 & gw=$!
$PY - "$port" "$t0" "$t1" "$memd" "$compd" "$work/up.log" <<'PY'
import json, sys, time, requests
port, t0, t1 = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
base = f"http://127.0.0.1:{port}"
deadline = time.time() + 600
while True:
    try:
        if requests.get(base + "/v2/health/ready", timeout=2).status_code == 200:
            break
    except requests.RequestException:
        pass
    if time.time() > deadline:
        sys.exit("gateway never ready:\n" + open(sys.argv[6]).read()[-3000:])
    time.sleep(0.05)
t2 = time.time()
body = {"inputs": [{"name": "targets", "datatype": "INT64", "shape": [1], "data": [1]}]}
r = requests.post(base + "/v2/models/bitcoin-otc/infer", json=body, timeout=600)
t3 = time.time()
if r.status_code != 200:
    sys.exit(f"first answer {r.status_code}: {r.text[:500]}")
print(json.dumps({"pull_s": round(t1 - t0, 2), "up_to_ready_s": round(t2 - t1, 2),
                  "first_answer_s": round(t3 - t2, 2), "total_s": round(t3 - t0, 2),
                  "images": {"memory": sys.argv[4], "compute": sys.argv[5]}}))
PY
