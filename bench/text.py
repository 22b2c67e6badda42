"""The tokenizer's size and speed: the C tokenizer (colibri_text.h) against HF `tokenizers` (Rust).

    .venv/bin/python bench/text.py [TOKENIZER_DIR] [--mb 1] [--lib libcolibri.so] [--model CKPT]
                                   [--target stm32h7] [--no-firmware]

TOKENIZER_DIR has tokenizer.json (+ tokenizer_config.json); default: a 320-token byte-level BPE that HF
tokenizers trains here (small enough for a microcontroller's flash). Prints:
  - flash: the tokenizer section's bytes against the target's flash budget, and the code of the text
    runtime (TEXT_SRC compiled as a firmware build compiles the runtime: -Os, the target's flags):
    .text + .rodata bytes (and .data + .bss, which must be 0);
  - host encode speed of both on the same ~--mb MB of text (one call per line for both), and whether
    their ids agree;
  - time to first token for a 64-token prompt on the target under QEMU, in instructions, not cycles
    (the runner's `-icount shift=0` makes one instruction one virtual ns; the firmware's board_counter
    turns the SysTick ticks into instructions, as the model's QEMU image does: 40 instructions per tick
    at stm32h7's 25 MHz): (a) encoding the prompt text, a bare-metal image of the text runtime and the
    section (its ids checked against HF's), plus (b) the forward pass over the 64 ids and the first
    token, the model's firmware image (SCons, --model CKPT with a colibri.json prompt of those ids and
    "generate": 1; default: a small synthetic Mixtral with the tokenizer's vocabulary).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
PROMPT_TOKENS = 64
SMALL_MODEL = dict(layers=2, hidden=64, ffn=96, heads=4, kv_heads=2, experts=4, top_k=2, seed=16)


def _c_string(data: bytes) -> str:
    return '"' + "".join(f"\\x{b:02x}" for b in data) + '"'


def _prompt(hf, texts: list[str], n: int) -> tuple[str, list[int]]:
    """A text HF encodes into exactly n ids (a prefix of the test texts joined), and those ids."""
    whole = " ".join(texts)
    lo, hi = 1, len(whole)
    while lo < hi:  # the shortest prefix with n ids or more
        mid = (lo + hi) // 2
        if len(hf.encode(whole[:mid], add_special_tokens=False).ids) >= n:
            hi = mid
        else:
            lo = mid + 1
    for end in range(lo, len(whole) + 1):
        ids = hf.encode(whole[:end], add_special_tokens=False).ids
        if len(ids) == n:
            return whole[:end], ids
    raise SystemExit(f"bench/text.py: no prefix of the text encodes into {n} ids")


def _fw_flags():
    from colibri.toolchain.csources import FLOAT_CFLAGS, OPT_CFLAGS, WARN_CFLAGS

    # a firmware build's compile flags, with the .su/.ci files firmware.stack_bound reads
    return [*WARN_CFLAGS, *FLOAT_CFLAGS, OPT_CFLAGS["firmware"], "-g", "-ffunction-sections", "-fdata-sections",
            "-fstack-usage", "-fcallgraph-info=su"]


def _compile(t, src: Path, obj: Path, *extra: str) -> Path:
    inc = [f"-I{obj.parent}", f"-I{ROOT / 'runtime_c' / 'include'}", f"-I{ROOT / 'firmware_examples' / 'common'}"]
    if src.suffix in (".S", ".s"):
        argv = [*t.cc_argv, *t.cflags, "-g", *extra, "-c", str(src), "-o", str(obj)]
    else:
        argv = [*t.cc_argv, *_fw_flags(), *t.cflags, *t.cpp_defines(), *inc, *extra, "-c", str(src), "-o", str(obj)]
    subprocess.run(argv, check=True, cwd=obj.parent)
    return obj


def code_size(t, out: Path) -> dict[str, int]:
    """Bytes of the text runtime's objects for the target, by kind of section."""
    from elftools.elf.elffile import ELFFile

    from colibri.toolchain.csources import TEXT_SRC

    sizes = {"text": 0, "rodata": 0, "data": 0, "bss": 0}
    for s in TEXT_SRC:
        obj = _compile(t, ROOT / "runtime_c" / "src" / s, out / f"{Path(s).stem}.o")
        with obj.open("rb") as f:
            for sec in ELFFile(f).iter_sections():
                for kind in sizes:
                    if sec.name == f".{kind}" or sec.name.startswith(f".{kind}."):
                        sizes[kind] += sec["sh_size"]
    return sizes


