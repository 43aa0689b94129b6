"""Imports show how far through the file they are: every importer reads through read_lines, which tells
a progress callback (a bar on a terminal) the bytes of the file taken, compressed ones for gzip."""

from __future__ import annotations

import gzip

import pytest

from recorder.importers.common import PROGRESS_EVERY, read_lines


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_read_lines_reports_the_share_of_the_file_read(tmp_path, gz):
    n = 3 * PROGRESS_EVERY + 123
    text = b"".join(b'{"i": %d, "pad": "%s"}\n' % (i, b"x" * (i % 50)) for i in range(n))
    path = tmp_path / ("in.gz" if gz else "in.txt")
    path.write_bytes(gzip.compress(text) if gz else text)
    size = path.stat().st_size
    seen: list[tuple[int, int]] = []
    lines = list(read_lines(path, progress=lambda done, total: seen.append((done, total))))
    assert len(lines) == n
    # one call every PROGRESS_EVERY lines and one at the end, never past the file, never backwards
    assert len(seen) == n // PROGRESS_EVERY + 1 and seen[-1] == (size, size)
    done = [d for d, _ in seen]
    assert done == sorted(done) and all(0 < d <= size for d in done) and {t for _, t in seen} == {size}
    assert done[0] < size  # the first call came while reading, not only at the end


def test_no_bar_when_stdout_is_not_a_terminal(tmp_path, capsys):
    path = tmp_path / "in.txt"
    path.write_bytes(b"a\nb\n")
    assert [ln for _, ln in read_lines(path)] == [b"a", b"b"]
    assert capsys.readouterr().out == ""
