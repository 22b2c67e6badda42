"""Worst-case stack of the `colibri_*` entry points from GCC's own accounting.

Inputs are the files the compiler leaves beside each object: `.su` from
-fstack-usage (one frame size per function) and `.ci` from -fcallgraph-info=su
(GCC >= 10: the call graph, with frame sizes, in VCG syntax). The bound of a
function is its frame plus the worst bound of its callees. It is unknown when a
path makes an indirect call, recurses, or has a dynamically sized frame; calls
to functions with no frame on record (libc, libgcc) are listed, not counted.
On x86-64 the 128-byte red zone a leaf may use below the stack pointer is added.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path

from elftools.elf.elffile import ELFFile

from .elf import ElfImage, object_unit, open_input
from .errors import SizeError

INDIRECT = "__indirect_call"
RED_ZONE = {"x86_64": 128}
_NODE = re.compile(r'node:\s*\{\s*title:\s*"((?:[^"\\]|\\.)*)"\s*label:\s*"((?:[^"\\]|\\.)*)"(.*?)\}')
_EDGE = re.compile(r'edge:\s*\{\s*sourcename:\s*"((?:[^"\\]|\\.)*)"\s*targetname:\s*"((?:[^"\\]|\\.)*)"')
_GRAPH = re.compile(r'graph:\s*\{\s*title:\s*"((?:[^"\\]|\\.)*)"')
_FRAME = re.compile(r"(\d+) bytes \(([a-z,]+)\)")
OBJECT_SUFFIXES = (".o", ".os", ".obj", ".lo")
STACK_FILE_LIMIT = 64 << 20  # bytes of one .su or .ci file (GCC writes kilobytes per source)


def _text(path: Path) -> str:
    """A .su or .ci file: a regular file of at most STACK_FILE_LIMIT bytes."""
    with open_input(path, "stack usage file") as f:
        data = f.read(STACK_FILE_LIMIT + 1)
    if len(data) > STACK_FILE_LIMIT:
        raise SizeError(f"{path}: stack usage file larger than {STACK_FILE_LIMIT} bytes")
    return data.decode("utf-8", "replace")


@dataclass(frozen=True)
class Frame:
    key: str  # call-graph title: "name", or "file.c:name" for static functions
    name: str
    location: str  # file:line:col
    bytes: int
    qualifier: str  # static | dynamic | dynamic,bounded


@dataclass
class CallGraph:
    frames: dict[str, Frame] = field(default_factory=dict)
    edges: dict[str, set[str]] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)
    has_edges_info: bool = False  # False: only .su files, no call graph


@dataclass
class Bound:
    entry: str
    bytes: int  # known part; a lower bound when not bounded
    bounded: bool
    path: list[str]
    reasons: list[str]
    externals: list[str]
    red_zone: int = 0

    def to_json(self) -> dict:
        return {"entry": self.entry, "bytes": self.bytes, "bounded": self.bounded, "path": self.path,
                "reasons": self.reasons, "externals": self.externals, "red_zone": self.red_zone}


def read_su(path: Path) -> list[Frame]:
    """Lines 'file:line:col:function<TAB>bytes<TAB>qualifier'."""
    out = []
    for line in _text(path).splitlines():
        parts = line.split("\t")
        if len(parts) < 3 or not parts[1].strip().isdigit():
            continue
        location, _, name = parts[0].rpartition(":")
        out.append(Frame(name, name, location, int(parts[1]), parts[2].strip()))
    return out


def read_ci(path: Path, graph: CallGraph) -> None:
    """Merge one VCG call-graph file into graph."""
    text = _text(path)
    for key, label, _rest in _NODE.findall(text):
        lines = label.replace("\\n", "\n").split("\n")
        m = _FRAME.search(label.replace("\\n", "\n"))
        if m is None:  # an external declaration or the indirect-call placeholder
            graph.edges.setdefault(key, set())
            continue
        location = lines[1] if len(lines) > 1 else ""
        graph.frames[key] = Frame(key, lines[0], location, int(m.group(1)), m.group(2))
        graph.edges.setdefault(key, set())
    for src, dst in _EDGE.findall(text):
        graph.edges.setdefault(src, set()).add(dst)
    graph.has_edges_info = True
    graph.sources.append(str(path))


def _fingerprint(obj: Path) -> tuple[str, int] | None:
    """(compile-unit name, unit length) of an object: ld copies .debug_info units unchanged. Read once per
    version of the file (its inode, size and modification time): every artifact of a build directory
    looks at the same objects, and reading one's DWARF applies all its relocations."""
    try:
        st = obj.stat()
    except OSError:
        return None
    return _read_fingerprint(str(obj), (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))


