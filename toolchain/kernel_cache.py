"""A content-addressed on-disk cache for compiled kernels.

Entries are keyed by a SHA-256 over everything that determines the artifact (source, device
headers, flags, compiler identity), so a key never needs invalidation. The cache lives under
cache_root() -- $COCONET_CACHE_DIR, else $XDG_CACHE_HOME/coconet, else ~/.cache/coconet -- as
<root>/<namespace>/<key[:2]>/<key><suffix>, each entry's SHA-256 beside it in <entry>.sha256.
It is shared between the MPI ranks of one job and between jobs, and loading an entry can run
code (a shared library's constructors, a pickled plan), so it loads only what this user built:

* the tree is private: each of its directories (root, namespace, shard) is opened without
  following a symbolic link and checked on its descriptor; one owned by another user, a
  symbolic link or a non-directory makes the cache unusable; one this user owns that others may
  write is made 0700, with a warning; the ones this process makes are 0700 and its files 0600,
  whatever the umask. Everything below the root is reached through these descriptors, never
  through a path that someone could rename something else onto meanwhile;
* an entry is loaded only through the descriptor it was checked on: a regular file of this
  user with one link, writable by nobody else, whose SHA-256 -- read through that descriptor --
  matches the digest beside it (a truncated or bit-flipped shared library can load and then
  crash with SIGBUS/SIGSEGV). `load` gets /proc/self/fd/N, a name of that very file;
* a build runs in a private temporary directory (mkdtemp, 0700); its output is copied into a
  temporary file created in the shard with O_CREAT|O_EXCL|O_NOFOLLOW (a planted symlink is
  never followed, nothing is truncated), its digest likewise, and both are published with
  os.replace (atomic): a reader sees either no entry or a complete one. The process then loads
  the file it wrote, through the descriptor it wrote it with;
* builders of one key take a lock in the shard, so MPI ranks compile a kernel once; without
  the lock both would still succeed (the last replace wins, with identical content);
* an entry that fails to load (truncated, corrupted, wrong architecture) is rebuilt;
* a cache that cannot be used -- not this user's, read-only, full, a directory where the entry
  should be -- falls back to the private build, loaded from there and then removed, with one
  CacheWarning naming the cause. A build that fails is raised as it is: a compiler's error is
  never mistaken for a cache problem.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import secrets
import shutil
import stat
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Generator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

__all__ = [
    "CacheStats",
    "CacheWarning",
    "CachedArtifact",
    "KernelCache",
    "cache_root",
    "content_key",
    "fd_path",
    "pinned",
]

T = TypeVar("T")
# Seconds a builder waits for another process building the same key before building it too
# (an NVRTC unit of many kernels compiles in well under a minute).
LOCK_WAIT = 300.0

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a FIFO at an entry's name must not hang the open
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH
_FD_DIR = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"


def cache_root() -> Path:
    """$COCONET_CACHE_DIR, else $XDG_CACHE_HOME/coconet, else ~/.cache/coconet (read on every
    call so tests can redirect; a relative XDG_CACHE_HOME is ignored, as the spec says)."""
    override = os.environ.get("COCONET_CACHE_DIR")
    if override:
        return Path(override)
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "coconet"
    return Path.home() / ".cache" / "coconet"


def content_key(*parts: str | bytes) -> str:
    """SHA-256 over length-prefixed parts: ("ab", "c") and ("a", "bc") differ."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


class CacheWarning(UserWarning):
    """The cache was not usable as it was: a directory was made private, or an artifact was
    built privately and not cached."""


@dataclass
class CacheStats:
    """Per-process counters; tests use them to prove that a second compile built nothing."""

    hits: int = 0
    builds: int = 0
    rebuilt_corrupt: int = 0
    untrusted: int = 0  # entries refused for their owner, permissions, links or file type
    uncached: int = 0  # builds that could not be published (unusable cache)
    repaired: int = 0  # directories of the tree made private (others could write them)


@dataclass(frozen=True)
class CachedArtifact(Generic[T]):
    """`path` is the entry's place in the cache; for an uncached build, where it was built
    (removed once loaded)."""

    value: T
    path: Path
    cache_hit: bool


def fd_path(fd: int) -> Path:
    """A name of the file open on `fd` itself, whatever its path names by now."""
    return Path(f"{_FD_DIR}/{fd}")


_pins: dict[tuple[int, int], int] = {}
_pins_lock = threading.Lock()


