"""How long `colibri size` takes on a 300 MB shared object with embedded weights (target: < 5 s).

    .venv/bin/python bench/size_audit.py

Builds the .so from tests/size_fixtures (a small runtime + an .incbin'd blob of 300 MiB of random
bytes), then times the audit in-process and the whole CLI (median of 5 each).
"""

from __future__ import annotations

import os
import runpy
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests/size_fixtures"


def main() -> int:
    from colibri.toolchain.size.audit import Options, audit

    runtime = runpy.run_path(str(FIXTURES / "build.py"))["RUNTIME"]  # the fixture's mini runtime sources

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        with open(tmp / "model.bin", "wb") as f:
            for _ in range(30):
                f.write(os.urandom(10 << 20))
        (tmp / "blob.S").write_text((FIXTURES / "gen/model_blob.S").read_text())
        so = tmp / "libbig.so"
        srcs = [str(FIXTURES / s) for s in runtime + ["gen/model.c"]]
        subprocess.run(["gcc", "-O2", "-g", "-fPIC", "-shared", f"-Wa,-I{tmp}", *srcs, str(tmp / "blob.S"),
                        "-o", str(so)], check=True)
        inproc, cli = [], []
        for _ in range(5):
            t0 = time.perf_counter()
            audit(so, Options(stack=False))
            inproc.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            subprocess.run([str(Path(sys.executable).parent / "colibri"), "size", str(so), "--json"],
                           check=True, capture_output=True)
            cli.append(time.perf_counter() - t0)
        print(f"{so.stat().st_size / 1e6:.0f} MB .so: audit {statistics.median(inproc):.3f} s in-process, "
              f"{statistics.median(cli):.3f} s for `colibri size --json` (median of 5; target < 5 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
