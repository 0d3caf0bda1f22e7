"""Which fragments may move, and how each of their inputs gets to the new peer (pure reads of
the local site; nothing stops or changes here)."""

from __future__ import annotations

from collections.abc import Collection

from peer.federation.mirror import MIRROR_PREFIX
from peer.site import LocalSite


def movable(site: LocalSite, hosted: Collection[str]) -> list[tuple[str, tuple[str, ...]]]:
    """(fragment, box types) of the fragments that may move now."""
    if site.engine is None:
        return []
    out = []
    for name in site.catalog.query_names():
        if why_not(site, hosted, name) is None:
            entry = site.catalog.query(name)
            out.append((name, tuple(sorted({b.type for b in entry.query.boxes}))))
    return out


def why_not(site: LocalSite, hosted: Collection[str], name: str) -> str | None:
    """Why fragment ``name`` may not move (None: it may). Movable: a RUNNING fragment (with
    its own streaming query, or a member of the shared lane), whose result streams and
    replica inputs no other local query reads, and whose inputs are all held here."""
    catalog = site.catalog
    entry = catalog.find_query(name)
    if entry is None:
        return f"no fragment {name} runs here"
    if entry.status != "RUNNING":
        return f"fragment {name} is {entry.status}, not RUNNING"
    engine = site.engine
    if engine is None or (name not in engine.running and name not in engine.lane.members):
        return f"fragment {name} is not running on this peer's engine"
    if site.replicated_outputs(entry.query):
        return f"fragment {name} writes replicated streams: it runs where their primary is"
    checked = site.checked(entry.query)
    others = site.streams_read(besides=name)
    replicas = catalog.replicas()
    for stream in checked.outputs:
        if stream in others:
            return f"another query here reads its result stream {stream}"
    for stream in checked.inputs:
        if stream in replicas:
            if stream in others:
                return f"another query here reads its input {stream}"
        elif stream not in hosted:
            return f"its input {stream} is neither hosted nor mirrored here"
    return None


def why_not_there(site: LocalSite, name: str, target: bytes) -> str | None:
    """Why the fragment cannot go to ``target`` (checked before anything stops)."""
    checked = site.checked(site.catalog.query(name).query)
    replicas = site.catalog.replicas()
    for stream in checked.inputs:
        if replicas.get(stream) == target.hex() and not site.spools.get(stream).aligned():
            # the target hosts it, but our copy numbers its batches otherwise
            return f"the target hosts its input {stream}, with other offsets than ours"
    for stream in checked.outputs:
        if MIRROR_PREFIX + target.hex() in site.spools.get(stream).readers():
            return f"the target reads its result stream {stream}"
    return None


def input_modes(site: LocalSite, name: str, target: bytes) -> dict[str, str]:
    """How each input gets to ``target``: ``copy`` (its uncommitted files travel and become a
    replica there) or ``local`` (the target holds the stream with our offsets already: it
    hosts it, or it holds a mirror of it that we send; only the reader offsets travel)."""
    checked = site.checked(site.catalog.query(name).query)
    replicas = site.catalog.replicas()
    modes = {}
    for stream in checked.inputs:
        if replicas.get(stream) == target.hex() or (
            stream not in replicas
            and (MIRROR_PREFIX + target.hex() in site.spools.get(stream).readers())
        ):
            modes[stream] = "local"
        else:
            modes[stream] = "copy"
    return modes
