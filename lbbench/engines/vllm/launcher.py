"""Launching local vLLM servers for a live run, and always tearing them down.

``launch(model, instances, ...)`` is a context manager that yields the
endpoints of running, healthy servers:

- with GPUs (``nvidia-smi`` works): one ``vllm serve`` per visible GPU
  (``CUDA_VISIBLE_DEVICES`` narrows the set), each pinned to its GPU;
- without GPUs: N instances of the vLLM CPU build, eager mode. Without ``cpus_per_instance`` the machine's
  cores are split between them (``VLLM_CPU_OMP_THREADS_BIND``) and the client runs anywhere, as before; with it,
  each instance is pinned to its own ``cpus_per_instance`` cores and the client to the rest, so that no two share
  compute, as GPU instances do not (``placement.py``; a layout the machine cannot hold is refused).

The URLs yielded are an :class:`Endpoints` list whose ``placement`` says which cores each instance and the
client got (run directories and fidelity reports record it).

The server command is ``vllm serve`` when a ``vllm`` on the PATH runs, else
``python -m vllm.entrypoints.openai.api_server`` with the Python of
``--vllm-python`` or of the project's ``.venv-vllm`` (``make vllm-env``).
``model == "tiny"`` serves the tiny random-weight Llama of
``lbbench.engines.vllm.tiny_model`` (created once, cached).

Every server runs in its own process group with its log in ``log_dir``. The
context manager waits for each ``/health`` (failing early, with the log's
tail, if a server exits) and on leaving — normally, by an exception, Ctrl-C or
SIGTERM — sends SIGTERM to every group, then SIGKILL to whatever is left.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

from ...errors import SetupError
from . import tiny_model
from .placement import Placement, PlacementError, available_cores, bind_current_process, bind_process, \
    cores_label, pin_client, plan_placement, shared_placement
from .tiny_model import TINY_NAME

API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"


class LaunchError(SetupError):
    """A server could not be started (the message says which and why)."""


class Endpoints(list):
    """The launched servers' base URLs, with the cores they (and the client) were given."""

    def __init__(self, urls, placement: Placement | None = None):
        super().__init__(urls)
        self.placement = placement


def placement_of(endpoints) -> dict | None:
    """The run.toml form of a launch's placement (None for endpoints that were not launched here)."""
    placement = getattr(endpoints, "placement", None)
    return placement.as_dict() if placement is not None else None


@dataclass
class Server:
    index: int
    url: str
    process: subprocess.Popen
    log_path: Path
    command: list[str]
    env: dict[str, str]


