"""What the programs' argparse command lines share: a parser whose errors are one line."""

from __future__ import annotations

import argparse
from typing import NoReturn


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose error is one line naming the command and what is wrong, not
    the whole usage: it usually ends up in a journal. Its subcommands' parsers are too."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")
