"""The kernel cache loads only what this user built (issue #30), against a second local user.

The attacks run as a real second user where the machine allows it: the suite runs as root in
CI, so a forked child drops to `nobody` (os.setuid) and plants libraries, symlinks and
directories in a shared (1777) directory, or renames its library over the victim's entries
while the victim builds and loads. Its library's constructor writes a marker file: the marker
must never appear. Without root these tests are skipped (there is no second user to be).

The rest needs no second user: planted symlinks are never followed, the tree is private
whatever the umask, XDG_CACHE_HOME is honoured, and an unusable cache (read-only, full, a
directory at the entry, another user's) falls back to a private build with one warning and
leaves nothing behind in the temp directory.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from coconet.toolchain import host_compiler, kernel_cache
from coconet.toolchain.host_compiler import HostCompileError, compile_host
from coconet.toolchain.kernel_cache import CacheWarning, KernelCache, cache_root, content_key

NOBODY = 65534
IS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not IS_ROOT, reason="a second user needs root (setuid)")

SOURCE = (
    '#include "coco_device.h"\n'
    "COCO_KERNEL(fill, int* p, int v, coco_i64 n) { COCO_KERNEL_BODY_BEGIN"
    " COCO_BLOCK_STRIDE_LOOP(coco_i64, i, 0, n) { p[i] = v; } COCO_KERNEL_BODY_END }\n"
)
GENUINE = 'extern "C" int which(void) { return 1; }\n'
PLANTED = """
#include <fcntl.h>
#include <unistd.h>
__attribute__((constructor)) static void planted(void) {
    int fd = open("%s", O_WRONLY | O_CREAT, 0644);
    if (fd >= 0) close(fd);
}
extern "C" int which(void) { return 666; }
"""
RACE_ROUNDS = 100


# -- fixtures ------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def private_tmp(tmp_path, monkeypatch) -> Path:
    """A temp directory of the test's own, so that leftovers can be counted."""
    tmp = tmp_path / "tmp"
    tmp.mkdir(mode=0o700)
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setenv("COCONET_CACHE_DIR", str(tmp_path / "cache"))
    return tmp


@pytest.fixture
def shared() -> Iterator[Path]:
    """A 1777 directory that `nobody` can reach (tmp_path's parents are root's, 0700)."""
    if not os.path.isdir("/tmp") or not os.stat("/tmp").st_mode & stat.S_ISVTX:
        pytest.skip("no sticky /tmp to share with a second user")
    base = Path(tempfile.mkdtemp(prefix="coconet-shared-", dir="/tmp"))
    os.chmod(base, 0o755)
    d = base / "shared"
    d.mkdir()
    os.chmod(d, 0o1777)
    try:
        yield d
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def libraries() -> Iterator[tuple[bytes, Path, Path]]:
    """(the genuine library's bytes, the planted library, the marker its constructor makes)."""
    if shutil.which("g++") is None:
        pytest.skip("no g++")
    if not os.path.isdir("/tmp"):
        pytest.skip("no /tmp")
    base = Path(tempfile.mkdtemp(prefix="coconet-planted-", dir="/tmp"))
    os.chmod(base, 0o755)
    marker = base / "constructor-ran"
    libs = {}
    for name, text in (("genuine", GENUINE), ("planted", PLANTED % marker)):
        src = base / f"{name}.cpp"
        src.write_text(text)
        libs[name] = base / f"{name}.so"
        subprocess.run(["g++", "-shared", "-fPIC", "-o", libs[name], src], check=True)
        os.chmod(libs[name], 0o644)
    yield libs["genuine"].read_bytes(), libs["planted"], marker
    shutil.rmtree(base, ignore_errors=True)


# -- helpers -------------------------------------------------------------------------------------


def _become(uid: int, gid: int) -> None:
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)


def _as_user(fn: Callable[[], None], uid: int = NOBODY, gid: int = NOBODY) -> None:
    """Run `fn` in a child process as `uid`; the test fails with its traceback if it raised."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(r)
        code = 1
        try:
            _become(uid, gid)
            fn()
            code = 0
        except BaseException:
            os.write(w, traceback.format_exc().encode()[-8000:])
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        failure = f.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, failure


def _spawn_as(fn: Callable[[], None], uid: int = NOBODY, gid: int = NOBODY) -> int:
    """Run `fn` (a loop) in a child process as `uid` until it is killed; returns its pid."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            _become(uid, gid)
            fn()
        finally:
            os._exit(0)
    return pid