def visible_gpus() -> list[str]:
    """GPU ids this process may use: ``CUDA_VISIBLE_DEVICES`` or every GPU ``nvidia-smi`` lists."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return []
    if out.returncode != 0:
        return []
    n = sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        ids = [x.strip() for x in env.split(",") if x.strip() and x.strip() != "-1"]
        return ids
    return [str(i) for i in range(n)]


def split_cores(cores: Sequence[int], instances: int) -> list[str]:
    """Split ``cores`` into ``instances`` contiguous groups (``"0-3"``, ``"4"``);
    with fewer cores than instances, instances share cores round robin."""
    cores = sorted(cores)
    if not cores:
        raise LaunchError("no CPU cores available")
    if instances <= 0:
        raise LaunchError("instances must be >= 1")
    if len(cores) < instances:
        return [str(cores[i % len(cores)]) for i in range(instances)]
    out = []
    per, extra = divmod(len(cores), instances)
    start = 0
    for i in range(instances):
        size = per + (1 if i < extra else 0)
        group = cores[start:start + size]
        start += size
        out.append(",".join(str(c) for c in group) if group != list(range(group[0], group[-1] + 1))
                   else (str(group[0]) if len(group) == 1 else f"{group[0]}-{group[-1]}"))
    return out


def _repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def find_vllm_python(vllm_python: str | None = None) -> str | None:
    """The Python that runs vLLM: ``vllm_python``, ``$LBBENCH_VLLM_PYTHON``, or
    ``.venv-vllm`` in the working directory or the source tree; None if none exists."""
    if vllm_python:
        if not (Path(vllm_python).is_file() and os.access(vllm_python, os.X_OK)):
            raise LaunchError(f"vllm_python: not an executable file: {vllm_python}")
        return vllm_python
    env = os.environ.get("LBBENCH_VLLM_PYTHON")
    if env:
        return env
    for base in (Path.cwd(), _repo_root()):
        p = base / ".venv-vllm" / "bin" / "python"
        if p.is_file():
            return str(p)
    return None


def _vllm_on_path() -> str | None:
    exe = shutil.which("vllm")
    if exe is None:
        return None
    try:
        ok = subprocess.run([exe, "--version"], capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return None
    return exe if ok else None


def base_command(vllm_python: str | None = None) -> list[str]:
    """``[vllm, serve]`` or ``[python, -m, api_server]``; the model path follows."""
    py = find_vllm_python(vllm_python)
    if vllm_python is None:
        exe = _vllm_on_path()
        if exe is not None:
            return [exe, "serve"]
    if py is None:
        raise LaunchError("no vLLM found: no working `vllm` on the PATH and no .venv-vllm "
                          "(run `make vllm-env`, or pass --vllm-python PATH)")
    return [py, "-m", API_SERVER_MODULE]


def resolve_model(model: str, vllm_python: str | None) -> tuple[str, str]:
    """(path or hub id to serve, served model name). ``tiny`` is created on first use."""
    if model != TINY_NAME:
        return model, model
    try:
        return str(tiny_model.ensure_tiny_model()), TINY_NAME
    except ImportError:
        # this environment lacks transformers: let the vLLM environment build it
        py = find_vllm_python(vllm_python)
        if py is None:
            raise LaunchError("launch_model tiny: needs transformers here or a vLLM environment") from None
        out = subprocess.run([py, tiny_model.__file__, str(tiny_model.cache_dir())],
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise LaunchError(f"launch_model tiny: could not create the tiny model: {out.stderr[-500:]}")
        return out.stdout.strip().splitlines()[-1], TINY_NAME


def server_args(model_path: str, served_name: str, port: int, *, chunked_prefill: bool | None,
                max_num_seqs: int | None, max_num_batched_tokens: int | None, cpu: bool,
                extra_args: Sequence[str] = (), scheduling_policy: str | None = None) -> list[str]:
    args = ["--model", model_path, "--host", "127.0.0.1", "--port", str(port), "--served-model-name", served_name]
    if chunked_prefill is not None:
        args.append("--enable-chunked-prefill" if chunked_prefill else "--no-enable-chunked-prefill")
    if max_num_seqs is not None:
        args += ["--max-num-seqs", str(max_num_seqs)]
    if max_num_batched_tokens is not None:
        args += ["--max-num-batched-tokens", str(max_num_batched_tokens)]
    if scheduling_policy is not None:  # vLLM's fcfs (default) or priority (per-request priority field)
        args += ["--scheduling-policy", scheduling_policy]
    if cpu and "--enforce-eager" not in extra_args:
        args.append("--enforce-eager")
    if served_name == TINY_NAME and not any(a.startswith("--max-model-len") for a in extra_args):
        args += ["--max-model-len", "4096"]
    return args + list(extra_args)


def _check_port_free(port: int, flag_port: int) -> None:
    with socket.socket() as sock:
        # as servers bind: a port left in TIME_WAIT by a previous server is free
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            raise LaunchError(f"port_base {flag_port}: port {port} is already in use") from None


def _health_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def _tail(path: Path, n: int = 20) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_servers(servers: Sequence[Server], grace_s: float = 15.0) -> None:
    """SIGTERM every server's process group, wait up to ``grace_s``, then SIGKILL."""
    for s in servers:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(s.process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for s in servers:
        with contextlib.suppress(subprocess.TimeoutExpired):
            s.process.wait(timeout=max(0.0, deadline - time.monotonic()))
    # the leader may be gone while its children linger in the group
    while time.monotonic() < deadline and any(_group_alive(s.process.pid) for s in servers):
        time.sleep(0.1)
    for s in servers:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(s.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            s.process.wait(timeout=5)


@contextlib.contextmanager
def _terminate_on_sigterm() -> Iterator[None]:
    """Turn SIGTERM into SystemExit in the main thread, so ``finally`` blocks run."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def launch(model: str, instances: int | None = None, *, chunked_prefill: bool | None = None,
           max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None,
           extra_args: Sequence[str] = (), vllm_python: str | None = None,
           log_dir: str | Path = "logs", port_base: int = 8100, health_timeout_s: float = 600.0,
           command: Sequence[str] | None = None, stop_grace_s: float = 15.0,
           scheduling_policy: str | None = None,
           extra_env: dict[str, str] | None = None, cpu_executor: str | None = None,
           cpus_per_instance: int | None = None, front_end: str = "client",
           instance_args: dict[int, Sequence[str]] | None = None) -> Iterator[Endpoints]:
    """Start vLLM servers, wait until healthy, yield their URLs, always stop them.

    ``instance_args``: more vLLM arguments for some instances, by index, after ``extra_args`` (vLLM takes a
    flag's last value, so ``{1: ["--no-enable-chunked-prefill"]}`` runs instance 1 without chunked prefill
    whatever ``chunked_prefill`` says): one fleet whose instances run different engine settings.

    ``instances`` defaults to the number of visible GPUs (1 without GPUs).
    ``cpu_executor`` (CPU instances only): ``mp`` runs the model in a separate worker process, as vLLM's CPU
    build does by default; ``uni`` runs it in the engine-core process; ``auto`` takes ``uni`` when every
    instance has one core (see :func:`cpu_executor_for`). None: ``$LBBENCH_CPU_EXECUTOR``, else ``auto``.
    ``cpus_per_instance``: pin instance ``i`` to its own block of that many cores and this process (the client)
    to the cores left; :class:`LaunchError` when instances x N + 1 exceeds the cores this process may use. None:
    CPU instances share the machine's cores, split between them, and the client is not pinned.
    ``front_end`` (with ``cpus_per_instance``): ``client`` (default) moves each server's API server process (HTTP,
    tokenizer, detokenizer, streaming; every thread) onto the client's cores once it is healthy, leaving the
    instance's cores to its engine core (and model workers), as a GPU host leaves the GPU to the model; ``instance``
    keeps it beside the engine core, where its per-token work lengthens every step.
    ``command`` replaces the server command prefix (tests use a stand-in server);
    ``stop_grace_s`` is how long servers get between SIGTERM and SIGKILL.
    """
    gpus = visible_gpus()
    if instances is None:
        instances = max(1, len(gpus))
    if instances < 1:
        raise LaunchError("instances must be >= 1")
    bad = sorted(i for i in (instance_args or {}) if not 0 <= i < instances)
    if bad:
        raise LaunchError(f"instance_args: no instance {bad[0]} among {instances} (0 to {instances - 1})")
    if gpus and instances > len(gpus):
        raise LaunchError(f"instances {instances}: only {len(gpus)} GPU(s) visible "
                          f"({','.join(gpus)})")
    cpu = not gpus
    placement = None
    if cpus_per_instance is not None:
        try:
            placement = plan_placement(available_cores(), instances, cpus_per_instance, front_end)
        except PlacementError as exc:
            raise LaunchError(str(exc)) from None
        cores = [cores_label(block) for block in placement.instance_cores] if cpu else []
    else:
        cores = split_cores(available_cores(), instances) if cpu else []
        if cpu:
            placement = shared_placement(cores, available_cores())
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    prefix = list(command) if command is not None else base_command(vllm_python)
    model_path, served_name = resolve_model(model, vllm_python)
    choice = cpu_executor or os.environ.get("LBBENCH_CPU_EXECUTOR") or "auto"
    executor = cpu_executor_for(cores, choice) if cpu else None
    if executor == "uni" and not any(a.startswith("--distributed-executor-backend") for a in extra_args):
        extra_args = [*extra_args, "--distributed-executor-backend", "uni"]
    for i in range(instances):
        _check_port_free(port_base + i, port_base)
    servers: list[Server] = []
    with _terminate_on_sigterm():
        try:
            for i in range(instances):
                port = port_base + i
                env = dict(os.environ)
                env.update(extra_env or {})
                env.setdefault("HF_HUB_OFFLINE", "1")
                env.setdefault("VLLM_NO_USAGE_STATS", "1")
                if cpu:
                    env["VLLM_CPU_OMP_THREADS_BIND"] = cores[i]
                    # OpenMP threads that spin between steps take the cores the API server, the engine core and
                    # the client need when instances share a small machine; passive waiting yields them
                    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
                    if executor == "uni":  # vLLM's CPU platform keeps the mp executor unless this is 0
                        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
                    if served_name == TINY_NAME:
                        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
                else:
                    env["CUDA_VISIBLE_DEVICES"] = gpus[i]
                args = server_args(model_path, served_name, port, chunked_prefill=chunked_prefill,
                                   max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                                   cpu=cpu, extra_args=[*extra_args, *(instance_args or {}).get(i, ())],
                                   scheduling_policy=scheduling_policy)
                if prefix[-1] == "serve":  # `vllm serve MODEL ...` takes the model positionally
                    args = [args[1]] + args[2:]
                cmd = prefix + args
                log_path = log_dir / f"server-{i}.log"
                with open(log_path, "ab") as log:
                    log.write(f"$ {' '.join(cmd)}\n".encode())
                    log.flush()
                    pin = placement.instance_cores[i] if placement is not None and placement.pinned else None
                    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env=env, start_new_session=True,
                                            preexec_fn=(lambda c=pin: bind_current_process(c)) if pin else None)
                servers.append(Server(i, f"http://127.0.0.1:{port}", proc, log_path, cmd, env))
            _wait_healthy(servers, health_timeout_s)
            if cpu and placement is not None and placement.pinned and placement.front_end == "client":
                for s in servers:  # the server process is the API server; its engine core is a child process
                    bind_process(s.process.pid, placement.front_end_cores(s.index))
            if cpu:
                for s in servers:
                    deprioritize_workers(s.process.pid)
            client = placement.client_cores if placement is not None and placement.pinned else None
            with pin_client(client):
                yield Endpoints([s.url for s in servers], placement)
        finally:
            stop_servers(servers, stop_grace_s)


CPU_EXECUTORS = ("auto", "mp", "uni")


def cpu_executor_for(cores: Sequence[str], choice: str = "auto") -> str:
    """The executor for CPU instances bound to ``cores`` (one ``"0"`` / ``"0-3"`` string per instance).

    ``auto`` takes ``uni`` when every instance has a single core. vLLM's CPU build otherwise runs the model in a
    ``VLLM::Worker`` process that busy-polls its shared-memory queue for a second after every step; with one core
    per instance that polling competes with the engine core, the API server and the client for a core that has
    no cycles to spare, and streamed tokens reach the client in bursts. With the worker inside the engine core
    (``--distributed-executor-backend uni`` and ``VLLM_ENABLE_V1_MULTIPROCESSING=0``) the replays are steadier
    but not faster. Measured on a 2-core machine, 2 tiny-model instances, a Poisson replay of 60 requests at
    4 req/s, 4 replays each, launches interleaved: mean TTFT 49-71 ms (uni) against 65-228 ms (mp); mean E2E
    0.63-0.88 s against 0.43-0.83 s (coefficient of variation 13 % against 28 %); mean TBT 9.4-13.0 ms against
    5.7-10.9 ms, because the engine core's I/O threads then share the model's core. The mp executor's stalls
    also make a profile calibrated on one replay useless for the next: calibrated on replays whose mean TTFT was
    510 ms, it over-predicted the next replays (mean TTFT 0.1 s) by 56-76 %, where uni's stayed within 5 %
    (docs/fidelity.md). A benchmark harness needs steady numbers first, so ``auto`` takes uni there;
    ``LBBENCH_CPU_EXECUTOR=mp`` restores vLLM's default.
    With several cores per instance, vLLM's CPU platform needs the mp executor to set its OpenMP environment, so
    ``auto`` keeps it.
    """
    if choice not in CPU_EXECUTORS:
        raise LaunchError(f"LBBENCH_CPU_EXECUTOR={choice}: must be one of {', '.join(CPU_EXECUTORS)}")
    if choice != "auto":
        return choice
    return "uni" if cores and all(c.isdigit() for c in cores) and len(set(cores)) == len(cores) else "mp"


#: how much lower the scheduling priority of a CPU instance's model workers is than its front end's
WORKER_NICE_INCREMENT = 10


def deprioritize_workers(pgid: int, increment: int = WORKER_NICE_INCREMENT) -> int:
    """Lower the priority of the ``VLLM::Worker`` processes in a CPU server's process group; returns how many.

    vLLM's CPU workers keep polling their shared-memory queue for a second after every step. On a machine
    with no cores to spare for the API servers, the engine cores and the benchmark client (vLLM's CPU guide
    reserves some), that polling starves them: streamed tokens then reach the client in bursts hundreds of
    milliseconds late. With the workers at a lower priority the front ends run when they have work, and the
    workers still get every cycle the front ends leave. Linux only; elsewhere nothing is changed.
    """
    done = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)
            comm = fields[0].split("(", 1)[1]
            group = int(fields[1].split()[2])
        except (OSError, IndexError, ValueError):
            continue
        if group != pgid or not comm.startswith("VLLM::Worker"):
            continue
        pid = int(stat.parent.name)
        try:
            os.setpriority(os.PRIO_PROCESS, pid, min(19, os.getpriority(os.PRIO_PROCESS, pid) + increment))
            done += 1
        except (OSError, PermissionError):
            pass
    return done


def _wait_healthy(servers: Sequence[Server], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    pending = list(servers)
    while pending:
        for s in list(pending):
            code = s.process.poll()
            if code is not None:
                raise LaunchError(f"server {s.index} ({s.url}) exited with code {code} before it was "
                                  f"healthy; log {s.log_path}:\n{_tail(s.log_path)}")
            if _health_ok(s.url):
                pending.remove(s)
        if not pending:
            return
        if time.monotonic() > deadline:
            s = pending[0]
            raise LaunchError(f"server {s.index} ({s.url}) not healthy after {timeout_s:g}s; "
                              f"log {s.log_path}:\n{_tail(s.log_path)}")
        time.sleep(0.5)
