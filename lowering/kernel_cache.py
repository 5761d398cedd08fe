"""A content-addressed on-disk cache for compiled kernels.

Entries are keyed by a SHA-256 over everything that determines the artifact (source, device
headers, flags, compiler identity), so a key never needs invalidation. The cache is shared
between the MPI ranks of one job and between jobs, hence:

* an entry is built into a temporary file in the final directory and published with
  os.replace (atomic on POSIX), so a reader sees either no entry or a complete one;
* concurrent builders of one key both succeed; the last replace wins with identical content;
* an entry that fails to load (truncated, corrupted, wrong architecture) is rebuilt;
* an entry is loaded only if it is intact -- its SHA-256 matches the digest written beside it
  when it was published (a truncated or bit-flipped shared library can load and then crash
  with SIGBUS/SIGSEGV) -- and trusted: owned by this user and writable by nobody else (a
  library planted by another user of a shared cache directory is never loaded);
* a cache that cannot be written (read-only, or owned by someone else) still works: the
  artifact is built in a private temporary directory instead, uncached.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

__all__ = ["CacheStats", "CachedArtifact", "KernelCache", "cache_root", "content_key"]

T = TypeVar("T")


def cache_root() -> Path:
    """$COCONET_CACHE_DIR, else ~/.cache/coconet (read on every call so tests can redirect)."""
    override = os.environ.get("COCONET_CACHE_DIR")
    if override:
        return Path(override)
    return Path.home() / ".cache" / "coconet"


def content_key(*parts: str | bytes) -> str:
    """SHA-256 over length-prefixed parts: ("ab", "c") and ("a", "bc") differ."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


@dataclass
class CacheStats:
    """Per-process counters; tests use them to prove that a second compile built nothing."""

    hits: int = 0
    builds: int = 0
    rebuilt_corrupt: int = 0
    untrusted: int = 0  # entries refused for their owner or permissions
    uncached: int = 0  # builds that could not be published (read-only cache)


@dataclass(frozen=True)
class CachedArtifact(Generic[T]):
    value: T
    path: Path
    cache_hit: bool


class KernelCache:
    """One namespace (e.g. "host") of the cache: <root>/<namespace>/<key[:2]>/<key><suffix>."""

    def __init__(self, namespace: str, root: Path | None = None) -> None:
        self.namespace = namespace
        self._root = root
        self.stats = CacheStats()

    @property
    def directory(self) -> Path:
        return (self._root if self._root is not None else cache_root()) / self.namespace

    def path_for(self, key: str, suffix: str) -> Path:
        return self.directory / key[:2] / f"{key}{suffix}"

    def get_or_build(
        self,
        key: str,
        suffix: str,
        build: Callable[[Path], None],
        load: Callable[[Path], T],
    ) -> CachedArtifact[T]:
        """Load the entry for `key`, building it first when absent or unloadable.

        `build(tmp_path)` must write the artifact to `tmp_path`; `load(path)` turns a published
        entry into a value and raises OSError (or ValueError) when the entry is unusable.
        """
        path = self.path_for(key, suffix)
        if path.exists():
            if not _trusted(path):
                self.stats.untrusted += 1
            elif _intact(path):
                try:
                    value = load(path)
                except (OSError, ValueError):
                    self.stats.rebuilt_corrupt += 1
                else:
                    self.stats.hits += 1
                    return CachedArtifact(value, path, cache_hit=True)
            else:
                self.stats.rebuilt_corrupt += 1
        try:
            self._build_and_publish(path, build)
        except PermissionError:
            return self._build_privately(path.name, build, load)
        self.stats.builds += 1
        return CachedArtifact(load(path), path, cache_hit=False)

    def _build_privately(
        self, name: str, build: Callable[[Path], None], load: Callable[[Path], T]
    ) -> CachedArtifact[T]:
        """Build into a fresh directory only this process uses (the cache cannot be
        written); the directory stays while the process runs, since the artifact is loaded."""
        private = Path(tempfile.mkdtemp(prefix="coconet-uncached-"))
        out = private / name
        build(out)
        self.stats.builds += 1
        self.stats.uncached += 1
        return CachedArtifact(load(out), out, cache_hit=False)

    @staticmethod
    def _build_and_publish(path: Path, build: Callable[[Path], None]) -> None:
        _private_mkdir(path.parent)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        tmp = Path(tmp_name)
        digest_tmp = tmp.with_suffix(".sha256.tmp")
        try:
            build(tmp)
            digest_tmp.write_text(_digest(tmp))
            os.chmod(tmp, 0o600)
            os.chmod(digest_tmp, 0o600)
            # the digest first: a reader that sees the new artifact sees its digest too
            os.replace(digest_tmp, _digest_path(path))
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
            digest_tmp.unlink(missing_ok=True)


def _digest_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _intact(path: Path) -> bool:
    """The entry's bytes are the ones that were published."""
    try:
        return _digest_path(path).read_text().strip() == _digest(path)
    except OSError:
        return False


def _trusted(path: Path) -> bool:
    """Owned by this user and writable by no one else (file and its directory)."""
    try:
        for p in (path, path.parent):
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode) or st.st_uid != os.getuid():
                return False
            if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                return False
    except OSError:
        return False
    return True


def _private_mkdir(directory: Path) -> None:
    """Create the cache directories readable and writable by this user only."""
    old = os.umask(0o077)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    finally:
        os.umask(old)
