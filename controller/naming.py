"""Names of the Workload and PodGroup phalanx creates — for readability only.

Discovery never reconstructs a name (it follows ``spec.controllerRef`` and ``spec.workloadRef``),
so this scheme may change freely. Workload: ``<sts>-<hash>``; PodGroup: ``<sts>-<hash>`` for the
StatefulSet's own Workload, ``<workload>-<template>-<hash>`` for a template of another's; a
PodGroup's shared ResourceClaim: ``<podgroup>-<claim entry>``. The hash is FNV-32a, its decimal
digits spelled with Kubernetes' "safe" alphabet (no vowels, no look-alike characters). Every name
is a DNS subdomain of at most 253 characters, and a PodGroup's name at most 63 (a valid label
value: in the CRD flavor a pod names its PodGroup in the label ``scheduling.phalanx.dev/pod-group``);
when parts must be cut, each part gets a fair share of the room.
"""

from __future__ import annotations

MAX_NAME = 253  # DNS subdomain
MAX_LABEL = 63  # DNS label (PodGroupTemplate names)
SAFE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"

_FNV32_OFFSET = 0x811C9DC5
_FNV32_PRIME = 0x01000193


def fnv32a(data: bytes) -> int:
    value = _FNV32_OFFSET
    for byte in data:
        value = ((value ^ byte) * _FNV32_PRIME) & 0xFFFFFFFF
    return value


def safe_encode(text: str) -> str:
    """Each character mapped into the safe alphabet (as Kubernetes does for generated suffixes)."""
    return "".join(SAFE_ALPHABET[ord(c) % len(SAFE_ALPHABET)] for c in text)


def name_hash(*parts: str) -> str:
    return safe_encode(str(fnv32a("/".join(parts).encode())))


def _trim(part: str, length: int) -> str:
    # A cut part must still end in an alphanumeric character, or "a.-b" style names appear.
    return part[:length].rstrip("-.")


def fair_join(parts: list[str], suffix: str, limit: int = MAX_NAME) -> str:
    """``part1-part2-...-suffix`` within ``limit``; parts that do not fit share the room fairly
    (a short part keeps its length and leaves the rest to the longer ones)."""
    room = limit - len(suffix) - len(parts)  # one dash after each part
    lengths = [len(p) for p in parts]
    if sum(lengths) > room:
        remaining, pending = room, sorted(range(len(parts)), key=lambda i: lengths[i])
        while pending:
            share = remaining // len(pending)
            i = pending.pop(0)
            lengths[i] = min(lengths[i], share)
            remaining -= lengths[i]
    return "-".join([_trim(p, n) for p, n in zip(parts, lengths, strict=True)] + [suffix])


def workload_name(sts_name: str, sts_uid: str) -> str:
    # the rule's one home (docs/design.md: KEP-6277/names-for-reading)
    return fair_join([sts_name], name_hash(sts_uid))


def podgroup_name(workload: str, template: str, workload_uid: str, owner_uid: str = "") -> str:
    """At most 63 characters (a label value). The Workload's name is left out when it is the
    template's own (``<template>-...``), so it carries no information twice. The owner's UID is part
    of the hash: sibling StatefulSets of one parent template differ."""
    parts = [template] if workload.startswith(f"{template}-") else [workload, template]
    return fair_join(parts, name_hash(workload_uid, template, owner_uid), MAX_LABEL)


def template_name(sts_name: str) -> str:
    """The PodGroupTemplate name for a StatefulSet: a DNS label derived from its name."""
    return _trim(sts_name.replace(".", "-"), MAX_LABEL) or "pods"


def claim_name(podgroup: str, entry: str, podgroup_uid: str) -> str:
    """The ResourceClaim phalanx creates for a PodGroup's shared claim ``entry``:
    ``<podgroup>-<entry>``; when that is longer than a DNS subdomain, both parts are cut fairly and
    a hash of the PodGroup's UID and the entry keeps the name unique."""
    plain = f"{podgroup}-{entry}"
    if len(plain) <= MAX_NAME:
        return plain
    return fair_join([podgroup, entry], name_hash(podgroup_uid, entry))