@functools.lru_cache(maxsize=4096)
def _read_fingerprint(obj: str, version: tuple[int, int, int, int]) -> tuple[str, int] | None:  # noqa: ARG001 - the cache key
    try:
        with open_input(Path(obj), "object file") as f:
            elf = ELFFile(f)
            unit = object_unit(elf) if elf.has_dwarf_info() else None
    except Exception:  # a stray or foreign object is simply not matched
        return None
    return (unit.name, unit.length) if unit is not None else None


def _source_of(path: Path) -> str:
    if path.suffix == ".ci":
        m = _GRAPH.search(_text(path)[:4096])
        return m.group(1) if m else path.stem
    first = _text(path).split("\n", 1)[0]
    return first.split(":", 1)[0] if ":" in first else path.stem


def find_inputs(dirs: list[Path], images: list[ElfImage] | None) -> tuple[list[Path], list[str]]:
    """The .ci (else .su) file of each source found in dirs, choosing among several builds of one source
    (e.g. obj/spec/colibri.ci and obj/generic/colibri.ci) the one whose object the artifact links."""
    files: list[Path] = []
    for d in dirs:
        if d.is_dir():
            files += sorted(p for p in d.rglob("*") if p.suffix in (".ci", ".su") and p.is_file())
    return choose_inputs(files, images)


def choose_inputs(files: list[Path], images: list[ElfImage] | None) -> tuple[list[Path], list[str]]:
    """Of the analysis files given, one per source: the .ci over the .su of an object, and only those whose
    object the artifact links (when its images are known); notes say where a source had several builds."""
    notes: list[str] = []
    by_stem: dict[Path, Path] = {}
    for p in files:  # one entry per object: prefer the call graph
        key = p.with_suffix("")
        if key not in by_stem or p.suffix == ".ci":
            by_stem[key] = p
    linked = {(u.name, u.length) for img in images or [] for u in img.units}
    groups: dict[str, list[Path]] = {}
    for p in by_stem.values():
        groups.setdefault(_source_of(p), []).append(p)
    chosen = []
    for source, cands in sorted(groups.items()):
        if len(cands) > 1 or linked:
            matching = [c for c in cands if _matches(c, linked)]
            if matching or linked:
                if not matching:
                    continue  # built, but not linked into this artifact
                cands = matching
            if len(cands) > 1:
                notes.append(f"{source}: {len(cands)} builds, using {cands[0]}")
        chosen.append(cands[0])
    return chosen, notes


def _matches(stack_file: Path, linked: set[tuple[str, int]]) -> bool:
    for suffix in OBJECT_SUFFIXES:
        obj = stack_file.with_suffix(suffix)
        if obj.is_file():
            fp = _fingerprint(obj)
            return fp is not None and fp in linked
    return not linked


def load_graph(paths: list[Path]) -> CallGraph:
    graph = CallGraph()
    for p in paths:
        if p.suffix == ".ci":
            read_ci(p, graph)
        else:
            for fr in read_su(p):
                graph.frames.setdefault(fr.key, fr)
                graph.edges.setdefault(fr.key, set())
            graph.sources.append(str(p))
    return graph


