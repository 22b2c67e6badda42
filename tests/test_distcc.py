"""CC_LAUNCHER=distcc / DISTCC=1 and CC_LAUNCHER=ccache: every C compile of a Linux and a firmware target goes
to a real distccd on 127.0.0.1 (started and stopped here: loopback only, a free port, its temporary files in
the test's directory) or through a real ccache, and the objects, images and stack bounds equal a local build's."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from colibri.toolchain.scons.launcher import LauncherError, parse
from colibri.toolchain.targets import load_target

from conftest import BIN, ROOT, require_target, synth

SMALL = dict(layers=1, hidden=32, ffn=32, heads=4, kv_heads=2, experts=2, top_k=1, vocab=64, seed=8)
# A Linux target (not host: distcc compiles -march=native locally, by design) and a cross-compiled firmware
# target (arm-none-eabi-gcc run by distccd): every target's compiles take the same launcher path.
TARGETS = ("x86_64", "stm32h7")
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
    # where the daemon's jobs write, checked by the tests and removed here. Not under tmp_path: distccd started
    # by root runs as the user distccd, which may not enter pytest's private directory.
    tmp = Path(tempfile.mkdtemp(prefix="colibri-distccd-"))
    tmp.chmod(0o777)
    # --enable-tcp-insecure: compilers are not looked up in /usr/lib/distcc (the cross compilers are not
    # there); acceptable only because nothing but this machine can connect (--listen/--allow 127.0.0.1).
    argv = ["distccd", "--daemon", "--no-detach", "--listen", LOOPBACK, "--allow", LOOPBACK, "--port", str(port),
            "--jobs", "2", "--log-stderr", "--log-level", "info", "--enable-tcp-insecure"]
    sink = log.open("wb")
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=sink, start_new_session=True,
                            env={**os.environ, "TMPDIR": str(tmp)})
    try:
        deadline = time.monotonic() + WAIT
        while not _listening(port):
            if proc.poll() is not None:
                pytest.fail(f"distccd exited: {log.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"distccd did not listen on {LOOPBACK}:{port} within {WAIT} s")
            time.sleep(0.05)  # polling a bounded wait for the port, not a synchronisation sleep
        yield port, log, tmp
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
        shutil.rmtree(tmp, ignore_errors=True)


def _scons(build: Path, ckpt: Path, target: str, *extra: str, env: dict | None = None):
    argv = [str(BIN / "scons"), "-C", str(ROOT), "-Q", "-j2", f"BUILD={build}", f"MODEL={ckpt}", f"TARGET={target}",
            "VERBOSE=1", *extra]
    res = subprocess.run(argv, capture_output=True, text=True, env=env)
    assert res.returncode == 0, f"{' '.join(argv)}:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res


OUTPUTS = (".o", ".os", ".elf", ".bin", ".hex", ".so", ".a")  # compiled and linked, independent of the build root
ANALYSIS = (".su", ".ci", ".size.json")  # the stack analysis and size report: they name the build root's paths


def _files(build: Path, suffixes: tuple[str, ...]) -> dict[str, bytes]:
    """The build's files with those suffixes, by path relative to the build root; text files with the build
    root's path replaced by BUILD (GCC writes .su/.ci paths as given, unmapped)."""
    out = {}
    for p in sorted(build.rglob("*")):
        name = p.name
        if p.is_file() and any(name.endswith(s) for s in suffixes) and "/gen/" not in f"/{p.relative_to(build)}":
            data = p.read_bytes()
            out[p.relative_to(build).as_posix()] = (data.replace(str(build).encode(), b"BUILD")
                                                    if suffixes == ANALYSIS else data)
    return out


