"""The SCons tools of a colibri build, one concern each (PlatformIO style: `generate(env)` / `exists(env)`).

safe      paths as nodes, strings escaped for substitution, commands run without a shell
layout    where a model's generated and built files go (build/gen/<key>/, build/<target>/<key>/)
lock      one build at a time per build directory
files     copy a file, write a generated text
compiledb the objects a build compiles, recorded for compile_commands.json
export    the codegen builder: a checkpoint to model.h/model.c/model_blob.S/model.bin/manifest.json
linux     libraries, programs and pkg-config file of a Linux target
firmware  the images of a microcontroller target (link and audit: toolchain/firmware.py)

None of them imports SCons at module level except through the functions SCons calls, so the data
modules they use (toolchain/csources.py, toolchain/firmware.py) stay importable from plain Python.
"""