def _stop(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def _leftovers(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.iterdir())


def _fill_works(lib) -> bool:
    import numpy as np

    p = np.zeros(5, np.int32)
    lib.kernel("fill", ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong)(1, 2, p, 7, 5)
    return p.tolist() == [7] * 5


def _payload_cache(root: Path) -> tuple[KernelCache, Callable[[Path], None]]:
    cache = KernelCache("sec", root=root)

    def build(out: Path) -> None:
        out.write_bytes(b"payload")

    return cache, build


def _read(path: Path) -> bytes:
    return Path(path).read_bytes()


# -- a second user's library is never loaded -----------------------------------------------------


def _race(
    cache: KernelCache, keys: list[str], genuine: bytes, marker: Path, attack: Callable[[], None]
) -> list[warnings.WarningMessage]:
    """Build and load every key while `attack` (a loop, run as `nobody`) renames the planted
    library over the entries; asserts that every library loaded is the genuine one."""
    attacker = _spawn_as(attack)
    try:
        time.sleep(0.05)  # let the attacker start its loop
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            found = [
                cache.get_or_build(
                    key, ".so", lambda out: out.write_bytes(genuine), host_compiler._load
                ).value.which()
                for key in keys
            ]
    finally:
        _stop(attacker)
    assert not marker.exists(), "the planted library's constructor ran in the victim"
    assert found == [1] * len(keys)
    return caught


def _rename_over(entries: list[Path], planted: Path, spare: Path) -> Callable[[], None]:
    """The attacker's loop: hard-link its own copy of the planted library to a fresh name in
    each entry's directory and rename it over the entry, over and over."""

    def loop() -> None:
        own = spare / f"planted-{os.getpid()}.so"
        shutil.copyfile(planted, own)
        n = 0
        while True:
            for entry in entries:
                tmp = entry.parent / f".planted{n}"
                n += 1
                try:
                    os.link(own, tmp)
                    os.rename(tmp, entry)
                except OSError:
                    pass  # not (or no longer) a directory this user may write

    return loop


def _plant_tree(root: Path, cache: KernelCache, keys: list[str], planted: Path) -> None:
    """As the attacker: the cache's directories for `keys`, world-writable, and its library
    at every entry with a matching digest."""
    os.umask(0)
    data = planted.read_bytes()
    for key in keys:
        entry = root / cache.namespace / key[:2] / f"{key}.so"
        entry.parent.mkdir(parents=True, exist_ok=True, mode=0o777)
        entry.write_bytes(data)
        Path(f"{entry}.sha256").write_text(hashlib.sha256(data).hexdigest())


@needs_root
def test_a_cache_another_user_created_first_is_never_loaded_from(shared, libraries, private_tmp):
    genuine, planted, marker = libraries
    root = shared / "cache"
    cache = KernelCache("host", root=root)
    keys = [content_key("created first", str(i)) for i in range(RACE_ROUNDS)]
    _as_user(lambda: _plant_tree(root, cache, keys, planted))
    entries = [cache.path_for(k, ".so") for k in keys]
    caught = _race(cache, keys, genuine, marker, _rename_over(entries, planted, shared))
    assert len(caught) == len(keys)  # one warning a build, naming the owner
    assert all(f"belongs to uid {NOBODY}" in str(w.message) for w in caught)
    assert cache.stats.uncached == len(keys)
    assert all(os.stat(e).st_uid == NOBODY for e in entries)  # nothing published there
    assert _leftovers(private_tmp) == []


@needs_root
def test_a_shared_1777_cache_is_never_loaded_from(shared, libraries, private_tmp):
    """The victim's own cache directory, 1777 (a shared COCONET_CACHE_DIR): the attacker got
    its namespace directory in first."""
    genuine, planted, marker = libraries
    root = shared / "cache"
    root.mkdir()
    os.chmod(root, 0o1777)
    cache = KernelCache("host", root=root)
    keys = [content_key("1777", str(i)) for i in range(RACE_ROUNDS)]
    _as_user(lambda: _plant_tree(root, cache, keys, planted))
    entries = [cache.path_for(k, ".so") for k in keys]
    caught = _race(cache, keys, genuine, marker, _rename_over(entries, planted, shared))
    messages = [str(w.message) for w in caught]
    assert "others could write" in messages[0]
    assert "1777" in messages[0]
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o700
    assert sum(f"belongs to uid {NOBODY}" in m for m in messages) == len(keys)
    assert _leftovers(private_tmp) == []


@needs_root
def test_a_group_writable_cache_is_made_private_before_anything_is_published(
    shared, libraries, private_tmp
):
    """A tree left group-writable (umask 002) and an attacker in the group: the first build
    makes it private, and the attacker's renames fail from then on."""
    genuine, planted, marker = libraries
    root = shared / "cache"
    cache = KernelCache("host", root=root)
    keys = [content_key("group", str(i)) for i in range(RACE_ROUNDS)]
    entries = [cache.path_for(k, ".so") for k in keys]
    for d in {root, root / "host", *(e.parent for e in entries)}:
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o775)
    attack = _rename_over(entries, planted, shared)
    attacker = _spawn_as(attack, gid=os.getegid())  # nobody, in the victim's group
    try:
        time.sleep(0.05)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            found = [
                cache.get_or_build(
                    key, ".so", lambda out: out.write_bytes(genuine), host_compiler._load
                )
                for key in keys
            ]
    finally:
        _stop(attacker)
    assert not marker.exists()
    assert [a.value.which() for a in found] == [1] * len(keys)
    assert all(stat.S_IMODE(os.stat(d).st_mode) == 0o700 for d in (root, root / "host"))
    assert any("others could write" in str(w.message) for w in caught)
    assert all(w.category is CacheWarning for w in caught)
    assert _leftovers(private_tmp) == []