def pinned(path: Path | str) -> str:
    """A name, for the rest of the process, of the file `path` names now (the name a load
    callback gets), for loaders that open it after the callback returns: CuPy loads a module
    on first use, and the dynamic loader knows a library by its name, so a descriptor number
    closed and reused would hand back the library loaded under it before. One descriptor is
    kept per file (its inode stays allocated, so (device, inode) names it alone)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    st = os.fstat(fd)
    with _pins_lock:
        kept = _pins.setdefault((st.st_dev, st.st_ino), fd)
    if kept != fd:
        os.close(fd)
    return str(fd_path(kept))


class _Unusable(Exception):
    """The cache cannot be used; the message says why."""


class _Untrusted(Exception):
    """An entry that is not a private regular file of this user."""


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

        `build(out)` must write the artifact to `out` (in a private directory). `load(path)`
        turns it into a value and raises OSError (or ValueError) when it is unusable; `path`
        names the checked file only during the call (see pinned() to keep it).
        """
        name = key + suffix
        try:
            shard = self._open_shard(key, create=True)
        except _Unusable as e:
            return self._build_uncached(name, build, load, str(e))
        try:
            found = self._lookup(shard, key, suffix, load, count=False)
            if isinstance(found, CachedArtifact):
                return found
            with _locked(shard, name):
                # another builder may have published it while this one waited
                found = self._lookup(shard, key, suffix, load, count=True)
                if isinstance(found, CachedArtifact):
                    return found
                return self._build_and_publish(shard, key, suffix, build, load)
        finally:
            os.close(shard)

    def get(self, key: str, suffix: str, load: Callable[[Path], T]) -> CachedArtifact[T] | None:
        """The entry for `key` if the cache holds a usable one; builds and creates nothing."""
        try:
            shard = self._open_shard(key, create=False)
        except _Unusable:
            return None
        try:
            found = self._lookup(shard, key, suffix, load, count=True)
        finally:
            os.close(shard)
        return found if isinstance(found, CachedArtifact) else None

    # -- the tree ------------------------------------------------------------------------------

    def _open_shard(self, key: str, *, create: bool) -> int:
        """A checked descriptor on the shard directory of `key` (made when `create`); the
        directories it had to make private are named in one warning."""
        repaired: list[str] = []
        try:
            fd = self._open_tree(key, create, repaired)
        except _Unusable:
            self._report_repairs(repaired)
            raise
        try:
            self._report_repairs(repaired)
        except BaseException:  # a warning turned into an error
            os.close(fd)
            raise
        return fd

    def _open_tree(self, key: str, create: bool, repaired: list[str]) -> int:
        root = self.directory.parent
        if create:
            _make_ancestors(root.parent)
        fd = _open_private_dir(None, root, root, create, repaired)
        try:
            where = root
            for part in (self.namespace, key[:2]):
                where = where / part
                child = _open_private_dir(fd, part, where, create, repaired)
                os.close(fd)
                fd = child
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _report_repairs(self, repaired: list[str]) -> None:
        if repaired:
            self.stats.repaired += len(repaired)
            warnings.warn(
                f"coconet cache: others could write {', '.join(repaired)}; made private (0700)",
                CacheWarning,
                stacklevel=4,
            )

    # -- entries -------------------------------------------------------------------------------

    def _lookup(
        self, shard: int, key: str, suffix: str, load: Callable[[Path], T], *, count: bool
    ) -> CachedArtifact[T] | str:
        """The loaded entry, or why there is none: absent, untrusted or corrupt (counted in
        the stats when `count`)."""
        name = key + suffix
        try:
            fd = _open_entry(shard, name)
        except FileNotFoundError:
            return "absent"
        except _Untrusted:
            self.stats.untrusted += count
            return "untrusted"
        try:
            if not _intact(shard, name, fd):
                self.stats.rebuilt_corrupt += count
                return "corrupt"
            value = load(fd_path(fd))
        except _Untrusted:  # its digest file
            self.stats.untrusted += count
            return "untrusted"
        except (OSError, ValueError):
            self.stats.rebuilt_corrupt += count
            return "corrupt"
        finally:
            os.close(fd)
        self.stats.hits += 1
        return CachedArtifact(value, self.path_for(key, suffix), cache_hit=True)

    def _build_and_publish(
        self,
        shard: int,
        key: str,
        suffix: str,
        build: Callable[[Path], None],
        load: Callable[[Path], T],
    ) -> CachedArtifact[T]:
        path = self.path_for(key, suffix)
        with _private_build(path.name, build) as (out_fd, out):
            try:
                fd = _publish(shard, path.name, out_fd)
            except OSError as e:
                return self._load_uncached(out_fd, out, load, f"{path} {_cannot('written', e)}")
        try:
            value = load(fd_path(fd))
        finally:
            os.close(fd)
        self.stats.builds += 1
        return CachedArtifact(value, path, cache_hit=False)

    def _build_uncached(
        self, name: str, build: Callable[[Path], None], load: Callable[[Path], T], cause: str
    ) -> CachedArtifact[T]:
        with _private_build(name, build) as (out_fd, out):
            return self._load_uncached(out_fd, out, load, cause)

    def _load_uncached(
        self, fd: int, out: Path, load: Callable[[Path], T], cause: str
    ) -> CachedArtifact[T]:
        warnings.warn(
            f"coconet cache: {cause}; built privately, not cached", CacheWarning, stacklevel=2
        )
        value = load(fd_path(fd))
        self.stats.builds += 1
        self.stats.uncached += 1
        return CachedArtifact(value, out, cache_hit=False)


