"""Reading a drawn timeline in tests: its bars and their outlines, and the render
command's parsed arguments (shared by the timeline tests)."""
from __future__ import annotations

import argparse
import xml.etree.ElementTree as ET


def bars(svg: str) -> list[ET.Element]:
    root = ET.fromstring(svg)
    return [g for g in root.iter("{http://www.w3.org/2000/svg}g") if g.get("class") == "bar"]


def outline(bar: ET.Element) -> ET.Element:
    return [e for e in bar if e.tag.endswith("rect")][-1]


def parse(argv):
    from hybridflow.commands import render as command
    from hybridflow.commands.args import IntermixedParser
    parser = argparse.ArgumentParser(prog="hybridflow")
    command.add_parser(parser.add_subparsers(dest="command", parser_class=IntermixedParser))
    return command, parser.parse_args(argv)
