"""Argument parsing shared by the commands."""
from __future__ import annotations

import argparse

__all__ = ["IntermixedParser"]


class IntermixedParser(argparse.ArgumentParser):
    """Lets `key=value` overrides follow options (`run g.py --runtime ray trainer.steps=4`):
    plain argparse binds all positionals at their first run and rejects later ones."""
    _intermixing = False

    def parse_known_args(self, args=None, namespace=None):
        if self._intermixing:
            return super().parse_known_args(args, namespace)
        self._intermixing = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False