# -- directories -------------------------------------------------------------------------------


def _make_ancestors(directory: Path) -> None:
    """The missing folders above the cache root (e.g. ~/.cache), made 0700."""
    missing: list[Path] = []
    for p in (directory, *directory.parents):
        if os.path.lexists(p):
            break
        missing.append(p)
    for p in reversed(missing):
        try:
            os.mkdir(p, 0o700)
        except FileExistsError:
            pass
        except OSError as e:
            raise _Unusable(f"{p} {_cannot('created', e)}") from None


def _open_private_dir(
    parent: int | None, name: str | Path, shown: Path, create: bool, repaired: list[str]
) -> int:
    """A descriptor on directory `name` (relative to the descriptor `parent`, or a path),
    made if absent and `create`, checked to be this user's and private (one that others could
    write is made so, and named in `repaired`)."""
    created = False
    try:
        fd = _open_dir(parent, name, shown)
    except FileNotFoundError:
        if not create:
            raise _Unusable(f"{shown} does not exist") from None
        try:
            os.mkdir(name, 0o700, dir_fd=parent)
            created = True
        except FileExistsError:  # another process made it first
            pass
        except OSError as e:
            raise _Unusable(f"{shown} {_cannot('created', e)}") from None
        try:
            fd = _open_dir(parent, name, shown)
        except FileNotFoundError as e:
            raise _Unusable(f"{shown} {_cannot('opened', e)}") from None
    try:
        _make_private(fd, shown, created, repaired)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_dir(parent: int | None, name: str | Path, shown: Path) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        raise
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            try:
                link = stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode)
            except OSError:
                link = False
            raise _Unusable(f"{shown} is {'a symbolic link' if link else 'not a directory'}")
        raise _Unusable(f"{shown} {_cannot('opened', e)}") from None


def _make_private(fd: int, shown: Path, created: bool, repaired: list[str]) -> None:
    """Refuse a directory of another user; take group and other bits off this user's (the
    umask does not decide: under umask 002 the tree would be group-writable, under 000
    world-writable). Only a directory this process made gets bits added (0700): one that
    this user made read-only stays so."""
    st = os.fstat(fd)
    if st.st_uid != os.geteuid():
        raise _Unusable(f"{shown} belongs to uid {st.st_uid}, not to this user")
    mode = stat.S_IMODE(st.st_mode)
    private = 0o700 if created else mode & 0o700
    if mode == private:
        return
    try:
        os.fchmod(fd, private)
    except OSError as e:
        if mode & _OTHERS_WRITE:
            raise _Unusable(f"{shown} is writable by others and {_cannot('made private', e)}")
        return  # e.g. a read-only file system: no one can write it
    if mode & _OTHERS_WRITE and not created:
        repaired.append(f"{shown} (mode {mode:o})")


# -- files -------------------------------------------------------------------------------------


