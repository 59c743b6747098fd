"""What a run drew from its prompt loader and has not consumed yet: the run scheduler's
one checkpoint state, in every mode.

A *draw* is one `loader.next_batch()` (or a few: a pipelined batch's gather rounds
draw more inside its pass), recorded with the loader's state before it and the ids
of what it holds — prompt uids when streaming (groups are consumed one by one, in any
order), one id per buffered batch otherwise (a batch is consumed whole, in order).
An id is *consumed* when it is trained, or dropped by an entrance filter; a draw
whose ids are all consumed is forgotten.

`state_dict()` is the loader before the oldest draw holding an id not consumed, and
the ids of that draw and later ones already consumed (`stream_skip`: never drawn
again); `load_state_dict` restores both, so a resume re-draws exactly the prompts in
flight or buffered at the save, once, and never a consumed one. Synchronous and
pipelined runs consume in draw order, so their `stream_skip` is always empty.

State: `draws` ((loader state before, ids) per draw still holding an id not
consumed, oldest first), `consumed` (ids of those draws), `skip` (ids a resumed run
must not draw again, until the loader serves them). Only its methods change it; the
run scheduler owns one.
"""
from __future__ import annotations

__all__ = ["Draws"]


class Draws:
    def __init__(self, loader):
        self.loader = loader
        self.draws: list[tuple[dict, list[str]]] = []
        self.consumed: set[str] = set()
        self.skip: set[str] = set()

    def record(self, state: dict, ids: list[str]) -> None:
        """A draw made from loader state `state` holds `ids`."""
        self.draws.append((state, list(ids)))

    def consume(self, ids) -> None:
        """Trained or dropped: never drawn again; fully consumed draws are forgotten."""
        self.consumed.update(ids)
        while self.draws and all(u in self.consumed for u in self.draws[0][1]):
            _, drawn = self.draws.pop(0)
            self.consumed.difference_update(drawn)

    def skipped(self, uids) -> list[int]:
        """Of a fresh draw's uids, the positions to keep (a resumed run's consumed ones
        are skipped once: the loader will not serve them again)."""
        uids = [str(u) for u in uids]
        keep = [i for i, u in enumerate(uids) if u not in self.skip]
        self.skip.difference_update(uids)
        return keep

    def state_dict(self) -> dict:
        if not self.draws:
            return {"loader": self.loader.state_dict(), "stream_skip": []}
        ids = [u for _, drawn in self.draws for u in drawn if u in self.consumed]
        return {"loader": self.draws[0][0], "stream_skip": sorted(ids)}

    def load_state_dict(self, state: dict) -> None:
        self.loader.load_state_dict(state["loader"])
        self.skip = set(state.get("stream_skip", []))
        self.draws.clear()
        self.consumed.clear()
