"""Tar shards (``FileDataset.from_tars``): the header parser on tars written by Python's
``tarfile`` in ustar, GNU and pax formats, the index (scan, sidecar, cache), labels, loaders
over local and HTTP shards reading exactly each member's bytes, and every fault named."""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aioloader import FileDataset, Loader
from aioloader.cli.main import main as cli
from aioloader.read import tarindex, tarranges, tarscan
from aioloader.read.tars import TarFormatError, expand_braces, group_samples, split_key


@pytest.fixture(autouse=True)
def index_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test's own index cache."""
    monkeypatch.setenv("AIOLOADER_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "tars"


def write_shard(
    path: Path, samples: list[tuple[str, dict[str, bytes]]], fmt: int = tarfile.PAX_FORMAT
) -> None:
    with tarfile.open(path, "w", format=fmt) as tar:
        for key, parts in samples:
            for ext, data in parts.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def image(s: int, k: int) -> bytes:
    return f"image {s}/{k} ".encode() * (50 + 37 * k)


def make_shards(folder: Path, count: int = 3, per: int = 5, fmt: int = tarfile.PAX_FORMAT) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for s in range(count):
        path = folder / f"train-{s:06d}.tar"
        samples = [(f"s{s}_{k:03d}", {"jpg": image(s, k), "cls": str(k % 3).encode()}) for k in range(per)]
        write_shard(path, samples, fmt)
        paths.append(path)
    return paths


def members_of(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def test_names_keys_and_braces() -> None:
    assert expand_braces("s3://b/train-{000008..000010}.tar") == [
        "s3://b/train-000008.tar",
        "s3://b/train-000009.tar",
        "s3://b/train-000010.tar",
    ]
    assert expand_braces("{a,b}-{1..2}") == ["a-1", "a-2", "b-1", "b-2"]
    assert split_key("dir/abc.seg.jpg") == ("dir/abc", "seg.jpg")
    assert split_key("abc") == ("abc", "")


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_the_index_finds_every_member_in_every_format(tmp_path: Path, fmt: int) -> None:
    """Long names (over 100 bytes) are GNU ``L`` headers or pax ``path`` records; ustar
    splits them into prefix and name."""
    path = tmp_path / "x.tar"
    key = "deep/" * 15 + "sample" if fmt != tarfile.USTAR_FORMAT else "deep/" * 15 + "s"
    samples = [(f"{key}{k}", {"jpg": image(0, k), "json": b'{"label": 7}'}) for k in range(4)]
    write_shard(path, samples, fmt)
    (members,) = tarindex.load_indexes([str(path)], None)
    with tarfile.open(path) as tar:
        want = [(m.name, m.offset_data, m.size) for m in tar.getmembers() if m.isfile()]
    assert [(m.name, m.offset, m.size) for m in members] == want
    assert [key for key, _ in group_samples(members)] == [f"{key}{k}" for k in range(4)]


def test_from_tars_gives_each_samples_image_and_label(tmp_path: Path) -> None:
    shards = make_shards(tmp_path / "d")
    ds = FileDataset.from_tars(str(tmp_path / "d" / "train-{000000..000002}.tar"))
    assert (
        len(ds) == 15
        and ds.labels is not None
        and ds.labels.tolist() == [k % 3 for _ in range(3) for k in range(5)]
    )
    for i in range(len(ds)):
        path, (offset, length) = ds.path(i), ds.span(i)  # type: ignore[misc]
        with open(path, "rb") as f:
            f.seek(offset)
            assert f.read(length) == image(i // 5, i % 5)
    assert len(FileDataset.from_tars(str(tmp_path / "d" / "*.tar"))) == 15
    assert FileDataset.from_tars(shards[0], label=None).labels is None
    write_shard(
        tmp_path / "j.tar",
        [(f"k{k}", {"png": b"x" * 9, "json": json.dumps({"y": k}).encode()}) for k in range(3)],
    )
    js = FileDataset.from_tars(tmp_path / "j.tar", label=("json", "y"))
    assert js.labels is not None and js.labels.tolist() == [0, 1, 2] and js.span(0) is not None


def read_all(loader: Loader) -> list[bytes]:
    with loader:
        return [bytes(sample) for images, _ in loader for sample in images]


def test_a_loader_reads_exactly_each_image_member(tmp_path: Path) -> None:
    shards = make_shards(tmp_path / "d", count=4, per=6)
    want = sorted(data for p in shards for name, data in members_of(p).items() if name.endswith(".jpg"))
    ds = FileDataset.from_tars([str(p) for p in shards])
    got = read_all(Loader(ds, batch_size=5, decode=None, collate=lambda s: tuple(zip(*s, strict=True))))
    assert sorted(got) == want
    halves = [
        read_all(
            Loader(
                ds,
                batch_size=5,
                decode=None,
                rank=r,
                world_size=2,
                collate=lambda s: tuple(zip(*s, strict=True)),
            )
        )
        for r in range(2)
    ]
    assert not set(halves[0]) & set(halves[1]) and sorted(halves[0] + halves[1]) == want


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, list[Path]]]:
    pytest.importorskip("aiohttp")
    from servers import start_file_server

    shards = make_shards(tmp_path / "web", count=3, per=5)
    server = start_file_server(tmp_path / "web")
    try:
        yield server.url, shards
    finally:
        server.stop()


def test_http_shards_are_indexed_in_one_pass_then_from_the_cache(served: tuple[str, list[Path]]) -> None:
    from servers import control, server_requests

    url, shards = served
    control(url, versions=True)
    urls = f"{url}/train-{{000000..000002}}.tar"
    ds = FileDataset.from_tars(urls)
    gets = {
        k: v for k, v in server_requests(url).items() if k.startswith("GET /train") and k.endswith(".tar")
    }
    assert gets == {f"GET /train-{s:06d}.tar": 1 for s in range(3)}  # one streamed GET a shard
    got = read_all(Loader(ds, batch_size=4, decode=None, collate=lambda s: tuple(zip(*s, strict=True))))
    assert sorted(got) == sorted(d for p in shards for n, d in members_of(p).items() if n.endswith(".jpg"))
    control(url, versions=True)
    again = FileDataset.from_tars(urls)
    assert [again.span(i) for i in range(len(again))] == [ds.span(i) for i in range(len(ds))]
    assert not any(k.startswith("GET /train") and k.endswith(".tar") for k in server_requests(url))
    control(
        url, versions=False
    )  # a server that gives no version: nothing to key a cached index on, scanned again
    FileDataset.from_tars(urls)
    assert (
        sum(v for k, v in server_requests(url).items() if k.startswith("GET /train") and k.endswith(".tar"))
        == 3
    )


@pytest.mark.parametrize("big", [False, True])
def test_a_remote_scan_streams_small_members_and_jumps_over_big_ones(
    served: tuple[str, list[Path]], monkeypatch: pytest.MonkeyPatch, big: bool
) -> None:
    """Ranges of ``CHUNK`` bytes where the parser reads: members smaller than a range are
    streamed through (a GET a range), a member larger is passed over by a new GET where the
    next header is, its bytes never asked for."""
    from servers import control, server_requests

    url, shards = served
    root = shards[0].parent  # what the server serves
    monkeypatch.setattr(tarranges, "CHUNK", 64 << 10)
    monkeypatch.setattr(tarranges, "JUMP", 16 << 10)
    size = 300_000 if big else 3_000
    samples = [(f"k{k:02d}", {"jpg": bytes([k]) * (size + k), "cls": str(k).encode()}) for k in range(12)]
    write_shard(root / "big.tar", samples)
    control(url)
    (members,) = tarindex.scan_fresh([f"{url}/big.tar"])
    assert [(m.name, m.size) for m in members] == [
        (f"{k}.{e}", len(d)) for k, p in samples for e, d in p.items()
    ]
    assert [m.text for m in members if m.name.endswith(".cls")] == [str(k) for k in range(12)]
    gets = server_requests(url).get("GET /big.tar", 0)
    shard_size = (root / "big.tar").stat().st_size
    if big:  # one GET a sample (a header, the label, the next header), no range of an image
        assert 12 <= gets <= 14 and shard_size > 40 * (64 << 10)
    else:  # streamed: a GET a range, the next asked ahead
        assert gets <= -(-shard_size // (64 << 10)) + 1
    assert tarscan.scan_local(str(root / "big.tar")) == members  # a seek past each member's data


def test_a_sidecar_written_by_the_command_is_read_instead_of_a_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    shards = make_shards(tmp_path / "d")
    assert cli(["index", str(tmp_path / "d" / "*.tar")]) == 0
    assert all(Path(f"{p}.idx").is_file() for p in shards)
    assert "5 members" not in capsys.readouterr().out  # 10 members: jpg and cls
    scanned = FileDataset.from_tars([str(p) for p in shards])

    def no_scan(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("scanned despite the sidecar")

    monkeypatch.setattr(tarscan, "scan", no_scan)
    monkeypatch.setenv("AIOLOADER_CACHE", str(tmp_path / "empty"))
    again = FileDataset.from_tars([str(p) for p in shards])
    assert [again.span(i) for i in range(15)] == [scanned.span(i) for i in range(15)]


def test_the_cache_is_used_until_the_shard_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, index_cache: Path
) -> None:
    (shard,) = make_shards(tmp_path / "d", count=1)
    FileDataset.from_tars(shard)
    assert len(list(index_cache.glob("*.idx"))) == 1
    real = tarscan.scan
    calls: list[str] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(tarscan, "scan", counted)
    FileDataset.from_tars(shard)
    assert calls == []
    write_shard(shard, [("a", {"jpg": b"new"})])
    os.utime(shard, ns=(1, 1))  # another mtime even within the clock's step
    ds = FileDataset.from_tars(shard, label=None)
    assert calls == [str(shard)] and len(ds) == 1


def test_faults_are_named(tmp_path: Path) -> None:
    (shard,) = make_shards(tmp_path / "d", count=1)
    data = shard.read_bytes()
    cut = tmp_path / "cut.tar"
    cut.write_bytes(data[: 512 + 300])  # inside the first member's data
    with pytest.raises(TarFormatError, match=r"cut\.tar: member 's0_000\.jpg' cut short: 300 of its"):
        FileDataset.from_tars(cut)
    garbage = tmp_path / "garbage.tar"
    garbage.write_bytes(b"this is not a tar" * 100)
    with pytest.raises(TarFormatError, match=r"garbage\.tar: not a tar header at byte 0"):
        FileDataset.from_tars(garbage)
    with pytest.raises(FileNotFoundError, match=r"shard '.*missing\.tar' does not exist"):
        FileDataset.from_tars(tmp_path / "missing.tar")
    nolabel = tmp_path / "nolabel.tar"
    write_shard(nolabel, [("a", {"jpg": b"1", "cls": b"0"}), ("b", {"jpg": b"2"})])
    with pytest.raises(ValueError, match=r"nolabel\.tar: sample 'b' has no 'cls' member"):
        FileDataset.from_tars(nolabel)
    noimage = tmp_path / "noimage.tar"
    write_shard(noimage, [("a", {"txt": b"1", "cls": b"0"})])
    with pytest.raises(ValueError, match=r"noimage\.tar: sample 'a' has no image member \(jpg, jpeg"):
        FileDataset.from_tars(noimage)
    with pytest.raises(
        ValueError, match=r"nolabel\.tar: sample 'a' has no 'png' member; it has \['cls', 'jpg'\]"
    ):
        FileDataset.from_tars(nolabel, image="png")
    with pytest.raises(
        ValueError, match=r"nolabel\.tar: sample 'a' has no 'json' member \(members=\['json'\]\)"
    ):
        FileDataset.from_tars(nolabel, members=["json"])
    with pytest.raises(ValueError, match=r"members=3 must be None, 'all' or extensions"):
        FileDataset.from_tars(nolabel, members=3)  # type: ignore[arg-type]


def test_a_shard_gone_after_indexing_is_a_read_error_skipped_and_counted(tmp_path: Path) -> None:
    shards = make_shards(tmp_path / "d", count=2, per=4)
    ds = FileDataset.from_tars([str(p) for p in shards])
    shards[1].unlink()
    loader = Loader(ds, batch_size=4, decode=None, on_error="skip", shuffle=False, collate=lambda s: s)
    with loader:
        got = [s for batch in loader for s in batch]
        failures = loader.stats.failures
    assert len(got) == 4 and failures == 4


def test_s3_shards_index_once_then_load(tmp_path: Path, moto_s3: dict[str, object]) -> None:
    """Shards in moto's S3: indexed through s3fs in one pass each, cached by ETag, read by
    byte ranges by a loader in a loader process."""
    from conftest import BUCKET
    from servers import s3_client

    shards = make_shards(tmp_path / "s3", count=2, per=4)
    client = s3_client(moto_s3)
    for p in shards:
        client.upload_file(str(p), BUCKET, f"tars/{p.name}")
    urls = f"s3://{BUCKET}/tars/train-{{000000..000001}}.tar"
    ds = FileDataset.from_tars(urls, storage_options=moto_s3)
    assert len(ds) == 8 and ds.labels is not None
    loader = Loader(
        ds, batch_size=3, decode=None, storage_options=moto_s3, collate=lambda s: tuple(zip(*s, strict=True))
    )
    want = sorted(d for p in shards for n, d in members_of(p).items() if n.endswith(".jpg"))
    assert sorted(read_all(loader)) == want
    with pytest.raises(FileNotFoundError, match=r"shard s3://aioloader-test/tars/nope\.tar does not exist"):
        FileDataset.from_tars(f"s3://{BUCKET}/tars/nope.tar", storage_options=moto_s3)


def sample_summary(sample: dict[str, Any]) -> tuple[Any, ...]:
    """A decode of the members' dict (a module-level function, as users write)."""
    return (sample["__key__"], sorted(sample), json.loads(sample["json"])["k"], len(sample["jpg"]))


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_members_reach_the_decode_as_webdatasets_dict(tmp_path: Path, fmt: int) -> None:
    """``members=`` gives the decode each sample's dict; the entry is one range of the shard,
    whatever headers (GNU long names, pax) sit between its members."""
    long = "d" * 90 if fmt != tarfile.USTAR_FORMAT else "d"
    samples = [
        (
            f"{long}/k{k:02d}",
            {"cls": b"1", "jpg": image(0, k), "json": json.dumps({"k": k}).encode(), "txt": b"t"},
        )
        for k in range(7)
    ]
    write_shard(tmp_path / "m.tar", samples, fmt)
    ds = FileDataset.from_tars(tmp_path / "m.tar", members=("json",))
    loader = Loader(ds, batch_size=3, decode=sample_summary, num_workers=1, shuffle=False, collate=list)
    with loader:
        got = [s for batch in loader for s, _ in batch]
    assert got == [(f"{long}/k{k:02d}", ["__key__", "jpg", "json"], k, len(image(0, k))) for k in range(7)]
    assert ds.member(3) == f"{long}/k03.jpg" and FileDataset([str(tmp_path / "m.tar")]).member(0) is None
    every = FileDataset.from_tars(tmp_path / "m.tar", members="all")
    loader = Loader(every, batch_size=7, decode=None, shuffle=False, collate=list)
    with loader:
        (batch,) = list(loader)
    assert [sorted(d) for d, _ in batch] == [["__key__", "cls", "jpg", "json", "txt"]] * 7
    assert [d["jpg"] for d, _ in batch] == [image(0, k) for k in range(7)] and [y for _, y in batch] == [
        1
    ] * 7


def test_members_refuse_a_decode_of_image_bytes_and_a_shrinking_cache(tmp_path: Path) -> None:
    from aioloader import Cache, ImageDecoder

    (shard,) = make_shards(tmp_path / "d", count=1)
    ds = FileDataset.from_tars(shard, members=["cls"])
    with pytest.raises(ValueError, match=r"decode=ImageDecoder\(.*takes an image's bytes.*sample\['jpg'\]"):
        Loader(ds)  # the default decode
    with pytest.raises(ValueError, match=r"decode=ImageDecoder\(.*takes an image's bytes"):
        Loader(ds, decode=ImageDecoder(32))
    with pytest.raises(ValueError, match=r"cache=Cache\(.*max_side shrinks image files"):
        Loader(ds, decode=len, cache=Cache(max_side=64))


def test_a_cached_sample_of_members_is_split_the_same(tmp_path: Path) -> None:
    from aioloader import Cache

    make_shards(tmp_path / "d", count=2, per=4)
    ds = FileDataset.from_tars(str(tmp_path / "d" / "*.tar"), members=["cls"])
    loader = Loader(ds, batch_size=4, decode=sample_keys, shuffle=False, collate=list, cache=Cache())
    with loader:
        epochs = [[s for batch in loader for s, _ in batch] for _ in range(2)]
        hits = loader.stats.cache.hits
    assert epochs[0] == epochs[1] == [(f"s{s}_{k:03d}", str(k % 3)) for s in range(2) for k in range(4)]
    assert hits == 8


def sample_keys(sample: dict[str, Any]) -> tuple[str, str]:
    return sample["__key__"], sample["cls"].decode()


def test_a_shard_cut_after_indexing_names_the_member(tmp_path: Path) -> None:
    from aioloader import ReadError

    shards = make_shards(tmp_path / "d", count=2, per=4)
    ds = FileDataset.from_tars([str(p) for p in shards])
    data = shards[1].read_bytes()
    shards[1].write_bytes(data[: ds.span(6)[0] + 10])  # type: ignore[index] # inside s1_002.jpg
    loader = Loader(ds, batch_size=4, decode=None, shuffle=False, collate=list)
    with loader, pytest.raises(ReadError) as caught:
        list(loader)
    err = caught.value
    assert err.member == "s1_002.jpg" and err.path == str(shards[1])
    assert re.search(
        r"ends after \d+ bytes \(sample 6: '.*train-000001\.tar', member 's1_002\.jpg'\)", err.summary
    )
    skipping = Loader(ds, batch_size=4, decode=None, shuffle=False, collate=list, on_error="skip")
    with skipping:
        got = sum(len(b) for b in skipping)
        failures = skipping.stats.failures
    assert got == 6 and failures == 2
