"""``dispatch serve``: cron, kanban and the registry follower in one long-running process.

Start-up order matters for "restarts lose no work": take the single-instance lock, open the
registry (its follower thread watches every session), register the finish listeners, adopt every
keeper left by the previous instance (finalizing those that ended meanwhile), reconcile the
board, then let cron catch up and start. Only then is ``READY=1`` sent.

The main thread owns the kanban dispatcher: it sleeps in ``poll()`` on a self-pipe (signals,
finished sessions) and the wake socket (pokes from ``dispatch kanban`` commands in other
processes) until the deadline the last :meth:`Gateway.step` returned, then steps again. One step
ticks kanban when woken, when the board version moved, or when the safety tick is due, and pings
the watchdog and refreshes the status when theirs are; it takes ``now`` from the caller, so tests
drive it with a fake clock. Cron runs on its own APScheduler thread (:mod:`dispatcher.cron.waker`).

On SIGTERM/SIGINT it stops deciding, flushes state and exits 0, leaving every worker running:
scoped workers survive the unit's stop; degraded ones are named in the log because they will
not. SIGHUP reloads the config (an invalid file is rejected and the old config kept).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import queue
import select
import signal
import threading
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from dispatcher.app.clusterstate import ClusterState
from dispatcher.app.reports import spawn_environ
from dispatcher.app.runtime import Runtime, open_runtime
from dispatcher.app.wake import WakeSocket
from dispatcher.config import load_config
from dispatcher.cron.scheduler import CronScheduler
from dispatcher.cron.waker import CronWaker
from dispatcher.cron.zones import host_zone_name
from dispatcher.errors import MissingModule
from dispatcher.gateway import summary
from dispatcher.gateway.admission import admitted
from dispatcher.gateway.exits import EXIT_FAILED, EXIT_OK, EXIT_RESTART, start_failure
from dispatcher.gateway.limits import raise_fd_limit
from dispatcher.gateway.lock import ServeLock
from dispatcher.gateway.member import Alone, open_gateway_state
from dispatcher.gateway.notify import Notifier
from dispatcher.gateway.recent import RecentErrors
from dispatcher.gateway.relaying import Relay, StartRelay
from dispatcher.gateway.reload import ReloadRecord, write_reload
from dispatcher.gateway.report import placement_of
from dispatcher.gateway.statusfile import ServeStatus, write_status
from dispatcher.kanban.store import SqlBoardStore
from dispatcher.kanban.tick import KanbanDispatcher
from dispatcher.notify.live import Notifications
from dispatcher.settings import Settings
from registry.abc import OwnerKind, Session, SessionState
from registry.errors import StateError
from scope.abc import CallerKind, Placement
from scope.foundation.clock import Clock, SystemClock
from scope.foundation.errors import DispatchError

log = logging.getLogger("dispatch.gateway")

BOARD_POLL = 0.25
"""Seconds between board-version checks (pokes usually wake the gateway sooner)."""
STATUS_INTERVAL = 5.0
"""Seconds between refreshes of the status file and the STATUS= line."""
REJECTED = "reload rejected, keeping the old config:"


class Gateway:
    """One ``dispatch serve`` process (see the module docstring)."""

    def __init__(
        self,
        *,
        settings: Settings,
        state_dir: Path,
        environ: Mapping[str, str],
        config_path: Path | None,
        clock: Clock | None = None,
        relay: StartRelay | None = None,
    ) -> None:
        self.settings = settings
        self.state_dir = Path(state_dir)
        self.environ = dict(environ)
        self.config_path = config_path
        self.clock: Clock = clock or SystemClock()
        self.notifier = Notifier(self.environ)
        self.errors = RecentErrors(self.clock)
        self._finished: queue.SimpleQueue[Session] = queue.SimpleQueue()
        self._stop = False
        self._reload = False
        self._pipe_r, self._pipe_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._started_at = self.clock.time()
        self._runtime: Runtime | None = None
        self._start_relay = relay
        self._relay: Relay | None = None
        self._cron: CronScheduler | None = None
        self._cron_waker: CronWaker | None = None
        self._notify: Notifications | None = None
        self._kanban: KanbanDispatcher | None = None
        self._store: SqlBoardStore | None = None
        self._cluster: ClusterState | None = None
        self._member = Alone(self.clock, BOARD_POLL)
        """This host in the cluster (dispatcher.gateway.member), or alone on SQLite."""
        self._board_version = -1
        self._ticks = 0
        self._next_safety = self._next_status = self._next_poll = 0.0
        self._next_watchdog: float | None = None
        self._state_problem: str | None = None
        self._reloads = 0

    # -- signals and wake-ups ----------------------------------------------------------------

    def _nudge(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._pipe_w, b"x")

    def request_stop(self, *_: object) -> None:
        """Begin a clean shutdown (SIGTERM/SIGINT handler; safe from any thread).

        The shutdown is bounded by ``serve.stop_timeout``: a tick or flush that hangs past it
        ends the process (exit 1) rather than leaving systemd to SIGKILL it later."""
        if not self._stop:
            self._stop = True
            timer = threading.Timer(self.settings.serve.stop_timeout, self._stop_overdue)
            timer.daemon = True
            timer.start()
        self._nudge()

    def _stop_overdue(self) -> None:
        log.error(
            "shutdown took longer than serve.stop_timeout (%g s); exiting now. Workers keep "
            "running and the next serve adopts them",
            self.settings.serve.stop_timeout,
        )
        logging.shutdown()
        os._exit(EXIT_FAILED)

    def request_reload(self, *_: object) -> None:
        """Reload the config at the next loop turn (SIGHUP handler)."""
        self._reload = True
        self._nudge()

    def _on_finish(self, session: Session) -> None:
        # Registry follower thread: log the event, hand over and wake the main loop.
        took = ""
        if session.started_at is not None and session.finished_at is not None:
            took = f" after {session.finished_at - session.started_at:.1f} s"
        log.info(
            "worker %s (%s) %s%s: %s",
            session.id,
            session.owner,
            session.state.value,
            took,
            session.completion_reason or "",
        )
        if session.owner.kind is OwnerKind.KANBAN:
            self._finished.put(session)
            self._nudge()

    def _install_signals(self) -> dict[int, Any]:
        previous: dict[int, Any] = {}
        for signum, handler in (
            (signal.SIGTERM, self.request_stop),
            (signal.SIGINT, self.request_stop),
            (signal.SIGHUP, self.request_reload),
        ):
            previous[signum] = signal.signal(signum, handler)
        return previous

    # -- life cycle --------------------------------------------------------------------------

    @property
    def kanban_ticks(self) -> int:
        """Kanban ticks done since start (reported in the status file)."""
        return self._ticks

    def run(self) -> int:
        """Serve until asked to stop; returns the exit status (0 or 75), or raises the
        :class:`DispatchError` that makes a start impossible (see :mod:`.exits`)."""
        lock = ServeLock(self.state_dir)
        lock.acquire()
        raise_fd_limit()
        logging.getLogger("dispatch").addHandler(self.errors)
        previous = self._install_signals()
        wake: WakeSocket | None = None
        started = False
        try:
            try:
                wake = WakeSocket(self.state_dir)
            except OSError as err:
                log.warning("no wake socket (%s); new cards wait for the next board poll", err)
            self.start()
            started = True
            if self._start_relay is not None:
                self._relay = self._start_relay(self.state_dir)
            status = self._loop(wake)
        except DispatchError as err:
            status = start_failure(err)
        except Exception as err:
            if isinstance(err, ImportError) and not started:
                # A module missing at start stays missing: one line, no restart loop.
                raise MissingModule.from_import_error(err) from None
            # An internal error, or a module missing only once running (its files were
            # upgraded under it): a fresh process may well get past it.
            log.exception("gateway failed; asking the supervisor for a restart (exit 75)")
            status = EXIT_RESTART
        finally:
            if self._relay is not None:
                self._relay.close()  # answers the commands it has started
            self.shutdown()
            if wake is not None:
                wake.close()
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            logging.getLogger("dispatch").removeHandler(self.errors)
            self.close()
            lock.release()
        return status

    def close(self) -> None:
        """Close the self-pipe (after :meth:`shutdown`; :meth:`run` calls it)."""
        for fd in (self._pipe_r, self._pipe_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._pipe_r = self._pipe_w = -1

    def start(self) -> None:
        """Open the registry, adopt, reconcile the board, start cron, send ``READY=1``.

        :meth:`run` calls it after taking the lock; tests that drive :meth:`step` call it and
        :meth:`shutdown` themselves."""
        begun = self.clock.monotonic()
        runtime = open_runtime(
            self.settings,
            self.state_dir,
            self.environ,
            caller_kind=CallerKind.KANBAN,
            follow=True,
            protect_gateway=True,
            clock=self.clock,
            fork_server=True,
        )
        try:
            # Cluster mode joins here (a duplicate host id ends the start, nothing written).
            self._cluster, self._member = open_gateway_state(
                self.settings, self.state_dir, self.environ, runtime, self._nudge, BOARD_POLL
            )
        except BaseException:
            runtime.close()
            raise
        self._runtime = runtime
        self._member = admitted(self._member, self)  # admission under pressure holds claims
        assert self._cluster is not None
        self._store = self._cluster.board
        self._kanban = self._make_kanban(self.settings)
        runtime.registry.add_finish_listener(self._on_finish)
        self._cron = CronScheduler(
            self.settings.cron,
            runtime.registry,
            runtime.db,
            clock=self._member.db_clock,
            environ=spawn_environ(self.settings, self.environ),
            state_dir=self.state_dir,
            config_path=self.config_path,
            ledger=self._cluster.ledger,
            limits=self.settings.limits,
        )
        self._cron_waker = CronWaker(self._cron)
        assert self._cluster.outbox is not None
        outbox, store = self._cluster.outbox, self._cluster.notify_store()
        self._notify = Notifications(self.settings.notify, outbox, store, self.config_path)
        self._adopt_at_start(runtime)
        self._member.start(self._cron)
        runtime.registry.prune()
        self._tick_kanban("start")
        if not self._member.cron_refused():
            self._cron_waker.start()
        self._schedule_from(self.clock.monotonic())
        self.notifier.ready(self._refresh_status())
        log.info(
            "dispatch serve ready in %.0f ms (pid %d, state dir %s)",
            (self.clock.monotonic() - begun) * 1000,
            os.getpid(),
            self.state_dir,
        )

    def _adopt_at_start(self, runtime: Runtime) -> None:
        adopted = runtime.registry.adopt()
        lost = [s for s in adopted if s.state is SessionState.LOST]
        running = [s for s in adopted if not s.finished]
        finished = len(adopted) - len(running) - len(lost)
        log.info("%s", summary.adopted(len(running), finished, len(lost)))
        for session in lost:
            log.warning(
                "worker %s (%s) was lost: %s", session.id, session.owner, session.completion_reason
            )

    def _make_kanban(self, settings: Settings) -> KanbanDispatcher:
        assert self._runtime is not None and self._store is not None
        return self._runtime.kanban_dispatcher(
            self._store, settings, self.environ, config_path=self.config_path, adopt=False
        )

    # -- the loop ----------------------------------------------------------------------------

    def _schedule_from(self, now: float) -> None:
        """Set every periodic deadline from monotonic instant ``now``."""
        watchdog = self.notifier.watchdog_interval
        self._next_safety = now + self.settings.serve.safety_tick
        self._next_status = now + STATUS_INTERVAL
        self._next_poll = now + self._member.board_poll
        self._next_watchdog = now + watchdog if watchdog else None

    def next_deadline(self) -> float:
        """The monotonic instant the next :meth:`step` is due (pokes and finished workers
        wake the loop sooner)."""
        deadlines = [self._next_safety, self._next_status, self._next_poll]
        if self._next_watchdog is not None:
            deadlines.append(self._next_watchdog)
        return min(deadlines)

    def step(self, now: float, *, poked: bool = False) -> float:
        """One pass of the loop at monotonic instant ``now``; returns :meth:`next_deadline`.

        Applies a pending reload, closes the runs of finished kanban workers, checks the board
        version when the poll is due, adopts stray sessions and ticks kanban when the safety
        tick is due, ticks kanban when ``poked`` (a wake-socket poke) or anything above asks
        for it, then pings the watchdog and refreshes the status when theirs are due."""
        if self._reload:
            self._reload = False
            self._do_reload()
            poked = True
        poked = self._member.events(self._cron, self._cron_waker) or poked
        finished = self._settle_finished()
        due = now >= self._next_safety
        if now >= self._next_poll:
            self._next_poll = now + self._member.board_poll
            poked = self._board_moved() or poked
        if due:
            self._adopt_strays()
        if (poked or finished) and self._notify is not None:
            self._notify.wake()  # the change may have queued a message: no poll's delay
        if poked or finished or due:
            self._tick_kanban("safety" if due and not (poked or finished) else "wake")
            self._next_safety = self.clock.monotonic() + self.settings.serve.safety_tick
        if self._next_watchdog is not None and now >= self._next_watchdog:
            self.notifier.watchdog()
            self._next_watchdog = now + (self.notifier.watchdog_interval or 1.0)
        if now >= self._next_status:
            self.notifier.status(self._refresh_status())
            self._next_status = now + STATUS_INTERVAL
        return self.next_deadline()

    def _loop(self, wake: WakeSocket | None) -> int:
        # poll(), not select(): with many workers open fds can pass select's 1024 limit.
        poller = select.poll()
        poller.register(self._pipe_r, select.POLLIN)
        if wake is not None:
            poller.register(wake.fileno(), select.POLLIN)
        deadline = self.next_deadline()
        while not self._stop:
            timeout = max(0.0, deadline - self.clock.monotonic())
            ready = {fd for fd, _ in poller.poll(timeout * 1000)}
            poked = False
            if self._pipe_r in ready:
                with contextlib.suppress(BlockingIOError):
                    while os.read(self._pipe_r, 4096):
                        pass
            if wake is not None and wake.fileno() in ready:
                poked = wake.drain() > 0
            if self._stop:
                break
            deadline = self.step(self.clock.monotonic(), poked=poked)
        return EXIT_OK

    def _adopt_strays(self) -> None:
        """Follow sessions other processes started and left (a ``dispatch run`` that exited),
        so their completions, heartbeats and watch events flow from here."""
        assert self._runtime is not None
        try:
            self._runtime.registry.adopt()
        except DispatchError as err:
            log.error("adopting sessions failed: %s", err)

    def _settle_finished(self) -> int:
        count = 0
        assert self._kanban is not None
        if self._member.down():
            return 0  # they stay queued, and are settled when the database answers again
        while True:
            try:
                session = self._finished.get_nowait()
            except queue.Empty:
                return count
            count += 1
            try:
                self._kanban.session_finished(session, self._member.db_clock.time())
            except DispatchError as err:
                log.error("kanban: closing the run of %s failed: %s", session.id, err)

    def _board_moved(self) -> bool:
        assert self._store is not None
        if self._member.down():
            return False
        try:
            version = self._store.board_version()
        except StateError as err:
            self._state_trouble(err)
            return False
        return version != self._board_version

    def _state_trouble(self, err: StateError | None) -> None:
        """Name a damaged or full state database once (not every poll) and when it recovers;
        workers keep running meanwhile (keepers do not need the database)."""
        if err is not None and self._state_problem != err.message:
            log.error("%s; workers keep running, no new claims until it is usable", err)
        elif err is None and self._state_problem is not None:
            log.info("state database usable again; dispatching resumes")
        self._state_problem = None if err is None else err.message

    def _tick_kanban(self, why: str) -> None:
        assert self._kanban is not None
        if self._member.down():
            return
        try:
            room = self._member.claim_room(self.settings.kanban, self.clock.monotonic())
            report = self._kanban.tick(self._member.db_clock.time(), max_claims=room)
        except StateError as err:
            self._state_trouble(err)
            return
        except DispatchError as err:
            log.error("kanban tick failed: %s", err)
            return
        self._state_trouble(None)
        self._ticks += 1
        self._board_version = report.board_version
        for warning in report.warnings:
            log.warning("kanban: %s", warning)
        if report.dispatched or report.reconciled or report.refused:
            log.debug("kanban tick (%s): %s", why, report.to_dict())

    def _do_reload(self) -> None:
        self.notifier.reloading()
        started = self.clock.time()
        try:
            loaded = load_config(self.config_path)
            if self._notify is not None:  # a bad secret file rejects the reload, changing nothing
                self._notify.apply(loaded.settings.notify)
        except DispatchError as err:
            log.error("%s %s", REJECTED, err)
            self._record_reload(started, error=err.message)
            self.notifier.ready(self._refresh_status())
            return
        new = loaded.settings
        for section in ("scope", "registry", "serve", "cluster"):
            if getattr(new, section) != getattr(self.settings, section):
                log.warning("reload: changes to %s: take effect after a restart", section)
        new = replace(
            new,
            scope=self.settings.scope,
            registry=self.settings.registry,
            serve=self.settings.serve,
            cluster=self.settings.cluster,
        )
        self.settings = new
        assert self._cron is not None
        self._cron.reload(new.cron, limits=new.limits)
        self._kanban = self._make_kanban(new)
        log.info("reloaded %s", loaded.source)
        self._record_reload(started, error=None)
        self.notifier.ready(self._refresh_status())

    def _record_reload(self, started: float, *, error: str | None) -> None:
        """Write the reload's verdict for ``dispatch reload`` (ExecReload=) and ``status``; a
        reload that worked retires the "reload rejected" entries of the recent errors."""
        self._reloads += 1
        if error is None:
            self.errors.forget(REJECTED)
        elif self._notify is not None:
            self._notify.event("reload.rejected", {"error": error}, self.clock.time())
        record = ReloadRecord(
            pid=os.getpid(),
            generation=self._reloads,
            started_at=started,
            finished_at=self.clock.time(),
            ok=error is None,
            source=str(self.config_path) if self.config_path else "built-in defaults",
            error=error,
        )
        try:
            write_reload(self.state_dir, record)
        except OSError as err:
            log.error("cannot write the reload verdict: %s", err)

    def shutdown(self) -> None:
        """Stop cron, close finished runs, warn about degraded workers, write the final status
        and close the runtime. Workers keep running."""
        self.notifier.stopping()
        waker, self._cron_waker = self._cron_waker, None
        if waker is not None:
            try:
                waker.stop()
            except StateError as err:
                log.error("stopping cron: %s", err)
            except Exception:
                log.exception("stopping cron failed")
        self._member.stop()
        if self._notify is not None:
            self._notify.close()
        runtime = self._runtime
        if runtime is None:
            return
        try:
            self._settle_finished()
            running = runtime.registry.list_sessions()
            degraded = [s for s in running if s.placement is Placement.DEGRADED]
            if degraded and self._kanban is not None:
                self._kanban.gateway_stopping(degraded, self.clock.time())
            if degraded:
                names = ", ".join(f"{s.id} ({s.owner})" for s in degraded)
                log.warning("%s", summary.degraded_lost(len(degraded), names))
            log.info("%s", summary.stopping(len(running) - len(degraded)))
            self._refresh_status(stopping=True)
        except StateError as err:
            log.error("final bookkeeping skipped: %s", err)
        except Exception:
            log.exception("final bookkeeping failed")
        finally:
            if self._cluster is not None:
                self._cluster.close()  # the cluster database's pool (nothing for a single host)
            runtime.close()
            self._runtime = None

    # -- status ------------------------------------------------------------------------------

    def placement_now(self) -> dict[str, str]:
        """What cron and kanban workers would get right now (cached probe verdict)."""
        assert self._runtime is not None
        return placement_of(self._runtime.scoper)

    def _counts(self) -> dict[str, Any]:
        assert self._runtime is not None and self._store is not None
        running = self._runtime.registry.list_sessions()
        by_kind: dict[str, int] = collections.Counter(s.owner.kind for s in running)
        counts = {} if self._member.down() else self._store.status_counts()
        cards = {status.value: n for status, n in counts.items()}
        return {"workers": dict(by_kind), "cards": cards, "keepers": self._runtime.keeper_stats()}

    def _refresh_status(self, *, stopping: bool = False) -> str:
        """Write the status file and return the STATUS= line, from one look at the sessions
        and the board (listing sessions is the expensive part with many workers)."""
        try:
            counts = self._counts()
            placement = self.placement_now()
        except StateError as err:
            self._state_trouble(err)
            return f"running; {err.describe()}; workers keep running, no new claims"
        except Exception as err:  # status must never take the gateway down
            log.exception("cannot collect the status")
            return f"running (status unavailable: {err})"
        try:
            write_status(
                self.state_dir,
                ServeStatus(
                    pid=os.getpid(),
                    started_at=self._started_at,
                    updated_at=self.clock.time(),
                    stopping=stopping,
                    placement=placement,
                    workers=counts["workers"],
                    kanban_ticks=self._ticks,
                    recent_errors=list(self.errors.items),
                    host_zone=host_zone_name(self.environ),
                    keepers=counts["keepers"],
                    relay=None if self._relay is None else self._relay.stats(),
                ),
            )
        except OSError as err:
            log.error("cannot write the status file: %s", err)
        workers = sum(counts["workers"].values())
        cards = counts["cards"]
        line = (
            f"{workers} workers; cards ready {cards.get('ready', 0)}, running "
            f"{cards.get('running', 0)}, blocked {cards.get('blocked', 0)}; placement cron "
            f"{placement['cron']}, kanban {placement['kanban']}"
        )
        note = self._member.note()
        return line if note is None else f"{note}; {line}"
