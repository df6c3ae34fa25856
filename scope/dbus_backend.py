"""The fast backend: ``StartTransientUnit`` on a persistent dbus-next connection.

Callers are synchronous and may be many threads; dbus-next is asyncio. One daemon-less helper
thread ("dispatch-scope-dbus") runs a private event loop that owns the connection; callers submit
coroutines to it and wait with a bound. The connection is made on first use, subscribed once
(``Subscribe``; the manager only signals subscribed clients) with a ``JobRemoved`` match added
before any ``StartTransientUnit``, and replaced when it drops or when discovery yields a different
bus (e.g. the bus came back, or linger was enabled).

A launch spawns the child *held* behind the gate (see :mod:`scope.gate`), asks the manager to make
a scope holding its pid, waits for the start job's ``JobRemoved`` (``done`` = the scope is active),
and only then opens the gate, so no instruction of the worker runs outside the scope. Any failure
closes the gate instead (the child exits at once) and reaps it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from dbus_next import Message, MessageType, Variant
from dbus_next.aio import MessageBus

from scope.abc import Launched, LaunchSpec, Placement, ScopeProperties
from scope.backend import UnitBackend
from scope.bus import BusInfo
from scope.cgroup import cgroup_procs
from scope.errors import BusError, ScopeError
from scope.gate import Gate, wrapped_argv
from scope.resources import bus_properties
from scope.spawn import abandon_started, start_held
from scope.translate import NO_SUCH_UNIT, ScopeStartFailed, from_dbus_reply, translate

__all__ = ["DbusBackend", "scope_properties"]

_log = logging.getLogger("dispatch.scope")

SYSTEMD = "org.freedesktop.systemd1"
SYSTEMD_PATH = "/org/freedesktop/systemd1"
MANAGER = "org.freedesktop.systemd1.Manager"
PROPERTIES = "org.freedesktop.DBus.Properties"
_KILL_NOOP = {NO_SUCH_UNIT, "org.freedesktop.systemd1.NoSuchProcess"}
_JOB_REMOVED_RULE = (
    f"type='signal',sender='{SYSTEMD}',path='{SYSTEMD_PATH}',interface='{MANAGER}',"
    "member='JobRemoved'"
)

T = TypeVar("T")


def scope_properties(
    description: str, properties: ScopeProperties, pids: list[int] | None = None
) -> list[list[Any]]:
    """The ``a(sv)`` list for ``StartTransientUnit`` (the probe and real spawns share it)."""
    props: list[list[Any]] = [
        ["Description", Variant("s", description)],
        ["CollectMode", Variant("s", "inactive-or-failed")],
    ]
    if pids:
        props.append(["PIDs", Variant("au", pids)])
    for name, signature, value in bus_properties(properties):
        props.append([name, Variant(signature, value)])
    return props


def clean_description(text: str) -> str:
    """A one-line description (control characters would garble ``systemctl`` output)."""
    return " ".join("".join(c if c.isprintable() else " " for c in text).split())[:200]


class _Connection:
    """The live bus connection and the start jobs waiting for their ``JobRemoved``.

    Only touched from the loop thread."""

    def __init__(self, bus: MessageBus, address: str) -> None:
        self.bus = bus
        self.address = address
        self.waiters: dict[str, asyncio.Future[tuple[str, str]]] = {}
        bus.add_message_handler(self._on_message)

    def _on_message(self, msg: Message) -> None:
        if (
            msg.message_type is MessageType.SIGNAL
            and msg.member == "JobRemoved"
            and msg.interface == MANAGER
        ):
            _job_id, job, unit, result = msg.body
            waiter = self.waiters.get(unit)
            if waiter is not None and not waiter.done():
                waiter.set_result((job, result))
        # Returning None leaves every message to dbus-next's own handling.

    @property
    def alive(self) -> bool:
        return bool(self.bus.connected)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.bus.disconnect()
        # Unregister the fd from the loop *before* closing it: a stale selector key would make
        # the next connection (often given the same fd number) fail to register.
        with contextlib.suppress(Exception):
            self.bus._finalize(None)
        # dbus-next shuts the socket down but never closes it; do it so fds return to baseline.
        for attr in ("_stream", "_sock"):
            handle = getattr(self.bus, attr, None)
            if handle is not None:
                with contextlib.suppress(Exception):
                    handle.close()
        for waiter in self.waiters.values():
            if not waiter.done():
                waiter.set_exception(EOFError("bus connection closed"))


class DbusBackend(UnitBackend):
    """Scopes via D-Bus (see the module docstring).

    ``discover`` is called on every operation (bus discovery is per spawn); ``timeout`` bounds
    one operation (connect + start + job) unless a call passes its own.
    """

    name = "dbus"

    def __init__(self, discover: Callable[[], BusInfo], *, timeout: float = 10.0) -> None:
        self._discover = discover
        self.timeout = timeout
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._conn: _Connection | None = None
        self._connecting: asyncio.Lock | None = None  # made and used on the loop thread only
        self._closed = False

    # -- the loop thread ---------------------------------------------------------------------

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._closed:
                raise ScopeStartFailed("the scoper is closed", backend=self.name, unit=None)
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def run() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                thread = threading.Thread(target=run, name="dispatch-scope-dbus", daemon=True)
                thread.start()
                ready.wait(5.0)
                self._loop, self._thread = loop, thread
            return self._loop

    def _run(self, coro: Coroutine[Any, Any, T], *, timeout: float, unit: str | None, op: str) -> T:
        loop = self._ensure_loop()
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError as exc:
            future.cancel()
            raise translate(exc, backend=self.name, unit=unit, op=op) from None
        except ScopeError:
            raise  # the manager answered with an error: the connection itself is fine
        except Exception as exc:
            # A connection-level failure: drop the connection so the next call reconnects.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._drop)
            raise translate(exc, backend=self.name, unit=unit, op=op) from exc

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    async def _connection(self, address: str) -> _Connection:
        conn = self._conn
        if conn is not None and conn.alive and conn.address == address:
            return conn
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        # Launches from many threads may all find no connection; only one may make it, or the
        # others' connections would be overwritten and leak.
        async with self._connecting:
            conn = self._conn
            if conn is not None and conn.alive and conn.address == address:
                return conn
            return await self._connect(address)

    async def _connect(self, address: str) -> _Connection:
        self._drop()
        bus = MessageBus(bus_address=address)
        try:
            await bus.connect()
            conn = _Connection(bus, address)
            # The match must exist before the first StartTransientUnit, or a fast job's
            # JobRemoved could pass unseen; Subscribe makes the manager send it at all.
            await self._call(
                conn,
                "org.freedesktop.DBus",
                "/org/freedesktop/DBus",
                "org.freedesktop.DBus",
                "AddMatch",
                "s",
                [_JOB_REMOVED_RULE],
                unit=None,
            )
            await self._call(conn, SYSTEMD, SYSTEMD_PATH, MANAGER, "Subscribe", "", [], unit=None)
        except BaseException:
            with contextlib.suppress(Exception):
                bus.disconnect()
            with contextlib.suppress(Exception):
                bus._finalize(None)
            for attr in ("_stream", "_sock"):
                with contextlib.suppress(Exception):
                    getattr(bus, attr).close()
            raise
        self._conn = conn
        return conn

    @staticmethod
    async def _call(
        conn: _Connection,
        destination: str,
        path: str,
        interface: str,
        member: str,
        signature: str,
        body: list[Any],
        *,
        unit: str | None,
    ) -> list[Any]:
        reply = await conn.bus.call(
            Message(
                destination=destination,
                path=path,
                interface=interface,
                member=member,
                signature=signature,
                body=body,
            )
        )
        if reply is None:
            return []
        if reply.message_type is MessageType.ERROR:
            text = reply.body[0] if reply.body else ""
            raise from_dbus_reply(reply.error_name or "?", str(text), unit=unit, op=member)
        return list(reply.body)

    def _address(self, unit: str | None) -> str:
        info = self._discover()
        if not info.bus_ok or info.bus_address is None:
            # A connection made earlier may still work, but the bus is no longer reachable by
            # name: treat it as gone, as a fresh process would.
            loop = self._loop
            if loop is not None:
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                    loop.call_soon_threadsafe(self._drop)
            raise BusError(
                f"no usable bus: {info.detail or 'no bus socket'}",
                backend=self.name,
                unit=unit,
                detail=info.detail,
            )
        return info.bus_address

    # -- operations --------------------------------------------------------------------------

    def launch(
        self,
        spec: LaunchSpec,
        unit: str,
        properties: ScopeProperties,
        *,
        timeout: float | None = None,
    ) -> Launched:
        """Spawn ``spec`` held, place it in ``unit``, then let it run (see the module doc)."""
        address = self._address(unit)
        gate = first = Gate.open()
        try:
            argv = (
                list(spec.argv)
                if spec.gated
                else wrapped_argv(spec.argv, gate.read_fd, spec.env, spec.cwd)
            )
            # A starter (the keeper fork server) may start it instead of Popen: either way the
            # child waits on its gate until the scope holds its pid.
            started, gate = start_held(spec, argv, gate)
            description = clean_description(spec.description or " ".join(spec.argv))
            try:
                self._run(
                    self._start(
                        address, unit, scope_properties(description, properties, [started.pid])
                    ),
                    timeout=self.timeout if timeout is None else timeout,
                    unit=unit,
                    op="StartTransientUnit",
                )
            except BaseException:
                gate.close()  # EOF on the gate: the held child exits without running anything
                abandon_started(started)
                raise
            gate.release()
        finally:
            first.close()
            gate.close()
        return Launched(
            process=started.process,
            pid=started.pid,
            start_time=started.start_time,
            placement=Placement.SCOPED,
            unit=unit,
            backend=self.name,
        )

    async def _start(self, address: str, unit: str, props: list[list[Any]]) -> None:
        conn = await self._connection(address)
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[tuple[str, str]] = loop.create_future()
        conn.waiters[unit] = waiter
        try:
            (job,) = await self._call(
                conn,
                SYSTEMD,
                SYSTEMD_PATH,
                MANAGER,
                "StartTransientUnit",
                "ssa(sv)a(sa(sv))",
                [unit, "fail", props, []],
                unit=unit,
            )
            got_job, result = await waiter
        finally:
            conn.waiters.pop(unit, None)
        if got_job != job:
            _log.debug("JobRemoved for %s names job %s, expected %s", unit, got_job, job)
        if result != "done":
            raise ScopeStartFailed(
                f"the start job of {unit} ended with {result!r}", backend=self.name, unit=unit
            )

    def kill_unit(self, unit: str, signal: int) -> None:
        """``KillUnit(unit, "all", signal)``; a unit that is not loaded (or empty) is a no-op."""
        address = self._address(unit)
        try:
            self._run(
                self._kill(address, unit, int(signal)),
                timeout=self.timeout,
                unit=unit,
                op="KillUnit",
            )
        except ScopeError as err:
            if err.fields.get("error_name") in _KILL_NOOP:
                return
            raise

    async def _kill(self, address: str, unit: str, signal: int) -> None:
        conn = await self._connection(address)
        await self._call(
            conn,
            SYSTEMD,
            SYSTEMD_PATH,
            MANAGER,
            "KillUnit",
            "ssi",
            [unit, "all", signal],
            unit=unit,
        )

    def control_group(self, unit: str) -> str | None:
        """The unit's ``ControlGroup`` ('' when it has none now), None when not loaded."""
        address = self._address(unit)
        try:
            return self._run(
                self._control_group(address, unit), timeout=self.timeout, unit=unit, op="GetUnit"
            )
        except ScopeError as err:
            if err.fields.get("error_name") == NO_SUCH_UNIT:
                return None
            raise

    async def _control_group(self, address: str, unit: str) -> str:
        conn = await self._connection(address)
        (path,) = await self._call(
            conn, SYSTEMD, SYSTEMD_PATH, MANAGER, "GetUnit", "s", [unit], unit=unit
        )
        (value,) = await self._call(
            conn,
            SYSTEMD,
            path,
            PROPERTIES,
            "Get",
            "ss",
            ["org.freedesktop.systemd1.Scope", "ControlGroup"],
            unit=unit,
        )
        return str(value.value)

    def unit_pids(self, unit: str) -> list[int] | None:
        control_group = self.control_group(unit)
        if control_group is None:
            return None
        return cgroup_procs(control_group) if control_group else []

    def manager_version(self) -> str:
        """The manager's ``Version`` property (doctor)."""
        address = self._address(None)
        return self._run(
            self._manager_property(address, "Version"),
            timeout=self.timeout,
            unit=None,
            op="Get Version",
        )

    async def _manager_property(self, address: str, name: str) -> str:
        conn = await self._connection(address)
        (value,) = await self._call(
            conn, SYSTEMD, SYSTEMD_PATH, PROPERTIES, "Get", "ss", [MANAGER, name], unit=None
        )
        return str(value.value)

    def manager_control_group(self) -> str:
        """The manager's ``ControlGroup`` property (which controllers it may use)."""
        address = self._address(None)
        return self._run(
            self._manager_property(address, "ControlGroup"),
            timeout=self.timeout,
            unit=None,
            op="Get ControlGroup",
        )

    def close(self) -> None:
        """Disconnect and stop the loop thread (bounded)."""
        with self._lock:
            self._closed = True
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._drop)
            loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(5.0)
        if not loop.is_running():
            loop.close()
