"""Ask the demo model sums through a built colibri library (or model.bin) and check its answers.

    .venv/bin/python firmware_examples/models/ask.py build/host/adder/libcolibri_adder.so 123+456 9+91 707+293
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import adder_task  # noqa: E402

from colibri.runtime import load  # noqa: E402

MAX_NEW = 5  # up to 4 digits and EOS


def answer(model, problem: str) -> str:
    model.reset()
    logits = model.forward(adder_task.encode_prompt(problem + "="))
    ids: list[int] = []
    while len(ids) < MAX_NEW and (tok := int(np.argmax(logits))) != adder_task.EOS:
        ids.append(tok)
        logits = model.forward([tok])
    return adder_task.decode_answer(ids)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    model = load(argv[0])
    wrong = 0
    for problem in argv[1:]:
        a, b = (int(x) for x in problem.split("+"))
        got = answer(model, problem)
        ok = got == str(a + b)
        wrong += not ok
        print(f"{problem}={got}  {'ok' if ok else f'WRONG (expected {a + b})'}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