ENCODE_MAIN = r"""
#include "board.h"
#include "colibri_text.h"

#include "tok_section.h" /* static const uint32_t tok_section[] */
static const char prompt[] = PROMPT;
static _Alignas(8) unsigned char scratch[COLIBRI_TOK_SCRATCH_BYTES];
static int32_t ids[4 * (sizeof prompt) + 8];

int main(void)
{
    colibri_tok t;
    size_t n = 0;
    board_counter_start();
    int rc = colibri_tok_init(&t, tok_section, sizeof tok_section);
    uint64_t init = board_counter();
    board_counter_start();
    if (rc == COLIBRI_TOK_OK)
        rc = colibri_tok_encode(&t, prompt, sizeof prompt - 1, COLIBRI_TOK_PARSE_SPECIAL, ids,
                                sizeof ids / sizeof ids[0], &n, scratch, sizeof scratch);
    uint64_t encode = board_counter();
    board_puts("ids: ");
    for (size_t i = 0; i < n; i++) {
        if (i)
            board_puts(",");
        board_put_dec((uint64_t)ids[i]);
    }
    board_puts("\nunit: ");
    board_puts(board_counter_name);
    board_puts("\ninit: ");
    board_put_dec(init);
    board_puts("\nencode: ");
    board_put_dec(encode);
    board_puts("\nstatus: ");
    board_put_dec((uint64_t)(rc < 0 ? -rc : rc));
    board_puts("\n");
    return rc ? 3 : 0;
}
"""



def _section_h(section: bytes) -> str:
    words = struct.unpack(f"<{len(section) // 4}I", section)
    rows = (",".join(f"0x{w:x}u" for w in words[i:i + 16]) for i in range(0, len(words), 16))
    return "static const uint32_t tok_section[] = {\n" + ",\n".join(rows) + "};\n"


def encode_on_target(t, section: bytes, prompt: str, out: Path) -> dict[str, int | list[int]]:
    """The bare-metal image encoding `prompt`, booted under the target's QEMU: its ids and counts."""
    from colibri.toolchain import firmware
    from colibri.toolchain.csources import TEXT_SRC

    fw = firmware.firmware_spec(t)
    (out / "tok_section.h").write_text(_section_h(section))
    (out / "encode_main.c").write_text(ENCODE_MAIN.replace("PROMPT", _c_string(prompt.encode())))
    app = [firmware.FW_DIR / s for s in firmware.COMMON_SRC if s != "common/main.c"]
    board = [firmware.FW_DIR / s for s in firmware.FAMILIES[fw.family]["sources"]]
    srcs = [out / "encode_main.c", *(ROOT / "runtime_c" / "src" / s for s in TEXT_SRC), *app, *board]
    # Cortex-M under -icount: SysTick ticks reported as instructions, as the firmware's QEMU image does
    tick = fw.insn_per_tick
    counting = () if tick is None else (f"-DCOLIBRI_FW_INSN_PER_TICK_NUM={tick.numerator}u",
                                        f"-DCOLIBRI_FW_INSN_PER_TICK_DEN={tick.denominator}u")
    objs = [_compile(t, s, out / f"img_{s.stem}.o", *(counting if s == board[0] else ())) for s in srcs]
    variant = fw.qemu_variant
    ld = out / "encode.ld"
    ld.write_text(firmware.render_linker_script(fw, variant))
    cfg = firmware.link_config(fw, "tok_encode", variant)
    cfg["variant"] = "qemu"  # booted, not shipped: no budget audit of a part image
    elf = out / "tok_encode.elf"
    try:
        firmware.link_image(cfg, [elf, elf.with_suffix(".map")], [*objs, ld])
    except firmware.FirmwareError as e:
        raise SystemExit(f"bench/text.py: the encode image: {e}") from None
    res = subprocess.run(firmware.qemu_argv(t, str(elf)), capture_output=True, text=True, timeout=600)
    got = dict(re.findall(r"^(\w+): (.*)$", res.stdout, re.M))
    if res.returncode != 0 or "encode" not in got or got.get("unit") != "instructions":
        raise SystemExit(f"bench/text.py: the encode image failed (exit {res.returncode}): {res.stdout}{res.stderr}")
    return {"ids": [int(x) for x in got["ids"].split(",") if x], "init": int(got["init"]),
            "encode": int(got["encode"])}


def forward_on_target(t, ckpt: Path, ids: list[int], out: Path) -> int:
    """Instructions of the model's firmware image for prefill over `ids` and its first token."""
    from colibri.toolchain.scons.layout import output_dirs

    model = out / "model"
    model.mkdir()
    for f in ckpt.iterdir():
        if f.name != "colibri.json":
            (model / f.name).symlink_to(f.resolve())
    (model / "colibri.json").write_text(json.dumps({"prompt": ids, "generate": 1}))
    scons = Path(sys.executable).parent / "scons"
    res = subprocess.run([str(scons), "-C", str(ROOT), "-Q", "-j2", f"BUILD={out / 'build'}", f"MODEL={model}",
                          "QUANT=int8c", f"TARGET={t.name}"], capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"bench/text.py: the firmware build failed:\n{res.stdout}{res.stderr}")
    d = output_dirs(res.stdout)[t.name]
    colibri = Path(sys.executable).parent / "colibri"
    run = subprocess.run([str(colibri), "run", "--target", t.name, str(d / f"{d.name}.elf")], capture_output=True,
                         text=True, timeout=1800)
    m = re.search(r"^instructions: (\d+)$", run.stdout, re.M)
    if run.returncode != 0 or not m:
        raise SystemExit(f"bench/text.py: the firmware image failed (exit {run.returncode}): {run.stdout}{run.stderr}")
    return int(m.group(1))


