"""`colibri size`: section totals against binutils, exact attribution, weights against the
manifest, budgets, diff, the HTML report in headless Chromium, stack bounds, speed."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from colibri.toolchain.cli import main as cli_main
from colibri.toolchain.size import SCHEMA
from colibri.toolchain.size.audit import Options, audit, overruns
from colibri.toolchain.size.command import check_budget, summary_line
from colibri.toolchain.size.regions import parse_budget, parse_bytes
from colibri.toolchain.size.stack import CallGraph, analyze, load_graph, read_ci

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _load_fixture_builder():
    """tests/size_fixtures/build.py, loaded by path: it lives beside its C sources."""
    spec = importlib.util.spec_from_file_location("colibri_size_fixtures", HERE / "size_fixtures" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fx = _load_fixture_builder()

CHROMIUM = "/usr/bin/chromium"
TOP_KEYS = {"schema", "file", "file_bytes", "elf", "members", "target", "allocated_bytes", "sections", "regions",
            "memory", "categories", "files", "symbols", "weights", "models", "abi", "stack", "budget", "warnings"}


def _skip_unless(cc: list[str]) -> None:
    if not fx.installed(cc):
        pytest.skip(f"{cc[0]} not installed")


@pytest.fixture(scope="session")
def fixture_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("size-fixtures")


@pytest.fixture(scope="session")
def linux_builds(fixture_root):
    cache: dict[tuple[str, str], dict[str, Path]] = {}

    def get(arch: str, quant: str = "int8c") -> dict[str, Path]:
        _skip_unless(fx.LINUX[arch])
        if (arch, quant) not in cache:
            cache[arch, quant] = fx.build_linux(arch, fixture_root / f"{arch}-{quant}", quant)
        return cache[arch, quant]

    return get


@pytest.fixture(scope="session")
def firmware_builds(fixture_root):
    cache: dict[str, Path] = {}

    def get(board: str) -> Path:
        _skip_unless(fx.FIRMWARE[board])
        if board not in cache:
            cache[board] = fx.build_firmware(board, fixture_root / board)
        return cache[board]

    return get


@pytest.fixture(scope="session")
def board_toml(fixture_root) -> Path:
    """A firmware target file with the fixtures' memory map and budgets, as targets/*.toml will carry them."""
    path = fixture_root / "boards" / "fixture_board.toml"
    path.parent.mkdir(exist_ok=True)
    regions = ",\n".join(f'  {{ name = "{r["name"]}", origin = {r["origin"]:#x}, length = {r["length"]}, '
                         f'kind = "{r["kind"]}" }}' for r in fx.MEMORY)
    path.write_text(f'description = "size test board"\nkind = "firmware"\narch = "arm"\ncc = "arm-none-eabi-gcc"\n'
                    f'memory = [\n{regions}\n]\nbudget = {{ flash = "200K", ram = "48K" }}\n')
    return path


ARTIFACTS = [(arch, kind) for arch in fx.LINUX for kind in ("so", "a", "exe")] + [(b, "fw") for b in fx.FIRMWARE]


@pytest.fixture(params=ARTIFACTS, ids=[f"{a}-{k}" for a, k in ARTIFACTS])
def artifact(request, linux_builds, firmware_builds) -> Path:
    arch, kind = request.param
    return firmware_builds(arch) if kind == "fw" else linux_builds(arch)[kind]


# ---------------------------------------------------------------- binutils cross-checks

def readelf_sections(path: Path) -> dict[str, list[tuple[str, int, bool]]]:
    """{member or "": [(name, size, alloc)]} from `readelf -SW` (it reads every architecture)."""
    out = subprocess.run(["readelf", "-SW", str(path)], capture_output=True, text=True, check=True).stdout
    files: dict[str, list[tuple[str, int, bool]]] = {}
    current = ""
    for line in out.splitlines():
        m = re.match(r"^File: .*\((.+)\)$", line)
        if m:
            current = m.group(1)
            continue
        m = re.match(r"^\s*\[\s*(\d+)\]\s+(.*)$", line)
        if not m or m.group(1) == "0":
            continue
        tok = m.group(2).split()
        flags = tok[6] if len(tok) == 10 else ""
        files.setdefault(current, []).append((tok[0], int(tok[4], 16), "A" in flags))
    return files


