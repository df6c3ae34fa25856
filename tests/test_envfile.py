"""env_file rules shared by cron jobs and kanban assignees."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dispatcher.envfile import parse_env_text, read_env_file
from dispatcher.errors import EnvFileError


def write(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    os.chmod(path, mode)
    return path


def test_parses_names_quotes_export_and_comments(tmp_path: Path) -> None:
    path = write(tmp_path / "e", "# c\n\nA=1\nexport B = 'two words'\nC=\"x\"\nD=a=b\n")
    assert read_env_file(str(path)) == {"A": "1", "B": "two words", "C": "x", "D": "a=b"}


def test_readable_by_others_is_refused_with_the_fix(tmp_path: Path) -> None:
    path = write(tmp_path / "e", "A=1\n", 0o644)
    with pytest.raises(EnvFileError) as info:
        read_env_file(str(path))
    assert "0644" in info.value.message and "chmod 600" in info.value.message


def test_foreign_owner_is_refused(tmp_path: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to chown the file to another uid")
    path = write(tmp_path / "e", "A=1\n")
    os.chown(path, 65534, 65534)
    with pytest.raises(EnvFileError, match="owned by uid 65534"):
        read_env_file(str(path))


def test_not_a_regular_file_and_missing(tmp_path: Path) -> None:
    with pytest.raises(EnvFileError, match="not a regular file"):
        read_env_file(str(tmp_path))
    with pytest.raises(EnvFileError, match="cannot open"):
        read_env_file(str(tmp_path / "missing"))


def test_bad_line_names_its_number() -> None:
    with pytest.raises(EnvFileError) as info:
        parse_env_text("A=1\nnot a pair\n", "f.env")
    assert info.value.fields["line"] == 2
    assert "line 2" in info.value.message
