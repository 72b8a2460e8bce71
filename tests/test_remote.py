"""Object storage and HTTP: real servers on loopback (tests/servers.py: moto's S3 server, an
aiohttp file server with latency and faults), real reads on the loader's event loop.

Each case runs in the trainer's process (fsspec) and in a loader process, through obstore
and through fsspec (the ``where`` fixture).

The second half is the fault contract (DESIGN.md, "Remote storage"), one suite for both
clients so that they cannot drift apart: each case runs the three ways, and where
``on_error`` could change the outcome, with "raise" and with "skip". Besides ``moto_s3``
and ``http_files``, its servers are a moto that checks every signature (``signed_s3``: one
user, who may read every object but one) and moto behind a proxy that answers with S3's
faults (``s3_proxy``), all in conftest.py.

=======================================================  ======================================
fault                                                    outcome, through either client
=======================================================  ======================================
unreachable endpoint (S3, HTTP; options or environment)  one LoaderError before any batch
refused credentials (unknown key; known key, wrong       one LoaderError before any batch
secret; from options, or from the environment)
good options over bad environment variables              the options are used whole: batches
credentials from the environment alone, mixed list       batches
missing object (404), denied object (403; S3, HTTP)      ReadError naming the URL, or skipped
throttling (503, S3 SlowDown), bodies cut short          retried and counted, never short
slow responses                                           LoaderTimeoutError naming the URL
=======================================================  ======================================

The cases with credentials in environment variables run as scripts whose environment is
set from their start (``helpers.start_script``), as a user's would be: a loader process is
forked from a zygote made at the first loader, so variables a test set on itself after
that would not be the loader process's.
"""

from __future__ import annotations

import errno
import json
import os
import re
import threading
from pathlib import Path
from typing import Any

import pytest
from helpers import RuntimeWatch, decode_number, finish_script, start_script
from servers import control, free_port, s3_client, server_stats

from aioloader import FileDataset, Loader, LoaderError, LoaderTimeoutError, ReadError
from aioloader.read.backends import choose, obstore_kwargs, resolve, tokio_started
from aioloader.read.urls import s3_settings, s3_unsupported

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


