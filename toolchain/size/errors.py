"""The one error type of `colibri size`: a file it cannot audit, as one line naming the file."""


class SizeError(Exception):
    """A file that is neither an ELF file nor an ar archive of ELF objects, or one that is malformed."""
