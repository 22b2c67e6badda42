"""A model partition: the weights in a flash partition of their own, the application image without them.

A firmware target's `[partitions.model]` (region, origin, length; targets/SCHEMA.md) names where the
blob goes. `scons TARGET=<t> PARTITION=model` (toolchain/scons/partition.py) then builds, in
build/<target>/<key>/:
  <key>-app.elf/.map/.bin/.hex/.size.json   runtime + application, no weights, in the region's bytes
                                            below the partition (firmware_examples/common/partition.c)
  <key>-app-qemu.elf/.map                   the same for the QEMU machine's map, where it differs
  <key>-model.bin, <key>-model.hex          the blob, linked at the partition's origin
  <key>-model-qemu.hex                      the same at the QEMU map's address, where it differs
A blob larger than the partition is refused when the image is made, naming both sizes.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .firmware import Firmware, FirmwareError, Variant
from .targets import TargetError

PARTITION_NAMES = ("model",)  # what PARTITION= takes
# the symbols partition.c reads, --defsym'd per memory map
START_SYMBOL = "__partition_model_start"
END_SYMBOL = "__partition_model_end"
BLOB_ALIGN = 64  # COLIBRI_BLOB_ALIGN: colibri_init refuses a blob at another alignment


@dataclass(frozen=True)
class Partition:
    name: str
    region: str
    origin: int  # in the part's map
    length: int
    qemu_origin: int  # in the map QEMU boots (the same offset in its region of that name)

    def origin_in(self, variant: Variant) -> int:
        return self.origin if variant.name == "part" else self.qemu_origin


def partition_spec(fw: Firmware, name: str = "model") -> Partition:
    """The target's partition `name`, checked against its memory maps; TargetError naming the file if not."""
    path = f"targets/{fw.target.name}.toml"
    raw = fw.target.partitions.get(name)
    if raw is None:
        raise TargetError(f"{path}: no [partitions.{name}] table (PARTITION={name} needs its region, origin "
                          "and length)")
    where = f"{path}: partitions.{name}"
    regions = {r.name: r for r in fw.part.regions}
    region = regions.get(raw["region"])
    if region is None:
        raise TargetError(f"{where}.region = {raw['region']!r}: no such region (known: {', '.join(regions)})")
    if region.kind != "flash":
        raise TargetError(f"{where}.region = {region.name!r} is {region.kind}, not flash")
    origin, length = raw["origin"], raw["length"]
    if length == 0:
        raise TargetError(f"{where}.length is 0")
    if origin % BLOB_ALIGN:
        raise TargetError(f"{where}.origin 0x{origin:08X} is not {BLOB_ALIGN}-byte aligned (the blob must be)")
    if not (region.origin < origin and origin + length <= region.origin + region.length):
        raise TargetError(f"{where}: 0x{origin:08X}+0x{length:X} is not inside {region.name} "
                          f"(0x{region.origin:08X}+0x{region.length:X}) above the application's first byte")
    offset = origin - region.origin
    qemu_origin = origin
    if fw.qemu is not None:
        q = {r.name: r for r in fw.qemu.regions}.get(region.name)
        if q is None or offset + length > q.length:
            raise TargetError(f"{where}: the QEMU map has no region {region.name} holding it")
        qemu_origin = q.origin + offset
    return Partition(name, region.name, origin, length, qemu_origin)


def partition_problems(fw: Firmware) -> list[str]:
    """`colibri targets --check`: each of the target's partitions that partition_spec refuses, one line each."""
    out = []
    for name in fw.target.partitions:
        try:
            partition_spec(fw, name)
        except TargetError as e:
            out.append(str(e))
    return out


def app_firmware(fw: Firmware, p: Partition) -> Firmware:
    """The application's view of the target: the partition's region ends where the partition begins, in
    the part's map and in QEMU's (the bytes above the partition, if any, stay unused)."""

    def shrink(v: Variant) -> Variant:
        regions = tuple(dataclasses.replace(r, length=p.origin_in(v) - r.origin) if r.name == p.region else r
                        for r in v.regions)
        return dataclasses.replace(v, regions=regions)

    return dataclasses.replace(fw, part=shrink(fw.part), qemu=shrink(fw.qemu) if fw.qemu is not None else None)


def app_link_config(cfg: dict, p: Partition, variant: Variant) -> dict:
    """firmware.link_config's dict for an application image: the partition's bounds as symbols, no weights."""
    start = p.origin_in(variant)
    return {**cfg, "linkflags": cfg["linkflags"] + [f"-Wl,--defsym={START_SYMBOL}=0x{start:08X}",
                                                    f"-Wl,--defsym={END_SYMBOL}=0x{start + p.length:08X}"],
            "partition": {"name": p.name, "origin": start, "length": p.length}}


def image_config(fw: Firmware, p: Partition, model: str) -> dict:
    """What making the partition's images needs (also their signature)."""
    return {"target": fw.target.name, "model": model, "partition": p.name, "length": p.length,
            "objcopy": fw.target.tool("objcopy"), "addresses": [p.origin] + (
                [p.qemu_origin] if fw.qemu is not None else [])}


def check_blob_fits(blob_bytes: int, cfg: dict) -> None:
    if blob_bytes > cfg["length"]:
        raise FirmwareError(f"blob of {blob_bytes:,} B does not fit partition {cfg['partition']!r} of "
                            f"{cfg['length']:,} B (targets/{cfg['target']}.toml [partitions.{cfg['partition']}])")


def make_model_images(cfg: dict, blob: Path, outs: list[Path]) -> None:
    """<key>-model.bin (the blob as it is), <key>-model.hex at the partition's address, and the QEMU
    map's .hex where its address differs. FirmwareError when the blob does not fit."""
    check_blob_fits(blob.stat().st_size, cfg)
    tmp = outs[0].with_name(f".{outs[0].name}.tmp")
    shutil.copyfile(blob, tmp)
    tmp.replace(outs[0])
    for addr, hex_ in zip(cfg["addresses"], outs[1:], strict=True):
        res = subprocess.run([cfg["objcopy"], "-I", "binary", "-O", "ihex", f"--change-addresses=0x{addr:08X}",
                              str(blob), str(hex_)], capture_output=True, text=True)
        if res.returncode != 0:
            raise FirmwareError(f"objcopy -O ihex failed: {res.stderr.strip().splitlines()[-1:]}")