def size_a(path: Path, prefix: str = "") -> dict[str, dict[str, int]]:
    """{member or "": {section: size}} from binutils `size -A`."""
    tool = shutil.which(prefix + "size") or shutil.which("size")
    out = subprocess.run([tool, "-A", str(path)], capture_output=True, text=True, check=True).stdout
    files: dict[str, dict[str, int]] = {}
    current = ""
    for line in out.splitlines():
        m = re.match(r"^(\S+)\s+\(ex .*\):$", line)
        if m:
            current = m.group(1)
            continue
        if line.endswith(":") or line.startswith(("section", "Total")) or not line.strip():
            continue
        name, size, *_ = line.split()
        files.setdefault(current, {})[name] = int(size)
    return files


def our_sections(report: dict) -> dict[str, list[tuple[str, int, bool]]]:
    files: dict[str, list[tuple[str, int, bool]]] = {}
    for s in report["sections"]:
        files.setdefault(s.get("member") or "", []).append((s["name"], s["size"], s["alloc"]))
    return files


def check_exact(report: dict) -> None:
    """Nothing lost, nothing counted twice."""
    alloc = sum(s["size"] for s in report["sections"] if s["alloc"])
    assert report["allocated_bytes"] == alloc
    assert sum(c["bytes"] for c in report["categories"]) == alloc
    assert sum(f["bytes"] for f in report["files"]) == alloc
    assert sum(s["bytes"] for s in report["symbols"]) == alloc
    assert all(s["bytes"] > 0 for s in report["symbols"])


def test_sections_match_binutils(artifact):
    report = audit(artifact, Options(stack=False))
    ours = our_sections(report)
    assert ours == readelf_sections(artifact)
    for member, sections in size_a(artifact).items():
        mine = {n: s for n, s, _ in ours[member]}
        for name, size in sections.items():
            assert mine[name] == size, (member, name)


def test_every_byte_attributed_once(artifact):
    report = audit(artifact, Options(stack=False))
    check_exact(report)
    assert set(report) == TOP_KEYS and report["schema"] == SCHEMA
    cats = {c["key"]: c["bytes"] for c in report["categories"]}
    assert cats["runtime"] > 0
    assert cats["arena"] == 16384


def test_weights_equal_manifest_blob(artifact):
    report = audit(artifact, Options(stack=False))
    manifest = json.loads((artifact.parent / "manifest.json").read_text())
    blob = manifest["blob"]["bytes"]
    assert {c["key"]: c["bytes"] for c in report["categories"]}["weights"] == blob
    w = report["weights"]
    assert w["matches_manifest"] and w["blob_bytes"] == blob
    assert sum(w["by_kind"].values()) == blob
    assert sum(w["by_layer"].values()) == blob
    rows = {t["name"]: t["bytes"] for t in w["tensors"]}
    assert rows == {t["name"]: t["bytes"] for t in manifest["tensors"]}
    assert w["by_kind"]["header+padding"] == blob - sum(rows.values())
    assert set(w["by_expert"]) == {f"layers.{la}.experts.{e}" for la in range(fx.LAYERS) for e in range(fx.EXPERTS)}


def test_regions_from_flags(linux_builds):
    so = linux_builds("x86_64")["so"]
    r = audit(so, Options(stack=False))
    fl, ram = r["regions"]["flash"], r["regions"]["ram"]
    assert fl["parts"]["weights"] == r["weights"]["blob_bytes"]
    assert ram["parts"]["arena"] == 16384
    alloc = [s for s in r["sections"] if s["alloc"] and s["size"]]
    assert fl["bytes"] == sum(s["size"] for s in alloc if s["type"] != "NOBITS")
    assert ram["bytes"] == sum(s["size"] for s in alloc if "W" in s["flags"])


def test_firmware_memory_map(firmware_builds, board_toml):
    elf = firmware_builds("cortex-m4")
    r = audit(elf, Options(target=str(board_toml), stack=False))
    check_exact(r)
    mem = {m["name"]: m for m in r["memory"]}
    alloc = [s for s in r["sections"] if s["alloc"] and s["size"]]
    progbits = sum(s["size"] for s in alloc if s["type"] != "NOBITS")
    in_ram = sum(s["size"] for s in alloc if s["address"] >= 0x20000000)
    assert mem["FLASH"]["used"] == progbits == r["regions"]["flash"]["bytes"]  # .data counted at its LMA
    assert mem["RAM"]["used"] == in_ram == r["regions"]["ram"]["bytes"]
    assert mem["RAM"]["percent"] == round(100 * in_ram / (64 * 1024), 2)
    assert r["regions"]["ram"]["parts"]["stack"] == 0x1000
    assert r["abi"]["kind"] == "firmware" and r["abi"]["linked_forbidden"] == []
    assert r["target"] == {"name": "fixture_board", "kind": "firmware"}


