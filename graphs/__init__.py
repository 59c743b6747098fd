"""The shipped graph files and the ops they share, public as `hybridflow.graphs`
(`from hybridflow.graphs import ops`); an install puts this folder there."""
if __name__ == "graphs":  # the old name, imported before hybridflow: the public package
    from hybridflow.core.shipped import adopt
    adopt(__name__)