def _open_entry(directory: int, name: str) -> int:
    """A descriptor on `name` if it is a regular file of this user, with one link, that nobody
    else may write (a second link could be another key's entry, hard-linked here)."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=directory)
    except FileNotFoundError:
        raise
    except OSError as e:  # ELOOP: a symbolic link
        raise _Untrusted(f"{name}: {e.strerror}") from None
    st = os.fstat(fd)
    if (
        not stat.S_ISREG(st.st_mode)
        or st.st_uid != os.geteuid()
        or st.st_mode & _OTHERS_WRITE
        or st.st_nlink != 1
    ):
        os.close(fd)
        raise _Untrusted(name)
    return fd


def _intact(directory: int, name: str, fd: int) -> bool:
    """The entry open on `fd` holds the bytes that were published (its digest file says)."""
    try:
        digest_fd = _open_entry(directory, _digest_name(name))
    except FileNotFoundError:
        return False
    try:
        recorded = os.read(digest_fd, 256).strip()
    finally:
        os.close(digest_fd)
    return recorded == _digest(fd).encode()


def _digest_name(name: str) -> str:
    return name + ".sha256"


def _digest(fd: int) -> str:
    """SHA-256 of the file open on `fd`, read with pread (the descriptor's offset is kept)."""
    h = hashlib.sha256()
    offset = 0
    while block := os.pread(fd, 1 << 20, offset):
        h.update(block)
        offset += len(block)
    return h.hexdigest()


@contextmanager
def _private_build(
    name: str, build: Callable[[Path], None]
) -> Generator[tuple[int, Path], None, None]:
    """Run `build` into a fresh directory of this process (0700, in the temp dir); yields a
    descriptor on its output and its path, and removes the directory afterwards (a file
    loaded from it stays reachable through its descriptor)."""
    directory = Path(tempfile.mkdtemp(prefix="coconet-build-"))
    try:
        out = directory / name
        dir_fd = os.open(directory, _DIR_FLAGS)
        try:
            st = os.fstat(dir_fd)
            if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077:
                raise PermissionError(errno.EACCES, "not a private directory", str(directory))
            build(out)
            fd = _open_output(dir_fd, name, out)
        finally:
            os.close(dir_fd)
        try:
            yield fd, out
        finally:
            os.close(fd)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _open_output(directory: int, name: str, shown: Path) -> int:
    """A descriptor on the build's output: a regular file of this user (its mode does not
    matter in a private directory; the compiler makes it 0755, or 0777 under umask 000)."""
    fd = os.open(name, _READ_FLAGS, dir_fd=directory)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise PermissionError(
            errno.EACCES, "the build's output is not this user's file", str(shown)
        )
    return fd


def _publish(shard: int, name: str, source: int) -> int:
    """Copy the file open on `source` into the shard as `name`, its digest beside it; returns
    a descriptor on the published file."""
    fd, tmp = _create_temp(shard, name)
    digest_tmp: str | None = None
    try:
        digest = _copy(source, fd)
        digest_fd, digest_tmp = _create_temp(shard, _digest_name(name))
        try:
            _write_all(digest_fd, digest.encode())
        finally:
            os.close(digest_fd)
        # the digest first: a reader that sees the new entry sees its digest too
        os.replace(digest_tmp, _digest_name(name), src_dir_fd=shard, dst_dir_fd=shard)
        digest_tmp = None
        os.replace(tmp, name, src_dir_fd=shard, dst_dir_fd=shard)
        tmp = None
    except BaseException:
        os.close(fd)
        raise
    finally:
        for leftover in (tmp, digest_tmp):
            if leftover is not None:
                _unlink_quietly(shard, leftover)
    return fd


def _random_token() -> str:
    return secrets.token_hex(8)


def _create_temp(directory: int, name: str) -> tuple[int, str]:
    """A new file .<name>.<random>.tmp, 0600: O_EXCL|O_NOFOLLOW, so a name someone planted
    (a symlink to a file of this user) is skipped, never followed or truncated."""
    for _ in range(100):
        tmp = f".{name}.{_random_token()}.tmp"
        try:
            fd = os.open(tmp, _CREATE_FLAGS, 0o600, dir_fd=directory)
        except FileExistsError:
            continue
        os.fchmod(fd, 0o600)  # the umask could only have taken bits away; be explicit
        return fd, tmp
    raise FileExistsError(errno.EEXIST, "no free temporary name", name)


def _copy(source: int, target: int) -> str:
    """Copy `source` into `target`; returns the SHA-256 of the bytes copied."""
    h = hashlib.sha256()
    offset = 0
    while block := os.pread(source, 1 << 20, offset):
        h.update(block)
        _write_all(target, block)
        offset += len(block)
    return h.hexdigest()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _unlink_quietly(directory: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=directory)
    except OSError:
        pass


@contextmanager
def _locked(shard: int, name: str) -> Generator[None, None, None]:
    """Serialize builders of one key across processes and threads (MPI ranks compile the same
    kernels at the same moment). Correctness does not depend on it, only wasted compiler time,
    so a lock that cannot be taken (read-only cache, a symlink at its name) is skipped, and
    one held for `LOCK_WAIT` seconds (a builder stopped, or stuck in its compiler) is given
    up on: nothing waits forever."""
    try:
        fd = os.open(
            name + ".lock",
            os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
            dir_fd=shard,
        )
    except OSError:
        fd = None
    if fd is None:
        yield
        return
    try:
        deadline = time.monotonic() + LOCK_WAIT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.02)
        yield
    finally:
        os.close(fd)  # releases the lock


def _cannot(what: str, e: OSError) -> str:
    code = errno.errorcode.get(e.errno, "") if e.errno is not None else ""
    return f"cannot be {what} ({code}: {e.strerror})" if code else f"cannot be {what} ({e})"
