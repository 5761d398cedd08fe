"""A content-addressed on-disk cache for compiled kernels.

Entries are keyed by a SHA-256 over everything that determines the artifact (source, device
headers, flags, compiler identity), so a key never needs invalidation. The cache is shared
between the MPI ranks of one job and between jobs, hence:

* an entry is built into a temporary file in the final directory and published with
  os.replace (atomic on POSIX), so a reader sees either no entry or a complete one;
* concurrent builders of one key both succeed; the last replace wins with identical content;
* an entry that fails to load (truncated, corrupted, wrong architecture) is rebuilt.
"""

from __future__ import annotations

import hashlib
import os
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
            try:
                value = load(path)
            except (OSError, ValueError):
                self.stats.rebuilt_corrupt += 1
            else:
                self.stats.hits += 1
                return CachedArtifact(value, path, cache_hit=True)
        self._build_and_publish(path, build)
        self.stats.builds += 1
        return CachedArtifact(load(path), path, cache_hit=False)

    @staticmethod
    def _build_and_publish(path: Path, build: Callable[[Path], None]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        tmp = Path(tmp_name)
        try:
            build(tmp)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
