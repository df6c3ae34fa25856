"""Output as text: incremental UTF-8 across chunk boundaries, invalid bytes, the rolling tail."""

from __future__ import annotations

from pathlib import Path

import pytest

from registry.output.log import LogReader
from registry.output.tail import OutputTail, decode_tail


def feed_in_chunks(tail: OutputTail, data: bytes, size: int) -> None:
    for start in range(0, len(data), size):
        tail.feed(data[start : start + size])
    tail.finish()


@pytest.mark.parametrize("size", [1, 2, 3, 7, 4096])
def test_multibyte_characters_survive_any_chunking(size: int) -> None:
    text = "héllo wörld ✓ 𝄞 end\n" * 50
    tail = OutputTail(10_000)
    feed_in_chunks(tail, text.encode(), size)
    view = tail.text()
    assert view.text == text
    assert view.cut == 0
    assert tail.total_bytes == len(text.encode())
    assert tail.total_chars == len(text)


def test_invalid_bytes_and_nul_become_replacement_characters() -> None:
    tail = OutputTail(100)
    tail.feed(b"a\x00b\xff\xfec")
    tail.feed(b"\xe2\x9c")  # a cut sequence at the very end
    tail.finish()
    assert tail.text().text == "a\x00b\ufffd\ufffdc\ufffd"


def test_rolling_tail_keeps_the_end_and_counts_the_cut() -> None:
    tail = OutputTail(1000)
    for i in range(5000):
        tail.feed(f"{i:05d}\n".encode())
    view = tail.text()
    assert len(view.text) == 1000
    assert view.text.endswith("04999\n")
    assert view.cut == 5000 * 6 - 1000
    small = tail.text(12)
    assert small.text == "04998\n04999\n"
    assert small.cut == 5000 * 6 - 12


def test_decode_tail_drops_a_sequence_cut_at_the_start() -> None:
    data = "ééé".encode()
    view = decode_tail(data[1:], skipped=1, chars=10, final=True)
    assert view.text == "éé"
    assert view.cut == 2  # the skipped byte and the dropped continuation byte


def test_log_reader_reads_only_new_bytes(tmp_path: Path) -> None:
    path = tmp_path / "log"
    reader = LogReader(path)
    assert reader.read_new() == b""
    path.write_bytes(b"one\n")
    assert reader.read_new() == b"one\n"
    assert reader.read_new() == b""
    with open(path, "ab") as f:
        f.write(b"two\n")
    assert reader.read_new() == b"two\n"
    assert reader.offset == 8
