"""Build the miniature colibri artifacts the size tests audit, for every toolchain installed.

Linux toolchains give a `.so`, a static executable and a `.a`; bare-metal ones a firmware
`.elf` linked with fw/firmware.ld (FLASH 256K at 0x08000000, RAM 64K at 0x20000000).
Every object is compiled like colibri's: -g -ffunction-sections -fdata-sections, and
with -fstack-usage -fcallgraph-info=su so the stack audit has its inputs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNTIME = ["runtime_c/src/colibri.c", "runtime_c/src/kernels.c"]
CFLAGS = ["-O2", "-g", "-std=c11", "-fvisibility=hidden", "-ffunction-sections", "-fdata-sections",
          "-fstack-usage", "-fcallgraph-info=su", "-fno-stack-protector"]
LINUX = {
    "x86_64": ["gcc"],
    "aarch64": ["aarch64-linux-gnu-gcc"],
    "armv7": ["arm-linux-gnueabihf-gcc"],
    "riscv64": ["riscv64-linux-gnu-gcc"],
}
FIRMWARE = {
    "cortex-m4": ["arm-none-eabi-gcc", "-mcpu=cortex-m4", "-mthumb"],
    "rv32": ["riscv64-unknown-elf-gcc", "-march=rv32imac", "-mabi=ilp32"],
    "rv64": ["riscv64-unknown-elf-gcc", "-march=rv64imac", "-mabi=lp64", "-mcmodel=medany"],
    "aarch64-bare": ["aarch64-linux-gnu-gcc", "-fno-pie", "-mstrict-align"],
    "x86_64-bare": ["gcc", "-fno-pie"],
}
MEMORY = [
    {"name": "FLASH", "origin": 0x08000000, "length": 256 * 1024, "kind": "flash"},
    {"name": "RAM", "origin": 0x20000000, "length": 64 * 1024, "kind": "ram"},
]
LAYERS, EXPERTS = 2, 2


def installed(cc: list[str]) -> bool:
    return shutil.which(cc[0]) is not None


def fake_blob(path: Path, quant: str = "int8c") -> dict:
    """A model.bin of deterministic bytes and a manifest.json describing its tensors.

    f32 tensors are 4x the int8 size; gaps between tensors are header/padding."""
    scale = 4 if quant == "f32" else 1
    names = ["embed", "rope_freq"]
    for layer in range(LAYERS):
        names += [f"layers.{layer}.attn_norm"] + [f"layers.{layer}.attn.{p}" for p in "qkvo"]
        names += [f"layers.{layer}.ffn_norm", f"layers.{layer}.moe.router"]
        for e in range(EXPERTS):
            names += [f"layers.{layer}.moe.experts.{e}.{p}" for p in ("gate", "down", "up")]
    names += ["final_norm", "lm_head"]
    header = 256 + 64 * len(names)
    offset = -(-header // 64) * 64
    tensors = []
    for i, name in enumerate(names):
        small = name.endswith("norm") or name.endswith("router") or name == "rope_freq"
        nbytes = 100 + 4 * i if small else (1000 + 16 * i) * scale + (0 if quant == "f32" else 130)
        tensors.append({"name": name, "offset": offset, "bytes": nbytes, "quant": "f32" if small else quant})
        offset = -(-(offset + nbytes) // 64) * 64
    data = bytes((i * 131 + 7) & 0xFF for i in range(offset))
    path.write_bytes(data)
    manifest = {"model": "fixture", "quant": {"scheme": quant}, "blob": {"file": "model.bin", "bytes": len(data)},
                "tensors": tensors}
    (path.parent / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def _run(argv: list[str], cwd: Path) -> None:
    res = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}\n{res.stdout}{res.stderr}")


def _objects(cc: list[str], out: Path, extra: list[str], sources: list[str]) -> list[Path]:
    objs = []
    (out / "obj").mkdir(parents=True, exist_ok=True)
    for src in sources:
        obj = out / "obj" / (Path(src).stem + ".o")
        argv = cc + CFLAGS + extra + ["-c", str(HERE / src), "-o", str(obj)]
        if src.endswith(".S"):
            argv = cc + extra + [f"-Wa,-I{out}", "-g", "-c", str(HERE / src), "-o", str(obj)]
        _run(argv, out)
        objs.append(obj)
    return objs


def build_linux(arch: str, out: Path, quant: str = "int8c") -> dict[str, Path]:
    """libcolibri_fixture.so, libcolibri_fixture.a and colibri_demo (static) for a Linux toolchain."""
    cc = LINUX[arch]
    out.mkdir(parents=True, exist_ok=True)
    fake_blob(out / "model.bin", quant)
    objs = _objects(cc, out, ["-fPIC"], RUNTIME + ["gen/model.c", "gen/model_blob.S"])
    so, lib, demo = out / "libcolibri_fixture.so", out / "libcolibri_fixture.a", out / "colibri_demo"
    version = out / "colibri.map"
    version.write_text("{ global: colibri_*; local: *; };\n")
    _run(cc + ["-shared", "-o", str(so), *map(str, objs), f"-Wl,--version-script={version}",
               "-Wl,-z,relro,-z,now", "-Wl,-z,noexecstack", "-Wl,--gc-sections"], out)
    _run([cc[0].removesuffix("gcc") + "ar", "rcs", str(lib), *map(str, objs)], out)
    demo_obj = _objects(cc, out, [], ["runtime_c/demo/demo.c"])
    _run(cc + ["-static", "-o", str(demo), *map(str, demo_obj), str(lib), "-Wl,--gc-sections"], out)
    return {"so": so, "a": lib, "exe": demo}


def build_firmware(board: str, out: Path, quant: str = "int8c") -> Path:
    """A bare-metal colibri_fw.elf: runtime + tables + blob + start, no libc."""
    cc = FIRMWARE[board]
    out.mkdir(parents=True, exist_ok=True)
    fake_blob(out / "model.bin", quant)
    free = ["-ffreestanding", "-fno-builtin"]
    objs = _objects(cc, out, free, RUNTIME + ["gen/model.c", "gen/model_blob.S", "fw/start.c"])
    elf = out / "colibri_fw.elf"
    _run(cc + ["-nostdlib", "-nostartfiles", "-static", "-T", str(HERE / "fw/firmware.ld"), "-Wl,--gc-sections",
               "-o", str(elf), *map(str, objs), "-lgcc"] + (["-no-pie"] if "-fno-pie" in cc else []), out)
    return elf


def build_stack_fixture(out: Path, cc: list[str] | None = None) -> Path:
    """stack_chain.o with its .su and .ci beside it."""
    cc = cc or ["gcc"]
    out.mkdir(parents=True, exist_ok=True)
    return _objects(cc, out, ["-O1"], ["stack_chain.c"])[0]


if __name__ == "__main__":
    import sys

    root = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/size-fixtures")
    for arch, cc in LINUX.items():
        if installed(cc):
            print(arch, build_linux(arch, root / arch))
    for board, cc in FIRMWARE.items():
        if installed(cc):
            print(board, build_firmware(board, root / board))
    print(build_stack_fixture(root / "stack"), os.listdir(root / "stack" / "obj"))
