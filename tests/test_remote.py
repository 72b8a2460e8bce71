"""Object storage and HTTP: real servers on loopback (tests/servers.py: moto's S3 server, an
aiohttp file server with latency and faults), real reads on the loader's event loop.

Each case runs in the trainer's process (fsspec) and in a loader process, through obstore
and through fsspec.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from helpers import RuntimeWatch, decode_number
from servers import control, s3_client, server_stats

from aioloader import FileDataset, Loader, LoaderError, LoaderTimeoutError, ReadError
from aioloader.read.backends import choose, obstore_kwargs, resolve, tokio_started

pytest.importorskip("fsspec")


@pytest.fixture(
    params=[
        {"loader_process": False},
        {"loader_process": True, "storage_backend": "obstore"},
        {"loader_process": True, "storage_backend": "fsspec"},
    ],
    ids=["thread", "process-obstore", "process-fsspec"],
)
def where(request: pytest.FixtureRequest, runtimes: RuntimeWatch) -> dict[str, Any]:
    """Where the reads run, and through which client (``aioloader.read.backends``). The
    test fails when a loader given these arguments ran elsewhere (``runtimes``, conftest.py);
    some cases also load the local copy in-process, to compare with."""
    if request.param.get("storage_backend") == "obstore":
        pytest.importorskip("obstore")
    runtimes.expect(request.param["loader_process"], in_process_too=True)
    return dict(request.param)


def values(batches: list[Any]) -> list[list[int]]:
    return [[int(v) for v in b] for b in batches]


def test_s3_batches_equal_those_of_the_local_copy(
    moto_s3: dict[str, object], numbered: list[str], where: dict[str, Any]
) -> None:
    urls = [f"s3://aioloader-test/numbered/{os.path.basename(p)}" for p in numbered]
    kw: dict[str, Any] = {"batch_size": 5, "decode": decode_number, "seed": 7, "num_workers": 2}
    with Loader(urls, storage_options=moto_s3, **where, **kw) as loader:
        remote = [values(list(loader)) for _ in range(2)]
        stats = loader.stats
    with Loader(numbered, loader_process=False, **kw) as loader:
        local = [values(list(loader)) for _ in range(2)]
    assert remote == local
    assert stats.bytes_read == 2 * sum(os.path.getsize(p) for p in numbered)


def test_http_urls_file_urls_and_paths_mix(
    http_files: str, numbered: list[str], where: dict[str, Any]
) -> None:
    names = [os.path.basename(p) for p in numbered]
    mixed = [
        f"{http_files}/{n}" if i % 3 == 0 else (f"file://{p}" if i % 3 == 1 else p)
        for i, (n, p) in enumerate(zip(names, numbered, strict=True))
    ]
    with Loader(mixed, batch_size=4, decode=decode_number, shuffle=False, num_workers=1, **where) as loader:
        assert [v for b in values(list(loader)) for v in b] == list(range(len(numbered)))


def test_a_missing_object_is_a_read_error_naming_the_url(
    moto_s3: dict[str, object], numbered: list[str], where: dict[str, Any]
) -> None:
    urls = [f"s3://aioloader-test/numbered/{os.path.basename(p)}" for p in numbered[:4]]
    missing = "s3://aioloader-test/numbered/nope.txt"
    opts: dict[str, Any] = {"storage_options": moto_s3, **where, "num_workers": 1}
    loader = Loader([*urls, missing], batch_size=5, decode=decode_number, shuffle=False, **opts)
    with loader, pytest.raises(ReadError, match="not found") as info:
        list(loader)
    assert info.value.path == missing and info.value.index == 4
    with Loader(
        [*urls, missing], batch_size=5, decode=decode_number, shuffle=False, on_error="skip", **opts
    ) as loader:
        assert values(list(loader)) == [[0, 1, 2, 3]]
        assert loader.stats.failures_by_reason == {"ReadError": 1}
        assert loader.stats.last_failed_paths == (missing,)


def test_throttling_and_cut_bodies_are_retried_and_counted(
    http_files: str, numbered: list[str], where: dict[str, Any]
) -> None:
    """Every object answers 503 twice before it is served, and every 7th response is cut off
    halfway: each sample still arrives exactly once, whole, and the retries are counted."""
    control(http_files, fail_first=2, reset_every=7)
    urls = [f"{http_files}/{os.path.basename(p)}" for p in numbered]
    with Loader(
        urls,
        batch_size=8,
        decode=decode_number,
        shuffle=False,
        num_workers=1,
        read_retries=4,
        **where,
    ) as loader:
        got = [v for b in values(list(loader)) for v in b]
        stats = loader.stats
    assert got == list(range(len(numbered)))
    assert stats.read_retries >= 2 * len(numbered) and stats.failures == 0


def test_an_unreachable_endpoint_is_one_loader_error(numbered: list[str], where: dict[str, Any]) -> None:
    from servers import free_port

    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    urls = [f"{dead}/{os.path.basename(p)}" for p in numbered]
    with (
        Loader(urls, batch_size=4, decode=decode_number, on_error="skip", num_workers=1, **where) as loader,
        pytest.raises(LoaderError, match="cannot reach the http:// endpoint") as info,
    ):
        list(loader)
    assert not isinstance(info.value, ReadError)  # not per sample: on_error="skip" does not hide it


def test_credentials_are_never_shown(moto_s3: dict[str, object], numbered: list[str], tmp_path: Path) -> None:
    secret = str(moto_s3["secret"])
    missing = "s3://aioloader-test/numbered/nope.txt"
    urls = [f"s3://aioloader-test/numbered/{os.path.basename(p)}" for p in numbered[:3]] + [missing]
    with Loader(
        urls, batch_size=2, decode=decode_number, on_error="skip", num_workers=1, storage_options=moto_s3
    ) as loader:
        list(loader)
        shown = [repr(loader), repr(loader.config), repr(loader.stats), json.dumps(loader.state_dict())]
    assert not any(secret in s for s in shown)
    # A URL that carries a user and a signed query: its errors show neither.
    signed = "http://user:pa55word@127.0.0.1:1/obj.txt?X-Amz-Signature=abcdef123&part=2"
    loader = Loader([signed], batch_size=1, decode=decode_number, num_workers=1)
    with loader, pytest.raises(LoaderError) as info:
        list(loader)
    text = str(info.value)
    assert "pa55word" not in text and "abcdef123" not in text and "127.0.0.1:1" in text


def test_thousands_of_reads_in_flight_cost_no_threads(http_files: str, numbered: list[str]) -> None:
    """2,048 reads of the file server, all in flight at once: the server holds every request
    until 2,048 are open together (a loader that read fewer at a time would get no answer
    before the server's hang guard), and no I/O thread is started for them."""
    n = 2048
    control(http_files, hold_until=n)
    before = server_stats(http_files)["requests"]
    names = [os.path.basename(p) for p in numbered]
    urls = [f"{http_files}/{names[i % len(names)]}" for i in range(n)]
    with Loader(
        urls, batch_size=64, shuffle=False, decode=decode_number, num_workers=1, io_concurrency=n
    ) as loader:
        got = [v for b in values(list(loader)) for v in b]
        io_threads = [t.name for t in threading.enumerate() if t.name.startswith("aioloader-io")]
    assert got == [i % len(names) for i in range(n)]
    assert io_threads == []
    assert server_stats(http_files) == {"requests": before + n, "max_in_flight": n}  # one request a read


def test_from_folder_on_a_bucket_matches_the_local_folder(
    moto_s3: dict[str, object], image_folder: Path
) -> None:
    """The same ImageFolder, on disk and uploaded under a prefix (with a hidden object and
    a file of another type beside the images): same classes, same labels, same order."""
    client = s3_client(moto_s3)
    for path in sorted(image_folder.rglob("*")):
        if path.is_file():
            client.upload_file(str(path), "aioloader-test", f"folder/{path.relative_to(image_folder)}")
    client.put_object(Bucket="aioloader-test", Key="folder/class_00/.hidden.jpg", Body=b"x")
    client.put_object(Bucket="aioloader-test", Key="folder/class_00/notes.txt", Body=b"x")
    local = FileDataset.from_folder(image_folder)
    remote = FileDataset.from_folder("s3://aioloader-test/folder/", storage_options=moto_s3)
    assert remote.classes == local.classes
    rel = [p.split("/folder/", 1)[1] for p in remote.paths]
    assert rel == [os.path.relpath(p, image_folder) for p in local.paths]
    assert remote.labels is not None and local.labels is not None
    assert remote.labels.tolist() == local.labels.tolist()
    assert all(p.startswith("s3://aioloader-test/folder/") for p in remote.paths)
    with Loader(remote, batch_size=8, num_workers=1, storage_options=moto_s3, shuffle=False) as loader:
        images, labels = next(iter(loader))
    assert images.shape == (8, 3, 224, 224) and labels.tolist() == local.labels[:8].tolist()


def test_a_protocol_whose_backend_is_missing_names_the_install(numbered: list[str]) -> None:
    pytest.importorskip("fsspec")
    try:
        import gcsfs  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("gcsfs is installed here")
    loader = Loader(["gs://bucket/a.jpg"], batch_size=1, decode=decode_number, num_workers=1)
    with loader, pytest.raises(LoaderError, match=r"pip install 'aioloader\[remote\]' gcsfs"):
        list(loader)


def test_refused_credentials_stop_the_loader_once(numbered: list[str], where: dict[str, Any]) -> None:
    """A server that checks credentials refuses ours: one LoaderError before any batch,
    even with ``on_error="skip"``, naming the code and not the secret."""
    pytest.importorskip("moto")
    from servers import start_moto

    server = start_moto(check_credentials=True)
    try:
        options = {"endpoint_url": server.url, "key": "nobody", "secret": "wrong-secret-xyz"}
        urls = [f"s3://aioloader-test/numbered/{os.path.basename(p)}" for p in numbered]
        loader = Loader(
            urls,
            batch_size=4,
            decode=decode_number,
            on_error="skip",
            num_workers=1,
            storage_options={**options, "client_kwargs": {"region_name": "us-east-1"}},
            **where,
        )
        with (
            loader,
            pytest.raises(
                LoaderError, match=r"credentials for s3:// were refused \(InvalidAccessKeyId\)"
            ) as info,
        ):
            next(iter(loader))
        assert not isinstance(info.value, ReadError) and "wrong-secret-xyz" not in str(info.value)
        assert loader.stats.failures == 0
    finally:
        server.stop()


def test_samples_inside_a_shard_are_read_by_byte_range(
    tmp_path: Path, moto_s3: dict[str, object], http_files: str, numbered: list[str], where: dict[str, Any]
) -> None:
    """Every numbered file concatenated into one shard (with junk between them): entries
    ``(shard, offset, length)`` give the same samples, from disk, over HTTP and from S3."""
    pytest.importorskip("boto3")
    shard = Path(numbered[0]).parent / "shard.bin"  # served by http_files too
    entries: list[tuple[int, int]] = []
    with open(shard, "wb") as f:
        for p in numbered:
            f.write(b"\x00junk\x00")
            data = Path(p).read_bytes()
            entries.append((f.tell(), len(data)))
            f.write(data)
    client = s3_client(moto_s3)
    client.upload_file(str(shard), "aioloader-test", "shards/shard.bin")
    sources = [str(shard), f"{http_files}/shard.bin", "s3://aioloader-test/shards/shard.bin"]
    for source in sources:
        ds = FileDataset([(source, off, n) for off, n in entries], list(range(len(entries))))
        assert ds.span(3) == entries[3] and ds.path(3) == source
        with Loader(
            ds,
            batch_size=6,
            decode=decode_number,
            shuffle=False,
            num_workers=1,
            storage_options={"s3": moto_s3},  # per protocol: the http:// URL gets none of it
            **where,
        ) as loader:
            got = [(int(v), int(label)) for x, y in loader for v, label in zip(x, y, strict=True)]
        assert got == [(n, n) for n in range(len(numbered))], source
    # A span past the end of the object is that sample's ReadError.
    bad = FileDataset([(str(shard), shard.stat().st_size - 3, 10)])
    loader = Loader(bad, batch_size=1, decode=decode_number, num_workers=1, **where)
    with loader, pytest.raises(ReadError, match="ends after"):
        list(loader)
    # A flat dict of S3 options given to an http:// URL: one clear error, not one per sample.
    flat = FileDataset([(f"{http_files}/shard.bin", off, n) for off, n in entries])
    opts = {"on_error": "skip", "storage_options": moto_s3, "loader_process": False}
    loader = Loader(flat, batch_size=6, decode=decode_number, **opts)
    with loader, pytest.raises(LoaderError, match="a dict per protocol"):
        list(loader)
    shard.unlink()


def test_each_backend_reads_in_the_loader_process_it_was_asked_for(
    http_files: str, numbered: list[str]
) -> None:
    """obstore runs its tokio threads in the loader process, never in the trainer's; fsspec
    starts none. Both give the same batches."""
    pytest.importorskip("obstore")
    from test_loader_process import loader_pid

    urls = [f"{http_files}/{os.path.basename(p)}" for p in numbered]
    got = {}
    for backend in ("obstore", "fsspec"):
        with Loader(
            urls,
            batch_size=6,
            decode=decode_number,
            num_workers=1,
            seed=3,
            loader_process=True,
            storage_backend=backend,
        ) as loader:
            got[backend] = values(list(loader))
            names = set()
            for tid in os.listdir(f"/proc/{loader_pid()}/task"):
                with open(f"/proc/{loader_pid()}/task/{tid}/comm") as f:
                    names.add(f.read().strip())
        assert any(n.startswith("tokio") for n in names) == (backend == "obstore"), names
    assert got["obstore"] == got["fsspec"]
    assert not tokio_started()  # the trainer's process never ran obstore


def test_storage_backend_settles_where_obstore_may_run() -> None:
    assert resolve("auto", loader_process=False) == "fsspec"
    assert resolve("fsspec", loader_process=True) == "fsspec"
    assert resolve("obstore", loader_process=True) == "obstore"
    with pytest.raises(
        ValueError, match=r"storage_backend='obstore' needs a loader process \(loader_process="
    ):
        Loader(["s3://b/a"], storage_backend="obstore", loader_process=False)
    # The default, "auto", runs in a loader process where it can: obstore may read there.
    assert Loader(["s3://b/a"], storage_backend="obstore").config.storage_backend == "obstore"
    with pytest.raises(ValueError, match="storage_backend='s3fs' must be 'auto', 'fsspec' or 'obstore'"):
        Loader(["s3://b/a"], storage_backend="s3fs")  # type: ignore[arg-type]


def test_obstore_takes_fsspec_option_names_or_leaves_the_protocol_to_fsspec(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pytest.importorskip("obstore")
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.aws here
    for name in ("AWS_PROFILE", "AWS_ACCESS_KEY_ID"):
        monkeypatch.delenv(name, raising=False)
    opts = {
        "key": "AK",
        "secret": "SK",
        "token": "T",
        "endpoint_url": "http://127.0.0.1:9000",
        "client_kwargs": {"region_name": "eu-west-1"},
        "config_kwargs": {"max_pool_connections": 10},
    }
    assert obstore_kwargs("s3", opts) == {
        "access_key_id": "AK",
        "secret_access_key": "SK",
        "session_token": "T",
        "endpoint": "http://127.0.0.1:9000",
        "region": "eu-west-1",
    }
    assert obstore_kwargs("s3", {"anon": True}) == {"skip_signature": True}
    assert obstore_kwargs("https", {"client_kwargs": {"headers": {"A": "b"}}}) == {
        "default_headers": {"A": "b"}
    }
    assert obstore_kwargs("s3", {"requester_pays": True}) is None  # no obstore name: fsspec reads
    assert obstore_kwargs("http", {"key": "AK"}) is None
    assert choose("s3", opts, "auto") == "obstore"
    assert choose("s3", {"requester_pays": True}, "auto") == "fsspec"
    assert choose("gs", {}, "auto") == "fsspec"
    assert choose("s3", opts, "fsspec") == "fsspec"
    # Credentials from an AWS profile: botocore reads config files, obstore does not.
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "credentials").write_text("[default]\n")
    assert choose("s3", {}, "auto") == "fsspec"
    assert choose("s3", {"key": "AK", "secret": "SK"}, "auto") == "obstore"
    with pytest.raises(LoaderError, match="cannot read gs:// URLs with these storage_options"):
        choose("gs", {}, "obstore")


def test_sample_timeout_bounds_a_remote_read(
    http_files: str, numbered: list[str], where: dict[str, Any]
) -> None:
    """Every response waits 5 s; a sample may take 0.5 s: a LoaderTimeoutError naming the
    URL, and the reads still in flight are cancelled by close (the test's timeout says so)."""
    control(http_files, latency_ms=5000)
    urls = [f"{http_files}/{os.path.basename(p)}" for p in numbered[:4]]
    loader = Loader(urls, batch_size=2, decode=decode_number, num_workers=1, sample_timeout=0.5, **where)
    with loader, pytest.raises(LoaderTimeoutError, match=r"sample_timeout=0.5s") as info:
        list(loader)
    assert info.value.path in urls


#: What obstore (reqwest) raised on this machine, shortened: a body cut off mid-way, and a
#: connection refused (tests/servers.py's file server, 127.0.0.1:9).
OBSTORE_CUT = (
    "Generic HTTP error: HTTP error: request or response body error\n\nDebug source:\nGeneric {\n"
    "    source: HttpError {\n        kind: Interrupted,\n        source: hyper::Error(Body, Custom { "
    "kind: UnexpectedEof, error: IncompleteBody })"
)
OBSTORE_REFUSED = (
    "Generic HTTP error: Error performing GET http://127.0.0.1:9/0.bin in 311µs - HTTP error: error "
    'sending request\n ConnectError("tcp connect error", 127.0.0.1:9, Os { code: 111, kind: '
    'ConnectionRefused, message: "Connection refused" })'
)
OBSTORE_503 = (
    "Generic HTTP error: Error performing GET http://127.0.0.1:1/1.bin in 518µs - Server returned "
    "non-2xx status code: 503 Service Unavailable: try again"
)
OBSTORE_BAD_KEY = (
    "The operation lacked the necessary privileges to complete for path a.bin: Server returned "
    "non-2xx status code: 403 Forbidden: <Error><Code>InvalidAccessKeyId</Code></Error>"
)


def test_obstore_errors_are_classified_like_fsspecs() -> None:
    """Each failure of obstore's becomes what the same failure of fsspec's becomes: a cut
    body and a 503 are tried again, a refused connection before any success stops the
    loader (after one, it is tried again), refused credentials stop it, 404 is per sample."""
    import errno

    exceptions = pytest.importorskip("obstore.exceptions")
    from aioloader.read.remote import RemoteReadError, RemoteStore

    store = RemoteStore(None, 8)
    url = "http://127.0.0.1:1/1.bin"

    def classify(exc: BaseException) -> BaseException:
        return store._classify(exc, url, "http")

    cut = classify(exceptions.GenericError(OBSTORE_CUT))
    assert isinstance(cut, RemoteReadError) and cut.errno == errno.EAGAIN
    assert isinstance(classify(exceptions.GenericError(OBSTORE_503)), RemoteReadError)
    assert classify(exceptions.GenericError(OBSTORE_503)).errno == errno.EAGAIN  # type: ignore[attr-defined]
    refused = classify(exceptions.GenericError(OBSTORE_REFUSED))
    assert isinstance(refused, LoaderError) and "cannot reach the http:// endpoint" in str(refused)
    store._ok.add("http")  # a read of this endpoint succeeded: now a refusal is worth a retry
    later = classify(exceptions.GenericError(OBSTORE_REFUSED))
    assert isinstance(later, RemoteReadError) and later.errno == errno.EAGAIN
    denied = classify(exceptions.PermissionDeniedError(OBSTORE_BAD_KEY))
    assert isinstance(denied, LoaderError) and "(InvalidAccessKeyId)" in str(denied)
    for missing in (  # obstore raises the builtin for a 404; its own class, by name
        classify(FileNotFoundError("Object at location 1.bin not found")),
        classify(exceptions.NotFoundError("Object at location 1.bin not found")),
    ):
        assert isinstance(missing, RemoteReadError) and missing.errno == errno.ENOENT


def test_a_presigned_url_keeps_its_query(http_files: str, numbered: list[str]) -> None:
    """A URL with a query string (a presigned URL) is sent as it is, also where obstore
    reads the others (it would take the query for part of the object's name)."""
    pytest.importorskip("obstore")
    urls = [f"{http_files}/{os.path.basename(p)}?X-Amz-Signature=abc&n={i}" for i, p in enumerate(numbered)]
    with Loader(
        urls,
        batch_size=8,
        decode=decode_number,
        shuffle=False,
        num_workers=1,
        loader_process=True,
        storage_backend="obstore",
    ) as loader:
        assert [v for b in values(list(loader)) for v in b] == list(range(len(numbered)))
