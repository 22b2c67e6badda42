"""The model's own tokenizer: tokenizer.json -> the blob's tokenizer section, run by runtime_c/src/text/."""

from ..emit import TOKENIZER_FILE
from .load import Tokenizer, load_tokenizer
from .pack import pack

__all__ = ["TOKENIZER_FILE", "Tokenizer", "load_tokenizer", "pack"]
