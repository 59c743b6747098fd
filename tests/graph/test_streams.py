"""How a worker class declares streaming (hybridflow/graph/streams.py): a `Streams` in
its `STREAMS` attribute, read as a declaration (inherited like any class attribute),
anything else refused naming the class."""
import pytest

from hybridflow.graph.streams import Streams, stream_capability
from hybridflow.workers.rollout.stream_worker import StreamCalls


class Plain:
    pass


class ByEngine(StreamCalls):  # the stream's calls (graph/streams.py StreamingRole)
    STREAMS = Streams.ENGINE


class Inherits(ByEngine):
    pass


class Wrong:
    STREAMS = "engine"  # a string is not the declaration


def test_a_class_declares_how_it_streams_or_nothing():
    assert stream_capability(Plain) is None
    assert stream_capability(ByEngine) is Streams.ENGINE is stream_capability(Inherits)
    assert Streams.ENGINE.needs_streaming_engine
    assert not Streams.EPISODES.needs_streaming_engine


def test_a_declaration_that_is_not_a_streams_is_refused_naming_the_class():
    with pytest.raises(TypeError, match=r"Wrong.STREAMS must be a hybridflow.graph.streams."
                                        r"Streams \(engine, episodes\) or None, not 'engine'"):
        stream_capability(Wrong)
