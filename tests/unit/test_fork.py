"""The fork registry (``durabilis._fork``) holds weak references only."""

from __future__ import annotations

import gc
import weakref

from durabilis import _fork
from durabilis._steps import Hold, LeaseBook


class _Thing:
    def after_fork_in_child(self) -> None:
        pass


def test_registering_for_fork_keeps_nothing_alive() -> None:
    thing = _Thing()
    gone = weakref.ref(_fork.reset_in_child(thing))
    book = LeaseBook()  # (registers itself)
    book_gone = weakref.ref(book)
    del thing, book
    gc.collect()
    assert gone() is None and book_gone() is None


def test_a_lease_book_is_registered_and_its_reset_empties_it() -> None:
    book = LeaseBook()
    book.hold(Hold("k", "n", "k|n"))
    assert book in _fork._LIVE
    book.after_fork_in_child()  # (what the child's hook runs for each live object)
    assert not book.busy() and book.held() == []
