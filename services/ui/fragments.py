"""Cheap live updates of the run page: its body cut into fragments, and what changed between two renders (pure).

The body (``_run_body.html``, rendered) is a sequence of top-level elements — the header, the lineage,
the timeline, the verdicts. A *container* (:data:`CONTAINERS`: the timeline) is not a fragment itself:
each of its child elements is (one per step, turn and tool call). Every other top-level element is one
fragment. A fragment's key is its element's ``id``, or ``~N`` for the N-th child without one in its
container (0-based), so a browser finds the same element by the same rule (``static/ui.js``).

:func:`split` cuts a render into :class:`Fragment`\\ s; :func:`manifest` keeps what a later :func:`delta`
needs of one (keys and digests, no HTML); :func:`delta` says what a page showing the old render must
replace, insert and remove to show the new one — or ``None`` when fragments that are in both changed
order (the page then takes the whole body). :class:`Renders` remembers the manifests of recent renders per
run page, keyed by head LSN.

The cut reads tags only: the render is autoescaped (a ``<`` in text or an attribute is ``&lt;``), has no
comments, scripts or raw text, and closes every element but the void ones (``<br>``, ``<input>``…) and
``<x/>``; an unmatched end tag closes up to the element it names.
"""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

CONTAINERS = frozenset({"timeline"})
"""Ids of the top-level elements whose children are the fragments (the container's own tag never changes)."""
VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track",
                  "wbr"})
_TAG = re.compile(r"<(/?)([A-Za-z][A-Za-z0-9:-]*)((?:[^>\"']|\"[^\"]*\"|'[^']*')*)>")
_ID = re.compile(r"""\sid\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s"'>/]+))""")
CONTAINER_DIGEST = "*"
"""The digest a container has in a manifest (it only places its children: never changed)."""


@dataclass(frozen=True)
class Fragment:
    """One fragment of a render: in ``container`` (``""``: the body's top level; else the container's id),
    its ``key`` (element id or ``~N``), its ``html`` (the element, outer HTML) and a ``digest`` of it (hex)."""

    container: str
    key: str
    html: str
    digest: str


Entry = tuple[str, str, str]
"""A manifest entry: (container, key, digest); a container is a top-level entry with :data:`CONTAINER_DIGEST`."""


def _digest(html: str) -> str:
    return hashlib.blake2b(html.encode(), digest_size=10).hexdigest()


def split(html: str) -> list[Fragment]:
    """The fragments of a rendered body, in document order (a container's entry, with empty HTML, before its
    children): top-level elements, and the children of each container."""
    out: list[Fragment] = []
    stack: list[str] = []  # open element names
    start = 0  # where the fragment being read began
    container = ""  # the container whose children are read ("" while at top level)
    unnamed: dict[str, int] = {}

    def key_of(attrs: str, where: str) -> str:
        found = _ID.search(attrs)
        if found is not None:
            return next(g for g in found.groups() if g is not None)
        n = unnamed.get(where, 0)
        unnamed[where] = n + 1
        return f"~{n}"

    pending_key: str | None = None
    for m in _TAG.finditer(html):
        closing, name, attrs = m.group(1) == "/", m.group(2).lower(), m.group(3)
        level = len(stack) - (1 if container else 0)  # depth below the fragment level
        if not closing:
            self_closing = name in VOID or attrs.rstrip().endswith("/")
            if level == 0:
                key = key_of(attrs, container)
                if not container and key in CONTAINERS and not self_closing:
                    out.append(Fragment("", key, "", CONTAINER_DIGEST))
                    stack.append(name)
                    container = key
                    continue
                if self_closing:
                    frag = html[m.start():m.end()]
                    out.append(Fragment(container, key, frag, _digest(frag)))
                    continue
                start, pending_key = m.start(), key
            if not self_closing:
                stack.append(name)
            continue
        if name not in stack:
            continue  # a stray end tag
        while stack:
            top = stack.pop()
            if top == name:
                break
        level = len(stack) - (1 if container else 0)
        if container and not stack:  # the container closed
            container = ""
        elif level == 0 and pending_key is not None:
            frag = html[start:m.end()]
            out.append(Fragment(container, pending_key, frag, _digest(frag)))
            pending_key = None
    return out


def manifest(fragments: Sequence[Fragment]) -> tuple[Entry, ...]:
    """What :func:`delta` needs of a render: each fragment's (container, key, digest), in order."""
    return tuple((f.container, f.key, f.digest) for f in fragments)


@dataclass(frozen=True)
class Delta:
    """What turns a page showing one render into the next.

    Attributes:
        removed: (container, key) of each fragment to remove.
        changes: (container, key, after, html) of each fragment that is new or changed, in document order:
            replace the element with that key, or insert it after the element keyed ``after`` in its
            container (``None``: as the container's first child).
    """

    removed: tuple[tuple[str, str], ...]
    changes: tuple[tuple[str, str, str | None, str], ...]


def delta(old: Sequence[Entry], new: Sequence[Fragment]) -> Delta | None:
    """The :class:`Delta` from the render ``old`` describes to ``new``; ``None`` if fragments in both are in a
    different order (or moved container), so no replace-and-insert gets there."""
    before = {(c, k): d for c, k, d in old}
    now = {(f.container, f.key) for f in new}
    if [e[:2] for e in old if e[:2] in now] != [(f.container, f.key) for f in new if (f.container, f.key) in before]:
        return None
    changes: list[tuple[str, str, str | None, str]] = []
    last: dict[str, str | None] = {}
    for f in new:
        if before.get((f.container, f.key)) != f.digest:
            if f.digest == CONTAINER_DIGEST:
                return None  # a container that was not one (or absent): no place to put its children
            changes.append((f.container, f.key, last.get(f.container), f.html))
        last[f.container] = f.key
    removed = tuple((c, k) for c, k, _ in old if (c, k) not in now)
    return Delta(removed=removed, changes=tuple(changes))


class Renders:
    """The manifests of the last ``per_page`` renders of each of the last ``pages`` run pages, by head LSN.

    A page is a (run id, branch parameter) pair. In memory only: a miss (a restarted server, an evicted
    render) makes the page take the whole body.
    """

    def __init__(self, *, pages: int = 64, per_page: int = 8) -> None:
        self._pages: OrderedDict[tuple[str, str], OrderedDict[int, tuple[Entry, ...]]] = OrderedDict()
        self._max_pages, self._per_page = pages, per_page

    def put(self, page: tuple[str, str], head_lsn: int, entries: tuple[Entry, ...]) -> None:
        """Remember the render of ``page`` at ``head_lsn`` (the newest one of a head replaces an older one)."""
        heads = self._pages.pop(page, None) or OrderedDict()
        heads.pop(head_lsn, None)
        heads[head_lsn] = entries
        while len(heads) > self._per_page:
            heads.popitem(last=False)
        self._pages[page] = heads
        while len(self._pages) > self._max_pages:
            self._pages.popitem(last=False)

    def get(self, page: tuple[str, str], head_lsn: int) -> tuple[Entry, ...] | None:
        """The manifest of ``page`` rendered at ``head_lsn``, if still kept."""
        heads = self._pages.get(page)
        return None if heads is None else heads.get(head_lsn)
