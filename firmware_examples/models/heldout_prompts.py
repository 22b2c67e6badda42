"""The demo model's held-out sums as a firmware image's table of prompts, and the score of its answers.

    python firmware_examples/models/heldout_prompts.py OUT.json [N]          # the first N (default 1,000)
    python firmware_examples/models/heldout_prompts.py --score OUTPUT [N]    # prints right/N, exit 1 below 99%

writes the PROMPTS file of `scons TARGET=stm32h7 PROMPTS=OUT.json` (toolchain/prompts.py): the held-out
problems of the demo's task.json (its seed, `adder_task.make_problems`), each as the ids of `<BOS>a+b=`,
5 tokens at most (4 digits and EOS), EOS stopping. score() (--score: of a file holding the image's
output) compares the image's `tokens:` lines with the sums as Python adds them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import adder_task  # noqa: E402

TASK = Path(__file__).resolve().parent / "adder" / "task.json"


def heldout(n: int) -> list[tuple[int, int]]:
    """The first n held-out pairs (a, b) of the demo's held-out seed, as the host tests draw them."""
    task = json.loads(TASK.read_text())
    problems = adder_task.make_problems(task["heldout_seed"], n, task["max_digits"])
    return [(int(a), int(b)) for a, b in (p.rstrip("=").split("+") for p, _ in problems)]


def prompts_file(pairs: list[tuple[int, int]]) -> dict:
    """The PROMPTS file's object for these pairs."""
    task = json.loads(TASK.read_text())
    return {"generate": task["max_new_tokens"], "stop": [adder_task.EOS],
            "prompts": [adder_task.encode_prompt(f"{a}+{b}=") for a, b in pairs]}


def answers(stdout: str) -> list[str]:
    """The answer text of each `tokens:` line of the image's output, in order."""
    return [adder_task.decode_answer([int(t) for t in line[8:].split(",") if t])
            for line in stdout.splitlines() if line.startswith("tokens: ")]


def score(stdout: str, pairs: list[tuple[int, int]]) -> int:
    """How many pairs the image answered exactly (digits, then EOS within the 5 tokens). Fewer answer lines
    than pairs count as wrong."""
    got = answers(stdout)
    lines = [line for line in stdout.splitlines() if line.startswith("tokens: ")]
    return sum(1 for (a, b), text, line in zip(pairs, got, lines, strict=False)
               if text == str(a + b) and line.rstrip().endswith(f",{adder_task.EOS}"))


def main(argv: list[str]) -> int:
    scoring = argv[:1] == ["--score"]
    args = argv[1:] if scoring else argv
    if not 1 <= len(args) <= 2 or (len(args) == 2 and not (args[1].isdigit() and int(args[1]) > 0)):
        print("usage: heldout_prompts.py OUT.json [N] | --score OUTPUT [N]", file=sys.stderr)
        return 2
    n = int(args[1]) if len(args) == 2 else 1000
    if not scoring:
        Path(args[0]).write_text(json.dumps(prompts_file(heldout(n))) + "\n")
        return 0
    try:
        output = Path(args[0]).read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        print(f"{args[0]}: cannot read it: {e.strerror or e}", file=sys.stderr)
        return 2
    right = score(output, heldout(n))
    print(f"{right}/{n} held-out sums right")
    return 0 if right >= 0.99 * n else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