def test_the_file_loaded_is_the_file_checked(tmp_path):
    """A rename over the entry between the checks and the load (the attacker's window) does
    not change what is loaded: `load` reads the checked file, not the entry's path."""
    cache, build = _payload_cache(tmp_path / "cache")
    key = content_key("swap")
    entry = cache.path_for(key, ".bin")
    forged = tmp_path / "forged"
    forged.write_bytes(b"forged")

    def load_after_a_swap(path: Path) -> bytes:
        spare = entry.with_name("spare")
        shutil.copyfile(forged, spare)
        os.replace(spare, entry)
        return _read(path)

    assert cache.get_or_build(key, ".bin", build, load_after_a_swap).value == b"payload"
    entry.unlink()
    cache.get_or_build(key, ".bin", build, _read)
    hit = cache.get_or_build(key, ".bin", build, load_after_a_swap)
    assert hit.cache_hit
    assert hit.value == b"payload"


def test_an_entry_hard_linked_from_another_key_is_not_trusted(tmp_path):
    cache, build = _payload_cache(tmp_path / "cache")
    a, b = content_key("a"), content_key("b")
    cache.get_or_build(b, ".bin", lambda out: out.write_bytes(b"b's"), _read)
    entry = cache.path_for(a, ".bin")
    entry.parent.mkdir(parents=True, exist_ok=True)
    other = cache.path_for(b, ".bin")
    os.link(other, entry)
    os.link(f"{other}.sha256", f"{entry}.sha256")
    got = cache.get_or_build(a, ".bin", build, _read)
    assert (got.value, got.cache_hit, cache.stats.untrusted) == (b"payload", False, 1)


# -- nothing planted is followed -----------------------------------------------------------------


def test_symlinks_planted_at_every_predictable_name_are_not_followed(tmp_path, monkeypatch):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    counter = iter(range(10**6))
    monkeypatch.setattr(
        kernel_cache, "_random_token", lambda: f"{next(counter):04d}", raising=False
    )
    cache, _ = _payload_cache(tmp_path / "cache")
    key = content_key("symlinks")
    entry = cache.path_for(key, ".bin")
    entry.parent.mkdir(parents=True)
    names = [entry.name, f"{entry.name}.sha256", f"{entry.name}.lock"]
    names += [f".{n}.{i:04d}.tmp" for n in (entry.name, f"{entry.name}.sha256") for i in range(4)]
    for name in names:
        (entry.parent / name).symlink_to(victim)

    def build(out: Path) -> None:
        # and every name a build's digest was once written to, next to the build's output
        for name in (f"{out.name}.sha256", f"{out.name}.sha256.tmp"):
            (out.parent / name).symlink_to(victim)
        out.with_suffix(".sha256.tmp").symlink_to(victim)
        out.write_bytes(b"payload")

    got = cache.get_or_build(key, ".bin", build, _read)
    assert got.value == b"payload"
    assert victim.read_text() == "keep me"
    again = cache.get_or_build(key, ".bin", build, _read)
    assert again.cache_hit
    assert not entry.is_symlink()
    assert victim.read_text() == "keep me"


