"""Peer death in a multi-process run: when one process dies, every other one prints one line and
exits with `EXIT_CODE`, instead of waiting forever or aborting with a C++ stack dump. The watch
is started by `distributed.initialize` (start-up and the same-run check are in distributed.py).

A process that dies after start-up (killed, out of memory, its host gone) leaves the others
waiting in a collective that never completes. JAX's coordination service is what notices: every
process sends it a heartbeat every `peer_timeout_s / 2` s from a C++ thread, so a long compile or
a slow step never looks like a death; a process silent for `peer_timeout_s` is declared dead and
every other process is told; when the coordinator itself (process 0) dies, the others lose their
connection to it at once. JAX then calls its client's `missed_heartbeat_callback`, whose default
aborts the process with a C++ fatal message and a stack dump (after 100 s by default). So
`distributed.initialize` passes `heartbeat_timeout_seconds=peer_timeout_s`
(`distributed.peer_timeout`: 25 s unless given or set in $CBERT_PEER_TIMEOUT_S) and a callback of
its own (`PEERS.fail`), which prints one line and exits with `EXIT_CODE`:

  distributed error: process 1 of 2 stopped responding: it exited, was killed (e.g. out of memory)
  or its host is unreachable (no heartbeat for 25 s, or its connection closed). This is process 0
  of 2, which stops too. Check process 1's log for why it stopped, then rerun the same command on
  every process to resume from the last checkpoint (...)

Bound: a survivor stops between `peer_timeout_s / 2` and `peer_timeout_s` + ~2 s after a peer's
death (heartbeats are `peer_timeout_s / 2` apart; the service checks every second), and within a
second when the coordinator died. Three workarounds for JAX 0.10.2 make this work:
- `jax.distributed.initialize` does not take the callback: while it runs, the jaxlib module it
  creates its client with is swapped for a proxy that adds it (`heartbeat_callback`).
- jaxlib cannot convert the C++ status it passes to a Python callback: calling it throws
  `std::bad_cast` on JAX's C++ thread, which ends in `std::terminate`. A std::terminate handler
  installed with ctypes turns exactly that exception into the same line; any other goes on to the
  previous handler (`_TerminateHook`). Should a later jaxlib call the callback, it does the same.
- A collective may fail first, in the main thread ("Gloo AllGather failed: ... Connection reset
  by peer"): such an error, uncaught, waits in sys.excepthook up to `peer_timeout_s` + 5 s for
  the service's verdict instead of printing a traceback (`_hold_collective_errors`).
Where a hook cannot be installed (another JAX or C++ runtime), a warning is logged and JAX's own
abort remains. A process that finishes normally waits at exit in JAX's shutdown barrier, still
sending heartbeats, until every process has finished, so one that finishes first is never
reported as dead; a peer that dies during that wait gives the same line ("... while this process
waited, at exit, for every process to finish"). Once the barrier has passed, the handler is
removed.
"""

import contextlib
import ctypes
import ctypes.util
import os
import re
import socket
import sys
import threading
import time
from typing import NoReturn

import jax
from absl import logging
from jax._src import distributed as _jax_distributed  # the hooks of the module docstring

EXIT_CODE = 4  # exit status of every multi-process failure (start-up, lost peer)
DEFAULT_PEER_TIMEOUT_S = 25  # a process silent this long is dead; the others stop <= 2 s later
PEER_TIMEOUT_ENV = "CBERT_PEER_TIMEOUT_S"  # overrides DEFAULT_PEER_TIMEOUT_S (launchers, tests)


def one_line(e: BaseException) -> str:
  return " ".join(str(e).split())


def peer_failure_message(
  process_id: int,
  num_processes: int,
  peer_timeout_s: float,
  coordinator: str | None = None,
  stage: str = "run",
  coordinator_gone: bool | None = None,
) -> str:
  """The one line (without "distributed error: ") of a survivor whose peer stopped responding.

  Args: this process's index and the process count; the heartbeat timeout; the coordinator's
  HOST:PORT; when it happened ("start-up", "run" or "shutdown"); whether the coordinator could
  not be reached (None: not checked). With 2 processes the peer is the other one; with more, it
  is process 0 when the coordinator is gone, else one of the others that the coordination
  service's log line names.
  """
  where = f" at {coordinator}" if coordinator else ""
  if num_processes == 2:
    peer = 1 - process_id
  elif process_id != 0 and coordinator_gone:
    peer = 0
  else:
    peer = None
  if peer == 0:
    who = f"process 0 of {num_processes} (the coordinator{where})"
  elif peer is not None:
    who = f"process {peer} of {num_processes}"
  elif process_id == 0:
    who = (
      f"one of processes 1..{num_processes - 1} (the coordination service's error logged just "
      "above names it)"
    )
  else:
    who = "another process (process 0's log names it)"
  when = {
    "start-up": " during start-up",
    "shutdown": " while this process waited, at exit, for every process to finish",
  }.get(stage, "")
  log = f"process {peer}'s log" if peer is not None else "the other processes' logs"
  return (
    f"{who} stopped responding{when}: it exited, was killed (e.g. out of memory) or its host "
    f"is unreachable (no heartbeat for {peer_timeout_s:g} s, or its connection closed). This "
    f"is process {process_id} of {num_processes}, which stops too. Check {log} for why it "
    "stopped, then rerun the same command on every process to resume from the last "
    f"checkpoint (a process that is only slow needs a longer --peer_timeout than "
    f"{peer_timeout_s:g} s)"
  )


