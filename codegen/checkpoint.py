"""Open a HuggingFace checkpoint directory: config, importer, safetensors files, all validated up front.

`open_checkpoint` reads only config.json, the index and the safetensors headers; tensor data is read
later, one tensor at a time, by `Checkpoint.get`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from . import mxfp4
from .errors import ExportError
from .importers import Importer, View, find_importer
from .rope import weight_scale
from .safeio import read_json
from .safetensors_reader import FLOAT_DTYPES, SafetensorsFile, TensorInfo
from .spec import ModelSpec, canonical_shape

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def _present(path: Path) -> bool:
    """The name exists, whatever it is (a FIFO or a dangling link is then refused by safeio, naming it)."""
    return path.exists() or path.is_symlink()


def _shard_files(directory: Path) -> tuple[dict[str, SafetensorsFile], Path, dict[str, str] | None]:
    """The safetensors files, the file that lists the tensors (for errors), and the index weight map."""
    single = directory / SINGLE_FILE
    if _present(single):
        f = SafetensorsFile(single)
        return {SINGLE_FILE: f}, single, None
    index_path = directory / INDEX_FILE
    if not _present(index_path):
        raise ExportError(directory, f"no {SINGLE_FILE} and no {INDEX_FILE}")
    index = read_json(index_path, "index", kind="index")
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ExportError(index_path, "key 'weight_map': missing or not an object of tensor name -> shard file")
    files: dict[str, SafetensorsFile] = {}
    for shard in sorted(set(weight_map.values())):
        rel = PurePosixPath(shard)
        if rel.is_absolute() or ".." in rel.parts or not rel.parts or "\0" in shard:
            raise ExportError(index_path, f"shard {shard!r} is not a file inside the checkpoint directory")
        if not _present(directory / rel):
            raise ExportError(index_path, f"shard {shard} listed in weight_map does not exist")
        files[shard] = SafetensorsFile(directory / rel)
    return files, index_path, weight_map


def _locate(directory: Path) -> tuple[dict[str, tuple[SafetensorsFile, TensorInfo]], Path]:
    """Every tensor name -> (its file, its header entry), cross-checked against the index when sharded."""
    files, listing, weight_map = _shard_files(directory)
    where: dict[str, tuple[SafetensorsFile, TensorInfo]] = {}
    for shard, f in files.items():
        for name, info in f.tensors.items():
            if name in where:
                raise ExportError(f.path, f"also present in {where[name][0].path.name}", name)
            if weight_map is not None and weight_map.get(name) != shard:
                listed = weight_map.get(name)
                raise ExportError(listing, f"found in shard {shard} but the weight_map lists "
                                           f"{'shard ' + listed if listed else 'no shard for it'}", name)
            where[name] = (f, info)
    if weight_map is not None:
        for name, shard in weight_map.items():
            if name not in where:
                raise ExportError(listing, f"listed in weight_map but absent from shard {shard}", name)
    return where, listing


def _min_tensor_count(spec: ModelSpec) -> int:
    """A lower bound of len(canonical_names(spec)), without listing them: embed and final_norm; per
    layer the attention norm, q, k, v, o and the ffn norm, then a dense MLP or a router and experts."""
    n_dense = len(spec.dense_layers)
    return 2 + 6 * spec.n_layers + 3 * n_dense + (spec.n_layers - n_dense) * (1 + 3 * spec.n_experts)


class Checkpoint:
    """A validated checkpoint; `get` reads one canonical tensor as float32."""

    def __init__(self, path: Path, config: dict[str, Any], importer: Importer, spec: ModelSpec,
                 sources: dict[str, tuple[SafetensorsFile, TensorInfo]], views: dict[str, View] | None = None,
                 mxfp4: dict[str, tuple[SafetensorsFile, TensorInfo]] | None = None) -> None:
        self.path = path
        self.config = config
        self.importer = importer
        self.spec = spec
        self._sources = sources  # canonical name -> (file, header entry)
        self._views = views or {}  # canonical name -> its part of a fused or scaled file tensor
        # canonical name -> safetensors dtype in the files ("F32", "F16" or "BF16")
        self.source_dtypes: dict[str, str] = {n: info.dtype for n, (_, info) in sources.items()}
        # canonical name -> the scales of an MXFP4 source (its blocks are in sources): codegen/mxfp4.py
        self._mxfp4 = mxfp4 or {}
        self.source_dtypes.update(dict.fromkeys(self._mxfp4, "MXFP4"))

    def names(self) -> list[str]:
        """Canonical tensor names, in canonical order."""
        return list(self._sources)

    def __contains__(self, name: object) -> bool:
        return name in self._sources

    def __iter__(self) -> Iterator[str]:
        return iter(self._sources)

    def __len__(self) -> int:
        return len(self._sources)

    def source_name(self, name: str) -> str:
        """The tensor's name in the checkpoint files."""
        return self._sources[name][1].name

    def source_file(self, name: str) -> Path:
        return self._sources[name][0].path

    def get(self, name: str) -> np.ndarray:
        """Read one canonical tensor as a new float32 array; ExportError on NaN/Inf. KeyError if unknown."""
        return self._get(name, mapped=False)

    def get_mapped(self, name: str) -> np.ndarray:
        """get(), but an F32 tensor read as is may be a private mapping of its file (no copy), which holds a
        file descriptor while it lives: for a tensor used and dropped at once, as the exporter does."""
        return self._get(name, mapped=True)

    def _get(self, name: str, mapped: bool) -> np.ndarray:
        f, info = self._sources[name]
        view = self._views.get(name)
        if name in self._mxfp4:  # dequantized as transformers does; one expert's part when the view picks one
            fs, scales = self._mxfp4[name]
            blocks, sc = f.read_u8(info.name), fs.read_u8(scales.name)
            if view is not None and view.index and isinstance(view.index[0], int):
                blocks, sc = blocks[view.index[0]], sc[view.index[0]]
                view = replace(view, index=view.index[1:])
            arr = mxfp4.dequantize(blocks, sc)
        else:
            arr = f.read(info.name, mapped=mapped)
        scale = weight_scale(self.spec, name)  # YaRN's attention factor on q and k (codegen/rope.py)
        if view is not None:
            arr = arr[view.index] if view.index else arr
            arr = np.ascontiguousarray(arr.T if view.transpose else arr)
            scale = scale * view.scale
        if np.any(scale != 1.0):
            with np.errstate(over="ignore"):
                arr = (arr * np.float32(scale)).astype(np.float32)
        if arr.size and not (np.isfinite(arr.max()) and np.isfinite(arr.min())):  # max and min propagate NaN
            bad = ~np.isfinite(arr)
            first = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ExportError(f.path, f"{int(bad.sum())} non-finite values (NaN or Inf), the first at index "
                                      f"{list(first)}", info.name)
        return arr

    def __getitem__(self, name: str) -> np.ndarray:
        return self.get(name)


