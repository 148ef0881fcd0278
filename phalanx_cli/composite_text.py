"""The line ``phalanx explain`` and ``kubectl phalanx explain`` print for a PodGroup that is a
child of a CompositePodGroup: the tree's root and the groups planned as one with it."""

from __future__ import annotations

from typing import Sequence


def composite_line(root: str, groups: Sequence[str], own: str, how: str = "", why: str = "") -> str:
    """``root``: the tree's root CompositePodGroup (namespace/name); ``groups``: every PodGroup of
    the tree (namespace/name); ``own``: this group's key; ``how``: the root's policy in words;
    ``why``: why the tree cannot be planned yet ("" when it can)."""
    if why:
        return f"compositepodgroup {root}, not ready: {why}"
    others = [g for g in groups if g != own]
    with_ = f", planned as one with {', '.join(others)}" if others else ""
    return f"compositepodgroup {root}{with_}" + (f" ({how})" if how else "")
