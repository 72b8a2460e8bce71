"""The Ray connection: Ray imported (or an error naming the extra), this process connected
(the user's ``ray.init(...)``, else ``ray.init(address="auto")``, else one
:class:`~aioloader.LoaderError` saying how), and the cluster's CPUs.

Ray is imported here and in :mod:`aioloader.cluster.task` only, and only once a loader with
``decode_on="ray"`` starts: ``import ray`` takes most of a second.
"""

from __future__ import annotations

import logging
from types import ModuleType

from aioloader.errors import LoaderError

__all__ = ["INSTALL_HINT", "cluster_cpus", "connect", "ray_module"]

logger = logging.getLogger("aioloader")

INSTALL_HINT = "decode_on='ray' needs Ray: pip install 'aioloader[ray]'"


def ray_module() -> ModuleType:
    """``ray``, or an ``ImportError`` naming the extra that installs it."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    return ray


def connect() -> ModuleType:
    """``ray``, with this process connected to a cluster: the connection the user made with
    ``ray.init(...)``, else one to the cluster ``ray.init(address="auto")`` finds (``RAY_ADDRESS``,
    or a cluster started on this machine by ``ray start``). Raises :class:`LoaderError`
    when there is none; the connection made here stays open after the loader closes, as
    the user's would."""
    ray = ray_module()
    if ray.is_initialized():
        return ray
    try:
        ray.init(address="auto", log_to_driver=False)
    except Exception as exc:
        raise LoaderError(
            "decode_on='ray': this process is not connected to a Ray cluster, and "
            f"ray.init(address='auto') found none ({type(exc).__name__}: {exc}). Call "
            "ray.init() before the loader starts: ray.init() for a cluster on this machine, "
            "ray.init(address='ray://<head>:10001') or RAY_ADDRESS for a running one"
        ) from exc
    logger.info("decode_on='ray': connected to the Ray cluster at %s", _address(ray))
    return ray


def _address(ray: ModuleType) -> str:
    try:
        return str(ray.get_runtime_context().gcs_address)
    except Exception:  # noqa: BLE001 - only for a log line
        return "?"


def cluster_cpus(ray: ModuleType) -> int:
    """The CPUs of the cluster now (every alive node's), or :class:`LoaderError` for none."""
    cpus = int(ray.cluster_resources().get("CPU", 0))
    if cpus < 1:
        raise LoaderError(
            "decode_on='ray': the Ray cluster has no CPUs to decode on "
            "(ray.cluster_resources() shows none); start nodes with --num-cpus, or pass num_workers"
        )
    return cpus
