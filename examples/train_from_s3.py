"""Train straight from an S3 bucket (any S3-compatible endpoint): an ImageFolder of JPEGs under
a prefix, listed and read by aioloader on its event loop, no copy to local disk first.

    pip install 'aioloader[remote]'
    python examples/train_from_s3.py s3://my-bucket/train/ [--endpoint-url URL] [--epochs 2]

Credentials come from the usual AWS environment (``AWS_ACCESS_KEY_ID``, ...), or
``--key``/``--secret``. To try it against a local moto server (``pip install 'moto[server]'``)::

    python -m moto.server -H 127.0.0.1 -p 5555 &
    python examples/train_from_s3.py s3://demo/train/ --endpoint-url http://127.0.0.1:5555 \\
        --key test --secret test --upload-demo

``--upload-demo`` first generates a small ImageFolder and uploads it under the prefix.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

import aioloader
from aioloader.synthetic import make_image_folder


def upload_demo(url: str, options: dict[str, Any]) -> None:
    """A generated ImageFolder (4 classes, 256 JPEGs), uploaded under ``url``."""
    import fsspec

    fs = fsspec.filesystem("s3", **options)
    bucket = url.removeprefix("s3://").split("/", 1)[0]
    if not fs.exists(bucket):
        fs.mkdir(bucket)
    with tempfile.TemporaryDirectory() as tmp:
        root = make_image_folder(Path(tmp) / "train", num_images=256, num_classes=4, size=(160, 120))
        for path in sorted(root.rglob("*.jpg")):
            fs.put_file(str(path), f"{url.rstrip('/')}/{path.relative_to(root).as_posix()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="s3://bucket/prefix/ holding class sub-prefixes of JPEGs")
    parser.add_argument("--endpoint-url", default=None, help="an S3-compatible endpoint (default: AWS)")
    parser.add_argument("--key", default=None, help="access key id (default: the AWS environment)")
    parser.add_argument("--secret", default=None, help="secret access key")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--io-concurrency", type=int, default=256, help="reads in flight (%(default)s)")
    parser.add_argument("--upload-demo", action="store_true", help="upload a generated dataset first")
    args = parser.parse_args()

    options: dict[str, Any] = {}
    if args.endpoint_url:
        options["endpoint_url"] = args.endpoint_url
    if args.key:
        options["key"], options["secret"] = args.key, args.secret
    if args.upload_demo:
        upload_demo(args.url, options)

    start = time.perf_counter()
    dataset = aioloader.FileDataset.from_folder(args.url, storage_options=options)
    print(
        f"listed {len(dataset)} objects in {len(dataset.classes or [])} classes in "
        f"{time.perf_counter() - start:.2f} s"
    )
    loader = aioloader.Loader(
        dataset,
        batch_size=32,
        decode=aioloader.ImageDecoder(112, crop="random", hflip=True),
        io_concurrency=args.io_concurrency,
        storage_options=options,
    )
    model = nn.Sequential(
        nn.Conv2d(3, 16, 5, stride=4),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, len(dataset.classes or [1])),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with loader:
        for epoch in range(args.epochs):
            loader.set_epoch(epoch)
            t0, n = time.perf_counter(), 0
            for images, labels in loader:
                loss = nn.functional.cross_entropy(model(images.float().div_(255)), labels)
                opt.zero_grad()
                loss.backward()
                opt.step()
                n += len(labels)
            stats = loader.stats
            print(
                f"epoch {epoch}: {n / (time.perf_counter() - t0):.0f} samples/s, "
                f"{stats.bytes_read / 2**20:.1f} MiB read in all, {stats.read_retries} retries, "
                f"waited {stats.epoch_wait_seconds:.2f} s for data"
            )


if __name__ == "__main__":
    main()
