"""`colibri size` on 500 mutated ELF files and archives: every run ends with exit 0 or 2 (1 only when
over a --budget), one line naming the file when it fails, never a traceback, a hang or a memory blow-up.

The inputs are small objects built here (an object file, a shared library, an executable, a static
and a thin archive, a 32-bit Arm object), mutated from a fixed seed: byte flips anywhere and inside
the DWARF sections, truncation, ELF header fields set to 0/1/max, section and program header fields
(offsets past the end of the file, e_shnum, e_shstrndx, sh_entsize, sh_size, sh_link), ar member
sizes negative, huge or not a number, bad long-name references, FIFOs, directories and /dev/zero.

The runs are batched: one driver process (this file run as a script) imports the CLI once, then
forks a child per case with RLIMIT_AS and an alarm, so 500 cases take seconds, not minutes.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

CASES = 500
SEED = 14
TIME_LIMIT = 10  # seconds a case may take (a hang is caught here; the slowest case is reported)
MEMORY_LIMIT = 1 << 30  # bytes of address space a case may add to the driver's

SOURCE_A = r"""
#include <stddef.h>
int table[64] = {1, 2, 3};
static int counter;
const char greeting[] = "hello";
int add(int a, int b) { counter++; return a + b + table[a & 63]; }
int scale(int x) { return x * 3 + counter; }
"""
SOURCE_B = r"""
extern int add(int, int);
double weights_with_a_long_member_name[128];
int twice(int x) { return add(x, x); }
int main(void) { return twice(2) == 0; }
"""


def _build(out: Path) -> dict[str, Path]:
    """The base artifacts; skips when the host compiler is missing."""
    if shutil.which("gcc") is None or shutil.which("ar") is None:
        pytest.skip("gcc/ar not installed")
    out.mkdir(parents=True, exist_ok=True)
    (out / "a.c").write_text(SOURCE_A)
    (out / "long_member_name_b.c").write_text(SOURCE_B)

    def run(*argv: str) -> None:
        subprocess.run(argv, cwd=out, check=True, capture_output=True)

    flags = ["-O1", "-g", "-fPIC", "-ffunction-sections", "-fdata-sections"]
    run("gcc", *flags, "-c", "a.c", "-o", "a.o")
    run("gcc", *flags, "-c", "long_member_name_b.c", "-o", "long_member_name_b.o")
    run("gcc", "-shared", "-o", "liba.so", "a.o")
    run("gcc", "-o", "prog", "a.o", "long_member_name_b.o")
    run("ar", "rcs", "libab.a", "a.o", "long_member_name_b.o")
    run("ar", "rcsT", "libthin.a", "a.o", "long_member_name_b.o")
    bases = {k: out / k for k in ("a.o", "liba.so", "prog", "libab.a", "libthin.a")}
    if shutil.which("arm-none-eabi-gcc"):
        run("arm-none-eabi-gcc", "-mcpu=cortex-m4", "-mthumb", "-O1", "-g", "-c", "a.c", "-o", "arm.o")
        bases["arm.o"] = out / "arm.o"
    return bases


# ---------------------------------------------------------------- ELF layout (independent of the code under test)

def _elf_layout(data: bytes) -> dict:
    """Where the header fields, section headers and program headers of an ELF image are."""
    is64, end = data[4] == 2, "<" if data[5] == 1 else ">"
    if is64:
        fields = {"e_type": (16, 2), "e_machine": (18, 2), "e_version": (20, 4), "e_entry": (24, 8),
                  "e_phoff": (32, 8), "e_shoff": (40, 8), "e_flags": (48, 4), "e_ehsize": (52, 2),
                  "e_phentsize": (54, 2), "e_phnum": (56, 2), "e_shentsize": (58, 2), "e_shnum": (60, 2),
                  "e_shstrndx": (62, 2)}
        sh = {"sh_name": (0, 4), "sh_type": (4, 4), "sh_flags": (8, 8), "sh_offset": (24, 8), "sh_size": (32, 8),
              "sh_link": (40, 4), "sh_info": (44, 4), "sh_entsize": (56, 8)}
        ph = {"p_type": (0, 4), "p_offset": (8, 8), "p_filesz": (32, 8), "p_memsz": (40, 8)}
    else:
        fields = {"e_type": (16, 2), "e_machine": (18, 2), "e_version": (20, 4), "e_entry": (24, 4),
                  "e_phoff": (28, 4), "e_shoff": (32, 4), "e_flags": (36, 4), "e_ehsize": (40, 2),
                  "e_phentsize": (42, 2), "e_phnum": (44, 2), "e_shentsize": (46, 2), "e_shnum": (48, 2),
                  "e_shstrndx": (50, 2)}
        sh = {"sh_name": (0, 4), "sh_type": (4, 4), "sh_flags": (8, 4), "sh_offset": (16, 4), "sh_size": (20, 4),
              "sh_link": (24, 4), "sh_info": (28, 4), "sh_entsize": (36, 4)}
        ph = {"p_type": (0, 4), "p_offset": (4, 4), "p_filesz": (16, 4), "p_memsz": (20, 4)}

    def get(off: int, size: int) -> int:
        return int.from_bytes(data[off:off + size], "little" if end == "<" else "big")

    shoff, shentsize, shnum = get(*fields["e_shoff"]), get(*fields["e_shentsize"]), get(*fields["e_shnum"])
    phoff, phentsize, phnum = get(*fields["e_phoff"]), get(*fields["e_phentsize"]), get(*fields["e_phnum"])
    strtab = shoff + get(*fields["e_shstrndx"]) * shentsize
    str_off = get(strtab + sh["sh_offset"][0], sh["sh_offset"][1])
    sections = []
    for i in range(shnum):
        base = shoff + i * shentsize
        name_at = str_off + get(base, 4)
        name = data[name_at:data.index(b"\0", name_at)].decode()
        sections.append({"name": name, "header": base, "offset": get(base + sh["sh_offset"][0], sh["sh_offset"][1]),
                         "size": get(base + sh["sh_size"][0], sh["sh_size"][1]), "type": get(base + 4, 4)})
    return {"end": end, "fields": fields, "sh": sh, "ph": ph, "sections": sections,
            "phdrs": [phoff + i * phentsize for i in range(phnum)]}


def _put(buf: bytearray, off: int, size: int, value: int, end: str) -> None:
    if off + size <= len(buf):
        buf[off:off + size] = (value % (1 << (8 * size))).to_bytes(size, "little" if end == "<" else "big")


def _value(rng: random.Random, size: int, file_size: int) -> int:
    top = (1 << (8 * size)) - 1
    return rng.choice([0, 1, 2, top, top - 1, 0xFF00, 0xFFFF, file_size, file_size + rng.randrange(1, 4096),
                       rng.randrange(0, top + 1), 1 << (8 * size - 1)])


def _mutate_elf(rng: random.Random, buf: bytearray, start: int = 0) -> str:
    """One structural or byte mutation of the ELF image at buf[start:]; what it did."""
    lay = _elf_layout(bytes(buf[start:]))
    end, n = lay["end"], len(buf)
    kind = rng.choice(["header", "header", "section", "section", "section", "special", "phdr", "dwarf", "flip"])
    if kind == "header":
        name = rng.choice(list(lay["fields"]) + ["ei_class", "ei_data"])
        if name.startswith("ei_"):
            buf[start + (4 if name == "ei_class" else 5)] = rng.choice([0, 3, 255, 2 if buf[start + 4] == 1 else 1])
            return name
        off, size = lay["fields"][name]
        _put(buf, start + off, size, _value(rng, size, n), end)
        return name
    if kind in ("section", "special") and lay["sections"]:
        if kind == "special":  # the tables pyelftools walks
            wanted = [s for s in lay["sections"] if s["name"] in (".symtab", ".dynsym", ".dynamic", ".strtab",
                                                                   ".rela.debug_info", ".debug_info", ".shstrtab")]
            sec = rng.choice(wanted or lay["sections"])
        else:
            sec = rng.choice(lay["sections"])
        field = rng.choice(list(lay["sh"]))
        off, size = lay["sh"][field]
        _put(buf, start + sec["header"] + off, size, _value(rng, size, n), end)
        return f"{sec['name']}.{field}"
    if kind == "phdr" and lay["phdrs"]:
        field = rng.choice(list(lay["ph"]))
        off, size = lay["ph"][field]
        _put(buf, start + rng.choice(lay["phdrs"]) + off, size, _value(rng, size, n), end)
        return f"phdr.{field}"
    if kind == "dwarf":
        debug = [s for s in lay["sections"] if s["name"].startswith(".debug_") and s["size"]]
        if debug:
            sec = rng.choice(debug)
            for _ in range(rng.randrange(1, 6)):
                i = start + sec["offset"] + rng.randrange(sec["size"])
                if i < n:
                    buf[i] = rng.randrange(256)
            return f"flip {sec['name']}"
    for _ in range(rng.randrange(1, 9)):
        buf[start + rng.randrange(n - start)] = rng.randrange(256)
    return "flip"


def _ar_headers(data: bytes) -> list[int]:
    pos, out = 8, []
    thin = data.startswith(b"!<thin>")
    while pos + 60 <= len(data):
        out.append(pos)
        name, size = data[pos:pos + 16].rstrip(), int(data[pos + 48:pos + 58])
        pos += 60 + (size if not thin or name in (b"//", b"/") else 0)
        pos += pos & 1
    return out


def _mutate_ar(rng: random.Random, buf: bytearray) -> str:
    heads = _ar_headers(bytes(buf))
    pos = rng.choice(heads)
    kind = rng.choice(["size", "size", "name", "fmag", "member", "member", "flip"])
    if kind == "size":
        value = rng.choice([b"-60", b"-1", b"9999999999", b"abc", b"", b"0x10", b" 12 34", b"+5",
                            str(len(buf)).encode(), str(rng.randrange(1 << 20)).encode()])
        buf[pos + 48:pos + 58] = value.ljust(10)[:10]
        return f"ar size {value!r}"
    if kind == "name":
        value = rng.choice([b"/999999", b"/0", b"/4", b"#1/99999", b"#1/abc", b"#1/0", b"//", b"/", b"\xff\xfe/"])
        buf[pos:pos + 16] = value.ljust(16)[:16]
        return f"ar name {value!r}"
    if kind == "fmag":
        buf[pos + 58:pos + 60] = b"x\n"
        return "ar fmag"
    if kind == "member" and not buf.startswith(b"!<thin>"):
        members = [p for p in heads if buf[p + 60:p + 64] == b"\x7fELF"]
        if members:
            return "member " + _mutate_elf(rng, buf, rng.choice(members) + 60)
    for _ in range(rng.randrange(1, 9)):
        buf[rng.randrange(len(buf))] = rng.randrange(256)
    return "flip"


def _make_cases(bases: dict[str, Path], out: Path) -> list[dict]:
    rng = random.Random(SEED)
    out.mkdir()
    for member in ("a.o", "long_member_name_b.o"):  # what the mutated thin archives refer to
        shutil.copy(bases["a.o"].parent / member, out / member)
    html = out / "report.html"
    cases = []
    for i in range(CASES):
        base_name = rng.choice(sorted(bases))
        base = bases[base_name]
        path = out / f"case{i:03d}-{base_name}"
        roll = rng.random()
        if roll < 0.03:
            os.mkfifo(path)
            what = "fifo"
        elif roll < 0.04:
            path.mkdir()
            what = "directory"
        elif roll < 0.05:
            path.symlink_to("/dev/zero")
            what = "/dev/zero"
        elif roll < 0.06:
            path.write_bytes(b"")
            what = "empty"
        else:
            data = bytearray(base.read_bytes())
            if roll < 0.18:
                cut = rng.randrange(1, len(data))
                data = data[:cut]
                what = f"truncated at {cut}"
            elif data.startswith(b"!<"):
                what = _mutate_ar(rng, data)
            else:
                what = _mutate_elf(rng, data)
            if rng.random() < 0.15:  # a second mutation on top, when the first left a layout to mutate
                try:
                    what += "; " + (_mutate_ar(rng, data) if data.startswith(b"!<") else _mutate_elf(rng, data))
                except (ValueError, IndexError):
                    what += "; none"
            path.write_bytes(bytes(data))
        options = rng.choice([[], [], ["--json"], ["--csv"], ["--html", str(html)], ["--budget", "flash=1K,ram=1K"],
                              ["--diff", str(base), str(path)], ["--diff", str(path), str(base)], ["--no-stack"]])
        argv = ["size", *options] if options[:1] == ["--diff"] else ["size", *options, str(path)]
        cases.append({"argv": argv, "file": path.name, "what": what, "budget": "--budget" in options,
                      "base": str(base)})
    return cases


def test_fuzz_size(tmp_path):
    bases = _build(tmp_path / "base")
    cases = _make_cases(bases, tmp_path / "cases")
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, __file__, str(tmp_path / "cases.json"), str(tmp_path / "results.json")],
                         capture_output=True, text=True, timeout=CASES * TIME_LIMIT)
    assert res.returncode == 0, res.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    assert len(results) == CASES
    bad = []
    for case, r in zip(cases, results, strict=True):
        allowed = {0, 1, 2} if case["budget"] else {0, 2}
        lines = [ln for ln in r["stderr"].splitlines() if ln.strip()]
        problem = None
        if r["status"] != "exited":
            problem = f"{r['status']} after {r['seconds']:.1f}s"
        elif r["rc"] not in allowed:
            problem = f"exit {r['rc']}"
        elif "Traceback" in r["stderr"]:
            problem = "traceback"
        elif r["rc"] == 2 and (len(lines) != 1 or case["file"] not in lines[0]):
            problem = "not one line naming the file"
        elif r["rc"] == 0 and not r["stdout_bytes"]:
            problem = "exit 0 without a report"
        if problem:
            bad.append(f"{case['file']} ({case['what']}; {' '.join(case['argv'][1:-1])}): {problem}: "
                       f"{r['stderr'][-600:]}")
    failed = sum(r["rc"] == 2 for r in results)
    slowest = max(r["seconds"] for r in results)
    print(f"{CASES} cases in {time.monotonic() - t0:.1f}s: {failed} refused (exit 2), slowest {slowest:.2f}s")
    assert not bad, f"{len(bad)} bad runs:\n" + "\n".join(bad[:20])
    assert failed > CASES // 4, "most mutations should be refused: is the fuzzer mutating anything?"


# ---------------------------------------------------------------- the driver (run as a script by the test)

def _vm_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 0


def _run_case(main, argv: list[str], out_dir: Path) -> dict:
    import resource

    out, err = out_dir / "stdout", out_dir / "stderr"
    limit = _vm_bytes() + MEMORY_LIMIT
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child: one `colibri size` run under limits
        rc = 1
        try:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            signal.alarm(TIME_LIMIT)
            for fd, path in ((1, out), (2, err)):
                os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
            sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
            sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
            rc = main(argv)
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 1
        except BaseException:  # what the console script would print: a traceback
            import traceback

            traceback.print_exc()
            rc = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(rc)
    _, status = os.waitpid(pid, 0)
    seconds = time.monotonic() - t0
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        state, rc = ("timeout" if sig == signal.SIGALRM else f"killed by signal {sig}"), None
    else:
        state, rc = "exited", os.WEXITSTATUS(status)
    return {"status": state, "rc": rc, "seconds": seconds, "stderr": err.read_text(errors="replace"),
            "stdout_bytes": out.stat().st_size}


def _drive(cases_path: str, results_path: str) -> None:
    from colibri.toolchain.cli import main

    cases = json.loads(Path(cases_path).read_text())
    out_dir = Path(results_path).parent / "run"
    out_dir.mkdir(exist_ok=True)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        for base in sorted({c["base"] for c in cases}):  # what `colibri size` imports lazily, once before the forks
            main(["size", "--html", str(out_dir / "warm.html"), base])
    os.chdir(Path(cases_path).parent / "cases")
    results = [_run_case(main, c["argv"], out_dir) for c in cases]
    Path(results_path).write_text(json.dumps(results))


if __name__ == "__main__":
    _drive(sys.argv[1], sys.argv[2])
