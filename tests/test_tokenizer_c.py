"""The C tokenizer outside Python (runtime_c/test/tok_driver.c): mutated and cut-short tokenizer sections
are refused with an error code or run within bounds (ASan/UBSan), and cross-built for the Linux targets
(AArch64, 32-bit Arm, RISC-V 64 under qemu-user) it gives the host's ids, which are HF tokenizers' ids."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from colibri.codegen.tokenizer import load_tokenizer, pack
from colibri.toolchain.csources import TEXT_SRC

from cbuild import SAN_ENV, SAN_MARKERS
from tokvocab import MODELS, ROOT, gguf_to_hf, strings, train_bytelevel

DRIVER = [ROOT / "runtime_c" / "test" / "tok_driver.c", *(ROOT / "runtime_c" / "src" / s for s in TEXT_SRC)]
FLAGS = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic", f"-I{ROOT / 'runtime_c' / 'include'}"]


def _compile(cc: str, out: Path, *extra: str) -> Path:
    subprocess.run([cc, *FLAGS, *extra, *map(str, DRIVER), "-o", str(out)], check=True)
    return out


@pytest.fixture(scope="module")
def tiny_section(tmp_path_factory) -> Path:
    d = train_bytelevel(tmp_path_factory.mktemp("tiny"))
    p = d / "tokenizer.bin"
    p.write_bytes(pack(load_tokenizer(d)))
    return p


def test_mutated_sections_never_crash(tmp_path, tiny_section):
    exe = _compile("cc", tmp_path / "drv", "-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all")
    res = subprocess.run([str(exe), "mutate", str(tiny_section), "3000", "16"], capture_output=True, text=True,
                         env=SAN_ENV, timeout=300)
    assert res.returncode == 0 and not any(m in res.stderr for m in SAN_MARKERS), res.stdout + res.stderr
    accepted, refused = (int(x) for x in res.stdout.split()[1::2])
    assert accepted + refused == 3000 and refused > 1500 and accepted > 0  # cuts and header words are refused


@pytest.mark.skipif(not MODELS.is_dir(), reason=f"{MODELS} missing: run `bash toolchain/dev.sh setup`")
@pytest.mark.parametrize("cc,runner", [("aarch64-linux-gnu-gcc", "qemu-aarch64"),
                                       ("arm-linux-gnueabihf-gcc", "qemu-arm"),  # 32-bit: rpi-armv7
                                       ("riscv64-linux-gnu-gcc", "qemu-riscv64")])
def test_cross_targets_same_ids(tmp_path, tmp_path_factory, cc, runner):
    from tokenizers import Tokenizer as HF

    if not (shutil.which(cc) and shutil.which(runner)):
        pytest.skip(f"{cc} or {runner} not installed")
    d = gguf_to_hf("qwen2", tmp_path_factory.mktemp("q") / "q")
    sec = tmp_path / "tokenizer.bin"
    sec.write_bytes(pack(load_tokenizer(d)))
    texts = [s for s in strings() if "\0" not in s]
    (tmp_path / "texts").write_bytes(b"\0".join(s.encode() for s in texts))
    host = subprocess.run([str(_compile("cc", tmp_path / "host", "-O2")), "encode", str(sec), str(tmp_path / "texts")],
                          capture_output=True, text=True, check=True).stdout
    cross = subprocess.run([runner, str(_compile(cc, tmp_path / "cross", "-O2", "-static")), "encode", str(sec),
                            str(tmp_path / "texts")], capture_output=True, text=True, check=True, timeout=600).stdout
    assert cross == host
    hf = HF.from_file(str(d / "tokenizer.json"))
    want = [",".join(map(str, hf.encode(s, add_special_tokens=False).ids)) for s in texts]
    assert host.split("\n")[:-1] == want
