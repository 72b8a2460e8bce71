"""Whether one read of a file may be trusted to have reached its end when it comes back
short: on which filesystems a hinted read (:class:`~aioloader.read.blocking.HintedRead`)
may skip the fstat.

A read of a regular file through the page cache (ext4, XFS, btrfs, tmpfs, NFS, overlayfs...)
returns fewer bytes than asked only at the end of the file. A FUSE filesystem mounted with
``direct_io``, an SMB share or a 9p mount passes on whatever its server answered, which may
be short in the middle of a file: there, a file is read to its size as fstat gives it, so a
short answer is never taken for the whole file.

:func:`parse_mountinfo` and :func:`whole_reads` are pure; :class:`Mounts` asks the kernel
(``/proc/self/mountinfo``, a ``stat`` of each folder, each once) and answers from memory
after that.
"""

from __future__ import annotations

import os

__all__ = ["WHOLE_READS", "Mounts", "parse_mountinfo", "whole_reads"]

#: Filesystems whose reads of a regular file come back short only at its end.
WHOLE_READS = frozenset(
    {
        "btrfs",
        "erofs",
        "exfat",
        "ext2",
        "ext3",
        "ext4",
        "f2fs",
        "hfsplus",
        "jfs",
        "nfs",
        "nfs4",
        "ntfs3",
        "overlay",
        "ramfs",
        "squashfs",
        "tmpfs",
        "vfat",
        "xfs",
        "zfs",
    }
)

#: Folders remembered at most; past that the memory starts afresh (a dataset with a folder
#: per file would otherwise grow it without bound).
MAX_FOLDERS = 65536


def parse_mountinfo(text: str) -> dict[tuple[int, int], str]:
    """``{(major, minor): filesystem type}`` from the text of ``/proc/<pid>/mountinfo``
    (``36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw``: the third field
    is the device, the one after ``-`` the type). Lines it cannot read are left out."""
    out: dict[tuple[int, int], str] = {}
    for line in text.splitlines():
        fields = line.split()
        try:
            major, minor = (int(x) for x in fields[2].split(":"))
            fstype = fields[fields.index("-", 6) + 1]
        except (IndexError, ValueError):
            continue
        out.setdefault((major, minor), fstype)
    return out


def whole_reads(fstype: str | None) -> bool:
    """Whether a short read on ``fstype`` (None: unknown) is the end of the file."""
    return fstype in WHOLE_READS


class Mounts:
    """Whether a folder's filesystem has :func:`whole_reads`, asked once per folder."""

    def __init__(self, mountinfo: str = "/proc/self/mountinfo") -> None:
        self._mountinfo = mountinfo
        self._types: dict[tuple[int, int], str] | None = None
        self._folders: dict[str, bool] = {}

    def whole_reads(self, folder: str) -> bool:
        """For the filesystem ``folder`` lies on; False when it cannot be told."""
        got = self._folders.get(folder)
        if got is None:
            got = self._ask(folder)
            if len(self._folders) >= MAX_FOLDERS:
                self._folders.clear()
            self._folders[folder] = got
        return got

    def _ask(self, folder: str) -> bool:
        try:
            if self._types is None:
                with open(self._mountinfo, encoding="utf-8", errors="replace") as f:
                    self._types = parse_mountinfo(f.read())
            dev = os.stat(folder or ".").st_dev
        except OSError:  # no /proc (not Linux), or the folder is gone: read to the size
            return False
        return whole_reads(self._types.get((os.major(dev), os.minor(dev))))