def open_checkpoint(path: str | Path) -> Checkpoint:
    """Open and validate a checkpoint directory (or its config.json) without reading any tensor data."""
    directory = Path(path)
    if directory.is_file() and directory.name == "config.json":
        directory = directory.parent
    if not directory.is_dir():
        raise ExportError(directory, "not a checkpoint directory" if directory.exists() else "does not exist")
    config_path = directory / "config.json"
    config = read_json(config_path, "config.json")
    if not isinstance(config, dict):
        raise ExportError(config_path, "not a JSON object")
    importer = find_importer(config, config_path)
    spec = importer.parse_config(config, config_path)
    where, listing = _locate(directory)

    # A config far larger than the files (say 60000 layers of 60000 experts) would have us list
    # billions of tensor names just to report the first missing one: say what is wrong instead.
    at_least = _min_tensor_count(spec)
    if at_least > 4 * len(where) + 1024:
        raise ExportError(config_path, f"describes {spec.n_layers} layers of {spec.n_experts} experts, at least "
                                       f"{at_least} tensors, but the checkpoint files hold {len(where)}")
    sources: dict[str, tuple[SafetensorsFile, TensorInfo]] = {}
    packed: dict[str, tuple[SafetensorsFile, TensorInfo]] = {}
    expected = importer.tensor_map(spec)
    views = {c: importer.view(spec, config, c) for c in expected} if importer.view else {}
    wanted = set(expected.values())
    for canonical, name in expected.items():
        pair = [name + sfx for sfx in mxfp4.SUFFIXES]
        if name not in where and all(p in where for p in pair):  # MXFP4 blocks and scales (codegen/mxfp4.py)
            (f, info), (fs, scales) = where[pair[0]], where[pair[1]]
            for n, i in ((pair[0], info), (pair[1], scales)):
                if i.dtype != "U8":
                    raise ExportError(where[n][0].path, f"MXFP4 {n.rsplit('_', 1)[-1]} of dtype {i.dtype}, not U8", n)
            why = mxfp4.problem(info.shape, scales.shape)
            shape = views[canonical].shape if views else canonical_shape(spec, canonical)
            plain = mxfp4.dequantized_shape(info.shape) if why is None else shape
            if plain != shape:
                why = (f"{info.shape[-2]} blocks of {mxfp4.BLOCK} dequantize to {list(plain)}, "
                       f"not the config's {list(shape)}")
            if why is not None:
                raise ExportError(f.path, f"MXFP4 tensor: {why}", pair[0])
            sources[canonical], packed[canonical] = (f, info), (fs, scales)
            wanted.update(pair)
            continue
        if name not in where:
            raise ExportError(listing, "missing tensor", name)
        f, info = where[name]
        if info.dtype not in FLOAT_DTYPES:
            raise ExportError(f.path, f"unsupported dtype {info.dtype} (accepted: {', '.join(FLOAT_DTYPES)})",
                              name)
        shape = views[canonical].shape if views else canonical_shape(spec, canonical)
        if info.shape != shape:
            raise ExportError(f.path, f"shape {list(info.shape)} does not match the config's {list(shape)}", name)
        sources[canonical] = (f, info)
    for name in sorted(where):
        if name not in wanted and not importer.is_ignored(spec, name):
            raise ExportError(where[name][0].path, "unexpected tensor (not part of the model)", name)
    return Checkpoint(directory, config, importer, spec, sources, views, packed)