@pytest.mark.parametrize("target", TARGETS)
def test_distcc_builds_equal_a_local_build(target, distccd, tmp_path):
    """Objects, libraries, images byte for byte, and .su/.ci and the size report (stack bound included) but for
    the build root's name, in another build root: the debug info names neither distccd's directory nor the
    build root (prefix maps, no column info, csources.py), and the stack analysis files, which distccd does
    not send back, come from this machine (toolchain/scons/launch.py)."""
    require_target(target)
    port, log, dtmp = distccd
    ckpt = synth(tmp_path / "dist_m", **SMALL)
    local_build, dist_build = tmp_path / "local", tmp_path / "dist"
    _scons(local_build, ckpt, target)
    local, local_analysis = _files(local_build, OUTPUTS), _files(local_build, ANALYSIS)
    assert any(k.endswith(".ci") for k in local_analysis) and any(k.endswith(".su") for k in local_analysis)
    (tmp_path / "distcc-state").mkdir()
    env = {**os.environ, "DISTCC_HOSTS": f"{LOOPBACK}:{port}/2", "DISTCC_FALLBACK": "0",
           "DISTCC_DIR": str(tmp_path / "distcc-state"), "DISTCC_SKIP_LOCAL_RETRY": "1"}
    res = _scons(dist_build, ckpt, target, "DISTCC=1", env=env)
    # every compile command (VERBOSE=1): "[... distcc --] <cc> -o <object> -c ... <source>"
    compiles = re.findall(r"(\S+ )?(\S*gcc) -o (\S+) -c .* (\S+\.[cS])$", res.stdout, re.M)
    c_compiles = [c for c in compiles if c[3].endswith(".c")]
    assert c_compiles and all(c[0].strip() == "--" for c in c_compiles), c_compiles
    assert " distcc -- " in res.stdout
    assert all(c[0].strip() != "--" for c in compiles if c[3].endswith(".S"))
    assert _files(dist_build, OUTPUTS) == local
    assert _files(dist_build, ANALYSIS) == local_analysis
    if load_target(target).kind == "firmware":
        assert any(k.endswith(".elf") for k in local) and any(k.endswith(".size.json") for k in local_analysis)
    served = log.read_text()
    # the daemon compiled every C object: one "COMPILE_OK" per job, and wrote nothing it left behind
    assert served.count("COMPILE_OK") == len(c_compiles), served[-2000:]
    assert sorted(p.name for p in dtmp.iterdir()) == []
    # compile_commands.json names the compiler, not the launcher
    db = next(dist_build.rglob("compile_commands.json")).read_text()
    assert '"distcc ' not in db and "scons.launch" not in db


def _dependencies(argv: list[str]) -> str:
    """The files a compile reads: its command with -M for -c and no -o."""
    o = argv.index("-o")
    argv = ["-M" if a == "-c" else a for a in argv[:o] + argv[o + 2:]]
    return subprocess.run(argv, cwd=ROOT, check=True, capture_output=True, text=True).stdout


def test_ccache_second_build_root_hits(tmp_path):
    """CC_LAUNCHER=ccache: a second build in a fresh build root with the same CCACHE_DIR takes the compiles
    of sources that include nothing from the build root (the generated model.h) from the cache, and its
    outputs equal the first build's (the .ci files a ccache hit may not restore come from this machine)."""
    if shutil.which("ccache") is None:
        pytest.skip("ccache not installed (apt-get install ccache)")
    require_target("stm32h7")
    ckpt = synth(tmp_path / "cc_m", **SMALL)
    env = {**os.environ, "CCACHE_DIR": str(tmp_path / "ccache")}
    env.pop("CCACHE_BASEDIR", None)  # it would rewrite the build root's paths relative (other debug info)
    stats = []
    builds = (tmp_path / "b1", tmp_path / "b2")
    for build in builds:
        subprocess.run(["ccache", "-z"], env=env, check=True, capture_output=True)
        res = _scons(build, ckpt, "stm32h7", "CC_LAUNCHER=ccache", env=env)
        out = subprocess.run(["ccache", "--print-stats"], env=env, check=True, capture_output=True, text=True)
        stats.append({k: int(v) for k, v in (ln.split("\t") for ln in out.stdout.splitlines())})
    commands = re.findall(r"-- (\S*gcc -o \S+ -c .* \S+\.c)$", res.stdout, re.M)
    # the compiles whose source and headers all lie outside the build root (the preprocessor's -M list)
    independent = [c for c in commands if str(builds[1]) not in _dependencies(shlex.split(c))]
    assert 6 <= len(independent) < len(commands), commands
    first, second = stats
    hits = second["direct_cache_hit"] + second["preprocessed_cache_hit"]
    assert first["direct_cache_hit"] + first["preprocessed_cache_hit"] == 0
    assert hits == len(independent) and hits + second["cache_miss"] == len(commands), (second, commands)
    assert _files(builds[1], OUTPUTS) == _files(builds[0], OUTPUTS)
    assert _files(builds[1], ANALYSIS) == _files(builds[0], ANALYSIS)


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