def test_samples_inside_a_shard_are_read_by_byte_range(
    tmp_path: Path,
    moto_s3: dict[str, object],
    http_files: str,
    numbered: list[str],
    where: dict[str, Any],
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
    assert Loader(["s3://b/a"], storage_backend="obstore").config.build.storage_backend == "obstore"
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


# == the fault contract: what each fault becomes, through either client ==================

#: A secret that must never show, in options that are refused or cannot be used.
WRONG_SECRET = "wrong-secret-never-shown"

ON_ERROR = pytest.mark.parametrize("on_error", ["raise", "skip"])


def s3_urls(numbered: list[str], n: int = 8) -> list[str]:
    return [f"s3://aioloader-test/numbered/{os.path.basename(p)}" for p in numbered[:n]]


def bare(options: dict[str, object]) -> dict[str, object]:
    """``s3_proxy``'s options without its ``proxy`` entry (not a storage option)."""
    return {k: v for k, v in options.items() if k != "proxy"}


# -- the endpoint cannot be reached, the credentials are refused ---------------------------


@ON_ERROR
@pytest.mark.parametrize("protocol", ["s3", "http"])
def test_an_unreachable_endpoint_is_one_loader_error(
    numbered: list[str], where: dict[str, Any], on_error: str, protocol: str
) -> None:
    """Nothing listens at the endpoint: one LoaderError before the first batch, naming it,
    not a ReadError per sample (``on_error="skip"`` would hide those)."""
    dead = f"http://127.0.0.1:{free_port()}"
    options: dict[str, Any] | None = None
    if protocol == "s3":
        urls = s3_urls(numbered)
        options = {"key": "AKIADEAD", "secret": WRONG_SECRET, "endpoint_url": dead}
    else:
        urls = [f"{dead}/{os.path.basename(p)}" for p in numbered[:8]]
    loader = Loader(
        urls,
        batch_size=4,
        decode=decode_number,
        on_error=on_error,
        num_workers=1,
        storage_options=options,
        **where,
    )
    with loader, pytest.raises(LoaderError, match=f"cannot reach the {protocol}:// endpoint") as info:
        next(iter(loader))
    assert not isinstance(info.value, ReadError) and WRONG_SECRET not in str(info.value)
    assert loader.stats.failures == 0


@ON_ERROR
@pytest.mark.parametrize("refused", ["InvalidAccessKeyId", "SignatureDoesNotMatch"])
def test_refused_credentials_stop_the_loader_once(
    signed_s3: dict[str, Any], numbered: list[str], where: dict[str, Any], on_error: str, refused: str
) -> None:
    """A server that checks signatures refuses a key it does not know, and a key it knows
    with another secret: one LoaderError before any batch, naming the code, not the
    secret."""
    options = {**signed_s3["options"], "secret": WRONG_SECRET}
    if refused == "InvalidAccessKeyId":
        options["key"] = "AKIANOBODYKNOWS"
    loader = Loader(
        s3_urls(numbered),
        batch_size=4,
        decode=decode_number,
        on_error=on_error,
        num_workers=1,
        storage_options=options,
        **where,
    )
    with (
        loader,
        pytest.raises(LoaderError, match=rf"credentials for s3:// were refused \({refused}\)") as info,
    ):
        next(iter(loader))
    assert not isinstance(info.value, ReadError) and WRONG_SECRET not in str(info.value)
    assert loader.stats.failures == 0


# -- one object cannot be read -------------------------------------------------------------


def sample_5_fails(
    urls: list[str], options: dict[str, Any] | None, where: dict[str, Any], on_error: str, message: str
) -> None:
    """Loads the 8 ``urls`` in batches of 4, of which the 6th cannot be read: with "raise",
    the first batch, then a ReadError with ``message`` naming sample 5's URL; with "skip",
    every other sample, and the skip names that URL."""
    loader = Loader(
        urls,
        batch_size=4,
        decode=decode_number,
        shuffle=False,
        num_workers=1,
        on_error=on_error,
        storage_options=options,
        **where,
    )
    got: list[Any] = []
    with loader:
        if on_error == "raise":
            with pytest.raises(ReadError, match=re.escape(message)) as info:
                for batch in loader:
                    got.append(batch)
            assert (info.value.path, info.value.index) == (urls[5], 5)
            assert values(got) == [[0, 1, 2, 3]]
        else:
            assert values(list(loader)) == [[0, 1, 2, 3], [4, 6, 7]]
            assert loader.stats.failures_by_reason == {"ReadError": 1}
            assert loader.stats.last_failed_paths == (urls[5],)


@ON_ERROR
def test_a_missing_object_is_a_read_error_naming_the_url(
    moto_s3: dict[str, object], numbered: list[str], where: dict[str, Any], on_error: str
) -> None:
    """Sample 5 of 8 is not in the bucket (404): a ReadError naming its URL, or skipped."""
    urls = s3_urls(numbered)
    urls[5] = "s3://aioloader-test/numbered/nope.txt"
    sample_5_fails(urls, moto_s3, where, on_error, "not found (404)")


@ON_ERROR
@pytest.mark.parametrize("protocol", ["s3", "http"])
def test_a_denied_object_is_a_read_error_naming_its_url(
    request: pytest.FixtureRequest, numbered: list[str], where: dict[str, Any], on_error: str, protocol: str
) -> None:
    """Sample 5 of 8 may not be read (403: an S3 policy that denies GetObject on that key
    alone, with good credentials; an HTTP server that refuses that path): a ReadError
    naming that URL, not another's, or skipped; not refused credentials."""
    if protocol == "s3":
        signed = request.getfixturevalue("signed_s3")
        urls, options = s3_urls(numbered), signed["options"]
        assert urls[5] == signed["denied"]
    else:
        server = request.getfixturevalue("http_files")
        urls, options = [f"{server}/{os.path.basename(p)}" for p in numbered[:8]], None
        control(server, fail_paths=[os.path.basename(numbered[5])], fail_status=403)
    sample_5_fails(urls, options, where, on_error, "access denied (403)")


# -- faults worth another try --------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["http", "s3"])
def test_throttling_and_cut_bodies_are_retried_and_counted(
    request: pytest.FixtureRequest, numbered: list[str], where: dict[str, Any], protocol: str
) -> None:
    """Every object answers 503 twice before it is served (for S3, with SlowDown), and every
    7th response is cut off halfway: each sample still arrives exactly once, whole, and the
    retries are counted."""
    options: dict[str, object] | None = None
    if protocol == "s3":
        proxy = request.getfixturevalue("s3_proxy")
        server, options, urls = str(proxy["proxy"]), bare(proxy), s3_urls(numbered, len(numbered))
    else:
        server = request.getfixturevalue("http_files")
        urls = [f"{server}/{os.path.basename(p)}" for p in numbered]
    control(server, fail_first=2, reset_every=7)
    # Each path fails twice; a cut body can cost a second try too (the client's pooled
    # connection the server closed): 6 tries leave room for two cuts on one path.
    with Loader(
        urls,
        batch_size=8,
        decode=decode_number,
        shuffle=False,
        num_workers=1,
        read_retries=6,
        storage_options=options,
        **where,
    ) as loader:
        got = [v for b in values(list(loader)) for v in b]
        stats = loader.stats
    assert got == list(range(len(numbered)))
    assert stats.read_retries >= 2 * len(numbered) and stats.failures == 0


@pytest.mark.parametrize("protocol", ["http", "s3"])
def test_sample_timeout_bounds_a_remote_read(
    request: pytest.FixtureRequest, numbered: list[str], where: dict[str, Any], protocol: str
) -> None:
    """Every response waits 5 s; a sample may take 0.5 s: a LoaderTimeoutError naming the
    URL, and the reads still in flight are cancelled by close (the test's timeout says so)."""
    options: dict[str, object] | None = None
    if protocol == "s3":
        proxy = request.getfixturevalue("s3_proxy")
        server, options, urls = str(proxy["proxy"]), bare(proxy), s3_urls(numbered, 4)
    else:
        server = request.getfixturevalue("http_files")
        urls = [f"{server}/{os.path.basename(p)}" for p in numbered[:4]]
    control(server, latency_ms=5000)
    loader = Loader(
        urls,
        batch_size=2,
        decode=decode_number,
        num_workers=1,
        sample_timeout=0.5,
        storage_options=options,
        **where,
    )
    with loader, pytest.raises(LoaderTimeoutError, match=r"sample_timeout=0.5s") as info:
        list(loader)
    assert info.value.path in urls


# -- credentials from the environment ------------------------------------------------------

#: Runs loaders as ``argv[1]`` (JSON) says and prints, as JSON, what each gave.
ENV_SCRIPT = """
import json
import sys

from helpers import decode_number

from aioloader import Loader

spec = json.loads(sys.argv[1])
results = []
for run in spec["runs"]:
    got, error = [], None
    loader = Loader(
        run["urls"],
        batch_size=4,
        decode=decode_number,
        shuffle=False,
        num_workers=1,
        on_error=run["on_error"],
        storage_options=run.get("options"),
        **spec["where"],
    )
    with loader:
        try:
            for batch in loader:
                got.append([int(v) for v in batch])
        except Exception as exc:
            error = {"type": type(exc).__name__, "text": str(exc), "path": getattr(exc, "path", None)}
        stats = loader.stats
    results.append(
        {
            "batches": got,
            "error": error,
            "runtime": loader.runtime,
            "failed": list(stats.last_failed_paths),
            "retries": stats.read_retries,
        }
    )
print(json.dumps(results))
"""


def run_with_env(
    tmp_path: Path, where: dict[str, Any], env: dict[str, str], runs: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """``runs`` (``urls``, ``on_error``, ``options``) in a script of their own whose
    environment holds ``env`` and no other ``AWS_*`` variable, one result per run."""
    script = tmp_path / "env_loader.py"
    clean: dict[str, str | None] = {name: None for name in os.environ if name.startswith("AWS_")}
    spec = json.dumps({"where": where, "runs": runs})
    proc = start_script(script, ENV_SCRIPT, args=[str(script), spec], env={**clean, **env})
    out, err = finish_script(proc, timeout=90)
    assert proc.returncode == 0, err[-4000:]
    results: list[dict[str, Any]] = json.loads(out.strip().splitlines()[-1])
    runtime = "process" if where["loader_process"] else "thread"
    assert [r["runtime"] for r in results] == [runtime] * len(runs), results
    return results


def test_credentials_from_the_environment_alone(
    tmp_path: Path,
    signed_s3: dict[str, Any],
    http_files: str,
    numbered: list[str],
    where: dict[str, Any],
) -> None:
    """A key, secret, endpoint and region in ``AWS_*`` variables, no storage_options: a
    list of local paths, ``file://``, ``s3://`` and ``http://`` URLs gives every sample
    in order; the one object the key may not read is a ReadError naming it (or skipped);
    a wrong secret in the options wins over the good one of the environment: refused, once."""
    n = 12
    names = [os.path.basename(p) for p in numbered[:n]]
    mixed = [
        [p, f"file://{p}", f"s3://aioloader-test/numbered/{name}", f"{http_files}/{name}"][i % 4]
        for i, (p, name) in enumerate(zip(numbered[:n], names, strict=True))
    ]
    urls = s3_urls(numbered)
    bad = {"s3": {**signed_s3["options"], "secret": WRONG_SECRET}}
    runs = [
        {"urls": mixed, "on_error": "raise"},
        {"urls": urls, "on_error": "raise"},
        {"urls": urls, "on_error": "skip"},
        {"urls": urls, "on_error": "raise", "options": bad},
        {"urls": urls, "on_error": "skip", "options": bad},
    ]
    mix, denied, skipped, *refused = run_with_env(tmp_path, where, signed_s3["env"], runs)
    assert mix["error"] is None and [v for b in mix["batches"] for v in b] == list(range(n)), mix
    assert denied["batches"] == [[0, 1, 2, 3]], denied
    assert denied["error"]["type"] == "ReadError" and "access denied (403)" in denied["error"]["text"]
    assert denied["error"]["path"] == signed_s3["denied"]
    assert skipped["error"] is None and skipped["batches"] == [[0, 1, 2, 3], [4, 6, 7]], skipped
    assert skipped["failed"] == [signed_s3["denied"]]
    for run in refused:
        assert run["batches"] == [] and run["error"]["type"] == "LoaderError", run
        assert "credentials for s3:// were refused (SignatureDoesNotMatch)" in run["error"]["text"]
    shown = json.dumps([mix, denied, skipped, *refused])
    assert signed_s3["secret"] not in shown and WRONG_SECRET not in shown


def test_storage_options_win_over_the_environment(
    tmp_path: Path, signed_s3: dict[str, Any], numbered: list[str], where: dict[str, Any]
) -> None:
    """Good credentials in storage_options, while the environment holds the same key with
    a wrong secret, a session token and an S3 endpoint where nothing listens: the options'
    key, secret and endpoint are used whole (as botocore uses them), so every sample
    arrives. Without options, the environment's apply: its endpoint cannot be reached,
    one LoaderError before any batch, whatever on_error says."""
    dead = f"http://127.0.0.1:{free_port()}"
    env = {
        **signed_s3["env"],
        "AWS_SECRET_ACCESS_KEY": WRONG_SECRET,
        "AWS_SESSION_TOKEN": "a-token-of-someone-else",
        "AWS_ENDPOINT_URL_S3": dead,
    }
    urls = [u for u in s3_urls(numbered, 12) if u != signed_s3["denied"]]
    runs = [
        {"urls": urls, "on_error": "raise", "options": {"s3": signed_s3["options"]}},
        {"urls": urls, "on_error": "raise"},
        {"urls": urls, "on_error": "skip"},
    ]
    good, *unreachable = run_with_env(tmp_path, where, env, runs)
    assert good["error"] is None and good["retries"] == 0, good
    assert [v for b in good["batches"] for v in b] == [i for i in range(12) if i != 5]
    for run in unreachable:
        assert run["batches"] == [] and run["error"]["type"] == "LoaderError", run
        assert "cannot reach the s3:// endpoint" in run["error"]["text"]
    shown = json.dumps([good, *unreachable])
    assert signed_s3["secret"] not in shown and WRONG_SECRET not in shown


def test_refused_credentials_from_the_environment_stop_the_loader_once(
    tmp_path: Path, signed_s3: dict[str, Any], numbered: list[str], where: dict[str, Any]
) -> None:
    """The environment's key with a wrong secret, and no credentials in storage_options
    (none at all, or only an endpoint): the environment's credentials are used and
    refused, one LoaderError before any batch, whatever on_error says."""
    env = {**signed_s3["env"], "AWS_SECRET_ACCESS_KEY": WRONG_SECRET}
    urls = s3_urls(numbered)
    runs = [
        {"urls": urls, "on_error": "raise"},
        {"urls": urls, "on_error": "skip", "options": {"s3": {"endpoint_url": signed_s3["url"]}}},
    ]
    for run in run_with_env(tmp_path, where, env, runs):
        assert run["batches"] == [] and run["error"]["type"] == "LoaderError", run
        assert "credentials for s3:// were refused (SignatureDoesNotMatch)" in run["error"]["text"]
        assert WRONG_SECRET not in json.dumps(run)


# -- the settings obstore is given, and what its errors become ------------------------------


def test_obstore_is_given_the_s3_settings_botocore_would_use(tmp_path: Path) -> None:
    """What obstore is given for S3 (``s3_settings``) from the options and the environment,
    against what botocore (fsspec's s3fs) makes of them; where obstore cannot do the same
    (``s3_unsupported``), ``auto`` reads S3 with fsspec."""
    opts = {"access_key_id": "AK", "secret_access_key": "SK", "endpoint": "http://127.0.0.1:1"}
    bad_env = {
        "AWS_ACCESS_KEY_ID": "ENVAK",
        "AWS_SECRET_ACCESS_KEY": "ENVSK",
        "AWS_SESSION_TOKEN": "ENVTOKEN",
        "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:2",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:3",
        "AWS_SKIP_SIGNATURE": "true",
        "AWS_REQUEST_PAYER": "true",
        "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "true",
    }
    # The options' key and secret whole (no token of the environment's), their endpoint
    # under both of obstore's names, the environment's obstore-only switches off.
    config, client, creds = s3_settings(opts, bad_env)
    assert creds == ("AK", "SK", None) and "SK" not in json.dumps(config)
    assert config["endpoint"] == config["aws_endpoint_url_s3"] == "http://127.0.0.1:1"
    assert not any(config[k] for k in ("skip_signature", "request_payer", "virtual_hosted_style_request"))
    assert client == {"allow_http": True}
    assert s3_unsupported(opts, bad_env, profile=True) is None
    assert s3_settings({**opts, "session_token": "T"}, bad_env)[2] == ("AK", "SK", "T")
    # Without options: the environment's key, secret and token, and its endpoint (the
    # service's own variable first).
    config, _, creds = s3_settings({}, bad_env)
    assert creds == ("ENVAK", "ENVSK", "ENVTOKEN") and config["endpoint"] == "http://127.0.0.1:2"
    env_only = {k: v for k, v in bad_env.items() if k != "AWS_ENDPOINT_URL_S3"}
    assert s3_settings({}, env_only)[0]["endpoint"] == "http://127.0.0.1:3"
    home = {"HOME": str(tmp_path)}  # no AWS config files there
    assert choose("s3", {}, "auto", {**env_only, **home}) == "obstore"
    # anon: unsigned, whatever credentials the environment holds.
    config, _, creds = s3_settings({"skip_signature": True}, bad_env)
    assert config["skip_signature"] is True and creds is None
    # Where obstore cannot do as botocore: fsspec reads with auto, obstore by name is an error.
    left_out = {
        "half a key in the options": ({"access_key_id": "AK"}, {}, False),
        "half a key in the environment": ({}, {"AWS_ACCESS_KEY_ID": "AK"}, False),
        "a profile": ({}, {}, True),
        "an endpoint only obstore reads": ({}, {"AWS_ENDPOINT": "http://127.0.0.1:4"}, False),
        "an ignored endpoint": (
            {},
            {"AWS_ENDPOINT_URL": "http://127.0.0.1:4", "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS": "true"},
            False,
        ),
        "SSE-C from the environment": (opts, {"AWS_SSE_CUSTOMER_KEY_BASE64": "a2V5"}, False),
    }
    for case, (kwargs, environ, profile) in left_out.items():
        assert s3_unsupported(kwargs, environ, profile) is not None, case
    assert choose("s3", {"key": "AK"}, "auto", home) == "fsspec"
    assert choose("s3", {}, "auto", {**home, "AWS_ACCESS_KEY_ID": "AK"}) == "fsspec"
    assert choose("s3", {}, "auto", {**home, "AWS_PROFILE": "dev"}) == "fsspec"
    assert choose("s3", {"key": "AK", "secret": "SK"}, "auto", {**home, "AWS_PROFILE": "dev"}) == "obstore"
    with pytest.raises(LoaderError, match="cannot read s3:// URLs as botocore would"):
        choose("s3", {}, "obstore", {**home, "AWS_PROFILE": "dev"})


#: What obstore (reqwest) raised on this machine, shortened: a body cut off mid-way, a
#: connection refused (tests/servers.py's file server, 127.0.0.1:9), a 503, refused
#: credentials, a token refused, and an http:// endpoint its client was not allowed.
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
OBSTORE_BAD_TOKEN = (
    "Generic S3 error: Error performing GET http://127.0.0.1:1/b/a.bin in 3ms - Server returned "
    "non-2xx status code: 400 Bad Request: <Error><Code>InvalidToken</Code></Error>"
)
OBSTORE_NO_HTTP = (
    "Generic S3 error: Error performing GET http://127.0.0.1:9/bkt/x in 108µs - HTTP error: builder "
    "error\n\nDebug source:\n    inner: Http(HttpError { kind: Unknown, source: reqwest::Error { "
    "kind: Builder, source: BadScheme } })"
)


def test_obstore_errors_are_classified_like_fsspecs() -> None:
    """Each failure of obstore's becomes what the same failure of fsspec's becomes: a cut
    body and a 503 are tried again, a refused connection before any success stops the
    loader (after one, it is tried again), refused credentials stop it, and so does a
    client that cannot send any request; 404 is per sample."""
    exceptions = pytest.importorskip("obstore.exceptions")
    from aioloader.read.remote import RemoteReadError, RemoteStore

    store = RemoteStore(None, 8)
    url = "http://127.0.0.1:1/1.bin"

    def classify(exc: BaseException, protocol: str = "http") -> BaseException:
        return store._classify(exc, url, protocol)

    cut = classify(exceptions.GenericError(OBSTORE_CUT))
    assert isinstance(cut, RemoteReadError) and cut.errno == errno.EAGAIN
    throttled = classify(exceptions.GenericError(OBSTORE_503))
    assert isinstance(throttled, RemoteReadError) and throttled.errno == errno.EAGAIN
    refused = classify(exceptions.GenericError(OBSTORE_REFUSED))
    assert isinstance(refused, LoaderError) and "cannot reach the http:// endpoint" in str(refused)
    store._ok.add("http")  # a read of this endpoint succeeded: now a refusal is worth a retry
    later = classify(exceptions.GenericError(OBSTORE_REFUSED))
    assert isinstance(later, RemoteReadError) and later.errno == errno.EAGAIN
    denied = classify(exceptions.PermissionDeniedError(OBSTORE_BAD_KEY))
    assert isinstance(denied, LoaderError) and "(InvalidAccessKeyId)" in str(denied)
    token = classify(exceptions.GenericError(OBSTORE_BAD_TOKEN), "s3")
    assert isinstance(token, LoaderError) and "(InvalidToken)" in str(token)
    no_http = classify(exceptions.GenericError(OBSTORE_NO_HTTP), "s3")
    assert isinstance(no_http, LoaderError) and "cannot send a request" in str(no_http)
    made = LoaderError("obstore cannot make a store for s3://b with these settings: ValueError")
    assert classify(made, "s3") is made
    for missing in (  # obstore raises the builtin for a 404; its own class, by name
        classify(FileNotFoundError("Object at location 1.bin not found")),
        classify(exceptions.NotFoundError("Object at location 1.bin not found")),
    ):
        assert isinstance(missing, RemoteReadError) and missing.errno == errno.ENOENT
