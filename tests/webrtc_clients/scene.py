"""`serve` on its default address (127.0.0.1) and a WebRTC client that knows nothing of this
project, on one machine: the client is a process of its own (aiortc_call.py, beta_call.py, or
Node's libwebrtc in node_call.cjs), run as its users run it.

    python scene.py MODEL_DIR OUT_DIR aiortc|beta|node [SECONDS]

Run by tests/test_serve_webrtc_clients.py inside a network namespace of its own where it can
(own_network.py): a loopback and one interface with an address, as a machine has, whose
packets could only go to its own peer in the namespace - and they are counted: nothing the
call does may go out of it. Writes OUT_DIR/result.json: the client's, the server's summary of
the call, its slots afterwards, and the packets the interface sent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent.parent / "benchmarks")]

from bench_serve import HELLO, ServerThread, wait_until  # noqa: E402
from own_network import NIC, sent_packets  # noqa: E402

from personaplex_edge.runtime.sampling import SamplingParams  # noqa: E402
from personaplex_edge.runtime.serve import ServeOptions  # noqa: E402

TOKEN = "the-servers-own-token"
# where scripts/install.sh puts Node's libwebrtc bindings (npm)
WRTC = Path(os.environ.get("PERSONAPLEX_WRTC", HERE.parent.parent / ".venv" / "npm"
                           / "node_modules" / "@roamhq" / "wrtc"))


def client(kind: str, url: str, seconds: float, out: Path) -> list[str]:
    if kind == "node":
        return ["node", str(HERE / "node_call.cjs"), url, str(HELLO), str(seconds), str(out)]
    script = {"aiortc": "aiortc_call.py", "beta": "beta_call.py"}[kind]
    return [sys.executable, str(HERE / script), url, str(HELLO), str(seconds), str(out)]


def main() -> int:
    model_dir, out, kind = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    seconds = float(sys.argv[4]) if len(sys.argv) > 4 else 3.0
    out.mkdir(parents=True, exist_ok=True)
    options = ServeOptions(model_dir, port=0, auth_token=TOKEN,
                           sampling=SamplingParams(greedy=True))
    env = {**os.environ, "NODE_PATH": str(WRTC.parent.parent), "OPENAI_API_KEY": TOKEN}
    with ServerThread(options) as srv:
        before = sent_packets(NIC)
        done = subprocess.run(client(kind, srv.url.rstrip("/"), seconds, out / "client.json"),
                              capture_output=True, text=True, timeout=seconds + 120, env=env)
        wait_until(lambda: srv.state.slots_used == 0, 10)
        result = {"returncode": done.returncode, "stderr": done.stderr[-3000:],
                  "summary": srv.history()[-1] if srv.history() else None,
                  "slots_used": srv.state.slots_used,
                  "sent_out": None if before is None else sent_packets(NIC) - before}
    if (out / "client.json").is_file():
        result["client"] = json.loads((out / "client.json").read_text())
    (out / "result.json").write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