def host_speed(lib, section: bytes, hf, mb: float) -> tuple[float, float, float, bool]:
    from colibri.runtime.text import Tokenizer

    from tokvocab import strings

    tok = Tokenizer.from_bytes(lib, section)
    lines = [s for s in strings() if s]
    text, size, k = [], 0, 0
    while size < mb * 1e6:
        text.append(lines[k % len(lines)])
        size += len(text[-1].encode())
        k += 1
    t0 = time.perf_counter()
    ours = [tok.encode(s, max_ids=4 * len(s.encode()) + 8) for s in text]
    t1 = time.perf_counter()
    theirs = [hf.encode(s, add_special_tokens=False).ids for s in text]
    t2 = time.perf_counter()
    return size / 1e6, (size / 1e6) / (t1 - t0), (size / 1e6) / (t2 - t1), ours == theirs


def main() -> int:
    from tokenizers import Tokenizer as HF

    from colibri.codegen.synth import synth_checkpoint
    from colibri.codegen.tokenizer import load_tokenizer, pack
    from colibri.toolchain.targets import load_target

    from tokvocab import build_lib, strings, train_bytelevel

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", nargs="?", help="a directory with tokenizer.json (default: one trained here)")
    ap.add_argument("--mb", type=float, default=1.0)
    ap.add_argument("--lib", default=None, help="a library with the text runtime (default: TEXT_SRC built here)")
    ap.add_argument("--model", default=None, help="the checkpoint for the time to first token (default: synthetic)")
    ap.add_argument("--target", default="stm32h7")
    ap.add_argument("--no-firmware", action="store_true", help="only the host figures")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        if a.dir:
            tdir = Path(a.dir)
        else:
            (tmp / "tok").mkdir()
            tdir = train_bytelevel(tmp / "tok")
            (tdir / "tokenizer_config.json").write_text("{}")
        tok = load_tokenizer(tdir)
        section = pack(tok)
        hf = HF.from_file(str(tdir / "tokenizer.json"))
        lib = ctypes.CDLL(a.lib) if a.lib else build_lib(tmp)
        mb, ours, theirs, agree = host_speed(lib, section, hf, a.mb)
        print(f"tokenizer section: {len(section):,} bytes ({len(tok.pieces):,} tokens, {len(tok.merges):,} merges)")
        print(f"host encode, {mb:.2f} MB: colibri C {ours:.2f} MB/s, HF tokenizers {theirs:.2f} MB/s "
              f"(one call per line for both); ids agree: {agree}")
        if a.no_firmware:
            return 0
        t = load_target(a.target)
        missing = t.missing(run=True)
        if missing:
            print(f"{a.target}: {', '.join(missing)} not installed: no firmware figures")
            return 0
        (tmp / "fw").mkdir()
        sizes = code_size(t, tmp / "fw")
        budget = t.budget.get("flash")
        print(f"{a.target}: text runtime code {sizes['text']:,} B .text + {sizes['rodata']:,} B .rodata "
              f"(.data {sizes['data']} B, .bss {sizes['bss']} B); the section {len(section):,} B in flash"
              + (f" of {budget:,}" if budget else ""))
        if budget and len(section) + sizes["text"] + sizes["rodata"] > budget:
            print(f"{a.target}: the tokenizer does not fit its flash: no time to first token")
            return 0
        prompt, want = _prompt(hf, strings()[30:], PROMPT_TOKENS)
        (tmp / "enc").mkdir()
        enc = encode_on_target(t, section, prompt, tmp / "enc")
        if enc["ids"] != want:
            raise SystemExit(f"bench/text.py: {a.target}'s ids differ from HF's: {enc['ids']} != {want}")
        if a.model:
            ckpt = Path(a.model)
        else:
            ckpt = synth_checkpoint(tmp / "ckpt", vocab=len(tok.pieces), **SMALL_MODEL)
        (tmp / "fwd").mkdir()
        fwd = forward_on_target(t, ckpt, want, tmp / "fwd")
        print(f"{a.target} time to first token, {PROMPT_TOKENS}-token prompt ({len(prompt.encode())} bytes), QEMU "
              f"-icount instructions: encode {enc['encode']:,} + prefill and first token {fwd:,} = "
              f"{enc['encode'] + fwd:,} (tokenizer init, once at boot: {enc['init']:,}); ids equal HF's")
    return 0


if __name__ == "__main__":
    if not shutil.which("cc"):
        raise SystemExit("bench/text.py: needs a host C compiler (cc)")
    sys.exit(main())
