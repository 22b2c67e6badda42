"""`colibri size`: where every byte of a built artifact goes (pyelftools, no binutils needed).

elf.py reads ELF files and ar archives; regions.py splits them into flash and RAM;
attribute.py gives every allocated byte one owner; abi.py, stack.py and diff.py
audit the rest; report.py and html.py print it; command.py is the CLI and the
SCons post-link hook. The JSON schema is in SCHEMA.md.
"""

SCHEMA = "colibri-size/1"
DIFF_SCHEMA = "colibri-size-diff/1"