class _PeerWatch:
  """Turns JAX's reaction to a lost peer (a C++ abort) into one line and EXIT_CODE.

  One per process (`PEERS`): `watch` before `jax.distributed.initialize` installs the
  std::terminate handler and records what the message needs; `joined` completes it once JAX
  knows this process's index; the shutdown hook marks the end of the run and, once JAX's
  shutdown barrier has passed, hands std::terminate back.
  """

  def __init__(self):
    self.process_id: int | None = None
    self.num_processes: int | None = None
    self.coordinator: str | None = None
    self.timeout_s = float(DEFAULT_PEER_TIMEOUT_S)
    self.stage = "start-up"
    self._terminate_hook: _TerminateHook | None = None

  def watch(
    self,
    process_id: int | None,
    num_processes: int | None,
    coordinator: str | None,
    timeout_s: float,
  ) -> None:
    self.process_id, self.num_processes, self.coordinator = process_id, num_processes, coordinator
    self.timeout_s, self.stage = timeout_s, "start-up"
    if self._terminate_hook is None:
      try:
        self._terminate_hook = _TerminateHook(self.fail)
      except (OSError, AttributeError) as e:  # no libstdc++ (another C++ runtime)
        logging.warning(
          "distributed: no std::terminate hook (%s); a process that dies makes the "
          "others abort with JAX's C++ error",
          e,
        )
    _guard_jax_shutdown(self)
    _hold_collective_errors(self)

  def joined(self, process_id: int, num_processes: int, coordinator: str | None) -> None:
    self.process_id, self.num_processes = process_id, num_processes
    self.coordinator = coordinator or self.coordinator
    self.stage = "run"

  def on_missed_heartbeat(self, *status) -> None:
    """JAX's missed_heartbeat_callback (called where jaxlib can convert its status argument)."""
    self.fail(" ".join(str(s) for s in status))

  def fail(self, detail: str = "") -> NoReturn:
    """Print the one line and exit with EXIT_CODE."""
    if detail and "bad_cast" not in detail:  # bad_cast: JAX's status was lost (module docstring)
      logging.error("distributed: JAX reported: %s", one_line(detail))
    if self.process_id is None or self.num_processes is None:  # before JAX told us who we are
      exit_with(
        f"the coordinator{f' at {self.coordinator}' if self.coordinator else ''} reported "
        "that a process stopped responding during start-up (see the error logged above); "
        "check every process's log, then rerun the same command on every process"
      )
    gone = None
    if self.num_processes > 2 and self.process_id != 0 and self.coordinator:
      gone = not _reachable(self.coordinator)
    exit_with(
      peer_failure_message(
        self.process_id, self.num_processes, self.timeout_s, self.coordinator, self.stage, gone
      )
    )

  def finished(self) -> None:
    """After a clean shutdown: nothing can fail any more; std::terminate goes back to its owner."""
    self.stage = "done"
    if self._terminate_hook is not None:
      self._terminate_hook.uninstall()
      self._terminate_hook = None


PEERS = _PeerWatch()


class _TerminateHook:
  """A std::terminate handler: std::bad_cast -> `on_bad_cast()`; anything else -> the previous one.

  jaxlib 0.10.2 cannot convert the C++ status it passes to a Python missed_heartbeat_callback,
  so calling that callback throws std::bad_cast on JAX's C++ thread, which ends in std::terminate
  (module docstring). The handler is a ctypes callback: it runs Python, so it waits for the GIL.
  """

  _HANDLER = ctypes.CFUNCTYPE(None)

  def __init__(self, on_bad_cast):
    lib = ctypes.CDLL(ctypes.util.find_library("stdc++") or "libstdc++.so.6")
    self._exception_type = getattr(lib, "__cxa_current_exception_type")
    self._exception_type.restype = ctypes.c_void_p
    self._set_terminate = lib._ZSt13set_terminatePFvvE  # std::set_terminate
    self._set_terminate.restype = ctypes.c_void_p
    self._set_terminate.argtypes = [ctypes.c_void_p]
    self._on_bad_cast = on_bad_cast
    self._handler = self._HANDLER(self._on_terminate)  # referenced here, so never collected
    self._previous = self._set_terminate(ctypes.cast(self._handler, ctypes.c_void_p))

  def _on_terminate(self) -> None:
    if self.exception_name() == "St8bad_cast":
      self._on_bad_cast()
    if self._previous:
      self._HANDLER(self._previous)()
    os.abort()

  def exception_name(self) -> str | None:
    """The mangled type name of the exception being handled (None: none)."""
    type_info = self._exception_type()
    if not type_info:
      return None
    name = ctypes.cast(type_info, ctypes.POINTER(ctypes.c_char_p))[1]  # std::type_info::__name
    return name.decode(errors="replace").lstrip("*") if name else None

  def uninstall(self) -> None:
    self._set_terminate(self._previous)


