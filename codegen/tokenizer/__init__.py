"""The model's own tokenizer: tokenizer.json -> the tokenizer section of model.bin, run by runtime_c/src/text/."""

from .load import Tokenizer, load_tokenizer
from .pack import pack

__all__ = ["Tokenizer", "load_tokenizer", "pack"]
