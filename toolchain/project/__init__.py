"""`colibri project`: a self-contained CMake/Make folder of one model for one target (see generate.py)."""
