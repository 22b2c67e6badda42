"""CC_LAUNCHER=distcc / DISTCC=1: every C compile of a Linux and a firmware target goes to a real distccd on
127.0.0.1 (started and stopped here: loopback only, a free port), and the objects equal a local build's."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from colibri.toolchain.scons.launcher import LauncherError, parse
from colibri.toolchain.targets import load_target

from conftest import BIN, ROOT, require_target, synth

SMALL = dict(layers=1, hidden=32, ffn=32, heads=4, kv_heads=2, experts=2, top_k=1, vocab=64, seed=8)
# Linux targets, native and cross (not host: distcc compiles -march=native locally, by design). Firmware
# targets: see test_distcc_firmware_needs_the_call_graphs.
TARGETS = ("x86_64", "rpi4")
LOOPBACK = "127.0.0.1"
WAIT = 20.0  # seconds, at most, for the daemon to listen


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=0.5):
            return True
    except OSError:
        return False


@pytest.fixture
def distccd(tmp_path):
    """A distccd on 127.0.0.1:<free port>, allowing only 127.0.0.1; killed whatever happens."""
    if shutil.which("distccd") is None:
        pytest.skip("distccd not installed (apt-get install distcc)")
    port = _free_port()
    log = tmp_path / "distccd.log"
    # --enable-tcp-insecure: compilers are not looked up in /usr/lib/distcc (the cross compilers are not
    # there); acceptable only because nothing but this machine can connect (--listen/--allow 127.0.0.1).
    argv = ["distccd", "--daemon", "--no-detach", "--listen", LOOPBACK, "--allow", LOOPBACK, "--port", str(port),
            "--jobs", "2", "--log-stderr", "--log-level", "info", "--enable-tcp-insecure"]
    sink = log.open("wb")
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=sink, start_new_session=True)
    try:
        deadline = time.monotonic() + WAIT
        while not _listening(port):
            if proc.poll() is not None:
                pytest.fail(f"distccd exited: {log.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"distccd did not listen on {LOOPBACK}:{port} within {WAIT} s")
            time.sleep(0.05)  # polling a bounded wait for the port, not a synchronisation sleep
        yield port, log
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        sink.close()


def _scons(build: Path, ckpt: Path, target: str, *extra: str, env: dict | None = None):
    argv = [str(BIN / "scons"), "-C", str(ROOT), "-Q", "-j2", f"BUILD={build}", f"MODEL={ckpt}", f"TARGET={target}",
            "VERBOSE=1", *extra]
    res = subprocess.run(argv, capture_output=True, text=True, env=env)
    assert res.returncode == 0, f"{' '.join(argv)}:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res


def _objects(build: Path, objcopy: str | None = None) -> dict[str, bytes]:
    """The build's objects; with objcopy, each without its debug sections (--strip-debug)."""
    out = {}
    for p in sorted(build.rglob("*.o*")):
        if p.suffix not in (".o", ".os"):
            continue
        if objcopy:
            stripped = p.with_name(p.name + ".nodebug")
            subprocess.run([objcopy, "--strip-debug", str(p), str(stripped)], check=True)
            out[p.relative_to(build).as_posix()] = stripped.read_bytes()
            stripped.unlink()
        else:
            out[p.relative_to(build).as_posix()] = p.read_bytes()
    return out


