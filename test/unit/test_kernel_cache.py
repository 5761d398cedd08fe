"""The kernel cache never loads what it should not and works where it cannot write: a
bit-flipped or truncated library is rebuilt (loading it could crash with SIGBUS/SIGSEGV), an
entry owned by another user or writable by others is not trusted, a lock file planted as a
symlink is neither followed nor truncated, and a cache that cannot be written builds privately.
Each test uses its own cache directory."""

from __future__ import annotations

import ctypes
import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from coconet.toolchain import kernel_cache
from coconet.toolchain.host_compiler import HOST_CACHE, compile_host, host_cache_path

SOURCE = (
    '#include "coco_device.h"\n'
    "COCO_KERNEL(fill, int* p, int v, coco_i64 n) { COCO_KERNEL_BODY_BEGIN"
    " COCO_BLOCK_STRIDE_LOOP(coco_i64, i, 0, n) { p[i] = v; } COCO_KERNEL_BODY_END }\n"
)


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("COCONET_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _published_elsewhere() -> Path:
    """Compile SOURCE into the cache from another process: this one must not have the
    library loaded (the dynamic loader would hand back that mapping for the same path)."""
    code = (
        "from coconet.toolchain.host_compiler import compile_host\n"
        f"print(compile_host({SOURCE!r}).path)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, env=os.environ
    )
    return Path(out.stdout.strip().splitlines()[-1])


def _works(lib) -> bool:
    p = np.zeros(5, np.int32)
    lib.kernel("fill", ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong)(1, 2, p, 7, 5)
    return p.tolist() == [7] * 5


def test_published_entries_are_private_and_carry_their_digest():
    lib = compile_host(SOURCE)
    mode = os.stat(lib.path).st_mode
    assert not mode & (stat.S_IWGRP | stat.S_IWOTH | stat.S_IRGRP | stat.S_IROTH)
    digest = Path(str(lib.path) + ".sha256").read_text().strip()
    assert len(digest) == 64
    assert not os.stat(lib.path.parent).st_mode & (stat.S_IWGRP | stat.S_IWOTH)


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_damaged_library_is_rebuilt_not_loaded(damage):
    path = _published_elsewhere()
    data = bytearray(path.read_bytes())
    if damage == "flip":
        for k in range(len(data) // 3, len(data) // 3 + 64):
            data[k] ^= 0xFF
    else:
        data = data[: len(data) // 2]
    path.write_bytes(bytes(data))
    corrupt = HOST_CACHE.stats.rebuilt_corrupt
    again = compile_host(SOURCE)
    assert not again.cache_hit
    assert HOST_CACHE.stats.rebuilt_corrupt == corrupt + 1
    assert _works(again)
    assert compile_host(SOURCE).cache_hit


@pytest.mark.parametrize("how", ["other-owner", "world-writable"])
def test_an_entry_this_user_cannot_trust_is_never_loaded(how):
    path = _published_elsewhere()
    if how == "other-owner":
        if os.getuid() != 0:
            pytest.skip("changing a file's owner needs root")  # CI and dev machines run as root
        os.chown(path, 4242, 4242)
    else:
        os.chmod(path, 0o666)
    untrusted = HOST_CACHE.stats.untrusted
    again = compile_host(SOURCE)
    assert not again.cache_hit
    assert HOST_CACHE.stats.untrusted == untrusted + 1
    assert _works(again)
    st = os.stat(again.path)
    assert st.st_uid == os.getuid()
    assert not st.st_mode & stat.S_IWOTH


def test_a_symlink_planted_as_the_lock_is_not_followed(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    lock = Path(str(host_cache_path(SOURCE)) + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.symlink_to(victim)
    assert _works(compile_host(SOURCE))
    assert victim.read_text() == "keep me"


def test_a_lock_held_by_a_stuck_builder_is_given_up_on(monkeypatch):
    """A builder that stopped while holding the key's lock (SIGSTOP, a hung compiler) does not
    make every later build wait forever: after LOCK_WAIT this one builds the key itself."""
    import fcntl

    monkeypatch.setattr(kernel_cache, "LOCK_WAIT", 0.3)
    source = SOURCE + "// stuck builder\n"
    lock = Path(str(host_cache_path(source)) + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    holder = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)  # another open file description: as another process
        lib = compile_host(source)
    finally:
        os.close(holder)
    assert not lib.cache_hit
    assert _works(lib)
    assert compile_host(source).cache_hit  # and it was published


def test_a_cache_that_cannot_be_written_builds_privately(monkeypatch, private_cache):
    def refuse(shard, name, source):
        raise PermissionError(13, "Permission denied", name)

    monkeypatch.setattr(kernel_cache, "_publish", refuse)
    uncached = HOST_CACHE.stats.uncached
    with pytest.warns(kernel_cache.CacheWarning, match="EACCES") as caught:
        lib = compile_host(SOURCE + "// read-only\n")
    assert len(caught) == 1
    assert not lib.cache_hit
    assert HOST_CACHE.stats.uncached == uncached + 1
    assert private_cache not in lib.path.parents
    assert _works(lib)
