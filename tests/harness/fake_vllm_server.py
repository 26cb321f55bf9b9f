"""A stand-in for a vLLM server in launcher tests: answers /health on --port,
starts a child process (as vLLM starts its engine core) and writes both pids to
the file named by FAKE_VLLM_PIDS. FAKE_VLLM_IGNORE_TERM=1 ignores SIGTERM;
FAKE_VLLM_EXIT=CODE exits at once with that code."""

import argparse
import http.server
import os
import signal
import subprocess
import sys

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, required=True)
args, _ = parser.parse_known_args()
print("fake vllm starting", " ".join(sys.argv[1:]), flush=True)
for var in ("CUDA_VISIBLE_DEVICES", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE",
            "VLLM_ENABLE_V1_MULTIPROCESSING"):
    print(f"env {var}={os.environ.get(var)}", flush=True)
if os.environ.get("FAKE_VLLM_EXIT"):
    print("fake vllm: failing on purpose", flush=True)
    sys.exit(int(os.environ["FAKE_VLLM_EXIT"]))
if os.environ.get("FAKE_VLLM_IGNORE_TERM"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import signal, time\n"
                          "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                          "time.sleep(600)"])
pids = os.environ.get("FAKE_VLLM_PIDS")
if pids:
    with open(pids, "a") as f:
        f.write(f"{os.getpid()} {child.pid}\n")


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *a):
        pass


http.server.HTTPServer(("127.0.0.1", args.port), Handler).serve_forever()