# -- a private tree whatever the umask; where it is -----------------------------------------------


@pytest.mark.parametrize("mask", [0o002, 0o000])
def test_the_tree_is_private_whatever_the_umask(mask, tmp_path):
    source = SOURCE + f"// umask {mask:03o}\n"
    old = os.umask(mask)
    try:
        first = compile_host(source)
        second = compile_host(source)
    finally:
        os.umask(old)
    assert (first.cache_hit, second.cache_hit) == (False, True)
    assert _fill_works(second)
    root = tmp_path / "cache"
    shard = first.path.parent
    for d in (root, root / "host", shard):
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700, d
    files = list(shard.iterdir())
    assert {f.name for f in files} >= {first.path.name, f"{first.path.name}.sha256"}
    for f in files:
        assert stat.S_IMODE(os.stat(f).st_mode) == 0o600, f


def test_xdg_cache_home_is_honoured(tmp_path, monkeypatch):
    monkeypatch.delenv("COCONET_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "coconet"
    cache = KernelCache("sec")
    got = cache.get_or_build(content_key("xdg"), ".bin", lambda out: out.write_bytes(b"x"), _read)
    assert (tmp_path / "xdg" / "coconet") in got.path.parents
    assert got.path.read_bytes() == b"x"
    assert stat.S_IMODE(os.stat(tmp_path / "xdg").st_mode) == 0o700
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # invalid: the spec says ignore it
    assert cache_root() == tmp_path / "home" / ".cache" / "coconet"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_root() == tmp_path / "home" / ".cache" / "coconet"
    monkeypatch.setenv("COCONET_CACHE_DIR", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "explicit"


def test_a_directory_others_may_write_is_made_private_once(tmp_path, private_tmp):
    root = tmp_path / "cache"
    (root / "sec").mkdir(parents=True)
    os.chmod(root, 0o1777)
    os.chmod(root / "sec", 0o775)
    cache, build = _payload_cache(root)
    key = content_key("repair")
    with pytest.warns(CacheWarning, match="others could write") as caught:
        cache.get_or_build(key, ".bin", build, _read)
    assert len(caught) == 1
    assert "1777" in str(caught[0].message)
    assert "775" in str(caught[0].message)
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(root / "sec").st_mode) == 0o700
    assert cache.stats.repaired == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache.get_or_build(key, ".bin", build, _read).cache_hit


# -- an unusable cache falls back, once, and leaves nothing behind -----------------------------------


def _falls_back(cache, build, key: str, match: str, tmp: Path) -> None:
    with pytest.warns(CacheWarning, match=match) as caught:
        got = cache.get_or_build(key, ".bin", build, _read)
    assert len(caught) == 1, [str(w.message) for w in caught]
    assert (got.value, got.cache_hit, cache.stats.uncached) == (b"payload", False, 1)
    assert _leftovers(tmp) == []


@pytest.mark.parametrize("how", ["other-owner", "symlink", "file", "other-owner-namespace"])
def test_a_cache_that_is_not_this_users_falls_back(how, tmp_path, private_tmp):
    root = tmp_path / "cache"
    if how == "symlink":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        root.symlink_to(tmp_path / "elsewhere")
    elif how == "file":
        root.write_text("not a directory")
    else:
        if not IS_ROOT:
            pytest.skip("changing a directory's owner needs root")
        mine = root if how == "other-owner" else root / "sec"
        mine.mkdir(parents=True, mode=0o700)
        os.chown(mine, NOBODY, NOBODY)
    cache, build = _payload_cache(root)
    match = {
        "symlink": "is a symbolic link",
        "file": "is not a directory",
    }.get(how, f"belongs to uid {NOBODY}")
    _falls_back(cache, build, content_key(how), match, private_tmp)
    if how == "symlink":
        assert list((tmp_path / "elsewhere").iterdir()) == []


def test_a_directory_at_the_entry_falls_back(tmp_path, private_tmp):
    cache, build = _payload_cache(tmp_path / "cache")
    key = content_key("dir at entry")
    cache.path_for(key, ".bin").mkdir(parents=True)
    _falls_back(cache, build, key, "EISDIR", private_tmp)


def test_an_empty_read_only_cache_falls_back(shared, private_tmp):
    """A read-only cache for a real user (root writes anywhere, so `nobody` is the victim when
    the suite runs as root)."""
    root = shared / "readonly"
    tmp = shared / "tmp"
    root.mkdir(mode=0o700)
    tmp.mkdir(mode=0o700)
    if IS_ROOT:
        for d in (root, tmp):
            os.chown(d, NOBODY, NOBODY)
    os.chmod(root, 0o500)

    def victim() -> None:
        tempfile.tempdir = str(tmp)
        cache, build = _payload_cache(root)
        _falls_back(cache, build, content_key("read-only"), "cannot be created", tmp)
        assert list(root.iterdir()) == []

    if IS_ROOT:
        _as_user(victim)
    else:
        victim()


@pytest.fixture
def full_cache_disk(monkeypatch, tmp_path):
    """Every write into the cache directory fails with ENOSPC (a full disk)."""
    cache_dir = str(tmp_path / "cache")
    write = os.write

    def full(fd: int, data) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").startswith(cache_dir):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return write(fd, data)

    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc/self/fd")
    monkeypatch.setattr(os, "write", full)


def test_a_full_cache_disk_falls_back(tmp_path, private_tmp, full_cache_disk):
    cache, build = _payload_cache(tmp_path / "cache")
    key = content_key("full")
    _falls_back(cache, build, key, "ENOSPC", private_tmp)
    shard = cache.path_for(key, ".bin").parent
    assert [p.name for p in shard.iterdir() if not p.name.endswith(".lock")] == []


def test_a_full_cache_disk_still_compiles_the_kernels(tmp_path, private_tmp, full_cache_disk):
    with pytest.warns(CacheWarning, match="ENOSPC") as caught:
        lib = compile_host(SOURCE + "// full disk\n")
    assert len(caught) == 1
    assert _fill_works(lib)
    assert not lib.cache_hit
    assert _leftovers(private_tmp) == []


def test_a_link_that_fails_on_a_full_disk_says_so(tmp_path, monkeypatch, private_tmp):
    """When the private build fails too, with only collect2's line, the error names ENOSPC;
    a link that fails with space left is not blamed on the disk."""
    fake = tmp_path / "fake-g++"
    fake.write_text(
        "#!/bin/sh\n"
        'case "$1" in --version) echo fake 1.0; exit 0;; -dumpmachine) echo x86_64; exit 0;; esac\n'
        'echo "collect2: error: ld returned 1 exit status" >&2\n'
        "exit 1\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("CXX", str(fake))
    monkeypatch.setenv("COCONET_HOST_MARCH", "default")
    with pytest.raises(HostCompileError) as plain:
        compile_host(SOURCE + "// link fails\n")
    assert "ENOSPC" not in str(plain.value)
    full = os.statvfs_result((4096, 4096, 1000, 0, 0, 1000, 10, 10, 0, 255))
    monkeypatch.setattr(os, "statvfs", lambda path: full)
    with pytest.raises(HostCompileError, match="ENOSPC") as info:
        compile_host(SOURCE + "// disk full\n")
    assert "collect2" in info.value.output
    assert "No space left on device" in info.value.note
    assert _leftovers(private_tmp) == []


def test_a_compile_error_is_not_taken_for_a_cache_problem(tmp_path, private_tmp):
    """The cache is unusable (a file where it should be) and the source is wrong: the
    compiler's error is raised, with no warning about the cache."""
    (tmp_path / "cache").write_text("not a directory")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(HostCompileError, match="no_such_function"):
            compile_host(SOURCE.replace("p[i] = v;", "no_such_function(p);"))
    assert _leftovers(private_tmp) == []
