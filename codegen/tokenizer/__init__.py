"""The model's own tokenizer: tokenizer.json -> the blob's tokenizer section, run by runtime_c/src/text/."""

from .load import Tokenizer, load_tokenizer
from .pack import pack

TOKENIZER_FILE = "tokenizer.bin"  # the tokenizer section, beside model.bin

__all__ = ["TOKENIZER_FILE", "Tokenizer", "load_tokenizer", "pack"]
