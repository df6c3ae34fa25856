"""Output hooks: transform first, then redaction, on every output handed to a program."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from registry.abc import EventType, HookContext, Owner
from registry.fake import FakeRegistry
from registry.output.hooks import OutputHooks
from registry.output.redact import Redactor
from registry.settings import RegistrySettings
from tests.support.wait import wait_for
from tests.test_events_support import ECHO, of_type, registry_at, wait_log, wait_seen
from tests.test_registry_support import request

ROOT = Path(__file__).resolve().parent.parent
OWNER = Owner(kind="kanban", id="r9")
SECRETS = {
    "sk-proj-abcdefghijklmnopqrstuvwx": "sk-***",
    "ghp_0123456789abcdefghijklmnopqrstuvwxyz": "ghp_***",
    "AKIAIOSFODNN7EXAMPLE": "AKIA***",
    "xoxb-123456789012-abcdefghij": "xoxb-***",
    "Authorization: Bearer abc.def.ghi-123": "Authorization: Bearer ***",
    "password=hunter2": "password=***",
    "GITHUB_TOKEN=abc123": "GITHUB_TOKEN=***",
    '"api_key": "k-1234"': '"api_key": "***"',
    "https://deploy:s3cret@git.example.com/repo": "https://deploy:***@git.example.com/repo",
}


@pytest.mark.parametrize(("secret", "masked"), list(SECRETS.items()), ids=list(range(len(SECRETS))))
def test_default_redaction_masks_common_token_shapes(secret: str, masked: str) -> None:
    redact = Redactor()
    assert redact(f"before {secret} after") == f"before {masked} after"
    assert redact(redact(secret)) == redact(secret)  # idempotent


@pytest.mark.parametrize(
    "plain",
    ["tokens: 5", "skip-tests", "user@example.com", "https://example.com:8080/a@b", "sk-short"],
)
def test_ordinary_output_is_left_alone(plain: str) -> None:
    assert Redactor()(plain) == plain


def test_extra_patterns_and_redaction_off() -> None:
    settings = RegistrySettings(redact=False, redact_patterns=(r"INTERNAL-\d+",))
    hooks = OutputHooks.from_settings(settings)
    text = hooks.apply(
        "INTERNAL-42 password=x", session_id="s", owner=OWNER, exit_code=None, purpose="poll"
    )
    assert text == "*** password=x"
    assert OutputHooks.from_settings(RegistrySettings(redact=False)).redactor is None


def test_a_hook_that_returns_a_secret_still_gets_it_masked(tmp_path: Path) -> None:
    seen: list[HookContext] = []

    def leak(text: str, context: HookContext) -> str:
        seen.append(context)
        return text + " sk-ant-api03-abcdefghijklmnopqrstuvwx"

    with registry_at(tmp_path / "state") as registry:
        registry.set_output_transform(leak)
        session = registry.spawn(request(ECHO, notify=True, owner=OWNER))
        registry.write_stdin(session.id, b"hello\n")
        wait_log(registry, session.id, b"hello\n")
        running = registry.poll(session.id).output
        assert running.startswith("hello\n") and running.endswith(" sk-***")
        assert registry.preview(session.id).endswith(" sk-***")
        registry.write_stdin(session.id, b"quit\n")
        done = registry.wait(session.id, timeout=10)
        assert done.snapshot.output == "hello\n sk-***"
        (event,) = of_type(registry, session.id, EventType.COMPLETION)
        assert event.output == "hello\n sk-***"
    # The hook learns the owning session (not the caller) and the exit code once known.
    assert {c.session_id for c in seen} == {session.id}
    assert {c.owner for c in seen} == {OWNER}
    by_purpose = {c.purpose: c.exit_code for c in seen}
    assert by_purpose["poll"] is None and by_purpose["preview"] is None
    assert by_purpose["wait"] == 0 and by_purpose["completion"] == 0


def test_a_hook_that_raises_is_logged_and_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(text: str, context: HookContext) -> str:
        raise RuntimeError("hook bug")

    with registry_at(tmp_path / "state", hooks=OutputHooks(broken, Redactor())) as registry:
        with caplog.at_level(logging.ERROR, logger="dispatch.registry"):
            session = registry.spawn(request(["sh", "-c", "echo token=abc; exit 0"], notify=True))
            result = registry.wait(session.id, timeout=10)
        assert result.snapshot.output == "token=***\n"  # still redacted, still delivered
        (event,) = of_type(registry, session.id, EventType.COMPLETION)
        assert event.output == "token=***\n"
        assert registry.hooks.failures >= 2
    assert "output transform hook failed" in caplog.text


def test_watch_and_heartbeat_outputs_are_redacted(tmp_path: Path) -> None:
    from tests.test_events_support import fake_clock

    clock = fake_clock()
    with registry_at(tmp_path / "state", clock) as registry:
        session = registry.spawn(request(ECHO, watch=["login"], heartbeat=60))
        registry.write_stdin(session.id, b"login with password=hunter2\n")
        wait_seen(registry, session.id, "password=***\n")
        hits = wait_for(lambda: of_type(registry, session.id, EventType.WATCH), 5)
        assert hits[0].output == "login with password=***"
        clock.advance(60)
        registry.notifier.tick()
        (beat,) = of_type(registry, session.id, EventType.HEARTBEAT)
        assert beat.output == "login with password=***\n"


def test_fake_registry_hands_out_output_through_the_same_hooks() -> None:
    fake = FakeRegistry()
    session = fake.spawn(request(["worker"], notify=True))
    fake.finish(session.id, output=b"Bearer abcdefghijkl\n")
    assert fake.poll(session.id).output == "Bearer ***\n"
    (event,) = fake.events()
    assert event.output == "Bearer ***\n" and event.type is EventType.COMPLETION


def test_dispatch_logs_is_raw_unless_redact(tmp_path: Path) -> None:
    env = dict(os.environ)
    env["DISPATCH_STATE_DIR"] = str(tmp_path / "state")
    env["XDG_CONFIG_HOME"] = str(tmp_path / "config")
    env.pop("DISPATCH_CONFIG", None)

    def dispatch(*args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [sys.executable, "-m", "dispatcher.cli.main", *args],
            capture_output=True,
            env=env,
            cwd=ROOT,
            timeout=60,
            check=False,
        )

    run = dispatch("run", "--wait", "--", "sh", "-c", "echo 'GITHUB_TOKEN=ghp_abc'; printf 'x'")
    assert run.returncode == 0, run.stderr
    sid = run.stdout.decode().strip()
    raw = dispatch("logs", sid)
    assert raw.stdout == b"GITHUB_TOKEN=ghp_abc\nx"
    masked = dispatch("logs", sid, "--redact")
    assert masked.returncode == 0, masked.stderr
    assert masked.stdout == b"GITHUB_TOKEN=***\nx"