def test_archive_long_member_names(linux_builds, tmp_path):
    objs = sorted((linux_builds("x86_64")["a"].parent / "obj").glob("*.o"))
    long = tmp_path / "a_member_name_longer_than_sixteen_chars.o"
    shutil.copy(objs[0], long)
    lib = tmp_path / "liblong.a"
    subprocess.run(["ar", "rcs", str(lib), str(long), *map(str, objs[1:])], check=True)
    r = audit(lib, Options(stack=False))
    assert [m["name"] for m in r["members"]][0] == long.name
    assert our_sections(r) == readelf_sections(lib)
    check_exact(r)


# ---------------------------------------------------------------- budgets and the build hook

def run_cli(*argv: str, capsys) -> tuple[int, str, str]:
    code = cli_main(["size", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_budget_tight_fails_and_names_region(linux_builds, capsys):
    so = str(linux_builds("x86_64")["so"])
    code, out, err = run_cli(so, "--budget", "flash=16K,ram=1M", "--no-stack", capsys=capsys)
    assert code == 1
    assert "flash" in err and "over budget" in err and "ram" not in err.split("over budget", 1)[1]
    assert "model weights" in out  # the table is still printed
    code, _, err = run_cli(so, "--budget", "flash=1M,ram=1K", "--no-stack", capsys=capsys)
    assert code == 1 and "ram" in err


def test_budget_loose_passes(linux_builds, capsys):
    code, _, err = run_cli(str(linux_builds("x86_64")["so"]), "--budget", "flash=2M,ram=1M", "--no-stack",
                           capsys=capsys)
    assert code == 0 and "over budget" not in err


def test_target_budget_and_summary_line(firmware_builds, board_toml, tmp_path, capsys):
    elf = firmware_builds("cortex-m4")
    assert check_budget(elf, str(board_toml)) == []
    line = summary_line(elf, str(board_toml))
    assert line.startswith("colibri_fw.elf: flash ") and "% of 256.00 KiB" in line and "% of budget" in line
    assert "RAM " in line and "arena 16,384" in line and "\n" not in line
    tight = tmp_path / "tight.toml"
    tight.write_text(board_toml.read_text().replace('flash = "200K"', 'flash = "8K"'))
    problems = check_budget(elf, str(tight))
    used = audit(elf, Options(target=str(board_toml), stack=False))["regions"]["flash"]["bytes"]
    assert problems == [f"colibri_fw.elf: flash overflowed by {used - 8192} bytes (budget 8192)"]
    code, _, err = run_cli(str(elf), "--target", str(tight), "--no-stack", capsys=capsys)
    assert code == 1 and "flash" in err


def test_overruns_one_line_each():
    """The one budget decision: check_budget, `colibri size` and the firmware link step all use it."""
    regions = {"flash": {"bytes": 1000}, "ram": {"bytes": 300}}
    memory = [{"name": "FLASH", "kind": "flash", "size": 1024, "used": 1000},
              {"name": "SRAM", "kind": "ram", "size": 256, "used": 300}]
    assert overruns(regions, memory, {"flash": 1024, "ram": 512}) == [
        "SRAM overflowed by 44 bytes (region 256 bytes, ram budget 512)"]
    assert overruns(regions, memory, {"flash": 900}) == [
        "flash overflowed by 100 bytes (budget 900)", "SRAM overflowed by 44 bytes (region 256 bytes)"]
    assert overruns(regions, [], {"flash": 1000, "ram": 300}) == []


def test_post_link_hook_fails_scons_build(firmware_builds, board_toml, tmp_path):
    from colibri.toolchain.size.command import post_link

    elf = firmware_builds("cortex-m4")
    (elf.parent / "colibri_fw.map").write_text("not an ELF file: skipped\n")
    assert post_link([elf, elf.parent / "colibri_fw.map"], [], {"COLIBRI_TARGET": str(board_toml)}) == 0
    tight = tmp_path / "tight.toml"
    tight.write_text(board_toml.read_text().replace('ram = "48K"', 'ram = "4K"'))
    assert post_link([elf], [], {"COLIBRI_TARGET": str(tight)}) == 1


def test_parse_sizes():
    assert parse_bytes("2M") == 2 << 20 and parse_bytes("512K") == 512 << 10 and parse_bytes("0x8000") == 0x8000
    assert parse_bytes("1.5MiB") == 3 << 19 and parse_bytes(4096) == 4096
    assert parse_budget("flash=2M,ram=1M") == {"flash": 2 << 20, "ram": 1 << 20}
    with pytest.raises(ValueError):
        parse_budget("rom=1M")


# ---------------------------------------------------------------- diff

def test_diff_quantization(linux_builds, capsys):
    old, new = linux_builds("x86_64", "int8c")["so"], linux_builds("x86_64", "f32")["so"]
    code, out, _ = run_cli("--diff", str(old), str(new), "--json", capsys=capsys)
    assert code == 0
    d = json.loads(out)
    blob_old = json.loads((old.parent / "manifest.json").read_text())["blob"]["bytes"]
    blob_new = json.loads((new.parent / "manifest.json").read_text())["blob"]["bytes"]
    assert blob_new > blob_old
    cats = {c["key"]: c for c in d["categories"]}
    assert cats["weights"]["delta"] == blob_new - blob_old > 0
    assert all(c["delta"] == 0 for k, c in cats.items() if k != "weights")
    assert d["regions"]["flash"]["parts"]["weights"]["delta"] == blob_new - blob_old
    assert d["regions"]["ram"]["delta"] == 0
    assert d["quant"] == {"old": "int8c", "new": "f32"}
    assert d["symbols"][0]["category"] == "weights" and d["symbols"][0]["delta"] > 0
    code, text, _ = run_cli("--diff", str(new), str(old), capsys=capsys)  # the other way round: shrinks
    assert code == 0 and f"{blob_old - blob_new:+,}" in text


# ---------------------------------------------------------------- ABI and hygiene

def test_abi_clean_library(linux_builds):
    r = audit(linux_builds("x86_64")["so"], Options(stack=False))
    abi = r["abi"]
    assert abi["kind"] == "shared-library"
    assert abi["exported"] == ["colibri_forward", "colibri_strerror"] and abi["flagged_exports"] == []
    assert abi["flagged_undefined"] == [] and abi["issues"] == []
    assert abi["hardening"]["relro"] == "full" and not abi["hardening"]["exec_stack"]


def test_abi_flags_leaks_malloc_and_weak_hardening(tmp_path, capsys):
    src = tmp_path / "leaky.c"
    src.write_text("#include <stdlib.h>\nvoid *colibri_make(void) { return malloc(4); }\n"
                   "int helper_exported(int x) { return x + 1; }\n")
    so = tmp_path / "libleaky.so"
    subprocess.run(["gcc", "-O2", "-g", "-fPIC", "-shared", str(src), "-o", str(so), "-Wl,-z,norelro",
                    "-Wl,-z,lazy", "-Wl,-z,execstack"], check=True, capture_output=True)
    abi = audit(so, Options(stack=False))["abi"]
    assert abi["flagged_exports"] == ["helper_exported"]
    assert {"name": "malloc", "reason": "forbidden: heap allocation"} in abi["flagged_undefined"]
    assert abi["hardening"]["relro"] == "none" and abi["hardening"]["exec_stack"]
    assert any("RELRO" in i for i in abi["issues"]) and any("stack" in i for i in abi["issues"])
    code, _, _ = run_cli(str(so), "--strict", "--no-stack", capsys=capsys)
    assert code == 1


def test_abi_archive_namespace(linux_builds):
    abi = audit(linux_builds("x86_64")["a"], Options(stack=False))["abi"]
    assert abi["kind"] == "archive"
    assert abi["exported"] == ["colibri_forward", "colibri_strerror"] and abi["flagged_exports"] == []
    assert abi["flagged_undefined"] == [] and abi["issues"] == []
    # hidden globals are not exported, but still take names in a user's static link
    assert abi["link_namespace"] == ["cb_rmsnorm"]


# ---------------------------------------------------------------- stack

def su_frames(su: Path) -> dict[str, int]:
    return {line.split("\t")[0].rsplit(":", 1)[1]: int(line.split("\t")[1]) for line in su.read_text().splitlines()}


@pytest.mark.parametrize("cc", [["gcc"], ["arm-none-eabi-gcc", "-mcpu=cortex-m4", "-mthumb"],
                                ["riscv64-unknown-elf-gcc", "-march=rv32imac", "-mabi=ilp32"]],
                         ids=["x86_64", "cortex-m4", "rv32"])
def test_stack_known_chain_and_recursion(cc, tmp_path):
    _skip_unless(cc)
    obj = fx.build_stack_fixture(tmp_path, cc)
    frames = su_frames(obj.with_suffix(".su"))
    r = audit(obj, Options(stack_dirs=[obj.parent]))
    entries = {e["entry"]: e for e in r["stack"]["entries"]}
    red = 128 if cc == ["gcc"] else 0
    chain = entries["colibri_chain"]
    assert chain["bounded"] and chain["reasons"] == []
    worst = max(frames["chain_mid"] + frames["chain_leaf"], frames["chain_other"])
    assert chain["bytes"] == frames["colibri_chain"] + worst + red
    assert chain["path"] == ["colibri_chain", "chain_mid", "chain_leaf"]
    rec = entries["colibri_recursive"]
    assert not rec["bounded"] and any("recursive" in x for x in rec["reasons"])
    ind = entries["colibri_indirect"]
    assert not ind["bounded"] and any("indirect" in x for x in ind["reasons"])


def test_object_read_again_when_rebuilt_in_place(tmp_path):
    """The stack audit reads each object's compile unit once per version of the file (every artifact of a
    build directory looks at the same objects): an object rebuilt under the same name is read again."""
    from colibri.toolchain.size.stack import _fingerprint

    _skip_unless(["gcc"])
    seen = []
    for body in ("int f(void) { return 1; }\n", "int f(void) { return 1; }\nint g(int x) { return x * 3 + f(); }\n"):
        (tmp_path / "u.c").write_text(body)
        subprocess.run(["gcc", "-g", "-c", "u.c", "-o", "u.o"], cwd=tmp_path, check=True)
        seen.append(_fingerprint(tmp_path / "u.o"))
    assert seen[0][0] == seen[1][0] == "u.c"
    assert seen[1][1] > seen[0][1], "the rebuilt object's larger unit must be read, not the first one's"


def test_stack_graph_from_text(tmp_path):
    ci = tmp_path / "g.ci"
    ci.write_text('graph: { title: "g.c"\n'
                  'node: { title: "colibri_a" label: "colibri_a\\ng.c:1:5\\n40 bytes (static)" }\n'
                  'node: { title: "g.c:b" label: "b\\ng.c:2:12\\n100 bytes (static)" }\n'
                  'node: { title: "c" label: "c\\ng.c:3:5\\n7 bytes (static)" }\n'
                  'node: { title: "d" label: "d\\ng.c:4:5\\n16 bytes (dynamic)" }\n'
                  'node: { title: "memcpy" label: "memcpy\\ng.c:9:1" shape : ellipse }\n'
                  'edge: { sourcename: "colibri_a" targetname: "g.c:b" label: "g.c:1:20" }\n'
                  'edge: { sourcename: "colibri_a" targetname: "c" label: "g.c:1:30" }\n'
                  'edge: { sourcename: "g.c:b" targetname: "memcpy" label: "g.c:2:30" }\n'
                  'edge: { sourcename: "c" targetname: "d" label: "g.c:3:30" }\n}\n')
    g = CallGraph()
    read_ci(ci, g)
    (a,) = analyze(g, ["colibri_a"], "aarch64")
    assert a.bounded is False and a.bytes == 40 + 100 and any("dynamically sized" in r for r in a.reasons)
    assert a.externals == ["memcpy"]
    su = tmp_path / "only.su"
    su.write_text("only.c:1:5:colibri_x\t48\tstatic\n")
    (x,) = analyze(load_graph([su]), ["colibri_x"], "x86_64")
    assert not x.bounded and "callgraph-info" in x.reasons[0]


# ---------------------------------------------------------------- HTML in headless Chromium

# Chromium's own background traffic (component updates, time sync, sign-in) reaches the proxy even
# with --disable-background-networking; the page contains no URL at all (checked first), so requests
# to these hosts cannot come from it.
BROWSER_HOSTS = re.compile(r"^(?:CONNECT |[A-Z]+ https?://)[^/ ]*(google\.com|googleapis\.com|gvt1\.com|gstatic\.com)"
                           r"[:/ ]")


class _Trap:
    """A TCP listener posing as the browser's proxy: every network request lands here."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.requests: list[str] = []
        self.stop = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _take(self, conn: socket.socket) -> None:
        conn.settimeout(1.0)
        try:
            self.requests.append(conn.recv(512).decode("latin-1").split("\r\n", 1)[0])
        except OSError:
            self.requests.append("(no request line)")
        conn.close()

    def _serve(self) -> None:
        while not self.stop:
            try:
                self._take(self.sock.accept()[0])
            except OSError:
                continue

    def close(self) -> None:
        """Once the browser has exited: stop the thread, then take what is still queued."""
        self.stop = True
        self.thread.join()
        self.sock.setblocking(False)
        while True:
            try:
                conn, _ = self.sock.accept()
            except BlockingIOError:
                break
            conn.setblocking(True)
            self._take(conn)
        self.sock.close()


def test_html_treemap_in_chromium(linux_builds, firmware_builds, board_toml, tmp_path, capsys):
    if not os.path.exists(CHROMIUM):
        pytest.skip("chromium not installed (apt-get install chromium)")
    page = tmp_path / "report.html"
    code, _, _ = run_cli(str(firmware_builds("cortex-m4")), str(linux_builds("x86_64")["so"]), "--target",
                         str(board_toml), "--html", str(page), capsys=capsys)
    assert code == 0
    text = page.read_text()
    assert not re.search(r"https?://", text) and "<link" not in text and " src=" not in text
    trap = _Trap()
    argv = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'ud'}",
            f"--proxy-server=127.0.0.1:{trap.port}", "--window-size=1280,2000", "--virtual-time-budget=3000",
            "--dump-dom", page.as_uri()]
    dom = subprocess.run(argv, capture_output=True, text=True, timeout=120).stdout
    trap.close()
    page_requests = [r for r in trap.requests if not BROWSER_HOSTS.match(r)]
    assert page_requests == [], "the report made network requests"
    assert 'data-rendered="yes"' in dom and 'data-resources="0"' in dom
    cats = set(re.findall(r'class="tm-node depth-1 tm-cat" data-category="([a-z]+)"', dom))
    assert {"weights", "runtime", "arena", "stack"} <= cats
    assert re.search(r'class="tm-node depth-3"[^>]*data-name="layers\.0\.moe\.experts\.0\.down"', dom)
    # --target applies to both files: each gets the map's FLASH and RAM bars
    assert re.findall(r'class="bar[^"]*" data-memory="(FLASH|RAM)"', dom) == ["FLASH", "RAM"] * 2


# ---------------------------------------------------------------- speed

def test_300mb_so_audits_exactly(tmp_path):
    """The speed of this audit is measured by bench/size_audit.py, not asserted here."""
    blob = tmp_path / "model.bin"
    with open(blob, "wb") as f:
        for _ in range(30):
            f.write(os.urandom(10 << 20))
    asm = tmp_path / "blob.S"
    asm.write_text((HERE / "size_fixtures/gen/model_blob.S").read_text())
    so = tmp_path / "libbig.so"
    srcs = [str(HERE / "size_fixtures" / s) for s in fx.RUNTIME + ["gen/model.c"]]
    subprocess.run(["gcc", "-O2", "-g", "-fPIC", "-shared", f"-Wa,-I{tmp_path}", *srcs, str(asm), "-o", str(so)],
                   check=True, capture_output=True)
    blob.unlink()
    assert so.stat().st_size > 300 << 20
    r = audit(so, Options(stack=False))
    check_exact(r)
    assert {c["key"]: c["bytes"] for c in r["categories"]}["weights"] == 300 << 20


# ---------------------------------------------------------------- artifacts of the real build, every target

def _target_names() -> list[str]:
    from colibri.toolchain.targets import all_targets

    return [t.name for t in all_targets()]


def _artifacts(out: Path) -> list[Path]:
    found = []
    for p in sorted(out.iterdir()):
        if p.is_file():
            head = p.read_bytes()[:8] if p.stat().st_size < 4096 else open(p, "rb").read(8)
            if head.startswith(b"\x7fELF") or head == b"!<arch>\n":
                found.append(p)
    return found


@pytest.mark.parametrize("target", _target_names())
def test_built_artifacts_of_every_target(target, cross_ckpt, build_model):
    """Every artifact a target builds of the cross checkpoint: on Linux targets the builds test_cross runs
    (build_model shares them), so one build per target serves both files."""
    from colibri.toolchain.targets import load_target

    t = load_target(target)
    missing = t.missing()
    if missing:
        pytest.skip(f"target {target}: {', '.join(missing)} not installed ({t.install_hint()})")
    out = build_model(cross_ckpt, "int8c", target)
    blob = json.loads((out / "manifest.json").read_text())["blob"]["bytes"]
    arts = _artifacts(out)
    assert arts
    for art in arts:
        report = audit(art)
        check_exact(report)
        assert our_sections(report) == readelf_sections(art), art
        weights = {c["key"]: c["bytes"] for c in report["categories"]}["weights"]
        assert weights in (0, blob), art
        if report["weights"]:
            assert report["weights"]["matches_manifest"], art
        if art.suffix == ".so":
            assert report["abi"]["kind"] == "shared-library", art
            assert report["abi"]["flagged_exports"] == [], art


def test_built_diff_f32_vs_int8c(golden_ckpts, build_model, capsys):
    ckpt = golden_ckpts["gqa_top2"]
    a, b = build_model(ckpt, "int8c"), build_model(ckpt, "f32")
    # each build's library is named after its output directory (gqa_top2, gqa_top2-f32)
    code, out, _ = run_cli("--diff", str(a / f"libcolibri_{a.name}.so"), str(b / f"libcolibri_{b.name}.so"), "--json",
                           capsys=capsys)
    assert code == 0
    d = json.loads(out)
    ba = json.loads((a / "manifest.json").read_text())["blob"]["bytes"]
    bb = json.loads((b / "manifest.json").read_text())["blob"]["bytes"]
    assert {c["key"]: c["delta"] for c in d["categories"]}["weights"] == bb - ba > 0


# ---------------------------------------------------------------- hostile input: one line, exit 2, at once

COLIBRI = Path(sys.executable).parent / "colibri"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    """A small x86-64 shared library and an archive, built with the host gcc."""
    if not shutil.which("gcc") or not shutil.which("ar"):
        pytest.skip("gcc/ar not installed")
    out = tmp_path_factory.mktemp("tiny")
    (out / "t.c").write_text("int table[8] = {1};\nint get(int i) { return table[i & 7]; }\n")
    subprocess.run(["gcc", "-g", "-fPIC", "-c", "t.c", "-o", "t.o"], cwd=out, check=True)
    subprocess.run(["gcc", "-shared", "-o", "libt.so", "t.o"], cwd=out, check=True)
    subprocess.run(["ar", "rcs", "libt.a", "t.o"], cwd=out, check=True)
    return {"so": out / "libt.so", "a": out / "libt.a"}


def _section_header(path: Path, name: str) -> int:
    """File offset of a section's header, from readelf (ELF64: e_shoff + index * 64)."""
    out = subprocess.run(["readelf", "-SW", str(path)], capture_output=True, text=True, check=True).stdout
    index = next(int(m.group(1)) for m in re.finditer(r"^\s*\[\s*(\d+)\]\s+(\S+)", out, re.M) if m.group(2) == name)
    return int.from_bytes(path.read_bytes()[0x28:0x30], "little") + 64 * index


def _poke(data: bytes, offset: int, fmt: str, value: int) -> bytes:
    buf = bytearray(data)
    struct.pack_into(fmt, buf, offset, value)
    return bytes(buf)


def _hostile(kind: str, tiny: dict[str, Path], out: Path) -> Path:
    so, ar = tiny["so"].read_bytes(), tiny["a"].read_bytes()
    path = out / f"{kind}.bin"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    elif kind.startswith("ar-size"):
        value = {"ar-size-negative": b"-60", "ar-size-text": b"abc", "ar-size-huge": b"9999999999"}[kind]
        path.write_bytes(ar[:8 + 48] + value.ljust(10) + ar[8 + 58:])
    else:
        symtab = _section_header(tiny["so"], ".symtab")
        data = {
            "truncated-header": lambda: so[:40],
            "truncated": lambda: so[:100],
            "truncated-half": lambda: so[:len(so) // 2],
            "shoff-past-eof": lambda: _poke(so, 0x28, "<Q", len(so) + 4096),
            "phoff-past-eof": lambda: _poke(so, 0x20, "<Q", len(so) + 4096),
            "shnum-65535": lambda: _poke(so, 0x3C, "<H", 65535),
            "shstrndx-bad": lambda: _poke(so, 0x3E, "<H", 60000),
            "symtab-past-eof": lambda: _poke(so, symtab + 24, "<Q", len(so) + 4096),
            "symtab-entsize-0": lambda: _poke(so, symtab + 56, "<Q", 0),
        }[kind]()
        path.write_bytes(data)
    return path


HOSTILE = ["truncated-header", "truncated", "truncated-half", "shoff-past-eof", "phoff-past-eof", "shnum-65535",
           "shstrndx-bad", "symtab-past-eof", "symtab-entsize-0", "ar-size-negative", "ar-size-text", "ar-size-huge",
           "fifo", "dev-zero", "directory"]


def _refused(argv: list[str], name: str) -> None:
    t0 = time.monotonic()
    res = subprocess.run([str(COLIBRI), "size", *argv], capture_output=True, text=True, timeout=30)
    seconds = time.monotonic() - t0
    lines = res.stderr.splitlines()
    assert res.returncode == 2, res.stderr
    assert len(lines) == 1 and name in lines[0] and "Traceback" not in res.stderr, res.stderr
    assert seconds < 5, f"{seconds:.1f}s"


@pytest.mark.parametrize("kind", HOSTILE)
def test_hostile_file_one_line_exit_2(kind, tiny, tmp_path):
    path = _hostile(kind, tiny, tmp_path)
    _refused([str(path)], path.name)


@pytest.mark.parametrize("options", [["--json"], ["--csv"], ["--html", "OUT"], ["--budget", "flash=1K"], ["--diff"]])
@pytest.mark.parametrize("kind", ["fifo", "ar-size-negative", "shnum-65535"])
def test_hostile_file_every_option(kind, options, tiny, tmp_path):
    path = _hostile(kind, tiny, tmp_path)
    html = tmp_path / "report.html"
    argv = ["--diff", str(tiny["so"]), str(path)] if options == ["--diff"] else \
        [o.replace("OUT", str(html)) for o in options] + [str(path)]
    _refused(argv, path.name)
    assert not html.exists()  # nothing half-written


def test_hostile_messages_name_the_problem(tiny, tmp_path):
    """The line says what is wrong, not just that something is."""
    for kind, words in (("fifo", "FIFO"), ("directory", "directory"), ("dev-zero", "character device"),
                        ("ar-size-negative", "'-60'"), ("shnum-65535", "65535"), ("symtab-entsize-0", "0 bytes"),
                        ("shoff-past-eof", "past the end")):
        path = _hostile(kind, tiny, tmp_path)
        res = subprocess.run([str(COLIBRI), "size", str(path)], capture_output=True, text=True, timeout=30)
        assert words in res.stderr, (kind, res.stderr)


def test_stack_dir_fifo_is_not_read(tiny, tmp_path):
    """A FIFO among the .su files is no stack file: skipped, never waited on."""
    obj = tmp_path / "obj"
    obj.mkdir()
    os.mkfifo(obj / "fifo.su")
    shutil.copy(tiny["so"].parent / "t.o", obj / "t.o")  # the object the library links: its .su is used
    (obj / "t.su").write_text("t.c:2:5:get\t16\tstatic\n")
    res = subprocess.run([str(COLIBRI), "size", "--json", "--stack-dir", str(obj), str(tiny["so"])],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["stack"]["inputs"] == [str(obj / "t.su")]


@pytest.mark.parametrize("where", ["directory", "missing-dir"])
def test_html_output_unwritable_one_line(tiny, tmp_path, where):
    out = tmp_path if where == "directory" else tmp_path / "no" / "report.html"
    res = subprocess.run([str(COLIBRI), "size", "--html", str(out), str(tiny["so"])],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.splitlines() == [f"colibri size: {out}: cannot write the HTML report: "
                                       + ("a directory" if where == "directory" else "No such file or directory")]
    assert not res.stdout  # refused before any report
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing left behind