@pytest.mark.parametrize("target", TARGETS)
def test_distcc_objects_equal_a_local_build(target, distccd, tmp_path):
    require_target(target)
    port, log = distccd
    ckpt = synth(tmp_path / "dist_m", **SMALL)
    build = tmp_path / "b"  # the same build directory for both: the objects' debug paths are the same
    _scons(build, ckpt, target)
    objcopy = load_target(target).tool("objcopy")
    local, local_code = _objects(build), _objects(build, objcopy)
    assert local
    _scons(build, ckpt, target, "-c")
    assert not _objects(build)
    (tmp_path / "distcc-state").mkdir()
    env = {**os.environ, "DISTCC_HOSTS": f"{LOOPBACK}:{port}/2", "DISTCC_FALLBACK": "0",
           "DISTCC_DIR": str(tmp_path / "distcc-state"), "DISTCC_SKIP_LOCAL_RETRY": "1"}
    res = _scons(build, ckpt, target, "DISTCC=1", env=env)
    # every compile command (VERBOSE=1): "[distcc] <cc> -o <object> -c ... <source>"
    compiles = re.findall(r"(\S+ )?(\S*gcc) -o (\S+) -c .* (\S+\.[cS])$", res.stdout, re.M)
    c_compiles = [c for c in compiles if c[3].endswith(".c")]
    assert c_compiles and all(c[0].strip().endswith("distcc") for c in c_compiles), c_compiles
    assert all(not c[0].strip().endswith("distcc") for c in compiles if c[3].endswith(".S"))
    # The code and data of every object are the local build's, byte for byte. The DWARF differs: distccd
    # compiles the preprocessed source in a directory of its own, which DW_AT_comp_dir records.
    assert _objects(build, objcopy) == local_code
    assert _objects(build).keys() == local.keys()
    served = log.read_text()
    # the daemon compiled every C object: one "COMPILE_OK" per job
    assert served.count("COMPILE_OK") == len(c_compiles), served[-2000:]
    # compile_commands.json names the compiler, not the launcher
    db = next(build.rglob("compile_commands.json")).read_text()
    assert '"distcc ' not in db


def test_distcc_firmware_needs_the_call_graphs(distccd, tmp_path):
    """distccd sends back the object only, not the .su/.ci files beside it that bound a firmware image's
    stack: the link refuses in one line rather than ship an image with an unchecked stack."""
    require_target("stm32h7")
    port, _ = distccd
    ckpt = synth(tmp_path / "fw_m", **SMALL)
    (tmp_path / "state").mkdir()
    env = {**os.environ, "DISTCC_HOSTS": f"{LOOPBACK}:{port}/2", "DISTCC_FALLBACK": "0",
           "DISTCC_DIR": str(tmp_path / "state")}
    res = subprocess.run([str(BIN / "scons"), "-C", str(ROOT), "-Q", "-j2", f"BUILD={tmp_path / 'b'}",
                          f"MODEL={ckpt}", "TARGET=stm32h7", "DISTCC=1"], capture_output=True, text=True, env=env)
    assert res.returncode != 0
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("colibri: ")]
    assert len(lines) == 1 and "no call graph (.ci)" in lines[0] and "cannot bound the stack" in lines[0]
    assert not list((tmp_path / "b").rglob("fw_m.elf"))


def test_launcher_option_parsing():
    assert parse({}) == []
    assert parse({"DISTCC": "1"}) == ["distcc"]
    assert parse({"CC_LAUNCHER": "ccache"}) == ["ccache"]
    assert parse({"CC_LAUNCHER": "env 'A B=1' ccache"}) == ["env", "A B=1", "ccache"]
    assert parse({"CC_LAUNCHER": "/usr/bin/distcc", "DISTCC": "1"}) == ["/usr/bin/distcc"]
    for bad in ({"DISTCC": "yes"}, {"CC_LAUNCHER": "ccache", "DISTCC": "1"}, {"CC_LAUNCHER": "'open"}):
        with pytest.raises(LauncherError):
            parse(bad)


def test_launcher_is_argv_not_shell(tmp_path):
    """A launcher word with shell syntax is one argument to exec, not shell: `$(touch x)` runs nothing."""
    ckpt = synth(tmp_path / "sh_m", **SMALL)
    marker = tmp_path / "ran"
    res = subprocess.run([str(BIN / "scons"), "-C", str(ROOT), "-Q", "-j2", f"BUILD={tmp_path / 'b'}",
                          f"MODEL={ckpt}", f"CC_LAUNCHER=env $(touch {marker}) ;true"], capture_output=True, text=True)
    assert res.returncode != 0  # env: '$(touch ...)' is no program
    assert not marker.exists()