@contextlib.contextmanager
def heartbeat_callback(callback):
  """Within: JAX creates its distributed client with `missed_heartbeat_callback=callback`.

  jax.distributed.initialize does not take the callback, so the jaxlib module it calls
  `get_distributed_runtime_client` on is swapped for a proxy that adds it. Where this JAX has no
  such module or the function does not take the argument, JAX's default (an abort) stays.
  """
  real = getattr(_jax_distributed, "_jax", None)
  if real is None or not hasattr(real, "get_distributed_runtime_client"):
    logging.warning(
      "distributed: cannot set JAX's missed_heartbeat_callback (jax %s); a process "
      "that dies makes the others abort with JAX's C++ error",
      jax.__version__,
    )
    yield
    return
  _jax_distributed._jax = _ClientFactory(real, callback)
  try:
    yield
  finally:
    _jax_distributed._jax = real


class _ClientFactory:
  """jaxlib's extension module, except that clients get a missed_heartbeat_callback."""

  def __init__(self, module, callback):
    self._module, self._callback = module, callback

  def __getattr__(self, name):
    return getattr(self._module, name)

  def get_distributed_runtime_client(self, *args, **kwargs):
    try:
      return self._module.get_distributed_runtime_client(
        *args, **kwargs, missed_heartbeat_callback=self._callback
      )
    except TypeError as e:  # a jaxlib without the argument
      logging.warning("distributed: cannot set JAX's missed_heartbeat_callback (%s)", e)
      return self._module.get_distributed_runtime_client(*args, **kwargs)


def _guard_jax_shutdown(watch: _PeerWatch) -> None:
  """Make `jax.distributed.shutdown` (at exit) report a failure in one line, not a traceback.

  JAX's shutdown waits in a barrier until every process has finished; a peer that dies meanwhile
  fails it, through the callback (C++ thread) or as an exception here (this thread).
  """
  state = _jax_distributed.global_state
  if "shutdown" in vars(state):
    return

  def shutdown():
    started = watch.stage != "start-up"  # else initialize failed and has said so in its own line
    watch.stage = "shutdown"
    try:
      type(state).shutdown(state)
    except Exception as e:  # pylint: disable=broad-except (any failure here is a lost peer's)
      if started:
        watch.fail(one_line(e))
      else:
        logging.warning("distributed: shutdown after a failed start: %s", one_line(e))
    watch.finished()

  state.shutdown = shutdown


_LOST_PEER = re.compile(
  r"Gloo|Connection (reset|closed|refused)|Broken pipe|Socket closed|UNAVAILABLE"
)


def _hold_collective_errors(watch: _PeerWatch) -> None:
  """Hold back the traceback of a collective that failed because a peer died (sys.excepthook).

  A process that dies resets its collectives' connections, so a survivor's collective may raise
  (e.g. "Gloo AllGather failed: ... Connection reset by peer") before JAX's coordination service
  has declared that process dead. Such an error, when no code catches it, waits here up to
  peer_timeout_s + 5 s for that verdict, which ends the process with the one line naming the
  dead process; only without a verdict is the traceback printed.
  """
  previous = sys.excepthook
  if getattr(previous, "_cbert_peer_watch", False):
    return

  def excepthook(kind, value, tb):
    if (
      watch.stage in ("start-up", "run")
      and isinstance(value, RuntimeError)
      and type(value).__name__ in ("JaxRuntimeError", "XlaRuntimeError")
      and _LOST_PEER.search(str(value))
    ):
      wait_s = watch.timeout_s + 5
      logging.warning(
        "distributed: a collective failed (%s); waiting up to %g s for the "
        "coordination service to say which process stopped",
        one_line(value)[:300],
        wait_s,
      )
      time.sleep(wait_s)  # the verdict ends the process meanwhile (_PeerWatch.fail)
    previous(kind, value, tb)

  excepthook._cbert_peer_watch = True
  sys.excepthook = excepthook


def _reachable(address: str, timeout_s: float = 2.0) -> bool:
  """Whether a TCP connection to HOST:PORT opens within timeout_s."""
  host, _, port = address.rpartition(":")
  try:
    with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
      return True
  except (OSError, ValueError):
    return False


_EXIT_LOCK = threading.Lock()


def exit_with(message: str) -> NoReturn:
  """Print "distributed error: <message>" to stderr and os._exit(EXIT_CODE); one line per process.

  os.write, not print: this may run on a C++ thread in std::terminate. A second caller (another
  thread failing at the same time) waits here until the process has exited.
  """
  _EXIT_LOCK.acquire()
  try:
    sys.stderr.flush()
  except Exception:  # pylint: disable=broad-except
    pass
  os.write(2, f"distributed error: {message}\n".encode())
  os._exit(EXIT_CODE)
