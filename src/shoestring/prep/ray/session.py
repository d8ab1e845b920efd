"""Ray for the length of one ``prep --executor ray``: join a cluster or start one, and fail
fast, naming the address, when none answers (`ray_session`, `check_address`)."""

from __future__ import annotations

import logging
import time
from typing import Any

from shoestring.errors import ShoestringError

WHERE = "--executor ray"  # the option errors name


# An explicit --ray-address must answer (TCP, then the GCS) within this many seconds.
CONNECT_TIMEOUT_S = 30.0


class ray_session:
    """Ray for the length of one prep: the running one, a cluster, or a local instance.

    Without an address prep starts a new local instance (``address="local"``): Ray's own
    default would join whatever address an earlier ``ray start`` left in its session files,
    and, that cluster being gone, retry for ever. An explicit address is checked first
    (`check_address`, within ``CONNECT_TIMEOUT_S``), because ``ray.init`` retries an
    unreachable one for ever, deaf to signals. While Ray runs, SIGTERM stops prep like
    Ctrl-C (``KeyboardInterrupt``): the journal keeps the finished stages.
    """

    def __init__(self, address: str | None) -> None:
        self.address = address
        self.started = False
        self._sigterm: Any = None

    def __enter__(self) -> ray_session:
        try:
            import ray
            import ray.data
        except ImportError:
            raise ShoestringError("Ray is not installed", where=WHERE,
                                  fix="pip install 'shoestring[ray]'") from None
        if not ray.is_initialized():  # (prep opens the session first; RayExecutor.run then reuses it)
            address = "local" if self.address is None else check_address(self.address)
            try:
                ray.init(address=address, include_dashboard=False,
                         logging_level=logging.ERROR, log_to_driver=False)
            except (ConnectionError, ValueError, RuntimeError) as e:
                raise _unreachable(self.address, str(e)) from None
            self.started = True
        self._stop_on_sigterm()
        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False
        ctx.print_on_execution_start = False
        ctx.execution_options.preserve_order = True
        logging.getLogger("ray.data").setLevel(logging.ERROR)
        return self

    def _stop_on_sigterm(self) -> None:
        """SIGTERM → KeyboardInterrupt (``ray.init`` installed a handler that exits with
        status 15 and no word); only the main thread can set handlers."""
        import signal
        import threading

        if threading.current_thread() is not threading.main_thread():
            return

        def interrupt(signum: int, frame: Any) -> None:
            raise KeyboardInterrupt

        self._sigterm = signal.signal(signal.SIGTERM, interrupt)

    def __exit__(self, *exc: object) -> None:
        import signal

        if self._sigterm is not None:
            signal.signal(signal.SIGTERM, self._sigterm)
        if self.started:
            import ray

            ray.shutdown()


def check_address(address: str, timeout: float = CONNECT_TIMEOUT_S) -> str:
    """``address`` ("auto" resolved to HOST:PORT) when a Ray cluster answers there within
    ``timeout`` seconds; otherwise a ``ShoestringError`` naming it."""
    import socket
    import threading

    from ray._private import services

    target = address
    if address == "auto":
        try:
            target = services.canonicalize_bootstrap_address("auto") or ""
        except (ConnectionError, ValueError) as e:
            raise _unreachable(address, str(e)) from None
    hostport = target.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise ShoestringError(f"not a Ray cluster address: {address!r}",
                              where=f"--ray-address {address}",
                              fix="give HOST:PORT (the GCS address `ray start --head` prints), "
                              "or auto")
    deadline = time.monotonic() + timeout
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as e:
        raise _unreachable(address, f"{e.strerror or e}", timeout) from None
    if "://" in target:  # Ray Client (ray://): ray.init fails fast on its own
        return address
    answer: dict[str, Any] = {}

    def probe() -> None:  # blocks in C++ (minutes) when no GCS answers: in a thread
        try:
            from ray._raylet import GcsClient

            GcsClient(address=hostport)
            answer["ok"] = True
        except Exception as e:  # whatever the GCS client raises: not reachable
            answer["error"] = e

    thread = threading.Thread(target=probe, daemon=True, name="ray-gcs-probe")
    thread.start()
    thread.join(max(0.0, deadline - time.monotonic()))
    if not answer.get("ok"):
        why = answer.get("error") or "no Ray GCS answered"
        raise _unreachable(address, str(why).splitlines()[0], timeout)
    return address


def _unreachable(address: str | None, why: str,
                 timeout: float | None = None) -> ShoestringError:
    within = f" within {timeout:.0f} s" if timeout else ""
    return ShoestringError(
        f"cannot reach a Ray cluster at {address}{within} ({why})",
        where=f"--ray-address {address}",
        fix="check the address (`ray status` on the head node prints it), start the cluster "
        "with `ray start --head`, or leave --ray-address out to start Ray on this machine")