def _sccs(graph: CallGraph) -> dict[str, int]:
    """Tarjan: node -> strongly connected component id."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    comp: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    counter = [0, 0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            while True:
                w = stack.pop()
                on.discard(w)
                comp[w] = counter[1]
                if w == v:
                    break
            counter[1] += 1

    for v in list(graph.edges):
        if v not in index:
            visit(v)
    return comp


class Analyzer:
    def __init__(self, graph: CallGraph) -> None:
        self.g = graph
        self.comp = _sccs(graph)
        sizes: dict[int, int] = {}
        for c in self.comp.values():
            sizes[c] = sizes.get(c, 0) + 1
        self.recursive = {v for v, c in self.comp.items() if sizes[c] > 1 or v in graph.edges.get(v, ())}
        self.memo: dict[str, Bound] = {}

    def bound(self, node: str) -> Bound:
        if node in self.memo:
            return self.memo[node]
        frame = self.g.frames.get(node)
        if node == INDIRECT:
            b = Bound(node, 0, False, [], ["indirect call"], [])
        elif frame is None:
            b = Bound(node, 0, True, [], [], [node])
        else:
            b = self._function(node, frame)
        self.memo[node] = b
        return b

    def _function(self, node: str, frame: Frame) -> Bound:
        reasons, externals = [], []
        if frame.qualifier == "dynamic":
            reasons.append(f"{frame.name}: dynamically sized frame")
        callees = sorted(self.g.edges.get(node, ()))
        if node in self.recursive:
            cycle = sorted(c for c in callees if self.comp.get(c) == self.comp[node])
            reasons.append(f"{frame.name}: recursive (calls {', '.join(self._name(c) for c in cycle)})")
            callees = [c for c in callees if self.comp.get(c) != self.comp[node]]
        best: Bound | None = None
        for c in callees:
            cb = self.bound(c)
            if c == INDIRECT:
                reasons.append(f"{frame.name}: indirect call")
            else:
                reasons += [r for r in cb.reasons if r not in reasons]
            externals += [e for e in cb.externals if e not in externals]
            if cb.path and (best is None or cb.bytes > best.bytes):
                best = cb
        path = [frame.name] + (best.path if best else [])
        return Bound(node, frame.bytes + (best.bytes if best else 0), not reasons, path, reasons, externals)

    def _name(self, key: str) -> str:
        f = self.g.frames.get(key)
        return f.name if f else key


def analyze(graph: CallGraph, entries: list[str], arch: str | None) -> list[Bound]:
    """Bounds for the named entry points (call-graph keys)."""
    if not graph.has_edges_info:
        return [Bound(e, graph.frames[e].bytes, False, [graph.frames[e].name],
                      ["no call graph: compile with -fcallgraph-info=su (GCC >= 10) for a bound"], [])
                for e in entries if e in graph.frames]
    a = Analyzer(graph)
    out = []
    for e in entries:
        b = a.bound(e)
        red = RED_ZONE.get(arch or "", 0)
        out.append(Bound(e, b.bytes + red, b.bounded, b.path, b.reasons, b.externals, red))
    return out


def entry_points(graph: CallGraph, images: list[ElfImage] | None, prefix: str = "colibri_") -> list[str]:
    """colibri_* functions with a frame (and, when known, present in the artifact)."""
    present = {s.name for img in images or [] for s in img.symbols if s.type == "FUNC" and s.defined}
    return sorted(k for k, f in graph.frames.items()
                  if f.name.startswith(prefix) and ":" not in k and (not present or f.name in present))


def analysis_files(objects: list[Path]) -> list[Path]:
    """The .ci and .su files beside the objects of a link: its stack inputs when the objects are known, with no
    directory scan (which would also see the files of another link's objects, perhaps still being compiled)."""
    return [f for o in objects for f in (o.with_suffix(".ci"), o.with_suffix(".su")) if f.is_file()]


def audit_stack(dirs: list[Path], images: list[ElfImage] | None, arch: str | None,
                files: list[Path] | None = None) -> dict | None:
    """The stack section of a size report, from the analysis files given (files), else from those found in dirs."""
    inputs, notes = choose_inputs(files, images) if files is not None else find_inputs(dirs, images)
    if not inputs:
        return None
    graph = load_graph(inputs)
    entries = entry_points(graph, images)
    try:
        bounds = analyze(graph, entries, arch)
    except RecursionError:  # the walk recurses along call chains
        raise SizeError(f"{inputs[0].parent}: stack audit: call chains in the .ci files too deep to follow "
                        "(--no-stack skips the audit)") from None
    frames = sorted(graph.frames.values(), key=lambda f: -f.bytes)
    return {
        "inputs": [str(p) for p in inputs],
        "call_graph": graph.has_edges_info,
        "notes": notes,
        "red_zone": RED_ZONE.get(arch or "", 0),
        "entries": [b.to_json() for b in bounds],
        "frames": [{"function": f.name, "location": f.location, "bytes": f.bytes, "qualifier": f.qualifier}
                   for f in frames],
    }
