"""The CLI's subcommands (`hybridflow check`, `run`, `plan`, `render`, ...): argparse and
printing only, the work done by the layers below. May import every folder of the package."""
