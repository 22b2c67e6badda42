#!/usr/bin/env bash
# colibri developer entry point. Idempotent: installs only what is missing.
#   bash toolchain/dev.sh demo   set up, export + build the default model for the host, run it
#   bash toolchain/dev.sh test   set up, run the whole test suite
#   bash toolchain/dev.sh setup  set up only
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages: the union of the targets' own (targets/*.toml "packages") and the few the host needs
# besides (toolchain/host-packages.txt). The system python3 (3.11+: tomllib) reads them; no venv needed.
apt_packages() {
  python3 - <<'PY'
import pathlib, sys, tomllib
names = set()
for path in sorted(pathlib.Path("targets").glob("*.toml")):
    try:
        packages = tomllib.loads(path.read_text(encoding="utf-8")).get("packages", [])
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        sys.exit(f"colibri: {path}: {e}")
    if not (isinstance(packages, list) and all(isinstance(p, str) for p in packages)):
        sys.exit(f"colibri: {path}: packages must be a list of strings")
    names.update(packages)
for line in pathlib.Path("toolchain/host-packages.txt").read_text().splitlines():
    names.update(line.split("#", 1)[0].split())
print(" ".join(sorted(names)))
PY
}

setup_apt() {
  local missing=() packages
  packages=$(apt_packages)
  for p in $packages; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  local cmd="apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then
    echo "colibri: missing Debian packages; run as root: $cmd" >&2
    exit 1
  fi
  echo "+ $cmd"
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null
}

setup_python() {
  local stamp=.venv/.colibri-installed want
  want=$(sha256sum pyproject.toml | cut -d' ' -f1)
  if [ -x .venv/bin/python ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then return 0; fi
  [ -x .venv/bin/python ] || python3 -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check -e '.[test]'
  echo "$want" > "$stamp"
}

# The tokenizer tests' real vocabularies: llama.cpp's models/ggml-vocab-*.gguf with their expected ids,
# from the llama-cpp-python sdist on PyPI, fetched once into .venv/share/ (tests never download).
LCP_VERSION=0.3.36
LCP_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
setup_vocabs() {
  local dest=.venv/share/llama-cpp-python-$LCP_VERSION tmp
  [ -d "$dest/vendor/llama.cpp/models" ] && return 0
  tmp=$(mktemp -d)
  .venv/bin/pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
    "llama-cpp-python==$LCP_VERSION" -d "$tmp"
  echo "$LCP_SHA256  $tmp/llama_cpp_python-$LCP_VERSION.tar.gz" | sha256sum -c --quiet -
  mkdir -p "$tmp/x"
  tar xzf "$tmp/llama_cpp_python-$LCP_VERSION.tar.gz" -C "$tmp/x" --wildcards \
    "llama_cpp_python-$LCP_VERSION/vendor/llama.cpp/models/ggml-vocab-*"
  mkdir -p .venv/share
  mv "$tmp/x/llama_cpp_python-$LCP_VERSION" "$dest"
  rm -rf "$tmp"
}

setup() { setup_apt; setup_python; setup_vocabs; }

demo() {
  setup
  local m=adder
  # the trained demo model (firmware_examples/models/adder) for this machine, a Raspberry Pi 4 and an STM32H7
  .venv/bin/scons -Q -j"$(nproc)" TARGET=host,rpi4,stm32h7
  echo
  echo "== host (x86-64): colibri_demo, built-in prompt <BOS>123+456= (answer 579 = ids 53,55,57 then EOS 257)"
  "build/host/$m/colibri_demo"
  echo "== rpi4 (AArch64 Linux, under qemu-aarch64): the same program cross-built"
  .venv/bin/colibri run --target rpi4 "build/rpi4/$m/colibri_demo"
  echo "== stm32h7 (Cortex-M7 firmware image, under qemu-system-arm)"
  .venv/bin/colibri run --target stm32h7 "build/stm32h7/$m/$m.elf"
  echo "== a few sums through the Python binding"
  .venv/bin/python firmware_examples/models/ask.py "build/host/$m/libcolibri_$m.so" 123+456 58+67 999+1 404+596 7+8
}

tests() {
  setup
  .venv/bin/ruff check .
  # two workers (the machines have 2 cores and much of the suite waits on one process: QEMU, an export);
  # the 15 slowest tests at the end
  .venv/bin/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=15 tests "$@"
}

case "${1:-}" in
  setup) setup ;;
  demo) demo ;;
  test) shift; tests "$@" ;;
  *) echo "usage: bash toolchain/dev.sh setup|demo|test [pytest args]" >&2; exit 2 ;;
esac
