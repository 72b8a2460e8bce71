"""``Loader(progress=...)``: a tqdm bar per epoch on stderr with samples/s, MB/s and the
trainer's wait share (and, with a cache, its hit share and the bytes it holds); drawn on a
terminal (a real pseudo-terminal here), silent on a pipe or file unless
``progress="always"``."""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import struct
import sys
import termios
from collections.abc import Iterator
from pathlib import Path

import pytest
from frontends import Driver
from helpers import decode_number

from aioloader import Cache, Loader
from aioloader.observe.progressbar import size_text
from aioloader.synthetic import make_image_folder


def test_always_draws_a_bar_per_epoch_with_rates(
    numbered: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with Loader(numbered, batch_size=2, decode=decode_number, num_workers=1, progress="always") as loader:
        for _ in range(2):
            assert len(list(loader)) == 19
    err = capsys.readouterr().err
    assert "epoch 0" in err and "epoch 1" in err
    assert "19/19" in err
    for figure in ("samples/s", "MB/s", "waited"):
        assert figure in err, err


def test_with_a_cache_the_bar_shows_the_epochs_hit_share_and_the_bytes_held(
    numbered: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    loader = Loader(
        numbered, batch_size=4, decode=decode_number, num_workers=1, cache=Cache(), progress="always"
    )
    with loader:
        for _ in range(2):
            assert len(list(loader)) == 10
        held = loader.stats.cache
    assert held is not None and held.bytes_held == sum(Path(p).stat().st_size for p in numbered)
    err = capsys.readouterr().err
    first, second = err.split("epoch 1", 1)
    # Each epoch's last drawing is its closing one, with the figures at the end of the epoch.
    assert first.rstrip().endswith(f"cache 0% {size_text(held.bytes_held)}]"), first
    assert second.rstrip().endswith(f"cache 100% {size_text(held.bytes_held)}]"), second
    assert size_text(412_300_000) == "412MB" and size_text(1_234_000_000) == "1.2GB"
    assert size_text(35_400) == "35kB" and size_text(held.bytes_held) == "481B"


def test_true_is_silent_when_stderr_is_not_a_terminal(
    numbered: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with Loader(numbered, batch_size=4, decode=decode_number, num_workers=1, progress=True) as loader:
        list(loader)
    assert capsys.readouterr().err == ""


@contextlib.contextmanager
def stderr_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bytes]]:
    """``sys.stderr`` on a pseudo-terminal of 24 x 100; yields a list that holds, on exit,
    everything written there."""
    main, side = os.openpty()
    fcntl.ioctl(side, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    tty = io.TextIOWrapper(io.FileIO(side, "w", closefd=True), write_through=True)
    shown: list[bytes] = []
    try:
        assert tty.isatty()
        monkeypatch.setattr(sys, "stderr", tty)
        yield shown
    finally:
        monkeypatch.undo()
        tty.close()
        os.set_blocking(main, False)
        try:
            while chunk := os.read(main, 65536):
                shown.append(chunk)
        except (BlockingIOError, OSError):
            pass
        os.close(main)


def test_true_draws_on_a_terminal(numbered: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    loader = Loader(numbered, batch_size=4, decode=decode_number, num_workers=1, progress=True)
    with stderr_on_a_terminal(monkeypatch) as shown, loader:
        list(loader)
    text = b"".join(shown)
    assert b"epoch 0" in text and b"10/10" in text, text


def test_generating_a_dataset_shows_its_progress_on_a_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What ``aioloader demo`` shows while it makes its JPEGs."""
    with stderr_on_a_terminal(monkeypatch) as shown:
        make_image_folder(tmp_path / "a", num_images=12, num_classes=2, size=(32, 24), progress=True)
    assert b"generating JPEGs" in b"".join(shown) and b"12/12" in b"".join(shown)
    make_image_folder(tmp_path / "b", num_images=12, num_classes=2, size=(32, 24), progress=True)  # no tty


def test_a_bar_left_mid_epoch_is_closed(numbered: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with Loader(numbered, batch_size=2, decode=decode_number, num_workers=1, progress="always") as loader:
        for i, _ in enumerate(loader):
            if i == 3:
                break
        list(loader)  # the next epoch draws its own bar
    err = capsys.readouterr().err
    assert "epoch 0" in err and "epoch 1" in err and "19/19" in err


def test_both_front_ends_draw_the_bar(
    numbered: list[str], frontend: Driver, capsys: pytest.CaptureFixture[str]
) -> None:
    loader = Loader(numbered, batch_size=2, decode=decode_number, num_workers=1, progress="always")
    with frontend.opened(loader):
        assert len(frontend.epoch(loader)) == 19
    assert "19/19" in capsys.readouterr().err


def test_progress_takes_true_false_or_always() -> None:
    with pytest.raises(ValueError, match="progress='yes' must be True, False or 'always'"):
        Loader(["a.jpg"], progress="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="progress=1 must be True, False or 'always'"):
        Loader(["a.jpg"], progress=1)  # type: ignore[arg-type]
